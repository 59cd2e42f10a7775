"""The CLI through click's CliRunner, and once as a real subprocess."""

from __future__ import annotations

import json
import subprocess
import textwrap
import sys

import pytest
from click.testing import CliRunner

from mhaexport.cli import main


@pytest.fixture()
def runner():
    return CliRunner()


def test_help_lists_verbs(runner):
    result = runner.invoke(main, ["--help"])
    assert result.exit_code == 0
    for verb in ("onnx", "torchscript"):
        assert verb in result.output
    for verb in ("onnx", "torchscript"):
        sub = runner.invoke(main, [verb, "--help"])
        assert sub.exit_code == 0 and "--config" in sub.output and "--model" in sub.output


@pytest.mark.slow  # ~6 s: both exports through the CLI into one folder
def test_onnx_and_torchscript_into_one_folder(runner, tmp_path):
    out = tmp_path / "exp"
    r1 = runner.invoke(main, ["onnx", "--config", "tiny", "--seq-dynamic", "-o", str(out)])
    assert r1.exit_code == 0, r1.output
    assert "model.onnx" in r1.output
    r2 = runner.invoke(main, ["torchscript", "--config", "tiny", "-o", str(out)])
    assert r2.exit_code == 0, r2.output
    manifest = json.loads((out / "manifest.json").read_text())
    assert set(manifest["artifacts"]) == {"onnx", "torchscript"}
    assert "torch.jit is deprecated" in r2.output  # said once
    assert r2.output.count("deprecated") == 1
    names = {p.name for p in out.iterdir()}
    assert {"manifest.json", "model.onnx", "model.pt"} <= names
    # no staging leftovers; the writers' lock file stays (an empty file: flock locks live on its inode)
    assert not [n for n in names if (n.startswith(".") or n.endswith(".tmp")) and n != ".mhaexport.lock"]
    assert (out / ".mhaexport.lock").read_text() == ""


@pytest.mark.parametrize("args,message", [
    (["onnx", "--config", "nope"], "unknown config 'nope'"),
    (["onnx", "--model", "not_a_module_abc:make"], "cannot import not_a_module_abc"),
    (["torchscript", "--checkpoint", "/no/such.pt", "--config", "tiny"], "checkpoint /no/such.pt does not exist"),
    (["onnx", "--seq-static", "--config", "tiny"], "--seq-static needs --seq-len"),
    (["onnx", "--opset", "12"], "12 is not in the range 18<=x<=23"),
    (["onnx", "--config", "tiny", "--model", "x:y"], "give one of --config, --model, --hf, not --config and --model"),
])
def test_bad_input_exits_2_with_one_line(runner, args, message):
    result = runner.invoke(main, args)
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert "Traceback" not in result.output


def test_d_model_not_divisible(runner, tmp_path):
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"d_model": 100, "n_heads": 3}))
    result = runner.invoke(main, ["onnx", "--config", str(cfg), "-o", str(tmp_path / "o")])
    assert result.exit_code == 2
    assert "d_model=100 is not divisible by n_heads=3" in result.output
    assert not (tmp_path / "o").exists()  # nothing half-written


@pytest.mark.slow  # ~14 s: a real interpreter per call; test_export covers the user factory in-process
def test_real_subprocess_user_factory(tmp_path):
    out = tmp_path / "user"
    proc = subprocess.run([sys.executable, "-m", "mhaexport", "onnx", "--model", "examples/user_decoder.py:build",
                           "-o", str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "wrote" in proc.stdout
    assert json.loads((out / "manifest.json").read_text())["model"]["contract"]["vocab_size"] == 300
    bad = subprocess.run([sys.executable, "-m", "mhaexport", "onnx", "--config", "missing.json"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines()[-1] == "Error: config file missing.json does not exist"
    assert "Traceback" not in bad.stderr


def test_an_unexpected_exception_exits_3_not_1(runner, monkeypatch):
    """A crash must not read as 'verification failed' (1) or 'bad input' (2) in CI."""
    import mhaexport.models.loading as loading

    def boom(**_kwargs):
        raise ZeroDivisionError("planted")

    monkeypatch.setattr(loading, "load_model", boom)
    result = runner.invoke(main, ["onnx", "--config", "tiny"])
    assert result.exit_code == 3
    assert "internal error: this is a bug in mhaexport" in result.output


@pytest.mark.parametrize("args", [["verify", "{nope}"], ["verify", "{nope}", "--atol", "1e-3"],
                                  ["verify", "{nope}", "--bisect"], ["generate", "{nope}", "--prompt-ids", "1"],
                                  ["bench", "{nope}"], ["eval", "{nope}"], ["quantize", "{nope}", "-o", "{out}"],
                                  ["lint", "{nope}"]])
def test_a_missing_folder_is_refused_before_torch_or_onnx_is_imported(tmp_path, args):
    """A FOLDER that is not there is one line, exit 2, said before the verb imports torch, onnx or onnxruntime
    (seconds: `mhaexport verify out/nope` took 4.6 s to say so). Held in a fresh interpreter by what it imported."""
    import subprocess
    import sys

    argv = [a.format(nope=tmp_path / "nope", out=tmp_path / "out") for a in args]
    code = ("import sys\nfrom mhaexport.cli import main\n"
            f"try:\n    main({argv!r})\nexcept SystemExit as e:\n    code = e.code\n"
            "heavy = sorted(m for m in ('torch', 'onnx', 'onnxruntime', 'transformers') if m in sys.modules)\n"
            "print('exit', code, 'imported', heavy)\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.stdout.strip().splitlines()[-1] == "exit 2 imported []", (res.stdout, res.stderr)
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: ") and "nope" in lines[0], res.stderr


def test_verify_names_the_html_report_and_a_subset_run_says_what_it_left(tiny_export, tmp_path):
    """The last lines name report.html (the page to open); a run of named runtimes in the folder writes
    report-RUNTIMES.* and says that the report.md beside it is an earlier full run's, left as it was; generate on a
    model with random weights says its text is noise."""
    import shutil

    folder = tmp_path / "f"
    shutil.copytree(tiny_export, folder, ignore=shutil.ignore_patterns(".snapshot-*", ".staging-*"))
    res = CliRunner().invoke(main, ["verify", str(folder)])
    assert res.exit_code == 0, res.output
    assert (f"wrote {folder / 'report.json'}, {folder / 'report.md'} and {folder / 'report.html'} (open report.html"
            in res.output)
    res = CliRunner().invoke(main, ["verify", str(folder), "--runtime", "eager,ort-cpu"])
    assert res.exit_code == 0, res.output
    assert f"{folder / 'report-eager+ort-cpu.html'} (open report-eager+ort-cpu.html in a browser" in res.output
    assert "report-eager+ort-cpu.md: a run of named runtimes; report.md beside it is an earlier full run's" in res.output
    res = CliRunner().invoke(main, ["generate", str(folder), "--prompt-ids", "1,2", "--max-new-tokens", "2"])
    assert res.exit_code == 0 and "preset:tiny has random weights (its seeded init: no checkpoint): what it " \
                                  "generates is noise" in res.output, res.output


def test_the_console_script_ends_without_the_teardown_yet_runs_exit_handlers_and_flushes(tmp_path):
    """``run`` (the console script) ends with os._exit once the command's exit handlers ran and its output is
    flushed: the exit code, piped output, atexit and weakref.finalize handlers all as before."""
    code = textwrap.dedent(f"""
        import atexit, gc, sys, tempfile, weakref
        from mhaexport.cli import run
        kept = tempfile.TemporaryDirectory(dir={str(tmp_path)!r})  # removed by its weakref.finalize at exit
        atexit.register(lambda: print("atexit ran, gc threshold", gc.get_threshold()[0]))
        sys.argv = ["mhaexport"] + sys.argv[1:]
        run()
        print("never reached")
    """)
    ok = subprocess.run([sys.executable, "-c", code, "--version"], capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0 and "mhaexport, version" in ok.stdout
    assert "atexit ran, gc threshold 10000" in ok.stdout and "never reached" not in ok.stdout
    assert list(tmp_path.iterdir()) == []  # the temporary folder went
    bad = subprocess.run([sys.executable, "-c", code, "verify", str(tmp_path / "absent")], capture_output=True,
                         text=True, timeout=120)
    assert bad.returncode == 2 and "no such folder" in bad.stderr and "atexit ran" in bad.stdout
