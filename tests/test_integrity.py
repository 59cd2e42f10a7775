"""Integrity: a killed export leaves nothing a reader would trust; altered files are refused; checkpoints are
never unpickled beyond tensors."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from mhaexport.core.errors import ArtifactError, ModelLoadError
from mhaexport.artifact import ExportFolder, atomic_write_json, read_json

EXPORT_SCRIPT = """
import sys
from mhaexport.models.loading import load_model
from mhaexport.exporter.onnx import export_onnx
loaded = load_model("tiny", random_weights=True)
print("loaded", flush=True)
export_onnx(loaded, sys.argv[1])
print("done", flush=True)
"""


def _kill_export_when(folder: Path, ready, timeout: float = 120.0) -> bool:
    """Start an ONNX export into ``folder`` in a subprocess and SIGKILL it once ``ready(folder)`` is true.
    Returns False if the export finished before the moment came."""
    proc = subprocess.Popen([sys.executable, "-c", EXPORT_SCRIPT, str(folder)], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                return False
            if ready(folder):
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait()
                return True
            time.sleep(0.005)
        raise AssertionError("the export neither reached the moment nor finished")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()


def _staging_dirs(folder: Path) -> list[Path]:
    return list(folder.glob(".staging-onnx-*")) if folder.is_dir() else []


def test_export_killed_while_staging_keeps_the_previous_export(tiny, tiny_export, tmp_path):
    """A complete ONNX + TorchScript folder is re-exported; the ONNX export is killed while it writes its staging
    folder. The previous ONNX export stays trusted and usable (its entry and files as they were), and so does the
    untouched TorchScript entry."""
    folder = tmp_path / "export"
    shutil.copytree(tiny_export, folder)
    before = ExportFolder.open(folder).manifest.to_dict()

    killed = _kill_export_when(folder, lambda d: bool(_staging_dirs(d)))
    assert killed, "the export finished before its staging folder was seen"
    assert _staging_dirs(folder)  # the killed export left its scratch folder
    ef = ExportFolder.open(folder)  # every hash still checks
    assert ef.manifest.to_dict() == before
    ef.close()
    assert _staging_dirs(folder)  # a reader writes nothing, not even to tidy up

    # the folder takes a normal export (whose writer removes the dead one's scratch folder), then trusted in full
    from mhaexport.exporter.onnx import export_onnx

    export_onnx(tiny, folder)
    assert not _staging_dirs(folder)
    assert "model.onnx" in ExportFolder.open(folder).entry("onnx").files
    assert not list(folder.glob(".snapshot-*")) or all(  # only this process's live snapshots
        str(os.getpid()) in p.name for p in folder.glob(".snapshot-*"))
    assert (folder / "manifest.json").stat().st_mode & 0o777 == 0o644  # readable by other users and services


@pytest.mark.slow  # ~8 s: a killed subprocess; the staging kill test stays in the fast set
def test_export_killed_while_writing_model_file(tmp_path):
    """Killed once model.onnx has bytes in the staging folder, into a fresh folder: no manifest, so no export."""
    folder = tmp_path / "fresh"

    def model_bytes_staged(d: Path) -> bool:
        return any((s / "model.onnx").is_file() and (s / "model.onnx").stat().st_size > 0 for s in _staging_dirs(d))

    killed = _kill_export_when(folder, model_bytes_staged)
    if not killed:
        pytest.fail("the export finished before model.onnx was staged")
    with pytest.raises(ArtifactError, match="no manifest.json"):
        ExportFolder.open(folder, "onnx")
    assert not (folder / "model.onnx").exists()  # nothing published next to a manifest that could vouch for it


def test_manifest_hash_mismatch_is_refused(tiny_export, tmp_path):
    folder = tmp_path / "export"
    shutil.copytree(tiny_export, folder)
    manifest = read_json(folder / "manifest.json", "manifest")
    manifest["artifacts"]["onnx"]["files"]["model.onnx"]["sha256"] = "0" * 64
    atomic_write_json(folder / "manifest.json", manifest)
    with pytest.raises(ArtifactError, match="does not match the manifest's 000000000000…"):
        ExportFolder.open(folder, "onnx")


def test_checkpoint_with_a_non_tensor_object_is_refused_without_running_it(tmp_path, tiny):
    """A pickle whose object would run code on load (here: make a folder) is refused, and the code never runs."""
    marker = tmp_path / "pwned"

    class Payload:
        def __reduce__(self):
            return (os.mkdir, (str(marker),))

    state = dict(tiny.module.state_dict())
    state["extra"] = Payload()
    torch.save(state, tmp_path / "evil.pt")
    from mhaexport.models.loading import load_model

    with pytest.raises(ModelLoadError, match=r"evil.pt cannot be read as a tensors-only state dict \(torch.load "
                                             r"weights_only=True\): it holds a non-tensor object \(.*mkdir\), "
                                             r"refused without unpickling it"):
        load_model("tiny", checkpoint=tmp_path / "evil.pt")
    assert not marker.exists()


def test_static_reexport_removes_the_dynamic_exports_genai_config(tiny, tiny_export, tmp_path):
    """A genai_config.json that no manifest vouches for must not survive next to a static model.onnx."""
    from mhaexport.exporter.onnx import export_onnx

    folder = tmp_path / "export"
    shutil.copytree(tiny_export, folder)
    assert (folder / "genai_config.json").is_file()
    export_onnx(tiny, folder, seq_dynamic=False, seq_len=4)
    assert not (folder / "genai_config.json").exists()
    assert "genai_config.json" not in ExportFolder.open(folder, "onnx").entry("onnx").files


# One refusal, every verb: a model file altered after export (same size, one byte flipped) is refused before any
# work by each command and API that reads an export folder: exit 2, one line, no traceback, nothing written.
VERBS = {
    "verify": ["verify", "{dir}"],
    "verify --bisect": ["verify", "{dir}", "--bisect"],
    "generate": ["generate", "{dir}", "--prompt-ids", "5,6", "--max-new-tokens", "2"],
    "bench": ["bench", "{dir}", "--runtimes", "ort-cpu", "--new-tokens", "2", "--repeats", "1", "--long", "0"],
    "bench --compare": ["bench", "{good}", "--compare", "{dir}", "--runtimes", "ort-cpu", "--new-tokens", "2",
                        "--repeats", "1", "--long", "0", "-o", "{out}"],
}


@pytest.mark.parametrize("verb", list(VERBS))
def test_every_verb_refuses_an_altered_model_file(verb, altered_export, tiny_export, tmp_path):
    from click.testing import CliRunner

    from mhaexport.cli import main

    before = sorted(p.name for p in altered_export.iterdir())
    args = [a.format(dir=altered_export, good=tiny_export, out=tmp_path / "out") for a in VERBS[verb]]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 2, res.output
    last = res.output.strip().splitlines()[-1]
    assert last.startswith(f"Error: {altered_export / 'model.onnx'} sha256 ") and "Traceback" not in res.output
    assert last.endswith("does not match the manifest's " + last.split("manifest's ")[1])
    assert "altered after export, re-export it" in last
    assert sorted(p.name for p in altered_export.iterdir()) == before  # nothing written into it
    assert not (tmp_path / "out" / "bench.json").exists()


@pytest.mark.parametrize("api", ["Generator", "genai_greedy", "bisect", "verify_folder"])
def test_every_api_refuses_an_altered_model_file(api, altered_export):
    from mhaexport.runtime import Generator
    from mhaexport.runtime.genai import genai_greedy
    from mhaexport.verify import verify_folder
    from mhaexport.diagnose.bisect import bisect

    call = {"Generator": lambda: Generator(altered_export), "genai_greedy": lambda: genai_greedy(altered_export, [[1]], 4),
            "bisect": lambda: bisect(altered_export), "verify_folder": lambda: verify_folder(altered_export)}[api]
    with pytest.raises(ArtifactError, match=r"model.onnx sha256 \w+… does not match the manifest's \w+…: altered"):
        call()
