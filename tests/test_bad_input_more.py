"""Bad input that used to end in exit 3, hang, or be recorded as given (issue 18, item 3): each is now exit 2 with
one line, refused before any work where the options alone tell. Cases that need no export give a folder that does
not exist: the refusal must come first."""

from __future__ import annotations

import json
import os

import pytest
from click.testing import CliRunner

from mhaexport.cli import main
from mhaexport.core.errors import ArtifactError, ConfigError
from test_bad_input import cli_error

CORES = os.cpu_count() or 1


@pytest.fixture()
def cwd(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


# ---- quantize: block sizes, contradictory or meaningless options, a block on its own ---------------------------

@pytest.mark.parametrize("size", ["512", "65536", str(2**30), "8", "48"])
def test_quantize_block_sizes_ort_cannot_take(cwd, size):
    (cwd / "empty").mkdir()  # a folder that is there (a missing one is refused first, at parse time)
    msg = cli_error(["quantize", "empty", "-o", "q", "--block-size", size])
    assert msg == f"Error: --block-size {size}: ONNX Runtime's MatMulNBits takes only 16, 32, 64, 128, 256"
    assert not (cwd / "q").exists()


@pytest.mark.parametrize("args,message", [
    (["--keep-float", "none,lm_head"], "Error: Invalid value for '--keep-float': 'none,lm_head': none (everything "
                                       "quantized) contradicts lm_head; give one or the other"),
    (["--weights", "int8", "--int8-blocks", "3"], "Error: --int8-blocks 3 applies to --weights int4 (it puts the "
                                                  "first blocks in 8 bits); with --weights int8 every block already is"),
])
def test_quantize_contradictory_options(cwd, args, message):
    (cwd / "empty").mkdir()
    assert cli_error(["quantize", "empty", "-o", "q", *args]) == message
    assert not (cwd / "q").exists()


def test_quantize_more_int8_blocks_than_the_model_has(tiny_export, cwd):
    msg = cli_error(["quantize", str(tiny_export), "-o", "q", "--int8-blocks", "100"])
    assert msg == "Error: --int8-blocks 100: the model has 2 decoder block(s)"
    assert not (cwd / "q").exists()


def test_quantize_refuses_an_attention_block_before_quantizing(cwd, monkeypatch):
    from mhaexport.exporter import quantize
    from mhaexport.exporter.block import export_module_onnx
    from mhaexport.models.block import load_block

    export_module_onnx(load_block("tiny", None), cwd / "block")
    monkeypatch.setattr(quantize, "quantize_model", lambda *a: pytest.fail("quantized before refusing"))
    msg = cli_error(["quantize", "block", "-o", "q"])
    assert msg == ("Error: block holds the attention block on its own (`--module attention`), not a decoder: only "
                   "`mhaexport verify` reads such a folder")
    assert not (cwd / "q").exists()


# ---- report merge: a report of the right schema with fields of the wrong type --------------------------------

def _report_dict() -> dict:
    from mhaexport.verify.results import CHECKS, CheckResult
    from mhaexport.artifact.record import Environment
    from mhaexport.verify.report import ReportModel, RuntimeInfo, SweepInfo, ToleranceInfo, VerifyReport

    runtimes = {rt: RuntimeInfo(rt, "ran", providers=["CPUExecutionProvider"]) for rt in ("eager", "ort-cpu")}
    results = {rt: {c: CheckResult(c, True, {}, "") for c in CHECKS} for rt in runtimes}
    return VerifyReport(model=ReportModel("preset:tiny"), folder="x", sweep=SweepInfo("quick", 0, 9),
                        tolerance=ToleranceInfo(1e-4, 1e-3), runtimes=runtimes, results=results,
                        environment=Environment(host="box")).to_dict()


def _set(data: dict, path: str, value) -> None:
    *parents, last = path.split("/")
    for key in parents:
        data = data[key]
    data[last] = value


@pytest.mark.parametrize("path,value,message", [
    ("runtimes", "oops", "field runtimes is 'oops' (str), expected an object"),
    ("results", [1, 2], "field results is an array, expected an object"),
    ("runtimes/ort-cpu", None, "field runtimes.ort-cpu is null, expected an object"),
    ("runtimes/ort-cpu/status", "fine", "field runtimes.ort-cpu.status is 'fine' (str), expected 'ran', 'skipped' or "
                                        "'error'"),
    ("results/ort-cpu/parity/status", "yes", "field results.ort-cpu.parity.status is 'yes' (str), expected bool or "
                                              "null"),
    ("results/ort-cpu/parity/figures", [], "field results.ort-cpu.parity.figures is an array, expected an object"),
    ("tolerance/atol", "tight", "field tolerance.atol is 'tight' (str), expected float"),
    ("sources", "a", "field sources is 'a' (str), expected an array of str"),
    ("model/source", "hf", "field model.source is 'hf' (str), expected an object or null"),
    ("cross", [{"a": "x"}], "field cross[0].b is missing, expected str"),
    ("lint", {"findings": [{"severity": "fatal", "rule": "r", "node": "n", "message": "m", "fix": "f"}]},
     "field lint.findings[0].severity is 'fatal' (str), expected 'error', 'warning' or 'info'"),
    ("sweep/shapes", [{"batch": 1}], "field sweep.shapes[0].seq is missing, expected int"),
])
def test_report_merge_of_a_report_with_fields_of_the_wrong_type(cwd, path, value, message):
    good, bad = _report_dict(), _report_dict()
    _set(bad, path, value)
    (cwd / "good.json").write_text(json.dumps(good))
    (cwd / "bad.json").write_text(json.dumps(bad))
    msg = cli_error(["report", "merge", "good.json", "bad.json", "-o", "merged"])
    assert msg.startswith(f"Error: report bad.json: {message}"), msg
    assert not (cwd / "merged").exists()
    from mhaexport.verify.report import load_report

    with pytest.raises(ArtifactError, match=r"report .*bad.json: field "):
        load_report(cwd / "bad.json")
    load_report(cwd / "good.json")


def test_report_merge_keeps_a_field_it_does_not_know(cwd):
    """A field a newer mhaexport wrote is kept, read and written back (the records' ``extra``), not refused."""
    data = _report_dict()
    data["runtimes"]["ort-cpu"]["colour"] = "red"
    (cwd / "a.json").write_text(json.dumps(data))
    (cwd / "b.json").write_text(json.dumps(_report_dict()))
    r = CliRunner().invoke(main, ["report", "merge", "a.json", "b.json", "--name", "a", "--name", "b", "-o", "m"])
    assert r.exit_code == 0, r.output
    merged = json.loads((cwd / "m" / "report.json").read_text())
    assert merged["runtimes"]["ort-cpu@a"]["colour"] == "red" and "colour" not in merged["runtimes"]["ort-cpu@b"]


# ---- eval / verify --text: a bounded read ---------------------------------------------------------------------

def test_eval_text_that_never_ends(cwd):
    """A device that never ends is not a text file: refused before it is opened (issue 25: a FIFO would hang)."""
    for verb in ("eval", "verify"):
        msg = cli_error([verb, "nofolder", "--text", "/dev/zero"])
        assert msg == ("Error: Invalid value for --text: /dev/zero is not a regular file (a FIFO, socket or device "
                       "would block the read)")


def test_eval_text_above_the_cap(cwd):
    (cwd / "big.txt").write_bytes(b"a" * (2 << 20))
    (cwd / "empty").mkdir()
    msg = cli_error(["eval", "empty", "--text", "big.txt"])
    assert msg == ("Error: --text big.txt holds 2097152 bytes, above the cap of 1048576 (--max-bytes): give a shorter "
                   "text or raise --max-bytes")
    (cwd / "small.txt").write_bytes(b"some text")
    msg = cli_error(["eval", "empty", "--text", "small.txt", "--max-bytes", "4"])
    assert msg == ("Error: --text small.txt holds 9 bytes, above the cap of 4 (--max-bytes): give a shorter text or "
                   "raise --max-bytes")


# ---- MHAEXPORT_LOCK_TIMEOUT ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("value", ["abc", "-1", "nan", "inf"])
def test_lock_timeout_that_is_not_seconds(cwd, monkeypatch, value):
    monkeypatch.setenv("MHAEXPORT_LOCK_TIMEOUT", value)
    line = (f"Error: MHAEXPORT_LOCK_TIMEOUT={value!r}: expected seconds to wait for another writer (a number >= 0)")
    assert cli_error(["onnx", "--config", "nope", "-o", "out"]) == line  # before the model is even looked up
    (cwd / "empty").mkdir()
    assert cli_error(["quantize", "empty", "-o", "q"]) == line
    assert not (cwd / "out").exists() and not (cwd / "q").exists()
    from mhaexport.artifact import FolderLock

    with pytest.raises(ConfigError, match="MHAEXPORT_LOCK_TIMEOUT"):
        FolderLock(cwd, "test")
    monkeypatch.setenv("MHAEXPORT_LOCK_TIMEOUT", "2.5")
    assert FolderLock(cwd, "test").timeout == 2.5


def test_lock_timeout_as_a_real_subprocess(tmp_path):
    import subprocess
    import sys

    env = {**os.environ, "MHAEXPORT_LOCK_TIMEOUT": "abc"}
    (tmp_path / "empty").mkdir()
    proc = subprocess.run([sys.executable, "-m", "mhaexport", "quantize", "empty", "-o", "q"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == ["Error: MHAEXPORT_LOCK_TIMEOUT='abc': expected seconds to wait for "
                                                "another writer (a number >= 0)"]


# ---- verify --quality: thresholds within their figure's range ----------------------------------------------------

@pytest.mark.parametrize("given,message", [
    ("top1=2", "top1=2: top-1 agreement thresholds are in [0, 1]"),
    ("greedy=-0.5", "greedy=-0.5: greedy agreement thresholds are in [0, 1]"),
    ("kl_mean=nan", "kl_mean=nan: KL mean thresholds are a finite number >= 0"),
    ("kl_p99=-1", "kl_p99=-1: KL p99 thresholds are a finite number >= 0"),
    ("logit_err=inf", "logit_err=inf: relative logit error thresholds are a finite number >= 0"),
    ("ppl_ratio=0.5", "ppl_ratio=0.5: perplexity ratio thresholds are a finite number >= 1"),
])
def test_quality_threshold_outside_its_figures_range(cwd, given, message):
    assert cli_error(["verify", "nofolder", "--quality", given]) == f"Error: Invalid value for '--quality': {message}"
    from mhaexport.verify.quality import Thresholds

    name, _, value = given.partition("=")
    with pytest.raises(ConfigError, match=r"--quality " + message.replace("[", r"\[").replace("]", r"\]")):
        Thresholds().with_overrides({name: float(value)})
    assert Thresholds().with_overrides({"top1": 1.0, "ppl_ratio": 1.0, "kl_mean": 0.0}).top1 == 1.0


# ---- the smaller ones -----------------------------------------------------------------------------------------

def test_lint_of_an_empty_onnx_file(cwd):
    (cwd / "empty.onnx").write_bytes(b"")
    assert cli_error(["lint", "empty.onnx"]) == "Error: empty.onnx is not a readable ONNX model: it holds no graph " \
                                                "(0 bytes)"


def test_bench_threads_beyond_the_cores(cwd):
    msg = cli_error(["bench", "nofolder", "--threads", "1000"])
    assert msg == (f"Error: Invalid value for '--threads': 1000: this machine has {CORES} CPU core(s); give at most "
                   f"{CORES}")
    assert cli_error(["generate", "nofolder", "--prompt-ids", "1", "--threads", str(CORES + 1)]).endswith(
        f"this machine has {CORES} CPU core(s); give at most {CORES}")


def test_max_positions_too_small_for_the_export(cwd):
    (cwd / "one.json").write_text(json.dumps({"d_model": 32, "n_heads": 2, "n_layers": 1, "max_positions": 1}))
    msg = cli_error(["onnx", "--config", "one.json", "-o", "out"])
    assert msg == "Error: max_positions=1: at least 8 (the export traces 3 new tokens after a cache of 5)"
    assert not (cwd / "out").exists()
    from mhaexport.models.config import DecoderConfig

    with pytest.raises(ConfigError, match="max_positions=7: at least 8"):
        DecoderConfig(max_positions=7)
    assert DecoderConfig(max_positions=8).max_positions == 8


def test_max_cache_with_the_concat_cache_before_the_model(cwd):
    msg = cli_error(["onnx", "--config", "nope", "--max-cache", "64", "-o", "out"])  # refused before the model
    assert msg == "Error: --max-cache sizes a shared cache: give it with --kv-cache shared"
    assert not (cwd / "out").exists()
