"""Windowed presets exported and verified, and windows or softcaps planted away in a shipped file (issue 37):
each caught by verify naming the check. Slow: each export takes about a minute on 2 shared cores."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from mhaexport.cli import main

pytestmark = pytest.mark.slow


def _export(out, *args):
    r = CliRunner().invoke(main, ["-q", "onnx", "--output", str(out), *args])
    assert r.exit_code == 0, r.output
    return out


def _verify(folder):
    r = CliRunner().invoke(main, ["verify", str(folder), "--runtime", "ort-cpu"])
    report = json.loads((folder / "report-ort-cpu.json").read_text())["results"]["ort-cpu"]
    return r, {name: res["status"] for name, res in report.items()}, report


@pytest.fixture(scope="module")
def window_shared(tmp_path_factory):
    return _export(tmp_path_factory.mktemp("w") / "shared", "--config", "tiny-window", "--kv-cache", "shared")


@pytest.fixture(scope="module")
def gemma_decomposed(tmp_path_factory):
    return _export(tmp_path_factory.mktemp("g") / "dec", "--config", "tiny-gemma")


def test_a_windowed_shared_cache_file_passes_beyond_its_window(window_shared):
    import onnx

    proto = onnx.load(str(window_shared / "model.onnx"), load_external_data=False)
    sizes = [a.i for n in proto.graph.node if n.op_type == "GroupQueryAttention" for a in n.attribute
             if a.name == "local_window_size"]
    assert sizes == [8, 8]
    r, status, report = _verify(window_shared)
    assert r.exit_code == 0, r.output
    assert report["parity"]["figures"]["longest_position"] >= 8 and report["parity"]["figures"]["windows_crossed"] == [8]
    for check in ("kv-consistency", "padding", "generation"):
        assert status[check] is True and report[check]["figures"]["longest_position"] >= 8, check


@pytest.mark.parametrize("bug", ["window_removed", "window_plus_one", "window_minus_one"])
def test_a_window_dropped_or_shifted_in_the_file_fails_verify(window_shared, tmp_path, bug):
    from planted.edit import rehashed_copy
    from planted.file_bugs import WINDOW_BUGS

    folder = rehashed_copy(window_shared, tmp_path / bug, WINDOW_BUGS[bug])
    r, status, _ = _verify(folder)
    assert r.exit_code == 1, r.output
    assert status["parity"] is False and status["kv-consistency"] is False, status


def test_the_gemma_preset_passes_and_its_softcap_dropped_fails(gemma_decomposed, tmp_path):
    from planted.edit import rehashed_copy
    from planted.file_bugs import softcap_dropped

    r, status, _ = _verify(gemma_decomposed)
    assert r.exit_code == 0, r.output
    folder = rehashed_copy(gemma_decomposed, tmp_path / "nocap", softcap_dropped)
    r, status, _ = _verify(folder)
    assert r.exit_code == 1 and status["parity"] is False, (r.output, status)


def test_the_gemma_preset_on_the_shared_cache_carries_window_softcap_and_scale_per_layer(tmp_path):
    """GroupQueryAttention gets local_window_size per layer (8, then -1 for the global layer), the softcap and the
    query scale; verify passes beyond the window."""
    import onnx

    folder = _export(tmp_path / "gs", "--config", "tiny-gemma", "--kv-cache", "shared")
    proto = onnx.load(str(folder / "model.onnx"), load_external_data=False)
    attrs = [{a.name: onnx.helper.get_attribute_value(a) for a in n.attribute} for n in proto.graph.node
             if n.op_type == "GroupQueryAttention"]
    assert [a["local_window_size"] for a in attrs] == [8, -1]
    assert all(abs(a["softcap"] - 0.02) < 1e-6 and abs(a["scale"] - 0.2) < 1e-6 for a in attrs)
    r, status, _ = _verify(folder)
    assert r.exit_code == 0, r.output


@pytest.mark.parametrize("bug, says", [("window_removed", "dropped"), ("window_plus_one", "shifted by +1")])
def test_bisect_names_the_layer_and_the_window_a_file_dropped_or_shifted(window_shared, tmp_path, bug, says):
    from planted.edit import rehashed_copy
    from planted.file_bugs import WINDOW_BUGS

    folder = rehashed_copy(window_shared, tmp_path / bug, WINDOW_BUGS[bug])
    _verify(folder)
    r = CliRunner().invoke(main, ["verify", str(folder), "--bisect"])
    assert r.exit_code == 1, r.output
    assert "layer 0 (blocks.0): sliding window differs: the graph's GroupQueryAttention" in r.output, r.output
    assert f"local_window_size={-1 if bug == 'window_removed' else 9}, the model's is 8 ({says}" in r.output


@pytest.mark.parametrize("preset, windowed", [("tiny-window", [0, 1]), ("tiny-gemma", [0])])
def test_a_window_cache_keeps_window_sized_buffers_and_passes_verify_through_ort_and_genai(tmp_path, preset,
                                                                                           windowed):
    """--kv-cache window: the windowed layers' GroupQueryAttention evicts in place (sliding_window_cache=1, fed
    query_seqlens), the manifest records their W + 16 slots and genai_config.json the sliding_window
    onnxruntime-genai sizes its buffers from; the deploy loop's buffers are that size, and verify passes on ONNX
    Runtime (its deploy loop decoding past the slots) and onnxruntime-genai."""
    import onnx

    from mhaexport.runtime.feed import Feed
    from mhaexport.artifact import opened

    folder = _export(tmp_path / "win", "--config", preset, "--kv-cache", "window")
    proto = onnx.load(str(folder / "model.onnx"), load_external_data=False)
    gqa = [n for n in proto.graph.node if n.op_type == "GroupQueryAttention"]
    evicting = [i for i, n in enumerate(gqa) if any(a.name == "sliding_window_cache" and a.i == 1 for a in n.attribute)]
    assert evicting == windowed and all(len(gqa[i].input) == 17 and gqa[i].input[16] for i in windowed)
    entry = json.loads((folder / "manifest.json").read_text())["artifacts"]["onnx"]
    assert entry["kv_cache"] == "window" and entry["window_slots"] == [24 if i in windowed else 0 for i in range(2)]
    cfg = json.loads((folder / "genai_config.json").read_text())["model"]["decoder"]
    assert cfg["sliding_window"] == {"window_size": 8, "slide_key_value_cache": False, "slide_inputs": False,
                                     "layers": windowed}
    with opened(folder, "onnx") as ef:
        feed = Feed.of(ef.entry("onnx"), ef.contract)
    assert feed.protocol_object().layer_slots(10) == [24 if i in windowed else 10 for i in range(2)]

    r = CliRunner().invoke(main, ["verify", str(folder), "--runtime", "ort-cpu", "--runtime", "ort-genai"])
    assert r.exit_code == 0, r.output
    report = json.loads((folder / "report-ort-cpu+ort-genai.json").read_text())["results"]
    kv = report["ort-cpu"]["kv-consistency"]
    assert kv["status"] is True and kv["figures"]["deploy_rows"][0] + kv["figures"]["deploy_steps"] > 24
    for check in ("parity", "kv-consistency", "padding", "generation"):
        assert report["ort-genai"][check]["status"] is True, (check, report["ort-genai"][check])
