"""Bugs planted in the shipped ONNX file only (the PyTorch model is right): each function edits a ModelProto in
place; ``planted.edit.rehashed_copy`` writes it into a copy of an export folder and re-hashes it, as a pipeline that
re-records a file would. One per class of damage verify must name (tests/test_messages.py, tests/test_sweeps.py)."""

from __future__ import annotations

import onnx
from onnx import TensorProto, helper, numpy_helper


def weight_column(proto: onnx.ModelProto) -> None:
    """Scale one output column of a MatMul weight (block 0's MLP) by 1.2: a real edit of a weight, not rounding."""
    inits = {t.name: t for t in proto.graph.initializer}
    node = [n for n in proto.graph.node if n.op_type == "MatMul" and n.input[1] in inits][5]
    t = inits[node.input[1]]
    a = numpy_helper.to_array(t).copy()
    a[:, 3] *= 1.2
    t.CopyFrom(numpy_helper.from_array(a, t.name))


def position_row(proto: onnx.ModelProto, position: int = 100) -> None:
    """Damage one row of the learned position table, high up: only sequences that long reach it."""
    t = next(t for t in proto.graph.initializer if t.name == "pos_emb.weight")
    a = numpy_helper.to_array(t).copy()
    a[position, ::2] += 0.5
    t.CopyFrom(numpy_helper.from_array(a, t.name))


def fp16_cache(proto: onnx.ModelProto, layer: int = 1) -> None:
    """One layer's key cache through float16 and back: precision lost in one cache output of a float32 file."""
    g = proto.graph
    name = f"present.{layer}.key"
    node = next(n for n in g.node if name in n.output)
    node.output[list(node.output).index(name)] = f"{name}_f32"
    g.node.extend([helper.make_node("Cast", [f"{name}_f32"], [f"{name}_f16"], to=TensorProto.FLOAT16),
                   helper.make_node("Cast", [f"{name}_f16"], [name], to=TensorProto.FLOAT)])


def ragged_seqlens(proto: onnx.ModelProto) -> None:
    """GroupQueryAttention's ``seqlens_k`` taken from the batch's longest row for every row: right for a batch of
    equal rows (every parity case, each row alone), wrong for a ragged batch over the shared buffer (the deploy
    loop's, onnxruntime-genai's)."""
    g = proto.graph.node
    i, node = next((i, n) for i, n in enumerate(g) if n.op_type == "Cast" and
                   any("seqlens_k" in o for o in n.output))
    real = node.input[0]  # int64 (B,): real tokens - 1 per row
    node.input[0] = "planted_seqlens"
    for j, n in enumerate([helper.make_node("ReduceMax", [real], ["planted_max"], keepdims=1),  # (1,)
                           helper.make_node("Shape", [real], ["planted_shape"]),
                           helper.make_node("Expand", ["planted_max", "planted_shape"], ["planted_seqlens"])]):
        g.insert(i + j, n)


FILE_BUGS = {"weight_column": weight_column, "position_row": position_row, "fp16_cache": fp16_cache}


def gqa_window(proto: onnx.ModelProto, shift: int | None) -> None:
    """Every GroupQueryAttention's local_window_size moved by ``shift`` (W+1, W-1), or removed (None: -1, full
    attention): the window a shared-cache file drops or shifts while its model and its config stay right."""
    for n in proto.graph.node:
        if n.op_type == "GroupQueryAttention":
            a = next(a for a in n.attribute if a.name == "local_window_size")
            a.i = -1 if shift is None else a.i + shift


def softcap_dropped(proto: onnx.ModelProto) -> None:
    """The attention softcap c * tanh(s / c) taken out of the graph (each Mul reads the Div's input instead): what a
    fused kernel without ``softcap`` would compute (onnxruntime-genai#692)."""
    g = proto.graph
    producer = {o: n for n in g.node for o in n.output}
    for tanh in [n for n in g.node if n.op_type == "Tanh"]:
        div = producer.get(tanh.input[0])
        mul = next((n for n in g.node if tanh.output[0] in n.input), None)
        if mul is None or div is None or mul.op_type != "Mul" or div.op_type != "Div":
            continue  # the final softcap (its Tanh writes the logits): kept
        out = mul.output[0]
        for n in g.node:  # readers of c * tanh(s / c) read s
            for k, name in enumerate(n.input):
                if name == out:
                    n.input[k] = div.input[0]


WINDOW_BUGS = {"window_removed": lambda p: gqa_window(p, None), "window_plus_one": lambda p: gqa_window(p, 1),
               "window_minus_one": lambda p: gqa_window(p, -1)}
