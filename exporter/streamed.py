"""Writing a streamed model's ONNX file without holding its weights: each initializer that is a view of the staging
weights file (:class:`mhaexport.models.stream.WeightsFile`) becomes a lazy tensor read from the file by offset when it
is written (:func:`read_when_written`), and a file with its weights inside (one protobuf, below the external-data
threshold) is written field by field, each weight's bytes in turn (:func:`save_inline`), where ``onnx.save`` would
build the whole message in memory. Both give the bytes the in-memory export writes (tests/test_streamed_export.py).
"""

from __future__ import annotations

import functools
import math
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import torch

from mhaexport.core.errors import ExportError
from mhaexport.runners.wire import write_proto
from mhaexport.models.stream import WeightsFile


def read_when_written(model: ir.Model, weights: WeightsFile) -> list[str]:
    """Make every initializer that is a view of ``weights``' memory map (torch's parameters of a streamed model, and
    the numpy views torch.onnx's optimizer folds Transposes into) a lazy tensor that reads its bytes from the file by
    offset when it is written — the same bytes, laid out the same way (a folded Transpose copied contiguous), one
    tensor at a time, in memory dropped once written: the map's pages are never touched, so the process never holds
    the weights. Returns the names of the initializers replaced."""
    replaced = []
    for name, value in model.graph.initializers.items():
        t = value.const_value
        if t is None or isinstance(t, ir.LazyTensor):
            continue
        raw = t.raw
        if isinstance(raw, torch.Tensor):
            if raw.device.type != "cpu":
                continue
            item = raw.element_size()
            where = (raw.data_ptr(), tuple(raw.shape), tuple(s * item for s in raw.stride()))
        elif isinstance(raw, np.ndarray):
            where = (raw.__array_interface__["data"][0], raw.shape, raw.strides)
        else:
            continue
        address, shape, strides = where
        np_dtype = t.dtype.numpy()
        if any(st < 0 for st in strides) or not all(shape):
            continue
        span = sum((n - 1) * st for n, st in zip(shape, strides)) + np_dtype.itemsize
        if weights.offset_of(address, span) is None:
            continue
        value.const_value = ir.LazyTensor(functools.partial(_read_view, weights, where, np_dtype, t.dtype, t.name),
                                          t.dtype, t.shape, name=t.name, doc_string=t.doc_string,
                                          metadata_props=dict(t.metadata_props))
        replaced.append(name)
    return replaced


def _read_view(weights: WeightsFile, where: tuple, np_dtype: np.dtype, dtype: ir.DataType, name: str) -> ir.Tensor:
    address, shape, strides = where
    array = weights.read_view(address, shape, strides, np_dtype)
    if array is None:
        raise ExportError(f"initializer {name} is no longer where the weights file holds it")
    return ir.Tensor(array, dtype=dtype, name=name)


def _placeholders(model: ir.Model, names: list[str]) -> dict[str, ir.LazyTensor]:
    """Swap the initializers ``names`` for tensors of the same name, type and shape whose bytes are empty (what the
    proto is built with); returns the lazy tensors taken out, to be put back."""
    taken = {}
    for name in names:
        value = model.graph.initializers[name]
        t = value.const_value
        taken[name] = t
        value.const_value = ir.LazyTensor(lambda: _NO_BYTES, t.dtype, t.shape, name=t.name, doc_string=t.doc_string,
                                          metadata_props=dict(t.metadata_props))
    return taken


class _NoBytes:
    def tobytes(self) -> bytes:
        return b""


_NO_BYTES = _NoBytes()


def _nbytes(t: ir.LazyTensor) -> int:
    return int(math.prod(t.shape.numpy()) * t.dtype.itemsize)


def save_inline(model: ir.Model, path: Path, streamed: list[str]) -> onnx.ModelProto:
    """Write ``model`` to ``path`` as one protobuf, the bytes ``ir.save(model, path)`` writes, but with the
    initializers ``streamed`` (lazy tensors, :func:`read_when_written`) written one at a time into the file instead of
    into a message built in memory. Returns the model's proto without those tensors' bytes (their raw_data empty),
    for :func:`check_stand_in`."""
    taken = _placeholders(model, streamed)
    try:
        proto = ir.serde.serialize_model(model)
    finally:
        for name, t in taken.items():
            model.graph.initializers[name].const_value = t
    write_proto(proto, path, {name: (_nbytes(t), t.tofile) for name, t in taken.items()})
    return proto


def check_stand_in(proto: onnx.ModelProto, folder: Path, name: str) -> Path:
    """``proto`` (from :func:`save_inline`) written to ``folder/name`` as the same graph whose streamed tensors are
    external data in a sparse file of zeros (no disk, no memory): what onnx.checker and shape inference read by path
    in place of the file with the weights inside, which they would load whole. Returns its path."""
    data = f"{name}.data"
    at = 0
    for tp in proto.graph.initializer:
        if tp.HasField("raw_data") and not tp.raw_data and math.prod(tp.dims) > 0:
            n = int(math.prod(tp.dims) * ir.DataType(tp.data_type).itemsize)
            tp.ClearField("raw_data")
            tp.data_location = onnx.TensorProto.EXTERNAL
            for k, v in (("location", data), ("offset", str(at)), ("length", str(n))):
                entry = tp.external_data.add()
                entry.key, entry.value = k, v
            at += n
    path = folder / name
    with open(folder / data, "wb") as f:
        f.truncate(at)
    path.write_bytes(proto.SerializeToString())
    return path



