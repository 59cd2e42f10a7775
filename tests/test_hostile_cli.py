"""The command line against hostile or careless input (issue 25, items 5-7): verify needs a folder; a refused folder is
a verdict with its report and JUnit case; a closed stdout/stderr keeps the verdict's exit code; outputs never replace
inputs; another model goes into a folder only with --replace; and the exit-3 roots of the issue (a negative seed,
absurd config sizes, wrongly typed manifest fields, a re-hashed corrupt model, unwritable --junit paths, FIFOs, Ctrl-C
inside the exporter) are each one line, exit 2 (130 for Ctrl-C), with nothing outside the folder changed."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from mhaexport.cli import main
from test_bad_input import cli_error

EXPORT_FILES = ("model.onnx", "model.pt", "manifest.json", "genai_config.json")


def digest(folder: Path) -> dict[str, str]:
    """{relative path: sha256} of every file under ``folder`` (what "nothing changed" compares)."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def export_copy(tiny_export, tmp_path_factory):
    """A copy of the session's tiny export (ONNX + TorchScript) this module's refusals run against."""
    folder = tmp_path_factory.mktemp("hostile") / "good"
    shutil.copytree(tiny_export, folder, ignore=shutil.ignore_patterns(".snapshot-*", ".staging-*"))
    return folder


@pytest.fixture()
def cwd(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


# ---- verdicts CI cannot misread -----------------------------------------------------------------------------------

@pytest.mark.parametrize("args", [["verify"], ["verify", "--runtime", "ort-cpu", "--sweep", "full"],
                                  ["verify", "--bisect"], ["verify", "-o", "r", "--junit", "j.xml"]])
def test_verify_without_a_folder_or_a_model_verifies_nothing_and_says_so(cwd, args):
    msg = cli_error(args)
    assert msg.startswith("Error: verify needs the export FOLDER") and "nothing was verified" in msg
    assert list(cwd.iterdir()) == []  # no export, no report, no JUnit


def matches(text: str, pattern: str) -> bool:
    """The parts of ``pattern`` between its ``*`` appear in ``text`` in order (no other wildcard: [ ] are literal)."""
    at = 0
    for part in pattern.split("*"):
        at = text.find(part, at)
        if at < 0:
            return False
        at += len(part)
    return True


def manifest_edit(folder: Path, edit) -> None:
    data = json.loads((folder / "manifest.json").read_text())
    edit(data)
    (folder / "manifest.json").write_text(json.dumps(data))


@pytest.mark.parametrize("how,why", [
    ("altered", "model.onnx sha256 * does not match the manifest"),
    ("sha256 null", "artifacts.onnx.files['model.onnx'].sha256: expected 64 hex digits, found None"),
    ("bytes a string", "artifacts.onnx.files['model.onnx'].bytes: expected a byte count, found 'x'"),
])
def test_a_refused_folder_is_a_verdict_with_its_report_and_junit(export_copy, tmp_path, how, why):
    folder = tmp_path / "f"
    shutil.copytree(export_copy, folder)
    if how == "altered":
        data = bytearray((folder / "model.onnx").read_bytes())
        data[-10] ^= 0xFF
        (folder / "model.onnx").write_bytes(bytes(data))
    elif how == "sha256 null":
        manifest_edit(folder, lambda d: d["artifacts"]["onnx"]["files"]["model.onnx"].update(sha256=None))
    else:
        manifest_edit(folder, lambda d: d["artifacts"]["onnx"]["files"]["model.onnx"].update(bytes="x"))
    before = digest(folder)
    out = tmp_path / "r"
    res = CliRunner().invoke(main, ["verify", str(folder), "-o", str(out), "--junit", str(out / "j.xml"),
                                    "--runtime", "ort-cpu"])
    assert res.exit_code == 2, res.output
    errors = [ln for ln in res.stderr.splitlines() if ln.startswith("Error:")]
    assert len(errors) == 1 and matches(errors[0], f"Error: *{why}"), res.stderr
    report = json.loads((out / "report.json").read_text())
    assert report["verdict"]["status"] == "refused" and report["verdict"]["exit_code"] == 2
    assert matches(report["verdict"]["message"], why) and report["passed"] is False
    assert "REFUSED" in (out / "report.md").read_text() and "REFUSED" in res.stdout
    junit = (out / "j.xml").read_text()
    assert 'errors="1"' in junit and '<testcase classname="mhaexport" name="folder">' in junit
    assert '<error message="refused: ' in junit
    # without -o the report would go into the refused folder: nothing is written there, the JUnit file still is
    res = CliRunner().invoke(main, ["verify", str(folder), "--junit", str(tmp_path / "j2.xml"), "--runtime", "ort-cpu"])
    assert res.exit_code == 2 and (tmp_path / "j2.xml").is_file(), res.output
    assert digest(folder) == before  # the refused folder is as it was


def run_shell(script: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONUNBUFFERED": "0"}
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, cwd=cwd, env=env, timeout=120)


def test_a_closed_stdout_keeps_the_report_and_the_verdicts_exit_code(export_copy, tmp_path):
    """`verify … | true` (stdout's reader gone before the report is printed): the report is written and the exit
    code is the verdict's (0), not 1 or 3."""
    cmd = f"{shlex_join([sys.executable, '-m', 'mhaexport', 'verify', str(export_copy)])}"
    p = run_shell(f"{cmd} -o r --junit r/j.xml --runtime ort-cpu | true; echo \"rc=${{PIPESTATUS[0]}}\" >&2",
                  tmp_path)
    assert "rc=0" in p.stderr and "Traceback" not in p.stderr, p.stderr
    assert json.loads((tmp_path / "r" / "report.json").read_text())["verdict"]["status"] == "passed"
    assert (tmp_path / "r" / "report.md").is_file() and (tmp_path / "r" / "j.xml").is_file()


@pytest.mark.parametrize("redirect", [">&- 2>&-", "2>&1 | head -c 1"])
def test_closed_or_broken_stdout_and_stderr_keep_a_refusals_report_and_exit_code(altered_export, tmp_path, redirect):
    """Closed descriptors (sys.stdout and sys.stderr are None) and a reader that leaves after one byte: the refused
    folder's report is still written, and the exit code stays 2."""
    cmd = shlex_join([sys.executable, "-m", "mhaexport", "verify", str(altered_export), "-o", "r", "--junit",
                      "r/j.xml", "--runtime", "ort-cpu"])
    p = run_shell(f"{cmd} {redirect}; echo \"rc=${{PIPESTATUS[0]}}\" >rc.txt", tmp_path)
    assert (tmp_path / "rc.txt").read_text().strip() == "rc=2", p.stdout + p.stderr
    assert json.loads((tmp_path / "r" / "report.json").read_text())["verdict"]["status"] == "refused"
    assert (tmp_path / "r" / "j.xml").is_file()


def shlex_join(args: list[str]) -> str:
    import shlex

    return shlex.join(args)


# ---- outputs never clobber inputs -----------------------------------------------------------------------------------

@pytest.mark.parametrize("args,said", [
    (["verify", "{F}", "-o", "r", "--junit", "{F}/model.onnx"], "--junit {F}/model.onnx is a file of {F}"),
    (["verify", "{F}", "-o", "r", "--junit", "{F}/manifest.json"], "--junit {F}/manifest.json is a file of {F}"),
    (["verify", "{F}", "-o", "r", "--junit", "{F}/genai_config.json"], "is a file of {F}"),
    (["verify", "{F}", "-o", "r", "--junit", "{F}/.mhaexport.lock"], "is a file of {F}"),
    (["verify", "{F}", "-o", "r", "--junit", "./{F}/../{F}/model.pt"], "is a file of {F}"),
    (["verify", "{F}", "-o", "r", "--junit", "link.xml"], "--junit link.xml is a file of {F}"),
    (["verify", "{F}", "-o", "r", "--junit", "r/report.json"], "is the report this run writes into r"),
    (["verify", "{F}", "--junit", "{F}/report.md"], "is the report this run writes into {F}"),
    (["all", "--config", "tiny", "-o", "OUT", "--junit", "OUT/model.onnx"], "is a file of the export OUT"),
    (["all", "--config", "tiny", "-o", "OUT", "--junit", "OUT/report.json"], "the report this run writes into OUT"),
    (["quantize", "{F}", "-o", "./{F}/"], "is the folder this command reads"),
    (["report", "merge", "old/report.json", "-o", "old"], "would write report.json over the input old/report.json"),
])
def test_outputs_never_replace_inputs(export_copy, cwd, args, said):
    shutil.copytree(export_copy, cwd / "F")
    (cwd / "link.xml").symlink_to(cwd / "F" / "model.onnx")
    (cwd / "old").mkdir()
    (cwd / "old" / "report.json").write_text("{}")
    before = digest(cwd)
    msg = cli_error([a.replace("{F}", "F") for a in args])
    assert said.replace("{F}", "F") in msg and "outputs never replace" in msg or "is the folder" in msg, msg
    assert digest(cwd) == before and not (cwd / "OUT").exists() and not (cwd / "r").exists()


def test_another_model_or_module_goes_into_a_folder_only_with_replace(export_copy, tmp_path):
    folder = tmp_path / "F"
    shutil.copytree(export_copy, folder)
    (folder / "report.md").write_text("## mhaexport verify: ✅ PASSED\n")  # a stale verdict of the decoder
    before = digest(folder)
    for args in (["onnx", "--config", "tiny", "--module", "attention"], ["torchscript", "--config", "tiny-llama"],
                 ["all", "--config", "tiny-llama"], ["pt2", "--config", "tiny", "--module", "attention"]):
        msg = cli_error([*args, "-o", str(folder)])
        assert f"{folder} holds a decoder" in msg and "give --replace" in msg, msg
    assert digest(folder) == before
    res = CliRunner().invoke(main, ["torchscript", "--config", "tiny", "--module", "attention", "-o", str(folder),
                                    "--replace"])
    assert res.exit_code == 0, res.output
    assert "replaced a decoder" in res.stderr
    left = sorted(p.name for p in folder.iterdir() if not p.name.startswith("."))  # the lock stays
    assert left == ["manifest.json", "model.pt"]  # no model.onnx, genai_config.json, stale report
    manifest = json.loads((folder / "manifest.json").read_text())
    assert list(manifest["artifacts"]) == ["torchscript"] and manifest["model"]["contract"]["kind"] == "attention"
    # quantize into a folder that holds another model (now the block): refused before any work, naming both
    before = digest(folder)
    msg = cli_error(["quantize", str(export_copy), "-o", str(folder)])
    assert f"{folder} holds the attention block" in msg and "this export is a decoder" in msg, msg
    assert digest(folder) == before


# ---- no exit 3 on user input ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("args", [
    ["verify", "{F}", "--seed", "-1"], ["verify", "{F}", "--seed", str(2**32)], ["all", "--seed", "-1", "-o", "x"],
    ["generate", "{F}", "--prompt-ids", "1,2", "--seed", "-1"],
])
def test_a_seed_out_of_range_is_bad_input(export_copy, cwd, args):
    msg = cli_error([a.replace("{F}", str(export_copy)) for a in args])
    assert "Invalid value for '--seed'" in msg and "0<=x<=4294967295" in msg
    assert not (cwd / "x").exists()


@pytest.mark.parametrize("field,value,said", [
    ("max_positions", 1e12, "must be a positive integer"),
    ("max_positions", 99999999999, "above the most this toolkit builds"),
    ("vocab_size", 10**10, "above the most"),
    ("d_model", 10**6, "above the most"),
    ("n_layers", 100000, "above the most"),
    ("layer_norm_eps", "x", "must be a finite positive number"),
    ("rope_theta", float("inf"), "c.json: Infinity is not JSON"),  # the strict reader refuses it, naming the file
    ("seed", -1, "'seed' must be an integer from 0"),
    ("tie_embeddings", "yes", "must be true or false"),
])
def test_absurd_config_values_are_one_line(cwd, field, value, said):
    cfg = {"vocab_size": 256, "d_model": 64, "n_heads": 4, "n_layers": 2, "d_ff": 256, "max_positions": 128,
           field: value}
    (cwd / "c.json").write_text(json.dumps(cfg))
    msg = cli_error(["onnx", "--config", "c.json", "-o", "x"])
    assert said in msg and (field in msg or "is not JSON" in said), msg
    assert not (cwd / "x" / "model.onnx").exists()


def test_the_config_bounds_leave_room_for_big_models():
    from mhaexport.models.config import DecoderConfig

    c = DecoderConfig(vocab_size=128256, d_model=4096, n_heads=32, n_kv_heads=8, n_layers=32, d_ff=14336,
                      max_positions=131072, norm="rmsnorm", mlp="swiglu", positions="rope", tie_embeddings=False)
    assert 7e9 < c.parameters < 9e9  # Llama-3-8B's shape is accepted


def test_quantize_of_a_rehashed_corrupt_model_is_bad_input(export_copy, cwd):
    folder = cwd / "c"
    shutil.copytree(export_copy, folder)
    junk = bytes(range(256)) * 20
    (folder / "model.onnx").write_bytes(junk)
    manifest_edit(folder, lambda d: d["artifacts"]["onnx"]["files"]["model.onnx"].update(
        sha256=hashlib.sha256(junk).hexdigest(), bytes=len(junk)))
    msg = cli_error(["quantize", "c", "-o", "q"])
    assert msg.startswith("Error: c/model.onnx is not a readable ONNX model"), msg
    assert not (cwd / "q" / "model.onnx").exists()


@pytest.mark.parametrize("junit,said", [
    ("{long}/j.xml", "longer than the file system takes"),
    ("deep/{long}.xml", "longer than the file system takes"),
    ("afile/j.xml", "is not a writable folder"),
])
def test_junit_paths_that_cannot_be_written_are_refused_before_work(export_copy, cwd, junit, said):
    (cwd / "afile").write_text("x")
    msg = cli_error(["verify", str(export_copy), "-o", "r", "--junit", junit.replace("{long}", "x" * 300)])
    assert said in msg and not (cwd / "r").exists()


@pytest.mark.parametrize("args", [
    ["eval", "{F}", "--text", "fifo"], ["verify", "{F}", "--text", "fifo"],
    ["onnx", "--config", "tiny", "--checkpoint", "fifo", "-o", "x"], ["onnx", "--config", "fifo.json", "-o", "x"],
    ["onnx", "--model", "fifo.py:make", "-o", "x"], ["lint", "fifo.onnx"], ["report", "merge", "fifo", "-o", "x"],
    ["verify", "fifo.onnx", "--config", "tiny"],
])
def test_a_fifo_the_user_names_is_refused_not_opened(export_copy, cwd, args):
    for name in ("fifo", "fifo.json", "fifo.py", "fifo.onnx"):
        os.mkfifo(cwd / name)
    msg = cli_error([a.replace("{F}", str(export_copy)) for a in args])
    assert "not a regular file" in msg or "neither a folder nor a regular file" in msg, msg


def test_read_text_refuses_a_fifo_without_blocking(cwd):
    from mhaexport.api import read_text
    from mhaexport.core.errors import ConfigError

    os.mkfifo(cwd / "fifo")
    with pytest.raises(ConfigError, match="is not a regular file") as e:
        read_text(str(cwd / "fifo"))
    assert e.value.cli == f"--text {cwd / 'fifo'} is not a regular file (a FIFO, socket or device): give a text file"


def test_ctrl_c_inside_torch_onnx_export_exits_130_not_export_failed(cwd, monkeypatch):
    """torch.onnx.export wraps what it meets (here a KeyboardInterrupt) in its own error; the exporter wraps that in
    ExportError: the CLI still sees the interrupt (exit 130, "interrupted"), and no model file is left."""
    import torch

    def interrupted_export(*args, **kwargs):
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt as e:
            raise RuntimeError("Failed to export the model with torch.export") from e

    monkeypatch.setattr(torch.onnx, "export", interrupted_export)
    monkeypatch.setenv("MHAEXPORT_TRACE", "fresh")  # traced now: a trace this user's cache holds would not call it
    res = CliRunner().invoke(main, ["onnx", "--config", "tiny", "-o", "out"])
    assert res.exit_code == 130, res.output
    assert "interrupted" in res.stderr and "export failed" not in res.output.lower()
    assert not (cwd / "out" / "model.onnx").exists()


@pytest.mark.parametrize("args", [
    ["verify", "{F}", "-o", "{L}"], ["all", "--config", "tiny", "-o", "{L}"], ["quantize", "{F}", "-o", "{L}"],
    ["report", "merge", "old.json", "-o", "{L}"], ["onnx", "--config", "{L}.json", "-o", "x"],
    ["onnx", "--config", "tiny", "--checkpoint", "{L}", "-o", "x"], ["verify", "{L}"], ["eval", "{L}"],
    ["generate", "{L}", "--prompt-ids", "1"], ["verify", "loop/x", "--config", "tiny"], ["eval", "loop"],
])
def test_a_path_no_file_system_takes_is_bad_input_whichever_verb(export_copy, cwd, args):
    """ENAMETOOLONG (a 300-byte name) and ELOOP (a symlink to itself), wherever a verb meets them: exit 2, one line."""
    (cwd / "old.json").write_text("{}")
    (cwd / "loop").symlink_to("loop")
    msg = cli_error([a.replace("{F}", str(export_copy)).replace("{L}", "y" * 300) for a in args])
    assert "File name too long" in msg or "Too many levels of symbolic links" in msg or "loop" in msg, msg
    assert not (cwd / "x").exists()


def test_a_size_no_machine_holds_is_bad_input(export_copy, cwd, monkeypatch):
    """eval --max-bytes above 1 GiB is refused by its range; a MemoryError a huge option causes deeper down (numpy's
    "Unable to allocate 233 TiB" for bench --batches 1,1e12) is exit 2 with one line, not a bug's exit 3."""
    msg = cli_error(["eval", str(export_copy), "--max-bytes", str(10**12), "--text", "t.txt"])
    assert "--max-bytes" in msg and "1073741824" in msg

    def huge(*args, **kwargs):
        raise MemoryError("Unable to allocate 233. TiB for an array with shape (1000000000000, 32)")

    import mhaexport.evaluate.perplexity

    monkeypatch.setattr(mhaexport.evaluate.perplexity, "evaluate_folder", huge)
    msg = cli_error(["eval", str(export_copy)])
    assert msg.startswith("Error: out of memory (MemoryError: Unable to allocate 233. TiB") and "smaller" in msg


def test_the_api_writes_a_refused_folders_report_where_asked(altered_export, tmp_path):
    import mhaexport
    from mhaexport.core.errors import ArtifactError

    with pytest.raises(ArtifactError, match="does not match the manifest"):
        mhaexport.verify(altered_export, runtimes=["ort-cpu"], output=tmp_path / "r", junit=tmp_path / "j.xml")
    report = json.loads((tmp_path / "r" / "report.json").read_text())
    assert report["verdict"]["status"] == "refused" and 'errors="1"' in (tmp_path / "j.xml").read_text()


@pytest.mark.parametrize("path,value,said", [
    (("model", "contract"), "x", "manifest.json: model.contract is 'x' (str), expected an object"),
    (("model", "contract", "n_layers"), "2", "manifest.json: model.contract.n_layers is '2' (str), expected int"),
    (("model", "contract", "windows"), 2, "manifest.json: model.contract.windows is 2 (int), expected an array of int "
                                          "or null"),
    (("model", "source", "name"), 5, "manifest.json: model.source.name is 5 (int), expected str"),
    (("model", "source"), {"kind": "hf"}, "manifest.json: model.source: a Hugging Face source names a folder (path) "
                                          "or a Hub model (repo_id), found neither"),
    (("model", "source"), {"kind": "factory", "callable": "f"}, "manifest.json: model.source: a factory source names "
                                                                "a file or a module (one of them), found neither"),
    (("model", "source"), {"kind": 7}, "manifest.json: model.source.kind is 7 (int), expected str or null"),
    (("model", "spec"), [], "manifest.json: model.spec is an array, expected str"),
    (("model", "fingerprint"), None, "manifest.json: model.fingerprint is null, expected str"),
    (("artifacts", "onnx", "static_sizes"), "x", "artifacts.onnx.static_sizes is 'x' (str), expected an object or "
                                                 "null"),
    (("artifacts", "onnx", "static_sizes"), {"sequence_length": "1"}, "artifacts.onnx.static_sizes.sequence_length "
                                                                      "is '1' (str), expected int"),
    (("artifacts", "onnx", "seq_dynamic"), "yes", "artifacts.onnx.seq_dynamic is 'yes' (str), expected bool"),
    (("artifacts", "onnx", "warnings"), [1], "artifacts.onnx.warnings[0] is 1 (int), expected str"),
    (("artifacts", "torchscript", "format"), 5, "artifacts.torchscript.format is 5 (int), expected str"),
])
def test_a_wrongly_typed_manifest_field_is_named_not_a_crash(export_copy, tmp_path, path, value, said):
    folder = tmp_path / "f"
    shutil.copytree(export_copy, folder)

    def edit(d):
        for key in path[:-1]:
            d = d[key]
        d[path[-1]] = value

    manifest_edit(folder, edit)
    msg = cli_error(["verify", str(folder), "-o", str(tmp_path / "r"), "--runtime", "ort-cpu"])
    assert said in msg, msg
    assert json.loads((tmp_path / "r" / "report.json").read_text())["verdict"]["status"] == "refused"
