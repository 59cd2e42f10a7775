"""The Python API (mhaexport/api.py, re-exported lazily at the top level): called directly on the session's tiny
export; the README's Python example is run as written (slow: it exports ONNX)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

import mhaexport
from mhaexport.cli import main
from mhaexport.errors import ArtifactError, ConfigError, ModelLoadError, RuntimeInputError

ROOT = Path(__file__).resolve().parent.parent


def test_import_stays_light_and_the_api_is_at_the_top_level():
    code = ("import sys, mhaexport; f = mhaexport.export_onnx; "
            "assert 'torch' not in sys.modules and 'onnxruntime' not in sys.modules, sorted(sys.modules); "
            "print(sorted(n for n in mhaexport.__all__ if not n.startswith('_')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == str(["MhaExportError", "bench", "export_onnx", "export_torchscript", "generate", "load",
                               "quantize", "verify"])
    help_ = subprocess.run([sys.executable, "-c", "import sys; from mhaexport.cli import main\n"
                            "try: main(['--help'])\nexcept SystemExit: pass\n"
                            "assert 'torch' not in sys.modules and 'mhaexport.api' not in sys.modules"],
                           capture_output=True, text=True)
    assert help_.returncode == 0, help_.stderr


def test_verify_and_bench_are_callable_packages():
    import mhaexport.verify as package
    from mhaexport.verify import verify_folder

    assert mhaexport.verify is package and callable(package) and package.verify_folder is verify_folder
    assert callable(mhaexport.bench) and mhaexport.bench.BenchConfig


def test_verify_returns_a_report_truthy_only_when_it_passed(tiny_export, tmp_path):
    report = mhaexport.verify(tiny_export, runtimes=["ort-cpu"], output=tmp_path, junit=tmp_path / "v.xml")
    assert report and report.verdict.code == 0 and report.results["ort-cpu"]["parity"]
    assert (tmp_path / "report.json").is_file() and (tmp_path / "v.xml").is_file()
    # the CLI's verdict on the same folder and runtimes is the API's
    r = CliRunner().invoke(main, ["verify", str(tiny_export), "--runtime", "ort-cpu", "-o", str(tmp_path / "cli")])
    assert r.exit_code == report.verdict.code
    failed = mhaexport.verify(tiny_export, runtimes=["ort-cpu"], atol=0.0, rtol=0.0)
    assert not failed and failed.verdict.code == 1 and "ort-cpu/parity" in failed.verdict.message


def test_a_requested_runtime_that_cannot_run_is_a_falsy_report(tiny_export):
    from mhaexport.runtime.session import provider_unavailable

    if provider_unavailable("cuda") is None:
        pytest.skip("ONNX Runtime's CUDA provider really runs here")
    report = mhaexport.verify(tiny_export, runtimes=["ort-cuda"])
    assert not report and report.verdict.code == 4 and report.counts["failed"] == 0


def test_bad_input_raises_the_packages_exceptions(tiny_export, tmp_path):
    with pytest.raises(ArtifactError):
        mhaexport.verify(tmp_path / "missing")
    with pytest.raises(ConfigError, match="unknown runtime"):
        mhaexport.verify(tiny_export, runtimes=["ort-tpu"])
    with pytest.raises(ConfigError, match="give one of"):
        mhaexport.export_torchscript(tmp_path / "x", config="tiny", model="pkg:f")
    with pytest.raises(ConfigError):
        mhaexport.export_onnx(tmp_path / "x", config="no-such-preset")
    with pytest.raises(ModelLoadError):
        mhaexport.load(model="no_such_module_here:build")
    with pytest.raises(RuntimeInputError, match="prompt"):
        mhaexport.generate(tiny_export)


def test_generate_bench_quantize_and_torchscript(tiny, tiny_export, tmp_path):
    from mhaexport.runtime import GenerationConfig, Generator

    result = mhaexport.generate(tiny_export, prompt_ids=[[5, 17, 42]], max_new_tokens=4)
    direct = Generator(tiny_export).generate([[5, 17, 42]], GenerationConfig(max_new_tokens=4))
    assert result.tokens == direct.tokens and result.stop_reason == "max_new_tokens"
    timing = mhaexport.bench(tiny_export, output=tmp_path / "bench", runtimes=["ort-cpu"], prompt_len=4,
                             new_tokens=4, repeats=1, long=0)
    assert timing.get("ort-cpu").token_p50_ms > 0 and (tmp_path / "bench" / "bench.json").is_file()
    from mhaexport.bench import markdown_body

    assert "\n| ort-cpu [attention=decomposed float32] | CPUExecutionProvider |" in markdown_body(timing)
    q = mhaexport.quantize(tiny_export, tmp_path / "int8", weights="int8")
    manifest = json.loads((q.folder / "manifest.json").read_text())
    assert manifest["artifacts"]["onnx"]["quantization"]["label"].startswith("int8")
    rec = mhaexport.export_torchscript(tmp_path / "ts", model=tiny)  # a LoadedModel is taken as it is
    assert rec.files == ["model.pt"]


def readme_block(marker: str) -> str:
    m = re.search(rf"<!-- {re.escape(marker)}[^>]*-->\s*```\w*\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    assert m, f"README.md has no block after <!-- {marker} -->"
    return m.group(1)


@pytest.mark.slow
def test_the_readmes_python_example_runs(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    exec(compile(readme_block("python example"), "README.md (python example)", "exec"), {})
    out = capsys.readouterr().out
    assert "max abs" in out and "max_new_tokens" in out
    assert (tmp_path / "out-int4" / "manifest.json").is_file()
