"""An ONNX Runtime session over an export folder: hash-checked, on the providers asked for, and honest about the
providers it really got. Torch-free (numpy and onnxruntime only)."""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import onnxruntime as ort

from mhaexport.errors import ArtifactError, ConfigError, ProviderUnavailable
from mhaexport.exporter.manifest import load_verified, sha256_file

CPU = "CPUExecutionProvider"
CUDA = "CUDAExecutionProvider"
PROVIDER_ALIASES = {"cpu": CPU, "cuda": CUDA}

# Graph optimization level by name. The default was measured on the bench preset's decode step (docs/DESIGN.md).
OPT_LEVELS = {
    "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}
DEFAULT_OPT_LEVEL = "all"


@dataclass(frozen=True)
class SessionConfig:
    """How to build the session. ``providers`` take full names or the aliases ``cpu`` / ``cuda``."""

    providers: tuple[str, ...] = ("cpu",)
    threads: int | None = None  # intra-op threads; None lets ONNX Runtime choose (one per core)
    opt_level: str = DEFAULT_OPT_LEVEL  # disable | basic | extended | all
    cache_optimized: bool = False  # write/read the optimized graph next to the export (see ``optimized_path``)
    strict_providers: bool = True  # raise ProviderUnavailable when a requested provider is not used
    profile_prefix: str | None = None  # enable ONNX Runtime's profiler, writing a JSON trace with this prefix
    log_severity: int = 3  # 0 verbose .. 4 fatal; 3 keeps ONNX Runtime quiet but for errors


@dataclass
class LoadedSession:
    """A created session and what it really runs on."""

    session: ort.InferenceSession
    manifest: dict
    model_path: Path
    requested: list[str]
    providers: list[str]  # session.get_providers(): what the session really uses
    device: str  # "cuda" when the session runs on CUDAExecutionProvider, else "cpu"
    warnings: list[str] = field(default_factory=list)
    optimized_from_cache: bool = False


def resolve_providers(names: tuple[str, ...] | list[str] | str) -> list[str]:
    """Expand aliases; CUDA requests get CPU appended as ONNX Runtime's fallback for unsupported nodes."""
    if isinstance(names, str):
        names = [n.strip() for n in names.split(",") if n.strip()]
    out = []
    for n in names:
        full = PROVIDER_ALIASES.get(n.lower(), n)
        if full not in out:
            out.append(full)
    if not out:
        out = [CPU]
    if CPU not in out:
        out.append(CPU)
    return out


def optimized_path(folder: Path, model_file: str, opt_level: str, provider: str) -> Path:
    """Where the cached optimized graph of ``model_file`` lives: keyed by level, provider and ORT version."""
    tag = f"{opt_level}-{provider.replace('ExecutionProvider', '').lower()}-ort{ort.__version__}"
    return folder / ".ort-cache" / f"{Path(model_file).stem}.{tag}.onnx"


@contextlib.contextmanager
def _stderr_lines() -> Iterator[list[str]]:
    """Capture what native code writes to file descriptor 2 (ONNX Runtime's provider loader logs there)."""
    lines: list[str] = []
    try:
        saved = os.dup(2)
    except OSError:
        yield lines
        return
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield lines
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            lines.extend(re.sub(r"\x1b\[[0-9;]*m", "", tmp.read().decode(errors="replace")).splitlines())


def _load_failure(lines: list[str]) -> str:
    """The line of ONNX Runtime's log that says why a provider did not load (e.g. a missing CUDA library)."""
    for ln in lines:
        if m := re.search(r"(lib[\w.+-]+\.so[\w.]*: cannot open shared object file[^\n]*)", ln):
            return m.group(1)
    for ln in lines:
        if "Failed to" in ln or "error" in ln.lower():
            return ln.split("] ", 1)[-1][:240]
    return "no device or its libraries did not load"


def start_session(model: str | Path | bytes, requested: list[str],
                  options: ort.SessionOptions | None = None) -> tuple[ort.InferenceSession, str | None]:
    """Create an InferenceSession on ``requested`` providers. Returns it and, when a requested provider is not
    among ``session.get_providers()`` (onnxruntime-gpu silently falls back to CPU), one line saying so and why."""
    capture = _stderr_lines() if requested != [CPU] else contextlib.nullcontext([])
    with capture as log:
        source = model if isinstance(model, bytes) else str(model)  # a file, or a serialized ModelProto
        session = ort.InferenceSession(source, sess_options=options or ort.SessionOptions(), providers=requested)
    used = list(session.get_providers())
    missing = [p for p in requested if p not in used]
    reason = f"{', '.join(missing)} requested; session runs on {used}: {_load_failure(log)}" if missing else None
    return session, reason


def _session_options(cfg: SessionConfig) -> ort.SessionOptions:
    so = ort.SessionOptions()
    if cfg.opt_level not in OPT_LEVELS:
        raise ConfigError(f"graph optimization level {cfg.opt_level!r} unknown; use one of {', '.join(OPT_LEVELS)}")
    so.graph_optimization_level = OPT_LEVELS[cfg.opt_level]
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.log_severity_level = cfg.log_severity
    if cfg.threads is not None:
        so.intra_op_num_threads = int(cfg.threads)
        so.inter_op_num_threads = 1
    if cfg.profile_prefix:
        so.enable_profiling = True
        so.profile_file_prefix = cfg.profile_prefix
    return so


def create_session(folder: str | Path, cfg: SessionConfig = SessionConfig()) -> LoadedSession:
    """Read and hash-check the manifest's ONNX export in ``folder`` and create its session.

    Raises ArtifactError for a missing/altered export or one with fixed sequence axes (no decode loop can run on
    it), and ProviderUnavailable when ``cfg.strict_providers`` and a requested provider is not in use.
    """
    folder = Path(folder)
    manifest = load_verified(folder, "onnx")
    entry = manifest["artifacts"]["onnx"]
    if not entry.get("seq_dynamic", True):
        raise ArtifactError(f"{folder} holds a static-shape ONNX export (sequence and past lengths fixed); "
                            "a KV-cache decode loop needs `mhaexport onnx --seq-dynamic`")
    model_path = folder / entry["file"]
    requested = resolve_providers(cfg.providers)
    so = _session_options(cfg)
    warnings: list[str] = []
    source = model_path
    from_cache = False
    if cfg.cache_optimized:
        cache = optimized_path(folder, entry["file"], cfg.opt_level, requested[0])
        stamp = cache.with_suffix(".sha256")
        want = manifest["artifacts"]["onnx"]["files"][entry["file"]]["sha256"]
        if cache.is_file() and stamp.is_file() and stamp.read_text().strip() == f"{want} {sha256_file(cache)}":
            source, from_cache = cache, True
            so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # already optimized
        else:
            cache.parent.mkdir(exist_ok=True)
            so.optimized_model_filepath = str(cache)
    try:
        session, missing = start_session(source, requested, so)
    except Exception as e:  # ORT raises its own exception types (Fail, InvalidGraph, ...)
        first = next((ln for ln in str(e).splitlines() if ln.strip()), type(e).__name__)
        raise ArtifactError(f"ONNX Runtime cannot load {source}: {first}") from None
    if cfg.cache_optimized and not from_cache and os.path.isfile(so.optimized_model_filepath):
        cache = Path(so.optimized_model_filepath)
        cache.with_suffix(".sha256").write_text(f"{want} {sha256_file(cache)}\n")
    used = list(session.get_providers())
    if missing:
        if cfg.strict_providers:
            raise ProviderUnavailable(missing)
        warnings.append(missing)
    device = "cuda" if used and used[0] == CUDA else "cpu"
    return LoadedSession(session, manifest, model_path, requested, used, device, warnings, from_cache)
