"""mhaexport: export a causal MHA decoder to ONNX and TorchScript with dynamic axes, and prove the export.

This module imports nothing heavy: torch and onnxruntime are imported by the subpackages that need them.
"""

from __future__ import annotations

__version__ = "0.1.0"

from pathlib import Path as _Path

# In a source checkout the subpackages live in top-level folders (models/, exporter/, verify/, runtime/) that
# pyproject.toml maps into this namespace. When Python finds this folder through the current directory (the repo
# root) rather than the installed mapping, let it find those folders too.
_root = _Path(__file__).resolve().parent.parent
if (_root / "pyproject.toml").is_file() and (_root / "models" / "attention.py").is_file():
    __path__.append(str(_root))  # type: ignore[name-defined]  # noqa: F821

from mhaexport.errors import MhaExportError  # noqa: E402

__all__ = ["MhaExportError", "__version__"]
