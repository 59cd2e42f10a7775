"""An export folder: its manifest read as typed objects and trusted only after its hashes are checked, and the one
way to write an artifact into it (staged, locked, published by rename, then recorded). Torch-free.

Two guarantees (docs/DESIGN.md, "Artifacts"):

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

**Readers run exactly the bytes they checked, and write nothing.** :meth:`ExportFolder.open` reads manifest.json
and, under the readers' shared lock (so no publish happens in between; a folder without a lock file, or a read-only
one, is read without it), copies the artifact's files into a private *snapshot* in the system's temporary folder,
hashing the bytes as it copies them. Every name is confined to the folder (:mod:`mhaexport.artifact.confine`: no
``..``, no absolute path, no symlink, regular files only; an ONNX file's external data and genai_config.json's decoder
file must be among the hashed files). Every reader (verify, generate, bench, eval, lint, bisect, the runtime,
onnxruntime-genai) loads the files from the snapshot (:meth:`ExportFolder.file`, :attr:`ExportFolder.root`): they
are the bytes that were hashed, whatever another process writes into the folder afterwards, in place or not — but
for a file too large for the snapshot's free space, which is hard-linked (the opened inode) when only this user can
write it, said in a note: there a process of the user's own rewriting it in place would be seen. The
snapshot is removed by :meth:`ExportFolder.close`, at process exit, or, after a kill, by the next reader. A reader
never rolls back a dead writer's publish (that would be writing): it refuses the folder until the next writer
does.

Several writers may work on one folder at once; none removes another's live staging folder.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from mhaexport.artifact.confine import (GENAI_CONFIG, MissingFile, check_name, copy_hashed, link_hashed,
                                       only_yours, open_inside, read_inside)
from mhaexport.artifact.details import OnnxDetails
from mhaexport.artifact.files import (atomic_write_json, check_files, ensure_free_space, ensure_writable_dir,
                                      file_entries)
from mhaexport.artifact.lock import FolderLock, reader_lock
from mhaexport.artifact.manifest import FILENAME, ArtifactEntry, Manifest, ModelRecord
from mhaexport.core.errors import ArtifactError, UnsafeFolder
from mhaexport.core.iospec import ModelContract
from mhaexport.core.untrusted import check_json, load_json

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
    if not path.is_file() and not path.is_symlink():
        raise ArtifactError(f"{folder} has no {FILENAME}: not an export folder (run `mhaexport onnx -o {folder}`)")
    # read inside the folder like every file it holds: a manifest.json that is a link is refused, never followed
    data = load_json(read_inside(folder, FILENAME, str(path)), f"manifest {path}")
    if not isinstance(data, dict):
        raise ArtifactError(f"manifest {path} holds a JSON {type(data).__name__}, expected an object")
    return Manifest.from_dict(data, what=str(path))


# snapshots this process made and has not closed yet (snapshot -> the folder it copies): removed at exit
_live_snapshots: dict[Path, Path] = {}


@atexit.register
def _remove_live_snapshots() -> None:
    for snap in list(_live_snapshots):
        shutil.rmtree(snap, ignore_errors=True)
    _live_snapshots.clear()


def folders_being_read() -> list[Path]:
    """The export folders this process has open for reading (each snapshot's source folder, resolved): where no
    cache or output of a reader may go."""
    return [Path(f).resolve() for f in _live_snapshots.values()]


def snapshot_dir() -> Path:
    """Where readers' private snapshots go: the system's temporary folder (``TMPDIR``), never the export folder."""
    return Path(tempfile.gettempdir())


def _remove_dead_snapshots() -> None:
    """Snapshots of reader processes that died (SIGKILL) before removing theirs: ``mhaexport.snapshot-<pid>-*`` in
    :func:`snapshot_dir` whose pid is gone. Only this naming, only folders this user owns."""
    try:
        found = list(snapshot_dir().glob(f"mhaexport{SNAPSHOT_PREFIX}*"))
    except OSError:
        return
    for snap in found:
        pid = _scratch_pid(snap)
        try:
            mine = snap.is_dir() and not snap.is_symlink() and snap.stat().st_uid == os.getuid()
        except OSError:
            continue
        if mine and pid is not None and pid != os.getpid() and not _pid_alive(pid):
            shutil.rmtree(snap, ignore_errors=True)


@dataclass
class ExportFolder:
    """A read export folder. ``open`` snapshots the files of the artifacts asked for and checks their hashes before
    returning it; :meth:`file` names the snapshot's files, which are the bytes that were checked.

    ``path`` is the folder as the user named it (messages, reports, caches); ``root`` is where its files are read
    (the snapshot; ``path`` itself for an object made without :meth:`open`)."""

    path: Path
    manifest: Manifest
    root: Path | None = None
    _copied: dict[str, tuple[str, int]] = field(default_factory=dict, repr=False)  # name -> (sha256, bytes) copied

    def __post_init__(self) -> None:
        self.path = Path(self.path)
        if self.root is None:
            self.root = self.path

    @classmethod
    def open(cls, folder: str | Path, artifact: str | None = None, *, check: bool = True,
             then_writes: float = 0.0) -> ExportFolder:
        """Read ``folder``'s manifest and copy the files of ``artifact`` (every artifact when None) into a private
        snapshot, hashing the bytes as they are copied, under the readers' shared lock; with ``check``, their sizes
        and sha256 must be the manifest's (ArtifactError naming the file in ``folder`` otherwise). Every name the
        folder supplies is confined to it (:mod:`mhaexport.artifact.confine`: UnsafeFolder naming the entry); a
        reader writes nothing into the folder. ``then_writes``: what the reader writes next on the snapshot's file
        system, as a fraction of the files' bytes (quantize: its output and its spill) — the room left for it decides
        which files are read in place rather than copied (:func:`links_for_room`)."""
        folder = Path(folder)
        if not folder.is_dir():
            raise ArtifactError(f"export folder {folder} does not exist")
        _remove_dead_snapshots()
        with reader_lock(folder):
            _refuse_unfinished_publish(folder)
            manifest = read_manifest(folder)
            ef = cls(folder, manifest)
            names = [artifact] if artifact else list(manifest.artifacts)
            files = sorted({f for n in names for f in ef.entry(n).files})
            if files:
                ef.root, ef._copied = _snapshot(folder, files, manifest, then_writes)
        try:
            ef._check_names(names)
            if check:
                ef.check(artifact)
        except BaseException:
            ef.close()
            raise
        return ef

    def _check_names(self, names: list[str]) -> None:
        """The names the files themselves supply, confined like the manifest's: genai_config.json's decoder filename
        must be one of the artifact's own (hashed) files. (External-data locations need onnx's parser:
        :func:`mhaexport.verify.external_data.check_external_data`, which verify and lint call; the deploy path,
        torch- and onnx-free, relies on the snapshot holding only hashed files and on ONNX Runtime refusing a
        location that leaves the model's folder or is absolute.)"""
        for name in names:
            entry = self.entry(name)
            where = f"{self.path / FILENAME}: artifacts.{name}"
            for fname in entry.files:
                if fname.endswith(".json") and fname in self._copied:  # onnxruntime-genai's C++ parser reads these
                    check_json(self.root / fname, str(self.path / fname))  # bounded (size, depth) before anyone
                if Path(fname).name == GENAI_CONFIG and fname in self._copied:
                    self._check_genai_config(fname, entry, where)

    def _check_genai_config(self, fname: str, entry: ArtifactEntry, where: str) -> None:
        try:
            config = load_json((self.root / fname).read_bytes(), f"{self.path / fname}")
            filename = config["model"]["decoder"]["filename"]
        except (KeyError, TypeError, ArtifactError):
            return  # not a config onnxruntime-genai could read: the genai runtime and lint report it
        check_name(filename, f"{self.path / fname}: model.decoder.filename")
        base = str(Path(fname).parent)
        if (filename if base == "." else f"{base}/{filename}") not in entry.files:
            raise UnsafeFolder(f"{self.path / fname}: model.decoder.filename {filename!r} is not one of the files "
                               f"{where} hashes: onnxruntime-genai would load a file verify never checked; refused")

    def close(self) -> None:
        """Remove the snapshot (the files stay readable by whoever already opened them; :meth:`file` then names
        files that are gone, never the folder's unchecked ones)."""
        if self.root in _live_snapshots:
            shutil.rmtree(self.root, ignore_errors=True)
            _live_snapshots.pop(self.root, None)

    def __enter__(self) -> ExportFolder:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def check(self, artifact: str | None = None) -> None:
        """Every file of ``artifact`` (or of all) exists with its recorded size and sha256 — the digests taken while
        the snapshot copied them, so the bytes judged are the bytes loaded; else ArtifactError."""
        for name in ([artifact] if artifact else list(self.manifest.artifacts)):
            if self.root == self.path:  # made without open(): nothing copied, read the folder
                check_files(self.root, self.entry(name).files, name, shown=self.path)
                continue
            for fname, meta in self.entry(name).files.items():
                got = self._copied.get(fname)
                shown = self.path / fname
                if got is None:
                    raise ArtifactError(f"{shown} is missing: the manifest lists it for the {name} export")
                digest, size = got
                if size != meta["bytes"]:
                    raise ArtifactError(f"{shown} has {size} bytes, the manifest recorded {meta['bytes']}: "
                                        "truncated or altered, re-export it")
                if digest != meta["sha256"]:
                    raise ArtifactError(f"{shown} sha256 {digest[:12]}… does not match the manifest's "
                                        f"{meta['sha256'][:12]}…: altered after export, re-export it")

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


@contextlib.contextmanager
def opened(folder: str | Path | ExportFolder, artifact: str | None = None, *,
           check: bool = True) -> Iterator[ExportFolder]:
    """``folder`` as an opened :class:`ExportFolder`: one given is used as it is (whoever opened it closes it); a
    path is opened here (:meth:`ExportFolder.open`) and its snapshot removed when the block ends, on errors too. A
    reader that takes either is how a command opens its folder once and hands it down."""
    if isinstance(folder, ExportFolder):
        yield folder
        return
    with ExportFolder.open(folder, artifact, check=check) as ef:
        yield ef


class OpenFolders:
    """The export folders one command reads, each opened once: :meth:`open` snapshots and hash-checks a folder the
    first time it is asked for and returns that same :class:`ExportFolder` afterwards (an open of every artifact
    serves a request for one); every snapshot is removed when the command ends (``with OpenFolders() as reads:``,
    on errors too). ``bench --lowerings/--quantize/--builder`` reads its folder, the --compare folders and the
    variants it finds or makes through one."""

    def __init__(self) -> None:
        self._open: dict[tuple[Path, str | None], ExportFolder] = {}

    def open(self, folder: str | Path | ExportFolder, artifact: str | None = None) -> ExportFolder:
        """``folder`` opened (once) for ``artifact`` (every artifact when None); an ExportFolder is returned as it
        is. ArtifactError as :meth:`ExportFolder.open` (a failed open is not remembered)."""
        if isinstance(folder, ExportFolder):
            return folder
        key = Path(folder).resolve()
        for art in dict.fromkeys((None, artifact)):
            ef = self._open.get((key, art))
            if ef is not None:
                return ef
        ef = ExportFolder.open(folder, artifact)
        self._open[(key, artifact)] = ef
        return ef

    def reusable(self, folder: str | Path, same: Callable[[ExportFolder], bool]) -> bool:
        """Whether ``folder`` holds a hash-checked ONNX export that ``same`` accepts (the same model and variant: kept,
        opened once); a folder that is absent or unreadable is not, and one that ``same`` refuses is forgotten, to be
        written anew."""
        try:
            ef = self.open(folder, "onnx")
        except ArtifactError:
            return False
        if same(ef):
            return True
        self.forget(folder)
        return False

    def forget(self, folder: str | Path) -> None:
        """Close ``folder``'s snapshots before something writes into it (the next :meth:`open` reads it anew)."""
        key = Path(folder).resolve()
        for k in [k for k in self._open if k[0] == key]:
            self._open.pop(k).close()

    def close(self) -> None:
        for ef in self._open.values():
            ef.close()
        self._open.clear()

    def __enter__(self) -> OpenFolders:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def lowering_of(ef: ExportFolder) -> str | None:
    """How an export folder's ONNX graph holds attention, as a label: "attention=ort float16", with " kv=shared"
    for a shared KV cache and the weights' quantization when there is one: "attention=decomposed float32 int4"; an
    adopted file's producer: "onnxruntime-genai float32 kv=shared" (None: no ONNX)."""
    if not ef.has("onnx") or not isinstance(d := (onnx_art := ef.artifacts["onnx"]).details, OnnxDetails):
        return None
    shared = f" kv={d.cache.kind}" if d.cache.shared else ""  # kv=shared, or kv=window (a window-sized cache)
    quant = f" {d.quantization.weights}" if d.quantization and d.quantization.weights else ""
    if d.producer:
        return f"{d.producer} {onnx_art.dtype}{quant}{shared}"
    return f"attention={d.attention or 'decomposed'} {onnx_art.dtype}{quant}{shared}"


def same_model_folders(folder: str | Path, ef: ExportFolder, others: tuple[str, ...] | list[str],
                       reads: OpenFolders | None = None) -> list[tuple[Path, ExportFolder]]:
    """Read and hash-check each of ``others``' ONNX exports; each must hold the model of ``folder`` (``ef``): same
    fingerprint, else ArtifactError naming both. ``folder`` itself and repeats are dropped. ``reads``: the command's
    :class:`OpenFolders` (a folder it opened already is not opened again, and it closes them); without it the
    caller closes the ExportFolders returned."""
    out = []
    want = ef.model.fingerprint
    seen = {Path(folder).resolve()}
    for other in others:
        other = Path(other)
        if other.resolve() in seen:  # the folder itself, or named twice: once is enough
            continue
        seen.add(other.resolve())
        m = reads.open(other, "onnx") if reads is not None else ExportFolder.open(other, "onnx")
        if m.model.fingerprint != want:
            raise ArtifactError(
                f"--compare {other} holds {m.model.spec} (model fingerprint {m.model.fingerprint}), "
                f"not the model of {folder} ({ef.model.spec}, fingerprint {want}): compare exports "
                "of one model only")
        out.append((other, m))
    return out


def in_snapshot(path: str | Path) -> bool:
    """Whether ``path`` lies in a live private snapshot of this process (a reader's own folder: a file written
    there, as verify's float-activation twin, changes nothing of the user's)."""
    path = Path(path)
    return any(snap in path.parents for snap in _live_snapshots)


def shown_path(path: str | Path) -> Path:
    """A file as the user knows it: a path inside a reader's snapshot named by its export folder's path."""
    path = Path(path)
    for snap, folder in _live_snapshots.items():
        if path == snap or snap in path.parents:
            return folder / path.relative_to(snap)
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
    """The pid in a ``.staging-<artifact>-<pid>-*`` or ``[mhaexport].snapshot-<pid>-*`` folder's name."""
    name = path.name.removeprefix("mhaexport")
    for prefix in (STAGING_PREFIX, SNAPSHOT_PREFIX):
        if name.startswith(prefix):
            name = name[len(prefix):]
    for p in name.split("-"):
        if p.isdigit():
            return int(p)
    return None


def _sha256_or_none(path: Path) -> str | None:
    """The sha256 of the regular file ``path`` (read without following a link: a manifest.json that is a link to a
    device would never end), None where there is none or it is not a regular file."""
    try:
        fd = open_inside(path.parent, path.name, str(path))
    except (MissingFile, UnsafeFolder):
        return None
    h = hashlib.sha256()
    with os.fdopen(fd, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def _journal_names(journal: dict, key: str, where: str) -> list[str]:
    """A publish journal's list of file names, each confined to the folder (a journal is the folder's content too:
    a crafted one must not make a writer's roll-back write or remove anything outside)."""
    names = journal.get(key, [])
    if not isinstance(names, list):
        raise UnsafeFolder(f"{where}: {key} is not a list of file names: refused")
    return [check_name(n, f"{where}: {key}") for n in names]


def _roll_back(folder: Path, staging: Path, journal: dict) -> None:
    """Undo an uncommitted publish: the replaced and removed files back from their hard links, the new ones gone.
    Every name is the journal's, confined to the folder; nothing is followed through a symlink: the staging folder,
    its backup folder and each backed-up file are opened one part at a time without following a link
    (:func:`~mhaexport.artifact.confine.open_inside`'s walk) and each must be what mhaexport wrote there — a folder, a
    regular file — or the roll-back is refused (UnsafeFolder: a crafted staging folder holding a link out would
    otherwise move a file from outside into the folder) and nothing is moved."""
    where = str(staging / JOURNAL)
    created = _journal_names(journal, "created", where)
    backed_up = _journal_names(journal, "backed_up", where)
    for name in created + backed_up:
        if any(p.is_symlink() for p in (folder / name).parents if folder in p.parents):
            raise UnsafeFolder(f"{where}: {name} lies under a symlink: refused")
    sources = {}
    for name in backed_up:  # every file to move back, checked before any is moved
        try:
            fd = open_inside(staging, f"{_BACKUP}/{name}", f"{where}: backed_up")
        except MissingFile:
            continue
        st = os.fstat(fd)
        os.close(fd)
        sources[name] = st
    for name in created:
        (folder / name).unlink(missing_ok=True)  # unlink removes a link itself, never its target
    for name, st in sources.items():
        src = staging / _BACKUP / name
        now = os.lstat(src)
        if (now.st_ino, now.st_dev) != (st.st_ino, st.st_dev):  # swapped since it was checked: leave it
            raise UnsafeFolder(f"{where}: {_BACKUP}/{name} changed while it was rolled back: refused")
        os.replace(src, folder / name)


def _dead_scratch(folder: Path) -> list[Path]:
    """Staging folders of writer processes that are gone (the folder's own ``.staging-*`` folders, not links)."""
    out = []
    for scratch in folder.glob(f"{STAGING_PREFIX}*"):
        if scratch.is_symlink() or not scratch.is_dir():
            continue
        pid = _scratch_pid(scratch)
        if pid is not None and pid != os.getpid() and not _pid_alive(pid):
            out.append(scratch)
    return out


def _uncommitted(folder: Path, scratch: Path) -> dict | None:
    """The publish journal a dead writer left in ``scratch`` when manifest.json is still the one it names (the
    publish did not reach its commit point), else None."""
    journal_path = scratch / JOURNAL
    try:  # read without following a link, a regular file only
        journal = load_json(read_inside(scratch, JOURNAL, str(journal_path), 1 << 20), str(journal_path))
    except MissingFile:
        return None
    except UnsafeFolder:
        raise
    except (OSError, ArtifactError):
        return None  # written atomically: a torn journal was never in force
    if isinstance(journal, dict) and _sha256_or_none(folder / FILENAME) == journal.get("manifest_sha256"):
        return journal
    return None


def _recover(folder: Path) -> None:
    """(A writer, holding the lock.) Scratch folders of processes that are gone: a staging folder with a publish
    journal is rolled back when manifest.json is still the one the journal names (the writer died before its commit
    point); then every dead staging folder is removed. Live writers' folders are left alone. Readers never do this:
    a reader writes nothing into a folder (see :func:`_refuse_unfinished_publish`)."""
    for scratch in _dead_scratch(folder):
        journal = _uncommitted(folder, scratch)
        if journal is not None:
            _roll_back(folder, scratch, journal)
        shutil.rmtree(scratch, ignore_errors=True)
    for old in folder.glob(f"{SNAPSHOT_PREFIX}*"):  # readers of earlier versions snapshotted inside the folder
        pid = _scratch_pid(old)
        if old.is_dir() and not old.is_symlink() and pid is not None and pid != os.getpid() and not _pid_alive(pid):
            shutil.rmtree(old, ignore_errors=True)


def _refuse_unfinished_publish(folder: Path) -> None:
    """(A reader.) ArtifactError when a writer died in the middle of a publish into ``folder`` (its journal is in
    force): the folder mixes old and new files until a writer rolls it back, which a reader does not do."""
    for scratch in _dead_scratch(folder):
        if _uncommitted(folder, scratch) is not None:
            raise ArtifactError(f"an export into {folder} was interrupted in the middle of its publish (process "
                                f"{_scratch_pid(scratch)} is gone; {scratch.name}/{JOURNAL}): the next export into "
                                "the folder rolls it back — run the export again")


# a file at least this large may be linked instead of copied when the copy would not fit (see _snapshot)
LINK_MIN_BYTES = 64 << 20
# files of this process's snapshots that are hard links to the folder's inode, not copies: {snapshot: [notes]}
_linked: dict[Path, list[str]] = {}


def links_for_room(sizes: dict[str, int], free: int | None, need: int, then_writes: int = 0) -> list[str] | None:
    """Which files a private copy of ``sizes`` ({name: bytes}) hard-links instead of copying so that ``need`` bytes
    (the copies, and whatever must be written beside them) fit ``free`` with 64 MB to spare, and with them, where
    linking makes the room, the ``then_writes`` bytes the reader writes next (quantize's output): none where all fit,
    else the largest (from :data:`LINK_MIN_BYTES`) until the rest does — every one of them where ``then_writes``
    cannot fit at all; None where even that leaves no room for ``need``."""
    spare = 64 << 20
    to_link: list[str] = []
    if free is None or free >= need + then_writes + spare:
        return to_link
    for name in sorted(sizes, key=lambda n: -sizes[n]):
        if free >= need + then_writes + spare or sizes[name] < LINK_MIN_BYTES:
            break
        to_link.append(name)
        need -= sizes[name]
    return to_link if free >= need + spare else None


def read_in_place_note(path: Path, size: int, free: int | None, base: Path) -> str:
    """The note a private copy leaves for a file it read in place (a hard link) instead of copying."""
    return (f"{path} ({size / 1e9:.1f} GB) was read in place, not copied: {(free or 0) / 1e9:.1f} GB free in {base}. "
            "Only you can write it, and its hash was checked; a process of yours rewriting it during this command "
            "would not be seen (TMPDIR with room: a private copy)")


def remember_linked(where: Path, notes: list[str]) -> None:
    """Notes of files a private copy at ``where`` read in place (said by :func:`linked_notes`)."""
    if notes:
        _linked[where] = notes


def linked_notes() -> list[str]:
    """What this process read in place (linked, not copied), one note per file, each said once: the CLI says them
    when the command ends."""
    out = [n for notes in _linked.values() for n in notes]
    _linked.clear()
    return out


def _snapshot(folder: Path, files: list[str], manifest: Manifest, then_writes: float = 0.0
              ) -> tuple[Path, dict[str, tuple[str, int]]]:
    """A private copy of ``folder``'s ``files`` in a new ``mhaexport.snapshot-<pid>-*`` folder of
    :func:`snapshot_dir` (mode 0700), each read through :func:`~mhaexport.artifact.confine.open_inside` (no symlink,
    regular files only) and hashed while it is copied: (the snapshot, {name: (sha256, bytes)}). The copy is the
    reader's own, so what it loads is what it hashed whatever another process writes into the folder. A listed file
    that is missing is left out: the hash check names it.

    Where the copy would not fit the snapshot's file system (an 8 B model's 32 GB weights), the largest files (from
    :data:`LINK_MIN_BYTES`) are hard-linked instead until the rest fits — the opened inode itself
    (:func:`~mhaexport.artifact.confine.link_hashed`: a rename or swap of the folder's entries changes nothing) —
    and only files no one but this user can write (:func:`~mhaexport.artifact.confine.only_yours`), each said in a
    note (:func:`linked_notes`): the one thing a link does not stop is a process of yours rewriting that file in
    place meanwhile (mhaexport's writers never do: they write new files and rename). ArtifactError (before anything
    is copied) when even that does not fit, or a file that would have to be linked is writable by someone else."""
    where = f"{folder / FILENAME}: files"
    sizes = {name: int(meta["bytes"]) for entry in manifest.artifacts.values() for name, meta in entry.files.items()}
    need = sum(sizes.get(name, 0) for name in files)
    base = snapshot_dir()
    try:
        free = shutil.disk_usage(base).free
    except OSError:
        free = None

    def no_room(why: str = "") -> str:
        return (f"a reader copies the files it checks into a private snapshot: {folder}'s files need about "
                f"{need / 1e9:.1f} GB in {base}, {free / 1e9:.1f} GB free{why} (set "
                "TMPDIR to a folder with room)")

    to_link = links_for_room({n: sizes.get(n, 0) for n in files}, free, need, int(then_writes * need))
    if to_link is None:
        raise ArtifactError(no_room())
    snap = Path(tempfile.mkdtemp(dir=base, prefix=f"mhaexport{SNAPSHOT_PREFIX}{os.getpid()}-"))
    _live_snapshots[snap] = folder
    copied: dict[str, tuple[str, int]] = {}
    notes: list[str] = []
    try:
        for name in files:
            try:
                fd = open_inside(folder, name, where)
            except MissingFile:
                continue
            dst = snap / name
            dst.parent.mkdir(parents=True, exist_ok=True)
            if name not in to_link:
                copied[name] = copy_hashed(fd, dst)
                continue
            why = only_yours(fd)
            if why is None:
                try:
                    copied[name] = link_hashed(fd, dst)
                except OSError as e:
                    why = f"it cannot be linked there ({e.strerror or e})"
            else:
                os.close(fd)
            if why is not None:
                raise ArtifactError(no_room(f", and {name} cannot be read in place instead: {why}"))
            notes.append(read_in_place_note(folder / name, copied[name][1], free, base))
    except BaseException:
        shutil.rmtree(snap, ignore_errors=True)
        _live_snapshots.pop(snap, None)
        raise
    if notes:
        _linked[snap] = notes
    return snap, copied


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
                if target.is_file() and not target.is_symlink():  # a link is never followed into the backup
                    (backup / name).parent.mkdir(parents=True, exist_ok=True)
                    os.link(target, backup / name, follow_symlinks=False)
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


def add_files(folder: str | Path, artifact: str, files: dict[str, bytes], *, drop_prefix: str | None = None,
              expect: dict[str, str] | None = None, purpose: str | None = None) -> Manifest:
    """Add ``files`` ({name: bytes}) to ``artifact``'s entry in ``folder`` through the staged publish (its journal and
    roll-back: the folder is as before or as after): the entry's other files are hard-linked (else copied) into the
    staging folder and published again unchanged, every file hashed into the manifest; its files under
    ``drop_prefix`` that ``files`` does not name are removed. ``expect`` ({name: sha256}): the entry's files must still
    hold these bytes (ArtifactError otherwise: the folder changed since it was read)."""
    folder = Path(folder)
    with stage_artifact(folder, artifact, purpose or f"add files to {artifact}") as st:
        manifest = read_manifest(folder)
        entry = manifest.artifacts.get(artifact)
        if entry is None:
            raise ArtifactError(f"{folder} holds no {artifact} export")
        keep = [n for n in entry.files if n not in files and not (drop_prefix and n.startswith(drop_prefix))]
        for name in keep:
            src = open_inside(folder, name, f"{folder / FILENAME}: files")
            dst = st.dir / name
            dst.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(f"/proc/self/fd/{src}", dst, follow_symlinks=True)
            except OSError:
                with os.fdopen(os.dup(src), "rb") as r, open(dst, "wb") as w:
                    shutil.copyfileobj(r, w, 1 << 20)
            finally:
                os.close(src)
        for name, data in files.items():
            check_name(name, f"{artifact} files")
            dst = st.dir / name
            dst.parent.mkdir(parents=True, exist_ok=True)
            dst.write_bytes(data)
        for name, sha in (expect or {}).items():
            got = file_entries(st.dir, [name])[name]["sha256"] if (st.dir / name).is_file() else None
            if got != sha:
                raise ArtifactError(f"{folder / name} changed while it was being read (sha256 {str(got)[:12]}…, "
                                    f"read as {sha[:12]}…): run again")
        main = [entry.file] if entry.file in keep else []
        order = main + [n for n in keep if n not in main] + list(files)
        new = ArtifactEntry.from_dict(entry.to_dict(), f"artifacts.{artifact}")
        return st.publish(manifest.model, new, order)
