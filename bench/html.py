"""bench.html: a bench result as one self-contained page beside bench.json and bench.md (verify/html.py's shell and
its inline SVG charts): the rows' table, per-token latency against the cache position (each row's median per decode
step; a long run dashed; each layer's window marked), and how cost grows with the batch and the prompt (--batches,
--prompts). Every name from a folder is escaped."""

from __future__ import annotations

from pathlib import Path

from mhaexport.core.numbers import number
from mhaexport.artifact import atomic_write_bytes
from mhaexport.bench.result import BenchResult
from markupsafe import Markup

from mhaexport.verify.html import figure, page, table
from mhaexport.verify.markup import as_text, h, join
from mhaexport.verify.svg import COLOURS, Chart, Series


def _ms(x: float | None, nd: int = 2) -> str:
    return "—" if x is None else number(x, f".{nd}f")


def row_colours(res: BenchResult) -> dict[str, str]:
    """One colour per row label, the same in bench.png, bench-scaling.png and bench.html: the charts' palette
    (:data:`mhaexport.verify.svg.COLOURS`) in the order of the rows that ran, then the long runs' and the
    scaling rows'."""
    labels = dict.fromkeys([r.label for r in res.runtimes if r.ran] + [lr.label for lr in res.long_runs]
                           + [s.label for s in res.scaling])
    return {lab: COLOURS[i % len(COLOURS)] for i, lab in enumerate(labels)}


def floor_words(res: BenchResult) -> str:
    """The floor in words (bench.md's): the bandwidth, the weights per token, and why a row beats it (the weights
    fit in the CPU's cache: then it is no floor)."""
    words = (f"Memory read bandwidth {number(res.bandwidth_gbps, '.2f')} GB/s ({as_text(res.floor_probe)} probe, "
             f"{number(res.floor_threads, 'd')} threads); weights read per token "
             f"{number(res.weight_bytes_per_token / 1e6, '.1f')} MB: weight-bandwidth floor "
             f"{number(res.floor_ms, '.2f')} ms per token.")
    below = res.below_floor
    if below:
        rows = ", ".join(f"{as_text(r.label)} {number(r.token_p50_ms, '.2f')} ms" for r in below)
        words += (f" Token p50 below it ({rows}): the weights fit in the CPU's cache and are not read from memory "
                  "every step, so for this model it is no floor.")
    return words


def html(res: BenchResult) -> str:
    """The bench result as an HTML page (see the module's docstring)."""
    env = res.environment
    cfg = res.config
    body = [h("<h1>mhaexport bench: <code>{}</code></h1>", res.model.spec),
            h("<p>{} · {} · batch {}, prompt {}, {} new tokens, {} threads; times in ms (medians over {} timed "
              "repeats)</p>", env.date or "", env.cpu or "?", cfg.batch, cfg.prompt_len, cfg.new_tokens, cfg.threads,
              cfg.repeats),
            h("<p>{}</p>", floor_words(res))]
    rows = []
    for r in res.runtimes:
        if not r.ran:
            rows.append([h("<b>{}</b>", r.label), f"skipped: {as_text(r.reason)}"] + ["—"] * 6)
            continue
        rows.append([h("<b>{}</b>", r.label), ", ".join(as_text(p) for p in r.providers), _ms(r.load_ms, 0),
                     _ms(r.prefill_ms), _ms(r.ttft_ms), _ms(r.token_p50_ms), _ms(r.token_p90_ms),
                     _ms(r.tokens_per_s, 1)])
    body.append(table(["row", "providers", "load", "prefill", "TTFT", "token p50", "token p90", "tokens/s"], rows))
    colour = row_colours(res)  # bench.png's
    series = [Series(r.label, list(zip(r.positions, r.per_position_ms)), colour=colour[r.label])
              for r in res.runtimes if r.ran and r.per_position_ms]
    series += [Series(f"{as_text(lr.label)}, long run", list(zip(lr.positions, lr.ms)), dashed=True,
                      colour=colour[lr.label]) for lr in res.long_runs]
    windows = [w for w in (res.model.contract or {}).get("windows") or [] if isinstance(w, int) and w > 0]
    if series:
        floor = "weights at memory bandwidth" if res.below_floor else "weight-bandwidth floor"
        body.append(figure(Chart("Per-token latency against position", "position of the token fed (tokens)",
                                 "ms per token", series,
                                 vlines=[(float(w), f"window {number(w, 'd')}") for w in sorted(set(windows))],
                                 hlines=[(res.floor_ms, f"{floor} {number(res.floor_ms, '.2f')} ms", "#777777")]),
                           "each row's median over the timed repeats at each decode step: a cache that grows "
                           "costs more per token further out; a window caps it."))
    for key, x, y, title, xlabel in (
            ("batches", "batch", "token_p50_ms", "Per-token latency against the batch", "batch size"),
            ("batches", "batch", "tokens_per_s", "Tokens/s against the batch", "batch size"),
            ("prompts", "prompt", "ttft_ms", "Time to first token against the prompt", "prompt length (tokens)")):
        lines = [Series(s.label, [(getattr(p, x), getattr(p, y)) for p in getattr(s, key) if getattr(p, y) is not None],
                        colour=colour.get(s.label)) for s in res.scaling]
        lines = [s for s in lines if s.points]
        if lines:
            body.append(figure(Chart(title, xlabel, y.replace("_", " "), lines, logy=False), "how cost grows "
                               "(--batches / --prompts): one line per row."))
    if res.notes:  # bench.md's notes
        body += [Markup("<h2>Notes</h2>"), h("<ul>{}</ul>", join(h("<li>{}</li>", n) for n in res.notes))]
    body.append(h('<p class="note">{}</p>', ", ".join(f"{as_text(k)} {as_text(v)}" for k, v in res.versions.items())))
    return page(f"mhaexport bench: {as_text(res.model.spec)}", body)


def write_html(res: BenchResult, path: str | Path) -> Path:
    """Write :func:`html` of ``res`` to ``path`` atomically; returns the path."""
    path = Path(path)
    atomic_write_bytes(path, html(res).encode())
    return path
