"""A quantized file's weights against their recipe: the check ``weights`` of a lossy folder.

A gate on quality against fp32 cannot see damage of the size quantization itself makes (a corrupted block scale in
one layer moved int4's relative logit error from 0.110 to 0.136 under a 0.30 limit). But a folder made by
``mhaexport quantize`` records its recipe (scheme, block size, symmetry, accuracy level, what stays float, the 8-bit
blocks) and the sha256 of the float file it quantized: re-running that recipe on that file must give the shipped
initializers bit for bit (round to nearest is deterministic), so any difference is named — the tensor, its role in
its node (packed weights, scales, zero points), and the block. Re-running the recipe is the exporter's
(``mhaexport.exporter.quantize.reproduce``); verify takes it as a function (the CLI and the Python API pass it) and
compares here. A file another tool quantized has no recipe to re-run: the check says so (not run), and the quality
check judges it.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
from onnx import numpy_helper

from mhaexport.verify.results import WEIGHTS, CheckResult

# Re-runs a folder's recipe: (shipped ModelProto, rebuilt ModelProto, a note) or why it cannot (a line)
Reproduce = Callable[[Any], "tuple[Any, Any, str] | str"]

_ROLES = {"MatMulNBits": {1: "packed weights", 2: "scales", 3: "zero points"},
          "GatherBlockQuantized": {0: "packed table", 2: "scales", 3: "zero points"}}


def _roles(model: Any) -> dict[str, tuple[Any, str]]:
    """{initializer: (the quantized node reading it, its role)}."""
    out = {}
    for node in model.graph.node:
        for k, name in enumerate(node.input):
            if node.op_type in _ROLES and k in _ROLES[node.op_type] and name:
                out.setdefault(name, (node, _ROLES[node.op_type][k]))
    return out


def _block_of(node: Any, role: str, shape: tuple[int, ...], index: tuple[int, ...]) -> str:
    """Where an element of a MatMulNBits input lies: output row n and K-block k."""
    if node is None or node.op_type != "MatMulNBits":
        return f"element {list(index)}"
    attrs = {a.name: a.i for a in node.attribute}
    n_blocks = -(-attrs.get("K", 0) // max(attrs.get("block_size", 1), 1)) or 1
    flat = int(np.ravel_multi_index(index, shape)) if shape else 0
    if role == "packed weights" and len(shape) == 3:  # (N, n_blocks, blob)
        return f"row {index[0]}, block {index[1]}"
    if role == "scales":
        return f"row {flat // n_blocks}, block {flat % n_blocks}"
    return f"element {list(index)}"


def first_difference(shipped: Any, rebuilt: Any) -> tuple[str | None, dict]:
    """The first initializer where the shipped model and the rebuilt one differ, as a sentence naming the tensor,
    its role and the block (None when every initializer is identical); and the figures."""
    a = {t.name: t for t in shipped.graph.initializer}
    b = {t.name: t for t in rebuilt.graph.initializer}
    roles = _roles(shipped)
    quantized = [n for n in a if n in roles]
    fig = {"tensors": len(a), "quantized_tensors": len(quantized)}
    if missing := sorted(set(b) - set(a)):
        return f"the shipped file lacks {len(missing)} tensor(s) the recipe makes (first: {missing[0]})", fig
    if extra := sorted(set(a) - set(b)):
        return f"the shipped file holds {len(extra)} tensor(s) the recipe does not make (first: {extra[0]})", fig
    differ = 0
    first = None
    for name in a:  # the shipped file's order
        if a[name].SerializeToString() == b[name].SerializeToString():
            continue
        x, y = numpy_helper.to_array(a[name]), numpy_helper.to_array(b[name])
        if x.shape != y.shape or x.dtype != y.dtype:
            differ += 1
            first = first or f"{name}: {x.dtype}{list(x.shape)} where the recipe makes {y.dtype}{list(y.shape)}"
            continue
        bad = np.argwhere(~((x == y) | (np.isnan(x) & np.isnan(y)) if x.dtype.kind == "f" else x == y))
        if not len(bad):
            continue  # the same values written differently (e.g. raw vs typed fields)
        differ += 1
        if first is None:
            node, role = roles.get(name, (None, "float tensor"))
            where = _block_of(node, role, x.shape, tuple(int(i) for i in bad[0]))
            what = f"{role} of {node.op_type} {node.name}" if node is not None else role
            first = (f"{name} ({what}) differs from the recipe's at {where}: {len(bad)} of {x.size} values "
                     f"(first {x[tuple(bad[0])].item()!r}, the recipe's {y[tuple(bad[0])].item()!r})")
    fig["differing_tensors"] = differ
    return first, fig


def check_weights(folder: Any, reproduce: Reproduce | None) -> CheckResult:
    """The ``weights`` check of an export folder's quantized ONNX artifact (``folder``: an opened ExportFolder)."""
    if reproduce is None:
        return CheckResult(WEIGHTS, None, {}, "not run: no recipe runner given (the CLI and mhaexport.verify pass "
                                              "the exporter's)")
    got = reproduce(folder)
    if isinstance(got, str):
        return CheckResult(WEIGHTS, None, {"reason": got}, f"not run: {got}; quality judges the file")
    shipped, rebuilt, note = got
    first, fig = first_difference(shipped, rebuilt)
    versions = f" ({note})" if note else ""
    if first is None:
        return CheckResult(WEIGHTS, True, fig, f"the recipe re-run on its recorded source gives the shipped "
                                               f"{fig['quantized_tensors']} quantized tensor(s) bit for bit{versions}")
    if note:  # another quantizer version may round differently: a difference is reported, not judged
        return CheckResult(WEIGHTS, None, {**fig, "first_difference": first},
                           f"not judged: {first}; {note}")
    return CheckResult(WEIGHTS, False, {**fig, "first_difference": first},
                       f"{fig['differing_tensors']} tensor(s) differ from the recorded recipe re-run on the recorded "
                       f"source: {first}")
