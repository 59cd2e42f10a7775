"""The serving checks' figures per export folder: eager's floor (its own difference of the same requests served
against run alone) and ONNX Runtime's difference, per check, with the allowance; and (``--cost``) what the serving
checks add to a default verify of the first folder.

    python scripts/measure_serving.py FOLDER [FOLDER ...] [--cost]

Measured numbers: docs/measurements/serving-2026-12-06.md."""

from __future__ import annotations

import statistics
import sys
import time

import torch

from mhaexport.verify import verify_folder
from mhaexport.verify.results import CHECKS, SERVING_CHECKS


def floors(folder: str) -> str:
    rep = verify_folder(folder, runtimes=("ort-cpu",), checks=SERVING_CHECKS)
    cells = []
    for ch in SERVING_CHECKS:
        e, o = rep.results["eager"][ch], rep.results["ort-cpu"][ch]
        cells.append(f"{ch}: floor {e.figures.max_abs:.3g} / ort-cpu {o.figures.max_abs:.3g} "
                     f"(allowed {o.figures.allowed:.3g}, {'passed' if o.status else o.status})")
    return f"{folder}: " + " | ".join(cells)


def cost(folder: str, repeats: int = 3) -> str:
    base = tuple(c for c in CHECKS if c not in SERVING_CHECKS)
    verify_folder(folder, checks=base)  # warm
    without, with_ = [], []
    for _ in range(repeats):
        t = time.perf_counter()
        verify_folder(folder, checks=base)
        without.append(time.perf_counter() - t)
        t = time.perf_counter()
        verify_folder(folder, checks=CHECKS)
        with_.append(time.perf_counter() - t)
    return (f"{folder}: default checks without the serving ones {statistics.median(without):.2f} s, with them "
            f"{statistics.median(with_):.2f} s (medians of {repeats}, default runtimes)")


if __name__ == "__main__":
    torch.set_num_threads(2)
    folders = [a for a in sys.argv[1:] if not a.startswith("--")]
    for f in folders:
        print(floors(f), flush=True)
    if "--cost" in sys.argv and folders:
        print(cost(folders[0]))
