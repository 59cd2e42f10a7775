"""The article's attention block on its own: `mhaexport onnx|torchscript --module attention`, and verify's module
checks (parity against eager and against torch's own attention, causality, cache-consistency, demonstration).

Fast: one ONNX export (causal, with its TorchScript trace), TorchScript-only exports for the rest (0.1 s each).
Slow: the bidirectional and grouped-query ONNX exports, the planted bug in ONNX, trained weights, a subprocess.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from mhaexport.core import iospec
from mhaexport.cli import main
from mhaexport.core.errors import ArtifactError, ExportError, RuntimeInputError
from mhaexport.exporter.block import export_module_onnx, export_module_torchscript
from mhaexport.models.block import AttentionBlock, load_block
from mhaexport.verify import verify_folder
from mhaexport.verify.results import MODULE_CHECKS
from mhaexport.runners.block import TorchMhaRunner, TorchModuleRunner
from mhaexport.verify.render import markdown
from mhaexport.core.untrusted import unescape_md
from planted.bugs import _AfterSoftmax, _NoMask


def _planted(bug: type, mask: str = "causal"):
    """The tiny block with its attention swapped for a planted bug, same weights (so the same fingerprint)."""
    loaded = load_block("tiny", mask=mask)
    attn = bug(loaded.contract.d_model, loaded.contract.n_heads)
    attn.load_state_dict(loaded.module.attn.state_dict())
    loaded.module.attn = attn.eval()
    return loaded


def _failed(report) -> set[tuple[str, str]]:
    return {(rt, ch) for rt, checks in report.results.items() for ch, r in checks.items() if r.status is False}


# --- the block and its references, no export ---------------------------------------------------------------------

@pytest.mark.parametrize("mask", ["causal", "none"])
def test_the_block_shows_the_articles_demonstration_and_its_cache_shapes(mask):
    block = load_block("tiny", mask=mask).module
    x = torch.randn(2, 5, 64)
    empty = torch.zeros(2, 4, 0, 16)  # past length 0
    with torch.no_grad():
        out, k, v, w = block(x, empty, empty)
        _, k2, _, w2 = block(x[:, :2], k, v)  # two more positions after a cache of five
    assert out.shape == (2, 5, 64) and k.shape == v.shape == (2, 4, 5, 16) and w.shape == (2, 4, 5, 5)
    assert k2.shape == (2, 4, 7, 16) and w2.shape == (2, 4, 2, 7)
    if mask == "causal":
        assert (w[..., 1, 3] == 0).all()  # position 1 does not attend to position 3: exactly 0
        assert (w2[..., 0, :6] > 0).all() and (w2[..., 0, 6] == 0).all()  # the past offset: row 0 is position 5
    else:
        assert (w[..., 1, 3] > 0).all()  # bidirectional: it does
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 4, 5))


@pytest.mark.parametrize("mask", ["causal", "none"])
def test_torch_mha_agrees_with_eager_with_and_without_a_cache(mask):
    loaded = load_block("tiny", mask=mask)
    c = loaded.contract
    eager = TorchModuleRunner("eager", c, loaded.module).activate()
    ref = TorchMhaRunner("torch-mha", c, loaded.module.attn).activate()
    assert ref.providers[0].startswith("nn.MultiheadAttention")
    for batch, seq, past in [(1, 1, 0), (2, 7, 0), (2, 1, 9), (3, 4, 6)]:  # past 0: nn.MultiheadAttention; else SDPA
        inputs = iospec.dummy_module_inputs(c, batch, seq, past, seed=seq + past)
        for got, want in zip(ref.run(*inputs), eager.run(*inputs)):
            np.testing.assert_allclose(got, want, atol=1e-6, rtol=1e-5)


def test_a_grouped_query_block_goes_through_the_sdpa_reference():
    loaded = load_block("tiny-llama")  # 4 query heads share 2 key/value heads
    c = loaded.contract
    assert (c.n_heads, c.n_kv_heads) == (4, 2)
    eager = TorchModuleRunner("eager", c, loaded.module).activate()
    ref = TorchMhaRunner("torch-mha", c, loaded.module.attn).activate()
    assert ref.mha is None and ref.providers == ["SDPA (enable_gqa)"]
    inputs = iospec.dummy_module_inputs(c, 2, 3, 4, seed=1)
    out = ref.run(*inputs)
    assert out[1].shape == (2, 2, 7, 16) and out[3].shape == (2, 4, 3, 7)
    for got, want in zip(out, eager.run(*inputs)):
        np.testing.assert_allclose(got, want, atol=1e-6, rtol=1e-5)


def test_module_runners_check_the_module_contract():
    loaded = load_block("tiny")
    r = TorchModuleRunner("eager", loaded.contract, loaded.module)
    with pytest.raises(RuntimeInputError, match=r"x must be a non-empty \(batch, seq, d_model=64\)"):
        r.run(np.zeros((2, 3, 32), np.float32))
    with pytest.raises(RuntimeInputError, match=r"past_key has shape \(2, 2, 1, 16\), expected \(batch=2, "
                                                r"n_kv_heads=4"):
        r.run(np.zeros((2, 3, 64), np.float32), np.zeros((2, 2, 1, 16)), np.zeros((2, 2, 1, 16)))
    with pytest.raises(RuntimeInputError, match="together"):
        r.run(np.zeros((2, 3, 64), np.float32), np.zeros((2, 4, 1, 16)))


# --- export + verify, causal (the one ONNX export of the fast set) ------------------------------------------------

@pytest.fixture(scope="module")
def causal_export(tmp_path_factory):
    """The tiny preset's causal block exported to ONNX and TorchScript through the CLI, then verified."""
    folder = tmp_path_factory.mktemp("module_causal")
    for verb in ("onnx", "torchscript"):
        res = CliRunner().invoke(main, [verb, "--module", "attention", "--config", "tiny", "-o", str(folder)])
        assert res.exit_code == 0, res.output
    return folder, CliRunner().invoke(main, ["verify", str(folder)])


def test_causal_export_records_the_module_contract(causal_export):
    folder, _ = causal_export
    m = json.loads((folder / "manifest.json").read_text())
    assert m["model"]["contract"] == {"kind": "attention", "d_model": 64, "n_heads": 4, "n_kv_heads": 4,
                                      "head_dim": 16, "mask": "causal", "max_positions": 128}
    assert m["model"]["source"] == {"kind": "preset", "name": "tiny", "block": "blocks.0.attn"}
    for name in ("onnx", "torchscript"):
        art = m["artifacts"][name]
        assert (art["module"], art["mask"]) == ("attention", "causal")
        assert art["weights"] == "blocks.0.attn of the built-in decoder: seeded (config seed 0)"
        assert art["io"] == iospec.module_io_schema(load_block("tiny").contract)
    assert not (folder / "genai_config.json").exists()
    import onnx

    g = onnx.load(str(folder / "model.onnx")).graph
    dims = {v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]
            for v in list(g.input) + list(g.output)}
    assert dims == {"x": ["batch_size", "sequence_length", 64],
                    "past_key": ["batch_size", 4, "past_sequence_length", 16],
                    "past_value": ["batch_size", 4, "past_sequence_length", 16],
                    "output": ["batch_size", "sequence_length", 64],
                    "present_key": ["batch_size", 4, "total_sequence_length", 16],
                    "present_value": ["batch_size", 4, "total_sequence_length", 16],
                    "attention_weights": ["batch_size", 4, "sequence_length", "total_sequence_length"]}


def test_causal_export_verifies_on_every_runtime_with_the_demonstration(causal_export):
    folder, res = causal_export
    assert res.exit_code == 0, res.output
    data = json.loads((folder / "report.json").read_text())
    assert data["module"] == "attention" and data["checks"] == list(MODULE_CHECKS)
    for rt in ("eager", "torch-mha", "torchscript", "ort-cpu"):
        assert data["runtimes"][rt]["status"] == "ran"
        for ch in MODULE_CHECKS:
            want = None if (rt, ch) == ("eager", "parity") else True
            assert data["results"][rt][ch]["status"] is want, (rt, ch, data["results"][rt][ch])
        assert re.match(r"earlier outputs, weights and cache unchanged \(max abs 0; later outputs moved by [\d.e+-]+\)",
                        data["results"][rt]["causality"]["message"]), data["results"][rt]["causality"]
        demo = data["results"][rt]["demonstration"]["figures"]
        assert demo["weight_1_3_max"] == 0.0 and demo["row_1"][2:] == [0.0, 0.0, 0.0]
    assert data["runtimes"]["ort-cpu"]["providers"] == ["CPUExecutionProvider"]
    cuda = data["runtimes"]["ort-cuda"]
    if "CUDAExecutionProvider" not in cuda["providers"]:
        assert cuda["status"] == "skipped" and cuda["reason"]
    md = unescape_md((folder / "report.md").read_text())  # as it reads rendered (data is Markdown-escaped)
    assert md.startswith("## mhaexport verify: ✅ PASSED")
    assert "| runtime | providers | parity | finite | causality | cache-consistency | demonstration |" in md
    assert "- ✅ ort-cpu: causal: weights[b, h, 1, 3] = 0 exactly for all 8 (batch, head) pairs" in md


def test_module_folders_are_refused_by_the_decoder_verbs_and_options(causal_export):
    folder, _ = causal_export
    for args in (["generate", str(folder), "--prompt-ids", "1,2"], ["lint", str(folder)],
                 ["verify", str(folder), "--bisect"]):
        res = CliRunner().invoke(main, args)
        assert res.exit_code == 2, (args, res.output)
        assert "attention block on its own" in res.output or "module on its own" in res.output, res.output
    res = CliRunner().invoke(main, ["verify", str(folder), "--runtime", "onnx-reference"])
    assert res.exit_code == 2 and "do not run an attention-block export" in res.output
    res = CliRunner().invoke(main, ["verify", str(folder), "--runtime", "torch-mha", "-o", str(folder / "ref")])
    assert res.exit_code == 4, res.output  # a second reference verifies no artifact: not verified
    assert "no runtime besides eager and torch-mha ran" in res.output


@pytest.mark.parametrize("args, hint", [
    (["onnx", "--mask", "none"], "--mask applies to --module attention"),
    (["onnx", "--module", "attention", "--model", "x.py:build"], "--model and --hf are decoders"),
    (["onnx", "--module", "attention", "--dtype", "float16"], "--dtype float16 does not apply"),
    (["onnx", "--module", "attention", "--seq-static", "--seq-len", "4"], "--seq-static True does not apply"),
    (["torchscript", "--module", "attention", "--config", "nope"], "unknown config 'nope'"),
])
def test_module_usage_errors_exit_2_before_any_work(args, hint, tmp_path):
    res = CliRunner().invoke(main, args + ["-o", str(tmp_path / "out")])
    assert res.exit_code == 2, res.output
    assert hint in res.output
    assert not (tmp_path / "out" / "manifest.json").exists()


# --- bidirectional and planted bugs: TorchScript exports (0.1 s) -------------------------------------------------

def test_bidirectional_export_verifies_and_causality_is_not_applicable(tmp_path):
    loaded = load_block("tiny", mask="none")
    export_module_torchscript(loaded, tmp_path)
    report = verify_folder(tmp_path, runtimes=("torch-mha", "torchscript"))
    assert report.verdict.code == 0, report.verdict
    for rt in ("eager", "torch-mha", "torchscript"):
        causality = report.results[rt]["causality"]
        assert causality.status is None and "n/a: bidirectional" in causality.message  # not applicable, not passed
        demo = report.results[rt]["demonstration"]
        assert demo.status is True and demo.figures["weight_1_3_min"] > 0
        assert report.results[rt]["cache-consistency"].status is True
    assert "⏭ n/a" in markdown(report)


@pytest.mark.parametrize("bug, why", [
    (_NoMask, "position 1 attends to position 3, a future position"),
    pytest.param(_AfterSoftmax, "the mask is applied after softmax", marks=pytest.mark.slow),
])
def test_demonstration_fails_on_a_planted_bug(bug, why, tmp_path):
    loaded = _planted(bug)
    export_module_torchscript(loaded, tmp_path)
    report = verify_folder(tmp_path, loaded=loaded, runtimes=("torch-mha", "torchscript"))
    assert report.verdict.code == 1
    failed = _failed(report)
    # wrong in eager and in the export alike: the invariants catch it on both, torch's own attention disagrees
    for rt in ("eager", "torchscript"):
        assert {(rt, "demonstration"), (rt, "causality")} <= failed
        assert why in report.results[rt]["demonstration"].message
    assert ("torch-mha", "parity") in failed and ("torch-mha", "demonstration") not in failed


# --- slow: more exports --------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_bidirectional_onnx_export_verifies_on_ort(tmp_path):
    res = CliRunner().invoke(main, ["onnx", "--module", "attention", "--mask", "none", "--config", "tiny", "-o",
                                    str(tmp_path)])
    assert res.exit_code == 0, res.output
    report = verify_folder(tmp_path, runtimes=("torch-mha", "ort-cpu"))
    assert report.verdict.code == 0, report.verdict
    assert report.results["ort-cpu"]["demonstration"].status is True
    assert report.results["ort-cpu"]["causality"].status is None


@pytest.mark.slow
def test_grouped_query_block_exports_and_verifies_against_sdpa(tmp_path):
    loaded = load_block("tiny-llama")
    export_module_onnx(loaded, tmp_path)
    export_module_torchscript(loaded, tmp_path)
    m = json.loads((tmp_path / "manifest.json").read_text())
    assert m["artifacts"]["onnx"]["io"]["inputs"]["past_key"]["shape"] == ["batch_size", 2, "past_sequence_length", 16]
    report = verify_folder(tmp_path, runtimes=("torch-mha", "torchscript", "ort-cpu"))
    assert report.verdict.code == 0, report.verdict
    assert report.runtimes["torch-mha"].providers == ["SDPA (enable_gqa)"]
    assert report.results["torch-mha"]["parity"].status is True


@pytest.mark.slow
def test_planted_bug_in_the_onnx_file_fails_the_demonstration_on_ort(tmp_path):
    loaded = _planted(_NoMask)
    export_module_onnx(loaded, tmp_path)
    report = verify_folder(tmp_path, loaded=loaded, runtimes=("torch-mha", "ort-cpu"))
    assert report.verdict.code == 1
    assert {("ort-cpu", "demonstration"), ("ort-cpu", "causality"), ("torch-mha", "parity")} <= _failed(report)
    msg = report.results["ort-cpu"]["causality"].message
    assert msg.startswith("changing x at positions 5..9 changed earlier outputs or weights (seq=10 past=0, "
                          "max abs "), msg


class _NoPastOffsetBlock(AttentionBlock):
    def forward(self, x, past_key, past_value):
        T, P = x.shape[1], past_key.shape[2]
        allowed = (torch.arange(P + T)[None, :] <= torch.arange(T)[:, None])[None, None]  # BUG: no + P on queries
        out, (k, v), w = self.attn.forward_with_weights(x, allowed, (past_key, past_value))
        return out, k, v, w


@pytest.mark.slow
def test_a_mask_without_the_past_offset_disagrees_with_torch_mha(tmp_path):
    loaded = load_block("tiny")
    bad = _NoPastOffsetBlock(64, 4)
    bad.load_state_dict(loaded.module.state_dict())
    loaded.module = bad.eval()
    export_module_torchscript(loaded, tmp_path)
    report = verify_folder(tmp_path, loaded=loaded, runtimes=("torch-mha", "torchscript"))
    assert report.verdict.code == 1
    failed = _failed(report)
    assert ("torch-mha", "parity") in failed and ("eager", "cache-consistency") in failed
    assert ("eager", "demonstration") not in failed  # with no past, the bug does not show: the other checks see it


class _FixedLengthBlock(AttentionBlock):
    def forward(self, x, past_key, past_value):
        x = x.reshape(x.shape[0], 3, x.shape[2])  # BUG: bakes the example's sequence length in
        return super().forward(x, past_key, past_value)


@pytest.mark.slow
def test_an_export_whose_sequence_axis_came_out_fixed_is_refused(tmp_path):
    loaded = load_block("tiny")
    bad = _FixedLengthBlock(64, 4)
    bad.load_state_dict(loaded.module.state_dict())
    loaded.module = bad.eval()
    with pytest.raises(ExportError, match="sequence_length"):
        export_module_onnx(loaded, tmp_path)
    assert not (tmp_path / "manifest.json").exists() or "onnx" not in json.loads(
        (tmp_path / "manifest.json").read_text())["artifacts"]


@pytest.mark.slow
def test_the_small_preset_block_carries_its_trained_weights(tmp_path):
    loaded = load_block("small")
    assert loaded.checkpoint == "shipped:small.pt"
    export_module_torchscript(loaded, tmp_path)
    m = json.loads((tmp_path / "manifest.json").read_text())
    assert m["artifacts"]["torchscript"]["weights"] == "blocks.0.attn of the built-in decoder: trained (shipped:small.pt)"
    assert m["model"]["checkpoint"] == "shipped:small.pt"
    report = verify_folder(tmp_path, runtimes=("torch-mha", "torchscript"))
    assert report.verdict.code == 0, report.verdict


@pytest.mark.slow
def test_a_recorded_block_that_changed_is_refused(tmp_path):
    export_module_torchscript(load_block("tiny", mask="none"), tmp_path)
    res = CliRunner().invoke(main, ["verify", str(tmp_path), "--config", "tiny-llama"])
    assert res.exit_code == 2 and "fingerprint" in res.output, res.output
    res = CliRunner().invoke(main, ["verify", str(tmp_path), "--config", "tiny", "--runtime", "torchscript"])
    assert res.exit_code == 0, res.output  # re-pointed at the same block: accepted


@pytest.mark.slow
def test_module_export_and_verify_as_a_real_subprocess(tmp_path):
    def run(*args):
        return subprocess.run([sys.executable, "-m", "mhaexport", *args], capture_output=True, text=True,
                              timeout=600, check=False)

    assert run("onnx", "--module", "attention", "--config", "tiny", "-o", str(tmp_path)).returncode == 0
    proc = run("verify", str(tmp_path), "--runtime", "ort-cpu", "--runtime", "torch-mha")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "| ort-cpu | CPU |" in proc.stdout and "w[1,3]=0" in proc.stdout
    from mhaexport.artifact import ExportFolder

    folder = ExportFolder.open(tmp_path)
    assert folder.module == "attention"
    with pytest.raises(ArtifactError, match="attention block on its own"):
        _ = folder.contract  # the decoder contract: what generate, bench and lint read
