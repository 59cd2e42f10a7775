"""The verify report as data (:class:`VerifyReport`), written as report.json (schema-versioned) and report.md
(a runtimes x checks table that reads as a CI job summary), and merged across machines."""

from __future__ import annotations

import json
import os
import platform
import re
import socket
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from mhaexport.errors import ArtifactError
from mhaexport.exporter.manifest import model_fingerprint
from mhaexport.verify.checks import CHECKS, CheckResult

REPORT_SCHEMA = "mhaexport.verify.report/1"
ICONS = {True: "✅", False: "❌", None: "⏭"}


def environment() -> dict:
    """Where the report was made: host label, OS, CPU count, Python."""
    return {"host": os.environ.get("MHAEXPORT_HOST_LABEL") or socket.gethostname(),
            "platform": platform.platform(), "machine": platform.machine(), "cpus": os.cpu_count(),
            "python": platform.python_version(), "ci": bool(os.environ.get("CI"))}


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

    @property
    def counts(self) -> dict[str, int]:
        flat = [r.status for checks in self.results.values() for r in checks.values()]
        return {"passed": flat.count(True), "failed": flat.count(False), "skipped": flat.count(None)}

    @property
    def passed(self) -> bool:
        """True when nothing failed and at least one check passed (skipped is never passed)."""
        c = self.counts
        return c["failed"] == 0 and c["passed"] > 0

    def failures(self) -> list[tuple[str, CheckResult]]:
        return [(rt, r) for rt, checks in self.results.items() for r in checks.values() if r.status is False]

    # --- JSON ----------------------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        return {
            "schema": REPORT_SCHEMA, "created": self.created, "passed": self.passed, "counts": self.counts,
            "environment": self.environment, "versions": self.versions, "model": self.model,
            "folder": self.folder, "artifacts": self.artifacts, "sweep": self.sweep, "tolerance": self.tolerance,
            "seconds": round(self.seconds, 2), "sources": self.sources,
            "runtimes": {k: v.to_dict() for k, v in self.runtimes.items()},
            "results": {rt: {c: r.to_dict() for c, r in checks.items()} for rt, checks in self.results.items()},
        }

    @classmethod
    def from_dict(cls, data: dict) -> VerifyReport:
        if not isinstance(data, dict) or data.get("schema") != REPORT_SCHEMA:
            found = data.get("schema") if isinstance(data, dict) else type(data).__name__
            raise ArtifactError(f"not a verify report: schema {found!r}, expected {REPORT_SCHEMA!r}")
        return cls(
            model=data["model"], folder=data["folder"], sweep=data["sweep"], tolerance=data["tolerance"],
            runtimes={k: RuntimeInfo(**v) for k, v in data["runtimes"].items()},
            results={rt: {c: CheckResult(c, r["status"], r.get("figures", {}), r.get("message", ""))
                          for c, r in checks.items()} for rt, checks in data["results"].items()},
            environment=data.get("environment", {}), versions=data.get("versions", {}),
            artifacts=data.get("artifacts", {}), created=data.get("created", ""),
            seconds=data.get("seconds", 0.0), sources=data.get("sources", []))

    def write(self, folder: str | Path) -> tuple[Path, Path]:
        """Write report.json and report.md into folder (atomically); returns both paths."""
        from mhaexport.exporter.manifest import atomic_write_bytes, atomic_write_json, ensure_writable_dir

        folder = ensure_writable_dir(folder)
        atomic_write_json(folder / "report.json", self.to_dict())
        text = self.to_markdown()
        old = folder / "report.md"
        if old.is_file():  # keep sections other commands own, delimited <!-- name --> ... <!-- /name --> (bench)
            blocks = re.finditer(r"<!-- ([\w-]+) -->.*?<!-- /\1 -->", old.read_text(errors="replace"), re.S)
            text += "".join(f"\n{m.group(0)}\n" for m in blocks)
        atomic_write_bytes(folder / "report.md", text.encode())
        return folder / "report.json", folder / "report.md"

    # --- Markdown ------------------------------------------------------------------------------------------
    def to_markdown(self) -> str:
        c = self.counts
        verdict = "✅ PASSED" if self.passed else ("❌ FAILED" if c["failed"] else "⏭ NOTHING PASSED")
        spec = self.model.get("spec", "?")
        ckpt = f"weights {self.model['checkpoint']}" if self.model.get("checkpoint") else "seeded random weights"
        arts = []
        for name, a in self.artifacts.items():
            how = [f"opset {a['opset']}"] if a.get("opset") else ([a["mode"]] if a.get("mode") else [])
            if a.get("attention"):
                how.append(f"attention {a['attention']}")
            how.append(a.get("dtype", "float32"))
            sizes = a.get("static_sizes") or {}
            static = "static " + " ".join(f"{k.split('_')[0]}={v}" for k, v in sizes.items() if "total" not in k)
            how.append("dynamic axes" if a.get("seq_dynamic", True) else static)
            arts.append(f"{name} ({', '.join(how)})")
        lines = [f"## mhaexport verify: {verdict}", "",
                 f"**Model** `{spec}` ({ckpt}) · **artifacts** {', '.join(arts) or 'none'} · "
                 f"**sweep** {self.sweep.get('kind')} "
                 f"({self.sweep.get('cases')} shapes, seed {self.sweep.get('seed')}) · **tolerance** "
                 f"atol={self.tolerance.get('atol'):g} rtol={self.tolerance.get('rtol'):g} · "
                 f"{c['passed']} passed, {c['failed']} failed, {c['skipped']} skipped", ""]
        if self.sources:
            lines += ["Merged from: " + "; ".join(self.sources) + " (sweep and tolerance above: the first report's)", ""]
        lines.append("| runtime | providers | " + " | ".join(CHECKS) + " |")
        lines.append("|---|---|" + "---|" * len(CHECKS))
        for rt, info in self.runtimes.items():
            cells = [self._cell(self.results.get(rt, {}).get(ch)) for ch in CHECKS]
            prov = ", ".join(p.replace("ExecutionProvider", "") for p in info.providers) or "—"
            if info.status == "skipped" and info.providers:
                prov = f"only {prov}"  # the session fell back: say what it ran on, not what was asked
            lines.append(f"| {rt} | {prov} | " + " | ".join(cells) + " |")
        lines += ["", "✅ passed · ❌ failed · ⏭ skipped / not applicable (never counted as passed). Figures: "
                      "worst max abs difference (parity: vs eager; causality: earlier outputs after changing later "
                      "tokens; kv-consistency: decode/chunked/recompute vs prefill; padding: padded vs unpadded); "
                      "generation: matched greedy tokens.", ""]
        notes = []
        for rt, info in self.runtimes.items():
            if info.status != "ran":
                notes.append(f"- **{rt}** {info.status}: {info.reason}")
        for rt, checks in self.results.items():
            for ch in CHECKS:
                r = checks.get(ch)
                if r is not None and r.status is False:
                    notes.append(f"- ❌ **{rt} / {ch}**: {r.message}")
        for rt, checks in self.results.items():
            if self.runtimes.get(rt) and self.runtimes[rt].status != "ran":
                continue
            for ch in CHECKS:
                r = checks.get(ch)
                if r is not None and r.status is None and ch != "parity":
                    notes.append(f"- ⏭ {rt} / {ch}: {r.message}")
        if notes:
            lines += ["### Details", ""] + notes + [""]
        env = self.environment
        vers = ", ".join(f"{k} {v}" for k, v in self.versions.items())
        lines.append(f"<sub>{env.get('host', '?')} · {env.get('platform', '?')} · {env.get('cpus', '?')} CPUs · "
                     f"{vers} · {self.seconds:.1f} s · {self.created}</sub>")
        return "\n".join(lines) + "\n"

    @staticmethod
    def _cell(r: CheckResult | None) -> str:
        if r is None:
            return "—"
        icon = ICONS[r.status]
        f = r.figures
        if r.status is None:
            if f.get("reference"):
                return "ref"
            return f"{icon} {'static' if f.get('static') else 'skipped'}"
        figure = ""
        if r.check == "parity":
            figure = f"{f['errors']} errors" if f.get("errors") else f"{f.get('max_abs', 0):.1e}"
        elif r.check == "finite":
            figure = f"{f.get('cases', '')} shapes"
        elif r.check == "causality":
            figure = f"{f.get('max_abs_earlier', 0):.1e}"
        elif r.check == "kv-consistency":
            worst = max(f.get("decode_max_abs", 0), f.get("chunked_max_abs", 0), f.get("recompute_max_abs", 0))
            figure = f"{worst:.1e}"
        elif r.check == "padding":
            figure = f"{max((v for k, v in f.items() if k.endswith('_max_abs')), default=0):.1e}"
        elif r.check == "dynamic-shapes" and "baked_axes" in f:
            figure = "baked"
        elif r.check == "dynamic-shapes":
            figure = f"{f.get('shapes', 0) - f.get('failed_shapes', 0)}/{f.get('shapes', 0)} shapes"
        elif r.check == "generation":
            figure = f"{f.get('matched', 0)}/{f.get('tokens', 0)} tokens" + (" (tie)" if f.get("tie") else "")
        if not f and r.message:
            figure = "error"
        return f"{icon} {figure}".strip()


def load_report(path: str | Path) -> VerifyReport:
    path = Path(path)
    if path.is_dir():
        path = path / "report.json"
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ArtifactError(f"report {path} does not exist") from None
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ArtifactError(f"report {path} is not readable JSON: {e}") from None
    return VerifyReport.from_dict(data)


def merge_reports(reports: list[VerifyReport], names: list[str] | None = None) -> VerifyReport:
    """One table from reports made on different machines (e.g. a CPU job and a GPU job) for the same model.

    Rows are runtimes labelled by host; a runtime skipped on one machine but run on another keeps only the run.
    """
    if not reports:
        raise ArtifactError("report merge needs at least one report")
    fps = {model_fingerprint(r.model) for r in reports}
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
    merged = VerifyReport(model=first.model, folder=first.folder, sweep=first.sweep, tolerance=first.tolerance,
                          runtimes=runtimes, results=results, environment=environment(), versions=first.versions,
                          artifacts=first.artifacts, seconds=sum(r.seconds for r in reports),
                          sources=[f"{n}: {r.environment.get('platform', '?')} ({r.created})"
                                   for n, r in zip(names, reports)])
    return merged
