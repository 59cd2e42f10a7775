"""A file whose weights do not fit this process's memory is generated from with its weights memory-mapped
(runtime/engine.py ``weights_too_large``), on mhaexport's loop, said in a warning — not loaded whole and killed by the
kernel midway; onnxruntime-genai's loop, which loads them whole, is refused in one line when asked for."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from mhaexport.artifact import ExportFolder
from mhaexport.artifact.details import onnx_weights
from mhaexport.cli import main
from mhaexport.core import machine
from mhaexport.core.errors import RuntimeOptionError
from mhaexport.runtime import GenerationConfig
from mhaexport.core.machine import BASELINE_BYTES
from mhaexport.runtime.engine import open_generator


@pytest.fixture
def external(tiny_lowered):
    """The tiny model's export whose weights are external data (tests/conftest.py), and their bytes."""
    folder = tiny_lowered["ort"]
    with ExportFolder.open(folder, "onnx") as ef:
        weights, mappable = onnx_weights(ef)
    assert mappable and weights > 0
    return folder, weights


def _memory(monkeypatch, n):
    monkeypatch.setattr(machine, "machine_memory", lambda: (n, "the cgroup's memory limit"))


def _tokens(gen):
    return gen.generate([[5, 17, 42], [9, 1]], GenerationConfig(max_new_tokens=6)).tokens


def test_weights_that_do_not_fit_are_mapped_and_generate_the_same_tokens(external, monkeypatch):
    folder, weights = external
    _memory(monkeypatch, weights + BASELINE_BYTES)  # just fits: loaded whole
    whole = open_generator(folder, engine="mhaexport")
    assert whole.runner.config.mmap_weights is False and not any("memory-mapped" in w for w in whole.warnings)
    want = _tokens(whole)

    _memory(monkeypatch, weights + BASELINE_BYTES - 1)
    for engine in ("auto", "mhaexport"):
        gen = open_generator(folder, engine=engine)
        assert gen.engine == "mhaexport" and gen.runner.config.mmap_weights is True
        assert any("do not fit" in w and "memory-mapped" in w for w in gen.warnings)
        if engine == "auto":
            assert "do not fit" in gen.engine_reason and "loads them whole" in gen.engine_reason
        assert _tokens(gen) == want


def test_onnxruntime_genai_asked_for_weights_that_do_not_fit_is_refused(external, monkeypatch):
    folder, weights = external
    _memory(monkeypatch, weights // 2)
    with pytest.raises(RuntimeOptionError, match="loads them whole; engine='mhaexport' maps them"):
        open_generator(folder, engine="onnxruntime-genai")
    res = CliRunner().invoke(main, ["generate", str(folder), "--prompt-ids", "5,17", "--max-new-tokens", "2",
                                    "--engine", "onnxruntime-genai"])
    assert res.exit_code == 2 and "--engine mhaexport maps them" in res.output, res.output


def test_the_cli_says_the_weights_are_mapped(external, monkeypatch):
    folder, weights = external
    _memory(monkeypatch, weights // 2)
    res = CliRunner().invoke(main, ["generate", str(folder), "--prompt-ids", "5,17", "--max-new-tokens", "2"])
    assert res.exit_code == 0, res.output
    assert "memory-mapped" in res.output and "do not fit" in res.output
