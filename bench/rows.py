"""Bench's rows: one timed row per runtime, each a :class:`~mhaexport.runtime.runner.Runner` driven by the one
decode loop, :class:`~mhaexport.runtime.decode.DecodeLoop` — the loop verify's generation and kv-consistency checks
drive, so what bench times is what verify proved. Every figure comes from :class:`GenerationResult`'s timings.

The rows: ``eager`` (verify's EagerRunner, the KV cache kept as torch tensors), ``eager-nocache`` (RecomputeRunner
around it: the whole sequence every step), ``eager-cuda``, ``torchscript``, ``ort-cpu`` / ``ort-cuda`` (the
registry's runner in the file's own protocol, as the deploy runtime's Generator drives it: hash-checked session, IO
binding), the ORT rows of each
``--compare`` folder labelled by lowering, and the ``--opt-levels`` variants of ORT CPU.

A row is planned (:func:`plan_rows`), then loaded (:meth:`Row.activate`), warmed up until steady
(:meth:`Row.warm_up`), timed (:meth:`Row.generate`, called round-robin by :mod:`mhaexport.bench.run`) and summed
up (:meth:`Row.finish`). A runtime that cannot run is skipped with the first line of why; only our own errors
(:class:`~mhaexport.core.errors.MhaExportError`: the runner protocol turns a runtime's exceptions into RuntimeFailure)
are caught — anything else is a bug and propagates.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mhaexport.core import dtypes
from mhaexport.artifact import ExportFolder, lowering_of
from mhaexport.bench.config import EAGER_NOCACHE, ORT_BARE, ORT_GENAI, ORT_RUNTIMES, BenchConfig
from mhaexport.bench.result import RuntimeBench
from mhaexport.bench.stats import agree, percentile, repeat_spread, token_spread
from mhaexport.core.errors import MhaExportError, RuntimeInputError
from mhaexport.runners.names import EAGER, EAGER_CUDA, ORT_CPU, ORT_CUDA, TORCHSCRIPT
from mhaexport.runners.pt2 import CODE_RUNTIMES
from mhaexport.runners.registry import DEPLOY, runner_for
from mhaexport.runtime.decode import DecodeLoop, GenerationConfig, GenerationResult
from mhaexport.runtime.runner import Runner
from mhaexport.runtime.session import SessionConfig


def code_record(ef: ExportFolder, name: str) -> RuntimeBench:
    """A pt2 / aoti row's record: the AOTInductor compile time (from the manifest) as a note, apart from load."""
    rb = RuntimeBench(name)
    seconds = getattr(ef.entry(name).details, "compile_seconds", None)
    if seconds is not None:
        rb.notes.append(f"compiled once at export in {seconds:.1f} s (AOTInductor, CPU), not in its load time")
    return rb


def why(e: BaseException | str) -> str:
    """The first line of a reason or an error's message (its type's name when it has none): a row's or a point's
    skip reason."""
    text = e if isinstance(e, str) else str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _ms(x: float) -> float:
    return round(x * 1000.0, 4)


def step_median_s(r: GenerationResult) -> float:
    """A generation's per-token figure: the median decode step (the first token's time when there is none)."""
    return statistics.median(r.step_s) if r.step_s else r.first_token_s


@dataclass
class Row:
    """One row: its record (what bench.json shows), how to load its runner, and the timed generations so far.

    ``load`` returns the active runner (or one whose ``skip_reason`` says why it cannot run here), e.g. a runner's
    own ``activate``; None when the row was skipped at planning. ``shared_load_s``: time spent loading what the
    runner shares with other rows (the eager module), added to its load time. ``clock``: the decode loop's timer
    (tests pass a fake one).
    """

    record: RuntimeBench
    load: Callable[[], Runner] | None
    repeats: int
    shared_load_s: float = 0.0
    clock: Callable[[], float] = time.perf_counter
    runner: Runner | None = None
    runs: list[GenerationResult] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Not skipped (so far)."""
        return self.record.reason is None

    def skip(self, e: BaseException | str) -> None:
        """Mark the row skipped with the first line of why; it leaves the timed rounds."""
        self.record.ran = None
        self.record.reason = why(e)

    def activate(self) -> None:
        """Load the runner (timed: ``load_ms``); a runtime that cannot run or load leaves the row skipped."""
        if not self.ok or self.load is None:
            return
        t0 = time.perf_counter()
        try:
            runner = self.load()
        except MhaExportError as e:
            self.skip(e)
            return
        if runner.skip_reason is not None:
            self.skip(runner.skip_reason)
            return
        self.runner = runner
        self.record.load_ms = _ms(time.perf_counter() - t0 + self.shared_load_s)
        self.record.providers = list(runner.providers)

    def generate(self, prompt: np.ndarray, n: int) -> GenerationResult:
        """One greedy generation of ``n`` tokens after ``prompt`` (B, T) through the decode loop, timed by it."""
        r = DecodeLoop(self.runner, clock=self.clock).generate(prompt, GenerationConfig(max_new_tokens=n))
        if len(r.tokens[0]) != n:
            raise RuntimeInputError(f"{self.record.label}: generation stopped after {len(r.tokens[0])} of {n} "
                                    f"tokens: {r.message}")
        return r

    def too_long(self, prompt_len: int, n: int) -> str | None:
        """Why this row cannot generate ``n`` tokens after a ``prompt_len``-token prompt, or None when it can: the
        decode loop feeds prompt_len + n - 1 positions, at most its runner's ``max_length`` (the model's
        max_positions, or a shared cache's slots)."""
        need = prompt_len + n - 1
        if self.runner is not None and need > self.runner.max_length:
            return f"{need} positions pass {self.runner.limit_text()}"
        return None

    def warmups_planned(self, most: int) -> int:
        """The most warm-up generations this row runs (bench's time-left estimate): ``most``, once per session."""
        return most

    def warm_up(self, prompt: np.ndarray, n: int, within: float, most: int, first: GenerationResult | None = None,
                before: Callable[[int], None] | None = None, after: Callable[[float], None] | None = None) -> bool:
        """Untimed generations of ``n`` tokens until two in a row agree on the median step latency within
        ``within`` (0.10 = 10 % of the smaller), at most ``most``; records how many ran, each one's median and
        whether they agreed. Returns whether the row became steady. ``first``: a warm-up generation already run
        (bench runs one of every row first, to know each row's cost); ``before(k)`` before the k-th warm-up (from
        1) and ``after(seconds)`` after it: bench's progress."""
        medians: list[float] = [step_median_s(first)] if first is not None else []
        steady = False
        while len(medians) < most and not steady:
            if before is not None:
                before(len(medians) + 1)
            t0 = time.perf_counter()
            medians.append(step_median_s(self.generate(prompt, n)))
            if after is not None:
                after(time.perf_counter() - t0)
            steady = len(medians) >= 2 and agree(medians[-2], medians[-1], within)
        self.record.warmups, self.record.steady = len(medians), steady
        self.record.warmup_token_ms = [_ms(m) for m in medians]
        return steady

    def finish(self, batch: int, new_tokens: int) -> None:
        """Sum up the timed generations into the record (medians over repeats; token percentiles over every
        decode step of every repeat; the spreads of bench.stats)."""
        rb, runs = self.record, self.runs
        if not self.ok or not runs:
            return
        rb.ran, rb.repeats = True, len(runs)
        rb.prefill_ms = _ms(statistics.median(r.prefill_s for r in runs))
        rb.ttft_ms = _ms(statistics.median(r.first_token_s for r in runs))
        steps = [s for r in runs for s in r.step_s]
        n = min(len(r.step_s) for r in runs)
        rb.positions = list(runs[0].step_positions[:n])
        if steps:
            rb.token_p50_ms = _ms(percentile(steps, 50))
            rb.token_p90_ms = _ms(percentile(steps, 90))
            rb.token_p10_ms = _ms(percentile(steps, 10))
            rb.token_min_ms = _ms(min(steps))
            rb.token_spread = token_spread(rb.positions, [r.step_s[:n] for r in runs])
            rb.repeat_spread = repeat_spread([r.step_s for r in runs])
        rb.decode_total_ms = _ms(statistics.median(sum(r.step_s) for r in runs))
        rb.tokens_per_s = round(statistics.median(batch * new_tokens / (r.first_token_s + sum(r.step_s))
                                                  for r in runs), 2)
        rb.per_position_ms = [_ms(statistics.median(r.step_s[i] for r in runs)) for i in range(n)]


class BareRow(Row):
    """A bare loop over the folder's ONNX file, to see what mhaexport's decode loop costs: ``session.run`` with numpy
    in and out (a shared cache: the buffers bound once and reused, the least IO binding can do), argmax on the last
    logits — no checks, no sampling, nothing else. Its timings are taken the way the decode loop takes them (a step
    = run + choosing the token). It feeds the file as every runner does (the folder's
    :class:`~mhaexport.runtime.feed.Feed`: an adopted file's names and position_ids, the cache and its slots, its
    dtype), so it differs from the ORT rows by the loop alone, not by another feeding.

    ``share``: returns the ORT CPU row of the same folder (or None); when that row is loaded first (the table order),
    the bare loop runs on *its* InferenceSession, so the two rows differ by the loop alone. Measured on this
    project's 2-core VM, identical sessions of one file created one after another in a process decode at different
    speeds (the first ~1.2 x slower than the third, on 1 thread as on 2), which a separate session would have
    counted as the loop's cost. Without a loaded ORT CPU row it builds its own session (the one session builder,
    CPU, ``--threads``) and its notes say so."""

    def __init__(self, record: RuntimeBench, ef: ExportFolder, cfg: BenchConfig,
                 share: Callable[[], Row | None] = lambda: None) -> None:
        super().__init__(record, self._load, cfg.repeats)
        self.ef, self.cfg, self.share = ef, cfg, share

    def _load(self) -> Runner:
        from mhaexport.runtime.session import SessionConfig

        ef = self.ef
        own = self.share()
        ours = own.runner if own is not None and own.ok else None
        # the registry's ort-bare runner: the file in its own protocol, on the ort-cpu row's session when loaded
        runner = runner_for(ef, ORT_BARE, ef.contract, ours=ours,
                            config=SessionConfig(providers=("cpu",), threads=self.cfg.threads)).activate()
        if runner.skip_reason is not None:
            return runner
        if runner.session_of is not None:
            self.record.notes.append("runs on the ort-cpu row's InferenceSession")
        else:
            self.record.notes.append("runs on a session of its own (no ort-cpu row loaded before it): its ratio to "
                                     "ort-cpu also holds the difference between two sessions")
        self.session, self.feed, self.protocol = runner.session, runner.feed, runner.protocol
        self.contract = ef.contract
        self.kv_dtype = dtypes.numpy_dtype(self.feed.cache_dtype)  # the cache's dtype as the runtime reads it
        self.out_names = [self.feed.logits, *self.feed.present]
        return runner

    def generate(self, prompt: np.ndarray, n: int) -> GenerationResult:

        c, clock, feed = self.contract, self.clock, self.feed
        B, P = prompt.shape
        res = GenerationResult([[] for _ in range(B)], "max_new_tokens", "", [P] * B)
        if feed.shared:
            import onnxruntime as ort

            protocol = self.protocol  # the runner's (the shared buffer's): its sizing and binding
            # sized to the generation, as the decode loop and onnxruntime-genai size theirs
            per_layer = protocol.layer_slots(protocol.slots(P + n))  # a window cache's windowed layers: W + slack
            bufs = [ort.OrtValue.ortvalue_from_numpy(np.zeros((B, c.n_kv_heads, per_layer[i // 2], c.head_dim),
                                                              self.kv_dtype)) for i in range(len(feed.past))]
            io = self.session.io_binding()
            io.bind_output(feed.logits, "cpu")  # bound first: get_outputs()[0]
            protocol.bind(io, bufs)

            def run(ids: np.ndarray, mask: np.ndarray, past):
                for name, value in feed.token_inputs(ids, mask).items():
                    io.bind_cpu_input(name, value)
                io.bind_output(feed.logits, "cpu")  # unallocated again (same slot): a prompt's are (B, P, V)
                self.session.run_with_iobinding(io)
                return io.get_outputs()[0].numpy(), past
        else:
            def run(ids: np.ndarray, mask: np.ndarray, past):
                outs = self.session.run(self.out_names, {**feed.token_inputs(ids, mask), **past})
                return outs[0], dict(zip(feed.past, outs[1:]))

        empty = np.zeros((B, c.n_kv_heads, 0, c.head_dim), self.kv_dtype)
        past = {name: empty for name in feed.past}
        t0 = clock()
        logits, past = run(prompt, np.ones((B, P), np.int64), past)
        res.prefill_s = clock() - t0
        tok = logits[:, -1].argmax(-1)  # (B,)
        res.first_token_s = clock() - t0
        for b in range(B):
            res.tokens[b].append(int(tok[b]))
        for i in range(1, n):
            t = clock()
            logits, past = run(tok.reshape(B, 1).astype(np.int64), np.ones((B, P + i), np.int64), past)
            tok = logits[:, -1].argmax(-1)
            res.step_s.append(clock() - t)
            res.step_positions.append(P + i - 1)
            for b in range(B):
                res.tokens[b].append(int(tok[b]))
        return res


class GenAIRow(Row):
    """onnxruntime-genai's own generator loop over the folder (its genai_config.json): append_tokens is the prefill,
    each generate_next_token a decode step, timed the same way — the comparison the issue asked to keep in every
    bench table."""

    def __init__(self, record: RuntimeBench, ef: ExportFolder, cfg: BenchConfig) -> None:
        super().__init__(record, self._load, cfg.repeats)
        self.ef, self.threads, self.trust_code = ef, cfg.threads, cfg.trust_code

    def _load(self) -> Runner:
        ef = self.ef
        # the registry's ort-genai runner (the one og.Model builder, its options checked), --threads as every row
        runner = runner_for(ef, ORT_GENAI, ef.contract, threads=self.threads, trust_code=self.trust_code).activate()
        if runner.skip_reason is not None:
            return runner
        self.model = runner.model
        length = runner.model_section.context_length
        self.context_length = int(length) if isinstance(length, int) and length > 0 else ef.contract.max_positions
        return runner

    def too_long(self, prompt_len: int, n: int) -> str | None:
        """onnxruntime-genai refuses a max_length (prompt + new tokens, the last one never fed) past the config's
        context_length, one position short of what the decode loop feeds."""
        if prompt_len + n > self.context_length:
            return (f"onnxruntime-genai's max_length {prompt_len + n} (prompt + new tokens) passes its "
                    f"context_length={self.context_length}")
        return None

    def generate(self, prompt: np.ndarray, n: int) -> GenerationResult:
        from mhaexport.runtime.genai import genai_generate

        return genai_generate(self.model, prompt, prompt.shape[1] + n, clock=self.clock)


class SessionsRow(Row):
    """One row timed over several sessions of its file (``--sessions N``): ``parts``, N rows of the same loop each
    loading its own session (an ORT CPU row's Generator, onnxruntime-genai's Model). Identical sessions of one file
    can decode at different speeds on a shared machine (BareRow's note), so one session per loop would count that
    difference as the loop's. Each part is loaded and warmed up on its own; :meth:`generate` runs the next part in
    turn (``repeats`` = N x the run's, so each session gets the run's repeats); :meth:`finish` gives the row the
    figures over every step of every session, except ``token_p50_ms``: the median of the sessions' p50s (each part's
    over its own steps, listed in ``session_p50_ms``). ``runner`` is the first session's (BareRow runs on it)."""

    def __init__(self, record: RuntimeBench, parts: list[Row]) -> None:
        super().__init__(record, self._load, parts[0].repeats * len(parts))
        self.parts = parts
        self._turn = 0
        self._last: Row | None = None

    @property
    def sessions(self) -> int:
        return len(self.parts)

    def _load(self) -> Runner:
        loads = []
        for part in self.parts:
            part.activate()
            if not part.ok:  # one session that cannot load: the row says why
                return _skip_runner(self.record.name, part.record.reason)
            loads.append(part.record.load_ms)
        self._load_ms = statistics.median(loads)
        self.record.notes += [n for n in self.parts[0].record.notes if n not in self.record.notes]
        return self.parts[0].runner

    def activate(self) -> None:
        super().activate()
        if self.ok and self.runner is not None:
            self.record.load_ms = round(self._load_ms, 4)  # a session's load (the median), not the N together

    def too_long(self, prompt_len: int, n: int) -> str | None:
        return self.parts[0].too_long(prompt_len, n)

    def generate(self, prompt: np.ndarray, n: int) -> GenerationResult:
        part = self.parts[self._turn]
        self._turn = (self._turn + 1) % len(self.parts)
        self._last = part
        r = part.generate(prompt, n)
        part.runs.append(r)
        return r

    def warmups_planned(self, most: int) -> int:
        return most * len(self.parts)

    def warm_up(self, prompt: np.ndarray, n: int, within: float, most: int, first: GenerationResult | None = None,
                before: Callable[[int], None] | None = None, after: Callable[[float], None] | None = None) -> bool:
        """Each session warmed up on its own until steady (``first``: the first session's first generation, run by
        :meth:`generate`); the row is steady when every session is."""
        for part in self.parts:
            part.runs.clear()  # warm-ups are not timed runs
        steady = [part.warm_up(prompt, n, within, most, first=first if part is self._last else None, before=before,
                               after=after) for part in self.parts]
        self._turn = 0
        self.record.warmups = sum(p.record.warmups for p in self.parts)
        self.record.steady = all(steady)
        self.record.warmup_token_ms = [m for p in self.parts for m in p.record.warmup_token_ms]
        return self.record.steady

    def finish(self, batch: int, new_tokens: int) -> None:
        if not self.ok:
            return
        for part in self.parts:
            part.finish(batch, new_tokens)
        self.runs = [r for part in self.parts for r in part.runs]
        super().finish(batch, new_tokens)
        p50s = [p.record.token_p50_ms for p in self.parts if p.record.token_p50_ms is not None]
        if p50s:
            self.record.session_p50_ms = p50s
            self.record.token_p50_ms = round(statistics.median(p50s), 4)
            self.record.notes.append(
                f"timed over {len(self.parts)} sessions of its file, each warmed up on its own and timed "
                f"{self.parts[0].repeats} time(s) in turn: token p50 {self.record.token_p50_ms:.2f} ms is the median "
                f"of the sessions' p50s ({', '.join(f'{m:.2f}' for m in p50s)} ms; "
                f"{self.record.sessions_apart * 100:.0f} % apart)")


def _skip_runner(name: str, reason: str | None) -> Runner:
    from mhaexport.runtime.runner import skipped

    return skipped(name, None, reason or "a session could not be loaded")


def with_sessions(row: Row, make: Callable[[], Row], sessions: int) -> Row:
    """``row`` timed over ``sessions`` sessions (:class:`SessionsRow`; ``make()`` builds another part like it), or
    ``row`` itself for one session or a row skipped at planning."""
    if sessions <= 1 or row.load is None or not row.ok:
        return row
    record = row.record  # the row's record is the SessionsRow's; each part gets one of its own
    parts = [row] + [make() for _ in range(sessions - 1)]
    for i, part in enumerate(parts):
        part.record = RuntimeBench(f"{record.name} #{i + 1}", label=f"{record.label} (session {i + 1}/{sessions})")
    return SessionsRow(record, parts)


# ---- planning the rows -----------------------------------------------------------------------------------------

def skipped_row(name: str, reason: str, **kw: Any) -> Row:
    """A row that cannot run here, listed with why."""
    return Row(RuntimeBench(name, reason=reason, **kw), None, 0)


def ort_session(provider: str, cfg: BenchConfig, opt_level: str | None = None,
                profile_prefix: str | None = None) -> SessionConfig:
    """An ORT row's session (and the profile's): one provider, strict, ``--threads``, the optimization level."""
    from mhaexport.runtime.session import DEFAULT_OPT_LEVEL

    return SessionConfig(providers=(provider,), threads=cfg.threads, opt_level=opt_level or DEFAULT_OPT_LEVEL,
                         strict_providers=True, profile_prefix=profile_prefix)


def _ort_loader(ef: ExportFolder, provider: str, cfg: BenchConfig, opt_level: str | None = None
                ) -> Callable[[], Runner]:
    def load() -> Runner:
        # the registry's runner in the file's own protocol (as generate drives it), on the folder opened (and its
        # snapshot hash-checked) once by the run: the rows run those bytes
        name = ORT_CPU if provider == "cpu" else ORT_CUDA
        return runner_for(ef, name, ef.contract, protocol=DEPLOY, config=ort_session(provider, cfg, opt_level)
                          ).activate()

    return load


def with_quantization(rb: RuntimeBench, ef: ExportFolder, batch: int) -> RuntimeBench:
    """``rb`` with the scheme and weight bytes per token of ``ef``'s ONNX export when it is quantized (counted from
    its graph at quantize time, or at adoption for a file another tool quantized, e.g. onnxruntime-genai's builder's
    int4 with MatMulNBits and GatherBlockQuantized: packed weights, scales, zero points, gathered rows). A folder
    adopted before mhaexport recorded them has none: the row says so and counts the float model's bytes."""
    quant = ef.artifacts["onnx"].details.quantization if ef.has("onnx") else None
    if quant:
        read = quant.weights_read
        rb.quantization, rb.quant_label = quant.weights, quant.label
        if read:
            rb.weight_bytes_per_token = int(read.fixed_bytes + batch * read.per_row_bytes)
        else:
            rb.notes.append("weight bytes per token not recorded (adopted before mhaexport counted them: adopt the "
                            "file again); the float model's bytes are shown")
    return rb


@dataclass
class EagerModel:
    """The eager module rebuilt from the manifest, and how long that took (eager rows count it as load time)."""

    module: Any
    load_s: float


def plan_rows(folder: Path, ef: ExportFolder, cfg: BenchConfig, names: tuple[str, ...],
              others: list[tuple[Path, ExportFolder]], eager: EagerModel | None, no_eager_reason: str | None
              ) -> list[Row]:
    """The rows of a run, in table order, not loaded yet: each runtime of ``names``; after each ORT runtime the
    same runtime on every ``--compare`` folder (``others``); then ORT CPU at each ``cfg.opt_levels`` level.
    Runtimes that cannot run are rows skipped with why: no eager model (``no_eager_reason``), no artifact,
    CUDA not running here (ort-cuda's compare rows are then left out)."""
    from mhaexport.runtime.session import provider_unavailable

    c = ef.contract
    arts = ef.artifacts
    own_lowering = lowering_of(ef)
    rows: list[Row] = []
    taken: set[str] = set()

    def add(row: Row) -> None:
        rows.append(row)
        taken.update((row.record.name, row.record.label))

    def sessions(row: Row) -> Row:
        """A loop row (ORT CPU, onnxruntime-genai) over ``cfg.sessions`` sessions of its file (:class:`SessionsRow`)."""
        if cfg.sessions <= 1 or (row.record.name.split(" [")[0] == ORT_CUDA):
            return row
        if isinstance(row, GenAIRow):
            return with_sessions(row, lambda: GenAIRow(RuntimeBench(row.record.name), row.ef, cfg), cfg.sessions)
        return with_sessions(row, lambda: Row(RuntimeBench(row.record.name), row.load, row.repeats), cfg.sessions)

    def ort_record(name: str, row_folder: Path, lowering: str | None, row_ef: ExportFolder = ef) -> RuntimeBench:
        label = name if lowering is None else f"{name} [{lowering}]"
        row_name = name if row_folder == folder else label
        if row_name in taken or (row_folder != folder and label in taken):
            # two folders with one lowering (e.g. two int4 schemes): tell them apart by folder
            row_name = label = f"{name} [{lowering}, {row_folder}]"
        return with_quantization(RuntimeBench(row_name, label=label, lowering=lowering, folder=str(row_folder)),
                                 row_ef, cfg.batch)

    for name in names:
        if name in (EAGER, EAGER_NOCACHE, EAGER_CUDA, TORCHSCRIPT) and eager is None:
            add(skipped_row(name, no_eager_reason or "no eager model"))
        elif name == EAGER_NOCACHE:
            add(Row(RuntimeBench(name), runner_for(ef, EAGER_NOCACHE, c, eager=eager.module).activate,
                    min(cfg.repeats, cfg.nocache_repeats), eager.load_s))
        elif name in (EAGER, EAGER_CUDA, TORCHSCRIPT) or name in CODE_RUNTIMES:
            # the registry's runner (runners/registry.py): the same artifact, the same skip reasons as verify's
            runner = runner_for(ef, name, c, eager=eager.module if eager else None, trust_code=cfg.trust_code)
            if name in CODE_RUNTIMES and not (ef.has(name) or cfg.runtimes is not None):
                continue  # a code runtime of the defaults whose artifact this folder does not hold
            if not runner.available:
                add(skipped_row(name, runner.skip_reason))
            elif name in CODE_RUNTIMES:  # torch.export / AOTInductor: load time is the row's; compile time apart
                add(Row(code_record(ef, name), runner.activate, cfg.repeats))
            else:
                add(Row(RuntimeBench(name), runner.activate, cfg.repeats, eager.load_s if name == EAGER else 0.0))
        elif name in ORT_RUNTIMES:
            provider = "cpu" if name == ORT_CPU else "cuda"
            why = provider_unavailable(provider) if name == ORT_CUDA else None
            if "onnx" not in arts:
                add(skipped_row(name, f"no ONNX export in {folder}"))
            elif why is not None:
                add(Row(ort_record(name, folder, own_lowering), None, 0))
                rows[-1].skip(why)
            else:
                add(sessions(Row(ort_record(name, folder, own_lowering), _ort_loader(ef, provider, cfg), cfg.repeats)))
            if name == ORT_CUDA and ("onnx" not in arts or why is not None):
                continue  # CUDA is not really present (or nothing to compare with): the folder's own row says why
            for other, m in others:
                add(sessions(Row(ort_record(name, other, lowering_of(m), m), _ort_loader(m, provider, cfg),
                                 cfg.repeats)))
        elif name in (ORT_BARE, ORT_GENAI):
            if "onnx" not in arts:
                add(skipped_row(name, f"no ONNX export in {folder}"))
            else:
                if name == ORT_BARE:
                    def own(rows: list[Row] = rows) -> Row | None:  # the folder's ort-cpu row, when it is loaded
                        return next((r for r in rows if r.record.name == ORT_CPU and r.runner is not None), None)

                    add(BareRow(ort_record(name, folder, own_lowering), ef, cfg, share=own))
                else:
                    add(sessions(GenAIRow(ort_record(name, folder, own_lowering), ef, cfg)))
    if ORT_CPU in names and "onnx" in arts:
        for level in cfg.opt_levels:
            rb = with_quantization(RuntimeBench(f"{ORT_CPU}@{level}", lowering=own_lowering, opt_level=level,
                                                folder=str(folder)), ef, cfg.batch)
            add(Row(rb, _ort_loader(ef, "cpu", cfg, level), cfg.repeats))
    return rows
