"""One writer at a time per export folder: an advisory lock (``flock``) on ``DIR/.mhaexport.lock``.

The lock file names its holder (pid, host, command, since), so a writer that cannot get the lock in time says who
holds it. The kernel releases the lock when the holder dies, however it dies, so a killed export never blocks the
next one.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import sys
import time
from pathlib import Path

from mhaexport.artifact.files import env_number
from mhaexport.errors import ArtifactError

LOCK_FILE = ".mhaexport.lock"
# how long a writer waits for another one to finish its critical section (seconds); MHAEXPORT_LOCK_TIMEOUT overrides
DEFAULT_TIMEOUT = 120.0
LOCK_TIMEOUT_ENV = "MHAEXPORT_LOCK_TIMEOUT"


def lock_timeout() -> float:
    """Seconds a writer waits for the lock: ``MHAEXPORT_LOCK_TIMEOUT`` when set, else :data:`DEFAULT_TIMEOUT`;
    ConfigError for a value that is not a finite number >= 0 (writing verbs call this before any work)."""
    return env_number(LOCK_TIMEOUT_ENV, DEFAULT_TIMEOUT, float,
                      "seconds to wait for another writer (a number >= 0)")


def _holder_line(path: Path) -> str:
    try:
        info = json.loads(path.read_text() or "{}")
    except (OSError, ValueError):
        info = {}
    if not info:
        return "another process"
    since = time.strftime("%H:%M:%S", time.localtime(info.get("since", 0)))
    return f"pid {info.get('pid')} on {info.get('host')} ({info.get('command', '?')}, since {since})"


class FolderLock:
    """``with FolderLock(folder, "export onnx"):`` — exclusive; waits up to ``timeout`` seconds, then raises
    ArtifactError naming the writer that holds it."""

    def __init__(self, folder: str | Path, purpose: str, timeout: float | None = None) -> None:
        self.path = Path(folder) / LOCK_FILE
        self.purpose = purpose
        self.timeout = lock_timeout() if timeout is None else timeout
        self._fd: int | None = None

    def __enter__(self) -> FolderLock:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    holder = _holder_line(self.path)
                    os.close(fd)
                    raise ArtifactError(f"export folder {self.path.parent} is being written by {holder}; waited "
                                        f"{self.timeout:.0f} s: run again when it has finished") from None
                time.sleep(0.05)
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
