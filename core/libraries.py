"""Third-party libraries mhaexport hands a folder's files to — tokenizers, onnx, onnxruntime, onnxruntime-genai,
safetensors — and their failures on that input, mapped in one place: :func:`library_call` around each call that
knows the file, :func:`library_of` for what reaches the CLI's top. Either way: :class:`LibraryRefused`, exit 2, one
line naming the file (where known) and the library. Stdlib only."""

from __future__ import annotations

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


class library_call:  # noqa: N801 - used as a context manager: ``with library_call("tokenizers", file):``
    """The one place a third-party library's failure on a folder's input becomes mhaexport's: inside it, whatever
    ``library`` raises — its own exception types, a RuntimeError, a Rust panic (a BaseException) — is
    :class:`LibraryRefused` naming ``file`` and the library, its first line shown escaped (``error``: another
    MhaExportError class, e.g. RuntimeFailure where a runtime's failure is a check's finding). mhaexport's own errors,
    a Ctrl-C and a MemoryError pass through unchanged."""

    def __init__(self, library: str, file: object, error: type[MhaExportError] = LibraryRefused) -> None:
        self.library, self.file, self.error = library, file, error

    def __enter__(self) -> library_call:
        return self

    def __exit__(self, kind, e, tb) -> bool:
        if e is None or isinstance(e, (MhaExportError, KeyboardInterrupt, SystemExit, MemoryError, GeneratorExit)):
            return False
        if not isinstance(e, Exception) and library_of(e) is None:
            return False
        raise self.error(f"{shown(self.file)}: {self.library} refused it: {shown(clip(first_line(e), 300))}: "
                         "refused") from None
