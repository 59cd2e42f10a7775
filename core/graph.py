"""Reading an exported ONNX graph: who produces and who consumes each value, the module scopes torch.onnx records
on each node, what counts as a mask fill in attention, and the weight bytes a decode step reads.

The exporter (quantize, lowering rules), verify (lint, bisect, the steps inside attention) and bench all read these;
this is their one implementation. It works on the protobuf objects as given and imports neither onnx nor torch
(core).
"""

from __future__ import annotations

import ast
from collections import defaultdict
from typing import Any

import numpy as np

SCOPES_KEY = "pkg.torch.onnx.name_scopes"  # node metadata: the module path a node was traced in
MS_DOMAIN = "com.microsoft"  # ONNX Runtime's contrib ops (MultiHeadAttention, GroupQueryAttention, MatMulNBits)
# A masked score filled with this or less (or -inf) counts as masked: every float dtype's finfo.min (fp16: -65504,
# what models/attention.py fills with) and the -1e4 / -10000 older Hugging Face models use. A fill above it (-1,
# -100) leaves masked keys real weight after softmax. The lowering rules, lint's mask-order rule and bisect's
# masked-score comparison all read it here.
MASK_FILL_AT_MOST = -1e4


def name_scopes(node: Any) -> list[str]:
    """The module scopes torch.onnx recorded on ``node`` (``pkg.torch.onnx.name_scopes``), outermost first:
    ``['', 'blocks.1', 'blocks.1.attn', 'div_1']``; [] when it has none or they cannot be read.

    torch.onnx writes ``repr(list_of_str)``, so the value is read back as a Python literal (a scope holding a comma
    or a quote survives; splitting the text on commas would cut it). ``node``: a protobuf NodeProto (its
    metadata_props a list of entries) or an onnx_ir Node (a mapping)."""
    props = node.metadata_props
    if hasattr(props, "get"):  # onnx_ir: a mapping
        text = props.get(SCOPES_KEY)
    else:
        text = next((p.value for p in props if p.key == SCOPES_KEY), None)
    if text is None:
        return []
    try:
        val = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return []
    return [str(v) for v in val] if isinstance(val, (list, tuple)) else []


class GraphIndex:
    """One graph's nodes (in graph order), the node producing each value, the nodes consuming it, and the
    initializers by name. The main graph only: subgraphs are not indexed."""

    def __init__(self, graph: Any) -> None:
        self.graph = graph
        self.nodes: list = list(graph.node)
        self.producer_index: dict[str, int] = {o: i for i, n in enumerate(self.nodes) for o in n.output if o}
        self.producer: dict[str, Any] = {o: self.nodes[i] for o, i in self.producer_index.items()}
        self.consumers: dict[str, list] = defaultdict(list)
        for n in self.nodes:
            for i in n.input:
                if i:
                    self.consumers[i].append(n)
        self.initializers: dict[str, Any] = {t.name: t for t in graph.initializer}


# bits per element of the initializer types an export holds, by onnx.TensorProto element type (FLOAT, FLOAT16,
# BFLOAT16, DOUBLE, INT64, INT32, INT16, UINT16, INT8, UINT8, BOOL, INT4, UINT4; tests/test_graph.py checks the
# numbers against onnx); any other counts as 32
_BITS_OF = {1: 32, 10: 16, 16: 16, 11: 64, 7: 64, 6: 32, 5: 16, 4: 16, 3: 8, 2: 8, 9: 8, 22: 4, 21: 4}


def _nbytes(t: Any) -> int:
    return (int(np.prod(t.dims, dtype=np.int64)) * _BITS_OF.get(t.data_type, 32) + 7) // 8


def weights_read(model: Any) -> dict[str, int]:
    """Bytes of weights one decode step reads: ``fixed_bytes`` (every initializer read whole) and ``per_row_bytes``
    (gathered tables, read one row per batch row): a step of batch B reads ``fixed + B * per_row``. Counted from the
    graph (no weights loaded), so a quantized export counts its packed bytes, scales and zero points."""
    gathered: dict[str, int] = {}  # initializer -> rows, for tensors only a Gather (or its scales) reads
    other: set[str] = set()
    for n in model.graph.node:
        for k, name in enumerate(n.input):
            if n.op_type in ("Gather", "GatherBlockQuantized") and k in (0, 2, 3):
                gathered.setdefault(name, 0)
            else:
                other.add(name)
    fixed = per_row = 0
    for t in model.graph.initializer:
        size = _nbytes(t)
        if t.name in gathered and t.name not in other and t.dims:
            per_row += size // max(int(t.dims[0]), 1)
        elif t.name in gathered or t.name in other:
            fixed += size
    return {"fixed_bytes": int(fixed), "per_row_bytes": int(per_row)}


# bytes of one element by TensorProto data type (FLOAT, UINT8, INT8, UINT16, INT16, INT32, INT64, BOOL, FLOAT16,
# DOUBLE, UINT32, UINT64, COMPLEX64, COMPLEX128, BFLOAT16, the float8s); 4-bit types hold two elements a byte
_ITEM_BYTES = {1: 4, 2: 1, 3: 1, 4: 2, 5: 2, 6: 4, 7: 8, 9: 1, 10: 2, 11: 8, 12: 4, 13: 8, 14: 8, 15: 16, 16: 2,
               17: 1, 18: 1, 19: 1, 20: 1}
_HALF_BYTE = {21, 22, 23}  # UINT4, INT4, FLOAT4E2M1
# the typed field that holds each data type's values when there is no raw_data (one element an entry)
_TYPED = {1: "float_data", 6: "int32_data", 7: "int64_data", 11: "double_data", 13: "uint64_data", 12: "uint64_data"}


def tensor_size_error(t: Any, stored: int | None = None) -> str | None:
    """Why the in-file tensor ``t`` (a TensorProto; external data is checked against its file elsewhere) cannot be
    read as its dims say — a negative dim, or data of another size than the dims declare — or None. Checked before
    anything reads the values: numpy would raise deep inside a rule, or allocate what the dims claim. ``stored``:
    the byte count of its raw data where a reader left them in the file (``runners.wire.read_graph``)."""
    if t.data_location == 1:  # EXTERNAL
        return None
    dims = list(t.dims)
    if any(d < 0 for d in dims):
        return f"dims {dims} hold a negative size"
    n = 1
    for d in dims:
        n *= d
    raw = stored is not None or bool(t.raw_data)
    if raw:
        if t.data_type in _HALF_BYTE:
            want = (n + 1) // 2
        elif t.data_type in _ITEM_BYTES:
            want = n * _ITEM_BYTES[t.data_type]
        else:
            return None
        have = stored if stored is not None else len(t.raw_data)
    elif t.data_type in _TYPED:
        want, have = n, len(getattr(t, _TYPED[t.data_type]))
    else:
        return None
    if have != want:
        unit = "bytes" if raw else "values"
        return f"dims {dims} declare {want} {unit} of data, the tensor holds {have}"
    return None
