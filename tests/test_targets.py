"""Deployment targets (``--target portable|ort-cpu|ort-cuda``): one option picks lowering, cache layout, dtype and
weights for a runtime; an option that contradicts it is refused before any work; the files it writes are what it
says and verify proves them."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from mhaexport.cli import main
from mhaexport.core.errors import ConfigError
from mhaexport.exporter.targets import TARGETS, conflicts, deploy_target


def test_each_target_names_its_choices_and_portable_is_the_default_export():
    assert set(TARGETS) == {"portable", "ort-cpu", "ort-cuda"}
    assert TARGETS["portable"].options == {"attention": "decomposed", "kv_cache": "concat", "dtype": "float32"}
    assert TARGETS["portable"].weights is None  # the defaults of `mhaexport onnx`: the article's graph
    cpu = deploy_target("ort-cpu")
    assert (cpu.attention, cpu.kv_cache, cpu.dtype, cpu.weights) == ("fused", "shared", "float32", "int4")
    assert deploy_target("ort-cuda").dtype == "float16"
    with pytest.raises(ConfigError, match="unknown deployment target 'tpu'; known: portable, ort-cpu, ort-cuda"):
        deploy_target("tpu")
    assert conflicts(cpu, {"attention": "fused", "dtype": "float16"}) == ["--dtype float16 (ort-cpu sets float32)"]


@pytest.mark.parametrize("args, says", [
    (["onnx", "--target", "ort-cuda", "--dtype", "float32"], "--target ort-cuda and --dtype float32 (ort-cuda sets "
                                                             "float16): give one or the other"),
    (["onnx", "--target", "ort-cpu", "--kv-cache", "concat"], "--kv-cache concat (ort-cpu sets shared)"),
    (["all", "--target", "ort-cpu", "--attention", "ort"], "--attention ort (ort-cpu sets fused)"),
    (["onnx", "--target", "tpu"], "Invalid value for '--target'"),
])
def test_a_contradicting_option_is_refused_before_any_work(tmp_path, args, says):
    r = CliRunner().invoke(main, [*args, "--config", "tiny", "-o", str(tmp_path / "out")])
    assert r.exit_code == 2 and says in r.output and "Traceback" not in r.output, r.output
    assert not (tmp_path / "out").exists()


def test_an_option_the_target_agrees_with_is_accepted(tmp_path, monkeypatch):
    from mhaexport.verbs import export  # where export_onnx_target finds export_onnx

    seen = {}

    def fake_export(output, **kw):
        seen.update(kw)
        raise ConfigError("stop here")

    monkeypatch.setattr(export, "export_onnx", fake_export)
    r = CliRunner().invoke(main, ["onnx", "--target", "ort-cuda", "--dtype", "float16", "--config", "tiny", "-o",
                                  str(tmp_path / "out")])
    assert r.exit_code == 2 and "stop here" in r.output, r.output
    assert (seen["attention"], seen["kv_cache"], seen["dtype"]) == ("fused", "shared", "float16")


@pytest.mark.slow  # an export with ort_fusions, int4, TorchScript and a verify of the tiny model (~25-40 s here)
def test_all_target_ort_cpu_writes_a_verified_int4_fused_shared_file(tmp_path):
    out = tmp_path / "cpu"
    r = CliRunner().invoke(main, ["-q", "all", "--config", "tiny", "--target", "ort-cpu", "-o", str(out),
                                  "--json"])
    assert r.exit_code == 0, r.output
    report = json.loads(r.stdout)
    assert report["verdict"]["status"] == "passed"
    onnx = json.loads((out / "manifest.json").read_text())["artifacts"]["onnx"]
    text = json.dumps(onnx)
    assert '"attention": "fused"' in text and "int4" in text and "shared" in text
    assert (tmp_path / "cpu-float32" / "model.onnx").is_file()  # the float source, for the weights' recipe re-run
    checks = report["results"]["ort-cpu"]
    assert checks["quality"]["status"] is True and checks["weights"]["status"] is True  # the int4 gate and recipe
    assert report["results"]["torchscript"]["parity"]["status"] is True
