"""What checks are called and what they return: the check names, :class:`CheckResult` (data, not text), and the
context the checks of one export share (:class:`SweepContext`; the decoder's :class:`Context`).

The report reads the names and results; the checks (verify/checks.py, verify/block.py, verify/quality.py) fill
them in. Nothing here runs a check.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar

import numpy as np

from mhaexport.artifact.details import Quantization
from mhaexport.artifact.record import Record
from mhaexport.errors import MhaExportError
from mhaexport.iospec import ModelContract
from mhaexport.runtime.runner import Outputs, Runner
from mhaexport.verify.compare import OUTPUT_KINDS, Diff, Tolerance, compare, compare_by_output
from mhaexport.verify.figures import NOT_A_CHECK, DiffFigures, Figures, figures_of  # noqa: F401 (NOT_A_CHECK)
from mhaexport.verify.sweep import Case

CHECKS = ("parity", "finite", "causality", "kv-consistency", "padding", "dynamic-shapes", "generation")
# the checks of an attention-block export (--module attention), in verify/block.py
MODULE_CHECKS = ("parity", "finite", "causality", "cache-consistency", "demonstration")
# A lossy (quantized) artifact adds this one: its figures against eager fp32 instead of exact parity
# (verify/quality.py); verify runs it when an artifact's manifest entry records a quantization.
QUALITY = "quality"
# ... and this one: its quantized weights against the recipe its manifest records (verify/weights.py)
WEIGHTS = "weights"
# ... and this one when the folder ships a genai_config.json: the config onnxruntime-genai reads, against the graph,
# the manifest, the model and the tokenizer (verify/genai_check.py)
GENAI_CONFIG_CHECK = "genai-config"
ALL_CHECKS = CHECKS + (QUALITY, WEIGHTS, GENAI_CONFIG_CHECK)


@dataclass
class CheckResult(Record):
    """One check on one runtime. status: True passed, False failed, None not run (skipped, with the reason).
    In report.json ``{"status", "figures", "message"}`` under the check's name (``check`` is that key). ``figures``:
    the check's record (verify/figures.py; a dict given is typed by the check's name, and retyped when a report
    read back names the check, :meth:`named`)."""

    check: str = field(default="", metadata={"json": False})
    status: bool | None = None
    figures: Figures = field(default_factory=Figures)
    message: str = ""

    REQUIRED = ("status",)
    WRITE_NONE = ("status",)

    def __post_init__(self) -> None:
        if self.check or not isinstance(self.figures, Figures):
            self.figures = figures_of(self.check, self.figures)

    def named(self, check: str, where: str = "figures") -> None:
        """This result read back under ``check``'s key: its figures typed as that check's record (ArtifactError
        naming ``where``.key)."""
        self.check = self.check or check
        self.figures = figures_of(self.check, self.figures, where)

    def __bool__(self) -> bool:
        return self.status is True

    @property
    def counted(self) -> bool:
        """Whether this result is a check the counts, the verdict, report.md and JUnit count (passed, failed or
        skipped): every result but the reference against itself and a check that does not apply by design
        (:data:`NOT_A_CHECK`; shown "ref" / "n/a", counted nowhere)."""
        return self.status is not None or self.figures.not_a_check is None


@dataclass
class CrossResult(Record):
    """Provider against provider (``a`` vs ``b``, e.g. ort-cuda vs ort-cpu) over the sweep: report.json's
    ``cross``; counted as the check ``cross-provider`` of the row ``a~b``."""

    a: str
    b: str
    status: bool | None
    figures: DiffFigures = field(default_factory=DiffFigures)
    message: str = ""

    def __post_init__(self) -> None:
        self.figures = figures_of("cross-provider", self.figures)

    WRITE_NONE = ("status",)

    @property
    def row(self) -> str:
        return f"{self.a}~{self.b}"

    def as_check(self) -> CheckResult:
        return CheckResult("cross-provider", self.status, self.figures, self.message)


@dataclass(kw_only=True)
class SweepContext:
    """What the checks of one export share, whatever its contract: the sweep, the tolerance of the runtime under
    check (verify gives each runtime a copy with its own), eager's memoized outputs, and each runtime's run over
    the sweep, done once (parity, finite, dynamic-shapes and the cross-provider comparison share it).

    A contract's context says how a case becomes inputs (:meth:`inputs`), how two runs of a case compare, per
    output kind (:meth:`compare`, kinds :attr:`output_kinds`), and what its outputs are called
    (:meth:`named_outputs`): the decoder's :class:`Context`, the attention block's ``verify.block.ModuleContext``.
    """

    contract: Any
    cases: list[Case]
    tol: Tolerance
    eager: Runner
    seed: int = 0
    tol_override: tuple = (None, None)  # --atol/--rtol as given: numbers or {None|"logits"|"present": number}
    _ref: dict = field(default_factory=dict)
    _sweep_out: dict = field(default_factory=dict)

    output_kinds: ClassVar[tuple[str, ...]] = OUTPUT_KINDS  # parity's figures per kind

    def inputs(self, case: Case) -> tuple:
        raise NotImplementedError

    def compare(self, case: Case, actual: Any, expected: Any, tol: Tolerance) -> dict[str, Diff]:
        """{kind: Diff} of two runs of ``case`` (a runtime's against eager's, or provider against provider)."""
        raise NotImplementedError

    def named_outputs(self, outputs: Any) -> list[tuple[str, np.ndarray]]:
        """Every output array of one run, with the name a message gives it."""
        raise NotImplementedError

    def reference(self, case: Case) -> Any:
        if case not in self._ref:
            self._ref[case] = self.eager.run(*self.inputs(case))
        return self._ref[case]

    def cases_for(self, runner: Runner) -> list[Case]:
        """The sweep cases the runner accepts."""
        return list(self.cases)

    def sweep(self, runner: Runner) -> dict[Case, Any]:
        """Run the runner over its cases once: case -> outputs, or the MhaExportError it raised."""
        if runner.name not in self._sweep_out:
            self._sweep_out[runner.name] = run_cases(runner, self.cases_for(runner), self.inputs)
        return self._sweep_out[runner.name]


@dataclass(kw_only=True)
class Context(SweepContext):
    """The decoder's checks' context: its contract, the export's traced sizes, generation and quality settings."""

    contract: ModelContract
    export_sizes: tuple[int, int]
    gen_tokens: int = 8
    long_full: bool = True  # long-context kv-consistency token by token to max_positions (small models), else spread
    # the runtime under check's artifact is lossy: its manifest's quantization record (verify sets it per runtime);
    # exact parity gives way to the quality check, and generation compares it with itself
    lossy: Quantization | None = None
    quality: Any = None  # verify.quality.QualitySettings: thresholds' overrides, the text, greedy prompts
    tokenizer: Any = None  # runtime.tokenizer.TextTokenizer of the folder (a tokenizer.json: quality reads text)
    weights: Callable[[], CheckResult] | None = None  # a lossy folder's weights check (verify/weights.py), run once
    genai_config: Callable[[], CheckResult] | None = None  # the folder's genai_config.json (verify/genai_check.py)
    without_cache: Callable[[Any], Any] | None = None  # the registry's recompute protocol of a runner (verify.py sets it)
    # the registry's deploy protocol of a runner (verify.py sets it: registry.deploy_of): the same session in its file's
    # own protocol where the checks' runner drives it otherwise (a shared cache's), else None
    deploy: Callable[[Any], Any] | None = None

    def inputs(self, case: Case):
        return case.inputs(self.contract)

    def compare(self, case: Case, actual: Outputs, expected: Outputs, tol: Tolerance) -> dict[str, Diff]:
        """logits on the case's real query rows, present keys/values on its real key positions."""
        return compare_by_output(actual, expected, tol, case.real_rows(), case.real_keys())

    def named_outputs(self, outputs: Outputs) -> list[tuple[str, np.ndarray]]:
        logits, present = outputs
        return [("logits", logits)] + [(f"present[{i}]", t) for i, kv in enumerate(present) for t in kv]

    @property
    def ltol(self) -> Tolerance:
        """The tolerance for logits (checks that compare logits only)."""
        return self.tol.for_output("logits")

    recorded = None  # verify.reference.RecordedReference when eager's references come from a record (RecordedContext)

    def reference_scale(self, case: Case) -> float:
        """max |eager logits| of ``case`` (parity's rounding scale)."""
        return float(np.abs(self.reference(case)[0]).max(initial=0.0))

    def ref_compare(self, got: np.ndarray, ref: np.ndarray, tol: Tolerance) -> Diff:
        """A runtime's logits against a reference's (one greedy step): the comparison of every value (a top-k
        record: of the values it kept)."""
        return compare(got, ref, tol)

    def cases_for(self, runner: Runner) -> list[Case]:
        """The sweep cases the runner accepts; a static export gets one case at its own sizes."""
        if runner.fixed is None:
            return list(self.cases)
        seq, past = runner.fixed
        return [Case(2, seq, past, (0, min(2, seq + past - 1)), seed=self.seed)]


def run_cases(runner, cases, inputs: Callable) -> dict:
    """``runner.run(*inputs(case))`` for every case (the decoder's and the block's sweeps): case -> outputs, or the
    MhaExportError it raised — the runtime failing at one shape is a result, not a crash."""
    out: dict = {}
    for case in cases:
        try:
            out[case] = runner.run(*inputs(case))
        except MhaExportError as e:
            out[case] = e
    return out
