"""The comparison math every check and report figure stands on: tolerances, element-wise differences and their
figures (max abs/rel error, mismatches, the smallest atol that would pass, |error| quantiles from a histogram).

Numpy on arrays and the runner protocol's outputs; nothing here knows a check, a context or a report.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mhaexport.core import dtypes
from mhaexport.runtime.runner import Outputs

OUTPUT_KINDS = ("logits", "present")  # what per-output tolerances and statistics are keyed by


@dataclass(frozen=True)
class Tolerance:
    """An element mismatches when |a - e| > atol + rtol * |e|. Defaults per artifact dtype (mhaexport.core.dtypes);
    ``per_output``: overrides for ``logits`` or ``present`` (every present.* output), as (kind, atol, rtol)."""

    atol: float
    rtol: float
    per_output: tuple[tuple[str, float, float], ...] = ()

    @classmethod
    def for_dtype(cls, dtype: str, atol: float | None | dict = None, rtol: float | None | dict = None) -> Tolerance:
        """The dtype's defaults, overridden by ``atol``/``rtol``: a number (every output) or a dict
        {None | "logits" | "present": number} (``--atol 1e-4 --atol logits=1e-3``)."""
        d = dtypes.DTYPES.get(dtype, dtypes.DTYPES["float32"])
        a_map = atol if isinstance(atol, dict) else {None: atol}
        r_map = rtol if isinstance(rtol, dict) else {None: rtol}
        base_a = d.atol if a_map.get(None) is None else a_map[None]
        base_r = d.rtol if r_map.get(None) is None else r_map[None]
        per = tuple((k, a_map[k] if a_map.get(k) is not None else base_a,
                     r_map[k] if r_map.get(k) is not None else base_r)
                    for k in OUTPUT_KINDS if k in a_map or k in r_map)
        return cls(base_a, base_r, per)

    def for_output(self, kind: str) -> Tolerance:
        """The tolerance for ``logits`` or ``present`` outputs."""
        for k, a, r in self.per_output:
            if k == kind:
                return Tolerance(a, r)
        return Tolerance(self.atol, self.rtol)

    def describe(self) -> str:
        base = f"atol={self.atol:g} rtol={self.rtol:g}"
        return base + "".join(f", {k}: atol={a:g} rtol={r:g}" for k, a, r in self.per_output)


# |error| histogram: 20 bins per decade from 1e-12 to 1e3, errors below in the first, inf/NaN in the last; the
# median and p99 are read off it (the bin's upper edge: within 12 % above the true quantile), the mean and max exact
HIST_EDGES = 10.0 ** np.arange(-12.0, 3.0001, 0.05)


@dataclass
class Diff:
    """Element-wise comparison figures over the selected (real, non-padded) positions: max, mean and
    (histogram) quantiles of |error|, mismatches against the tolerance, and the smallest atol that would pass."""

    max_abs: float = 0.0
    max_rel: float = 0.0
    mismatched: int = 0
    total: int = 0
    min_atol: float = 0.0  # the smallest atol that would have passed at the given rtol
    sum_abs: float = 0.0  # finite |errors| summed (for the mean)
    hist: np.ndarray | None = None  # counts over HIST_EDGES (+ one bin for inf/NaN)

    @property
    def ok(self) -> bool:
        return self.mismatched == 0

    @property
    def mismatch_fraction(self) -> float:
        return self.mismatched / self.total if self.total else 0.0

    def merge(self, other: Diff) -> Diff:
        hist = self.hist if other.hist is None else (other.hist if self.hist is None else self.hist + other.hist)
        return Diff(max(self.max_abs, other.max_abs), max(self.max_rel, other.max_rel),
                    self.mismatched + other.mismatched, self.total + other.total, max(self.min_atol, other.min_atol),
                    self.sum_abs + other.sum_abs, hist)

    def quantile(self, q: float) -> float:
        """|error| at quantile q from the histogram (the bin's upper edge; inf when it falls among inf/NaN)."""
        if self.hist is None or not self.hist.sum():
            return 0.0
        cum = np.cumsum(self.hist)
        i = int(np.searchsorted(cum, q * cum[-1]))
        if i == 0:  # below 1e-12: reads 0
            return 0.0
        return float("inf") if i >= len(HIST_EDGES) else float(min(HIST_EDGES[i], self.max_abs))

    def stats(self) -> dict:
        """mean, median, p99 and max of |error|, and the mismatch fraction (per output in the report)."""
        mean = self.sum_abs / self.total if self.total else 0.0
        return {"mean": rounded(mean), "median": rounded(self.quantile(0.5)), "p99": rounded(self.quantile(0.99)),
                "max": rounded(self.max_abs), "mismatch_fraction": rounded(self.mismatch_fraction),
                "compared": self.total}

    def figures(self) -> dict:
        return {"max_abs": rounded(self.max_abs), "max_rel": rounded(self.max_rel),
                "mismatch_fraction": rounded(self.mismatch_fraction), "min_atol": rounded(self.min_atol),
                "compared": self.total}


def near_tie(reference: np.ndarray, chosen: int, tol: Tolerance, logits_agree: bool) -> tuple[bool, float]:
    """The generation check's one tie rule, for every runtime (verify's loops, the deploy loop, onnxruntime-genai's):
    a greedy token that differs from the reference's at a step is a near-tie — passed, reported as such — when the
    reference's (V,) logits there put the chosen token within tolerance of its best (``best - chosen <= atol + rtol
    * |best|``) and the runtime's logits agreed with the reference's at every step up to and including that one.
    Returns (tie, that margin)."""
    best = int(np.argmax(reference))
    margin = float(reference[best] - reference[chosen])
    return (logits_agree and margin <= tol.atol + tol.rtol * abs(float(reference[best]))), margin


def rounded(x: float) -> float:
    """x to 3 significant digits: how figures are recorded (report.json reads as written)."""
    return float(f"{x:.3g}")


# compare() reduces this many elements at a time (float64 temporaries of ~8 arrays of this size: ~32 MiB): a long
# case's (B, T, V) logits are compared in slices along B and T, never as whole float64 copies
CHUNK_ELEMENTS = 1 << 19


def _blocks(shape: tuple[int, ...], limit: int | None = None):
    """Basic-index tuples that tile an array of ``shape`` in blocks of at most ``limit`` (CHUNK_ELEMENTS) elements
    (or one row of its last axis, when a row alone is larger), in C order."""
    limit = CHUNK_ELEMENTS if limit is None else limit
    size = int(np.prod(shape, dtype=np.int64))
    if size <= limit or len(shape) <= 1:
        yield ()
        return
    inner = int(np.prod(shape[1:], dtype=np.int64))
    if inner <= limit:
        step = max(1, limit // max(inner, 1))
        for i in range(0, shape[0], step):
            yield (slice(i, min(i + step, shape[0])),)
        return
    for i in range(shape[0]):
        for rest in _blocks(shape[1:], limit):
            yield (i,) + rest


def _compare_block(a: np.ndarray, e: np.ndarray, tol: Tolerance) -> Diff:
    """The figures of two same-shape blocks (float64 math), every element selected."""
    a = np.asarray(a, dtype=np.float64)
    e = np.asarray(e, dtype=np.float64)
    if a.size == 0:
        return Diff()
    with np.errstate(invalid="ignore", over="ignore"):  # inf - inf: decided just below
        err = np.abs(a - e)
    # a value that is not finite on either side is a mismatch, whatever the other side holds (inf - inf is NaN, and
    # an infinite expected value would make its own bound infinite): its error is inf
    finite = np.isfinite(a) & np.isfinite(e)
    err = np.where(finite, err, np.inf)
    ae = np.where(finite, np.abs(e), 0.0)
    bound = tol.atol + tol.rtol * ae
    rel = err / np.maximum(ae, 1e-12)
    need = err - tol.rtol * ae
    hist = np.bincount(np.searchsorted(HIST_EDGES, err[finite]), minlength=len(HIST_EDGES) + 1)
    hist[-1] += int((~finite).sum())
    return Diff(float(err.max()), float(rel.max()), int((~finite | (err > bound)).sum()), int(err.size),
                float(max(need.max(), 0.0)), float(err[finite].sum()), hist)


def compare(actual: np.ndarray, expected: np.ndarray, tol: Tolerance, where: np.ndarray | None = None) -> Diff:
    """Compare two arrays (float64 math); ``where`` selects elements (broadcast to the arrays' shape). Reduced
    block by block (:data:`CHUNK_ELEMENTS`): what it holds beyond its inputs is bounded whatever their size."""
    a, e = np.asarray(actual), np.asarray(expected)
    if a.shape != e.shape:
        return Diff(float("inf"), float("inf"), max(a.size, e.size, 1), max(a.size, e.size, 1), float("inf"))
    sel = None if where is None else np.broadcast_to(where, a.shape)
    parts = []
    for ix in _blocks(a.shape):
        if sel is None:
            d = _compare_block(a[ix], e[ix], tol)
        else:
            s = sel[ix]
            d = _compare_block(a[ix][s], e[ix][s], tol)
        if d.total:
            parts.append(d)
    if len(parts) <= 1:
        return parts[0] if parts else Diff()
    return merged(parts)


def compare_by_output(actual: Outputs, expected: Outputs, tol: Tolerance, rows: np.ndarray | None,
                      keys: np.ndarray | None) -> dict[str, Diff]:
    """{"logits": Diff on real query rows (B, T), "present": Diff over every present.* on real key positions
    (B, S)}, each against its own tolerance (``tol.for_output``)."""
    la, pa = actual
    le, pe = expected
    out = {"logits": compare(la, le, tol.for_output("logits"), None if rows is None else rows[:, :, None])}
    if len(pa) != len(pe):
        out["present"] = Diff(float("inf"), float("inf"), 1, 1, float("inf"))
        return out
    kmask = None if keys is None else keys[:, None, :, None]  # (B, 1, S, 1)
    tp, d = tol.for_output("present"), Diff()
    for (ka, va), (ke, ve) in zip(pa, pe):
        d = d.merge(compare(ka, ke, tp, kmask)).merge(compare(va, ve, tp, kmask))
    out["present"] = d
    return out


def compare_outputs(actual: Outputs, expected: Outputs, tol: Tolerance, rows: np.ndarray | None,
                    keys: np.ndarray | None) -> Diff:
    """logits on real query rows (B, T) and present keys/values on real key positions (B, S), merged."""
    by = compare_by_output(actual, expected, tol, rows, keys)
    return by["logits"].merge(by["present"])



def merged(diffs) -> Diff:
    """One Diff of several (the kinds of one case, or cases of one sweep)."""
    total = Diff()
    for d in diffs:
        total = total.merge(d)
    return total

