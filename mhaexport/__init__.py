"""mhaexport: export a causal MHA decoder to ONNX and TorchScript with dynamic axes, and prove the export.

This module imports nothing heavy: torch and onnxruntime are imported by the subpackages that need them.
"""

from __future__ import annotations

__version__ = "0.1.0"

import sys as _sys
from pathlib import Path as _Path
from types import ModuleType as _ModuleType

# In a source checkout the subpackages live in top-level folders (models/, exporter/, verify/, runtime/) that
# pyproject.toml maps into this namespace. When Python finds this folder through the current directory (the repo
# root) rather than the installed mapping, let it find those folders too.
_root = _Path(__file__).resolve().parent.parent
if (_root / "pyproject.toml").is_file() and (_root / "models" / "attention.py").is_file():
    __path__.append(str(_root))  # type: ignore[name-defined]  # noqa: F821

from mhaexport.errors import MhaExportError  # noqa: E402

# The Python API (mhaexport/api.py), imported on first use so `import mhaexport` and `mhaexport --help` stay instant.
_API = ("bench", "export_onnx", "export_torchscript", "generate", "load", "quantize", "verify")
# Two API names are also subpackages (verify/, bench/): importing a subpackage sets the package's attribute to the
# module, whatever was there, so those modules are made callable instead (each calls _callable_package on import).
_PACKAGES = ("verify", "bench")

__all__ = ["MhaExportError", "__version__", *_API]


class _CallablePackage(_ModuleType):
    """A subpackage that, called, is the API function of its name: ``mhaexport.verify(folder)`` is
    :func:`mhaexport.api.verify` while ``mhaexport.verify.verify_folder`` stays the package's."""

    def __call__(self, *args, **kwargs):
        from mhaexport import api

        return getattr(api, self.__name__.rpartition(".")[2])(*args, **kwargs)


def _callable_package(name: str) -> None:
    """Make the subpackage ``name`` (mhaexport.verify, mhaexport.bench) callable as its API function."""
    _sys.modules[name].__class__ = _CallablePackage


def __getattr__(name: str):
    if name in _PACKAGES:
        import importlib

        return importlib.import_module(f"mhaexport.{name}")  # the callable subpackage
    if name in _API:
        from mhaexport import api

        return getattr(api, name)
    raise AttributeError(f"module 'mhaexport' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_API))
