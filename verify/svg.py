"""Charts as inline SVG text for report.html: lines and dots against a linear x axis and a log (or linear) y axis,
with vertical markers (a layer's window) and horizontal ones (a tolerance). Plain Python, no plotting library: a
report costs no import and no second of drawing, renders without JavaScript, and every page has its plots (why not
matplotlib, the ``[plot]`` extra behind bench.png: docs/DESIGN.md "report.html"). Every text drawn is escaped here.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from markupsafe import Markup

from mhaexport.core.numbers import finite, number
from mhaexport.verify.markup import h

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
    """A chart's content: title, axis labels, the series, and markers ``vlines`` as (value, label) and ``hlines`` (a
    threshold) as (value, label) or (value, label, colour: None for the default red)."""

    title: str
    xlabel: str
    ylabel: str
    series: list[Series]
    logy: bool = True
    vlines: list[tuple[float, str]] = field(default_factory=list)
    hlines: list[tuple] = field(default_factory=list)


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


def svg(chart: Chart) -> Markup:
    """The chart as an ``<svg>`` element (a string to put in HTML as is). On a log axis, zeros and negatives are
    drawn at the floor (a tenth of the smallest positive value) and the axis says so. Any figure draws: a point whose
    value is NaN or infinite is a cross at the top edge (the bottom edge for -inf on a linear axis) and the axis says
    so; magnitudes past 1e300 are clipped there; a point whose x is not finite is left out."""
    ys = [y for s in chart.series for x, y in s.points if y is not None and finite(x) is not None]
    ys += [y for y, *_ in chart.hlines]
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

    out = [h('<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {w} {h}" width="{w}" height="{h}" role="img" '
             'aria-label="{t}" font-family="sans-serif" font-size="11">', w=W, h=H, t=chart.title),
           h("<title>{}</title>", chart.title),
           h('<rect x="{}" y="{}" width="{}" height="{}" fill="#fff" stroke="#888"/>', LEFT, TOP, pw, ph),
           h('<text x="{}" y="18" font-size="13" font-weight="bold">{}</text>', LEFT, chart.title)]
    yticks = ([10.0 ** k for k in range(ylo, yhi + 1)] if chart.logy else _linear_ticks(ylo, yhi))
    for t in yticks:
        y = py(t, clamp=False)
        out.append(h('<line x1="{}" x2="{}" y1="{y}" y2="{y}" stroke="#eee"/><text x="{}" y="{}" text-anchor="end">{}'
                     "</text>", LEFT, LEFT + pw, LEFT - 4, _c(y + 4), _fmt(t), y=_c(y)))
    for t in _linear_ticks(xlo, xhi):
        x = px(t)
        out.append(h('<line x1="{x}" x2="{x}" y1="{}" y2="{}" stroke="#888"/><text x="{x}" y="{}" '
                     'text-anchor="middle">{}</text>', TOP + ph, TOP + ph + 4, TOP + ph + 16, _fmt(t), x=_c(x)))
    ylabel = chart.ylabel + (f" (0 drawn at {_fmt(floor)})" if chart.logy and any(y <= 0 for y in ys) else "")
    ylabel += " (NaN / inf: × at the edge)" if off_scale else ""
    out.append(h('<text x="{}" y="{}" text-anchor="middle">{}</text><text transform="translate(14 {}) rotate(-90)" '
                 'text-anchor="middle">{}</text>', _c(LEFT + pw / 2, ".0f"), H - 8, chart.xlabel,
                 _c(TOP + ph / 2, ".0f"), ylabel))
    for x, label in chart.vlines:
        out.append(h('<line x1="{x}" x2="{x}" y1="{}" y2="{}" stroke="#999" stroke-dasharray="4 3"/><text x="{}" '
                     'y="{}" fill="#555">{}</text>', TOP, TOP + ph, _c(px(x) + 3), TOP + 12, label, x=_c(px(x))))
    for y, label, *colour in chart.hlines:
        if finite(y) is None:
            continue
        stroke = _colour(colour[0]) if colour and colour[0] else "#cc0000"
        out.append(h('<line x1="{}" x2="{}" y1="{y}" y2="{y}" stroke="{c}" stroke-dasharray="6 3"/><text x="{}" '
                     'y="{}" text-anchor="end" fill="{c}">{}</text>', LEFT, LEFT + pw, LEFT + pw - 3,
                     _c(max(TOP + 11, py(y) - 3)), label, y=_c(py(y)), c=stroke))
    legend_y = TOP + 14
    for i, s in enumerate(chart.series):
        colour = _colour(s.colour or COLOURS[i % len(COLOURS)])
        pts = [(x, y) for x, y in s.points if y is not None and finite(x) is not None]
        off = [(x, y) for x, y in pts if finite(y) is None]
        pts = [(x, y) for x, y in pts if finite(y) is not None]
        for x, y in off:  # a value that is not finite: a cross at the edge, its value in the tooltip
            cx, cy = px(x), py(y)
            d = f"M{_c(cx - 4)},{_c(cy - 4)}L{_c(cx + 4)},{_c(cy + 4)}M{_c(cx - 4)},{_c(cy + 4)}L{_c(cx + 4)},{_c(cy - 4)}"
            out.append(h('<path d="{}" stroke="{}" stroke-width="2"><title>{}: {}, {}</title></path>', d, colour,
                         s.label, _fmt(x), number(y)))
        if not s.dots and len(pts) > 1:
            dash = "5 3" if s.dashed else "none"
            d = " ".join(f"{_c(px(x))},{_c(py(y))}" for x, y in pts)
            out.append(h('<polyline points="{}" fill="none" stroke="{}" stroke-width="1.5" stroke-dasharray="{}"/>',
                         d, colour, dash))
        if s.dots or len(pts) <= 40:
            for x, y in pts:
                out.append(h('<circle cx="{}" cy="{}" r="3" fill="{}"><title>{}: {}, {}</title></circle>',
                             _c(px(x)), _c(py(y)), colour, s.label, _fmt(x), number(y)))
        label_lines = _wrapped(s.label)
        dash = "4 2" if s.dashed else "none"
        out.append(h('<line x1="{}" x2="{}" y1="{y}" y2="{y}" stroke="{}" stroke-width="3" stroke-dasharray="{}"/>'
                     "<title>{}</title>", W - RIGHT + 10, W - RIGHT + 30, colour, dash, s.label, y=legend_y - 4))
        for k, line in enumerate(label_lines):
            out.append(h('<text x="{}" y="{}">{}<title>{}</title></text>', W - RIGHT + 34, legend_y + 13 * k, line,
                         s.label))
        legend_y += 13 * len(label_lines) + 4
    out.append(Markup("</svg>"))
    return Markup("\n").join(out)


LEGEND_CHARS = 22  # the legend's width in characters (the right margin at font-size 11)


def _wrapped(label: str, lines: int = 4) -> list[str]:
    """A legend label in lines of at most :data:`LEGEND_CHARS`, broken after a space, "=", "," or "/" or before "["
    where it can (else mid-word): whole up to ``lines`` lines, past them the last line ends in "…" (the tooltip holds it all)."""
    out, rest = [], label
    while rest and len(out) < lines:
        if len(rest) <= LEGEND_CHARS:
            out.append(rest)
            rest = ""
            break
        cut = max([rest.rfind(c, 0, LEGEND_CHARS) + 1 for c in " =,/"] + [rest.rfind("[", 0, LEGEND_CHARS)])
        cut = cut if cut > 0 else LEGEND_CHARS
        out.append(rest[:cut].rstrip())
        rest = rest[cut:].lstrip()
    if rest:
        out[-1] = out[-1][:LEGEND_CHARS - 1] + "…"
    return out


def _c(v: float, spec: str = ".1f") -> str:
    """A coordinate in the chart (finite: the axes clip what they draw)."""
    return number(v, spec)


def _colour(colour: str) -> str:
    """A series' colour: one of ours (``#rrggbb``), else the first of :data:`COLOURS`."""
    return colour if re.fullmatch(r"#[0-9A-Fa-f]{6}", colour) else COLOURS[0]
