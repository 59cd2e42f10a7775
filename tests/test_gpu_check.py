"""scripts/gpu_check.sh, tested where it can be without a GPU: its arguments, and its refusal to go on (exit 4,
nothing written) when CUDA does not really run — a CPU fallback is never reported as a GPU result."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mhaexport.core.devices import no_cuda_device
from mhaexport.runtime.session import provider_unavailable

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "gpu_check.sh"


def _run(*args: str, tmp: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHON": sys.executable}
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=120, env=env,
                          cwd=tmp)


def test_bad_arguments_exit_2_with_the_usage(tmp_path):
    res = _run("--bogus", tmp=tmp_path)
    assert res.returncode == 2 and "unknown option --bogus" in res.stderr and "usage: scripts/gpu_check.sh" in res.stderr
    res = _run("--wheel", str(tmp_path / "nope.whl"), tmp=tmp_path)
    assert res.returncode == 2 and "nope.whl does not exist" in res.stderr
    assert _run("--help", tmp=tmp_path).returncode == 0


@pytest.mark.skipif(provider_unavailable("cuda") is None, reason="CUDA really runs here: the GPU run would start")
def test_without_cuda_it_stops_before_anything_and_never_reports_a_fallback(tmp_path):
    out = tmp_path / "gpu"
    res = _run("--skip-install", "-o", str(out), tmp=tmp_path)
    assert res.returncode == 4, res.stderr
    why = no_cuda_device() or "session runs on ['CPUExecutionProvider']"
    assert f"gpu_check: ONNX Runtime does not run on CUDA here: CUDAExecutionProvider requested; {why}" in res.stderr
    assert not out.exists() and "verify" not in res.stdout
    assert "Failed to load" not in res.stdout + res.stderr  # ONNX Runtime's preload chatter stays out of the output


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="nvidia-smi is here: the install would start")
def test_without_a_gpu_it_installs_nothing(tmp_path):
    """Before pip installs onnxruntime-gpu (~340 MB) or a --wheel: no nvidia-smi listing a GPU, exit 4."""
    out = tmp_path / "gpu"
    res = _run("-o", str(out), tmp=tmp_path)
    assert res.returncode == 4, res.stderr
    assert "gpu_check: no NVIDIA GPU here (nvidia-smi is missing or lists none): nothing installed" in res.stderr
    assert "== install" not in res.stderr and not out.exists()
