"""The closing measurements of issue 12: quantized exports' quality on the trained default model and their speed
on the `bench` preset beside onnxruntime-genai's model builder on a Llama of the same size, in one run.

    python scripts/measure_quantize.py quality -o out/quantize        # small: int4 / int8 / variants (verify --sweep full)
    python scripts/measure_quantize.py speed -o out/quantize          # bench: fp32 / int4 / int8 + the builder
    python scripts/measure_quantize.py speed -o out/quantize --threads 2 --repeats 5
    python scripts/measure_quantize.py profile -o out/quantize       # per-op time of a decode step, both int4

`speed` exports the `bench` preset (if OUTPUT/bench has no export; also with `--attention ort` and with
`--kv-cache shared`), quantizes them with `mhaexport quantize`, builds a
Llama of the bench size (vocab 32000, d 512, 8 layers, 8 heads, SwiGLU 1376, tied embeddings: 166.8 MB of fp32
weights read per token) with transformers' save_pretrained and a byte-pair tokenizer trained on data/*.txt,
converts it with onnxruntime-genai's model builder (fp32 and int4, CPU), then times every row in one run,
round-robin: mhaexport's rows through its own decode loop (the deploy Generator, as bench does), the builder's
through onnxruntime-genai's own generator loop (each generate_next_token timed), and mhaexport's int4 folder through
onnxruntime-genai's loop too (the same graph in the other loop: graph cost and loop cost told apart), batch 1, prompt
32, 128 greedy tokens, the same thread count for every session. Writes OUTPUT/speed.json and prints a markdown table.
Nothing is downloaded.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

LLAMA = dict(vocab_size=32000, hidden_size=512, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=8,
             intermediate_size=1376, max_position_embeddings=1024, tie_word_embeddings=True, rms_norm_eps=1e-6)


def sh(cmd: list[str]) -> None:
    print("$", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def mhaexport(*args: str) -> None:
    sh([sys.executable, "-m", "mhaexport", *args])


# ---- quality ------------------------------------------------------------------------------------------------

def quality(out: Path) -> dict:
    """small: export, quantize int4 / int8 (and the planted 2-bit), verify each on ort-cpu; the quality figures."""
    small = out / "small"
    if not (small / "manifest.json").is_file():
        mhaexport("onnx", "-o", str(small))
    rows = {}
    for name, args in (("int4", ["--weights", "int4"]), ("int4-all", ["--weights", "int4", "--int8-blocks", "0"]),
                       ("int4-none", ["--weights", "int4", "--keep-float", "none"]), ("int8", ["--weights", "int8"]),
                       ("planted-2bit", None)):
        folder = out / f"small-{name}"
        if args is None:  # the tests' planted quantizer bug: the int4 scheme writing 2-bit weights
            from mhaexport.exporter import quantize

            quantize.BITS["int4"] = 2
            try:
                quantize.quantize_folder(small, folder, quantize.QuantConfig())
            finally:
                quantize.BITS["int4"] = 4
        else:
            mhaexport("quantize", str(small), "-o", str(folder), *args)
        subprocess.run([sys.executable, "-m", "mhaexport", "verify", str(folder), "--runtime", "ort-cpu",
                        "--sweep", "full"], check=False)
        report = json.loads((folder / "report-ort-cpu.json").read_text())
        rows[name] = {"verdict": report["verdict"], "quality": report["results"]["ort-cpu"]["quality"]["figures"],
                      "kv-consistency": report["results"]["ort-cpu"]["kv-consistency"]["figures"]}
    (out / "quality.json").write_text(json.dumps(rows, indent=1))
    print("| run | scheme | verdict | text top-1 | KL mean | KL p99 | logit err | ppl (eager) | ppl ratio | greedy mean/min "
          "| sweep top-1 | sweep KL mean | sweep logit err |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, r in rows.items():
        t, s, g = r["quality"]["text"], r["quality"]["sweep"], r["quality"]["greedy"]
        print(f"| {name} | {r['quality']['scheme']} | {r['verdict']['status']} | {t['top1']:.4f} | {t['kl_mean']:.4f} | "
              f"{t['kl_p99']:.3f} | {t['logit_err']:.4f} | {t['perplexity']:.3f} ({t['eager_perplexity']:.3f}) | "
              f"{t['ppl_ratio']:.4f} | {g['mean']:.1f}/{g['min']} of {g['tokens']} | {s['top1']:.3f} | "
              f"{s['kl_mean']:.4f} | {s['logit_err']:.4f} |")
    return rows


# ---- the builder's Llama ------------------------------------------------------------------------------------

def build_llama(out: Path) -> Path:
    """A random Llama of the bench size (seeded) saved with save_pretrained, and a BPE tokenizer trained on data/."""
    hf = out / "llama-hf"
    if (hf / "config.json").is_file():
        return hf
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**LLAMA, bos_token_id=1, eos_token_id=2, pad_token_id=0)).eval()
    model.save_pretrained(hf)
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=2000, special_tokens=["<pad>", "<s>", "</s>", "<unk>"])
    tok.train([str(p) for p in sorted((ROOT / "data").glob("*.txt"))], trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                   unk_token="<unk>")
    fast.save_pretrained(hf)
    return hf


def build_genai(hf: Path, out: Path, precision: str, threads: int) -> Path:
    """onnxruntime-genai's model builder on the HF folder (CPU), its session pinned to ``threads`` threads."""
    folder = out / f"genai-{precision}"
    if not (folder / "genai_config.json").is_file():
        sh([sys.executable, "-m", "onnxruntime_genai.models.builder", "-m", "bench-llama", "-i", str(hf), "-o",
            str(folder), "-p", precision, "-e", "cpu", "-c", str(out / "genai-cache")])
    cfg_path = folder / "genai_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["model"]["decoder"]["session_options"].update(intra_op_num_threads=threads, inter_op_num_threads=1)
    cfg_path.write_text(json.dumps(cfg, indent=4))
    return folder


# ---- timing -------------------------------------------------------------------------------------------------

class OursRow:
    """mhaexport's deploy Generator on one export folder, driven by its decode loop (what bench times)."""

    def __init__(self, label: str, folder: Path, threads: int) -> None:
        from mhaexport.runtime import Generator

        self.label, self.folder = label, folder
        self.gen = Generator(folder, threads=threads)

    def run(self, prompt: np.ndarray, n: int) -> list[float]:
        from mhaexport.runtime import GenerationConfig

        r = self.gen.generate(prompt, GenerationConfig(max_new_tokens=n))
        assert len(r.tokens[0]) == n
        return list(r.step_s)


class GenaiRow:
    """onnxruntime-genai's own generator loop on a builder folder: each generate_next_token after the prompt timed."""

    def __init__(self, label: str, folder: Path) -> None:
        import onnxruntime_genai as og

        self.og, self.label, self.folder = og, label, folder
        self.model = og.Model(str(folder))

    def run(self, prompt: np.ndarray, n: int) -> list[float]:
        og = self.og
        params = og.GeneratorParams(self.model)
        params.set_search_options(max_length=prompt.shape[1] + n, do_sample=False)
        gen = og.Generator(self.model, params)
        gen.append_tokens(prompt.astype(np.int32))  # the prefill
        steps = []
        while not gen.is_done():
            t0 = time.perf_counter()
            gen.generate_next_token()
            steps.append(time.perf_counter() - t0)
        return steps[1:]  # the first produces the token after the prompt's logits; the rest are decode steps


def og_copy(folder: Path, out: Path, threads: int) -> Path:
    """A copy of an mhaexport folder for onnxruntime-genai's loop, its genai_config.json pinned to ``threads``
    threads like the builder's (a copy: editing the config in place would break the folder's manifest hashes)."""
    import shutil

    dst = out / f"{folder.name}-og"
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(folder, dst)
    cfg = json.loads((dst / "genai_config.json").read_text())
    cfg["model"]["decoder"]["session_options"].update(intra_op_num_threads=threads, inter_op_num_threads=1)
    (dst / "genai_config.json").write_text(json.dumps(cfg, indent=4))
    return dst


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.iterdir() if p.suffix in (".onnx", ".data"))


def speed(out: Path, threads: int, repeats: int, prompt_len: int, new_tokens: int) -> dict:
    from mhaexport.artifact import ExportFolder
    from mhaexport.bench.probes import measure_bandwidth, weight_bytes_per_token
    from mhaexport.models.loading import load_recorded

    bench = out / "bench"
    if not (bench / "manifest.json").is_file():
        mhaexport("onnx", "--config", "bench", "-o", str(bench))
    for scheme in ("int4", "int8"):
        if not (out / f"bench-{scheme}" / "manifest.json").is_file():
            mhaexport("quantize", str(bench), "-o", str(out / f"bench-{scheme}"), "--weights", scheme)
    if not (out / "bench-ort" / "manifest.json").is_file():  # the fused attention lowering: one kernel per layer
        mhaexport("onnx", "--config", "bench", "--attention", "ort", "-o", str(out / "bench-ort"))
    if not (out / "bench-ort-int4" / "manifest.json").is_file():
        mhaexport("quantize", str(out / "bench-ort"), "-o", str(out / "bench-ort-int4"), "--weights", "int4")
    if not (out / "bench-shared" / "manifest.json").is_file():  # the shared KV cache: GroupQueryAttention in place
        mhaexport("onnx", "--config", "bench", "--kv-cache", "shared", "-o", str(out / "bench-shared"))
    if not (out / "bench-shared-int4" / "manifest.json").is_file():
        mhaexport("quantize", str(out / "bench-shared"), "-o", str(out / "bench-shared-int4"), "--weights", "int4")
    hf = build_llama(out)
    g32, g4 = build_genai(hf, out, "fp32", threads), build_genai(hf, out, "int4", threads)

    fp32_bytes = weight_bytes_per_token(load_recorded(ExportFolder.open(bench), trust_code=True).module)
    rows = [OursRow("mhaexport fp32", bench, threads), OursRow("mhaexport int4", out / "bench-int4", threads),
            OursRow("mhaexport int8", out / "bench-int8", threads),
            OursRow("mhaexport int4, attention=ort", out / "bench-ort-int4", threads),
            OursRow("mhaexport int4, kv-cache shared", out / "bench-shared-int4", threads),
            GenaiRow("mhaexport int4 folder (og loop)", og_copy(out / "bench-int4", out, threads)),
            GenaiRow("mhaexport int4 shared-cache folder (og loop)", og_copy(out / "bench-shared-int4", out, threads)),
            GenaiRow("builder fp32 (og loop)", g32),
            GenaiRow("builder int4 (og loop)", g4)]
    prompt = np.random.default_rng(0).integers(3, 32000, (1, prompt_len), dtype=np.int64)
    for r in rows:  # warm-up: two untimed generations each
        for _ in range(2):
            r.run(prompt, new_tokens)
    steps: dict[str, list[float]] = {r.label: [] for r in rows}
    medians: dict[str, list[float]] = {r.label: [] for r in rows}
    loads: list[str] = []
    for i in range(repeats):  # round-robin: the machine's noise falls on every row alike
        for r in rows:
            s = r.run(prompt, new_tokens)
            steps[r.label] += s
            medians[r.label].append(statistics.median(s))
        loads.append(Path("/proc/loadavg").read_text().split()[0] if Path("/proc/loadavg").is_file() else "?")
        print(f"round {i + 1}/{repeats} (load {loads[-1]}): "
              + ", ".join(f"{k} {v[-1] * 1e3:.2f}" for k, v in medians.items()), flush=True)
    bw = measure_bandwidth(threads)
    floor_ms = fp32_bytes / (bw.read_gbps * 1e9) * 1e3
    result = {"threads": threads, "repeats": repeats, "prompt_len": prompt_len, "new_tokens": new_tokens,
              "bandwidth": bw.to_dict(), "fp32_bytes_per_token": fp32_bytes, "fp32_floor_ms": floor_ms, "rows": {}}
    for r in rows:
        s = np.array(steps[r.label]) * 1e3
        entry = {"p50_ms": float(np.median(s)), "p90_ms": float(np.percentile(s, 90)), "min_ms": float(s.min()),
                 "repeat_medians_ms": [round(m * 1e3, 3) for m in medians[r.label]],
                 "folder_mb": folder_bytes(r.folder) / 1e6}
        if isinstance(r, OursRow):
            q = r.gen.entry.details.quantization
            entry["weights_read_mb"] = ((q.weights_read.fixed_bytes + q.weights_read.per_row_bytes) / 1e6
                                        if q else fp32_bytes / 1e6)
        result["rows"][r.label] = entry
    # per round, each row against the builder's int4 of the same round: the machine's slow drifts cancel out
    b4_rounds = medians["builder int4 (og loop)"]
    for label, e in result["rows"].items():
        e["x_builder_int4_per_round"] = [round(m / b, 3) for m, b in zip(medians[label], b4_rounds)]
        e["x_builder_int4_median_of_rounds"] = round(statistics.median(e["x_builder_int4_per_round"]), 3)
    result["loadavg_per_round"] = loads
    b4 = result["rows"]["builder int4 (og loop)"]["p50_ms"]
    print(f"\nbandwidth {bw.read_gbps:.2f} GB/s ({bw.probe}, {threads} threads); fp32 weights read per token "
          f"{fp32_bytes / 1e6:.1f} MB; fp32 floor {floor_ms:.2f} ms\n")
    print(f"load average per round: {', '.join(loads)}\n")
    print("| row | token p50 ms | p90 | min | repeats' medians | MB read/token | folder MB | x fp32 floor | "
          "x builder int4 | x builder int4, median of rounds |")
    print("|---|---:|---:|---:|---|---:|---:|---:|---:|---:|")
    for label, e in result["rows"].items():
        mb = f"{e['weights_read_mb']:.1f}" if "weights_read_mb" in e else "-"
        print(f"| {label} | {e['p50_ms']:.2f} | {e['p90_ms']:.2f} | {e['min_ms']:.2f} | "
              f"{', '.join(f'{m:.2f}' for m in e['repeat_medians_ms'])} | {mb} | {e['folder_mb']:.1f} | "
              f"{e['p50_ms'] / floor_ms:.3f} | {e['p50_ms'] / b4:.3f} | {e['x_builder_int4_median_of_rounds']:.3f} |")
    (out / "speed.json").write_text(json.dumps(result, indent=1))
    return result


PROFILE_OG = """
import json, sys, numpy as np, onnxruntime_genai as og
folder, n, prompt_len = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
model = og.Model(folder)
prompt = np.random.default_rng(0).integers(3, 32000, (1, prompt_len)).astype(np.int32)
for _ in range(3):
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=prompt_len + n, do_sample=False)
    gen = og.Generator(model, params)
    gen.append_tokens(prompt)
    while not gen.is_done():
        gen.generate_next_token()
"""


def decode_profile(path: Path) -> dict:
    """ONNX Runtime's profile -> microseconds per decode step per op type (the prefill runs, the longest tenth of
    model_run events, left out), the step count and the median model_run."""
    events = json.loads(Path(path).read_text())
    runs = sorted((e for e in events if e.get("cat") == "Session" and e.get("name") == "model_run"),
                  key=lambda e: e["ts"])
    durs = sorted(e["dur"] for e in runs)
    cut = durs[int(len(durs) * 0.9)] if durs else 0
    decode = [(e["ts"], e["ts"] + e["dur"]) for e in runs if e["dur"] < cut]
    per: dict[str, float] = {}
    for e in events:
        if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time"):
            if any(a <= e["ts"] <= b for a, b in decode):
                op = e.get("args", {}).get("op_name", "?")
                per[op] = per.get(op, 0.0) + e["dur"]
    n = max(len(decode), 1)
    return {"steps": len(decode), "model_run_us": statistics.median(b - a for a, b in decode) if decode else None,
            "kernels_us": round(sum(per.values()) / n, 1),
            "ops_us": {k: round(v / n, 1) for k, v in sorted(per.items(), key=lambda kv: -kv[1])}}


def profile(out: Path, threads: int, prompt_len: int, new_tokens: int) -> dict:
    """Where a decode step's time goes: mhaexport's int4 (its deploy Generator) and the builder's int4 (og's loop),
    ONNX Runtime's profile of 3 generations each, one after the other."""
    from mhaexport.runtime import GenerationConfig, Generator

    g4 = build_genai(build_llama(out), out, "int4", threads)
    gen = Generator(out / "bench-int4", threads=threads, profile_prefix=str(out / "profile-mhaexport-int4"))
    prompt = np.random.default_rng(0).integers(3, 32000, (1, prompt_len), dtype=np.int64)
    for _ in range(3):
        gen.generate(prompt, GenerationConfig(max_new_tokens=new_tokens))
    ours = decode_profile(Path(gen.session.end_profiling()))
    cfg_path = g4 / "genai_config.json"
    cfg = json.loads(cfg_path.read_text())
    opts = cfg["model"]["decoder"]["session_options"]
    opts["enable_profiling"] = str(out / "profile-builder-int4")
    cfg_path.write_text(json.dumps(cfg, indent=4))
    try:  # in a process of its own: og writes the profile when its session is destroyed
        subprocess.run([sys.executable, "-c", PROFILE_OG, str(g4), str(new_tokens), str(prompt_len)], check=True)
    finally:
        opts.pop("enable_profiling")
        cfg_path.write_text(json.dumps(cfg, indent=4))
    builder = decode_profile(max(out.glob("profile-builder-int4*.json"), key=lambda p: p.stat().st_mtime))
    result = {"mhaexport int4": ours, "builder int4": builder}
    (out / "profile.json").write_text(json.dumps(result, indent=1))
    for name, r in result.items():
        top = ", ".join(f"{k} {v:.0f}" for k, v in list(r["ops_us"].items())[:10])
        print(f"{name}: {r['steps']} decode steps, median model_run {r['model_run_us']:.0f} us, kernels "
              f"{r['kernels_us']:.0f} us per step: {top}")
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["quality", "speed", "profile"])
    ap.add_argument("-o", "--output", type=Path, default=Path("out/quantize"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=128)
    args = ap.parse_args()
    args.output.mkdir(parents=True, exist_ok=True)
    if args.what == "quality":
        quality(args.output)
    elif args.what == "profile":
        profile(args.output, args.threads, args.prompt_len, args.new_tokens)
    else:
        speed(args.output, args.threads, args.repeats, args.prompt_len, args.new_tokens)


if __name__ == "__main__":
    main()
