"""`verify --junit FILE`: the verdict as JUnit XML, one test case per runtime x check, valid against the JUnit schema
CI readers accept (tests/data/junit.xsd, written from Jenkins' xunit-plugin junit-10.xsd; validated with xmlschema)."""

from __future__ import annotations

import copy
import io
import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from click.testing import CliRunner

from mhaexport.cli import main
from mhaexport.verify.results import CheckResult
from mhaexport.verify.junit import suite_name, to_junit_xml
from mhaexport.verify.report import RuntimeInfo, load_report

XSD = Path(__file__).parent / "data" / "junit.xsd"


def validate(data: bytes | Path) -> ET.Element:
    """Parse a JUnit file and validate it against tests/data/junit.xsd."""
    xmlschema = pytest.importorskip("xmlschema", reason="xmlschema validates the JUnit file (the test extra)")
    text = data.read_bytes() if isinstance(data, Path) else data
    xmlschema.XMLSchema(str(XSD)).validate(io.BytesIO(text))
    root = ET.fromstring(text)
    assert root.tag == "testsuites"
    return root


def cases(root: ET.Element) -> dict[tuple[str, str], ET.Element]:
    out = {(c.get("classname"), c.get("name")): c for c in root.iter("testcase")}
    assert len(out) == len(list(root.iter("testcase"))), "a (runtime, check) pair appears twice"
    return out


@pytest.fixture(scope="module")
def verified(tiny_export, tmp_path_factory):
    """`verify tiny_export --junit --json` with the default runtimes (ort-cuda skipped here, or run where CUDA is):
    (CliRunner result, report folder, junit path)."""
    out = tmp_path_factory.mktemp("junit")
    junit = out / "verify.xml"
    r = CliRunner().invoke(main, ["verify", str(tiny_export), "-o", str(out), "--junit", str(junit), "--json"])
    return r, out, junit


def test_verify_junit_has_one_valid_case_per_counted_check(verified):
    r, out, junit = verified
    assert r.exit_code == 0, r.output
    assert f"wrote {junit}" in r.output
    report = load_report(out / "report.json")
    root = validate(junit)
    (suite,) = root.findall("testsuite")
    assert suite.get("name") == suite_name(report)
    assert suite.get("name").startswith("preset:tiny · onnx (float32, decomposed) + torchscript")
    got = cases(root)
    # a check that ran, unless it is the reference itself or does not apply by design (shown "ref" / "n/a")
    not_checks = {(rt, c) for rt, checks in report.results.items() for c, res in checks.items()
                  if res.status is None and {"reference", "lossy", "exact", "not_applicable"} & set(res.figures)}
    assert ("eager", "parity") in not_checks and ("ort-genai" not in report.runtimes
                                                   or ("ort-genai", "causality") in not_checks)
    want = {(rt, c) for rt, checks in report.results.items() for c in checks} - not_checks
    skipped_rts = [rt for rt, info in report.runtimes.items() if info.status == "skipped"]
    want |= {(rt, c) for rt in skipped_rts for c in report.checks}  # every check asked of a runtime not run here
    assert set(got) == want  # a passed verdict: no verdict case
    for (rt, check), case in got.items():
        status = report.results.get(rt, {}).get(check)
        if rt in skipped_rts:
            assert report.runtimes[rt].reason in case.find("skipped").get("message")
        elif status is not None and status.status is None:
            assert case.find("skipped") is not None
        else:
            assert len(case) == 0, (rt, check)  # passed: no outcome element
    n_skipped = sum(1 for c in got.values() if c.find("skipped") is not None)
    assert (suite.get("tests"), suite.get("failures"), suite.get("skipped")) == (str(len(got)), "0", str(n_skipped))
    assert "| runtime |" in suite.find("system-out").text  # report.md rides along
    props = {p.get("name"): p.get("value") for p in suite.iter("property")}
    assert props["verdict"] == "passed" and props["exit_code"] == "0"


def test_a_clean_run_counts_the_same_everywhere(verified):
    """The summary line, report.md, report.json (and --json), JUnit and bool(report) count the same checks: a clean
    verify of the tiny preset (eager's parity against itself is no check; ort-cuda's checks are skipped where it
    cannot run, and then the verdict names it)."""
    r, out, junit = verified
    assert r.exit_code == 0, r.output
    printed = json.loads(r.stdout)  # --json: report.json's content on stdout
    data = json.loads((out / "report.json").read_text())
    counts = data["counts"]
    assert printed["counts"] == counts and counts["failed"] == 0 and counts["passed"] > 0
    report = load_report(out / "report.json")
    assert report.counts == counts and bool(report) and report.verdict.code == 0
    (line,) = [ln for ln in r.stderr.splitlines() if ln.startswith("verify passed in ")]
    m = re.search(r": (\d+) passed(?:, (\d+) skipped)?", line)
    assert (int(m.group(1)), int(m.group(2) or 0)) == (counts["passed"], counts["skipped"]), line
    md = (out / "report.md").read_text()
    assert f"{counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped" in md
    page = (out / "report.html").read_text()  # self-contained: no script, no link, nothing fetched; plots inline
    assert f"{counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped" in page
    assert not re.search(r"<script|<link|(?:src|href)\s*=\s*[\"']?\s*(?:https?:|//)", page, re.I)
    assert page.count("<svg") >= 3 and "Cached decode: error against position" in page
    assert all(f"<b>{rt}</b>" in page for rt in report.runtimes)
    suite = validate(junit).find("testsuite")
    n_tests, n_failed, n_skipped = (int(suite.get(k)) for k in ("tests", "failures", "skipped"))
    assert (n_tests - n_failed - n_skipped, n_failed, n_skipped) == (counts["passed"], 0, counts["skipped"])
    assert "(skipped is not passed)" not in line  # the reference is not a skip
    skipped_rts = [rt for rt, info in report.runtimes.items() if info.status == "skipped"]
    assert counts["skipped"] == len(skipped_rts) * len(report.checks) + sum(  # a check skipped where it ran
        1 for rt, checks in report.results.items() for res in checks.values() if res.status is None and res.counted)
    if skipped_rts:
        assert f"runtime(s) skipped: {', '.join(skipped_rts)}" in line


def test_failures_carry_message_and_figure_and_not_verified_fails_the_verdict_case(verified):
    _, out, _ = verified
    report = load_report(out / "report.json")
    bad = copy.deepcopy(report)
    bad.results["ort-cpu"]["parity"] = CheckResult("parity", False, {"max_abs": 0.25, "per_output": {"logits": {
        "max": 0.25}}}, "max abs 2.5e-01 > atol 1e-04 at b=1 seq=7 past=0 \x1b[31m")
    bad.runtimes["torchscript"] = RuntimeInfo("torchscript", "error", "RuntimeFailure: model.pt: bad magic")
    root = validate(to_junit_xml(bad))
    got = cases(root)
    failure = got[("ort-cpu", "parity")].find("failure")
    assert failure.get("message").startswith("parity on ort-cpu: max abs 2.5e-01 > atol 1e-04")
    assert failure.get("type") == "mhaexport.parity"
    assert "max_abs=0.25" in failure.text and "per_output.logits.max=0.25" in failure.text
    assert got[("torchscript", "load")].find("failure").get("message").endswith("bad magic")
    assert "could not load" in got[("torchscript", "parity")].find("skipped").get("message")
    assert ("mhaexport", "verdict") not in got  # the failed checks carry a failed verdict (exit 1)
    assert root.find("testsuite").get("failures") == "2" == str(bad.counts["failed"])
    # nothing failed, but the runtime asked for was skipped: readers that count failures must not show green
    skipped = copy.deepcopy(report)
    skipped.requested = ["ort-cuda"]
    skipped.runtimes = {"eager": report.runtimes["eager"],
                        "ort-cuda": RuntimeInfo("ort-cuda", "skipped", "CUDAExecutionProvider not available")}
    skipped.results = {"eager": report.results["eager"]}
    root = validate(to_junit_xml(skipped))
    got = cases(root)
    assert got[("ort-cuda", "parity")].find("skipped").get("message") == \
        "ort-cuda skipped: CUDAExecutionProvider not available"
    verdict = got[("mhaexport", "verdict")].find("failure")
    assert verdict.get("type") == "mhaexport.verdict.exit4" and "not verified" in verdict.get("message")


def test_a_junit_path_that_cannot_be_written_is_refused_before_any_work(tiny_export, tmp_path):
    (tmp_path / "a-file").write_text("")
    r = CliRunner().invoke(main, ["verify", str(tiny_export), "-o", str(tmp_path),
                                  "--junit", str(tmp_path / "a-file" / "sub" / "j.xml")])
    assert r.exit_code == 2 and "is not a writable folder" in r.output and "Traceback" not in r.output, r.output
    assert not (tmp_path / "report.json").exists()


def test_the_junit_folder_is_made_like_the_output_folder(tiny_export, tmp_path):
    """`all -o out --junit out/verify.xml`: out does not exist before the run."""
    r = CliRunner().invoke(main, ["verify", str(tiny_export), "--runtime", "ort-cpu", "-o", str(tmp_path / "out"),
                                  "--junit", str(tmp_path / "out" / "ci" / "verify.xml")])
    assert r.exit_code == 0, r.output
    validate(tmp_path / "out" / "ci" / "verify.xml")
