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
from mhaexport.core.errors import ArtifactError, ConfigError, ModelLoadError, RuntimeInputError

ROOT = Path(__file__).resolve().parent.parent


def test_import_stays_light_and_the_api_is_at_the_top_level():
    code = ("import sys, mhaexport; f = mhaexport.export_onnx; "
            "assert 'torch' not in sys.modules and 'onnxruntime' not in sys.modules, sorted(sys.modules); "
            "print(sorted(n for n in mhaexport.__all__ if not n.startswith('_')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == str(["MhaExportError", "adopt", "bench", "bisect_folder", "check_junit", "check_threads",
                               "eval_verdict", "evaluate", "export_onnx", "export_onnx_target", "export_pt2",
                               "export_torchscript", "generate", "lint", "lint_verdict", "load", "merge_reports",
                               "quantize", "target_options", "verify", "verify_run", "write_reports"])  # all: not in __all__
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
    from mhaexport.evaluate.perplexity import evaluate_folder  # eval's subpackage, and mhaexport.evaluate the API's

    assert callable(mhaexport.evaluate) and mhaexport.evaluate.perplexity.evaluate_folder is evaluate_folder


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
    text = "\n".join(p.read_text() for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))])
    m = re.search(rf"<!-- {re.escape(marker)}[^>]*-->\s*```\w*\n(.*?)```", text, re.S)
    assert m, f"README.md and docs/*.md have no block after <!-- {marker} -->"
    return m.group(1)


@pytest.mark.slow
def test_the_readmes_python_example_runs(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    exec(compile(readme_block("python example"), "README.md (python example)", "exec"), {})
    out = capsys.readouterr().out
    assert "max abs" in out and "max_new_tokens" in out
    assert (tmp_path / "out" / "api-int4" / "manifest.json").is_file()  # under out/, not beside the checkout's files


# --- issue 26, "the Python API surprises": what help() shows, the CLI's names, list arguments, one error family ---

def test_help_and_signature_are_the_api_functions_not_the_subpackages(monkeypatch):
    import inspect
    import pydoc

    from mhaexport import api

    for name in ("verify", "bench"):
        view, function = getattr(mhaexport, name), getattr(api, name)
        assert inspect.signature(view) == inspect.signature(function) != inspect.signature(lambda *a, **k: None)
        assert view.__doc__ == function.__doc__ and view.__wrapped__ is function and view.__name__ == name
        text = pydoc.render_doc(view, renderer=pydoc.plaintext)
        assert f"{name}(folder: 'str | Path'" in text and "PACKAGE CONTENTS" not in text, text[:400]
    assert "``mhaexport verify FOLDER``" in pydoc.render_doc(mhaexport.verify, renderer=pydoc.plaintext)
    # the subpackage's attributes stay reachable through the same name, and patching them patches the subpackage
    package = sys.modules["mhaexport.verify"]
    assert mhaexport.verify.verify_folder is package.verify_folder and mhaexport.verify.report is package.report
    monkeypatch.setattr(mhaexport.verify, "verify_folder", "patched")
    assert package.verify_folder == "patched"


def test_import_mhaexport_resolves_only_the_mapped_subpackages():
    mapped = ("core", "artifact", "models", "exporter", "verify", "runners", "runtime", "bench", "diagnose", "evaluate")
    code = ("import importlib.util as u, sys\n"
            f"for name in {mapped!r}:\n"
            "    spec = u.find_spec('mhaexport.' + name)\n"
            "    assert spec and spec.origin.endswith(name + '/__init__.py'), (name, spec)\n"
            "for name in ('tests', 'scripts', 'docs', 'examples'):\n"
            "    assert u.find_spec('mhaexport.' + name) is None, name\n"
            "try:\n    import mhaexport.tests\nexcept ModuleNotFoundError:\n    pass\n"
            "else:\n    sys.exit('mhaexport.tests imported')\n")
    # from the repo root: with the editable install's finder, and (-S: no site-packages) through the checkout alone
    for flags in ([], ["-S"]):
        r = subprocess.run([sys.executable, *flags, "-c", code], cwd=ROOT, capture_output=True, text=True)
        assert r.returncode == 0, (flags, r.stderr[-2000:])


def _cli_option(param) -> str:
    return max(param.opts, key=len).lstrip("-").replace("-", "_")


# a repeated CLI option (--runtime X --runtime Y) is one list argument in the plural
PLURAL = {"runtime": "runtimes", "provider": "providers", "prompt": "prompts"}
# options with no argument of that name in the API, and why: -q (the API takes progress=), --json (printing),
# --text (verify: in quality=QualitySettings; eval: the text's bytes, read by the CLI), --max-bytes (the CLI's cap on
# what it reads), --bisect (verify's diagnosis: api.bisect_folder, which takes --case), CLI compositions the API spells as
# calls of its own (--target: export_onnx, then quantize)
CLI_ONLY = {"quiet", "json", "text", "max_bytes", "bisect", "target"}


@pytest.mark.parametrize("verb, function", [("onnx", "export_onnx"), ("torchscript", "export_torchscript"),
                                             ("pt2", "export_pt2"), ("verify", "verify"), ("generate", "generate"),
                                             ("bench", "bench"), ("quantize", "quantize"), ("eval", "evaluate"),
                                             ("all", "all")])
def test_every_cli_option_has_its_name_in_the_api(verb, function):
    import dataclasses
    import inspect

    import click

    from mhaexport import api
    from mhaexport.bench import BenchConfig

    params = set(inspect.signature(getattr(api, function)).parameters)
    if verb == "bench":  # its keywords are BenchConfig's fields, long_to under the CLI's name
        params |= {f.name for f in dataclasses.fields(BenchConfig)} - {"long_to"} | {"long"}
    if verb == "verify":  # --bisect calls api.bisect_folder: its --case is that function's
        params |= set(inspect.signature(api.bisect_folder).parameters)
    options = [_cli_option(p) for p in main.commands[verb].params if isinstance(p, click.Option)]
    missing = [o for o in options if PLURAL.get(o, o) not in params and o not in CLI_ONLY]
    assert not missing, f"mhaexport {verb} options the API calls otherwise or lacks: {missing}"


def test_old_names_are_deprecated_aliases_and_both_names_are_a_config_error(tiny_export, monkeypatch):
    import warnings

    seen = []
    monkeypatch.setattr(mhaexport.verify, "verify_folder", lambda folder, **kw: seen.append(kw) or "report")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the CLI's names warn nothing
        mhaexport.verify(tiny_export, tokens=3, runtimes="ort-cpu")
    with pytest.warns(DeprecationWarning, match=r"gen_tokens= is deprecated: use tokens= \(the CLI's --tokens\)"):
        mhaexport.verify(tiny_export, gen_tokens=5)
    assert [kw["gen_tokens"] for kw in seen] == [3, 5] and seen[0]["runtimes"] == ("ort-cpu",)
    with pytest.raises(ConfigError, match="give tokens= or its deprecated alias gen_tokens=, not both"):
        mhaexport.verify(tiny_export, tokens=3, gen_tokens=3)

    configs = []
    import types

    monkeypatch.setattr(mhaexport.bench, "run_bench", lambda folder, cfg, progress=None, reads=None:
                        configs.append(cfg) or types.SimpleNamespace(notes=[]))
    mhaexport.bench(tiny_export, long=0, runtimes="ort-cpu", compare=tiny_export, opt_levels="basic")
    with pytest.warns(DeprecationWarning, match="long_to= is deprecated: use long="):
        mhaexport.bench(tiny_export, long_to=40)
    assert [c.long_to for c in configs] == [0, 40]
    assert (configs[0].runtimes, configs[0].compare, configs[0].opt_levels) == (("ort-cpu",), (tiny_export,),
                                                                               ("basic",))
    with pytest.raises(ConfigError, match="give long= or its deprecated alias long_to=, not both"):
        mhaexport.bench(tiny_export, long=0, long_to=0)


def test_a_bare_string_in_a_list_argument_is_one_item(tiny_export, tmp_path, monkeypatch):
    from mhaexport.exporter import quantize as quantize_module

    # one runtime name, not its characters (they were: "unknown runtime(s) o, r, t, -, c, p, u")
    with pytest.raises(ConfigError, match=r"unknown runtime\(s\) ort-tpu;"):
        mhaexport.verify(tiny_export, runtimes="ort-tpu")
    with pytest.raises(ConfigError, match=r"unknown runtime\(s\) ort-tpu;"):
        mhaexport.bench(tiny_export, runtimes="ort-tpu")
    one = mhaexport.generate(tiny_export, "hi", max_new_tokens=2, providers="cpu")
    assert one.tokens == mhaexport.generate(tiny_export, ["hi"], max_new_tokens=2).tokens and len(one.tokens) == 1
    # prompt_ids: one flat list of ids is one prompt; a string is not ids
    flat = mhaexport.generate(tiny_export, prompt_ids=[5, 17, 42], max_new_tokens=2)
    assert flat.tokens == mhaexport.generate(tiny_export, prompt_ids=[[5, 17, 42]], max_new_tokens=2).tokens
    with pytest.raises(ConfigError, match=r"prompt_ids='5,17': expected lists of token ids"):
        mhaexport.generate(tiny_export, prompt_ids="5,17")
    with pytest.raises(ConfigError, match=r"prompt_ids: 'ab' is not a list of token ids"):
        mhaexport.generate(tiny_export, prompt_ids=[[1], "ab"])
    seen = []
    monkeypatch.setattr(quantize_module, "quantize_folder", lambda src, out, cfg, progress=None: seen.append(cfg))
    mhaexport.quantize(tiny_export, tmp_path / "q", keep_float="lm_head")
    assert seen[0].keep_float == ("lm_head",)
    with pytest.raises(ConfigError, match="keep_float: 1 is not a name"):
        mhaexport.quantize(tiny_export, tmp_path / "q", keep_float=[1])
    with pytest.raises(ConfigError, match="runtimes=3: expected a list of names"):
        mhaexport.verify(tiny_export, runtimes=3)


def _bad_arguments(folder, out):
    m = mhaexport
    return [
        (lambda: m.load(config="no-such-preset"), "unknown config 'no-such-preset'"),
        (lambda: m.export_onnx(out, config="tiny", attention="flash"), "--attention 'flash': expected one of"),
        (lambda: m.export_onnx(out, config="tiny", dtype="float8"), "--dtype 'float8'"),
        (lambda: m.export_onnx(out, config="tiny", opset=3), "outside the supported range"),
        (lambda: m.export_onnx(out, config="tiny", kv_cache="ring"), "--kv-cache 'ring'"),
        (lambda: m.export_onnx(out, config="tiny", seq_dynamic=False, seq_len=4, past_len=-1), "--past-len -1"),
        (lambda: m.export_torchscript(out, config="tiny", mode="compile"), "--mode 'compile'"),
        (lambda: m.verify(folder, sweep="huge"), "sweep 'huge': expected one of quick, full"),
        (lambda: m.verify(folder, tokens=0), "tokens=0: expected an integer >= 1"),
        (lambda: m.verify(folder, atol=-1.0), "atol: -1.0 is not a tolerance"),
        (lambda: m.verify(folder, rtol={"hidden": 1e-3}), "rtol: output 'hidden' is not one of logits, present"),
        (lambda: m.generate(folder), "give prompts"),
        (lambda: m.generate(folder, prompt_ids=[[1]], max_new_tokens=0), "max_new_tokens must be >= 1"),
        (lambda: m.generate(folder, prompt_ids=[[1]], top_p=2.0), "top_p must be in"),
        (lambda: m.generate(folder, prompt_ids=[[1]], eos_id=-1), "eos_id=-1"),
        (lambda: m.generate(folder, prompt_ids=[[1]], threads=0), "threads=0"),
        (lambda: m.bench(folder, runtimes=["ort-tpu"]), "unknown runtime"),
        (lambda: m.bench(folder, new_tokens=1), "new_tokens=1: at least 2"),
        (lambda: m.bench(folder, prompt_len=0), "prompt_len=0: expected an integer >= 1"),
        (lambda: m.bench(folder, repeats=0), "repeats=0"),
        (lambda: m.bench(folder, runtimes=["ort-cpu"], prompt_len=100, new_tokens=64),
         "exceeds the model's max_positions"),  # both given: a default would shrink, a given length does not
        (lambda: m.quantize(folder, out, weights="int3"), "--weights 'int3'"),
        (lambda: m.bench(folder, lowerings="flash"), "--lowerings 'flash': expected ATTENTION[:DTYPE]"),
        (lambda: m.bench(folder, quantize=["int4", "int3"]), "--weights 'int3'"),
        (lambda: m.bench(folder, builder="fp8"), "--builder 'fp8'"),
        (lambda: m.export_onnx(out, config="tiny", mask="none"), "--mask applies to --module attention"),
        (lambda: m.export_torchscript(out, config="tiny", module="attention", model="x.py:f"), "are decoders"),
        (lambda: m.bisect_folder(folder, case=(0, 3, 2)), "batch and sequence must be >= 1"),
        (lambda: m.evaluate(folder, runtimes="ort-tpu"), "unknown runtime(s) ort-tpu"),
    ]


def test_every_bad_argument_is_a_config_error(tiny_export, tmp_path):
    from mhaexport.core.errors import ExportError

    for call, match in _bad_arguments(tiny_export, tmp_path / "out"):
        with pytest.raises(ConfigError, match=re.escape(match)):
            call()
    # the classes they had before still catch them
    with pytest.raises(ExportError):
        mhaexport.export_onnx(tmp_path / "out", config="tiny", attention="flash")
    with pytest.raises(RuntimeInputError):
        mhaexport.generate(tiny_export)


def test_bisect_and_evaluate_are_api_functions(tiny_export):
    """verify --bisect and eval as the API's functions: records, no printing, the folder opened once."""
    run = mhaexport.bisect_folder(tiny_export, case=[1, 3, 2])
    assert run and run.followed is None and run.report.ok and run.report.shapes["seq"] == 3
    assert "bisect" in run.summary().lower()
    report = mhaexport.evaluate(tiny_export, b"the quick brown fox jumps over the lazy dog " * 4, window=32)
    assert [r.runtime for r in report.rows] == ["ort-cpu"] and report.rows[0].status == "ran"


def test_py_typed_ships_in_the_wheel(tmp_path):
    import tomllib
    import zipfile

    pytest.importorskip("setuptools")
    assert (ROOT / "mhaexport" / "py.typed").is_file()
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    assert "py.typed" in data["mhaexport"]
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", str(ROOT),
                        "-w", str(tmp_path)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    (wheel,) = tmp_path.glob("mhaexport-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "mhaexport/py.typed" in names and "mhaexport/verify/__init__.py" in names


def test_an_export_over_another_model_needs_replace_in_the_api_too(tmp_path):
    """The API refuses what the CLI refuses (issue 25: outputs never clobber inputs) and takes the CLI's --replace."""
    from mhaexport.artifact import read_manifest
    from mhaexport.core.errors import ExportError

    out = tmp_path / "out"
    mhaexport.export_torchscript(out, config="tiny")
    with pytest.raises(ExportError, match="--replace"):
        mhaexport.export_torchscript(out, config="tiny-llama")
    assert read_manifest(out).model.spec == "preset:tiny"
    mhaexport.export_torchscript(out, config="tiny-llama", replace=True)
    assert read_manifest(out).model.spec == "preset:tiny-llama"
