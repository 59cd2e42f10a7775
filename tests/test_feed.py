"""One feed description and one session builder: how an ONNX file is fed is read from its manifest entry once
(runtime.feed.Feed) and every ONNX Runtime session of the package is built by runtime.session.open_session — the
Generator, verify's runners, bench's rows (the bare loop too) and bisect."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

from mhaexport.core import iospec
from mhaexport.artifact import ArtifactEntry, ExportFolder
from mhaexport.artifact.details import AdoptedLayout, CacheLayout, OnnxDetails
from mhaexport.runtime import session
from mhaexport.runtime.feed import Feed

ROOT = Path(__file__).resolve().parents[1]

def _package_folders() -> list[str]:
    """The folders mapped into mhaexport.* (package code, not tests or scripts), as tests/test_layers.py reads them."""
    from test_layers import FOLDERS

    return ["mhaexport", *FOLDERS]


pytestmark = pytest.mark.usefixtures("one_thread")


def _entry(details: OnnxDetails, past0: str = "past_key_values.0.key", dtype: str = "float16") -> ArtifactEntry:
    io = {"inputs": {past0: {"dtype": dtype, "shape": []}}, "outputs": {}}
    return ArtifactEntry("onnx", "model.onnx", "float32", io, details=details)


def test_the_feed_of_an_entry_is_read_once_from_where_each_fact_is_stored(tiny):
    c = tiny.contract
    own = Feed.of(_entry(OnnxDetails(cache=CacheLayout("shared", 48, "right"))), c)
    assert (own.cache, own.max_cache, own.padding, own.cache_dtype, own.producer) == ("shared", 48, "right",
                                                                                      "float16", None)
    assert own.past == tuple(n for i in range(c.n_layers) for n in iospec.past_names(i)) and own.scoped
    assert Feed.of(_entry(OnnxDetails()), c).protocol == "concat cache, left padding"
    names = [f"k{i}" for i in range(2 * c.n_layers)]
    layout = AdoptedLayout("torch.onnx", "ids", "m", "out", names, [f"p{i}" for i in range(2 * c.n_layers)])
    foreign = Feed.of(_entry(OnnxDetails(producer="torch.onnx", layout=layout, cache=CacheLayout("concat", None,
                                                                                                 "left")),
                             past0="k0", dtype="float32"), c)
    assert (foreign.input_ids, foreign.past[0], foreign.cache_dtype, foreign.adopted, foreign.scoped) == \
        ("ids", "k0", "float32", True, False)
    assert foreign.file_names()[iospec.LOGITS] == "out" and foreign.plain() == foreign
    ids, mask = np.array([[3, 4]]), np.array([[0, 1, 1]])
    assert set(foreign.token_inputs(ids, mask)) == {"ids", "m"}  # no position_ids input: none fed


def _package_sources():
    for folder in _package_folders():
        yield from sorted((ROOT / folder).rglob("*.py"))


def test_one_place_creates_sessions_and_one_function_calls_it():
    """``InferenceSession(`` appears once in the package (runtime/session.py's _create_session), called only by
    open_session and the provider probe; no package code builds its own SessionOptions but session.py."""
    creates, calls, options = [], [], []
    for path in _package_sources():
        text = path.read_text()
        rel = str(path.relative_to(ROOT))
        if "InferenceSession(" in text:
            creates.append(rel)
        if "SessionOptions()" in text:
            options.append(rel)
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef):
                for sub in ast.walk(node):
                    if isinstance(sub, ast.Call) and getattr(sub.func, "id", getattr(sub.func, "attr", None)) \
                            == "_create_session":
                        calls.append((rel, node.name))
    assert creates == ["runtime/session.py"] and options == ["runtime/session.py"]
    assert sorted(calls) == [("runtime/session.py", "open_session"), ("runtime/session.py", "provider_unavailable")]


def _side(node: ast.AST) -> bool:
    """A padding side written in code: the string "left"/"right" or the name LEFT/RIGHT."""
    return (isinstance(node, ast.Constant) and node.value in ("left", "right")) or \
        (isinstance(node, ast.Name) and node.id in ("LEFT", "RIGHT"))


def test_one_function_decides_which_side_a_cache_pads():
    """The rule "a shared cache pads right" is one decision: artifact.details.padding_of. No other package code
    chooses between the two sides (``"right" if ... else "left"``, either order, names or strings); the protocols,
    the feed and a legacy manifest entry call it."""
    choices = []
    for path in _package_sources():
        rel = str(path.relative_to(ROOT))
        tree = ast.parse(path.read_text())
        for fn in [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.Module))]:
            for sub in ast.walk(fn):
                if isinstance(fn, ast.FunctionDef) and isinstance(sub, ast.IfExp) and _side(sub.body) \
                        and _side(sub.orelse):
                    choices.append((rel, fn.name))
    assert sorted(set(choices)) == [("artifact/details.py", "padding_of")]
    from mhaexport.artifact.details import padding_of
    from mhaexport.runtime.protocol import ContractOverShared, SharedBuffer, protocol_of

    assert (padding_of("shared"), padding_of("concat"), padding_of(None)) == ("right", "left", "left")
    assert SharedBuffer.padding == padding_of("shared")
    assert ContractOverShared.padding == "left"  # verify's contract calls come left-padded; the protocol repacks them
    assert protocol_of.__module__ == "mhaexport.runtime.protocol"


@pytest.fixture()
def built(monkeypatch):
    """Every session created while the test runs: (the function that asked _create_session, the model)."""
    made: list[tuple[str, object]] = []
    real = session._create_session

    def spy(model, requested, options, *rest):
        made.append((sys._getframe(1).f_code.co_name, model))
        return real(model, requested, options, *rest)

    monkeypatch.setattr(session, "_create_session", spy)
    return made


def test_the_generator_verify_bench_and_bisect_build_their_sessions_with_the_one_builder(tiny, tiny_export, built):
    from mhaexport.bench.config import BenchConfig
    from mhaexport.bench.result import RuntimeBench
    from mhaexport.bench.rows import BareRow
    from mhaexport.runtime import Generator
    from mhaexport.diagnose.bisect import bisect
    from mhaexport.runners.registry import runner_for

    ef = ExportFolder.open(tiny_export, "onnx")
    paths = {}

    def count(name, fn):
        before = len(built)
        fn()
        paths[name] = len(built) - before

    count("generator", lambda: Generator(ef, threads=1))
    count("verify", lambda: runner_for(ef, "ort-cpu", tiny.contract).activate())
    bare = BareRow(RuntimeBench("ort-bare"), ef, BenchConfig(threads=1))
    count("bench bare", bare.activate)
    assert bare.ok and "a session of its own" in bare.record.notes[0]
    count("bisect", lambda: bisect(tiny_export, tiny, batch=1, seq=2, past=1))
    assert paths == {"generator": 1, "verify": 1, "bench bare": 1, "bisect": 1}
    assert {caller for caller, _ in built} == {"open_session"}


def _renamed(src: Path, out: Path) -> Path:
    """``src`` (an mhaexport export of the contract) with every input and output renamed as a plain torch.onnx
    export names them: the layout is found by position only."""
    model = onnx.load(str(src))
    names = {v.name: f"in_{i}" for i, v in enumerate(model.graph.input)}
    names.update({v.name: f"out_{i}" for i, v in enumerate(model.graph.output)})
    for v in list(model.graph.input) + list(model.graph.output):
        v.name = names[v.name]
    for node in model.graph.node:
        node.input[:] = [names.get(n, n) for n in node.input]
        node.output[:] = [names.get(n, n) for n in node.output]
    out.mkdir(parents=True)
    onnx.save(model, str(out / "model.onnx"))
    return out / "model.onnx"


def test_the_bare_bench_loop_feeds_an_adopted_file_under_its_own_names(tiny, tiny_export, tmp_path):
    """The bare loop used to feed the contract's names whatever the folder: an adopted file with its own names
    failed there (ONNX Runtime: invalid input name) while every other row ran it. It reads the folder's feed now,
    and decodes what the runtime's loop decodes."""
    from mhaexport.bench.config import BenchConfig
    from mhaexport.bench.result import RuntimeBench
    from mhaexport.bench.rows import BareRow
    from mhaexport.exporter.adopt import adopt_onnx
    from mhaexport.runtime import GenerationConfig, Generator

    folder = adopt_onnx(tiny, _renamed(tiny_export / "model.onnx", tmp_path / "plain"), tmp_path / "adopted").folder
    ef = ExportFolder.open(folder, "onnx")
    gen = Generator(ef, threads=1)
    assert gen.feed.producer == "torch.onnx" and gen.feed.input_ids == "in_0" and gen.feed.logits == "out_0"
    prompt = np.array([[5, 17, 42, 7], [9, 8, 7, 6]], dtype=np.int64)
    want = gen.generate(prompt, GenerationConfig(max_new_tokens=5)).tokens
    row = BareRow(RuntimeBench("ort-bare"), ef, BenchConfig(threads=1))
    row.activate()
    assert row.ok, row.record.reason
    assert row.generate(prompt, 5).tokens == want
