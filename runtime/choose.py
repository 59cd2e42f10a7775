"""The one place that decides how an exported ONNX file is driven: which runner class (a concat cache or one shared
buffer), the names it is fed under (the contract's or an adopted file's layout), the cache's dtype and slots, the
fixed sizes of a static export. The Generator, verify's and eval's ort-cpu / ort-cuda and every bench row built on
ONNX Runtime take their runner from here, over a folder opened once (:class:`~mhaexport.artifact.ExportFolder`,
whose snapshot holds the bytes that were hash-checked). Torch-free.
"""

from __future__ import annotations

from pathlib import Path

from mhaexport import iospec
from mhaexport.artifact import ArtifactEntry, ExportFolder
from mhaexport.errors import ArtifactError
from mhaexport.iospec import ModelContract
from mhaexport.runtime.foreign import layout_of
from mhaexport.runtime.ort import OrtRunner, SharedCacheOrtRunner
from mhaexport.runtime.session import SessionConfig, optimized_path, resolve_providers


def open_folder(folder: str | Path | ExportFolder, artifact: str = "onnx") -> ExportFolder:
    """``folder`` as an opened, hash-checked :class:`ExportFolder` (opened here when given as a path)."""
    return folder if isinstance(folder, ExportFolder) else ExportFolder.open(folder, artifact)


def cache_dtype(entry: ArtifactEntry, contract: ModelContract) -> str:
    """The dtype of the KV cache as the file takes it (its first past input; the artifact's dtype without layers)."""
    if not contract.n_layers:
        return entry.dtype
    try:
        return entry.input_dtype(iospec.past_names(0)[0])
    except ArtifactError:  # an I/O schema without the contract's names: the artifact's dtype
        return entry.dtype


def is_shared_cache(entry: ArtifactEntry) -> bool:
    """Whether the file's past and present are one preallocated buffer per layer (``--kv-cache shared``)."""
    return entry.details.cache.shared


def ort_runner_for(ef: ExportFolder, name: str, config: SessionConfig = SessionConfig(), *,
                   contract: ModelContract | None = None, io_binding: bool | None = None,
                   contract_steps: bool = False) -> OrtRunner:
    """The ONNX Runtime runner of ``ef``'s ONNX export, not yet activated: a :class:`SharedCacheOrtRunner` for a shared
    cache (``contract_steps``: verify's contract calls, see that class), else an :class:`OrtRunner`; an adopted file
    fed under its own names. ``contract``: the eager model's contract (default: the folder's)."""
    entry = ef.entry("onnx")
    c = contract or ef.contract
    optimized = None
    if config.cache_optimized:
        provider = resolve_providers(config.providers)[0]
        sha = entry.files[entry.file]["sha256"]
        optimized = (optimized_path(sha, entry.file, config.opt_level, provider), sha)
    common = dict(config=config, dtype=cache_dtype(entry, c), layout=layout_of(entry), io_binding=io_binding,
                  optimized_cache=optimized)
    if is_shared_cache(entry):
        return SharedCacheOrtRunner(name, c, ef.file("onnx"), max_cache=entry.details.cache.max_cache,
                                    contract_steps=contract_steps, **common)
    return OrtRunner(name, c, ef.file("onnx"), fixed=entry.fixed_sizes, **common)
