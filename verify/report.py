"""The verify report as typed records (:class:`VerifyReport` and the records it holds, on
:mod:`mhaexport.artifact.record`'s machinery, the manifest's): built in one place (:func:`build_report`), its
verdict and counts (one definition of a counted check: :meth:`VerifyReport.outcomes`), report.json
(schema-versioned; read back into the same types, every field typed before anything uses it), loading and merging
across machines. report.md's text is rendered from it by :mod:`mhaexport.verify.render`, the JUnit file by
:mod:`mhaexport.verify.junit`."""

from __future__ import annotations

import dataclasses
import re
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from mhaexport.artifact import read_json, schema
from mhaexport.artifact.details import Details, OnnxDetails, Quantization, TorchScriptDetails
from mhaexport.artifact.manifest import contract_dict
from mhaexport.artifact.record import Environment, Record
from mhaexport.artifact.source import Source
from mhaexport.core.env import environment, tool_versions
from mhaexport.core.errors import ArtifactError
from mhaexport.runtime.feed import Feed
from mhaexport.verify.lint import LintReport
from mhaexport.verify.memory import MemoryInfo
from mhaexport.verify.results import ALL_CHECKS, CHECKS, MODULE_CHECKS, CheckResult, CrossResult

if TYPE_CHECKING:
    from mhaexport.artifact import ExportFolder
    from mhaexport.verify.compare import Tolerance

KIND, VERSION, READABLE = "verify.report", 2, (1, 2)
REPORT_SCHEMA = schema.tag(KIND, VERSION)

# Exit codes of verify (and of every verb that verifies): docs/DESIGN.md "Verdicts"; a refused folder is bad input
EXIT_PASSED, EXIT_FAILED, EXIT_REFUSED, EXIT_NOT_VERIFIED = 0, 1, 2, 4


@dataclass
class Verdict(Record):
    """What a report amounts to: ``code`` is the exit code (0 passed, 1 failed, 4 not verified), ``message`` one
    line saying why."""

    status: str  # "passed" | "failed" | "not verified" | "refused"
    code: int = field(metadata={"key": "exit_code"})
    message: str

    def __bool__(self) -> bool:
        return self.code == EXIT_PASSED


@dataclass
class RuntimeInfo(Record):
    """One runtime as verify met it: which providers the session really used, or why it was skipped."""

    name: str
    status: Literal["ran", "skipped", "error"]
    reason: str = ""
    providers: list[str] = field(default_factory=list)
    artifact: str | None = None
    calls: int = 0
    seconds: float = 0.0
    host: str = ""
    self_tolerance: str | None = None  # a lossy artifact's tolerance for comparing it with itself (verify/quality)
    allowance: Allowance | None = None  # the same as bounds, with the rule that set them (report.html draws them)
    # {order: calls} of the planned calls (runners/plan.py): "block by block" (each layer's weights read once per
    # check) or "call by call"; empty: none planned
    order: dict[str, int] = field(default_factory=dict)
    order_note: str = ""  # why a runtime asked to run block by block ran call by call

    WRITE_NONE = ("artifact", "self_tolerance")

    def order_text(self) -> str:
        """``eager ran 59 planned calls block by block`` (and how many call by call, and why not block by block),
        or "" where none was planned."""
        parts = [f"{n} planned calls {order}" for order, n in sorted(self.order.items()) if n]
        why = f" (not block by block: {self.order_note})" if self.order_note else ""
        return f"{self.name} ran {' and '.join(parts)}{why}" if parts else ""


def order_line(runtimes: dict[str, RuntimeInfo]) -> str:
    """The order the runtimes ran the checks' planned calls in, one line (report.md, report.html); "" where every
    planned call ran call by call as asked (nothing to say)."""
    if not any((k != "call by call" and n) or info.order_note for info in runtimes.values()
               for k, n in info.order.items()):
        return ""
    return ("; ".join(t for info in runtimes.values() if (t := info.order_text()))
            + " (block by block: every call of a check through a layer before the next layer, each layer's weights "
              "read once per check)")


@dataclass
class Bounds(Record):
    atol: float
    rtol: float


@dataclass
class Allowance(Record):
    """What a lossy artifact's comparisons with itself allowed (:func:`mhaexport.verify.quality.self_tolerance`):
    the logits' and the present outputs' bounds (an element fails past atol + rtol x |value|) and the rule that set
    them, in words."""

    logits: Bounds
    present: Bounds | None = None
    rule: str = ""


@dataclass
class ReportModel(Record):
    """The model verified: the manifest's model record as it was written (its ``config``, hashes, ... kept as read);
    ``spec`` None for a folder refused before it was read."""

    spec: str | None = None
    contract: dict[str, Any] | None = field(default=None, metadata={"parse": lambda v, w: contract_dict(v, w)})
    source: Source | None = None  # how it is rebuilt: the record of its kind (artifact/source.py)
    checkpoint: str | None = None
    fingerprint: str | None = None

    WRITE_NONE = ("spec",)


@dataclass
class Shape(Record):
    """One case of the sweep (``verify.sweep.Case.to_dict``)."""

    batch: int
    seq: int
    past: int
    pad: list[int] = field(default_factory=list)
    seed: int = 0
    name: str | None = None


@dataclass
class Sizes(Record):
    seq: int
    past: int


@dataclass
class SweepInfo(Record):
    """The sweep the checks ran over: its kind and seed, its shapes, the sizes the export was traced at, and the
    generation check's tokens (the decoder's)."""

    kind: str | None = None
    seed: int | None = None
    cases: int | None = None
    shapes: list[Shape] | None = None
    export_sizes: Sizes | None = None
    generation_tokens: int | None = None


@dataclass
class RuntimeTolerance(Record):
    """A runtime's tolerance: its artifact's dtype, the tolerance in words and the logits' bounds (what its parity
    was judged by: report.html draws it)."""

    dtype: str | None = None
    describe: str | None = None
    logits: Bounds | None = None


@dataclass
class ToleranceInfo(Record):
    """The tolerance the checks held the artifacts to: the default, per output kind, per runtime (its dtype's)."""

    atol: float
    rtol: float
    dtype: str | None = None
    per_output: dict[str, Bounds] | None = None
    overridden: bool | None = None
    per_runtime: dict[str, RuntimeTolerance] | None = None


@dataclass
class ArtifactInfo(Record):
    """What the report says of one artifact: its manifest entry's format, file, dtype and axes, and the details that
    say how it was made (opset, TorchScript mode, attention, cache, an adopted file's producer and protocol, the
    block's mask and weights, its quantization)."""

    format: str | None = None
    file: str | None = None
    dtype: str = "float32"
    seq_dynamic: bool = True
    static_sizes: dict[str, Any] | None = None
    opset: int | None = None
    mode: str | None = None
    compile_seconds: float | None = None
    attention: str | None = None
    kv_cache: str | None = None
    producer: str | None = None
    protocol: str | None = None
    quantization: Quantization | None = None
    module: str | None = None
    mask: str | None = None
    weights: str | None = None

    WRITE_NONE = ("static_sizes",)

    @classmethod
    def of(cls, entry) -> ArtifactInfo:
        """The report's view of a manifest entry (:class:`mhaexport.artifact.manifest.ArtifactEntry`)."""
        d: Details = entry.details
        onnx = d if isinstance(d, OnnxDetails) else None
        q = onnx.quantization if onnx else None
        shown = Quantization(**{k: getattr(q, k) for k in _QUANT_SHOWN}) if q else None
        return cls(format=entry.format, file=entry.file, dtype=entry.dtype, seq_dynamic=entry.seq_dynamic,
                   static_sizes=entry.static_sizes, opset=onnx and onnx.opset or None,
                   mode=(d.mode if isinstance(d, TorchScriptDetails) else None) or None,
                   compile_seconds=getattr(d, "compile_seconds", None) or None,
                   attention=onnx and onnx.attention or None, kv_cache=d.cache.kind or None,
                   producer=onnx and onnx.producer or None,
                   protocol=onnx and onnx.layout and Feed.of(entry).protocol or None, quantization=shown,
                   module=d.module or None, mask=d.mask or None, weights=d.weights or None)


# the part of a quantization record the report shows
_QUANT_SHOWN = ("weights", "label", "block_size", "symmetric", "accuracy_level", "keep_float", "int8_blocks",
                "lm_head", "weights_read", "source")


@dataclass
class OtherProtocol(Record):
    """An adopted file whose producer drives it in another protocol, driven in the plain one too: findings, never in
    the verdict, the counts or the main table."""

    protocol: str
    producer_protocol: str
    runtimes: dict[str, RuntimeInfo]
    results: dict[str, dict[str, CheckResult]]

    def __post_init__(self) -> None:
        _name_results(self.results, "other_protocol.results")


def _name_results(results: dict[str, dict[str, CheckResult]], where: str = "results") -> None:
    """Each result read back knows its check, the key it sits under, and holds that check's figures record
    (ArtifactError naming the figure's path when a known figure has the wrong type)."""
    for rt, checks in results.items():
        for name, r in checks.items():
            r.named(name, f"{where}.{rt}.{name}.figures")


def here(**more: Any) -> Environment:
    """This machine, now (:func:`mhaexport.core.env.environment`), with a verb's own keys (``more``)."""
    return Environment.from_dict({**environment(), **more}, "environment")


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


@dataclass
class VerifyReport(Record):
    """Status and figures per runtime x check, plus what was verified, where, and with which tolerances."""

    model: ReportModel
    folder: str
    sweep: SweepInfo
    tolerance: ToleranceInfo
    runtimes: dict[str, RuntimeInfo]
    results: dict[str, dict[str, CheckResult]]
    environment: Environment = field(default_factory=lambda: here())
    versions: dict[str, Any] = field(default_factory=dict)
    artifacts: dict[str, ArtifactInfo] = field(default_factory=dict)
    created: str = field(default_factory=_now)
    seconds: float = 0.0
    sources: list[str] = field(default_factory=list)  # merged reports: where each came from
    requested: list[str] | None = None  # the runtimes asked for by name; None: the defaults
    checks: list[str] = field(default_factory=list)  # the checks run (empty: every check of its kind)
    lint: LintReport | None = None  # the ONNX artifact's lint (verify lints it first); None: no ONNX
    cross: list[CrossResult] = field(default_factory=list)  # provider vs provider (ort-cuda vs ort-cpu), both ran
    module: str | None = None  # "attention": the block on its own (--module attention); None: a decoder
    other_protocol: OtherProtocol | None = None
    # why the folder was refused before any check ran (a hash that does not match the manifest, a name leaving the
    # folder, ...): the verdict is "refused", exit 2, and the report says why (CI has a report to show)
    refused: str | None = None
    # where eager's references came from: {"kind": "recorded", "describe", "date", "fingerprint", "made_with",
    # "keeps", "checks": {check: how it was judged}} for a verify from a record; {"kind": "eager", "recorded":
    # {"files", "bytes", "keeps"}} for one that wrote a record (verify --record); None: eager, nothing recorded
    reference: dict[str, Any] | None = None
    memory: MemoryInfo | None = None  # the memory plan (cap, mode and why) and the run's peak RSS

    # written, never read back: the verdict and counts follow from the records
    DERIVED = ("schema", "passed", "verdict", "counts")
    WRITE_NONE = ("requested", "module", "lint", "refused", "other_protocol", "reference")
    KEY_ORDER = ("schema", "created", "passed", "verdict", "counts", "requested", "checks", "module", "lint", "cross",
                 "environment", "versions", "model", "folder", "artifacts", "sweep", "tolerance", "seconds",
                 "sources", "runtimes", "results", "refused", "other_protocol", "reference", "memory")

    schema = REPORT_SCHEMA

    def __post_init__(self) -> None:
        if not self.checks:
            self.checks = list(MODULE_CHECKS if self.module else CHECKS)
        _name_results(self.results)

    @property
    def all_checks(self) -> tuple[str, ...]:
        """Every check of this kind of export, in the table's column order: the decoder's or the module's."""
        if self.module:
            return MODULE_CHECKS
        return tuple(c for c in ALL_CHECKS if c in CHECKS or c in self.checks)  # quality: when it ran (lossy)

    def outcomes(self) -> list[tuple[str, CheckResult]]:
        """Every counted check, once: (row, result) with status True passed, False failed, None skipped — what the
        counts, the verdict, the summary line, report.md and the JUnit file all count. In order: lint's errors (row
        "lint"); per runtime, each check that ran and is a check (:attr:`CheckResult.counted`: eager's parity
        against itself is none), or, for a runtime that did not run, each check asked for, skipped with its reason
        (one that could not load its artifact first fails "load"); then provider against provider (row "a~b").
        The plain protocol's findings are not counted; a refused folder has none."""
        if self.refused is not None:
            return []
        out = [("lint", CheckResult(f.rule, False, {}, f"{f.node}: {f.message}"))
               for f in (self.lint.errors if self.lint else [])]
        asked = [c for c in self.all_checks if c in self.checks]
        for rt, info in self.runtimes.items():
            if info.status == "ran":
                out += [(rt, r) for r in self.results.get(rt, {}).values() if r.counted]
                continue
            if info.status == "error":
                out.append((rt, CheckResult("load", False, {}, info.reason)))
            why = f"{rt} skipped: {info.reason}" if info.status == "skipped" else f"not run: {rt} could not load"
            out += [(rt, CheckResult(c, None, {}, why)) for c in asked]
        return out + [(c.row, c.as_check()) for c in self.cross]

    @property
    def counts(self) -> dict[str, int]:
        """Counted checks (:meth:`outcomes`) passed / failed / skipped."""
        flat = [r.status for _, r in self.outcomes()]
        return {"passed": flat.count(True), "failed": flat.count(False), "skipped": flat.count(None)}

    def result(self, runtime: str, check: str) -> CheckResult | None:
        """``runtime``'s result in ``check``, None when it has none (not run, not one of its checks)."""
        return self.results[runtime][check] if check in self.results.get(runtime, {}) else None

    def judged_by(self, runtime: str) -> tuple[Bounds, str]:
        """The logits' bounds ``runtime``'s comparisons were held to (an element fails past atol + rtol x |value|:
        parity, causality, kv-consistency, padding, a generation step's tie) and whose rule they are: a lossy
        artifact's allowance (its rule), else its dtype's tolerance, else the run's."""
        info = self.runtimes.get(runtime)
        if info is not None and info.allowance is not None:
            return info.allowance.logits, info.allowance.rule
        if info is not None and info.self_tolerance:  # a report written before the allowance was recorded
            own = re.search(r"logits: atol=(\d[0-9.e+-]*) rtol=(\d[0-9.e+-]*)", info.self_tolerance)
            try:
                return Bounds(float(own[1]), float(own[2])), "lossy, compared with itself"
            except (TypeError, ValueError):  # no such figures in it: the dtype's below
                pass
        tol = self.tolerance
        own = (tol.per_runtime or {}).get(runtime)
        overridden = " as given" if tol.overridden else ""
        if own is not None and own.logits is not None:
            return own.logits, f"{own.dtype or 'its dtype'}'s tolerance{overridden}"
        per = (tol.per_output or {}).get("logits")
        return per or Bounds(tol.atol, tol.rtol), f"{tol.dtype or 'the run'}'s tolerance{overridden}"

    def judged_groups(self) -> list[tuple[list[str], Bounds, str]]:
        """:meth:`judged_by` of every runtime that ran a check, those held to the same bounds by the same rule as one
        group: (runtimes, bounds, rule) in the runtimes' order."""
        groups: dict[tuple, tuple[list[str], Bounds, str]] = {}
        for rt, info in self.runtimes.items():
            if info.status == "ran" and self.results.get(rt):
                b, whose = self.judged_by(rt)
                groups.setdefault((b.atol, b.rtol, whose), ([], b, whose))[0].append(rt)
        return list(groups.values())

    def failures(self) -> list[tuple[str, CheckResult]]:
        """The failed outcomes: (row, check) pairs (a runtime that could not load its artifact: its "load")."""
        return [(row, r) for row, r in self.outcomes() if r.status is False]

    @property
    def verdict(self) -> Verdict:
        """docs/DESIGN.md's rules: failed (1) when a check failed or a runtime could not load its artifact; not
        verified (4) when a runtime asked for by name was skipped entirely, or no runtime besides eager ran; else
        passed (0). Skipped is never passed. A folder refused before any check: refused (2)."""
        if self.refused is not None:
            return Verdict("refused", EXIT_REFUSED, self.refused)
        fails = self.failures()
        if fails:
            which = ", ".join(f"{rt}/{r.check}" for rt, r in fails)
            return Verdict("failed", EXIT_FAILED, f"{len(fails)} check(s) failed: {which}")
        from mhaexport.runners.names import REFERENCE_RUNTIMES  # eager, torch-mha: they verify no artifact

        ran = [rt for rt, info in self.runtimes.items()
               if info.status == "ran" and rt.split("@")[0] not in REFERENCE_RUNTIMES]
        asked = [rt for rt in (self.requested or []) if rt not in REFERENCE_RUNTIMES]
        missing = [rt for rt in asked if rt in self.runtimes and self.runtimes[rt].status == "skipped"]
        if missing:
            why = "; ".join(f"{rt} skipped ({self.runtimes[rt].reason})" for rt in missing)
            lead = "nothing requested was verified" if not any(rt in ran for rt in asked) else \
                "not verified as requested"
            return Verdict("not verified", EXIT_NOT_VERIFIED, f"{lead}: {why}")
        if not ran:
            skipped = "; ".join(f"{rt} skipped ({info.reason})" for rt, info in self.runtimes.items()
                                if info.status == "skipped")
            refs = " and ".join(rt for rt in REFERENCE_RUNTIMES if rt in self.runtimes) or "eager"
            return Verdict("not verified", EXIT_NOT_VERIFIED,
                           f"nothing was verified: no runtime besides {refs} ran ({skipped or 'none requested'})")
        c = self.counts
        off = [rt for rt, info in self.runtimes.items() if info.status == "skipped"]
        also = f"; runtime(s) skipped: {', '.join(off)}" if off else ""
        skipped = f", {c['skipped']} skipped" if c["skipped"] else ""
        return Verdict("passed", EXIT_PASSED, f"{c['passed']} passed{skipped}{also}")

    @property
    def passed(self) -> bool:
        return bool(self.verdict)

    def __bool__(self) -> bool:
        """True only when the verdict passed (exit 0): a failed check and a runtime asked for that was skipped are
        both False (the Python API returns the report: ``if not mhaexport.verify(folder): ...``)."""
        return self.passed

    @property
    def subset(self) -> bool:
        """True when runtimes were named or checks left out: such a report does not replace the full report."""
        from mhaexport.runners.names import DEFAULT_RUNTIMES, MODULE_RUNTIMES

        default = MODULE_RUNTIMES if self.module else DEFAULT_RUNTIMES
        named = self.requested is not None and set(self.requested) != set(default)
        return named or not set(self.all_checks) <= set(self.checks)

    def default_name(self) -> str:
        """"report" for a full run; "report-ort-cuda+torchscript" (the runtimes asked for) for a subset run."""
        if not self.subset:
            return "report"
        part = "+".join(self.requested) if self.requested else "checks-" + "+".join(self.checks)
        return f"report-{part}"

    # --- JSON ----------------------------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, data: dict, what: str = "verify report") -> VerifyReport:
        """A report.json read back (schema /1 or /2): ArtifactError naming ``what`` and the first field whose type
        is not what the records hold, before anything reads it."""
        schema.version_of(data, KIND, READABLE, what)
        try:
            return super().from_dict(data, "")
        except ArtifactError as e:
            raise ArtifactError(f"{what}: field {e}") from None


def refused_report(folder: str | Path, reason: str, requested: list[str] | None = None, sweep: str = "quick",
                   seed: int = 0) -> VerifyReport:
    """The report of a folder refused before any check ran (``reason``: the refusal's one line): verdict "refused",
    exit 2, no runtime run; written like any report so CI shows why."""
    return VerifyReport(model=ReportModel(), folder=str(folder), sweep=SweepInfo(kind=sweep, seed=seed),
                        tolerance=ToleranceInfo(0.0, 0.0), runtimes={}, results={}, requested=requested,
                        refused=reason)


def build_report(ef: ExportFolder, *, sweep: str, seed: int, cases: list, tol: Tolerance, atol, rtol,
                 runners: list, infos: dict[str, RuntimeInfo], results: dict[str, dict[str, CheckResult]],
                 checks: tuple[str, ...], requested: tuple[str, ...] | None, threads: int | None, started: float,
                 export_sizes: tuple[int, int], dtype: str = "float32", generation_tokens: int | None = None,
                 module: str | None = None, lint: LintReport | None = None, cross: list[CrossResult] = (),
                 other: OtherProtocol | None = None, memory: MemoryInfo | None = None) -> VerifyReport:
    """The report of one verify run, the decoder's and the attention block's alike (``module``): the folder's model
    and artifacts (:meth:`ArtifactInfo.of`), the sweep (``cases`` at ``seed``), the tolerance ``tol`` (``atol``/
    ``rtol`` as given; each runner's own for its dtype), what each runtime did (``infos``, ``results``), the lint,
    provider against provider and the plain protocol's findings; ``started``: ``time.perf_counter()`` at the start."""
    from mhaexport.verify.compare import Tolerance

    return VerifyReport(
        model=ReportModel.from_dict(ef.model.to_dict(), "model"), folder=str(ef.path), module=module,
        sweep=SweepInfo(kind=sweep, seed=seed, cases=len(cases),
                        shapes=[Shape.from_dict(cs.to_dict(), "shape") for cs in cases],
                        export_sizes=Sizes(*export_sizes), generation_tokens=generation_tokens),
        tolerance=ToleranceInfo(tol.atol, tol.rtol, dtype=dtype,
                                per_output={k: Bounds(a, r) for k, a, r in tol.per_output},
                                overridden=atol is not None or rtol is not None,
                                per_runtime={r.name: _runtime_tolerance(Tolerance.for_dtype(r.dtype, atol, rtol),
                                                                        r.dtype) for r in runners}),
        runtimes=infos, results=results, versions=tool_versions(),
        artifacts={k: ArtifactInfo.of(v) for k, v in ef.artifacts.items()},
        requested=list(requested) if requested else None, checks=list(checks), lint=lint, cross=list(cross),
        other_protocol=other, environment=here(torch_threads=threads), memory=memory,
        seconds=round(time.perf_counter() - started, 2))


def _runtime_tolerance(tol, dtype: str) -> RuntimeTolerance:
    logits = tol.for_output("logits")
    return RuntimeTolerance(dtype, tol.describe(), Bounds(logits.atol, logits.rtol))


# the largest report.json read back (a full sweep's report of a large model is ~1 MB)
MAX_REPORT_BYTES = 16 << 20


def read_report_in(folder: str | Path, name: str = "report.json") -> VerifyReport | None:
    """The verify report ``folder/name`` (an output folder's file: input like any other), read by the confined reader
    (no link followed, a regular file of at most :data:`MAX_REPORT_BYTES`), strictly parsed and typed as a record;
    None where there is none. MhaExportError (exit 2) naming the file for anything else."""
    from mhaexport.artifact.confine import MissingFile, read_inside
    from mhaexport.core.untrusted import load_json

    where = str(Path(folder) / name)
    try:
        raw = read_inside(folder, name, where, MAX_REPORT_BYTES)
    except MissingFile:
        return None
    return VerifyReport.from_dict(load_json(raw, where), what=f"report {where}")


def load_report(path: str | Path) -> VerifyReport:
    """A verify report: ``path`` a report.json the user named, or a folder whose report.json is read confined
    (:func:`read_report_in`)."""
    path = Path(path)
    if path.is_dir():
        report = read_report_in(path)
        if report is None:
            raise ArtifactError(f"report {path / 'report.json'} does not exist")
        return report
    return VerifyReport.from_dict(read_json(path, "report"), what=f"report {path}")


def merge_reports(reports: list[VerifyReport], names: list[str] | None = None) -> VerifyReport:
    """One table from reports made on different machines (e.g. a CPU job and a GPU job) for the same model.

    Rows are runtimes labelled by host; a runtime skipped on one machine but run on another keeps only the run.
    """
    if not reports:
        raise ArtifactError("report merge needs at least one report")
    for r in reports:
        if r.refused is not None:
            raise ArtifactError(f"report merge: the report of {r.folder} verified nothing (the folder was refused: "
                                f"{r.refused})")
    fps = {r.model.fingerprint or r.model.spec for r in reports}
    if len(fps) > 1:
        specs = ", ".join(sorted({str(r.model.spec) for r in reports}))
        raise ArtifactError(f"report merge: the reports verify different models ({specs})")
    names = list(names or [r.environment.host or f"report{i}" for i, r in enumerate(reports)])
    for i, name in enumerate(names):  # two reports from one host must not overwrite each other's rows
        if names[:i].count(name):
            names[i] = f"{name}#{names[:i].count(name) + 1}"
    runtimes: dict[str, RuntimeInfo] = {}
    results: dict[str, dict[str, CheckResult]] = {}
    ran_somewhere = {rt for r in reports for rt, info in r.runtimes.items() if info.status != "skipped"}
    for host, r in zip(names, reports):
        for rt, info in r.runtimes.items():
            if info.status == "skipped" and rt in ran_somewhere:
                continue
            key = f"{rt}@{host}"
            runtimes[key] = dataclasses.replace(info, host=host)
            results[key] = r.results.get(rt, {})
    first = reports[0]
    every = MODULE_CHECKS if first.module else ALL_CHECKS
    checks = [c for c in every if any(c in r.checks for r in reports)]
    merged = VerifyReport(model=first.model, folder=first.folder, sweep=first.sweep, tolerance=first.tolerance,
                          module=first.module, checks=checks,
                          runtimes=runtimes, results=results, versions=first.versions,
                          artifacts=first.artifacts, seconds=round(sum(r.seconds for r in reports), 2),
                          sources=[f"{n}: {r.environment.platform or '?'} ({r.created})"
                                   for n, r in zip(names, reports)])
    return merged
