"""verify's ort-genai runtime: onnxruntime-genai's own generator on the folder, as deployed. Healthy folders pass
(our concat and shared layouts, float16, the builder's fp32 and int4 files in the slow set); a config that makes its
loop feed the file differently fails on the loop's own checks; without onnxruntime-genai it is skipped, never
passed."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from mhaexport.cli import main
from mhaexport.runtime.genai import GenAIUnavailable
from mhaexport.verify import verify_folder
from mhaexport.verify.render import markdown
from planted.edit import edited_genai_config as edited

pytest.importorskip("onnxruntime_genai")

GENAI = ("ort-genai",)
OWN_CHECKS = ("parity", "finite", "causality", "kv-consistency", "padding", "generation", "genai-config")




def assert_healthy(report) -> None:
    res = report.results["ort-genai"]
    assert report.runtimes["ort-genai"].status == "ran", report.runtimes["ort-genai"]
    judged = [ch for ch in OWN_CHECKS if res[ch].status is not None]
    assert all(res[ch].status is True for ch in judged) and len(judged) >= 5, {c: r.message for c, r in res.items()}
    if "causality" in res:
        assert res["causality"].status is None and "n/a" in res["causality"].message  # not run, never passed


def test_a_healthy_folder_passes_in_onnxruntime_genais_loop_and_it_is_a_default(tiny, tiny_export):
    report = verify_folder(tiny_export, loaded=tiny, checks=("parity", "padding", "generation", "genai-config"))
    assert "ort-genai" in report.runtimes and report.verdict.code == 0, markdown(report)
    res = report.results["ort-genai"]
    assert res["parity"].status is True and "prefill and every decode step of 5 rows" in res["parity"].message
    assert res["padding"].status is True and res["generation"].figures["tokens"] > 0


@pytest.mark.parametrize("edit, check, says", [
    # onnxruntime-genai binds one buffer as past and present: the concat graph's Concat cannot write it
    (lambda c: c["search"].update(past_present_share_buffer=True), "parity", "onnxruntime-genai failed"),
    # it refuses the lengths verify asks for
    (lambda c: c["model"].update(context_length=32), "parity", "cannot be greater than model context_length (32)"),
    # its search changes the tokens
    (lambda c: c["search"].update(repetition_penalty=1.3), "generation", "greedy tokens diverge from eager"),
], ids=["share-buffer-on-concat", "context-length-32", "repetition-penalty"])
def test_a_config_that_makes_its_loop_differ_fails_there(tiny, tiny_export, tmp_path, edit, check, says):
    """Right in our loop (ort-cpu passes), wrong in onnxruntime-genai's: its own check fails, and genai-config names
    the field."""
    folder = edited(tiny_export, tmp_path / "f", edit)
    report = verify_folder(folder, loaded=tiny, runtimes=("ort-cpu",) + GENAI,
                           checks=("parity", "generation", "genai-config"))
    assert report.results["ort-cpu"]["parity"].status is True
    r = report.results["ort-genai"][check]
    assert r.status is False and says in r.message, r.message
    assert report.results["ort-genai"]["genai-config"].status is False
    assert report.verdict.code == 1


def test_without_onnxruntime_genai_it_is_skipped_never_passed(tiny, tiny_export, monkeypatch):
    import mhaexport.runtime.genai as rg

    def unavailable():
        raise GenAIUnavailable("onnxruntime_genai cannot be imported (ImportError: planted)")

    monkeypatch.setattr(rg, "import_og", unavailable)
    default = verify_folder(tiny_export, loaded=tiny, checks=("parity",))
    assert "ort-genai" not in default.runtimes and default.verdict.code == 0  # a default only where it runs
    asked = verify_folder(tiny_export, loaded=tiny, runtimes=GENAI, checks=("parity",))
    assert asked.runtimes["ort-genai"].status == "skipped" and "planted" in asked.runtimes["ort-genai"].reason
    assert asked.verdict.code == 4 and not asked.passed


def test_the_cli_report_and_junit_show_it(tiny_export, tmp_path):
    junit = tmp_path / "v.xml"
    res = CliRunner().invoke(main, ["verify", str(tiny_export), "--runtime", "ort-genai", "--junit", str(junit),
                                    "-o", str(tmp_path / "out")])
    assert res.exit_code == 0, res.output
    assert "| ort-genai | onnxruntime-genai" in res.output
    xml = junit.read_text()
    assert 'classname="ort-genai"' in xml or "ort-genai" in xml


@pytest.mark.slow  # an export each (~10 s here)
@pytest.mark.parametrize("name", ["shared", "fused", "float16"])
def test_our_layouts_and_dtypes_pass_in_its_loop(tmp_path, name):
    """The peaked tiny-llama (greedy output varies) exported with a shared cache and fused attention; float16 on
    the plain one (its logits at the scale float16's tolerance is set for)."""
    from mhaexport.exporter.onnx import export_onnx
    from mhaexport.models.loading import load_model
    from planted.edit import peaked

    kw = {"shared": {"attention": "fused", "kv_cache": "shared"}, "fused": {"attention": "fused"},
          "float16": {"dtype": "float16"}}[name]
    loaded = load_model("tiny-llama", random_weights=True) if name == "float16" else peaked("tiny-llama")
    export_onnx(loaded, tmp_path, **kw)
    report = verify_folder(tmp_path, loaded=loaded, runtimes=GENAI, checks=OWN_CHECKS)
    assert report.verdict.code == 0, markdown(report)
    assert_healthy(report)
    assert report.results["ort-genai"]["generation"].figures["tokens"] >= 8


@pytest.mark.slow  # the builder twice (~20 s each here)
@pytest.mark.parametrize("precision", ["fp32", "int4"])
def test_the_builders_folders_pass_in_its_loop(hf_dir, tmp_path, precision):
    from mhaexport.exporter.adopt import adopt_onnx
    from mhaexport.models.loading import load_model
    from test_foreign import build_with_genai

    hf = hf_dir("llama")
    loaded = load_model(hf=hf)
    rec = adopt_onnx(loaded, build_with_genai(hf, tmp_path / precision, precision))
    report = verify_folder(rec.folder, loaded=loaded, runtimes=GENAI)
    assert report.verdict.code == 0, markdown(report)
    assert_healthy(report)
    if precision == "int4":
        assert report.results["ort-genai"]["quality"].status is True
