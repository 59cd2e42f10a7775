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
from mhaexport.core.errors import MhaExportError
from mhaexport.core import iospec
from mhaexport.core.iospec import ModelContract
from mhaexport.runtime.runner import Outputs, Runner
from mhaexport.runners.names import EAGER, ORT_CPU, ORT_CUDA
from mhaexport.runners.plan import BLOCK, Plan, order_of
from mhaexport.verify.compare import OUTPUT_KINDS, Diff, Tolerance, compare, compare_by_output, merged
from mhaexport.verify.figures import NOT_A_CHECK, DiffFigures, Figures, figures_of  # noqa: F401 (NOT_A_CHECK)
from mhaexport.verify.sweep import REFERENCE_CACHE_BYTES, Case

# what serving stacks do with a file, each request held to its run alone (verify/serving.py)
CONTINUOUS_BATCHING, SPECULATIVE, PREFIX_REUSE = "continuous-batching", "speculative", "prefix-reuse"
SERVING_CHECKS = (CONTINUOUS_BATCHING, SPECULATIVE, PREFIX_REUSE)
CHECKS = ("parity", "finite", "causality", "kv-consistency", "padding", "dynamic-shapes", "generation") + SERVING_CHECKS
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
# ... and this one when the ONNX file computes in float16 or bfloat16: eager's activation peaks per layer against the
# dtype's range and precision (verify/headroom.py)
HEADROOM = "headroom"
ALL_CHECKS = CHECKS + (QUALITY, WEIGHTS, GENAI_CONFIG_CHECK, HEADROOM)


def non_finite_figure(value: object, at: str = "") -> str | None:
    """The first NaN or infinite number in a record (its fields, lists and dicts, depth first) as "name = value",
    else None."""
    import dataclasses
    import math

    if isinstance(value, float):
        return None if math.isfinite(value) else f"{at or 'value'} = {value}"
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        items = ((f.name, getattr(value, f.name)) for f in dataclasses.fields(value))
    elif isinstance(value, dict):
        items = ((str(k), v) for k, v in value.items())
    elif isinstance(value, (list, tuple)):
        items = ((f"[{i}]", v) for i, v in enumerate(value))
    else:
        return None
    for name, v in items:
        found = non_finite_figure(v, f"{at}{name}" if name.startswith("[") or not at else f"{at}.{name}")
        if found is not None:
            return found
    return None


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
        if self.status is True and (bad := non_finite_figure(self.figures)) is not None:
            # no check of mhaexport's passes with a NaN or infinite figure (a non-finite value is a mismatch): a
            # report that says so is read as what its figures show
            self.status = False
            self.message = f"read back as failed: it says passed, but its figure {bad} is not finite"

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


def outputs_bytes(outputs: Any, spill: Any = None) -> int:
    """Bytes of the arrays of one run's outputs (nested tuples of arrays); with the mapped mode's ``spill``
    (runtime/spill.py), only those in memory: not its file-backed arrays, however they were handed on
    (:meth:`~mhaexport.runtime.spill.Spill.holds`: eager's cache comes back through torch, no ``np.memmap``)."""
    if isinstance(outputs, np.ndarray):
        return 0 if spill is not None and spill.holds(outputs) else int(outputs.nbytes)
    if isinstance(outputs, (tuple, list)):
        return sum(outputs_bytes(o, spill) for o in outputs)
    return 0


@dataclass
class CaseRun:
    """What the sweep kept of one runtime's run of one case — its outputs are reduced as it runs and dropped.
    ``by_kind``: {kind: Diff} against eager (None for eager itself and a lossy artifact, which parity does not
    compare); ``non_finite``: [(output name, count of NaN/inf)] of the outputs that had any; the decoder's adds
    ``scale`` (max |eager logits|), ``present`` ({present.i.key|value: Diff} on real keys), ``present_scale``
    ({name: max |eager| on real keys}), ``shape_problem`` (the contract's shapes broken: the message) and
    ``first_bad`` (the lowest position whose logits differ)."""

    by_kind: dict[str, Diff] | None = None
    non_finite: list[tuple[str, int]] = field(default_factory=list)
    scale: float = 0.0
    present: dict[str, Diff] | None = None
    present_scale: dict[str, float] | None = None
    shape_problem: str | None = None
    first_bad: int | None = None


class SweepRuns(dict):
    """{case: :class:`CaseRun`, or the MhaExportError the runtime raised there}, in the runtime's case order;
    ``agreement``: a lossy artifact's running quality figures over the sweep (evaluate.scoring.Agreement)."""

    agreement: Any = None


@dataclass(kw_only=True)
class SweepContext:
    """What the checks of one export share, whatever its contract: the sweep, the tolerance of the runtime under
    check (verify gives each runtime a copy with its own), eager's references, and each runtime's run over the
    sweep, done once and reduced as it goes (parity, finite, dynamic-shapes, quality and the cross-provider
    comparison read its :class:`CaseRun`s: no check holds a sweep's outputs).

    The sweep runs *case by case* over every runtime :meth:`plan` named: eager's reference of a case is computed
    once, each runtime runs the case, its outputs are reduced against the reference (and compared with its
    provider pair's, :data:`CROSS_PAIRS`), and all of them are dropped before the next case; what it holds at once
    is one case's reference and one or two runtimes' outputs (verify.sweep.sweep_peak_bytes).

    A contract's context says how a case becomes inputs (:meth:`inputs`), how two runs of a case compare, per
    output kind (:meth:`compare`, kinds :attr:`output_kinds`), what its outputs are called (:meth:`named_outputs`)
    and what a run of a case keeps (:meth:`summarize`): the decoder's :class:`Context`, the attention block's
    ``verify.block.ModuleContext``.
    """

    contract: Any
    cases: list[Case]
    tol: Tolerance
    eager: Runner
    seed: int = 0
    tol_override: tuple = (None, None)  # --atol/--rtol as given: numbers or {None|"logits"|"present": number}
    spill: Any = None  # runtime.spill.Spill in the mapped mode: large inputs in file-backed pages
    _ref: dict = field(default_factory=dict)  # memos of checks (greedy references, genai-config, weights)
    _refs: dict = field(default_factory=dict)  # eager's references kept (REFERENCE_CACHE_BYTES)
    _sweep_out: dict = field(default_factory=dict)  # runtime name -> SweepRuns
    _plan: list = field(default_factory=list)  # [(runner, its context)] whose sweeps run together, case by case
    _cross: dict = field(default_factory=dict)  # (a, b) -> [(case, Diff)] of a provider pair, from the sweep

    output_kinds: ClassVar[tuple[str, ...]] = OUTPUT_KINDS  # parity's figures per kind

    def inputs(self, case: Case) -> tuple:
        raise NotImplementedError

    def compare(self, case: Case, actual: Any, expected: Any, tol: Tolerance) -> dict[str, Diff]:
        """{kind: Diff} of two runs of ``case`` (a runtime's against eager's, or provider against provider)."""
        raise NotImplementedError

    def named_outputs(self, outputs: Any) -> list[tuple[str, np.ndarray]]:
        """Every output array of one run, with the name a message gives it."""
        raise NotImplementedError

    def compared(self, runner: Runner) -> bool:
        """Whether the sweep compares ``runner``'s outputs with eager's (not eager itself)."""
        return runner.name != EAGER

    def needs_reference(self, runner: Runner) -> bool:
        """Whether summarizing ``runner``'s runs reads eager's outputs."""
        return self.compared(runner)

    def summarize(self, runner: Runner, case: Case, out: Any, ref: Any, runs: SweepRuns) -> CaseRun:
        """What the sweep keeps of ``runner``'s run of ``case`` (``ref``: eager's, when :meth:`needs_reference`)."""
        run = CaseRun(non_finite=non_finite(self.named_outputs(out)))
        if self.compared(runner):
            run.by_kind = self.compare(case, out, ref, self.tol)
        return run

    def reference(self, case: Case) -> Any:
        """Eager's outputs of ``case``: kept while the kept ones stay under REFERENCE_CACHE_BYTES of memory (in the
        mapped mode each is kept on file-backed pages, ``Spill.pack``, and none counts), else computed again when
        asked again."""
        if case in self._refs:
            return self._refs[case]
        out = self.eager.run(*self.inputs(case))
        self._keep_reference(case, out)
        return out

    def references(self, cases: list[Case]) -> None:
        """Eager's references of ``cases`` computed ahead, kept as :meth:`reference` keeps them (verify's mapped
        mode, before the other runtimes' pass). Where eager runs plans block by block (runners/plan.py) every case is
        one call of one plan — each layer's weights read once for the sweep — else case after case, stopping at the
        first reference memory does not keep (the rest computed case by case, each once)."""
        if order_of(self.eager)[0] != BLOCK:
            for case in cases:
                try:
                    self.reference(case)
                except MhaExportError:
                    continue  # the case's own run says it
                if case not in self._refs:
                    break
            return
        plan, todo = Plan(), [case for case in cases if case not in self._refs]
        for case in todo:
            plan.add(*self.inputs(case), keep=True)
        for case, result in zip(todo, plan.run(self.eager)):
            if result.error is None:  # (a case that failed: its own run says it)
                self._keep_reference(case, result.outputs())

    def _keep_reference(self, case: Case, out: Any) -> None:
        if self.spill is not None:  # the mapped mode: a reference kept is kept on file-backed pages, all of it
            out = self.spill.pack(out)
        size = outputs_bytes(out, self.spill)
        if size + sum(outputs_bytes(o, self.spill) for o in self._refs.values()) <= REFERENCE_CACHE_BYTES:
            self._refs[case] = out

    def cases_for(self, runner: Runner) -> list[Case]:
        """The sweep cases the runner accepts."""
        return list(self.cases)

    def plan(self, runners: list[tuple[Runner, SweepContext]]) -> None:
        """Run these runtimes' sweeps together, case by case, when the first of them is asked for (each with its
        own context: its tolerance, a lossy artifact's record). verify's run_all plans the runtimes that ran."""
        self._plan[:] = [(r, c) for r, c in runners if r.name not in self._sweep_out]

    def sweep(self, runner: Runner) -> SweepRuns:
        """The runner's run over its cases, done once (with the runtimes planned with it): case -> CaseRun, or
        the MhaExportError it raised."""
        if runner.name not in self._sweep_out:
            group = [(r, c) for r, c in self._plan if r.name not in self._sweep_out]
            if not any(r is runner for r, _ in group):
                group = [(runner, self)]
            self._sweep_out.update(sweep_pass(group, self))
        return self._sweep_out[runner.name]


def non_finite(named: list[tuple[str, np.ndarray]]) -> list[tuple[str, int]]:
    """[(name, count)] of the outputs holding NaN or inf."""
    out = []
    for name, arr in named:
        n = int(arr.size - np.count_nonzero(np.isfinite(arr)))
        if n:
            out.append((name, n))
    return out


# runtimes of one artifact on different providers: when both ran, they are compared with each other too (eager-cuda
# against eager is its parity already)
CROSS_PAIRS = ((ORT_CUDA, ORT_CPU),)


def sweep_pass(group: list[tuple[Runner, SweepContext]], ctx: SweepContext) -> dict[str, SweepRuns]:
    """Run every runner of ``group`` over its cases, case by case: eager's reference once per case (eager itself
    takes it as its own run), each runner's outputs reduced by its context's :meth:`~SweepContext.summarize` and
    compared with its provider pair's (``ctx._cross``), then dropped. Returns {runner name: SweepRuns}."""
    runs = {r.name: SweepRuns() for r, _ in group}
    lists = {r.name: c.cases_for(r) for r, c in group}
    order: list[Case] = []
    for r, _ in group:
        order += [case for case in lists[r.name] if case not in order]
    if ctx.spill is not None and any(r is ctx.eager or c.needs_reference(r) for r, c in group):
        # the mapped mode (weights that do not stay in memory): eager's pass over every case first, its references
        # kept on file-backed pages, then the others' — case by case, eager's pages and a file's would evict each
        # other on every call (an 8 B model's 16 GB reference beside its 6.3 GB int4 file: 301 GB read in 7 min)
        ctx.references(order)
    ahead = _runs_ahead(group, lists, ctx)
    names = {r.name for r, _ in group}
    pairs = [(a, b) for a, b in CROSS_PAIRS if a in names and b in names]
    paired = {n for p in pairs for n in p}
    for case in order:
        ref, kept = None, {}
        for r, c in group:
            if case not in lists[r.name]:
                continue
            try:
                if r is ctx.eager:
                    out = ref = ctx.reference(case) if ref is None else ref
                elif r.name in ahead:
                    out = ahead[r.name].pop(case).outputs()
                else:
                    out = r.run(*c.inputs(case))
            except MhaExportError as e:
                runs[r.name][case] = e
                continue
            want = None
            if c.needs_reference(r):
                if ref is None:
                    ref = ctx.reference(case)
                want = ref
            runs[r.name][case] = c.summarize(r, case, out, want, runs[r.name])
            if r.name in paired:
                kept[r.name] = (out, c)
            del out
        for a, b in pairs:
            if a in kept and b in kept:
                tol = Tolerance.for_dtype(next(r for r, _ in group if r.name == a).dtype, *ctx.tol_override)
                ctx._cross.setdefault((a, b), []).append(
                    (case, merged(kept[a][1].compare(case, kept[a][0], kept[b][0], tol).values())))
        kept.clear()
        ref = None
    for r, _ in group:  # each runtime's cases in its own order (parity's worst case and per-case figures)
        sr = runs[r.name]
        ordered = SweepRuns((case, sr[case]) for case in lists[r.name] if case in sr)
        ordered.agreement = sr.agreement
        runs[r.name] = ordered
    return runs


def _runs_ahead(group: list[tuple[Runner, SweepContext]], lists: dict[str, list[Case]], ctx: SweepContext
                ) -> dict[str, dict]:
    """{runner name: {case: runners.plan.Result}} of the runners (not eager) that run plans block by block (verify's
    mapped mode, a file whose weights stay mapped: runners/plan.py): each one's sweep run ahead as one plan, its
    outputs on file-backed pages until the case's turn, so its file's layers are read once for the sweep."""
    out: dict[str, dict] = {}
    if ctx.spill is None:
        return out
    for r, c in group:
        if r is ctx.eager or order_of(r)[0] != BLOCK:
            continue
        plan = Plan()
        for case in lists[r.name]:
            plan.add(*c.inputs(case), keep=True)
        out[r.name] = dict(zip(lists[r.name], plan.run(r)))
    return out


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
    headroom: Callable[[], CheckResult] | None = None  # a half-precision file's headroom (verify/headroom.py)
    without_cache: Callable[[Any], Any] | None = None  # the registry's recompute protocol of a runner (verify.py sets it)
    # the registry's deploy protocol of a runner (verify.py sets it: registry.deploy_of): the same session in its file's
    # own protocol where the checks' runner drives it otherwise (a shared cache's), else None
    deploy: Callable[[Any], Any] | None = None

    def inputs(self, case: Case):
        ids, mask, past = case.inputs(self.contract)
        if self.spill is not None:  # a long past (a decode step at max_positions) in file-backed pages
            past = tuple((self.spill.keep(k), self.spill.keep(v)) for k, v in past)
        return ids, mask, past

    def compare(self, case: Case, actual: Outputs, expected: Outputs, tol: Tolerance) -> dict[str, Diff]:
        """logits on the case's real query rows, present keys/values on its real key positions."""
        return compare_by_output(actual, expected, tol, case.real_rows(), case.real_keys())

    def named_outputs(self, outputs: Outputs) -> list[tuple[str, np.ndarray]]:
        logits, present = outputs
        return [("logits", logits)] + [(f"present[{i}]", t) for i, kv in enumerate(present) for t in kv]

    def compared(self, runner: Runner) -> bool:
        """Eager and a lossy artifact (judged by quality) are not compared value for value with eager."""
        return runner.name != EAGER and not self.lossy

    def needs_reference(self, runner: Runner) -> bool:
        """Compared with eager, or a lossy artifact (its quality figures over the sweep)."""
        return runner.name != EAGER

    def shape_problem(self, case: Case, out: Outputs) -> str | None:
        """What breaks the contract's shapes in a run of ``case`` (the message), or None."""
        c = self.contract
        logits, present = out
        want_l = (case.batch, case.seq, c.vocab_size)
        want_kv = (case.batch, c.n_kv_heads, case.past + case.seq, c.head_dim)
        if tuple(logits.shape) != want_l or any(tuple(t.shape) != want_kv for kv in present for t in kv):
            return f"wrong output shapes at {case.name}: logits {list(logits.shape)} (want {list(want_l)})"
        return None

    def summarize(self, runner: Runner, case: Case, out: Outputs, ref: Outputs | None, runs: SweepRuns) -> CaseRun:
        """What parity, finite, dynamic-shapes and quality need of one run: non-finite counts, whether the shapes
        are the contract's, and against eager (``ref``) the figures per kind and per present output, eager's
        scale, and the first position whose logits differ; a lossy artifact's outputs feed the running quality
        figures (``runs.agreement``) instead."""
        logits, present = out
        run = CaseRun(non_finite=non_finite(self.named_outputs(out)), shape_problem=self.shape_problem(case, out))
        if self.lossy and runner.name != EAGER:
            from mhaexport.evaluate.scoring import Agreement

            if runs.agreement is None:
                runs.agreement = Agreement()
            rows = case.real_rows()
            runs.agreement.add(ref[0][rows], logits[rows])
        if not self.compared(runner):
            return run
        rows, keys = case.real_rows(), case.real_keys()
        le, pe = ref
        tl = self.tol.for_output("logits")
        run.scale = float(max(le.max(initial=0.0), -le.min(initial=0.0)))  # max |eager logits|, no |copy|
        run.by_kind = {"logits": compare(logits, le, tl, rows[:, :, None])}
        if len(present) != len(pe):
            run.by_kind["present"] = Diff(float("inf"), float("inf"), 1, 1, float("inf"))
        else:
            tp, kmask = self.tol.for_output("present"), keys[:, None, :, None]  # (B, 1, S, 1)
            run.present, run.present_scale = {}, {}
            for i, (pair_a, pair_e) in enumerate(zip(present, pe)):
                for name, a, e in zip(iospec.present_names(i), pair_a, pair_e):
                    run.present[name] = compare(a, e, tp, kmask)
                    sel = np.broadcast_to(kmask, e.shape) if e.shape == a.shape else None
                    run.present_scale[name] = float(np.abs(e[sel] if sel is not None else e).max(initial=0.0))
            run.by_kind["present"] = merged(run.present.values())
        if run.by_kind["logits"].mismatched and logits.shape == le.shape:
            run.first_bad = first_bad_position(case, logits, le, tl)
        return run

    @property
    def ltol(self) -> Tolerance:
        """The tolerance for logits (checks that compare logits only)."""
        return self.tol.for_output("logits")

    recorded = None  # verify.reference.RecordedReference when eager's references come from a record (RecordedContext)

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


def first_bad_position(case: Case, got: np.ndarray, want: np.ndarray, tol: Tolerance) -> int | None:
    """The lowest token position (past + index in the call, a row's left padding not counted) whose (B, T, V)
    logits differ beyond ``tol`` on a real row; reduced one row of T at a time (no float64 copy of the whole)."""
    rows = case.real_rows()
    pads = list(case.pad) + [0] * (case.batch - len(case.pad))
    first = None
    for b in range(got.shape[0]):
        for t in range(got.shape[1]):
            if not rows[b, t] or (first is not None and case.past + t - int(pads[b]) >= first):
                continue
            g, w = got[b, t].astype(np.float64), want[b, t].astype(np.float64)
            if (np.abs(g - w) > tol.atol + tol.rtol * np.abs(w)).any():
                first = case.past + t - int(pads[b])
                break
    return first
