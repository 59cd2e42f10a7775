"""The --hf export's time against onnxruntime-genai's builder on the same folder (the bench-size random Llama of
scripts/measure_quantize.py: 8 layers, d 512, vocab 32000), alternating, in one run:

- ``builder``: ``python -m onnxruntime_genai.models.builder -p fp32 -e cpu`` into a fresh folder and cache;
- ``ours cold``: ``mhaexport onnx --hf`` with an empty user cache (traced now: 3 layers traced, 5 copied);
- ``ours warm``: the same with the cache an earlier export of this architecture and width filled — of another
  model: 5 layers, other weights (the trace reused: no torch.export);
- ``ours whole``: ``MHAEXPORT_TRACE=fresh`` (every layer traced, the cache neither read nor written: the path before
  layers were copied);
- ``builder imports``, ``ours imports``: each tool's imports alone (what its run pays before any work: the builder's
  module; mhaexport's CLI, torch, transformers' Llama, onnx, onnxscript), so that a run less its imports is its work.

Each row is a whole process (Python start and imports included), OMP/MKL threads 2. Prints each pair's seconds and
the median ratio of each row to the builder's.

    python scripts/measure_export_speed.py /tmp/export-speed [PAIRS]
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

ENV = {**os.environ, "OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "2"}
# each tool's imports alone (ours ends as its console script does, with os._exit: no interpreter teardown)
IMPORTS = {"builder imports": "import onnxruntime_genai.models.builder",
           "ours imports": "import os, mhaexport.cli, torch, transformers, onnx, onnxscript; "
                           "from transformers import LlamaForCausalLM; os._exit(0)"}


def timed(cmd: list[str], env: dict) -> float:
    t0 = time.perf_counter()
    res = subprocess.run(cmd, env=env, capture_output=True, text=True)
    took = time.perf_counter() - t0
    if res.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} exited {res.returncode}:\n{res.stderr[-3000:]}")
    return took


def build_other(hf: Path, out: Path) -> Path:
    """Another Llama of the bench width: 5 layers, other random weights, the same tokenizer — what fills the warm
    cache, so the warm row reuses a trace made for another model, not for the folder it exports."""
    other = out / "llama-other"
    if (other / "config.json").is_file():
        return other
    import torch
    from measure_quantize import LLAMA
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(1)
    cfg = LlamaConfig(**{**LLAMA, "num_hidden_layers": 5}, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    LlamaForCausalLM(cfg).eval().save_pretrained(other)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (hf / name).is_file():
            shutil.copy(hf / name, other / name)
    return other


def main() -> None:
    from measure_quantize import build_llama

    work = Path(sys.argv[1])
    pairs = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    work.mkdir(parents=True, exist_ok=True)
    hf = build_llama(work)
    other = build_other(hf, work)
    ours = [sys.executable, "-m", "mhaexport", "-q", "onnx", "--hf", str(hf), "--replace"]
    warm_cache = work / "cache-warm"
    shutil.rmtree(warm_cache, ignore_errors=True)
    # the warm cache is filled by the other model's export (5 layers, other weights): the trace is keyed by the
    # architecture's code, config and shapes, not by depth or weights
    timed([sys.executable, "-m", "mhaexport", "-q", "onnx", "--hf", str(other), "--replace", "-o",
           str(work / "warmup")], {**ENV, "MHAEXPORT_CACHE_DIR": str(warm_cache)})
    rows: dict[str, list[float]] = {"builder": [], "ours cold": [], "ours warm": [], "ours whole": [],
                                    "builder imports": [], "ours imports": []}
    for i in range(pairs):
        for name in rows:
            out, cache = work / f"out-{name.replace(' ', '-')}", work / f"cache-{i}-{name.replace(' ', '-')}"
            shutil.rmtree(out, ignore_errors=True)
            shutil.rmtree(cache, ignore_errors=True)
            if name.endswith("imports"):
                cmd = [sys.executable, "-c", IMPORTS[name]]
                env = ENV
            elif name == "builder":
                cmd = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-m", "bench-llama", "-i", str(hf),
                       "-o", str(out), "-p", "fp32", "-e", "cpu", "-c", str(cache)]
                env = ENV
            else:
                cmd = ours + ["-o", str(out)]
                env = {**ENV, "MHAEXPORT_CACHE_DIR": str(warm_cache if name == "ours warm" else cache)}
                if name == "ours whole":
                    env["MHAEXPORT_TRACE"] = "fresh"
            rows[name].append(timed(cmd, env))
            # each export row did what it says: the trace reused only where warm
            if name.startswith("ours") and not name.endswith("imports"):
                how = json.loads((out / "manifest.json").read_text())["artifacts"]["onnx"]["exporter"]
                if ("reused" in how) != (name == "ours warm"):
                    raise SystemExit(f"{name}: the manifest says {how!r}")
            print(f"pair {i + 1} {name}: {rows[name][-1]:.1f} s", flush=True)
    print("\n| row | seconds (each pair) | median | median ratio to the builder (pair by pair) |")
    print("|---|---|---:|---:|")
    for name, secs in rows.items():
        ratios = [s / b for s, b in zip(secs, rows["builder"])]
        print(f"| {name} | {', '.join(f'{s:.1f}' for s in secs)} | {statistics.median(secs):.1f} | "
              f"{statistics.median(ratios):.2f} |")


if __name__ == "__main__":
    main()
