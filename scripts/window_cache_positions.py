"""Per-token decode cost against position: a ``--kv-cache shared`` export (full-length buffers) against a
``--kv-cache window`` export of the same model (its windowed layers' buffers W + 16 slots), one row, bound as the
deploy loop binds them (each layer's buffer as its past and its present, written in place), one thread.

    python scripts/window_cache_positions.py N DIR    # DIR/b_shared and DIR/b_window: the two export folders

Prints the median step time over 128-step bins (the fastest of 3 runs per step). Measured numbers:
docs/measurements/window-cache-2026-12-04.md."""

from __future__ import annotations

import json
import sys
import time

import numpy as np
import onnxruntime as ort

REPEATS = 3


def step_times(folder: str, n: int) -> np.ndarray:
    """The fastest of REPEATS runs of each of ``n`` one-token steps, in seconds."""
    entry = json.load(open(f"{folder}/manifest.json"))["artifacts"]["onnx"]
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    s = ort.InferenceSession(f"{folder}/model.onnx", so, providers=["CPUExecutionProvider"])
    past = [i.name for i in s.get_inputs() if i.name.startswith("past_key_values")]
    shape = next(i.shape for i in s.get_inputs() if i.name == past[0])  # (B, H_kv, slots, D)
    slots = entry.get("window_slots") or [0] * (len(past) // 2)
    best = None
    for _ in range(REPEATS):
        io = s.io_binding()
        for i, name in enumerate(past):  # (1, H_kv, slots, D): W + 16 on a windowed layer, else n + 1
            buf = np.zeros((1, shape[1], slots[i // 2] or n + 1, shape[3]), np.float32)
            value = ort.OrtValue.ortvalue_from_numpy(buf)
            io.bind_ortvalue_input(name, value)
            io.bind_ortvalue_output(name.replace("past_key_values", "present"), value)
        times = []
        for t in range(n):
            io.bind_cpu_input("input_ids", np.array([[t % 1000]], np.int64))
            io.bind_cpu_input("attention_mask", np.ones((1, t + 1), np.int64))
            io.bind_output("logits", "cpu")
            start = time.perf_counter()
            s.run_with_iobinding(io)
            times.append(time.perf_counter() - start)
        best = np.array(times) if best is None else np.minimum(best, times)
    return best


def main(n: int, root: str) -> None:
    got = {kind: step_times(f"{root}/b_{kind}", n) for kind in ("shared", "window")}
    for lo in (0, 128, 256, 512, 1024, 1536, n - 128):
        if lo + 128 <= n:
            a, b = (np.median(got[k][lo:lo + 128]) * 1e3 for k in ("shared", "window"))
            print(f"positions {lo:5d}-{lo + 127:5d}: shared {a:.3f} ms/token, window {b:.3f} ms/token")


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else ".")
