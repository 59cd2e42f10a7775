"""The ``fused`` lowering's second half: onnxscript's ``rewriter.ort_fusions`` applied around the fused attention.

``--attention fused`` first lowers each attention with our own rules (``rules.py``: com.microsoft
MultiHeadAttention over a concat cache, GroupQueryAttention over a shared one), then hands the graph to the
well-kept fusions ONNX Runtime's own tools use (onnxscript's ``ort_fusions``): LayerNormalization + residual Add ->
SkipLayerNormalization, RMSNorm -> SimplifiedLayerNormalization (+ residual -> SkipSimplifiedLayerNormalization),
Erf-GELU -> Gelu, bias + Gelu -> BiasGelu, rotary embedding -> RotaryEmbedding (with its cos/sin cache); and one
rule of ours over a shared cache, :func:`gqa_takes_projections`: GroupQueryAttention takes the packed Q | K | V
projection and applies the rotary itself (the builder's attention); over a concat cache, :func:`pack_projections`:
Q, K and V (and SwiGLU's gate and up) as one MatMul and a Split. Their attention fusions (SDPA/MHA/GQA) are not run:
our rules already wrote the attention op, with the mask and the cache as this project's contract needs them. Nor is
FusedMatMul: in our graphs the one MatMul it takes is the tied LM head's ``MatMul(x, Transpose(embedding))``, a
transpose of a constant that ONNX Runtime folds at load anyway, and as FusedMatMul the head is out of reach of
``mhaexport quantize`` (which quantizes MatMul weights: "LM head not found" on the built-in decoder).

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


def _packable(group: list) -> bool:
    """MatMuls reading one value with constant 2-D initializer weights of one dtype and one K."""
    if len(group) < 2 or any(u.op_type != "MatMul" or u.domain not in ("", "ai.onnx") or u.inputs[1] is None
                             or u.inputs[1].const_value is None or not u.inputs[1].is_initializer()
                             or len(u.inputs[1].const_value.shape) != 2 or u.inputs[0] is not group[0].inputs[0]
                             for u in group):
        return False
    weights = [u.inputs[1].const_value for u in group]
    return len({w.dtype for w in weights}) == 1 and len({w.shape[0] for w in weights}) == 1


def _packed_matmul(model: ir.Model, group: list) -> ir.Node:
    """One MatMul of ``group``'s weights side by side (in group order), inserted before the first; it keeps the
    scopes the group shares (its block), so quantize's ``--int8-blocks`` and bisect still place it."""
    import onnx_ir as ir

    from mhaexport.core.graph import SCOPES_KEY, name_scopes

    first = group[0]
    name = f"{first.name}_packed"
    w = ir.Value(name=f"{name}.weight", const_value=ir.tensor(
        np.concatenate([u.inputs[1].const_value.numpy() for u in group], axis=1), name=f"{name}.weight"))
    model.graph.register_initializer(w)
    mm = ir.Node("", "MatMul", [first.inputs[0], w], num_outputs=1, name=name)
    scopes = [name_scopes(u) for u in group]
    mm.metadata_props[SCOPES_KEY] = repr([x for i, x in enumerate(scopes[0])
                                          if all(len(sc) > i and sc[i] == x for sc in scopes)])
    model.graph.insert_before(first, mm)
    return mm


def pack_projections(model: ir.Model) -> int:
    """MatMuls that read one value with constant (K, N_i) weights — a block's Q, K and V projections; SwiGLU's gate
    and up — become one MatMul of the weights side by side and a Split: one weight to read per step, and one
    MatMulNBits after ``mhaexport quantize``. Used where the attention cannot take the packed tensor itself
    (MultiHeadAttention over a concat cache); GroupQueryAttention takes it whole (:func:`gqa_takes_projections`).
    Returns the groups packed."""
    import onnx_ir as ir

    from mhaexport.core.graph import SCOPES_KEY

    packed = 0
    for value in list(model.graph.inputs) + [o for n in list(model.graph) for o in n.outputs]:
        group = [u for u, _ in value.uses() if u.op_type == "MatMul" and u.inputs[0] is value]
        group = list({id(u): u for u in group}.values())
        if not _packable(group):
            continue
        mm = _packed_matmul(model, group)
        sizes = ir.Value(name=f"{mm.name}.sizes", const_value=ir.tensor(
            np.array([u.inputs[1].const_value.shape[1] for u in group], dtype=np.int64), name=f"{mm.name}.sizes"))
        model.graph.register_initializer(sizes)
        split = ir.Node("", "Split", [mm.outputs[0], sizes], attributes=[ir.AttrInt64("axis", -1)],
                        num_outputs=len(group), name=f"{mm.name}_split")
        split.metadata_props[SCOPES_KEY] = mm.metadata_props[SCOPES_KEY]
        model.graph.insert_after(mm, split)
        for u, out in zip(group, split.outputs):
            out.shape, out.dtype = u.outputs[0].shape, u.outputs[0].dtype
            u.outputs[0].replace_all_uses_with(out)
            if u.outputs[0].is_graph_output():
                raise AssertionError("a projection is a graph output")  # never in a decoder
            model.graph.remove(u, safe=True)
        packed += 1
    return packed


HEADS_PERM = [0, 2, 1, 3]  # (B, T, H, D) <-> (B, H, T, D)


def _head_moves(value: ir.Value) -> tuple[ir.Value, ir.Node | None, int] | None:
    """Walk back from a GroupQueryAttention input through what only moves heads around — Reshape, Transpose with
    perm [0, 2, 1, 3] — and at most one RotaryEmbedding: (the value it starts from, the RotaryEmbedding or None,
    the Transposes between the RotaryEmbedding and the attention). None when the walk meets a RotaryEmbedding twice
    or an odd count of Transposes in all (the heads not moved back: the value is not the attention's layout)."""
    rotary, transposes, after_rotary = None, 0, 0
    while (n := value.producer()) is not None:
        if n.op_type == "Reshape" and n.domain in ("", "ai.onnx"):
            pass
        elif n.op_type == "Transpose" and n.domain in ("", "ai.onnx") and "perm" in n.attributes \
                and list(n.attributes["perm"].value) == HEADS_PERM:
            transposes += 1
            after_rotary += rotary is None
        elif n.op_type == "RotaryEmbedding" and n.domain == "com.microsoft":
            if rotary is not None:
                return None
            rotary = n
        else:
            break
        value = n.inputs[0]
    if transposes % 2:
        return None
    return value, rotary, after_rotary


def _int_attr(node: ir.Node, name: str, default: int = 0) -> int:
    a = node.attributes.get(name)
    return int(a.value) if a is not None else default


def gqa_takes_projections(model: ir.Model) -> int:
    """GroupQueryAttention nodes whose Q and K come through a RotaryEmbedding between head-moving Reshapes and
    Transposes (and V through such moves alone; or all three through moves alone, a model without rotary) read the
    projections themselves, with the rotary inside (``do_rotary=1``, the same cos/sin caches) — and, when Q, K and V
    are MatMuls of one value by constant weights, one MatMul of the three weights side by side (Q | K | V), key and
    value left out: onnxruntime-genai's builder's attention (one MatMulNBits after ``mhaexport quantize``). The
    attention's output then goes straight to the output projection (:func:`_skip_head_reshapes`). On the bench-size
    Llama this took the optimized graph from 228 to 105 nodes (per layer: the two RotaryEmbeddings, the Split, 4
    Transposes and 8 Reshapes; with constant rotary tables, :func:`fixed_cos_sin_cache`, 89: the builder's graph,
    op for op). Returns the attentions rewritten.

    ort_fusions' own GQA rule (``ort_fusions.gqa``) would do this from a concat-cache SDPA with the causal mask it
    knows; ours writes GroupQueryAttention over the shared buffer first (its sequence lengths from the attention
    mask), so the rotary is folded in here. The same numbers: GroupQueryAttention rotates each new token at its row's
    slot (past length + i), and in its protocol (rows packed from slot 0) that is the position the RotaryEmbedding
    was fed, cumsum(mask) - 1 — the export's self-check compares both graphs, left padding and a past included."""
    import onnx_ir as ir

    done = 0
    for node in list(model.graph):
        if node.op_type != "GroupQueryAttention" or node.domain != "com.microsoft" or _int_attr(node, "do_rotary"):
            continue
        ins = list(node.inputs)
        if len(ins) < 7 or any(x is None for x in ins[:7]) or any(x is not None for x in ins[7:]):
            continue
        H, Hkv = _int_attr(node, "num_heads"), _int_attr(node, "kv_num_heads")
        walks = [_head_moves(x) for x in ins[:3]]
        if any(w is None for w in walks):
            continue
        (q, rq, tq), (k, rk, tk), (v, rv, _) = walks
        if (rq is None) != (rk is None) or rv is not None:
            continue
        rotary = rq is not None
        if rotary and (any(len(r.inputs) < 4 or r.inputs[2] is None for r in (rq, rk)) or
                       rq.inputs[2] is not rk.inputs[2] or rq.inputs[3] is not rk.inputs[3] or
                       _int_attr(rq, "interleaved") != _int_attr(rk, "interleaved") or
                       any(_int_attr(r, "rotary_embedding_dim") or _int_attr(r, "is_packed_batching")
                           for r in (rq, rk))):
            continue
        # each rotary between its transposes as the layout needs: a 4-D input is (B, H, T, D) (an odd count of
        # Transposes after it), a 3-D one (B, T, H*D) (an even count)
        if rotary and any(r.inputs[0].shape is None or (len(r.inputs[0].shape) == 4) != (t % 2 == 1)
                          for r, t in ((rq, tq), (rk, tk))):
            continue
        shapes = [x.shape for x in (q, k, v)]
        if any(sh is None or len(sh) != 3 or not isinstance(sh[2], int) for sh in shapes):
            continue
        if shapes[0][2] % H or shapes[1][2] != shapes[2][2] or shapes[1][2] % Hkv:
            continue
        D = shapes[0][2] // H
        if shapes[1][2] // Hkv != D:
            continue
        if rotary and (rq.inputs[2].shape is None or rq.inputs[2].shape[-1] != D // 2):
            continue  # full-width rotary only: GroupQueryAttention's cos/sin caches are (positions, D/2)
        new_in = [q, k, v]
        projections = [x.producer() for x in (q, k, v)]
        if all(projections) and _packable(projections) and all(len(list(x.uses())) == 1 for x in (q, k, v)):
            packed = _packed_matmul(model, projections).outputs[0]  # (B, T, (H + 2 Hkv) D): Q | K | V
            packed.shape, packed.dtype = ir.Shape([q.shape[0], q.shape[1], (H + 2 * Hkv) * D]), q.dtype
            new_in = [packed, None, None]
        for i, x in enumerate(new_in):
            node.replace_input_with(i, x)
        if rotary:
            node.resize_inputs(9)
            node.replace_input_with(7, rq.inputs[2])  # cos_cache
            node.replace_input_with(8, rq.inputs[3])  # sin_cache
            node.attributes["do_rotary"] = ir.AttrInt64("do_rotary", 1)
            node.attributes["rotary_interleaved"] = ir.AttrInt64("rotary_interleaved", _int_attr(rq, "interleaved"))
        _skip_head_reshapes(node, ir.Shape([q.shape[0], q.shape[1], H * D]))
        done += 1
    return done


def _skip_head_reshapes(node: ir.Node, out_shape: ir.Shape) -> None:
    """The attention's output (B, T, H*D) reshaped to heads and back to (B, T, H*D) by the next Reshape (the model's
    own, its shape computed at run time): the consumers of that second Reshape read the output itself, when shape
    inference says the second one's shape is the output's."""
    y = node.outputs[0]
    uses = list(y.uses())
    if len(uses) != 1 or uses[0][0].op_type != "Reshape":
        return
    nxt = list(uses[0][0].outputs[0].uses())
    if len(nxt) != 1 or nxt[0][0].op_type != "Reshape":
        return
    back = nxt[0][0].outputs[0]
    if back.shape is not None and back.shape == out_shape and not back.is_graph_output():
        y.shape, y.dtype = out_shape, back.dtype
        back.replace_all_uses_with(y)


# the largest cos + sin tables (bytes) written as constants; a model with more positions keeps computing its rows
CONST_ROTARY_TABLES_AT_MOST = 64 << 20


def fixed_cos_sin_cache(max_positions: int | None):
    """ort_fusions' cos/sin-cache fusion; with ``max_positions``, its rules set to the model's positions (their
    ``max_pos_id``), so the caches are constant tables of max_positions rows, as the builder writes them, instead
    of rows computed on every call up to the largest position id (Range, MatMul, Cos, Sin and the mask's cumsum
    before them: ~10 small ops a decode step ran). None: their default (computed)."""
    from onnxscript.rewriter import _fusion_utils, pattern
    from onnxscript.rewriter.ort_fusions.cos_sin_cache import CosSinCacheFusion, fuse_cos_sin_cache

    if max_positions is None:
        return fuse_cos_sin_cache

    class Fixed(CosSinCacheFusion):
        def __init__(self, name: str, **kwargs) -> None:
            super().__init__(name, **kwargs)
            self.max_pos_id = max_positions - 1  # their tables hold max_pos_id + 1 rows

    rules = [Fixed.rule("CosSinCache_cast_fixed", cast=True), Fixed.rule("CosSinCache_fixed", cast=False)]
    return _fusion_utils.apply_fusion_rules(pattern.RewriteRuleSet(rules))


def _low_precision(model: ir.Model) -> bool:
    """Whether the graph's float inputs (the cache) are float16 or bfloat16."""
    import onnx_ir as ir

    floats = [v.dtype for v in model.graph.inputs if v.dtype is not None and v.dtype.is_floating_point()]
    return any(d in (ir.DataType.FLOAT16, ir.DataType.BFLOAT16) for d in floats)


def fuse_for_ort(model: ir.Model, max_positions: int | None = None, head_dim: int | None = None) -> dict[str, int]:
    """Apply ort_fusions' non-attention fusions to ``model`` in place; returns {fusion: count} (zeros left out).
    ``max_positions`` / ``head_dim``: the model's, for constant rotary tables (:func:`fixed_cos_sin_cache`) where
    they stay under CONST_ROTARY_TABLES_AT_MOST."""
    from onnx_ir.passes.common import RemoveUnusedNodesPass, ShapeInferencePass, TopologicalSortPass
    from onnxscript.optimizer import optimize
    from onnxscript.rewriter.ort_fusions.bias_gelu import fuse_bias_gelu
    from onnxscript.rewriter.ort_fusions.erfgelu import fuse_erfgelu
    from onnxscript.rewriter.ort_fusions.gelu import fuse_gelu
    from onnxscript.rewriter.ort_fusions.rms_normalization import fuse_rms_normalization
    from onnxscript.rewriter.ort_fusions.rotary_embedding import fuse_rotary_embedding
    from onnxscript.rewriter.ort_fusions.skip_normalization import (fuse_skip_layer_normalization,
                                                                   fuse_skip_rms_normalization)

    fixed = (max_positions if max_positions and head_dim and max_positions * head_dim * 4 <= CONST_ROTARY_TABLES_AT_MOST
             else None)  # cos and sin: (max_positions, D/2) float32 each
    cos_sin = fixed_cos_sin_cache(fixed)
    ShapeInferencePass()(model)
    counts = {"canonical_last_axis": canonical_last_axis(model), "outer_product_freqs": outer_product_freqs(model)}
    # float16 / bfloat16 exports compute their norms in float32 (torch's autocast-style upcast: the residual sum in
    # the low precision, Cast, the norm in float32): ort_fusions' skip fusions then bind the residual and the Cast
    # sum into one Skip*Normalization of two types, which ONNX Runtime refuses to load ("Type parameter (T) of
    # SkipSimplifiedLayerNormalization bound to different types (tensor(float16) and tensor(float))" on tiny-llama);
    # there the norms are fused without their residual Add
    skip = not _low_precision(model)
    for name, fuse in (("erf_gelu", fuse_erfgelu), ("rms_normalization", fuse_rms_normalization),
                       ("skip_layer_normalization", fuse_skip_layer_normalization if skip else None),
                       ("skip_rms_normalization", fuse_skip_rms_normalization if skip else None),
                       ("rotary_embedding", fuse_rotary_embedding), ("cos_sin_cache", cos_sin),
                       ("gelu", fuse_gelu), ("bias_gelu", fuse_bias_gelu)):
        if fuse is not None:
            counts[name] = fuse(model)
    optimize(model)  # inlines the intermediate functions a fusion left unconsumed (as ort_fusions itself does)
    counts["gqa_takes_projections"] = gqa_takes_projections(model)
    if not counts["gqa_takes_projections"]:  # MultiHeadAttention takes no packed Q/K/V with a cache: MatMul + Split
        counts["packed_projections"] = pack_projections(model)
    RemoveUnusedNodesPass()(model)
    TopologicalSortPass()(model)
    return {k: int(v) for k, v in counts.items() if v}
