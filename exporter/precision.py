"""Export precision (float32 / float16 / bfloat16) and the checks the ONNX exporter runs on a lowered graph.

- ``self_check``: a rewritten (lowered) graph must give the decomposed graph's outputs on ONNX Runtime CPU at the
  export's example shapes, left padding included; otherwise the rewrite matched something that is not attention.
- ``precision_report``: which nodes ONNX Runtime's CPU provider runs in float32 because it has no kernel for the
  export's dtype. ORT inserts those Casts itself when it builds the session (``InsertCastTransformer``); they show
  in the graph it saves with ``optimized_model_filepath`` at optimization level 0, and nowhere else.
"""

from __future__ import annotations

import collections
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
import torch

from mhaexport import iospec
from mhaexport.errors import ExportError, first_line

DTYPES = ("float32", "float16", "bfloat16")
TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
# Largest |lowered - decomposed| on logits the self-check accepts, relative to max |logits| (plus this absolute)
SELF_CHECK_TOL = {"float32": 1e-4, "float16": 2e-2, "bfloat16": 1e-1}
_ELEM = {"float32": onnx.TensorProto.FLOAT, "float16": onnx.TensorProto.FLOAT16,
         "bfloat16": onnx.TensorProto.BFLOAT16}


@dataclass
class PrecisionReport:
    """Which ops ONNX Runtime CPU runs outside the export's dtype (None where it could not be checked)."""

    dtype: str
    cast_by_ort: dict[str, int] | None = None  # op type -> nodes ORT CPU wraps in Casts (no kernel for dtype)
    casts_in_graph: int = 0  # Cast nodes the exporter wrote (e.g. bool/int mask arithmetic)
    session_error: str | None = None  # ORT CPU could not build a session for this graph
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"dtype": self.dtype, "cast_by_ort_cpu": self.cast_by_ort, "casts_in_graph": self.casts_in_graph,
                "ort_cpu_session_error": self.session_error, **self.extra}


def _session(model: bytes | str, optimized: str | None = None, level: int | None = None):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    if level is not None:
        so.graph_optimization_level = ort.GraphOptimizationLevel(level)
    if optimized:
        so.optimized_model_filepath = optimized
    from mhaexport.runtime.session import CPU, start_session

    return start_session(model, [CPU], so)[0]


def precision_report(model: onnx.ModelProto, dtype: str) -> PrecisionReport:
    """Count, per op type, the nodes ONNX Runtime CPU will run in float32 because it lacks a ``dtype`` kernel."""
    report = PrecisionReport(dtype, casts_in_graph=sum(n.op_type == "Cast" for n in model.graph.node))
    if dtype == "float32":
        report.cast_by_ort = {}
        return report
    with tempfile.TemporaryDirectory() as d:
        out = str(Path(d) / "ort_level0.onnx")
        try:
            _session(model.SerializeToString(), optimized=out, level=0)
        except Exception as e:  # noqa: BLE001 - ORT raises its own exception types
            report.session_error = first_line(e)
            return report
        seen = onnx.load(out, load_external_data=False)
    report.cast_by_ort = _float32_nodes(seen)
    return report


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


def _np_inputs(contract: iospec.ModelContract, dtype: str, batch: int, seq: int, past: int,
               pad: list[int]) -> dict:
    from mhaexport.models.inputs import make_inputs

    ids, mask, cache = make_inputs(contract, batch=batch, seq=seq, past=past, seed=7, pad=pad)
    np_dtype = np.float16 if dtype == "float16" else np.float32
    kv = [(k.numpy().astype(np_dtype), v.numpy().astype(np_dtype)) for k, v in cache]
    return iospec.make_feed(ids.numpy(), mask.numpy(), kv)


def self_check(decomposed: bytes, lowered: onnx.ModelProto, contract: iospec.ModelContract, dtype: str,
               attention: str, *, seq: int, past: int) -> float | None:
    """Run the decomposed and the lowered graph on ONNX Runtime CPU at the export's shapes, the second batch row
    left-padded, and compare every output at real (non-padded) positions; all positions must be finite. Returns the largest |difference|; raises ExportError past tolerance.
    Returns None (not checked) for bfloat16, which numpy cannot feed."""
    if dtype == "bfloat16":
        return None
    pad = [0, min(2, past + seq - 1)]
    feed = _np_inputs(contract, dtype, batch=2, seq=seq, past=past, pad=pad)
    try:
        ref = _session(decomposed).run(None, feed)
    except Exception as e:  # noqa: BLE001
        raise ExportError(f"ONNX Runtime CPU cannot run the decomposed {dtype} graph: {first_line(e)}") from None
    try:
        got = _session(lowered.SerializeToString()).run(None, feed)
    except Exception as e:  # noqa: BLE001
        raise ExportError(f"--attention {attention}: ONNX Runtime CPU cannot run the lowered {dtype} graph: "
                          f"{first_line(e)}") from None
    # padded query rows and padded key slots are not compared (their values are never read; a fused kernel may
    # fill a fully masked row differently), only checked finite
    keys = np.ones((2, past + seq), dtype=bool)  # (B, past + T)
    keys[1, :pad[1]] = False
    worst = 0.0
    for name, r, g in zip(iospec.output_names(contract.n_layers), ref, got):
        sel = keys[:, past:, None] if name == iospec.LOGITS else keys[:, None, :, None]
        if r.shape != g.shape:
            raise ExportError(f"--attention {attention}: output {name} has shape {g.shape} after the rewrite, "
                              f"{r.shape} before")
        sel = np.broadcast_to(sel, r.shape)
        r32, g32 = r.astype(np.float32)[sel], g.astype(np.float32)[sel]
        if not np.isfinite(g.astype(np.float32)).all():
            raise ExportError(f"--attention {attention}: output {name} of the lowered graph holds NaN/inf")
        diff = float(np.abs(r32 - g32).max()) if r32.size else 0.0
        tol = SELF_CHECK_TOL[dtype] * (1.0 + float(np.abs(r32).max() if r32.size else 0.0))
        if diff > tol:
            raise ExportError(f"--attention {attention}: the lowered graph differs from the decomposed one on "
                              f"{name} by {diff:.3g} (tolerance {tol:.3g}): the rewrite is wrong for this model")
        worst = max(worst, diff)
    return worst
