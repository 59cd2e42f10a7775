"""Time the KV-cache decode loop of an export folder on each runtime (`mhaexport bench`).

Per runtime, after an untimed warm-up and over repeats, on the same seeded prompt, greedy: prefill latency, time
to first token, per-token decode latency (p50 / p90 / min), tokens/s, and per-token latency against position.
ONNX Runtime is timed through the deploy runtime's own decode loop (``mhaexport.runtime.Generator``), so the
figures are what a deployment sees. The memory bandwidth and the weight-bandwidth floor are measured in the same
run, and ``--long`` times one ORT CPU generation out to a far position to show how cost grows with the cache.

Writes bench.json, bench.md and bench.png (matplotlib optional) and refreshes a delimited table in report.md.
"""

from __future__ import annotations

import json
import os
import platform
import re
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from mhaexport.errors import MhaExportError, RuntimeInputError
from mhaexport.exporter.manifest import contract_from_manifest, load_verified

EAGER, EAGER_NOCACHE, EAGER_CUDA, TORCHSCRIPT, ORT_CPU, ORT_CUDA = (
    "eager", "eager-nocache", "eager-cuda", "torchscript", "ort-cpu", "ort-cuda")
ALL_RUNTIMES = (EAGER, EAGER_NOCACHE, EAGER_CUDA, TORCHSCRIPT, ORT_CPU, ORT_CUDA)
WARMUP_TOKENS = 8
REPORT_BEGIN, REPORT_END = "<!-- bench -->", "<!-- /bench -->"
Progress = Callable[[str], None]


@dataclass(frozen=True)
class BenchConfig:
    prompt_len: int = 32
    new_tokens: int = 128
    batch: int = 1
    threads: int = 2  # torch.set_num_threads and ONNX Runtime intra-op threads
    runtimes: tuple[str, ...] | None = None  # None: all of ALL_RUNTIMES (absent ones are reported skipped)
    repeats: int = 3
    nocache_repeats: int = 1  # recompute is slow (O(n^2)); it is timed this many times
    long_to: int | None = None  # one ORT CPU run out to this position; None: max_positions when <= 1024; 0: off
    opt_levels: tuple[str, ...] = ()  # extra ORT CPU runs at these graph optimization levels ("ort-cpu@basic")
    profile: bool = False  # write ONNX Runtime's profile of one ORT CPU generation and summarize it
    profile_dir: str | None = None  # where the profile goes (default: the export folder)
    seed: int = 0


@dataclass
class RuntimeBench:
    """One runtime's figures (milliseconds); ``ran`` is None when skipped (``reason`` says why)."""

    name: str
    ran: bool | None = None
    reason: str | None = None
    providers: list[str] = field(default_factory=list)
    load_ms: float | None = None  # creating the session / loading the module
    repeats: int = 0
    prefill_ms: float | None = None  # medians over repeats
    ttft_ms: float | None = None
    token_p50_ms: float | None = None  # over every decode step of every repeat
    token_p90_ms: float | None = None
    token_min_ms: float | None = None
    decode_total_ms: float | None = None  # median over repeats of the summed decode steps
    tokens_per_s: float | None = None  # batch * new_tokens / (prefill + decode), median over repeats
    positions: list[int] = field(default_factory=list)  # position of the token fed at each decode step
    per_position_ms: list[float] = field(default_factory=list)  # median over repeats, per decode step


@dataclass
class BenchResult:
    folder: str
    config: dict
    model: dict
    environment: dict
    bandwidth_gbps: float  # the memory read bandwidth the floor uses (the fastest of ``bandwidth``)
    bandwidth: dict  # each measurement (memory_bandwidth_gbps)
    weight_bytes_per_token: int
    floor_ms: float  # weight bytes per token / bandwidth
    runtimes: list[RuntimeBench]
    long_run: dict | None = None  # {"positions": [...], "ms": [...], "at": {pos: ms}}
    targets: list[dict] = field(default_factory=list)
    profile: dict | None = None
    notes: list[str] = field(default_factory=list)

    def get(self, name: str) -> RuntimeBench | None:
        return next((r for r in self.runtimes if r.name == name), None)

    def to_dict(self) -> dict:
        return asdict(self)

    def summary(self) -> str:
        """The table, the bandwidth floor and the targets, as plain text for the terminal."""
        return _markdown_body(self, plot_line=False)


# ---- measurements shared by every runtime ----------------------------------------------------------------------

def memory_bandwidth_gbps(mbytes: int = 256, repeats: int = 7) -> dict[str, float]:
    """Memory bandwidth (GB/s, medians) on arrays far larger than the caches, three ways:
    ``copy``: numpy copy, STREAM convention (bytes read + bytes written) / time; ``sum``: a numpy sum (bytes read /
    time, one thread); ``gemv``: float32 matrix @ vector through numpy's BLAS (bytes read / time, its threads).
    ``read`` is the largest: the floor must be a lower bound on time, so it uses the fastest read measured."""
    n = mbytes * (1 << 20) // 4
    src = np.ones(n, dtype=np.float32)
    dst = np.empty_like(src)
    mat = src.reshape(-1, 4096)  # (n / 4096, 4096)
    vec = np.ones(4096, dtype=np.float32)

    def median_s(fn) -> float:
        fn()  # touch every page first
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return statistics.median(times)

    out = {"copy": 2 * src.nbytes / median_s(lambda: np.copyto(dst, src)) / 1e9,
           "sum": src.nbytes / median_s(lambda: src.sum()) / 1e9,
           "gemv": src.nbytes / median_s(lambda: mat @ vec) / 1e9}
    out = {k: round(v, 3) for k, v in out.items()}
    out["read"] = max(out.values())
    return out


def weight_bytes_per_token(module, batch: int = 1) -> int:
    """Bytes of parameters one decode step reads: every parameter once (shared ones once), except embedding
    tables that are only gathered (a position table, an untied token table), which cost ``batch`` rows."""
    from torch import nn

    linear_ptrs = {m.weight.data_ptr() for m in module.modules() if isinstance(m, nn.Linear)}
    gathered = {m.weight.data_ptr(): m.weight for m in module.modules()
                if isinstance(m, nn.Embedding) and m.weight.data_ptr() not in linear_ptrs}
    total, seen = 0, set()
    for p in module.parameters():
        if p.data_ptr() in seen:
            continue
        seen.add(p.data_ptr())
        if p.data_ptr() in gathered:
            total += batch * p.shape[1] * p.element_size()
        else:
            total += p.numel() * p.element_size()
    return total


def _ms(x: float) -> float:
    return round(x * 1000.0, 4)


def _fill(rb: RuntimeBench, runs: list, batch: int, new_tokens: int) -> RuntimeBench:
    """Aggregate timed runs; each run is (prefill_s, first_token_s, step_s list, positions list)."""
    rb.ran, rb.repeats = True, len(runs)
    rb.prefill_ms = _ms(statistics.median(r[0] for r in runs))
    rb.ttft_ms = _ms(statistics.median(r[1] for r in runs))
    steps = [s for r in runs for s in r[2]]
    if steps:
        rb.token_p50_ms = _ms(float(np.percentile(steps, 50)))
        rb.token_p90_ms = _ms(float(np.percentile(steps, 90)))
        rb.token_min_ms = _ms(min(steps))
    rb.decode_total_ms = _ms(statistics.median(sum(r[2]) for r in runs))
    rb.tokens_per_s = round(statistics.median(batch * new_tokens / (r[1] + sum(r[2])) for r in runs), 2)
    n = min(len(r[2]) for r in runs)
    rb.positions = list(runs[0][3][:n])
    rb.per_position_ms = [_ms(statistics.median(r[2][i] for r in runs)) for i in range(n)]
    return rb


# ---- the torch runtimes: eager with and without the cache, TorchScript ------------------------------------------

def _torch_generate(module, contract, ids_np: np.ndarray, new_tokens: int, *, cache: bool,
                    device: str = "cpu") -> tuple:
    """Greedy decode with a torch module under the contract; returns (prefill_s, ttft_s, step_s, positions)."""
    import torch

    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    ids = torch.from_numpy(ids_np).to(device)  # (B, T)
    B = ids.shape[0]
    mask = torch.ones_like(ids)  # (B, T)
    one = torch.ones(B, 1, dtype=mask.dtype, device=device)
    kv = torch.zeros(B, contract.n_heads, 0, contract.head_dim, device=device)  # (B, H, 0, D)
    empty = tuple((kv, kv) for _ in range(contract.n_layers))  # the contract's past of length 0
    steps, positions = [], []
    with torch.inference_mode():
        sync()
        t0 = time.perf_counter()
        logits, past = module(ids, mask, empty)
        sync()
        prefill = time.perf_counter() - t0
        tok = logits[:, -1].argmax(-1, keepdim=True)  # (B, 1)
        tok.cpu()
        ttft = time.perf_counter() - t0
        seq = ids
        for _ in range(new_tokens - 1):
            positions.append(mask.shape[1])
            t = time.perf_counter()
            mask = torch.cat([mask, one], dim=1)  # (B, S + 1)
            if cache:
                logits, past = module(tok, mask, past)
            else:
                seq = torch.cat([seq, tok], dim=1)  # (B, S + 1): the whole sequence again, no cache
                logits, _ = module(seq, mask, empty)
            tok = logits[:, -1].argmax(-1, keepdim=True)
            tok.cpu()  # the host needs the token (as a sampler would): this also syncs the device
            steps.append(time.perf_counter() - t)
    return prefill, ttft, steps, positions


def _bench_torch(name: str, module, contract, ids: np.ndarray, cfg: BenchConfig, *, cache: bool, device: str,
                 repeats: int, load_s: float, providers: list[str]) -> RuntimeBench:
    rb = RuntimeBench(name, providers=providers, load_ms=_ms(load_s))
    _torch_generate(module, contract, ids, WARMUP_TOKENS, cache=cache, device=device)  # untimed warm-up
    runs = [_torch_generate(module, contract, ids, cfg.new_tokens, cache=cache, device=device) for _ in range(repeats)]
    return _fill(rb, runs, cfg.batch, cfg.new_tokens)


# ---- ONNX Runtime, through the deploy runtime's decode loop ------------------------------------------------------

def _ort_run(gen, ids: np.ndarray, new_tokens: int) -> tuple:
    from mhaexport.runtime import GenerationConfig

    r = gen.generate(ids, GenerationConfig(max_new_tokens=new_tokens))
    if len(r.tokens[0]) != new_tokens:
        raise RuntimeInputError(f"ONNX Runtime generation stopped after {len(r.tokens[0])} tokens: {r.message}")
    return r.prefill_s, r.first_token_s, r.step_s, r.step_positions


def _make_generator(folder: Path, provider: str, cfg: BenchConfig, opt_level: str | None = None,
                    profile_prefix: str | None = None):
    from mhaexport.runtime import Generator
    from mhaexport.runtime.session import DEFAULT_OPT_LEVEL

    t0 = time.perf_counter()
    gen = Generator(folder, providers=(provider,), threads=cfg.threads, opt_level=opt_level or DEFAULT_OPT_LEVEL,
                    profile_prefix=profile_prefix)
    return gen, time.perf_counter() - t0


def _bench_ort(name: str, folder: Path, provider: str, ids: np.ndarray, cfg: BenchConfig,
               opt_level: str | None = None) -> tuple[RuntimeBench, object]:
    gen, load_s = _make_generator(folder, provider, cfg, opt_level)
    rb = RuntimeBench(name, providers=list(gen.providers), load_ms=_ms(load_s))
    _ort_run(gen, ids, WARMUP_TOKENS)
    runs = [_ort_run(gen, ids, cfg.new_tokens) for _ in range(cfg.repeats)]
    return _fill(rb, runs, cfg.batch, cfg.new_tokens), gen


def summarize_profile(path: str | Path, top: int = 12) -> dict:
    """ONNX Runtime's profile (chrome trace JSON) -> total ms per op type, largest first, and the node count."""
    events = json.loads(Path(path).read_text())
    per_op: dict[str, float] = {}
    runs = 0
    for e in events:
        if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time"):
            op = e.get("args", {}).get("op_name", "?")
            per_op[op] = per_op.get(op, 0.0) + e.get("dur", 0) / 1000.0
        elif e.get("cat") == "Session" and e.get("name") == "model_run":
            runs += 1
    total = sum(per_op.values()) or 1.0
    ranked = sorted(per_op.items(), key=lambda kv: -kv[1])[:top]
    return {"file": str(path), "model_runs": runs,
            "ops": [{"op": k, "ms": round(v, 3), "share": round(v / total, 4)} for k, v in ranked]}


# ---- the whole bench -------------------------------------------------------------------------------------------

def _window_ms(positions: list[int], ms: list[float], at: int, half: int = 8) -> float | None:
    vals = [m for p, m in zip(positions, ms) if abs(p - at) <= half]
    return round(statistics.median(vals), 4) if vals else None


def _targets(res: BenchResult, cfg: BenchConfig) -> list[dict]:
    out = []
    eager, nocache, ort_cpu = res.get(EAGER), res.get(EAGER_NOCACHE), res.get(ORT_CPU)

    def add(name, measured, limit, better="lower", detail=""):
        ok = None if measured is None else (measured <= limit if better == "lower" else measured >= limit)
        out.append({"target": name, "measured": None if measured is None else round(measured, 3), "limit": limit,
                    "met": ok, "detail": detail})

    if ort_cpu and ort_cpu.ran and eager and eager.ran:
        add("ORT CPU per-token p50 / eager-with-cache p50", ort_cpu.token_p50_ms / eager.token_p50_ms, 0.55,
            detail=f"{ort_cpu.token_p50_ms:.2f} ms vs {eager.token_p50_ms:.2f} ms")
    else:
        add("ORT CPU per-token p50 / eager-with-cache p50", None, 0.55, detail="needs eager and ort-cpu")
    if ort_cpu and ort_cpu.ran:
        add("ORT CPU per-token p50 / weight-bandwidth floor", ort_cpu.token_p50_ms / res.floor_ms, 1.25,
            detail=f"{ort_cpu.token_p50_ms:.2f} ms vs floor {res.floor_ms:.2f} ms")
    lr = res.long_run
    if lr and lr["at"].get("1000") is not None and lr["at"].get(str(cfg.prompt_len)) is not None:
        a, b = lr["at"]["1000"], lr["at"][str(cfg.prompt_len)]
        add(f"ORT CPU per-token latency at position 1000 / at {cfg.prompt_len}", a / b, 1.5,
            detail=f"{a:.2f} ms vs {b:.2f} ms (median of positions +-8)")
    else:
        add(f"ORT CPU per-token latency at position 1000 / at {cfg.prompt_len}", None, 1.5,
            detail="needs --long >= 1008 on a model with max_positions >= 1008")
    if eager and eager.ran and nocache and nocache.ran:
        add(f"recompute / cached decode time at {cfg.new_tokens} new tokens (eager)",
            nocache.decode_total_ms / eager.decode_total_ms, 5.0, better="higher",
            detail=f"{nocache.decode_total_ms:.0f} ms vs {eager.decode_total_ms:.0f} ms")
    else:
        add(f"recompute / cached decode time at {cfg.new_tokens} new tokens (eager)", None, 5.0, better="higher",
            detail="needs eager and eager-nocache")
    return out


def _environment(threads: int) -> dict:
    import onnxruntime as ort

    env = {"python": platform.python_version(), "machine": platform.machine(), "cpu_count": os.cpu_count(),
           "threads": threads, "onnxruntime": ort.__version__, "date": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
    try:
        import torch

        env["torch"] = torch.__version__
        env["cuda_device"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except Exception:  # torch is only needed for the eager runtimes
        env["torch"] = None
    cpu = Path("/proc/cpuinfo")
    if cpu.is_file():
        m = re.search(r"model name\s*:\s*(.+)", cpu.read_text())
        env["cpu"] = m.group(1).strip() if m else None
    return env


def run_bench(folder: str | Path, cfg: BenchConfig = BenchConfig(), progress: Progress | None = None) -> BenchResult:
    """Benchmark every requested runtime on ``folder``'s exports; runtimes that cannot run are skipped with why."""
    say = progress or (lambda m: None)
    folder = Path(folder)
    manifest = load_verified(folder)
    c = contract_from_manifest(manifest)
    names = cfg.runtimes or ALL_RUNTIMES
    unknown = [n for n in names if n not in ALL_RUNTIMES]
    if unknown:
        raise RuntimeInputError(f"unknown runtime(s) {', '.join(unknown)}; known: {', '.join(ALL_RUNTIMES)}")
    if cfg.prompt_len + cfg.new_tokens > c.max_positions:
        raise RuntimeInputError(f"--prompt-len {cfg.prompt_len} + --new-tokens {cfg.new_tokens} exceeds the model's "
                                f"max_positions={c.max_positions}")
    long_to = cfg.long_to if cfg.long_to is not None else (c.max_positions if c.max_positions <= 1024 else 0)
    long_to = min(long_to, c.max_positions)
    arts = manifest.get("artifacts", {})
    ids = np.random.default_rng(cfg.seed).integers(0, c.vocab_size, (cfg.batch, cfg.prompt_len), dtype=np.int64)

    say("measuring memory bandwidth ...")
    bandwidth = memory_bandwidth_gbps()
    bw = bandwidth["read"]
    runtimes: list[RuntimeBench] = []
    notes: list[str] = []

    torch_wanted = [n for n in names if n in (EAGER, EAGER_NOCACHE, EAGER_CUDA, TORCHSCRIPT)]
    module, wbytes, torch_reason = None, None, None
    try:
        import torch

        torch.set_num_threads(cfg.threads)
        from mhaexport.verify.verify import loaded_from_manifest

        t0 = time.perf_counter()
        loaded = loaded_from_manifest(manifest)
        load_s = time.perf_counter() - t0
        module = loaded.module.eval()
        wbytes = weight_bytes_per_token(module, cfg.batch)
    except ImportError as e:
        torch_reason = f"torch is not importable: {e}"
    except MhaExportError as e:
        torch_reason = f"cannot rebuild the eager model from the manifest: {e}"
    if wbytes is None:  # no eager model: count the ONNX file's bytes (an upper bound: embeddings counted whole)
        wbytes = sum(m["bytes"] for m in arts.get("onnx", {}).get("files", {}).values())
        notes.append("weight bytes per token counted from the ONNX file size (no eager model)")
    floor_s = wbytes / (bw * 1e9)

    for name in names:
        if name in torch_wanted and module is None:
            runtimes.append(RuntimeBench(name, reason=torch_reason))
            continue
        say(f"timing {name} ...")
        try:
            if name == EAGER:
                runtimes.append(_bench_torch(name, module, c, ids, cfg, cache=True, device="cpu", repeats=cfg.repeats,
                                             load_s=load_s, providers=["torch (cpu)"]))
            elif name == EAGER_NOCACHE:
                runtimes.append(_bench_torch(name, module, c, ids, cfg, cache=False, device="cpu",
                                             repeats=min(cfg.repeats, cfg.nocache_repeats), load_s=load_s,
                                             providers=["torch (cpu), no KV cache: whole sequence each step"]))
            elif name == EAGER_CUDA:
                import torch

                if not torch.cuda.is_available():
                    runtimes.append(RuntimeBench(name, reason="torch.cuda.is_available() is False"))
                    continue
                import copy

                t0 = time.perf_counter()
                cuda_module = copy.deepcopy(module).to("cuda")
                rb = _bench_torch(name, cuda_module, c, ids, cfg, cache=True, device="cuda", repeats=cfg.repeats,
                                  load_s=time.perf_counter() - t0,
                                  providers=[f"torch (cuda: {torch.cuda.get_device_name(0)})"])
                runtimes.append(rb)
                del cuda_module
            elif name == TORCHSCRIPT:
                if "torchscript" not in arts:
                    runtimes.append(RuntimeBench(name, reason=f"no TorchScript export in {folder}"))
                    continue
                import torch

                t0 = time.perf_counter()
                ts = torch.jit.load(str(folder / arts["torchscript"]["file"]), map_location="cpu").eval()
                runtimes.append(_bench_torch(name, ts, c, ids, cfg, cache=True, device="cpu", repeats=cfg.repeats,
                                             load_s=time.perf_counter() - t0, providers=["torch.jit (cpu)"]))
            elif name in (ORT_CPU, ORT_CUDA):
                if "onnx" not in arts:
                    runtimes.append(RuntimeBench(name, reason=f"no ONNX export in {folder}"))
                    continue
                provider = "cpu" if name == ORT_CPU else "cuda"
                rb, _ = _bench_ort(name, folder, provider, ids, cfg)
                runtimes.append(rb)
        except MhaExportError as e:  # ProviderUnavailable, a static export, ...
            runtimes.append(RuntimeBench(name, reason=str(e)))

    if ORT_CPU in names and "onnx" in arts:
        for level in cfg.opt_levels:
            say(f"timing {ORT_CPU}@{level} ...")
            try:
                rb, _ = _bench_ort(f"{ORT_CPU}@{level}", folder, "cpu", ids, cfg, opt_level=level)
            except MhaExportError as e:
                rb = RuntimeBench(f"{ORT_CPU}@{level}", reason=str(e))
            runtimes.append(rb)

    res = BenchResult(str(folder), asdict(cfg), {"spec": manifest["model"]["spec"], "contract": c.to_dict()},
                      _environment(cfg.threads), round(bw, 3), bandwidth, int(wbytes), round(floor_s * 1000, 4),
                      runtimes,
                      notes=notes)

    ort_ok = (r := res.get(ORT_CPU)) is not None and r.ran
    if ort_ok and long_to > cfg.prompt_len + 1:
        say(f"timing {ORT_CPU} from position {cfg.prompt_len} to {long_to} ...")
        gen, _ = _make_generator(folder, "cpu", cfg)
        _ort_run(gen, ids, WARMUP_TOKENS)
        _, _, steps, pos = _ort_run(gen, ids, long_to - cfg.prompt_len + 1)  # feeds positions up to long_to - 1
        ms = [_ms(s) for s in steps]
        marks = sorted({cfg.prompt_len, 128, 256, 512, 1000} & set(range(pos[0], pos[-1] + 1)))
        res.long_run = {"positions": pos, "ms": ms, "at": {str(p): _window_ms(pos, ms, p) for p in marks}}
    if ort_ok and cfg.profile:
        say(f"profiling {ORT_CPU} ...")
        out = Path(cfg.profile_dir or folder)
        out.mkdir(parents=True, exist_ok=True)
        out = out / "ort-profile"
        gen, _ = _make_generator(folder, "cpu", cfg, profile_prefix=str(out))
        _ort_run(gen, ids, cfg.new_tokens)
        path = gen.session.end_profiling()
        res.profile = summarize_profile(path)
    if module is None:
        notes.append(f"eager runtimes skipped: {torch_reason}")
    if EAGER_NOCACHE in names and cfg.nocache_repeats < cfg.repeats:
        notes.append(f"eager-nocache is timed {min(cfg.repeats, cfg.nocache_repeats)} time(s): recompute is O(n^2)")
    res.targets = _targets(res, cfg)
    return res


# ---- writing it out --------------------------------------------------------------------------------------------

def _f(x, nd=2) -> str:
    return "-" if x is None else f"{x:.{nd}f}"


def _table(res: BenchResult) -> str:
    cfg = res.config
    rows = [f"batch {cfg['batch']}, prompt {cfg['prompt_len']}, {cfg['new_tokens']} new tokens, "
            f"{cfg['threads']} threads, greedy; times in ms (medians; token latency over all decode steps)", "",
            "| runtime | providers | load | prefill | TTFT | token p50 | token p90 | token min | tokens/s |",
            "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in res.runtimes:
        if not r.ran:
            rows.append(f"| {r.name} | skipped: {r.reason} | | | | | | | |")
            continue
        rows.append(f"| {r.name} | {', '.join(r.providers)} | {_f(r.load_ms, 0)} | {_f(r.prefill_ms)} | "
                    f"{_f(r.ttft_ms)} | {_f(r.token_p50_ms)} | {_f(r.token_p90_ms)} | {_f(r.token_min_ms)} | "
                    f"{_f(r.tokens_per_s, 1)} |")
    return "\n".join(rows)


def _markdown_body(res: BenchResult, plot_line: bool = True) -> str:
    parts = [_table(res), "",
             f"Memory read bandwidth: **{res.bandwidth_gbps:.2f} GB/s** (the fastest of: numpy copy "
             f"{res.bandwidth['copy']:.2f} GB/s counting read + write, numpy sum {res.bandwidth['sum']:.2f} GB/s, "
             f"float32 gemv {res.bandwidth['gemv']:.2f} GB/s; 256 MiB, medians). Weights read per token: "
             f"{res.weight_bytes_per_token / 1e6:.1f} MB. Weight-bandwidth floor: "
             f"**{res.floor_ms:.2f} ms/token**."]
    if res.long_run:
        at = ", ".join(f"{p}: {_f(v)} ms" for p, v in res.long_run["at"].items())
        parts.append(f"ORT CPU per-token latency against position (median of positions +-8), one run to position "
                     f"{res.long_run['positions'][-1] + 1}: {at}.")
    parts += ["", "| target | measured | limit | met |", "| --- | ---: | ---: | --- |"]
    for t in res.targets:
        met = {True: "yes", False: "**no**", None: "not measured"}[t["met"]]
        parts.append(f"| {t['target']} ({t['detail']}) | {_f(t['measured'])} | {t['limit']} | {met} |")
    if res.profile:
        ops = ", ".join(f"{o['op']} {o['share'] * 100:.0f}%" for o in res.profile["ops"][:8])
        parts.append(f"\nONNX Runtime profile of one ORT CPU generation ({res.profile['file']}): {ops}.")
    for n in res.notes:
        parts.append(f"\nNote: {n}.")
    if plot_line:
        parts.append(f"\n{res.environment.get('plot', '')}")
    return "\n".join(parts)


def plot(res: BenchResult, path: Path) -> str | None:
    """bench.png: per-token latency against position per runtime (and the long ORT CPU run). None if no matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for r in res.runtimes:
        if r.ran and r.per_position_ms:
            ax.plot(r.positions, r.per_position_ms, label=r.name, linewidth=1)
    if res.long_run:
        ax.plot(res.long_run["positions"], res.long_run["ms"], label="ort-cpu (long run)", linewidth=0.8, alpha=0.7)
    ax.axhline(res.floor_ms, color="grey", linestyle="--", linewidth=0.8, label="weight-bandwidth floor")
    ax.set_xlabel("position of the token fed")
    ax.set_ylabel("ms per token")
    ax.set_yscale("log")
    ax.set_title(f"decode latency per position: {res.model['spec']}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)


def write_bench(res: BenchResult, out_dir: str | Path) -> list[Path]:
    """bench.json, bench.md, bench.png (when matplotlib is installed); refresh the bench table in report.md."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    png = plot(res, out_dir / "bench.png")
    res.environment["plot"] = ("![per-token latency against position](bench.png)" if png else
                               "No plot: matplotlib is not installed (`pip install 'mhaexport[plot]'`).")
    (out_dir / "bench.json").write_text(json.dumps(res.to_dict(), indent=1) + "\n")
    written.append(out_dir / "bench.json")
    md = f"# Bench: {res.model['spec']}\n\n{res.environment['date']}, {res.environment.get('cpu')}\n\n" \
         f"{_markdown_body(res)}\n"
    (out_dir / "bench.md").write_text(md)
    written.append(out_dir / "bench.md")
    if png:
        written.append(Path(png))
    report = out_dir / "report.md"
    if report.is_file():
        update_report(report, res)
        written.append(report)
    return written


def update_report(report: Path, res: BenchResult) -> None:
    """Replace (or append) the bench section between the markers; running it again changes only that section."""
    section = f"{REPORT_BEGIN}\n## Bench\n\n{_markdown_body(res)}\n{REPORT_END}"
    text = report.read_text()
    pattern = re.compile(re.escape(REPORT_BEGIN) + r".*?" + re.escape(REPORT_END), re.S)
    if pattern.search(text):
        text = pattern.sub(lambda _: section, text)
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    report.write_text(text)
