"""The streamed ONNX export of the built-in decoder (weights in a staging file, read by offset as they are written)
writes the bytes the in-memory export writes: the same graph, byte-identical initializers, the same fingerprint."""

import json
import math

import onnx
import pytest
import torch

import mhaexport
from mhaexport.core.errors import ModelLoadError
from mhaexport.exporter import onnx as onnx_exporter
from mhaexport.exporter import streamed
from mhaexport.runners import wire
from mhaexport.exporter.onnx import EXTERNAL_DATA_ENV, export_onnx
from mhaexport.models import stream
from mhaexport.models.loading import load_model


def _files(folder):
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.name not in ("manifest.json",)
            and not p.name.startswith(".")}


def _fingerprint(folder):
    return json.loads((folder / "manifest.json").read_text())["model"]["fingerprint"]


@pytest.fixture
def replaced(monkeypatch):
    """The initializers each streamed export read from its staging file."""
    seen = []

    def spy(model, weights):
        names = streamed.read_when_written(model, weights)
        seen.append(names)
        return names

    monkeypatch.setattr(onnx_exporter, "read_when_written", spy)
    return seen


# tiny (its weights inside model.onnx: save_inline) against the session's in-memory export, tiny_export
def test_the_streamed_tiny_export_is_the_session_fixtures_bytes(tiny, tiny_export, tmp_path, replaced):
    loaded = load_model("tiny", streamed=True)
    export_onnx(loaded, tmp_path)
    for name in ("model.onnx", "genai_config.json"):
        assert (tmp_path / name).read_bytes() == (tiny_export / name).read_bytes()
    assert _fingerprint(tmp_path) == _fingerprint(tiny_export) == tiny.fingerprint and replaced[0]


# external data for two presets (ir.save's writer), the weights inside model.onnx for the others (save_inline)
# two in the fast suite (the one-file writer, external data); the softcap and sinks presets with the slow set
@pytest.mark.parametrize("preset,external", [("tiny-llama", False), ("tiny-window", True),
                                             pytest.param("tiny-gemma", False, marks=pytest.mark.slow),
                                             pytest.param("tiny-sinks", True, marks=pytest.mark.slow)])
def test_streamed_export_writes_the_in_memory_exports_bytes(tmp_path, monkeypatch, replaced, loaded_presets, preset,
                                                            external):
    if external:
        monkeypatch.setenv(EXTERNAL_DATA_ENV, "0")
    eager = load_model(preset)
    export_onnx(eager, tmp_path / "mem")
    loaded = loaded_presets(preset)  # streamed, as the CLI loads it (shared with tests/test_export_paths.py)
    assert loaded.weights is not None and not loaded.weights.path.exists()  # the staging file is unlinked at once
    export_onnx(loaded, tmp_path / "str")
    mem, out = _files(tmp_path / "mem"), _files(tmp_path / "str")
    assert ("model.onnx.data" in out) == external
    assert mem.keys() == out.keys() and all(mem[k] == out[k] for k in mem)
    assert _fingerprint(tmp_path / "str") == _fingerprint(tmp_path / "mem") == eager.fingerprint
    # every weight was read from the staging file (the parameters and the folded transposes of the linear weights;
    # the other initializers are the exporter's small constants)
    graph = onnx.load(str(tmp_path / "str" / "model.onnx"), load_external_data=False).graph
    weights = {t.name for t in graph.initializer if math.prod(t.dims) >= eager.config.d_model}
    assert len(replaced) == 1 and weights and weights <= set(replaced[0])


@pytest.mark.slow
def test_a_float16_streamed_export_converts_one_tensor_at_a_time(tmp_path, replaced):
    export_onnx(load_model("tiny-llama"), tmp_path / "mem", dtype="float16")
    export_onnx(load_model("tiny-llama", streamed=True), tmp_path / "str", dtype="float16")
    assert _files(tmp_path / "mem") == _files(tmp_path / "str") and replaced[0]
    assert _fingerprint(tmp_path / "str") == _fingerprint(tmp_path / "mem")  # the float32 weights' fingerprint


def test_the_api_exports_streamed_and_verify_passes(tmp_path, replaced):
    record = mhaexport.export_onnx(tmp_path / "out", config="tiny")
    assert replaced and replaced[0]
    assert record.manifest.model.fingerprint == load_model("tiny").fingerprint
    report = mhaexport.verify(tmp_path / "out", runtimes=["ort-cpu"])
    assert report and report.verdict.code == 0


def test_a_checkpoint_is_streamed_into_the_staging_file(tmp_path):
    cfg = load_model("tiny").config
    trained = load_model("tiny")
    with torch.no_grad():
        for p in trained.module.parameters():
            p.add_(0.5)
    pt, st = tmp_path / "ck.pt", tmp_path / "ck.safetensors"
    torch.save(trained.module.state_dict(), pt)
    stream.write_safetensors(st, stream.param_specs(cfg), trained.module.state_dict().items())
    eager = load_model("tiny", checkpoint=pt)
    for path in (pt, st):
        lazy = load_model("tiny", checkpoint=path, streamed=True)
        assert lazy.weights is not None
        assert lazy.checkpoint_sha256 == load_model("tiny", checkpoint=path).checkpoint_sha256
        assert lazy.fingerprint == eager.fingerprint == trained.fingerprint != load_model("tiny").fingerprint
    torch.save({"tok_emb.weight": torch.zeros(3, 3)}, pt)
    stream.write_safetensors(st, [("tok_emb.weight", (3, 3), torch.float32)], [("tok_emb.weight", torch.zeros(3, 3))])
    for path in (pt, st):
        with pytest.raises(ModelLoadError, match="does not fit the model"):
            load_model("tiny", checkpoint=path, streamed=True)


def test_split_refuses_fields_out_of_order():
    key = wire._varint(5 << 3 | 0) + wire._varint(1)  # field 5, varint 1
    low = wire._varint(2 << 3 | 0) + wire._varint(7)  # field 2, varint 7
    assert wire._split(low + key, 3) == (low, key)
    assert wire._split(low + key, 5) == (low, b"")
    with pytest.raises(ValueError, match="after field"):
        wire._split(key + low, 3)


def test_no_room_to_stage_the_weights_is_one_line(monkeypatch):
    import errno

    from mhaexport.core.errors import ArtifactError
    from mhaexport.models import loading

    def full(*_a, **_k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(loading, "staged_weights", full)
    with pytest.raises(ArtifactError, match="cannot stage the weights .*No space left.*TMPDIR"):
        load_model("tiny", streamed=True)
