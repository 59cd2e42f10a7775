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

import itertools
from collections.abc import Iterator
from typing import Any, Callable

import numpy as np
import onnx
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


PIECE = 16 << 20  # bytes of each of two stored tensors compared at a time
_SUB_BYTE = {onnx.TensorProto.INT4, onnx.TensorProto.UINT4, getattr(onnx.TensorProto, "FLOAT4E2M1", -1)}


def _pieces(model: Any, t: Any, size: int) -> Iterator[bytes] | None:
    """``t``'s raw bytes in pieces of ``size`` where ``model`` keeps them in its files (the exporter's
    ``StoredModel``), else None (the message holds them: a small tensor, read whole)."""
    read = getattr(model, "pieces", None)
    return read(t, size) if read is not None else None


def _unequal(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Where two arrays of one dtype hold different values (NaN equal to NaN; 0.0 to -0.0)."""
    return ~((x == y) | (np.isnan(x) & np.isnan(y))) if x.dtype.kind == "f" else x != y


def _compare_stored(a: Any, ta: Any, b: Any, tb: Any) -> tuple[int, int | None, Any, Any] | str:
    """Two tensors of one shape and dtype, at least one of them kept in its model's files, compared
    :data:`PIECE` bytes at a time: (differing values, the first one's flat index, its value, the recipe's), or a
    sentence where their data's lengths differ. Memory: two pieces, whatever the tensors' size."""
    dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(ta.data_type)).newbyteorder("<")
    size = max(1, PIECE // dtype.itemsize) * dtype.itemsize

    def stream(model: Any, t: Any) -> Iterator[bytes]:
        got = _pieces(model, t, size)
        if got is not None:
            return got
        raw = numpy_helper.to_array(_tensor(model, t)).astype(dtype, copy=False).tobytes()
        return (raw[i:i + size] for i in range(0, len(raw), size))

    bad, first = 0, None
    for k, (pa, pb) in enumerate(itertools.zip_longest(stream(a, ta), stream(b, tb))):
        if pa == pb:
            continue
        if pa is None or pb is None or len(pa) != len(pb):
            return f"its data is {'shorter' if pa is None or (pb is not None and len(pa) < len(pb)) else 'longer'} " \
                   f"than the recipe's ({k * size + len(pa or b'')} against {k * size + len(pb or b'')} bytes on)"
        x, y = np.frombuffer(pa, dtype), np.frombuffer(pb, dtype)
        hits = np.flatnonzero(_unequal(x, y))
        if len(hits) and first is None:
            first = (k * (size // dtype.itemsize) + int(hits[0]), x[hits[0]].item(), y[hits[0]].item())
        bad += len(hits)
    return (bad, None, None, None) if first is None else (bad, *first)


def first_difference(shipped: Any, rebuilt: Any) -> tuple[str | None, WeightsFigures]:
    """The first initializer where the shipped model and the rebuilt one differ, as a sentence naming the tensor,
    its role and the block (None when every initializer is identical); and the figures. Each model: a ModelProto or
    one whose large tensors stay in its files (the exporter's ``StoredModel``): those are compared :data:`PIECE`
    bytes at a time, never read whole (an 8 B model's 2.1 GB embedding table was read four times over: twice each
    side, its message and its serialization)."""
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
    for name in a:  # the shipped file's order, one pair of tensors at a time
        stored = _pieces(shipped, a[name], 1) is not None or _pieces(rebuilt, b[name], 1) is not None
        same_kind = list(a[name].dims) == list(b[name].dims) and a[name].data_type == b[name].data_type
        if stored and same_kind and a[name].data_type not in _SUB_BYTE:
            got = _compare_stored(shipped, a[name], rebuilt, b[name])
            shape = tuple(int(d) for d in a[name].dims)
        else:  # small tensors (in the message), or a shape or dtype apart: read in
            ta, tb = _tensor(shipped, a[name]), _tensor(rebuilt, b[name])
            if ta.SerializeToString() == tb.SerializeToString():
                continue
            x, y = numpy_helper.to_array(ta), numpy_helper.to_array(tb)
            if x.shape != y.shape or x.dtype != y.dtype:
                got = f"{x.dtype}{list(x.shape)} where the recipe makes {y.dtype}{list(y.shape)}"
            else:
                hits = np.flatnonzero(_unequal(x, y))
                got = (len(hits), None, None, None) if not len(hits) else \
                    (len(hits), int(hits[0]), x.flat[hits[0]].item(), y.flat[hits[0]].item())
            shape = x.shape
        if isinstance(got, str):
            differ += 1
            first = first or f"{name}: {got}"
            continue
        bad, at, xv, yv = got
        if not bad:
            continue  # the same values written differently (e.g. raw vs typed fields)
        differ += 1
        if first is None:
            node, role = roles.get(name, (None, "float tensor"))
            index = tuple(int(i) for i in np.unravel_index(at, shape)) if shape else ()
            where = _block_of(node, role, shape, index)
            what = f"{role} of {node.op_type} {node.name}" if node is not None else role
            first = (f"{name} ({what}) differs from the recipe's at {where}: {bad} of {int(np.prod(shape))} values "
                     f"(first {xv!r}, the recipe's {yv!r})")
    fig.set(differing_tensors=differ)
    return first, fig


class Packed:
    """A MatMulNBits node's quantized weight, read in: the packed values, scales and zero points as the file holds
    them (a few bytes per weight), dequantized a block of rows at a time (:meth:`rows`)."""

    def __init__(self, node: Any, inits: dict[str, Any]) -> None:
        attrs = {a.name: a.i for a in node.attribute}
        self.K, self.N, self.bits, self.bs = attrs.get("K"), attrs.get("N"), attrs.get("bits", 4), attrs.get("block_size")
        names = list(node.input) + [""] * 4
        self.ok = bool(self.K and self.N and self.bs) and names[1] in inits and names[2] in inits
        if not self.ok:
            return
        self.n_blocks = -(-self.K // self.bs)
        self.packed = numpy_helper.to_array(inits[names[1]]).astype(np.uint8).reshape(self.N, -1)
        self.scales = numpy_helper.to_array(inits[names[2]]).reshape(self.N, self.n_blocks)
        self.zp = (numpy_helper.to_array(inits[names[3]]).astype(np.uint8).reshape(self.N, -1)
                   if names[3] and names[3] in inits else None)

    @property
    def shape(self) -> tuple[int, int]:
        return (self.N, self.K)

    def rows(self, idx: Any) -> tuple[np.ndarray, np.ndarray]:
        """Rows ``idx`` (a slice or an index array) as floats, (n, K), and the scale of each value's block, (n, K):
        (q - zero point) x scale per block of ``block_size`` along K, 4-bit values two to a byte (low nibble
        first)."""
        packed, bits, bs, nb = self.packed[idx], self.bits, self.bs, self.n_blocks
        n = packed.shape[0]
        q = np.stack([packed & 0x0F, packed >> 4], axis=-1).reshape(n, -1) if bits == 4 else packed
        q = q[:, :nb * bs].astype(np.float64).reshape(n, nb, bs)
        scales = self.scales[idx].astype(np.float64).reshape(n, nb, 1)
        if self.zp is not None:
            zp = self.zp[idx]
            if bits == 4:
                zp = np.stack([zp & 0x0F, zp >> 4], axis=-1).reshape(n, -1)
            zp = zp[:, :nb].astype(np.float64).reshape(n, nb, 1)
        else:
            zp = np.full((n, nb, 1), 2.0 ** (bits - 1))
        w = ((q - zp) * scales).reshape(n, -1)[:, :self.K]
        return w, np.broadcast_to(np.abs(scales), (n, nb, bs)).reshape(n, -1)[:, :self.K]


# how far (in steps of its block's scale) a quantized value may lie from the weight it quantizes: half a step by
# rounding, one at the clamped edge of the range; and float slack
STEP_SLACK = 1.0 + 1e-3
ROWS = 1024  # rows of a weight compared at a time: what the check holds is a block of rows, never a model
SAMPLE = 64  # rows a candidate is scored on when several reference weights have the weight's shape


class Reference:
    """A reference weight (N, K) — one of the model's, or sibling weights stacked along N as producers pack them
    (q, k, v; gate, up) — whose rows are read when asked (:meth:`rows`), as float64, from tensors that stay where
    they are (a memory-mapped model's pages)."""

    def __init__(self, name: str, parts: list[Any]) -> None:
        self.name, self.parts = name, parts
        self.starts = np.cumsum([0] + [int(p.shape[0]) for p in parts])
        self.shape = (int(self.starts[-1]), int(parts[0].shape[1]))

    def rows(self, idx: Any) -> np.ndarray:
        idx = np.arange(self.shape[0])[idx]
        out = np.empty((len(idx), self.shape[1]), dtype=np.float64)
        for i, part in enumerate(self.parts):
            sel = (idx >= self.starts[i]) & (idx < self.starts[i + 1])
            if sel.any():
                out[sel] = _as_array(part, idx[sel] - self.starts[i])
        return out


def _as_array(t: Any, rows: np.ndarray) -> np.ndarray:
    """Rows of a numpy array or a torch tensor (any float dtype) as float64."""
    if hasattr(t, "detach"):
        import torch

        return t.detach()[torch.from_numpy(rows)].to(torch.float64).cpu().numpy()
    return np.asarray(t[rows], dtype=np.float64)


def _with_packed(reference: dict[str, Any]) -> list[Reference]:
    """The reference weights, and packed ones as producers write them: runs of 2 or 3 sibling weights (one parent
    module, one input size K, in the model's order: q, k, v; gate, up) stacked along the output axis — none copied."""
    out = [Reference(name, [w]) for name, w in reference.items()]
    siblings: dict[str, list[str]] = {}
    for name in reference:
        siblings.setdefault(name.rsplit(".", 2)[0] if name.count(".") >= 2 else "", []).append(name)
    for names in siblings.values():
        for n in (2, 3):
            for i in range(len(names) - n + 1):
                run = names[i:i + n]
                if len({int(reference[x].shape[1]) for x in run}) == 1:
                    out.append(Reference(" + ".join(run), [reference[x] for x in run]))
    return out


def _steps(got: Packed, ref: Reference, idx: Any) -> np.ndarray:
    """|quantized - reference| in steps of each value's block scale, over rows ``idx``."""
    w, scale = got.rows(idx)
    return np.abs(w - ref.rows(idx)) / np.maximum(scale, 1e-30)


def against_reference(shipped: Any, reference: dict[str, Any]) -> tuple[str | None, WeightsFigures]:
    """Each MatMulNBits weight of ``shipped`` against the reference model's weights (``reference``: name -> (N, K)
    array or tensor, e.g. its Linear weights, read a block of rows at a time): the candidate of its shape that it is
    closest to (scored on :data:`SAMPLE` rows where several share the shape), and per block an error beyond what the
    block's own scale explains names the tensor and block: round to nearest is off by at most half a step, and a
    value at the clamped edge of the range (symmetric int4 maps the block's largest magnitude to -8, so a positive
    one clamps to 7) by at most one: |error| <= STEP_SLACK x scale. Packed weights (QKV, gate + up) are matched
    against sibling weights stacked; a weight no candidate matches in shape is counted, not judged. Memory: one
    weight's quantized bytes and :data:`ROWS` rows of floats at a time, whatever the model's size."""
    inits = _Initializers(shipped)  # each tensor read when a node asks for it
    by_shape: dict[tuple, list[Reference]] = {}
    for ref in _with_packed(reference):
        by_shape.setdefault(ref.shape, []).append(ref)
    checked, unmatched, first = 0, 0, None
    for node in shipped.graph.node:
        if node.op_type != "MatMulNBits":
            continue
        got = Packed(node, inits)
        if not got.ok:
            continue
        cands = by_shape.get(got.shape, [])
        if not cands:
            unmatched += 1
            continue
        checked += 1
        best = cands[0]
        if len(cands) > 1:
            sample = np.unique(np.linspace(0, got.N - 1, min(SAMPLE, got.N)).astype(np.int64))
            best = min(cands, key=lambda r: float(np.median(_steps(got, r, sample))))
        bad, where = 0, None
        for start in range(0, got.N, ROWS):
            ratio = _steps(got, best, slice(start, start + ROWS))
            hits = np.argwhere(ratio > STEP_SLACK)
            if len(hits) and where is None:
                n, k = (int(i) for i in hits[0])
                where = (start + n, k, float(ratio[n, k]))
            bad += len(hits)
        if bad and first is None:
            n, k, r = where
            first = (f"{node.input[1]} (MatMulNBits {node.name}, against the reference's {best.name}) at row {n}, "
                     f"block {k // got.bs}: off by {r:.2f} of its block's step (round to nearest, the range's edge "
                     f"clamped: at most 1), {bad} value(s) so")
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
