"""Prove an export: runners per runtime, a seeded input sweep, attention-aware checks and the report.

``verify_folder(DIR)`` returns a :class:`VerifyReport`; its ``verdict`` is the exit code; the CLI prints it and
writes report.json / report.md.
"""

from __future__ import annotations

from mhaexport.runners.names import ALL_RUNTIMES, DEFAULT_RUNTIMES
from mhaexport.runtime.runner import Runner
from mhaexport.verify.compare import Tolerance
from mhaexport.verify.report import Verdict, VerifyReport, load_report, merge_reports
from mhaexport.verify.results import CHECKS, CheckResult
from mhaexport.verify.sweep import Case, build_sweep
from mhaexport.verify.verify import verify_folder

__all__ = ["ALL_RUNTIMES", "CHECKS", "Case", "CheckResult", "DEFAULT_RUNTIMES", "Runner", "Tolerance", "Verdict",
           "VerifyReport", "build_sweep", "load_report", "merge_reports", "verify_folder"]

