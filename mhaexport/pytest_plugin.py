"""pytest plugin (entry point ``pytest11``, loaded wherever mhaexport is installed): the ``mhaexport_verify``
fixture verifies an export folder — or a model, exported to a temporary folder first — inside a user's own test,
fails the test with verify's one-line verdict, and attaches report.md to the test's report::

    def test_my_export_is_faithful(mhaexport_verify):
        mhaexport_verify("artifacts/default", runtimes=["ort-cpu"])

    def test_my_model_exports(mhaexport_verify):
        report = mhaexport_verify(model="my_pkg.model:build")   # or config="small", hf="org/name"
        assert report.results["ort-cpu"]["parity"].figures["max_abs"] < 1e-5

The fixture returns the :class:`~mhaexport.verify.report.VerifyReport` when the verdict passed (exit 0); a failed
check (1) or a runtime asked for that could not run (4, not verified: skipped never counts as passed) fails the test
with ``pytest.fail``; so does bad input (a missing folder, an unknown runtime, a folder refused because a file does not
match its manifest: :class:`~mhaexport.core.errors.MhaExportError`), in one line "REFUSED: why" without a traceback. report.md goes into a "mhaexport report" section of the test's report (shown with the failure,
or for passed tests with ``-rA``), and the verdict into ``record_property`` (JUnit XML ``<property>`` entries).

This module imports only pytest at load time: every pytest session of an environment holding mhaexport loads it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

SECTION = "mhaexport report"


@pytest.fixture()
def mhaexport_verify(request: pytest.FixtureRequest, record_property: Callable[[str, object], None],
                     tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Any]:
    """A function ``(folder=None, *, model=None, config=None, hf=None, runtimes=None, sweep="quick", **verify_args)
    -> VerifyReport`` that verifies ``folder`` (or exports ``model``/``config``/``hf`` to a temporary folder first)
    and fails the test unless the verdict passed. ``verify_args``: seed, atol, rtol, tokens (as
    :func:`mhaexport.verify`)."""

    def verify(folder: str | Path | None = None, *, model: str | None = None, config: str | None = None,
               hf: str | None = None, runtimes: Sequence[str] | None = None, sweep: str = "quick",
               **verify_args: Any):
        from mhaexport import api
        from mhaexport.core.errors import MhaExportError

        what = folder if folder is not None else (model or config or hf)
        try:
            loaded = None
            if folder is None or model is not None or config is not None or hf is not None:
                loaded = api.load(model=model, config=config, hf=hf)  # once, for the exports and verify alike
            if folder is None:
                folder = tmp_path_factory.mktemp("mhaexport-verify")
                api.export_onnx(folder, model=loaded)
                api.export_torchscript(folder, model=loaded)
            report = api.verify(folder, model=loaded, runtimes=runtimes, sweep=sweep, **verify_args)
        except MhaExportError as e:  # bad input or a refused folder: one line, not a traceback through mhaexport
            record_property("mhaexport_verdict", "refused")
            record_property("mhaexport_exit_code", 2)
            pytest.fail(f"mhaexport verify {what}: REFUSED: {e}", pytrace=False)
        from mhaexport.verify.render import markdown as render_markdown

        markdown = render_markdown(report)
        request.node.add_report_section("call", SECTION, markdown)
        v = report.verdict
        record_property("mhaexport_verdict", v.status)
        record_property("mhaexport_exit_code", v.code)
        if not v:
            label = "NOT VERIFIED" if v.code == 4 else "FAILED"
            pytest.fail(f"mhaexport verify {folder}: {label}: {v.message}", pytrace=False)
        return report

    return verify
