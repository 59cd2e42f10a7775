"""Names a folder supplies, kept inside it. Torch-free.

A folder handed to mhaexport may have been made by someone else (docs/DESIGN.md, "Folders from elsewhere"): every
name it supplies — a manifest's file names, an ONNX file's external-data locations, genai_config.json's decoder
``filename`` — is untrusted input. A name is accepted only when it is a plain relative path (no absolute path, no
``..``, no ``.``/empty part, no backslash or NUL) that is not one of mhaexport's own scratch names, and a file is read
only through :func:`open_inside`, which walks the path from the folder one part at a time refusing symlinks (so no
name, however built, leads out of the folder, and no symlink swapped in later does either) and opens only a regular
file (never a FIFO that would hang, a device or a folder). A refusal is :class:`UnsafeFolder`: one line naming the
entry.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
import unicodedata
from pathlib import Path, PurePosixPath

from mhaexport.core.errors import ArtifactError, UnsafeFolder

# mhaexport's own files in a folder: never an artifact's file
LOCK_FILE = ".mhaexport.lock"
SCRATCH_PREFIXES = (".staging-", ".snapshot-")
# onnxruntime-genai's config: the ONNX file it names must be one of the artifact's hashed files
GENAI_CONFIG = "genai_config.json"
_CHUNK = 8 << 20


class MissingFile(ArtifactError):
    """A file a folder lists is not there."""


def check_name(name: object, where: str) -> str:
    """``name`` if it is a plain relative file name inside a folder, else UnsafeFolder naming ``where`` (the entry
    that supplied it, e.g. "manifest.json: artifacts.onnx.files")."""
    if not isinstance(name, str) or not name:
        raise UnsafeFolder(f"{where}: {name!r} is not a file name")
    bad = None
    if "\0" in name or "\\" in name:
        bad = "holds a NUL or a backslash"
    elif any(unicodedata.category(ch) in ("Cc", "Cs") for ch in name):  # a line break, an escape, a lone surrogate
        bad = "holds a control character or a character no file system name holds"
    elif name.startswith("/") or PurePosixPath(name).is_absolute():
        bad = "is an absolute path"
    else:
        parts = name.split("/")
        if any(p in ("", ".", "..") for p in parts):
            bad = "leaves the folder (.., . or an empty part)" if ".." in parts else "is not a plain relative path"
        elif parts[0] == LOCK_FILE or parts[0].startswith(SCRATCH_PREFIXES):
            bad = "is one of mhaexport's own scratch files"
    if bad:
        raise UnsafeFolder(f"{where}: {name!r} {bad}; mhaexport reads only files inside the folder: refused")
    return name


def open_inside(root: str | Path, name: str, where: str) -> int:
    """A read-only file descriptor of ``root/name``, reached without following any symlink below ``root`` and only
    when it is a regular file; UnsafeFolder (naming ``where``) for a symlink or a non-regular file, ArtifactError for
    a missing one. ``root`` itself is the folder the user named (a symlink there is the user's choice)."""
    check_name(name, where)
    shown = Path(root) / name
    parts = name.split("/")
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        dir_fd = os.open(root, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0))
    except (FileNotFoundError, NotADirectoryError):
        raise MissingFile(f"{shown} is missing: {root} is not a folder") from None
    try:
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            try:
                fd = os.open(part, flags | (os.O_NONBLOCK if last else getattr(os, "O_DIRECTORY", 0)), dir_fd=dir_fd)
            except FileNotFoundError:
                raise MissingFile(f"{shown} is missing: {where} lists it") from None
            except OSError as e:
                if e.errno in (errno.ELOOP, errno.EMLINK) or (e.errno == errno.ENOTDIR and _is_link(dir_fd, part)):
                    raise UnsafeFolder(f"{where}: {'/'.join(parts[:i + 1])} is a symlink; mhaexport reads only "
                                       "files inside the folder, never through a link: refused") from None
                if e.errno == errno.ENOTDIR:
                    raise ArtifactError(f"{shown} is missing: {'/'.join(parts[:i + 1])} is not a folder") from None
                raise ArtifactError(f"{shown} cannot be read: {e.strerror or e}") from None
            os.close(dir_fd)
            dir_fd = fd
        mode = os.fstat(dir_fd).st_mode
        if not stat.S_ISREG(mode):
            raise UnsafeFolder(f"{where}: {name} is not a regular file ({_kind(mode)}): refused")
        os.set_blocking(dir_fd, True)
        fd, dir_fd = dir_fd, -1
        return fd
    finally:
        if dir_fd >= 0:
            os.close(dir_fd)


def _is_link(dir_fd: int, part: str) -> bool:
    try:
        return stat.S_ISLNK(os.stat(part, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a device"),
                       (stat.S_ISBLK, "a device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a file"


def copy_hashed(fd: int, dst: str | Path) -> tuple[str, int]:
    """Copy the open file ``fd`` (closed afterwards) to a new file ``dst`` (created exclusively, mode 0400 in the
    caller's private folder) and return the sha256 and size of the copy: the copy is private, so these are the bytes
    a reader then loads, whatever any other process does to the source meanwhile. The kernel copies
    (``copy_file_range``; a read/write loop where it cannot), then the copy is hashed from the page cache."""
    try:
        out = os.open(dst, os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
        try:
            size = os.fstat(fd).st_size
            done = 0
            try:
                while True:  # to the end of the file, whatever its size when stat'ed
                    n = os.copy_file_range(fd, out, max(size - done, _CHUNK))
                    if n == 0:
                        break
                    done += n
            except (AttributeError, OSError):  # no copy_file_range here: copy by hand from where it stopped
                os.lseek(fd, done, os.SEEK_SET)
                os.lseek(out, done, os.SEEK_SET)
                while block := os.read(fd, _CHUNK):
                    view = memoryview(block)
                    while view:
                        view = view[os.write(out, view):]
            os.fchmod(out, 0o400)
            return _hashed(out)
        finally:
            os.close(out)
    finally:
        os.close(fd)


def _hashed(fd: int) -> tuple[str, int]:
    """The sha256 and size of the open file ``fd``'s bytes, read from its start."""
    h = hashlib.sha256()
    n = 0
    os.lseek(fd, 0, os.SEEK_SET)
    while block := os.read(fd, _CHUNK):
        h.update(block)
        n += len(block)
    return h.hexdigest(), n


def only_yours(fd: int) -> str | None:
    """Why the open file ``fd``'s bytes could change by a hand other than this user's (another owner, a group or
    others allowed to write it), or None: only this user (and root) can write the inode."""
    st = os.fstat(fd)
    if hasattr(os, "geteuid") and st.st_uid != os.geteuid():
        return f"it is owned by uid {st.st_uid}, not by you"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"its mode {stat.filemode(st.st_mode)} lets others write it"
    return None


def link_hashed(fd: int, dst: str | Path) -> tuple[str, int]:
    """A hard link ``dst`` to the open file ``fd`` (closed afterwards) — the very inode that was opened (through
    ``/proc/self/fd``: a rename or swap of the folder's entry afterwards changes nothing here) — and the sha256 and
    size of its bytes, read through ``fd``. Unlike :func:`copy_hashed` the bytes are shared with the source: a
    writer of that inode in place would be seen (the caller links only what :func:`only_yours` passes). OSError when
    the link cannot be made (another file system: EXDEV; no /proc)."""
    try:
        proc = os.open("/proc/self/fd", os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:  # linkat(AT_SYMLINK_FOLLOW): the inode the descriptor names (link(2) would link the proc entry)
            os.link(str(fd), dst, src_dir_fd=proc, follow_symlinks=True)
        finally:
            os.close(proc)
        return _hashed(fd)
    finally:
        os.close(fd)


def read_inside(root: str | Path, name: str, where: str, max_bytes: int = 64 << 20) -> bytes:
    """The bytes of a small file ``root/name`` read through :func:`open_inside` (at most ``max_bytes``)."""
    fd = open_inside(root, name, where)
    with os.fdopen(fd, "rb") as f:
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise UnsafeFolder(f"{where}: {name} holds more than {max_bytes} bytes: refused")
    return data
