"""What both exporters share: example inputs, staging + atomic publish, warnings capture, the export record."""

from __future__ import annotations

import contextlib
import logging
import os
import platform
import shutil
import tempfile
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch

from mhaexport import __version__
from mhaexport.exporter import manifest as mf
from mhaexport.iospec import ModelContract, io_schema
from mhaexport.models.inputs import make_inputs
from mhaexport.models.loading import LoadedModel

# Messages torch.onnx/torch.export emit on every export that say nothing about the user's model.
NOISE = ("torchvision is not installed", "isinstance(treespec, LeafSpec)", "shares the same shape constraints")

# Example sizes for tracing/exporting: all >= 2 and pairwise distinct, so torch.export neither specializes a
# dynamic dim to 0/1 nor mistakes one axis for another.
EXAMPLE_BATCH, EXAMPLE_SEQ, EXAMPLE_PAST = 2, 3, 5


@dataclass
class ExportRecord:
    """What an export produced (returned to the CLI, which decides what to show)."""

    artifact: str  # "onnx" | "torchscript"
    folder: Path
    files: list[str]
    seconds: float
    warnings: list[str] = field(default_factory=list)
    manifest: dict = field(default_factory=dict)


def example_inputs(contract: ModelContract, seq: int = EXAMPLE_SEQ, past: int = EXAMPLE_PAST,
                   batch: int = EXAMPLE_BATCH, dtype: torch.dtype = torch.float32):
    return make_inputs(contract, batch=batch, seq=seq, past=past, seed=1234, dtype=dtype)


def tool_versions() -> dict:
    import onnx

    versions = {"mhaexport": __version__, "python": platform.python_version(), "torch": torch.__version__,
                "onnx": onnx.__version__}
    for mod in ("onnxruntime", "onnxscript"):
        with contextlib.suppress(Exception):
            versions[mod] = __import__(mod).__version__
    return versions


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
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        try:
            yield caught
        finally:
            registry.setLevel(registry_level)
            for lg, (prop, level) in zip(loggers, saved):
                lg.removeHandler(handler)
                lg.propagate = prop
                lg.setLevel(level)
            seen = set(caught)
            for item in w:
                text = f"{item.category.__name__}: {item.message}"
                if text not in seen and not any(n in text for n in NOISE):
                    seen.add(text)
                    caught.append(text)


@contextlib.contextmanager
def staging(out_dir: Path, artifact: str) -> Iterator[Path]:
    """A scratch folder inside out_dir; the artifact's manifest entry is dropped first, so a crash mid-export
    leaves no entry whose files a reader would trust."""
    mf.ensure_writable_dir(out_dir)
    mf.forget_artifact(out_dir, artifact)
    for stale in out_dir.glob(f".staging-{artifact}-*"):  # left by an export that was killed
        shutil.rmtree(stale, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(dir=out_dir, prefix=f".staging-{artifact}-"))
    try:
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def publish(staged: Path, out_dir: Path, files: list[str]) -> None:
    """Move staged files into out_dir by rename (atomic per file); the main file (files[0]) goes last."""
    for name in files[1:] + files[:1]:
        src = staged / name
        with open(src, "rb") as f:
            os.fsync(f.fileno())
        os.replace(src, out_dir / name)


def finish(loaded: LoadedModel, out_dir: Path, artifact: str, files: list[str], entry: dict, started: float,
           warns: list[str], dtype: str = "float32") -> ExportRecord:
    c = loaded.contract
    manifest = mf.record_artifact(
        out_dir, model=loaded.describe(), io=io_schema(c.n_layers, c.n_heads, c.head_dim, c.vocab_size, dtype),
        artifact=artifact, entry={**entry, "export_seconds": round(time.perf_counter() - started, 3),
                                  "warnings": warns},
        files=files, versions=tool_versions())
    return ExportRecord(artifact, out_dir, files, time.perf_counter() - started, warns, manifest)
