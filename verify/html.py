"""report.html: the verify report as one self-contained page beside report.json and report.md — no script, no
stylesheet or font fetched, the plots inline SVG (:mod:`mhaexport.verify.svg`), every text from the report (names
from folders, messages) HTML-escaped. Its counts are :meth:`VerifyReport.outcomes`' (the summary line's, report.md's
and JUnit's); its plots read the check figures: error against the cached decode position (kv-consistency, each
layer's window marked), error over the (batch, seq, past) sweep (parity), each generation step's logit error against
eager's top-1 margin (generation); the quality figures of lossy files are a table. :func:`page` is the shell bench.html
shares."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from markupsafe import Markup

from mhaexport.artifact import atomic_write_bytes
from mhaexport.core.numbers import is_real, number
from mhaexport.core.untrusted import shown, unescape_md
from mhaexport.verify.figures import Limits, Scores
from mhaexport.verify.report import VerifyReport, order_line
from mhaexport.verify.results import QUALITY, SERVING_CHECKS, CheckResult
from mhaexport.verify.markup import as_text, e, h, join
from mhaexport.verify.svg import COLOURS, Chart, Series, svg

CSS = """body{font-family:system-ui,sans-serif;margin:1.5em auto;max-width:1240px;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:.5em 0 1em;font-size:13px;display:block;overflow-x:auto;max-width:100%}td,th{border:1px solid #ccc;padding:3px 4px;
text-align:left;vertical-align:top}th{background:#f3f3f3}td.n{text-align:right}.pass{background:#e9f7ec}
.fail{background:#fde8e8}.skip{background:#f5f5f5;color:#666}.verdict{font-size:1.3em;padding:.4em .6em;
border-radius:4px}figure{margin:.5em 0 1.2em}figcaption{font-size:12px;color:#555;max-width:720px}
code{background:#f3f3f3;padding:0 3px}.note{color:#555;font-size:13px}.num{white-space:nowrap}
td.wrap{overflow-wrap:anywhere;min-width:8em}.judged{font-size:12px;color:#555;margin:.2em 0}"""


def page(title: object, body: list[Markup]) -> str:
    """A whole HTML document: ``title`` (escaped) and ``body`` (markup made by :func:`h`)."""
    return str(h('<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
                 '<meta name="viewport" content="width=device-width, initial-scale=1">'
                 "<title>{}</title><style>{}</style></head>\n<body>\n{}\n</body></html>\n",
                 title, Markup(CSS), join(body, "\n")))


@dataclass(frozen=True)
class Td:
    """A table cell with attributes: ``value`` (markup made by :func:`h`, or a value escaped here) over ``span``
    columns, ``title`` its tooltip, ``cls`` its CSS class."""

    value: object
    span: int = 1
    title: object = ""
    cls: str = ""


def _td(v: object) -> Markup:
    if not isinstance(v, Td):
        return h("<td>{}</td>", v)
    attrs = [h(' colspan="{}"', v.span) if v.span > 1 else "", h(' title="{}"', v.title) if v.title else "",
             h(' class="{}"', v.cls) if v.cls else ""]
    return h("<td{}>{}</td>", join(a for a in attrs if a), v.value)


def table(head: list, rows: list[list], classes: list[str] | None = None) -> Markup:
    """An HTML table; ``head`` and ``rows``: cells (markup made by :func:`h`, a :class:`Td`, or values escaped
    here); ``classes``: one CSS class per row (or "")."""
    classes = classes or [""] * len(rows)
    out = [h("<table><tr>{}</tr>", join(h("<th>{}</th>", c) for c in head))]
    out += [h('<tr class="{}">{}</tr>', c, join(_td(v) for v in r)) for r, c in zip(rows, classes)]
    return join(out + [Markup("</table>")], "\n")


# a word holding a digit ("6.7e-06", "x1.012", "8/8"): kept on one line (a browser breaks "6.7e-06" at its minus)
_NUMBER_WORD = re.compile(r"[^\s,;]*\d[^\s,;]*")


def nowrap(text: object) -> Markup:
    """``text`` escaped, each word that holds a digit in a span that never breaks inside."""
    t, out, last = as_text(text), [], 0
    for m in _NUMBER_WORD.finditer(t):
        out += [e(t[last:m.start()]), h('<span class="num">{}</span>', m.group())]
        last = m.end()
    return join(out + [e(t[last:])])


def figure(chart: Chart, caption: object) -> Markup:
    return h("<figure>{}<figcaption>{}</figcaption></figure>", svg(chart), caption)


_CLASS = {True: "pass", False: "fail", None: "skip"}
# report.md's icons are emoji, which a machine without an emoji font draws as boxes: these are in every font
_ICONS = {True: "✓", False: "✗", None: "–"}
_PLAIN = str.maketrans({"✅": "✓", "❌": "✗", "⏭": "–"})


Cell = Callable[[CheckResult | None], str]  # a result's table cell: report.md's (verify.render.cell)


def html(report: VerifyReport, cell: Cell) -> str:
    """The report as an HTML page (see the module's docstring); ``cell``: the text of a result's table cell,
    report.md's (:func:`mhaexport.verify.render.cell`, handed in: render writes this page)."""
    spec = report.model.spec or "?"
    title = f"mhaexport verify: {as_text(spec)}"
    v = report.verdict
    colour = {"passed": "pass", "failed": "fail"}.get(v.status, "skip")
    body = [h("<h1>mhaexport verify: <code>{}</code></h1>", spec),
            h('<p class="verdict {}"><b>{}</b> (exit {}): {}</p>', colour, v.status.upper(), v.code, v.message)]
    if report.refused is not None:
        body.append(h("<p>The folder <code>{}</code> was refused before any check ran; nothing was verified.</p>"
                      "<p><b>Why:</b> {}</p>", report.folder, report.refused))
        return page(title, body + [_footer(report)])
    c = report.counts
    body.append(h("<p>{} passed, {} failed, {} skipped · folder <code>{}</code> · sweep {} ({} shapes, seed {}) · "
                  "tolerance atol={} rtol={}</p>", c["passed"], c["failed"], c["skipped"], report.folder,
                  report.sweep.kind, report.sweep.cases, report.sweep.seed, number(report.tolerance.atol, "g"),
                  number(report.tolerance.rtol, "g")))
    if report.sources:
        body.append(h("<p>Merged from: {}</p>", join(report.sources, "; ")))
    cols = report.all_checks
    rows, classes = [], []
    for rt, info in report.runtimes.items():
        prov = ", ".join(as_text(p).replace("ExecutionProvider", "") for p in info.providers) or "—"
        if info.status == "ran":
            cells = [_cell(report, rt, report.results.get(rt, {}).get(ch), cell) for ch in cols]
        else:  # one cell across the checks says why none ran
            cells = [Td(nowrap(f"{as_text(info.status)}: {as_text(info.reason)}"), span=len(cols))]
        rows.append([h("<b>{}</b>", rt), Td(nowrap(prov), cls="wrap")] + cells)
        classes.append({"ran": "", "error": "fail"}.get(info.status, "skip"))
    body += [Markup("<h2>Runtimes × checks</h2>"), table(["runtime", "providers", *cols], rows, classes)]
    body += [h('<p class="judged">{}</p>', line) for line in judged_lines(report)]
    body += _plots(report, _colours(report))
    body += _quality(report)
    notes = _grouped([(row, r) for row, r in report.outcomes() if r.status is not True])
    if notes:
        body += [Markup("<h2>Failed and skipped</h2>"),
                 table(["", "runtime", "check", "why"],
                       [[_ICONS[r.status], row, Td(f"{len(names)} checks", title=", ".join(names))
                         if len(names) > 1 else r.check, nowrap(r.message)] for row, r, names in notes],
                       [_CLASS[r.status] for _, r, _ in notes])]
    if report.cross:
        body += [Markup("<h2>Provider against provider</h2>"),
                 table(["", "pair", "message"], [[_ICONS[x.status], x.row, nowrap(x.message)] for x in report.cross])]
    if report.lint is not None:
        findings = report.lint.findings
        body.append(h("<h2>Lint: {} finding(s)</h2>", len(findings)))
        if findings:
            body.append(table(["severity", "rule", "node", "message"],
                              [[f.severity, f.rule, f.node, f.message] for f in findings]))
    return page(title, body + [_footer(report)])


def _grouped(notes: list[tuple[str, CheckResult]]) -> list[tuple[str, CheckResult, list[str]]]:
    """The failed and skipped outcomes, those of one runtime with one status and one message as one line: (row,
    the first result, every check's name) in the order first met."""
    groups: dict[tuple, tuple[str, CheckResult, list[str]]] = {}
    for row, r in notes:
        groups.setdefault((row, r.status, r.message), (row, r, []))[2].append(r.check)
    return list(groups.values())


def _colours(report: VerifyReport) -> dict[str, str]:
    return {rt: COLOURS[i % len(COLOURS)] for i, rt in enumerate(report.runtimes)}


# the checks whose comparisons are judged element by element: |error| <= atol + rtol x |value|
# (VerifyReport.judged_by's bounds; a lossy file's dynamic-shapes judges its shapes only)
BOUNDED = ("parity", "causality", "kv-consistency", "padding", "dynamic-shapes")


def _bound(b) -> str:
    return f"|error| ≤ {number(b.atol, 'g')} + {number(b.rtol, 'g')} × |value|"


def judged_lines(report: VerifyReport) -> list[str]:
    """In words, what judged each runtime's comparisons (:data:`BOUNDED` checks, a generation step's near-tie):
    the runtimes held to the same bounds by the same rule on one line."""
    return [f"Judged by: {', '.join(rts)}: {_bound(b)} ({whose})" for rts, b, whose in report.judged_groups()]


def _rule(report: VerifyReport, rt: str, r: CheckResult) -> str:
    """What judged one result, in words (the cell's tooltip)."""
    info = report.runtimes.get(rt)
    if r.status is None or not r.counted:
        return ""
    if r.check == "dynamic-shapes" and info is not None and info.allowance is not None:
        return "judged by its shapes (a lossy file's values are judged by quality)"
    if r.check in BOUNDED:
        b, whose = report.judged_by(rt)
        return f"judged by {_bound(b)} ({whose})"
    if r.check in SERVING_CHECKS and getattr(r.figures, "allowed", None) is not None:
        return (f"judged by max abs ≤ {number(r.figures.allowed, '.3g')} (eager's floor over the same runs and "
                "the dtype's rounding)")
    if r.check == "generation":
        b, whose = report.judged_by(rt)
        return (f"judged by greedy tokens equal; a divergence where the top-1 margin is within {_bound(b)} "
                f"({whose}) is a near-tie")
    if r.check == QUALITY:
        return "judged by the scheme's thresholds (the quality table)"
    return ""


def _cell(report: VerifyReport, rt: str, r: CheckResult | None, cell: Cell) -> Markup | str | Td:
    """report.md's cell as text (its Markdown escapes undone: HTML escapes it), its icon drawn in any font, coloured
    by status, its numbers unbroken; its tooltip: the rule that judged it and the message."""
    shown_cell = nowrap(unescape_md(cell(r)).translate(_PLAIN))
    if r is None:
        return shown_cell
    rule = _rule(report, rt, r)
    title = f"{rule}. {as_text(r.message)}" if rule else as_text(r.message)
    value = h('<span class="{}">{}</span>', _CLASS[r.status], shown_cell) if r.counted else shown_cell
    return Td(value, title=title)


def _footer(report: VerifyReport) -> Markup:
    env = report.environment
    versions = ", ".join(f"{as_text(k)} {as_text(v)}" for k, v in report.versions.items())
    memory = (h('<p class="note">Memory: {}</p>', report.memory.summary().removeprefix("memory: "))
              if report.memory is not None and report.memory.mode else Markup(""))
    if order := order_line(report.runtimes):
        memory += h('<p class="note">Order: {}</p>', order)
    return memory + h('<p class="note">{} · {} · {} CPUs · {} · {} s · {}</p>', env.host or "?", env.platform or "?",
                      env.cpus or "?", versions, number(report.seconds, ".1f"), report.created)


def _windows(report: VerifyReport) -> list[tuple[float, str]]:
    """Each distinct sliding window of the model's layers as a marker: (W, "W=... (layers ...)")."""
    windows = (report.model.contract or {}).get("windows") or []
    marks: dict[int, list[int]] = {}
    for layer, w in enumerate(windows):
        if isinstance(w, int) and w > 0:
            marks.setdefault(w, []).append(layer)
    return [(float(w), f"window {w} (layer{'s' if len(ls) > 1 else ''} {','.join(map(str, ls))})")
            for w, ls in sorted(marks.items())]


def _ran(report: VerifyReport, check: str) -> list[tuple[str, CheckResult]]:
    return [(rt, checks[check]) for rt, checks in report.results.items()
            if check in checks and checks[check].figures and report.runtimes.get(rt) is not None
            and report.runtimes[rt].status == "ran"]


def _plots(report: VerifyReport, colours: dict[str, str]) -> list[str]:
    """The error against position, over the sweep and along generation: one chart each, the runtimes overlaid (each
    in its colour, ``colours``)."""
    windows = _windows(report)
    out = []
    kv = _eager_last([(rt, r.figures.long_by_position) for rt, r in _ran(report, "kv-consistency")
                      if r.figures.long_by_position])
    if kv:
        lines, words = _limits(report, [rt for rt, _ in kv], colours)
        out.append(figure(Chart("Cached decode: error against position", "position in the cache (tokens)",
                                "max |logits − full prefill|",
                                [_series(rt, [(p, y) for p, y in pts], colours) for rt, pts in kv],
                                vlines=windows, hlines=lines),
                          h("kv-consistency: each runtime decodes one long sequence token by token in its own cache "
                            "and is compared with one prefill of the whole sequence, per position (a curve that "
                            "climbs at a window or drifts with the cache is a cache or mask bug). {}", words)))
    sweep = _eager_last([(rt, r.figures.by_case) for rt, r in _ran(report, "parity") if r.figures.by_case])
    if sweep:
        lines, words = _limits(report, [rt for rt, _ in sweep], colours)
        out.append(figure(Chart("Parity over the sweep: error against the last position", "past + seq (tokens)",
                                "max |artifact − eager|",
                                [_series(rt, [(past + seq, y) for _, seq, past, y in cases], colours, dots=True)
                                 for rt, cases in sweep], vlines=windows, hlines=lines),
                          h("parity: every (batch, seq, past) case of the sweep against eager; the table below "
                            "lists each case. {}", words)))
        shapes = sorted({(b, s, p) for _, cases in sweep for b, s, p, _ in cases})
        got = {rt: {(b, s, p): y for b, s, p, y in cases} for rt, cases in sweep}
        rows = [[b, s, p] + [_num(got[rt].get((b, s, p), "")) for rt, _ in sweep]
                for b, s, p in shapes]
        out.append(h("<details><summary>Parity per case</summary>{}</details>",
                     table(["batch", "seq", "past"] + [rt for rt, _ in sweep], rows)))
    gen = _ran(report, "generation")
    for key in ("", "long_"):
        runs = [(rt, r.figures) for rt, r in gen if getattr(r.figures, f"{key}step_max_abs")]
        if not runs:
            continue
        runs = _eager_last(runs)
        series = [_series(rt, list(enumerate(getattr(f, f"{key}step_max_abs"))), colours) for rt, f in runs]
        margin = next((getattr(f, f"{key}step_margin") for rt, f in runs if getattr(f, f"{key}step_margin")), None)
        if margin:
            series.append(Series("top-1 margin", list(enumerate(margin)), dashed=True, colour="#777777"))
        divs = [(float(getattr(f, f"{key}first_divergence")), f"{rt} diverges") for rt, f in runs
                if getattr(f, f"{key}first_divergence") is not None]
        prompt = runs[0][1].long_prompt if key else None
        label = f"generation after a {prompt}-token prompt" if prompt else "generation after a short prompt"
        out.append(figure(Chart(f"Greedy generation: step error and margin ({label})", "decode step",
                                "logits error / margin", series, vlines=divs),
                          "generation: each step's max |logits − reference| (eager; eager itself against a full "
                          "recompute) with the reference's top-1 minus top-2 logit (dashed): a token flips where "
                          "the error reaches the margin; a divergence is marked."))
    return out


def _eager_last(pairs: list[tuple[str, object]]) -> list[tuple[str, object]]:
    """(runtime, figures) pairs with eager's drawn last: on top of a runtime that matches it exactly."""
    return sorted(pairs, key=lambda p: p[0] == "eager")


def _series(rt: str, points: list, colours: dict[str, str], dots: bool = False) -> Series:
    """A runtime's curve in its colour; eager's dashed (drawn last, over a runtime it matches: both show)."""
    return Series(rt, points, dots=dots, dashed=rt == "eager" and not dots, colour=colours[rt])


def _limits(report: VerifyReport, runtimes: list[str], colours: dict[str, str]) -> tuple[list, str]:
    """The threshold lines of a chart of ``runtimes``' logits errors and the words that say which rule judged
    each: one line per atol (the runtimes it judged named; the rtol part of each element's bound is said, not
    drawn: it depends on the element's value)."""
    groups: dict[float, list[tuple[str, object, str]]] = {}
    for rt in runtimes:
        b, whose = report.judged_by(rt)
        groups.setdefault(b.atol, []).append((rt, b, whose))
    lines, words = [], {}
    for atol, members in groups.items():
        names = ", ".join(rt for rt, _, _ in members)
        lossy = any(report.runtimes[rt].allowance is not None or report.runtimes[rt].self_tolerance
                    for rt, _, _ in members if rt in report.runtimes)
        if atol > 0:
            lines.append((atol, f"{'allowed' if lossy else 'atol'} {number(atol, 'g')} ({names})",
                          colours[members[0][0]] if len(groups) > 1 else None))
        for rt, b, whose in members:
            words.setdefault(f"{_bound(b)} ({whose})", []).append(rt)
    said = "; ".join(f"{', '.join(rts)}: {rule}" for rule, rts in words.items())
    return lines, f"Judged by (the dashed line: each atol, the runtimes it judged): {said}." if said else ""


def _or_dash(x: object) -> object:
    """A figure a report lacks (None) shown as "—"."""
    return "—" if x is None else x


def _num(x: object) -> str:
    return f"{number(x, '.3g')}" if isinstance(x, float) else e(x if x is not None else "failed to run")


def _quality(report: VerifyReport) -> list[str]:
    """The quality figures of each lossy runtime against their thresholds."""
    rows_in = [(rt, r) for rt, r in _ran(report, QUALITY) if r.status is not None]
    if not rows_in:
        return []
    from mhaexport.verify.quality import LABELS

    rows, classes = [], []
    for rt, r in rows_in:
        f = r.figures
        sweep, text, lim = f.sweep or Scores(), f.text or Scores(), f.thresholds or Limits()
        for name in ("top1", "kl_mean", "kl_p99", "logit_err", "ppl_ratio"):
            limit = getattr(lim, name)
            shown = "—" if limit is None else f"{'≥' if name == 'top1' else '≤'} {number(limit, 'g')}"
            rows.append([e(rt), e(f.scheme or ""), e(LABELS[name]), _num(_or_dash(getattr(sweep, name))),
                         _num(_or_dash(getattr(text, name))), e(shown)])
            classes.append(_CLASS[r.status])
        if (g := f.greedy) is not None:
            bound = "—" if lim.greedy is None else \
                f"≥ {number(lim.greedy, 'g')} × {number(_or_dash(g.tokens), 'd')}"
            rows.append([e(rt), "", "greedy agreement (mean)", "", _num(g.mean), e(bound)])
            classes.append(_CLASS[r.status])
    return [Markup("<h2>Quality of lossy files (against eager fp32)</h2>"),
            table(["runtime", "scheme", "figure", "sweep", "text", "threshold"], rows, classes)]


def write_html(report: VerifyReport, path: str | Path, cell: Cell) -> Path:
    """Write :func:`html` of ``report`` to ``path`` atomically; returns the path."""
    path = Path(path)
    atomic_write_bytes(path, html(report, cell).encode())
    return path
