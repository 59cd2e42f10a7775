"""The API's checks of what a command line names for reading or writing, before any work: a JUnit path, a file to
read (never a FIFO or a device), a text to score (bounded), a thread count within this machine's cores."""

from __future__ import annotations

import os
from pathlib import Path

from mhaexport.core.errors import ConfigError


def check_junit(path: str | Path) -> Path:
    """A JUnit file path checked before any work: its folder may be made by the run (inside the output folder, say),
    but what exists of the path must be writable folders, and no name in it longer than the file system takes.
    ConfigError in one line otherwise. Returns the path."""
    try:
        full = Path(path).resolve()
        longest = max(len(os.fsencode(part)) for part in full.parts)
        name_max = os.pathconf("/", "PC_NAME_MAX") if hasattr(os, "pathconf") else 255
        if longest > name_max:
            raise ConfigError(f"junit={str(path)!r}: a name in the path is {longest} bytes long, longer than the file "
                              f"system takes ({name_max})", cli=f"--junit {path}: a name in the path is {longest} "
                              f"bytes long, longer than the file system takes ({name_max})")
        parent = full.parent
        while not parent.exists():
            parent = parent.parent
    except OSError as e:  # a name or path too long, a symlink loop, a folder we may not search
        raise ConfigError(f"junit={str(path)!r}: {e.strerror or e}", cli=f"--junit {path}: {e.strerror or e}") from None
    if not parent.is_dir() or not os.access(parent, os.W_OK):
        raise ConfigError(f"junit={str(path)!r}: {parent} is not a writable folder",
                          cli=f"--junit {path}: {parent} is not a writable folder")
    return Path(path)


def check_input_file(path: str | Path, *, folder_ok: bool = True) -> None:
    """A file named for reading (a text, a checkpoint, a config or model file) checked before anything opens it: a
    FIFO, socket or device would block the read (a folder too, unless ``folder_ok``). ConfigError in one line; a
    missing path passes (its reader says so)."""
    import stat

    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return
    if not stat.S_ISREG(mode) and not stat.S_ISDIR(mode):
        raise ConfigError(f"{path} is not a regular file (a FIFO, socket or device would block the read)")
    if stat.S_ISDIR(mode) and not folder_ok:
        raise ConfigError(f"{path} is a folder, not a file")


TEXT_MAX_BYTES = 1 << 20  # a text to score is read whole and scored token by token: 1 MiB of bytes is minutes


def read_text(path: str | Path, max_bytes: int = TEXT_MAX_BYTES, option: str = "") -> bytes:
    """The bytes of a text file to score (``--text``), read with a bounded read (a device or a pipe that never ends
    cannot hang it). ConfigError when it is no regular file or holds more than ``max_bytes`` (``option``: the option
    that raises the cap, if any)."""
    import stat

    def refused(why: str) -> ConfigError:
        return ConfigError(f"text {str(path)!r}: {why}", cli=f"--text {path}{'' if why[0] in ' (' else ': '}{why}")

    try:  # O_NONBLOCK: opening a FIFO nobody writes returns at once (a plain open() waits for a writer forever)
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as e:
        raise refused(str(e.strerror or e)) from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise refused(" is not a regular file (a FIFO, socket or device): give a text file")
        os.set_blocking(fd, True)
        with os.fdopen(fd, "rb") as f:
            fd = -1
            data = f.read(max_bytes + 1)
            size = os.fstat(f.fileno()).st_size
    except OSError as e:
        raise refused(str(e.strerror or e)) from None
    finally:
        if fd >= 0:
            os.close(fd)
    if len(data) > max_bytes:
        cap = f" ({option})" if option else ""
        fix = f"give a shorter text or raise {option}" if option else "give a shorter text"
        found = f"{size} bytes, above the cap of {max_bytes}{cap}" if size > max_bytes else \
            f"more than {max_bytes} bytes, the cap{cap}"
        raise refused(f" holds {found}: {fix}")
    return data


def check_threads(threads: int | None) -> int | None:
    """A thread count within this machine's cores: more threads than cores only contend (and time nothing real).
    ConfigError otherwise; None (the runtime's default) passes."""
    cores = os.cpu_count() or 1
    if threads is not None and threads > cores:
        raise ConfigError(f"threads={threads}: this machine has {cores} CPU core(s); give at most {cores}",
                          cli=f"--threads {threads}: this machine has {cores} CPU core(s); give at most {cores}")
    return threads
