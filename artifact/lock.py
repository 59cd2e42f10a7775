"""One writer at a time per export folder: an advisory lock (``flock``) on ``DIR/.mhaexport.lock``.

The lock file names its holder (pid, host, command, since), so a writer that cannot get the lock in time says who
holds it. The kernel releases the lock when the holder dies, however it dies, so a killed export never blocks the
next one.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import stat
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from mhaexport.artifact.confine import LOCK_FILE
from mhaexport.artifact.files import env_number
from mhaexport.core.errors import ArtifactError, UnsafeFolder
from mhaexport.core.untrusted import load_json, shown
# how long a writer waits for another one to finish its critical section (seconds); MHAEXPORT_LOCK_TIMEOUT overrides
DEFAULT_TIMEOUT = 120.0
LOCK_TIMEOUT_ENV = "MHAEXPORT_LOCK_TIMEOUT"


def lock_timeout() -> float:
    """Seconds a writer waits for the lock: ``MHAEXPORT_LOCK_TIMEOUT`` when set, else :data:`DEFAULT_TIMEOUT`;
    ConfigError for a value that is not a finite number >= 0 (writing verbs call this before any work)."""
    return env_number(LOCK_TIMEOUT_ENV, DEFAULT_TIMEOUT, float,
                      "seconds to wait for another writer (a number >= 0)")


def _holder_line(fd: int) -> str:
    """Who holds the lock, from the lock file's JSON (written by a writer; any field may be junk in a folder someone
    else made: each is shown only when it has the expected type)."""
    try:
        info = load_json(os.pread(fd, 4096, 0) or b"{}", LOCK_FILE)
    except (OSError, ArtifactError):
        info = {}
    if not isinstance(info, dict) or not info:
        return "another process"
    pid, host, command, since = (info.get(k) for k in ("pid", "host", "command", "since"))
    pid = pid if isinstance(pid, int) and not isinstance(pid, bool) else "?"
    host = shown(host) if isinstance(host, str) else "?"
    command = shown(command[:200]) if isinstance(command, str) else "?"
    try:
        when = time.strftime("%H:%M:%S", time.localtime(float(since)))
    except (TypeError, ValueError, OverflowError, OSError):
        when = "?"
    return f"pid {pid} on {host} ({command}, since {when})"


def _open_lock(path: Path, write: bool) -> int | None:
    """The lock file's descriptor, never through a symlink and only when it is a regular file of its own (one link):
    a writer creates it (O_CREAT, mode 0644); a reader only opens one that is there (None when there is none).
    UnsafeFolder when it is a symlink, not a regular file, or a hard link to another file."""
    flags = (os.O_RDWR | os.O_CREAT if write else os.O_RDONLY) | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, 0o644)
    except FileNotFoundError:
        if write:
            raise
        return None
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise UnsafeFolder(f"{path} is a symlink: mhaexport's lock is a file of the folder's own, never followed;"
                               " remove it") from None
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
        os.close(fd)
        what = "not a regular file" if not stat.S_ISREG(st.st_mode) else f"a hard link ({st.st_nlink} names)"
        raise UnsafeFolder(f"{path} is {what}: mhaexport's lock is a file of the folder's own; remove it")
    return fd


def _acquire(fd: int, how: int, timeout: float, path: Path) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            fcntl.flock(fd, how | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                holder = _holder_line(fd)
                os.close(fd)
                raise ArtifactError(f"export folder {path.parent} is being written by {holder}; waited "
                                    f"{timeout:.0f} s: run again when it has finished") from None
            time.sleep(0.05)


class FolderLock:
    """``with FolderLock(folder, "export onnx"):`` — exclusive; waits up to ``timeout`` seconds, then raises
    ArtifactError naming the writer that holds it. The lock file is opened without following a symlink and must be a
    regular file with one link (UnsafeFolder otherwise): a writer writes and truncates only its own lock."""

    def __init__(self, folder: str | Path, purpose: str, timeout: float | None = None) -> None:
        self.path = Path(folder) / LOCK_FILE
        self.purpose = purpose
        self.timeout = lock_timeout() if timeout is None else timeout
        self._fd: int | None = None

    def __enter__(self) -> FolderLock:
        fd = _open_lock(self.path, write=True)
        _acquire(fd, fcntl.LOCK_EX, self.timeout, self.path)
        self._fd = fd
        info = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.time(),
                "command": f"{self.purpose}: {' '.join(sys.argv[:4])}"[:200]}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(info).encode(), 0)
        return self

    def __exit__(self, *exc) -> None:
        if self._fd is not None:
            os.ftruncate(self._fd, 0)
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


@contextlib.contextmanager
def reader_lock(folder: str | Path, timeout: float | None = None) -> Iterator[bool]:
    """A reader's shared lock on the folder's lock file while it reads the manifest and copies the files, so no
    writer publishes in between. A reader writes nothing: it opens only a lock file that is there, read-only (a
    read-only folder works), and yields False when there is none (no writer has ever written the folder; a writer
    that starts now publishes minutes later, and the hash check would catch a mix) or when it is not a plain file of
    its own (a symlink or a hard link: never followed or locked; no mhaexport writer can write such a folder)."""
    path = Path(folder) / LOCK_FILE
    try:
        fd = _open_lock(path, write=False)
    except (UnsafeFolder, PermissionError):
        fd = None
    if fd is None:
        yield False
        return
    _acquire(fd, fcntl.LOCK_SH, lock_timeout() if timeout is None else timeout, path)
    try:
        yield True
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
