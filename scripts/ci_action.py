"""The logic of the composite GitHub action (action.yml at the repository root): install, export or take a folder,
verify on the given runtimes, write the job summary and the step outputs, collect the reports for upload.

Called as CI calls it: inputs in environment variables ``INPUT_<NAME>`` (action.yml maps each ``inputs.<name>``
onto one; composite actions do not do that by themselves), ``GITHUB_STEP_SUMMARY`` and ``GITHUB_OUTPUT`` naming
files to append to, ``GITHUB_ACTION_PATH`` the action's own checkout. tests/test_ci_action.py runs it that way.

Inputs (all optional):
  INPUT_FOLDER    an export folder to verify (made by an earlier step or job); empty: export the model first
  INPUT_MODEL     the model options when exporting, as on the command line: "--config small", "--hf org/name",
                  "--model pkg.mod:build" (default: the default preset)
  INPUT_RUNTIMES  runtimes to verify, comma- or space-separated ("ort-cpu,torchscript"); empty: verify's defaults
  INPUT_SWEEP     quick | full (default quick)
  INPUT_ARGS      more verify/all options, e.g. "--atol logits=1e-3 --dtype float16"
  INPUT_NAME      a label for this job's reports (the merged table's host column; the artifact's name)
  INPUT_OUTPUT    where the export (when made) and reports/ go (default mhaexport-ci)
  INPUT_INSTALL   what pip installs first (default: the action's own source with the hf extra); "none": nothing
  INPUT_FAIL      "true" (default): the step fails unless the verdict passed; "false": failed (1) and not
                  verified (4) only set the outputs (bad input 2 and a bug 3 still fail)

Outputs (GITHUB_OUTPUT): verdict (passed | failed | not verified | bad input | error | interrupted), exit-code,
reports (the folder with report.json, report.md, junit.xml), folder (what was verified).
Exit status: mhaexport's (0 passed, 1 failed, 2 bad input, 3 a bug, 4 not verified), or 0 per INPUT_FAIL.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections import deque
from pathlib import Path

VERDICTS = {0: "passed", 1: "failed", 2: "bad input", 3: "error", 4: "not verified", 130: "interrupted"}
ICONS = {0: "✅", 1: "❌", 4: "⏭"}
TAIL = 40  # log lines kept for the summary when there is no report


def _input(name: str, default: str = "") -> str:
    return os.environ.get(f"INPUT_{name.upper().replace('-', '_')}", "").strip() or default


def _append(env: str, text: str) -> None:
    path = os.environ.get(env)
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(text)


def _run(cmd: list[str], env: dict) -> tuple[int, list[str]]:
    """Run ``cmd``, echoing its output to the log as it comes; returns its exit code and the last lines."""
    print("+ " + shlex.join(cmd), flush=True)
    tail: deque[str] = deque(maxlen=TAIL)
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env) as p:
        assert p.stdout is not None
        for line in p.stdout:
            sys.stdout.write(line)
            tail.append(line.rstrip("\n"))
        code = p.wait()
    sys.stdout.flush()
    return code, list(tail)


def build_command(folder: str, model: str, runtimes: list[str], sweep: str, args: str, out: Path,
                  junit: Path) -> tuple[list[str], Path, Path]:
    """The mhaexport command, the folder it verifies and the folder its report goes to."""
    cli = [sys.executable, "-m", "mhaexport"]
    rts = [a for rt in runtimes for a in ("--runtime", rt)]
    common = ["--sweep", sweep, *rts, "--junit", str(junit), *shlex.split(args)]
    if folder:
        return [*cli, "verify", folder, "-o", str(out / "verify"), *common], Path(folder), out / "verify"
    export = out / "export"
    return [*cli, "all", *shlex.split(model), "-o", str(export), *common], export, export


def main() -> int:
    folder = _input("folder")
    model = _input("model")
    runtimes = [r for r in re.split(r"[,\s]+", _input("runtimes")) if r]
    sweep = _input("sweep", "quick")
    name = _input("name", "mhaexport")
    out = Path(_input("output", "mhaexport-ci"))
    install = _input("install", f"{os.environ.get('GITHUB_ACTION_PATH', '.')}[hf]")
    fail = _input("fail", "true").lower() not in ("false", "0", "no")
    if folder and model:
        print(f"::error title=mhaexport::give folder or model, not both (folder={folder!r}, model={model!r})")
        return 2
    env = {**os.environ, "MHAEXPORT_HOST_LABEL": name}
    if install.lower() != "none":
        code, _ = _run([sys.executable, "-m", "pip", "install", "--quiet", install], env)
        if code:
            print(f"::error title=mhaexport::pip install {install} failed (exit {code})")
            _append("GITHUB_OUTPUT", f"verdict=error\nexit-code={code}\n")
            return code
    out.mkdir(parents=True, exist_ok=True)
    reports = out / "reports"
    reports.mkdir(exist_ok=True)
    junit = reports / "junit.xml"
    cmd, verified, report_dir = build_command(folder, model, runtimes, sweep, _input("args"), out, junit)
    code, tail = _run(cmd, env)
    verdict = VERDICTS.get(code, "error")
    for f in ("report.json", "report.md"):
        if (report_dir / f).is_file():
            shutil.copyfile(report_dir / f, reports / f)
    message = tail[-1] if tail else ""
    if (reports / "report.json").is_file():
        message = json.loads((reports / "report.json").read_text())["verdict"]["message"]
    icon = ICONS.get(code, "💥")
    what = folder or model or "the default model"
    summary = [f"## mhaexport · {name}: {icon} {verdict}", "", f"`{shlex.join(cmd[2:])}` → exit {code}: {message}", ""]
    if (reports / "report.md").is_file() and code in (0, 1, 4):
        summary.append((reports / "report.md").read_text())
    else:
        summary += [f"No report for {what}: mhaexport stopped before verify wrote one. The log's last lines:", "",
                    "```", *tail, "```"]
    _append("GITHUB_STEP_SUMMARY", "\n".join(summary) + "\n")
    _append("GITHUB_OUTPUT", f"verdict={verdict}\nexit-code={code}\nreports={reports}\nfolder={verified}\n")
    if code:
        level = "warning" if code in (1, 4) and not fail else "error"
        print(f"::{level} title=mhaexport {name}: {verdict}::{message}")
    if code in (1, 4) and not fail:
        return 0
    return code


if __name__ == "__main__":
    sys.exit(main())
