"""How cost grows (``--batches``, ``--prompts``): per-token latency and tokens/s against the batch size, and the time
to first token against the prompt's length, on the ONNX Runtime rows of a bench run — ours beside the builder's.

It runs after the main timed rounds and the long runs, on rows already loaded and warm, so the main figures are
taken exactly as without it and a default run does not get slower. Each point (a batch size, or a prompt length at
batch 1) is its own small round-robin: one untimed generation of every row at that shape (ONNX Runtime sizes its
buffers for a new shape on its first run), then ``repeats`` rounds of one generation per row, so the drift of a
shared machine falls on every row alike; per point and row, the medians. A row that cannot take a point (a shared
cache too short for the prompt, a runtime error) records why for that point and goes on with the others; a prompt
the model itself cannot hold is skipped for every row, with the model's limit as the reason.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

import numpy as np

from mhaexport.bench.config import ORT_GENAI, ORT_RUNTIMES, BenchConfig
from mhaexport.bench.result import BatchPoint, PromptPoint, ScalingRow
from mhaexport.bench.rows import Row, why
from mhaexport.bench.stats import percentile
from mhaexport.core.errors import MhaExportError
from mhaexport.core.progress import Step
from mhaexport.runtime.decode import GenerationResult

Progress = Callable[[str], None]

# a TTFT point generates two tokens: the first (what TTFT times) and one decode step, so the prompt's point also
# proves the row decodes after a prompt that long (it needs prompt + 1 positions)
TTFT_NEW_TOKENS = 2


def seeded_prompt(seed: int, vocab_size: int, batch: int, length: int) -> np.ndarray:
    """(batch, length) int64 token ids drawn from ``seed``: the main run's prompt and every scaling point's."""
    return np.random.default_rng(seed).integers(0, vocab_size, (batch, length), dtype=np.int64)


def scaling_rows(rows: list[Row]) -> list[Row]:
    """The rows the scaling phase times: every ONNX Runtime row that ran (the folder's own, ``--compare`` and
    ``--builder`` folders; ort-cpu and ort-cuda) and onnxruntime-genai's loop; not the ``--opt-levels`` variants
    (the same lowering again), the bare loop (a yardstick of the loop's cost, not a runtime) or the torch rows."""
    def wanted(r: Row) -> bool:
        base = r.record.name.split(" [")[0]
        return base in ORT_RUNTIMES + (ORT_GENAI,) and r.record.opt_level is None

    return [r for r in rows if r.ok and r.record.ran and r.runner is not None and wanted(r)]


def _ms(x: float) -> float:
    return round(x * 1000.0, 4)


def batch_point(batch: int, runs: list[GenerationResult], new_tokens: int) -> BatchPoint:
    """A batch point's figures, from the decode loop's timings: per-token p50 over every decode step of every
    repeat, tokens/s = batch * new_tokens / (first token + decode) and TTFT, medians over the repeats."""
    steps = [s for r in runs for s in r.step_s]
    return BatchPoint(batch, _ms(percentile(steps, 50)) if steps else None,
                      round(statistics.median(batch * new_tokens / (r.first_token_s + sum(r.step_s)) for r in runs), 2),
                      _ms(statistics.median(r.first_token_s for r in runs)), len(runs))


def prompt_point(prompt: int, runs: list[GenerationResult]) -> PromptPoint:
    """A prompt point's figures: TTFT (prefill + choosing the first token) and the prefill alone, medians over the
    repeats."""
    return PromptPoint(prompt, _ms(statistics.median(r.first_token_s for r in runs)),
                       _ms(statistics.median(r.prefill_s for r in runs)), len(runs))


def skipped_batch(batch: int, reason: str) -> BatchPoint:
    return BatchPoint(batch, reason=reason)


def skipped_prompt(prompt: int, reason: str) -> PromptPoint:
    return PromptPoint(prompt, reason=reason)


def _point(rows: list[Row], prompt: np.ndarray, n: int, repeats: int, failed: dict[int, str],
           say: Callable[[str, int], None]) -> list[list[GenerationResult]]:
    """One point: an untimed round, then ``repeats`` timed rounds, each one generation of every row (row order) not
    in ``failed``; a row that raises our error leaves the point with its first line in ``failed`` (only the
    point: the row goes on with the next). Returns each row's timed generations."""
    runs: list[list[GenerationResult]] = [[] for _ in rows]
    for k in range(repeats + 1):
        say("untimed round" if k == 0 else f"round {k}/{repeats}", k)
        for i in [i for i in range(len(rows)) if i not in failed]:
            try:
                r = rows[i].generate(prompt, n)
            except MhaExportError as e:
                failed[i] = why(e)
                continue
            if k:
                runs[i].append(r)
    return runs


def scaling_runs(rows: list[Row], cfg: BenchConfig, max_positions: int, vocab_size: int,
                 say: Progress) -> list[ScalingRow]:
    """The scaling phase over ``rows`` (loaded and warm; :func:`scaling_rows`): for each batch of ``cfg.batches``,
    ``cfg.prompt_len``-token prompts and ``cfg.new_tokens`` new tokens; for each length of ``cfg.prompts``, batch 1
    and :data:`TTFT_NEW_TOKENS` new tokens. Prompts are drawn from ``cfg.seed`` as the main run's. Returns one entry
    per row: ``{"name", "label", "lowering", "providers", "batches": [...], "prompts": [...]}``, every asked point in
    each (a skipped one with its ``reason``; see :func:`batch_point`, :func:`prompt_point`)."""
    batches, prompts = sorted(set(cfg.batches)), sorted(set(cfg.prompts))
    out = [ScalingRow(r.record.name, r.record.label, r.record.lowering, list(r.record.providers)) for r in rows]
    rounds = cfg.repeats + 1
    total = (len(batches) + len(prompts)) * rounds
    done = 0
    labels = ", ".join(r.record.label for r in rows)

    def speaker(what: str) -> Callable[[str, int], None]:
        def tell(which: str, k: int) -> None:
            say(Step(f"how cost grows, {what}, {which}: {labels} ...", done + k, total))
        return tell

    for b in batches:
        failed = {i: why for i, r in enumerate(rows) if (why := r.too_long(cfg.prompt_len, cfg.new_tokens))}
        runs = _point(rows, seeded_prompt(cfg.seed, vocab_size, b, cfg.prompt_len), cfg.new_tokens, cfg.repeats,
                      failed, speaker(f"batch {b} ({cfg.prompt_len}-token prompts, {cfg.new_tokens} new tokens)"))
        done += rounds
        for i in range(len(rows)):
            why = failed.get(i) or (None if runs[i] else "not timed (repeats=0)")
            out[i].batches.append(skipped_batch(b, why) if why else batch_point(b, runs[i], cfg.new_tokens))
    for p in prompts:
        need = p + TTFT_NEW_TOKENS - 1  # positions a prompt of p tokens and one decode step fill
        if need > max_positions:
            for entry in out:
                entry.prompts.append(skipped_prompt(p, f"the model allows {max_positions} positions"))
            say(Step(f"how cost grows, prompt {p}: skipped, the model allows {max_positions} positions",
                     done, total))
            done += rounds
            continue
        # a row whose loop holds fewer positions (a shared cache's --max-cache, onnxruntime-genai's context_length)
        failed = {i: why for i, r in enumerate(rows) if (why := r.too_long(p, TTFT_NEW_TOKENS))}
        runs = _point(rows, seeded_prompt(cfg.seed, vocab_size, 1, p), TTFT_NEW_TOKENS, cfg.repeats, failed,
                      speaker(f"TTFT at prompt {p} (batch 1)"))
        done += rounds
        for i in range(len(rows)):
            why = failed.get(i) or (None if runs[i] else "not timed (repeats=0)")
            out[i].prompts.append(skipped_prompt(p, why) if why else prompt_point(p, runs[i]))
    return out
