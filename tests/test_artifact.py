"""The artifact layer: the manifest as typed objects, per-artifact I/O and dtype, no absolute paths, schema 1
still read, the writers' lock, staging folders of live writers kept, and re-pointing a folder at its model."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

import pytest
from click.testing import CliRunner

from mhaexport.artifact import ExportFolder, FolderLock, atomic_write_json, read_json, stage_artifact
from mhaexport.artifact.manifest import legacy_fingerprint
from mhaexport.artifact.source import ConfigSource, FactorySource, HfSource, LegacySource, PresetSource, Source
from mhaexport.cli import main
from mhaexport.core.errors import ArtifactError


def _strings(x):
    if isinstance(x, str):
        yield x
    elif isinstance(x, dict):
        for k, v in x.items():
            yield from _strings(k)
            yield from _strings(v)
    elif isinstance(x, list):
        for v in x:
            yield from _strings(v)


def test_manifest_is_typed_with_io_and_dtype_per_artifact_and_no_absolute_path(tiny_export):
    ef = ExportFolder.open(tiny_export)
    assert set(ef.artifacts) == {"onnx", "torchscript"}
    for name, entry in ef.artifacts.items():
        assert entry.dtype == "float32" and entry.io["outputs"]["logits"]["dtype"] == "float32", name
        assert entry.versions["onnx"] and entry.files[entry.file]["bytes"] > 0
    assert ef.model.source == PresetSource(name="tiny") and ef.model.source.to_dict() == {"kind": "preset",
                                                                                            "name": "tiny"}
    data = json.loads((tiny_export / "manifest.json").read_text())
    assert data["schema"] == "mhaexport.manifest/2"
    absolute = [s for s in _strings(data) if s.startswith("/") or str(tiny_export) in s or os.getcwd() in s]
    assert not absolute, absolute


def test_a_file_factory_and_checkpoint_are_recorded_relative_to_the_folder(tmp_path, monkeypatch):
    import torch

    from mhaexport.exporter.torchscript import export_torchscript
    from mhaexport.models.loading import load_model

    src = tmp_path / "proj"
    src.mkdir()
    shutil.copy("examples/user_decoder.py", src / "user_decoder.py")
    monkeypatch.chdir(src)
    user = load_model(model=str(src / "user_decoder.py") + ":build")  # given as an absolute path
    torch.save(user.module.state_dict(), src / "w.pt")
    user = load_model(model=str(src / "user_decoder.py") + ":build", checkpoint=src / "w.pt")
    export_torchscript(user, src / "out")
    model = read_json(src / "out" / "manifest.json", "manifest")["model"]
    assert model["source"] == {"kind": "factory", "callable": "build", "file": "../user_decoder.py",
                               "checkpoint": "../w.pt"}
    assert model["spec"] == "factory:user_decoder.py:build" and model["checkpoint"] == "w.pt"
    assert not [s for s in _strings(model) if str(tmp_path) in s]


def test_schema_1_folders_are_still_read_and_verified(tiny, tiny_export, tmp_path):
    """A folder written by mhaexport 0.1 (one top-level io, schema_version 1, absolute rebuild paths) still runs
    in the deploy runtime and rebuilds its eager model."""
    folder = tmp_path / "v1"
    shutil.copytree(tiny_export, folder)
    v2 = read_json(folder / "manifest.json", "manifest")
    io = v2["artifacts"]["onnx"]["io"]
    arts = {k: {kk: vv for kk, vv in v.items() if kk not in ("io", "versions")} for k, v in v2["artifacts"].items()}
    model = {"spec": "preset:tiny", "contract": v2["model"]["contract"], "config": v2["model"]["config"],
             "checkpoint": None, "checkpoint_sha256": None, "rebuild": {"cwd": "/nowhere", "checkpoint": None,
                                                                         "config": "tiny"}}
    v1 = {"schema_version": 1, "model": model, "io": io, "artifacts": arts, "versions": {"torch": "2.9"},
          "model_fingerprint": legacy_fingerprint("preset:tiny", model["contract"], model["config"], None)}
    atomic_write_json(folder / "manifest.json", v1)
    ef = ExportFolder.open(folder)
    assert ef.manifest.version == 1 and ef.model.legacy
    assert ef.entry("torchscript").io["inputs"]["past_key_values.0.key"]["dtype"] == "float32"
    from mhaexport.models.loading import load_recorded
    from mhaexport.runtime import GenerationConfig, Generator

    assert load_recorded(ef).fingerprint == tiny.fingerprint
    assert len(Generator(folder).generate([[1, 2]], GenerationConfig(max_new_tokens=2)).tokens[0]) == 2
    atomic_write_json(folder / "manifest.json", {"schema": "mhaexport.manifest/9"})
    with pytest.raises(ArtifactError, match=r"has schema 'mhaexport.manifest/9', expected 'mhaexport.manifest/1' "
                                            r"or 'mhaexport.manifest/2'"):
        ExportFolder.open(folder)


def test_the_folder_lock_waits_then_names_its_holder(tmp_path):
    with FolderLock(tmp_path, "export onnx"):
        t0 = time.monotonic()
        with pytest.raises(ArtifactError, match=rf"is being written by pid {os.getpid()} on .* \(export onnx: .*\); "
                                                r"waited 0 s: run again when it has finished"):
            with FolderLock(tmp_path, "export torchscript", timeout=0.3):
                pass
        assert time.monotonic() - t0 >= 0.3
    with FolderLock(tmp_path, "export torchscript", timeout=0.3):  # released: the next writer gets it at once
        pass


def test_staging_folders_of_live_writers_are_kept_and_dead_ones_removed(tmp_path):
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    try:
        (tmp_path / f".staging-onnx-{live.pid}-abc").mkdir()
        (tmp_path / f".staging-onnx-{dead.pid}-def").mkdir()
        with stage_artifact(tmp_path, "torchscript") as staged:
            assert staged.dir.name.startswith(f".staging-torchscript-{os.getpid()}-")
            assert (tmp_path / f".staging-onnx-{live.pid}-abc").is_dir()  # another writer, alive: left alone
            assert not (tmp_path / f".staging-onnx-{dead.pid}-def").exists()  # its writer is gone
        assert not staged.dir.exists()
    finally:
        live.kill()
        live.wait()


def test_verify_re_points_a_folder_only_at_the_same_model(tiny, tiny_export, tmp_path):
    """A folder whose factory moved: verify DIR --model NEW is accepted when the fingerprint matches, and refused
    naming both fingerprints when it does not."""
    folder = tmp_path / "export"
    shutil.copytree(tiny_export, folder)
    ok = CliRunner().invoke(main, ["verify", str(folder), "--config", "tiny", "--runtime", "ort-cpu",
                                   "--checkpoint", str(_save(tiny, tmp_path / "same.pt"))])
    assert ok.exit_code == 0, ok.output
    other = CliRunner().invoke(main, ["verify", str(folder), "--config", "small", "--runtime", "ort-cpu"])
    assert other.exit_code == 2
    line = other.output.strip().splitlines()[-1]
    assert "preset:small (fingerprint " in line and f"(preset:tiny, fingerprint {tiny.fingerprint})" in line
    assert "is not the model this folder was exported from" in line


def _save(loaded, path):
    import torch

    torch.save(loaded.module.state_dict(), path)
    return path


@pytest.mark.slow
def test_three_exports_into_one_folder_at_once_all_succeed(tmp_path):
    """onnx, torchscript and onnx --attention ort into one folder at the same moment: no writer kills another,
    and the folder ends consistent (every recorded file hash-checked)."""
    folder = tmp_path / "shared"
    cmds = [["onnx", "--config", "tiny"], ["torchscript", "--config", "tiny"],
            ["onnx", "--config", "tiny", "--attention", "ort"]]
    procs = [subprocess.Popen([sys.executable, "-m", "mhaexport", *c, "-o", str(folder)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for c in cmds]
    outs = [p.communicate(timeout=600) for p in procs]
    for p, (out, err), c in zip(procs, outs, cmds):
        assert p.returncode == 0, (c, err[-2000:])
    ef = ExportFolder.open(folder)
    assert set(ef.artifacts) == {"onnx", "torchscript"}
    assert not list(folder.glob(".staging-*"))


def test_a_record_relocated_to_another_folder_keeps_every_source_path_pointing_at_the_same_file(tmp_path):
    """A folder written from another (quantize's output beside its source) gets the source's model record with its
    paths made relative to the new folder: a factory file, a checkpoint and an --hf folder alike."""
    from mhaexport.artifact import ModelRecord
    from mhaexport.core.iospec import ModelContract

    src, out = tmp_path / "exp", tmp_path / "exp" / "quantized" / "int4"
    for source, keys in ((HfSource(path="../hfmodel", checkpoint="../w.pt"), ("path", "checkpoint")),
                         (FactorySource(file="f.py", callable="build", checkpoint="../w.pt"), ("file", "checkpoint"))):
        rec = ModelRecord(spec="hf:m", contract=ModelContract(1, 2, 4, 8, 16), fingerprint="f", source=source,
                          extra={"x": 1})
        moved = rec.relocated(src, out)
        for key in keys:
            assert (out / getattr(moved.source, key)).resolve() == (src / getattr(rec.source, key)).resolve(), key
        assert type(moved.source) is type(source) and moved.source.checkpoint == "../../../w.pt"
        assert (moved.spec, moved.fingerprint, moved.extra) == (rec.spec, rec.fingerprint, rec.extra)
        assert rec.source.checkpoint == "../w.pt"  # the original is left as it was


@pytest.mark.parametrize("source, kind", [
    ({"kind": "preset", "name": "tiny", "checkpoint": "../w.pt"}, PresetSource),
    ({"kind": "config", "block": "blocks.0.attn"}, ConfigSource),
    ({"kind": "factory", "file": "../net.py", "callable": "build"}, FactorySource),
    ({"kind": "factory", "module": "pkg.net", "callable": "build"}, FactorySource),
    ({"kind": "hf", "path": "../hf", "model_type": "llama", "architecture": "LlamaForCausalLM"}, HfSource),
    ({"kind": "hf", "repo_id": "org/m", "revision": "main", "commit": "a" * 40, "model_type": "gpt2"}, HfSource),
    ({"kind": "preset", "v1_rebuild": {"config": "tiny", "cwd": "/x"}}, LegacySource),
    ({"kind": "someday", "how": [1]}, Source),
    ({}, Source),
])
def test_a_model_source_is_read_as_the_record_of_its_kind_and_written_back_as_read(source, kind):
    """The model record's source: one typed record per kind, parsed where the manifest is read; the JSON written is
    the JSON read (a kind this code does not know kept as it was)."""
    read = Source.from_dict(source, "model.source")
    assert type(read) is kind and read.to_dict() == source and list(read.to_dict()) == list(source)


@pytest.mark.parametrize("v1, said", [
    ({"model": {}, "artifacts": {"onnx": "x"}}, r"m\.json \(schema 1\)\.artifacts\.onnx is 'x' \(str\), expected an "
                                                r"object"),
    ({"model": {"spec": 5}}, r"m\.json \(schema 1\)\.model\.spec is 5 \(int\), expected str"),
    ({"model": {"rebuild": {"config": {}}}}, r"m\.json \(schema 1\)\.model\.rebuild\.config is an object, expected "
                                             r"str or null"),
    ({"model": {"contract": {"n_layers": 2}}, "artifacts": {}}, r"m\.json: model\.contract\.n_heads is missing"),
])
def test_a_crafted_schema_1_manifest_is_refused_naming_its_field(v1, said):
    """Schema-1 manifests are typed records too: a wrong type is an ArtifactError naming the field, never a crash
    in the upgrade (it raised ValueError on an artifact entry that is not an object)."""
    from mhaexport.artifact import Manifest

    with pytest.raises(ArtifactError, match=said):
        Manifest.from_dict({"schema_version": 1, **v1}, "m.json")
