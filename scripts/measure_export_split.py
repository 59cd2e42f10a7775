"""Where the --hf export's time goes against onnxruntime-genai's builder's, in one run (alternating rows, three
rounds, OMP/MKL threads 2, each row a whole process): each tool's imports alone, the builder, our export with an
empty user cache (traced) and with a cache an earlier export of the architecture filled (no trace). Run in a
folder holding the bench-size Llama as ``llama-hf`` (``scripts/measure_quantize.py``'s ``build_llama``):

    cd WORK && python "$REPO/scripts/measure_export_split.py"
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import time

ENV = {**os.environ, "OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "2"}
PY = sys.executable
OURS = [PY, "-m", "mhaexport", "-q", "onnx", "--hf", "llama-hf", "--replace"]


def rows(i: int) -> dict[str, tuple[list[str], dict]]:
    """Each row's command and environment in round ``i`` (its own output and cache folders)."""
    return {
        "builder: imports only": ([PY, "-c", "import onnxruntime_genai.models.builder"], ENV),
        "builder": ([PY, "-m", "onnxruntime_genai.models.builder", "-m", "bench-llama", "-i", "llama-hf",
                     "-o", f"ob{i}", "-p", "fp32", "-e", "cpu", "-c", f"cb{i}"], ENV),
        "ours: imports only": ([PY, "-c", "import os, mhaexport.cli, torch, transformers, onnx, onnxscript; "
                                "from transformers import LlamaForCausalLM; os._exit(0)"], ENV),
        "ours cold": (OURS + ["-o", f"oc{i}"], {**ENV, "MHAEXPORT_CACHE_DIR": f"cc{i}"}),
        "ours warm": (OURS + ["-o", f"ow{i}"], {**ENV, "MHAEXPORT_CACHE_DIR": "cw"}),
    }


def main() -> None:
    # the warm rows' cache, filled once by an export of this architecture and width
    shutil.rmtree("cw", ignore_errors=True)
    subprocess.run(OURS + ["-o", "ow-fill"], env={**ENV, "MHAEXPORT_CACHE_DIR": "cw"}, check=True,
                   capture_output=True)
    out: dict[str, list[float]] = {k: [] for k in rows(0)}
    for i in range(3):
        for name, (cmd, env) in rows(i).items():
            for folder in (f"ob{i}", f"cb{i}", f"oc{i}", f"cc{i}", f"ow{i}"):
                shutil.rmtree(folder, ignore_errors=True)
            t0 = time.perf_counter()
            subprocess.run(cmd, env=env, check=True, capture_output=True)
            out[name].append(time.perf_counter() - t0)
            print(f"round {i + 1} {name}: {out[name][-1]:.2f} s", flush=True)
    print("| row | seconds (each round) | median |")
    print("|---|---|---:|")
    for name, secs in out.items():
        print(f"| {name} | {', '.join(f'{s:.1f}' for s in secs)} | {statistics.median(secs):.1f} |")


if __name__ == "__main__":
    main()
