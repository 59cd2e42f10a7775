"""One crafted input per class of attack the threat model names (docs/untrusted-folders.md "Sinks" and "Readers,
bounds, budgets"), each held to the structure that closes the whole class: a sink's escaper, the confined reader, a
bound in the record's type, the run's budget, the one place third-party failures are mapped, staging that follows no
link. The red team (tests/test_redteam.py) crosses the classes with every field; these are the classes' own cases,
with what mhaexport says."""

from __future__ import annotations

import json
import os
import struct
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from mhaexport.core.errors import (ArtifactError, LibraryRefused, MhaExportError, OverBudget, UnsafeFolder,
                                   UntrustedInput)

ESC = "\x1b[2J\x1b[32mverify passed\x1b[0m"


# --- text reaches a sink in that sink's syntax -------------------------------------------------------------------

def test_onnxruntimes_own_log_never_prints_a_node_name(capfd):
    """A node whose name clears the screen fails at run time: ONNX Runtime's log line (which names the node, raw)
    stays off; the failure comes back as an exception."""
    from onnx import TensorProto, helper

    from mhaexport.runtime.session import SessionConfig, open_session

    node = helper.make_node("Reshape", ["x", "s"], ["y"], name=f"n{ESC}")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [helper.make_tensor("s", TensorProto.INT64, [1], [5])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    session = open_session(model.SerializeToString(), SessionConfig())[0]
    with pytest.raises(Exception, match="Reshape"):
        session.run(None, {"x": np.ones(1, np.float32)})
    assert "\x1b" not in capfd.readouterr().err


def test_the_clis_streams_carry_no_control_character_whatever_prints():
    """Whatever reaches the CLI's stdout / stderr — a renderer that forgot, a library's message — is written with its
    controls escaped; mhaexport's own styles stay only on a terminal."""
    from mhaexport.core.untrusted import terminal_text

    assert terminal_text(f"a{ESC}\rb\u202ec\n") == "a\\x1b[2J\\x1b[32mverify passed\\x1b[0m\\rb\\u202ec\n"
    assert terminal_text("\x1b[1mbold\x1b[0m 🚀 模型", style=True) == "\x1b[1mbold\x1b[0m 🚀 模型"
    assert terminal_text("\x1b]0;title\x07", style=True) == "\\x1b]0;title\\x07"


def test_markdown_data_makes_no_link_image_html_or_heading():
    pytest.importorskip("markdown_it")
    from redteam.sinks import markdown_findings

    from mhaexport.core.untrusted import md, unescape_md

    for text in ("![x](https://evil.example/p.png)", "[a](https://evil.example)", "<img src=x onerror=y>",
                 "# ✅ passed", "a | b", "`code`", "https://evil.example www.evil.example a@evil.example"):
        assert markdown_findings(f"| cell | {md(text)} |\n|---|---|\n", headings=0) == [], text
        assert unescape_md(md(text)) == text  # rendered, it reads as itself


# --- two parsers read one file differently ----------------------------------------------------------------------

def _safetensors(path: Path, header: bytes, data: bytes) -> Path:
    header += b" " * (-len(header) % 8)
    path.write_bytes(struct.pack("<Q", len(header)) + header + data)
    return path


def test_a_safetensors_header_the_library_refuses_is_refused_by_ours(tmp_path):
    """An --hf folder's weights: our mapped reader accepts only what the safetensors library accepts, and reads the
    header strictly (a key twice, which two parsers read differently, is refused either way)."""
    from mhaexport.models.stream import read_header

    entry = b'{"dtype":"F32","shape":[2],"data_offsets":[0,8]}'
    ok = _safetensors(tmp_path / "ok.safetensors", b'{"a":' + entry + b"}", bytes(8))
    assert read_header(ok, foreign=True)[1]["a"]["shape"] == [2]
    twice = _safetensors(tmp_path / "twice.safetensors", b'{"a":' + entry + b',"a":' + entry + b"}", bytes(8))
    with pytest.raises(UntrustedInput, match="twice"):  # a refusal, not a reason to load it another way
        read_header(twice, foreign=True)
    short = _safetensors(tmp_path / "short.safetensors", b'{"a":{"dtype":"F32","shape":[4],"data_offsets":[0,8]}}',
                         bytes(8))
    with pytest.raises(ValueError, match="safetensors library refuses"):
        read_header(short, foreign=True)


def test_an_hf_folder_whose_safetensors_header_holds_a_key_twice_is_refused_not_loaded_another_way(hf_dir, tmp_path):
    """The library reads one of the two entries (the file loads through transformers); our strict reader refuses the
    header: the export is refused in one line (exit 2) — never the in-memory load through the laxer parser."""
    import json
    import shutil
    import struct

    from click.testing import CliRunner

    from mhaexport.cli import main

    folder = tmp_path / "hf"
    shutil.copytree(hf_dir("llama-small"), folder)
    raw = (folder / "model.safetensors").read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    name = next(k for k in header if k != "__metadata__")
    text = json.dumps(header)
    text = text[:-1] + ", " + json.dumps(name) + ": " + json.dumps(header[name]) + "}"  # the first entry again
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(text)) + text.encode() + raw[8 + n:])
    res = CliRunner().invoke(main, ["onnx", "--hf", str(folder), "-o", str(tmp_path / "out")])
    assert res.exit_code == 2, res.output
    *progress, line = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert [p.split()[0] for p in progress] == ["Loading"], res.output  # the folder checked, its weights refused:
    assert line == (f"Error: {folder}/model.safetensors: its header: the key {name!r} appears twice in one object: "
                    "refused"), res.output  # named by the user's folder, not the private copy read
    assert not (tmp_path / "out" / "model.onnx").exists()


# --- an output folder is an input too ---------------------------------------------------------------------------

def _report():
    from mhaexport.verify.report import ReportModel, SweepInfo, ToleranceInfo, VerifyReport

    return VerifyReport(model=ReportModel("preset:tiny"), folder="f", sweep=SweepInfo("quick", 0, 9),
                        tolerance=ToleranceInfo(1e-4, 1e-3), runtimes={}, results={})


def test_an_existing_report_md_is_never_read(tmp_path):
    """A report.md in the output folder that is a link to an outside file, or a megabyte of markers: the new report
    carries none of it over and takes no time over it."""
    from mhaexport.api import write_reports

    outside = tmp_path / "outside.txt"
    outside.write_text("<!-- bench -->SECRET from outside<!-- /bench -->")
    out = tmp_path / "out"
    out.mkdir()
    (out / "report.md").symlink_to(outside)
    write_reports(_report(), out)
    assert "SECRET" not in (out / "report.md").read_text() and not (out / "report.md").is_symlink()
    (out / "report.md").write_text("<!-- a -->" * 100_000 + "x" * 1_000_000)
    t = time.perf_counter()
    write_reports(_report(), out)
    assert time.perf_counter() - t < 5 and "<!-- a -->" not in (out / "report.md").read_text()


def test_a_bench_json_that_is_a_link_adds_no_section(tmp_path):
    from mhaexport.api import write_reports

    (tmp_path / "elsewhere.json").write_text("{}")
    out = tmp_path / "out"
    out.mkdir()
    (out / "bench.json").symlink_to(tmp_path / "elsewhere.json")
    write_reports(_report(), out)
    assert "<!-- bench -->" not in (out / "report.md").read_text()


# --- numbers not bounded where they are read --------------------------------------------------------------------

def test_a_negative_size_is_refused_where_the_manifest_is_read():
    from mhaexport.artifact.details import OnnxDetails

    with pytest.raises(ArtifactError, match=r"weight_bytes is -1000000000 \(int\), expected a number within 0\.\."):
        OnnxDetails.from_dict({"weight_bytes": -10**9}, "artifacts.onnx")


def test_a_hugging_face_config_asking_for_a_million_layers_is_refused_before_any_module():
    from mhaexport.core.errors import ModelLoadError
    from mhaexport.models.hf import check_sizes

    with pytest.raises(ModelLoadError, match=r"num_hidden_layers=1000000 is outside 0\.\.1024"):
        check_sizes(SimpleNamespace(num_hidden_layers=10**6, hidden_size=64), "--hf x: config.json")
    with pytest.raises(ModelLoadError, match="parameters"):
        check_sizes(SimpleNamespace(num_hidden_layers=1024, hidden_size=65536, intermediate_size=262144,
                                    vocab_size=4_000_000), "--hf x: config.json")
    check_sizes(SimpleNamespace(num_hidden_layers=32, hidden_size=4096, intermediate_size=14336,
                                vocab_size=128256, num_attention_heads=32, num_key_value_heads=8), "ok")


def test_a_merged_reports_figure_of_any_size_renders():
    """A figure that is NaN, infinite or 1e400 in a report given to merge: every sink renders it."""
    from mhaexport.verify.html import html
    from mhaexport.verify.render import cell, markdown
    from mhaexport.verify.report import VerifyReport

    doc = _report().to_dict()
    doc["runtimes"] = {"ort-cpu": {"name": "ort-cpu", "status": "ran"}}
    doc["results"] = {"ort-cpu": {"parity": {"check": "parity", "status": False,
                                             "figures": {"max_abs": "Infinity", "by_case": [[1, 1, 0, "NaN"]]},
                                             "message": "x"}}}
    report = VerifyReport.from_dict(json.loads(json.dumps(doc)))
    assert "+inf" in markdown(report) and "<svg" in html(report, cell)


def test_a_report_that_says_passed_beside_a_non_finite_figure_is_read_as_failed(tmp_path):
    """A crafted report.json whose check says passed while its figure is infinite: no check of mhaexport's passes so
    (a non-finite value is a mismatch), so merge reads it as the failure its figures show (exit 1), and says why."""
    from mhaexport import merge_reports

    doc = _report().to_dict()
    doc["runtimes"] = {"ort-cpu": {"name": "ort-cpu", "status": "ran"}}
    doc["results"] = {"ort-cpu": {"parity": {"status": True, "figures": {"max_abs": "Infinity"}, "message": ""}}}
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "report.json").write_text(json.dumps(doc))
    merged = merge_reports([tmp_path / "a"], tmp_path / "m")
    r = merged.results[next(iter(merged.results))]["parity"]
    assert r.status is False and "max_abs = inf is not finite" in r.message
    assert merged.verdict.code == 1


# --- work with no budget ----------------------------------------------------------------------------------------

def _loop_model(trips: int):
    from onnx import TensorProto, helper

    body = helper.make_graph(
        [helper.make_node("Add", ["y_in", "one"], ["y_out"]), helper.make_node("Identity", ["c_in"], ["c_out"])],
        "body", [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                 helper.make_tensor_value_info("c_in", TensorProto.BOOL, []),
                 helper.make_tensor_value_info("y_in", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("c_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("y_out", TensorProto.FLOAT, [1])],
        [helper.make_tensor("one", TensorProto.FLOAT, [1], [1.0])])
    graph = helper.make_graph(
        [helper.make_node("Loop", ["M", "c", "x"], ["y"], body=body)], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
        [helper.make_tensor("M", TensorProto.INT64, [], [trips]), helper.make_tensor("c", TensorProto.BOOL, [], [True])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def test_an_onnx_loop_of_2_to_the_62_trips_is_stopped_at_its_budget():
    """Every ONNX Runtime call has a deadline: the Loop is stopped (OverBudget, which a check reports as the
    runtime's failure), and the session's later calls are refused at once, not waited on again."""
    from mhaexport.runtime import budget
    from mhaexport.runtime.session import SessionConfig, open_session

    session = open_session(_loop_model(2 ** 62), SessionConfig())[0]
    t = time.perf_counter()
    with budget.limit(0.5), pytest.raises(OverBudget, match="ran past its budget of 0.5 s"):
        session.run(None, {"x": np.zeros(1, np.float32)})
    assert time.perf_counter() - t < 5
    t = time.perf_counter()
    with pytest.raises(OverBudget):
        session.run(None, {"x": np.zeros(1, np.float32)})
    assert time.perf_counter() - t < 0.5
    quick = open_session(_loop_model(3), SessionConfig())[0]
    with budget.limit(5):
        assert quick.run(None, {"x": np.zeros(1, np.float32)})[0].tolist() == [3.0]  # a bounded loop runs


def test_a_watched_session_is_freed_by_its_last_reference_not_by_the_cyclic_collector():
    """watch() puts its wrappers in the session's own __dict__: they must not reach the session strongly, or the
    session (its weights) lives on in a cycle until the collector runs, which a long verify rarely does."""
    import gc
    import weakref

    from mhaexport.runtime import budget
    from mhaexport.runtime.session import SessionConfig, open_session

    gc.disable()
    try:
        session = open_session(_loop_model(3), SessionConfig())[0]
        with budget.limit(5):
            assert session.run(None, {"x": np.zeros(1, np.float32)})[0].tolist() == [3.0]  # still watched, still runs
        assert hasattr(session, "_mhaexport_watch")
        gone = weakref.ref(session)
        del session
        assert gone() is None
    finally:
        gc.enable()


# --- third-party failures escape ---------------------------------------------------------------------------------

def test_a_rust_panic_and_a_librarys_error_are_one_line_naming_the_file_and_the_library():
    from mhaexport.core.libraries import library_call

    panic = type("PanicException", (BaseException,), {"__module__": "pyo3_runtime"})
    with pytest.raises(LibraryRefused, match=r"^DIR/tokenizer\.json: tokenizers refused it: PanicException: index out "
                                                 r"of bounds: refused$"):
        with library_call("tokenizers", "DIR/tokenizer.json"):
            raise panic("index out of bounds\nthread panicked at ...")
    with pytest.raises(LibraryRefused, match="onnx refused it: ValueError: Cycle"):
        with library_call("onnx", "DIR/model.onnx"):
            raise ValueError("Cycle detected in model-local function references")
    with pytest.raises(KeyboardInterrupt):  # a Ctrl-C is never a library's refusal
        with library_call("onnx", "x"):
            raise KeyboardInterrupt


def test_a_real_rust_panic_writes_nothing_raw_on_our_stderr(capfd, monkeypatch):
    """tokenizers' panic hook writes its message (and, with RUST_BACKTRACE=1, a native backtrace) straight to fd 2
    before the exception reaches Python: inside library_call that text is captured and dropped (the error's one line
    says it); a library that writes on fd 2 and succeeds has it said as a warning, escaped."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    from mhaexport.core.libraries import library_call
    from mhaexport.runtime.tokenizer import TextTokenizer

    monkeypatch.setenv("RUST_BACKTRACE", "1")
    tok = Tokenizer(models.WordLevel({"a": 0, "b": 1, "[UNK]": 2}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    crafted = Tokenizer.from_str(tok.to_str().replace('"truncation":null', '"truncation":{"direction":"Right",'
                                                      '"max_length":1,"strategy":"LongestFirst","stride":5}'))
    capfd.readouterr()
    with pytest.raises(LibraryRefused, match=r"^DIR/tokenizer\.json: tokenizers refused it: PanicException: "):
        TextTokenizer("tokenizer.json", crafted, source="DIR/tokenizer.json").encode("a b a b")
    out, err = capfd.readouterr()
    assert "panicked" not in out + err and err == "", err
    with pytest.warns(UserWarning, match=r"onnx wrote on stderr: said \\x1b\[2J"):  # shown: ESC as text
        with library_call("onnx", "x"):
            os.write(2, b"said \x1b[2J")
    assert "\x1b" not in capfd.readouterr().err


def test_a_panic_that_reaches_the_cli_is_exit_2_not_a_traceback(monkeypatch, tmp_path):
    from click.testing import CliRunner

    from mhaexport import api
    from mhaexport.cli import main

    panic = type("PanicException", (BaseException,), {"__module__": "pyo3_runtime"})

    def generate(*a, **k):
        raise panic("called `Option::unwrap()` on a `None` value")

    monkeypatch.setattr(api, "generate", generate)
    r = CliRunner().invoke(main, ["generate", str(tmp_path), "--prompt", "x"])
    assert r.exit_code == 2 and "refused" in r.output and "Traceback" not in r.output


# --- leftovers are followed -------------------------------------------------------------------------------------

def test_a_dead_writers_staging_folder_holding_a_link_out_is_refused_and_nothing_moved(tmp_path):
    import hashlib

    from mhaexport.artifact.folder import stage_artifact

    folder, outside = tmp_path / "f", tmp_path / "outside"
    folder.mkdir()
    outside.mkdir()
    (outside / "model.onnx").write_text("outside")
    (folder / "manifest.json").write_text("{}")
    stage = folder / ".staging-onnx-999999-x"
    stage.mkdir()
    (stage / ".replaced").symlink_to(outside)
    (stage / "PUBLISHING.json").write_text(json.dumps({
        "manifest_sha256": hashlib.sha256(b"{}").hexdigest(), "created": [], "backed_up": ["model.onnx"]}))
    with pytest.raises(UnsafeFolder, match=r"\.replaced is a symlink.*refused"):
        with stage_artifact(folder, "onnx"):
            pass
    assert (outside / "model.onnx").read_text() == "outside" and not (folder / "model.onnx").exists()
    assert os.path.islink(stage / ".replaced")  # refused, not moved or removed


def test_every_class_refusal_is_an_mhaexport_error():
    """The refusals above are all MhaExportError: exit 2 in one line (OverBudget, a runtime's failure, is a check's
    failure inside verify)."""
    assert all(issubclass(e, MhaExportError) for e in (LibraryRefused, UnsafeFolder, OverBudget, ArtifactError))


# --- one reader of an ONNX file's graph ----------------------------------------------------------------------------

# the loads that want what they load: a file's weights into memory on purpose, or a graph mhaexport itself wrote
# without weights (a trace it stored, ORT's optimized copy of a weightless graph)
WHOLE_LOADS = {
    "exporter/quantize.py": "load_with_data: the in-memory quantizer's input, weights and all, by request",
    "exporter/precision.py": "ORT's level-0 copy of a weightless graph, written by this process",
    "exporter/trace_store.py": "a stored trace: a graph the exporter wrote, its weights never stored",
}


def test_every_graph_of_a_shipped_file_is_read_by_the_one_graph_reader():
    """An ONNX file's graph is read through ``runners.wire.read_graph`` (a one-file model's weights walked past in
    the mapped file, never parsed into memory) everywhere but the loads above: ``onnx.load`` of a 0.86 GB one-file
    model held 1.7 GB, and verify did it four times (lint, the external-data check twice, the genai check), the
    twin a fifth — over verify's memory plan. A new ``onnx.load`` must be a reader of the graph or say why not."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    load = re.compile(r"\bonnx\.load(?:_model)?\(|\bir\.load\(|load_model_from_string\(")
    found = {}
    for folder in ("core", "artifact", "models", "exporter", "runtime", "runners", "verify", "bench", "diagnose",
                   "evaluate", "mhaexport"):
        for path in (root / folder).rglob("*.py"):
            text = "\n".join(line for line in path.read_text().splitlines()
                             if not line.lstrip().startswith("#"))
            text = re.sub(r'"""[\s\S]*?"""', "", text)  # docstrings may name onnx.load
            if load.search(text):
                found[str(path.relative_to(root))] = len(load.findall(text))
    assert set(found) == set(WHOLE_LOADS), found
    assert found["exporter/precision.py"] == 1 and found["exporter/quantize.py"] == 1
