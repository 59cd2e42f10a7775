"""Every export path a user can ask for, in the default run: each ``--attention`` x ``--kv-cache`` of one LayerNorm
preset (tiny) and one RMSNorm preset (tiny-llama), the window cache of a windowed preset, float16 where a path has
code of its own, every ``--target``, and a streamed ``--hf`` export of an RMSNorm family. Each is exported at tiny
size (its own self-check and onnx.checker run inside the export), then verified on ONNX Runtime CPU against eager.

A fused export of every Llama-family model once failed onnx.checker (a contrib-op copy checked in memory resolved
its external data against the working directory) while the default run held no fused export of an RMSNorm model:
the break landed green. Any one path broken here fails the default run.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from mhaexport.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")

# the (attention, kv_cache) pairs every preset takes; the ONNX Attention op has no in-place cache
PAIRS = [("decomposed", "concat"), ("decomposed", "shared"), ("onnx", "concat"), ("ort", "concat"),
         ("ort", "shared"), ("fused", "concat"), ("fused", "shared")]
PATHS = [(preset, attention, kv, "float32") for preset in ("tiny", "tiny-llama") for attention, kv in PAIRS]
PATHS += [("tiny-window", attention, "window", "float32") for attention in ("decomposed", "ort", "fused")]
# float16 has code of its own in the mask fill (decomposed), GroupQueryAttention's kernel (ort + shared) and the
# fusions' casts (fused): on the RMSNorm preset, whose norms the fusions rewrite
PATHS += [("tiny-llama", "decomposed", "concat", "float16"), ("tiny-llama", "ort", "shared", "float16"),
          ("tiny-llama", "fused", "concat", "float16"), ("tiny-llama", "fused", "shared", "float16")]
# what the exporter refuses in one line, before any work
REFUSED = [("tiny", "onnx", "shared", "the ONNX Attention op has no in-place cache"),
           ("tiny-llama", "onnx", "window", "the ONNX Attention op has no in-place cache"),
           ("tiny-llama", "fused", "window", "the model has no sliding window")]


def _id(path: tuple) -> str:
    return "-".join(path)


def _entry(folder: Path) -> dict:
    return json.loads((folder / "manifest.json").read_text())["artifacts"]["onnx"]


@pytest.mark.parametrize("path", PATHS, ids=[_id(p) for p in PATHS])
def test_every_export_path_exports_self_checks_and_verifies(export_path, path):
    preset, attention, kv, dtype = path
    folder, error = export_path(*path)
    assert error is None, error
    entry = _entry(folder)
    # a shared (or window) cache is written by GroupQueryAttention: decomposed or ort attention over one is "gqa"
    recorded = "gqa" if kv != "concat" and attention in ("decomposed", "ort") else attention
    assert (entry["attention"], entry["kv_cache"], entry["dtype"]) == (recorded, kv, dtype)
    lowering = entry["lowering"]
    if attention == "decomposed" and kv == "concat":
        assert lowering["self_check_not_run"] == "nothing lowered"  # the reference itself: verify compares it
    else:  # the lowered file against the decomposed graph, run by the export itself, past the longest window
        limit = 1e-4 if dtype == "float32" else 2e-3
        assert lowering["self_check_not_run"] is None and lowering["self_check_max_abs_diff"] <= limit, lowering
    if kv == "window":
        assert entry.get("window_slots"), entry
    assert entry["precision"]["ort_cpu_session_error"] is None
    res = CliRunner().invoke(main, ["-q", "verify", str(folder), "--runtime", "eager,ort-cpu"])
    assert res.exit_code == 0, res.output


@pytest.mark.parametrize("preset,attention,kv,said", REFUSED)
def test_a_path_the_exporter_cannot_make_is_refused_in_one_line(tmp_path, preset, attention, kv, said):
    res = CliRunner().invoke(main, ["onnx", "--config", preset, "--attention", attention, "--kv-cache", kv, "-o",
                                    str(tmp_path / "x")])
    assert res.exit_code == 2 and said in res.output and "Traceback" not in res.output, res.output
    assert not (tmp_path / "x" / "model.onnx").exists()


@pytest.mark.parametrize("target", ["portable", "ort-cpu", "ort-cuda"])
def test_every_target_exports(export_path, target):
    """``--target`` on the RMSNorm preset: portable (decomposed, concat), ort-cpu (fused over a shared cache, then
    int4 weights behind the quality gate), ort-cuda (fused, shared, float16: exported here, run on CPU)."""
    folder, error = export_path("tiny-llama", None, None, None, target)
    assert error is None, error
    entry = _entry(folder)
    want = {"portable": ("decomposed", "concat", "float32"), "ort-cpu": ("fused", "shared", "float32"),
            "ort-cuda": ("fused", "shared", "float16")}[target]
    assert (entry["attention"], entry["kv_cache"], entry["dtype"]) == want
    if target == "ort-cpu":
        assert entry["quantization"]["weights"] == "int4", entry.get("quantization")


def test_a_streamed_hf_llama_exports_for_ort_cpu_and_verifies(hf_dir, tmp_path):
    """``onnx --hf LLAMA --target ort-cpu``: the folder's safetensors streamed, fused over a shared cache, int4; then
    verify passes on eager and ONNX Runtime CPU (the int4 file by the quality gate)."""
    folder = tmp_path / "llama"
    res = CliRunner().invoke(main, ["-q", "onnx", "--hf", str(hf_dir("llama")), "--target", "ort-cpu", "-o",
                                    str(folder)])
    assert res.exit_code == 0, res.output
    entry = _entry(folder)
    assert (entry["attention"], entry["kv_cache"]) == ("fused", "shared") and entry["quantization"]
    res = CliRunner().invoke(main, ["-q", "verify", str(folder), "--runtime", "eager,ort-cpu"])
    assert res.exit_code == 0, res.output


def test_a_reused_trace_writes_the_bytes_a_fresh_trace_writes(loaded_presets, tmp_path, monkeypatch):
    """exporter/trace.py: a second export of the same model reuses torch.onnx's trace and lowers a clone of it; the
    file is byte for byte the one a fresh trace writes (float32 over the model's own mapped weights, float16 over
    its restaged copy), a lowering before it leaves the kept trace untouched, and a weight changed in place makes a
    new trace (never a stale one)."""
    import torch

    from mhaexport.exporter import trace
    from mhaexport.exporter.onnx import export_onnx

    monkeypatch.setenv("MHAEXPORT_TRACE", "fresh")  # this process's memo alone (the cache's: tests/test_replicate.py)
    loaded = loaded_presets("tiny-llama")
    for dtype in ("float32", "float16"):
        trace.forget(loaded.module)
        export_onnx(loaded, tmp_path / f"fresh-{dtype}", attention="fused", kv_cache="shared", dtype=dtype)
        export_onnx(loaded, tmp_path / f"between-{dtype}", attention="ort", dtype=dtype)
        export_onnx(loaded, tmp_path / f"reused-{dtype}", attention="fused", kv_cache="shared", dtype=dtype)
        assert (tmp_path / f"fresh-{dtype}" / "model.onnx").read_bytes() == \
            (tmp_path / f"reused-{dtype}" / "model.onnx").read_bytes(), dtype
    # float16 of a model in memory: the trace holds a float16 copy, which a weight changed in place makes stale
    plain = load_model_in_memory("tiny")
    calls = []
    real = torch.onnx.export
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(torch.onnx, "export", lambda *a, **k: calls.append(1) or real(*a, **k))
        export_onnx(plain, tmp_path / "before", dtype="float16")
        export_onnx(plain, tmp_path / "again", dtype="float16")
        with torch.no_grad():
            plain.module.blocks[0].attn.W_q.weight.mul_(2.0)  # bumps the tensor's version
        export_onnx(plain, tmp_path / "after", dtype="float16")
    assert len(calls) == 2  # traced, reused, traced again
    before, after = ((tmp_path / n / "model.onnx").read_bytes() for n in ("before", "after"))
    assert before == (tmp_path / "again" / "model.onnx").read_bytes() and before != after


def load_model_in_memory(preset: str):
    from mhaexport.models.loading import load_model

    return load_model(preset, random_weights=True)
