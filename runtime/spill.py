"""Arrays held in file-backed pages instead of anonymous memory (verify's mapped mode, issue 38), torch-free.

A run under a memory cap cannot hold a long case's outputs beside a runtime's working memory: a 2,048-token prompt
of a 32,000-token model has 262 MB of logits and, at 20 layers of d 1536, a 503 MB KV cache, per runtime. A
:class:`Spill` places such arrays in a file under its folder (the user's cache, on disk) that is unlinked as soon
as it is mapped: the pages are the page cache's, which the kernel writes back and drops under a cgroup's cap and
reads again when touched, instead of counting against the cap like anonymous memory. An array is flushed
(``msync``) once written, so its pages are clean and can be dropped without waiting for a write-back. The numbers
are the same; only where they live changes. Arrays under ``min_bytes`` stay ordinary numpy arrays.

What writes into a spill: ONNX Runtime's outputs bound to spilled buffers (``OrtRunner``: the logits and the
present cache written straight into them, IO binding), eager PyTorch's present cache per block as each block
returns and its logits (``EagerRunner``), and verify's large inputs (a decode step's past at max_positions).
"""

from __future__ import annotations

import os
import tempfile
import weakref
from pathlib import Path

import numpy as np

# arrays smaller than this stay in memory: spilling costs a write and an msync, worth it only for the large ones
SPILL_MIN_BYTES = 4 << 20


class Spill:
    """A folder (created 0700 if absent) where large arrays live as unlinked, memory-mapped files."""

    def __init__(self, root: str | Path, min_bytes: int = SPILL_MIN_BYTES) -> None:
        self.root = Path(root)
        self.min_bytes = int(min_bytes)
        self.spilled_bytes = 0  # what went to files over the run (a figure for the report)
        self._live: list[tuple[int, int, weakref.ref]] = []  # (address, bytes, the array) of each file-backed array

    def empty(self, shape: tuple[int, ...], dtype) -> np.ndarray:
        """An uninitialized array of ``shape``: file-backed at ``min_bytes`` and above, else an ordinary one."""
        dtype = np.dtype(dtype)
        n = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if n < self.min_bytes or n == 0:
            return np.empty(shape, dtype)
        try:
            self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        except OSError:  # a cache that cannot be written: the system's temporary folder (may be memory: tmpfs)
            self.root = Path(tempfile.gettempdir())
        # unlinked from the start (O_TMPFILE where the file system has it): nothing is left behind by a crash, and the
        # mapping keeps the pages until the array is freed
        with tempfile.TemporaryFile(dir=self.root) as f:
            f.truncate(n)
            arr = np.memmap(f, dtype=dtype, mode="r+", shape=tuple(shape))
        self.spilled_bytes += n
        self._live.append((arr.ctypes.data, n, weakref.ref(arr)))
        return arr

    def pack(self, outputs):
        """``outputs`` (nested tuples and lists of arrays) with every array not yet file-backed copied into *one*
        file-backed buffer, flushed, when together they reach ``min_bytes`` (a kept reference's many small caches,
        each under it: one file, not thousands); the structure as given."""
        flat: list[np.ndarray] = []

        def collect(o):
            if isinstance(o, np.ndarray):
                if not self.holds(o) and o.nbytes:
                    flat.append(o)
            elif isinstance(o, (tuple, list)):
                for x in o:
                    collect(x)
        collect(outputs)
        if sum(a.nbytes for a in flat) < self.min_bytes:
            return outputs
        offsets, total = [], 0
        for a in flat:
            total = -(-total // 64) * 64  # each array 64-byte aligned
            offsets.append(total)
            total += a.nbytes
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        with tempfile.TemporaryFile(dir=self.root) as f:
            f.truncate(total)
            buf = np.memmap(f, dtype=np.uint8, mode="r+", shape=(total,))
        self.spilled_bytes += total
        self._live.append((buf.ctypes.data, total, weakref.ref(buf)))
        moved = {}
        for a, at in zip(flat, offsets):
            view = buf[at:at + a.nbytes].view(a.dtype).reshape(a.shape)
            np.copyto(view, a)
            moved[id(a)] = view
        buf.flush()

        def rebuild(o):
            if isinstance(o, np.ndarray):
                return moved.get(id(o), o)
            if isinstance(o, (tuple, list)):
                return type(o)(rebuild(x) for x in o)
            return o
        return rebuild(outputs)

    def holds(self, arr: np.ndarray) -> bool:
        """Whether ``arr``'s memory is one of this spill's file-backed arrays (the array, a view of it, or an array
        another library made over the same memory — a torch tensor's ``numpy()`` —, which is no ``np.memmap``):
        its address inside one that is still alive."""
        if isinstance(arr, np.memmap):
            return True
        self._live = [e for e in self._live if e[2]() is not None]
        at = arr.__array_interface__["data"][0]
        return any(start <= at < start + n for start, n, _ in self._live)

    def keep(self, arr: np.ndarray) -> np.ndarray:
        """``arr`` as a file-backed copy, flushed (its pages clean), when it is large; itself otherwise."""
        if arr.nbytes < self.min_bytes or isinstance(arr, np.memmap):
            return arr
        out = self.empty(arr.shape, arr.dtype)
        np.copyto(out, arr)
        return self.flushed(out)

    def close(self) -> None:
        """Remove the folder (its files were unlinked when mapped; arrays still alive keep their pages)."""
        if self.root == Path(tempfile.gettempdir()):
            return
        try:
            self.root.rmdir()
        except OSError:  # never made, or not empty: someone else's files are left alone
            pass

    @staticmethod
    def flushed(arr: np.ndarray) -> np.ndarray:
        """``arr`` after writing its pages back (a file-backed array; others as they are)."""
        if isinstance(arr, np.memmap):
            arr.flush()
        return arr


def return_freed_memory(threshold: int = 1 << 20) -> bool:
    """Ask glibc's malloc to give every allocation of ``threshold`` bytes and more its own mapping, returned to the
    system when freed. By default glibc raises that threshold to the size of the last large block freed (up to
    32 MiB), after which a long run's 4-32 MiB caches and scores come from the heap, which fragments and is not given
    back: measured, the anonymous memory of a mapped verify of a 5 GB model crept up by ~0.3 GB over its generation
    check. Process-wide (verify's mapped mode sets it); False where the C library has no ``mallopt`` (not glibc)."""
    import ctypes

    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(-3, int(threshold)))  # M_MMAP_THRESHOLD: fixed, so glibc stops raising it


def trim_freed_memory() -> bool:
    """Give the heap's free pages back to the system (glibc's ``malloc_trim(0)``), after a large owner of small
    allocations is gone — an ONNX Runtime session closed. Allocations under :func:`return_freed_memory`'s threshold
    come from the heap, and freeing them leaves the pages resident: measured on the bench-size int4 file's mapped
    verify, closing its session gave back 73 MB and a trim 47 MB more (tests/test_spill.py). False where the C
    library has no ``malloc_trim`` (not glibc)."""
    import ctypes

    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return False
    trim(0)
    return True


def spill_dir() -> Path:
    """Where verify spills: ``spill/<pid>`` in the user's cache (:func:`mhaexport.artifact.cache.cache_root`), on
    the same disk as the mapped weights; the files in it are unlinked, so the folder stays empty."""
    from mhaexport.artifact.cache import cache_root

    return cache_root() / "spill" / str(os.getpid())


__all__ = ["SPILL_MIN_BYTES", "Spill", "return_freed_memory", "spill_dir", "trim_freed_memory"]
