"""What `mhaexport bench` is asked to do: :class:`BenchConfig`, the runtimes it knows, and the checks a request must
pass before anything is exported or timed."""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from dataclasses import dataclass

from mhaexport.core.errors import ConfigError, RuntimeOptionError
from mhaexport.runners.names import (AOTI, BENCH, EAGER, EAGER_CUDA, EAGER_NOCACHE, ORT_BARE, ORT_CPU, ORT_CUDA,
                                     ORT_GENAI, PT2, RUNTIMES, TORCHSCRIPT, refuse_unknown)

# bench's runtimes are its entry of the one table (runners/names.py's RUNTIMES): verify's besides eager without the
# KV cache (the runners room's RecomputeRunner), ort-bare (a bare session.run loop over the folder's ONNX file: what the
# runtime's loop costs) and onnxruntime-genai's generator loop; what a run times unless told: every one but
# eager-nocache, opt-in by name
BENCH_RUNTIMES = RUNTIMES[BENCH]


# the table's entry under the names bench exported before it (mhaexport.bench's callers): aliases, not lists
ALL_RUNTIMES, DEFAULT_RUNTIMES = BENCH_RUNTIMES.accepts, BENCH_RUNTIMES.default


TORCH_RUNTIMES = (EAGER, EAGER_NOCACHE, EAGER_CUDA, TORCHSCRIPT)
ORT_RUNTIMES = (ORT_CPU, ORT_CUDA)
_EXAMPLE = {"batches": "1,4,16", "prompts": "32,512,2048", "serving": "1,4,8"}  # the errors' examples


@dataclass(frozen=True)
class BenchConfig:
    """One bench run. Recorded whole in bench.json (``config``)."""

    prompt_len: int = 32
    new_tokens: int = 128
    batch: int = 1
    threads: int = 2  # torch's intra-op threads, ONNX Runtime's intra-op threads and the bandwidth probes'
    runtimes: tuple[str, ...] | None = None  # None: BENCH_RUNTIMES.default (absent ones are reported skipped)
    repeats: int = 3  # timed generations per row, round-robin over the rows
    nocache_repeats: int = 1  # recompute is slow (O(n^2)); it is timed this many times
    # ORT CPU runs (each lowering) out to this position; 0: off (the default: a long run is opt-in); None:
    # max_positions if <= 1024
    long_to: int | None = 0
    opt_levels: tuple[str, ...] = ()  # extra ORT CPU runs at these graph optimization levels ("ort-cpu@basic")
    profile: bool = False  # write ONNX Runtime's profile of one ORT CPU generation and summarize it
    profile_dir: str | None = None  # where the profile goes (never the export folder; None: summed up, not kept)
    seed: int = 0  # the prompt's token ids
    compare: tuple[str, ...] = ()  # more export folders of the same model: ORT rows labelled by their lowering
    long_repeats: int = 1  # long runs per ORT CPU row, round-robin over the rows; per position, the median
    # Warm-up: untimed generations of new_tokens tokens until two in a row agree on the per-token median within
    # steady_within (0.10 = 10 %), at most max_warmups; a row that never agrees is timed anyway, with a note.
    steady_within: float = 0.10
    max_warmups: int = 5
    # Verdicts: a target says yes/no only when every row it reads has a spread (max(p90 / p50, p50 / p10) of
    # per-token latency, the steady growth with position taken out) of at most max_spread; else "no verdict".
    max_spread: float = 1.5
    # How cost grows (bench.scaling), after the main rounds and the long runs, on the ONNX Runtime rows: per-token
    # latency and tokens/s at each of these batch sizes (prompt_len-token prompts, new_tokens new tokens), and the
    # time to first token at batch 1 for each of these prompt lengths. Empty: no scaling phase (the default).
    batches: tuple[int, ...] = ()
    prompts: tuple[int, ...] = ()
    # Serving (bench.serving), after the main rounds on the ort-cpu row: continuous batching's tokens/s at each of
    # these numbers of rows against the plain loop, and speculative decoding (prompt lookup) against plain greedy on a
    # repetitive and a non-repetitive prompt. Empty: off (the default).
    serving: tuple[int, ...] = ()
    # the folder's code runs only when the user says so (--trust-code; docs/DESIGN.md, "Folders from elsewhere"):
    # the eager rows' model rebuilt from a manifest source that is code (a factory file or module), and the folder's
    # pt2 program / AOTInductor package (artifact/trust.py)
    trust_code: bool = False
    # the project's own speed targets (bench.targets) judged and shown: a project benchmark, off in a user's report
    targets: bool = False
    # sessions per loop row (the ORT CPU rows and ort-genai): identical sessions of one file can decode at different
    # speeds on a shared machine (~1.2 x apart measured here), so a row opens this many, warms each up and times each
    # in turn, ``repeats`` generations apiece; its token p50 is the median of its sessions' p50s (each in
    # RuntimeBench.session_p50_ms). 1: one session per row
    sessions: int = 1

    def __post_init__(self) -> None:
        """A BenchConfig is checked when it is made (:func:`check_config`: ConfigError in one line naming what is
        valid), so a request is checked once, before anything is exported or timed, and the functions that take one
        trust it; the scaling points are kept as bench.json records them (ascending, each once)."""
        for name in ("runtimes", "opt_levels", "compare"):  # lists given: tuples, as recorded
            value = getattr(self, name)
            if isinstance(value, list):
                object.__setattr__(self, name, tuple(value))
        for name in ("batches", "prompts", "serving"):  # the command line's "1,4,16" (None: off)
            value = getattr(self, name)
            if value is None or isinstance(value, str):
                object.__setattr__(self, name, parse_points(value, name))
        check_config(self)
        object.__setattr__(self, "batches", parse_points(self.batches, "batches"))
        object.__setattr__(self, "prompts", parse_points(self.prompts, "prompts"))
        object.__setattr__(self, "serving", parse_points(self.serving, "serving"))


def check_config(cfg: BenchConfig) -> tuple[str, ...]:
    """The runtimes ``cfg`` asks for; RuntimeOptionError (a ConfigError) for an unknown runtime, ConfigError for an
    unknown --opt-levels level, a count or length out of range, or a warm-up / spread setting out of range (one line
    naming what is valid). Every BenchConfig is checked so when it is made."""
    from mhaexport.runtime.session import OPT_LEVELS

    names = cfg.runtimes or BENCH_RUNTIMES.default
    refuse_unknown(names, BENCH)
    bad_levels = [x for x in cfg.opt_levels if x not in OPT_LEVELS]
    if bad_levels:
        raise ConfigError(f"--opt-levels: unknown graph optimization level(s) {', '.join(bad_levels)}; "
                          f"valid: {', '.join(OPT_LEVELS)}")
    if cfg.max_warmups < 2:
        raise ConfigError(f"max_warmups={cfg.max_warmups}: steadiness compares two warm-ups, so at least 2")
    if not 0 < cfg.steady_within < 1:
        raise ConfigError(f"steady_within={cfg.steady_within}: a fraction in (0, 1), e.g. 0.10 for 10 %")
    if cfg.max_spread < 1:
        raise ConfigError(f"max_spread={cfg.max_spread}: a spread is never below 1")
    for option, values, unit in (("batches", cfg.batches, "prompt"), ("prompts", cfg.prompts, "token"),
                                 ("serving", cfg.serving, "row")):
        bad = _not_positive(values)
        if bad:
            raise ConfigError(f"{option}={tuple(values)}: {bad[0]!r} is not a positive integer (each point holds at "
                              f"least 1 {unit}; e.g. --{option} {_EXAMPLE[option]})")
    if cfg.new_tokens < 2:
        raise RuntimeOptionError(f"new_tokens={cfg.new_tokens}: at least 2 (one prefill token and one decode step)")
    # the command line's ranges (click.IntRange), for the API's callers too
    for field, value, least in (("prompt_len", cfg.prompt_len, 1), ("batch", cfg.batch, 1),
                                ("threads", cfg.threads, 1), ("repeats", cfg.repeats, 1),
                                ("nocache_repeats", cfg.nocache_repeats, 1), ("long_repeats", cfg.long_repeats, 1),
                                ("sessions", cfg.sessions, 1),
                                ("long_to", 0 if cfg.long_to is None else cfg.long_to, 0)):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < least:
            raise ConfigError(f"{field}={value!r}: expected an integer >= {least}")
    return tuple(names)


def _not_positive(values) -> list:
    """The values that are not positive integers (a bool is not one; numpy's integers are)."""
    return [v for v in values if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 1]


def parse_points(value: str | Sequence[int] | None, option: str) -> tuple[int, ...]:
    """``--batches 1,4,16`` / ``--prompts 32,512,2048`` (or a sequence of ints, the API's form) -> the points,
    ascending, each once; None or "" -> () (off). ConfigError in one line for anything but positive integers."""
    if value is None:
        return ()
    if isinstance(value, str):
        parts = [x.strip() for x in value.split(",") if x.strip()]
        try:
            points = [int(x) for x in parts]
        except ValueError:
            raise ConfigError(f"--{option} {value!r}: expected comma-separated positive integers, e.g. "
                              f"--{option} {_EXAMPLE[option]}") from None
    else:
        points = list(value)
    bad = _not_positive(points)
    if bad:
        raise ConfigError(f"--{option} {value if isinstance(value, str) else ','.join(map(str, points))}: {bad[0]!r} "
                          f"is not a positive integer; e.g. --{option} {_EXAMPLE[option]}")
    return tuple(sorted({int(v) for v in points}))
