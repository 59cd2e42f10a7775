"""The install: ONNX Runtime chosen at install ([cpu]: onnxruntime, [gpu]: onnxruntime-gpu), never both, and an
install with neither told in one line (exit 2) instead of a traceback."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from click.testing import CliRunner

from mhaexport.cli import main

ROOT = Path(__file__).resolve().parent.parent


def _project() -> dict:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def test_onnx_runtime_is_chosen_at_install_cpu_or_gpu():
    project = _project()
    base = " ".join(project["dependencies"])
    assert "onnxruntime" not in base  # a CPU user's install pulls no CUDA provider library
    extras = project["optional-dependencies"]
    assert [d.split(">")[0] for d in extras["cpu"]] == ["onnxruntime"]
    assert [d.split(">")[0] for d in extras["gpu"]] == ["onnxruntime-gpu"]
    for name, deps in extras.items():  # no extra brings a second onnxruntime module beside the chosen one
        assert not any(d.startswith("onnxruntime-gpu") or d.startswith("onnxruntime>") for d in deps) \
            or name in ("cpu", "gpu"), name
    ci = (ROOT / ".ci" / "run").read_text()
    # CI installs the CPU runtime (plus the site's [docs]), never [gpu] beside it
    assert re.search(r"pip install -e '\.\[cpu,test(,docs)?(,browser)?\]'", ci) and "'.[gpu" not in ci
    assert "pip install --no-deps onnxruntime-genai" in ci


def test_without_onnx_runtime_the_cli_says_how_to_install_it(monkeypatch, tmp_path):
    from mhaexport import api

    def missing(*a, **k):
        raise ModuleNotFoundError("No module named 'onnxruntime'", name="onnxruntime")

    monkeypatch.setattr(api, "generate", missing)
    monkeypatch.setattr(api, "bench", missing)
    r = CliRunner().invoke(main, ["bench", str(tmp_path), "--runtimes", "ort-cpu"])
    assert r.exit_code == 2, r.output
    assert "ONNX Runtime is not installed: pip install -e '.[cpu]'" in r.output and "Traceback" not in r.output


def test_both_onnx_runtimes_installed_is_warned_about(monkeypatch, tmp_path):
    import importlib.metadata

    from mhaexport.core import env

    real = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version",
                        lambda d: {"onnxruntime": "1.32.0", "onnxruntime-gpu": "1.31.1"}.get(d) or real(d))
    line = env.onnxruntime_clash()
    assert line.startswith("both onnxruntime 1.32.0 and onnxruntime-gpu 1.31.1 are installed")
    r = CliRunner().invoke(main, ["report", "merge", str(tmp_path / "none.json"), "-o", str(tmp_path / "o")])
    assert f"warning: {line}" in r.stderr
