"""Anonymous memory of a quantized (MatMulNBits, accuracy level 4) file's ONNX Runtime session and its float-activation
twin's, opened as verify's mapped mode opens them (weights mapped, MatMulNBits packed): both at once, and one at a
time (docs/measurements/big-models-2026-12-06.md, "The float-activation twin, one session at a time").

    python scripts/measure_twin_memory.py QUANTIZED_FOLDER
"""

from __future__ import annotations

import dataclasses
import gc
import sys

from mhaexport.artifact import ExportFolder
from mhaexport.runners.registry import float_activation_twin, runner_for
from mhaexport.runtime.spill import return_freed_memory


def anon() -> int:
    """This process's anonymous resident memory, bytes (/proc/self/status)."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("RssAnon"))


def main() -> None:
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
