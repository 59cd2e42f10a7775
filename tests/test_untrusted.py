"""Input from outside (issue 35, items 5 and 6): text shown escaped by the one function every renderer uses, JSON read
by the one bounded reader, model dimensions bounded — a name from a folder cannot clear the screen or forge a
"## ✅ passed" line, a JSON nested 100 000 deep is exit 2 naming the file, never a RecursionError (exit 3)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from mhaexport.artifact.record import Environment
from mhaexport.cli import main
from mhaexport.core.errors import ArtifactError, ConfigError, UntrustedInput
from mhaexport.terminal import to_terminal
from mhaexport.core.untrusted import MAX_JSON_DEPTH, check_dims, json_depth, load_json, shown
from mhaexport.verify import CHECKS
from mhaexport.verify.junit import to_junit_xml
from mhaexport.verify.render import markdown, write_report
from mhaexport.verify.report import ReportModel, RuntimeInfo, SweepInfo, ToleranceInfo, VerifyReport
from mhaexport.verify.results import CheckResult

ROOT = Path(__file__).resolve().parent.parent
# what a crafted folder or report writes into a name, a label or a message: clear the screen, print a green
# "verify passed", then a line of its own that forges a heading
EVIL = "m\x1b[2J\x1b[32mverify passed\x1b[0m\n## ✅ passed\r\u202eevil"
FORGED = re.compile(r"^\s*#+ ✅ passed", re.M)


def unescape_md(text: str) -> str:
    """Markdown text as it reads once rendered: each backslash escape (data escaped by ``md``) the character itself."""
    return re.sub(r"\\([!-/:-@\[-`{-~])", r"\1", text)


def _raw(text: str) -> list[str]:
    """What of EVIL reached ``text`` unescaped: the escape character, a forged heading line, a carriage return, the
    bidi override."""
    return [what for what, found in (("ESC", "\x1b" in text), ("forged heading", bool(FORGED.search(text))),
                                     ("CR", "\r" in text), ("RLO", "\u202e" in text)) if found]


def test_shown_escapes_what_moves_styles_or_breaks_a_line_and_keeps_the_rest():
    assert shown(EVIL) == "m\\x1b[2J\\x1b[32mverify passed\\x1b[0m\\n## ✅ passed\\r\\u202eevil"
    assert shown("naïve ✅ 模型 tab\there\x00\x7f\x85\u2028\ud800") == \
        "naïve ✅ 模型 tab\\there\\x00\\x7f\\x85\\u2028\\ud800"
    assert shown("plain text · ≥ 1e-4 | `x`") == "plain text · ≥ 1e-4 | `x`" and shown(None) == "None"


def _report(host: str = EVIL) -> VerifyReport:
    """A report whose spec, folder, host, runtime reason and check message all come from a crafted folder."""
    infos = {"eager": RuntimeInfo("eager", "ran", ""), "ort-cpu": RuntimeInfo("ort-cpu", "ran", ""),
             "ort-cuda": RuntimeInfo("ort-cuda", "skipped", EVIL)}
    results = {rt: {ch: CheckResult(ch, ch != "parity" or rt == "eager", {"max_abs": 1e-6}, EVIL) for ch in CHECKS}
               for rt in ("eager", "ort-cpu")}
    return VerifyReport(model=ReportModel(EVIL), folder=EVIL, sweep=SweepInfo("quick", 0, 9),
                        tolerance=ToleranceInfo(1e-4, 1e-3), runtimes=infos, results=results,
                        environment=Environment(host=host, platform=EVIL))


def test_every_renderer_shows_a_crafted_name_escaped(tmp_path):
    """report.md, the terminal, JUnit, a refused report, bench.md, lint: the crafted text is there, escaped."""
    from mhaexport.bench.render import markdown_body
    from mhaexport.verify.lint import Finding, LintReport
    from mhaexport.verify.report import refused_report

    rep = _report()
    md = markdown(rep)
    outputs = {"report.md": md, "terminal": to_terminal(md), "terminal styled": to_terminal(md, style=True),
               "refused report.md": markdown(refused_report(EVIL, EVIL)),
               "junit": to_junit_xml(rep, md).decode()}
    outputs["terminal styled"] = re.sub(r"\x1b\[[0-9;]*m", "", outputs["terminal styled"])  # mhaexport's own bold
    lint = LintReport(model=EVIL, findings=[Finding("error", "contract-io", EVIL, EVIL, EVIL)], rules=["contract-io"])
    outputs["lint"] = lint.to_markdown()
    bench = _bench_result()
    outputs["bench.md"] = markdown_body(bench)
    for where, text in outputs.items():
        assert _raw(text) == [], where
        seen = unescape_md(text) if where in ("report.md", "refused report.md", "lint", "bench.md") else text
        assert "\\x1b[2J" in seen and "\\n## ✅ passed" in seen, where
    written = write_report(rep, tmp_path)[1].read_text()
    assert _raw(written) == [] and written.count("\n## ") == 0


def _bench_result():
    from mhaexport.bench import BenchConfig, BenchResult, RuntimeBench
    from mhaexport.bench.result import BandwidthInfo, BenchModel

    bw = BandwidthInfo(read=10.0, probe="sum", threads=1, sum=10.0, mbytes=64, method="fake")
    rows = [RuntimeBench("ort-cpu", ran=True, label=EVIL, repeats=1, providers=["x"], token_p50_ms=1.0,
                         token_p90_ms=1.0, decode_total_ms=10.0),
            RuntimeBench("ort-cuda", ran=None, reason=EVIL, label="ort-cuda")]
    return BenchResult(EVIL, BenchConfig(prompt_len=8, new_tokens=8, threads=1), BenchModel(EVIL),
                       Environment(host=EVIL), 10.0, bw, 1000, 0.1, rows, notes=[EVIL])


def test_report_merge_shows_a_crafted_host_label_escaped(tmp_path):
    """Two crafted reports given to `report merge`: the merged report.md, the output and JUnit show it escaped."""
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        write_report(_report(host=f"{name}{EVIL}"), tmp_path / name, "report")
    r = CliRunner().invoke(main, ["report", "merge", str(tmp_path / "a"), str(tmp_path / "b"), "-o",
                                  str(tmp_path / "merged")])
    assert r.exit_code == 1, r.output  # the crafted checks failed: a verdict, not a crash
    merged = (tmp_path / "merged" / "report.md").read_text()
    for where, text in (("report.md", unescape_md(merged)), ("output", r.output)):
        assert _raw(text) == [] and "a m\\x1b[2J" not in text and "am\\x1b[2J" in text, where


@pytest.mark.slow  # two Python processes (the action's script, then mhaexport verify): a few seconds
def test_a_crafted_message_reaches_the_ci_step_summary_escaped(tmp_path):
    """The GitHub step summary: the verdict line (from report.json) and report.md show the crafted text escaped."""
    folder = tmp_path / "x\x1b[2Jy"
    folder.mkdir()
    (folder / "manifest.json").write_text('{"schema": "' + EVIL.replace("\n", "\\n").replace("\r", "\\r")
                                          + '"' + ", " + "[" * 200 + "]" * 200 + "}")  # refused: not an object key
    summary, output = tmp_path / "summary.md", tmp_path / "output.txt"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("INPUT_", "GITHUB_"))}
    env.update({"GITHUB_STEP_SUMMARY": str(summary), "GITHUB_OUTPUT": str(output), "GITHUB_ACTION_PATH": str(ROOT),
                "INPUT_INSTALL": "none", "INPUT_OUTPUT": str(tmp_path / "ci"), "INPUT_FOLDER": str(folder),
                "INPUT_NAME": "job\x1b[31m"})
    p = subprocess.run([sys.executable, str(ROOT / "scripts" / "ci_action.py")], capture_output=True, text=True,
                       env=env, cwd=tmp_path, timeout=300)
    text = unescape_md(summary.read_text())  # as it reads rendered (data is Markdown-escaped)
    assert p.returncode == 2 and "REFUSED" in text, p.stdout + p.stderr
    assert _raw(text) == [] and "x\\x1b[2Jy" in text and "job\\x1b[31m" in text


# --- one bounded JSON reader ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("raw, message", [
    (b"[" * 20_000 + b"]" * 20_000, "nested 20000 deep, deeper than the 64 levels"),
    (b'{"a":' * 5000 + b"1" + b"}" * 5000, "nested 5000 deep"),
    (b"\xff\xfe{}", "not UTF-8 text"),
    (b"1" * 5000, "not valid JSON"),
    (b'{"a": [1, 2}', "not valid JSON"),
    (b"", "not valid JSON"),
])
def test_the_reader_refuses_in_one_line_naming_the_file(raw, message):
    with pytest.raises(UntrustedInput, match=re.escape(message)) as e:
        load_json(raw, "DIR/tokenizer.json")
    assert str(e.value).startswith("DIR/tokenizer.json: ") and "\n" not in str(e.value)
    assert isinstance(e.value, ConfigError) and isinstance(e.value, ArtifactError)


def test_depth_counts_brackets_outside_strings_only():
    assert json_depth(b'{"a": "[[[[[[", "b": ["\\"[[", {"c": []}]}') == 4
    assert json_depth(b'"\\\\"') == 0 and json_depth(b"[[[") == 3 and json_depth(b"7") == 0
    deep_in_strings = json.dumps({"k": "[" * 10_000}).encode()
    assert load_json(deep_in_strings, "x") == {"k": "[" * 10_000}
    assert load_json(b"[" * MAX_JSON_DEPTH + b"]" * MAX_JSON_DEPTH, "x") is not None


def test_the_reader_bounds_size_and_never_opens_a_fifo(tmp_path):
    big = tmp_path / "big.json"
    big.write_bytes(b"[" + b"0," * 600 + b"0]")
    with pytest.raises(UntrustedInput, match="more than the 1000 a JSON file may hold"):
        load_json(big, "big.json", max_bytes=1000)
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    with pytest.raises(UntrustedInput, match="not a regular file"):
        load_json(fifo, "fifo.json")  # no writer: opening it to read would hang


def test_a_deep_manifest_and_config_file_are_refused_naming_the_file(tmp_path):
    folder = tmp_path / "f"
    folder.mkdir()
    (folder / "manifest.json").write_bytes(b"[" * 20_000 + b"]" * 20_000)
    r = CliRunner().invoke(main, ["lint", str(folder)])
    assert r.exit_code == 2 and "manifest.json: JSON nested 20000 deep" in r.output, r.output
    cfg = tmp_path / "cfg.json"
    cfg.write_bytes(b'{"n_layers":' + b"[" * 5000 + b"]" * 5000 + b"}")
    from mhaexport.models.config import load_config

    with pytest.raises(UntrustedInput, match=re.escape(f"config file {cfg}: JSON nested 5001 deep")):
        load_config(str(cfg))  # --config FILE.json: a ConfigError, exit 2


def test_model_dimensions_from_a_folder_are_bounded():
    ok = {"n_layers": 126, "n_heads": 128, "n_kv_heads": 8, "head_dim": 128, "vocab_size": 262_144,
          "max_positions": 131_072}
    check_dims(ok, "manifest field model.contract")
    with pytest.raises(UntrustedInput, match=r"model.contract.n_layers: 1000000000 is outside 1..1024"):
        check_dims({**ok, "n_layers": 10**9}, "manifest field model.contract")
    with pytest.raises(UntrustedInput, match="KV cache of 512 MiB a position"):
        check_dims({**ok, "n_layers": 1024, "n_kv_heads": 1024, "head_dim": 64}, "manifest field model.contract")
    with pytest.raises(UntrustedInput, match="n_heads: 0 is outside"):
        check_dims({**ok, "n_heads": 0}, "m")


def test_a_tensor_whose_dims_disagree_with_its_data_is_named():
    from onnx import TensorProto, helper

    from mhaexport.core.graph import tensor_size_error

    ok = helper.make_tensor("w", TensorProto.FLOAT, [2, 3], [0.0] * 6)
    raw = helper.make_tensor("r", TensorProto.FLOAT16, [4], b"\0" * 8, raw=True)
    assert tensor_size_error(ok) is None and tensor_size_error(raw) is None
    ok.dims[0] = 2_000_000_000  # what numpy would try to reshape (or allocate) to
    assert tensor_size_error(ok) == "dims [2000000000, 3] declare 6000000000 values of data, the tensor holds 6"
    raw.dims[0] = -1
    assert tensor_size_error(raw) == "dims [-1] hold a negative size"


def test_lint_and_verify_refuse_an_initializer_whose_dims_disagree_with_its_data(tiny_export, tmp_path):
    import hashlib
    import shutil

    import onnx

    folder = tmp_path / "f"
    shutil.copytree(tiny_export, folder)
    model = onnx.load(str(folder / "model.onnx"))
    t = next(t for t in model.graph.initializer if len(t.dims) == 2 and t.raw_data)
    t.dims[0] *= 1000
    onnx.save(model, str(folder / "model.onnx"))
    manifest = json.loads((folder / "manifest.json").read_text())  # re-hashed, as someone preparing it would
    data = (folder / "model.onnx").read_bytes()
    manifest["artifacts"]["onnx"]["files"]["model.onnx"] = {"sha256": hashlib.sha256(data).hexdigest(),
                                                            "bytes": len(data)}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    for args in (["lint", folder], ["verify", folder, "--runtime", "ort-cpu", "-o", tmp_path / "out"]):
        r = CliRunner().invoke(main, [str(a) for a in args])
        assert r.exit_code == 2, r.output
        assert r.output.strip().splitlines()[-1] == (f"Error: {folder}/model.onnx: tensor {t.name!r}: dims "
                                                     f"{list(t.dims)} declare {t.dims[0] * t.dims[1] * 4} bytes of "
                                                     f"data, the tensor holds {len(t.raw_data)}: refused")


def test_bisect_reads_only_a_case_name_from_a_report_nobody_hashed(tmp_path):
    """A report.json in the folder names the worst case; its shapes are verify's own sweep's, so a crafted report
    cannot make bisect allocate a batch of a million rows."""
    from mhaexport.diagnose.bisect import case_of_report
    from mhaexport.core.iospec import ModelContract

    contract = ModelContract(n_layers=2, n_heads=4, head_dim=16, vocab_size=256, max_positions=128)
    for worst, expected in (("b=1000000 seq=4 past=0", None), ("b=3 seq=11 past=6 pad=[0, 2, 9]", (3, 11, 6))):
        rep = _report(host="h")
        rep.results["ort-cpu"]["parity"] = CheckResult("parity", False, {"worst_case": worst}, "failed")
        path = write_report(rep, tmp_path, "report")[0]
        found = case_of_report(path, contract)
        assert (found and (found[0].batch, found[0].seq, found[0].past)) == (expected or None), worst


def test_a_folders_json_files_are_bounded_at_open_and_a_nul_in_a_source_is_refused(tiny_export, tmp_path):
    """Every JSON file a folder lists (a tokenizer's, read later by tokenizers or onnxruntime-genai's C++ parser) is
    bounded when the folder is opened; a manifest source path holding a NUL is refused: both exit 2, one line."""
    import hashlib
    import shutil

    deep, nul = tmp_path / "deep", tmp_path / "nul"
    for folder in (deep, nul):
        shutil.copytree(tiny_export, folder)
    (deep / "tokenizer_config.json").write_bytes(b'{"a": ' + b"[" * 3000 + b"]" * 3000 + b"}")
    manifest = json.loads((deep / "manifest.json").read_text())
    data = (deep / "tokenizer_config.json").read_bytes()
    manifest["artifacts"]["onnx"]["files"]["tokenizer_config.json"] = {"sha256": hashlib.sha256(data).hexdigest(),
                                                                        "bytes": len(data)}
    (deep / "manifest.json").write_text(json.dumps(manifest))
    manifest = json.loads((nul / "manifest.json").read_text())
    manifest["model"]["source"] = {"kind": "hf", "path": "../hf\x00/x"}
    (nul / "manifest.json").write_text(json.dumps(manifest))
    odd = tmp_path / "odd"
    shutil.copytree(tiny_export, odd)
    manifest = json.loads((odd / "manifest.json").read_text())
    manifest["artifacts"]["onnx"]["files"]["\ud800\n.bin"] = {"sha256": "0" * 64, "bytes": 1}
    (odd / "manifest.json").write_text(json.dumps(manifest))
    for folder, line in ((deep, f"Error: {deep}/tokenizer_config.json: JSON nested 3001 deep, deeper than the 64 "
                                "levels mhaexport reads: refused"),
                         (odd, f"Error: {odd}/manifest.json: artifacts.onnx.files: '\\ud800\\n.bin' holds a control "
                               "character or a character no file system name holds; mhaexport reads only files inside "
                               "the folder: refused"),
                         (nul, f"Error: {nul}/manifest.json: model.source.path: '../hf\\x00/x' holds a NUL: refused")):
        r = CliRunner().invoke(main, ["lint", str(folder)])
        assert r.exit_code == 2 and r.output.strip().splitlines()[-1] == line, r.output


@pytest.mark.parametrize("name", ["config.json", "generation_config.json", "tokenizer.json"])
def test_a_hf_folders_json_is_read_by_the_bounded_reader_before_transformers(tmp_path, name):
    from mhaexport.models.hf import hf_adapter

    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}))
    (tmp_path / name).write_bytes(b"[" * 5000 + b"]" * 5000)
    with pytest.raises(UntrustedInput, match=re.escape(f"--hf {tmp_path}: {name}: JSON nested 5000 deep")):
        hf_adapter(tmp_path)
