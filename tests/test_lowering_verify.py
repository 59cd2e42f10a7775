"""Every attention lowering, in float32 and float16, passes `mhaexport verify` on ONNX Runtime CPU, and the
report names the lowering and dtype."""

from __future__ import annotations

import pytest

from mhaexport.exporter.onnx import export_onnx
from mhaexport.verify import verify_folder

CASES = [
    ("onnx", "float32"),
    ("ort", "float32"),
    pytest.param("decomposed", "float16", marks=pytest.mark.slow),
    pytest.param("onnx", "float16", marks=pytest.mark.slow),
    pytest.param("ort", "float16", marks=pytest.mark.slow),
]


@pytest.mark.parametrize("attention,dtype", CASES)
def test_lowering_passes_verify(tiny, tmp_path, attention, dtype):
    export_onnx(tiny, tmp_path, attention=attention, dtype=dtype)
    report = verify_folder(tmp_path, loaded=tiny, runtimes=("eager", "ort-cpu"))
    failed = {(rt, name) for rt, checks in report.results.items() for name, r in checks.items() if r.status is False}
    assert not failed, report.to_markdown()
    ort = report.results["ort-cpu"]
    for check in ("parity", "finite", "causality", "kv-consistency", "padding", "dynamic-shapes", "generation"):
        assert ort[check].status is True, (check, ort[check].message)
    assert f"attention {attention}" in report.to_markdown() and dtype in report.to_markdown()


def test_all_verb_takes_the_lowering_options(tmp_path):
    import json

    from click.testing import CliRunner

    from mhaexport.cli import main

    res = CliRunner().invoke(main, ["all", "--config", "tiny", "--attention", "ort", "--runtime", "eager",
                                    "--runtime", "ort-cpu", "-o", str(tmp_path)])
    assert res.exit_code == 0, res.output
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["artifacts"]["onnx"]["attention"] == "ort"
    assert "attention ort" in (tmp_path / "report.md").read_text()
