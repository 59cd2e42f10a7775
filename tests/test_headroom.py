"""Half-precision headroom (models/headroom.py, verify/headroom.py): eager float32's per-layer activation peaks
against float16's range (65,504) and bfloat16's precision, before a float16 export and in verify of a half-precision
folder.

Planted: the tiny preset with block 1's feed-forward weights scaled (x1000: its output reaches ~128,000, past float16;
x500: ~32,000, a thin margin). The float16 export refuses the first in one line naming the layer; a float16 file of
it written without that refusal (the file an exporter that does not check writes) fails verify's headroom check,
naming the same layer, beside the finite/parity failures its NaN logits cause.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
from click.testing import CliRunner

from mhaexport.cli import main
from mhaexport.exporter import onnx as onnx_exporter
from mhaexport.models.headroom import FLOAT16_MAX, bfloat16_step, layer_of, measure
from mhaexport.models.loading import load_model

pytestmark = pytest.mark.usefixtures("one_thread")

PLANTED = ("blocks.1.ffn.0.weight", "blocks.1.ffn.2.weight")


def planted(path, scale: float):
    """A checkpoint of the tiny preset with block 1's feed-forward weights times ``scale``."""
    state = {k: v.clone() for k, v in load_model("tiny").module.state_dict().items()}
    for name in PLANTED:
        state[name] *= scale
    torch.save(state, path)
    return path


def test_bfloat16_step_and_layer_names():
    assert bfloat16_step(45000.0) == 256.0 and bfloat16_step(1.0) == 2 ** -7 and bfloat16_step(0.0) == 0.0
    assert layer_of("blocks.3.attn.W_q") == "blocks.3"
    assert layer_of("model.model.layers.12.mlp.down_proj") == "model.model.layers.12"
    assert layer_of("lm_head") == "lm_head" and layer_of("model.model.norm") == "model.model.norm"


def test_measure_finds_the_planted_layer(tmp_path):
    loaded = load_model("tiny", checkpoint=planted(tmp_path / "p.pt", 1000.0))
    h = measure(loaded.module, loaded.contract)
    assert [p.layer for p in h.layers] == ["tok_emb", "pos_emb", "blocks.0", "blocks.1", "ln_f", "lm_head"]
    assert h.overflow.layer == "blocks.1" and h.overflow.module.startswith("blocks.1.ffn")
    assert h.overflow.peak > FLOAT16_MAX and h.overflow.float16_margin < 1
    assert h.layers[2].peak < 100 and not h.layers[2].overflows  # block 0 as it was
    clean = measure(load_model("tiny").module, loaded.contract)
    assert clean.overflow is None and clean.thin() is None and math.isfinite(clean.worst.float16_margin)


def test_a_float16_export_that_would_overflow_is_refused_naming_the_layer(tmp_path):
    ckpt = planted(tmp_path / "p.pt", 1000.0)
    res = CliRunner().invoke(main, ["onnx", "--config", "tiny", "--checkpoint", str(ckpt), "--dtype", "float16",
                                    "-o", str(tmp_path / "out")])
    assert res.exit_code == 2, res.output
    line = res.output.strip().splitlines()[-1]
    assert "--dtype float16" in line and "blocks.1.ffn" in line and "65,504" in line and "bfloat16" in line
    assert not (tmp_path / "out" / "model.onnx").exists()  # no file whose logits are NaN


def test_verify_fails_a_float16_file_that_overflows_naming_the_layer(tmp_path, monkeypatch):
    ckpt = planted(tmp_path / "p.pt", 1000.0)
    out = tmp_path / "f16"
    with monkeypatch.context() as mp:  # the file an exporter without the refusal writes
        mp.setattr(onnx_exporter, "half_precision_headroom", lambda loaded, dtype: None)
        onnx_exporter.export_onnx(load_model("tiny", checkpoint=ckpt), out, dtype="float16")
    res = CliRunner().invoke(main, ["verify", str(out), "--runtime", "ort-cpu", "-o", str(tmp_path / "r")])
    assert res.exit_code == 1, res.output
    report = json.loads((tmp_path / "r" / "report.json").read_text())
    r = report["results"]["ort-cpu"]["headroom"]
    assert r["status"] is False and "blocks.1.ffn" in r["message"] and "65,504" in r["message"]
    assert r["figures"]["float16_overflow"] == "blocks.1" and r["figures"]["float16_margin"] < 1
    md = (tmp_path / "r" / "report.md").read_text()
    assert "Headroom of the float16 file" in md and "| blocks.1 | blocks.1.ffn" in md


@pytest.mark.slow
def test_a_thin_margin_exports_with_a_note_the_figures_and_verify_passes_saying_it(tmp_path):
    ckpt = planted(tmp_path / "p.pt", 500.0)
    res = CliRunner().invoke(main, ["onnx", "--config", "tiny", "--checkpoint", str(ckpt), "--dtype", "float16",
                                    "-o", str(tmp_path / "out")])
    assert res.exit_code == 0, res.output
    entry = json.loads((tmp_path / "out" / "manifest.json").read_text())["artifacts"]["onnx"]
    h = entry["precision"]["headroom"]
    assert h["layer"] == "blocks.1" and 1 < h["float16_margin"] < 4 and h["float16_overflow"] is None
    assert [row["layer"] for row in h["layers"]][2:4] == ["blocks.0", "blocks.1"]
    assert any("float16 headroom is thin" in w and "blocks.1" in w for w in entry["warnings"])
    assert any(w.startswith("headroom: peak |activation|") and "blocks.1" in w for w in entry["warnings"])
    res = CliRunner().invoke(main, ["verify", str(tmp_path / "out"), "--runtime", "ort-cpu",
                                    "-o", str(tmp_path / "r")])
    assert res.exit_code == 0, res.output
    r = json.loads((tmp_path / "r" / "report.json").read_text())["results"]["ort-cpu"]["headroom"]
    assert r["status"] is True and "thin" in r["message"] and r["figures"]["float16_margin"] < 4
    assert len(r["figures"]["layers"]) == 6


def test_a_float32_folder_has_no_headroom_check(tiny_export, tmp_path):
    res = CliRunner().invoke(main, ["verify", str(tiny_export), "--runtime", "ort-cpu", "-o", str(tmp_path / "r")])
    assert res.exit_code == 0, res.output
    assert "headroom" not in json.loads((tmp_path / "r" / "report.json").read_text())["results"]["ort-cpu"]
