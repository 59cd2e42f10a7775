"""bench.html: a bench result as one self-contained page beside bench.json and bench.md (verify/html.py's shell and
its inline SVG charts): the rows' table, per-token latency against the cache position (each row's median per decode
step; a long run dashed; each layer's window marked), and how cost grows with the batch and the prompt (--batches,
--prompts). Every name from a folder is escaped."""

from __future__ import annotations

from pathlib import Path

from mhaexport.core.numbers import number
from mhaexport.artifact import atomic_write_bytes
from mhaexport.bench.result import BenchResult
from mhaexport.verify.html import e, figure, page, table
from mhaexport.verify.svg import COLOURS, Chart, Series


def _ms(x: float | None, nd: int = 2) -> str:
    return "—" if x is None else number(x, f".{nd}f")


def html(res: BenchResult) -> str:
    """The bench result as an HTML page (see the module's docstring)."""
    env = res.environment
    cfg = res.config
    body = [f"<h1>mhaexport bench: <code>{e(res.model.spec)}</code></h1>",
            f"<p>{e(env.date or '')} · {e(env.cpu or '?')} · batch {cfg.batch}, prompt {cfg.prompt_len}, "
            f"{cfg.new_tokens} new tokens, {cfg.threads} threads; times in ms (medians over {cfg.repeats} timed "
            f"repeats); weight-bandwidth floor {number(res.floor_ms, '.3g')} ms per token</p>"]
    rows = []
    for r in res.runtimes:
        if not r.ran:
            rows.append([f"<b>{e(r.label)}</b>", e(f"skipped: {r.reason}")] + ["—"] * 6)
            continue
        rows.append([f"<b>{e(r.label)}</b>", e(", ".join(r.providers)), _ms(r.load_ms, 0), _ms(r.prefill_ms),
                     _ms(r.ttft_ms), _ms(r.token_p50_ms), _ms(r.token_p90_ms), _ms(r.tokens_per_s, 1)])
    body.append(table(["row", "providers", "load", "prefill", "TTFT", "token p50", "token p90", "tokens/s"], rows))
    labels = list(dict.fromkeys([r.label for r in res.runtimes] + [lr.label for lr in res.long_runs]))
    colour = {lab: COLOURS[i % len(COLOURS)] for i, lab in enumerate(labels)}
    series = [Series(r.label, list(zip(r.positions, r.per_position_ms)), colour=colour[r.label])
              for r in res.runtimes if r.ran and r.per_position_ms]
    series += [Series(f"{lr.label}, long run", list(zip(lr.positions, lr.ms)), dashed=True, colour=colour[lr.label])
               for lr in res.long_runs]
    windows = [w for w in (res.model.contract or {}).get("windows") or [] if isinstance(w, int) and w > 0]
    if series:
        body.append(figure(Chart("Per-token latency against position", "position of the token fed (tokens)",
                                 "ms per token", series,
                                 vlines=[(float(w), f"window {w}") for w in sorted(set(windows))]),
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
    body.append(f'<p class="note">{e(", ".join(f"{k} {v}" for k, v in res.versions.items()))}</p>')
    return page(f"mhaexport bench: {res.model.spec}", body)


def write_html(res: BenchResult, path: str | Path) -> Path:
    """Write :func:`html` of ``res`` to ``path`` atomically; returns the path."""
    path = Path(path)
    atomic_write_bytes(path, html(res).encode())
    return path
