"""This user's cache (``MHAEXPORT_CACHE_DIR``, else ``$XDG_CACHE_HOME/mhaexport``, else ``~/.cache/mhaexport``): the
optimized graphs ONNX Runtime wrote (``runtime/session.py``) and the built-in decoder's seeded weights written once
to be memory-mapped (``models/loading.py``, verify's mapped mode). Torch-free. Never inside a folder being read."""

from __future__ import annotations

import os
from pathlib import Path

from mhaexport.core.errors import ConfigError

CACHE_ENV = "MHAEXPORT_CACHE_DIR"


def cache_root(model: str | Path | None = None) -> Path:
    """This user's cache: ``MHAEXPORT_CACHE_DIR`` (a relative value taken from the working directory), else
    ``$XDG_CACHE_HOME/mhaexport``, else ``~/.cache/mhaexport``; resolved. Never inside a folder being read:
    ConfigError (one line, naming the variable) when it is inside the folder of ``model`` or of an export folder this
    process has open (a folder someone else made must not supply the graph or weights a reader runs, nor be written
    by a reader)."""
    from mhaexport.artifact.folder import folders_being_read

    explicit = os.environ.get(CACHE_ENV)
    if explicit:
        root = Path(explicit).expanduser().resolve()
    else:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
        root = (Path(base) / "mhaexport").resolve()
    read = folders_being_read() + ([Path(model).resolve().parent] if model is not None else [])
    for folder in read:
        if root == folder or folder in root.parents:
            raise ConfigError(f"{CACHE_ENV if explicit else 'the optimized-graph cache'}={root} is inside {folder}, "
                              "a folder being read: the optimized-graph cache never lives in a folder a reader "
                              f"reads (set {CACHE_ENV} to a folder of your own)")
    return root
