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
  INPUT_DEVICE    cpu (default) | gpu: the install's ONNX Runtime and torch — cpu: onnxruntime and PyTorch's CPU
                  wheel (no CUDA libraries); gpu: onnxruntime-gpu and PyPI's default (CUDA) torch
  INPUT_INSTALL   what pip installs (default: the action's own source with the DEVICE and hf extras, after torch when
                  torch is not installed yet); "none": nothing (the environment already holds mhaexport)
  INPUT_FAIL      "true" (default): the step fails unless the verdict passed; "false": failed (1) and not
                  verified (4) only set the outputs (bad input 2 and a bug 3 still fail)

Bad input of the action itself (folder and model both or neither, an unbalanced quote in model/args, a line break in
an input that names one thing, an unknown device, an output that is a file) is one ::error line and exit 2, never a
traceback.

Outputs (GITHUB_OUTPUT): verdict (passed | failed | not verified | bad input | error | interrupted), exit-code,
reports (the folder with report.json, report.md, junit.xml), folder (what was verified). Written in GitHub's
documented forms — ``name=value``, or for a value holding a line break ``name<<DELIMITER`` with a fresh random
delimiter — so no input can add a key; inputs that name one thing (folder, name, output, device, sweep) refuse a
line break outright, and workflow commands (``::error``) carry their text escaped.
Exit status: mhaexport's (0 passed, 1 failed, 2 bad input, 3 a bug, 4 not verified), or 0 per INPUT_FAIL.
"""

from __future__ import annotations

import importlib.util
import os
import re
import secrets
import shlex
import shutil
import subprocess
import sys
from collections import deque
from pathlib import Path

VERDICTS = {0: "passed", 1: "failed", 2: "bad input", 3: "error", 4: "not verified", 130: "interrupted"}
ICONS = {0: "✅", 1: "❌", 4: "⏭"}
TAIL = 40  # log lines kept for the summary when there is no report


TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"  # PyTorch's CPU-only wheels (PyPI's Linux torch is CUDA's)
ONE_LINE = ("folder", "name", "output", "device", "sweep")  # inputs that name one thing: a line break is refused


def _input(name: str, default: str = "") -> str:
    return os.environ.get(f"INPUT_{name.upper().replace('-', '_')}", "").strip() or default


def _append(env: str, text: str) -> None:
    path = os.environ.get(env)
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(text)


def output_lines(name: str, value: str) -> str:
    """One step output in GitHub's documented syntax: ``name=value``, or, when the value holds a line break, the
    multi-line form with a random delimiter that the value does not contain — so a value can never start a key."""
    value = str(value)
    if "\n" not in value and "\r" not in value:
        return f"{name}={value}\n"
    while (delimiter := f"ghadelimiter_{secrets.token_hex(16)}") in value:
        pass  # pragma: no cover - 128 random bits
    return f"{name}<<{delimiter}\n{value}\n{delimiter}\n"


def _outputs(**values: object) -> None:
    _append("GITHUB_OUTPUT", "".join(output_lines(k.replace("_", "-"), str(v)) for k, v in values.items()))


def _escape(text: str, prop: bool = False) -> str:
    """A workflow command's data (or, ``prop``, a property value) escaped as the runner's toolkit does: a line break
    in a message cannot start a command of its own."""
    text = str(text).replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
    return text.replace(":", "%3A").replace(",", "%2C") if prop else text


def command(level: str, title: str, message: str) -> str:
    """``::error title=...::message`` with both parts escaped."""
    return f"::{level} title={_escape(title, prop=True)}::{_escape(message)}"


def _annotate(level: str, title: str, message: str) -> None:
    print(command(level, title, message))


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
    device = _input("device", "cpu").lower()
    own = f"{os.environ.get('GITHUB_ACTION_PATH', '.')}[{device},hf]"  # one argument: the path may hold spaces
    install = _input("install", own)
    fail = _input("fail", "true").lower() not in ("false", "0", "no")
    broken = [k for k in ONE_LINE if re.search(r"[\r\n]", os.environ.get(f"INPUT_{k.upper()}", "").strip())]
    if broken:
        return _refuse(f"input {broken[0]} holds a line break; it names one thing, on one line")
    if device not in ("cpu", "gpu"):
        return _refuse(f"device {device!r}: cpu or gpu")
    if folder and model:
        return _refuse(f"give folder or model, not both (folder={folder!r}, model={model!r})")
    if not folder and not model:  # an unset variable in the workflow must not verify the built-in model and pass
        return _refuse("give folder (an export folder to verify) or model (e.g. --config small): both are empty, "
                       "nothing would be verified of yours")
    for key in ("model", "args"):
        try:
            shlex.split(_input(key))
        except ValueError as e:
            return _refuse(f"input {key} is not a valid command line ({e}): {_input(key)!r}")
    env = {**os.environ, "MHAEXPORT_HOST_LABEL": name}
    if install.lower() != "none":
        pip = [sys.executable, "-m", "pip", "install", "--quiet"]
        steps = []
        if importlib.util.find_spec("torch") is None:  # torch first, so the package's torch>=2.6 is already met
            steps.append([*pip, "torch", *(["--index-url", TORCH_CPU_INDEX] if device == "cpu" else [])])
        try:
            steps.append([*pip, *([install] if install == own else shlex.split(install))])
        except ValueError as e:
            return _refuse(f"input install is not a valid command line ({e}): {install!r}")
        for step in steps:
            code, _ = _run(step, env)
            if code:
                _annotate("error", "mhaexport", f"{shlex.join(step[3:])} failed (exit {code})")
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
    for f in ("report.json", "report.md", "report.html"):
        if (report_dir / f).is_file():
            shutil.copyfile(report_dir / f, reports / f)
    from mhaexport.core.errors import MhaExportError
    from mhaexport.core.untrusted import fenced, load_json, md, shown  # installed by now: the one reader, the escapers

    message = tail[-1] if tail else ""
    if (reports / "report.json").is_file():
        try:
            message = load_json(reports / "report.json", "report.json")["verdict"]["message"]
        except (MhaExportError, KeyError, TypeError):
            pass
    icon = ICONS.get(code, "💥")
    what = folder or model or "the default model"
    summary = [f"## mhaexport · {md(name)}: {icon} {verdict}", "",
               f"{md(shlex.join(cmd[2:]))} → exit {code}: {md(message)}", ""]
    if (reports / "report.md").is_file() and code in (0, 1, 2, 4):  # 2: a refused folder's report says why
        summary.append((reports / "report.md").read_text())
    else:
        summary += [f"No report for {md(what)}: mhaexport stopped before verify wrote one. The log's last lines:", "",
                    fenced("\n".join(tail))]  # a fence no log line can close
    _append("GITHUB_STEP_SUMMARY", "\n".join(summary) + "\n")
    _outputs(verdict=verdict, exit_code=code, reports=reports, folder=verified)
    if code:
        level = "warning" if code in (1, 4) and not fail else "error"
        _annotate(level, f"mhaexport {shown(name)}: {verdict}", shown(message))
    if code in (1, 4) and not fail:
        return 0
    return code


if __name__ == "__main__":
    sys.exit(main())
