"""The logic of the composite GitHub action (action.yml at the repository root): install, export or take a folder,
verify on the given runtimes, write the job summary and the step outputs, collect the reports for upload.

Called as CI calls it: inputs in environment variables ``INPUT_<NAME>`` (action.yml maps each ``inputs.<name>``
onto one; composite actions do not do that by themselves), ``GITHUB_STEP_SUMMARY`` and ``GITHUB_OUTPUT`` naming
files to append to, ``GITHUB_ACTION_PATH`` the action's own checkout. tests/test_ci_action.py runs it that way.

Inputs (all optional):
  INPUT_FOLDER    an export folder to verify (made by an earlier step or job); empty: export the model first
  INPUT_MODEL     the model options when exporting, as on the command line: "--config small", "--hf org/name",
                  "--model pkg.mod:build" (one of folder and model is required: both empty is bad input, exit 2)
  INPUT_RUNTIMES  runtimes to verify, comma- or space-separated ("ort-cpu,torchscript"); empty: verify's defaults
  INPUT_SWEEP     quick | full (default quick)
  INPUT_ARGS      more verify/all options, e.g. "--atol logits=1e-3 --dtype float16"
  INPUT_NAME      a label for this job's reports (the merged table's host column; the artifact's name)
  INPUT_OUTPUT    where the export (when made) and reports/ go (default mhaexport-ci)
  INPUT_INSTALL   what pip installs first (default: the action's own source with the hf extra); "none": nothing
  INPUT_FAIL      "true" (default): the step fails unless the verdict passed; "false": failed (1) and not
                  verified (4) only set the outputs (bad input 2 and a bug 3 still fail)

Bad input of the action itself (folder and model both or neither, an unbalanced quote in model/args, a line break in
folder/name/output, an output that is a file) is one ::error line and exit 2, never a traceback.

Outputs (GITHUB_OUTPUT, each in the ``name<<DELIMITER`` form with a random delimiter: no input can add a key): verdict (passed | failed | not verified | bad input | error | interrupted), exit-code,
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


def _outputs(**values: object) -> None:
    """Append step outputs to $GITHUB_OUTPUT in GitHub's multi-line form (``name<<DELIMITER``, the value, the
    delimiter) with a random delimiter: a value holding a newline (an input ``folder=x\nverdict=passed``) stays one
    value and cannot add keys."""
    import secrets

    text = ""
    for key, value in values.items():
        delimiter = f"ghadelimiter_{secrets.token_hex(16)}"
        text += f"{key.replace('_', '-')}<<{delimiter}\n{value}\n{delimiter}\n"
    _append("GITHUB_OUTPUT", text)


def _escape(text: str, property_: bool = False) -> str:
    """A workflow command's message (or property) escaped as GitHub's toolkit does: no newline can start another
    command (``::add-mask::``, ``::stop-commands::``)."""
    text = str(text).replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
    return text.replace(":", "%3A").replace(",", "%2C") if property_ else text


def _annotate(level: str, title: str, message: str) -> None:
    print(f"::{level} title={_escape(title, True)}::{_escape(message)}")


def _refuse(message: str) -> int:
    """Bad input of the action itself: one annotation, the outputs, exit 2."""
    _annotate("error", "mhaexport", message)
    _outputs(verdict="bad input", exit_code=2)
    return 2


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
    if folder:  # after "--": a folder input such as "--help" or "-o x" is a folder name, never an option
        return [*cli, "verify", "-o", str(out / "verify"), *common, "--", folder], Path(folder), out / "verify"
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
        return _refuse(f"give folder or model, not both (folder={folder!r}, model={model!r})")
    if not folder and not model:  # an unset variable in the workflow must not verify the built-in model and pass
        return _refuse("give folder (an export folder to verify) or model (e.g. --config small): both are empty, "
                       "nothing would be verified of yours")
    for key, value in (("folder", folder), ("name", name), ("output", str(out))):
        if "\n" in value or "\r" in value:
            return _refuse(f"input {key} holds a line break: {value!r}")
    for key in ("model", "args"):
        try:
            shlex.split(_input(key))
        except ValueError as e:
            return _refuse(f"input {key} is not a valid command line ({e}): {_input(key)!r}")
    env = {**os.environ, "MHAEXPORT_HOST_LABEL": name}
    if install.lower() != "none":
        code, _ = _run([sys.executable, "-m", "pip", "install", "--quiet", install], env)
        if code:
            _annotate("error", "mhaexport", f"pip install {install} failed (exit {code})")
            _outputs(verdict="error", exit_code=code)
            return code
    reports = out / "reports"
    try:
        reports.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        return _refuse(f"output {out}: cannot make the folder {reports} ({e.strerror or e})")
    junit = reports / "junit.xml"
    cmd, verified, report_dir = build_command(folder, model, runtimes, sweep, _input("args"), out, junit)
    code, tail = _run(cmd, env)
    verdict = VERDICTS.get(code, "error")
    for f in ("report.json", "report.md"):
        if (report_dir / f).is_file():
            shutil.copyfile(report_dir / f, reports / f)
    message = tail[-1] if tail else ""
    if (reports / "report.json").is_file():
        try:
            message = json.loads((reports / "report.json").read_text())["verdict"]["message"]
        except (OSError, ValueError, KeyError, TypeError):
            pass
    icon = ICONS.get(code, "💥")
    what = folder or model or "the default model"
    summary = [f"## mhaexport · {name}: {icon} {verdict}", "", f"`{shlex.join(cmd[2:])}` → exit {code}: {message}", ""]
    if (reports / "report.md").is_file() and code in (0, 1, 2, 4):  # 2: a refused folder's report says why
        summary.append((reports / "report.md").read_text())
    else:
        summary += [f"No report for {what}: mhaexport stopped before verify wrote one. The log's last lines:", "",
                    "```", *tail, "```"]
    _append("GITHUB_STEP_SUMMARY", "\n".join(summary) + "\n")
    _outputs(verdict=verdict, exit_code=code, reports=reports, folder=verified)
    if code:
        level = "warning" if code in (1, 4) and not fail else "error"
        _annotate(level, f"mhaexport {name}: {verdict}", message)
    if code in (1, 4) and not fail:
        return 0
    return code


if __name__ == "__main__":
    sys.exit(main())
