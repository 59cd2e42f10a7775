"""A 1 B decoder on this machine (issue 48): a TinyLlama-1.1B-shaped random model, bfloat16 safetensors in shards
(tests/big_models.py: made here, never downloaded), exported float32 and quantized int4, each verified with verify's
default checks on ort-cpu (eager's too, as the reference), every command a child process whose own peak memory is
read (tests/children.py). ~10 minutes on 2 cores.

Real sizes, small positions: 1.10 B parameters (2.2 GB bfloat16, a 4.4 GB float32 file); ``max_position_embeddings``
32 (it changes no weight) keeps verify's longest prompt and its decode sweep short. The 8 B model's runs are
measured in docs/measurements/ (python -m tests.big_models llama-3-8b FOLDER makes one).
"""

from __future__ import annotations

import json

import pytest

from big_models import parameters, write_random_llama
from children import run_measured

pytestmark = pytest.mark.slow

GB = 1e9


def _verdict(folder) -> dict:
    """The report of a ``--runtime ort-cpu`` run (named runtimes write report-RUNTIMES.json)."""
    return json.loads((folder / "report-ort-cpu.json").read_text())


def _weights_bytes(folder) -> int:
    """The ONNX file's bytes with its external data (an int4 file under 2 GB keeps its weights inline)."""
    return sum(p.stat().st_size for p in (folder / "model.onnx", folder / "model.onnx.data") if p.exists())


def _ran(report: dict) -> dict[str, dict[str, bool | None]]:
    """{runtime that ran: {check: passed (True), failed (False) or not run (None)}}."""
    return {name: {ch: r["status"] for ch, r in report["results"][name].items()}
            for name, rt in report["runtimes"].items() if rt["status"] == "ran"}


def test_a_1b_llama_exports_quantizes_and_verifies_in_bounded_memory(tmp_path):
    src = write_random_llama(tmp_path / "tinyllama", "tinyllama-1b", positions=32)
    # the folder holds what a TinyLlama-1.1B checkpoint holds: its shards' bytes are 2 per parameter, plus headers
    n = parameters(json.loads((src / "config.json").read_text()))
    shards = sorted(src.glob("model-*.safetensors"))
    index = json.loads((src / "model.safetensors.index.json").read_text())
    assert len(shards) >= 2 and {p.name for p in shards} == set(index["weight_map"].values())
    assert 2 * n <= sum(p.stat().st_size for p in shards) < 2 * n + 1e6 and 1.0e9 < n < 1.2e9

    f32, int4 = tmp_path / "f32", tmp_path / "int4"
    export = run_measured(["onnx", "--hf", src, "-o", f32], timeout=1800)
    assert export.returncode == 0, export.output[-3000:]
    assert (f32 / "model.onnx.data").stat().st_size > 4.3 * GB
    assert export.anon < 2.0 * GB, export.anon  # the weights are streamed: ~0.9 GB measured, never 4.4 GB

    checked = run_measured(["verify", f32, "--hf", src, "--runtime", "ort-cpu"], timeout=3600)
    assert checked.returncode == 0, checked.output[-3000:]
    report = _verdict(f32)
    assert report["verdict"]["status"] == "passed", report["verdict"]
    ran = _ran(report)
    assert "ort-cpu" in ran  # eager ran too: the reference
    for check in ("parity", "causality", "kv-consistency", "padding", "generation", "continuous-batching"):
        assert ran["ort-cpu"][check] is True, (check, ran["ort-cpu"])

    quantized = run_measured(["quantize", f32, "-o", int4, "--weights", "int4"], timeout=1800)
    assert quantized.returncode == 0, quantized.output[-3000:]
    assert quantized.anon < 2.0 * GB, quantized.anon
    assert _weights_bytes(int4) < 0.4 * _weights_bytes(f32)  # 0.86 GB inline (under 2 GB), against 4.4 GB

    # random weights are no quality benchmark: int4's relative logit error on this random 1.1 B model is 0.38, past
    # the 0.30 set for trained models (the figure is reported either way); every invariant is held exactly (on the
    # int8-activation file's float-activation twin) and the weights against the reference model's
    checked = run_measured(["verify", int4, "--hf", src, "--runtime", "ort-cpu", "--quality", "logit_err=0.5"],
                           timeout=3600)
    assert checked.returncode == 0, checked.output[-3000:]
    ran = _ran(_verdict(int4))
    for check in ("causality", "kv-consistency", "padding", "generation", "continuous-batching", "speculative",
                  "prefix-reuse", "quality", "weights"):
        assert ran["ort-cpu"][check] is True, (check, ran["ort-cpu"])
