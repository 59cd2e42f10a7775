"""Quantization one weight at a time (``mhaexport quantize``): the float model's weights are never in memory together.

:class:`WeightStore` holds every large initializer of one quantize run *outside* the ONNX message, as an external
reference the message carries (``data_location: EXTERNAL``) and the store resolves by the tensor's name:

- the source's weights, read by offset from the float export (its ``model.onnx.data``, or the raw bytes inside a
  one-file ``model.onnx``, found by walking the protobuf: :func:`mhaexport.runners.wire.read_graph`);
- each tensor ONNX Runtime's quantizer makes (packed blocks, scales, zero points) and the untied LM head, written to
  an unlinked staging file as soon as it is made (:meth:`WeightStore.spill`).

ONNX Runtime's own ``MatMulNBitsQuantizer`` drives the run, as in the in-memory path — the same passes, node order,
names and block quantization (its C++ ``quantize_matmul_4bits`` / ``_8bits``, its numpy ``GatherBlockQuantized``) —
with its per-node quantizer wrapped (:meth:`WeightStore.feeding`): before a node is quantized its float weight is
read into the message (one tensor), after it the new tensors are spilled and the float weight dropped again. The
file is then written from the store (:meth:`WeightStore.write`): external data laid out as ``onnx.save_model``
lays it out, or one protobuf written field by field (:func:`~mhaexport.exporter.streamed.write_proto`) — byte for
byte the file the in-memory path writes (tests/test_quantize_stream.py). Peak memory: one float weight and its
quantized copy, plus the graph (the largest: an untied LM head, the embedding's size).
"""

from __future__ import annotations

import mmap
import os
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx.external_data_helper import (ExternalDataInfo, _get_all_tensors, _get_attribute_tensors,
                                       _get_initializer_tensors, uses_external_data)

from mhaexport.artifact import shown_path
from mhaexport.core.errors import ArtifactError
from mhaexport.runners.wire import read_graph, write_proto

# onnx.save_model's rule (convert_model_to_external_data, size_threshold=1024): a tensor goes to external data when
# sys.getsizeof(raw_data) >= 1024, i.e. from this many bytes on
EXTERNAL_MIN_BYTES = 1024 - sys.getsizeof(b"")
_CHUNK = 64 << 20
ALIGN = 4096  # each staged tensor starts on a page: a memory map of it is aligned for any element type


@dataclass(frozen=True)
class Ref:
    """Where a tensor's bytes are: ``fd`` (the store's open file), ``offset``, ``nbytes``; ``explicit_default``: the
    in-memory path's tensor carries ``data_location: DEFAULT`` (it was read from external data by
    :func:`mhaexport.exporter.quantize.load_with_data`, which sets it), so the file written keeps that field."""

    fd: int
    offset: int
    nbytes: int
    explicit_default: bool


class WeightStore:
    """The large initializers of one quantize run, outside the message (see the module's docstring). A context
    manager: its files are closed (the staging file, unlinked, gone) on exit."""

    def __init__(self, spill_dir: str | Path | None = None) -> None:
        self.refs: dict[str, Ref] = {}
        self._fds: list[int] = []
        fd, tmp = tempfile.mkstemp(dir=spill_dir, prefix=".mhaexport-quantized-", suffix=".bin")
        os.unlink(tmp)  # gone with the descriptor, even on a crash
        self._spill, self._spill_end = fd, 0
        self._fds.append(fd)
        self.spilled_bytes = 0

    def __enter__(self) -> WeightStore:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self, _close=os.close) -> None:
        """Close the store's files, once (``_close`` bound early: a store closed at the interpreter's exit)."""
        fds, self._fds = getattr(self, "_fds", []), []
        for fd in fds:
            _close(fd)

    def __del__(self) -> None:
        self.close()

    # ---- the source ------------------------------------------------------------------------------------------------

    def source(self, path: str | Path) -> onnx.ModelProto:
        """The float model in ``path`` as a message without its large weights (each a reference into its file):
        its external data's tensors, and in a one-file model each initializer from :data:`EXTERNAL_MIN_BYTES` on.
        ArtifactError for a file that is no ONNX model or names external data outside its folder."""
        path = Path(path)
        try:  # the graph: a one-file model's large raw_data stays in the file, walked past, never loaded
            model, where = read_graph(path, EXTERNAL_MIN_BYTES)
        except Exception as e:  # noqa: BLE001 - protobuf's DecodeError, a malformed field, OSError
            raise ArtifactError(f"{shown_path(path)} is not a readable ONNX model: {type(e).__name__}: {e}") from None
        if not model.graph.node:
            raise ArtifactError(f"{shown_path(path)} is not a readable ONNX model: it holds no graph")
        external = [t for t in _get_all_tensors(model) if uses_external_data(t)]  # before the refs below
        if where:
            fd = self._open(path)
            for t in model.graph.initializer:
                if t.name in where:
                    self._make_ref(t, Ref(fd, *where[t.name], explicit_default=False))
        if not external:
            return model
        files: dict[str, int] = {}
        for t in external:
            try:
                info = ExternalDataInfo(t)
            except ValueError as e:  # a negative offset or length, an unknown key
                raise ArtifactError(f"{shown_path(path)}: tensor {t.name}'s external data: {e}") from None
            if Path(info.location).name != info.location:
                raise ArtifactError(f"{shown_path(path)}: tensor {t.name} names external data {info.location!r} "
                                    "outside the model's folder")
            if info.location not in files:
                files[info.location] = self._open(path.parent / info.location)
            fd = files[info.location]
            length = info.length if info.length is not None else os.fstat(fd).st_size - int(info.offset or 0)
            self._make_ref(t, Ref(fd, int(info.offset or 0), int(length), explicit_default=True))
        return model

    def _open(self, path: Path) -> int:
        fd = os.open(path, os.O_RDONLY)
        self._fds.append(fd)
        return fd

    def _make_ref(self, t: onnx.TensorProto, ref: Ref) -> None:
        t.ClearField("raw_data")
        del t.external_data[:]
        t.data_location = onnx.TensorProto.EXTERNAL
        for k, v in (("location", "mhaexport-store"), ("offset", str(ref.offset)), ("length", str(ref.nbytes))):
            e = t.external_data.add()
            e.key, e.value = k, v
        self.refs[t.name] = ref

    def held(self, t: onnx.TensorProto) -> bool:
        """Whether ``t``'s bytes are in the store (not in the message)."""
        return uses_external_data(t) and t.name in self.refs

    # ---- reading and writing bytes ---------------------------------------------------------------------------------

    def read(self, name: str) -> bytes:
        """``name``'s bytes, read by offset in one piece (a short read continued)."""
        ref = self.refs[name]
        parts, done = [], 0
        while done < ref.nbytes:
            chunk = os.pread(ref.fd, min(ref.nbytes - done, 0x7FFFF000), ref.offset + done)
            if not chunk:
                raise ArtifactError(f"tensor {name}: its data ends after {done} of {ref.nbytes} bytes")
            parts.append(chunk)
            done += len(chunk)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def pieces(self, name: str, size: int = _CHUNK) -> Iterator[bytes]:
        """``name``'s bytes in pieces of ``size`` (the last shorter), read by offset: what a comparison holds is one
        piece, never the tensor."""
        ref = self.refs[name]
        for at in range(0, ref.nbytes, size):
            n = min(size, ref.nbytes - at)
            chunk = os.pread(ref.fd, n, ref.offset + at)
            while len(chunk) < n:  # a short read continued
                more = os.pread(ref.fd, n - len(chunk), ref.offset + at + len(chunk))
                if not more:
                    raise ArtifactError(f"tensor {name}: its data ends after {at + len(chunk)} of {ref.nbytes} bytes")
                chunk += more
            yield chunk

    def copy_to(self, name: str, f) -> None:
        """Write ``name``'s bytes to the open file ``f`` at its position, 64 MB at a time."""
        ref = self.refs[name]
        for at in range(0, ref.nbytes, _CHUNK):
            n = min(_CHUNK, ref.nbytes - at)
            chunk = os.pread(ref.fd, n, ref.offset + at)
            if len(chunk) != n:
                raise ArtifactError(f"tensor {name}: its data ends after {at + len(chunk)} of {ref.nbytes} bytes")
            f.write(chunk)

    def load(self, t: onnx.TensorProto) -> None:
        """Put ``t``'s bytes into the message: the tensor as the in-memory path holds it."""
        ref = self.refs[t.name]
        del t.external_data[:]
        if ref.explicit_default:
            t.data_location = onnx.TensorProto.DEFAULT
        else:
            t.ClearField("data_location")
        t.raw_data = self.read(t.name)

    def unload(self, t: onnx.TensorProto) -> None:
        """Drop ``t``'s bytes from the message again (they are in the store)."""
        self._make_ref(t, self.refs[t.name])

    def spill(self, t: onnx.TensorProto) -> None:
        """Write ``t``'s raw_data to the staging file and keep a reference in its place."""
        data = memoryview(t.raw_data)
        at = self._append(data)
        self._make_ref(t, Ref(self._spill, at, len(data), explicit_default=t.HasField("data_location")))

    def mapped_path(self, name: str) -> str | None:
        """A path ONNX Runtime's quantizer opens to memory-map ``name``'s file (onnx_ir's external tensor: the weight
        as a numpy view of file-backed pages, no copy), or None where there is none (not Linux: the bytes are read
        into the message instead). ``/proc/self/fd/N``: the store's own descriptor, so the file read is the one
        opened (the snapshot's, the unlinked staging file)."""
        path = f"/proc/self/fd/{self.refs[name].fd}"
        return path if os.path.exists(path) else None

    def _append(self, data: memoryview) -> int:
        """Write ``data`` at the staging file's end, from a page boundary (the quantizer maps it); returns where it
        starts."""
        self._spill_end = -(-self._spill_end // ALIGN) * ALIGN
        return self._append_raw(data)

    def _append_raw(self, data: memoryview) -> int:
        at = self._spill_end
        done = 0
        while done < len(data):
            done += os.pwrite(self._spill, data[done:done + _CHUNK], at + done)
        self._spill_end += len(data)
        self.spilled_bytes += len(data)
        return at

    # ---- the quantizer fed one weight at a time --------------------------------------------------------------------

    def feeding(self, inner):
        """ONNX Runtime's per-node quantizer ``inner`` wrapped: each node's weight read into the message before it
        runs, the tensors it adds spilled and the weight dropped after."""
        return _Feeding(inner, self)

    def fold_transposed(self, value, perm: list[int] | None, name: str):
        """The untied LM head (:func:`mhaexport.exporter.quantize.untie_lm_head`'s ``fold``): the transposed copy of
        the stored tensor behind ``value`` (an onnx_ir value) written to the staging file, returned as an onnx_ir
        external tensor named ``name`` that the store resolves; None for a tensor the store does not hold."""
        import onnx_ir as ir

        t = value.const_value
        if not isinstance(t, ir.ExternalTensor) or t.name not in self.refs:
            return None
        ref = self.refs[t.name]
        with mmap.mmap(ref.fd, 0, access=mmap.ACCESS_READ) as mm:  # file-backed pages, dropped after
            arr = np.frombuffer(mm, dtype=t.dtype.numpy(), count=int(np.prod(t.shape.numpy())), offset=ref.offset)
            moved = np.transpose(arr.reshape(t.shape.numpy()), perm)  # a view
            rows = max(1, (16 << 20) // max(1, moved[0].nbytes)) if moved.ndim else 1
            start = -(-self._spill_end // ALIGN) * ALIGN
            for i in range(0, max(len(moved), 1) if moved.ndim else 1, rows):  # 16 MB of the copy at a time
                self._append_raw(memoryview(np.ascontiguousarray(moved[i:i + rows] if moved.ndim else moved)).cast("B"))
            shape = moved.shape
            del arr, moved
        self.refs[name] = Ref(self._spill, start, self._spill_end - start, explicit_default=False)
        return ir.ExternalTensor("mhaexport-store", offset=start, length=self._spill_end - start, dtype=t.dtype,
                                 shape=ir.Shape(shape), name=name)

    # ---- the file --------------------------------------------------------------------------------------------------

    def inline_bytes(self, model: onnx.ModelProto) -> int:
        """``sum(t.ByteSize() for t in model.graph.initializer)`` of the message with every stored tensor's bytes
        inside it (what the in-memory path measures to choose external data), without reading them."""
        total = 0
        for t in model.graph.initializer:
            if self.held(t):
                total += _inline_form(t, self.refs[t.name]).ByteSize() + _raw_field_bytes(self.refs[t.name].nbytes)
            else:
                total += t.ByteSize()
        return total

    def write(self, model: onnx.ModelProto, path: Path, *, external: bool, data_file: str,
              stand_in: Path | None = None) -> list[str]:
        """Write ``model`` (its large tensors in the store) to ``path``: with ``external``, the bytes
        ``onnx.save_model(..., save_as_external_data=True, all_tensors_to_one_file=True, location=data_file,
        size_threshold=1024)`` writes, else those of ``onnx.save_model(model, path)`` — one tensor at a time.
        Returns the names of the files written, the model file first. ``model`` is consumed. ``stand_in`` (a one-file
        model; a path beside ``path``): also write there the same graph whose large tensors are external data
        pointing at their bytes inside ``path``, which ONNX Runtime can memory-map where it would read ``path``
        whole."""
        path = Path(path)
        if external:
            with open(path.parent / data_file, "wb") as f:
                for t in _get_initializer_tensors(model):  # onnx's order (subgraphs' initializers after)
                    if self.held(t):
                        ref = self.refs[t.name]
                        if ref.nbytes < EXTERNAL_MIN_BYTES:
                            self.load(t)
                            continue
                        at = f.tell()
                        self.copy_to(t.name, f)
                    elif t.HasField("raw_data") and sys.getsizeof(t.raw_data) >= 1024:
                        at = f.tell()
                        f.write(t.raw_data)
                        t.ClearField("raw_data")
                    else:
                        continue
                    _set_external(t, data_file, at, f.tell() - at)
            for t in _get_attribute_tensors(model):  # never external data in onnx's save: read in
                if self.held(t):
                    self.load(t)
            path.write_bytes(model.SerializeToString())
            return [path.name, data_file]
        main = len(model.graph.initializer)  # onnx yields the main graph's initializers first
        for i, t in enumerate(_get_all_tensors(model)):  # a stored tensor outside them (a subgraph's): read in
            if i >= main and self.held(t):
                self.load(t)
        streamed, at = {}, {}

        def writer(name: str):
            def write(f) -> None:
                at[name] = f.tell()
                self.copy_to(name, f)
            return write

        for t in model.graph.initializer:
            if self.held(t):
                ref = self.refs[t.name]
                t.CopyFrom(_inline_form(t, ref))
                t.raw_data = b""  # the placeholder write_proto fills
                streamed[t.name] = (ref.nbytes, writer(t.name))
        write_proto(model, path, streamed)
        if stand_in is not None:  # the same graph, its streamed tensors external data: the file's own bytes
            for t in model.graph.initializer:
                if t.name in at:
                    n = streamed[t.name][0]
                    t.ClearField("raw_data")
                    _set_external(t, path.name, at[t.name], n)
            stand_in.write_bytes(model.SerializeToString())
        return [path.name]


def _inline_form(t: onnx.TensorProto, ref: Ref) -> onnx.TensorProto:
    """``t`` as the in-memory path holds it, without its bytes."""
    out = onnx.TensorProto()
    out.CopyFrom(t)
    del out.external_data[:]
    if ref.explicit_default:
        out.data_location = onnx.TensorProto.DEFAULT
    else:
        out.ClearField("data_location")
    return out


def _raw_field_bytes(n: int) -> int:
    """Bytes of a raw_data field of ``n`` bytes in a message: key, length, payload."""
    length, rest = 1, n
    while rest >= 0x80:
        rest >>= 7
        length += 1
    return 1 + length + n


def _set_external(t: onnx.TensorProto, location: str, offset: int, length: int) -> None:
    """onnx's ``set_external_data(t, location, offset, length)``: the keys in its order."""
    del t.external_data[:]
    t.data_location = onnx.TensorProto.EXTERNAL
    for k, v in (("location", location), ("offset", str(offset)), ("length", str(length))):
        e = t.external_data.add()
        e.key, e.value = k, v


class _Feeding:
    """ONNX Runtime's per-node weight quantizer, fed one weight at a time from a :class:`WeightStore`."""

    def __init__(self, inner, store: WeightStore) -> None:
        self.inner, self.store = inner, store

    def __getattr__(self, name: str):
        return getattr(self.inner, name)

    def quantize(self, node: onnx.NodeProto, graph_stack: list[onnx.GraphProto]) -> list[onnx.NodeProto]:
        """The node quantized by ONNX Runtime with its weight read into a graph of its own (innermost on the stack,
        so ONNX Runtime finds the weight there and adds what it makes there): a message in the model's own arena
        keeps every byte ever put into it until the model goes, so the model's message never holds a weight. What
        ONNX Runtime made is then moved to the weight's graph, in its order, each large tensor spilled first."""
        weight = node.input[1] if node.op_type == "MatMul" and len(node.input) > 1 else \
            node.input[0] if node.op_type == "Gather" and node.input else None
        graph, t = _initializer(weight, graph_stack)
        if t is None or not self.store.held(t):
            return self.inner.quantize(node, graph_stack)
        own = onnx.GraphProto()
        copy = own.initializer.add()
        copy.CopyFrom(t)
        if node.op_type == "MatMul" and (where := self.store.mapped_path(t.name)) is not None:
            _set_external(copy, where, self.store.refs[t.name].offset, self.store.refs[t.name].nbytes)
        else:  # GatherBlockQuantized's numpy path reads raw_data (onnx's reader refuses a path outside a folder)
            self.store.load(copy)
        out = self.inner.quantize(node, [*graph_stack, own])
        for made in own.initializer[1:]:  # the weight first, then what quantizing it added
            big = made.HasField("raw_data") and len(made.raw_data) >= EXTERNAL_MIN_BYTES
            if big:
                self.store.spill(made)
            graph.initializer.add().CopyFrom(made)
        del own, copy
        return out


def _initializer(name: str | None, graph_stack: list[onnx.GraphProto]
                 ) -> tuple[onnx.GraphProto | None, onnx.TensorProto | None]:
    """(the graph, the initializer) named ``name``, innermost graph first (ONNX Runtime's ``get_initializer``)."""
    if name:
        for graph in reversed(graph_stack):
            for t in graph.initializer:
                if t.name == name:
                    return graph, t
    return None, None


class StoredModel:
    """A model whose large tensors are in a :class:`WeightStore`: its graph (``.graph``, the message without them)
    and :meth:`tensor`, one initializer with its bytes read in — what verify's weights check compares, one tensor at a
    time (verify/weights.py), without either model whole in memory."""

    def __init__(self, proto: onnx.ModelProto, store: WeightStore) -> None:
        self.proto, self.store = proto, store

    @classmethod
    def of(cls, path: str | Path) -> StoredModel:
        """The ONNX file at ``path`` with its large tensors left in its files."""
        store = WeightStore()
        return cls(store.source(path), store)

    @property
    def graph(self) -> onnx.GraphProto:
        return self.proto.graph

    def pieces(self, t: onnx.TensorProto, size: int) -> Iterator[bytes] | None:
        """``t``'s raw bytes in pieces of ``size`` when they are in the store (None when the message holds them)."""
        return self.store.pieces(t.name, size) if self.store.held(t) else None

    def tensor(self, t: onnx.TensorProto) -> onnx.TensorProto:
        """``t`` as the in-memory path holds it: a copy with its bytes when they are in the store, else ``t``."""
        if not self.store.held(t):
            return t
        out = _inline_form(t, self.store.refs[t.name])
        out.raw_data = self.store.read(t.name)
        return out
