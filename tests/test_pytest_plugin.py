"""The pytest plugin (entry point ``pytest11`` -> mhaexport/pytest_plugin.py): a user's test verifies an export
in a line with the ``mhaexport_verify`` fixture, fails with verify's verdict, and carries report.md in its report.
Driven with pytester, in process, on the session's tiny export (tests/conftest.py)."""

from __future__ import annotations

import importlib.metadata
import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"

pytest_plugins = ["pytester"]


def test_the_plugin_is_registered_as_a_pytest11_entry_point():
    eps = {ep.name: ep.value for ep in importlib.metadata.entry_points(group="pytest11")}
    assert eps.get("mhaexport") == "mhaexport.pytest_plugin"


def test_a_good_folder_passes_and_attaches_the_report(pytester, tiny_export):
    pytester.makepyfile(f"""
        def test_export(mhaexport_verify):
            report = mhaexport_verify(r"{tiny_export}", runtimes=["ort-cpu"])
            assert report and report.verdict.code == 0
            assert report.results["ort-cpu"]["parity"].figures["max_abs"] < 1e-4
    """)
    result = pytester.runpytest("-rA", "-p", "no:cacheprovider", "--junitxml", "junit.xml")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*Captured mhaexport report call*", "| runtime | providers |*"])
    junit = (pytester.path / "junit.xml").read_text()
    assert '<property name="mhaexport_verdict" value="passed"' in junit


def test_a_failed_check_fails_the_test_with_verifys_verdict(pytester, tiny_export):
    pytester.makepyfile(f"""
        def test_export(mhaexport_verify):
            mhaexport_verify(r"{tiny_export}", runtimes=["ort-cpu"], atol=0.0, rtol=0.0)
    """)
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*mhaexport verify *: FAILED: * check(s) failed: *ort-cpu/parity*",
                                 "*Captured mhaexport report call*"])
    result.stdout.no_fnmatch_line("*pytest_plugin.py*")  # verify's message, not a traceback into the plugin


def test_a_runtime_that_cannot_run_is_not_verified_not_passed(pytester, tiny_export):
    from mhaexport.runtime.session import provider_unavailable

    if provider_unavailable("cuda") is None:
        pytest.skip("ONNX Runtime's CUDA provider really runs here: ort-cuda would be verified")
    pytester.makepyfile(f"""
        def test_export(mhaexport_verify):
            mhaexport_verify(r"{tiny_export}", runtimes=["ort-cuda"])
    """)
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*NOT VERIFIED: nothing requested was verified: ort-cuda skipped*"])


def test_bad_input_and_a_refused_folder_fail_in_one_line(pytester, tmp_path, altered_export):
    """A missing folder, or one whose model.onnx no longer matches its manifest: the test fails with one line
    saying why (REFUSED), not a traceback through mhaexport's files."""
    pytester.makepyfile(f"""
        def test_missing(mhaexport_verify):
            mhaexport_verify(r"{tmp_path / 'missing'}")

        def test_altered(mhaexport_verify):
            mhaexport_verify(r"{altered_export}", runtimes=["ort-cpu"])
    """)
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines(["*mhaexport verify *missing: REFUSED: *",
                                 "*mhaexport verify *: REFUSED: *model.onnx sha256 * does not match the manifest*"])
    result.stdout.no_fnmatch_line("*mhaexport/*.py:*")  # no traceback into the package


def readme_block(marker: str) -> str:
    """The fenced code block that follows ``<!-- {marker} -->`` in README.md."""
    text = "\n".join(p.read_text() for p in [README.parent / "README.md", *sorted((README.parent / "docs").glob("*.md"))])
    m = re.search(rf"<!-- {re.escape(marker)}[^>]*-->\s*```\w*\n(.*?)```", text, re.S)
    assert m, f"README.md and docs/*.md have no block after <!-- {marker} -->"
    return m.group(1)


def test_the_readmes_pytest_example_runs(pytester, tiny_export):
    """The README's first example on the tiny export (its second exports a model: the slow test below)."""
    code = readme_block("pytest example")
    assert '"artifacts/default"' in code
    pytester.makepyfile(test_readme_example=code.replace('"artifacts/default"', f'r"{tiny_export}"'))
    result = pytester.runpytest("-p", "no:cacheprovider", "-k", "test_export_matches_eager")
    result.assert_outcomes(passed=1, deselected=1)


@pytest.mark.slow
def test_a_model_is_exported_then_verified(pytester):
    pytester.makepyfile("""
        def test_model(mhaexport_verify):
            report = mhaexport_verify(config="tiny", runtimes=["ort-cpu", "torchscript"])
            assert set(report.artifacts) == {"onnx", "torchscript"}
    """)
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=1)
