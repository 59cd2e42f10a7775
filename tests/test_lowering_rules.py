"""The lowering's rewrite rules on small hand-written graphs: every attention variant the pattern accepts becomes
one fused node that computes what the decomposed graph computes, and a near miss is refused saying why."""

from __future__ import annotations

import math

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from mhaexport.core.errors import ExportError
from mhaexport.exporter.lowering import lower_attention, op_counts

B, H, T, P, D = 2, 2, 3, 2, 4  # batch, heads, new tokens, past tokens, head size
S = P + T
FUSED = {"onnx": "Attention", "ort": "com.microsoft.MultiHeadAttention"}
OPSET = {"onnx": 23, "ort": 18}


def _graph(attention: str, *, scale: str = "div", mask: str = "masked", nan_guard: bool = False, kv: bool = False,
           k_transposed: bool = True, q_factor: bool = False, softmax_axis: int = -1, fill: float | None = None,
           non_scalar_scale: bool = False) -> onnx.ModelProto:
    """One decomposed attention, written the way an exporter writes it, with the variant's choices."""
    f32 = TensorProto.FLOAT
    inputs = [helper.make_tensor_value_info("q", f32, [B, H, T, D])]
    outputs = [helper.make_tensor_value_info("out", f32, [B, H, T, D])]
    nodes, inits = [], []

    def const(name: str, value) -> str:
        inits.append(numpy_helper.from_array(np.asarray(value, dtype=np.float32), name))
        return name

    if kv:
        inputs += [helper.make_tensor_value_info(n, f32, [B, H, P if n.startswith("past") else T, D])
                   for n in ("past_key", "past_value", "k_new", "v_new")]
        nodes += [helper.make_node("Concat", ["past_key", "k_new"], ["k"], axis=2),
                  helper.make_node("Concat", ["past_value", "v_new"], ["v"], axis=2)]
        outputs += [helper.make_tensor_value_info(n, f32, [B, H, S, D]) for n in ("k", "v")]
    else:
        inputs.append(helper.make_tensor_value_info("v", f32, [B, H, S, D]))
        inputs.append(helper.make_tensor_value_info("k" if k_transposed else "kt", f32,
                                                    [B, H, S, D] if k_transposed else [B, H, D, S]))
    if k_transposed:
        nodes.append(helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]))  # (B, H, D, S)
    q, kt = "q", "kt"
    if q_factor:  # a Mul on Q by a graph input: not a constant scale, it stays
        inputs.append(helper.make_tensor_value_info("q_factor", f32, [1]))
        nodes.append(helper.make_node("Mul", ["q", "q_factor"], ["q_f"]))
        q = "q_f"
    if scale == "sdpa":  # Q and Kᵀ each scaled by D ** -0.25
        root = const("root_scale", D ** -0.25)
        nodes += [helper.make_node("Mul", [q, root], ["q_s"]), helper.make_node("Mul", [kt, root], ["kt_s"])]
        q, kt = "q_s", "kt_s"
    nodes.append(helper.make_node("MatMul", [q, kt], ["qk"]))  # (B, H, T, S)
    scores = "qk"
    if scale in ("div", "mul"):
        c = math.sqrt(D) if scale == "div" else 1 / math.sqrt(D)
        nodes.append(helper.make_node(scale.capitalize(), ["qk", const("c", [c] * S if non_scalar_scale else c)],
                                      ["scaled"]))
        scores = "scaled"
    if mask in ("masked", "allowed"):
        inputs.append(helper.make_tensor_value_info("cond", TensorProto.BOOL, [B, 1, T, S]))
        fill_c = const("fill", np.finfo(np.float32).min if fill is None else fill)
        args = ["cond", fill_c, scores] if mask == "masked" else ["cond", scores, fill_c]
        nodes.append(helper.make_node("Where", args, ["masked_scores"]))
        scores = "masked_scores"
    elif mask in ("bias", "bias_first"):
        inputs.append(helper.make_tensor_value_info("bias", f32, [B, 1, T, S]))
        nodes.append(helper.make_node("Add", [scores, "bias"] if mask == "bias" else ["bias", scores], ["biased"]))
        scores = "biased"
    nodes.append(helper.make_node("Softmax", [scores], ["w"], axis=softmax_axis))
    weights = "w"
    if nan_guard:
        nodes += [helper.make_node("IsNaN", ["w"], ["w_nan"]),
                  helper.make_node("Where", ["w_nan", const("zero", 0.0), "w"], ["w_safe"])]
        weights = "w_safe"
    nodes.append(helper.make_node("MatMul", [weights, "v"], ["out"]))
    graph = helper.make_graph(nodes, "attention", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET[attention])])
    model.ir_version = 10
    meta = model.graph.node[-1].metadata_props.add()
    meta.key, meta.value = "pkg.torch.onnx.name_scopes", "['', 'blocks.0', 'blocks.0.attn', 'matmul_1']"
    return model


def _feed(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    allowed = np.arange(S)[None, :] <= np.arange(T)[:, None] + P  # (T, S)
    allowed = np.broadcast_to(allowed, (B, 1, T, S)).copy()
    allowed[1, :, :, 0] = False  # row 1: one padded key
    feed = {}
    for i in model.graph.input:
        shape = [d.dim_value for d in i.type.tensor_type.shape.dim]
        if i.name == "cond":
            masked = any(n.op_type == "Where" and n.input[1] == "fill" for n in model.graph.node)
            feed[i.name] = ~allowed if masked else allowed
        elif i.name == "bias":
            feed[i.name] = np.where(allowed, 0.0, -1e9).astype(np.float32)
        else:
            feed[i.name] = rng.standard_normal(shape).astype(np.float32)
    return feed


def _run(model: onnx.ModelProto, feed: dict) -> list[np.ndarray]:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feed)


VARIANTS = {
    "div-masked": {},
    "mul-allowed": {"scale": "mul", "mask": "allowed"},
    "div-bias": {"mask": "bias"},
    "div-bias-first": {"mask": "bias_first"},
    "unscaled-unmasked": {"scale": "none", "mask": "none"},
    "sdpa-scaled-q-k-nan-guard": {"scale": "sdpa", "mask": "bias", "nan_guard": True},
    "kt-without-transpose": {"k_transposed": False},
    "q-times-a-graph-input": {"q_factor": True},
    "kv-cache": {"kv": True},
    "kv-cache-sdpa": {"kv": True, "scale": "sdpa", "mask": "allowed", "nan_guard": True},
}


@pytest.mark.parametrize("attention", ["onnx", "ort"])
@pytest.mark.parametrize("variant", VARIANTS)
def test_each_variant_becomes_one_fused_node_that_computes_the_same(attention, variant):
    model = _graph(attention, **VARIANTS[variant])
    feed = _feed(model)
    want = _run(model, feed)
    report = lower_attention(model, attention, n_heads=H, head_dim=D)
    counts = op_counts(model)
    assert counts[FUSED[attention]] == report.fused_nodes == 1
    assert "Softmax" not in counts and counts.get("MatMul", 0) == 0
    assert report.kv_cache_in_op is VARIANTS[variant].get("kv", False)
    onnx.checker.check_model(model, full_check=attention == "onnx")  # contrib ops have no schema to check against
    fused = next(n for n in model.graph.node if n.op_type == FUSED[attention].rsplit(".", 1)[-1])
    scale = next(a.f for a in fused.attribute if a.name == "scale")
    assert scale == pytest.approx(1 / math.sqrt(D) if VARIANTS[variant].get("scale") != "none" else 1.0)
    scopes = {p.key: p.value for p in fused.metadata_props}["pkg.torch.onnx.name_scopes"]
    assert "blocks.0.attn" in scopes  # the final MatMul's module scope, carried to the fused node
    got = _run(model, feed)
    for name, g, w in zip([o.name for o in model.graph.output], got, want):
        np.testing.assert_allclose(g, w, atol=1e-5, rtol=1e-5, err_msg=f"{variant} {attention}: {name}")


@pytest.mark.parametrize("variant,reason", [
    ({"softmax_axis": 2}, r"Softmax \S+ is over axis 2, not the key axis"),
    ({"fill": 0.0}, r"Where \S+ before Softmax has no large negative fill"),
    ({"non_scalar_scale": True}, r"Div \S+ scales scores by a non-scalar"),
])
def test_a_near_miss_is_refused_saying_why_and_leaves_the_graph_alone(variant, reason):
    model = _graph("ort", **variant)
    before = model.SerializeToString()
    with pytest.raises(ExportError, match=r"--attention ort: 1 of 1 Softmax node\(s\) are not a recognized "
                                          rf"attention pattern \({reason}\); export with --attention decomposed"):
        lower_attention(model, "ort", n_heads=H, head_dim=D)
    assert model.SerializeToString() == before
