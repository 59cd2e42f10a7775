"""Which accelerators this machine has, asked of their drivers (stdlib only: no runtime, no torch, and nothing of
mhaexport imported, so any layer may ask)."""

from __future__ import annotations


_NO_DEVICE = "no CUDA device on this machine"
_cuda_probe: list[str | None] = []  # the one answer of this process (the driver's view does not change under it)


def no_cuda_device() -> str | None:
    """None when this machine has a CUDA device the NVIDIA driver can see, else one line saying there is none and
    how that is known: "no CUDA device on this machine (no NVIDIA driver: libcuda.so.1 not found)" or "... (the
    NVIDIA driver reports 0 devices)". Asks the driver itself (its library, ``cuInit`` and ``cuDeviceGetCount``, as
    torch and ONNX Runtime do) rather than guessing from /dev or from which libraries are installed: a CUDA build of
    a runtime installed on a CPU machine is still a CPU machine. Cheap (a library load; no runtime is imported) and
    asked once per process. Where it answers None a device exists, and a runtime that still cannot use it has a
    reason of its own (a missing CUDA library, a CPU build) to report."""
    if not _cuda_probe:
        _cuda_probe.append(_ask_cuda_driver())
    return _cuda_probe[0]


def _ask_cuda_driver() -> str | None:
    import ctypes
    import sys

    if sys.platform == "darwin":
        return f"{_NO_DEVICE} (macOS has no CUDA)"
    lib = "nvcuda.dll" if sys.platform == "win32" else "libcuda.so.1"
    try:
        driver = ctypes.CDLL(lib)
    except OSError:
        return f"{_NO_DEVICE} (no NVIDIA driver: {lib} not found)"
    try:
        init, count_of = driver.cuInit, driver.cuDeviceGetCount
    except AttributeError:
        return f"{_NO_DEVICE} ({lib} is not an NVIDIA driver: no cuInit)"
    code = init(0)
    if code == 100:  # CUDA_ERROR_NO_DEVICE (also what CUDA_VISIBLE_DEVICES="" gives)
        return f"{_NO_DEVICE} (the NVIDIA driver reports none)"
    if code != 0:  # e.g. 999 unknown, 35 the driver older than the library: a device may be there; let the runtime say
        return None
    count = ctypes.c_int(0)
    if count_of(ctypes.byref(count)) == 0 and count.value == 0:
        return f"{_NO_DEVICE} (the NVIDIA driver reports 0 devices)"
    return None
