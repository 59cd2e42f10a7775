"""Attention lowerings: rewrite the exported decomposed attention into one fused node per layer.

torch.onnx exports eager attention as ``MatMul(Q, Kᵀ) -> Div|Mul(scale) -> Where(masked, fill) | Add(bias) ->
Softmax -> MatMul(·, V)``. onnxscript rewrite rules (``rules.py``) find that subgraph (one match per Softmax) and
replace it with

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

The fused nodes keep the module scope of the attention they replace (``pkg.torch.onnx.name_scopes``), so bisect
names them by module. ``self_check.py`` runs a lowered graph against the decomposed one before it is written.

Works on an onnx_ir ``Model`` (``lower_attention_ir``: the exporter's path, weights never copied into a protobuf,
so models past 2 GB lower too) or on an ``onnx.ModelProto`` (``lower_attention``); no torch. The rewrite is a
graph pass that any model exporting the usual attention pattern gets, built-in or user factory. A model whose
attention does not match raises ExportError.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import onnx

from mhaexport.core.errors import ExportError
from mhaexport.exporter.lowering.self_check import SELF_CHECK_TOL, self_check, self_check_shared
from mhaexport.core.graph import MS_DOMAIN

if TYPE_CHECKING:
    import onnx_ir as ir

LOWERINGS = ("decomposed", "onnx", "ort", "fused")  # what --attention chooses
ATTENTION_OPSET = 23  # the ONNX Attention op appears in opset 23
# "gqa" is not an --attention choice: --kv-cache shared selects it (the op that writes a shared buffer in place)
# "fused": the ort lowering's attention (gqa's over a shared cache), then onnxscript's ort_fusions (fused.py)
FUSED_OP = {"onnx": ("", "Attention"), "ort": (MS_DOMAIN, "MultiHeadAttention"),
            "fused": (MS_DOMAIN, "MultiHeadAttention"),
            "gqa": (MS_DOMAIN, "GroupQueryAttention")}

__all__ = ["ATTENTION_OPSET", "FUSED_OP", "LOWERINGS", "MS_DOMAIN", "SELF_CHECK_TOL", "LoweringReport",
           "lower_attention", "lower_attention_ir", "op_counts", "self_check", "self_check_shared"]


@dataclass
class LoweringReport:
    """What a lowering did to the graph (recorded in the manifest)."""

    attention: str
    fused_nodes: int = 0  # fused attention nodes written
    kv_cache_in_op: bool | None = None  # past/present go through the op (None: decomposed, nothing fused)
    softmax_left: int = 0  # Softmax nodes still in the graph after the rewrite
    op_counts: dict = field(default_factory=dict)
    fusions: dict = field(default_factory=dict)  # --attention fused: {ort_fusions rule: count} beyond attention

    def to_dict(self) -> dict:
        out = {"attention": self.attention, "fused_nodes": self.fused_nodes, "kv_cache_in_op": self.kv_cache_in_op,
               "softmax_left": self.softmax_left, "op_counts": self.op_counts}
        return {**out, "fusions": self.fusions} if self.attention == "fused" else out


def op_counts(model: onnx.ModelProto | ir.Model) -> collections.Counter[str]:
    """Node count per op type (domain-qualified for non-default domains), sorted by name; an op the graph lacks
    counts 0. Takes a ModelProto or an onnx_ir Model (the main graph's nodes either way)."""
    nodes = model.graph.node if isinstance(model, onnx.ModelProto) else model.graph
    c = collections.Counter(f"{n.domain}.{n.op_type}" if n.domain not in ("", "ai.onnx") else n.op_type
                            for n in nodes)
    return collections.Counter(dict(sorted(c.items())))


def lower_attention(model: onnx.ModelProto, attention: str, *, n_heads: int, head_dim: int,
                    n_kv_heads: int | None = None, windows: tuple[int, ...] | None = None) -> LoweringReport:
    """Rewrite the ModelProto ``model`` in place so each attention is one fused node of the ``attention`` lowering
    (one of LOWERINGS, or "gqa": GroupQueryAttention over a shared KV buffer).

    A wrapper of :func:`lower_attention_ir` for callers that hold a proto: the proto is wrapped as an onnx_ir Model
    (its weights are not copied), rewritten, and written back. Raises ExportError as that function does; ``model``
    is then unchanged. The exporter itself works on onnx_ir all the way (no proto of the whole model is built).
    """
    if attention not in LOWERINGS + ("gqa",):
        raise ExportError(f"--attention {attention!r}: expected one of {', '.join(LOWERINGS)}")
    if attention == "decomposed":
        return _decomposed_report(op_counts(model))
    import onnx_ir as ir  # onnxscript's rewriter and onnx_ir load only when a graph is lowered

    rewrites = op_counts(model)["Softmax"] > 0  # else nothing to lower (or an error below)
    ir_model = ir.serde.deserialize_model(model)  # wraps the proto's tensors, copies no weights
    report = lower_attention_ir(ir_model, attention, n_heads=n_heads, head_dim=head_dim, n_kv_heads=n_kv_heads,
                                windows=windows)
    if rewrites:
        _write_back(ir_model, model)
    return report


def lower_attention_ir(model: ir.Model, attention: str, *, n_heads: int, head_dim: int,
                       n_kv_heads: int | None = None, shared_fused: bool = False,
                       max_positions: int | None = None, windows: tuple[int, ...] | None = None) -> LoweringReport:
    """Rewrite the onnx_ir ``model`` in place so each attention is one fused node of the ``attention`` lowering.

    ``fused``: the ``ort`` lowering's attention, then onnxscript's ort_fusions for the rest (``fused.py``);
    ``shared_fused``: the same over a shared cache (``gqa``'s attention, then the fusions).
    n_heads / head_dim / n_kv_heads (and max_positions: the fused rotary tables; windows: GroupQueryAttention's
    per-layer ``local_window_size``) come from the model's contract.
    Raises ExportError when the graph holds no attention this pass recognizes, or when some Softmax is left
    unmatched (``model`` may then be partly rewritten: discard it). Works on tensors as the model holds them (a
    torch export's ``ONNXProgram.model`` wraps torch's own parameters), so a model of any size is lowered without a
    protobuf of it.
    """
    if attention not in LOWERINGS + ("gqa",):
        raise ExportError(f"--attention {attention!r}: expected one of {', '.join(LOWERINGS)}")
    if attention == "fused" or shared_fused:
        from mhaexport.exporter.lowering.fused import fuse_for_ort

        report = lower_attention_ir(model, "gqa" if shared_fused else "ort", n_heads=n_heads, head_dim=head_dim,
                                    n_kv_heads=n_kv_heads, windows=windows)
        report.attention, report.fusions = "fused", fuse_for_ort(model, max_positions, head_dim)
        report.op_counts = op_counts(model)
        return report
    counts = op_counts(model)
    if attention == "decomposed":
        return _decomposed_report(counts)
    report = LoweringReport(attention)
    domain, op_type = FUSED_OP[attention]
    opset = model.opset_imports.get("", model.opset_imports.get("ai.onnx", 0))
    if attention == "onnx" and opset < ATTENTION_OPSET:
        raise ExportError(f"--attention onnx needs opset >= {ATTENTION_OPSET} (the ONNX Attention op); the model "
                          f"was exported at opset {opset}: use --opset {ATTENTION_OPSET}")
    n_softmax = counts["Softmax"]
    if not n_softmax:
        already = counts.get(f"{domain}.{op_type}" if domain else op_type, 0)
        if already:
            report.fused_nodes, report.op_counts = already, counts
            return report
        if n_attn := counts["Attention"]:
            raise ExportError(f"--attention {attention}: the graph already holds {n_attn} ONNX Attention node(s) "
                              "(torch.onnx exports scaled_dot_product_attention so at opset 23): export at "
                              "--opset 18 to lower it")
        raise ExportError(f"--attention {attention}: the exported graph has no Softmax, so no decomposed attention "
                          "to lower (does the model compute attention?)")

    import onnx_ir as ir  # onnxscript's rewriter and onnx_ir load only when a graph is lowered
    from onnx_ir.passes.common import RemoveUnusedNodesPass, TopologicalSortPass

    from mhaexport.exporter.lowering.rules import attention_rules, why_unmatched

    fused = attention_rules(attention, n_heads=n_heads, head_dim=head_dim, n_kv_heads=n_kv_heads,
                            windows=windows).apply_to_model(model)
    left = [n for n in model.graph if n.op_type == "Softmax" and n.domain in ("", "ai.onnx")]
    if left:
        why = why_unmatched(model, left[0], attention, n_heads=n_heads, head_dim=head_dim, n_kv_heads=n_kv_heads)
        raise ExportError(f"--attention {attention}: {len(left)} of {n_softmax} Softmax node(s) are not a "
                          f"recognized attention pattern ({why}); export with --attention decomposed")
    try:
        ir.passes.PassManager([RemoveUnusedNodesPass(), TopologicalSortPass()])(model)
    except ValueError as e:  # Graph.sort: a cycle
        raise ExportError(f"--attention {attention}: the attention rewrite left the graph unsortable ({e})") from None
    ops = [n for n in model.graph if (n.domain, n.op_type) == (domain, op_type)]
    report.fused_nodes = fused
    report.kv_cache_in_op = all(len(n.outputs) == 3 for n in ops)  # Y, present_key, present_value
    report.op_counts = op_counts(model)
    report.softmax_left = report.op_counts["Softmax"]
    return report


def _decomposed_report(counts: collections.Counter[str]) -> LoweringReport:
    """The report of the ``decomposed`` lowering: nothing rewritten, the graph's op counts as they are."""
    return LoweringReport("decomposed", op_counts=counts, softmax_left=counts["Softmax"])


def _write_back(ir_model: ir.Model, model: onnx.ModelProto) -> None:
    """Make ``model`` the rewritten ``ir_model`` without copying the weights it already holds: nodes, outputs and
    opsets come from the serialized rewrite; initializers the rewrite dropped are deleted, the ones it added
    appended. value_info is dropped: the rewrite changed node outputs' shapes where it wrote them."""
    import onnx_ir as ir

    inits = dict(ir_model.graph.initializers)
    ir_model.graph.initializers.clear()  # serialize the graph without tensor data
    rewritten = ir.serde.serialize_model(ir_model)
    g = model.graph
    for i in reversed([i for i, t in enumerate(g.initializer) if t.name not in inits]):
        del g.initializer[i]
    present = {t.name for t in g.initializer}
    for name, value in inits.items():
        if name not in present:
            tensor = g.initializer.add()
            tensor.CopyFrom(ir.serde.serialize_tensor(value.const_value))
            tensor.name = name
    for name in ("node", "output", "value_info"):
        g.ClearField(name)
    g.node.extend(rewritten.graph.node)
    g.output.extend(rewritten.graph.output)
    model.ClearField("opset_import")
    model.opset_import.extend(rewritten.opset_import)
