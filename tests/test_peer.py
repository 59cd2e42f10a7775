"""bench --builder: onnxruntime-genai's model builder on the same Hugging Face model, its files adopted and timed
beside ours in one run, rows labelled by producer, the int4 file's bytes per token counted from its graph."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from mhaexport.cli import main


@pytest.mark.parametrize("args, says", [
    (["--builder", "fp8"], "--builder 'fp8': expected a comma list of fp32, int4"),
    (["--builder", "fp32"], "holds preset:tiny, not a Hugging Face model; onnxruntime-genai's builder reads"),
])
def test_bad_builder_requests_are_refused_before_any_work(tiny_export, tmp_path, args, says):
    res = CliRunner().invoke(main, ["bench", str(tiny_export), *args, "-o", str(tmp_path / "b")])
    assert res.exit_code == 2 and says in res.output and "Traceback" not in res.output, res.output
    assert not (tmp_path / "b").exists()


@pytest.mark.slow  # the builder twice (~20 s each here), an --hf export, a short bench
def test_the_builders_files_are_timed_beside_ours(hf_dir, tmp_path):
    pytest.importorskip("onnxruntime_genai")
    folder = tmp_path / "ours"
    res = CliRunner().invoke(main, ["-q", "onnx", "--hf", str(hf_dir("llama")), "-o", str(folder)])
    assert res.exit_code == 0, res.output
    res = CliRunner().invoke(main, ["-q", "bench", str(folder), "--builder", "fp32,int4", "--runtimes", "ort-cpu",
                                    "--new-tokens", "4", "--repeats", "1", "--long", "0", "-o", str(tmp_path / "b")])
    assert res.exit_code == 0, res.output
    rows = {r["name"]: r for r in json.loads((tmp_path / "b" / "bench.json").read_text())["runtimes"]}
    fp32 = next(r for n, r in rows.items() if "onnxruntime-genai float32 kv=shared" in n)
    int4 = next(r for n, r in rows.items() if "onnxruntime-genai float32 int4" in n)
    assert fp32["token_p50_ms"] > 0 and int4["token_p50_ms"] > 0
    assert int4["weight_bytes_per_token"] < 0.3 * fp32.get("weight_bytes_per_token", rows["ort-cpu"].get(
        "weight_bytes_per_token") or 1e18)  # int4 counted as int4, not as the float model's bytes
    # a second run reuses the adopted builds
    res = CliRunner().invoke(main, ["bench", str(folder), "--builder", "fp32", "--runtimes", "ort-cpu",
                                    "--new-tokens", "4", "--repeats", "1", "--long", "0", "-o", str(tmp_path / "b")])
    assert res.exit_code == 0 and "reusing" in res.output, res.output
