"""--attention fused: our attention op, then onnxscript's ort_fusions (norms, Gelu, rotary, FusedMatMul); the graph
holds the fused ops it claims and computes what the decomposed graph computes."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from click.testing import CliRunner

from mhaexport.core import iospec
from mhaexport.exporter.lowering import lower_attention, op_counts
from mhaexport.exporter.lowering.fused import canonical_last_axis
from mhaexport.models.inputs import make_inputs


def _outputs(model: onnx.ModelProto, contract, batch, seq, past, seed=0):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    ids, mask, cache = make_inputs(contract, batch=batch, seq=seq, past=past, seed=seed)
    feed = iospec.make_feed(ids.numpy(), mask.numpy(), [(k.numpy(), v.numpy()) for k, v in cache])
    return sess.run(iospec.output_names(contract.n_layers), feed)


def test_the_default_decoder_fuses_norms_gelu_and_attention_and_computes_the_same(tiny, tiny_export):
    c = tiny.contract
    decomposed = onnx.load(str(tiny_export / "model.onnx"))
    fused = onnx.load(str(tiny_export / "model.onnx"))
    report = lower_attention(fused, "fused", n_heads=c.n_heads, head_dim=c.head_dim, n_kv_heads=c.n_kv_heads)
    counts = op_counts(fused)
    assert report.attention == "fused" and report.fused_nodes == c.n_layers
    assert counts.get("com.microsoft.MultiHeadAttention") == c.n_layers and "Softmax" not in counts
    # Pre-LN: each block's two LayerNorms take the residual sum -> SkipLayerNormalization, but the first one's
    assert counts.get("com.microsoft.SkipLayerNormalization") == 2 * c.n_layers
    assert counts.get("com.microsoft.BiasGelu") == c.n_layers and "Erf" not in counts
    assert "com.microsoft.FusedMatMul" not in counts  # the tied head stays a MatMul: quantize finds it
    assert counts.get("Split") == c.n_layers and report.fusions["packed_projections"] == c.n_layers  # Q, K, V as one
    assert report.fusions["skip_layer_normalization"] == 2 * c.n_layers
    assert json.loads(json.dumps(report.to_dict()))["fusions"] == report.fusions  # recorded in the manifest
    for batch, seq, past in [(1, 1, 0), (2, 7, 0), (1, 1, 13), (3, 5, 4)]:  # lengths never seen at export
        want = _outputs(decomposed, c, batch, seq, past)
        got = _outputs(fused, c, batch, seq, past)
        for w, g in zip(want, got):
            np.testing.assert_allclose(g, w, atol=2e-5, rtol=1e-4)


def test_reduce_mean_over_the_last_axis_is_written_as_minus_one():
    """The rule beside ort_fusions': their RMSNorm pattern wants axes [-1]; torch writes the positive axis."""
    import onnx_ir as ir
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, 1])
    z = helper.make_tensor_value_info("z", TensorProto.FLOAT, [2, 1, 8])
    axes2 = helper.make_tensor("axes2", TensorProto.INT64, [1], [2])
    axes1 = helper.make_tensor("axes1", TensorProto.INT64, [1], [1])
    g = helper.make_graph([helper.make_node("ReduceMean", ["x", "axes2"], ["y"], keepdims=1),
                           helper.make_node("ReduceMean", ["x", "axes1"], ["z"], keepdims=1)],
                          "g", [x], [y, z], [axes2, axes1])
    model = ir.serde.deserialize_model(helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)]))
    assert canonical_last_axis(model) == 1
    last, middle = list(model.graph)
    assert last.inputs[1].const_value.numpy().tolist() == [-1]
    assert middle.inputs[1].const_value.numpy().tolist() == [1]  # not the last axis: left alone


@pytest.mark.slow  # tiny-llama exports (~10-25 s each on 2 cores) and their verify
@pytest.mark.parametrize("kv_cache", ["concat", "shared"])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_llama_fused_export_passes_verify(tmp_path, kv_cache, dtype):
    """float16: the norms compute in float32 (an upcast), so their residual Adds stay unfused (ort_fusions' skip
    fusion would bind a float16 and a float32 input in one node, which ONNX Runtime refuses to load)."""
    from mhaexport.cli import main

    out = tmp_path / kv_cache
    res = CliRunner().invoke(main, ["onnx", "--config", "tiny-llama", "--attention", "fused", "--kv-cache", kv_cache,
                                    "--dtype", dtype, "-o", str(out)])
    assert res.exit_code == 0, res.output
    model = onnx.load(str(out / "model.onnx"))
    counts = op_counts(model)
    attention = "GroupQueryAttention" if kv_cache == "shared" else "MultiHeadAttention"
    assert counts.get(f"com.microsoft.{attention}") == 2
    if dtype == "float32":
        assert counts.get("com.microsoft.SkipSimplifiedLayerNormalization") == 4
    else:
        assert counts.get("SimplifiedLayerNormalization") == 5 and "com.microsoft.SkipSimplifiedLayerNormalization" \
            not in counts
    assert not {"Cos", "Sin"} & set(counts)  # rotary tables: constants, not computed per call
    if kv_cache == "shared":  # the builder's attention: packed Q | K | V in, the rotary inside, nothing around it
        assert not {"com.microsoft.RotaryEmbedding", "Split", "Transpose", "CumSum"} & set(counts)  # nor positions
        for gqa in (n for n in model.graph.node if n.op_type == "GroupQueryAttention"):
            attrs = {a.name: onnx.helper.get_attribute_value(a) for a in gqa.attribute}
            assert attrs["do_rotary"] == 1 and list(gqa.input[1:3]) == ["", ""] and gqa.input[7] and gqa.input[8]
    else:
        assert counts.get("com.microsoft.RotaryEmbedding") == 4  # q and k of each layer, cos/sin from a cache
    entry = json.loads((out / "manifest.json").read_text())["artifacts"]["onnx"]
    assert entry["attention"] == "fused" and entry["lowering"]["self_check_max_abs_diff"] < (1e-4 if dtype == "float32" else 1e-2)
    res = CliRunner().invoke(main, ["verify", str(out), "--runtime", "ort-cpu"])
    assert res.exit_code == 0, res.output


@pytest.mark.slow  # one tiny export (~6 s) and its verify
def test_the_default_decoder_over_a_shared_cache_feeds_the_packed_projection_to_the_attention(tmp_path):
    """No rotary in the built-in decoder: GroupQueryAttention still reads the packed Q | K | V projection (nothing
    between them) and no rotary attribute is set; verify passes."""
    from mhaexport.cli import main

    out = tmp_path / "fs"
    res = CliRunner().invoke(main, ["onnx", "--config", "tiny", "--attention", "fused", "--kv-cache", "shared",
                                    "-o", str(out)])
    assert res.exit_code == 0, res.output
    model = onnx.load(str(out / "model.onnx"))
    counts = op_counts(model)
    assert not {"Split", "com.microsoft.RotaryEmbedding"} & set(counts)
    weights = {i.name for i in model.graph.initializer}
    assert all(n.input[0] in weights for n in model.graph.node if n.op_type == "Transpose")  # the tied head's only
    for gqa in (n for n in model.graph.node if n.op_type == "GroupQueryAttention"):
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in gqa.attribute}
        assert list(gqa.input[1:3]) == ["", ""] and "do_rotary" not in attrs and len(gqa.input) == 7
    res = CliRunner().invoke(main, ["verify", str(out), "--runtime", "ort-cpu"])
    assert res.exit_code == 0, res.output
