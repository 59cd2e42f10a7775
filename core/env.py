"""Where something was measured or exported: the machine and the tool versions (one place for reports, bench and
manifests). Torch-free: versions of torch and the ONNX packages are read only where they are already importable."""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import platform
import re
import socket
import time
from pathlib import Path

from mhaexport.core.version import __version__

_PACKAGES = ("torch", "onnx", "onnxruntime", "onnxscript", "onnxruntime-genai", "transformers", "numpy")


def tool_versions() -> dict[str, str]:
    """mhaexport, Python and the installed versions of the packages it works with (absent ones left out).
    ``onnxruntime`` is the version of whichever wheel provides the module (onnxruntime-gpu or onnxruntime)."""
    out = {"mhaexport": __version__, "python": platform.python_version()}
    for name in _PACKAGES:
        dist = name
        if name == "onnxruntime":
            for cand in ("onnxruntime-gpu", "onnxruntime"):
                with contextlib.suppress(importlib.metadata.PackageNotFoundError):
                    out["onnxruntime"] = importlib.metadata.version(cand)
                    break
            continue
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            out[name.replace("-", "_")] = importlib.metadata.version(dist)
    return out


def onnxruntime_clash() -> str | None:
    """One line when both ONNX Runtime distributions are installed (``onnxruntime`` and ``onnxruntime-gpu`` write the
    one ``onnxruntime`` module, so which files won is anyone's guess), else None. Installed metadata only: cheap."""
    found = []
    for dist in ("onnxruntime", "onnxruntime-gpu"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            found.append(f"{dist} {importlib.metadata.version(dist)}")
    if len(found) < 2:
        return None
    return (f"both {found[0]} and {found[1]} are installed; they write the one onnxruntime module: pip uninstall -y "
            "onnxruntime onnxruntime-gpu, then install one (-e '.[cpu]' or -e '.[gpu]')")


def cpu_name() -> str | None:
    cpu = Path("/proc/cpuinfo")
    if cpu.is_file():
        m = re.search(r"model name\s*:\s*(.+)", cpu.read_text(errors="replace"))
        return m.group(1).strip() if m else None
    return platform.processor() or None


def environment() -> dict:
    """Host label (MHAEXPORT_HOST_LABEL or the host name), OS, CPU, core count, Python, CI flag and the date."""
    return {"host": os.environ.get("MHAEXPORT_HOST_LABEL") or socket.gethostname(),
            "platform": platform.platform(), "machine": platform.machine(), "cpu": cpu_name(),
            "cpus": os.cpu_count(), "python": platform.python_version(), "ci": bool(os.environ.get("CI")),
            "date": time.strftime("%Y-%m-%d %H:%M:%S %Z")}

