"""The verify report as data (:class:`VerifyReport`): its verdict, report.json (schema-versioned), loading and
merging across machines. report.md's text is rendered from it by :mod:`mhaexport.verify.render`."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from mhaexport.artifact import atomic_write_bytes, atomic_write_json, ensure_writable_dir, read_json, schema
from mhaexport.env import environment
from mhaexport.errors import ArtifactError
from mhaexport.verify.render import markdown
from mhaexport.verify.results import ALL_CHECKS, CHECKS, MODULE_CHECKS, CheckResult

KIND, VERSION, READABLE = "verify.report", 2, (1, 2)
REPORT_SCHEMA = schema.tag(KIND, VERSION)

# ---- reading a report back: every field typed before anything uses it (report merge reads other machines' files)

_JSON_TYPES = {dict: "an object", list: "an array", str: "a string", bool: "a boolean", int: "a number",
               float: "a number", type(None): "null"}


class _Field:
    """Type checks of one report read back: ArtifactError naming ``what`` (the file), the field's path and what it
    holds instead."""

    def __init__(self, what: str) -> None:
        self.what = what

    def fail(self, path: str, value: object, expected: str) -> None:
        shown = repr(value) if isinstance(value, (str, int, float, bool)) else _JSON_TYPES.get(type(value), "?")
        if len(shown) > 40:
            shown = shown[:37] + "..."
        raise ArtifactError(f"{self.what}: field {path} is {shown}, expected {expected}")

    def obj(self, path: str, value: object, optional: bool = False) -> dict:
        if not isinstance(value, dict) and not (optional and value is None):
            self.fail(path, value, "an object")
        return value or {}

    def strs(self, path: str, value: object, optional: bool = False) -> None:
        if optional and value is None:
            return
        if not isinstance(value, list):
            self.fail(path, value, "an array of strings")
        for i, v in enumerate(value):
            if not isinstance(v, str):
                self.fail(f"{path}[{i}]", v, "a string")

    def is_a(self, path: str, value: object, types: tuple[type, ...], expected: str) -> None:
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            self.fail(path, value, expected)

    def runtimes(self, path: str, value: object) -> None:
        known = set(RuntimeInfo.__dataclass_fields__)
        for rt, info in self.obj(path, value).items():
            where = f"{path}.{rt}"
            info = self.obj(where, info)
            extra = sorted(set(info) - known)
            if extra:
                self.fail(f"{where}.{extra[0]}", info[extra[0]], f"no such field (fields: {', '.join(known)})")
            for name in ("name", "status"):
                if name not in info:
                    self.fail(f"{where}.{name}", None, "a string (missing)")
            self.is_a(f"{where}.name", info["name"], (str,), "a string")
            if info["status"] not in ("ran", "skipped", "error"):
                self.fail(f"{where}.status", info["status"], '"ran", "skipped" or "error"')
            for name in ("reason", "host"):
                self.is_a(f"{where}.{name}", info.get(name, ""), (str,), "a string")
            for name in ("artifact", "self_tolerance"):
                self.is_a(f"{where}.{name}", info.get(name), (str, type(None)), "a string or null")
            self.strs(f"{where}.providers", info.get("providers", []))
            self.is_a(f"{where}.calls", info.get("calls", 0), (int,), "an integer")
            self.is_a(f"{where}.seconds", info.get("seconds", 0.0), (int, float), "a number")

    def results(self, path: str, value: object) -> None:
        for rt, checks in self.obj(path, value).items():
            for check, r in self.obj(f"{path}.{rt}", checks).items():
                self.check_result(f"{path}.{rt}.{check}", r)

    def check_result(self, where: str, r: object) -> None:
        r = self.obj(where, r)
        if r.get("status", "missing") not in (True, False, None):
            self.fail(f"{where}.status", r.get("status", "missing"), "true, false or null")
        self.obj(f"{where}.figures", r.get("figures", {}))
        self.is_a(f"{where}.message", r.get("message", ""), (str,), "a string")


def check_report_fields(data: dict, what: str = "verify report") -> None:
    """ArtifactError naming ``what`` and the first field of a report.json (already of the right schema) whose type
    is not what :class:`VerifyReport` holds, before anything reads it."""
    f = _Field(what)
    for name in ("model", "sweep", "tolerance", "runtimes", "results"):
        if name not in data:
            f.fail(name, None, "an object (missing)")
    model = f.obj("model", data["model"])
    for name in ("spec", "fingerprint", "checkpoint"):
        f.is_a(f"model.{name}", model.get(name), (str, type(None)), "a string or null")
    for name in ("source", "contract"):
        f.obj(f"model.{name}", model.get(name), optional=True)
    f.is_a("folder", data.get("folder"), (str,), "a string")
    f.obj("sweep", data["sweep"])
    tol = f.obj("tolerance", data["tolerance"])
    for name in ("atol", "rtol"):
        f.is_a(f"tolerance.{name}", tol.get(name), (int, float), "a number")
    for out, t in f.obj("tolerance.per_output", tol.get("per_output"), optional=True).items():
        for name in ("atol", "rtol"):
            f.is_a(f"tolerance.per_output.{out}.{name}", f.obj(f"tolerance.per_output.{out}", t).get(name),
                   (int, float), "a number")
    f.runtimes("runtimes", data["runtimes"])
    f.results("results", data["results"])
    for name in ("environment", "versions", "artifacts"):
        f.obj(name, data.get(name, {}))
    for art, entry in (data.get("artifacts") or {}).items():
        entry = f.obj(f"artifacts.{art}", entry)
        f.is_a(f"artifacts.{art}.dtype", entry.get("dtype", ""), (str,), "a string")
        for name in ("mode", "producer", "protocol", "attention"):
            f.is_a(f"artifacts.{art}.{name}", entry.get(name), (str, type(None)), "a string or null")
        f.is_a(f"artifacts.{art}.opset", entry.get("opset"), (int, type(None)), "an integer or null")
        for name in ("quantization", "static_sizes"):
            f.obj(f"artifacts.{art}.{name}", entry.get(name), optional=True)
    f.is_a("created", data.get("created", ""), (str,), "a string")
    f.is_a("seconds", data.get("seconds", 0.0), (int, float), "a number")
    f.strs("sources", data.get("sources", []))
    f.strs("requested", data.get("requested"), optional=True)
    f.strs("checks", data.get("checks"), optional=True)
    f.is_a("module", data.get("module"), (str, type(None)), "a string or null")
    f.is_a("refused", data.get("refused"), (str, type(None)), "a string or null")
    lint = f.obj("lint", data.get("lint"), optional=True)
    f.strs("lint.rules", lint.get("rules", []))
    if not isinstance(lint.get("findings", []), list):
        f.fail("lint.findings", lint["findings"], "an array")
    from mhaexport.verify.lint import SEVERITIES

    for i, finding in enumerate(lint.get("findings", [])):
        where = f"lint.findings[{i}]"
        finding = f.obj(where, finding)
        fields = ("severity", "rule", "node", "message", "fix")
        if extra := sorted(set(finding) - set(fields)):
            f.fail(f"{where}.{extra[0]}", finding[extra[0]], f"no such field (fields: {', '.join(fields)})")
        for name in fields:
            f.is_a(f"{where}.{name}", finding.get(name), (str,), "a string")
        if finding["severity"] not in SEVERITIES:
            f.fail(f"{where}.severity", finding["severity"], " or ".join(SEVERITIES))
    cross = data.get("cross") or []
    if not isinstance(cross, list):
        f.fail("cross", cross, "an array")
    for i, c in enumerate(cross):
        c = f.obj(f"cross[{i}]", c)
        for name in ("a", "b", "message"):
            f.is_a(f"cross[{i}].{name}", c.get(name), (str,), "a string")
        f.check_result(f"cross[{i}]", c)
        f.obj(f"cross[{i}].figures", c.get("figures"))
    other = f.obj("other_protocol", data.get("other_protocol"), optional=True)
    if other:
        for name in ("protocol", "producer_protocol"):
            f.is_a(f"other_protocol.{name}", other.get(name), (str,), "a string")
        f.runtimes("other_protocol.runtimes", other.get("runtimes"))
        f.results("other_protocol.results", other.get("results"))


def _results_from_dict(data: dict) -> dict[str, dict[str, CheckResult]]:
    return {rt: {c: CheckResult(c, r["status"], r.get("figures", {}), r.get("message", ""))
                 for c, r in checks.items()} for rt, checks in data.items()}


def _other_from_dict(data: dict | None) -> dict | None:
    if not data:
        return None
    return {**data, "runtimes": {k: RuntimeInfo(**v) for k, v in data["runtimes"].items()},
            "results": _results_from_dict(data["results"])}


# Exit codes of verify (and of every verb that verifies): docs/DESIGN.md "Verdicts"; a refused folder is bad input
EXIT_PASSED, EXIT_FAILED, EXIT_REFUSED, EXIT_NOT_VERIFIED = 0, 1, 2, 4


@dataclass(frozen=True)
class Verdict:
    """What a report amounts to: ``code`` is the exit code (0 passed, 1 failed, 4 not verified), ``message`` one
    line saying why."""

    status: str  # "passed" | "failed" | "not verified" | "refused"
    code: int
    message: str

    def __bool__(self) -> bool:
        return self.code == EXIT_PASSED


@dataclass
class RuntimeInfo:
    """One runtime as verify met it: which providers the session really used, or why it was skipped."""

    name: str
    status: str  # "ran" | "skipped" | "error"
    reason: str = ""
    providers: list[str] = field(default_factory=list)
    artifact: str | None = None
    calls: int = 0
    seconds: float = 0.0
    host: str = ""
    self_tolerance: str | None = None  # a lossy artifact's tolerance for comparing it with itself (verify/quality)

    def to_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass
class VerifyReport:
    """Status and figures per runtime x check, plus what was verified, where, and with which tolerances."""

    model: dict
    folder: str
    sweep: dict
    tolerance: dict
    runtimes: dict[str, RuntimeInfo]
    results: dict[str, dict[str, CheckResult]]
    environment: dict = field(default_factory=environment)
    versions: dict = field(default_factory=dict)
    artifacts: dict = field(default_factory=dict)
    created: str = field(default_factory=lambda: datetime.now(timezone.utc).isoformat(timespec="seconds"))
    seconds: float = 0.0
    sources: list[str] = field(default_factory=list)  # merged reports: where each came from
    requested: list[str] | None = None  # the runtimes asked for by name; None: the defaults
    checks: list[str] = field(default_factory=lambda: list(CHECKS))
    lint: dict | None = None  # LintReport.to_dict() of the ONNX artifact (verify lints it first); None: no ONNX
    cross: list[dict] = field(default_factory=list)  # provider vs provider (ort-cuda vs ort-cpu), when both ran
    module: str | None = None  # "attention": the block on its own (--module attention); None: a decoder
    # an adopted file whose producer drives it in another protocol, driven in the plain one too: {"protocol",
    # "producer_protocol", "runtimes": {name: RuntimeInfo}, "results": {name: {check: CheckResult}}}. Findings:
    # never in the verdict, the counts or the main table
    other_protocol: dict | None = None
    # why the folder was refused before any check ran (a hash that does not match the manifest, a name leaving the
    # folder, ...): the verdict is "refused", exit 2, and the report says why (CI has a report to show)
    refused: str | None = None

    @property
    def all_checks(self) -> tuple[str, ...]:
        """Every check of this kind of export, in the table's column order: the decoder's or the module's."""
        if self.module:
            return MODULE_CHECKS
        return tuple(c for c in ALL_CHECKS if c in CHECKS or c in self.checks)  # quality: when it ran (lossy)

    @property
    def counts(self) -> dict[str, int]:
        """Checks passed / failed / skipped; a runtime that could not load its artifact counts as one failure."""
        flat = [r.status for checks in self.results.values() for r in checks.values()]
        errors = sum(1 for info in self.runtimes.values() if info.status == "error")
        return {"passed": flat.count(True), "failed": flat.count(False) + errors, "skipped": flat.count(None)}

    def failures(self) -> list[tuple[str, CheckResult]]:
        """(runtime, failed check) pairs; a runtime that could not load its artifact is one ("load", reason)."""
        out = [(rt, CheckResult("load", False, {}, info.reason)) for rt, info in self.runtimes.items()
               if info.status == "error"]
        lint = [("lint", CheckResult(f["rule"], False, {}, f"{f['node']}: {f['message']}"))
                for f in (self.lint or {}).get("findings", []) if f["severity"] == "error"]
        cross = [(f"{c['a']}~{c['b']}", CheckResult("cross-provider", False, c["figures"], c["message"]))
                 for c in self.cross if c["status"] is False]
        return lint + out + [(rt, r) for rt, checks in self.results.items() for r in checks.values()
                             if r.status is False] + cross

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
        from mhaexport.verify.runners import REFERENCE_RUNTIMES  # eager, torch-mha: they verify no artifact

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
        return Verdict("passed", EXIT_PASSED,
                       f"{c['passed']} passed, {c['skipped']} skipped{also} (skipped is not passed)")

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
        from mhaexport.verify.runners import DEFAULT_RUNTIMES, MODULE_RUNTIMES

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
    def to_dict(self) -> dict:
        v = self.verdict
        return {
            "schema": REPORT_SCHEMA, "created": self.created, "passed": self.passed,
            "verdict": {"status": v.status, "exit_code": v.code, "message": v.message}, "counts": self.counts,
            "requested": self.requested, "checks": self.checks, "module": self.module, "lint": self.lint,
            "cross": self.cross,
            "environment": self.environment, "versions": self.versions, "model": self.model,
            "folder": self.folder, "artifacts": self.artifacts, "sweep": self.sweep, "tolerance": self.tolerance,
            "seconds": round(self.seconds, 2), "sources": self.sources,
            "runtimes": {k: v.to_dict() for k, v in self.runtimes.items()},
            "results": {rt: {c: r.to_dict() for c, r in checks.items()} for rt, checks in self.results.items()},
            "refused": self.refused,
            "other_protocol": None if self.other_protocol is None else {
                **self.other_protocol, "runtimes": {k: v.to_dict() for k, v in self.other_protocol["runtimes"].items()},
                "results": {rt: {c: r.to_dict() for c, r in checks.items()}
                            for rt, checks in self.other_protocol["results"].items()}},
        }

    @classmethod
    def from_dict(cls, data: dict, what: str = "verify report") -> VerifyReport:
        schema.version_of(data, KIND, READABLE, what)
        check_report_fields(data, what)
        return cls(
            model=data["model"], folder=data["folder"], sweep=data["sweep"], tolerance=data["tolerance"],
            runtimes={k: RuntimeInfo(**v) for k, v in data["runtimes"].items()},
            results=_results_from_dict(data["results"]),
            environment=data.get("environment", {}), versions=data.get("versions", {}),
            artifacts=data.get("artifacts", {}), created=data.get("created", ""),
            seconds=data.get("seconds", 0.0), sources=data.get("sources", []), requested=data.get("requested"),
            checks=data.get("checks") or list(MODULE_CHECKS if data.get("module") else CHECKS), lint=data.get("lint"),
            cross=data.get("cross") or [], module=data.get("module"),
            other_protocol=_other_from_dict(data.get("other_protocol")), refused=data.get("refused"))

    def write(self, folder: str | Path, name: str | None = None) -> tuple[Path, Path]:
        """Write NAME.json and NAME.md into folder (atomically); ``name`` defaults to :meth:`default_name`, so a
        subset run never overwrites the full report. Returns both paths."""
        folder = ensure_writable_dir(folder)
        name = name or self.default_name()
        atomic_write_json(folder / f"{name}.json", self.to_dict())
        text = self.to_markdown()
        old = folder / f"{name}.md"
        if old.is_file():  # keep sections other commands own, delimited <!-- name --> ... <!-- /name --> (bench)
            blocks = re.finditer(r"<!-- ([\w-]+) -->.*?<!-- /\1 -->", old.read_text(errors="replace"), re.S)
            text += "".join(f"\n{m.group(0)}\n" for m in blocks)
        atomic_write_bytes(folder / f"{name}.md", text.encode())
        return folder / f"{name}.json", folder / f"{name}.md"

    # --- Markdown (verify/render.py) ------------------------------------------------------------------------
    def to_markdown(self) -> str:
        """report.md's text (:func:`mhaexport.verify.render.markdown`)."""
        return markdown(self)


def refused_report(folder: str | Path, reason: str, requested: list[str] | None = None, sweep: str = "quick",
                   seed: int = 0) -> VerifyReport:
    """The report of a folder refused before any check ran (``reason``: the refusal's one line): verdict "refused",
    exit 2, no runtime run; written like any report so CI shows why."""
    return VerifyReport(model={"spec": None}, folder=str(folder), sweep={"name": sweep, "seed": seed},
                        tolerance={"atol": 0.0, "rtol": 0.0}, runtimes={}, results={}, requested=requested,
                        refused=reason)


def load_report(path: str | Path) -> VerifyReport:
    path = Path(path)
    if path.is_dir():
        path = path / "report.json"
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
    fps = {r.model.get("fingerprint") or r.model.get("spec") for r in reports}
    if len(fps) > 1:
        specs = ", ".join(sorted({str(r.model.get("spec")) for r in reports}))
        raise ArtifactError(f"report merge: the reports verify different models ({specs})")
    names = list(names or [r.environment.get("host", f"report{i}") for i, r in enumerate(reports)])
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
            runtimes[key] = RuntimeInfo(**{**info.to_dict(), "host": host})
            results[key] = r.results.get(rt, {})
    first = reports[0]
    every = MODULE_CHECKS if first.module else ALL_CHECKS
    checks = [c for c in every if any(c in r.checks for r in reports)]
    merged = VerifyReport(model=first.model, folder=first.folder, sweep=first.sweep, tolerance=first.tolerance,
                          module=first.module, checks=checks,
                          runtimes=runtimes, results=results, environment=environment(), versions=first.versions,
                          artifacts=first.artifacts, seconds=sum(r.seconds for r in reports),
                          sources=[f"{n}: {r.environment.get('platform', '?')} ({r.created})"
                                   for n, r in zip(names, reports)])
    return merged
