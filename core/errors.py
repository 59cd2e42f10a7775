"""One root exception, one subclass per stage.

The CLI turns any :class:`MhaExportError` into exit code 2 (bad usage or bad input) with one line and no
traceback, except :class:`VerificationFailed` (exit code 1) and :class:`NotVerified` (exit code 4).
"""

from __future__ import annotations


class MhaExportError(Exception):
    """Root of every error the toolkit raises on purpose. ``cli``: the message in the command line's words (its
    option names: ``--prompt-ids`` where the Python API says ``prompt_ids``), when they differ; the CLI prints it
    instead of the API's message."""

    def __init__(self, *args: object, cli: str | None = None) -> None:
        super().__init__(*args)
        self.cli = cli


class ConfigError(MhaExportError):
    """A config preset, JSON file or field is wrong."""


class ModelLoadError(MhaExportError):
    """A user model spec, factory or checkpoint could not be loaded or is off-contract."""


class ExportError(MhaExportError):
    """torch.onnx / torch.jit could not export the model, or the result failed its checks."""


class ExportOptionError(ConfigError, ExportError):
    """An export option's value is wrong or contradicts another (``attention``, ``dtype``, ``opset``, ``kv_cache``,
    ``max_cache``, the static lengths, the TorchScript ``mode``): a ConfigError like every bad argument, and an
    ExportError as before, so either ``except`` catches it."""


class ArtifactError(MhaExportError):
    """An export folder is missing files, has an unreadable manifest, or a hash does not match."""


class ReportNotWritten(ArtifactError):
    """A report (or its JUnit file) could not be written where asked; ``written``: what was written before."""

    def __init__(self, *args: object, written: list | None = None) -> None:
        super().__init__(*args)
        self.written = list(written or [])


class FolderRefused(ArtifactError):
    """A verify verdict "refused" (exit 2): the folder was refused before any check ran; its report says why."""

    exit_code = 2


class UnsafeFolder(ArtifactError):
    """A folder names something outside itself (a path that leaves it, a symlink, a non-regular file): refused before
    any work (docs/DESIGN.md, "Folders from elsewhere")."""


class UntrustedInput(ConfigError, ArtifactError):
    """A file or value from outside (a folder, a ``--hf`` folder, a report, ``--config FILE.json``) is beyond what
    mhaexport reads: not JSON, larger or nested deeper than the limits, a number beyond what the machine can do, a
    name holding a NUL. A ConfigError and an ArtifactError, so either ``except`` catches it
    (core/untrusted.py)."""


class ReferenceMismatch(ArtifactError):
    """A folder's recorded eager reference (``verify --record``) was made from other weights, over another sweep or
    for another file than the one verify is asked to judge: refused, never compared (verify/reference.py)."""


class UntrustedCode(ArtifactError):
    """Loading what a folder names would run code (a manifest's model source that is a factory file or module, a
    compiled or pickled artifact) and the user did not ask for it (``--trust-code`` / ``trust_code=True``, or naming
    the model with ``--model``)."""


class RuntimeInputError(MhaExportError):
    """Inputs given to a runner or the deploy runtime do not fit the model (ids, shapes, lengths)."""


class RuntimeOptionError(ConfigError, RuntimeInputError):
    """A decode or bench setting is wrong (no prompt, ``max_new_tokens``, ``temperature``, ``top_k``/``top_p``, an
    unknown bench runtime, lengths past the model's ``max_positions``): a ConfigError like every bad argument, and a
    RuntimeInputError as before, so either ``except`` catches it."""


class ProviderUnavailable(MhaExportError):
    """An execution provider was requested but the created session does not use it."""


class RuntimeFailure(MhaExportError):
    """A runtime (ONNX Runtime, TorchScript, the eager model itself) raised while loading or running an artifact.

    Runners wrap what the runtime raises in this, so verify can tell a runtime that fails (a finding: a failed
    check) from a bug in mhaexport's own code (exit 3 with the traceback)."""


class OverBudget(RuntimeFailure):
    """A runtime's call ran past its budget (``mhaexport.runtime.budget``) and was stopped: inside a check, that
    runtime's failure of the check; elsewhere exit 2, one line."""

    def __init__(self, message: str, seconds: float | None = None) -> None:
        super().__init__(message)
        self.seconds = seconds


class LibraryRefused(MhaExportError):
    """A library mhaexport hands a folder's file to (tokenizers, onnx, onnxruntime, onnxruntime-genai, safetensors)
    refused it — raised, or panicked — on that input: exit 2, one line naming the file and the library
    (:func:`mhaexport.core.libraries.library_call`, the one place such failures are mapped)."""


class VerificationFailed(MhaExportError):
    """Verification ran and at least one check failed (CLI exit code 1)."""

    exit_code = 1


class NotVerified(VerificationFailed):
    """Nothing failed, but what was asked for was not verified: a runtime requested by name was skipped entirely
    (no CUDA, no artifact), or no runtime besides eager ran (CLI exit code 4)."""

    exit_code = 4


def clip(text: str, limit: int = 300) -> str:
    """``text`` cut to at most ``limit`` characters at a word boundary, with "…" where it was cut (a message shown
    in one line never ends mid-word: "Non-zero status code returned while running Ad…" was ONNX Runtime's)."""
    if len(text) <= limit:
        return text
    cut = text[:limit - 1]
    space = cut.rfind(" ")
    return (cut[:space] if space > limit // 2 else cut).rstrip(" ,;:") + "…"


def raise_for_verdict(code: int, message: str) -> None:
    """Every verdict -> exit mapping, in one place: 0 (passed) returns; 1 raises VerificationFailed, 4 NotVerified
    (the CLI exits with the exception's ``exit_code``), 2 (a folder refused before any check) FolderRefused, bad
    input."""
    if code == VerificationFailed.exit_code:
        raise VerificationFailed(message)
    if code == FolderRefused.exit_code:
        raise FolderRefused(message)
    if code == NotVerified.exit_code:
        raise NotVerified(message)


def first_line(e: BaseException) -> str:
    """``Type: first line`` of an exception, for one-line messages; for TorchScript interpreter errors, the line
    that says what failed."""
    lines = [ln.strip() for ln in str(e).strip().splitlines() if ln.strip()]
    line = lines[0] if lines else ""
    if "TorchScript interpreter" in line and len(lines) > 1:
        line = lines[-1]
    if not line:
        return type(e).__name__
    return clip(line) if line.startswith(f"{type(e).__name__}:") else f"{type(e).__name__}: {clip(line)}"
