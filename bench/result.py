"""What a bench run found, as data: one :class:`RuntimeBench` per row and the :class:`BenchResult` (bench.json).
Rendering it is :mod:`mhaexport.bench.render`'s job."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from mhaexport.artifact.schema import tag

SCHEMA = tag("bench", 1)


@dataclass
class RuntimeBench:
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

    def __post_init__(self) -> None:
        if not self.label:
            self.label = self.name if self.lowering is None else f"{self.name} [{self.lowering}]"

    @property
    def sessions_apart(self) -> float | None:
        """(slowest - fastest) / median of the sessions' p50s, or None with one session."""
        s = self.session_p50_ms
        if not s or len(s) < 2:
            return None
        mid = sorted(s)[len(s) // 2] if len(s) % 2 else (sorted(s)[len(s) // 2 - 1] + sorted(s)[len(s) // 2]) / 2
        return (max(s) - min(s)) / mid if mid else None


@dataclass
class BenchResult:
    """Everything bench.json holds (plus ``"schema": "mhaexport.bench/1"`` at the top)."""

    folder: str
    config: dict
    model: dict
    environment: dict  # mhaexport.env.environment() plus the thread count and the CUDA device
    bandwidth_gbps: float  # the memory read bandwidth the floor uses (the fastest probe)
    bandwidth: dict  # Bandwidth.to_dict(): each probe, "read", and the "probe" and "threads" that set the floor
    weight_bytes_per_token: int
    floor_ms: float  # weight bytes per token / bandwidth
    runtimes: list[RuntimeBench]
    # one per ORT CPU lowering: {"name", "label", "lowering", "positions", "ms", "at": {pos: ms}, "near", "far",
    # "spread"}
    long_runs: list[dict] = field(default_factory=list)
    lowerings: list[dict] = field(default_factory=list)  # ORT rows side by side (lowerings.compare_lowerings)
    targets: list[dict] = field(default_factory=list)  # targets.evaluate
    profile: dict | None = None
    notes: list[str] = field(default_factory=list)
    versions: dict = field(default_factory=dict)  # mhaexport.env.tool_versions()
    # how cost grows (--batches / --prompts; bench.scaling): one per ONNX Runtime row, {"name", "label", "lowering",
    # "providers", "batches": [{"batch", "token_p50_ms", "tokens_per_s", "ttft_ms", "repeats", "reason"}],
    # "prompts": [{"prompt", "ttft_ms", "prefill_ms", "repeats", "reason"}]}; a point skipped has its reason
    scaling: list[dict] = field(default_factory=list)
    # mhaexport's decode loop against onnxruntime-genai's on the same file (run.loop_comparison): {"ours", "genai",
    # "ours_ms", "genai_ms", "ratio" (ours / genai), "sessions", "ours_sessions_ms", "genai_sessions_ms", "threads"};
    # None when the ort-cpu and ort-genai rows did not both run
    loop: dict | None = None

    def get(self, name: str) -> RuntimeBench | None:
        """The row named ``name``, or None."""
        return next((r for r in self.runtimes if r.name == name), None)

    def long_run(self, name: str = "ort-cpu") -> dict | None:
        """The long run of row ``name`` (default: the folder's own ORT CPU export), or None."""
        return next((lr for lr in self.long_runs if lr["name"] == name), None)

    def scaling_of(self, name: str = "ort-cpu") -> dict | None:
        """How cost grows for row ``name`` (default: the folder's own ORT CPU export), or None."""
        return next((s for s in self.scaling if s["name"] == name), None)

    @property
    def floor_probe(self) -> str:
        """The bandwidth probe whose read set the floor ("copy", "sum", "gemv")."""
        return self.bandwidth["probe"]

    @property
    def floor_threads(self) -> int:
        """The thread count the floor's probe read with."""
        return self.bandwidth["threads"]

    def to_dict(self) -> dict:
        return {"schema": SCHEMA, **asdict(self)}
