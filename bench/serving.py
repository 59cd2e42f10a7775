"""Serving (``--serving 1,4,8``): what the deploy runtime's serving loops buy on this machine, on the ort-cpu row (the
folder's file in its own protocol, the Generator's loop), after the main rounds on the loaded, warm row:

- continuous batching (:mod:`mhaexport.runtime.serve`): a queue of requests of mixed prompt lengths and budgets,
  all waiting at the start, served over R rows, tokens/s against the plain loop (the same requests one at a time,
  :meth:`DecodeLoop.generate` at batch 1), at each R asked;
- speculative decoding (:mod:`mhaexport.runtime.speculative`, prompt lookup, 4 drafts a call): tokens/s against
  plain greedy decoding of the same prompt, on a repetitive prompt and a non-repetitive one: text through the
  folder's tokenizer where it has one (a sentence over and over; a paragraph of prose), else seeded ids (an 8-gram
  over and over; ids drawn at random).

Each workload's runs are interleaved round by round (one untimed round, then ``repeats`` timed ones), medians; the
serving runs' tokens are checked against the plain loop's (``same_tokens``: verify's serving checks are the proof).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import numpy as np

from mhaexport.bench.config import BenchConfig
from mhaexport.bench.result import BatchingPoint, ServingBench, SpeculativePoint
from mhaexport.bench.rows import Row
from mhaexport.core.progress import Step
from mhaexport.runtime.decode import DecodeLoop, GenerationConfig
from mhaexport.runtime.serve import Request, Scheduler, alone
from mhaexport.runtime.speculative import PromptLookup, speculative_generate

Progress = Callable[[str], None]
DRAFT_TOKENS = 4  # prompt lookup's drafts per call
REPEATED = "The river runs down to the sea, and the sea sends the rain back to the hills. "
PROSE = ("Morning came slowly over the harbour. A fisherman checked his nets twice, counted the floats, and "
         "decided the weather would hold until noon. Behind him the market was opening: bread, salt, lamp oil, a "
         "crate of lemons that nobody had ordered. By the time the bell rang the boats were already past the wall.")


def speculative_prompts(cfg: BenchConfig, vocab_size: int, tokenizer=None) -> dict[str, list[int]]:
    """The repetitive and the non-repetitive prompt, ``cfg.prompt_len`` tokens each (see the module)."""
    P = cfg.prompt_len
    if tokenizer is not None:
        rep, prose = tokenizer.encode(REPEATED * (P // 8 + 2)), tokenizer.encode(PROSE * (P // 64 + 1))
        if len(rep) >= P and len(prose) >= P and max(rep + prose) < vocab_size:
            return {"repetitive": rep[:P], "non-repetitive": prose[:P]}
    rng = np.random.default_rng(cfg.seed + 2)
    gram = rng.integers(0, vocab_size, 8).tolist()
    return {"repetitive": (gram * P)[:P], "non-repetitive": rng.integers(0, vocab_size, P).tolist()}


def serving_requests(cfg: BenchConfig, vocab_size: int, max_positions: int, count: int) -> list[Request]:
    """``count`` requests, all arriving at once: prompts of 1/4 .. 1 x prompt_len, budgets of 1/4 .. 1 x
    new_tokens, cycled so long and short ones mix; seeded ids."""
    rng = np.random.default_rng(cfg.seed + 1)
    P, N = cfg.prompt_len, cfg.new_tokens
    lengths = [P, max(1, P // 4), max(1, 3 * P // 4), max(1, P // 2)]
    budgets = [max(1, N // 2), N, max(1, N // 4), max(1, 3 * N // 4), max(1, N // 3)]
    out = []
    for i in range(count):
        p = lengths[i % len(lengths)]
        n = min(budgets[i % len(budgets)], max_positions - p)
        out.append(Request(rng.integers(0, vocab_size, p).tolist(), n))
    return out


def serving_runs(row: Row, cfg: BenchConfig, vocab_size: int, max_positions: int, say: Progress,
                 tokenizer=None) -> ServingBench:
    """The serving phase on ``row`` (loaded and warm; ``tokenizer``: the folder's, for the speculative prompts): see
    the module."""
    loop = DecodeLoop(row.runner)
    points = sorted(set(cfg.serving))
    reqs = serving_requests(cfg, vocab_size, max_positions, max(8, 2 * max(points)))
    total = sum(r.max_new_tokens for r in reqs)
    rounds = cfg.repeats + 1
    out = ServingBench(row.record.label, len(reqs), total, notes=[])
    greedy = GenerationConfig()  # no eos: every request runs its budget

    def timed(fn) -> tuple[float, object]:
        t0 = time.perf_counter()
        got = fn()
        return time.perf_counter() - t0, got

    plain_s, batch_s = [], {r: [] for r in points}
    same = True
    for k in range(rounds):
        say(Step(f"serving: continuous batching at rows {','.join(map(str, points))} vs the plain loop, "
                 f"{'untimed round' if k == 0 else f'round {k}/{cfg.repeats}'} ...", k, rounds))
        seconds, plain = timed(lambda: [alone(loop, r, greedy).tokens[0] for r in reqs])
        if k:
            plain_s.append(seconds)
        for R in points:
            sched = Scheduler(loop, R, greedy)
            seconds, _ = timed(lambda: [None for _ in sched.run(reqs)])
            same = same and [o.tokens for o in sched.outcomes] == plain
            if k:
                batch_s[R].append(seconds)
    plain_tps = total / statistics.median(plain_s)
    out.plain_tokens_per_s = round(plain_tps, 2)
    for R in points:
        tps = total / statistics.median(batch_s[R])
        out.batching.append(BatchingPoint(R, round(tps, 2), round(tps / plain_tps, 3), len(batch_s[R])))
    out.same_tokens = same

    n = min(cfg.new_tokens, max_positions - cfg.prompt_len - DRAFT_TOKENS - 1)
    prompts = speculative_prompts(cfg, vocab_size, tokenizer)
    spec_cfg = GenerationConfig(max_new_tokens=n)
    for name, prompt in prompts.items():
        plain_t, spec_t, stats, equal = [], [], None, True
        for k in range(rounds):
            say(Step(f"serving: speculative decoding (prompt lookup) vs plain greedy, {name} prompt, "
                     f"{'untimed round' if k == 0 else f'round {k}/{cfg.repeats}'} ...", k, rounds))
            s1, plain = timed(lambda: loop.generate([prompt], spec_cfg))
            s2, spec = timed(lambda: speculative_generate(loop, prompt, spec_cfg, PromptLookup(), k=DRAFT_TOKENS))
            equal = equal and spec.tokens[0] == plain.tokens[0]
            stats = spec.speculative
            if k:
                plain_t.append(s1)
                spec_t.append(s2)
        p_tps, s_tps = n / statistics.median(plain_t), n / statistics.median(spec_t)
        out.speculative.append(SpeculativePoint(
            name, round(p_tps, 2), round(s_tps, 2), round(s_tps / p_tps, 3), stats["acceptance"],
            round(n / max(1, stats["target_calls"] + 1), 3), equal, len(spec_t), n))
    if not same or not all(p.same_tokens for p in out.speculative):
        out.notes.append("a serving run's tokens differ from the plain loop's: run `mhaexport verify` (its "
                         "continuous-batching and speculative checks)")
    return out
