"""Run `mhaexport verify FILE.onnx --hf DIR` on what other tools export for the proved Hugging Face architectures.

    python scripts/measure_foreign.py -o /tmp/foreign.md [--work /tmp/mhaexport-foreign]
        [--optimum-python /tmp/optenv/bin/python] [ARCH ...]

For each architecture of tests/hf_models.py (seed 0, the trained tokenizer) saved to WORK/hf/ARCH:

- onnxruntime-genai's model builder, fp32 and int4 (`python -m onnxruntime_genai.models.builder -m tiny-ARCH -i
  WORK/hf/ARCH -o WORK/genai/ARCH-PREC -p PREC -e cpu -c WORK/genai/cache-ARCH-PREC`); an architecture it refuses is
  recorded with its last error line. Phi-3's tiny config keeps transformers' default
  original_max_position_embeddings (4096) next to max_position_embeddings 64, which sends the builder to its LongRoPE
  path; the same weights with original_max_position_embeddings = 64 (the same eager model: default RoPE either way)
  are built too, as `phi3-orig64`.
- Optimum (`optimum-cli export onnx --model WORK/hf/ARCH --task text-generation-with-past WORK/optimum/ARCH`, and
  with `--optimize O2`), run by the Python of ANOTHER virtual environment (`--optimum-python`): optimum-onnx 0.1.0
  needs transformers<4.58, this project transformers>=5.24. Without it these rows are left out.
- a plain `torch.onnx.export(dynamo=True)` with no names given, of `llama` (the exporter's own I/O names).

Then for each file: `python -m mhaexport verify FILE --hf WORK/hf/ARCH -o WORK/verify/NAME` (quick sweep, this
checkout's code), and the tables are read from WORK/verify/NAME/report.json. For the builder's files,
onnxruntime-genai's own generator also decodes a right-padded batch of two prompts on the adopted folder, compared
with eager greedy decoding of each prompt alone; for Optimum's files, Optimum's own ORTModelForCausalLM.generate does
the same on a left-padded batch (in the Optimum venv). Nothing is downloaded. `--render OUTPUT.json` only rewrites the
tables from a saved run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]  # this checkout's mhaexport (not an installed one) and the configs

from hf_models import PROVED, save_tiny  # noqa: E402

CHECK_COLS = ("parity", "causality", "kv-consistency", "padding", "dynamic-shapes", "generation")
PRECISIONS = ("fp32", "int4")


def last_error(text: str) -> str:
    """The last exception line (``SomeError: ...``) and the lines that continue its message, else the last line."""
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    starts = [i for i, ln in enumerate(lines) if re.match(r"[\w.]*(Error|Exception|InvalidArgument|Fail)\w*: ", ln)]
    if starts:
        return " ".join(lines[starts[-1]:starts[-1] + 3])
    return lines[-1] if lines else "?"


def run(cmd: list[str], log: Path, cwd: Path | None = None) -> tuple[int, float, str]:
    started = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, check=False)
    log.write_text(f"$ {' '.join(cmd)}\n{proc.stdout}\n{proc.stderr}")
    return proc.returncode, round(time.perf_counter() - started, 1), proc.stdout + "\n" + proc.stderr


def save_models(work: Path, archs: list[str]) -> dict[str, Path]:
    dirs = {}
    for arch in archs:
        d = work / "hf" / arch
        if not (d / "config.json").is_file():
            save_tiny(arch, d)
        dirs[arch] = d
    if "phi3" in archs:  # the builder's plain Phi-3 path: original_max_position_embeddings == max_position_embeddings
        d = work / "hf" / "phi3-orig64"
        if not (d / "config.json").is_file():
            shutil.copytree(dirs["phi3"], d)
            cfg = json.loads((d / "config.json").read_text())
            cfg["original_max_position_embeddings"] = cfg["max_position_embeddings"]
            (d / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
        dirs["phi3-orig64"] = d
    return dirs


def build_genai(work: Path, dirs: dict[str, Path]) -> list[dict]:
    rows = []
    for arch, hf in dirs.items():
        for prec in PRECISIONS:
            out = work / "genai" / f"{arch}-{prec}"
            shutil.rmtree(out, ignore_errors=True)
            out.parent.mkdir(parents=True, exist_ok=True)
            cmd = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-m", f"tiny-{arch}", "-i", str(hf),
                   "-o", str(out), "-p", prec, "-e", "cpu", "-c", str(work / "genai" / f"cache-{arch}-{prec}")]
            rc, secs, text = run(cmd, work / "genai" / f"{arch}-{prec}.log")
            rows.append({"tool": "onnxruntime-genai builder", "name": f"genai-{arch}-{prec}", "arch": arch,
                         "variant": prec, "hf": str(hf),
                         "build_exit": rc, "build_s": secs, "file": str(out / "model.onnx"),
                         **({"build_error": last_error(text)} if rc or not (out / "model.onnx").is_file() else {})})
            print(f"builder {arch} {prec}: exit {rc} in {secs} s", file=sys.stderr, flush=True)
    return rows


def build_optimum(work: Path, dirs: dict[str, Path], python: Path) -> list[dict]:
    cli = python.parent / "optimum-cli"
    rows = []
    for arch in PROVED:
        if arch not in dirs:
            continue
        for variant, extra in (("fp32", []), ("fp32 --optimize O2", ["--optimize", "O2"])):
            name = arch + ("-O2" if extra else "")
            out = work / "optimum" / name
            shutil.rmtree(out, ignore_errors=True)
            out.parent.mkdir(parents=True, exist_ok=True)
            cmd = [str(cli), "export", "onnx", "--model", str(dirs[arch]), "--task", "text-generation-with-past",
                   *extra, str(out)]
            rc, secs, text = run(cmd, work / "optimum" / f"{name}.log")
            rows.append({"tool": "Optimum", "name": f"optimum-{name}", "arch": arch, "variant": variant,
                         "hf": str(dirs[arch]),
                         "build_exit": rc, "build_s": secs, "file": str(out / "model.onnx"),
                         **({"build_error": last_error(text)} if rc or not (out / "model.onnx").is_file() else {})})
            print(f"optimum {name}: exit {rc} in {secs} s", file=sys.stderr, flush=True)
    return rows


def export_plain(work: Path, dirs: dict[str, Path], arch: str = "llama") -> list[dict]:
    """torch.onnx.export with no names given (tests/hf_models.py's export_plain)."""
    from hf_models import export_plain as plain_export

    from mhaexport.models.loading import load_model

    out = work / "plain" / arch
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    plain_export(load_model(hf=dirs[arch]), out / "model.onnx")
    secs = round(time.perf_counter() - started, 1)
    print(f"plain torch.onnx {arch}: {secs} s", file=sys.stderr, flush=True)
    return [{"tool": "torch.onnx.export", "name": f"plain-{arch}", "arch": arch, "variant": "fp32, no names given",
             "hf": str(dirs[arch]),
             "build_exit": 0, "build_s": secs, "file": str(out / "model.onnx")}]


def verify(work: Path, row: dict) -> None:
    name = row["name"]
    out = work / "verify" / name
    shutil.rmtree(out, ignore_errors=True)
    cmd = [sys.executable, "-m", "mhaexport", "verify", row["file"], "--hf", row["hf"], "-o", str(out)]
    rc, secs, text = run(cmd, work / "verify" / f"{name}.log", cwd=ROOT)
    row.update(verify_exit=rc, verify_wall_s=secs, verify_dir=str(out),
               command=f"python -m mhaexport verify {row['file']} --hf {row['hf']} -o {out}")
    if not (out / "report.json").is_file():
        row["verify_error"] = last_error(text)
        return
    from mhaexport.verify.render import cell
    from mhaexport.verify.report import VerifyReport

    data = json.loads((out / "report.json").read_text())
    rep = VerifyReport.from_dict(data)
    from mhaexport.artifact import read_manifest

    details = read_manifest(out).artifacts["onnx"].details
    row["adopted_as"] = f"{details.producer}: {data['artifacts']['onnx'].get('protocol', '?')}"
    if details.quantization:
        row["quantization"] = details.quantization.to_dict()
    row["verdict"] = f"{data['verdict']['status']} (exit {data['verdict']['exit_code']})"
    row["counts"] = data["counts"]
    row["cells"] = {ch: cell(rep.results.get("ort-cpu", {}).get(ch)) for ch in CHECK_COLS}
    row["failures"] = {ch: r.message for ch, r in rep.results.get("ort-cpu", {}).items() if r.status is False}
    row["figures"] = {ch: r.figures for ch, r in rep.results.get("ort-cpu", {}).items()}
    other = rep.other_protocol
    if other:
        res = other.results.get("ort-cpu:plain", {})
        row["plain_cells"] = {ch: cell(res.get(ch)) for ch in CHECK_COLS}
        row["plain_failures"] = {ch: r.message for ch, r in res.items() if r.status is False}
        row["plain_figures"] = {ch: r.figures for ch, r in res.items()}
    print(f"verify {name}: {row['verdict']} in {secs} s", file=sys.stderr, flush=True)


GENAI_PROMPTS = ([1, 40, 41, 42, 43], [1, 50, 60, 70, 80, 90, 100, 110, 120])  # batched right-padded by genai
GENAI_NEW = 8


def genai_batch(row: dict) -> None:
    """onnxruntime-genai's own generator (the producer's runtime) on the adopted folder: GENAI_PROMPTS as one
    batch, greedy, against eager greedy decoding of each prompt alone (full recompute, transformers)."""
    import torch
    import transformers

    from mhaexport.runtime.genai import genai_greedy

    model = transformers.AutoModelForCausalLM.from_pretrained(row["hf"]).eval()
    theirs = genai_greedy(row["verify_dir"], GENAI_PROMPTS, max_length=max(map(len, GENAI_PROMPTS)) + GENAI_NEW)
    out = []
    for prompt, seq in zip(GENAI_PROMPTS, theirs):
        ids = list(prompt)
        with torch.no_grad():
            while len(ids) < len(seq):
                ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
        new, want = seq[len(prompt):], ids[len(prompt):]
        first = next((i for i, (a, b) in enumerate(zip(new, want)) if a != b), None)
        out.append(f"{len(new)}/{len(new)}" if first is None else f"differs from step {first}")
    row["genai_batch"] = ", ".join(out)
    print(f"genai batch {row['name']}: {row['genai_batch']}", file=sys.stderr, flush=True)


OPTIMUM_GENERATE = """
import json, sys, torch, transformers
from optimum.onnxruntime import ORTModelForCausalLM
folder, hf, prompts, new = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), int(sys.argv[4])
width = max(map(len, prompts))
ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])  # left-padded, as Optimum's loop expects
mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
kw = dict(max_new_tokens=new, do_sample=False, pad_token_id=0, eos_token_id=None)
theirs = ORTModelForCausalLM.from_pretrained(folder, use_cache=True).generate(input_ids=ids, attention_mask=mask, **kw)
eager = transformers.AutoModelForCausalLM.from_pretrained(hf).eval()
out = []
for b, p in enumerate(prompts):
    with torch.no_grad():
        want = eager.generate(input_ids=torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long), **kw)
    a, w = theirs[b, width:].tolist(), want[0, len(p):].tolist()
    first = next((i for i, (x, y) in enumerate(zip(a, w)) if x != y), None)
    out.append(f"{len(a)}/{len(a)}" if first is None else f"differs from step {first}")
print(json.dumps(out))
"""


def optimum_generate(row: dict, python: Path) -> None:
    """Optimum's own loop (ORTModelForCausalLM.generate, in the Optimum venv) on the exported folder: GENAI_PROMPTS
    as one left-padded batch, greedy, against that venv's eager generate of each prompt alone."""
    folder = str(Path(row["file"]).parent)
    proc = subprocess.run([str(python), "-c", OPTIMUM_GENERATE, folder, row["hf"], json.dumps(GENAI_PROMPTS),
                           str(GENAI_NEW)], capture_output=True, text=True, check=False)
    row["optimum_generate"] = (", ".join(json.loads(proc.stdout.strip().splitlines()[-1])) if proc.returncode == 0
                               else f"exit {proc.returncode}: {last_error(proc.stderr)}")
    print(f"optimum generate {row['name']}: {row['optimum_generate']}", file=sys.stderr, flush=True)


def versions(optimum_python: Path | None) -> dict:
    from importlib import metadata

    def ours(pkgs):
        out = {}
        for p in pkgs:
            try:
                out[p] = metadata.version(p)
            except metadata.PackageNotFoundError:
                pass
        return out

    main_pkgs = ("torch", "transformers", "tokenizers", "onnx", "onnxscript", "onnx-ir", "onnxruntime",
                 "onnxruntime-gpu", "onnxruntime-genai", "numpy")
    from mhaexport import __version__

    v = {"mhaexport": __version__, "python": platform.python_version(), "main venv": ours(main_pkgs)}
    if optimum_python:
        code = ("import json,importlib.metadata as m;p=" + repr(("optimum-onnx", "optimum", "transformers", "torch",
                                                                 "onnx", "onnxruntime", "tokenizers")) +
                ";print(json.dumps({k:m.version(k) for k in p}))")
        proc = subprocess.run([str(optimum_python), "-c", code], capture_output=True, text=True, check=False)
        v["optimum venv"] = json.loads(proc.stdout) if proc.returncode == 0 else {"error": proc.stderr[-300:]}
    return v


def render(rows: list[dict], vers: dict) -> str:
    lines = []
    for tool in dict.fromkeys(r["tool"] for r in rows):
        lines += [f"### {tool}", "",
                  ("| architecture | variant | built | adopted as | verdict | ort-cpu parity | kv-consistency | "
                  "padding | dynamic-shapes | generation | failed in the verdict |"),
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in (r for r in rows if r["tool"] == tool):
            if r.get("build_error"):
                lines.append(f"| {r['arch']} | {r['variant']} | refused (exit {r['build_exit']}): "
                             f"`{r['build_error'][:200]}` | — | — | — | — | — | — | — | — |")
                continue
            if r.get("verify_error"):
                lines.append(f"| {r['arch']} | {r['variant']} | {r['build_s']} s | — | exit {r['verify_exit']}: "
                             f"`{r['verify_error'][:200]}` | — | — | — | — | — | — |")
                continue
            c = r["cells"]
            failed = ", ".join(r["failures"]) or "—"
            q = r.get("quantization")
            quant = (f"; {q['label']} ({', '.join(f'{k} x{v}' for k, v in q['ops'].items())})" if q else "")
            lines.append(f"| {r['arch']} | {r['variant']} | {r['build_s']} s | {r['adopted_as']}{quant} | "
                         f"{r['verdict']} | "
                         f"{c['parity']} | {c['kv-consistency']} | {c['padding']} | {c['dynamic-shapes']} | "
                         f"{c['generation']} | {failed} |")
        lines.append("")
        batch = [r for r in rows if r["tool"] == tool and r.get("genai_batch")]
        if batch:
            lines += [("onnxruntime-genai's own generator on the adopted folder, prompts of "
                      f"{' and '.join(str(len(p)) for p in GENAI_PROMPTS)} tokens batched (right-padded by it), "
                      f"{GENAI_NEW} greedy tokens, against eager greedy decoding of each prompt alone:"), "",
                      "| architecture | variant | greedy tokens vs eager's, per prompt (n/n: all equal) |",
                      "|---|---|---|"]
            lines += [f"| {r['arch']} | {r['variant']} | {r['genai_batch']} |" for r in batch]
            lines.append("")
        batch = [r for r in rows if r["tool"] == tool and r.get("optimum_generate")]
        if batch:
            lines += [("Optimum's own loop (`ORTModelForCausalLM.generate`, in the Optimum venv) on the exported "
                      f"folder, prompts of {' and '.join(str(len(p)) for p in GENAI_PROMPTS)} tokens as one "
                      "left-padded batch, "
                      f"{GENAI_NEW} greedy tokens, against that venv's eager `generate` of each prompt alone:"), "",
                      "| architecture | variant | greedy tokens vs eager's, per prompt (n/n: all equal) |",
                      "|---|---|---|"]
            lines += [f"| {r['arch']} | {r['variant']} | {r['optimum_generate']} |" for r in batch]
            lines.append("")
        plain = [r for r in rows if r["tool"] == tool and r.get("plain_cells")]
        if plain:
            lines += [("Under the plain protocol (concat cache, left padding; `ort-cpu:plain`, findings, not in the "
                      "verdict):"), "",
                      "| architecture | variant | " + " | ".join(CHECK_COLS) + " |",
                      "|---|---|" + "---|" * len(CHECK_COLS)]
            for r in plain:
                lines.append(f"| {r['arch']} | {r['variant']} | " + " | ".join(r["plain_cells"][ch]
                                                                           for ch in CHECK_COLS) + " |")
            lines.append("")
        groups: dict[tuple, list] = {}  # the same message but for its figures, on several files: listed once
        for r in (r for r in rows if r["tool"] == tool):
            for rt, key in (("ort-cpu", "failures"), ("ort-cpu:plain", "plain_failures")):
                for ch, m in r.get(key, {}).items():
                    shape = re.sub(r"\d+(\.\d+)?(e[-+]?\d+)?", "#", m)
                    groups.setdefault((rt, ch, shape), []).append((f"{r['arch']} {r['variant']}", m))
        if groups:
            lines += ["The failed checks' messages (one per kind; the files it came from, the first file's words):",
                      ""]
            for (rt, ch, _), hits in groups.items():
                lines.append(f"- **{rt} / {ch}** ({', '.join(h for h, _ in hits)}): {hits[0][1][:400]}")
            lines.append("")
    lines += ["Versions: " + json.dumps(vers), ""]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("archs", nargs="*", default=list(PROVED))
    ap.add_argument("-o", "--output", type=Path, required=True, help="the tables (markdown); OUTPUT.json: every row")
    ap.add_argument("--work", type=Path, default=Path("/tmp/mhaexport-foreign"))
    ap.add_argument("--optimum-python", type=Path, default=None,
                    help="python of a venv with optimum-onnx[onnxruntime] and transformers<4.58 (optimum-cli beside)")
    ap.add_argument("--no-plain", action="store_true", help="skip the plain torch.onnx.export of llama (~20 s)")
    ap.add_argument("--render", type=Path, default=None,
                    help="only render the tables again from a saved OUTPUT.json (no build, no verify)")
    args = ap.parse_args()
    if args.render:
        data = json.loads(args.render.read_text())
        args.output.write_text(render(data["rows"], data["versions"]))
        return
    args.work.mkdir(parents=True, exist_ok=True)
    dirs = save_models(args.work, args.archs)
    rows = build_genai(args.work, dirs)
    if args.optimum_python:
        rows += build_optimum(args.work, dirs, args.optimum_python)
    if not args.no_plain and "llama" in dirs:
        rows += export_plain(args.work, dirs)
    (args.work / "verify").mkdir(exist_ok=True)
    for row in rows:
        if not row.get("build_error"):
            verify(args.work, row)
            if row["tool"].startswith("onnxruntime-genai") and row.get("cells"):
                genai_batch(row)
            if row["tool"] == "Optimum" and args.optimum_python:
                optimum_generate(row, args.optimum_python)
    load = os.getloadavg()
    vers = versions(args.optimum_python)
    args.output.write_text(render(rows, vers) + f"\n1-minute load average at the end: {load[0]:.1f}\n")
    args.output.with_suffix(".json").write_text(json.dumps({"versions": vers, "rows": rows}, indent=2) + "\n")
    print(f"wrote {args.output}", file=sys.stderr)


if __name__ == "__main__":
    main()
