"""Third-party libraries mhaexport hands a folder's files to — tokenizers, onnx, onnxruntime, onnxruntime-genai,
safetensors — and their failures on that input, mapped in one place: :func:`library_call` around each call that
knows the file, :func:`library_of` for what reaches the CLI's top. Either way: :class:`LibraryRefused`, exit 2, one
line naming the file (where known) and the library. Stdlib only."""

from __future__ import annotations

import atexit
import os
import sys
import tempfile
import threading
import warnings

from mhaexport.core.errors import LibraryRefused, MhaExportError, clip, first_line
from mhaexport.core.untrusted import shown


# the libraries whose failures on a folder's input are mapped to LibraryRefused, by the module their exceptions come
# from (a Rust panic of tokenizers / safetensors is pyo3_runtime.PanicException, a BaseException)
LIBRARIES = {"tokenizers": "tokenizers", "onnx": "onnx", "onnxruntime": "onnxruntime",
             "onnxruntime_genai": "onnxruntime-genai", "safetensors": "safetensors", "google.protobuf": "onnx (protobuf)",
             "pyo3_runtime": "a Rust library (panic)", "onnxscript": "onnxscript"}


def library_of(e: BaseException) -> str | None:
    """The library (of :data:`LIBRARIES`) whose exception ``e`` is, else None."""
    module = type(e).__module__ or ""
    for prefix, name in LIBRARIES.items():
        if module == prefix or module.startswith(prefix + "."):
            return name
    if type(e).__name__ == "PanicException":
        return LIBRARIES["pyo3_runtime"]
    if type(e).__name__ in ("Fail", "InvalidGraph", "InvalidArgument", "InvalidProtobuf", "NoSuchFile",
                            "RuntimeException", "NotImplemented", "EPFail", "ModelLoaded"):
        return "onnxruntime"
    return None


# fd 2's capture while a library runs (library_call): one file for the process, taken by the outermost call
_capture = None
_depth = 0
_lock = threading.Lock()


class library_call:  # noqa: N801 - used as a context manager: ``with library_call("tokenizers", file):``
    """The one place a third-party library's failure on a folder's input becomes mhaexport's: inside it, whatever
    ``library`` raises — its own exception types, a RuntimeError, a Rust panic (a BaseException) — is
    :class:`LibraryRefused` naming ``file`` and the library, its first line shown escaped (``error``: another
    MhaExportError class, e.g. RuntimeFailure where a runtime's failure is a check's finding). mhaexport's own errors,
    a Ctrl-C and a MemoryError pass through unchanged. What the library writes to the process's stderr meanwhile (a
    Rust panic's message and backtrace, a C++ library's log line) is captured, never passed raw: dropped where the
    call failed (its first line is the error's), else a warning, escaped."""

    def __init__(self, library: str, file: object, error: type[MhaExportError] = LibraryRefused) -> None:
        self.library, self.file, self.error = library, file, error
        self._saved: int | None = None

    def __enter__(self) -> library_call:
        global _capture, _depth
        with _lock:
            _depth += 1
            if _depth > 1:  # an outer call captures fd 2 already: what this one writes lands there
                return self
            try:
                sys.stderr.flush()
                if _capture is None:  # one file per process, emptied per use: a tokenizer's decode runs per token
                    _capture = tempfile.TemporaryFile()
                    atexit.register(_capture.close)
                _capture.seek(0)
                _capture.truncate()
                saved = os.dup(2)
            except (OSError, ValueError, AttributeError):  # no fd 2 to take (an embedding host): the call as it is
                return self
            os.dup2(_capture.fileno(), 2)
            self._saved = saved
        return self

    def _restore(self) -> str:
        """fd 2 given back; what the library wrote there meanwhile."""
        global _depth
        with _lock:
            _depth -= 1
            if self._saved is None:
                return ""
            os.dup2(self._saved, 2)
            os.close(self._saved)
            self._saved = None
            _capture.seek(0)
            return _capture.read(1 << 16).decode("utf-8", "replace")

    def __exit__(self, kind, e, tb) -> bool:
        text = self._restore()
        if e is None:
            if text.strip():
                warnings.warn(f"{self.library} wrote on stderr: {shown(clip(text.strip(), 300))}", stacklevel=2)
            return False
        if isinstance(e, (MhaExportError, KeyboardInterrupt, SystemExit, MemoryError, GeneratorExit)):
            return False
        if not isinstance(e, Exception) and library_of(e) is None:
            return False
        raise self.error(f"{shown(self.file)}: {self.library} refused it: {shown(clip(first_line(e), 300))}: "
                         "refused") from None
