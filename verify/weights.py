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

from mhaexport.verify.figures import WeightsFigures
from mhaexport.verify.results import WEIGHTS, CheckResult

# Re-runs a folder's recipe: (shipped ModelProto, rebuilt ModelProto or None, a note: why not, or the versions)
Reproduce = Callable[[Any], "tuple[Any, Any, str]"]

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


def _tensor(model: Any, t: Any) -> Any:
    """``t`` with its bytes: a model whose large tensors stay in their files (the exporter's ``StoredModel``) reads
    one in when asked (``model.tensor(t)``); a ModelProto holds them already."""
    read = getattr(model, "tensor", None)
    return read(t) if read is not None else t


class _Initializers(dict):
    """{name: initializer} of a model, each read in (:func:`_tensor`) when looked up."""

    def __init__(self, model: Any) -> None:
        super().__init__((t.name, t) for t in model.graph.initializer)
        self.model = model

    def __getitem__(self, name: str) -> Any:
        return _tensor(self.model, super().__getitem__(name))


def first_difference(shipped: Any, rebuilt: Any) -> tuple[str | None, WeightsFigures]:
    """The first initializer where the shipped model and the rebuilt one differ, as a sentence naming the tensor,
    its role and the block (None when every initializer is identical); and the figures. Each model: a ModelProto or
    one whose large tensors are read one at a time (:func:`_tensor`)."""
    a = {t.name: t for t in shipped.graph.initializer}
    b = {t.name: t for t in rebuilt.graph.initializer}
    roles = _roles(shipped)
    quantized = [n for n in a if n in roles]
    fig = WeightsFigures.of(tensors=len(a), quantized_tensors=len(quantized))
    if missing := sorted(set(b) - set(a)):
        fig.set(differing_tensors=len(missing))
        return f"the shipped file lacks {len(missing)} tensor(s) the recipe makes (first: {missing[0]})", fig
    if extra := sorted(set(a) - set(b)):
        fig.set(differing_tensors=len(extra))
        return f"the shipped file holds {len(extra)} tensor(s) the recipe does not make (first: {extra[0]})", fig
    differ = 0
    first = None
    for name in a:  # the shipped file's order, one pair of tensors read at a time
        ta, tb = _tensor(shipped, a[name]), _tensor(rebuilt, b[name])
        if ta.SerializeToString() == tb.SerializeToString():
            continue
        x, y = numpy_helper.to_array(ta), numpy_helper.to_array(tb)
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
    fig.set(differing_tensors=differ)
    return first, fig


def dequantize(node: Any, inits: dict[str, Any]) -> tuple[np.ndarray, np.ndarray] | None:
    """A MatMulNBits node's weight as floats, (N, K), and the scale of the block of each value, (N, K): (q - zero
    point) x scale per block of ``block_size`` along K, 4-bit values two to a byte (low nibble first); None when an
    input is not a constant."""
    attrs = {a.name: a.i for a in node.attribute}
    K, N, bits, bs = attrs.get("K"), attrs.get("N"), attrs.get("bits", 4), attrs.get("block_size")
    names = list(node.input) + [""] * 4
    if not (K and N and bs) or names[1] not in inits or names[2] not in inits:
        return None
    packed = numpy_helper.to_array(inits[names[1]]).astype(np.uint8).reshape(N, -1)  # (N, n_blocks * blob)
    n_blocks = -(-K // bs)
    if bits == 4:
        q = np.stack([packed & 0x0F, packed >> 4], axis=-1).reshape(N, -1)  # (N, n_blocks * bs)
    else:
        q = packed
    q = q[:, :n_blocks * bs].astype(np.float64).reshape(N, n_blocks, bs)
    scales = numpy_helper.to_array(inits[names[2]]).astype(np.float64).reshape(N, n_blocks, 1)
    if names[3] and names[3] in inits:
        zp = numpy_helper.to_array(inits[names[3]]).astype(np.uint8).reshape(N, -1)
        if bits == 4:
            zp = np.stack([zp & 0x0F, zp >> 4], axis=-1).reshape(N, -1)
        zp = zp[:, :n_blocks].astype(np.float64).reshape(N, n_blocks, 1)
    else:
        zp = np.full((N, n_blocks, 1), 2.0 ** (bits - 1))
    w = ((q - zp) * scales).reshape(N, -1)[:, :K]
    return w, np.broadcast_to(np.abs(scales), (N, n_blocks, bs)).reshape(N, -1)[:, :K]


# how far (in steps of its block's scale) a quantized value may lie from the weight it quantizes: half a step by
# rounding, one at the clamped edge of the range; and float slack
STEP_SLACK = 1.0 + 1e-3


def _with_packed(reference: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The reference weights, and packed ones as producers write them: runs of 2 or 3 sibling weights (one parent
    module, one input size K, in the model's order: q, k, v; gate, up) stacked along the output axis."""
    out = dict(reference)
    siblings: dict[str, list[str]] = {}
    for name in reference:
        siblings.setdefault(name.rsplit(".", 2)[0] if name.count(".") >= 2 else "", []).append(name)
    for names in siblings.values():
        for n in (2, 3):
            for i in range(len(names) - n + 1):
                run = names[i:i + n]
                if len({reference[x].shape[1] for x in run}) == 1:
                    out[" + ".join(run)] = np.concatenate([reference[x] for x in run], axis=0)
    return out


def against_reference(shipped: Any, reference: dict[str, np.ndarray]) -> tuple[str | None, WeightsFigures]:
    """Each MatMulNBits weight of ``shipped`` against the reference model's weights (``reference``: name -> (N, K)
    array, e.g. its Linear weights): the candidate of its shape that it is closest to, and per block an error
    beyond what the block's own scale explains names the tensor and block: round to nearest is off by at most half
    a step, and a value at the clamped edge of the range (symmetric int4 maps the block's largest magnitude to -8,
    so a positive one clamps to 7) by at most one: |error| <= STEP_SLACK x scale. Packed weights (QKV, gate + up)
    are matched against sibling weights stacked; a weight no candidate matches in shape is counted, not judged."""
    inits = _Initializers(shipped)  # each tensor read when a node asks for it
    by_shape: dict[tuple, list[tuple[str, np.ndarray]]] = {}
    for name, w in _with_packed(reference).items():
        by_shape.setdefault(tuple(w.shape), []).append((name, np.asarray(w, dtype=np.float64)))
    checked, unmatched, first = 0, 0, None
    for node in shipped.graph.node:
        if node.op_type != "MatMulNBits":
            continue
        got = dequantize(node, inits)
        if got is None:
            continue
        w, scale = got
        cands = by_shape.get(tuple(w.shape), [])
        if not cands:
            unmatched += 1
            continue
        checked += 1
        ratio = {n: np.abs(w - ref) / np.maximum(scale, 1e-30) for n, ref in cands}  # errors in steps
        best = min(ratio, key=lambda n: float(np.median(ratio[n])))
        bad = np.argwhere(ratio[best] > STEP_SLACK)
        if len(bad) and first is None:
            attrs = {a.name: a.i for a in node.attribute}
            n, k = (int(i) for i in bad[0])
            first = (f"{node.input[1]} (MatMulNBits {node.name}, against the reference's {best}) at row {n}, block "
                     f"{k // attrs.get('block_size', 1)}: off by {ratio[best][n, k]:.2f} of its block's step "
                     f"(round to nearest, the range's edge clamped: at most 1), {len(bad)} value(s) so")
    return first, WeightsFigures.of(checked_against_reference=checked, not_matched=unmatched)


def check_weights(folder: Any, reproduce: Reproduce | None, reference: Callable[[], dict] | None = None
                  ) -> CheckResult:
    """The ``weights`` check of an export folder's quantized ONNX artifact (``folder``: an opened ExportFolder):
    the recipe re-run bit for bit; where it cannot be re-run (another tool's file, the source gone), each quantized
    weight against ``reference()`` (the eager model's weights) within its block's rounding."""
    if reproduce is None:
        return CheckResult(WEIGHTS, None, {}, "not run: no recipe runner given (the CLI and mhaexport.verify pass "
                                              "the exporter's)")
    shipped, rebuilt, note = reproduce(folder)
    if rebuilt is None:
        if shipped is None or reference is None:
            return CheckResult(WEIGHTS, None, WeightsFigures.of(reason=note),
                               f"not run: {note}; quality judges the file")
        first, fig = against_reference(shipped, reference())
        fig.set(recipe=note)
        if not fig.checked_against_reference:
            return CheckResult(WEIGHTS, None, fig, f"not run: {note}, and no quantized weight matches a reference "
                                                   "weight's shape; quality judges the file")
        if first is not None:
            return CheckResult(WEIGHTS, False, fig, f"{note}; against the reference model's weights: {first}")
        unmatched = f" ({fig.not_matched} not matched by shape)" if fig.not_matched else ""
        return CheckResult(WEIGHTS, True, fig, f"{note}; each of {fig.checked_against_reference} quantized weight(s)"
                                               f" is the reference model's within its blocks' rounding{unmatched}")
    first, fig = first_difference(shipped, rebuilt)
    versions = f" ({note})" if note else ""
    if first is None:
        return CheckResult(WEIGHTS, True, fig, f"the recipe re-run on its recorded source gives the shipped "
                                               f"{fig.quantized_tensors} quantized tensor(s) bit for bit{versions}")
    fig.set(first_difference=first)
    if note:  # another quantizer version may round differently: a difference is reported, not judged
        return CheckResult(WEIGHTS, None, fig, f"not judged: {first}; {note}")
    return CheckResult(WEIGHTS, False, fig,
                       f"{fig.differing_tensors} tensor(s) differ from the recorded recipe re-run on the recorded "
                       f"source: {first}")
