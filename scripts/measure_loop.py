"""Our decode loop against onnxruntime-genai's on the same file, with the session-to-session spread taken out.

Identical ONNX Runtime sessions of one file can decode at different speeds on this project's machines (a bench run
compares one session of each loop). This script opens SESSIONS sessions of each — mhaexport's Generator and
onnxruntime-genai's Model over the same export folder, 2 threads each — and times ROUNDS rounds in which every
session generates once (greedy, prompt 32, 128 new tokens), round-robin. It prints each session's median step, the
median over sessions per loop, their ratio, and for our loop the part of a step spent inside
``session.run_with_iobinding`` (what is left is the Python loop's own cost).

    python scripts/measure_loop.py FOLDER [--sessions 3] [--rounds 5] [--threads 2]
"""

from __future__ import annotations

import argparse
import statistics as st
import time

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folder")
    ap.add_argument("--sessions", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=128)
    a = ap.parse_args()

    from mhaexport.runtime import GenerationConfig, Generator
    from mhaexport.runtime.genai import genai_generate, genai_model

    prompt = np.random.default_rng(0).integers(3, 2000, size=(1, a.prompt_len))
    ours, inner = [], []
    for _ in range(a.sessions):
        g = Generator(a.folder, threads=a.threads)
        times: list[float] = []
        run = g.session.run_with_iobinding

        def timed(io, *args, run=run, times=times):
            t = time.perf_counter()
            run(io, *args)
            times.append(time.perf_counter() - t)

        g.session.run_with_iobinding = timed
        ours.append(g)
        inner.append(times)
    genai = [genai_model(ours[0].export.root, threads=a.threads) for _ in range(a.sessions)]
    cfg = GenerationConfig(max_new_tokens=a.new_tokens)
    ids = prompt.astype(np.int64)
    for g in ours:  # warm-up
        g.generate(prompt, cfg)
    for m in genai:
        genai_generate(m, ids, a.prompt_len + a.new_tokens)
    step = {("ours", i): [] for i in range(a.sessions)} | {("genai", i): [] for i in range(a.sessions)}
    in_run = {i: [] for i in range(a.sessions)}
    for _ in range(a.rounds):
        for i, g in enumerate(ours):
            inner[i].clear()
            res = g.generate(prompt, cfg)
            step[("ours", i)].append(st.median(res.step_s))
            in_run[i].append(st.median(inner[i][1:]))
        for i, m in enumerate(genai):
            step[("genai", i)].append(st.median(genai_generate(m, ids, a.prompt_len + a.new_tokens).step_s))
    per = {k: st.median(v) * 1e3 for k, v in step.items()}
    for (loop, i), ms in per.items():
        extra = f"  (inside session.run {st.median(in_run[i]) * 1e3:.3f})" if loop == "ours" else ""
        print(f"{loop:5s} session {i}: median step {ms:.3f} ms{extra}")
    o = st.median(per[("ours", i)] for i in range(a.sessions))
    g = st.median(per[("genai", i)] for i in range(a.sessions))
    r = st.median(st.median(in_run[i]) * 1e3 for i in range(a.sessions))
    print(f"ours {o:.3f} ms, onnxruntime-genai {g:.3f} ms: ours / genai = {o / g:.3f}; "
          f"our loop outside session.run: {o - r:.3f} ms per step ({(o - r) / o:.1%})")


if __name__ == "__main__":
    main()
