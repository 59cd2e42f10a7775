"""Charts as inline SVG text for report.html: lines and dots against a linear x axis and a log (or linear) y axis,
with vertical markers (a layer's window) and horizontal ones (a tolerance). Plain Python, no plotting library: a
report costs no import and no second of drawing, renders without JavaScript, and every page has its plots (why not
matplotlib, the ``[plot]`` extra behind bench.png: docs/DESIGN.md "report.html"). Every text drawn is escaped here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from html import escape

from mhaexport.core.numbers import finite, number

# a colour per series, in order (colour-blind safe: Okabe-Ito)
COLOURS = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#F0E442", "#000000")
W, H = 720, 300  # the chart's size in px
LEFT, RIGHT, TOP, BOTTOM = 70, 170, 30, 45  # margins: the legend sits in the right one


@dataclass
class Series:
    """One curve: ``points`` (x, y) with y None where there is no value (a case that failed to run); ``dots``: marks
    only, no line between them."""

    label: str
    points: list[tuple[float, float | None]]
    dots: bool = False
    dashed: bool = False
    colour: str | None = None  # None: the next of COLOURS


@dataclass
class Chart:
    """A chart's content: title, axis labels, the series, and markers ``vlines`` / ``hlines`` as (value, label)."""

    title: str
    xlabel: str
    ylabel: str
    series: list[Series]
    logy: bool = True
    vlines: list[tuple[float, str]] = field(default_factory=list)
    hlines: list[tuple[float, str]] = field(default_factory=list)


def _e(text: object) -> str:
    return escape(str(text), quote=True)


def _fmt(v: float) -> str:
    if v == 0 or 1e-3 <= abs(v) < 1e5:
        return number(v, "g")
    return number(v, ".0e").replace("e-0", "e-").replace("e+0", "e")


# values drawn are clipped to this magnitude, so no span or ratio of the axis overflows a float
CLIP = 1e300


def _clip(v: float) -> float:
    return max(-CLIP, min(CLIP, v))


def _linear_ticks(lo: float, hi: float, n: int = 6) -> list[float]:
    span = hi - lo or 1.0
    step = 10 ** math.floor(math.log10(span / n))
    for m in (1, 2, 5, 10):
        if span / (step * m) <= n:
            step *= m
            break
    start = math.ceil(lo / step) * step
    return [start + i * step for i in range(int((hi - start) / step + 1e-9) + 1)]


def svg(chart: Chart) -> str:
    """The chart as an ``<svg>`` element (a string to put in HTML as is). On a log axis, zeros and negatives are
    drawn at the floor (a tenth of the smallest positive value) and the axis says so. Any figure draws: a point whose
    value is NaN or infinite is a cross at the top edge (the bottom edge for -inf on a linear axis) and the axis says
    so; magnitudes past 1e300 are clipped there; a point whose x is not finite is left out."""
    ys = [y for s in chart.series for x, y in s.points if y is not None and finite(x) is not None]
    ys += [y for y, _ in chart.hlines]
    off_scale = any(finite(y) is None for y in ys)
    ys = [_clip(v) for v in (finite(y) for y in ys) if v is not None]
    xs = [_clip(v) for v in (finite(x) for s in chart.series for x, _ in s.points) if v is not None]
    xs += [_clip(v) for v in (finite(x) for x, _ in chart.vlines) if v is not None]
    xlo, xhi = (min(xs), max(xs)) if xs else (0.0, 1.0)
    if xhi - xlo <= abs(xlo) * 1e-9:  # one x (or x's a float cannot tell apart): a unit around it
        pad = max(1.0, abs(xlo) * 1e-6)
        xlo, xhi = xlo - pad, xhi + pad
    floor = None
    if chart.logy:
        pos = [y for y in ys if y > 0]
        floor = max(min(pos) / 10, 1e-300) if pos else 1e-12
        ylo, yhi = math.floor(math.log10(floor)), math.ceil(math.log10(max(pos) if pos else 1.0))
        yhi = max(yhi, ylo + 1)
    else:
        ylo, yhi = min(ys + [0.0]), max(ys + [1.0]) * 1.05
        if yhi - ylo > CLIP:  # the span itself must be a finite float
            ylo, yhi = max(ylo, -CLIP / 2), min(yhi, CLIP / 2)
    pw, ph = W - LEFT - RIGHT, H - TOP - BOTTOM

    def px(x: float) -> float:
        return LEFT + (_clip(x) - xlo) / (xhi - xlo) * pw

    def py(y: float, clamp: bool = True) -> float:
        if finite(y) is None:  # NaN and +inf at the top edge; -inf at the bottom of a linear axis
            return TOP + ph if (not chart.logy and y < 0) else TOP
        y = _clip(y)
        v = math.log10(max(y, floor) if clamp else y) if chart.logy else y
        return min(TOP + ph, max(TOP, TOP + ph - (v - ylo) / (yhi - ylo) * ph))

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {W} {H}" width="{W}" height="{H}" role="img" '
           f'aria-label="{_e(chart.title)}" font-family="sans-serif" font-size="11">',
           f"<title>{_e(chart.title)}</title>",
           f'<rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}" fill="#fff" stroke="#888"/>',
           f'<text x="{LEFT}" y="18" font-size="13" font-weight="bold">{_e(chart.title)}</text>']
    yticks = ([10.0 ** k for k in range(ylo, yhi + 1)] if chart.logy else _linear_ticks(ylo, yhi))
    for t in yticks:
        y = py(t, clamp=False)
        out.append(f'<line x1="{LEFT}" x2="{LEFT + pw}" y1="{y:.1f}" y2="{y:.1f}" stroke="#eee"/>'
                   f'<text x="{LEFT - 4}" y="{y + 4:.1f}" text-anchor="end">{_fmt(t)}</text>')
    for t in _linear_ticks(xlo, xhi):
        x = px(t)
        out.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{TOP + ph}" y2="{TOP + ph + 4}" stroke="#888"/>'
                   f'<text x="{x:.1f}" y="{TOP + ph + 16}" text-anchor="middle">{_fmt(t)}</text>')
    ylabel = chart.ylabel + (f" (0 drawn at {_fmt(floor)})" if chart.logy and any(y <= 0 for y in ys) else "")
    ylabel += " (NaN / inf: × at the edge)" if off_scale else ""
    out.append(f'<text x="{LEFT + pw / 2:.0f}" y="{H - 8}" text-anchor="middle">{_e(chart.xlabel)}</text>'
               f'<text transform="translate(14 {TOP + ph / 2:.0f}) rotate(-90)" text-anchor="middle">'
               f"{_e(ylabel)}</text>")
    for x, label in chart.vlines:
        out.append(f'<line x1="{px(x):.1f}" x2="{px(x):.1f}" y1="{TOP}" y2="{TOP + ph}" stroke="#999" '
                   f'stroke-dasharray="4 3"/><text x="{px(x) + 3:.1f}" y="{TOP + 12}" fill="#555">{_e(label)}</text>')
    for y, label in chart.hlines:
        if finite(y) is None:
            continue
        out.append(f'<line x1="{LEFT}" x2="{LEFT + pw}" y1="{py(y):.1f}" y2="{py(y):.1f}" stroke="#c00" '
                   f'stroke-dasharray="6 3"/><text x="{LEFT + pw - 3}" y="{py(y) - 3:.1f}" text-anchor="end" '
                   f'fill="#c00">{_e(label)}</text>')
    for i, s in enumerate(chart.series):
        colour = s.colour or COLOURS[i % len(COLOURS)]
        pts = [(x, y) for x, y in s.points if y is not None and finite(x) is not None]
        off = [(x, y) for x, y in pts if finite(y) is None]
        pts = [(x, y) for x, y in pts if finite(y) is not None]
        for x, y in off:  # a value that is not finite: a cross at the edge, its value in the tooltip
            cx, cy = px(x), py(y)
            out.append(f'<path d="M{cx - 4:.1f},{cy - 4:.1f}L{cx + 4:.1f},{cy + 4:.1f}M{cx - 4:.1f},{cy + 4:.1f}'
                       f'L{cx + 4:.1f},{cy - 4:.1f}" stroke="{colour}" stroke-width="2"><title>{_e(s.label)}: '
                       f"{_fmt(x)}, {number(y)}</title></path>")
        if not s.dots and len(pts) > 1:
            dash = ' stroke-dasharray="5 3"' if s.dashed else ""
            d = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in pts)
            out.append(f'<polyline points="{d}" fill="none" stroke="{colour}" stroke-width="1.5"{dash}/>')
        if s.dots or len(pts) <= 40:
            for x, y in pts:
                out.append(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="3" fill="{colour}">'
                           f"<title>{_e(s.label)}: {_fmt(x)}, {number(y)}</title></circle>")
        ly = TOP + 14 + 16 * i
        out.append(f'<line x1="{W - RIGHT + 10}" x2="{W - RIGHT + 30}" y1="{ly - 4}" y2="{ly - 4}" '
                   f'stroke="{colour}" stroke-width="3"/><text x="{W - RIGHT + 34}" y="{ly}">{_e(s.label[:26])}</text>')
    out.append("</svg>")
    return "\n".join(out)
