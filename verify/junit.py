"""A verify report as JUnit XML (``verify --junit FILE``), the test-result format GitHub, GitLab, Jenkins and Azure
render: one ``<testcase>`` per runtime x check, so a CI system shows which check failed on which runtime.

Layout (the Jenkins xunit plugin's ``junit-10.xsd`` rules; ``tests/data/junit.xsd`` checks them)::

    <testsuites name="mhaexport verify" tests failures errors skipped time>
      <testsuite name="<model spec> · <artifacts>" tests failures errors skipped time timestamp hostname>
        <properties> verdict, exit code, folder, fingerprint, versions </properties>
        <testcase classname="<runtime>" name="<check>">          passed: empty
          <skipped message="<reason>"/>                          skipped (a check, or each check of a runtime)
          <failure message="<check> on <runtime>: <message>" type="mhaexport.<check>">figures</failure>
        </testcase>
        <testcase classname="mhaexport" name="folder"><error/>   only when the folder was refused before any check
        <testcase classname="mhaexport" name="verdict">           only when not verified (exit 4): a failure
        <system-out> report.md </system-out>
      </testsuite>
    </testsuites>

One case per counted check of the report (:meth:`~mhaexport.verify.report.VerifyReport.outcomes`), so the file's
tests, failures and skipped are the report's counts (report.json's ``counts``, report.md's and the summary line's):
lint errors, a runtime that could not load its artifact (a failed ``load`` case, its checks skipped), each check
of each runtime (eager's parity against itself is no check, and no case), provider against provider. The
``verdict`` case carries docs/DESIGN.md's rule into readers that count only failures: a run in which nothing failed
but what was asked for was not verified (exit 4) fails it, because skipped never counts as passed; a refused folder
is one error. Reads the report's records only (no rendering of its own beyond the figures); the Markdown, when
given, goes in ``<system-out>``.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

from mhaexport.verify.results import CheckResult
from mhaexport.core.numbers import finite
from mhaexport.core.untrusted import shown
from mhaexport.verify.report import EXIT_NOT_VERIFIED, VerifyReport


def _text(s: object) -> str:
    """One value as an attribute or text: shown escaped (no control characters, so nothing XML 1.0 cannot hold)."""
    return shown(s)


def _lines(text: str) -> str:
    """A text of several lines (report.md, a check's figures): each line escaped, the line breaks kept."""
    return "\n".join(shown(line) for line in str(text).split("\n"))


def _figures(figures: dict, prefix: str = "") -> list[str]:
    """``key=value`` lines of a check's figures (nested dicts flattened with dots)."""
    lines = []
    for k, v in figures.items():
        if isinstance(v, dict):
            lines += _figures(v, f"{prefix}{k}.")
        elif v is not None:
            lines.append(f"{prefix}{k}={v}")
    return lines


def suite_name(report: VerifyReport) -> str:
    """``<model spec> · <artifacts>``, e.g. ``hf:org/name · onnx (float32, decomposed) + torchscript (trace)``."""
    spec = report.model.spec or "model"
    parts = []
    for fmt, a in report.artifacts.items():
        how = [x for x in (a.dtype, a.attention, a.kv_cache if a.kv_cache != "concat" else None, a.mode) if x]
        parts.append(f"{fmt} ({', '.join(how)})" if how else fmt)
    return f"{spec} · {' + '.join(parts) or Path(report.folder).name}"


def _seconds(t: float | None) -> str:
    """A JUnit ``time`` (an xs:decimal: a time that is not a finite, non-negative number is written as 0)."""
    v = finite(t)
    return f"{v:.3f}" if v is not None and 0 <= v < 1e12 else "0.000"


def _case(parent: ET.Element, classname: str, name: str, time: float | None = None) -> ET.Element:
    attrs = {"classname": _text(classname), "name": _text(name)}
    if time is not None:
        attrs["time"] = _seconds(time)
    return ET.SubElement(parent, "testcase", attrs)


def _result(case: ET.Element, runtime: str, r: CheckResult) -> str:
    """Fill ``case`` from a check result; returns "passed", "failed" or "skipped"."""
    if r.status is True:
        return "passed"
    if r.status is None:
        ET.SubElement(case, "skipped", {"message": _text(r.message or "not run")})
        return "skipped"
    failure = ET.SubElement(case, "failure", {"message": _text(f"{r.check} on {runtime}: {r.message or 'failed'}"),
                                              "type": _text(f"mhaexport.{r.check}")})
    failure.text = _lines("\n".join(_figures(r.figures.to_dict())) or r.message)
    return "failed"


def to_element(report: VerifyReport, markdown: str | None = None) -> ET.Element:
    """The ``<testsuites>`` element of ``report`` (``markdown``: report.md's text, put in ``<system-out>``)."""
    suite = ET.Element("testsuite", {"name": _text(suite_name(report))})
    props = ET.SubElement(suite, "properties")
    v = report.verdict
    for name, value in (("verdict", v.status), ("exit_code", v.code), ("verdict_message", v.message),
                        ("folder", report.folder), ("fingerprint", report.model.fingerprint),
                        *((f"version.{k}", val) for k, val in sorted(report.versions.items()))):
        if value is not None:
            ET.SubElement(props, "property", {"name": name, "value": _text(value)})
    counts = {"passed": 0, "failed": 0, "skipped": 0, "errors": 0}
    if report.refused is not None:  # the folder was refused before any check: one error case saying why
        case = _case(suite, "mhaexport", "folder")
        ET.SubElement(case, "error", {"message": _text(f"refused: {report.refused}"),
                                      "type": "mhaexport.refused"}).text = _text(report.refused)
        counts["errors"] += 1
    for row, r in report.outcomes():  # the report's counted checks, one case each
        info = report.runtimes.get(row)
        time = info.seconds if info is not None and r.check == "load" else None
        counts[_result(_case(suite, row, r.check, time), row, r)] += 1
    if v.code == EXIT_NOT_VERIFIED:  # nothing failed, yet what was asked was not verified: not green
        verdict = _case(suite, "mhaexport", "verdict", report.seconds)
        counts["failed"] += 1
        ET.SubElement(verdict, "failure", {"message": _text(f"{v.status}: {v.message}"),
                                           "type": f"mhaexport.verdict.exit{v.code}"}).text = _text(v.message)
    if markdown:
        ET.SubElement(suite, "system-out").text = _lines(markdown)
    tests = sum(counts.values())
    figures = {"tests": str(tests), "failures": str(counts["failed"]), "errors": str(counts["errors"]),
               "skipped": str(counts["skipped"]), "time": _seconds(report.seconds)}
    suite.attrib.update(figures)
    if report.created:
        suite.set("timestamp", report.created)
    if report.environment.host:
        suite.set("hostname", _text(report.environment.host))
    root = ET.Element("testsuites", {"name": "mhaexport verify", **{k: figures[k] for k in
                                                                     ("tests", "failures", "errors", "time")}})
    root.append(suite)
    return root


def to_junit_xml(report: VerifyReport, markdown: str | None = None) -> bytes:
    """The JUnit XML document of ``report`` (UTF-8 bytes, with the XML declaration)."""
    root = to_element(report, markdown)
    ET.indent(root)
    return ET.tostring(root, encoding="utf-8", xml_declaration=True) + b"\n"


def write_junit(report: VerifyReport, path: str | Path, markdown: str | None = None) -> Path:
    """Write :func:`to_junit_xml` to ``path`` atomically; returns the path."""
    from mhaexport.artifact import atomic_write_bytes

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, to_junit_xml(report, markdown))
    return path
