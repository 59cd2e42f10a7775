"""An export folder: its manifest read as typed objects and trusted only after its hashes are checked, and the one
way to write an artifact into it (staged, locked, published by rename, then recorded). Torch-free.

Writing, as :func:`stage_artifact` does it:

1. under the folder lock: drop the artifact's manifest entry (a crash from here on leaves nothing a reader trusts),
   remove staging folders of writers that are gone, create this writer's ``.staging-<artifact>-<pid>-*`` folder;
2. without the lock: the exporter writes its files into the staging folder (the slow part);
3. under the lock: rename the files into place (main file last), remove files the artifact no longer has,
   hash them and record the entry in manifest.json (atomic rename).

Several writers may work on one folder at once; none removes another's live staging folder.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from mhaexport.artifact.details import OnnxDetails
from mhaexport.artifact.files import atomic_write_json, check_files, ensure_writable_dir, file_entries, read_json
from mhaexport.artifact.lock import FolderLock
from mhaexport.artifact.manifest import FILENAME, ArtifactEntry, Manifest, ModelRecord
from mhaexport.errors import ArtifactError
from mhaexport.iospec import ModelContract

STAGING_PREFIX = ".staging-"


def read_manifest(folder: str | Path) -> Manifest:
    """The folder's manifest (no hash check): ArtifactError for a missing folder, file or unreadable schema."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ArtifactError(f"export folder {folder} does not exist")
    path = folder / FILENAME
    if not path.is_file():
        raise ArtifactError(f"{folder} has no {FILENAME}: not an export folder (run `mhaexport onnx -o {folder}`)")
    return Manifest.from_dict(read_json(path, "manifest"), what=str(path))


@dataclass
class ExportFolder:
    """A read export folder. ``open`` checks the hashes of the artifacts asked for before returning it."""

    path: Path
    manifest: Manifest

    @classmethod
    def open(cls, folder: str | Path, artifact: str | None = None, *, check: bool = True) -> ExportFolder:
        """Read ``folder``'s manifest and (``check``) the files of ``artifact`` (every artifact when None)."""
        ef = cls(Path(folder), read_manifest(folder))
        if check:
            ef.check(artifact)
        return ef

    def check(self, artifact: str | None = None) -> None:
        """Every file of ``artifact`` (or of all) exists with its recorded size and sha256; else ArtifactError."""
        for name in ([artifact] if artifact else list(self.manifest.artifacts)):
            check_files(self.path, self.entry(name).files, name)

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
        """The path of ``artifact``'s main file (or of its file ``name``)."""
        return self.path / (name or self.entry(artifact).file)


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


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


def _staging_pid(path: Path) -> int | None:
    parts = path.name[len(STAGING_PREFIX):].split("-")
    for p in parts:
        if p.isdigit():
            return int(p)
    return None


def _remove_dead_staging(folder: Path) -> None:
    """Remove ``.staging-*`` folders whose writer process is gone (a killed export); leave live writers' alone."""
    for stale in folder.glob(f"{STAGING_PREFIX}*"):
        pid = _staging_pid(stale)
        if pid is None or (pid != os.getpid() and not _pid_alive(pid)):
            shutil.rmtree(stale, ignore_errors=True)


def _forget(folder: Path, artifact: str) -> list[str]:
    """Drop ``artifact``'s entry from the manifest (caller holds the lock); returns the files it listed."""
    try:
        old = read_manifest(folder)
    except ArtifactError:
        return []
    entry = old.artifacts.get(artifact)
    if entry is None:
        return []
    atomic_write_json(folder / FILENAME, old.with_artifact(artifact, None).to_dict())
    return list(entry.files)


@dataclass
class Staging:
    """A writer's scratch folder inside the export folder; :meth:`publish` moves its files in and records them."""

    folder: Path
    dir: Path
    artifact: str
    purpose: str
    previous_files: list[str] = field(default_factory=list)
    manifest: Manifest | None = None  # set by publish

    def publish(self, model: ModelRecord, entry: ArtifactEntry, files: list[str],
                owned: tuple[str, ...] = ()) -> Manifest:
        """Under the folder lock: rename ``files`` (staged; files[0] is the main file, moved last) into the folder,
        remove files this artifact listed before or may write (``owned``) but no longer has, then record ``entry``
        with every file's hash. Another model's entries are dropped (one folder, one model)."""
        with FolderLock(self.folder, self.purpose):
            for name in files[1:] + files[:1]:
                src = self.dir / name
                with open(src, "rb") as f:
                    os.fsync(f.fileno())
                os.replace(src, self.folder / name)
            for stale in set(self.previous_files) | set(owned):
                if stale not in files:
                    (self.folder / stale).unlink(missing_ok=True)
            entry.files = file_entries(self.folder, files)
            try:
                old = read_manifest(self.folder)
            except ArtifactError:
                old = None
            if old is not None and old.model.fingerprint == model.fingerprint:
                manifest = Manifest(model=model, artifacts=dict(old.artifacts)).with_artifact(self.artifact, entry)
            else:
                manifest = Manifest(model=model, artifacts={self.artifact: entry})
            atomic_write_json(self.folder / FILENAME, manifest.to_dict())
        self.manifest = manifest
        return manifest


@contextlib.contextmanager
def stage_artifact(folder: str | Path, artifact: str, purpose: str | None = None) -> Iterator[Staging]:
    """Prepare to (re)write ``artifact`` in ``folder``: checks the folder is writable, drops the entry under the
    lock, removes dead writers' staging folders and yields this writer's :class:`Staging`; the staging folder is
    removed afterwards whatever happens."""
    folder = ensure_writable_dir(folder)
    purpose = purpose or f"export {artifact}"
    with FolderLock(folder, purpose):
        previous = _forget(folder, artifact)
        _remove_dead_staging(folder)
        tmp = Path(tempfile.mkdtemp(dir=folder, prefix=f"{STAGING_PREFIX}{artifact}-{os.getpid()}-"))
    try:
        yield Staging(folder, tmp, artifact, purpose, previous)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
