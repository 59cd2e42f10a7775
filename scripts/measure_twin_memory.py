"""Anonymous memory of a quantized (MatMulNBits, accuracy level 4) file's ONNX Runtime session and its float-activation
twin's, opened as verify's mapped mode opens them (weights mapped, MatMulNBits packed): both at once, and one at a
time (docs/measurements/big-models-2026-12-06.md, "The float-activation twin, one session at a time").

    python scripts/measure_twin_memory.py QUANTIZED_FOLDER
    python scripts/measure_twin_memory.py QUANTIZED_FOLDER --in-turn   # as verify runs them: one at a time

``--in-turn``: the file's session opened and run (a prefill of 2 x 64 tokens and 8 decode steps), closed, the heap
trimmed (``trim_freed_memory``, what verify does when it closes a session), then the twin's the same; the anonymous
memory after each step.
"""

from __future__ import annotations

import dataclasses
import gc
import sys

from mhaexport.artifact import ExportFolder
from mhaexport.runners.registry import float_activation_twin, runner_for
from mhaexport.runtime.spill import return_freed_memory, trim_freed_memory


def anon() -> int:
    """This process's anonymous resident memory, bytes (/proc/self/status)."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("RssAnon"))


def _exercise(runner) -> None:
    """A prefill of 2 x 64 tokens and 8 greedy decode steps on ``runner`` (what a check's calls allocate)."""
    import numpy as np

    c = runner.contract
    ids = np.random.default_rng(0).integers(0, c.vocab_size, (2, 64)).astype(np.int64)
    mask = np.ones_like(ids)
    logits, past = runner.run(ids, mask)
    for _ in range(8):
        ids = logits[:, -1:].argmax(-1).astype(np.int64)
        mask = np.concatenate([mask, np.ones_like(ids)], axis=1)
        logits, past = runner.run(ids, mask, past)


def in_turn(folder: str) -> None:
    gb = lambda b: f"{b / 1e9:.2f} GB"  # noqa: E731
    with ExportFolder.open(folder) as ef:
        base = anon()
        say = lambda what: print(f"{what}: {gb(anon() - base)} over the baseline", flush=True)  # noqa: E731
        file = runner_for(ef, "ort-cpu", ef.contract)
        file.config = dataclasses.replace(file.config, mmap_weights=True, packed_weights=True)
        twin = float_activation_twin(file)
        for name, r in (("the file", file), ("its twin", twin)):
            r.activate()
            say(f"{name}'s session open")
            _exercise(r)
            say(f"{name}'s session run")
            r.deactivate()
            gc.collect()
            say(f"{name}'s session closed")
            trim_freed_memory()
            say("the heap trimmed")


def main() -> None:
    if "--in-turn" in sys.argv:
        return_freed_memory()
        return in_turn(sys.argv[1])
    return_freed_memory()  # as verify's mapped mode does: a large allocation goes back to the system when freed
    gb = lambda b: f"{b / 1e9:.2f} GB"  # noqa: E731
    with ExportFolder.open(sys.argv[1]) as ef:
        base = anon()
        file = runner_for(ef, "ort-cpu", ef.contract)
        file.config = dataclasses.replace(file.config, mmap_weights=True, packed_weights=True)
        file.activate()
        one = anon() - base
        twin = float_activation_twin(file)
        if twin is None:
            sys.exit("no float-activation twin: the file has no MatMulNBits at accuracy level 4")
        twin.activate()
        both = anon() - base
        file.deactivate()
        gc.collect()
        twin_only = anon() - base
        twin.deactivate()
        gc.collect()
        print(f"over the baseline: the file's session {gb(one)}; with its twin's open too {gb(both)}; the twin's "
              f"alone (the file's closed) {gb(twin_only)}; both closed {gb(anon() - base)}")


if __name__ == "__main__":
    main()
