"""verify's ``headroom`` check of a half-precision folder: eager float32's per-layer activation peaks (measured by
:func:`mhaexport.models.headroom.measure` on the verify run's eager model) against float16's range and bfloat16's
precision. A float16 file whose model passes 65,504 somewhere fails, naming the layer and module (its runtimes then
compute inf there, and NaN logits after it: the finite and parity checks say *that* it is wrong, this one *where*
and why); a thin margin passes with the figure said; a bfloat16 file passes with bfloat16's step at the peak (its
range is float32's). One result per folder, shown on each runtime that runs the ONNX file.
"""

from __future__ import annotations

from typing import Any, Callable

from mhaexport.verify.results import HEADROOM, CheckResult

HALF = ("float16", "bfloat16")


def headroom_result(loaded: Any, dtype: str) -> Callable[[], CheckResult]:
    """The check's result for ``loaded`` (the eager model verify holds) and the folder's ``dtype``, computed when
    first asked (the callable the Context keeps)."""
    def run() -> CheckResult:
        from mhaexport.models.headroom import THIN_MARGIN, measure

        h = measure(loaded.module, loaded.contract, weights=loaded.weights, float32=getattr(loaded, "half", False))
        figures = {"dtype": dtype, **h.to_dict()}
        first = h.overflow
        if dtype == "float16" and first is not None:
            return CheckResult(HEADROOM, False, figures, h.summary("float16"))
        thin = h.thin() if dtype == "float16" else None
        note = (f"; thin: under {THIN_MARGIN:g}x, inputs unlike these may overflow float16 (bfloat16 keeps "
                "float32's range)" if thin is not None else "")
        return CheckResult(HEADROOM, True, figures, f"{dtype}: {h.summary(dtype)}{note}")
    return run


def check_headroom(runner: Any, ctx: Any) -> CheckResult:
    """The folder's headroom result (computed once), on each runtime that runs its ONNX file."""
    produce = getattr(ctx, "headroom", None)
    if produce is None:
        return CheckResult(HEADROOM, None, {}, "not run: the folder's ONNX file computes in float32")
    if HEADROOM not in ctx._ref:
        ctx._ref[HEADROOM] = produce()
    return ctx._ref[HEADROOM]
