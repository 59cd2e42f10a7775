"""core/graph.py: the one reader of name scopes, the one graph index, the one mask-fill threshold."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import helper, numpy_helper

from mhaexport.core.graph import MASK_FILL_AT_MOST, SCOPES_KEY, GraphIndex, name_scopes
from mhaexport.models.attention import masked_fill_value


def _node_with_scopes(value: str | None) -> onnx.NodeProto:
    node = helper.make_node("Relu", ["x"], ["y"])
    if value is not None:
        node.metadata_props.add(key=SCOPES_KEY, value=value)
    return node


def test_name_scopes_read_what_torch_onnx_writes():
    scopes = ["", "blocks.0", "blocks.0.attn", "matmul_1"]
    assert name_scopes(_node_with_scopes(repr(scopes))) == scopes
    # a scope holding a comma or a quote: repr() escapes it; splitting the text on commas (quantize's old reader)
    # cut it in two and kept the quotes
    odd = ["", "layers.3", "it's, odd"]
    assert name_scopes(_node_with_scopes(repr(odd))) == odd


@pytest.mark.parametrize("value", [None, "not a list", "[unclosed", "{'a': 1}"])
def test_name_scopes_absent_or_unreadable_is_empty(value):
    assert name_scopes(_node_with_scopes(value)) == []


def test_graph_index_producers_consumers_initializers():
    w = numpy_helper.from_array(np.ones((2, 2), np.float32), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
             helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("Add", ["h", "r"], ["y"], name="add")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 2])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 2])], [w])
    g = GraphIndex(graph)
    assert [n.name for n in g.nodes] == ["mm", "relu", "add"]
    assert g.producer["y"].name == "add" and g.producer_index["r"] == 1
    assert "x" not in g.producer and "w" not in g.producer  # graph inputs and initializers have no producer
    assert [n.name for n in g.consumers["h"]] == ["relu", "add"]
    assert set(g.initializers) == {"w"}


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_the_built_in_mask_fill_counts_as_a_mask_fill(dtype):
    """The threshold the lowering rules, lint and bisect share must take the built-in attention's own fill."""
    assert masked_fill_value(dtype) <= MASK_FILL_AT_MOST < -100.0


def test_the_element_bit_table_matches_onnx():
    from mhaexport.core.graph import _BITS_OF

    T = onnx.TensorProto
    assert _BITS_OF == {T.FLOAT: 32, T.FLOAT16: 16, T.BFLOAT16: 16, T.DOUBLE: 64, T.INT64: 64, T.INT32: 32,
                        T.INT16: 16, T.UINT16: 16, T.INT8: 8, T.UINT8: 8, T.BOOL: 8, T.INT4: 4, T.UINT4: 4}
