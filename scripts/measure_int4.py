"""Issue 28's two speed questions on onnxruntime-genai's builder's own model: what the int4 recipe's choices cost
in the MatMulNBits step, and where an export's time goes.

    python scripts/measure_int4.py recipes -o out/int4 --threads 1 --rounds 20   # ORT profile per recipe, interleaved
    python scripts/measure_int4.py kernels --threads 1,2 --rounds 60             # one MatMulNBits node per config
    python scripts/measure_int4.py export -o out/int4 --repeats 2                 # export time per stage vs builder

`recipes` builds the random Llama of the `bench` size (scripts/measure_quantize.py's build_llama), exports it with
`mhaexport onnx --hf DIR --target ort-cpu` (its float source OUTPUT/ours-float32), quantizes that source with each
recipe (block size, int8 first blocks, accuracy level, embeddings) and runs onnxruntime-genai's builder (int4, CPU)
on the same folder; then every file is loaded in mhaexport's deploy Generator with ONNX Runtime's profiler on and
decoded round-robin (order shuffled per round, batch 1, prompt 32). Per decode step the profile gives model_run and
each kernel's time (MatMulNBits split by bits): the table is p10 / p50 of model_run, the median over rounds of each
round's p50 ratio to the default recipe, and the kernels' mean over the quietest quarter of steps (the machine this
was written on is shared: the quiet steps are the ones that say what the kernels cost).

`kernels` times one MatMulNBits node (M = 1, the bench Llama's K x N shapes) per bits / block / accuracy level /
threads, interleaved: the kernel's own cost without the rest of the graph.

`export` runs `mhaexport onnx` (the default model, `--hf` of a tiny random Llama, and `--hf ... --target ort-cpu`)
with each stage timed (CPU and wall: imports, model build, torch.export, decompositions, translation, onnxscript's
optimizer, our lowering, checks, save, manifest) and the builder on the same tiny Llama (its process's CPU and wall
time), alternated.
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

DEFAULT = "b128, blocks 0-1 int8, acc 4 (default)"


def recipes_table() -> dict:
    """label -> QuantConfig: the default and one change at a time."""
    from mhaexport.exporter.quantize import QuantConfig

    return {
        DEFAULT: QuantConfig(),
        "b128, block 0 int8": QuantConfig(int8_blocks=1),
        "b128, no int8 blocks": QuantConfig(int8_blocks=0),
        "b256, blocks 0-1 int8": QuantConfig(block_size=256),
        "b256, no int8 blocks": QuantConfig(block_size=256, int8_blocks=0),
        "b64, blocks 0-1 int8": QuantConfig(block_size=64),
        "b32, blocks 0-1 int8": QuantConfig(block_size=32),
        "b32, no int8 blocks": QuantConfig(block_size=32, int8_blocks=0),
        "b32, no int8 blocks, embeddings int4 (the builder's recipe)": QuantConfig(block_size=32, int8_blocks=0,
                                                                                    keep_float=()),
        "b128, blocks 0-1 int8, embeddings int4": QuantConfig(keep_float=()),
        "b128, blocks 0-1 int8, acc 1 (fp32 compute)": QuantConfig(accuracy_level=1),
        "b128, blocks 0-1 int8, acc 0 (unset)": QuantConfig(accuracy_level=0),
    }


def slug(label: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in label).strip("-")[:60]


def sh(cmd: list[str]) -> None:
    print("$", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


# ---- recipes: the ORT profile of a decode step per recipe ---------------------------------------------------

def prepare(out: Path, labels: list[str]) -> dict[str, Path]:
    """The target's float source, each recipe's quantized folder, and the builder's int4 adopted: label -> folder."""
    from measure_quantize import build_llama

    from mhaexport.exporter.peer import export_builder
    from mhaexport.exporter.quantize import quantize_folder

    hf = build_llama(out)
    ours = out / "ours"
    if not (ours / "manifest.json").is_file():
        sh([sys.executable, "-m", "mhaexport", "-q", "onnx", "--hf", str(hf), "--target", "ort-cpu", "-o", str(ours)])
    src = out / "ours-float32"
    table = recipes_table()
    folders = {}
    for label in labels:
        f = out / "recipes" / slug(label)
        if not (f / "manifest.json").is_file():
            quantize_folder(src, f, table[label])
        folders[label] = f
    folders["onnxruntime-genai builder int4 (b32, acc 4, embeddings int4)"] = export_builder(src, ["int4"], out)[0]
    return folders


def bits_by_node(model_path: Path) -> dict[str, str]:
    import onnx

    out = {}
    for n in onnx.load(str(model_path), load_external_data=False).graph.node:
        if n.op_type == "MatMulNBits":
            bits = next((a.i for a in n.attribute if a.name == "bits"), 4)
            out[n.name] = f"MatMulNBits/{bits}"
    return out


def step_profile(path: str, bits: dict[str, str], warm_runs: int, runs_per_gen: int) -> list[dict]:
    """ONNX Runtime's profile -> one dict per decode step (each generation's prefill and the warm-up runs left out):
    its generation, model_run us, and us per op type (MatMulNBits as MatMulNBits/BITS)."""
    events = json.loads(Path(path).read_text())
    runs = sorted((e for e in events if e.get("cat") == "Session" and e.get("name") == "model_run"),
                  key=lambda e: e["ts"])[warm_runs:]
    steps = [{"gen": i // runs_per_gen, "ts": e["ts"], "end": e["ts"] + e["dur"], "run": e["dur"], "ops": {}}
             for i, e in enumerate(runs) if i % runs_per_gen]
    starts = [s["ts"] for s in steps]
    for e in events:
        if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time"):
            i = bisect.bisect_right(starts, e["ts"]) - 1
            if i >= 0 and e["ts"] <= steps[i]["end"]:
                op = e.get("args", {}).get("op_name", "?")
                if op == "MatMulNBits":
                    op = bits.get(e["name"][: -len("_kernel_time")], "MatMulNBits/?")
                steps[i]["ops"][op] = steps[i]["ops"].get(op, 0.0) + e["dur"]
    return steps


def quantile(values: list[float], q: float) -> float:
    v = sorted(values)
    return v[min(int(len(v) * q), len(v) - 1)]


def recipes(out: Path, threads: int, rounds: int, new_tokens: int, only: str) -> dict:
    import numpy as np

    from mhaexport.runtime import GenerationConfig, Generator

    labels = [k for k in recipes_table() if k == DEFAULT or not only or any(o in k for o in only.split(","))]
    folders = prepare(out, labels)
    prompt = np.random.default_rng(0).integers(3, 32000, (1, 32), dtype=np.int64)
    warm = 8
    gens = {}
    for label, folder in folders.items():
        prof = out / "profiles" / slug(label)
        prof.mkdir(parents=True, exist_ok=True)
        gens[label] = Generator(folder, threads=threads, profile_prefix=str(prof / "ort"))
        gens[label].generate(prompt, GenerationConfig(max_new_tokens=warm))  # warm-up: `warm` model runs
    rng = random.Random(0)
    loads = []
    for _ in range(rounds):
        order = list(gens)
        rng.shuffle(order)
        for label in order:
            gens[label].generate(prompt, GenerationConfig(max_new_tokens=new_tokens))
        loads.append(os.getloadavg()[0])
    res = {}
    for label, g in gens.items():
        path = g.session.end_profiling()
        res[label] = step_profile(path, bits_by_node(folders[label] / "model.onnx"), warm, new_tokens)
        Path(path).unlink()

    def round_p50(steps: list[dict]) -> list[float]:
        by: dict[int, list[float]] = {}
        for s in steps:
            by.setdefault(s["gen"], []).append(s["run"])
        return [statistics.median(v) for _, v in sorted(by.items())]

    base = round_p50(res[DEFAULT])
    rows = {}
    for label, steps in res.items():
        cut = quantile([s["run"] for s in steps], 0.25)
        quiet = [s for s in steps if s["run"] <= cut]

        def ms(pred) -> float:
            return sum(sum(v for k, v in s["ops"].items() if pred(k)) for s in quiet) / len(quiet) / 1000

        runs = [s["run"] for s in steps]
        rows[label] = {
            "p10_ms": quantile(runs, 0.1) / 1000, "p50_ms": statistics.median(runs) / 1000,
            "x_default": statistics.median(a / b for a, b in zip(round_p50(steps), base)),
            "matmulnbits4_ms": ms(lambda k: k == "MatMulNBits/4"),
            "matmulnbits8_ms": ms(lambda k: k == "MatMulNBits/8"),
            "gqa_ms": ms(lambda k: k == "GroupQueryAttention"),
            "other_ms": ms(lambda k: not k.startswith("MatMulNBits") and k != "GroupQueryAttention")}
    result = {"threads": threads, "rounds": rounds, "new_tokens": new_tokens, "loadavg_per_round": loads,
              "cpus": os.cpu_count(), "rows": rows}
    (out / f"recipes-t{threads}.json").write_text(json.dumps(result, indent=1))
    print(f"\n{threads} thread(s), {rounds} rounds of {new_tokens} tokens, order shuffled per round; load average "
          f"over the rounds {min(loads):.1f}-{max(loads):.1f} on {os.cpu_count()} CPUs. ms per decode step "
          "(model_run); kernels: mean over the quietest quarter of steps\n")
    print("| recipe | step p10 | step p50 | x default (median of rounds) | MatMulNBits int4 | MatMulNBits int8 | "
          "MatMulNBits | GroupQueryAttention | other ops |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for label, r in rows.items():
        print(f"| {label} | {r['p10_ms']:.2f} | {r['p50_ms']:.2f} | {r['x_default']:.3f} | "
              f"{r['matmulnbits4_ms']:.2f} | {r['matmulnbits8_ms']:.2f} | "
              f"{r['matmulnbits4_ms'] + r['matmulnbits8_ms']:.2f} | {r['gqa_ms']:.2f} | {r['other_ms']:.2f} |")
    return result


# ---- kernels: one MatMulNBits node --------------------------------------------------------------------------

KERNEL_SHAPES = [(512, 1536), (512, 512), (512, 1376), (1376, 512), (512, 32000)]  # qkv, o, gate/up, down, head
KERNEL_CONFIGS = [(4, 32, 4), (4, 64, 4), (4, 128, 4), (4, 256, 4), (8, 32, 4), (8, 128, 4), (4, 128, 1)]


def kernel_model(k: int, n: int, bits: int, block: int, acc: int) -> bytes:
    import logging

    import numpy as np
    import onnx
    from onnx import TensorProto, helper

    from mhaexport.exporter.quantize import _quantizer_class

    w = np.random.default_rng(0).standard_normal((k, n)).astype(np.float32) * 0.05
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["y"], name="mm")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, n])],
                              [onnx.numpy_helper.from_array(w, "W")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    logging.disable(logging.WARNING)
    q = _quantizer_class()(model, bits=bits, block_size=block, is_symmetric=True, accuracy_level=acc)
    q.process()
    logging.disable(logging.NOTSET)
    return q.model.model.SerializeToString()


def kernels(threads: list[int], rounds: int) -> dict:
    import numpy as np
    import onnxruntime as ort

    sessions = {}
    for k, n in KERNEL_SHAPES:
        x = np.random.default_rng(1).standard_normal((1, k)).astype(np.float32)
        for cfg in KERNEL_CONFIGS:
            blob = kernel_model(k, n, *cfg)
            for t in threads:
                so = ort.SessionOptions()
                so.intra_op_num_threads, so.inter_op_num_threads = t, 1
                sessions[(k, n, *cfg, t)] = (ort.InferenceSession(blob, so, providers=["CPUExecutionProvider"]), x)
    times: dict[tuple, list[float]] = {key: [] for key in sessions}
    keys = list(sessions)
    rng = random.Random(0)
    for _ in range(rounds):
        rng.shuffle(keys)
        for key in keys:
            s, x = sessions[key]
            s.run(None, {"x": x})
            t0 = time.perf_counter()
            for _ in range(20):
                s.run(None, {"x": x})
            times[key].append((time.perf_counter() - t0) / 20 * 1e6)
    print(f"\none MatMulNBits node, M = 1, session.run per call (20 calls timed together), {rounds} rounds "
          f"interleaved; load average now {os.getloadavg()[0]:.1f}\n")
    print("| K x N | bits | block | accuracy level | threads | p10 us | p50 us | p10 x int4 b128 acc4 |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    out = {}
    for key in sorted(times):
        k, n, bits, block, acc, t = key
        p10 = quantile(times[key], 0.1)
        ref = quantile(times[(k, n, 4, 128, 4, t)], 0.1)
        out["/".join(map(str, key))] = {"p10_us": p10, "p50_us": statistics.median(times[key])}
        print(f"| {k} x {n} | {bits} | {block} | {acc} | {t} | {p10:.1f} | {statistics.median(times[key]):.1f} | "
              f"{p10 / ref:.2f} |")
    return out


# ---- export: where the time goes ---------------------------------------------------------------------------

def _stages_main(argv: list[str]) -> None:
    """In a process of its own: run `mhaexport ARGV` with each export stage wrapped; the stages' CPU and wall
    seconds go to the JSON file named by MHAEXPORT_STAGES_OUT."""
    import atexit
    import functools

    t0 = (time.process_time(), time.perf_counter())
    rows: list[tuple[str, float, float]] = []

    def timed(label: str, f):
        @functools.wraps(f)
        def w(*a, **k):
            c, p = time.process_time(), time.perf_counter()
            try:
                return f(*a, **k)
            finally:
                rows.append((label, time.process_time() - c, time.perf_counter() - p))
        return w

    def wrap(owner, name: str, label: str) -> None:
        raw = owner.__dict__.get(name) if isinstance(owner, type) else None
        if isinstance(raw, classmethod):
            setattr(owner, name, classmethod(timed(label, raw.__func__)))
        else:
            setattr(owner, name, timed(label, getattr(owner, name)))

    import mhaexport.cli as cli
    import torch.export
    from torch.onnx._internal.exporter import _capture_strategies, _core, _onnx_program, _registration
    # the CLI's imports and torch.onnx's exporter (which pulls onnxscript); mhaexport's exporter modules load after
    rows.append(("imports (torch, onnx, onnxscript, mhaexport)", time.process_time() - t0[0],
                 time.perf_counter() - t0[1]))
    from mhaexport.exporter import onnx as eo
    from mhaexport.exporter import quantize as q
    from mhaexport.models import loading

    wrap(loading, "load_model", "model build (+ transformers import for --hf)")
    wrap(_registration.ONNXRegistry, "from_torchlib", "torch.onnx: onnxscript op registry")
    wrap(_capture_strategies.TorchExportNonStrictStrategy, "__call__", "torch.export (capture)")
    wrap(torch.export.ExportedProgram, "run_decompositions", "torch.onnx: run_decompositions")
    wrap(_core, "_exported_program_to_onnx_program", "torch.onnx: translation to ONNX")
    wrap(_onnx_program.ONNXProgram, "optimize", "torch.onnx: onnxscript optimizer")
    wrap(torch.onnx, "export", "torch.onnx.export (all of it)")
    for name, label in (("lower_attention_ir", "mhaexport: attention lowering"), ("save_model", "mhaexport: save"),
                        ("check_onnx", "mhaexport: onnx.checker + shape inference"),
                        ("self_check", "mhaexport: lowering self-check"),
                        ("self_check_shared", "mhaexport: lowering self-check"),
                        ("precision_report", "mhaexport: precision report"),
                        ("write_genai_config", "mhaexport: genai_config.json"),
                        ("finish", "mhaexport: manifest, hashes, publish")):
        wrap(eo, name, label)
    wrap(q, "quantize_folder", "mhaexport: quantize (--target ort-cpu)")

    def report() -> None:
        rows.append(("total (process)", time.process_time() - t0[0], time.perf_counter() - t0[1]))
        merged: dict[str, list[float]] = {}
        for label, cpu, wall in rows:
            m = merged.setdefault(label, [0.0, 0.0])
            m[0] += cpu
            m[1] += wall
        Path(os.environ["MHAEXPORT_STAGES_OUT"]).write_text(json.dumps(merged))

    atexit.register(report)
    sys.argv = ["mhaexport", *argv]
    cli.main()


def _child_run(cmd: list[str], env: dict | None = None) -> tuple[float, float]:
    """Run ``cmd``; its (CPU seconds: user + sys of the child, wall seconds)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), wall


def export(out: Path, repeats: int) -> dict:
    tiny = out / "tiny-llama"
    if not (tiny / "config.json").is_file():
        sh([sys.executable, str(ROOT / "examples" / "tiny_hf_model.py"), str(tiny)])
    runs = {"mhaexport onnx (default model)": ["onnx", "-q", "--replace", "-o", str(out / "x-default")],
            "mhaexport onnx --hf tiny-llama": ["onnx", "-q", "--replace", "--hf", str(tiny), "-o", str(out / "x-hf")],
            "mhaexport onnx --hf tiny-llama --target ort-cpu": ["onnx", "-q", "--replace", "--hf", str(tiny),
                                                                "--target", "ort-cpu", "-o", str(out / "x-tgt")]}
    builders = {f"builder -p {p} (tiny-llama)": [sys.executable, "-m", "onnxruntime_genai.models.builder", "-m",
                                                 "tiny-llama", "-i", str(tiny), "-o", str(out / f"x-builder-{p}"),
                                                 "-p", p, "-e", "cpu", "-c", str(out / "x-builder-cache")]
                for p in ("fp32", "int4")}
    stages: dict[str, list[dict]] = {k: [] for k in runs}
    totals: dict[str, list[tuple[float, float]]] = {k: [] for k in [*runs, *builders]}
    loads = []
    for _ in range(repeats):  # alternated: ours, the builder's, ...
        for label, args in runs.items():
            path = out / "stages.json"
            env = {**os.environ, "MHAEXPORT_STAGES_OUT": str(path)}
            totals[label].append(_child_run([sys.executable, __file__, "_stages", *args], env))
            stages[label].append(json.loads(path.read_text()))
        for label, cmd in builders.items():
            totals[label].append(_child_run(cmd))
        loads.append(os.getloadavg()[0])
    print(f"\n{repeats} repeat(s), alternated; load average after each: {', '.join(f'{x:.1f}' for x in loads)} on "
          f"{os.cpu_count()} CPUs. Seconds, median of repeats (CPU = user + sys of the process)\n")
    print("| run | CPU s | wall s |")
    print("| --- | ---: | ---: |")
    for label, v in totals.items():
        print(f"| {label} | {statistics.median(c for c, _ in v):.2f} | {statistics.median(w for _, w in v):.2f} |")
    for label, per in stages.items():
        print(f"\n{label}, per stage (in-process timers; nested: torch.onnx.export holds the torch.onnx rows):\n")
        print("| stage | CPU s | wall s |")
        print("| --- | ---: | ---: |")
        for stage in per[0]:
            print(f"| {stage} | {statistics.median(p[stage][0] for p in per if stage in p):.2f} | "
                  f"{statistics.median(p[stage][1] for p in per if stage in p):.2f} |")
    result = {"repeats": repeats, "loadavg": loads, "totals": totals, "stages": stages}
    (out / "export.json").write_text(json.dumps(result, indent=1))
    return result


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "_stages":
        _stages_main(sys.argv[2:])
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["recipes", "kernels", "export"])
    ap.add_argument("-o", "--output", type=Path, default=Path("out/int4"))
    ap.add_argument("--threads", default="1", help="recipes: one count; kernels: a comma list")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--only", default="", help="recipes: comma list of substrings of the recipes to run (the "
                                                "default and the builder's file always run)")
    ap.add_argument("--repeats", type=int, default=2, help="export: alternated repeats")
    args = ap.parse_args()
    args.output.mkdir(parents=True, exist_ok=True)
    if args.what == "recipes":
        recipes(args.output, int(args.threads), args.rounds, args.new_tokens, args.only)
    elif args.what == "kernels":
        kernels([int(t) for t in args.threads.split(",")], args.rounds)
    else:
        export(args.output, args.repeats)


if __name__ == "__main__":
    main()
