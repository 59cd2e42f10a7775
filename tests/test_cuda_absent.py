"""On a machine without a CUDA device, every CUDA runtime is skipped with that sentence — not with the CUDA
library a CUDA build of ONNX Runtime could not load — and the check that says so asks the NVIDIA driver."""

from __future__ import annotations

import ctypes

import pytest

from mhaexport.core import devices as env
from mhaexport.runtime import session


@pytest.fixture
def fresh(monkeypatch):
    """Forget this process's answers (the driver's and the provider probe's) for the test, and restore them after."""
    monkeypatch.setattr(env, "_cuda_probe", [])
    monkeypatch.setattr(session, "_probed", {})


class FakeDriver:
    def __init__(self, init: int, count: int) -> None:
        self.init_code, self.count = init, count

    def cuInit(self, flags: int) -> int:  # noqa: N802 - the driver's name
        return self.init_code

    def cuDeviceGetCount(self, out) -> int:  # noqa: N802
        out._obj.value = self.count
        return 0


def _driver(monkeypatch, result):
    def cdll(name):
        if isinstance(result, Exception):
            raise result
        return result
    monkeypatch.setattr(ctypes, "CDLL", cdll)
    monkeypatch.setattr("sys.platform", "linux")


@pytest.mark.parametrize("driver, expected", [
    (OSError("libcuda.so.1: cannot open shared object file"), "no NVIDIA driver: libcuda.so.1 not found"),
    (FakeDriver(100, 0), "the NVIDIA driver reports none"),
    (FakeDriver(0, 0), "the NVIDIA driver reports 0 devices"),
])
def test_no_device_is_said_with_how_it_is_known(fresh, monkeypatch, driver, expected):
    _driver(monkeypatch, driver)
    assert env.no_cuda_device() == f"no CUDA device on this machine ({expected})"


@pytest.mark.parametrize("driver", [FakeDriver(0, 1), FakeDriver(999, 0)])
def test_a_device_or_a_driver_error_leaves_the_reason_to_the_runtime(fresh, monkeypatch, driver):
    _driver(monkeypatch, driver)
    assert env.no_cuda_device() is None


def test_asked_once_per_process(fresh, monkeypatch):
    calls = []
    monkeypatch.setattr(env, "_ask_cuda_driver", lambda: calls.append(1) or "no CUDA device on this machine (x)")
    assert env.no_cuda_device() == env.no_cuda_device() and len(calls) == 1


def test_ort_cuda_without_a_device_says_so_not_a_library_error(fresh, monkeypatch):
    monkeypatch.setattr(env, "_cuda_probe", ["no CUDA device on this machine (no NVIDIA driver: libcuda.so.1 not "
                                             "found)"])
    started = []
    monkeypatch.setattr(session, "_create_session", lambda *a, **k: started.append(a))
    why = session.provider_unavailable("cuda")
    assert why == ("CUDAExecutionProvider requested; no CUDA device on this machine (no NVIDIA driver: libcuda.so.1 "
                   "not found)")
    assert "cannot open shared object" not in why and not started  # no session tried, no library chatter


def test_with_a_device_the_runtime_reason_is_kept(fresh, monkeypatch):
    monkeypatch.setattr(env, "_cuda_probe", [None])
    monkeypatch.setattr(session.ort, "get_available_providers", lambda: ["CPUExecutionProvider"])
    assert "this onnxruntime build" in session.provider_unavailable("cuda")


def test_this_machine_agrees_with_what_the_runtimes_report():
    """Where the driver says there is no device, ONNX Runtime's CUDA provider does not run either (the check never
    hides a working GPU)."""
    if env.no_cuda_device() is None:
        pytest.skip("a CUDA device is here")
    assert session.provider_unavailable("cuda").startswith("CUDAExecutionProvider requested; no CUDA device")


def test_cuda_sessions_run_float32_without_tf32(monkeypatch):
    """onnxruntime's CUDA provider runs float32 MatMul in TF32 by default (~1e-3 off: ort-cuda failed parity on an
    H200, docs/measurements/gpu-check-2026-12-04.md): every session asks CUDA for use_tf32=0, CPU for nothing."""
    import onnxruntime as ort

    from mhaexport.runtime import session

    seen = {}

    class Fake:
        def __init__(self, source, sess_options=None, providers=None, provider_options=None):
            seen.update(providers=providers, provider_options=provider_options)

        def get_providers(self):
            return list(seen["providers"])

    monkeypatch.setattr(session.ort, "InferenceSession", Fake)
    session._create_session(b"model", [session.CUDA, session.CPU], ort.SessionOptions())
    assert seen["provider_options"] == [{"use_tf32": "0"}, {}]
    session._create_session(b"model", [session.CPU], ort.SessionOptions())
    assert seen["provider_options"] == [{}]
