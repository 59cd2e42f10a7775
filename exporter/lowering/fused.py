"""The ``fused`` lowering's second half: onnxscript's ``rewriter.ort_fusions`` applied around the fused attention.

``--attention fused`` first lowers each attention with our own rules (``rules.py``: com.microsoft
MultiHeadAttention over a concat cache, GroupQueryAttention over a shared one), then hands the graph to the
well-kept fusions ONNX Runtime's own tools use (onnxscript's ``ort_fusions``): LayerNormalization + residual Add ->
SkipLayerNormalization, RMSNorm -> SimplifiedLayerNormalization (+ residual -> SkipSimplifiedLayerNormalization),
Erf-GELU -> Gelu, bias + Gelu -> BiasGelu, rotary embedding -> RotaryEmbedding (with its cos/sin cache); and one
rule of ours, :func:`pack_projections`: Q, K and V (and SwiGLU's gate and up) as one MatMul and a Split. Its
attention fusions (SDPA/MHA/GQA) are not run: our rules already wrote the attention op, with the mask and the cache
as this project's contract needs them. Nor is FusedMatMul: in our graphs the one MatMul it takes is the tied LM
head's ``MatMul(x, Transpose(embedding))``, a transpose of a constant that ONNX Runtime folds at load anyway, and
as FusedMatMul the head is out of reach of ``mhaexport quantize`` (which quantizes MatMul weights: "LM head not
found" on the built-in decoder).

One rule beside theirs, :func:`canonical_last_axis`: torch.onnx writes ``nn.RMSNorm``'s mean over the last dim with
a positive axis (``ReduceMean(x², axes=[2])``), and ort_fusions' RMSNorm pattern asks for ``[-1]``; its
``MatchingTracer`` said so on the built-in ``tiny-llama`` export::

    Rule: RmsNormFusion2 ... Status: NO_MATCH
    Graph matching failed: Value mismatch: expected [-1], got [2].

so the axes constant of a ReduceMean over the input's last dim is rewritten to ``[-1]`` (the same op) first.

And a second, :func:`outer_product_freqs`: torch.onnx writes Hugging Face's rotary angles
(``inv_freq[None, :, None].expand(B, -1, 1) @ position_ids[:, None, :]``, then ``.transpose(1, 2)``) as the outer
product it is, ``Mul(Cast(Unsqueeze(position_ids, [-1])), inv_freq)``, where ort_fusions' cos/sin-cache pattern
asks for the MatMul and Transpose; on a tiny transformers Llama its tracer said::

    Rule: CosSinCache_const_freqs ... Status: NO_MATCH
    Graph matching failed: OpType mismatch: expected Transpose, got Mul.

so that Mul is written back as ``Transpose(MatMul(inv_freq[1, D/2, 1], Cast(Unsqueeze(position_ids, [1]))))``:
one product per element either way, the same numbers.

Torch-free: onnx_ir and onnxscript only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import onnx_ir as ir


def canonical_last_axis(model: ir.Model) -> int:
    """Rewrite ``ReduceMean(x, axes=[r - 1])`` (r = rank of x) to ``axes=[-1]``; returns how many were rewritten."""
    import onnx_ir as ir

    done, last = 0, None
    for node in model.graph:
        if node.op_type != "ReduceMean" or node.domain not in ("", "ai.onnx") or len(node.inputs) < 2:
            continue
        x, axes = node.inputs[0], node.inputs[1]
        if x is None or axes is None or axes.const_value is None or x.shape is None:
            continue
        if axes.const_value.numpy().reshape(-1).tolist() == [len(x.shape) - 1]:
            if last is None:
                name = "mhaexport.last_axis"
                last = ir.Value(name=name, const_value=ir.tensor(np.array([-1], dtype=np.int64), name=name))
                model.graph.register_initializer(last)
            node.replace_input_with(1, last)
            done += 1
    return done


def _outer_product_rule():
    """Mul(Cast(Unsqueeze(pos, [-1|2]), float), inv_freq[E]) -> Transpose(MatMul(inv_freq[1, E, 1], Cast(Unsqueeze(pos,
    [1]), float)), [0, 2, 1]) for a (B, T) pos and a constant 1-D inv_freq."""
    import onnx_ir as ir
    from onnxscript.rewriter import pattern

    def target(op, pos, axes, inv_freq):
        return op.Mul(op.Cast(op.Unsqueeze(pos, axes), to=ir.DataType.FLOAT), inv_freq)

    def condition(context, pos, axes, inv_freq, **_):
        if pos.shape is None or len(pos.shape) != 2 or axes.const_value is None or inv_freq.const_value is None:
            return False
        return axes.const_value.numpy().reshape(-1).tolist() in ([-1], [2]) and len(inv_freq.shape or ()) == 1

    def replacement(op, pos, axes, inv_freq, **_):
        table = inv_freq.const_value.numpy().reshape(1, -1, 1)  # (1, E, 1)
        inv3 = op.initializer(ir.tensor(table, name=f"{inv_freq.name}_1E1"), name=f"{inv_freq.name}_1E1")
        one = op.Constant(value_ints=[1])
        pos3 = op.Cast(op.Unsqueeze(pos, one), to=ir.DataType.FLOAT)  # (B, 1, T)
        return op.Transpose(op.MatMul(inv3, pos3), perm=[0, 2, 1])  # (B, T, E)

    return pattern.RewriteRule(target, replacement, condition, name="OuterProductFreqsAsMatMul")


def outer_product_freqs(model: ir.Model) -> int:
    """Rewrite rotary angles written as an outer product into the MatMul/Transpose form ort_fusions matches."""
    from onnxscript.rewriter import pattern

    return pattern.RewriteRuleSet([_outer_product_rule()]).apply_to_model(model)


def pack_projections(model: ir.Model) -> int:
    """MatMuls that read one value with constant (K, N_i) weights — a block's Q, K and V projections; SwiGLU's gate
    and up — become one MatMul of the weights side by side and a Split: one weight to read per step, and one
    MatMulNBits after ``mhaexport quantize`` (the builder's packed QKV). The packed node keeps the scopes the group
    shares (its block), so quantize's ``--int8-blocks`` and bisect still place it. Returns the groups packed."""
    import onnx_ir as ir

    from mhaexport.graph import SCOPES_KEY, name_scopes

    packed = 0
    for value in list(model.graph.inputs) + [o for n in list(model.graph) for o in n.outputs]:
        group = [u for u, _ in value.uses() if u.op_type == "MatMul" and u.domain in ("", "ai.onnx")
                 and u.inputs[0] is value and u.inputs[1] is not None and u.inputs[1].const_value is not None
                 and u.inputs[1].is_initializer() and len(u.inputs[1].const_value.shape) == 2]
        group = list({id(u): u for u in group}.values())
        if len(group) < 2 or len({u.inputs[1].const_value.numpy().dtype for u in group}) != 1:
            continue
        weights = [u.inputs[1].const_value.numpy() for u in group]  # (K, N_i) each
        if len({w.shape[0] for w in weights}) != 1:
            continue
        first = group[0]
        name = f"{first.name}_packed"
        w = ir.Value(name=f"{name}.weight", const_value=ir.tensor(np.concatenate(weights, axis=1),
                                                                 name=f"{name}.weight"))
        model.graph.register_initializer(w)
        sizes = ir.Value(name=f"{name}.sizes", const_value=ir.tensor(
            np.array([x.shape[1] for x in weights], dtype=np.int64), name=f"{name}.sizes"))
        model.graph.register_initializer(sizes)
        mm = ir.Node("", "MatMul", [value, w], num_outputs=1, name=name)
        split = ir.Node("", "Split", [mm.outputs[0], sizes], attributes=[ir.AttrInt64("axis", -1)],
                        num_outputs=len(group), name=f"{name}_split")
        scopes = [name_scopes(u) for u in group]
        common = [x for i, x in enumerate(scopes[0]) if all(len(sc) > i and sc[i] == x for sc in scopes)]
        for node in (mm, split):
            node.metadata_props[SCOPES_KEY] = repr(common)
        model.graph.insert_before(first, [mm, split])
        for u, out in zip(group, split.outputs):
            out.shape, out.dtype = u.outputs[0].shape, u.outputs[0].dtype
            u.outputs[0].replace_all_uses_with(out)
            if u.outputs[0].is_graph_output():
                raise AssertionError("a projection is a graph output")  # never in a decoder
            model.graph.remove(u, safe=True)
        packed += 1
    return packed


def fuse_for_ort(model: ir.Model) -> dict[str, int]:
    """Apply ort_fusions' non-attention fusions to ``model`` in place; returns {fusion: count} (zeros left out)."""
    from onnx_ir.passes.common import RemoveUnusedNodesPass, ShapeInferencePass, TopologicalSortPass
    from onnxscript.optimizer import optimize
    from onnxscript.rewriter.ort_fusions.bias_gelu import fuse_bias_gelu
    from onnxscript.rewriter.ort_fusions.cos_sin_cache import fuse_cos_sin_cache
    from onnxscript.rewriter.ort_fusions.erfgelu import fuse_erfgelu
    from onnxscript.rewriter.ort_fusions.gelu import fuse_gelu
    from onnxscript.rewriter.ort_fusions.rms_normalization import fuse_rms_normalization
    from onnxscript.rewriter.ort_fusions.rotary_embedding import fuse_rotary_embedding
    from onnxscript.rewriter.ort_fusions.skip_normalization import (fuse_skip_layer_normalization,
                                                                   fuse_skip_rms_normalization)

    ShapeInferencePass()(model)
    counts = {"canonical_last_axis": canonical_last_axis(model), "outer_product_freqs": outer_product_freqs(model)}
    for name, fuse in (("erf_gelu", fuse_erfgelu), ("rms_normalization", fuse_rms_normalization),
                       ("skip_layer_normalization", fuse_skip_layer_normalization),
                       ("skip_rms_normalization", fuse_skip_rms_normalization),
                       ("rotary_embedding", fuse_rotary_embedding), ("cos_sin_cache", fuse_cos_sin_cache),
                       ("gelu", fuse_gelu), ("bias_gelu", fuse_bias_gelu)):
        counts[name] = fuse(model)
    optimize(model)  # inlines the intermediate functions a fusion left unconsumed (as ort_fusions itself does)
    counts["packed_projections"] = pack_projections(model)
    RemoveUnusedNodesPass()(model)
    TopologicalSortPass()(model)
    return {k: int(v) for k, v in counts.items() if v}
