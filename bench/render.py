"""A bench result on paper: bench.json, bench.md, bench.html, bench.png and bench-scaling.png (matplotlib optional), the
delimited section of the export folder's report.md, and the terminal summary. Nothing here measures or prints."""

from __future__ import annotations

import re
from pathlib import Path

from mhaexport.core.numbers import number
from mhaexport.artifact import atomic_write_bytes, atomic_write_json
from mhaexport.bench.html import write_html
from mhaexport.bench.result import BenchResult
from mhaexport.bench.targets import TARGETS, describe_conditions
from mhaexport.core.untrusted import shown

REPORT_BEGIN, REPORT_END = "<!-- bench -->", "<!-- /bench -->"



def _save_png(fig, path) -> None:
    """The figure as a PNG written atomically (a temporary file renamed over ``path``: a link there is replaced,
    never written through)."""
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    atomic_write_bytes(path, buf.getvalue())

def _f(x: float | None, nd: int = 2) -> str:
    return "-" if x is None else number(x, f".{nd}f")


def _div(a: float, b: float) -> float:
    """a / b, NaN where b is 0 (a figure read back may be anything: a renderer never raises)."""
    return a / b if b else float("nan")


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{number(x * 100, '.0f')} %"


def runtimes_table(res: BenchResult) -> str:
    """One line per row: load, warm-ups, prefill, TTFT, per-token p50 / p90 / min, spread, tokens/s."""
    cfg = res.config
    rows = [(f"batch {cfg.batch}, prompt {cfg.prompt_len}, {cfg.new_tokens} new tokens, "
             f"{cfg.threads} threads, greedy; times in ms (medians over {cfg.repeats} timed repeats, "
             "round-robin; token latency over all decode steps). warm-ups: untimed generations until two in a row "
             f"agreed within {number(cfg.steady_within * 100, '.0f')} % (at most {cfg.max_warmups}). spread: the "
             "larger of p90 / p50 and p50 / p10 of per-token latency with its growth with position taken out; "
             "repeats apart: (slowest - fastest) / median of the repeats' medians."), "",
            "| runtime | providers | load | warm-ups | prefill | TTFT | token p50 | token p90 | token min | spread | "
            "repeats apart | tokens/s |",
            "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in res.runtimes:
        if not r.ran:
            rows.append(f"| {r.label} | skipped: {r.reason} | | | | | | | | | | |")
            continue
        warm = f"{r.warmups}" if r.steady else f"{r.warmups}, not steady"
        p50 = _f(r.token_p50_ms)
        if r.session_p50_ms and len(r.session_p50_ms) > 1:  # --sessions: the median of the sessions' p50s
            p50 += (f" ({len(r.session_p50_ms)} sessions: {_f(min(r.session_p50_ms))}-"
                    f"{_f(max(r.session_p50_ms))})")
        rows.append(f"| {r.label} | {', '.join(r.providers)} | {_f(r.load_ms, 0)} | {warm} | {_f(r.prefill_ms)} | "
                    f"{_f(r.ttft_ms)} | {p50} | {_f(r.token_p90_ms)} | {_f(r.token_min_ms)} | "
                    f"{_f(r.token_spread)} | {_pct(r.repeat_spread)} | {_f(r.tokens_per_s, 1)} |")
    return "\n".join(map(shown, rows))  # one line each: text from a folder cannot start another


def loop_text(res: BenchResult) -> str:
    """mhaexport's decode loop against onnxruntime-genai's on the same file: the ratio of their token p50s and how
    many sessions each figure is the median of."""
    lp = res.loop
    threads = f"{lp.threads} thread{'s' if lp.threads != 1 else ''} each" if lp.threads else "threads as the run's"
    if lp.sessions > 1:
        ours = ", ".join(_f(m) for m in lp.ours_sessions_ms)
        how = (f"each the median of {lp.sessions} sessions' p50s — ours {ours}, onnxruntime-genai's "
               f"{', '.join(_f(m) for m in lp.genai_sessions_ms)} ms")
    else:
        how = ("one session each: identical sessions of one file can decode at different speeds, so this ratio "
               "also holds the two sessions' difference; --sessions 3 times each loop over three")
    return (f"mhaexport's decode loop ({lp.ours}, the deploy runtime's) / onnxruntime-genai's loop ({lp.genai}) "
            f"on the same file: {_f(lp.ours_ms)} / {_f(lp.genai_ms)} ms per token = **{number(lp.ratio, '.3f')} x** "
            f"({how}; {threads}).")


def lowerings_table(res: BenchResult) -> str:
    """The lowerings side by side: which is fastest per provider and by how much, and how cost grows with position."""
    far = {lw.far for lw in res.lowerings if lw.far is not None}
    near = {lw.near for lw in res.lowerings if lw.near is not None}
    at_near = f"at {near.pop()}" if len(near) == 1 else "near"
    at_far = f"at {far.pop()}" if len(far) == 1 else "far"
    rows = [("Lowerings (ONNX Runtime rows of this run; token p50 over the interleaved repeats, x fastest = p50 / "
             "the fastest p50 on the same provider; position latencies from the long runs, median of positions +-8):"),
            "",
            f"| lowering | provider | token p50 | x fastest | {at_near} | {at_far} | {at_far} / {at_near} |",
            "| --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    for lw in res.lowerings:
        rows.append(f"| {lw.label} | {lw.provider} | {_f(lw.token_p50_ms)} | {_f(lw.vs_fastest)} | "
                    f"{_f(lw.near_ms)} | {_f(lw.far_ms)} | {_f(lw.far_over_near)} |")
    return "\n".join(map(shown, rows))  # one line each: text from a folder cannot start another


def quantized_table(res: BenchResult) -> str:
    """Quantized exports beside the float ones: weight bytes per token, token p50, and both against the float
    model (its weight-bandwidth floor and its ORT row on the same provider)."""
    rows = [r for r in res.runtimes if r.ran and r.lowering is not None and r.opt_level is None]
    out = [(f"Quantized and float exports side by side (ONNX Runtime rows of this run; weights read per token "
            f"counted from each graph; x float floor = token p50 / the float model's weight-bandwidth floor, "
            f"{number(res.floor_ms, '.2f')} ms; x float p50 = token p50 / the float export's on the same provider):"), "",
           "| row | weights | MB read per token | x float bytes | token p50 | x float floor | x float p50 |",
           "| --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        floats = [f.token_p50_ms for f in rows if f.quantization is None and f.providers[:1] == r.providers[:1]
                  and f.token_p50_ms]
        mb = r.weight_bytes_per_token or res.weight_bytes_per_token
        out.append(f"| {r.label} | {r.quant_label or 'float'} | {number(mb / 1e6, '.1f')} | "
                   f"{number(_div(mb, res.weight_bytes_per_token), '.3f')} | {_f(r.token_p50_ms)} | {_f(r.floor_ratio)} | "
                   f"{_f(r.token_p50_ms / min(floats) if floats and r.token_p50_ms else None)} |")
    return "\n".join(map(shown, out))


def _ratio(x: float | None, base: float | None) -> str:
    return f" (x {number(x / base, '.2f')})" if x is not None and base else ""


def scaling_tables(res: BenchResult) -> str:
    """How cost grows: per ONNX Runtime row, per-token p50 and tokens/s at each batch (x: tokens/s / at the
    smallest batch) and TTFT at each prompt length (x: TTFT / at the shortest prompt); a point a row could not take
    says why."""
    cfg = res.config
    threads = f"{cfg.threads} thread{'s' if cfg.threads != 1 else ''}"
    out = [(f"How cost grows (ONNX Runtime rows of this run, after the main rounds; per point one untimed "
            f"generation of every row, then {cfg.repeats} timed round(s) round-robin, medians; {threads}, "
            "greedy):")]

    def table(key: str, x: str, intro: str, cell) -> list[str]:
        points = [getattr(pt, x) for pt in getattr(res.scaling[0], key)]
        # a point every row skipped for one reason (the model's limit) is said once, under the table
        common = {}
        for j, at in enumerate(points):
            reasons = {getattr(entry, key)[j].reason for entry in res.scaling}
            if len(reasons) == 1 and None not in reasons:
                common[at] = reasons.pop()
        lines = ["", intro, "", "| row | " + " | ".join(f"{x} {at}" for at in points) + " |",
                 "| --- |" + " ---: |" * len(points)]
        for entry in res.scaling:
            base = getattr(entry, key)[0]
            cells = [("skipped" if getattr(pt, x) in common else f"skipped: {pt.reason}") if pt.reason else
                     cell(pt, None if pt is base or base.reason else base) for pt in getattr(entry, key)]
            lines.append(f"| {entry.label} | " + " | ".join(cells) + " |")
        for why in dict.fromkeys(common.values()):
            lines += ["", f"{', '.join(f'{x} {at}' for at, w in common.items() if w == why)}: skipped for every "
                          f"row, {why}."]
        return lines

    if res.scaling and res.scaling[0].batches:
        b0 = res.scaling[0].batches[0].batch
        out += table("batches", "batch", (
            f"Per-token latency (p50 of every decode step, ms) and tokens/s (batch x {cfg.new_tokens} new tokens "
            f"/ (TTFT + decode)) at each batch of {cfg.prompt_len}-token prompts; x batch {b0} = tokens/s / "
            f"tokens/s at batch {b0}:"),
            lambda pt, base: (f"{_f(pt.token_p50_ms)} ms, {_f(pt.tokens_per_s, 1)} tokens/s"
                              + (_ratio(pt.tokens_per_s, base.tokens_per_s) if base else "")))
    if res.scaling and res.scaling[0].prompts:
        p0 = res.scaling[0].prompts[0].prompt
        out += table("prompts", "prompt", (
            f"Time to first token (prefill + choosing it, ms) at batch 1 for each prompt length; x prompt {p0} = "
            f"TTFT / TTFT at prompt {p0}:"),
            lambda pt, base: f"{_f(pt.ttft_ms)} ms" + (_ratio(pt.ttft_ms, base.ttft_ms) if base else ""))
    return "\n".join(map(shown, out))


def floor_text(res: BenchResult) -> str:
    """The bandwidth and the floor, naming the probe that set it and the thread count it read with."""
    bw = res.bandwidth
    probes = ", ".join(f"{k} {number(v, '.2f')} GB/s" + (" counting read + write" if k == "copy" else "")
                       for k, v in bw.probes.items())
    threads = f"{bw.threads} thread{'s' if bw.threads != 1 else ''}"
    return (f"Memory read bandwidth: **{number(res.bandwidth_gbps, '.2f')} GB/s**, the fastest of the probes ({probes}; "
            f"{bw.method}, {threads}, {bw.mbytes} MiB, medians). Weights read per token: "
            f"{number(res.weight_bytes_per_token / 1e6, '.1f')} MB. Weight-bandwidth floor: **{number(res.floor_ms, '.2f')} ms/token** "
            f"(set by the {bw.probe} probe on {threads}).")


def targets_table(res: BenchResult) -> str:
    """The speed targets with their verdicts (yes / no / not measured / spread too wide: no verdict); a target set for
    other run conditions than this run's shows its figure, marked as not a verdict."""
    conditions = "; ".join(dict.fromkeys(describe_conditions(t.conditions) for t in TARGETS))
    max_spread = res.config.max_spread
    rows = [f"Speed targets (set for {conditions}; a verdict only where every timed row a target reads has spread "
            f"<= {number(max_spread, 'g')}; where this run's conditions differ from a target's, its figure is shown, not a "
            "verdict):", "", "| target | measured | limit | met |", "| --- | ---: | ---: | --- |"]
    for t in res.targets:
        verdict = "**no**" if t.verdict == "no" else t.verdict
        if not t.applies and t.met is not None:
            verdict = f"{t.verdict} (other run conditions: a figure, not a verdict)"
        limit = f"{'<=' if t.direction == 'at most' else '>='} {number(t.limit, 'g')}"
        rows.append(f"| {t.target} ({t.detail}) | {_f(t.measured)} | {limit} | {verdict} |")
    return "\n".join(map(shown, rows))  # one line each: text from a folder cannot start another


def markdown_body(res: BenchResult, plot_note: str | None = None, scaling_note: str | None = None) -> str:
    """The bench section in markdown; ``plot_note`` (the bench.png link, or why there is none) ends it;
    ``scaling_note`` (the bench-scaling.png link) follows the how-cost-grows tables."""
    parts = [runtimes_table(res), "", floor_text(res)]
    if res.loop:
        parts += ["", loop_text(res)]
    for lr in res.long_runs:
        at = ", ".join(f"{p}: {_f(v)} ms" for p, v in lr.at.items())
        read = lr.bytes_at or {}
        near, far = str(lr.near), str(lr.far)
        grow = (f"; bytes a step reads at least (weights + the cache so far) at {far} / at {near}: "
                f"{number(_div(read[far], read[near]), '.2f')}" if near in read and far in read and near != far
                else "")
        parts.append(f"\n{shown(lr.label)}: per-token latency against position (median of positions +-8), "
                     f"{lr.repeats} run(s) to position {lr.positions[-1] + 1}: {at}; spread "
                     f"{_f(lr.spread)}{grow}.")
    if len(res.lowerings) > 1:
        parts += ["", lowerings_table(res)]
    if any(r.quantization for r in res.runtimes):
        parts += ["", quantized_table(res)]
    if res.scaling:
        parts += ["", scaling_tables(res)]
        if scaling_note:
            parts.append(f"\n{shown(scaling_note)}")
    if res.targets:  # the project's speed targets, when the run asked for them (--targets)
        parts += ["", targets_table(res)]
    if res.profile:
        ops = ", ".join(f"{o.op} {number(o.share * 100, '.0f')}%" for o in res.profile.ops[:8])
        where = res.profile.file or "not kept: give -o DIR to keep the trace there"
        parts.append(f"\nONNX Runtime profile of one ORT CPU generation ({shown(where)}): {shown(ops)}.")
    for n in res.notes:
        parts.append(f"\nNote: {shown(n)}.")
    if plot_note:
        parts.append(f"\n{shown(plot_note)}")
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
    labels = list(dict.fromkeys([r.label for r in ran] + [lr.label for lr in res.long_runs]))
    colours = {lab: plt.get_cmap("tab10")(i % 10) for i, lab in enumerate(labels)}
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
    bars.set_yticks(range(len(ran)), [r.label for r in ran], fontsize=8)
    for tick, r in zip(bars.get_yticklabels(), ran):
        tick.set_color(colours[r.label])
    bars.set_ylim(len(ran) - 0.5, -0.7)  # the table's order, top to bottom
    bars.axvline(res.floor_ms, color="grey", linestyle="--", linewidth=0.9)
    bars.set_xlabel("ms per token: median (dot), p10-p90 of the decode steps (bar)", fontsize=8)
    bars.grid(True, axis="x", alpha=0.3)
    for r in ran:
        if r.per_position_ms:
            lines.plot(r.positions, _smooth(r.positions, r.per_position_ms), color=colours[r.label], linewidth=1.4,
                       label=r.label)
    for lr in res.long_runs:
        lines.plot(lr.positions, _smooth(lr.positions, lr.ms), color=colours[lr.label], linewidth=1.2,
                   linestyle="--", label=f"{lr.label}, long run")
    lines.axhline(res.floor_ms, color="grey", linestyle="--", linewidth=0.9,
                  label=f"weight-bandwidth floor {number(res.floor_ms, '.2f')} ms ({res.floor_probe}, {res.floor_threads} "
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
    fig.suptitle(f"decode latency: {res.model.spec} (batch {cfg.batch}, prompt {cfg.prompt_len}, "
                 f"{cfg.new_tokens} new tokens, {cfg.threads} threads)", fontsize=10)
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
    for ax, (key, x, y, ylabel) in zip(axes[0], panels):
        ticks = set()  # the points some row measured (a point skipped for every row widens nothing)
        for entry in res.scaling:
            pts = [(getattr(pt, x), getattr(pt, y)) for pt in getattr(entry, key) if getattr(pt, y) is not None]
            if pts:
                ax.plot(*zip(*pts), marker="o", linewidth=1, label=entry.label)
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
    fig.suptitle(f"how cost grows: {res.model.spec}", fontsize=10)
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
    png = plot(res, out_dir / "bench.png")
    note = ("![per-token latency against position](bench.png)" if png else
            "No plot: matplotlib is not installed (`pip install 'mhaexport[plot]'`).")
    scaling_png = plot_scaling(res, out_dir / SCALING_PNG)
    scaling_note = (f"![how cost grows: per-token latency and tokens/s against the batch, TTFT against the prompt]"
                    f"({SCALING_PNG})" if scaling_png else None)
    atomic_write_json(out_dir / "bench.json", res.to_dict())
    written.append(out_dir / "bench.json")
    md = f"# Bench: {res.model.spec}\n\n{res.environment.date}, {res.environment.cpu}\n\n" \
         f"{markdown_body(res, note, scaling_note)}\n"
    atomic_write_bytes(out_dir / "bench.md", md.encode())
    written.append(out_dir / "bench.md")
    written.append(write_html(res, out_dir / "bench.html"))  # bench.html beside them (bench/html.py)
    if png:
        written.append(Path(png))
    if scaling_png:
        written.append(Path(scaling_png))
    report = out_dir / "report.md"
    if report.is_file():
        update_report(report, res, note, scaling_note)
        written.append(report)
    return written


def update_report(report: Path, res: BenchResult, plot_note: str | None = None,
                  scaling_note: str | None = None) -> None:
    """Replace (or append) the bench section between the markers; running it again changes only that section.
    ``plot_note``: the bench.png link (bench.png sits next to report.md), or why there is none; ``scaling_note``:
    the bench-scaling.png link."""
    section = f"{REPORT_BEGIN}\n## Bench\n\n{markdown_body(res, plot_note, scaling_note)}\n{REPORT_END}"
    text = report.read_text()
    pattern = re.compile(re.escape(REPORT_BEGIN) + r".*?" + re.escape(REPORT_END), re.DOTALL)
    if pattern.search(text):
        text = pattern.sub(lambda _: section, text)
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    atomic_write_bytes(report, text.encode())
