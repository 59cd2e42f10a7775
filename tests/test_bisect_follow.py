"""verify --bisect follows the check that failed: after a deploy-loop failure it runs that protocol (the ragged batch
over the in-place cache, rows together) and names the first step, row and tensor that differ; after a weights
failure it points at the weights check's tensor, its block and its module."""

from __future__ import annotations

import re

import numpy as np
import pytest
from click.testing import CliRunner

from mhaexport.cli import main
from mhaexport.verify import verify_folder
from mhaexport.diagnose.follow import bisect_deploy, follow, followed_failure
from mhaexport.verify.render import write_report


@pytest.fixture(scope="module")
def shared(tiny, tmp_path_factory):
    from mhaexport.exporter.onnx import export_onnx

    folder = tmp_path_factory.mktemp("follow_shared")
    export_onnx(tiny, folder, kv_cache="shared")
    return folder


def _plant_deploy_bug(monkeypatch, bug: str) -> None:
    """A defect only the deploy loop shows (tests/test_shared_cache.py's): the in-place protocol's own code — its
    decode steps (the decode loop's stepper, SharedSteps, where it runs; Runner.step's _run_shared elsewhere)."""
    from mhaexport.runtime.ort import SharedCacheOrtRunner, SharedSteps

    real, real_step = SharedCacheOrtRunner._run_shared, SharedSteps.step

    def lose_slot(bufs, mask) -> None:
        for buf in bufs:  # the slot just written for row 1, lost
            arr = buf.numpy()
            arr[1, :, int(mask[1].sum()) - 1] = 0
            buf.update_inplace(arr)

    def buggy(self, ids, mask, bufs):
        if bug == "ragged" and self.protocol.in_place and ids.shape[1] == 1:
            mask = np.ones_like(mask)  # every row fed as if as long as the longest: the shorter row reads holes
        out = real(self, ids, mask, bufs)
        if bug == "reused" and self.protocol.in_place and ids.shape[0] > 1 and ids.shape[1] == 1:
            lose_slot(bufs, mask)
        return out

    def buggy_step(self, tokens):
        if bug == "ragged":
            self.mask[:] = 1
        out = real_step(self, tokens)
        if bug == "reused" and self.ids.shape[0] > 1:
            lose_slot(self.bufs, self.mask[:, :self.length])
        return out

    monkeypatch.setattr(SharedCacheOrtRunner, "_run_shared", buggy)
    monkeypatch.setattr(SharedSteps, "step", buggy_step)


@pytest.mark.slow  # the planted ones below prove the same path fails; this one that it passes (~3 s)
def test_a_clean_shared_cache_agrees_in_the_deploy_loop(shared, tiny):
    report = bisect_deploy(shared, tiny)
    assert report.ok and "rows together" in report.protocol, report.summary()
    assert report.figures["prompts"] == [10, 7]  # ragged, as verify's deploy check


@pytest.mark.parametrize("bug, tensors", [("ragged", {"logits", "present.0.key"}),
                                          pytest.param("reused", {"present.0.key"}, marks=pytest.mark.slow)])
def test_a_deploy_loop_failure_is_bisected_in_its_protocol(shared, tiny, monkeypatch, bug, tensors):
    """verify fails only in the deploy loop; bisect (which fed each row alone and said "all agree") now follows
    kv-consistency into the loop and names decode step 1, row 1 (the shorter), the first cache tensor."""
    _plant_deploy_bug(monkeypatch, bug)
    report = verify_folder(shared, loaded=tiny, runtimes=("ort-cpu",), checks=("parity", "kv-consistency"))
    assert report.results["ort-cpu"]["parity"].status is True
    assert report.results["ort-cpu"]["kv-consistency"].status is False
    write_report(report, shared, "report-follow")
    try:
        kind, runtime, _ = followed_failure(shared)
        assert (kind, runtime) == ("deploy", "ort-cpu")
        res = follow(shared, tiny)
    finally:
        (shared / "report-follow.json").unlink()
        (shared / "report-follow.md").unlink()
    assert not res.ok and res.figures["step"] == 1 and res.figures["row"] == 1, res.summary()
    assert res.figures["tensor"] == "present.0.key" and "decode step 1, row 1 (7 tokens), present.0.key" in res.where
    assert tensors <= set(res.summary().split("differing: ")[1].split(", ")), res.summary()


@pytest.mark.slow  # quantize, verify, then bisect through the CLI (~10 s here)
def test_a_weights_failure_points_at_the_tensor_and_its_block(tiny_export, tmp_path):
    from test_weights import _plant, _quantize

    q = _quantize(tiny_export, tmp_path / "q", "--block-size", "32")
    name = _plant(q, 2, lambda a: a.reshape(-1).__setitem__(5, a.reshape(-1)[5] * 1.5))
    res = CliRunner().invoke(main, ["-q", "verify", str(q), "--runtime", "ort-cpu"])
    assert res.exit_code == 1 and "ort-cpu/weights" in res.output, res.output
    res = CliRunner().invoke(main, ["verify", str(q), "--bisect"])
    assert res.exit_code == 1, res.output
    assert "bisect follows ort-cpu's weights check" in res.output
    assert f"first difference: {name} (scales of MatMulNBits" in res.output and "row 2, block 1" in res.output
    # the module holding the tensor (the first 4-bit MatMul: the default scheme keeps block 0 int8)
    assert re.search(rf"culprit in block (blocks\.\d): \1\.[\w.]+: its quantized weight {name} differs",
                     res.output), res.output
    assert "all agree" not in res.output
