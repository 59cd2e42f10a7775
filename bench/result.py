"""What a bench run found, as typed records (:mod:`mhaexport.artifact.record`'s machinery, as the manifest and the
verify report): one :class:`RuntimeBench` per row and the :class:`BenchResult` (bench.json, read back by
:func:`load_bench` into the same types). Rendering it is :mod:`mhaexport.bench.render`'s job."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mhaexport.artifact.manifest import contract_dict
from mhaexport.artifact.record import Environment, Record
from mhaexport.artifact.schema import tag, version_of
from mhaexport.bench.config import BenchConfig
from mhaexport.core.errors import ArtifactError

KIND, VERSION = "bench", 1
SCHEMA = tag(KIND, VERSION)


@dataclass
class RuntimeBench(Record):
    """One row's figures (milliseconds); ``ran`` is None when skipped (``reason`` says why)."""

    name: str  # unique row id: "ort-cpu" for the folder's own export, "ort-cpu [attention=ort float16]" for --compare
    ran: bool | None = None
    reason: str | None = None
    label: str = ""  # the row in tables: the name and, for ONNX Runtime rows, the lowering
    lowering: str | None = None  # "attention=ort float32": ONNX Runtime rows only
    opt_level: str | None = None  # "basic": the --opt-levels variants of ORT CPU ("ort-cpu@basic") only
    folder: str | None = None  # the export folder an ONNX Runtime row ran
    providers: list[str] = field(default_factory=list)
    load_ms: float | None = None  # creating the session / loading the module
    warmups: int = 0  # untimed warm-up generations run before the timed ones
    steady: bool | None = None  # whether the last two warm-ups agreed (None: not warmed up)
    warmup_token_ms: list[float] = field(default_factory=list)  # each warm-up's median step latency
    repeats: int = 0
    prefill_ms: float | None = None  # medians over repeats
    ttft_ms: float | None = None
    token_p50_ms: float | None = None  # over every decode step of every repeat
    token_p90_ms: float | None = None
    token_p10_ms: float | None = None  # with p90: the spread bench.png draws around the p50
    token_min_ms: float | None = None
    token_spread: float | None = None  # max(p90 / p50, p50 / p10), growth with position taken out (bench.stats)
    repeat_spread: float | None = None  # (max - min) / median of the repeats' median step latency
    decode_total_ms: float | None = None  # median over repeats of the summed decode steps
    tokens_per_s: float | None = None  # batch * new_tokens / (prefill + decode), median over repeats
    positions: list[int] = field(default_factory=list)  # position of the token fed at each decode step
    per_position_ms: list[float] = field(default_factory=list)  # median over repeats, per decode step
    quantization: str | None = None  # the weights' scheme of a quantized ONNX export ("int4"); None: float
    quant_label: str | None = None  # its full label ("int4 b32 sym acc4 (block 0 int8; float: embeddings)")
    weight_bytes_per_token: int | None = None  # bytes of weights one decode step of this row reads
    floor_ratio: float | None = None  # token p50 / the float model's weight-bandwidth floor (BenchResult.floor_ms)
    # --sessions N: the row timed over N sessions of its file; token_p50_ms is then the median of these, each
    # session's p50 over its own decode steps (None: one session)
    session_p50_ms: list[float] | None = None
    notes: list[str] = field(default_factory=list)  # what a reader of this row must know (bench.md's notes)

    WRITE_NONE = ("*",)

    def __post_init__(self) -> None:
        if not self.label:
            self.label = self.name if self.lowering is None else f"{self.name} [{self.lowering}]"

    @property
    def sessions_apart(self) -> float | None:
        """(slowest - fastest) / median of the sessions' p50s, or None with one session."""
        s = sorted(self.session_p50_ms or [])
        if len(s) < 2:
            return None
        mid = s[len(s) // 2] if len(s) % 2 else (s[len(s) // 2 - 1] + s[len(s) // 2]) / 2
        return (s[-1] - s[0]) / mid if mid else None


@dataclass
class BenchModel(Record):
    """The model timed: its spec, contract and fingerprint (the manifest's)."""

    spec: str
    contract: dict[str, Any] | None = field(default=None, metadata={"parse": lambda v, w: contract_dict(v, w)})
    fingerprint: str | None = None


@dataclass
class BandwidthInfo(Record):
    """The memory read bandwidth the floor uses (:class:`mhaexport.bench.probes.Bandwidth`): each probe's GB/s,
    ``read`` (the fastest), the ``probe`` that measured it, its threads, size and method."""

    read: float
    probe: str
    threads: int
    copy: float | None = None
    sum: float | None = None
    gemv: float | None = None
    mbytes: int | None = None
    method: str | None = None

    KEY_ORDER = ("copy", "sum", "gemv", "read", "probe", "threads", "mbytes", "method")

    @property
    def probes(self) -> dict[str, float]:
        """{probe: GB/s} of each probe that ran."""
        return {k: v for k, v in (("copy", self.copy), ("sum", self.sum), ("gemv", self.gemv)) if v is not None}


@dataclass
class LongRun(Record):
    """One ORT CPU row run from the prompt out to a far position (``--long``): per-token latency per position and
    at the marks (median of positions +-8), ``near`` (the prompt end) and ``far``, and where known the bytes a step
    reads at least at each mark (``bytes_at``)."""

    name: str
    label: str
    positions: list[int]
    ms: list[float]
    at: dict[str, float | None]
    near: int
    far: int
    lowering: str | None = None
    repeats: int = 1
    spread: float | None = None
    bytes_at: dict[str, int] | None = None

    WRITE_NONE = ("lowering", "spread")
    KEY_ORDER = ("name", "label", "lowering", "positions", "ms", "at", "near", "far", "repeats", "spread", "bytes_at")

    def at_position(self, pos: int | None) -> float | None:
        """The latency at mark ``pos`` (None where the run has no such mark)."""
        return self.at.get(str(pos))


@dataclass
class LoweringRow(Record):
    """One ONNX Runtime row in the lowerings table: its p50 against the fastest on its provider, near and far."""

    name: str
    label: str
    lowering: str | None = None
    folder: str | None = None
    provider: str | None = None
    token_p50_ms: float | None = None
    vs_fastest: float | None = None
    near: int | None = None
    near_ms: float | None = None
    far: int | None = None
    far_ms: float | None = None
    far_over_near: float | None = None

    WRITE_NONE = ("*",)


@dataclass
class BatchPoint(Record):
    """How cost grows: one batch size (``reason``: why it was skipped)."""

    batch: int
    token_p50_ms: float | None = None
    tokens_per_s: float | None = None
    ttft_ms: float | None = None
    repeats: int = 0
    reason: str | None = None

    WRITE_NONE = ("*",)


@dataclass
class PromptPoint(Record):
    """How cost grows: one prompt length (``reason``: why it was skipped)."""

    prompt: int
    ttft_ms: float | None = None
    prefill_ms: float | None = None
    repeats: int = 0
    reason: str | None = None

    WRITE_NONE = ("*",)


@dataclass
class ScalingRow(Record):
    """How cost grows for one row (``--batches`` / ``--prompts``; bench.scaling): every asked point."""

    name: str
    label: str
    lowering: str | None = None
    providers: list[str] = field(default_factory=list)
    batches: list[BatchPoint] = field(default_factory=list)
    prompts: list[PromptPoint] = field(default_factory=list)

    WRITE_NONE = ("*",)


@dataclass
class BatchingPoint(Record):
    """Serving: continuous batching over ``rows`` rows: tokens/s, and its ratio to the plain loop's (bench.serving)."""

    rows: int
    tokens_per_s: float | None = None
    ratio: float | None = None
    repeats: int = 0

    WRITE_NONE = ("*",)


@dataclass
class SpeculativePoint(Record):
    """Serving: speculative decoding (prompt lookup) on one prompt against plain greedy decoding: tokens/s both
    ways, the ratio, the drafts accepted, tokens per call of the model, whether the tokens were the same."""

    prompt: str
    plain_tokens_per_s: float | None = None
    tokens_per_s: float | None = None
    ratio: float | None = None
    acceptance: float | None = None
    tokens_per_call: float | None = None
    same_tokens: bool | None = None
    repeats: int = 0
    tokens: int | None = None

    WRITE_NONE = ("*",)


@dataclass
class ServingBench(Record):
    """Serving (``--serving``; bench.serving) on one row: the requests and their tokens, the plain loop's tokens/s,
    continuous batching at each number of rows, speculative decoding per prompt, whether every serving run's
    tokens were the plain loop's, notes."""

    row: str
    requests: int
    tokens: int
    plain_tokens_per_s: float | None = None
    batching: list[BatchingPoint] = field(default_factory=list)
    speculative: list[SpeculativePoint] = field(default_factory=list)
    same_tokens: bool | None = None
    notes: list[str] = field(default_factory=list)

    WRITE_NONE = ("*",)


@dataclass
class TargetResult(Record):
    """One speed target judged on this run (bench.targets): measured ratio, ``met`` (None: no verdict), the verdict,
    the widest spread among the figures read, whether the run conditions match the target's."""

    target: str
    limit: float
    direction: str = "at most"
    measured: float | None = None
    met: bool | None = None
    verdict: str = "not measured"
    detail: str = ""
    spread: float | None = None
    spread_of: str | None = None
    applies: bool = True

    WRITE_NONE = ("*",)
    KEY_ORDER = ("target", "measured", "limit", "direction", "met", "verdict", "detail", "spread", "spread_of",
                 "applies")


@dataclass
class OpTime(Record):
    op: str
    ms: float
    share: float


@dataclass
class Profile(Record):
    """ONNX Runtime's profile of one ORT CPU generation, summed per op type (``file``: None when not kept)."""

    file: str | None = None
    model_runs: int = 0
    ops: list[OpTime] = field(default_factory=list)

    WRITE_NONE = ("*",)


@dataclass
class LoopComparison(Record):
    """mhaexport's decode loop (``ours``: the folder's ort-cpu row, the deploy runtime's Generator) against
    onnxruntime-genai's (``genai``: ort-genai) on the same file: their token p50s (with ``--sessions``, each the
    median of its sessions' p50s, listed) and ``ratio`` = ours / genai, at ``threads`` threads each."""

    ours: str
    genai: str
    ours_ms: float
    genai_ms: float
    ratio: float
    sessions: int = 1
    ours_sessions_ms: list[float] = field(default_factory=list)
    genai_sessions_ms: list[float] = field(default_factory=list)
    threads: int | None = None


@dataclass
class BenchResult(Record):
    """Everything bench.json holds (plus ``"schema": "mhaexport.bench/1"`` at the top)."""

    folder: str
    config: BenchConfig
    model: BenchModel
    environment: Environment  # mhaexport.core.env.environment() plus the thread count and the CUDA device
    bandwidth_gbps: float  # the memory read bandwidth the floor uses (the fastest probe)
    bandwidth: BandwidthInfo
    weight_bytes_per_token: int
    floor_ms: float  # weight bytes per token / bandwidth
    runtimes: list[RuntimeBench]
    long_runs: list[LongRun] = field(default_factory=list)  # one per ORT CPU lowering
    lowerings: list[LoweringRow] = field(default_factory=list)  # ORT rows side by side (lowerings.compare_lowerings)
    targets: list[TargetResult] = field(default_factory=list)  # targets.evaluate
    profile: Profile | None = None
    notes: list[str] = field(default_factory=list)
    versions: dict[str, Any] = field(default_factory=dict)  # mhaexport.core.env.tool_versions()
    # how cost grows (--batches / --prompts; bench.scaling): one per ONNX Runtime row, every asked point
    scaling: list[ScalingRow] = field(default_factory=list)
    # mhaexport's loop / onnxruntime-genai's on the same file (run.loop_comparison); None unless both rows ran
    loop: LoopComparison | None = None
    # continuous batching and speculative decoding against the plain loop (--serving; bench.serving); None: not asked
    serving: ServingBench | None = None

    DERIVED = ("schema",)
    WRITE_NONE = ("profile", "loop", "serving")
    KEY_ORDER = ("schema",)
    schema = SCHEMA

    def get(self, name: str) -> RuntimeBench | None:
        """The row named ``name``, or None."""
        return next((r for r in self.runtimes if r.name == name), None)

    def long_run(self, name: str = "ort-cpu") -> LongRun | None:
        """The long run of row ``name`` (default: the folder's own ORT CPU export), or None."""
        return next((lr for lr in self.long_runs if lr.name == name), None)

    def scaling_of(self, name: str = "ort-cpu") -> ScalingRow | None:
        """How cost grows for row ``name`` (default: the folder's own ORT CPU export), or None."""
        return next((s for s in self.scaling if s.name == name), None)

    @property
    def below_floor(self) -> list[RuntimeBench]:
        """The rows whose token p50 beats the weight-bandwidth floor: their weights are not read from memory every
        step (they fit in the CPU's cache), so for this model the floor bounds nothing."""
        return [r for r in self.runtimes if r.ran and r.token_p50_ms is not None and r.token_p50_ms < self.floor_ms]

    @property
    def floor_probe(self) -> str:
        """The bandwidth probe whose read set the floor ("copy", "sum", "gemv")."""
        return self.bandwidth.probe

    @property
    def floor_threads(self) -> int:
        """The thread count the floor's probe read with."""
        return self.bandwidth.threads

    @classmethod
    def from_dict(cls, data: dict, what: str = "bench result") -> BenchResult:
        """bench.json read back: ArtifactError naming ``what`` and the first field of the wrong type."""
        version_of(data, KIND, (VERSION,), what)
        try:
            return super().from_dict(data, "")
        except ArtifactError as e:
            raise ArtifactError(f"{what}: field {e}") from None


def load_bench(path: str | Path) -> BenchResult:
    """A bench.json (or the folder holding one) as a :class:`BenchResult`."""
    from mhaexport.artifact import read_json

    from mhaexport.core.errors import ConfigError

    path = Path(path)
    if path.is_dir():
        path = path / "bench.json"
    try:
        return BenchResult.from_dict(read_json(path, "bench result"), what=f"bench result {path}")
    except ConfigError as e:  # its config is not one this version runs (a BenchConfig is checked when made)
        raise ArtifactError(f"bench result {path}: config: {e}") from None


# the largest bench.json read back
MAX_RESULT_BYTES = 16 << 20


def read_result_in(folder: str | Path, name: str = "bench.json") -> BenchResult | None:
    """The bench result ``folder/name`` (an output folder's file: input like any other), read by the confined reader
    (no link followed, a regular file of at most :data:`MAX_RESULT_BYTES`), strictly parsed and typed; None where
    there is none. MhaExportError (exit 2) naming the file for anything else."""
    from mhaexport.artifact.confine import MissingFile, read_inside
    from mhaexport.core.errors import ConfigError
    from mhaexport.core.untrusted import load_json

    where = str(Path(folder) / name)
    try:
        raw = read_inside(folder, name, where, MAX_RESULT_BYTES)
    except MissingFile:
        return None
    try:
        return BenchResult.from_dict(load_json(raw, where), what=f"bench result {where}")
    except ConfigError as e:
        raise ArtifactError(f"bench result {where}: config: {e}") from None
