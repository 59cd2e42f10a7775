"""Verdicts that never pass what did not run, and the exit codes of docs/DESIGN.md: 0 passed, 1 failed,
2 bad input, 3 a bug in mhaexport, 4 not verified, 130 interrupted. One test per defect the core issue found."""

from __future__ import annotations

import json
import shutil

import pytest
from click.testing import CliRunner

from mhaexport.artifact import read_json
from mhaexport.cli import main
from mhaexport.runtime.session import provider_unavailable
from planted.edit import rehash

pytestmark = pytest.mark.usefixtures("one_thread")
NO_CUDA = provider_unavailable("cuda")


@pytest.fixture()
def export_copy(tiny_export, tmp_path):
    dst = tmp_path / "export"
    shutil.copytree(tiny_export, dst)
    return dst


@pytest.mark.skipif(NO_CUDA is None, reason="CUDA really runs here: ort-cuda is verified, not skipped")
def test_a_requested_runtime_that_cannot_run_is_not_verified_exit_4(export_copy):
    """`verify DIR --runtime ort-cuda` without CUDA: exit 4 with the reason, never "PASSED"; its own report, the
    full report.json of `all` untouched."""
    (export_copy / "report.json").write_text('{"full": true}')
    res = CliRunner().invoke(main, ["verify", str(export_copy), "--runtime", "ort-cuda"])
    assert res.exit_code == 4, res.output
    assert f"NOT VERIFIED: nothing requested was verified: ort-cuda skipped ({NO_CUDA})" in res.output
    assert "PASSED" not in res.output and "## mhaexport verify: ⏭ NOT VERIFIED" in res.output
    assert (export_copy / "report.json").read_text() == '{"full": true}'
    data = read_json(export_copy / "report-ort-cuda.json", "report")
    assert data["verdict"] == {"status": "not verified", "exit_code": 4, "message": data["verdict"]["message"]}
    assert data["runtimes"]["ort-cuda"]["status"] == "skipped" and data["results"]["ort-cuda"] == {}


def test_a_truncated_model_with_a_matching_hash_is_one_failure_and_cuda_stays_skipped(export_copy):
    """model.onnx truncated *and* re-hashed (the manifest vouches for it): ort-cpu cannot load it, which is one
    failed check with one message; ort-cuda is skipped for its own reason (no CUDA), not failed; TorchScript still
    passes. generate on the same folder: exit 2, one line."""
    path = export_copy / "model.onnx"
    path.write_bytes(path.read_bytes()[:5000])
    rehash(export_copy)
    res = CliRunner().invoke(main, ["verify", str(export_copy)])
    assert res.exit_code == 1, res.output
    data = read_json(export_copy / "report.json", "report")
    cpu = data["runtimes"]["ort-cpu"]
    assert cpu["status"] == "error" and cpu["reason"].startswith(f"ONNX Runtime cannot load {path}:")
    assert data["counts"]["failed"] == 1 and data["verdict"]["message"] == "1 check(s) failed: ort-cpu/load"
    if NO_CUDA is not None:
        assert data["runtimes"]["ort-cuda"]["status"] == "skipped" and "CUDAExecutionProvider" in \
            data["runtimes"]["ort-cuda"]["reason"]
    assert all(r["status"] is not False for r in data["results"]["torchscript"].values())
    first = cpu["reason"].split(": ", 1)[1][:60]
    assert res.output.count(first) <= 2  # the table's note and the stderr line, not one per case or check
    gen = CliRunner().invoke(main, ["generate", str(export_copy), "--prompt-ids", "1,2"])
    assert gen.exit_code == 2 and len(gen.output.strip().splitlines()) == 1, gen.output


def test_verify_into_an_unwritable_folder_fails_before_any_work(export_copy, tmp_path):
    blocker = tmp_path / "afile"
    blocker.write_text("")
    res = CliRunner().invoke(main, ["verify", str(export_copy), "-o", str(blocker / "out")])
    assert res.exit_code == 2
    assert res.output.strip() == f"Error: output folder {blocker / 'out'} is not writable: Not a directory"
    res = CliRunner().invoke(main, ["all", "--config", "tiny", "-o", str(blocker / "out")])
    assert res.exit_code == 2 and "[1/4]" not in res.output  # nothing loaded, nothing exported


def test_an_export_output_probe_leaves_nothing_behind(tmp_path):
    res = CliRunner().invoke(main, ["onnx", "--config", "nope", "-o", str(tmp_path / "a" / "b")])
    assert res.exit_code == 2 and not (tmp_path / "a").exists()


def test_a_runtime_failing_inside_a_check_is_a_failed_check_but_a_bug_exits_3(tiny, tiny_export, monkeypatch):
    from mhaexport.core.iospec import ModelContract
    from mhaexport.runtime.runner import Runner
    from mhaexport.verify import suite
    from mhaexport.verify.compare import Tolerance
    from mhaexport.verify.results import Context

    class Broken(Runner):
        def run_impl(self, ids, mask, past):
            raise ValueError("kernel exploded")

    c = ModelContract(n_layers=1, n_heads=1, head_dim=2, vocab_size=4, max_positions=16)
    ctx = Context(contract=c, cases=[], tol=Tolerance(1e-4, 1e-3), eager=Broken("eager", c), export_sizes=(3, 5))
    r = suite.run_check("causality", Broken("ort-cpu", c), ctx)
    assert r.status is False and r.message.startswith("RuntimeFailure: ort-cpu failed at batch=2 seq=10 past=0: "
                                                      "ValueError: kernel exploded")

    def buggy(runner, ctx):  # a bug in mhaexport's own check code
        return {}["missing"]

    monkeypatch.setitem(suite.CHECK_FUNCS, "causality", buggy)
    with pytest.raises(KeyError):
        suite.run_check("causality", Broken("ort-cpu", c), ctx)
    res = CliRunner().invoke(main, ["verify", str(tiny_export), "-o", str(tiny_export.parent / "bug-report")])
    assert res.exit_code == 3
    assert "Traceback" in res.output and "KeyError: 'missing'" in res.output
    assert "internal error: this is a bug in mhaexport (exit code 3)" in res.output


def test_ctrl_c_exits_130_not_1(tiny_export, monkeypatch):
    import mhaexport.verify as v

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(v, "verify_folder", interrupted)
    res = CliRunner().invoke(main, ["verify", str(tiny_export), "-o", str(tiny_export.parent / "ctrl-c")])
    assert res.exit_code == 130 and "interrupted" in res.output


@pytest.mark.slow  # ~8 s: a float16 ONNX export and a float32 TorchScript one in one folder
def test_generate_on_a_float16_folder_with_a_float32_torchscript(tiny, tmp_path):
    """`all --dtype float16` then generate: the ONNX file's cache is float16 while TorchScript's is float32; each
    artifact records its own I/O dtype and the runtime feeds the ONNX file's."""
    from mhaexport.exporter.onnx import export_onnx
    from mhaexport.exporter.torchscript import export_torchscript

    export_onnx(tiny, tmp_path, dtype="float16")
    export_torchscript(tiny, tmp_path)
    arts = read_json(tmp_path / "manifest.json", "manifest")["artifacts"]
    assert arts["onnx"]["io"]["inputs"]["past_key_values.0.key"]["dtype"] == "float16"
    assert arts["torchscript"]["io"]["inputs"]["past_key_values.0.key"]["dtype"] == "float32"
    res = CliRunner().invoke(main, ["generate", str(tmp_path), "--prompt-ids", "1,2,3", "--max-new-tokens", "5",
                                    "--json"])
    assert res.exit_code == 0, res.output
    assert len(json.loads(res.stdout)["tokens"]) == 5
