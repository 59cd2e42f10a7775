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
    from mhaexport.core.errors import UnsafeFolder

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


# ---- one rule: what the writer says is what the check expects, for every family mhaexport exports ------------------

def _graph_of(contract, shared: bool):
    """The I/O an export of ``contract`` has (iospec's names, the contract's sizes): what the check reads."""
    from mhaexport.core import iospec
    from mhaexport.runtime.genai_config import GraphIO

    cache = ["batch_size", contract.n_kv_heads, "max_cache" if shared else "past_sequence_length", contract.head_dim]
    inputs = {iospec.INPUT_IDS: ["batch_size", "sequence_length"],
              iospec.ATTENTION_MASK: ["batch_size", "total_sequence_length"]}
    outputs = {iospec.LOGITS: ["batch_size", "sequence_length", contract.vocab_size]}
    for i in range(contract.n_layers):
        inputs.update(dict.fromkeys(iospec.past_names(i), cache))
        outputs.update(dict.fromkeys(iospec.present_names(i), cache))
    return GraphIO(inputs, outputs, {"GroupQueryAttention"} if shared else set())


def _families():
    """(name, contract, model_config) for each preset and each Hugging Face family tests/hf_models.py builds — the
    latter's config made by the loader's own code from the family's config (pad_token_id as given and null)."""
    from types import SimpleNamespace

    from mhaexport.models.config import PRESETS
    from mhaexport.models.hf import _contract_config
    from mhaexport.core.iospec import ModelContract

    out = []
    for name, cfg in PRESETS.items():
        c = ModelContract(n_layers=cfg.n_layers, n_heads=cfg.n_heads, head_dim=cfg.head_dim,
                          vocab_size=cfg.vocab_size, max_positions=cfg.max_positions, n_kv_heads=cfg.n_kv_heads)
        out.append((name, c, cfg))
    pytest.importorskip("transformers")
    from hf_models import configs

    for name, cfg in configs().items():
        for pad in ("as built", None):
            if pad is None:
                cfg = cfg.__class__(**{**cfg.to_dict(), "pad_token_id": None})
            heads = cfg.num_attention_heads if hasattr(cfg, "num_attention_heads") else cfg.n_head
            kv = getattr(cfg, "num_key_value_heads", None) or heads
            dim = getattr(cfg, "head_dim", None) or (cfg.hidden_size // heads)
            layers = cfg.num_hidden_layers
            probe = [(SimpleNamespace(shape=(1, kv, 2, dim)),) * 2] * layers  # the cache a probe call returns
            mc, _plan = _contract_config(cfg, probe, name)
            c = ModelContract(n_layers=mc.n_layers, n_heads=mc.n_heads, head_dim=mc.head_dim,
                              vocab_size=mc.vocab_size, max_positions=mc.max_positions, n_kv_heads=mc.n_kv_heads,
                              windows=tuple(mc.layer_windows) if mc.layer_windows else None)
            out.append((f"{name} (pad_token_id {pad})", c, mc))
    return out


@pytest.fixture(scope="module")
def shipped_tokenizer(tmp_path_factory):
    """tests/hf_models.py's tokenizer files (pad <pad>=0, bos <s>=1, eos </s>=2), as an --hf export ships them."""
    from hf_models import train_tokenizer

    folder = tmp_path_factory.mktemp("tokenizer")
    train_tokenizer(folder)
    return {p.name: p for p in folder.iterdir()}


def test_the_written_config_passes_its_own_check_for_every_family(shipped_tokenizer):
    """The writer of genai_config.json and the genai-config check take the special ids from one function
    (runtime.genai_config.special_ids): every family, with and without its tokenizer, with each cache layout, gets
    a config the check passes — a GPT-2 whose config has pad_token_id null (the loader pads with eos, 2) and whose
    tokenizer pads with 0 was written with 2 and failed its own check ("2 but tokenizer_config.json says 0")."""
    from mhaexport.exporter.genai import genai_config
    from mhaexport.runtime.genai_config import Expected, config_findings, expected_special_ids, special_ids

    seen = []
    for name, contract, model_config in _families():
        for files in ({}, shipped_tokenizer) if contract.vocab_size >= 300 else ({},):
            ids = special_ids(model_config, files)
            for shared in (False, True):
                cfg = genai_config(contract, ids=ids, kv_cache="shared" if shared else "concat")
                exp = Expected(contract=contract, filename="model.onnx", shared=shared,
                               special=expected_special_ids(files, model_config))
                found = [f.line() for f in config_findings(cfg, _graph_of(contract, shared), exp)
                         if f.severity == "error"]
                assert found == [], (name, sorted(files), shared, found)
                # the check holds the ids to the writer's decision: another pad id is named
                wrong = json.loads(json.dumps(cfg))
                wrong["model"]["pad_token_id"] = (ids["pad_token_id"] + 1) % contract.vocab_size
                found = config_findings(wrong, _graph_of(contract, shared), exp)
                assert any(f.field == "model.pad_token_id" for f in found), (name, found)
            seen.append((name, bool(files), ids["pad_token_id"]))
    assert ("gpt2 (pad_token_id None)", True, 0) in seen  # the tokenizer's pad, not eos
    assert ("gpt2 (pad_token_id None)", False, 2) in seen  # no tokenizer: eos pads (the loader's rule)
    assert ("tiny", False, 0) in seen  # built-in: NUL


@pytest.mark.slow  # save a tiny GPT-2, then `mhaexport all --hf` (~60 s here)
def test_all_passes_on_a_gpt2_whose_config_has_no_pad_id(tmp_path):
    """GPT-2's config has pad_token_id null; its tokenizer pads with 0: `all --hf` failed its own genai-config check
    on ort-cpu and ort-genai ("model.pad_token_id: 2 but tokenizer_config.json says 0")."""
    pytest.importorskip("transformers")
    from hf_models import save_tiny

    hf = save_tiny("gpt2", tmp_path / "gpt2")
    cfg = json.loads((hf / "config.json").read_text())
    cfg["pad_token_id"] = None
    (hf / "config.json").write_text(json.dumps(cfg))
    res = CliRunner().invoke(main, ["-q", "all", "--hf", str(hf), "-o", str(tmp_path / "out"), "--runtime",
                                    "ort-cpu", "--runtime", "ort-genai"])
    assert res.exit_code == 0, res.output
    written = json.loads(next((tmp_path / "out").rglob(GENAI_CONFIG)).read_text())["model"]
    assert (written["pad_token_id"], written["eos_token_id"]) == (0, 2)
