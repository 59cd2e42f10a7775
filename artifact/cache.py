"""This user's cache (``MHAEXPORT_CACHE_DIR``, else ``$XDG_CACHE_HOME/mhaexport``, else ``~/.cache/mhaexport``): the
optimized graphs ONNX Runtime wrote (``runtime/session.py``), torch.onnx's traces kept across processes
(``exporter/trace_store.py``) and the built-in decoder's seeded weights written once to be memory-mapped
(``models/loading.py``, verify's mapped mode); this user's key that stamps what is read back (:func:`cache_key`).
Torch-free. Never inside a folder being read."""

from __future__ import annotations

import hashlib
import hmac
import os
import stat
from pathlib import Path

from mhaexport.core.errors import ConfigError

CACHE_ENV = "MHAEXPORT_CACHE_DIR"


def cache_root(model: str | Path | None = None) -> Path:
    """This user's cache: ``MHAEXPORT_CACHE_DIR`` (a relative value taken from the working directory), else
    ``$XDG_CACHE_HOME/mhaexport``, else ``~/.cache/mhaexport``; resolved. Never inside a folder being read:
    ConfigError (one line, naming the variable) when it is inside the folder of ``model`` or of an export folder this
    process has open (a folder someone else made must not supply the graph or weights a reader runs, nor be written
    by a reader)."""
    from mhaexport.artifact.folder import folders_being_read

    explicit = os.environ.get(CACHE_ENV)
    if explicit:
        root = Path(explicit).expanduser().resolve()
    else:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
        root = (Path(base) / "mhaexport").resolve()
    read = folders_being_read() + ([Path(model).resolve().parent] if model is not None else [])
    for folder in read:
        if root == folder or folder in root.parents:
            raise ConfigError(f"{CACHE_ENV if explicit else 'the optimized-graph cache'}={root} is inside {folder}, "
                              "a folder being read: the optimized-graph cache never lives in a folder a reader "
                              f"reads (set {CACHE_ENV} to a folder of your own)")
    return root


KEY_FILE = "key"


def cache_key(root: Path) -> bytes:
    """This user's secret for the cache's stamps (``root/key``, 32 random bytes, mode 0600, made once): a stamp is an
    HMAC under it, so a stamp cannot be computed by whoever merely knows a file's hash. OSError when the key file is
    not this user's private file."""
    path = root / KEY_FILE
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    except FileExistsError:
        pass
    else:
        with os.fdopen(fd, "wb") as f:
            f.write(os.urandom(32))
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    with os.fdopen(fd, "rb") as f:
        if not private(os.fstat(f.fileno())):
            raise OSError(f"{path} is not this user's private file")
        return f.read(64)


def private(st: os.stat_result) -> bool:
    """Owned by this user and writable by no one else."""
    return st.st_uid == os.getuid() and not st.st_mode & 0o022


def usable(root: Path, files: list[Path]) -> bool:
    """Every folder from the cache root down to ``files`` and the files themselves are this user's own, writable by no
    one else, and no symlink among them (a file not made yet counts as usable): else the cache is neither read nor
    written."""
    try:
        chain = list(files)
        p = files[0]
        while p != root and root in p.parents:
            p = p.parent
            chain.append(p)
        for path in chain:
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                continue
            if stat.S_ISLNK(st.st_mode) or not private(st):
                return False
        return True
    except OSError:
        return False


def stamp(key: bytes, *parts: str) -> str:
    """An HMAC-SHA256 under this user's ``key`` of ``parts`` (a source's sha256, a cached file's own): what a cache
    entry's stamp file holds."""
    return hmac.new(key, " ".join(parts).encode(), hashlib.sha256).hexdigest()
