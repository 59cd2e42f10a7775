"""A bench result on paper: bench.json, bench.md, bench.html, bench.png and bench-scaling.png (matplotlib optional), the
delimited section of the export folder's report.md, and the terminal summary. Nothing here measures or prints."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from mhaexport.core.numbers import number
from mhaexport.artifact import atomic_write_bytes, atomic_write_json
from mhaexport.bench.html import row_colours, write_html
from mhaexport.bench.result import BenchResult
from mhaexport.bench.targets import TARGETS, describe_conditions
from mhaexport.core.untrusted import md, shown

REPORT_BEGIN, REPORT_END = "<!-- bench -->", "<!-- /bench -->"



def mpl_text(value: object) -> str:
    """Text from outside as matplotlib draws it (bench.png's sink): :func:`shown`, every ``$`` escaped (a pair of them
    would start mathtext, whose parser raises on what it cannot read), numbers through the one formatter."""
    from mhaexport.core.numbers import is_real

    return (number(value, "g") if is_real(value) else shown(value)).replace("$", r"\$")


def _save_png(fig, path) -> None:
    """The figure as a PNG written atomically (a temporary file renamed over ``path``: a link there is replaced,
    never written through)."""
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    atomic_write_bytes(path, buf.getvalue())

def _num(x: object, spec: str) -> str:
    """A figure in bench.md: the one formatter's text, as Markdown text."""
    return md(number(x, spec))


def _f(x: float | None, nd: int = 2) -> str:
    return "-" if x is None else _num(x, f".{nd}f")


def _div(a: float, b: float) -> float:
    """a / b, NaN where b is 0 (a figure read back may be anything: a renderer never raises)."""
    return a / b if b else float("nan")


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{_num(x * 100, '.0f')} %"


def runtimes_table(res: BenchResult) -> str:
    """One line per row: load, warm-ups, prefill, TTFT, per-token p50 / p90 / min, spread, tokens/s."""
    cfg = res.config
    rows = [(f"batch {md(cfg.batch)}, prompt {md(cfg.prompt_len)}, {md(cfg.new_tokens)} new tokens, "
             f"{md(cfg.threads)} threads, greedy; times in ms (medians over {md(cfg.repeats)} timed repeats, "
             "round-robin; token latency over all decode steps). warm-ups: untimed generations until two in a row "
             f"agreed within {_num(cfg.steady_within * 100, '.0f')} % (at most {md(cfg.max_warmups)}). spread: the "
             "larger of p90 / p50 and p50 / p10 of per-token latency with its growth with position taken out; "
             "repeats apart: (slowest - fastest) / median of the repeats' medians."), "",
            "| runtime | providers | load | warm-ups | prefill | TTFT | token p50 | token p90 | token min | spread | "
            "repeats apart | tokens/s |",
            "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in res.runtimes:
        if not r.ran:
            rows.append(f"| {md(r.label)} | skipped: {md(r.reason)} | | | | | | | | | | |")
            continue
        warm = md(r.warmups) if r.steady else f"{md(r.warmups)}, not steady"
        p50 = _f(r.token_p50_ms)
        if r.session_p50_ms and len(r.session_p50_ms) > 1:  # --sessions: the median of the sessions' p50s
            p50 += (f" ({md(len(r.session_p50_ms))} sessions: {_f(min(r.session_p50_ms))}-"
                    f"{_f(max(r.session_p50_ms))})")
        rows.append(f"| {md(r.label)} | {md(', '.join(r.providers))} | {_f(r.load_ms, 0)} | {warm} | {_f(r.prefill_ms)} | "
                    f"{_f(r.ttft_ms)} | {p50} | {_f(r.token_p90_ms)} | {_f(r.token_min_ms)} | "
                    f"{_f(r.token_spread)} | {_pct(r.repeat_spread)} | {_f(r.tokens_per_s, 1)} |")
    return "\n".join(rows)


def loop_text(res: BenchResult) -> str:
    """mhaexport's decode loop against onnxruntime-genai's on the same file: the ratio of their token p50s and how
    many sessions each figure is the median of."""
    lp = res.loop
    threads = f"{md(lp.threads)} thread{'s' if lp.threads != 1 else ''} each" if lp.threads else "threads as the run's"
    if lp.sessions > 1:
        ours = ", ".join(_f(m) for m in lp.ours_sessions_ms)
        how = (f"each the median of {md(lp.sessions)} sessions' p50s — ours {ours}, onnxruntime-genai's "
               f"{', '.join(_f(m) for m in lp.genai_sessions_ms)} ms")
    else:
        how = ("one session each: identical sessions of one file can decode at different speeds, so this ratio "
               "also holds the two sessions' difference; --sessions 3 times each loop over three")
    return (f"mhaexport's decode loop ({md(lp.ours)}, the deploy runtime's) / onnxruntime-genai's loop ({md(lp.genai)}) "
            f"on the same file: {_f(lp.ours_ms)} / {_f(lp.genai_ms)} ms per token = **{_num(lp.ratio, '.3f')} x** "
            f"({how}; {threads}).")


def lowerings_table(res: BenchResult) -> str:
    """The lowerings side by side: which is fastest per provider and by how much, and how cost grows with position."""
    far = {lw.far for lw in res.lowerings if lw.far is not None}
    near = {lw.near for lw in res.lowerings if lw.near is not None}
    at_near = f"at {md(near.pop())}" if len(near) == 1 else "near"
    at_far = f"at {md(far.pop())}" if len(far) == 1 else "far"
    rows = [("Lowerings (ONNX Runtime rows of this run; token p50 over the interleaved repeats, x fastest = p50 / "
             "the fastest p50 on the same provider; position latencies from the long runs, median of positions +-8):"),
            "",
            f"| lowering | provider | token p50 | x fastest | {at_near} | {at_far} | {at_far} / {at_near} |",
            "| --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    for lw in res.lowerings:
        rows.append(f"| {md(lw.label)} | {md(lw.provider)} | {_f(lw.token_p50_ms)} | {_f(lw.vs_fastest)} | "
                    f"{_f(lw.near_ms)} | {_f(lw.far_ms)} | {_f(lw.far_over_near)} |")
    return "\n".join(rows)


def quantized_table(res: BenchResult) -> str:
    """Quantized exports beside the float ones: weight bytes per token, token p50, and both against the float
    model (its weight-bandwidth floor and its ORT row on the same provider)."""
    rows = [r for r in res.runtimes if r.ran and r.lowering is not None and r.opt_level is None]
    out = [(f"Quantized and float exports side by side (ONNX Runtime rows of this run; weights read per token "
            f"counted from each graph; x float floor = token p50 / the float model's weight-bandwidth floor, "
            f"{_num(res.floor_ms, '.2f')} ms; x float p50 = token p50 / the float export's on the same provider):"), "",
           "| row | weights | MB read per token | x float bytes | token p50 | x float floor | x float p50 |",
           "| --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        floats = [f.token_p50_ms for f in rows if f.quantization is None and f.providers[:1] == r.providers[:1]
                  and f.token_p50_ms]
        mb = r.weight_bytes_per_token or res.weight_bytes_per_token
        out.append(f"| {md(r.label)} | {md(r.quant_label or 'float')} | {_num(mb / 1e6, '.1f')} | "
                   f"{_num(_div(mb, res.weight_bytes_per_token), '.3f')} | {_f(r.token_p50_ms)} | {_f(r.floor_ratio)} | "
                   f"{_f(r.token_p50_ms / min(floats) if floats and r.token_p50_ms else None)} |")
    return "\n".join(out)


def _ratio(x: float | None, base: float | None) -> str:
    return f" (x {_num(x / base, '.2f')})" if x is not None and base else ""


def scaling_tables(res: BenchResult) -> str:
    """How cost grows: per ONNX Runtime row, per-token p50 and tokens/s at each batch (x: tokens/s / at the
    smallest batch) and TTFT at each prompt length (x: TTFT / at the shortest prompt); a point a row could not take
    says why."""
    cfg = res.config
    threads = f"{md(cfg.threads)} thread{'s' if cfg.threads != 1 else ''}"
    out = [(f"How cost grows (ONNX Runtime rows of this run, after the main rounds; per point one untimed "
            f"generation of every row, then {md(cfg.repeats)} timed round(s) round-robin, medians; {threads}, "
            "greedy):")]

    def table(key: str, x: str, intro: str, cell) -> list[str]:
        points = [getattr(pt, x) for pt in getattr(res.scaling[0], key)]
        # a point every row skipped for one reason (the model's limit) is said once, under the table
        common = {}
        for j, at in enumerate(points):
            reasons = {getattr(entry, key)[j].reason for entry in res.scaling}
            if len(reasons) == 1 and None not in reasons:
                common[at] = reasons.pop()
        lines = ["", intro, "", "| row | " + " | ".join(f"{md(x)} {md(at)}" for at in points) + " |",
                 "| --- |" + " ---: |" * len(points)]
        for entry in res.scaling:
            base = getattr(entry, key)[0]
            cells = [("skipped" if getattr(pt, x) in common else f"skipped: {md(pt.reason)}") if pt.reason else
                     cell(pt, None if pt is base or base.reason else base) for pt in getattr(entry, key)]
            lines.append(f"| {md(entry.label)} | " + " | ".join(cells) + " |")
        for why in dict.fromkeys(common.values()):
            lines += ["", f"{', '.join(f'{md(x)} {md(at)}' for at, w in common.items() if w == why)}: skipped for every "
                          f"row, {md(why)}."]
        return lines

    if res.scaling and res.scaling[0].batches:
        b0 = res.scaling[0].batches[0].batch
        out += table("batches", "batch", (
            f"Per-token latency (p50 of every decode step, ms) and tokens/s (batch x {md(cfg.new_tokens)} new tokens "
            f"/ (TTFT + decode)) at each batch of {md(cfg.prompt_len)}-token prompts; x batch {md(b0)} = tokens/s / "
            f"tokens/s at batch {md(b0)}:"),
            lambda pt, base: (f"{_f(pt.token_p50_ms)} ms, {_f(pt.tokens_per_s, 1)} tokens/s"
                              + (_ratio(pt.tokens_per_s, base.tokens_per_s) if base else "")))
    if res.scaling and res.scaling[0].prompts:
        p0 = res.scaling[0].prompts[0].prompt
        out += table("prompts", "prompt", (
            f"Time to first token (prefill + choosing it, ms) at batch 1 for each prompt length; x prompt {md(p0)} = "
            f"TTFT / TTFT at prompt {md(p0)}:"),
            lambda pt, base: f"{_f(pt.ttft_ms)} ms" + (_ratio(pt.ttft_ms, base.ttft_ms) if base else ""))
    return "\n".join(out)


def serving_tables(res: BenchResult) -> str:
    """Serving (--serving): continuous batching's tokens/s at each number of rows against the plain loop, and
    speculative decoding against plain greedy per prompt (bench.serving)."""
    sv, cfg = res.serving, res.config
    threads = f"{md(cfg.threads)} thread{'s' if cfg.threads != 1 else ''}"
    out = [(f"Serving on {md(sv.row)} (after the main rounds; one untimed round, then {md(cfg.repeats)} timed "
            f"round(s), interleaved, medians; {threads}, greedy): {md(sv.requests)} requests waiting at the start "
            f"(prompts of {md(max(1, cfg.prompt_len // 4))}..{md(cfg.prompt_len)} tokens, {md(sv.tokens)} new tokens "
            f"in all); the plain loop serves them one at a time at {_f(sv.plain_tokens_per_s, 1)} tokens/s."), "",
           "| continuous batching | tokens/s | x plain loop |", "| --- | ---: | ---: |"]
    out += [f"| {md(p.rows)} row{'s' if p.rows != 1 else ''} | {_f(p.tokens_per_s, 1)} | {_f(p.ratio)} |"
            for p in sv.batching]
    if sv.speculative:
        out += ["", "| speculative decoding (prompt lookup, 4 drafts) | plain tokens/s | tokens/s | x plain | "
                    "drafts accepted | tokens per call |", "| --- | ---: | ---: | ---: | ---: | ---: |"]
        out += [f"| {md(p.prompt)} prompt ({md(p.tokens)} tokens) | {_f(p.plain_tokens_per_s, 1)} | "
                f"{_f(p.tokens_per_s, 1)} | {_f(p.ratio)} | {_f(p.acceptance)} | {_f(p.tokens_per_call)} |"
                for p in sv.speculative]
    tokens = "the same as the plain loop's" if sv.same_tokens and all(p.same_tokens for p in sv.speculative) else \
        "**not** the same as the plain loop's (see the notes)"
    out += ["", f"Every serving run's tokens: {tokens}."]
    return "\n".join(out)


def floor_text(res: BenchResult) -> str:
    """The bandwidth and the floor, naming the probe that set it and the thread count it read with."""
    bw = res.bandwidth
    probes = ", ".join(f"{md(k)} {_num(v, '.2f')} GB/s" + (" counting read + write" if k == "copy" else "")
                       for k, v in bw.probes.items())
    threads = f"{md(bw.threads)} thread{'s' if bw.threads != 1 else ''}"
    caveat = floor_caveat(res)  # Markdown made of md()
    return (f"Memory read bandwidth: **{_num(res.bandwidth_gbps, '.2f')} GB/s**, the fastest of the probes ({probes}; "
            f"{md(bw.method)}, {threads}, {md(bw.mbytes)} MiB, medians). Weights read per token: "
            f"{_num(res.weight_bytes_per_token / 1e6, '.1f')} MB. Weight-bandwidth floor: **{_num(res.floor_ms, '.2f')} ms/token** "
            f"(set by the {md(bw.probe)} probe on {threads}).{caveat}")


def floor_caveat(res: BenchResult) -> str:
    """Why a row beats the floor (its weights come from the CPU's cache, not memory), or "" when none does."""
    below = res.below_floor
    if not below:
        return ""
    rows = ", ".join(f"{md(r.label)} {_f(r.token_p50_ms)} ms" for r in below)
    return (f" Token p50 below it ({rows}): the {_num(res.weight_bytes_per_token / 1e6, '.1f')} MB of weights fit "
            "in the CPU's cache and are not read from memory every step, so for this model it is no floor.")


def targets_table(res: BenchResult) -> str:
    """The speed targets with their verdicts (yes / no / not measured / spread too wide: no verdict); a target set for
    other run conditions than this run's shows its figure, marked as not a verdict."""
    conditions = "; ".join(dict.fromkeys(describe_conditions(t.conditions) for t in TARGETS))
    max_spread = res.config.max_spread
    rows = [f"Speed targets (set for {md(conditions)}; a verdict only where every timed row a target reads has spread "
            f"<= {_num(max_spread, 'g')}; where this run's conditions differ from a target's, its figure is shown, not a "
            "verdict):", "", "| target | measured | limit | met |", "| --- | ---: | ---: | --- |"]
    for t in res.targets:
        verdict = "**no**" if t.verdict == "no" else md(t.verdict)
        if not t.applies and t.met is not None:
            verdict = f"{md(t.verdict)} (other run conditions: a figure, not a verdict)"
        limit = f"{'<=' if t.direction == 'at most' else '>='} {_num(t.limit, 'g')}"
        rows.append(f"| {md(t.target)} ({md(t.detail)}) | {_f(t.measured)} | {limit} | {verdict} |")
    return "\n".join(rows)


def markdown_body(res: BenchResult, plot_note: str | None = None, scaling_note: str | None = None) -> str:
    """The bench section in markdown; ``plot_note`` (the bench.png link, or why there is none) ends it;
    ``scaling_note`` (the bench-scaling.png link) follows the how-cost-grows tables."""
    parts = [runtimes_table(res), "", floor_text(res)]
    if res.loop:
        parts += ["", loop_text(res)]
    for lr in res.long_runs:
        at = ", ".join(f"{md(p)}: {_f(v)} ms" for p, v in lr.at.items())
        read = lr.bytes_at or {}
        near, far = str(lr.near), str(lr.far)
        grow = (f"; bytes a step reads at least (weights + the cache so far) at {md(far)} / at {md(near)}: "
                f"{_num(_div(read[far], read[near]), '.2f')}" if near in read and far in read and near != far
                else "")
        parts.append(f"\n{md(lr.label)}: per-token latency against position (median of positions +-8), "
                     f"{md(lr.repeats)} run(s) to position {md(lr.positions[-1] + 1 if lr.positions else 0)}: {at}; spread "
                     f"{_f(lr.spread)}{grow}.")
    if len(res.lowerings) > 1:
        parts += ["", lowerings_table(res)]
    if any(r.quantization for r in res.runtimes):
        parts += ["", quantized_table(res)]
    if res.scaling:
        parts += ["", scaling_tables(res)]
        if scaling_note:
            parts.append(f"\n{scaling_note}")
    if res.serving is not None:
        parts += ["", serving_tables(res)]
    if res.targets:  # the project's speed targets, when the run asked for them (--targets)
        parts += ["", targets_table(res)]
    if res.profile:
        ops = ", ".join(f"{md(o.op)} {_num(o.share * 100, '.0f')}%" for o in res.profile.ops[:8])
        where = md(res.profile.file or "not kept: give -o DIR to keep the trace there")
        parts.append(f"\nONNX Runtime profile of one ORT CPU generation ({where}): {ops}.")
    for n in res.notes:
        parts.append(f"\nNote: {md(n)}.")
    if plot_note:
        parts.append(f"\n{plot_note}")
    return "\n".join(parts)


def _smooth(positions: list[int], ms: list[float], half: int = 8) -> list[float]:
    """The median of each point's +-``half`` positions: the trend a reader follows, without the per-step noise."""
    import statistics

    return [statistics.median(v for q, v in zip(positions, ms) if abs(q - p) <= half) for p in positions]


def plot(res: BenchResult, path: Path) -> str | None:
    """bench.png, readable at a glance: left, each row's per-token latency as its median (dot) with the spread of
    its decode steps (bar from p10 to p90), the weight-bandwidth floor as a line; right, per-token latency against
    position (each row's median over repeats, smoothed over +-8 positions; a long run dashed in its row's colour).
    One colour per row in both panels, named on the left panel's axis; the legend sits below the plots, over no
    data. None if matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import FuncFormatter, LogLocator
    except ImportError:
        return None
    ran = [r for r in res.runtimes if r.ran and r.token_p50_ms]
    colours = row_colours(res)
    fig, (bars, lines) = plt.subplots(1, 2, figsize=(11, 0.9 + 0.45 * max(len(ran), 4) + 1.2),
                                      gridspec_kw={"width_ratios": [1, 1.3]})
    for y, r in enumerate(ran):
        lo = r.token_p10_ms if r.token_p10_ms is not None else r.token_min_ms
        hi = r.token_p90_ms if r.token_p90_ms is not None else r.token_p50_ms
        c = colours[r.label]
        bars.plot([lo, hi], [y, y], color=c, linewidth=3, alpha=0.45, solid_capstyle="round")
        bars.plot([r.token_p50_ms], [y], "o", color=c, markersize=7)
        bars.annotate(f"{number(r.token_p50_ms, '.2f')}", (r.token_p50_ms, y), textcoords="offset points", xytext=(0, 7),
                      ha="center", fontsize=7)
    bars.set_yticks(range(len(ran)), [mpl_text(r.label) for r in ran], fontsize=8)
    for tick, r in zip(bars.get_yticklabels(), ran):
        tick.set_color(colours[r.label])
    bars.set_ylim(len(ran) - 0.5, -0.7)  # the table's order, top to bottom
    bars.axvline(res.floor_ms, color="grey", linestyle="--", linewidth=0.9)
    bars.set_xlabel("ms per token: median (dot), p10-p90 of the decode steps (bar)", fontsize=8)
    bars.grid(True, axis="x", alpha=0.3)
    for r in ran:
        if r.per_position_ms:
            lines.plot(r.positions, _smooth(r.positions, r.per_position_ms), color=colours[r.label], linewidth=1.4,
                       label=mpl_text(r.label))
    for lr in res.long_runs:
        lines.plot(lr.positions, _smooth(lr.positions, lr.ms), color=colours[lr.label], linewidth=1.2,
                   linestyle="--", label=f"{mpl_text(lr.label)}, long run")
    floor = "weights at memory bandwidth (they fit in cache: no floor)" if res.below_floor else \
        "weight-bandwidth floor"
    lines.axhline(res.floor_ms, color="grey", linestyle="--", linewidth=0.9,
                  label=f"{floor} {number(res.floor_ms, '.2f')} ms ({mpl_text(res.floor_probe)}, {mpl_text(res.floor_threads)} "
                        f"thread{'s' if res.floor_threads != 1 else ''})")
    lines.set_xlabel("position of the token fed", fontsize=8)
    lines.set_ylabel("ms per token (median of repeats, +-8 positions)", fontsize=8)
    lines.grid(True, alpha=0.3)
    values = [v for r in ran for v in (r.token_p10_ms or r.token_min_ms, r.token_p90_ms) if v] + [res.floor_ms]
    if values and max(values) / max(min(values), 1e-9) > 8:  # rows a decade apart: log axes, in plain numbers
        bars.set_xscale("log")
        lines.set_yscale("log")
        for axis in (bars.xaxis, lines.yaxis):
            axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0), numticks=7))
            axis.set_major_formatter(FuncFormatter(lambda v, _: f"{number(v, 'g')}"))
            axis.set_minor_formatter(plt.NullFormatter())
    else:
        bars.set_xlim(left=0)
        lines.set_ylim(bottom=0)
    handles, names = lines.get_legend_handles_labels()
    cfg = res.config
    fig.suptitle(f"decode latency: {mpl_text(res.model.spec)} (batch {mpl_text(cfg.batch)}, prompt {mpl_text(cfg.prompt_len)}, "
                 f"{mpl_text(cfg.new_tokens)} new tokens, {mpl_text(cfg.threads)} threads)", fontsize=10)
    fig.legend(handles, names, loc="lower center", ncol=min(3, max(1, len(names))), fontsize=7, frameon=False)
    rows_of_legend = -(-len(names) // 3)
    fig.tight_layout(rect=(0, 0.04 + 0.035 * rows_of_legend, 1, 1), w_pad=3)
    _save_png(fig, path)
    plt.close(fig)
    return str(path)


SCALING_PNG = "bench-scaling.png"


def plot_scaling(res: BenchResult, path: Path) -> str | None:
    """bench-scaling.png: per-token latency and tokens/s against the batch, TTFT against the prompt's length, one
    line per row (log x axes; a panel only where its points were asked). None if no matplotlib or nothing to draw."""
    batches = bool(res.scaling and res.scaling[0].batches)
    prompts = bool(res.scaling and res.scaling[0].prompts)
    if not (batches or prompts):
        return None
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import ScalarFormatter
    except ImportError:
        return None
    panels = [(k, x, y, label) for k, x, y, label, on in (
        ("batches", "batch", "token_p50_ms", "ms per token (p50)", batches),
        ("batches", "batch", "tokens_per_s", "tokens/s", batches),
        ("prompts", "prompt", "ttft_ms", "time to first token, ms (batch 1)", prompts)) if on]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 4.2), squeeze=False)
    colours = row_colours(res)
    for ax, (key, x, y, ylabel) in zip(axes[0], panels):
        ticks = set()  # the points some row measured (a point skipped for every row widens nothing)
        for entry in res.scaling:
            pts = [(getattr(pt, x), getattr(pt, y)) for pt in getattr(entry, key) if getattr(pt, y) is not None]
            if pts:
                ax.plot(*zip(*pts), marker="o", linewidth=1, label=mpl_text(entry.label), color=colours[entry.label])
                ticks.update(p for p, _ in pts)
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted(ticks), [str(t) for t in sorted(ticks)])
        ax.minorticks_off()
        ax.set_xlabel("batch size" if x == "batch" else "prompt length (tokens)")
        ax.set_ylabel(ylabel)
        if y != "tokens_per_s":  # latencies: log, in plain numbers
            ax.set_yscale("log")
            ax.yaxis.set_major_formatter(ScalarFormatter())
            ax.yaxis.set_minor_formatter(ScalarFormatter())
        ax.grid(True, alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.suptitle(f"how cost grows: {mpl_text(res.model.spec)}", fontsize=10)
    fig.tight_layout()
    _save_png(fig, path)
    plt.close(fig)
    return str(path)


def write_bench(res: BenchResult, out_dir: str | Path) -> list[Path]:
    """bench.json, bench.md, bench.png and, when the run timed how cost grows, bench-scaling.png (both when
    matplotlib is installed); refresh the bench section of report.md when the folder has one. Returns the paths
    written."""
    from mhaexport.artifact.files import refuse_link

    out_dir = refuse_link(out_dir, "bench output folder")  # never written through a link
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    plot(res, out_dir / "bench.png")
    plot_scaling(res, out_dir / SCALING_PNG)
    note, scaling_note = plot_notes(out_dir)
    png = str(out_dir / "bench.png") if note.startswith("!") else None
    scaling_png = str(out_dir / SCALING_PNG) if scaling_note else None
    atomic_write_json(out_dir / "bench.json", res.to_dict())
    written.append(out_dir / "bench.json")
    text = f"# Bench: {md(res.model.spec)}\n\n{md(res.environment.date)}, {md(res.environment.cpu)}\n\n" \
           f"{markdown_body(res, note, scaling_note)}\n"
    atomic_write_bytes(out_dir / "bench.md", text.encode())
    written.append(out_dir / "bench.md")
    written.append(write_html(res, out_dir / "bench.html"))  # bench.html beside them (bench/html.py)
    if png:
        written.append(Path(png))
    if scaling_png:
        written.append(Path(scaling_png))
    if update_report(out_dir, res, note, scaling_note):
        written.append(out_dir / "report.md")
    return written


def report_section(res: BenchResult, plot_note: str | None = None, scaling_note: str | None = None) -> str:
    """The bench section of report.md (between its markers), rendered from the result."""
    return f"{REPORT_BEGIN}\n## Bench\n\n{markdown_body(res, plot_note, scaling_note)}\n{REPORT_END}"


def plot_notes(folder: Path) -> tuple[str, str | None]:
    """The bench.png and bench-scaling.png links of report.md / bench.md where those plots are in ``folder`` (regular
    files, not links), or why there is no plot."""
    def there(name: str) -> bool:
        try:
            return stat.S_ISREG(os.lstat(folder / name).st_mode)
        except OSError:
            return False

    note = ("![per-token latency against position](bench.png)" if there("bench.png") else
            "No plot: matplotlib is not installed (`pip install 'mhaexport[plot]'`).")
    scaling = (f"![how cost grows: per-token latency and tokens/s against the batch, TTFT against the prompt]"
               f"({SCALING_PNG})" if there(SCALING_PNG) else None)
    return note, scaling


def update_report(folder: Path, res: BenchResult, plot_note: str | None = None,
                  scaling_note: str | None = None) -> bool:
    """report.md of ``folder`` made again with this bench section, when the folder holds a verify report: from its
    report.json (read by the confined reader and parsed as a record: nothing of the old report.md is read, so a crafted
    one carries nothing over), rendered by verify's renderer, this section after it. Returns whether it was written
    (False: no report.json, or one that is not a verify report)."""
    from mhaexport.core.errors import MhaExportError
    from mhaexport.verify.render import markdown
    from mhaexport.verify.report import read_report_in

    try:
        report = read_report_in(folder, "report.json")
    except MhaExportError:
        return False
    if report is None:
        return False
    text = markdown(report) + f"\n{report_section(res, plot_note, scaling_note)}\n"
    atomic_write_bytes(Path(folder) / "report.md", text.encode())
    return True
