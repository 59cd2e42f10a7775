"""`mhaexport quantize` one weight at a time (exporter/quantize_stream.py) writes the bytes the in-memory path writes.

The in-memory path is the one quantize ran before: the float model loaded whole (`load_with_data`), ONNX Runtime's
MatMulNBitsQuantizer over it (`quantize_model` without a store), `onnx.save_model` with the export's external-data
rule. Both are run here on the same source, for each writer (a one-file source or external data in, a one-file file
or external data out) and the schemes that take different code (int4 with its int8 blocks, int8, the embedding
Gather quantized, asymmetric), and the files compared byte for byte. The streamed run never loads the float model:
`load_with_data` is made to fail, and at most one float weight is in the message at a time.
"""

from __future__ import annotations

import os
from pathlib import Path

import onnx
import pytest

from mhaexport.artifact import ExportFolder
from mhaexport.artifact.files import DATA_FILE, ONNX_FILE, external_data_threshold
from mhaexport.exporter import quantize as q
from mhaexport.exporter import quantize_stream as qs
from mhaexport.exporter.onnx import EXTERNAL_DATA_ENV, export_onnx
from mhaexport.runners.wire import read_stripped
from children import run_measured

pytestmark = pytest.mark.usefixtures("one_thread")


def in_memory(src: Path, out: Path, cfg: q.QuantConfig) -> None:
    """The in-memory path: the float model whole, ORT's quantizer, onnx.save_model as quantize chose before."""
    model, _, _ = q.quantize_model(q.load_with_data(src / ONNX_FILE), cfg)
    out.mkdir(parents=True)
    size = sum(t.ByteSize() for t in model.graph.initializer)
    cwd = os.getcwd()
    os.chdir(out)  # onnx.save_model checks `location` against the working directory
    try:
        if size > external_data_threshold():
            onnx.save_model(model, out / ONNX_FILE, save_as_external_data=True, all_tensors_to_one_file=True,
                            location=DATA_FILE, size_threshold=1024)
        else:
            onnx.save_model(model, out / ONNX_FILE)
    finally:
        os.chdir(cwd)


@pytest.fixture(scope="module")
def tiny_external(tiny, tmp_path_factory):
    """The tiny model exported with every weight in model.onnx.data."""
    out = tmp_path_factory.mktemp("tiny_external")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(EXTERNAL_DATA_ENV, "0")
        export_onnx(tiny, out)
    assert (out / DATA_FILE).is_file()
    return out


@pytest.fixture
def never_whole(monkeypatch):
    """The float model is never loaded whole, and after each node ONNX Runtime quantized the model's message holds
    neither a stored weight's bytes nor the tensors made from it (each weight was handed to ONNX Runtime in a graph
    of its own — memory-mapped, or read in —, what was made spilled). Returns the number of weights handed over for
    each node."""
    monkeypatch.setattr(q, "load_with_data", lambda *a: pytest.fail("the float model was loaded whole"))
    reads = []
    load, mapped, quantize = qs.WeightStore.load, qs.WeightStore.mapped_path, qs._Feeding.quantize

    def spy_load(self, t):
        reads[-1] += 1
        load(self, t)

    def spy_mapped(self, name):
        path = mapped(self, name)
        reads[-1] += path is not None
        return path

    def spy_quantize(self, node, graph_stack):
        reads.append(0)
        out = quantize(self, node, graph_stack)
        held = [t.name for g in graph_stack for t in g.initializer if t.HasField("raw_data")
                and (t.name in self.store.refs
                     or t.name.startswith(node.input[1]) and len(t.raw_data) >= qs.EXTERNAL_MIN_BYTES)]
        assert not held, f"after {node.name}: {held} in the model's message"
        return out

    monkeypatch.setattr(qs.WeightStore, "load", spy_load)
    monkeypatch.setattr(qs.WeightStore, "mapped_path", spy_mapped)
    monkeypatch.setattr(qs._Feeding, "quantize", spy_quantize)
    return reads


SCHEMES = {"int4": dict(weights="int4"), "int8": dict(weights="int8"),
           "int4-gather": dict(weights="int4", keep_float=()), "int4-asym": dict(weights="int4", symmetric=False)}


@pytest.mark.parametrize("source,out_external,scheme", [
    ("inline", False, "int4"), ("inline", False, "int8"), ("inline", False, "int4-gather"),
    ("external", True, "int4"), ("external", False, "int8"), ("inline", True, "int4-asym"),
    ("external", True, "int4-gather")])
def test_streamed_quantize_writes_the_in_memory_paths_bytes(tiny_export, tiny_external, tmp_path, monkeypatch,
                                                            source, out_external, scheme):
    src = tiny_external if source == "external" else tiny_export
    if out_external:
        monkeypatch.setenv(EXTERNAL_DATA_ENV, "0")
    with ExportFolder.open(src, "onnx") as ef:
        cfg = q.QuantConfig(**SCHEMES[scheme]).check_model(ef.contract.n_layers)
    in_memory(src, tmp_path / "whole", cfg)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(q, "load_with_data", lambda *a: pytest.fail("the float model was loaded whole"))
        q.quantize_folder(src, tmp_path / "streamed", q.QuantConfig(**SCHEMES[scheme]))
    names = [ONNX_FILE] + ([DATA_FILE] if out_external else [])
    assert (tmp_path / "streamed" / DATA_FILE).exists() == out_external
    for name in names:
        assert (tmp_path / "streamed" / name).read_bytes() == (tmp_path / "whole" / name).read_bytes(), name


def test_one_float_weight_in_memory_at_a_time(tiny_external, tmp_path, never_whole):
    q.quantize_folder(tiny_external, tmp_path / "q", q.QuantConfig(weights="int8"))
    assert never_whole and max(never_whole) == 1 and sum(never_whole) >= 8  # each weight read in alone


def test_read_stripped_leaves_large_raw_data_in_the_file(tiny_export):
    """A one-file model read field by field: its large weights stay in the file at the offsets returned, and the
    message with those bytes put back is the file's message."""
    path = tiny_export / ONNX_FILE
    stripped, where = read_stripped(path, 1024)
    whole = onnx.load(str(path))
    data = path.read_bytes()
    assert where and all(n >= 1024 for _, n in where.values())
    for t in stripped.graph.initializer:
        if t.name in where:
            at, n = where[t.name]
            t.raw_data = data[at:at + n]
    assert stripped.SerializeToString() == whole.SerializeToString()


@pytest.mark.slow
def test_the_m_model_quantizes_one_weight_at_a_time_in_bounded_memory(tmp_path):
    """examples/big.json (2.47 GB of float32 weights, external data): int4 quantized with a peak resident set under
    1 GB — the in-memory path held 8.5 GB (docs/measurements/streamed-verbs-2026-12-06.md) — most of it the
    quantized file's pages mapped by ONNX Runtime's check that it runs."""
    from pathlib import Path as P

    big = P(__file__).resolve().parents[1] / "examples" / "big.json"
    export_onnx(load_model_streamed(big), tmp_path / "float")
    assert (tmp_path / "float" / DATA_FILE).stat().st_size > 2.4e9
    got = run_measured(["-q", "quantize", str(tmp_path / "float"), "-o", str(tmp_path / "int4")], timeout=900)
    assert got.returncode == 0, got.output[-2000:]
    peak = got.peak
    assert peak < 1.0e9, peak
    entry = ExportFolder.open(tmp_path / "int4", "onnx")
    with entry:
        q = entry.entry("onnx").details.quantization
    assert q.nodes["MatMulNBits/4"] > 0 and q.nodes["MatMulNBits/8"] > 0


def load_model_streamed(config):
    from mhaexport.models.loading import load_model

    return load_model(str(config), streamed=True)
