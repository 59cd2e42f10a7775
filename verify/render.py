"""The verify report as Markdown (report.md): functions of a :class:`~mhaexport.verify.report.VerifyReport`, which
holds the data, the verdict and the JSON (the report knows nothing of its presentation: this module imports it,
not the other way), and :func:`write_report` (report.json + report.md + report.html). A runtimes x checks table that reads as a CI job summary, the parity and
quality figures, the details of what failed or was skipped, the plain protocol's findings, provider against
provider, and the lint findings."""

from __future__ import annotations

from pathlib import Path

from mhaexport.artifact import atomic_write_bytes, atomic_write_json, ensure_writable_dir
from mhaexport.artifact.source import HfSource
from mhaexport.core.numbers import finite, number
from mhaexport.core.untrusted import md, shown
from mhaexport.verify.html import write_html
from mhaexport.verify.report import RuntimeInfo, VerifyReport, order_line
from mhaexport.verify.figures import Limits, Scores
from mhaexport.verify.results import HEADROOM, QUALITY, SERVING_CHECKS, CheckResult

ICONS = {True: "✅", False: "❌", None: "⏭"}
# the cell of a result that is no check (CheckResult.counted) or was skipped for a static export
_NOT_RUN = {"reference": "ref", "lossy": "⏭ n/a (lossy)", "exact": "⏭ n/a (exact)", "not_applicable": "⏭ n/a",
            "static": "⏭ static"}


def markdown(report: VerifyReport) -> str:
    """The report as Markdown: the verdict and what was verified, the runtimes x checks table, the figures (parity by
    output; quality, or the block's demonstration), the details of what failed or was skipped, then the plain
    protocol's findings, provider against provider, the lint findings and where it ran."""
    env = report.environment
    if report.refused is not None:  # nothing ran: the reason, and where
        return (f"## mhaexport verify: ⛔ REFUSED\n\n**Folder** {md(report.folder)} was refused before any "
                f"check ran; nothing was verified.\n\n**Why:** {md(report.refused)}\n\n<sub>{md(env.host or '?')}"
                f" · {md(env.platform or '?')} · {md(report.created)}</sub>\n")
    cols = report.all_checks
    lines = _header(report) + _table(report.runtimes, report.results, cols) + _parity_lines(report)
    lines += (_module_lines(report) if report.module else
              _quality_lines(report) + _headroom_lines(report) + _decoder_legend(cols))
    lines += _judged_lines(report)
    lines += _details(report, cols)
    lines += _serving_lines(report)
    lines += _other_protocol_lines(report, cols)
    if report.cross:
        lines += ["### Provider against provider", ""]
        lines += [f"- {ICONS[c.status]} **{md(c.a)} vs {md(c.b)}**: {md(c.message)}" for c in report.cross]
        lines.append("")
    lines = [shown(line) for line in lines]  # one line each: a name or message from a folder cannot start another
    if report.lint is not None:
        lines += [report.lint.to_markdown("###")]  # escaped line by line by lint
    if report.memory is not None and report.memory.mode:  # the memory plan: cap, mode and why, the peak measured
        lines += [f"**Memory:** {md(report.memory.summary().removeprefix('memory: '))}", ""]
    if order := order_line(report.runtimes):
        lines += [f"**Order:** {md(order)}", ""]
    vers = ", ".join(f"{md(k)} {md(v)}" for k, v in report.versions.items())
    lines.append(f"<sub>{md(env.host or '?')} · {md(env.platform or '?')} · {md(env.cpus or '?')} CPUs · "
                 f"{vers} · {_x(report.seconds, '.1f')} s · {md(report.created)}</sub>")
    return "\n".join(lines) + "\n"


def _header(report: VerifyReport) -> list[str]:
    """The verdict, the model (or block) and its artifacts, the sweep, the tolerance and the counts."""
    c = report.counts
    verdict = {"passed": "✅ PASSED", "failed": "❌ FAILED"}.get(report.verdict.status, "⏭ NOT VERIFIED")
    model = report.model
    spec = model.spec or "?"
    if model.checkpoint:
        ckpt = f"weights {md(model.checkpoint)}"
    elif isinstance(model.source, HfSource):
        ckpt = f"{md(model.source.architecture or 'Hugging Face model')}, weights of its folder"
    else:
        ckpt = "seeded random weights"
    arts = []
    for name, a in report.artifacts.items():
        how = [f"opset {md(a.opset)}"] if a.opset else ([md(a.mode)] if a.mode else [])
        if a.producer:
            how.append(f"made by {md(a.producer)}, adopted; its protocol: {md(a.protocol or '?')}")
        if a.attention:
            how.append(f"attention {md(a.attention)}")
        how.append(md(a.dtype))
        if a.quantization:
            how.append(f"**{md(a.quantization.label or a.quantization.weights)} weights, lossy**")
        sizes = a.static_sizes or {}
        static = "static " + " ".join(f"{md(k.split('_')[0])}={md(v)}" for k, v in sizes.items() if "total" not in k)
        how.append("dynamic axes" if a.seq_dynamic else static)
        arts.append(f"{md(name)} ({', '.join(how)})")
    what = f"**Model** {md(spec)} ({ckpt})"
    if report.module:
        mask = (model.contract or {}).get("mask", "?")
        what = (f"**Module** {md(report.module)} block on its own, mask {md(mask)}"
                f"{'' if mask == 'causal' else ' (bidirectional)'} · **weights** {md(spec)} ({ckpt})")
    sweep, tol = report.sweep, report.tolerance
    lines = [f"## mhaexport verify: {verdict}", "",
             f"{what} · **artifacts** {', '.join(arts) or 'none'} · "
             f"**sweep** {md(sweep.kind)} ({md(sweep.cases)} shapes, seed {md(sweep.seed)}) · **tolerance** "
             f"atol={_x(tol.atol, 'g')} rtol={_x(tol.rtol, 'g')}"
             + "".join(f" ({md(k)}: atol={_x(v.atol, 'g')} rtol={_x(v.rtol, 'g')})" for k, v in (tol.per_output or {}).items())
             + " · "
             f"{md(c['passed'])} passed, {md(c['failed'])} failed, {md(c['skipped'])} skipped", ""]
    if report.sources:
        lines += ["Merged from: " + "; ".join(md(x) for x in report.sources)
                  + " (sweep and tolerance above: the first report's)", ""]
    return lines + _reference_lines(report.reference)


def _reference_lines(ref: dict | None) -> list[str]:
    """Where eager's references came from: a record (and how each check was judged from it), or the record this run
    wrote."""
    if not ref:
        return []
    if ref.get("kind") == "recorded":
        lines = [f"**Reference:** {md(ref.get('describe'))}; eager PyTorch was not run. The record keeps "
                 f"{md(ref.get('keeps'))}. How each check was judged:", ""]
        checks = ref.get("checks")
        return lines + [f"- {md(k)}: {md(v)}" for k, v in (checks if isinstance(checks, dict) else {}).items()] + [""]
    rec = ref.get("recorded")
    rec = rec if isinstance(rec, dict) else {}
    files = rec.get("files")
    return [f"**Reference recorded** into {md(', '.join(map(str, files)) if isinstance(files, list) else '?')} "
            f"({md(rec.get('bytes'))} bytes; keeps {md(rec.get('keeps'))}): a later verify judges the ONNX file from "
            "it without torch", ""]


def _parity_lines(report: VerifyReport) -> list[str]:
    """Parity's |error| statistics per runtime and output kind."""
    stats = [(rt, kind, v) for rt, checks in report.results.items() if "parity" in checks
             for kind, v in (checks["parity"].figures.per_output or {}).items()]
    if not stats:
        return []
    lines = ["", f"Parity by output (|artifact − eager| over the sweep's {'' if report.module else 'real '}"
                 "positions; median and p99 read "
                 "off a 20-bins-per-decade histogram):", "",
             "| runtime | output | mean | median | p99 | max | mismatched | atol | rtol |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    return lines + [f"| {md(rt)} | {md(kind)} | {_n(v.mean, '.1e')} | {_n(v.median, '.1e')} | {_n(v.p99, '.1e')} | "
                    f"{_n(v.max, '.1e')} | {_n(v.mismatch_fraction, '.1%')} | {_n(v.atol, 'g')} | {_n(v.rtol, 'g')} |"
                    for rt, kind, v in stats]


def _n(x: float | None, spec: str) -> str:
    """A figure formatted, "—" where a report read back lacks it."""
    return _x(x, spec)


def _module_lines(report: VerifyReport) -> list[str]:
    """The attention block's legend and the demonstration's line per runtime."""
    lines = ["", "✅ passed · ❌ failed · ⏭ skipped / not applicable (never counted as passed). Figures: "
                 "worst max abs difference (parity: output, present K/V and attention weights vs eager; "
                 "torch-mha is torch's own attention with the same weights; causality: earlier outputs, "
                 "weights and cache after changing later x; cache-consistency: fed with the cache vs one "
                 "call over the whole sequence); demonstration: weights[b, h, 1, 3], position 1's weight on "
                 "position 3 (causal: exactly 0; bidirectional: its smallest value, > 0).", ""]
    demo = [(rt, checks["demonstration"]) for rt, checks in report.results.items() if "demonstration" in checks]
    if demo:
        lines += ["Demonstration (the article's: does position 1 attend to position 3?):", ""]
        lines += [f"- {ICONS[r.status]} {md(rt)}: {md(r.message)}" for rt, r in demo]
        lines.append("")
    return lines


def _judged_lines(report: VerifyReport) -> list[str]:
    """What judged each runtime's element-wise comparisons (parity, causality, kv-consistency, padding,
    dynamic-shapes, a generation step's near-tie): the runtimes held to the same bounds by the same rule on one
    line."""
    groups = report.judged_groups()
    if not groups:
        return []
    return ["Judged by (an element fails past atol + rtol × its value):", ""] + [
        f"- {', '.join(md(rt) for rt in rts)}: |error| ≤ {_x(b.atol, 'g')} + {_x(b.rtol, 'g')} × |value| "
        f"({md(whose)})" for rts, b, whose in groups] + [""]


def _decoder_legend(cols: tuple[str, ...]) -> list[str]:
    return ["", "✅ passed · ❌ failed · ⏭ skipped / not applicable (never counted as passed). Figures: "
                "worst max abs difference (parity: vs eager; causality: earlier outputs after changing "
                "later tokens; kv-consistency: the largest of decode/chunked/recompute vs prefill and of cached "
                "decode out to the position shown; padding: padded vs unpadded); generation: matched greedy "
                "tokens after a short prompt and after a long one (its length shown)"
            + ("; quality: top-1 agreement and perplexity ratio on text (or the sweep's relative logit "
               "error); a lossy artifact's parity is n/a and its generation compares cached decode with its "
               "own recompute" if QUALITY in cols else "") + ".", ""]


def _details(report: VerifyReport, cols: tuple[str, ...]) -> list[str]:
    """Why the verdict is not passed, each runtime that did not run, each failed check, each check not run."""
    v = report.verdict
    notes = [f"- **verdict**: {md(v.message)}"] if v.status != "passed" else []
    for rt, info in report.runtimes.items():
        if info.status == "error":
            notes.append(f"- ❌ **{md(rt)}** cannot load its artifact: {md(info.reason)}")
        elif info.status != "ran":
            notes.append(f"- **{md(rt)}** {md(info.status)}: {md(info.reason)}")
    for rt, checks in report.results.items():
        for ch in cols:
            r = checks.get(ch)
            if r is not None and r.status is False:
                notes.append(f"- ❌ **{md(rt)} / {md(ch)}**: {md(r.message)}")
    for rt, checks in report.results.items():
        if report.runtimes.get(rt) and report.runtimes[rt].status != "ran":
            continue
        for ch in cols:
            r = checks.get(ch)
            if r is not None and r.status is None and r.counted:
                notes.append(f"- ⏭ {md(rt)} / {md(ch)}: {md(r.message)}")
    return ["### Details", ""] + notes + [""] if notes else []


def _table(runtimes: dict[str, RuntimeInfo], results: dict[str, dict[str, CheckResult]],
           cols: tuple[str, ...]) -> list[str]:
    """The runtimes x checks table's lines."""
    lines = ["| runtime | providers | " + " | ".join(md(c) for c in cols) + " |", "|---|---|" + "---|" * len(cols)]
    for rt, info in runtimes.items():
        if info.status == "ran":
            cells = [cell(results.get(rt, {}).get(ch)) for ch in cols]
        else:  # one cell says why; the checks did not run
            cells = ["❌ cannot load" if info.status == "error" else "⏭ skipped"] + ["—"] * (len(cols) - 1)
        prov = ", ".join(md(p.replace("ExecutionProvider", "")) for p in info.providers) or "—"
        if info.status == "skipped" and info.providers:
            prov = f"only {prov}"  # the session fell back: say what it ran on, not what was asked
        lines.append(f"| {md(rt)} | {prov} | " + " | ".join(cells) + " |")
    return lines


def _other_protocol_lines(report: VerifyReport, cols: tuple[str, ...]) -> list[str]:
    """An adopted file driven in the plain protocol as well as its producer's: a table of findings."""
    o = report.other_protocol
    if not o:
        return []
    lines = [f"### Under the plain protocol ({md(o.protocol)}): findings, not in the verdict", "",
             f"The file's producer drives it as {md(o.producer_protocol)}; the verdict above is on that protocol. "
             f"Here the same checks drive it as {md(o.protocol)}, as the contract and Optimum-style loops do: "
             "a failure says the file is correct only under its producer's protocol.", ""]
    lines += _table(o.runtimes, o.results, cols)
    notes = []
    for rt, info in o.runtimes.items():
        if info.status != "ran":
            notes.append(f"- **{md(rt)}** {md(info.status)}: {md(info.reason)}")
        for ch in cols:
            r = o.results.get(rt, {}).get(ch)
            if r is not None and r.status is False:
                notes.append(f"- ❌ **{md(rt)} / {md(ch)}**: {md(r.message)}")
    return lines + ([""] + notes if notes else []) + [""]


def _quality_lines(report: VerifyReport) -> list[str]:
    """The quality figures of each lossy runtime: sweep and text side by side with the thresholds."""
    rows = [(rt, checks[QUALITY]) for rt, checks in report.results.items()
            if QUALITY in checks and checks[QUALITY].status is not None]
    if not rows:
        return []
    from mhaexport.verify.quality import LABELS

    out = ["", "Quality against eager fp32 (lossy artifact; sweep: the verify sweep's real positions; text: "
               "sliding windows over real text; greedy: tokens until the first that differs):", "",
           "| runtime | scheme | figure | sweep | text | threshold |", "|---|---|---|---:|---:|---:|"]
    for rt, r in rows:
        f = r.figures
        sweep, text, lim = f.sweep or Scores(), f.text or Scores(), f.thresholds or Limits()
        for name in ("top1", "kl_mean", "kl_p99", "logit_err", "ppl_ratio"):
            at_least = name == "top1"
            limit = getattr(lim, name)
            bound = "—" if limit is None else f"{'≥' if at_least else '≤'} {_x(limit, 'g')}"
            out.append(f"| {md(rt)} | {md(f.scheme or '')} | {md(LABELS[name])} | {_fig(getattr(sweep, name))} | "
                       f"{_fig(getattr(text, name))} | {bound} |")
        if text.perplexity is not None:
            bpb = (f" ({_x(text.bits_per_byte, '.3f')} vs {_n(text.eager_bits_per_byte, '.3f')} bits/byte)"
                   if text.bits_per_byte is not None else "")
            out.append(f"| {md(rt)} | | perplexity (eager) | | {_x(text.perplexity, '.4g')} "
                       f"({_n(text.eager_perplexity, '.4g')}){bpb} | |")
        if (g := f.greedy) is not None:
            limit = lim.greedy
            bound = "—" if limit is None else f"≥ {_x(limit, 'g')} x {_x(g.tokens, 'd')}"
            out.append(f"| {md(rt)} | | greedy agreement (mean, min of {_x(g.prompts, 'd')} prompts) | | "
                       f"{_n(g.mean, '.3g')}, {_x(g.min, 'd')} of {_x(g.tokens, 'd')} | {bound} |")
        if text.skipped:
            out.append(f"| {md(rt)} | | text | | {md(text.skipped)} | |")
        for why in f.not_judged or []:
            out.append(f"| {md(rt)} | | not judged | | {md(why)} | |")
    return out


def _serving_lines(report: VerifyReport) -> list[str]:
    """The serving checks' noise figures per runtime (its difference, eager's floor, the allowance) and, where a run
    diverged, each run's first divergence from the run it is held to."""
    out = []
    for rt, checks in report.results.items():
        for ch in SERVING_CHECKS:
            r = checks.get(ch)
            if r is None or r.status is None and not r.figures.runs:
                continue
            f = r.figures
            floor = ("the floor the others are judged by" if rt == "eager" else
                     f"eager's floor {_n(f.floor, '.3g')}")
            noise = (f"max abs {_n(f.max_abs, '.3g')} ({floor}, rounding {_n(f.rounding, '.3g')}, allowed "
                     f"{_n(f.allowed, '.3g')})" if f.max_abs is not None else
                     f"tokens only ({md(f.engine or 'its loop')})")
            out.append(f"- {ICONS[r.status]} **{md(rt)} / {md(ch)}**: {_x(len(f.runs or []), 'd')} runs, {noise}")
            for run in f.runs or []:
                d = run.get("first_divergence")
                if d is not None or run.get("refused"):
                    where = (f"refused: {md(run['refused'])}" if run.get("refused") else
                             f"first diverges at token {md(d)} (margin {_run_figure(run.get('margin'))}"
                             f"{', a near-tie' if run.get('tie') else ''}, max abs "
                             f"{_run_figure(run.get('max_abs'))})")
                    out.append(f"  - {md(run.get('run', '?'))} ({md(run.get('prompt', '?'))}-token prompt): {where}")
    return ["### Serving: each request against its run alone", ""] + out + [""] if out else []


def _run_figure(v: object) -> str:
    """A serving run's figure (a report read back may hold anything there): the one formatter's text, else "—"."""
    return _x(v, ".3g") if isinstance(v, (int, float)) and not isinstance(v, bool) else "—"


def _headroom_lines(report: VerifyReport) -> list[str]:
    """The half-precision headroom per layer (one table: every runtime of the file shows the same result)."""
    r = next((checks[HEADROOM] for checks in report.results.values()
              if HEADROOM in checks and checks[HEADROOM].status is not None and checks[HEADROOM].figures.layers), None)
    if r is None:
        return []
    f = r.figures
    out = ["", f"Headroom of the {md(f.dtype)} file: eager float32's largest |activation| per layer ({md(f.inputs)}), "
               "float16's "
               "range over it (below 1: inf in float16) and bfloat16's step at it:", "",
           "| layer | module | peak | float16 margin | bfloat16 step |", "|---|---|---:|---:|---:|"]
    for row in f.layers or []:
        margin = finite(row.float16_margin)
        flag = " ❌" if margin is not None and margin < 1 else ""
        out.append(f"| {md(row.layer)} | {md(row.module)} | {_n(row.peak, '.4g')} | "
                   f"{_n(row.float16_margin, '.3g')}{flag} | {_n(row.bfloat16_step, '.3g')} |")
    return out


def cell(r: CheckResult | None) -> str:
    """One check's table cell: its icon and the figure that says most (``ref``, ``⏭ n/a (lossy)`` where not run)."""
    if r is None:
        return "—"
    icon = ICONS[r.status]
    f = r.figures
    if r.status is None:
        flag = f.not_a_check or ("static" if f.static else None)
        return _NOT_RUN.get(flag, f"{icon} skipped")
    figure = ""
    if r.check == "parity":
        figure = f"{_x(f.errors, 'd')} errors" if f.errors else _x(f.max_abs, ".1e")
    elif r.check == "finite":
        figure = f"{_x(f.cases, 'd') if f.cases is not None else ''} shapes"
    elif r.check == "causality":
        figure = _x(f.max_abs_earlier, ".1e")
    elif r.check == "cache-consistency":
        figure = _x(_worst(f.decode_max_abs, f.chunked_max_abs), ".1e")
    elif r.check == "demonstration":
        figure = (f"w[1,3]={_x(f.weight_1_3_max or 0, 'g')}" if f.mask == "causal"
                  else f"w[1,3]≥{_x(f.weight_1_3_min or 0, '.2g')}")
    elif r.check == "kv-consistency":
        figure = (f"max {_x(f.worst, '.1e')}" if f.worst is not None else "—") + (f", out to pos {_x(f.long_to, 'd')}" if f.long_to is not None else "")
    elif r.check == "padding":
        figure = _x(f.worst, ".1e")
    elif r.check == "dynamic-shapes" and f.baked_axes is not None:
        figure = "baked"
    elif r.check == "dynamic-shapes":
        figure = f"{_x((f.shapes or 0) - (f.failed_shapes or 0), 'd')}/{_x(f.shapes or 0, 'd')} shapes"
    elif r.check == QUALITY:
        t, sw = f.text or Scores(), f.sweep or Scores()
        if t.positions:
            figure = f"top-1 {_n(t.top1, '.3f')}, ppl x{_n(t.ppl_ratio, '.4g')}"
        elif sw.positions:
            figure = f"logit err {_n(sw.logit_err, '.2g')}"
    elif r.check in SERVING_CHECKS:
        figure = _x(f.max_abs, ".1e") if f.max_abs is not None else f"{_x(len(f.runs or []), 'd')} runs"
    elif r.check == HEADROOM:
        at = f.float16_overflow or f.layer
        figure = (f"{md(f.module)} past 65,504" if f.float16_overflow and f.dtype == "float16" else
                  f"peak {_n(f.peak, '.3g')} ({md(at)}), x{_n(f.float16_margin, '.2g')}")
    elif r.check == "generation":
        figure = f"{_x(f.matched or 0, 'd')}/{_x(f.tokens or 0, 'd')} tokens" + (" (tie)" if f.tie else "")
        if f.long_prompt is not None:
            figure += f", {_x(f.long_matched or 0, 'd')}/{_x(f.long_tokens or 0, 'd')} after {_x(f.long_prompt, 'd')}"
    if not f and r.message:
        figure = "error"
    return f"{icon} {figure}".strip()


def _fig(x: float | None) -> str:
    return _x(x, ".4g")


def _x(v: object, spec: str) -> str:
    """A figure in a cell: "—" where the report has none, else the one formatter's text (NaN, inf, any size), as
    Markdown text."""
    return "—" if v is None else md(number(v, spec))


def _worst(*values: float | None) -> float:
    """The largest of figures, NaN the largest of all (``max`` would keep whichever came first)."""
    vals = [v for v in values if v is not None]
    return next((v for v in vals if v != v), max(vals, default=0.0))


def write_report(report: VerifyReport, folder: str | Path, name: str | None = None,
                 sections: tuple[str, ...] = ()) -> tuple[Path, Path, Path]:
    """Write NAME.json, NAME.md and NAME.html into folder (atomically); ``name`` defaults to the report's
    :meth:`~VerifyReport.default_name`, so a subset run never overwrites the full report. ``sections``: Markdown
    sections other commands own (bench's, rendered from bench.json by its own renderer), appended to report.md. Every
    file is made from records: nothing of an earlier report.md in the folder is read or carried over (an output
    folder's files are input too: a crafted one would otherwise reach the new report). Returns the three paths."""
    folder = ensure_writable_dir(folder)
    name = name or report.default_name()
    atomic_write_json(folder / f"{name}.json", report.to_dict())
    text = markdown(report) + "".join(f"\n{section}\n" for section in sections)
    atomic_write_bytes(folder / f"{name}.md", text.encode())
    write_html(report, folder / f"{name}.html", cell)  # report.html beside them (verify/html.py)
    return folder / f"{name}.json", folder / f"{name}.md", folder / f"{name}.html"
