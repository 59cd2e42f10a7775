"""The one writer of a verify report (a run, a refused folder, a merge; the JUnit file), ``mhaexport report merge``
and ``mhaexport lint`` with its verdict."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mhaexport.core.errors import ConfigError, MhaExportError
from mhaexport.verbs.common import _names, writable_output

if TYPE_CHECKING:  # pragma: no cover
    from mhaexport.verify.report import VerifyReport


def _bench_sections(report: Any, output: str | Path, name: str | None) -> tuple[str, ...]:
    """report.md's bench section, when ``output`` holds a bench result beside the report (bench writes its section
    into report.md): made again from bench.json, read by the confined reader and typed, never copied from the old
    report.md."""
    from mhaexport.bench.render import plot_notes, report_section
    from mhaexport.bench.result import read_result_in

    if (name or report.default_name()) != "report":
        return ()
    try:
        res = read_result_in(output)
    except MhaExportError:
        return ()  # a bench.json that is not a bench result: no section (bench, run again, says why)
    return () if res is None else (report_section(res, *plot_notes(Path(output))),)


def write_reports(report: Any, output: str | Path | None = None, junit: str | Path | None = None, *,
                  name: str | None = None, markdown: str | None = None) -> list[Path]:
    """The one writer of a verify report (a run, a refused folder, a merge): NAME.json / .md / .html into folder
    ``output`` (when given; ``name`` None: the report's own default name, so a subset run never replaces the full
    report) and the JUnit XML file ``junit`` (when given). Returns the paths written. What cannot be written raises
    :class:`~mhaexport.core.errors.ReportNotWritten` (an ArtifactError) after everything else was written; its
    ``written`` lists those paths. Call it before printing anything: a closed stdout then loses no report."""
    from mhaexport.core.errors import ReportNotWritten

    written: list[Path] = []
    failed: list[str] = []
    if output is not None:
        from mhaexport.verify.render import write_report

        try:
            written.extend(write_report(report, output, name, _bench_sections(report, output, name)))
        except (OSError, MhaExportError) as e:
            failed.append(f"cannot write the report into {output}: {getattr(e, 'strerror', None) or e}")
    if junit is not None:
        from mhaexport.verify.junit import write_junit

        try:
            written.append(write_junit(report, junit, markdown))
        except (OSError, MhaExportError) as e:
            failed.append(f"--junit {junit}: {getattr(e, 'strerror', None) or e}")
    if failed:
        raise ReportNotWritten("; ".join(failed), written=written)
    return written


def lint(path: str | Path) -> Any:
    """``mhaexport lint PATH``: static findings on a decoder's ONNX graph (a FILE.onnx, ours or another tool's, or
    an export folder), each with its severity, node and a one-line fix. Returns the
    :class:`~mhaexport.verify.lint.LintReport` (``.errors``; :func:`lint_verdict`: its verdict)."""
    from mhaexport.verify.lint import lint_path

    return lint_path(path)


def lint_verdict(report: Any) -> tuple[int, str]:
    """A lint report's verdict as (code, message): 1 when a finding is an error, else 0 (``mhaexport.core.errors.
    raise_for_verdict`` turns it into the exit)."""
    if not report.errors:
        return 0, "no error"
    return 1, (f"lint found {len(report.errors)} error(s): "
               + "; ".join(f"{f.rule} at {f.node}" for f in report.errors[:3]))


def merge_reports(reports: Sequence[str | Path], output: str | Path, *, names: Sequence[str] | None = None,
                  junit: str | Path | None = None) -> VerifyReport:
    """``mhaexport report merge``: merge report.json files (or folders holding one) from different machines into
    one table, written as report.json / .md / .html into folder ``output`` (never over one of the inputs).
    ``names``: a label per report, in order (default: each report's host). Returns the merged report: its verdict
    follows verify's rules (``bool(report)``: passed)."""
    from mhaexport.outputs import check_reports_out
    from mhaexport.verify.report import load_report, merge_reports as merge_loaded_reports

    reports = _names(reports, "reports", paths=True) or ()
    names = _names(names, "names")
    if names and len(names) != len(reports):
        raise ConfigError(f"names: {len(names)} given for {len(reports)} reports",
                          cli=f"--name given {len(names)} times for {len(reports)} reports")
    check_reports_out(output, reports, ("report.json", "report.md", "report.html"))
    writable_output(output)
    merged = merge_loaded_reports([load_report(p) for p in reports], list(names) if names else None)
    write_reports(merged, output, junit, name="report")
    return merged
