"""Re-measure the fused exports after the check_onnx fix: every windowed Hugging Face family x (fused, concat) and
(fused, shared) — export, the beyond-window figure against transformers' own forward, verify's verdict and ort-cpu
parity — and the bench-size Llama's fused + shared file against onnxruntime-genai's builder's fp32 file, timed in
one `mhaexport bench` run (ratios within the run). Prints Markdown tables for docs/measurements.

    python scripts/measure_fused_paths.py /tmp/fused-measure
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "scripts"))


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mhaexport", *args], capture_output=True, text=True,
                          env={**os.environ, "OMP_NUM_THREADS": "2"})


def families(work: Path) -> list[str]:
    from hf_models import WINDOWED, beyond_window, save_tiny

    rows = ["| family | lowering | cache | export | max abs vs transformers, positions 8-23 | verify | ort-cpu parity |",
            "|---|---|---|---|---:|---|---:|"]
    for name in WINDOWED:
        hf = work / "hf" / name
        if not (hf / "config.json").is_file():
            save_tiny(name, hf)
        for cache in ("concat", "shared"):
            out = work / f"{name}-fused-{cache}"
            t0 = time.perf_counter()
            res = cli("onnx", "-q", "--hf", str(hf), "-o", str(out), "--attention", "fused", "--kv-cache", cache,
                      "--replace")
            took = time.perf_counter() - t0
            if res.returncode != 0:
                line = (res.stderr.strip().splitlines() or ["?"])[-1][:110]
                rows.append(f"| {name} | fused | {cache} | exit {res.returncode}: {line} | — | — | — |")
                continue
            diff = beyond_window(out, hf)
            ver = cli("verify", str(out), "--runtime", "ort-cpu", "-o", str(out / "verify"))
            rep = json.loads(next((out / "verify").glob("report*.json")).read_text())
            parity = rep["results"].get("ort-cpu", {}).get("parity", {}).get("figures", {}).get("max_abs")
            rows.append(f"| {name} | fused | {cache} | exported ({took:.0f} s) | {diff:.1e} | exit {ver.returncode} | "
                        f"{parity} |")
            print(rows[-1], flush=True)
    return rows


def against_builder(work: Path) -> list[str]:
    from measure_quantize import build_llama

    hf = build_llama(work / "llama")
    ours = work / "llama-fs"
    res = cli("onnx", "-q", "--hf", str(hf), "--attention", "fused", "--kv-cache", "shared", "-o", str(ours),
              "--replace")
    assert res.returncode == 0, res.stderr
    res = cli("-q", "bench", str(ours), "--builder", "fp32", "--runtimes", "ort-cpu,ort-genai", "--threads", "2",
              "--repeats", "5", "--long", "0", "-o", str(work / "bench"))
    assert res.returncode == 0, res.stderr[-3000:]
    bench = json.loads((work / "bench" / "bench.json").read_text())
    out = ["| row | token p50 (ms) | tokens/s |", "|---|---:|---:|"]
    for r in bench["runtimes"]:
        if r.get("ran"):
            out.append(f"| {r['label']} | {r['token_p50_ms']:.2f} | {r['tokens_per_s']:.1f} |")
    for lr in bench.get("lowerings") or []:
        out.append(f"| {lr.get('label')} | {lr.get('token_p50_ms')} | |")
    return out


def main() -> None:
    work = Path(sys.argv[1])
    work.mkdir(parents=True, exist_ok=True)
    print("\n".join(families(work)), flush=True)
    print("\n".join(against_builder(work)), flush=True)


if __name__ == "__main__":
    main()
