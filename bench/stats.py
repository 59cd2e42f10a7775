"""The few statistics bench reads from step timings: percentiles, the steadiness of warm-ups, and spread.

**Spread** (:func:`token_spread`) is p90 / p50 of per-token latency after the steady growth with position is taken
out: per-token latency legitimately rises with the cache (steeply for eager-nocache, which recomputes the whole
sequence), and that rise is not noise. The trend is a line through (median position, median latency) of the
earlier and the later half of the steps, never falling; each step is divided by it. Spikes, a slow stretch or a slow
repeat (the steps of all repeats are pooled) stay in, so a spread near 1 means the p50 is a figure to trust.
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
    """p90 / p50 of each decode step's latency divided by the trend at its position (see the module docstring);
    ``runs``: the step latencies of each repeat, at ``positions``. None without steps."""
    pos = np.array([p for run in runs for p, _ in zip(positions, run)], dtype=np.float64)
    lat = np.array([s for run in runs for _, s in zip(positions, run)], dtype=np.float64)
    if lat.size == 0:
        return None
    mid = float(np.median(pos))
    early, late = pos <= mid, pos > mid
    if late.any():
        x1, y1 = float(np.median(pos[early])), float(np.median(lat[early]))
        x2, y2 = float(np.median(pos[late])), float(np.median(lat[late]))
        slope = max(0.0, (y2 - y1) / (x2 - x1))  # latency never legitimately falls as the cache grows
        trend = y1 + slope * (pos - x1)
    else:
        trend = np.full_like(lat, float(np.median(lat)))
    ratio = lat / np.maximum(trend, 1e-12)
    return round(percentile(ratio, 90) / max(percentile(ratio, 50), 1e-12), 3)


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
