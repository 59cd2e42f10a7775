"""The verbs the CLI used to compose itself are API functions (issue 36, item 4): adoption, ``mhaexport.all``,
--target, lint, report merge, eval's and lint's verdicts, the threads and JUnit checks, the one report writer. From
Python they give what the command line gives."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

import mhaexport
from mhaexport.cli import main
from mhaexport.core.errors import ConfigError, ReportNotWritten


def _checks(folder: Path, name: str = "report") -> dict:
    """NAME.json's verdict and every runtime's check statuses (what must not differ between CLI and API)."""
    d = json.loads((folder / f"{name}.json").read_text())
    return {"verdict": d["verdict"], "counts": d["counts"],
            "results": {rt: {c: r["status"] for c, r in checks.items()} for rt, checks in d["results"].items()}}


def _manifest(folder: Path) -> dict:
    """The manifest's artifacts: files and details (not the times)."""
    d = json.loads((folder / "manifest.json").read_text())
    return {name: {"files": sorted(a["files"]), "details": a.get("details")} for name, a in d["artifacts"].items()}


def test_adoption_from_python_gives_the_clis_folder_and_report(tiny_export, tmp_path):
    file = tmp_path / "theirs" / "model.onnx"  # a file without our manifest: another tool's export
    file.parent.mkdir()
    shutil.copy(tiny_export / "model.onnx", file)
    rec = mhaexport.adopt(file, tmp_path / "py", config="tiny")
    report = mhaexport.verify(rec.folder, config="tiny", runtimes=["ort-cpu"], output=rec.folder)
    assert report and rec.folder == tmp_path / "py"
    r = CliRunner().invoke(main, ["verify", str(file), "--config", "tiny", "--runtime", "ort-cpu", "-o",
                                  str(tmp_path / "cli")])
    assert r.exit_code == 0, r.output
    assert _manifest(tmp_path / "py") == _manifest(tmp_path / "cli")
    # the CLI names a run of named runtimes' report after them (never replacing a full report); the API's is "report"
    assert _checks(tmp_path / "py") == _checks(tmp_path / "cli", "report-ort-cpu")
    with pytest.raises(ConfigError, match="say which model it claims to be"):
        mhaexport.adopt(file, tmp_path / "none")
    assert not (tmp_path / "none").exists()  # refused before any work


def test_merge_lint_the_verdicts_and_the_one_writer_are_api_functions(tiny_export, tmp_path):
    alone = mhaexport.verify(tiny_export, runtimes=["eager"], output=tmp_path / "a")
    merged = mhaexport.merge_reports([tmp_path / "a", tmp_path / "a" / "report.json"], tmp_path / "m",
                                     names=["x", "y"])
    assert merged.verdict.code == alone.verdict.code and (tmp_path / "m" / "report.json").is_file()  # verify's rules
    with pytest.raises(ConfigError, match="names: 1 given for 2 reports"):
        mhaexport.merge_reports([tmp_path / "a", tmp_path / "a"], tmp_path / "m2", names=["x"])
    lint = mhaexport.lint(tiny_export)
    assert mhaexport.lint_verdict(lint) == (0, "no error")
    bad = SimpleNamespace(errors=[SimpleNamespace(rule="r", node="n")])
    assert mhaexport.lint_verdict(bad) == (1, "lint found 1 error(s): r at n")
    row = SimpleNamespace
    (tmp_path / "file").write_text("")  # the one writer: what it can, then what it could not
    with pytest.raises(ReportNotWritten, match="--junit") as e:
        mhaexport.write_reports(alone, tmp_path / "out", tmp_path / "file" / "j.xml", name="report")
    # the report was written first, every one of its files
    assert [p.name for p in e.value.written] == ["report.json", "report.md", "report.html"]
    assert (tmp_path / "out" / "report.html").is_file()
    assert mhaexport.eval_verdict(row(rows=[row(status="ok", runtime="a", reason="")]))[0] == 0
    assert mhaexport.eval_verdict(row(rows=[row(status="skipped", runtime="a", reason="no cuda")])) == \
        (4, "a skipped (no cuda)")
    assert mhaexport.eval_verdict(row(rows=[row(status="skipped", runtime="a", reason="x"),
                                            row(status="error", runtime="b", reason="boom")])) == (1, "b: boom")


def test_the_input_checks_and_the_target_are_api_functions(tmp_path):
    import os

    cores = os.cpu_count() or 1
    assert mhaexport.check_threads(None) is None and mhaexport.check_threads(cores) == cores
    with pytest.raises(ConfigError, match=f"has {cores} CPU core"):
        mhaexport.check_threads(cores + 1)
    assert mhaexport.check_junit(tmp_path / "new" / "j.xml") == tmp_path / "new" / "j.xml"  # made by the run
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError, match="is not a writable folder"):
        mhaexport.check_junit(tmp_path / "file" / "j.xml")
    assert mhaexport.target_options("ort-cpu") == ("fused", "shared", "float32", "int4")
    assert mhaexport.target_options("ort-cpu", {"dtype": "float32"})[2] == "float32"  # agrees: fine
    with pytest.raises(ConfigError, match="give one or the other"):
        mhaexport.target_options("ort-cuda", {"dtype": "float32"})
    with pytest.raises(ConfigError, match="give one or the other"):  # before any work
        mhaexport.all(tmp_path / "out", config="tiny", target="ort-cpu", attention="ort")
    assert not (tmp_path / "out").exists()


@pytest.mark.slow  # two exports and verifies of the tiny model (~40 s on 2 loaded cores)
def test_all_from_python_gives_the_clis_folder_and_report(tmp_path):
    from mhaexport.core.progress import Stage

    said: list = []
    run = mhaexport.all(tmp_path / "py", config="tiny", runtimes=["ort-cpu"], junit=tmp_path / "py.xml",
                        progress=said.append)
    assert run and run.report.verdict.code == 0
    assert [s.index for s in said if isinstance(s, Stage)] == [1, 2, 3, 4]
    assert [r.artifact for r in run.records] == ["onnx", "torchscript"]
    assert {p.name for p in run.written} >= {"report.json", "report.md", "py.xml"}
    r = CliRunner().invoke(main, ["all", "--config", "tiny", "--runtime", "ort-cpu", "-o", str(tmp_path / "cli")])
    assert r.exit_code == 0, r.output
    assert "[4/4] verify" in r.output
    assert sorted(p.name for p in (tmp_path / "py").iterdir()) == sorted(p.name for p in (tmp_path / "cli").iterdir())
    assert _manifest(tmp_path / "py") == _manifest(tmp_path / "cli")
    assert _checks(tmp_path / "py") == _checks(tmp_path / "cli")


def test_the_verify_verb_whole_is_an_api_function(tiny_export, tmp_path):
    """verify_run: the command's input checks, a refused folder's verdict and report, the file adopted, --bisect's
    exit — what the CLI used to decide itself; the CLI prints its VerifyRun."""
    with pytest.raises(ConfigError, match="nothing was verified"):
        mhaexport.verify_run()
    with pytest.raises(ConfigError, match="case is for bisect"):
        mhaexport.verify_run(tiny_export, case=(1, 2, 0))
    with pytest.raises(ConfigError, match="no such folder"):
        mhaexport.verify_run(tmp_path / "nope")
    broken = tmp_path / "broken"  # a file that does not match its manifest: refused before any check
    shutil.copytree(tiny_export, broken)
    (broken / "model.onnx").write_bytes((broken / "model.onnx").read_bytes()[:-1] + b"\0")
    run = mhaexport.verify_run(broken, tmp_path / "refused", runtimes=["ort-cpu"], junit=tmp_path / "j.xml")
    assert not run and run.exit[0] == 2 and run.report.refused and "sha256" in run.exit[1]
    assert {p.name for p in run.written} >= {"report.json", "report.md", "j.xml"}
    assert not (broken / "report.json").exists()  # nothing written into the refused folder
    r = CliRunner().invoke(main, ["verify", str(broken), "--runtime", "ort-cpu", "-o", str(tmp_path / "cli")])
    assert r.exit_code == 2 and _checks(tmp_path / "cli") == _checks(tmp_path / "refused")
    file = tmp_path / "theirs" / "model.onnx"
    file.parent.mkdir()
    shutil.copy(tiny_export / "model.onnx", file)
    adopted = mhaexport.verify_run(file, tmp_path / "adopted", config="tiny", runtimes=["ort-cpu"])
    assert adopted and adopted.adopted.folder == tmp_path / "adopted" and adopted.folder == tmp_path / "adopted"
    assert (tmp_path / "adopted" / "report-ort-cpu.json").is_file()
    # verify --bisect takes the adopted folder's report (written since its export) as its verdict
    bisected = mhaexport.verify_run(tmp_path / "adopted", tmp_path / "b", config="tiny", bisect=True, case=(1, 3, 0))
    assert bisected.bisect.verified == "report-ort-cpu.json"
    assert bisected.bisect is not None and bisected.exit == bisected.bisect.exit
    assert bisected.exit[0] == (0 if bisected.bisect.found is None else 1)
