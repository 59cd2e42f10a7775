"""Bugs planted at one step inside one attention module of an exported ONNX graph (the decomposed lowering:
MatMul → Div → Where → Softmax → MatMul → Transpose → Reshape → W_o), for bisect to find. Each edits the ModelProto
in place, touches only the nodes in ``module``'s own scope (initializers shared between blocks get a private copy)
and returns the name of the node it changed."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from mhaexport.core.graph import name_scopes
from mhaexport.diagnose.bisect import _module_paths


def _own(proto: onnx.ModelProto, module: str, op_type: str, nth: int = 0) -> onnx.NodeProto:
    nodes = [n for n in proto.graph.node if n.op_type == op_type
             and (_module_paths(name_scopes(n)) or [""])[-1] == module]
    if len(nodes) <= nth:
        raise LookupError(f"no {op_type} #{nth} among {module}'s own nodes: the attention lowering changed")
    return nodes[nth]


def _private_constant(proto: onnx.ModelProto, node: onnx.NodeProto, i: int, change) -> None:
    """Give ``node`` its own copy of initializer input ``i``, changed by ``change(array) -> array``."""
    init = next(x for x in proto.graph.initializer if x.name == node.input[i])
    val = numpy_helper.to_array(init)
    new = numpy_helper.from_array(np.asarray(change(val)).astype(val.dtype), f"{init.name}_planted_{node.name}")
    proto.graph.initializer.append(new)
    node.input[i] = new.name


def _wrap_with_metadata(like: onnx.NodeProto, node: onnx.NodeProto) -> onnx.NodeProto:
    node.metadata_props.extend(like.metadata_props)  # the scope of the node it sits beside
    return node


def scale(proto: onnx.ModelProto, module: str, factor: float = 2.0) -> str:
    """The scores divided by ``factor`` * sqrt(d_k) instead of sqrt(d_k): the Div (or Mul by 1/sqrt(d_k), as
    transformers writes it) that takes Q·Kᵀ gets its own constant."""
    scores = _own(proto, module, "MatMul").output[0]
    node = next(n for n in proto.graph.node if n.op_type in ("Div", "Mul") and scores in n.input)
    inits = {x.name for x in proto.graph.initializer}
    i = next(i for i, x in enumerate(node.input) if x in inits)
    _private_constant(proto, node, i, lambda v: v * factor if node.op_type == "Div" else v / factor)
    return node.name


def mask_fill(proto: onnx.ModelProto, module: str, value: float = -1.0) -> str:
    """Masked scores filled with ``value`` (too weak: masked keys keep weight) instead of the dtype's minimum."""
    where = _own(proto, module, "Where")
    _private_constant(proto, where, 1, lambda v: np.full_like(v, value))
    return where.name


def mask_after_softmax(proto: onnx.ModelProto, module: str) -> str:
    """Softmax over the unmasked scaled scores, then the mask zeroes masked keys' weights: the classic bug."""
    where, softmax = _own(proto, module, "Where"), _own(proto, module, "Softmax")
    matmul = next(n for n in proto.graph.node if softmax.output[0] in n.input)  # the weighted sum
    scaled, weights = where.input[2], softmax.output[0]
    softmax.input[0] = scaled
    where.input[2] = weights
    _private_constant(proto, where, 1, lambda v: np.zeros_like(v))
    matmul.input[list(matmul.input).index(weights)] = where.output[0]
    nodes = list(proto.graph.node)  # run order: the Softmax now comes before the Where
    i, j = nodes.index(where), nodes.index(softmax)
    nodes[i], nodes[j] = nodes[j], nodes[i]
    del proto.graph.node[:]
    proto.graph.node.extend(nodes)
    return where.name


def softmax_axis(proto: onnx.ModelProto, module: str, axis: int = -2) -> str:
    """Softmax over the queries (``axis`` -2) instead of the keys."""
    softmax = _own(proto, module, "Softmax")
    for a in softmax.attribute:
        if a.name == "axis":
            a.i = axis
            break
    else:
        softmax.attribute.append(helper.make_attribute("axis", axis))
    return softmax.name


def value_scaled(proto: onnx.ModelProto, module: str, factor: float = 1.1) -> str:
    """The weighted sum takes V * ``factor`` (the cache itself, present.*.value, is left right)."""
    matmul = _own(proto, module, "MatMul", nth=1)  # Q·Kᵀ is the first MatMul of the module's own nodes
    name = f"{matmul.name}_planted"
    const = numpy_helper.from_array(np.array(factor, dtype=np.float32), f"{name}_factor")
    proto.graph.initializer.append(const)
    mul = _wrap_with_metadata(matmul, helper.make_node("Mul", [matmul.input[1], const.name], [f"{name}_v"],
                                                       name=f"{name}_mul"))
    matmul.input[1] = mul.output[0]
    nodes = list(proto.graph.node)
    nodes.insert(nodes.index(matmul), mul)
    del proto.graph.node[:]
    proto.graph.node.extend(nodes)
    return matmul.name


def heads_unmerged(proto: onnx.ModelProto, module: str) -> str:
    """The heads concatenated without moving them next to each other first: (B, H, T, D) reshaped straight to
    (B, T, H * D), the Transpose after the weighted sum made the identity."""
    transpose = next(n for n in proto.graph.node if n.op_type == "Transpose"
                     and n.input[0] == _own(proto, module, "MatMul", nth=1).output[0])
    next(a for a in transpose.attribute if a.name == "perm").ints[:] = [0, 1, 2, 3]
    return transpose.name


PLANTS = {"scale": scale, "mask fill": mask_fill, "mask after softmax": mask_after_softmax,
          "softmax": softmax_axis, "weighted sum": value_scaled, "output projection": heads_unmerged}
