"""A ``--hf`` folder read like an export folder (docs/DESIGN.md, "Folders from elsewhere"): every file transformers
and the exporter take from it — config, generation config, weights, tokenizer files — is opened inside it without
following a symlink (:func:`mhaexport.artifact.confine.open_inside`) and copied, hashed, into a private folder;
transformers loads that copy, and an export's tokenizer files are the bytes read then (never the folder read twice).

Only the files a causal LM's ``save_pretrained`` writes are taken (:data:`PATTERNS`, the Hub download's list): no
``*.py`` ever reaches transformers, so a folder's ``auto_map`` has no code to run (transformers is also called with
``trust_remote_code=False``). A Hub snapshot (:mod:`mhaexport.models.hub`) keeps its own rules: its files are
symlinks into the same cache's ``blobs/`` by design, checked by ``confine_snapshot``.
"""

from __future__ import annotations

import contextlib
import fnmatch
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from mhaexport.artifact.confine import check_name, copy_hashed, link_hashed, only_yours, open_inside
from mhaexport.artifact import folder as _folder
from mhaexport.core.errors import ModelLoadError, UnsafeFolder

# what transformers reads of a causal LM folder (the Hub download's allow-list, models/hub.py)
PATTERNS = ("*.json", "*.safetensors", "*.bin", "*.model", "*.txt", "*.tiktoken")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


@dataclass
class HFFiles:
    """The private copy of a ``--hf`` folder: ``dir`` (what transformers loads), ``sha256`` per file copied, and the
    tokenizer files' bytes (what an export ships)."""

    dir: Path
    sha256: dict[str, str] = field(default_factory=dict)
    tokenizer: dict[str, bytes] = field(default_factory=dict)


def _wanted(name: str) -> bool:
    return any(fnmatch.fnmatch(name, p) for p in PATTERNS)


def _tokenizer_bytes(folder: Path) -> dict[str, bytes]:
    if not (folder / TOKENIZER_FILES[0]).is_file():
        return {}
    return {n: (folder / n).read_bytes() for n in TOKENIZER_FILES if (folder / n).is_file()}


def _copy_in(root: Path, private: Path, shown: str, reserve: int = 0) -> HFFiles:
    files = HFFiles(private)
    with os.scandir(root) as entries:
        names = sorted(e.name for e in entries)
    wanted: dict[str, int] = {}
    for name in names:
        if not _wanted(name):
            continue
        check_name(name, f"--hf {shown}")
        st = os.lstat(root / name)
        if stat.S_ISLNK(st.st_mode):
            raise UnsafeFolder(f"--hf {shown}: {name} is a symlink; mhaexport reads a --hf folder's files only "
                               "inside it, never through a link: refused (copy the file in)")
        if not stat.S_ISDIR(st.st_mode):
            wanted[name] = st.st_size
    # where the copies and what the loader writes next (``reserve``: the staged weights) would not fit, the largest
    # files are read in place (a hard link to the inode opened, only a file no one else can write) as an export
    # folder's reader does (artifact/folder.py); a file that cannot be is copied, as before
    try:
        free = shutil.disk_usage(private).free
    except OSError:
        free = None
    to_link = _folder.links_for_room(wanted, free, sum(wanted.values()) + reserve)
    if to_link is None:  # no room even so: every large file read in place all the same (the least room taken)
        to_link = [n for n, size in wanted.items() if size >= _folder.LINK_MIN_BYTES]
    notes = []
    for name in wanted:
        fd = open_inside(root, name, f"--hf {shown}")  # no link, a regular file (no FIFO to hang on)
        if name in to_link and only_yours(fd) is None:
            try:
                files.sha256[name], size = link_hashed(fd, private / name)
                notes.append(_folder.read_in_place_note(root / name, size, free, private.parent))
                continue
            except OSError:  # cannot be linked here: copied
                (private / name).unlink(missing_ok=True)
                fd = open_inside(root, name, f"--hf {shown}")
        files.sha256[name], _ = copy_hashed(fd, private / name)
    _folder.remember_linked(private, notes)
    if TOKENIZER_FILES[0] in files.sha256:
        files.tokenizer = _tokenizer_bytes(private)
    return files


@contextlib.contextmanager
def confined_copy(folder: str | Path, shown: str, reserve: int = 0) -> Iterator[HFFiles]:
    """The files of ``folder`` transformers reads, copied (hashed) into a private folder removed on exit (the
    largest read in place where the copies and ``reserve`` bytes the caller writes next would not fit).
    UnsafeFolder (one line, naming the entry) for such a file that is a symlink or not a regular file; a
    subfolder and other files are not read."""
    private = Path(tempfile.mkdtemp(prefix="mhaexport-hf-"))  # mode 0700: this user's
    try:
        try:
            files = _copy_in(Path(folder), private, shown, reserve)
        except OSError as e:
            raise ModelLoadError(f"--hf {shown}: cannot be read: {e.strerror or e}") from None
        yield files
    finally:
        shutil.rmtree(private, ignore_errors=True)


@contextlib.contextmanager
def hf_files(folder: str | Path, shown: str, *, confine: bool = True, reserve: int = 0) -> Iterator[HFFiles]:
    """What transformers loads of ``folder``: its confined copy (:func:`confined_copy`; ``reserve``: the bytes the
    caller writes beside it next, the staged weights), or with ``confine=False`` (a Hub snapshot, already held to
    the cache's rules) the folder itself."""
    if not confine:
        yield HFFiles(Path(folder), tokenizer=_tokenizer_bytes(Path(folder)))
        return
    with confined_copy(folder, shown, reserve) as files:
        yield files
