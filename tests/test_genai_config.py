"""The genai-config check: genai_config.json edited in a shipped folder (re-hashed, as a pipeline that edits the
config would) fails verify naming the field; lint judges the config on its own; a healthy config passes."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from mhaexport.artifact import ExportFolder
from mhaexport.cli import main
from mhaexport.runtime.genai import GENAI_CONFIG
from mhaexport.verify.genai_check import folder_findings
from planted.edit import edited_genai_config as edited




def fields(folder: Path, loaded) -> dict[str, str]:
    with ExportFolder.open(folder, "onnx") as ef:
        found = folder_findings(ef, loaded.contract, loaded.module.config)
    return {f.field: f.message for f in found if f.severity == "error"}


def _set(path: str, value):
    def edit(cfg):
        *keys, last = path.split(".")
        d = cfg
        for k in keys:
            d = d[k]
        d[last] = value
    return edit


@pytest.fixture(scope="module")
def shared_export(tiny, tmp_path_factory):
    """The tiny model exported with a shared cache (one buffer per layer, GroupQueryAttention)."""
    from mhaexport.exporter.onnx import export_onnx

    out = tmp_path_factory.mktemp("genai_shared")
    export_onnx(tiny, out, kv_cache="shared")
    return out


def test_a_healthy_config_has_no_findings(tiny, tiny_export):
    assert fields(tiny_export, tiny) == {}


# every field onnxruntime-genai reads: (the edit, the field named, words of its message)
EDITS = [
    ("model.context_length", 32, "model.context_length", "refuses any max_length above 32"),
    ("model.context_length", 4096, "model.context_length", "positions the model never learned"),
    ("model.decoder.head_size", 8, "model.decoder.head_size", "the graph's cache is 16"),
    ("model.decoder.hidden_size", 96, "model.decoder.hidden_size", "num_attention_heads x head_size is 64"),
    ("model.decoder.num_attention_heads", 2, "model.decoder.num_attention_heads", "the model's is 4"),
    ("model.decoder.num_key_value_heads", 2, "model.decoder.num_key_value_heads", "the graph's cache is 4"),
    ("model.decoder.num_hidden_layers", 3, "model.decoder.inputs.past_key_names", "past_key_values.2.key not a graph"),
    ("model.decoder.num_hidden_layers", 1, "model.decoder.num_hidden_layers", "the graph's past inputs is 2"),
    ("model.vocab_size", 300, "model.vocab_size", "the graph's logits is 256"),
    # a hashed file of the folder that is not its ONNX model (a name outside the hashed files is refused when the
    # folder is opened: test_a_filename_outside_the_hashed_files_refuses_the_folder)
    ("model.decoder.filename", "genai_config.json", "model.decoder.filename",
     "the manifest's hashed ONNX file is 'model.onnx'"),
    ("model.decoder.inputs.attention_mask", "mask", "model.decoder.inputs.attention_mask", "'mask' is not a graph input"),
    ("model.decoder.inputs.past_key_names", "past.%d.key", "model.decoder.inputs.past_key_names", "not a graph input"),
    ("model.decoder.outputs.logits", "scores", "model.decoder.outputs.logits", "'scores' is not a graph output"),
    ("model.decoder.outputs.present_value_names", "present.%d.v", "model.decoder.outputs.present_value_names",
     "present.0.v, present.1.v not a graph output"),
    ("model.eos_token_id", 5, "model.eos_token_id", "says 0"),
    ("model.pad_token_id", 300, "model.pad_token_id", "outside the vocabulary"),
    ("model.bos_token_id", 7, "model.bos_token_id", "says 0"),
    ("search.past_present_share_buffer", True, "search.past_present_share_buffer", "concat-style"),
    ("search.repetition_penalty", 1.3, "search.repetition_penalty", "differ from greedy"),
    ("search.do_sample", True, "search.do_sample", "samples by default"),
    ("search.num_beams", 4, "search.num_beams", "beam search"),
    ("search.no_repeat_ngram_size", 2, "search.no_repeat_ngram_size", "n-grams"),
    ("search.min_length", 20, "search.min_length", "suppresses eos"),
    ("search.num_return_sequences", 2, "search.num_return_sequences", "several sequences"),
    ("search.max_length", 512, "search.max_length", "refuses it"),
]


@pytest.mark.parametrize("path, value, field, says", EDITS, ids=[f"{e[0]}={e[1]}" for e in EDITS])
def test_each_edited_field_is_named(tiny, tiny_export, tmp_path, path, value, field, says):
    folder = edited(tiny_export, tmp_path / "f", _set(path, value))
    found = fields(folder, tiny)
    assert field in found and says in found[field], found


@pytest.mark.parametrize("filename", ["other.onnx", "../model.onnx", "/tmp/model.onnx"])
def test_a_filename_outside_the_hashed_files_refuses_the_folder(tiny, tiny_export, tmp_path, filename):
    """onnxruntime-genai would load a file verify never hashed: the folder is refused when it is opened (issue 25),
    naming the field, before any check runs."""
    from mhaexport.errors import UnsafeFolder

    folder = edited(tiny_export, tmp_path / "f", _set("model.decoder.filename", filename))
    with pytest.raises(UnsafeFolder, match=r"model\.decoder\.filename.*refused"):
        fields(folder, tiny)


def test_sampling_knobs_count_only_with_sampling(tiny, tiny_export, tmp_path):
    """temperature / top_k / top_p change nothing while do_sample is off (onnxruntime-genai decodes greedily); with
    it on each is named."""
    quiet = edited(tiny_export, tmp_path / "q", lambda c: c["search"].update(temperature=0.7, top_k=50, top_p=0.9))
    assert fields(quiet, tiny) == {}
    loud = edited(tiny_export, tmp_path / "l", lambda c: c["search"].update(do_sample=True, temperature=0.7,
                                                                             top_k=50, top_p=0.9))
    assert {"search.do_sample", "search.temperature", "search.top_k", "search.top_p"} <= set(fields(loud, tiny))


@pytest.mark.slow  # a shared-cache export (~10 s here)
def test_share_buffer_off_on_a_shared_cache_is_named(tiny, shared_export, tmp_path):
    assert fields(shared_export, tiny) == {}
    folder = edited(shared_export, tmp_path / "s", _set("search.past_present_share_buffer", False))
    found = fields(folder, tiny)
    assert "one shared buffer per layer" in found["search.past_present_share_buffer"], found


def test_verify_fails_on_the_named_field_and_lint_on_the_config_alone(tiny_export, tmp_path):
    """Through the CLI: verify exits 1 naming ort-cpu/genai-config and the field; lint (no model) names the search
    default; the healthy folder's verify shows the check passed."""
    folder = edited(tiny_export, tmp_path / "f", lambda c: (c["model"].update(context_length=32),
                                                            c["search"].update(repetition_penalty=1.3)))
    res = CliRunner().invoke(main, ["verify", str(folder), "--runtime", "ort-cpu"])
    assert res.exit_code == 1, res.output
    assert "ort-cpu/genai-config" in res.output and "model.context_length: 32 but the model has 128" in res.output
    data = json.loads((folder / "report-ort-cpu.json").read_text())
    assert data["results"]["ort-cpu"]["genai-config"]["figures"]["fields"] == [
        "model.context_length", "search.max_length", "search.repetition_penalty"]  # max_length 128 > 32 too
    res = CliRunner().invoke(main, ["lint", str(folder)])
    assert res.exit_code == 1 and "search.repetition_penalty" in res.output, res.output
    res = CliRunner().invoke(main, ["lint", str(tiny_export)])
    assert res.exit_code == 0 and "genai-config" in res.output, res.output


@pytest.fixture(scope="module")
def builder_fp32(hf_dir, tmp_path_factory):
    pytest.importorskip("onnxruntime_genai")
    from mhaexport.models.loading import load_model
    from test_foreign import build_with_genai

    hf = hf_dir("llama")
    return load_model(hf=hf), build_with_genai(hf, tmp_path_factory.mktemp("genai_cfg") / "fp32", "fp32").parent


BUILDER_EDITS = [
    ("model.context_length", 32, "model.context_length", "refuses any max_length above 32"),
    ("model.decoder.num_key_value_heads", 4, "model.decoder.num_key_value_heads", "the graph's cache is 2"),
    ("model.decoder.hidden_size", 100, "model.decoder.hidden_size", "num_attention_heads x head_size is 64"),
    ("search.past_present_share_buffer", False, None, None),  # GroupQueryAttention takes either: no finding
    ("model.eos_token_id", 5, "model.eos_token_id", "tokenizer_config.json says 2"),
    ("model.bos_token_id", 7, "model.bos_token_id", "tokenizer_config.json says 1"),
    ("search.repetition_penalty", 1.2, "search.repetition_penalty", "differ from greedy"),
]


@pytest.mark.slow  # the builder (~20 s here), an adoption per edit
@pytest.mark.parametrize("path, value, field, says", BUILDER_EDITS, ids=[f"{e[0]}={e[1]}" for e in BUILDER_EDITS])
def test_an_edited_builder_config_is_named(builder_fp32, tmp_path, path, value, field, says):
    """The builder's own folder, its config edited, then adopted (the manifest hashes the edited file): the same
    fields are named, the ids against the builder's shipped tokenizer."""
    from mhaexport.exporter.adopt import adopt_onnx

    loaded, folder = builder_fp32
    assert fields(adopt_onnx(loaded, folder / "model.onnx", tmp_path / "clean").folder, loaded) == {}
    copy = tmp_path / "edited"
    shutil.copytree(folder, copy, ignore=shutil.ignore_patterns("mhaexport"))
    cfg = json.loads((copy / GENAI_CONFIG).read_text())
    _set(path, value)(cfg)
    (copy / GENAI_CONFIG).write_text(json.dumps(cfg))
    found = fields(adopt_onnx(loaded, copy / "model.onnx").folder, loaded)
    if field is None:
        assert found == {}, found
    else:
        assert field in found and says in found[field], found
