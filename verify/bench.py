"""Time the KV-cache decode loop of an export folder on each runtime (`mhaexport bench`).

Per runtime, after an untimed warm-up and over repeats, on the same seeded prompt, greedy: prefill latency, time
to first token, per-token decode latency (p50 / p90 / min), tokens/s, and per-token latency against position.
ONNX Runtime is timed through the deploy runtime's own decode loop (``mhaexport.runtime.Generator``), so the
figures are what a deployment sees. The memory bandwidth and the weight-bandwidth floor are measured in the same
run, and ``--long`` times one ORT CPU generation out to a far position to show how cost grows with the cache.

``--compare`` adds the ONNX exports of other folders holding the same model (another attention lowering or dtype):
each gets ORT rows labelled by its lowering, and a table compares the lowerings. Every runtime is loaded and warmed
up first, then the timed repeats run round-robin (one generation of each row per round), so drift and noise on a
shared machine fall on every row alike; the long runs (``long_repeats`` each) are interleaved the same way.

Writes bench.json, bench.md and bench.png (matplotlib optional) and refreshes a delimited table in report.md.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import re
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from mhaexport.errors import ArtifactError, ConfigError, MhaExportError, RuntimeInputError
from mhaexport.artifact import ExportFolder, atomic_write_bytes, atomic_write_json
from mhaexport.verify.runners import EAGER, EAGER_CUDA, ORT_CPU, ORT_CUDA, TORCHSCRIPT

# bench's own row besides verify's runtimes: eager without the KV cache
EAGER_NOCACHE = "eager-nocache"
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
    long_to: int | None = None  # ORT CPU runs (each lowering) out to this position; None: max_positions if <= 1024; 0: off
    opt_levels: tuple[str, ...] = ()  # extra ORT CPU runs at these graph optimization levels ("ort-cpu@basic")
    profile: bool = False  # write ONNX Runtime's profile of one ORT CPU generation and summarize it
    profile_dir: str | None = None  # where the profile goes (default: the export folder)
    seed: int = 0
    compare: tuple[str, ...] = ()  # more export folders of the same model: ORT rows labelled by their lowering
    long_repeats: int = 1  # long runs per ORT CPU row, round-robin over the rows; per position, the median


@dataclass
class RuntimeBench:
    """One runtime's figures (milliseconds); ``ran`` is None when skipped (``reason`` says why)."""

    name: str  # unique row id: "ort-cpu" for the folder's own export, "ort-cpu [attention=ort float16]" for --compare
    ran: bool | None = None
    reason: str | None = None
    label: str = ""  # the row in tables: the name and, for ONNX Runtime rows, the lowering
    lowering: str | None = None  # "attention=ort float32": ONNX Runtime rows only
    opt_level: str | None = None  # "basic": the --opt-levels variants of ORT CPU ("ort-cpu@basic") only
    folder: str | None = None  # the export folder an ONNX Runtime row ran
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

    def __post_init__(self) -> None:
        if not self.label:
            self.label = self.name if self.lowering is None else f"{self.name} [{self.lowering}]"


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
    # one per ORT CPU lowering: {"name", "label", "lowering", "positions", "ms", "at": {pos: ms}, "near", "far"}
    long_runs: list[dict] = field(default_factory=list)
    lowerings: list[dict] = field(default_factory=list)  # ORT rows side by side (see compare_lowerings)
    targets: list[dict] = field(default_factory=list)
    profile: dict | None = None
    notes: list[str] = field(default_factory=list)

    def get(self, name: str) -> RuntimeBench | None:
        return next((r for r in self.runtimes if r.name == name), None)

    def long_run(self, name: str = "ort-cpu") -> dict | None:
        """The long run of row ``name`` (default: the folder's own ORT CPU export), or None."""
        return next((lr for lr in self.long_runs if lr["name"] == name), None)

    def to_dict(self) -> dict:
        return asdict(self)

    def summary(self) -> str:
        """The table, the bandwidth floor and the targets, as plain text for the terminal."""
        return _markdown_body(self)


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


# ---- timed runners: set up (load, warm-up) first, then the timed repeats round-robin ----------------------------

@dataclass
class _Runner:
    """One row being timed: ``generate(new_tokens)`` -> (prefill_s, first_token_s, step_s list, positions list)."""

    rb: RuntimeBench
    generate: Callable[[int], tuple]
    repeats: int
    gen: object = None  # the ONNX Runtime Generator, for the long run
    runs: list = field(default_factory=list)


def _round_robin(runners: list[_Runner], new_tokens: int, say: Progress) -> None:
    """Round i runs one generation of every runner that wants more than i repeats, in row order; a runner that
    fails is marked skipped with the reason and leaves the rounds."""
    rounds = max((r.repeats for r in runners), default=0)
    for i in range(rounds):
        say(f"timed round {i + 1}/{rounds}: {', '.join(r.rb.label for r in runners if i < r.repeats)} ...")
        for r in runners:
            if i < r.repeats and r.rb.reason is None:
                try:
                    r.runs.append(r.generate(new_tokens))
                except _runtime_errors() as e:
                    _skip(r.rb, e)


def _runtime_errors() -> tuple[type[Exception], ...]:
    """What a runtime that cannot run raises: our errors and ONNX Runtime's (a lowering or dtype without a kernel,
    a provider that does not load). Anything else is a bug and propagates."""
    from onnxruntime.capi import onnxruntime_pybind11_state as st

    names = ("Fail", "InvalidArgument", "NoSuchFile", "NoModel", "EngineError", "RuntimeException", "InvalidProtobuf",
             "ModelLoaded", "NotImplemented", "InvalidGraph", "EPFail")
    return (MhaExportError, *(getattr(st, n) for n in names if hasattr(st, n)))


def _skip(rb: RuntimeBench, e: Exception) -> None:
    """Mark a row skipped with the first line of why."""
    text = str(e).strip()
    rb.ran, rb.reason = None, text.splitlines()[0] if text else type(e).__name__


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


def _torch_runner(name: str, module, contract, ids: np.ndarray, *, cache: bool, device: str, repeats: int,
                  load_s: float, providers: list[str]) -> _Runner:
    def generate(n: int) -> tuple:
        return _torch_generate(module, contract, ids, n, cache=cache, device=device)

    generate(WARMUP_TOKENS)  # untimed warm-up
    return _Runner(RuntimeBench(name, providers=providers, load_ms=_ms(load_s)), generate, repeats)


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


def _ort_runner(rb: RuntimeBench, folder: Path, provider: str, ids: np.ndarray, cfg: BenchConfig,
                opt_level: str | None = None) -> _Runner:
    """Create the session, warm up; a runtime that cannot run leaves ``rb`` skipped (runner with 0 repeats)."""
    try:
        gen, load_s = _make_generator(folder, provider, cfg, opt_level)
        rb.providers, rb.load_ms = list(gen.providers), _ms(load_s)
        _ort_run(gen, ids, WARMUP_TOKENS)
    except _runtime_errors() as e:
        _skip(rb, e)
        return _Runner(rb, lambda n: (), 0)
    return _Runner(rb, lambda n: _ort_run(gen, ids, n), cfg.repeats, gen=gen)


def lowering_of(ef: ExportFolder) -> str | None:
    """How an export folder's ONNX graph holds attention, as a row label: "attention=ort float16"."""
    onnx_art = ef.artifacts.get("onnx")
    if onnx_art is None:
        return None
    return f"attention={onnx_art.get('attention', 'decomposed')} {onnx_art.dtype}"


def compare_exports(folder: Path, manifest: ExportFolder,
                    others: tuple[str, ...] | list[str]) -> list[tuple[Path, ExportFolder]]:
    """Read and hash-check each --compare folder's ONNX export; each must hold the same model as ``folder``
    (ArtifactError otherwise). ``folder`` itself and repeats are dropped."""
    out = []
    want = manifest.model.fingerprint
    seen = {folder.resolve()}
    for other in others:
        other = Path(other)
        if other.resolve() in seen:  # the folder itself, or named twice: one row is enough
            continue
        seen.add(other.resolve())
        m = ExportFolder.open(other, "onnx")
        if m.model.fingerprint != want:
            raise ArtifactError(
                f"--compare {other} holds {m.model.spec} (model fingerprint {m.model.fingerprint}), "
                f"not the model of {folder} ({manifest.model.spec}, fingerprint {want}): compare exports "
                "of one model only")
        out.append((other, m))
    return out


def parse_lowerings(text: str) -> list[tuple[str, str]]:
    """"decomposed,onnx,ort:float16" -> [("decomposed", "float32"), ("onnx", "float32"), ("ort", "float16")]."""
    from mhaexport.exporter.lowering import LOWERINGS
    from mhaexport.dtypes import NAMES as DTYPES

    out = []
    for item in (x.strip() for x in text.split(",")):
        if not item:
            continue
        attention, _, dtype = item.partition(":")
        dtype = dtype or "float32"
        if attention not in LOWERINGS or dtype not in DTYPES:
            raise RuntimeInputError(f"--lowerings {item!r}: expected ATTENTION[:DTYPE] with ATTENTION one of "
                                    f"{', '.join(LOWERINGS)} and DTYPE one of {', '.join(DTYPES)}")
        if (attention, dtype) not in out:
            out.append((attention, dtype))
    return out


def export_lowerings(folder: str | Path, wanted: list[tuple[str, str]], out_dir: str | Path,
                     have: tuple[str, ...] | list[str] = (), progress: Progress | None = None) -> list[Path]:
    """The export folders holding each (attention, dtype) of ``wanted`` for ``folder``'s model: ``folder`` or one of
    ``have`` when it already holds that lowering, else out_dir/lowerings/ATTENTION-DTYPE, exported there unless
    a hash-checked export of the same model and lowering is already there. Returns them in ``wanted``'s order."""
    say = progress or (lambda m: None)
    folder = Path(folder)
    manifest = ExportFolder.open(folder)
    known = {lowering_of(manifest): folder}
    for other, m in compare_exports(folder, manifest, have):
        known.setdefault(lowering_of(m), other)
    loaded, out = None, []
    for attention, dtype in wanted:
        lowering = f"attention={attention} {dtype}"
        if lowering in known:
            out.append(known[lowering])
            continue
        sub = Path(out_dir) / "lowerings" / f"{attention}-{dtype}"
        try:
            m = ExportFolder.open(sub, "onnx")
            if m.model.fingerprint == manifest.model.fingerprint and lowering_of(m) == lowering:
                say(f"reusing {sub} ({lowering})")
                out.append(sub)
                continue
        except ArtifactError:
            pass
        if loaded is None:
            from mhaexport.models.loading import load_recorded

            loaded = load_recorded(manifest)
        from mhaexport.exporter.onnx import export_onnx

        say(f"exporting {lowering} -> {sub} ...")
        export_onnx(loaded, sub, attention=attention, dtype=dtype)
        out.append(sub)
    return out


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


def _long_entry(rb: RuntimeBench, pos: list[int], steps: list[float], prompt_len: int) -> dict:
    """One long run: the marks 32/128/256/512/1000 it covers, ``near`` (the prompt end) and ``far`` (1000, or the
    last full +-8 window when the run stops earlier)."""
    ms = [_ms(s) for s in steps]
    last = pos[-1]
    far = 1000 if last >= 1000 else max(last - 8, prompt_len)
    marks = sorted(({prompt_len, 128, 256, 512, 1000} & set(range(pos[0], last + 1))) | {far})
    return {"name": rb.name, "label": rb.label, "lowering": rb.lowering, "positions": pos, "ms": ms,
            "at": {str(p): _window_ms(pos, ms, p) for p in marks}, "near": prompt_len, "far": far}


def _long_runs(runners: list[_Runner], ids: np.ndarray, long_to: int, prompt_len: int, repeats: int,
               say: Progress) -> list[dict]:
    """Generations from the prompt to ``long_to`` for each ORT CPU row (warm already), round-robin over the rows
    ``repeats`` times; per position, the median over the repeats."""
    runs: dict[int, list] = {i: [] for i in range(len(runners))}
    for k in range(repeats):
        for i, r in enumerate(runners):
            if r.rb.reason is not None:
                continue
            say(f"long run {k + 1}/{repeats}: {r.rb.label} from position {prompt_len} to {long_to} ...")
            try:
                runs[i].append(_ort_run(r.gen, ids, long_to - prompt_len + 1))  # feeds positions up to long_to - 1
            except _runtime_errors() as e:
                _skip(r.rb, e)
    out = []
    for i, r in enumerate(runners):
        if r.rb.reason is None and runs[i]:
            pos = runs[i][0][3]
            steps = [statistics.median(run[2][j] for run in runs[i]) for j in range(len(pos))]
            out.append(_long_entry(r.rb, pos, steps, prompt_len))
    return out


def compare_lowerings(res: BenchResult) -> list[dict]:
    """The ORT rows side by side, per provider: per-token p50 and its ratio to the fastest row of that provider
    (same run, interleaved), and per-token latency near the prompt and far out (the long runs). The --opt-levels
    variants are left out: they are one lowering at another graph optimization level, not another lowering."""
    rows = [r for r in res.runtimes if r.ran and r.lowering is not None and r.opt_level is None]
    out = []
    for r in rows:
        peers = [x.token_p50_ms for x in rows if x.providers[:1] == r.providers[:1] and x.token_p50_ms]
        lr = res.long_run(r.name)
        near = lr["at"].get(str(lr["near"])) if lr else None
        far = lr["at"].get(str(lr["far"])) if lr else None
        out.append({"name": r.name, "label": r.label, "lowering": r.lowering, "folder": r.folder,
                    "provider": r.providers[0] if r.providers else None, "token_p50_ms": r.token_p50_ms,
                    "vs_fastest": round(r.token_p50_ms / min(peers), 3) if r.token_p50_ms and peers else None,
                    "near": lr["near"] if lr else None, "near_ms": near, "far": lr["far"] if lr else None,
                    "far_ms": far, "far_over_near": round(far / near, 3) if near and far else None})
    return out


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
    lr = res.long_run(ORT_CPU)
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
    from mhaexport.env import environment, tool_versions

    env = {**environment(), "threads": threads, "cpu_count": environment()["cpus"]}
    versions = tool_versions()
    env["onnxruntime"] = versions.get("onnxruntime")
    env["torch"] = versions.get("torch")
    try:
        import torch

        env["cuda_device"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except (ImportError, RuntimeError):  # torch is only needed for the eager runtimes
        env["cuda_device"] = None
    return env


def _torch_threads(n: int):
    """verify's torch_threads (torch's intra-op threads set to n, restored afterwards); a no-op without torch."""
    try:
        import torch  # noqa: F401

        from mhaexport.verify.verify import torch_threads
    except ImportError:
        return contextlib.nullcontext()
    return torch_threads(n)


def run_bench(folder: str | Path, cfg: BenchConfig = BenchConfig(), progress: Progress | None = None) -> BenchResult:
    """Benchmark every requested runtime on ``folder``'s exports, and the ONNX exports of ``cfg.compare`` (same
    model, other lowerings) on ONNX Runtime; runtimes that cannot run are skipped with why.

    Raises RuntimeInputError for an unknown runtime and ConfigError for an unknown --opt-levels level, before
    anything runs. torch's thread count is ``cfg.threads`` during the run and restored afterwards."""
    names = check_config(cfg)
    with _torch_threads(cfg.threads):
        return _run_bench(Path(folder), cfg, names, progress or (lambda m: None))


def check_config(cfg: BenchConfig) -> tuple[str, ...]:
    """The runtimes ``cfg`` asks for; RuntimeInputError for an unknown runtime, ConfigError for an unknown
    --opt-levels level (one line naming the valid ones). Cheap: the CLI calls it before exporting anything."""
    from mhaexport.runtime.session import OPT_LEVELS

    names = cfg.runtimes or ALL_RUNTIMES
    unknown = [n for n in names if n not in ALL_RUNTIMES]
    if unknown:
        raise RuntimeInputError(f"unknown runtime(s) {', '.join(unknown)}; known: {', '.join(ALL_RUNTIMES)}")
    bad_levels = [x for x in cfg.opt_levels if x not in OPT_LEVELS]
    if bad_levels:
        raise ConfigError(f"--opt-levels: unknown graph optimization level(s) {', '.join(bad_levels)}; "
                          f"valid: {', '.join(OPT_LEVELS)}")
    return tuple(names)


def _run_bench(folder: Path, cfg: BenchConfig, names: tuple[str, ...], say: Progress) -> BenchResult:
    manifest = ExportFolder.open(folder)
    c = manifest.contract
    if cfg.prompt_len + cfg.new_tokens > c.max_positions:
        raise RuntimeInputError(f"--prompt-len {cfg.prompt_len} + --new-tokens {cfg.new_tokens} exceeds the model's "
                                f"max_positions={c.max_positions}")
    others = compare_exports(folder, manifest, cfg.compare)
    if others and not {ORT_CPU, ORT_CUDA} & set(names):
        raise RuntimeInputError("--compare times ONNX exports on ONNX Runtime, but --runtimes has neither ort-cpu "
                                "nor ort-cuda")
    long_to = cfg.long_to if cfg.long_to is not None else (c.max_positions if c.max_positions <= 1024 else 0)
    long_to = min(long_to, c.max_positions)
    arts = manifest.artifacts
    ids = np.random.default_rng(cfg.seed).integers(0, c.vocab_size, (cfg.batch, cfg.prompt_len), dtype=np.int64)

    say("measuring memory bandwidth ...")
    bandwidth = memory_bandwidth_gbps()
    bw = bandwidth["read"]
    notes: list[str] = []

    torch_wanted = [n for n in names if n in (EAGER, EAGER_NOCACHE, EAGER_CUDA, TORCHSCRIPT)]
    module, wbytes, torch_reason = None, None, None
    # the eager model also gives the weight bytes per token for the floor
    try:
        import torch  # its thread count is set by run_bench

        from mhaexport.models.loading import load_recorded

        t0 = time.perf_counter()
        loaded = load_recorded(manifest)
        load_s = time.perf_counter() - t0
        module = loaded.module.eval()
        wbytes = weight_bytes_per_token(module, cfg.batch)
    except ImportError as e:
        torch_reason = f"torch is not importable: {e}"
    except MhaExportError as e:
        torch_reason = f"cannot rebuild the eager model from the manifest: {e}"
    if wbytes is None:  # no eager model: count the ONNX file's bytes (an upper bound: embeddings counted whole)
        wbytes = sum(m["bytes"] for m in arts["onnx"].files.values()) if "onnx" in arts else 0
        notes.append("weight bytes per token counted from the ONNX file size (no eager model)")
    floor_s = wbytes / (bw * 1e9)

    # Set up every row (load, warm-up) in row order; the timed repeats come after, round-robin.
    rows: list[RuntimeBench] = []
    runners: list[_Runner] = []
    own_lowering = lowering_of(manifest)
    taken: set[str] = set()

    def add(runner: _Runner) -> None:
        rows.append(runner.rb)
        taken.add(runner.rb.name)
        if runner.rb.reason is None:
            runners.append(runner)

    def ort_row(name: str, row_folder: Path, lowering: str | None) -> RuntimeBench:
        label = name if lowering is None else f"{name} [{lowering}]"
        row_name = name if row_folder == folder else label
        if row_name in taken:  # two folders with one lowering: tell them apart by folder
            row_name = label = f"{name} [{lowering}, {row_folder}]"
        return RuntimeBench(row_name, label=label, lowering=lowering, folder=str(row_folder))

    for name in names:
        if name in torch_wanted and module is None:
            rows.append(RuntimeBench(name, reason=torch_reason))
            continue
        say(f"loading and warming up {name} ...")
        try:
            if name == EAGER:
                add(_torch_runner(name, module, c, ids, cache=True, device="cpu", repeats=cfg.repeats,
                                  load_s=load_s, providers=["torch (cpu)"]))
            elif name == EAGER_NOCACHE:
                add(_torch_runner(name, module, c, ids, cache=False, device="cpu",
                                  repeats=min(cfg.repeats, cfg.nocache_repeats), load_s=load_s,
                                  providers=["torch (cpu), no KV cache: whole sequence each step"]))
            elif name == EAGER_CUDA:
                import torch

                if not torch.cuda.is_available():
                    rows.append(RuntimeBench(name, reason="torch.cuda.is_available() is False"))
                    continue
                import copy

                t0 = time.perf_counter()
                cuda_module = copy.deepcopy(module).to("cuda")
                add(_torch_runner(name, cuda_module, c, ids, cache=True, device="cuda", repeats=cfg.repeats,
                                  load_s=time.perf_counter() - t0,
                                  providers=[f"torch (cuda: {torch.cuda.get_device_name(0)})"]))
            elif name == TORCHSCRIPT:
                if "torchscript" not in arts:
                    rows.append(RuntimeBench(name, reason=f"no TorchScript export in {folder}"))
                    continue
                import torch

                t0 = time.perf_counter()
                ts = torch.jit.load(str(folder / arts["torchscript"].file), map_location="cpu").eval()
                add(_torch_runner(name, ts, c, ids, cache=True, device="cpu", repeats=cfg.repeats,
                                  load_s=time.perf_counter() - t0, providers=["torch.jit (cpu)"]))
            elif name in (ORT_CPU, ORT_CUDA):
                provider = "cpu" if name == ORT_CPU else "cuda"
                if "onnx" not in arts:
                    rows.append(RuntimeBench(name, reason=f"no ONNX export in {folder}"))
                    own_ok = False
                else:
                    add(_ort_runner(ort_row(name, folder, own_lowering), folder, provider, ids, cfg))
                    own_ok = rows[-1].reason is None
                for other, m in others:
                    if name == ORT_CUDA and not own_ok:
                        continue  # CUDA is not really present (the folder's own row says why)
                    say(f"loading and warming up {name} on {other} ...")
                    add(_ort_runner(ort_row(name, other, lowering_of(m)), other, provider, ids, cfg))
        except MhaExportError as e:  # a static export, ...
            rows.append(RuntimeBench(name, reason=str(e)))

    if ORT_CPU in names and "onnx" in arts:
        for level in cfg.opt_levels:
            say(f"loading and warming up {ORT_CPU}@{level} ...")
            rb = RuntimeBench(f"{ORT_CPU}@{level}", lowering=own_lowering, opt_level=level, folder=str(folder))
            add(_ort_runner(rb, folder, "cpu", ids, cfg, opt_level=level))

    _round_robin(runners, cfg.new_tokens, say)
    for r in runners:
        if r.rb.reason is None:
            _fill(r.rb, r.runs, cfg.batch, cfg.new_tokens)

    res = BenchResult(str(folder), asdict(cfg), {"spec": manifest.model.spec, "contract": c.to_dict(),
                                                 "fingerprint": manifest.model.fingerprint},
                      _environment(cfg.threads), round(bw, 3), bandwidth, int(wbytes), round(floor_s * 1000, 4),
                      rows, notes=notes)

    # The long runs: every ORT CPU lowering (not the opt-level variants), from the prompt out to long_to.
    long_runners = [r for r in runners if r.rb.ran and r.gen is not None and r.rb.name.split(" [")[0] == ORT_CPU]
    if long_runners and long_to > cfg.prompt_len + 1:
        res.long_runs = _long_runs(long_runners, ids, long_to, cfg.prompt_len, cfg.long_repeats, say)
    if res.get(ORT_CPU) is not None and res.get(ORT_CPU).ran and cfg.profile:
        say(f"profiling {ORT_CPU} ...")
        out = Path(cfg.profile_dir or folder)
        out.mkdir(parents=True, exist_ok=True)
        out = out / "ort-profile"
        gen, _ = _make_generator(folder, "cpu", cfg, profile_prefix=str(out))
        _ort_run(gen, ids, cfg.new_tokens)
        path = gen.session.end_profiling()
        res.profile = summarize_profile(path)
    if module is None and torch_wanted:
        notes.append(f"eager runtimes skipped: {torch_reason}")
    if EAGER_NOCACHE in names and cfg.nocache_repeats < cfg.repeats:
        notes.append(f"eager-nocache is timed {min(cfg.repeats, cfg.nocache_repeats)} time(s): recompute is O(n^2)")
    if len(runners) > 1:
        notes.append(f"timed round-robin: {cfg.repeats} round(s), one generation of every row per round, after "
                     "every row was loaded and warmed up")
    res.lowerings = compare_lowerings(res)
    res.targets = _targets(res, cfg)
    return res


# ---- writing it out --------------------------------------------------------------------------------------------

def _f(x, nd=2) -> str:
    return "-" if x is None else f"{x:.{nd}f}"


def _table(res: BenchResult) -> str:
    cfg = res.config
    rows = [(f"batch {cfg['batch']}, prompt {cfg['prompt_len']}, {cfg['new_tokens']} new tokens, "
             f"{cfg['threads']} threads, greedy; times in ms (medians; token latency over all decode steps)"), "",
            "| runtime | providers | load | prefill | TTFT | token p50 | token p90 | token min | tokens/s |",
            "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in res.runtimes:
        if not r.ran:
            rows.append(f"| {r.label} | skipped: {r.reason} | | | | | | | |")
            continue
        rows.append(f"| {r.label} | {', '.join(r.providers)} | {_f(r.load_ms, 0)} | {_f(r.prefill_ms)} | "
                    f"{_f(r.ttft_ms)} | {_f(r.token_p50_ms)} | {_f(r.token_p90_ms)} | {_f(r.token_min_ms)} | "
                    f"{_f(r.tokens_per_s, 1)} |")
    return "\n".join(rows)


def _lowering_table(res: BenchResult) -> str:
    """The lowerings side by side: which is fastest per provider and by how much, and how cost grows with position."""
    far = {lw["far"] for lw in res.lowerings if lw["far"] is not None}
    near = {lw["near"] for lw in res.lowerings if lw["near"] is not None}
    at_near = f"at {near.pop()}" if len(near) == 1 else "near"
    at_far = f"at {far.pop()}" if len(far) == 1 else "far"
    rows = [("Lowerings (ONNX Runtime rows of this run; token p50 over the interleaved repeats, x fastest = p50 / "
             "the fastest p50 on the same provider; position latencies from the long runs, median of positions +-8):"),
            "",
            f"| lowering | provider | token p50 | x fastest | {at_near} | {at_far} | {at_far} / {at_near} |",
            "| --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    for lw in res.lowerings:
        rows.append(f"| {lw['label']} | {lw['provider']} | {_f(lw['token_p50_ms'])} | {_f(lw['vs_fastest'])} | "
                    f"{_f(lw['near_ms'])} | {_f(lw['far_ms'])} | {_f(lw['far_over_near'])} |")
    return "\n".join(rows)


def _markdown_body(res: BenchResult, plot_note: str | None = None) -> str:
    """The bench section in markdown; ``plot_note`` (the bench.png link, or why there is none) ends it."""
    parts = [_table(res), "",
             (f"Memory read bandwidth: **{res.bandwidth_gbps:.2f} GB/s** (the fastest of: numpy copy "
              f"{res.bandwidth['copy']:.2f} GB/s counting read + write, numpy sum {res.bandwidth['sum']:.2f} GB/s, "
              f"float32 gemv {res.bandwidth['gemv']:.2f} GB/s; 256 MiB, medians). Weights read per token: "
              f"{res.weight_bytes_per_token / 1e6:.1f} MB. Weight-bandwidth floor: "
              f"**{res.floor_ms:.2f} ms/token**.")]
    for lr in res.long_runs:
        at = ", ".join(f"{p}: {_f(v)} ms" for p, v in lr["at"].items())
        parts.append(f"\n{lr['label']}: per-token latency against position (median of positions +-8), one run to "
                     f"position {lr['positions'][-1] + 1}: {at}.")
    if len(res.lowerings) > 1:
        parts += ["", _lowering_table(res)]
    cfg = res.config
    standard = (res.model.get("spec") == "preset:bench" and cfg.get("batch") == 1 and cfg.get("prompt_len") == 32
                and cfg.get("new_tokens") == 128 and cfg.get("threads") == 2)
    parts += ["", "Speed targets (set for the `bench` preset at batch 1, prompt 32, 128 new tokens, 2 threads"
              + ("" if standard else "; this run differs, so read them as figures, not as a verdict") + "):",
              "", "| target | measured | limit | met |", "| --- | ---: | ---: | --- |"]
    for t in res.targets:
        met = {True: "yes", False: "**no**", None: "not measured"}[t["met"]]
        parts.append(f"| {t['target']} ({t['detail']}) | {_f(t['measured'])} | {t['limit']} | {met} |")
    if res.profile:
        ops = ", ".join(f"{o['op']} {o['share'] * 100:.0f}%" for o in res.profile["ops"][:8])
        parts.append(f"\nONNX Runtime profile of one ORT CPU generation ({res.profile['file']}): {ops}.")
    for n in res.notes:
        parts.append(f"\nNote: {n}.")
    if plot_note:
        parts.append(f"\n{plot_note}")
    return "\n".join(parts)


def plot(res: BenchResult, path: Path) -> str | None:
    """bench.png: per-token latency against position per runtime (and the long ORT CPU runs). None if no matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for r in res.runtimes:
        if r.ran and r.per_position_ms:
            ax.plot(r.positions, r.per_position_ms, label=r.label, linewidth=1)
    for lr in res.long_runs:
        ax.plot(lr["positions"], lr["ms"], label=f"{lr['label']} (long run)", linewidth=0.8, alpha=0.7)
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
    note = ("![per-token latency against position](bench.png)" if png else
            "No plot: matplotlib is not installed (`pip install 'mhaexport[plot]'`).")
    atomic_write_json(out_dir / "bench.json", res.to_dict())
    written.append(out_dir / "bench.json")
    md = f"# Bench: {res.model['spec']}\n\n{res.environment['date']}, {res.environment.get('cpu')}\n\n" \
         f"{_markdown_body(res, note)}\n"
    atomic_write_bytes(out_dir / "bench.md", md.encode())
    written.append(out_dir / "bench.md")
    if png:
        written.append(Path(png))
    report = out_dir / "report.md"
    if report.is_file():
        update_report(report, res, note)
        written.append(report)
    return written


def update_report(report: Path, res: BenchResult, plot_note: str | None = None) -> None:
    """Replace (or append) the bench section between the markers; running it again changes only that section.
    ``plot_note``: the bench.png link (bench.png sits next to report.md), or why there is none."""
    section = f"{REPORT_BEGIN}\n## Bench\n\n{_markdown_body(res, plot_note)}\n{REPORT_END}"
    text = report.read_text()
    pattern = re.compile(re.escape(REPORT_BEGIN) + r".*?" + re.escape(REPORT_END), re.DOTALL)
    if pattern.search(text):
        text = pattern.sub(lambda _: section, text)
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    atomic_write_bytes(report, text.encode())
