"""Attention lowerings: rewrite the exported decomposed attention into one fused node per layer.

torch.onnx exports eager attention as ``MatMul(Q, Kᵀ) -> Div|Mul(scale) -> Where(masked, fill) | Add(bias) ->
Softmax -> MatMul(·, V)``. This module finds that subgraph (one match per Softmax) and replaces it with

- ``onnx``: the standard ONNX ``Attention`` op (opset 23), Q/K/V in (B, H, T|S, D);
- ``ort``:  ONNX Runtime's ``com.microsoft`` ``MultiHeadAttention``, query/key/value in (B, T, H*D).

When K and V are ``Concat(past_key_values.i.*, new, axis=2)`` of a graph input (the KV cache), the op takes the
new keys/values plus ``past_key``/``past_value`` and produces ``present.i.*`` itself: the cache goes through the op.

The mask the model built (causal + past offset + left padding, see ``models/attention.build_causal_mask``) is
passed as an additive float ``attention_bias``: 0 where attention may look, ``dtype.min / 2`` where not. Half the
minimum stays finite after adding any score (``min + negative score`` would be -inf in float16), and it is not
the exact lowest value, which ONNX Runtime's ``Attention`` kernel reads as "fully masked row -> output 0": with
it, a fully masked (left-padded) query row gets the same uniform average of V that eager's ``masked_fill`` gives.
``is_causal`` is never used: ONNX Runtime has had alignment bugs with it when the query is shorter than the keys.

``self_check.py`` runs a lowered graph against the decomposed one before it is written.

Works on ``onnx.ModelProto`` (no torch): the rewrite is a graph pass that any model exporting the usual
attention pattern gets, built-in or user factory. A model whose attention does not match raises ExportError.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from mhaexport.errors import ExportError
from mhaexport.exporter.lowering.self_check import SELF_CHECK_TOL, self_check  # noqa: F401 - re-exported

LOWERINGS = ("decomposed", "onnx", "ort")
ATTENTION_OPSET = 23  # the ONNX Attention op appears in opset 23
MS_DOMAIN = "com.microsoft"
FUSED_OP = {"onnx": ("", "Attention"), "ort": (MS_DOMAIN, "MultiHeadAttention")}


@dataclass
class LoweringReport:
    """What a lowering did to the graph (recorded in the manifest)."""

    attention: str
    fused_nodes: int = 0  # fused attention nodes written
    kv_cache_in_op: bool | None = None  # past/present go through the op (None: decomposed, nothing fused)
    softmax_left: int = 0  # Softmax nodes still in the graph after the rewrite
    op_counts: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"attention": self.attention, "fused_nodes": self.fused_nodes, "kv_cache_in_op": self.kv_cache_in_op,
                "softmax_left": self.softmax_left, "op_counts": self.op_counts}


@dataclass
class _Match:
    softmax: onnx.NodeProto
    out: str  # output of the final MatMul: (B, H, T, D)
    q: str  # (B, H, T, D)
    k: str  # (B, H, S, D); "" when only Kᵀ is at hand (then kt is set)
    v: str  # (B, H, S, D)
    scale: float
    masked: str | None = None  # bool, True where attention may NOT look
    allowed: str | None = None  # bool, True where attention may look
    bias: str | None = None  # additive float mask
    past: tuple[str, str, str, str] | None = None  # past_key, past_value, new_key, new_value
    kt: str = ""  # (B, H, D, S), when K is not a Transpose away
    fill_dtype: np.dtype | None = None  # dtype of the Where fill constant (the attention math's dtype)


def op_counts(model: onnx.ModelProto) -> dict[str, int]:
    """Node count per op type (domain-qualified for non-default domains), sorted by name."""
    c = collections.Counter(f"{n.domain}.{n.op_type}" if n.domain not in ("", "ai.onnx") else n.op_type
                            for n in model.graph.node)
    return dict(sorted(c.items()))


class _Graph:
    """Producer/consumer lookups and constant folding of scalars over one onnx GraphProto."""

    def __init__(self, model: onnx.ModelProto) -> None:
        self.model = model
        self.g = model.graph
        self.producer = {o: n for n in self.g.node for o in n.output}
        self.consumers: dict[str, list[onnx.NodeProto]] = collections.defaultdict(list)
        for n in self.g.node:
            for i in n.input:
                self.consumers[i].append(n)
        self.inits = {t.name: t for t in self.g.initializer}
        self.graph_inputs = {i.name for i in self.g.input}
        self.graph_outputs = {o.name for o in self.g.output}
        self._fresh = 0

    def const(self, name: str) -> np.ndarray | None:
        if name in self.inits:
            return numpy_helper.to_array(self.inits[name])
        node = self.producer.get(name)
        if node is not None and node.op_type == "Constant":
            for a in node.attribute:
                if a.name == "value":
                    return numpy_helper.to_array(a.t)
                if a.name == "value_float":
                    return np.array(a.f, dtype=np.float32)
        if node is not None and node.op_type in ("Cast", "Identity"):
            return self.const(node.input[0])
        return None

    def scalar(self, name: str) -> float | None:
        v = self.const(name)
        if v is None or v.size != 1:
            return None
        return float(v.reshape(()))

    def only_consumer(self, name: str) -> onnx.NodeProto | None:
        cons = self.consumers.get(name, [])
        return cons[0] if len(cons) == 1 and name not in self.graph_outputs else None

    def fresh(self, base: str) -> str:
        self._fresh += 1
        return f"_lower_{base}_{self._fresh}"


def _perm(node: onnx.NodeProto) -> list[int] | None:
    for a in node.attribute:
        if a.name == "perm":
            return list(a.ints)
    return None


def _match(g: _Graph, softmax: onnx.NodeProto) -> _Match | str:
    """Match one decomposed attention around ``softmax``; a string says why it is not one."""
    axis = next((a.i for a in softmax.attribute if a.name == "axis"), -1)
    if axis not in (-1, 3):
        return f"Softmax {softmax.name or softmax.output[0]} is over axis {axis}, not the key axis"
    weights = softmax.output[0]
    cons = g.consumers.get(weights, [])
    # SDPA's NaN guard (opset < 23): Where(IsNaN(w), 0, w) between Softmax and the V product
    if len(cons) == 2 and {n.op_type for n in cons} == {"IsNaN", "Where"}:
        isnan = next(n for n in cons if n.op_type == "IsNaN")
        guard = next(n for n in cons if n.op_type == "Where")
        if guard.input[0] == isnan.output[0] and guard.input[2] == weights and g.scalar(guard.input[1]) == 0.0:
            weights = guard.output[0]
    av = g.only_consumer(weights)
    if av is None or av.op_type != "MatMul" or av.input[0] != weights:
        return f"Softmax {softmax.output[0]} does not feed one MatMul(weights, V)"
    v = av.input[1]
    m = _Match(softmax=softmax, out=av.output[0], q="", k="", v=v, scale=1.0)
    x = g.producer.get(softmax.input[0])
    # mask: Where(masked, fill, scores) | Where(allowed, scores, fill) | Add(scores, bias)
    if x is not None and x.op_type == "Where":
        cond, a, b = x.input
        fa, fb = g.scalar(a), g.scalar(b)
        if fa is not None and fa <= -1e4:
            m.masked, scores, m.fill_dtype = cond, b, g.const(a).dtype
        elif fb is not None and fb <= -1e4:
            m.allowed, scores, m.fill_dtype = cond, a, g.const(b).dtype
        else:
            return f"Where {x.output[0]} before Softmax has no large negative fill"
        x = g.producer.get(scores)
    elif x is not None and x.op_type == "Add":
        # the bias is the operand that does not come from Q·Kᵀ (a graph input or a mask subgraph)
        for s, bias in ((x.input[0], x.input[1]), (x.input[1], x.input[0])):
            p = g.producer.get(s)
            if p is not None and p.op_type in ("MatMul", "Div", "Mul"):
                m.bias, x = bias, p
                break
        else:
            return f"Add {x.output[0]} before Softmax: no Q·Kᵀ operand"
    # scale: Div(qk, c) | Mul(qk, c)
    if x is not None and x.op_type in ("Div", "Mul"):
        c = g.scalar(x.input[1])
        if c is None:
            return f"{x.op_type} {x.output[0]} scales scores by a non-scalar"
        m.scale = 1.0 / c if x.op_type == "Div" else c
        x = g.producer.get(x.input[0])
    if x is None or x.op_type != "MatMul":
        return f"no MatMul(Q, Kᵀ) before Softmax {softmax.output[0]}"
    q, kt = x.input
    # SDPA-style scaling of both operands: Mul(q, a), Mul(kᵀ, b)
    for which in ("q", "kt"):
        name = q if which == "q" else kt
        p = g.producer.get(name)
        if p is not None and p.op_type == "Mul" and (c := g.scalar(p.input[1])) is not None:
            m.scale *= c
            if which == "q":
                q = p.input[0]
            else:
                kt = p.input[0]
    m.q = q
    t = g.producer.get(kt)
    if t is not None and t.op_type == "Transpose" and _perm(t) == [0, 1, 3, 2]:
        m.k = t.input[0]
    else:
        m.kt = kt  # the rewrite adds Transpose(kt) to get K
    # the KV cache: K = Concat(past_key, k_new, axis=2), V likewise, past_* graph inputs
    if m.k:
        kc, vc = g.producer.get(m.k), g.producer.get(m.v)
        if kc is not None and vc is not None and kc.op_type == vc.op_type == "Concat" and \
                len(kc.input) == len(vc.input) == 2:
            ax_k = next((a.i for a in kc.attribute if a.name == "axis"), None)
            ax_v = next((a.i for a in vc.attribute if a.name == "axis"), None)
            if ax_k in (2, -2) and ax_v in (2, -2) and kc.input[0] in g.graph_inputs and \
                    vc.input[0] in g.graph_inputs:
                m.past = (kc.input[0], vc.input[0], kc.input[1], vc.input[1])
    return m


def _dtype_of_scores(g: _Graph, m: _Match) -> int:
    """Element type of the attention math: the Where fill constant's, else the first float graph input's."""
    if m.fill_dtype is not None and m.fill_dtype in (np.float32, np.float16, np.float64):
        return helper.np_dtype_to_tensor_dtype(m.fill_dtype)
    for i in g.g.input:
        et = i.type.tensor_type.elem_type
        if et in (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.DOUBLE):
            return et
    return TensorProto.FLOAT


_NP = {TensorProto.FLOAT: np.float32, TensorProto.FLOAT16: np.float16, TensorProto.DOUBLE: np.float64}


def _bias_fill(elem_type: int) -> float:
    if elem_type == TensorProto.BFLOAT16:
        return -1.6e38  # bfloat16 has float32's range
    return float(np.finfo(_NP[elem_type]).min) / 2


def lower_attention(model: onnx.ModelProto, attention: str, *, n_heads: int, head_dim: int) -> LoweringReport:
    """Rewrite ``model`` in place so each attention is one fused node of the ``attention`` lowering.

    n_heads / head_dim come from the model's contract. Raises ExportError when the graph holds no attention
    this pass recognizes, or when some Softmax is left unmatched.
    """
    if attention not in LOWERINGS:
        raise ExportError(f"--attention {attention!r}: expected one of {', '.join(LOWERINGS)}")
    report = LoweringReport(attention)
    if attention == "decomposed":
        report.op_counts = op_counts(model)
        report.softmax_left = report.op_counts.get("Softmax", 0)
        return report
    domain, op_type = FUSED_OP[attention]
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    if attention == "onnx" and opset < ATTENTION_OPSET:
        raise ExportError(f"--attention onnx needs opset >= {ATTENTION_OPSET} (the ONNX Attention op); the model "
                          f"was exported at opset {opset}: use --opset {ATTENTION_OPSET}")
    g = _Graph(model)
    softmaxes = [n for n in g.g.node if n.op_type == "Softmax"]
    already = sum(1 for n in g.g.node if n.op_type == op_type and n.domain == domain)
    if not softmaxes:
        if already:
            report.fused_nodes, report.op_counts = already, op_counts(model)
            return report
        n_attn = sum(1 for n in g.g.node if n.op_type == "Attention" and n.domain in ("", "ai.onnx"))
        if n_attn:
            raise ExportError(f"--attention {attention}: the graph already holds {n_attn} ONNX Attention node(s) "
                              "(torch.onnx exports scaled_dot_product_attention so at opset 23): export at "
                              "--opset 18 to lower it")
        raise ExportError(f"--attention {attention}: the exported graph has no Softmax, so no decomposed attention "
                          "to lower (does the model compute attention?)")
    matches, why = [], []
    for s in softmaxes:
        r = _match(g, s)
        (matches if isinstance(r, _Match) else why).append(r)
    if why:
        raise ExportError(f"--attention {attention}: {len(why)} of {len(softmaxes)} Softmax node(s) are not a "
                          f"recognized attention pattern ({why[0]}); export with --attention decomposed")
    elem = _dtype_of_scores(g, matches[0])
    fill = _bias_fill(elem)
    new_nodes: dict[str, list[onnx.NodeProto]] = {}  # output name of the node to replace -> nodes in its place
    bias_cache: dict[str, str] = {}
    consts: list[onnx.TensorProto] = []

    def const(name: str, value: np.ndarray) -> str:
        cname = g.fresh(name)
        consts.append(numpy_helper.from_array(value, cname))
        return cname

    def scalar_const(name: str, value: float) -> str:
        arr = np.array(value, dtype=np.float32)
        t = numpy_helper.from_array(arr, g.fresh(name))
        if elem != TensorProto.FLOAT:
            t = helper.make_tensor(t.name, elem, [], [value])
        consts.append(t)
        return t.name

    zero_c, fill_c = scalar_const("zero", 0.0), scalar_const("fill", fill)
    removed_outputs: set[str] = set()
    fused_past = []
    for m in matches:
        nodes: list[onnx.NodeProto] = []
        # the additive bias (shared between layers that use the same mask)
        key = m.masked or m.allowed or m.bias or ""
        if m.bias:
            bias = m.bias
        elif key in bias_cache:
            bias = bias_cache[key]
        elif key:
            bias = g.fresh("attn_bias")
            a, b = (fill_c, zero_c) if m.masked else (zero_c, fill_c)
            nodes.append(helper.make_node("Where", [key, a, b], [bias], name=bias))
            bias_cache[key] = bias
        else:
            bias = ""
        k = m.k
        if not k:
            k = g.fresh("k")
            nodes.append(helper.make_node("Transpose", [m.kt], [k], perm=[0, 1, 3, 2], name=k))
        use_past = m.past is not None
        if use_past:
            past_k, past_v, k_new, v_new = m.past
            present_k, present_v = m.k, m.v  # the Concat outputs: the op writes them now
            removed_outputs.update((present_k, present_v))
        out = m.out
        if attention == "onnx":
            ins = [m.q, k_new, v_new, bias, past_k, past_v] if use_past else [m.q, k, m.v, bias]
            outs = [out, present_k, present_v] if use_past else [out]
            nodes.append(helper.make_node("Attention", ins, outs, name=g.fresh("Attention"), scale=m.scale))
        else:
            shape3 = const("shape3", np.array([0, 0, n_heads * head_dim], dtype=np.int64))
            shape4 = const("shape4", np.array([0, 0, n_heads, head_dim], dtype=np.int64))

            def bsh(x: str) -> str:  # (B, H, T, D) -> (B, T, H*D)
                t, r = g.fresh("bsnh"), g.fresh("bsh")
                nodes.append(helper.make_node("Transpose", [x], [t], perm=[0, 2, 1, 3], name=t))
                nodes.append(helper.make_node("Reshape", [t, shape3], [r], name=r))
                return r

            q3 = bsh(m.q)
            y3 = g.fresh("mha_out")
            if use_past:
                ins = [q3, bsh(k_new), bsh(v_new), "", "", bias, past_k, past_v]
                outs = [y3, present_k, present_v]
            else:  # key/value in (B, H, S, D) straight through (BNSH)
                ins = [q3, k, m.v, "", "", bias]
                outs = [y3]
            while ins and ins[-1] == "":
                ins.pop()
            nodes.append(helper.make_node("MultiHeadAttention", ins, outs, name=g.fresh("MultiHeadAttention"),
                                          domain=MS_DOMAIN, num_heads=n_heads, scale=m.scale))
            y4 = g.fresh("mha_bsnh")
            nodes.append(helper.make_node("Reshape", [y3, shape4], [y4], name=y4))
            nodes.append(helper.make_node("Transpose", [y4], [out], perm=[0, 2, 1, 3], name=out))
        fused_past.append(use_past)
        new_nodes[out] = nodes

    # rebuild the node list: fused nodes where the final MatMul was; drop the KV Concats the op replaced
    kept: list[onnx.NodeProto] = []
    for n in g.g.node:
        if n.output and n.output[0] in new_nodes:
            kept.extend(new_nodes[n.output[0]])
        elif n.op_type == "Concat" and n.output[0] in removed_outputs:
            continue
        else:
            kept.append(n)
    del g.g.node[:]
    g.g.node.extend(kept)
    g.g.initializer.extend(consts)
    if attention == "ort" and not any(o.domain == MS_DOMAIN for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(MS_DOMAIN, 1))
    _remove_dead(model)
    _toposort(model)
    report.fused_nodes = len(matches)
    report.kv_cache_in_op = all(fused_past)
    report.op_counts = op_counts(model)
    report.softmax_left = report.op_counts.get("Softmax", 0)
    # the rewrite changed node outputs' shapes only where we wrote them: drop stale value_info
    del model.graph.value_info[:]
    return report


def _remove_dead(model: onnx.ModelProto) -> None:
    """Drop nodes whose outputs nobody reads, then initializers nobody reads."""
    g = model.graph
    needed = {o.name for o in g.output}
    live: list[onnx.NodeProto] = []
    for n in reversed(list(g.node)):
        if any(o in needed for o in n.output if o):
            live.append(n)
            needed.update(i for i in n.input if i)
    live.reverse()
    del g.node[:]
    g.node.extend(live)
    inits = [t for t in g.initializer if t.name in needed]
    del g.initializer[:]
    g.initializer.extend(inits)


def _toposort(model: onnx.ModelProto) -> None:
    g = model.graph
    available = {i.name for i in g.input} | {t.name for t in g.initializer} | {""}
    pending = list(g.node)
    ordered: list[onnx.NodeProto] = []
    while pending:
        rest = []
        for n in pending:
            if all(i in available for i in n.input):
                ordered.append(n)
                available.update(n.output)
            else:
                rest.append(n)
        if len(rest) == len(pending):
            raise ExportError(f"attention rewrite left a cycle or a dangling input at {rest[0].op_type} "
                              f"{rest[0].name}: {[i for i in rest[0].input if i not in available]}")
        pending = rest
    del g.node[:]
    g.node.extend(ordered)
