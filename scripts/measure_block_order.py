"""Two checks' plans on eager PyTorch — causality's four calls, and a decode of 12 tokens with its one prefill
(kv-consistency's first two chains) —, call by call and block by block, alternating in one process
(docs/measurements/big-models-2026-12-06.md, "Block order").

    python scripts/measure_block_order.py HF_FOLDER [PAIRS]

HF_FOLDER: a bfloat16 Hugging Face folder (``python -m tests.big_models tinyllama-1b FOLDER``), loaded as verify's
mapped mode loads it (streamed, kept bfloat16, its float32 reference computed a slice at a time). 2 torch threads.
Prints each run's wall time, user and system CPU, and the median of each (plan, order).
"""

from __future__ import annotations

import resource
import statistics
import sys
import time

import numpy as np
import torch

from mhaexport.models.loading import load_hf
from mhaexport.runners.decoder import EagerRunner
from mhaexport.runners.plan import Plan, run_in_turn, run_plan


def causality_plan(c, rng) -> Plan:
    """Causality's calls: two shapes (seq 10, and seq 6 after a past of 4), a base and a perturbed call each."""
    p = Plan()
    for seq, past in ((10, 0), (6, 4)):
        ids = rng.integers(0, c.vocab_size, (2, seq))
        mask = np.ones((2, seq + past), np.int64)
        kv = tuple((np.zeros((2, c.n_kv_heads, past, c.head_dim), np.float32),) * 2 for _ in range(c.n_layers))
        p.add(ids, mask, kv, keep=True)
        p.add((ids + 1) % c.vocab_size, mask, kv, keep=True)
    return p


def decode_plan(c, rng) -> Plan:
    """A prefill of 12 tokens, and the same 12 tokens decoded one at a time (a chain of 12 steps)."""
    p = Plan()
    ids = rng.integers(0, c.vocab_size, (2, 12))
    mask = np.ones((2, 12), np.int64)
    p.chain(ids, mask, [12], keep=True)
    p.chain(ids, mask, [1] * 12, keep=True)
    return p


PLANS = {"causality": causality_plan, "decode": decode_plan}


def main() -> None:
    torch.set_num_threads(2)
    folder, pairs = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 3
    loaded = load_hf(folder, streamed=True, keep_half=True)
    runner = EagerRunner("eager", loaded.contract, loaded.eager).activate()
    rng = np.random.default_rng(0)
    times: dict[tuple[str, str], list[float]] = {}
    for _ in range(pairs):
        for name, make in PLANS.items():
            for order in ("call by call", "block by block"):
                plan = make(loaded.contract, rng)
                runner.block_order = order == "block by block"
                r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
                (run_plan if runner.block_order else run_in_turn)(runner, plan.calls)
                wall, r1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF)
                times.setdefault((name, order), []).append(wall)
                print(f"{name}, {order}: {wall:.2f} s (user {r1.ru_utime - r0.ru_utime:.1f} s, system "
                      f"{r1.ru_stime - r0.ru_stime:.1f} s)", flush=True)
    for (name, order), ts in times.items():
        print(f"median {name}, {order}: {statistics.median(ts):.2f} s over {len(ts)}")

if __name__ == "__main__":
    main()
