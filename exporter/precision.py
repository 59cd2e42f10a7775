"""Export precision (float32 / float16 / bfloat16): which nodes ONNX Runtime's CPU provider runs in float32 because
it has no kernel for the export's dtype. ORT inserts those Casts itself when it builds the session
(``InsertCastTransformer``); they show in the graph it saves with ``optimized_model_filepath`` at optimization
level 0, and nowhere else. (The lowering's self-check lives next to the lowering: ``exporter/lowering/``.)
"""

from __future__ import annotations

import collections
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import onnx

from mhaexport.core.errors import first_line
from mhaexport.runtime.session import cpu_session
from mhaexport.runners.wire import read_graph


@dataclass
class PrecisionReport:
    """Which ops ONNX Runtime CPU runs outside the export's dtype (None where it could not be checked)."""

    dtype: str
    cast_by_ort: dict[str, int] | None = None  # op type -> nodes ORT CPU wraps in Casts (no kernel for dtype)
    casts_in_graph: int = 0  # Cast nodes the exporter wrote (e.g. bool/int mask arithmetic)
    session_error: str | None = None  # ORT CPU could not build a session for this graph
    not_run: str | None = None  # why ORT CPU was not asked (cast_by_ort stays None)
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"dtype": self.dtype, "cast_by_ort_cpu": self.cast_by_ort, "casts_in_graph": self.casts_in_graph,
                "ort_cpu_session_error": self.session_error, "not_run": self.not_run, **self.extra}


def precision_report(model: str | Path | onnx.ModelProto, dtype: str, *, casts_in_graph: int | None = None,
                     not_run: str | None = None) -> PrecisionReport:
    """Count, per op type, the nodes ONNX Runtime CPU will run in float32 because it lacks a ``dtype`` kernel.

    ``model``: the saved ONNX file (read without its external data; ONNX Runtime reads the data from beside it) or a
    ModelProto. ``casts_in_graph``: the graph's Cast nodes, when the caller counted them (else read from ``model``).
    ``not_run``: a reason not to build the ORT session (a float16 model too large for the level-0
    graph ORT would save in one protobuf); ``cast_by_ort`` is then None, "not checked". float32 needs no session.
    """
    if casts_in_graph is None:
        graph = model if isinstance(model, onnx.ModelProto) else read_graph(model)[0]
        casts_in_graph = sum(n.op_type == "Cast" for n in graph.graph.node)
    report = PrecisionReport(dtype, casts_in_graph=casts_in_graph)
    if dtype == "float32":
        report.cast_by_ort = {}
        return report
    if not_run is not None:
        report.not_run = not_run
        return report
    with tempfile.TemporaryDirectory() as d:
        out = str(Path(d) / "ort_level0.onnx")
        try:
            cpu_session(weightless(model), optimized_file=out, opt_level="disable")
        except Exception as e:  # noqa: BLE001 - ORT raises its own exception types
            report.session_error = first_line(e)
            return report
        seen = onnx.load(out, load_external_data=False)
    report.cast_by_ort = _float32_nodes(seen)
    return report


# a floating initializer from this many bytes on is a weight: an input of the same type and shape in the graph the
# precision session reads (smaller ones, and every integer one — shapes, axes, indices — stay constants)
WEIGHT_BYTES = 1024


def weightless(model: str | Path | onnx.ModelProto) -> bytes:
    """``model`` serialized with its floating weights turned into graph inputs of the same type and shape: what ONNX
    Runtime's kernel choice and its Casts depend on (op types and dtypes), without the weights — a session over it
    reads none, so the precision report of a model of any size costs its graph, not its weights. The weights are
    never read either: a one-file model is walked field by field (:func:`mhaexport.runners.wire.read_graph`),
    an external-data one read without its data."""
    where: dict[str, tuple[int, int]] = {}
    if isinstance(model, onnx.ModelProto):
        proto = onnx.ModelProto()
        proto.CopyFrom(model)
    else:
        proto, where = read_graph(model, WEIGHT_BYTES)
    g = proto.graph
    kept = []
    for t in g.initializer:
        floating = t.data_type in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16,
                                   onnx.TensorProto.DOUBLE)
        if floating and _itemsize(t.data_type) * _count(t.dims) >= WEIGHT_BYTES:
            g.input.append(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
            continue
        if t.name in where:  # a large integer constant the walk left in the file: read back
            with open(model, "rb") as f:
                f.seek(where[t.name][0])
                t.raw_data = f.read(where[t.name][1])
        kept.append(t)
    if len(kept) != len(g.initializer):
        kept = [onnx.TensorProto.FromString(t.SerializeToString()) for t in kept]
        del g.initializer[:]
        g.initializer.extend(kept)
    return proto.SerializeToString()


def _itemsize(data_type: int) -> int:
    return {onnx.TensorProto.DOUBLE: 8, onnx.TensorProto.FLOAT: 4}.get(data_type, 2)


def _count(dims) -> int:
    n = 1
    for d in dims:
        n *= int(d)
    return n


# ops whose outputs are never float, whatever their inputs
_NON_FLOAT_OUT = {"Shape", "Size", "Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "Not", "And", "Or",
                  "Xor", "ArgMax", "ArgMin", "NonZero", "IsNaN", "IsInf"}


def _float32_nodes(graph_model: onnx.ModelProto) -> dict[str, int]:
    """Per op type, the nodes of ORT's level-0 graph that compute in float32: fed (directly or through other
    such nodes) by the Casts to float ORT inserted (``InsertedPrecisionFreeCast_*``)."""
    f32 = {t.name for t in graph_model.graph.initializer if t.data_type == onnx.TensorProto.FLOAT}
    counts: collections.Counter[str] = collections.Counter()
    for n in graph_model.graph.node:
        if n.op_type == "Cast":
            if n.name.startswith("Inserted") and any(a.name == "to" and a.i == onnx.TensorProto.FLOAT
                                                     for a in n.attribute):
                f32.update(n.output)
            continue
        if any(i in f32 for i in n.input):
            counts[f"{n.domain}.{n.op_type}" if n.domain not in ("", "ai.onnx") else n.op_type] += 1
            if n.op_type not in _NON_FLOAT_OUT:
                f32.update(n.output)
    return dict(sorted(counts.items()))
