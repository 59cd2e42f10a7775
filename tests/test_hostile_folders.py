"""Folders someone else made (docs/DESIGN.md, "Folders from elsewhere"): a corpus of crafted folders, one per class of
attack, each pointed at the real CLI. For every one: the refusal (exit 2, one line naming the entry, no traceback)
or an honest verdict, and nothing outside the folder read into the verdict, written or run.

Each crafted folder starts from a good tiny export (re-hashed after the edit, as an attacker would), next to an
"outside" folder whose files must stay byte for byte as they were.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from mhaexport.artifact import ExportFolder
from mhaexport.artifact.files import sha256_file
from mhaexport.cli import main
from mhaexport.core.errors import ArtifactError, ModelLoadError, UnsafeFolder, UntrustedCode


def _cli(*args: str):
    return CliRunner().invoke(main, [str(a) for a in args])


def _state(root: Path) -> dict[str, str]:
    """Every file under ``root`` (links as their target text) and its sha256."""
    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_symlink():
            out[str(p.relative_to(root))] = "-> " + os.readlink(p)
        elif p.is_file():
            out[str(p.relative_to(root))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def _rehash(folder: Path, edit) -> None:
    """Edit the manifest (``edit(manifest_dict)``) and write it back, as a pipeline or an attacker would."""
    path = folder / "manifest.json"
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data, indent=2))


def _entry(data: dict) -> dict:
    return data["artifacts"]["onnx"]


def _meta(path: Path) -> dict:
    return {"sha256": sha256_file(path), "bytes": path.stat().st_size}


@pytest.fixture()
def world(tiny_export, tmp_path):
    """(the crafted folder — a copy of a good export —, an outside folder with a victim file and another export)."""
    folder = tmp_path / "crafted"
    shutil.copytree(tiny_export, folder, ignore=shutil.ignore_patterns(".snapshot-*", ".staging-*", "report*"))
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim.txt").write_text("precious\n")
    shutil.copytree(tiny_export, outside / "other", ignore=shutil.ignore_patterns(".*", "report*"))
    return folder, outside


def _refused(res, *needles: str) -> str:
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output
    line = [ln for ln in res.output.strip().splitlines() if ln.startswith("Error: ")][-1]
    for n in needles:
        assert n in line, line
    return line


def _verify(folder: Path, *more: str):
    return _cli("-q", "verify", folder, "--runtime", "ort-cpu", "-o", folder.parent / "reports", *more)


# --- names that leave the folder ---------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["../outside/other/model.onnx", "/etc/hostname", "sub/../../outside/x",
                                  "./model.onnx", "a\\..\\b", ".mhaexport.lock", ".snapshot-1-x/model.onnx"])
def test_a_manifest_name_outside_the_folder_is_refused_naming_the_entry(world, name):
    folder, outside = world
    before = _state(outside)
    (folder / "model.onnx").unlink()  # the local file gone: only the outside one could pass

    def edit(m):
        e = _entry(m)
        e["files"] = {name: _meta(outside / "other" / "model.onnx"), "genai_config.json": e["files"]["genai_config.json"]}
        e["file"] = name
    _rehash(folder, edit)
    line = _refused(_verify(folder), "artifacts.onnx", repr(name))
    assert "refused" in line
    assert _state(outside) == before


def test_a_name_through_a_symlinked_subfolder_neither_reads_nor_writes_outside(world):
    """The issue's write-outside case: ``sub`` links to a folder outside and the manifest names ``sub/../x``; the
    snapshot must not copy over a file elsewhere, and a name through the link must not be read."""
    folder, outside = world
    (folder / "sub").symlink_to(outside)
    before = _state(outside)
    for name in ("sub/victim.txt", "sub/../model.onnx"):
        def edit(m, name=name):
            _entry(m)["files"][name] = _meta(outside / "victim.txt")
        _rehash(folder, edit)
        _refused(_verify(folder), "sub")
        assert _state(outside) == before


def test_a_model_file_that_is_a_symlink_to_a_file_outside_is_refused(world):
    folder, outside = world
    real = outside / "other" / "model.onnx"
    (folder / "model.onnx").unlink()
    (folder / "model.onnx").symlink_to(real)
    _rehash(folder, lambda m: _entry(m)["files"].update({"model.onnx": _meta(real)}))
    _refused(_verify(folder), "model.onnx is a symlink")


def test_a_fifo_in_place_of_a_file_is_refused_at_once(world):
    folder, _ = world
    (folder / "model.onnx").unlink()
    os.mkfifo(folder / "model.onnx")  # open() of a FIFO blocks forever: opened non-blocking, refused by its kind
    _refused(_verify(folder), "not a regular file (a FIFO)")


def test_external_data_outside_the_files_the_manifest_hashes_is_refused(world, tmp_path):
    """An ONNX file whose weights are external data named ``../outside/…``: ONNX Runtime would read them from wherever
    the name leads (the folder's own unhashed file, seen from a snapshot, or a file elsewhere)."""
    import onnx
    from onnx import numpy_helper

    folder, outside = world
    for location in ("../outside/weights.bin", "weights.bin"):
        model = onnx.load(str(outside / "other" / "model.onnx"))
        blob = bytearray()
        for t in model.graph.initializer:  # the weights moved out by hand: onnx.save refuses to write such names
            raw = numpy_helper.to_array(t).tobytes()
            t.ClearField("raw_data")
            for f in ("float_data", "int64_data", "int32_data", "double_data"):
                t.ClearField(f)
            t.data_location = onnx.TensorProto.EXTERNAL
            for k, v in (("location", location), ("offset", str(len(blob))), ("length", str(len(raw)))):
                e = t.external_data.add()
                e.key, e.value = k, v
            blob += raw
        (folder / "model.onnx").write_bytes(model.SerializeToString())
        (folder / "weights.bin").write_bytes(bytes(blob))
        # weights.bin beside model.onnx but not among the hashed files: a reader must not let ONNX Runtime read it
        _rehash(folder, lambda m: _entry(m)["files"].update({"model.onnx": _meta(folder / "model.onnx")}))
        _refused(_verify(folder), "external data", repr(location))


def test_a_genai_config_naming_another_file_is_refused(world, tmp_path):
    folder, outside = world
    for filename in ("../outside/other/model.onnx", "other.onnx"):
        cfg = json.loads((folder / "genai_config.json").read_text())
        cfg["model"]["decoder"]["filename"] = filename
        (folder / "genai_config.json").write_text(json.dumps(cfg))
        shutil.copyfile(outside / "other" / "model.onnx", folder / "other.onnx")
        _rehash(folder, lambda m: _entry(m)["files"].update({"genai_config.json": _meta(folder / "genai_config.json")}))
        _refused(_verify(folder), "model.decoder.filename", repr(filename))


# --- the lock and the snapshot -------------------------------------------------------------------------------------

def test_a_lock_that_is_a_symlink_is_never_followed_written_or_truncated(world):
    folder, outside = world
    (folder / ".mhaexport.lock").unlink(missing_ok=True)
    (folder / ".mhaexport.lock").symlink_to(outside / "victim.txt")
    before = _state(outside)
    res = _verify(folder)  # a reader: does not use such a lock, reads and verifies
    assert res.exit_code == 0, res.output
    assert _state(outside) == before
    res = _cli("-q", "torchscript", "--config", "tiny", "-o", folder)  # a writer: refuses it
    _refused(res, ".mhaexport.lock is a symlink")
    assert _state(outside) == before


def test_a_lock_that_is_a_hard_link_to_another_file_is_refused_by_a_writer(world):
    folder, outside = world
    (folder / ".mhaexport.lock").unlink(missing_ok=True)
    os.link(outside / "victim.txt", folder / ".mhaexport.lock")
    before = _state(outside)
    _refused(_cli("-q", "torchscript", "--config", "tiny", "-o", folder), "hard link")
    assert _state(outside) == before


def test_a_lock_holder_with_junk_fields_is_named_without_a_crash(world):
    """A writer that cannot get the lock names its holder from the lock file; junk there (another tool's, an
    attacker's) is shown as '?', never a crash."""
    import fcntl

    from mhaexport.artifact.lock import FolderLock

    folder, _ = world
    lock = folder / ".mhaexport.lock"
    lock.write_text(json.dumps({"pid": "x", "host": ["a"], "since": "never", "command": {"k": 1}}))
    with open(lock) as held:
        fcntl.flock(held, fcntl.LOCK_SH)  # someone holds it
        with pytest.raises(ArtifactError, match=r"being written by pid \? on \? \(\?, since \?\)"):
            with FolderLock(folder, "test", timeout=0.1):
                pass
    for junk in ("[1, 2]", "{", "\xff", '{"since": 1e400}'):
        lock.write_text(junk)
        with open(lock) as held:
            fcntl.flock(held, fcntl.LOCK_SH)
            with pytest.raises(ArtifactError, match="being written by"):
                with FolderLock(folder, "test", timeout=0.1):
                    pass


def test_a_crafted_publish_journal_cannot_make_a_writer_touch_files_outside(world):
    """A dead writer's journal is the folder's content too: names in it that leave the folder are refused before the
    roll-back touches anything."""
    folder, outside = world
    scratch = folder / ".staging-onnx-999999-x"  # no process 999999: a dead writer
    (scratch / ".replaced").mkdir(parents=True)
    manifest_sha = hashlib.sha256((folder / "manifest.json").read_bytes()).hexdigest()
    (scratch / "PUBLISHING.json").write_text(json.dumps({"manifest_sha256": manifest_sha,
                                                         "created": ["../outside/victim.txt"], "backed_up": []}))
    before = _state(outside)
    _refused(_cli("-q", "torchscript", "--config", "tiny", "-o", folder), "PUBLISHING.json", "created")
    assert _state(outside) == before


def test_what_is_loaded_is_what_was_hashed_whatever_is_written_in_place_afterwards(world, tmp_path):
    """The snapshot is a private copy hashed as it is copied: rewriting model.onnx in place (same inode) after the
    open changes nothing the reader loads."""
    folder, outside = world
    ef = ExportFolder.open(folder)
    try:
        good = ef.entry("onnx").files["model.onnx"]["sha256"]
        with open(folder / "model.onnx", "r+b") as f:  # in place: the inode a hard link would share
            f.write(b"garbage" * 16)
        assert sha256_file(ef.file("onnx")) == good
        assert sha256_file(folder / "model.onnx") != good
        assert folder not in ef.root.parents and os.stat(ef.root).st_mode & 0o077 == 0
    finally:
        ef.close()
    _refused(_verify(folder), "sha256", "does not match")


def _no_room_for_a_copy(monkeypatch, folder: Path) -> str:
    """The snapshot's file system with room for every file of ``folder``'s export but its largest (as
    shutil.disk_usage reports it), every file large enough to be linked: returns the largest file's name."""
    from mhaexport.artifact import folder as F

    sizes = {}
    for entry in json.loads((folder / "manifest.json").read_text())["artifacts"].values():
        sizes.update({name: meta["bytes"] for name, meta in entry["files"].items()})
    largest = max(sizes, key=sizes.get)
    free = sum(sizes.values()) - sizes[largest] + (64 << 20) + 1
    real = shutil.disk_usage
    monkeypatch.setattr(F, "LINK_MIN_BYTES", 1)
    monkeypatch.setattr(F.shutil, "disk_usage", lambda p: real(p)._replace(free=free))
    return largest


def test_a_file_too_large_to_copy_is_read_in_place_linked_only_when_only_you_can_write_it(world, monkeypatch):
    """Where the snapshot's copy would not fit, the largest files are hard links to the inode opened (a swap of the
    folder's entry afterwards changes nothing loaded), hash-checked, each said in a note; a file others may write
    is refused instead, naming why; the others still copied."""
    from mhaexport.artifact import folder as F

    folder, _ = world
    name = _no_room_for_a_copy(monkeypatch, folder)
    data = folder / name
    F.linked_notes()
    ef = ExportFolder.open(folder)
    try:
        good = sha256_file(data)
        linked = ef.root / name
        assert os.stat(linked).st_ino == os.stat(data).st_ino  # the folder's inode, not a copy
        others = [p for p in ef.root.iterdir() if p.name != name]
        assert others and all(os.stat(p).st_ino != os.stat(folder / p.name).st_ino for p in others)  # copies
        swapped = folder / "swap.tmp"
        swapped.write_bytes(b"x" * data.stat().st_size)
        os.replace(swapped, data)  # the folder's entry now names another file: the link still holds the old one
        assert sha256_file(linked) == good != sha256_file(data)
        notes = F.linked_notes()
        assert len(notes) == 1 and name in notes[0] and "read in place" in notes[0], notes
    finally:
        ef.close()
    assert data.exists()  # closing the snapshot removes the link, never the folder's file

    os.chmod(data, 0o666)
    with pytest.raises(ArtifactError, match=f"{name} cannot be read in place instead: its mode"):
        ExportFolder.open(folder)


def test_quantize_reads_in_place_where_the_copy_would_leave_no_room_for_its_output(world, monkeypatch, tmp_path):
    """quantize writes its spilled weights and its file after the reader's snapshot: where the copy fits the snapshot's
    file system but the copy and what follows do not (an 8 B float32 file, 32 GB, on 38 GB free: the copy left 6 GB
    for 12 GB of output and quantize failed after two minutes), the reader reads the largest files in place instead,
    and says so; a reader that writes nothing after copies as before."""
    from mhaexport.artifact import folder as F

    folder, _ = world
    sizes = {}
    for entry in json.loads((folder / "manifest.json").read_text())["artifacts"].values():
        sizes.update({name: meta["bytes"] for name, meta in entry["files"].items() if name in
                      ExportFolder(folder, F.read_manifest(folder)).entry("onnx").files})
    free = sum(sizes.values()) + (64 << 20) + 1  # the copy fits, with nothing to spare
    real, base = shutil.disk_usage, F.snapshot_dir()
    monkeypatch.setattr(F, "LINK_MIN_BYTES", 1)
    monkeypatch.setattr(F.shutil, "disk_usage", lambda p: real(p)._replace(free=free) if Path(p) == base else real(p))
    F.linked_notes()
    with ExportFolder.open(folder, "onnx") as ef:  # copies: it fits
        assert all(os.stat(ef.root / n).st_ino != os.stat(folder / n).st_ino for n in sizes)
    assert F.linked_notes() == []
    with ExportFolder.open(folder, "onnx", then_writes=0.6) as ef:  # and the output after it would not
        largest = max(sizes, key=sizes.get)
        assert os.stat(ef.root / largest).st_ino == os.stat(folder / largest).st_ino
    assert any(largest in n and "read in place" in n for n in F.linked_notes())
    res = _cli("quantize", folder, "-o", tmp_path / "q", "--weights", "int4")
    assert res.exit_code == 0, res.output
    assert "note: " in res.output and largest in res.output and "read in place" in res.output, res.output


def test_verify_says_which_files_it_read_in_place(world, monkeypatch):
    folder, _ = world
    name = _no_room_for_a_copy(monkeypatch, folder)
    res = _cli("verify", folder, "--runtime", "ort-cpu", "-o", folder.parent / "reports")
    assert res.exit_code == 0, res.output
    assert "note: " in res.output and name in res.output and "read in place" in res.output, res.output


def test_a_reader_writes_nothing_into_the_folder(world):
    folder, _ = world
    (folder / ".mhaexport.lock").unlink(missing_ok=True)
    before = _state(folder)
    res = _cli("-q", "verify", folder, "--runtime", "ort-cpu", "-o", folder.parent / "reports")
    assert res.exit_code == 0, res.output
    assert _state(folder) == before and not (folder / ".mhaexport.lock").exists()


# --- code the folder names -----------------------------------------------------------------------------------------

def _code_source(folder: Path, source: dict, spec: str) -> None:
    def edit(m):
        m["model"]["source"] = source
        m["model"]["spec"] = spec
    _rehash(folder, edit)


def test_a_factory_file_the_folder_names_is_not_run_without_trust(world, tmp_path):
    folder, outside = world
    evil = tmp_path / "evil.py"
    marker = tmp_path / "ran"
    evil.write_text(f"open({str(marker)!r}, 'w').write('ran')\ndef build():\n    raise SystemExit(7)\n")
    _code_source(folder, {"kind": "factory", "file": "../evil.py", "callable": "build"}, "factory:evil.py:build")
    line = _refused(_verify(folder), "--trust-code", "evil.py")
    assert "runs a folder's code only when you ask" in line
    assert not marker.exists()
    with pytest.raises(UntrustedCode):
        import mhaexport

        mhaexport.verify(folder, runtimes=["ort-cpu"])
    assert not marker.exists()


@pytest.mark.parametrize("verb", [["verify", "--bisect"],
                                  pytest.param(["eval", "--runtime", "eager"], marks=pytest.mark.slow)])  # ~3 s each
def test_no_verb_runs_a_module_the_folder_names(world, verb):
    """``os:abort`` as the model's module would kill the process with no output."""
    folder, _ = world
    _code_source(folder, {"kind": "factory", "module": "os", "callable": "abort"}, "factory:os:abort")
    res = subprocess.run([sys.executable, "-m", "mhaexport", "-q", verb[0], str(folder), *verb[1:]],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 2, res.stderr
    assert "os:abort" in res.stderr and "--trust-code" in res.stderr and "Traceback" not in res.stderr


def test_bench_leaves_out_the_eager_rows_of_a_folder_whose_model_is_code(world):
    from mhaexport.bench import BenchConfig
    from mhaexport.bench.run import _load_eager

    folder, _ = world
    _code_source(folder, {"kind": "factory", "module": "os", "callable": "abort"}, "factory:os:abort")
    with ExportFolder.open(folder) as ef:
        eager, why = _load_eager(ef, BenchConfig().trust_code)
    assert eager is None and "--trust-code" in why


@pytest.mark.slow  # ~5 s: an export and three verifies; the fast planted tests verify factory folders with --trust-code
def test_a_users_own_code_folder_verifies_with_trust_code(tmp_path):
    """The opt-in works: the user's own factory export, verified with --trust-code (and with --model instead)."""
    factory = Path(__file__).resolve().parent.parent / "examples" / "user_decoder.py"
    out = tmp_path / "mine"
    res = _cli("-q", "onnx", "--model", f"{factory}:build", "-o", out)
    assert res.exit_code == 0, res.output
    _refused(_verify(out), "--trust-code")
    res = _verify(out, "--trust-code")
    assert res.exit_code == 0, res.output
    res = _cli("-q", "verify", out, "--runtime", "ort-cpu", "--model", f"{factory}:build", "-o", tmp_path / "r2")
    assert res.exit_code == 0, res.output


# --- the Hugging Face cache ---------------------------------------------------------------------------------------

def test_a_hub_cache_whose_ref_leads_outside_its_repo_is_refused(tmp_path, monkeypatch):
    from mhaexport.models import hub

    cache = tmp_path / "cache"
    repo = cache / "models--org--name"
    commit = "a" * 40
    elsewhere = tmp_path / "elsewhere" / "x" / "y" / commit
    elsewhere.mkdir(parents=True)
    (elsewhere / "config.json").write_text("{}")
    (repo / "refs").mkdir(parents=True)
    (repo / "snapshots").mkdir()
    (repo / "refs" / "main").write_text(os.path.relpath(elsewhere, repo / "snapshots"))
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    with pytest.raises(UnsafeFolder, match="resolves to .*elsewhere.*, outside .*snapshots: refused"):
        hub.resolve("org/name")
    # a snapshot whose file links out of the repo's folder
    snap = repo / "snapshots" / commit
    snap.mkdir()
    (snap / "config.json").symlink_to(elsewhere / "config.json")
    (repo / "refs" / "main").write_text(commit)
    with pytest.raises(UnsafeFolder, match="outside"):
        hub.confine_snapshot(cache, "org/name", snap)
    with pytest.raises(ModelLoadError, match="not a branch, tag or commit"):
        hub.resolve("org/name", revision="../../x")


def test_an_hf_folder_without_room_for_its_copy_and_staging_reads_its_weights_in_place(hf_dir, monkeypatch):
    """A --hf folder's private copy plus the staged weights written next would not fit TMPDIR: its weights are hard
    links to the inodes opened (hash-checked, each said in a note), the small files copied; a weights file others
    may write is copied as before (a link would let them change what was hashed)."""
    from mhaexport.artifact import folder as F
    from mhaexport.models import hf_files as H

    src = hf_dir("llama", tokenizer=False)
    weights = sorted(p.name for p in src.iterdir() if p.suffix == ".safetensors")
    size = sum((src / n).stat().st_size for n in weights)
    real = shutil.disk_usage
    monkeypatch.setattr(F, "LINK_MIN_BYTES", 1)
    monkeypatch.setattr(H.shutil, "disk_usage", lambda p: real(p)._replace(free=size + (64 << 20) + size // 2))
    F.linked_notes()
    with H.hf_files(src, "tiny", reserve=size) as files:  # the copy (~size) and the staging (size): no room
        for n in weights:
            assert os.stat(files.dir / n).st_ino == os.stat(src / n).st_ino
            assert files.sha256[n] == sha256_file(src / n)
        assert os.stat(files.dir / "config.json").st_ino != os.stat(src / "config.json").st_ino  # a copy
    notes = F.linked_notes()
    assert len(notes) == len(weights) and all("read in place" in n for n in notes), notes
    with H.hf_files(src, "tiny") as files:  # room enough without a reserve: every file copied
        assert all(os.stat(files.dir / n).st_ino != os.stat(src / n).st_ino for n in weights)
    monkeypatch.setattr(H.shutil, "disk_usage", lambda p: real(p)._replace(free=0))
    with H.hf_files(src, "tiny", reserve=size) as files:  # no room even so: the least room taken all the same
        assert all(os.stat(files.dir / n).st_ino == os.stat(src / n).st_ino for n in weights)
    F.linked_notes()

    os.chmod(src / weights[0], 0o666)
    try:
        with H.hf_files(src, "tiny", reserve=size) as files:
            assert os.stat(files.dir / weights[0]).st_ino != os.stat(src / weights[0]).st_ino
    finally:
        os.chmod(src / weights[0], 0o644)
