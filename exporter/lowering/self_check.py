"""The lowering's self-check: a rewritten (lowered) graph must give the decomposed graph's outputs on ONNX Runtime
CPU at the export's example shapes, left padding included; otherwise the rewrite matched something that is not
attention, or wrote the fused op wrong."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx

from mhaexport.core import dtypes, iospec
from mhaexport.core.errors import ExportError, MhaExportError, first_line

# Largest |lowered - decomposed| on logits the self-check accepts, relative to max |logits| (plus this absolute)
SELF_CHECK_TOL = {name: d.self_check_tol for name, d in dtypes.DTYPES.items()}


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
    from mhaexport.runners.registry import graph_runner
    from mhaexport.runtime.feed import Feed

    feed = Feed.contract(contract.n_layers, cache_dtype=dtype)  # both graphs in the contract's protocol
    pad = [0, min(2, past + seq - 1)]
    ids, mask, cache = iospec.dummy_inputs(contract, 2, seq, past, seed=7, pad=pad, dtype=dtypes.numpy_dtype(dtype))
    outputs = []
    for graph, which in ((decomposed, f"the decomposed {dtype} graph"),
                         (lowered, f"the lowered {dtype} graph")):  # the registry's runners, on one thread
        runner = graph_runner("decomposed" if graph is decomposed else attention, contract, _session_source(graph),
                              feed)
        try:
            outputs.append(_flat(runner.activate().run(ids, mask, cache)))
        except Exception as e:  # noqa: BLE001  (a graph ONNX Runtime refuses to load or run)
            said = "" if graph is decomposed else f"--attention {attention}: "
            raise ExportError(f"{said}ONNX Runtime CPU cannot run {which}: {first_line(e)}") from None
        finally:
            runner.deactivate()
    return _compare_real(f"--attention {attention}", "the lowered graph",
                         list(zip(iospec.output_names(contract.n_layers), *outputs)), pad, past, dtype)


def _flat(out) -> list[np.ndarray]:
    """A contract call's outputs as the file's output list: logits, then present.* in output_names order."""
    return [out[0]] + [t for kv in out[1] for t in kv]


def _compare_real(what: str, graph: str, outputs: list[tuple[str, np.ndarray, np.ndarray]], pad: list[int],
                  past: int, dtype: str) -> float:
    """(name, reference, lowered) per output at the self-check's shapes (row 1 left-padded by pad[1]): the lowered
    outputs finite everywhere and within tolerance at real positions (padded query rows and key slots are never
    read; a fused kernel may fill them differently). Returns the largest |difference|; ExportError otherwise."""
    seq = outputs[0][1].shape[1]  # logits (B, T, V)
    keys = np.ones((2, past + seq), dtype=bool)  # (B, past + T)
    keys[1, :pad[1]] = False
    worst = 0.0
    for name, r, g in outputs:
        if r.shape != g.shape:
            raise ExportError(f"{what}: output {name} has shape {g.shape} after the rewrite, {r.shape} before")
        if not np.isfinite(g.astype(np.float32)).all():
            raise ExportError(f"{what}: output {name} of {graph} holds NaN/inf")
        sel = np.broadcast_to(keys[:, past:, None] if name == iospec.LOGITS else keys[:, None, :, None], r.shape)
        r32, g32 = r.astype(np.float32)[sel], g.astype(np.float32)[sel]
        diff = float(np.abs(r32 - g32).max()) if r32.size else 0.0
        tol = SELF_CHECK_TOL[dtype] * (1.0 + float(np.abs(r32).max() if r32.size else 0.0))
        if diff > tol:
            raise ExportError(f"{what}: {graph} differs from the decomposed one on {name} by {diff:.3g} "
                              f"(tolerance {tol:.3g}): the rewrite is wrong for this model")
        worst = max(worst, diff)
    return worst


def self_check_shared(decomposed: ModelSource, lowered: ModelSource, contract: iospec.ModelContract, dtype: str, *,
                      seq: int, past: int, max_cache: int, option: str = "--kv-cache shared") -> float | None:
    """The shared-cache lowering against the decomposed graph: both driven through the contract at the export's
    shapes, the second row left-padded — the lowered one by the runner that translates into its protocol (rows
    packed, the past copied into the buffers, one call per row with a past). Real positions must agree. Each graph
    is given as :func:`self_check` takes it."""
    if dtype == "bfloat16":
        return None
    from mhaexport.runners.registry import graph_runner
    from mhaexport.runtime.feed import Feed

    n = contract.n_layers  # the registry's runners, on one thread: the contract's calls (the shared one's translated)
    ref = graph_runner("decomposed", contract, _session_source(decomposed), Feed.contract(n, cache_dtype=dtype))
    got = graph_runner("shared", contract, _session_source(lowered),
                       Feed.contract(n, cache="shared", max_cache=max_cache, cache_dtype=dtype))
    pad = [0, min(2, past + seq - 1)]
    ids, mask, cache = iospec.dummy_inputs(contract, 2, seq, past, seed=7, pad=pad, dtype=dtypes.numpy_dtype(dtype))
    try:
        r = ref.activate().run(ids, mask, cache)
        g = got.activate().run(ids, mask, cache)
    except MhaExportError as e:
        import onnxruntime as ort

        why = first_line(e)
        if option == "--kv-cache window" and "GroupQueryAttention" in why:  # sliding_window_cache, query_seqlens
            why += (f" (the window cache needs GroupQueryAttention's sliding_window_cache and query_seqlens: "
                    f"onnxruntime >= 1.32; this is {ort.__version__})")
        raise ExportError(f"{option}: ONNX Runtime CPU cannot run the lowered {dtype} graph: {why}") from None
    return _compare_real(option, "the GroupQueryAttention graph",
                         list(zip(iospec.output_names(contract.n_layers), _flat(r), _flat(g))), pad, past, dtype)
