"""An ONNX file read and written field by field (protobuf's wire format), so that its large tensors' bytes are never
in one message: :func:`write_proto` writes a message whose chosen initializers' bytes come from writers, one tensor at
a time (the bytes ``SerializeToString`` would give), and :func:`read_stripped` reads a one-file model back without its
large initializers' bytes, returning where each lies in the file. Torch-free: the streamed export
(:mod:`mhaexport.exporter.streamed`) and quantization (:mod:`mhaexport.exporter.quantize_stream`) both use it, and
verify's float-activation twin of a quantized file (:func:`mhaexport.runners.registry.float_activation_twin`), whose
weights are the file's own bytes where they lie. In the runners room, below both the exporter and verify.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import BinaryIO

import onnx

from mhaexport.core.errors import ExportError

# protobuf's wire format: what writing one message field by field needs
_LEN = 2  # wire type of a length-delimited field (bytes, strings, messages)
_MODEL_GRAPH, _GRAPH_INITIALIZER, _TENSOR_RAW_DATA = 7, 5, 9  # ModelProto.graph, GraphProto.initializer, raw_data


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _read_varint(data: bytes, i: int) -> tuple[int, int]:
    n = shift = 0
    while True:
        b = data[i]
        i += 1
        n |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return n, i


def _field(data, i: int) -> tuple[int, int, int, int]:
    """The field that starts at byte ``i``: (its number, where its payload starts, where it ends, its wire type).
    ValueError on a wire type protobuf does not write (groups)."""
    key, i = _read_varint(data, i)
    field, wire = key >> 3, key & 7
    if wire == 0:
        _, end = _read_varint(data, i)
    elif wire == 1:
        end = i + 8
    elif wire == _LEN:
        n, i = _read_varint(data, i)
        end = i + n
    elif wire == 5:
        end = i + 4
    else:
        raise ValueError(f"wire type {wire}")
    return field, i, end, wire


def _split(data: bytes, number: int) -> tuple[bytes, bytes]:
    """A serialized message's fields numbered below ``number`` and above it (field ``number`` itself dropped):
    protobuf writes known fields in field-number order, so the message is ``before + field + after``. ValueError
    where the fields are out of that order."""
    before, after, i = [], [], 0
    while i < len(data):
        start = i
        field, _, i, _ = _field(data, i)
        if field < number:
            if after:
                raise ValueError(f"field {field} after field {number}")
            before.append(data[start:i])
        elif field > number:
            after.append(data[start:i])
    return b"".join(before), b"".join(after)


def write_proto(proto: onnx.ModelProto, path: Path, streamed: Mapping[str, tuple[int, Callable[[BinaryIO], None]]]
                ) -> None:
    """Write ``proto`` to ``path`` as ``proto.SerializeToString()`` would, except that each main-graph initializer
    named in ``streamed`` — its ``raw_data`` an empty placeholder in ``proto`` — gets its bytes from its writer, as
    (byte count, ``write(file)``), one tensor at a time: the whole message is never built in memory."""
    graph = proto.graph
    parts: list[tuple[bytes, tuple[int, Callable] | None, bytes]] = []  # (bytes before, tensor to stream, after)
    for tp in graph.initializer:
        s = streamed.get(tp.name)
        data = tp.SerializeToString()
        if s is None:
            parts.append((data, None, b""))
        else:
            head, tail = _split(data, _TENSOR_RAW_DATA)
            parts.append((head, s, tail))
    kept = onnx.GraphProto()
    kept.CopyFrom(graph)
    del kept.initializer[:]
    g_head, g_tail = _split(kept.SerializeToString(), _GRAPH_INITIALIZER)
    rest = onnx.ModelProto()
    rest.CopyFrom(proto)
    rest.ClearField("graph")
    m_head, m_tail = _split(rest.SerializeToString(), _MODEL_GRAPH)
    del kept, rest

    def tensor_field(n: int) -> bytes:  # raw_data's key and length
        return _varint(_TENSOR_RAW_DATA << 3 | _LEN) + _varint(n)

    sizes = [len(h) + len(tl) + (0 if s is None else len(tensor_field(s[0])) + s[0]) for h, s, tl in parts]
    init_key = _varint(_GRAPH_INITIALIZER << 3 | _LEN)
    graph_size = len(g_head) + len(g_tail) + sum(len(init_key) + len(_varint(n)) + n for n in sizes)
    with open(path, "wb") as f:
        f.write(m_head)
        f.write(_varint(_MODEL_GRAPH << 3 | _LEN) + _varint(graph_size))
        f.write(g_head)
        for (head, s, tail), (tp, n) in zip(parts, zip(graph.initializer, sizes)):
            f.write(init_key + _varint(n) + head)
            if s is not None:
                f.write(tensor_field(s[0]))
                at = f.tell()
                s[1](f)
                if f.tell() - at != s[0]:
                    raise ExportError(f"initializer {tp.name}: {f.tell() - at} bytes written, {s[0]} expected")
            f.write(tail)
        f.write(g_tail)
        f.write(m_tail)


# what a reader that needs no weights keeps of a one-file model's tensor: its bytes below this, a place in the file above
GRAPH_BYTES = 1 << 16


def read_graph(path: str | Path, min_bytes: int = GRAPH_BYTES) -> tuple[onnx.ModelProto, dict[str, tuple[int, int]]]:
    """The ONNX file at ``path`` as every reader that needs its graph, not its weights, reads it — lint, the
    external-data and tensor checks, the genai-config check, the twin, diagnosis: :func:`read_stripped` (a one-file
    model's main-graph tensors of ``min_bytes`` and more left in the file, their (offset, byte count) returned; an
    external-data model's data never read), and an empty file an empty model, as protobuf parses 0 bytes. Reading a
    one-file model with ``onnx.load`` held its weights twice over (the file's bytes and the parsed message: 1.7 GB of
    anonymous memory for a 0.86 GB file, four times in one verify). ValueError or IndexError on a malformed file."""
    path = Path(path)
    if path.stat().st_size == 0:
        return onnx.ModelProto(), {}
    return read_stripped(path, min_bytes)


def refer_in_place(model: onnx.ModelProto, where: dict[str, tuple[int, int]], location: str) -> onnx.ModelProto:
    """``model`` (from :func:`read_graph`) with each initializer whose bytes were left in the file made external data
    naming that file (``location``, beside the graph that is written from ``model``) at their offset: a graph file
    that runs on the file's own bytes, none copied (ONNX Runtime maps them). Returns ``model``, changed in place."""
    for t in model.graph.initializer:
        if t.name in where and not t.raw_data:
            offset, length = where[t.name]
            t.ClearField("raw_data")
            del t.external_data[:]
            for key, value in (("location", location), ("offset", str(offset)), ("length", str(length))):
                t.external_data.add(key=key, value=value)
            t.data_location = onnx.TensorProto.EXTERNAL
    return model


def stored_bytes(path: str | Path, where: dict[str, tuple[int, int]], name: str) -> bytes | None:
    """The bytes :func:`read_graph` left in the file for the tensor ``name`` (read now, only these), or None where it
    left none."""
    if name not in where:
        return None
    offset, length = where[name]
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read(length)


def read_stripped(path: Path, min_bytes: int) -> tuple[onnx.ModelProto, dict[str, tuple[int, int]]]:
    """The model in ``path`` (one protobuf, weights inside) without its large weights' bytes: each main-graph
    initializer whose ``raw_data`` holds ``min_bytes`` or more comes back without it, and its (offset in the file,
    byte count) in the dict — the file memory-mapped and walked field by field (the inverse of
    :func:`write_proto`), so only the graph and the small tensors are copied into memory."""
    import mmap

    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        m_rest, graphs = _fields(mm, 0, len(mm), _MODEL_GRAPH)
        where: dict[str, tuple[int, int]] = {}
        model = onnx.ModelProto.FromString(m_rest)
        for gs, ge in graphs:  # protobuf merges repeated occurrences of a message field: so does this
            g_rest, inits = _fields(mm, gs, ge, _GRAPH_INITIALIZER)
            graph = onnx.GraphProto.FromString(g_rest)
            for ts, te in inits:
                t_rest, raws = _fields(mm, ts, te, _TENSOR_RAW_DATA)
                tensor = onnx.TensorProto.FromString(t_rest)
                for rs, re_ in raws[-1:]:  # the last occurrence of a scalar field wins
                    if re_ - rs >= min_bytes:
                        where[tensor.name] = (rs, re_ - rs)
                        tensor.raw_data = b""
                    else:
                        tensor.raw_data = bytes(mm[rs:re_])
                graph.initializer.append(tensor)
            model.graph.MergeFrom(graph)
    return model, where


def _fields(buf, start: int, end: int, number: int) -> tuple[bytes, list[tuple[int, int]]]:
    """The bytes of the message ``buf[start:end]`` without its field ``number`` (length-delimited), and where each
    occurrence of that field's payload lies in ``buf`` ((start, end) offsets)."""
    rest, found, i = bytearray(), [], start
    while i < end:
        at = i
        try:
            field, payload, i, wire = _field(buf, i)
        except ValueError as e:
            raise ValueError(f"{e} at byte {at}") from None
        if field == number and wire == _LEN:
            found.append((payload, i))
            continue
        rest += buf[at:i]
    if i != end:
        raise ValueError(f"a field runs past its message's end (byte {i} of {end})")
    return bytes(rest), found
