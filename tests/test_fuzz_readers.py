"""Every reader of untrusted input driven with generated hostile inputs (issue 35, item 8): manifest.json,
genai_config.json, the tokenizer files, a verify report and a bench result, a Hugging Face config.json and a
``--config FILE.json``, an ONNX file for lint. Each starts from a valid document and Hypothesis edits it — a field
replaced by a wrong type, a huge or negative number, NaN, a name with a NUL, ``..``, an ANSI escape or a line break,
nesting thousands deep, bytes that are not UTF-8 — and the reader must return or raise a MhaExportError (exit 2),
never anything else (exit 3), never hang (an alarm per case) and never touch a file outside its folder.

Deterministic (``derandomize``, no example database) and bounded: :data:`FAST` cases per reader in the default run,
:data:`SLOW` under ``-m slow``. The number of cases each reader ran is recorded as the test's ``cases`` property.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import shutil
import signal
import time
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from mhaexport.core.errors import MhaExportError  # noqa: E402

FAST, SLOW = 8, 300  # cases per reader: the default run, and -m slow
PER_CASE_S = 20  # a case still running after this is a hang
# text a crafted folder puts in a name or a value
HOSTILE_TEXT = ["", "../outside/x", "/etc/passwd", "model.onnx", "a\x00b", "\x1b[2J\n## ✅ passed", "\ud800",
                "x" * 300, "C:\\x", "genai_config.json", ".mhaexport.lock", "%s%n", "\u202e"]
SCALARS = (st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.sampled_from([0, -1, 1, 2**31, 2**63, 10**9])
           | st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from(HOSTILE_TEXT)
           | st.text(max_size=12))
VALUES = st.recursive(SCALARS, lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=6), c, max_size=3),
                      max_leaves=8)


def _paths(doc, at=()) -> list[tuple]:
    """Every key path of a JSON document (dict keys and list indices), the root's children first."""
    out = []
    items = doc.items() if isinstance(doc, dict) else enumerate(doc) if isinstance(doc, list) else ()
    for k, v in items:
        out.append(at + (k,))
        out += _paths(v, at + (k,))
    return out


def _set(doc, path: tuple, value, delete: bool, rename: str | None = None) -> None:
    for k in path[:-1]:
        doc = doc[k]
    if rename is not None and isinstance(doc, dict):  # a hostile key: a file name, a runtime's name
        doc[rename] = doc.pop(path[-1])
    elif delete and isinstance(doc, dict):
        doc.pop(path[-1], None)
    else:
        doc[path[-1]] = value


@st.composite
def hostile_json(draw, base) -> bytes:
    """``base`` (a JSON document) with a few fields replaced or removed, serialized — or, sometimes, text that is
    no document at all: nested thousands deep, cut short, not UTF-8."""
    kind = draw(st.sampled_from(["edit"] * 6 + ["deep", "cut", "bytes", "deep-field"]))
    doc = copy.deepcopy(base)
    if kind in ("edit", "deep-field", "cut"):
        paths = _paths(doc)
        for path in draw(st.lists(st.sampled_from(paths), min_size=1, max_size=3)) if paths else []:
            try:
                rename = draw(st.sampled_from(HOSTILE_TEXT)) if draw(st.integers(0, 4)) == 0 else None
                _set(doc, path, draw(VALUES), draw(st.booleans()), rename)
            except (KeyError, IndexError, TypeError):
                pass  # an earlier edit took its parent away
    text = json.dumps(doc, allow_nan=True).encode()
    if kind == "deep":
        n = draw(st.sampled_from([100, 1000, 50_000]))
        return b"[" * n + b"]" * n
    if kind == "deep-field" and text.endswith(b"}"):
        n = draw(st.sampled_from([70, 1000, 20_000]))
        return text[:-1] + b', "x": ' + b"[" * n + b"]" * n + b"}"
    if kind == "cut":
        return text[:draw(st.integers(0, max(0, len(text) - 1)))]
    if kind == "bytes":
        return draw(st.binary(max_size=64))
    return text


@contextmanager
def _alarm(seconds: int):
    def hang(signum, frame):
        raise TimeoutError(f"a reader ran past {seconds} s: a hang")

    old = signal.signal(signal.SIGALRM, hang)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _state(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for p in sorted(root.rglob("*")) if not p.is_symlink()}


def drive(strategy, read, examples: int, world: Path, record_property) -> int:
    """Run ``read(case)`` on ``examples`` generated cases; every exception but MhaExportError fails the test.
    Returns the number of cases run; checks nothing outside ``world / "in"`` changed."""
    outside = world / "outside"
    outside.mkdir(exist_ok=True)
    (outside / "x").write_text("keep me")
    before, cwd_before = _state(outside), sorted(os.listdir(world / "cwd"))
    count = 0

    @settings(max_examples=examples, derandomize=True, database=None, deadline=timedelta(seconds=10),
              suppress_health_check=list(HealthCheck), print_blob=False)
    @given(strategy)
    def one(case):
        nonlocal count
        count += 1
        with _alarm(PER_CASE_S):
            try:
                read(case)
            except MhaExportError:
                pass

    start = time.perf_counter()
    one()
    record_property("cases", count)
    record_property("seconds", round(time.perf_counter() - start, 2))
    assert _state(outside) == before and sorted(os.listdir(world / "cwd")) == cwd_before
    assert sorted(p.name for p in world.iterdir()) == ["cwd", "in", "outside"]
    return count


# --- the readers, each from a valid document ------------------------------------------------------------------------

def _rehash(folder: Path, name: str) -> None:
    """Re-hash ``name`` in the manifest, as someone preparing the folder would."""
    manifest = json.loads((folder / "manifest.json").read_text())
    data = (folder / name).read_bytes()
    manifest["artifacts"]["onnx"]["files"][name] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    (folder / "manifest.json").write_text(json.dumps(manifest))


def _manifest_reader(folder: Path):
    from mhaexport.artifact import ExportFolder, read_manifest

    good = (folder / "manifest.json").read_bytes()

    def read(raw: bytes):
        (folder / "manifest.json").write_bytes(raw)
        m = read_manifest(folder)
        m.model.contract, [a.files for a in m.artifacts.values()]  # noqa: B018 - what the verbs read next
        with ExportFolder.open(folder) as ef:
            ef.contract, ef.entry("onnx").details  # noqa: B018

    return json.loads(good), read


def _genai_reader(folder: Path):
    from mhaexport.artifact import ExportFolder
    from mhaexport.runtime.genai_config import deploy_findings
    from mhaexport.verify.genai_check import folder_findings

    base = json.loads((folder / "genai_config.json").read_text())

    def read(raw: bytes):
        (folder / "genai_config.json").write_bytes(raw)
        _rehash(folder, "genai_config.json")
        with ExportFolder.open(folder) as ef:
            deploy_findings(ef)
            folder_findings(ef, ef.contract)

    return base, read


def _tokenizer_reader(folder: Path, name: str):
    from mhaexport.runtime.genai_config import tokenizer_special_ids
    from mhaexport.runtime.tokenizer import load_tokenizer_file

    base = {"tokenizer.json": json.loads(_tokenizer_json()),
            "tokenizer_config.json": {"bos_token": "<s>", "eos_token": {"content": "</s>"}, "pad_token": None,
                                      "added_tokens_decoder": {"0": {"content": "<s>", "special": True}}},
            "generation_config.json": {"bos_token_id": 0, "eos_token_id": [1, 2], "pad_token_id": 1},
            "config.json": {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 4,
                            "eos_token_id": 1}}
    for other, doc in base.items():
        (folder / other).write_text(json.dumps(doc))

    def read(raw: bytes):
        (folder / name).write_bytes(raw)
        tokenizer_special_ids({n: folder / n for n in base})
        if name == "tokenizer.json":
            load_tokenizer_file(folder / name)

    return base[name], read


def _tokenizer_json() -> str:
    tokenizers = pytest.importorskip("tokenizers")
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel({"<s>": 0, "</s>": 1, "a": 2, "<unk>": 3},
                                                           unk_token="<unk>"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    return tok.to_str()


def _report_reader(folder: Path):
    from mhaexport.diagnose.bisect import case_of_report
    from mhaexport.core.iospec import ModelContract
    from mhaexport.verify.junit import to_junit_xml
    from mhaexport.verify.render import markdown
    from mhaexport.verify.report import load_report, merge_reports
    from test_untrusted import _report

    rep = _report(host="h")
    rep.results["ort-cpu"]["parity"].figures["worst_case"] = "b=1 seq=1 past=0"
    contract = ModelContract(n_layers=2, n_heads=4, head_dim=16, vocab_size=256, max_positions=128)

    def read(raw: bytes):
        (folder / "report.json").write_bytes(raw)
        r = load_report(folder / "report.json")
        markdown(r), to_junit_xml(r, markdown(r))  # noqa: B018
        case_of_report(folder / "report.json", contract)
        markdown(merge_reports([r, r]))

    return rep.to_dict(), read


def _bench_reader(folder: Path):
    from mhaexport.bench.render import markdown_body
    from mhaexport.bench.result import load_bench
    from test_untrusted import _bench_result

    def read(raw: bytes):
        (folder / "bench.json").write_bytes(raw)
        markdown_body(load_bench(folder / "bench.json"))

    return _bench_result().to_dict(), read


def _config_reader(folder: Path):
    from mhaexport.models.config import PRESETS, load_config
    from mhaexport.models.hf import architecture_label

    def read(raw: bytes):
        (folder / "config.json").write_bytes(raw)
        architecture_label(folder)  # a Hugging Face folder's config.json, as mhaexport reads it itself
        load_config(str(folder / "config.json"))  # --config FILE.json

    return dict(PRESETS["tiny"].to_dict()), read


@st.composite
def hostile_onnx(draw, model) -> bytes:
    """An ONNX file (the tiny export's graph) with a few protobuf fields edited: an initializer's dims, data type
    or data; a node's op, input name or attribute; a graph input's dims or type; the opset; or the bytes cut."""
    m = copy.deepcopy(model)
    g = m.graph
    for _ in range(draw(st.integers(1, 3))):
        what = draw(st.sampled_from(["dims", "dtype", "data", "op", "name", "attr", "input", "opset", "cut"]))
        if what in ("dims", "dtype", "data") and len(g.initializer):
            t = g.initializer[draw(st.integers(0, len(g.initializer) - 1))]
            if what == "dims" and len(t.dims):
                t.dims[draw(st.integers(0, len(t.dims) - 1))] = draw(st.sampled_from([-1, 0, 1, 3, 2**31, 2**40]))
            elif what == "dtype":
                t.data_type = draw(st.integers(0, 25))
            else:
                t.raw_data = draw(st.binary(max_size=16))
        elif what in ("op", "name", "attr") and len(g.node):
            n = g.node[draw(st.integers(0, len(g.node) - 1))]
            if what == "op":
                n.op_type = draw(st.sampled_from(["Softmax", "Where", "Reshape", "Cast", "NoSuchOp", "", "\x00"]))
            elif what == "name" and len(n.input):
                n.input[0] = draw(st.sampled_from(HOSTILE_TEXT).filter(lambda x: "\ud800" not in x))
            elif len(n.attribute):
                a = n.attribute[0]
                a.i, a.f = draw(st.integers(-(2**63), 2**63 - 1)), draw(st.floats(allow_nan=True, width=32))
        elif what == "input" and len(g.input):
            vi = g.input[draw(st.integers(0, len(g.input) - 1))]
            vi.type.tensor_type.elem_type = draw(st.integers(0, 25))
            for d in vi.type.tensor_type.shape.dim:
                if draw(st.booleans()):
                    d.dim_value = draw(st.sampled_from([0, 1, 7, 2**40]))
        elif what == "opset" and len(m.opset_import):
            m.opset_import[0].version = draw(st.integers(-1, 1000))
    data = m.SerializeToString()
    if draw(st.integers(0, 9)) == 0:
        data = data[:draw(st.integers(0, len(data)))]
    return data


def _onnx_reader(folder: Path, tiny_export: Path):
    import onnx

    from mhaexport.verify.lint import lint_path

    model = onnx.load(str(tiny_export / "model.onnx"))

    def read(raw: bytes):
        (folder / "model.onnx").write_bytes(raw)
        lint_path(folder / "model.onnx")

    return model, read


READERS = ["onnx", "manifest", "genai_config", "tokenizer.json", "tokenizer_config.json", "generation_config.json",
           "report", "bench", "config"]


@pytest.fixture()
def world(tmp_path, monkeypatch):
    for name in ("in", "cwd"):
        (tmp_path / name).mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    return tmp_path


def _reader(name: str, world: Path, tiny_export):
    folder = world / "in"
    if name in ("manifest", "genai_config"):
        folder.rmdir()
        shutil.copytree(tiny_export, folder, ignore=shutil.ignore_patterns("model.pt", "report*"))
        manifest = json.loads((folder / "manifest.json").read_text())
        manifest["artifacts"].pop("torchscript", None)
        (folder / "manifest.json").write_text(json.dumps(manifest))
        return _manifest_reader(folder) if name == "manifest" else _genai_reader(folder)
    if name.endswith(".json"):
        return _tokenizer_reader(folder, name)
    return {"report": _report_reader, "bench": _bench_reader, "config": _config_reader}[name](folder)


def _run(name, world, tiny_export, record_property, examples):
    if name == "onnx":
        model, read = _onnx_reader(world / "in", tiny_export)
        assert drive(hostile_onnx(model), read, examples, world, record_property) == examples
        return
    base, read = _reader(name, world, tiny_export)
    assert drive(hostile_json(base), read, examples, world, record_property) == examples


@pytest.mark.parametrize("name", READERS)
def test_a_reader_meets_hostile_input_with_exit_2_at_worst(name, world, tiny_export, record_property):
    _run(name, world, tiny_export, record_property, FAST)


@pytest.mark.slow
@pytest.mark.parametrize("name", READERS)
def test_a_reader_meets_hostile_input_with_exit_2_at_worst_long(name, world, tiny_export, record_property):
    _run(name, world, tiny_export, record_property, SLOW)
