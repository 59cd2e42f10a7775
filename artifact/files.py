"""Files in an export folder: hashing, atomic writes, writability. Torch-free."""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import tempfile
from pathlib import Path

from mhaexport.core.errors import ArtifactError, ConfigError, UnsafeFolder
from mhaexport.core.numbers import dumps

# protobuf cannot serialize one message past 2 GiB: larger ONNX models keep their weights in external data
TWO_GB = 2 * 1024**3
ONNX_FILE = "model.onnx"
DATA_FILE = "model.onnx.data"
# Room left for the graph itself (nodes, names, metadata, small constants) when weights must fit one protobuf.
GRAPH_HEADROOM = 64 * 1024**2
# Weights (initializer bytes) above which model.onnx keeps them in DATA_FILE: a protobuf message cannot pass 2 GiB
# (TWO_GB), and the graph needs room besides its weights. The environment variable overrides it (tests lower it
# to exercise the external-data path on tiny models; 0 = always external).
EXTERNAL_DATA_BYTES = TWO_GB - GRAPH_HEADROOM
EXTERNAL_DATA_ENV = "MHAEXPORT_EXTERNAL_DATA_BYTES"


def env_number(name: str, default: float, parse: type = float, expected: str = "a number >= 0") -> float:
    """The environment variable ``name`` read with ``parse`` (int or float), ``default`` when unset or blank;
    ConfigError naming it and ``expected`` for a value that is not a finite number >= 0. Validated like an option:
    the verbs call the readers before any work."""
    value = os.environ.get(name)
    if value is None or not value.strip():
        return default
    try:
        n = parse(value)
    except ValueError:
        n = -1
    if not 0 <= n < float("inf"):
        raise ConfigError(f"{name}={value!r}: expected {expected}")
    return n


def external_data_threshold() -> int:
    """Initializer bytes above which an ONNX file is written with external data (the export and quantize alike):
    ``MHAEXPORT_EXTERNAL_DATA_BYTES`` when set, else :data:`EXTERNAL_DATA_BYTES`."""
    return int(env_number(EXTERNAL_DATA_ENV, EXTERNAL_DATA_BYTES, int, "a number of bytes (an integer >= 0)"))


def sha256_file(path: str | Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write to a temporary file in the same folder, fsync, then rename over ``path`` (mode 0644)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o644)  # mkstemp makes 0600; an export is read by other users and services
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def atomic_write_json(path: str | Path, data: dict) -> None:
    atomic_write_bytes(path, (dumps(data, indent=2) + "\n").encode())


def read_json(path: str | Path, what: str) -> dict:
    """A JSON object from ``path``, read by the one bounded reader (:func:`mhaexport.core.untrusted.load_json`: size and
    depth limited), or ArtifactError naming ``what`` it was supposed to be."""
    from mhaexport.core.untrusted import load_json

    path = Path(path)
    if not path.exists() and not path.is_symlink():
        raise ArtifactError(f"{what} {path} does not exist")
    data = load_json(path, f"{what} {path}")
    if not isinstance(data, dict):
        raise ArtifactError(f"{what} {path} holds a JSON {type(data).__name__}, expected an object")
    return data


# The least free space a writing verb starts with when it cannot know what it will write (reports, a manifest)
MIN_FREE_BYTES = 4 * 1024**2


def ensure_free_space(path: str | Path, need: int, what: str) -> None:
    """ArtifactError unless the file system of the folder ``path`` has ``need`` bytes free (and MIN_FREE_BYTES)."""
    try:
        free = shutil.disk_usage(path).free
    except OSError:
        return  # a file system that cannot say: the write itself will tell
    need = max(int(need), MIN_FREE_BYTES)
    if free < need:
        raise ArtifactError(f"not enough disk space in {path}: {what} needs about {_size(need)}, "
                            f"{_size(free)} free")


def _size(n: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"


def refuse_link(path: str | Path, what: str = "output folder") -> Path:
    """``path`` unless it is a symlink: UnsafeFolder (one line) for an output folder that is one — a verb writes only
    into a real folder, never through a link into another export or somewhere the user did not name. (The folders
    above it are the user's path, links included.)"""
    path = Path(path)
    if path.is_symlink():
        try:
            target = os.readlink(path)
        except OSError:
            target = "?"
        raise UnsafeFolder(f"{what} {path} is a symlink (to {target}); mhaexport writes outputs only into a real "
                           "folder, never through a link: refused (name the folder itself)")
    return path


def ensure_writable_dir(path: str | Path) -> Path:
    """Create the output folder if needed and prove it is writable (a real file is created and removed) with at least
    MIN_FREE_BYTES free, or raise ArtifactError (UnsafeFolder for a symlink: :func:`refuse_link`). Every verb that
    writes calls this before any work."""
    path = refuse_link(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".probe-") as f:
            f.write(b"\0" * 4096)
            f.flush()
    except OSError as e:
        raise ArtifactError(f"output folder {path} is not writable: {e.strerror or e}") from None
    ensure_free_space(path, MIN_FREE_BYTES, "writing there")
    return path


def probe_writable(path: str | Path) -> Path:
    """Prove that ``path`` can be created and written, leaving nothing behind: folders created for the probe are
    removed again. Verbs call this before any work (and create the folder when they write)."""
    path = refuse_link(path)
    top = None  # the highest folder of ``path`` that does not exist yet
    p = path.absolute()
    while not p.exists():
        top = p
        if p.parent == p:
            break
        p = p.parent
    try:
        ensure_writable_dir(path)
    finally:
        if top is not None and top.is_dir():
            shutil.rmtree(top, ignore_errors=True)
    return path


def file_entries(folder: Path, names: list[str]) -> dict[str, dict]:
    """{name: {"sha256", "bytes"}} for files in ``folder``."""
    return {n: {"sha256": sha256_file(folder / n), "bytes": (folder / n).stat().st_size} for n in names}


def check_files(folder: Path, files: dict[str, dict], artifact: str, shown: Path | None = None) -> None:
    """Every file exists with its recorded size and sha256, or ArtifactError saying which and how. ``shown``: the
    folder to name in messages when ``folder`` is a reader's snapshot of it."""
    for fname, meta in files.items():
        path = (shown or folder) / fname
        if not (folder / fname).is_file():
            raise ArtifactError(f"{path} is missing: the manifest lists it for the {artifact} export")
        size = (folder / fname).stat().st_size
        if size != meta["bytes"]:
            raise ArtifactError(f"{path} has {size} bytes, the manifest recorded {meta['bytes']}: "
                                "truncated or altered, re-export it")
        digest = sha256_file(folder / fname)
        if digest != meta["sha256"]:
            raise ArtifactError(f"{path} sha256 {digest[:12]}… does not match the manifest's "
                                f"{meta['sha256'][:12]}…: altered after export, re-export it")
