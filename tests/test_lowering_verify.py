"""Every attention lowering, in float32 and float16, passes `mhaexport verify` on ONNX Runtime CPU, and the
report names the lowering and dtype."""

from __future__ import annotations

import pytest

from mhaexport.exporter.onnx import export_onnx
from mhaexport.verify import verify_folder
from mhaexport.verify.render import markdown

CASES = [
    # ~5 s each; tests/test_export_paths.py verifies every lowering x cache of tiny and tiny-llama in the fast run
    pytest.param("onnx", "float32", marks=pytest.mark.slow),
    pytest.param("ort", "float32", marks=pytest.mark.slow),
    pytest.param("decomposed", "float16", marks=pytest.mark.slow),
    pytest.param("onnx", "float16", marks=pytest.mark.slow),
    pytest.param("ort", "float16", marks=pytest.mark.slow),
]


@pytest.mark.parametrize("attention,dtype", CASES)
def test_lowering_passes_verify(tiny, tmp_path, attention, dtype):
    export_onnx(tiny, tmp_path, attention=attention, dtype=dtype)
    report = verify_folder(tmp_path, loaded=tiny, runtimes=("eager", "ort-cpu"))
    failed = {(rt, name) for rt, checks in report.results.items() for name, r in checks.items() if r.status is False}
    assert not failed, markdown(report)
    ort = report.results["ort-cpu"]
    for check in ("parity", "finite", "causality", "kv-consistency", "padding", "dynamic-shapes", "generation"):
        assert ort[check].status is True, (check, ort[check].message)
    assert f"attention {attention}" in markdown(report) and dtype in markdown(report)


@pytest.mark.slow  # ~5 s; test_lowering's CLI test covers --attention on the export verbs
def test_all_verb_takes_the_lowering_options(tmp_path):
    import json

    from click.testing import CliRunner

    from mhaexport.cli import main

    res = CliRunner().invoke(main, ["all", "--config", "tiny", "--attention", "ort", "--runtime", "eager",
                                    "--runtime", "ort-cpu", "-o", str(tmp_path)])
    assert res.exit_code == 0, res.output
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["artifacts"]["onnx"]["attention"] == "ort"
    assert "attention ort" in (tmp_path / "report.md").read_text()


# --- grouped-query attention (the Llama-shaped preset: 4 query heads share 2 key/value heads) -----------------------

@pytest.fixture(scope="module")
def tiny_llama():
    from mhaexport.models.loading import load_model

    return load_model("tiny-llama")


@pytest.mark.slow  # ~9 s: exports tiny-llama; test_lowering_rules holds the GQA rule on a small graph
def test_gqa_onnx_attention_groups_the_heads_itself_and_takes_the_cache(tiny_llama, tmp_path):
    """--attention onnx on a GQA model: the ONNX Attention op gets the un-repeated (B, H_kv, S, D) cache and
    writes present.* itself; no repeat_interleave (Expand) is left; every check passes on ONNX Runtime CPU."""
    import onnx

    from mhaexport.exporter.lowering import op_counts

    rec = export_onnx(tiny_llama, tmp_path, attention="onnx")
    low = rec.manifest.artifacts["onnx"].details.lowering
    assert low.fused_nodes == 2 and low.kv_cache_in_op is True
    model = onnx.load(str(tmp_path / "model.onnx"))
    counts = op_counts(model)
    assert counts.get("Attention") == 2 and "Expand" not in counts and "Softmax" not in counts
    kv = {o.name: [d.dim_param or d.dim_value for d in o.type.tensor_type.shape.dim] for o in model.graph.output}
    assert kv["present.0.key"] == ["batch_size", 2, "total_sequence_length", 16]
    report = verify_folder(tmp_path, loaded=tiny_llama, runtimes=("ort-cpu",))
    assert report.passed, markdown(report)


@pytest.mark.slow
@pytest.mark.parametrize("attention,dtype", [("ort", "float32"), ("decomposed", "float16"), ("onnx", "float16"),
                                             ("ort", "float16")])
def test_gqa_lowerings_and_float16_pass_verify(tiny_llama, tmp_path, attention, dtype):
    """ort: MultiHeadAttention takes as many key/value heads as query heads, so it gets the repeated K/V and the
    (grouped) cache stays outside the op — correct, as verify proves; float16 on every lowering."""
    rec = export_onnx(tiny_llama, tmp_path, attention=attention, dtype=dtype)
    if attention == "ort":
        assert rec.manifest.artifacts["onnx"].details.lowering.kv_cache_in_op is False
    report = verify_folder(tmp_path, loaded=tiny_llama, runtimes=("ort-cpu",))
    assert report.passed, markdown(report)
