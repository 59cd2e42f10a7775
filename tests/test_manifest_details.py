"""The manifest's per-artifact details as typed records (artifact/details.py): every kind of entry mhaexport writes
reads into records and writes back byte for byte; a detail of the wrong type is refused naming its key; keys this
code does not know survive a rewrite of the folder."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from mhaexport.artifact import ExportFolder, lowering_of, read_json, read_manifest
from mhaexport.artifact.details import (AdoptedLayout, CacheLayout, OnnxDetails, Quantization, QuantSource,
                                        TorchScriptDetails, WeightsRead)
from mhaexport.artifact.files import atomic_write_json
from mhaexport.core.errors import ArtifactError

pytestmark = pytest.mark.usefixtures("one_thread")
ROOT = Path(__file__).resolve().parents[1]


def _round_trip(folder: Path) -> None:
    """manifest.json read into records and written again is the same bytes."""
    raw = (folder / "manifest.json").read_text()
    assert json.dumps(read_manifest(folder).to_dict(), indent=2) + "\n" == raw


@pytest.fixture(scope="module")
def quantized(tiny_export, tmp_path_factory):
    from mhaexport.exporter.quantize import QuantConfig, quantize_folder

    out = tmp_path_factory.mktemp("q") / "int8"
    quantize_folder(tiny_export, out, QuantConfig(weights="int8"))
    return out


@pytest.fixture(scope="module")
def shared(tiny, tmp_path_factory):
    from mhaexport.exporter.onnx import export_onnx

    out = tmp_path_factory.mktemp("shared")
    export_onnx(tiny, out, kv_cache="shared", max_cache=48)
    return out


@pytest.fixture(scope="module")
def adopted(tiny, tiny_export, tmp_path_factory):
    from mhaexport.exporter.adopt import adopt_onnx

    return adopt_onnx(tiny, tiny_export / "model.onnx", tmp_path_factory.mktemp("adopted") / "a").folder


def test_an_export_reads_into_records_and_writes_back_byte_for_byte(tiny_export):
    _round_trip(tiny_export)
    ef = ExportFolder.open(tiny_export)
    onnx, ts = ef.entry("onnx").details, ef.entry("torchscript").details
    assert isinstance(onnx, OnnxDetails) and isinstance(ts, TorchScriptDetails)
    assert (onnx.opset, onnx.attention, onnx.cache.kind, onnx.cache.shared) == (18, "decomposed", "concat", False)
    assert onnx.lowering.fused_nodes == 0 and onnx.precision.dtype == "float32" and onnx.quantization is None
    assert onnx.example_sizes.seq > 0 and onnx.layout is None and onnx.producer is None
    assert ts.mode == "trace" and ts.cache.kind is None  # the TorchScript entry states no cache layout: none written
    assert "kv_cache" not in ef.entry("torchscript").to_dict()


def test_a_quantized_export_reads_its_recipe_as_records(quantized, tiny_export):
    _round_trip(quantized)
    q = ExportFolder.open(quantized).entry("onnx").details.quantization
    assert isinstance(q, Quantization) and isinstance(q.source, QuantSource)
    assert (q.weights, q.bits, q.int8_blocks) == ("int8", 8, None)  # int8_blocks written as null: still null
    assert '"int8_blocks": null' in (quantized / "manifest.json").read_text()
    assert isinstance(q.weights_read, WeightsRead) and q.weights_read.fixed_bytes < q.source.weights_read.fixed_bytes
    assert (Path(quantized) / q.source.folder).resolve() == Path(tiny_export).resolve()
    assert lowering_of(ExportFolder.open(quantized)) == "attention=decomposed float32 int8"


def test_a_shared_cache_export_reads_its_cache_layout(shared):
    _round_trip(shared)
    ef = ExportFolder.open(shared)
    assert ef.entry("onnx").details.cache == CacheLayout("shared", max_cache=48, padding="right")
    assert lowering_of(ef) == "attention=gqa float32 kv=shared"


def test_an_adopted_file_reads_its_layout_as_a_record(adopted):
    _round_trip(adopted)
    d = ExportFolder.open(adopted).entry("onnx").details
    assert isinstance(d.layout, AdoptedLayout) and d.layout.producer == d.producer == "mhaexport"
    assert d.layout.past[0] == "past_key_values.0.key"
    assert (d.cache.kind, d.cache.padding, d.attention) == ("concat", "left", "as exported")
    written = read_json(adopted / "manifest.json", "manifest")["artifacts"]["onnx"]
    assert written["layout"]["position_ids"] is None
    # the cache and padding are stored once, in the entry's own keys, not in the layout too
    assert (written["kv_cache"], written["padding"]) == ("concat", "left")
    assert "kv_cache" not in written["layout"] and "padding" not in written["layout"]


def test_an_adopted_entry_of_an_earlier_version_reads_its_cache_from_either_place(adopted, tmp_path):
    """Earlier versions wrote the cache and padding twice (the entry's keys and the layout's): read and written back
    unchanged, fed as the entry says. A layout whose entry states no cache of its own gives the cache."""
    from mhaexport.runtime.feed import Feed

    folder = tmp_path / "old"
    shutil.copytree(adopted, folder)
    data = read_json(folder / "manifest.json", "manifest")
    onnx = data["artifacts"]["onnx"]
    onnx["layout"].update(kv_cache="shared", padding="right")
    onnx.update(kv_cache="shared", padding="right", max_cache=onnx["layout"]["max_positions"])
    atomic_write_json(folder / "manifest.json", data)
    _round_trip(folder)
    entry = ExportFolder.open(folder).entry("onnx")
    feed = Feed.of(entry)
    assert (feed.cache, feed.padding, feed.max_cache) == ("shared", "right", onnx["max_cache"])
    assert feed.producer == "mhaexport" and feed.past[0] == "past_key_values.0.key"
    for key in ("kv_cache", "padding", "max_cache"):  # only the layout's placement
        del onnx[key]
    atomic_write_json(folder / "manifest.json", data)
    feed = Feed.of(ExportFolder.open(folder).entry("onnx"))
    assert (feed.cache, feed.padding, feed.max_cache) == ("shared", "right", onnx["layout"]["max_positions"])


def test_old_entries_nulls_and_unknown_keys_read_and_write_back_unchanged(tiny_export, tmp_path):
    """Keys in another order (adoption's), an explicit null, the 0.1 name ``example_shapes``, a detail this code
    does not know: read and written back unchanged."""
    folder = tmp_path / "old"
    shutil.copytree(tiny_export, folder)
    data = read_json(folder / "manifest.json", "manifest")
    onnx = data["artifacts"]["onnx"]
    details = {k: onnx.pop(k) for k in list(onnx) if k not in ("format", "file", "dtype", "io", "files",
                                                               "seq_dynamic", "static_sizes", "versions",
                                                               "export_seconds", "warnings")}
    onnx.update({"future_key": {"x": [1, 2]}, **dict(reversed(list(details.items())))})
    onnx["precision"] = None
    onnx["lowering"]["a_new_figure"] = 3
    ts = data["artifacts"]["torchscript"]
    ts["example_shapes"] = ts.pop("example_sizes")
    atomic_write_json(folder / "manifest.json", data)
    _round_trip(folder)
    ef = ExportFolder.open(folder)
    assert ef.entry("onnx").details.extra == {"future_key": {"x": [1, 2]}}
    assert ef.entry("onnx").details.lowering.extra == {"a_new_figure": 3}
    assert ef.entry("torchscript").details.traced_sizes == ef.entry("onnx").details.example_sizes


def test_unknown_keys_survive_another_artifact_published_into_the_folder(tiny, tiny_export, tmp_path):
    from mhaexport.exporter.torchscript import export_torchscript

    folder = tmp_path / "f"
    shutil.copytree(tiny_export, folder)
    data = read_json(folder / "manifest.json", "manifest")
    data["artifacts"]["onnx"]["future_key"] = "kept"
    atomic_write_json(folder / "manifest.json", data)
    export_torchscript(tiny, folder, mode="trace")  # rewrites manifest.json with its own entry
    after = read_json(folder / "manifest.json", "manifest")
    assert after["artifacts"]["onnx"] == data["artifacts"]["onnx"]


@pytest.mark.parametrize("edit, named", [
    (lambda a: a.update(kv_cache="shared", max_cache="48"),
     r"artifacts\.onnx\.max_cache is '48' \(str\), expected int"),
    (lambda a: a.update(kv_cache="shared"), r"artifacts\.onnx: kv_cache 'shared' without max_cache"),
    (lambda a: a.update(opset="18"), r"artifacts\.onnx\.opset is '18' \(str\), expected int"),
    (lambda a: a["lowering"].update(kv_cache_in_op=1), r"artifacts\.onnx\.lowering\.kv_cache_in_op is 1 \(int\), "
                                                       r"expected bool"),
    (lambda a: a.update(quantization={"weights": "int4", "block_size": "32"}),
     r"artifacts\.onnx\.quantization\.block_size is '32'"),
    (lambda a: a.update(quantization={"source": 7}), r"artifacts\.onnx\.quantization\.source is 7 \(int\), "
                                                     r"expected an object or str or null"),
    (lambda a: a.update(layout={"producer": "optimum"}),
     r"artifacts\.onnx\.layout\.input_ids is missing, expected str"),
    (lambda a: a.update(example_sizes=[1, 2, 3]), r"artifacts\.onnx\.example_sizes is an array, "
                                                  r"expected an object"),
])
def test_a_detail_of_the_wrong_type_is_refused_naming_its_key(tiny_export, tmp_path, edit, named):
    folder = tmp_path / "bad"
    shutil.copytree(tiny_export, folder)
    data = read_json(folder / "manifest.json", "manifest")
    edit(data["artifacts"]["onnx"])
    atomic_write_json(folder / "manifest.json", data)
    with pytest.raises(ArtifactError, match=named):
        ExportFolder.open(folder)


def test_no_reader_digs_details_by_key():
    """Readers use the records' attributes: the entry has no ``get`` any more, and no module indexes or ``.get``s
    a details record as a dict."""
    from mhaexport.artifact import ArtifactEntry

    assert not hasattr(ArtifactEntry, "get")
    dig = re.compile(r"\.details\[|\.details\.get\(")
    found = [f"{p.relative_to(ROOT)}:{n}" for folder in ("artifact", "runtime", "exporter", "verify", "bench",
                                                        "mhaexport", "models", "scripts")
             for p in (ROOT / folder).rglob("*.py")
             for n, line in enumerate(p.read_text().splitlines(), 1) if dig.search(line)]
    assert not found
