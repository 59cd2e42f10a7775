"""`verify --junit FILE`: the verdict as JUnit XML, one test case per runtime x check, valid against the JUnit schema
CI readers accept (tests/data/junit.xsd, written from Jenkins' xunit-plugin junit-10.xsd; validated with xmlschema)."""

from __future__ import annotations

import copy
import io
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
    """`verify tiny_export --junit` with the default runtimes (ort-cuda skipped here, or run where CUDA is):
    (CliRunner result, report folder, junit path)."""
    out = tmp_path_factory.mktemp("junit")
    junit = out / "verify.xml"
    r = CliRunner().invoke(main, ["verify", str(tiny_export), "-o", str(out), "--junit", str(junit)])
    return r, out, junit


def test_verify_junit_has_one_valid_case_per_runtime_and_check(verified):
    r, out, junit = verified
    assert r.exit_code == 0, r.output
    assert f"wrote {junit}" in r.output
    report = load_report(out / "report.json")
    root = validate(junit)
    (suite,) = root.findall("testsuite")
    assert suite.get("name") == suite_name(report)
    assert suite.get("name").startswith("preset:tiny · onnx (float32, decomposed) + torchscript")
    got = cases(root)
    want = {(rt, c) for rt, checks in report.results.items() for c in checks}
    skipped_rts = [rt for rt, info in report.runtimes.items() if info.status == "skipped"]
    want |= {(rt, c) for rt in skipped_rts for c in report.all_checks}
    assert set(got) == want | {("mhaexport", "verdict")}
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
    assert got[("mhaexport", "verdict")].find("failure").get("type") == "mhaexport.verdict.exit1"
    assert root.find("testsuite").get("failures") == "3"
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
