"""An export folder: its manifest read as typed objects and trusted only after its hashes are checked, and the one
way to write an artifact into it (staged, locked, published by rename, then recorded). Torch-free.

Two guarantees (docs/DESIGN.md, "The export folder"):

**A good artifact stays trusted until its replacement is published.** Writing, as :func:`stage_artifact` does it:

1. under the folder lock: finish or roll back what a dead writer left (see below), remove dead processes' scratch
   folders, create this writer's ``.staging-<artifact>-<pid>-*`` folder. The artifact's manifest entry stays: the
   previous export is trusted and usable all through the slow part;
2. without the lock: the exporter writes its files into the staging folder (the slow part), then they are hashed;
3. under the lock (:meth:`Staging.publish`): hard links of the files about to be replaced or removed go into the
   staging folder and a journal (``PUBLISHING.json``: the sha256 of manifest.json as it was) is written; the files
   are renamed into place (main file last), files the artifact no longer has are removed, and manifest.json is
   replaced (atomic rename): that rename is the commit point. The journal goes last.

Interrupted anywhere before the commit point (Ctrl-C, an exception, a full disk), the writer rolls the folder back
itself; killed (SIGKILL, power), the next process that takes the lock (writer or reader) finds the journal of a
dead writer and rolls back when manifest.json is still the one the journal names (else the publish had committed
and only the scratch folder is removed). So a folder is either as it was before the command or as after it.

**Readers run exactly the bytes they checked.** :meth:`ExportFolder.open` reads manifest.json and takes a
*snapshot* of the artifact's files under the same lock: hard links in a ``.snapshot-<pid>-*`` folder (a copy
where hard links are refused). Writers only ever replace files by rename, never write into them, so a snapshot's
files keep the bytes they had when the manifest was read. The hashes are checked on the snapshot, and every reader
(verify, generate, bench, eval, lint, bisect, the runtime, onnxruntime-genai) loads the files from it
(:meth:`ExportFolder.file`, :attr:`ExportFolder.root`). The snapshot is removed by :meth:`ExportFolder.close`, at
process exit, or, after a kill, by the next process that takes the lock.

Several writers may work on one folder at once; none removes another's live staging folder.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from mhaexport.artifact.details import OnnxDetails
from mhaexport.artifact.files import (atomic_write_json, check_files, ensure_free_space, ensure_writable_dir,
                                      file_entries, read_json)
from mhaexport.artifact.lock import LOCK_FILE, FolderLock
from mhaexport.artifact.manifest import FILENAME, ArtifactEntry, Manifest, ModelRecord
from mhaexport.errors import ArtifactError
from mhaexport.iospec import ModelContract

STAGING_PREFIX = ".staging-"
SNAPSHOT_PREFIX = ".snapshot-"
JOURNAL = "PUBLISHING.json"
_BACKUP = ".replaced"  # inside a staging folder: hard links of the files a publish replaces or removes


def read_manifest(folder: str | Path) -> Manifest:
    """The folder's manifest (no hash check): ArtifactError for a missing folder, file or unreadable schema."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ArtifactError(f"export folder {folder} does not exist")
    path = folder / FILENAME
    if not path.is_file():
        raise ArtifactError(f"{folder} has no {FILENAME}: not an export folder (run `mhaexport onnx -o {folder}`)")
    return Manifest.from_dict(read_json(path, "manifest"), what=str(path))


# snapshots this process made and has not closed yet: removed at exit
_live_snapshots: set[Path] = set()


@atexit.register
def _remove_live_snapshots() -> None:
    for snap in list(_live_snapshots):
        shutil.rmtree(snap, ignore_errors=True)
    _live_snapshots.clear()


@dataclass
class ExportFolder:
    """A read export folder. ``open`` snapshots the files of the artifacts asked for and checks their hashes before
    returning it; :meth:`file` names the snapshot's files, which are the bytes that were checked.

    ``path`` is the folder as the user named it (messages, reports, caches); ``root`` is where its files are read
    (the snapshot; ``path`` itself for an object made without :meth:`open`)."""

    path: Path
    manifest: Manifest
    root: Path | None = None

    def __post_init__(self) -> None:
        self.path = Path(self.path)
        if self.root is None:
            self.root = self.path

    @classmethod
    def open(cls, folder: str | Path, artifact: str | None = None, *, check: bool = True) -> ExportFolder:
        """Read ``folder``'s manifest and snapshot the files of ``artifact`` (every artifact when None) under the
        folder lock; with ``check``, their sizes and sha256 are then checked on the snapshot (ArtifactError naming
        the file in ``folder`` otherwise)."""
        folder = Path(folder)
        if not folder.is_dir():
            raise ArtifactError(f"export folder {folder} does not exist")
        with _reader_lock(folder) as locked:
            if locked:
                _recover(folder)
            manifest = read_manifest(folder)
            ef = cls(folder, manifest)
            names = [artifact] if artifact else list(manifest.artifacts)
            files = sorted({f for n in names for f in ef.entry(n).files})
            if files:
                ef.root = _snapshot(folder, files)
        if check:
            try:
                ef.check(artifact)
            except BaseException:
                ef.close()
                raise
        return ef

    def close(self) -> None:
        """Remove the snapshot (the files stay readable by whoever already opened them; :meth:`file` then names
        files that are gone, never the folder's unchecked ones)."""
        if self.root in _live_snapshots:
            shutil.rmtree(self.root, ignore_errors=True)
            _live_snapshots.discard(self.root)

    def __enter__(self) -> ExportFolder:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def check(self, artifact: str | None = None) -> None:
        """Every file of ``artifact`` (or of all) exists with its recorded size and sha256; else ArtifactError."""
        for name in ([artifact] if artifact else list(self.manifest.artifacts)):
            check_files(self.root, self.entry(name).files, name, shown=self.path)

    @property
    def model(self) -> ModelRecord:
        return self.manifest.model

    @property
    def contract(self) -> ModelContract:
        """The decoder contract. ArtifactError for an export of a module on its own (``--module attention``): every
        reader but verify (generate, bench, lint, bisect, the deploy runtime) runs decoders only."""
        contract = self.manifest.model.contract
        if not isinstance(contract, ModelContract):
            raise ArtifactError(f"{self.path} holds the {contract.kind} block on its own (`--module {contract.kind}`),"
                                " not a decoder: only `mhaexport verify` reads such a folder")
        return contract

    @property
    def module(self) -> str | None:
        """The module exported on its own ("attention"), or None for a decoder."""
        return self.manifest.model.module

    @property
    def artifacts(self) -> dict[str, ArtifactEntry]:
        return self.manifest.artifacts

    def has(self, artifact: str) -> bool:
        return artifact in self.manifest.artifacts

    def entry(self, artifact: str) -> ArtifactEntry:
        """``artifact``'s entry, or ArtifactError listing what the folder holds."""
        entry = self.manifest.artifacts.get(artifact)
        if entry is None:
            held = ", ".join(self.manifest.artifacts) or "nothing"
            raise ArtifactError(f"{self.path} holds no {artifact} export (manifest lists: {held})")
        return entry

    def file(self, artifact: str, name: str | None = None) -> Path:
        """The path of ``artifact``'s main file (or of its file ``name``) as checked: in the snapshot."""
        return self.root / (name or self.entry(artifact).file)


def lowering_of(ef: ExportFolder) -> str | None:
    """How an export folder's ONNX graph holds attention, as a label: "attention=ort float16", with " kv=shared"
    for a shared KV cache and the weights' quantization when there is one: "attention=decomposed float32 int4"; an
    adopted file's producer: "onnxruntime-genai float32 kv=shared" (None: no ONNX)."""
    onnx_art = ef.artifacts.get("onnx")
    if onnx_art is None or not isinstance(d := onnx_art.details, OnnxDetails):
        return None
    shared = " kv=shared" if d.cache.shared else ""
    quant = f" {d.quantization.weights}" if d.quantization and d.quantization.weights else ""
    if d.producer:
        return f"{d.producer} {onnx_art.dtype}{quant}{shared}"
    return f"attention={d.attention or 'decomposed'} {onnx_art.dtype}{quant}{shared}"


def same_model_folders(folder: str | Path, ef: ExportFolder,
                       others: tuple[str, ...] | list[str]) -> list[tuple[Path, ExportFolder]]:
    """Read and hash-check each of ``others``' ONNX exports; each must hold the model of ``folder`` (``ef``): same
    fingerprint, else ArtifactError naming both. ``folder`` itself and repeats are dropped."""
    out = []
    want = ef.model.fingerprint
    seen = {Path(folder).resolve()}
    for other in others:
        other = Path(other)
        if other.resolve() in seen:  # the folder itself, or named twice: once is enough
            continue
        seen.add(other.resolve())
        m = ExportFolder.open(other, "onnx")
        if m.model.fingerprint != want:
            raise ArtifactError(
                f"--compare {other} holds {m.model.spec} (model fingerprint {m.model.fingerprint}), "
                f"not the model of {folder} ({ef.model.spec}, fingerprint {want}): compare exports "
                "of one model only")
        out.append((other, m))
    return out


def shown_path(path: str | Path) -> Path:
    """A file as the user knows it: a path inside a reader's snapshot named by its export folder's path."""
    path = Path(path)
    parts = path.parts
    for i, part in enumerate(parts):
        if part.startswith(SNAPSHOT_PREFIX) or part.startswith(f"mhaexport{SNAPSHOT_PREFIX}"):
            return Path(*parts[:i], *parts[i + 1:]) if part.startswith(SNAPSHOT_PREFIX) else Path(*parts[i + 1:])
    return path


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


def _scratch_pid(path: Path) -> int | None:
    """The pid in a ``.staging-<artifact>-<pid>-*`` or ``.snapshot-<pid>-*`` folder's name."""
    name = path.name
    for prefix in (STAGING_PREFIX, SNAPSHOT_PREFIX):
        if name.startswith(prefix):
            name = name[len(prefix):]
    for p in name.split("-"):
        if p.isdigit():
            return int(p)
    return None


def _sha256_or_none(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except FileNotFoundError:
        return None


def _roll_back(folder: Path, staging: Path, journal: dict) -> None:
    """Undo an uncommitted publish: the replaced and removed files back from their hard links, the new ones gone."""
    backup = staging / _BACKUP
    for name in journal.get("created", []):
        (folder / name).unlink(missing_ok=True)
    for name in journal.get("backed_up", []):
        if (backup / name).exists():
            os.replace(backup / name, folder / name)


def _recover(folder: Path) -> None:
    """(Caller holds the lock.) Scratch folders of processes that are gone: a staging folder with a publish journal
    is rolled back when manifest.json is still the one the journal names (the writer died before its commit point);
    then every dead scratch folder is removed. Live writers' and readers' folders are left alone."""
    for scratch in [*folder.glob(f"{STAGING_PREFIX}*"), *folder.glob(f"{SNAPSHOT_PREFIX}*")]:
        pid = _scratch_pid(scratch)
        if pid == os.getpid() and scratch.name.startswith(SNAPSHOT_PREFIX) and \
                scratch.resolve() not in {s.resolve() for s in _live_snapshots}:
            shutil.rmtree(scratch, ignore_errors=True)  # named for this process but not one of its own: a copy
            continue
        if pid is not None and (pid == os.getpid() or _pid_alive(pid)):
            continue
        journal_path = scratch / JOURNAL
        if journal_path.is_file():
            try:
                journal = json.loads(journal_path.read_text())
            except (OSError, ValueError):
                journal = None  # written atomically: a torn journal was never in force
            if journal is not None and _sha256_or_none(folder / FILENAME) == journal.get("manifest_sha256"):
                _roll_back(folder, scratch, journal)
        shutil.rmtree(scratch, ignore_errors=True)


@contextlib.contextmanager
def _reader_lock(folder: Path) -> Iterator[bool]:
    """The folder lock for a reader's snapshot (held for the time hard links take). Yields whether it is held: a
    folder this process cannot write has no lock to take (nobody here can publish into it either), and then the
    snapshot is a copy whose hashes are checked like any other."""
    if not os.access(folder, os.W_OK) and not (folder / LOCK_FILE).exists():
        yield False
        return
    try:
        lock = FolderLock(folder, "read (snapshot)")
        lock.__enter__()
    except PermissionError:
        yield False
        return
    try:
        yield True
    finally:
        lock.__exit__(None, None, None)


def _snapshot(folder: Path, files: list[str]) -> Path:
    """A new scratch folder holding the ``files`` of ``folder`` as hard links in a new ``.snapshot-<pid>-*`` folder, or
    copies where a link is refused (another file system, a read-only folder: then in the system's temp folder).
    A listed file that is missing is left out: the hash check names it."""
    try:
        snap = Path(tempfile.mkdtemp(dir=folder, prefix=f"{SNAPSHOT_PREFIX}{os.getpid()}-"))
    except OSError:
        snap = Path(tempfile.mkdtemp(prefix=f"mhaexport{SNAPSHOT_PREFIX}{os.getpid()}-"))
    _live_snapshots.add(snap)
    try:
        for name in files:
            src, dst = folder / name, snap / name
            if not src.is_file():
                continue
            dst.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(src, dst)
            except OSError:
                shutil.copyfile(src, dst)
    except BaseException:
        shutil.rmtree(snap, ignore_errors=True)
        _live_snapshots.discard(snap)
        raise
    return snap


@dataclass
class Staging:
    """A writer's scratch folder inside the export folder; :meth:`publish` moves its files in and records them."""

    folder: Path
    dir: Path
    artifact: str
    purpose: str
    previous_files: list[str] = field(default_factory=list)  # the artifact's files when staging began
    manifest: Manifest | None = None  # set by publish

    def publish(self, model: ModelRecord, entry: ArtifactEntry, files: list[str],
                owned: tuple[str, ...] = ()) -> Manifest:
        """Hash the staged ``files`` (files[0] is the main file), then under the folder lock: keep hard links of
        what is replaced or removed and a journal, rename the files into place (main file last), remove files this
        artifact listed or may write (``owned``) but no longer has, and record ``entry`` in manifest.json (the
        commit point). Another model's entries are dropped (one folder, one model). Anything raised before the
        commit point rolls the folder back to what it was."""
        for name in files:
            with open(self.dir / name, "rb") as f:
                os.fsync(f.fileno())
        entry.files = file_entries(self.dir, files)  # the bytes renamed below: a rename keeps them
        with FolderLock(self.folder, self.purpose):
            try:
                old = read_manifest(self.folder)
            except ArtifactError:
                old = None
            listed = list(old.artifacts[self.artifact].files) if old and self.artifact in old.artifacts else []
            stale = sorted((set(self.previous_files) | set(listed) | set(owned)) - set(files))
            if old is not None and old.model.fingerprint == model.fingerprint:
                manifest = Manifest(model=model, artifacts=dict(old.artifacts)).with_artifact(self.artifact, entry)
            else:
                manifest = Manifest(model=model, artifacts={self.artifact: entry})
            backup = self.dir / _BACKUP
            backup.mkdir(exist_ok=True)
            journal = {"manifest_sha256": _sha256_or_none(self.folder / FILENAME), "created": [], "backed_up": []}
            for name in files + stale:
                target = self.folder / name
                if target.is_file():
                    (backup / name).parent.mkdir(parents=True, exist_ok=True)
                    os.link(target, backup / name)
                    journal["backed_up"].append(name)
                elif name in files:
                    journal["created"].append(name)
            atomic_write_json(self.dir / JOURNAL, journal)
            try:
                for name in files[1:] + files[:1]:
                    os.replace(self.dir / name, self.folder / name)
                for name in stale:
                    (self.folder / name).unlink(missing_ok=True)
                atomic_write_json(self.folder / FILENAME, manifest.to_dict())  # the commit point
            except BaseException:
                _roll_back(self.folder, self.dir, journal)
                raise
            (self.dir / JOURNAL).unlink()
        self.manifest = manifest
        return manifest


@contextlib.contextmanager
def stage_artifact(folder: str | Path, artifact: str, purpose: str | None = None, *,
                   expected_bytes: int | None = None) -> Iterator[Staging]:
    """Prepare to (re)write ``artifact`` in ``folder``: checks the folder is writable (and, given
    ``expected_bytes``, has that much free space), finishes what dead writers left under the lock and yields this
    writer's :class:`Staging`. The artifact's current entry stays trusted until :meth:`Staging.publish`; the
    staging folder is removed afterwards whatever happens."""
    folder = ensure_writable_dir(folder)
    if expected_bytes is not None:
        ensure_free_space(folder, expected_bytes, f"the {artifact} export")
    purpose = purpose or f"export {artifact}"
    with FolderLock(folder, purpose):
        _recover(folder)
        try:
            old = read_manifest(folder)
            previous = list(old.artifacts[artifact].files) if artifact in old.artifacts else []
        except ArtifactError:
            previous = []
        tmp = Path(tempfile.mkdtemp(dir=folder, prefix=f"{STAGING_PREFIX}{artifact}-{os.getpid()}-"))
    try:
        yield Staging(folder, tmp, artifact, purpose, previous)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
