"""report.html: the verify report as one self-contained page beside report.json and report.md — no script, no
stylesheet or font fetched, the plots inline SVG (:mod:`mhaexport.verify.svg`), every text from the report (names
from folders, messages) HTML-escaped. Its counts are :meth:`VerifyReport.outcomes`' (the summary line's, report.md's
and JUnit's); its plots read the check figures: error against the cached decode position (kv-consistency, each
layer's window marked), error over the (batch, seq, past) sweep (parity), each generation step's logit error against
eager's top-1 margin (generation); the quality figures of lossy files are a table. :func:`page` is the shell bench.html
shares."""

from __future__ import annotations

from html import escape
from pathlib import Path
from typing import Callable

from mhaexport.artifact import atomic_write_bytes
from mhaexport.core.numbers import number
from mhaexport.core.untrusted import shown
from mhaexport.verify.figures import Limits, Scores
from mhaexport.verify.report import VerifyReport
from mhaexport.verify.results import QUALITY, CheckResult
from mhaexport.verify.svg import COLOURS, Chart, Series, svg

CSS = """body{font-family:system-ui,sans-serif;margin:1.5em auto;max-width:1100px;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:.5em 0 1em;font-size:13px;display:block;overflow-x:auto;max-width:100%}td,th{border:1px solid #ccc;padding:3px 6px;
text-align:left;vertical-align:top}th{background:#f3f3f3}td.n{text-align:right}.pass{background:#e9f7ec}
.fail{background:#fde8e8}.skip{background:#f5f5f5;color:#666}.verdict{font-size:1.3em;padding:.4em .6em;
border-radius:4px}figure{margin:.5em 0 1.2em}figcaption{font-size:12px;color:#555;max-width:720px}
code{background:#f3f3f3;padding:0 3px}.note{color:#555;font-size:13px}"""
def e(text: object) -> str:
    """Text from a report (a folder's names, a message) as HTML: each line through the one escaping function for
    shown text (:func:`mhaexport.core.untrusted.shown`), then markup escaped."""
    return escape("\n".join(shown(line) for line in str(text).split("\n")), quote=True)


def page(title: str, body: list[str]) -> str:
    """A whole HTML document: ``title`` (escaped here) and ``body`` (HTML, escaped by its writer)."""
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{e(title)}</title><style>{CSS}</style></head>\n<body>\n" + "\n".join(body) + "\n</body></html>\n")


def table(head: list[str], rows: list[list[str]], classes: list[str] | None = None) -> str:
    """An HTML table; ``head`` and ``rows`` are HTML already; ``classes``: one CSS class per row (or "")."""
    classes = classes or [""] * len(rows)
    out = ["<table><tr>" + "".join(f"<th>{h}</th>" for h in head) + "</tr>"]
    out += [f'<tr class="{c}">' + "".join(f"<td>{v}</td>" for v in r) + "</tr>" for r, c in zip(rows, classes)]
    return "\n".join(out + ["</table>"])


def figure(chart: Chart, caption: str) -> str:
    return f"<figure>{svg(chart)}<figcaption>{caption}</figcaption></figure>"


_CLASS = {True: "pass", False: "fail", None: "skip"}
# report.md's icons are emoji, which a machine without an emoji font draws as boxes: these are in every font
_ICONS = {True: "✓", False: "✗", None: "–"}
_PLAIN = str.maketrans({"✅": "✓", "❌": "✗", "⏭": "–"})


Cell = Callable[[CheckResult | None], str]  # a result's table cell: report.md's (verify.render.cell)


def html(report: VerifyReport, cell: Cell) -> str:
    """The report as an HTML page (see the module's docstring); ``cell``: the text of a result's table cell,
    report.md's (:func:`mhaexport.verify.render.cell`, handed in: render writes this page)."""
    spec = report.model.spec or "?"
    title = f"mhaexport verify: {spec}"
    v = report.verdict
    colour = {"passed": "pass", "failed": "fail"}.get(v.status, "skip")
    body = [f"<h1>mhaexport verify: <code>{e(spec)}</code></h1>",
            f'<p class="verdict {colour}"><b>{e(v.status.upper())}</b> (exit {v.code}): {e(v.message)}</p>']
    if report.refused is not None:
        body.append(f"<p>The folder <code>{e(report.folder)}</code> was refused before any check ran; nothing was "
                    f"verified.</p><p><b>Why:</b> {e(report.refused)}</p>")
        return page(title, body + [_footer(report)])
    c = report.counts
    body.append(f"<p>{c['passed']} passed, {c['failed']} failed, {c['skipped']} skipped · folder "
                f"<code>{e(report.folder)}</code> · sweep {e(report.sweep.kind)} ({e(report.sweep.cases)} shapes, "
                f"seed {e(report.sweep.seed)}) · tolerance atol={number(report.tolerance.atol, 'g')} "
                f"rtol={number(report.tolerance.rtol, 'g')}</p>")
    if report.sources:
        body.append("<p>Merged from: " + "; ".join(e(s) for s in report.sources) + "</p>")
    cols = report.all_checks
    rows, classes = [], []
    for rt, info in report.runtimes.items():
        prov = ", ".join(p.replace("ExecutionProvider", "") for p in info.providers) or "—"
        if info.status == "ran":
            cells = [_cell(report.results.get(rt, {}).get(ch), cell) for ch in cols]
        else:
            cells = [e(f"{info.status}: {info.reason}")] + ["—"] * (len(cols) - 1)
        rows.append([f"<b>{e(rt)}</b>", e(prov)] + cells)
        classes.append({"ran": "", "error": "fail"}.get(info.status, "skip"))
    body += ["<h2>Runtimes × checks</h2>", table(["runtime", "providers"] + [e(ch) for ch in cols], rows, classes)]
    body += _plots(report, {rt: COLOURS[i % len(COLOURS)] for i, rt in enumerate(report.runtimes)})
    body += _quality(report)
    notes = [(row, r) for row, r in report.outcomes() if r.status is not True]
    if notes:
        body += ["<h2>Failed and skipped</h2>",
                 table(["", "runtime", "check", "why"],
                       [[_ICONS[r.status], e(row), e(r.check), e(r.message)] for row, r in notes],
                       [_CLASS[r.status] for _, r in notes])]
    if report.cross:
        body += ["<h2>Provider against provider</h2>",
                 table(["", "pair", "message"], [[_ICONS[x.status], e(x.row), e(x.message)] for x in report.cross])]
    if report.lint is not None:
        findings = report.lint.findings
        body.append(f"<h2>Lint: {len(findings)} finding(s)</h2>")
        if findings:
            body.append(table(["severity", "rule", "node", "message"],
                              [[e(f.severity), e(f.rule), e(f.node), e(f.message)] for f in findings]))
    return page(title, body + [_footer(report)])


def _cell(r: CheckResult | None, cell: Cell) -> str:
    """report.md's cell, its icon drawn in any font, coloured by status."""
    text = e(cell(r).translate(_PLAIN))
    return text if r is None or not r.counted else f'<span class="{_CLASS[r.status]}">{text}</span>'


def _footer(report: VerifyReport) -> str:
    env = report.environment
    versions = ", ".join(f"{k} {v}" for k, v in report.versions.items())
    memory = (f'<p class="note">Memory: {e(report.memory.summary().removeprefix("memory: "))}</p>'
              if report.memory is not None and report.memory.mode else "")
    return memory + (f'<p class="note">{e(env.host or "?")} · {e(env.platform or "?")} · {e(env.cpus or "?")} CPUs · '
            f"{e(versions)} · {number(report.seconds, '.1f')} s · {e(report.created)}</p>")


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
    tol = report.tolerance
    per = tol.per_output or {}
    atol = per["logits"].atol if "logits" in per else tol.atol
    limit = [(atol, f"atol {number(atol, 'g')}")] if atol > 0 else []
    windows = _windows(report)
    out = []
    kv = [(rt, r.figures.long_by_position) for rt, r in _ran(report, "kv-consistency") if r.figures.long_by_position]
    if kv:
        out.append(figure(Chart("Cached decode: error against position", "position in the cache (tokens)",
                                "max |logits − full prefill|",
                                [Series(rt, [(p, y) for p, y in pts], colour=colours[rt]) for rt, pts in kv],
                                vlines=windows, hlines=limit),
                          "kv-consistency: each runtime decodes one long sequence token by token in its own cache "
                          "and is compared with one prefill of the whole sequence, per position (a curve that "
                          "climbs at a window or drifts with the cache is a cache or mask bug)."))
    sweep = [(rt, r.figures.by_case) for rt, r in _ran(report, "parity") if r.figures.by_case]
    if sweep:
        out.append(figure(Chart("Parity over the sweep: error against the last position", "past + seq (tokens)",
                                "max |artifact − eager|",
                                [Series(rt, [(past + seq, y) for _, seq, past, y in cases], dots=True,
                                        colour=colours[rt])
                                 for rt, cases in sweep], vlines=windows, hlines=limit),
                          "parity: every (batch, seq, past) case of the sweep against eager; the table below lists "
                          "each case."))
        shapes = sorted({(b, s, p) for _, cases in sweep for b, s, p, _ in cases})
        got = {rt: {(b, s, p): y for b, s, p, y in cases} for rt, cases in sweep}
        rows = [[str(b), str(s), str(p)] + [_num(got[rt].get((b, s, p), "")) for rt, _ in sweep]
                for b, s, p in shapes]
        out.append("<details><summary>Parity per case</summary>"
                   + table(["batch", "seq", "past"] + [e(rt) for rt, _ in sweep], rows) + "</details>")
    gen = _ran(report, "generation")
    for key in ("", "long_"):
        runs = [(rt, r.figures) for rt, r in gen if getattr(r.figures, f"{key}step_max_abs")]
        if not runs:
            continue
        series = [Series(rt, list(enumerate(getattr(f, f"{key}step_max_abs"))), colour=colours[rt]) for rt, f in runs]
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
            rows.append([e(rt), "", "greedy agreement (mean)", "", _num(g.mean), e(_or_dash(lim.greedy))])
            classes.append(_CLASS[r.status])
    return ["<h2>Quality of lossy files (against eager fp32)</h2>",
            table(["runtime", "scheme", "figure", "sweep", "text", "threshold"], rows, classes)]


def write_html(report: VerifyReport, path: str | Path, cell: Cell) -> Path:
    """Write :func:`html` of ``report`` to ``path`` atomically; returns the path."""
    path = Path(path)
    atomic_write_bytes(path, html(report, cell).encode())
    return path
