"""The export folder's two guarantees (artifact/folder.py): a good artifact stays trusted until its replacement is
published, whatever stops the writer; and a reader runs exactly the bytes it hash-checked, even while another
process publishes into the folder. The writers here publish through the real Staging code in a torch-free
subprocess, so they can be killed at any system call of the publish."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mhaexport.artifact import ExportFolder, read_json
from mhaexport.core.errors import ArtifactError

# Republish the folder's onnx artifact with new bytes (a model.onnx whose tail byte differs, a new genai_config and a
# file the artifact did not have), through stage_artifact/publish. KILL_AT=N SIGKILLs the writer at its N-th rename
# or unlink inside the publish (the journal's own write counts too); ROUNDS repeats the publish, alternating bytes.
PUBLISHER = r"""
import os, signal, sys
from pathlib import Path
from mhaexport.artifact import folder as F
from mhaexport.artifact import read_manifest, stage_artifact

folder = Path(sys.argv[1]); kill_at = int(os.environ.get("KILL_AT", "-1")); rounds = int(os.environ.get("ROUNDS", "1"))
calls = [0]
real_replace, real_unlink = os.replace, Path.unlink

def counting(real):
    def call(*a, **k):
        if calls[0] == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        calls[0] += 1
        return real(*a, **k)
    return call

for r in range(rounds):
    m = read_manifest(folder)
    entry = m.artifacts["onnx"]
    with stage_artifact(folder, "onnx", purpose="test publish") as st:
        data = bytearray((folder / "model.onnx").read_bytes())
        data[-1] = (r + 1) % 256
        (st.dir / "model.onnx").write_bytes(bytes(data))
        (st.dir / "genai_config.json").write_text('{"round": %d}' % r)
        (st.dir / "extra.bin").write_bytes(os.urandom(64))
        if r == rounds - 1:
            os.replace, Path.unlink = counting(real_replace), counting(real_unlink)
        st.publish(m.model, entry, ["model.onnx", "genai_config.json", "extra.bin"])
        os.replace, Path.unlink = real_replace, real_unlink
print("published", flush=True)
"""


def _state(folder: Path) -> dict[str, str]:
    """Every visible file of the folder and its sha256 (scratch folders and the lock aside)."""
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())
            if p.is_file() and not p.name.startswith(".")}


def _publish(folder: Path, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", PUBLISHER, str(folder)], capture_output=True, text=True,
                          env={**os.environ, **{k: str(v) for k, v in env.items()}}, timeout=120)


@pytest.fixture()
def folder(tiny_export, tmp_path) -> Path:
    out = tmp_path / "export"
    shutil.copytree(tiny_export, out)
    return out


def test_publish_completes_and_is_trusted(folder):
    proc = _publish(folder)
    assert proc.returncode == 0, proc.stderr
    ef = ExportFolder.open(folder)
    assert set(ef.entry("onnx").files) == {"model.onnx", "genai_config.json", "extra.bin"}
    assert ef.entry("torchscript").files  # the other artifact of the same model kept
    assert not list(folder.glob(".staging-*"))


@pytest.mark.parametrize("kill_at", range(8))
def test_a_writer_killed_anywhere_in_its_publish_leaves_the_old_or_the_new_folder(folder, kill_at):
    """SIGKILL at each rename/unlink of the publish (the journal, the three files, the manifest): a reader refuses
    a folder left mid-publish and changes nothing (a reader writes nothing); the next writer finds it and rolls back
    from the journal, so the folder is exactly as before or exactly as after, and trusted either way: never half."""
    from mhaexport.artifact import stage_artifact

    old = _state(folder)
    old_manifest = read_json(folder / "manifest.json", "manifest")
    proc = _publish(folder, KILL_AT=kill_at)
    killed = proc.returncode == -9
    left = _state(folder)
    try:
        ExportFolder.open(folder).close()
    except ArtifactError as e:
        assert killed and "interrupted in the middle of its publish" in str(e), str(e)
    assert _state(folder) == left  # the reader wrote nothing
    with stage_artifact(folder, "onnx"):  # a writer: recovers what the dead writer left
        pass
    ExportFolder.open(folder).close()  # then every hash checks
    now = _state(folder)
    manifest = read_json(folder / "manifest.json", "manifest")
    if manifest == old_manifest:
        assert killed, proc.stderr
        assert now == old, f"rolled back to the manifest but not to its files (killed at call {kill_at})"
    else:
        assert set(manifest["artifacts"]["onnx"]["files"]) == {"model.onnx", "genai_config.json", "extra.bin"}
        assert now != old
    assert not list(folder.glob(".staging-*"))  # the dead writer's scratch folder was removed


def test_an_exception_before_the_commit_point_rolls_back_in_process(folder, monkeypatch):
    """A full disk while writing the manifest (the commit point): the folder is as it was, and still trusted."""
    from mhaexport.artifact import folder as F
    from mhaexport.artifact import read_manifest, stage_artifact

    old = _state(folder)
    real = F.atomic_write_json

    def full(path, data):
        if Path(path).name == "manifest.json":
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real(path, data)

    monkeypatch.setattr(F, "atomic_write_json", full)
    m = read_manifest(folder)
    with pytest.raises(OSError, match="No space left"):
        with stage_artifact(folder, "onnx") as st:
            (st.dir / "model.onnx").write_bytes(b"new bytes")
            st.publish(m.model, m.artifacts["onnx"], ["model.onnx"])
    assert _state(folder) == old
    ExportFolder.open(folder).close()
    assert not list(folder.glob(".staging-*"))


def test_an_interrupted_reexport_keeps_the_previous_export_usable(folder, monkeypatch):
    """Ctrl-C (or any error) in the slow part of a re-export: the previous artifact is still listed and verified."""
    from mhaexport.artifact import stage_artifact

    before = read_json(folder / "manifest.json", "manifest")
    with pytest.raises(KeyboardInterrupt):
        with stage_artifact(folder, "onnx") as st:
            (st.dir / "model.onnx").write_bytes(b"half an export")
            with ExportFolder.open(folder, "onnx") as ef:  # during the slow part: the old export is trusted
                assert ef.entry("onnx").files == before["artifacts"]["onnx"]["files"]
            raise KeyboardInterrupt
    assert read_json(folder / "manifest.json", "manifest") == before
    ExportFolder.open(folder).close()


def test_a_reader_runs_the_bytes_it_checked_while_a_publisher_replaces_them(folder):
    """The snapshot: opened, then the folder's files are replaced by a publish; the reader's files are still the
    ones its manifest vouches for (which the folder no longer holds)."""
    ef = ExportFolder.open(folder, "onnx")
    proc = _publish(folder)
    assert proc.returncode == 0, proc.stderr
    mine = hashlib.sha256(ef.file("onnx").read_bytes()).hexdigest()
    assert mine == ef.entry("onnx").files["model.onnx"]["sha256"]
    assert mine != hashlib.sha256((folder / "model.onnx").read_bytes()).hexdigest()  # the folder moved on
    snap = ef.root
    assert snap != folder and folder not in snap.parents  # a private copy, outside the folder
    ef.close()
    assert not snap.exists()


def test_readers_racing_a_publisher_never_see_unhashed_bytes(folder):
    """A publisher republishes 30 times while this process opens the folder over and over: every open either checks
    cleanly and its files match its own manifest, or (never here: the lock orders them) refuses; none mixes."""
    proc = subprocess.Popen([sys.executable, "-c", PUBLISHER, str(folder)], env={**os.environ, "ROUNDS": "30"},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    opened = 0
    try:
        deadline = time.monotonic() + 120
        while proc.poll() is None and time.monotonic() < deadline:
            with ExportFolder.open(folder, "onnx") as ef:
                for name, meta in ef.entry("onnx").files.items():
                    assert hashlib.sha256((ef.root / name).read_bytes()).hexdigest() == meta["sha256"]
                opened += 1
    finally:
        out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert opened >= 2
    assert not list(folder.glob(".snapshot-*"))


def test_a_killed_readers_snapshot_is_removed_by_the_next_process(folder):
    from mhaexport.artifact.folder import snapshot_dir

    code = ("import os, signal, sys\nfrom mhaexport.artifact import ExportFolder\n"
            "ef = ExportFolder.open(sys.argv[1])\nprint(ef.root, flush=True)\nos.kill(os.getpid(), signal.SIGKILL)\n")
    proc = subprocess.run([sys.executable, "-c", code, str(folder)], timeout=60, capture_output=True, text=True)
    snap = Path(proc.stdout.strip())
    assert snap.is_dir() and snap.parent == snapshot_dir() and not list(folder.glob(".snapshot-*"))
    ExportFolder.open(folder).close()
    assert not snap.exists()


def test_a_read_only_folder_with_a_lock_file_is_read(folder, monkeypatch):
    """A read-only mount of a folder a writer used (a CI artifact: it holds .mhaexport.lock): the reader opens the
    lock read-only and writes nothing, so EROFS on any write cannot stop it."""
    import errno as errno_

    from mhaexport.artifact import lock

    assert (folder / ".mhaexport.lock").is_file()
    real = os.open

    def read_only_fs(path, flags, *a, **k):
        inside = k.get("dir_fd") is not None or Path(path).parent == folder
        if inside and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
            raise OSError(errno_.EROFS, "Read-only file system", str(path))
        return real(path, flags, *a, **k)

    monkeypatch.setattr(lock.os, "open", read_only_fs)  # os itself: every open of the process
    with ExportFolder.open(folder) as ef:
        assert folder not in ef.root.parents
        assert ef.file("onnx").read_bytes() == (folder / "model.onnx").read_bytes()


def test_messages_name_the_users_folder_not_the_snapshot(altered_export):
    with pytest.raises(ArtifactError, match=f"^{altered_export / 'model.onnx'} sha256"):
        ExportFolder.open(altered_export)
    assert not list(altered_export.glob(".snapshot-*"))  # a refused open leaves nothing behind


def _cli(args):
    from click.testing import CliRunner

    from mhaexport.cli import main

    return CliRunner().invoke(main, args)


def test_too_little_free_space_is_refused_before_any_work(folder, tmp_path, monkeypatch):
    import collections

    from mhaexport.artifact import files

    Usage = collections.namedtuple("Usage", "total used free")
    monkeypatch.setattr(files.shutil, "disk_usage", lambda p: Usage(10**9, 10**9, 0))
    before = _state(folder)
    for args in (["torchscript", "--config", "tiny", "-o", str(folder)],
                 ["verify", str(folder), "-o", str(tmp_path / "reports")]):
        res = _cli(args)
        assert res.exit_code == 2, res.output
        assert res.output.strip().splitlines()[-1].startswith("Error: ") and "Traceback" not in res.output
        assert "not enough disk space" in res.output
    assert _state(folder) == before


def test_a_full_disk_during_an_export_is_one_line_and_the_folder_unchanged(folder, monkeypatch):
    """ENOSPC while the exporter writes its files (the slow part): exit 2, one line, the previous export intact."""
    import torch

    before = _state(folder)

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch.jit.ScriptModule, "save", full)
    res = _cli(["torchscript", "--config", "tiny", "-o", str(folder)])
    assert res.exit_code == 2, res.output
    line = res.output.strip().splitlines()[-1]
    assert line.startswith("Error: no space left on the device") and "Traceback" not in res.output
    assert _state(folder) == before
    ExportFolder.open(folder).close()
    assert json.loads((folder / "manifest.json").read_text())["artifacts"]["torchscript"]
