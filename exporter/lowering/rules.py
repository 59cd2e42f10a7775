"""The decomposed attention as onnxscript rewrite rules, and the fused nodes each lowering writes in its place.

One pattern covers the attention torch.onnx writes for eager code and for ``scaled_dot_product_attention``
(brackets: optional; ``|``: an ``OrValue`` of alternatives)::

    MatMul(Q [* a], Kᵀ [* b])                    Kᵀ = Transpose(K, perm=[0, 1, 3, 2]) | any (B, H, D, S) value
      [-> Div(c) | Mul(c)]                       the scale
      [-> Where(masked, fill, ·) | Where(allowed, ·, fill) | Add(·, bias) | Add(bias, ·)]
      -> Softmax(axis=-1 | 3)
      [-> Where(IsNaN(w), 0, w)]                 SDPA's NaN guard
      -> MatMul(·, V)

Two rules share it: ``kv-cache``, where K and V are ``Concat(past_key_values.i.*, new, axis=2)`` of graph inputs
and the fused op takes the cache and writes ``present.i.*`` itself, and ``plain``, tried when the first does not
apply. With grouped-query attention K and V reach the scores through ``repeat_interleave`` over the head axis
(``Reshape(Expand(Unsqueeze(·, 2)))``: query head h reads key/value head h // (H / H_kv)); the kv-cache rule takes
the un-repeated cache, which the ONNX ``Attention`` op groups itself. ``MultiHeadAttention`` needs as many key/value
heads as query heads, so for ``ort`` the plain rule takes the repeated K and V and the cache stays outside the op. Each rule's ``check`` turns a match into a :class:`MatchedAttention` record (or says why it is none) and
``rewrite`` hands the record to the lowering's writer in :data:`FUSE`.

Every node a rewrite writes carries the metadata of the attention's final MatMul, ``pkg.torch.onnx.name_scopes``
included, so bisect places the fused op in the attention module that computed it.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import pattern

from mhaexport.core.errors import ExportError
from mhaexport.core.graph import MASK_FILL_AT_MOST, MS_DOMAIN

KEY_AXES = (-1, 3)  # Softmax over the key axis of (B, H, T, S)
SEQ_AXES = (2, -2)  # the KV cache grows along axis 2 of (B, H, S, D)
TRANSPOSE_LAST = [0, 1, 3, 2]  # (B, H, S, D) <-> (B, H, D, S)
BHTD_TO_BTHD = [0, 2, 1, 3]  # (B, H, T, D) <-> (B, T, H, D), its own inverse


@dataclass
class MatchedAttention:
    """One matched attention in the fused op's terms (values of the graph being rewritten)."""

    q: ir.Value  # (B, H, T, D)
    v: ir.Value | None  # (B, H, S, D); None in the kv-cache rule (new_value and past_value instead)
    k: ir.Value | None  # (B, H, S, D), when Kᵀ is a Transpose of it
    kt: ir.Value | None  # (B, H, D, S), when K is not a Transpose away
    scale: float
    softcap: float = 0.0  # c of c * tanh(scores / c) before the mask; 0: none
    q_factor: ir.Value | None = None  # a Mul on Q by a non-constant: kept, Q := Mul(q, q_factor)
    k_factor: ir.Value | None = None  # the same on Kᵀ
    masked: ir.Value | None = None  # bool (B|1, 1, T, S), True where attention may NOT look
    allowed: ir.Value | None = None  # bool (B|1, 1, T, S), True where attention may look
    bias: ir.Value | None = None  # the model's own additive float mask
    fill_dtype: ir.DataType = ir.DataType.FLOAT  # dtype of the Where fill: the attention math's dtype
    past: tuple[ir.Value, ir.Value, ir.Value, ir.Value] | None = None  # past_key, past_value, new_key, new_value
    graph: Any = None  # the graph being rewritten (the GroupQueryAttention writer reads its attention_mask input)
    metadata: dict[str, str] = field(default_factory=dict)  # the final MatMul's metadata_props


def _const(value: ir.Value | None) -> tuple[float, ir.DataType] | None:
    """A one-element constant (initializer or Constant node, through Cast/Identity): its value and dtype."""
    while value is not None:
        tensor = ir.convenience.get_const_tensor(value)
        if tensor is not None:
            if tensor.size != 1:
                return None
            return float(tensor.numpy().reshape(())), tensor.dtype
        node = value.producer()
        if node is None or node.op_type not in ("Cast", "Identity"):
            return None
        value = node.inputs[0]
    return None


def _label(node: ir.Node) -> str:
    """A node's name, else its first output's (as the messages name nodes)."""
    return node.name or (node.outputs[0].name if node.outputs else "") or "?"


def _scalar(value: ir.Value | None) -> float | None:
    c = _const(value)
    return None if c is None else c[0]


def _fill_value(dtype: ir.DataType) -> float:
    """Half the dtype's lowest finite value (module docstring of exporter.lowering says why half)."""
    if dtype == ir.DataType.BFLOAT16:
        return -1.6e38  # bfloat16 has float32's range
    return float(np.finfo(dtype.numpy()).min) / 2


@dataclass
class Shared:
    """What the rules of one lowering call share: fresh names and the constants and biases already written."""

    names: itertools.count = field(default_factory=lambda: itertools.count(1))
    consts: dict[Any, ir.Value] = field(default_factory=dict)
    biases: dict[tuple[ir.Value, str], ir.Value] = field(default_factory=dict)  # (bool mask, kind) -> bias

    def fresh(self, base: str) -> str:
        return f"_lower_{base}_{next(self.names)}"


class AttentionRule(pattern.RewriteRuleClassBase):
    """Match one decomposed attention; rewrite it into the ``attention`` lowering's fused op."""

    def __init__(self, attention: str, *, kv_cache: bool, n_heads: int, head_dim: int, shared: Shared,
                 n_kv_heads: int | None = None, windows: tuple[int, ...] | None = None) -> None:
        super().__init__(name=f"{attention}-attention-{'kv-cache' if kv_cache else 'plain'}")
        self.attention, self.kv_cache = attention, kv_cache
        self.n_heads, self.head_dim = n_heads, head_dim
        self.n_kv_heads = n_kv_heads or n_heads
        self.shared = shared
        self.windows = windows  # per layer the contract's sliding window (0: full); GroupQueryAttention's own mask
        self._match: MatchedAttention | None = None  # set by check, read by rewrite (called right after it)

    def pattern(self, op, q, q_scale, k, kt, k_scale, v, past_key, past_value, new_key, new_value, qk_scale, cond,
                fill, bias, nan_zero, k_axes, k_expand, k_shape, v_axes, v_expand, v_shape, cap_in, cap_out):
        if self.kv_cache:
            kc = op.Concat(past_key, new_key, axis=pattern.AttrVar("k_axis"))  # (B, H_kv, S, D): present.i.key
            vc = op.Concat(past_value, new_value, axis=pattern.AttrVar("v_axis"))  # (B, H_kv, S, D)
            # grouped-query attention: repeat_interleave over the head axis, (B, H_kv, S, D) -> (B, H, S, D)
            k = pattern.OrValue([op.Reshape(op.Expand(op.Unsqueeze(kc, k_axes), k_expand), k_shape), kc],
                                tag_var="k_repeated", tag_values=[True, False])
            v = pattern.OrValue([op.Reshape(op.Expand(op.Unsqueeze(vc, v_axes), v_expand), v_shape), vc],
                                tag_var="v_repeated", tag_values=[True, False])
            key_t = op.Transpose(k, perm=TRANSPOSE_LAST)  # (B, H, D, S)
        else:
            key_t = pattern.OrValue([op.Transpose(k, perm=TRANSPOSE_LAST), kt], tag_var="k_transposed",
                                    tag_values=[True, False])  # (B, H, D, S)
        query = pattern.OrValue([op.Mul(q, q_scale), q], tag_var="q_scaled", tag_values=[True, False])
        key_t = pattern.OrValue([op.Mul(key_t, k_scale), key_t], tag_var="k_scaled", tag_values=[True, False])
        scores = op.MatMul(query, key_t)  # (B, H, T, S)
        scores = pattern.OrValue([op.Div(scores, qk_scale), op.Mul(scores, qk_scale), scores],
                                 tag_var="qk_scaling", tag_values=["Div", "Mul", "none"])
        # an attention softcap c * tanh(scores / c) (Gemma 2): only GroupQueryAttention takes it (``softcap``)
        scores = pattern.OrValue([op.Mul(op.Tanh(op.Div(scores, cap_in)), cap_out), scores], tag_var="softcapped",
                                 tag_values=[True, False])
        scores = pattern.OrValue([op.Where(cond, fill, scores), op.Where(cond, scores, fill),
                                  op.Add(scores, bias), op.Add(bias, scores), scores],
                                 tag_var="mask", tag_values=["masked", "allowed", "bias", "bias", "none"])
        weights = op.Softmax(scores, axis=pattern.AttrVar("axis", can_match_none=True))  # (B, H, T, S)
        weights = pattern.OrValue([op.Where(op.IsNaN(weights), nan_zero, weights), weights],
                                  tag_var="nan_guard", tag_values=[True, False])
        out = op.MatMul(weights, v)  # (B, H, T, D)
        return (out, kc, vc) if self.kv_cache else out

    def check(self, context, *, axis: Any = None, qk_scaling: str | None = None, softcapped: bool = False,
              mask: str | None = None, nan_guard: bool = False, k_repeated: bool = False, v_repeated: bool = False,
              **b: Any) -> pattern.MatchResult:
        """Turn the bindings into a :class:`MatchedAttention` (kept for ``rewrite``) or fail saying why. The
        pattern's tags and optional attribute are keywords (absent: not matched); ``b``: its values by name."""
        result = pattern.MatchResult()
        self._match = None
        nodes = {n.op_type: n for n in reversed(context.nodes)}  # the first matched node of each op type
        softmax = nodes["Softmax"]
        axis = -1 if axis is None else axis.as_int()
        if axis not in KEY_AXES:
            return result.fail(f"Softmax {_label(softmax)} is over axis {axis}, not the key axis", softmax)
        scale = 1.0
        if (how := qk_scaling) in ("Div", "Mul"):
            c = _scalar(b["qk_scale"])
            if c is None or c == 0.0:
                scaler = next(u.node for u in b["qk_scale"].uses() if u.node in context.nodes)
                return result.fail(f"{how} {_label(scaler)} scales scores by a non-scalar", scaler)
            scale = 1.0 / c if how == "Div" else c
        factors = {}
        for side in ("q", "k"):
            factors[side] = None
            if b.get(f"{side}_scaled"):
                c = _scalar(b[f"{side}_scale"])
                if c is None:
                    factors[side] = b[f"{side}_scale"]  # not a constant: the Mul stays in front of the op
                else:
                    scale *= c
        a = MatchedAttention(q=b["q"], v=b["v"], k=b["k"], kt=b["kt"], scale=scale, q_factor=factors["q"],
                             k_factor=factors["k"], metadata=dict(context.root.metadata_props),
                             graph=context.graph_or_function)
        if softcapped:
            cap, cap_out = _scalar(b["cap_in"]), _scalar(b["cap_out"])
            tanh = nodes["Tanh"]
            if cap is None or cap <= 0.0 or cap != cap_out:
                return result.fail(f"Tanh {_label(tanh)} before the mask is not a softcap c * tanh(scores / c)", tanh)
            if self.attention != "gqa":
                return result.fail(f"Tanh {_label(tanh)}: an attention softcap ({cap:g}); only GroupQueryAttention "
                                   "(--kv-cache shared) takes one", tanh)
            a.softcap = cap
        if self.attention == "gqa" and not self.kv_cache:
            return result.fail(f"Softmax {_label(softmax)}: the shared KV cache needs K and V to be "
                               "Concat(past_key_values.i.*, new) of the graph's cache inputs", softmax)
        if mask in ("masked", "allowed"):
            where = softmax.inputs[0].producer()
            c = _const(b["fill"])
            if c is None or c[0] > MASK_FILL_AT_MOST:
                return result.fail(f"Where {_label(where)} before Softmax has no large negative fill", where)
            a.fill_dtype = c[1] if c[1].is_floating_point() else _first_float_input(context.graph_or_function)
            setattr(a, mask, b["cond"])
        elif mask == "bias":
            a.bias = b["bias"]
        if nan_guard and _scalar(b["nan_zero"]) != 0.0:
            return result.fail(f"the Where after Softmax {_label(softmax)} is not SDPA's NaN guard "
                               "Where(IsNaN(w), 0, w)", softmax)
        if self.kv_cache:
            concat = nodes["Concat"]
            if a.k_factor is not None:
                return result.fail("Kᵀ is scaled by a non-constant: the KV cache cannot go through the op", concat)
            if b["k_axis"].as_int() not in SEQ_AXES or b["v_axis"].as_int() not in SEQ_AXES:
                return result.fail(f"Concat {_label(concat)} of K or V is not along the sequence axis", concat)
            if not (b["past_key"].is_graph_input() and b["past_value"].is_graph_input()):
                return result.fail(f"Concat {_label(concat)} of K or V does not start from a graph input "
                                   "(past_key_values.*)", concat)
            if k_repeated or v_repeated:
                if not (k_repeated and v_repeated):
                    return result.fail("only one of K and V is repeated over the heads", concat)
                for side in ("k", "v"):
                    axes = ir.convenience.get_const_tensor(b[f"{side}_axes"])
                    if axes is None or axes.numpy().reshape(-1).tolist() not in ([2], [-3]):
                        return result.fail(f"{side.upper()} is repeated over the heads by an Unsqueeze that is not "
                                           "repeat_interleave's (axis 2)", concat)
                if self.attention == "ort":
                    return result.fail("MultiHeadAttention takes as many key/value heads as query heads: with "
                                       "grouped-query attention the cache stays outside the fused op", concat)
            if self.attention == "gqa" and not any(i.name == "attention_mask" for i in a.graph.inputs):
                return result.fail("GroupQueryAttention's sequence lengths come from the attention_mask input, "
                                   "which the graph does not have", concat)
            a.k, a.v = None, None  # the op takes the new K/V and the past, not the concatenated cache
            a.past = (b["past_key"], b["past_value"], b["new_key"], b["new_value"])
        self._match = a
        return result

    def rewrite(self, op, **_: Any):
        """Write the fused op for the match ``check`` accepted; every node gets the final MatMul's metadata."""
        a = self._match
        assert a is not None, "rewrite without a successful check"
        outputs = FUSE[self.attention](self, op, a)
        for node in op.nodes:
            node.metadata_props.update(a.metadata)
        return outputs

    # ---- building blocks for the writers in FUSE -------------------------------------------------------------

    def node(self, op, op_type: str, *inputs: ir.Value | None, base: str, n_out: int = 1, domain: str = "",
             **attrs: Any) -> Any:
        """One node named ``_lower_{base}_{n}``; trailing absent inputs dropped."""
        ins = list(inputs)
        while ins and ins[-1] is None:
            ins.pop()
        name = self.shared.fresh(base)
        outs = [name] if n_out == 1 else [f"{name}_{i}" for i in range(n_out)]
        return op.op(op_type, *ins, _domain=domain, _name=name, _outputs=outs, **attrs)

    def const(self, op, key: Any, base: str, array: np.ndarray) -> ir.Value:
        """An initializer written once per lowering call and shared by every fused node that needs it."""
        if key not in self.shared.consts:
            name = self.shared.fresh(base)
            self.shared.consts[key] = op.initializer(ir.tensor(array, name=name), name=name)
        return self.shared.consts[key]

    def attention_bias(self, op, a: MatchedAttention) -> ir.Value | None:
        """The mask as an additive bias: ``Where(masked, fill, 0)`` / ``Where(allowed, 0, fill)``, one per mask."""
        if a.bias is not None or (a.masked is None and a.allowed is None):
            return a.bias
        cond = a.masked if a.masked is not None else a.allowed
        key = (cond, "masked" if a.masked is not None else "allowed")
        if key not in self.shared.biases:
            dt = a.fill_dtype
            zero = self.const(op, ("zero", dt), "zero", np.array(0.0, dtype=dt.numpy()))
            fill = self.const(op, ("fill", dt), "fill", np.array(_fill_value(dt), dtype=dt.numpy()))
            pair = (fill, zero) if a.masked is not None else (zero, fill)
            self.shared.biases[key] = self.node(op, "Where", cond, *pair, base="attn_bias")  # (B|1, 1, T, S)
        return self.shared.biases[key]

    def sequence_lengths(self, op, graph: Any) -> tuple[ir.Value, ir.Value]:
        """GroupQueryAttention's ``seqlens_k`` (int32 (B,): real tokens - 1 per row) and ``total_sequence_length``
        (int32 scalar: the mask's width), computed once from the ``attention_mask`` input and shared by every layer."""
        if "seqlens" not in self.shared.consts:
            mask = next(i for i in graph.inputs if i.name == "attention_mask")  # int64 (B, S)
            axis = self.const(op, "axis1", "axis1", np.array([1], dtype=np.int64))
            one = self.const(op, "one_i64", "one", np.array(1, dtype=np.int64))
            scalar = self.const(op, "scalar_shape", "scalar_shape", np.array([], dtype=np.int64))
            real = self.node(op, "ReduceSum", mask, axis, base="real_tokens", keepdims=0)  # (B,)
            last = self.node(op, "Sub", real, one, base="seqlens_k_i64")  # (B,)
            self.shared.consts["seqlens"] = self.node(op, "Cast", last, base="seqlens_k", to=ir.DataType.INT32)
            width = self.node(op, "Shape", mask, base="mask_width", start=1, end=2)  # (1,)
            width = self.node(op, "Reshape", width, scalar, base="total_i64")  # ()
            self.shared.consts["total"] = self.node(op, "Cast", width, base="total_sequence_length",
                                                    to=ir.DataType.INT32)
        return self.shared.consts["seqlens"], self.shared.consts["total"]

    def query(self, op, a: MatchedAttention) -> ir.Value:
        """Q in (B, H, T, D), with a non-constant factor applied."""
        if a.q_factor is None:
            return a.q
        return self.node(op, "Mul", a.q, a.q_factor, base="q")  # (B, H, T, D)

    def key(self, op, a: MatchedAttention) -> ir.Value:
        """K in (B, H, S, D): the matched one, or a Transpose of Kᵀ (with a non-constant factor applied)."""
        if a.k is not None and a.k_factor is None:
            return a.k
        kt = a.kt if a.k is None else self.node(op, "Transpose", a.k, base="kt", perm=TRANSPOSE_LAST)
        if a.k_factor is not None:
            kt = self.node(op, "Mul", kt, a.k_factor, base="kt")  # (B, H, D, S)
        return self.node(op, "Transpose", kt, base="k", perm=TRANSPOSE_LAST)  # (B, H, S, D)


def _first_float_input(graph: ir.Graph) -> ir.DataType:
    for value in graph.inputs:
        if value.dtype is not None and value.dtype.is_floating_point():
            return value.dtype
    return ir.DataType.FLOAT


def _fuse_onnx(rule: AttentionRule, op, a: MatchedAttention) -> Any:
    """ONNX ``Attention`` (opset 23): Q, K, V in (B, H, T|S, D), the mask as ``attn_mask`` (additive)."""
    q, bias = rule.query(op, a), rule.attention_bias(op, a)
    if a.past is not None:
        past_key, past_value, new_key, new_value = a.past
        return rule.node(op, "Attention", q, new_key, new_value, bias, past_key, past_value, base="Attention",
                         n_out=3, scale=a.scale)  # Y (B, H, T, D), present_key/value (B, H, S, D)
    return rule.node(op, "Attention", q, rule.key(op, a), a.v, bias, base="Attention", scale=a.scale)


def _fuse_ort(rule: AttentionRule, op, a: MatchedAttention) -> Any:
    """``com.microsoft.MultiHeadAttention``: query (and new key/value) in (B, T, H*D); past/present and a
    cache-free key/value in (B, H, S, D)."""
    H, D = rule.n_heads, rule.head_dim
    shape3 = rule.const(op, "shape3", "shape3", np.array([0, 0, H * D], dtype=np.int64))
    shape4 = rule.const(op, "shape4", "shape4", np.array([0, 0, H, D], dtype=np.int64))

    def bsh(x: ir.Value) -> ir.Value:  # (B, H, T, D) -> (B, T, H*D)
        t = rule.node(op, "Transpose", x, base="bsnh", perm=BHTD_TO_BTHD)  # (B, T, H, D)
        return rule.node(op, "Reshape", t, shape3, base="bsh")  # (B, T, H*D)

    q3, bias = bsh(rule.query(op, a)), rule.attention_bias(op, a)
    mha = {"base": "MultiHeadAttention", "domain": MS_DOMAIN, "num_heads": H, "scale": a.scale}
    if a.past is not None:
        past_key, past_value, new_key, new_value = a.past
        y3, present_key, present_value = rule.node(op, "MultiHeadAttention", q3, bsh(new_key), bsh(new_value), None,
                                                   None, bias, past_key, past_value, n_out=3, **mha)  # (B, T, H*D)
    else:
        y3 = rule.node(op, "MultiHeadAttention", q3, rule.key(op, a), a.v, None, None, bias, **mha)  # (B, T, H*D)
    y4 = rule.node(op, "Reshape", y3, shape4, base="mha_bsnh")  # (B, T, H, D)
    out = rule.node(op, "Transpose", y4, base="mha_out", perm=BHTD_TO_BTHD)  # (B, H, T, D)
    return (out, present_key, present_value) if a.past is not None else out


def _fuse_gqa(rule: AttentionRule, op, a: MatchedAttention) -> Any:
    """``com.microsoft.GroupQueryAttention`` writing the KV cache in place: past_key_values.i.* and present.i.* are one
    (B, H_kv, max_cache, D) buffer each, the new keys/values go to each row's next slots. Its sequence lengths come
    from the attention mask (``seqlens_k = sum(mask) - 1`` per row, ``total_sequence_length`` = the mask's width), its
    causal mask from them: rows are packed from slot 0 (onnxruntime-genai's right padding), so the model's own mask
    (which knows left padding) is not passed — the runtime and verify's runners feed this layout."""
    H, Hkv, D = rule.n_heads, rule.n_kv_heads, rule.head_dim
    past_key, past_value, new_key, new_value = a.past
    shape4 = rule.const(op, "shape4", "shape4", np.array([0, 0, H, D], dtype=np.int64))

    def bsh(x: ir.Value, heads: int) -> ir.Value:  # (B, heads, T, D) -> (B, T, heads*D)
        shape3 = rule.const(op, ("shape3", heads), "shape3", np.array([0, 0, heads * D], dtype=np.int64))
        t = rule.node(op, "Transpose", x, base="bsnh", perm=BHTD_TO_BTHD)  # (B, T, heads, D)
        return rule.node(op, "Reshape", t, shape3, base="bsh")  # (B, T, heads*D)

    seqlens, total = rule.sequence_lengths(op, a.graph)
    window = {"local_window_size": gqa_local_window(_layer_of(past_key), rule.windows)} if rule.windows else {}
    if a.softcap:
        window["softcap"] = a.softcap
    y3, present_key, present_value = rule.node(
        op, "GroupQueryAttention", bsh(rule.query(op, a), H), bsh(new_key, Hkv), bsh(new_value, Hkv), past_key,
        past_value, seqlens, total, base="GroupQueryAttention", domain=MS_DOMAIN, n_out=3, num_heads=H,
        kv_num_heads=Hkv, scale=a.scale, **window)  # (B, T, H*D), present: the buffers, written in place
    y4 = rule.node(op, "Reshape", y3, shape4, base="gqa_bsnh")  # (B, T, H, D)
    out = rule.node(op, "Transpose", y4, base="gqa_out", perm=BHTD_TO_BTHD)  # (B, H, T, D)
    return out, present_key, present_value


def _layer_of(past_key: ir.Value) -> int:
    """The layer whose cache input ``past_key`` is (``past_key_values.{i}.key``)."""
    m = re.fullmatch(r"past_key_values\.(\d+)\.key", past_key.name or "")
    if m is None:
        raise ExportError(f"GroupQueryAttention over a sliding window: the cache input {past_key.name!r} names no "
                          "layer (past_key_values.{i}.key)")
    return int(m.group(1))


def gqa_local_window(layer: int, windows: tuple[int, ...]) -> int:
    """GroupQueryAttention's ``local_window_size`` for a layer of sliding window W (the contract's: W keys, the
    current one included), or -1 for full attention. onnxruntime 1.32's CPU kernel lets a query see
    ``local_window_size`` keys, its own included: W (tests/test_windows.py pins it on the op alone, and the
    lowering's self-check crosses the window, so a kernel that changes meaning fails the export)."""
    w = windows[layer] if layer < len(windows) else 0
    return w if w else -1


# lowering -> writer of its fused node(s); a writer returns what replaces the pattern's outputs
FUSE: dict[str, Callable[[AttentionRule, Any, MatchedAttention], Any]] = {"onnx": _fuse_onnx, "ort": _fuse_ort,
                                                                        "gqa": _fuse_gqa}


def attention_rules(attention: str, *, n_heads: int, head_dim: int, n_kv_heads: int | None = None,
                    windows: tuple[int, ...] | None = None) -> pattern.RewriteRuleSet:
    """The rules of one lowering call: the kv-cache form first, the plain form where it does not apply."""
    shared = Shared()
    return pattern.RewriteRuleSet([
        AttentionRule.rule(attention, kv_cache=kv, n_heads=n_heads, head_dim=head_dim, shared=shared,
                           n_kv_heads=n_kv_heads, windows=windows)
        for kv in (True, False)])


@dataclass
class _Attempt:
    rule: str
    root: ir.Node
    result: pattern.MatchResult
    status: pattern.MatchStatus

    @property
    def score(self) -> int:  # MatchingTracer's: how far the match got, a failed check above any partial match
        return len(self.result.nodes) + 100 * int(self.status)


class AttemptTracer(pattern.MatchingTracer):
    """Every (rule, root node) attempt, where MatchingTracer keeps only the best ones overall: a Softmax among
    several can then be explained by the attempts rooted at the MatMuls right after it."""

    def __init__(self) -> None:
        super().__init__()
        self.attempts: list[_Attempt] = []

    def log(self, rule, container, node, match_result, status) -> None:
        super().log(rule, container, node, match_result, status)
        self.attempts.append(_Attempt(str(rule), node, match_result, status))


def _describe(x: ir.Node | ir.Value) -> str:
    return f"{x.op_type} {_label(x)}" if isinstance(x, ir.Node) else f"value {x.name}"


def why_unmatched(model: ir.Model, softmax: ir.Node, attention: str, *, n_heads: int, head_dim: int,
                  n_kv_heads: int | None = None, hops: int = 3) -> str:
    """One line on why no rule rewrote the attention around ``softmax``: the rules are traced (no rewrite) over the
    graph, and of the attempts rooted at a MatMul up to ``hops`` consumers after it, the one that got furthest is
    described."""
    via: dict[ir.Node, list[ir.Node]] = {}  # MatMul after the Softmax -> the nodes between them
    frontier: list[tuple[ir.Node, list[ir.Node]]] = [(softmax, [])]
    for _ in range(hops):
        frontier = [(user, path + [n] if n is not softmax else path)
                    for n, path in frontier for out in n.outputs for user, _ in out.uses()]
        for n, path in frontier:
            if n.op_type == "MatMul":
                via.setdefault(n, path)
    if not via:
        return f"Softmax {_label(softmax)} feeds no MatMul(weights, V)"
    tracer = AttemptTracer()
    attention_rules(attention, n_heads=n_heads, head_dim=head_dim, n_kv_heads=n_kv_heads).apply_to_model(
        model, tracer=tracer)
    tried = [t for t in tracer.attempts if t.root in via]
    if not tried:
        return f"Softmax {_label(softmax)}: no rule matched any part of it"
    best = max(tried, key=lambda t: t.score)
    reason = (best.result.reason or best.status.name.lower().replace("_", " ")).rstrip(".")
    if best.status == pattern.MatchStatus.CONDITION_FAILED:
        return reason
    path = via[best.root]
    through = f" through {', '.join(map(_describe, path))}" if path else ""
    where = best.result.failure_nodes_and_values
    at = f" at {_describe(where[0])}" if where else ""
    return (f"Softmax {_label(softmax)} reaches {_describe(best.root)}{through}; matching back from there stopped{at}: "
            f"{reason}")
