"""mhaexport: export a causal MHA decoder to ONNX and TorchScript with dynamic axes, and prove the export.

This module imports nothing heavy: torch and onnxruntime are imported by the subpackages that need them.
"""

from __future__ import annotations

import sys as _sys
from pathlib import Path as _Path
from types import ModuleType as _ModuleType

# In a source checkout the subpackages live in top-level folders (models/, exporter/, verify/, ...) that
# pyproject.toml maps into this namespace. When Python finds this folder through the current directory (the repo
# root) rather than the installed mapping, let it find those folders too -- only those: the checkout's other folders
# (tests/, scripts/, docs/) are not mhaexport.tests or mhaexport.scripts.
# pyproject.toml's package-dir
_MAPPED = ("core", "artifact", "models", "exporter", "verify", "runners", "runtime", "bench", "diagnose", "evaluate")
_root = _Path(__file__).resolve().parent.parent


class _CheckoutFinder:
    """Finds ``mhaexport.<name>`` for the mapped folders of a source checkout, and nothing else."""

    @staticmethod
    def find_spec(fullname: str, path=None, target=None):
        head, _, name = fullname.partition(".")
        if head != "mhaexport" or name not in _MAPPED:
            return None
        from importlib.util import spec_from_file_location

        init = _root / name / "__init__.py"
        return spec_from_file_location(fullname, init, submodule_search_locations=[str(init.parent)])


if (_root / "pyproject.toml").is_file() and (_root / "models" / "attention.py").is_file():
    if not any(isinstance(f, type) and f.__name__ == "_CheckoutFinder" for f in _sys.meta_path):
        _sys.meta_path.append(_CheckoutFinder)

from mhaexport.core.version import __version__  # noqa: E402 (the ground floor: found through the finder above in a checkout)

from mhaexport.core.errors import MhaExportError  # noqa: E402

# The Python API (mhaexport/api.py), imported on first use so `import mhaexport` and `mhaexport --help` stay instant.
_API = ("adopt", "all", "bench", "bisect_folder", "check_junit", "check_threads", "eval_verdict", "evaluate",
        "export_onnx", "export_onnx_target", "export_pt2", "export_torchscript", "generate", "lint", "lint_verdict",
        "load", "merge_reports", "quantize", "target_options", "verify", "verify_run", "write_reports")
# Three API names are also subpackages (verify/, bench/, evaluate/): importing a subpackage sets the package's
# attribute to the module, whatever was there, so the attribute becomes an ApiFunction view of it (see _Package).
_PACKAGES = ("verify", "bench", "evaluate")

# mhaexport.all is the main job; `from mhaexport import *` leaves it out (it would hide the builtin all)
__all__ = ["MhaExportError", "__version__", *(n for n in _API if n != "all")]


class ApiFunction:
    """``mhaexport.verify`` / ``mhaexport.bench``: the API function of that name (called, and to ``help()``,
    ``inspect.signature`` and ``__doc__``), whose other attributes are the subpackage's (``mhaexport.verify.
    verify_folder``, ``mhaexport.bench.BenchConfig``; set and deleted there too, so monkeypatch works).

    A module object cannot be both: ``help()`` documents any module as a module. So the subpackage stays a module in
    ``sys.modules`` and the package attribute is this view of it (:class:`_Package` puts it there whenever the import
    system sets the attribute). mhaexport.api is imported only when the function is called or looked at."""

    __slots__ = ("_name", "_package")

    def __init__(self, name: str, package: _ModuleType) -> None:
        object.__setattr__(self, "_name", name)
        object.__setattr__(self, "_package", package)

    def _function(self):
        from mhaexport import api

        return getattr(api, self._name)

    def __call__(self, *args, **kwargs):
        return self._function()(*args, **kwargs)

    def __get__(self, obj, objtype=None):  # a routine to inspect and pydoc: help() documents it as the function
        return self

    # what help(), inspect.signature (through __wrapped__) and typing tools read: the function's own
    __doc__ = property(lambda self: self._function().__doc__)  # type: ignore[assignment]
    __wrapped__ = property(lambda self: self._function())
    __signature__ = property(lambda self: __import__("inspect").signature(self._function()))
    __name__ = property(lambda self: self._name)  # type: ignore[assignment]
    __annotations__ = property(lambda self: self._function().__annotations__)  # type: ignore[assignment]

    def __getattr__(self, attr: str):
        return getattr(self._package, attr)

    def __setattr__(self, attr: str, value) -> None:
        setattr(self._package, attr, value)

    def __delattr__(self, attr: str) -> None:
        delattr(self._package, attr)

    def __dir__(self) -> list[str]:
        return dir(self._package)

    def __repr__(self) -> str:
        return f"<function mhaexport.{self._name} (API; attributes: package {self._package.__name__})>"


class _Package(_ModuleType):
    """mhaexport itself: importing a subpackage sets the parent's attribute to the module; for verify, bench and
    evaluate the attribute becomes the :class:`ApiFunction` view of it instead."""

    def __setattr__(self, name: str, value) -> None:
        if name in _PACKAGES and isinstance(value, _ModuleType):
            value = ApiFunction(name, value)
        super().__setattr__(name, value)


_sys.modules[__name__].__class__ = _Package


def __getattr__(name: str):
    if name in _PACKAGES:
        import importlib

        importlib.import_module(f"mhaexport.{name}")  # sets the attribute (to the ApiFunction view)
        return globals()[name]
    if name in _API:
        from mhaexport import api

        return getattr(api, name)
    raise AttributeError(f"module 'mhaexport' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_API))
