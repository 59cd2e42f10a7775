"""The few statistics bench reads from step timings: percentiles, the steadiness of warm-ups, and spread.

**Spread** (:func:`token_spread`) says how far the slow and the fast tenth of the decode steps sit from the median:
the larger of p90 / p50 and p50 / p10, after the steady growth with position is taken out. Per-token latency
legitimately rises with the cache (steeply for eager-nocache, which recomputes the whole sequence), and that rise
is not noise. The trend is a line through (median position, median latency) of the earlier and the later half of
the steps (the steps of all repeats pooled), never falling and never steeper than latency in proportion to the
sequence length (what recomputing it all costs); each step is divided by it. Spikes, a slow stretch, a slow
repeat — or a run that was slow but for its fast moments — stay in, so a spread near 1 means the p50 is a figure
to trust.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

import numpy as np


def percentile(values: Sequence[float], q: float) -> float:
    return float(np.percentile(np.asarray(values, dtype=np.float64), q))


def agree(a: float, b: float, within: float) -> bool:
    """Two timings agree when they differ by at most ``within`` (0.10 = 10 %) of the smaller."""
    return abs(a - b) <= within * min(a, b)


def token_spread(positions: Sequence[int], runs: Sequence[Sequence[float]]) -> float | None:
    """max(p90 / p50, p50 / p10) of each decode step's latency divided by the trend at its position (see the
    module docstring); ``runs``: the step latencies of each repeat, at ``positions``. None without steps."""
    pos = np.array([p for run in runs for p, _ in zip(positions, run)], dtype=np.float64)
    lat = np.array([s for run in runs for _, s in zip(positions, run)], dtype=np.float64)
    if lat.size == 0 or not (lat > 0).all():  # no steps, or steps too short for the clock to see
        return None
    mid = float(np.median(pos))
    early, late = pos <= mid, pos > mid
    if late.any():
        x1, y1 = float(np.median(pos[early])), float(np.median(lat[early]))
        x2, y2 = float(np.median(pos[late])), float(np.median(lat[late]))
        # latency never legitimately falls as the cache grows, nor grows faster than the sequence (recompute)
        slope = min(max(0.0, (y2 - y1) / (x2 - x1)), y1 / (x1 + 1))
        trend = y1 + slope * (pos - x1)  # > 0: at least y1 * (pos + 1) / (x1 + 1)
    else:
        trend = np.full_like(lat, float(np.median(lat)))
    ratio = lat / trend
    p10, p50, p90 = (percentile(ratio, q) for q in (10, 50, 90))
    return round(max(p90 / p50, p50 / p10), 3)


def repeat_spread(runs: Sequence[Sequence[float]]) -> float | None:
    """(max - min) / median of each repeat's median step latency: how far the repeats disagree. None for fewer
    than two repeats with steps."""
    medians = [statistics.median(r) for r in runs if len(r)]
    if len(medians) < 2:
        return None
    return round((max(medians) - min(medians)) / statistics.median(medians), 3)


def window_median(positions: Sequence[int], values: Sequence[float], at: int, half: int = 8) -> float | None:
    """The median of ``values`` at positions within ``half`` of ``at``; None when none are."""
    vals = [v for p, v in zip(positions, values) if abs(p - at) <= half]
    return round(statistics.median(vals), 4) if vals else None
