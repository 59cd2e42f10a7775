"""The lowering's self-check: a rewritten (lowered) graph must give the decomposed graph's outputs on ONNX Runtime
CPU at the export's example shapes, left padding included; otherwise the rewrite matched something that is not
attention, or wrote the fused op wrong."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx

from mhaexport import dtypes, iospec
from mhaexport.errors import ExportError, first_line
from mhaexport.runtime.session import cpu_session as _cpu_session

# Largest |lowered - decomposed| on logits the self-check accepts, relative to max |logits| (plus this absolute)
SELF_CHECK_TOL = {name: d.self_check_tol for name, d in dtypes.DTYPES.items()}


def _np_inputs(contract: iospec.ModelContract, dtype: str, batch: int, seq: int, past: int,
               pad: list[int]) -> dict:
    ids, mask, cache = iospec.dummy_inputs(contract, batch, seq, past, seed=7, pad=pad,
                                           dtype=dtypes.numpy_dtype(dtype))
    return iospec.make_feed(ids, mask, cache)


ModelSource = bytes | str | Path | onnx.ModelProto  # a serialized model, a file (external data beside it), a proto


def _session_source(model: ModelSource) -> bytes | str:
    return model.SerializeToString() if isinstance(model, onnx.ModelProto) else (
        model if isinstance(model, bytes) else str(model))


def self_check(decomposed: ModelSource, lowered: ModelSource, contract: iospec.ModelContract, dtype: str,
               attention: str, *, seq: int, past: int) -> float | None:
    """Run the decomposed and the lowered graph on ONNX Runtime CPU at the export's shapes, the second batch row
    left-padded, and compare every output at real (non-padded) positions; all positions must be finite.

    Each graph is given as serialized bytes, a ModelProto, or the path of a saved file (whose external data ONNX
    Runtime reads from beside it: the exporter passes the lowered model as the file it wrote).

    Returns the largest |difference|; raises ExportError past tolerance. Returns None (not checked) for bfloat16,
    which numpy cannot feed."""
    if dtype == "bfloat16":
        return None
    pad = [0, min(2, past + seq - 1)]
    feed = _np_inputs(contract, dtype, batch=2, seq=seq, past=past, pad=pad)
    try:
        ref = _cpu_session(_session_source(decomposed)).run(None, feed)
    except Exception as e:  # noqa: BLE001
        raise ExportError(f"ONNX Runtime CPU cannot run the decomposed {dtype} graph: {first_line(e)}") from None
    try:
        got = _cpu_session(_session_source(lowered)).run(None, feed)
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
