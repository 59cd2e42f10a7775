"""The one builder of ONNX Runtime sessions, :func:`open_session`: on the providers asked for (probed first, and
honest about the providers the session really got), its threads, graph optimization level and options, and the
optimized-graph cache, all from one :class:`SessionConfig`. Every session of the package is built there: the
deploy runtime's and verify's runners (:mod:`mhaexport.runtime.ort`), bench's bare loop, bisect, and the quick CPU
sessions of the exporter's and lint's checks (:func:`cpu_session`, a preset of it). Torch-free (numpy and
onnxruntime only)."""

from __future__ import annotations

import contextlib
import hmac
import io
import os
import re
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import onnxruntime as ort

from mhaexport.artifact import sha256_file, shown_path
from mhaexport.artifact.cache import CACHE_ENV, cache_key, cache_root, usable  # noqa: F401 - CACHE_ENV
from mhaexport.artifact.cache import stamp as hmac_stamp
from mhaexport.core.devices import no_cuda_device
from mhaexport.runtime.budget import watch
from mhaexport.core.errors import ArtifactError, ConfigError, ProviderUnavailable, clip

CPU = "CPUExecutionProvider"
# ONNX Runtime's log severity for every session and run mhaexport makes: fatal only (its lines echo names from the file
# raw; errors come back as exceptions)
QUIET_LOG = 4
ort.set_default_logger_severity(QUIET_LOG)
CUDA = "CUDAExecutionProvider"
PROVIDER_ALIASES = {"cpu": CPU, "cuda": CUDA}
# Every session's provider options. CUDA: no TF32 — onnxruntime's CUDA provider runs float32 MatMul/Gemm in TF32 by
# default (a 10-bit mantissa on Ampere and later: ~1e-3 relative error, which failed ort-cuda's parity on an H200,
# docs/measurements/gpu-check-2026-12-04.md); a float32 file is verified, timed and deployed at float32 precision.
PROVIDER_OPTIONS = {CUDA: {"use_tf32": "0"}}

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
    cache_optimized: bool = False  # write/read the optimized graph in this user's cache (see ``optimized_path``)
    strict_providers: bool = True  # raise ProviderUnavailable when a requested provider is not used
    profile_prefix: str | None = None  # enable ONNX Runtime's profiler, writing a JSON trace with this prefix
    # 0 verbose .. 4 fatal: ONNX Runtime's own log echoes the file's node names to stderr raw, so it says nothing but
    # fatal errors (every failure comes back as an exception, which mhaexport shows escaped)
    log_severity: int = 4
    optimized_file: str | None = None  # save the graph ONNX Runtime optimized here (the precision check reads it)
    # a model given as bytes whose weights stay in external data: the folder ONNX Runtime reads them from (bisect's
    # copy of a graph with every value exposed, served from memory without copying a large model's weights)
    external_data_dir: str | None = None
    # weights memory-mapped, not copied (verify's mapped mode, issue 38): prepacking off
    # (``session.disable_prepacking``: the kernels read the mapped external data instead of packed copies in
    # anonymous memory), constant folding off (it would fold, e.g., a tied LM head's Transpose of the embedding
    # into a new anonymous copy of it) and the CPU arena off; the graph computes the same numbers. A file whose
    # weights are inside model.onnx is read whole all the same
    mmap_weights: bool = False
    # with mmap_weights: prepacking kept — a quantized file's MatMulNBits weights packed into anonymous memory (about
    # their own bytes), because unpacked MatMulNBits dequantizes every weight on every call (a decode step of a 1.1 B
    # int4 file: 5.0 s unpacked, 0.06 s packed); verify's plan keeps it where the packed weights fit the cap
    packed_weights: bool = False


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


def optimized_path(source_sha256: str, model_file: str, opt_level: str, provider: str,
                   root: Path | None = None) -> Path:
    """Where the cached optimized graph of the file whose sha256 is ``source_sha256`` lives (in :func:`cache_root`,
    or ``root``): keyed by that whole hash, the level, provider and ORT version."""
    tag = f"{opt_level}-{provider.replace('ExecutionProvider', '').lower()}-ort{ort.__version__}"
    return (root or cache_root()) / "ort" / source_sha256 / f"{Path(model_file).stem}.{tag}.onnx"


def _cache_data(cache: Path) -> Path:
    """The external-data file of the optimized-graph cache ``cache``."""
    return cache.with_name(cache.name + ".data")


def _cache_usable(root: Path, cache: Path) -> bool:
    """The cache's folders and files are this user's own, writable by no one else, no symlink among them."""
    return usable(root, [cache, _cache_data(cache), cache.with_suffix(".sha256")])


def _cache_stamp(source_sha256: str, cache: Path, key: bytes) -> str:
    """What the cache's .sha256 stamp holds: an HMAC-SHA256, under this user's key, of the source file's sha256 and
    the cache's files' own (so the graph is checked against its files on each use, and a stamp cannot be forged
    without the key)."""
    data = _cache_data(cache)
    return hmac_stamp(key, source_sha256, sha256_file(cache), sha256_file(data) if data.is_file() else "-")


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
            return clip(ln.split("] ", 1)[-1], 240)
    return "no device or its libraries did not load"


# A one-node float Identity model (80 bytes, made with onnx.helper; kept as bytes so the deploy path needs no onnx
# package): creating a session of it on a provider says whether that provider really runs here, whatever the state
# of the artifact that is to run on it.
_PROBE_MODEL = bytes.fromhex(
    "080812096d68616578706f72743a3b0a100a017812017922084964656e74697479120570726f62655a0f0a0178120a0a080801120"
    "40a020801620f0a0179120a0a08080112040a02080142040a00100d")
_probed: dict[str, str | None] = {}


def provider_unavailable(provider: str) -> str | None:
    """None when ``provider`` (an alias or full name) really runs in this process, else one line saying why not:
    "CUDAExecutionProvider requested; no CUDA device on this machine (no NVIDIA driver: libcuda.so.1 not found)"
    where there is none (:func:`mhaexport.core.devices.no_cuda_device`, asked first), and only where a device exists the
    runtime's own reason ("... session runs on ['CPUExecutionProvider']: libcublasLt.so.13: cannot open shared
    object file"). Probed once per process on a tiny built-in model."""
    full = resolve_providers([provider])[0]
    if full == CPU:
        return None
    if full not in _probed:
        if full == CUDA and (absent := no_cuda_device()) is not None:
            # no device at all: that, not which CUDA library this onnxruntime build could not load, is the reason
            _probed[full] = f"{full} requested; {absent}"
        elif full not in ort.get_available_providers():
            _probed[full] = (f"{full} requested; this onnxruntime build ({ort.__version__}) does not have it "
                             f"(available: {', '.join(ort.get_available_providers())})")
        else:
            if full == CUDA and hasattr(ort, "preload_dlls"):  # CUDA/cuDNN from pip's nvidia-* wheels (torch's)
                with _stderr_lines(), contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(Exception):
                    ort.preload_dlls(msvc=False)  # it prints what it cannot find: the probe below says why
            so = ort.SessionOptions()
            so.log_severity_level = QUIET_LOG
            try:
                _, missing = _create_session(_PROBE_MODEL, resolve_providers([full]), so)
            except Exception as e:  # noqa: BLE001 - ORT's own exception types
                missing = f"{full} requested; a session could not be created: {str(e).splitlines()[0]}"
            _probed[full] = missing
    return _probed[full]


# the graph optimizers a mapped session leaves out (SessionConfig.mmap_weights): each would copy mapped weights
MMAP_DISABLED_OPTIMIZERS = ("ConstantFolding",)


def _create_session(model: str | Path | bytes, requested: list[str], options: ort.SessionOptions,
                    disabled_optimizers: tuple[str, ...] = ()) -> tuple[ort.InferenceSession, str | None]:
    """Create an InferenceSession on ``requested`` providers: :func:`open_session`'s last step (and the provider
    probe's), called by nothing else. Returns it and, when a requested provider is not among
    ``session.get_providers()`` (onnxruntime-gpu silently falls back to CPU), one line saying so and why."""
    capture = _stderr_lines() if requested != [CPU] else contextlib.nullcontext([])
    with capture as log:
        source = model if isinstance(model, bytes) else str(model)  # a file, or a serialized ModelProto
        extra = {"disabled_optimizers": list(disabled_optimizers)} if disabled_optimizers else {}
        session = ort.InferenceSession(source, sess_options=options, providers=requested,
                                       provider_options=[PROVIDER_OPTIONS.get(p, {}) for p in requested], **extra)
    used = list(session.get_providers())
    missing = [p for p in requested if p not in used]
    why = (CUDA in missing and no_cuda_device()) or _load_failure(log)
    reason = f"{', '.join(missing)} requested; session runs on {used}: {why}" if missing else None
    return session, reason


def cpu_session(model: str | Path | bytes, *, threads: int = 1, opt_level: str = DEFAULT_OPT_LEVEL,
                optimized_file: str | None = None) -> ort.InferenceSession:
    """A quiet ONNX Runtime CPU session on ``threads`` threads (the exporter's and lint's checks run tiny batches):
    :func:`open_session` with that config. ``optimized_file``: where ONNX Runtime saves the graph it ran. A file ONNX
    Runtime cannot load raises ArtifactError."""
    cfg = SessionConfig(providers=("cpu",), threads=threads, opt_level=opt_level, optimized_file=optimized_file)
    return open_session(model, cfg)[0]


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
    if cfg.optimized_file:
        so.optimized_model_filepath = str(cfg.optimized_file)
    if cfg.external_data_dir:
        so.add_session_config_entry("session.model_external_initializers_file_folder_path", str(cfg.external_data_dir))
    if cfg.mmap_weights:
        if not cfg.packed_weights:
            so.add_session_config_entry("session.disable_prepacking", "1")
        # no arena: what a long call took goes back when it returns, instead of staying the session's for good
        # (a 2,048-token prompt's attention intermediates: ~0.8 GB for a d 1536, 12-head model)
        so.enable_cpu_mem_arena = False
    return so


def open_session(model: str | Path | bytes, cfg: SessionConfig = SessionConfig(), *,
                 source_sha256: str | None = None) -> tuple[ort.InferenceSession, list[str], bool]:
    """Build an ONNX Runtime session of ``model`` (an ONNX file, or a serialized ModelProto) as ``cfg`` says: the one
    place the package creates sessions. Returns it, the warnings (a requested provider not in use when
    ``cfg.strict_providers`` is off) and whether the optimized-graph cache was used.

    A requested provider that does not run here raises ProviderUnavailable *before* the file is read (probed on a
    tiny model), so "no CUDA" is told apart from "this file is broken"; ONNX Runtime failing to load the file
    raises ArtifactError. ``source_sha256``: the sha256 of the file as its manifest records it (hash-checked), which
    keys the optimized-graph cache when ``cfg.cache_optimized`` (:func:`optimized_path`)."""
    requested = resolve_providers(cfg.providers)
    warnings: list[str] = []
    for p in requested:
        if (why := provider_unavailable(p)) is not None:
            if cfg.strict_providers:
                raise ProviderUnavailable(why)
            warnings.append(why)
    so = _session_options(cfg)
    source, from_cache = (model if isinstance(model, bytes) else Path(model)), False
    optimized_cache = None
    if cfg.cache_optimized and source_sha256 is not None and not isinstance(model, bytes):
        if cfg.optimized_file:
            raise ConfigError("cache_optimized and optimized_file both ask where the optimized graph goes")
        root = cache_root(model)  # ConfigError when inside a folder being read
        optimized_cache = optimized_path(source_sha256, Path(model).name, cfg.opt_level, requested[0], root)
        stamp = optimized_cache.with_suffix(".sha256")
        optimized_cache.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        try:
            key = cache_key(root) if _cache_usable(root, optimized_cache) else None
        except OSError:  # a key file that is not this user's private file
            key = None
        if key is None:  # not this user's private cache: neither read nor written
            optimized_cache = None
        elif (optimized_cache.is_file() and stamp.is_file() and hmac.compare_digest(
                stamp.read_text().strip(), _cache_stamp(source_sha256, optimized_cache, key))):
            source, from_cache = optimized_cache, True
            so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # already optimized
        else:
            so.optimized_model_filepath = str(optimized_cache)
            # the optimized graph keeps its weights in a file beside it, as a model past 2 GB must
            so.add_session_config_entry("session.optimized_model_external_initializers_file_name",
                                        _cache_data(optimized_cache).name)
    try:
        session, missing = _create_session(source, requested, so,
                                           MMAP_DISABLED_OPTIMIZERS if cfg.mmap_weights else ())
    except Exception as e:  # ORT raises its own exception types (Fail, InvalidGraph, ...)
        first = next((ln for ln in str(e).splitlines() if ln.strip()), type(e).__name__)
        what = "the model" if isinstance(source, bytes) else shown_path(source)
        raise ArtifactError(f"ONNX Runtime cannot load {what}: {first}") from None
    watch(session)  # every call has a deadline (runtime/budget.py)
    if optimized_cache is not None and not from_cache and optimized_cache.is_file():
        optimized_cache.with_suffix(".sha256").write_text(_cache_stamp(source_sha256, optimized_cache, key) + "\n")
    if missing:
        if cfg.strict_providers:
            raise ProviderUnavailable(missing)
        if missing not in warnings:
            warnings.append(missing)
    return session, warnings, from_cache
