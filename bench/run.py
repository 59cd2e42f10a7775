"""A whole bench run: read the folder, probe the memory bandwidth, plan the rows, load and warm up every row until
it is steady, then the timed repeats round-robin (one generation of each row per round, so the drift and noise of
a shared machine fall on every row alike), the long runs (interleaved the same way), how cost grows with the batch
and the prompt (``--batches`` / ``--prompts``, :mod:`mhaexport.bench.scaling`), the profile, and the targets.
Returns a :class:`~mhaexport.bench.result.BenchResult`; writing it out is :mod:`mhaexport.bench.render`'s.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from mhaexport.core import dtypes
from mhaexport.artifact import ExportFolder, OpenFolders, same_model_folders
from mhaexport.bench import probes
from mhaexport.bench.config import (BENCH_RUNTIMES, EAGER_NOCACHE, ORT_GENAI, ORT_RUNTIMES, TORCH_RUNTIMES,
                                    BenchConfig)
from mhaexport.bench.eta import Eta
from mhaexport.bench.lowerings import compare_lowerings
from mhaexport.artifact.record import Environment
from mhaexport.bench.result import (BandwidthInfo, BenchModel, BenchResult, LongRun, LoopComparison, OpTime,
                                    Profile)
from mhaexport.bench.rows import EagerModel, Row, ort_session, plan_rows
from mhaexport.bench.scaling import scaling_rows, scaling_runs, seeded_prompt
from mhaexport.bench.stats import token_spread, window_median
from mhaexport.bench.targets import evaluate
from mhaexport.core.env import environment, tool_versions
from mhaexport.core.errors import MhaExportError, ProviderUnavailable, RuntimeOptionError
from mhaexport.core.progress import Step
from mhaexport.runners.names import ORT_CPU
from mhaexport.runners.pt2 import refuse_untrusted
from mhaexport.runners.registry import DEPLOY, runner_for
from mhaexport.runners.threads import torch_threads
from mhaexport.runtime.decode import DecodeLoop, GenerationConfig, GenerationResult

Progress = Callable[[str], None]


def run_bench(folder: str | Path | ExportFolder, cfg: BenchConfig = BenchConfig(),
              progress: Progress | None = None, *, probe: probes.Probe | None = None,
              reads: OpenFolders | None = None) -> BenchResult:
    """Benchmark every requested runtime on ``folder``'s exports, and the ONNX exports of ``cfg.compare`` (same
    model, other lowerings) on ONNX Runtime; runtimes that cannot run are skipped with why.

    ``probe(threads) -> Bandwidth`` measures the memory bandwidth for the floor (default:
    :func:`mhaexport.bench.probes.default_probe`, 256 MiB read three ways). ``cfg`` was checked when it was made
    (:class:`BenchConfig`). ``folder``: a path, or an opened ExportFolder; ``reads``: the command's
    :class:`~mhaexport.artifact.OpenFolders` (the folders it opened already are not opened again; it closes them);
    without it the folders are opened here and their snapshots removed when the run ends. torch's thread count is
    ``cfg.threads`` during the run and restored afterwards."""
    names = tuple(cfg.runtimes or BENCH_RUNTIMES.default)
    with torch_threads(cfg.threads), OpenFolders() as own:
        reads = reads or own
        return _run_bench(reads.open(folder), cfg, names, progress or (lambda m: None), probe or probes.default_probe,
                          reads)


def _load_eager(ef: ExportFolder, trust_code: bool = False) -> tuple[EagerModel | None, str | None]:
    """The eager model rebuilt from the manifest (eager rows, weight bytes), or None and why not."""
    try:
        import torch  # noqa: F401  # its thread count is set by run_bench

        from mhaexport.models.loading import load_recorded
    except ImportError as e:
        return None, f"torch is not importable: {e}"
    t0 = time.perf_counter()
    try:
        loaded = load_recorded(ef, trust_code=trust_code)
    except MhaExportError as e:
        return None, f"cannot rebuild the eager model from the manifest: {e}"
    return EagerModel(loaded.module.eval(), time.perf_counter() - t0), None


def _run_bench(ef: ExportFolder, cfg: BenchConfig, names: tuple[str, ...], say: Progress,
               probe: probes.Probe, reads: OpenFolders) -> BenchResult:
    folder = ef.path
    refuse_untrusted(ef, cfg.runtimes, cfg.trust_code, option="--runtimes")  # code named without --trust-code
    if ORT_GENAI in names and ef.has("onnx") and "genai_config.json" in ef.entry("onnx").files:
        from mhaexport.runtime.genai import check_options

        check_options(ef.root, folder, trust_code=cfg.trust_code)  # options that load code: refused before work
    c = ef.contract
    if cfg.prompt_len + cfg.new_tokens > c.max_positions:
        raise RuntimeOptionError(f"--prompt-len {cfg.prompt_len} + --new-tokens {cfg.new_tokens} exceeds the model's "
                                 f"max_positions={c.max_positions}")
    others = same_model_folders(folder, ef, cfg.compare, reads)  # hash-checked, each holding this folder's model
    if others and not set(ORT_RUNTIMES) & set(names):
        raise RuntimeOptionError("--compare times ONNX exports on ONNX Runtime, but --runtimes has neither ort-cpu "
                                 "nor ort-cuda")
    long_to = cfg.long_to if cfg.long_to is not None else (c.max_positions if c.max_positions <= 1024 else 0)
    long_to = min(long_to, c.max_positions)
    ids = seeded_prompt(cfg.seed, c.vocab_size, cfg.batch, cfg.prompt_len)

    say(f"measuring memory bandwidth ({cfg.threads} thread{'s' if cfg.threads != 1 else ''}) ...")
    bandwidth = probe(cfg.threads)
    notes: list[str] = []
    eager, no_eager = _load_eager(ef, cfg.trust_code)
    if eager is not None:
        wbytes = probes.weight_bytes_per_token(eager.module, cfg.batch)
    else:  # no eager model: count the ONNX file's bytes (an upper bound: embeddings counted whole)
        wbytes = sum(m["bytes"] for m in ef.artifacts["onnx"].files.values()) if ef.has("onnx") else 0
        notes.append("weight bytes per token counted from the ONNX file size (no eager model)")
    floor_s = wbytes / (bandwidth.read_gbps * 1e9)

    # Load every row and run its first warm-up generation (its cost: the estimate of what is left), then warm up
    # each until steady; the timed repeats come after, round-robin. Every generation is a progress line.
    rows = plan_rows(folder, ef, cfg, names, others, eager, no_eager)
    loading = [row for row in rows if row.ok]
    eta = Eta(say)
    long_to_run = long_to > cfg.prompt_len + 1
    for row in loading:
        eta.plan(row.record.label, row.warmups_planned(cfg.max_warmups) + row.repeats)
        if long_to_run and row.record.name.split(" [")[0] == ORT_CPU and row.record.opt_level is None:
            # a long run in generations' worth: its tokens over new_tokens, the cache's growth counted by half
            eta.plan(row.record.label, cfg.long_repeats * 1.5 * (long_to - cfg.prompt_len) / cfg.new_tokens)
    firsts = {}
    for row in loading:
        eta.tell(f"loading {row.record.label} and its first warm-up generation ...")
        firsts[id(row)] = setup(row, ids, cfg, eta)
    for row in loading:
        if row.ok:
            warm(row, ids, cfg, firsts[id(row)], eta)
        if row.ok and not row.record.steady:
            notes.append(f"{row.record.label} did not settle in {row.record.warmups} warm-ups (median step "
                         f"{', '.join(f'{m:.2f}' for m in row.record.warmup_token_ms)} ms): its timings may still "
                         "include warm-up effects")
    timed = [r for r in rows if r.ok]
    run_rounds(timed, ids, cfg.new_tokens, say, eta)
    for row in timed:
        row.finish(cfg.batch, cfg.new_tokens)
    notes += quantized_rows([r.record for r in rows], int(wbytes), floor_s * 1000)
    loop = loop_comparison([r.record for r in rows], cfg)

    res = BenchResult(str(folder), cfg, BenchModel(ef.model.spec, c.to_dict(), ef.model.fingerprint),
                      Environment.from_dict({**environment(), "threads": cfg.threads, "cuda_device": _cuda_device()},
                                            "environment"),
                      round(bandwidth.read_gbps, 3), BandwidthInfo.from_dict(bandwidth.to_dict(), "bandwidth"),
                      int(wbytes), round(floor_s * 1000, 4), [r.record for r in rows], notes=notes,
                      versions=tool_versions(), loop=loop)

    # The long runs: every ORT CPU lowering (not the opt-level variants), from the prompt out to long_to.
    long_rows = [r for r in timed if r.ok and r.record.ran and r.record.name.split(" [")[0] == ORT_CPU]
    if long_rows and long_to_run:
        res.long_runs = long_runs(long_rows, ids, long_to, cfg.prompt_len, cfg.long_repeats, say, eta)
    # How cost grows: after the main rounds and the long runs, so those are timed as in a run without it
    if cfg.batches or cfg.prompts:
        scaled = scaling_rows(timed)
        if scaled:
            res.scaling = scaling_runs(scaled, cfg, c.max_positions, c.vocab_size, say)
        else:
            notes.append("how cost grows (--batches / --prompts) not timed: no ONNX Runtime row ran")
    if cfg.serving:  # continuous batching and speculative decoding against the plain loop, on the ort-cpu row
        from mhaexport.bench.serving import serving_runs

        served = next((r for r in timed if r.ok and r.record.ran and r.record.name == ORT_CPU and r.runner is not None
                       and r.record.opt_level is None), None)
        if served is not None:
            from mhaexport.runtime.tokenizer import for_folder

            res.serving = serving_runs(served, cfg, c.vocab_size, c.max_positions, say, for_folder(ef))
        else:
            notes.append("serving (--serving) not timed: the ort-cpu row did not run")
    own = res.get(ORT_CPU)
    if own is not None and own.ran and cfg.profile:
        say(f"profiling {ORT_CPU} ...")
        res.profile = profile_ort_cpu(ef, cfg, ids)
    if cfg.runtimes is None:  # the default set: say what it leaves out and how to add it
        notes.append(f"{EAGER_NOCACHE} (eager recomputing the whole sequence every step) not timed: it is slow "
                     "(O(n^2)); add it with --runtimes all, or name it in --runtimes")
    if eager is None and set(TORCH_RUNTIMES) & set(names):
        notes.append(f"eager runtimes skipped: {no_eager}")
    if EAGER_NOCACHE in names and cfg.nocache_repeats < cfg.repeats:
        notes.append(f"eager-nocache is timed {min(cfg.repeats, cfg.nocache_repeats)} time(s): recompute is O(n^2)")
    if len(timed) > 1:
        rounds = max(r.repeats for r in timed)
        per = (f"; a row over {cfg.sessions} sessions runs one session per round, in turn, so {rounds} rounds"
               if rounds > cfg.repeats else "")
        notes.append(f"timed round-robin: {cfg.repeats} round(s), one generation of every row per round{per}, after "
                     "every row was loaded and warmed up")
    notes += [f"{r.label}: {n}" for r in res.runtimes for n in r.notes]
    res.lowerings = compare_lowerings(res)
    if cfg.targets:  # the project's own speed targets: opt-in, not every user's report
        res.targets = evaluate(res, cfg.max_spread)
    return res


def quantized_rows(records: list, float_bytes: int, floor_ms: float) -> list[str]:
    """Give every row its weight bytes per token (the float model's where its export is not quantized) and its p50
    against the float floor; one note per quantized row slower than the float ORT row on the same provider."""
    notes = []
    for rb in records:
        if rb.weight_bytes_per_token is None:
            rb.weight_bytes_per_token = float_bytes
        if rb.ran and rb.token_p50_ms and floor_ms:
            rb.floor_ratio = round(rb.token_p50_ms / floor_ms, 3)
    for rb in records:
        if not (rb.ran and rb.quantization and rb.token_p50_ms):
            continue
        provider = rb.providers[:1]
        floats = [f for f in records if f.ran and f.quantization is None and f.lowering is not None
                  and f.opt_level is None and f.providers[:1] == provider and f.token_p50_ms]
        if floats:
            best = min(floats, key=lambda f: f.token_p50_ms)
            if rb.token_p50_ms > best.token_p50_ms:
                notes.append(f"{rb.label} is slower than float on this machine ({rb.token_p50_ms:.2f} ms vs "
                             f"{best.token_p50_ms:.2f} ms per token on {best.label}) although it reads "
                             f"{rb.weight_bytes_per_token / 1e6:.1f} MB of weights per token instead of "
                             f"{best.weight_bytes_per_token / 1e6:.1f} MB: its kernels cost more than the bytes save")
    return notes


def loop_comparison(records: list, cfg: BenchConfig) -> LoopComparison | None:
    """mhaexport's decode loop (the folder's ort-cpu row: the deploy runtime's Generator) against onnxruntime-genai's
    (ort-genai) on the same file, when both ran: their token p50s (with --sessions, each the median of its
    sessions' p50s) and ``ratio`` = ours / genai."""
    ours = next((r for r in records if r.name == ORT_CPU and r.ran and r.token_p50_ms), None)
    genai = next((r for r in records if r.name == ORT_GENAI and r.ran and r.token_p50_ms), None)
    if ours is None or genai is None:
        return None
    return LoopComparison(ours.name, genai.name, ours.token_p50_ms, genai.token_p50_ms,
                          round(ours.token_p50_ms / genai.token_p50_ms, 4), cfg.sessions,
                          ours.session_p50_ms or [ours.token_p50_ms], genai.session_p50_ms or [genai.token_p50_ms],
                          cfg.threads)


def setup(row: Row, prompt: np.ndarray, cfg: BenchConfig, eta: Eta | None = None) -> GenerationResult | None:
    """Load a row and run its first warm-up generation (returned; its time is the row's cost in ``eta``); a runtime
    that cannot run leaves it skipped with why (and None)."""
    row.activate()
    if not row.ok:
        if eta is not None:
            eta.drop(row.record.label)
        return None
    try:
        t0 = time.perf_counter()
        first = row.generate(prompt, cfg.new_tokens)
    except MhaExportError as e:
        row.skip(e)
        if eta is not None:
            eta.drop(row.record.label)
        return None
    if eta is not None:
        eta.ran(row.record.label, time.perf_counter() - t0)
    return first


def warm(row: Row, prompt: np.ndarray, cfg: BenchConfig, first: GenerationResult | None = None,
         eta: Eta | None = None) -> None:
    """Warm a loaded row up until steady (see :meth:`Row.warm_up`), after its ``first`` warm-up generation; a
    runtime that fails leaves it skipped with why."""
    label = row.record.label

    def before(k: int) -> None:
        if eta is not None:
            eta.tell(f"warming up {label} (warm-up {k}, at most {cfg.max_warmups}) ...")

    def after(seconds: float) -> None:
        if eta is not None:
            eta.ran(label, seconds)

    try:
        row.warm_up(prompt, cfg.new_tokens, cfg.steady_within, cfg.max_warmups, first=first, before=before,
                    after=after)
    except MhaExportError as e:
        row.skip(e)
    if eta is not None:
        if row.ok:
            eta.settled(label, row.warmups_planned(cfg.max_warmups) - row.record.warmups)
        else:
            eta.drop(label)


def run_rounds(rows: list[Row], prompt: np.ndarray, new_tokens: int, say: Progress, eta: Eta | None = None) -> None:
    """Round i runs one generation of every row that wants more than i repeats, in row order; a row that fails is
    marked skipped with the first line of why and leaves the rounds. With ``eta``, a progress line per generation."""
    rounds = max((r.repeats for r in rows), default=0)
    for i in range(rounds):
        if eta is None:
            say(Step(f"timed round {i + 1}/{rounds}: {', '.join(r.record.label for r in rows if i < r.repeats)} ...",
                     i, rounds))
        for r in rows:
            if i < r.repeats and r.ok:
                if eta is not None:
                    eta.tell(f"timed round {i + 1}/{rounds}: {r.record.label} ...")
                try:
                    t0 = time.perf_counter()
                    r.runs.append(r.generate(prompt, new_tokens))
                    if eta is not None:
                        eta.ran(r.record.label, time.perf_counter() - t0)
                except MhaExportError as e:
                    r.skip(e)
                    if eta is not None:
                        eta.drop(r.record.label)


def _long_entry(row: Row, pos: list[int], steps: list[float], prompt_len: int, repeats: int,
                batch: int = 1) -> LongRun:
    """One long run: the marks 32/128/256/512/1000 it covers, ``near`` (the prompt end) and ``far`` (1000, or the
    last full +-8 window when the run stops earlier), the run's spread and, where the row's weight bytes are known,
    ``bytes_at``: the bytes a step reads at least at each mark (weights + the cache so far, read once)."""
    ms = [round(s * 1000.0, 4) for s in steps]
    last = pos[-1]
    far = 1000 if last >= 1000 else max(last - 8, prompt_len)
    marks = sorted(({prompt_len, 128, 256, 512, 1000} & set(range(pos[0], last + 1))) | {far})
    rb = row.record
    entry = LongRun(rb.name, rb.label, pos, ms, {str(p): window_median(pos, ms, p) for p in marks}, prompt_len, far,
                    rb.lowering, repeats, token_spread(pos, [steps]))
    kv = kv_bytes_per_position(row.runner, batch)
    if kv and rb.weight_bytes_per_token:
        # the least a step at position p reads: its weights and the cache's p + 1 keys and values, once
        entry.bytes_at = {str(p): int(rb.weight_bytes_per_token + kv * (p + 1)) for p in marks}
    return entry


def kv_bytes_per_position(runner, batch: int) -> int | None:
    """Bytes of keys and values one position of the cache holds over every layer (batch rows), or None."""
    c = getattr(runner, "contract", None)
    dtype = getattr(runner, "dtype", None)
    if c is None or dtype is None:
        return None
    return 2 * c.n_layers * c.n_kv_heads * c.head_dim * batch * np.dtype(dtypes.numpy_dtype(dtype)).itemsize


def long_runs(rows: list[Row], prompt: np.ndarray, long_to: int, prompt_len: int, repeats: int,
              say: Progress, eta: Eta | None = None) -> list[LongRun]:
    """Generations from the prompt to ``long_to`` for each ORT CPU row (warm already), round-robin over the rows
    ``repeats`` times; per position, the median over the repeats."""
    runs: dict[int, list] = {i: [] for i in range(len(rows))}
    for k in range(repeats):
        for i, r in enumerate(rows):
            if not r.ok:
                continue
            message = f"long run {k + 1}/{repeats}: {r.record.label} from position {prompt_len} to {long_to} ..."
            if eta is not None:
                eta.tell(message)
            else:
                say(Step(message, k * len(rows) + i, repeats * len(rows)))
            try:
                t0 = time.perf_counter()
                runs[i].append(r.generate(prompt, long_to - prompt_len + 1))  # feeds positions up to long_to - 1
                if eta is not None:
                    eta.ran(r.record.label, time.perf_counter() - t0, eta.left.get(r.record.label, 0.0) / (repeats - k))
            except MhaExportError as e:
                r.skip(e)
    out = []
    for i, r in enumerate(rows):
        if r.ok and runs[i]:
            pos = runs[i][0].step_positions
            steps = [statistics.median(run.step_s[j] for run in runs[i]) for j in range(len(pos))]
            out.append(_long_entry(r, pos, steps, prompt_len, len(runs[i]), prompt.shape[0]))
    return out


def profile_ort_cpu(ef: ExportFolder, cfg: BenchConfig, prompt: np.ndarray) -> Profile:
    """ONNX Runtime's profile of one ORT CPU generation, summed up per op type. The trace is written to
    ``cfg.profile_dir`` (bench's output folder), never into the export folder being read: with no profile_dir, or
    one that is the export folder, it goes to a temporary folder and only the summary is kept (``file`` None)."""
    import tempfile

    keep = cfg.profile_dir is not None and Path(cfg.profile_dir).resolve() != Path(ef.path).resolve()
    with tempfile.TemporaryDirectory(prefix="mhaexport-profile-") as tmp:
        out = Path(cfg.profile_dir) if keep else Path(tmp)
        if keep:
            from mhaexport.artifact.files import refuse_link

            refuse_link(out, "bench output folder")  # the trace is never written through a link
        out.mkdir(parents=True, exist_ok=True)
        # the registry's ort-cpu in the file's own protocol (as its row runs), with ONNX Runtime's profiler on
        runner = runner_for(ef, ORT_CPU, ef.contract, protocol=DEPLOY,
                            config=ort_session("cpu", cfg, profile_prefix=str(out / "ort-profile"))).activate()
        if runner.skip_reason is not None:
            raise ProviderUnavailable(runner.skip_reason)
        try:
            DecodeLoop(runner).generate(prompt, GenerationConfig(max_new_tokens=cfg.new_tokens))
            summary = summarize_profile(runner.session.end_profiling())
        finally:
            runner.deactivate()
    if not keep:
        summary.file = None
    return summary


def summarize_profile(path: str | Path, top: int = 12) -> Profile:
    """ONNX Runtime's profile (chrome trace JSON) -> total ms per op type, largest first, and the run count."""
    from mhaexport.core.untrusted import load_json

    events = load_json(path, str(path), max_bytes=1 << 30)  # the one JSON reader (the trace names the file's ops)
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
    return Profile(str(path), runs, [OpTime(k, round(v, 3), round(v / total, 4)) for k, v in ranked])


def _cuda_device() -> str | None:
    """The CUDA device torch sees (for the eager-cuda row), or None."""
    try:
        import torch

        return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except (ImportError, RuntimeError):  # torch is only needed for the eager runtimes
        return None
