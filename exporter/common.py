"""What both exporters share: example inputs, warnings capture, the export record and writing it to the folder."""

from __future__ import annotations

import contextlib
import logging
import os
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from mhaexport.artifact import ArtifactEntry, Manifest, Staging
from mhaexport.artifact.details import Details
from mhaexport.artifact.source import HfSource
from mhaexport.core.env import tool_versions
from mhaexport.core.errors import ExportError, UntrustedInput
from mhaexport.exporter.records import Replaced, record_dict
from mhaexport.core.iospec import EXAMPLE_BATCH, EXAMPLE_PAST, EXAMPLE_SEQ, ModelContract, io_schema

if TYPE_CHECKING:  # torch is imported where it is used: quantize (torch-free) uses this module too
    import torch

    from mhaexport.models.loading import LoadedModel

# Messages torch.onnx/torch.export emit on every export that say nothing about the user's model.
NOISE = ("torchvision is not installed", "isinstance(treespec, LeafSpec)", "shares the same shape constraints",
         # transformers' deprecated property, which torch.jit.trace reads while it walks every module's attributes
         "`is_gradient_checkpointing` is deprecated")


@dataclass
class ExportRecord:
    """What an export produced (returned to the CLI, which decides what to show)."""

    artifact: str  # "onnx" | "torchscript" | "pt2" | "aoti"
    folder: Path
    files: list[str]
    seconds: float
    warnings: list[str] = field(default_factory=list)
    manifest: Manifest | None = None
    replaced: Replaced | None = None  # the other model the folder held (``replace``), else None

    def to_dict(self) -> dict:
        """The record for scripts (``--json``): :func:`mhaexport.exporter.records.record_dict`."""
        return record_dict(self)


def example_inputs(contract: ModelContract, seq: int = EXAMPLE_SEQ, past: int = EXAMPLE_PAST,
                   batch: int = EXAMPLE_BATCH, dtype: torch.dtype | None = None):
    import torch

    from mhaexport.models.inputs import make_inputs

    dtype = torch.float32 if dtype is None else dtype
    return make_inputs(contract, batch=batch, seq=seq, past=past, seed=1234, dtype=dtype)


# Export warnings that are no fault of the model, shown by the CLI as a note (not a yellow warning): torch.jit's
# deprecation, and the tracer's warnings folded into one line (verify runs the trace at other sizes and says so)
JIT_DEPRECATED = "torch.jit is deprecated in recent PyTorch; the .pt file still loads with torch.jit.load"
TRACED_CONSTANTS = "torch.jit.trace recorded"
# an export whose layers could not be copied from one traced layer (exporter/replicate.py) says why, as a note
TRACED_WHOLE = "traced every layer"


# a half-precision export's headroom figures (models/headroom.py), always said: a note
HEADROOM_NOTE = "headroom:"


def is_note(warning: str) -> bool:
    """Whether an export's warning is a note (:data:`JIT_DEPRECATED`, the folded tracer warnings, the headroom, a
    model traced whole because its layers could not be copied)."""
    return warning == JIT_DEPRECATED or warning.startswith((TRACED_CONSTANTS, HEADROOM_NOTE, TRACED_WHOLE))


@contextlib.contextmanager
def captured_warnings() -> Iterator[list[str]]:
    """Collect Python warnings and torch.onnx's logged warnings as strings instead of letting them print."""
    caught: list[str] = []

    class _ToList(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            msg = record.getMessage()
            if not any(n in msg for n in NOISE):
                caught.append(msg)

    handler = _ToList(level=logging.WARNING)
    loggers = [logging.getLogger(n) for n in ("torch.onnx", "torch.export", "torch._export", "onnxscript")]
    saved = [(lg.propagate, lg.level) for lg in loggers]
    for lg in loggers:
        lg.addHandler(handler)
        lg.propagate = False
    registry = logging.getLogger("torch.onnx._internal.exporter._registration")  # logs torchvision noise itself
    registry_level = registry.level
    registry.setLevel(logging.ERROR)
    seen: set[str] = set()

    def show(message, category, *_args, **_kwargs) -> None:  # live, so the list is complete at any moment
        text = f"{category.__name__}: {message}"
        if text not in seen and not any(n in text for n in NOISE):
            seen.add(text)
            caught.append(text)

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = show
        try:
            yield caught
        finally:
            registry.setLevel(registry_level)
            for lg, (prop, level) in zip(loggers, saved):
                lg.removeHandler(handler)
                lg.propagate = prop
                lg.setLevel(level)


def module_bytes(module: torch.nn.Module, dtype: torch.dtype | None = None) -> int:
    """Bytes of ``module``'s parameters and buffers (in ``dtype`` when given): what an export of it writes, about."""
    import torch

    size = torch.tensor([], dtype=dtype).element_size() if dtype is not None else None
    tensors = [*module.parameters(), *module.buffers()]
    return sum(t.numel() * (size or t.element_size()) for t in tensors)


def copy_tokenizer(loaded: LoadedModel, dest: Path) -> list[str]:
    """Write the tokenizer of an ``--hf`` folder (``tokenizer.json`` and its companions) into ``dest``: the bytes
    read when the model was loaded (:mod:`mhaexport.models.hf_files`: inside the folder, no link followed), never
    the folder read again; returns the names written, [] for a model without one (the built-in models are
    byte-level)."""
    if not isinstance(loaded.origin, HfSource):
        return []
    files = getattr(getattr(loaded, "module", None), "tokenizer", None) or {}
    for name, data in files.items():
        (dest / name).write_bytes(data)
    return list(files)


def finish(loaded: LoadedModel, staged: Staging, *, fmt: str, main_file: str, files: list[str], dtype: str,
           details: Details, started: float, warns: list[str], seq_dynamic: bool = True,
           static_sizes: tuple[int, int] | None = None, owned: tuple[str, ...] = (),
           io: dict | None = None) -> ExportRecord:
    """Publish the staged ``files`` (``main_file`` first) and record the artifact with its own I/O schema (``io``;
    default: the decoder contract's, ``details.cache`` shaping the cache's entries) and dtype."""
    from mhaexport.core import iospec

    entry = ArtifactEntry(
        format=fmt, file=main_file, dtype=dtype,
        io=io if io is not None else io_schema(loaded.contract, dtype, seq_dynamic=seq_dynamic, sizes=static_sizes,
                                               kv_cache=details.cache.kind or "concat"),
        seq_dynamic=seq_dynamic,
        static_sizes=None if static_sizes is None else {iospec.SEQ: static_sizes[0], iospec.PAST: static_sizes[1],
                                                        iospec.TOTAL: sum(static_sizes)},
        versions=tool_versions(), export_seconds=round(time.perf_counter() - started, 3), warnings=list(warns),
        details=details)
    ordered = [main_file] + [f for f in files if f != main_file]
    manifest = staged.publish(loaded.record(staged.folder), entry, ordered, owned=owned)
    return ExportRecord(fmt, staged.folder, ordered, time.perf_counter() - started, list(warns), manifest)


# --- one folder, one model: replacing another model's export (--replace) -----------------------------------------

@dataclass
class PreviousModel:
    """The model an export folder held before this export (read leniently from its manifest.json)."""

    spec: str
    fingerprint: str
    module: str | None  # "attention" for a block on its own, None for a decoder
    files: list[str]  # every file its manifest lists

    @property
    def what(self) -> str:
        return f"the {self.module} block" if self.module else "a decoder"


def previous_model(folder: str | Path) -> PreviousModel | None:
    """The model ``folder``'s manifest.json records, or None (no folder, no manifest, a manifest not ours)."""
    from mhaexport.artifact.manifest import FILENAME
    from mhaexport.core.untrusted import load_json

    try:
        data = load_json(Path(folder) / FILENAME, f"{folder}/{FILENAME}")
        model = data["model"]
        contract = model.get("contract") or {}
        files = []
        for entry in (data.get("artifacts") or {}).values():
            files += [entry["file"]] if isinstance(entry.get("file"), str) else []
            files += [n for n in (entry.get("files") or {}) if isinstance(n, str)]
        return PreviousModel(spec=str(model.get("spec")), fingerprint=str(model.get("fingerprint")),
                             module=contract.get("kind") if isinstance(contract, dict) else None,
                             files=list(dict.fromkeys(files)))
    except (UntrustedInput, KeyError, TypeError, AttributeError):  # none, unreadable, not ours
        return None


def check_replace(folder: str | Path, loaded: LoadedModel | PreviousModel, replace: bool) -> PreviousModel | None:
    """Before any export into ``folder`` of ``loaded`` (a model, or the model record of the folder a quantized export
    is made from): ExportError (one line naming both) when ``folder`` holds another model, or the block where a
    decoder goes (or the other way round), unless ``replace``. Returns that other model (its files go after the new
    export is published: :func:`drop_replaced`), or None when the folder holds this model or none."""
    prev = previous_model(folder)
    module = loaded.module if isinstance(loaded, PreviousModel) else getattr(loaded.contract, "kind", None)
    if prev is None or (prev.fingerprint == loaded.fingerprint and prev.module == module):
        return None
    new = f"the {module} block" if module else "a decoder"
    if not replace:
        raise ExportError(f"{folder} holds {prev.what}, {prev.spec} (fingerprint {prev.fingerprint}); this export is "
                          f"{new}, {loaded.spec} (fingerprint {loaded.fingerprint}): give --replace to replace it "
                          "(its files and reports go), or another -o folder")
    return prev


STALE_OUTPUTS = ("report*.json", "report*.md", "bench*.json", "bench*.md", "bench*.png", "genai_config.json")


def drop_replaced(folder: str | Path, prev: PreviousModel | None) -> list[str]:
    """After an export replaced ``prev`` in ``folder`` (--replace): remove the files its manifest listed that the
    new manifest does not, and the reports and bench results that judged it (and its genai_config.json unless the
    new export wrote one). Names that leave the folder are left alone. Returns the names removed."""
    if prev is None:
        return []
    from mhaexport.artifact.manifest import FILENAME

    root = Path(folder).resolve()
    now = previous_model(folder)
    keep = set(now.files if now is not None else []) | {FILENAME}
    names = set(prev.files) | {p.name for pattern in STALE_OUTPUTS for p in root.glob(pattern)}
    removed = []
    for name in sorted(names - keep):
        path = Path(os.path.normpath(root / name))
        if path == root or not path.is_relative_to(root) or not (path.is_symlink() or path.is_file()):
            continue  # outside the folder, or not a file: not this folder's to remove
        path.unlink()
        removed.append(name)
    return removed
