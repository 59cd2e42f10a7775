"""Measure `mhaexport all --hf DIR` on each proved Hugging Face architecture and write the table.

    python scripts/measure_hf.py -o docs/measurements/hf-architectures.md [--work /tmp/hf-measure] [ARCH ...]

For each architecture: build the tiny random model of tests/hf_models.py (seed 0) with the tokenizer trained there,
save it to WORK/ARCH, run `python -m mhaexport all --hf WORK/ARCH -o WORK/ARCH-out` (wall time measured around
the subprocess), then read the export times from the manifest (`export_seconds` per artifact), the worst parity
max-abs over the non-eager runtimes from report.json, and the verdict. Nothing is downloaded.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]  # this checkout's mhaexport (not an installed one) and the configs

from hf_models import PROVED, config_summary, configs, save_tiny  # noqa: E402


def measure(arch: str, work: Path) -> dict:
    """Save, run `all`, read the manifest and report: one table row."""
    src, out = work / arch, work / f"{arch}-out"
    save_tiny(arch, src)
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "mhaexport", "all", "--hf", str(src), "-o", str(out)],
                          capture_output=True, text=True, cwd=ROOT, check=False)
    wall = time.perf_counter() - started
    row = {"arch": arch, "exit": proc.returncode, "wall_s": round(wall, 1)}
    if not (out / "report.json").is_file():
        row["error"] = (proc.stderr.strip().splitlines() or ["?"])[-1]
        return row
    manifest = json.loads((out / "manifest.json").read_text())
    report = json.loads((out / "report.json").read_text())
    row["architecture"] = manifest["model"]["source"].get("architecture")
    row["export_s"] = {k: a.get("export_seconds") for k, a in manifest["artifacts"].items()}
    parity = {rt: checks["parity"]["figures"].get("max_abs") for rt, checks in report["results"].items()
              if rt != "eager" and checks.get("parity", {}).get("status") is not None}
    row["parity"] = parity
    row["worst_parity"] = max((v for v in parity.values() if v is not None), default=None)
    row["verdict"] = report["verdict"]["status"]
    row["checks"] = report["counts"]
    row["verify_s"] = round(report.get("seconds", 0.0), 1)
    row["warnings"] = manifest["artifacts"]["torchscript"].get("warnings", []) if "torchscript" in manifest[
        "artifacts"] else []
    row["max_abs_logit"] = logit_scale(src)
    return row


def logit_scale(src: Path) -> float:
    """max |logit| of the model on a seeded (2, 7) prompt: the scale the parity figures are read against."""
    import torch

    from mhaexport.models.inputs import make_inputs
    from mhaexport.models.loading import load_model

    loaded = load_model(hf=src)
    ids, mask, past = make_inputs(loaded.contract, batch=2, seq=7, past=0)
    with torch.no_grad():
        logits, _ = loaded.module(ids, mask, past)  # (2, 7, V)
    return round(float(logits.abs().max()), 3)


def render(rows: list[dict], cfgs: dict, load_before: tuple[float, ...]) -> str:
    load = os.getloadavg()
    lines = [
        "# Hugging Face architectures: `mhaexport all --hf DIR` on tiny random models",
        "",
        f"Measured {date.today().isoformat()} on {platform.node() or 'this machine'} ({os.cpu_count()} CPUs; 1-minute "
        f"load average {load_before[0]:.1f} before, {load[0]:.1f} after: a shared machine where other jobs ran, so "
        "read the times as orders of magnitude), Python " + platform.python_version() + ".",
        "",
        "Made by `python scripts/measure_hf.py -o docs/measurements/hf-architectures.md`, which for each "
        "architecture builds the tiny model of `tests/hf_models.py` (seeded random weights, the byte-level BPE "
        "tokenizer of 300 tokens trained on `data/*.txt`), saves it with `save_pretrained`, and runs",
        "",
        "```bash",
        "python -m mhaexport all --hf WORK/ARCH -o WORK/ARCH-out",
        "```",
        "",
        "Export times are the manifest's `export_seconds` (ONNX: torch.onnx dynamo export, checks, genai config, "
        "tokenizer copy; TorchScript: `torch.jit.trace`); *wall* is the whole command (Python start-up, importing "
        "torch and transformers, loading, both exports, verify). *Worst parity* is the largest max-abs difference "
        "from eager over the quick sweep (9 shapes) on any runtime that ran (TorchScript, ONNX Runtime CPU; CUDA is "
        "absent here and reported skipped). Tolerance atol 1e-4, rtol 1e-3. *max |logit|* is the model's largest "
        "logit on a seeded 2 x 7 prompt: the default Hugging Face initialization (std 0.02) gives small logits, so "
        "read the parity figures against it (float32 rounding is about 1e-7 of the values summed).",
        "",
        "| architecture | model_type | ONNX export s | TorchScript export s | wall s | worst parity (max abs) | "
        "max \\|logit\\| | checks | verdict |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['arch']} | — | — | — | {r['wall_s']} | — | — | — | exit {r['exit']}: {r['error']} |")
            continue
        c = r["checks"]
        ex = r["export_s"]
        worst = f"{r['worst_parity']:.1e}" if r["worst_parity"] is not None else "—"
        lines.append(f"| {r['architecture']} | {cfgs[r['arch']].model_type} | {ex.get('onnx', '—')} | "
                     f"{ex.get('torchscript', '—')} | {r['wall_s']} | {worst} | {r['max_abs_logit']} | "
                     f"{c['passed']} passed, {c['failed']} failed, {c['skipped']} skipped | "
                     f"{r['verdict']} (exit {r['exit']}) |")
    lines += ["", "Parity per runtime (max abs vs eager):", ""]
    for r in rows:
        if "parity" in r:
            lines.append(f"- {r['arch']}: " + ", ".join(f"{k} {v:.1e}" for k, v in r["parity"].items()))
    lines += ["", "## The tiny configs", "",
              "| name | " + " | ".join(("layers", "hidden", "heads", "kv heads", "head_dim", "mlp", "vocab",
                                        "positions")) + " |",
              "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        s = config_summary(cfgs[r["arch"]])
        heads = s.get("num_attention_heads")
        kv = s.get("num_key_value_heads", heads)
        hd = s.get("head_dim") or (s.get("hidden_size", 0) // heads if heads else "—")
        lines.append(f"| {r['arch']} | {s.get('num_hidden_layers')} | {s.get('hidden_size')} | {heads} | {kv} | "
                     f"{hd} | {s.get('intermediate_size', '4 x hidden')} | {s.get('vocab_size')} | "
                     f"{s.get('max_position_embeddings')} |")
    lines += ["", "Every config sets bos/eos/pad = 1/2/0 (the tokenizer's `<s>`, `</s>`, `<pad>`); Mistral and "
              "Phi-3 have `sliding_window=None`; Gemma has one key/value head and `head_dim=16`; GPT-2's MLP is "
              "4 x hidden.", ""]
    warns = {w for r in rows for w in r.get("warnings", [])}
    if warns:
        lines += ["Warnings the TorchScript trace reported (the same on every architecture):", ""]
        lines += [f"- {w[:160]}" for w in sorted(warns)]
        lines += ["", "They come from transformers' cache and mask code, and each fixes a value the contract "
                  "keeps fixed: `DynamicLayer.lazy_initialization` makes an empty `torch.tensor([])` that the past is "
                  "concatenated to (a constant at every shape); `get_seq_length` asks `keys.numel() == 0`, traced "
                  "with past=5 as `keys.shape[-2]`, which is also right (0) at past=0; the mask's `padding_length = "
                  "kv_length + kv_offset - attention_mask.shape[-1] > 0` is always false under the contract (the "
                  "mask covers past + new exactly). verify's dynamic-shapes, padding, kv-consistency and generation "
                  "checks run the TorchScript file at past 0..63 and seq 1..64 and pass.", ""]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("archs", nargs="*", default=list(PROVED))
    ap.add_argument("-o", "--output", type=Path, required=True)
    ap.add_argument("--work", type=Path, default=Path("/tmp/mhaexport-hf-measure"))
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    cfgs = configs()
    load_before = os.getloadavg()
    rows = []
    for arch in args.archs:
        print(f"{arch} ...", file=sys.stderr, flush=True)
        rows.append(measure(arch, args.work))
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    args.output.write_text(render(rows, cfgs, load_before))
    (args.output.with_suffix(".json")).write_text(json.dumps(rows, indent=2) + "\n")
    print(f"wrote {args.output}", file=sys.stderr)


if __name__ == "__main__":
    main()
