"""ONNX decoders exported by other tools, produced here for real and verified with `verify FILE.onnx --hf DIR`:
onnxruntime-genai's model builder (fp32; int4 in the slow set), a graph with Optimum's exact I/O layout
(position_ids an input the model reads), and a plain torch.onnx.export with the exporter's own names."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from click.testing import CliRunner

from hf_models import export_plain

from mhaexport.core import iospec
from mhaexport.artifact.details import OnnxDetails
from mhaexport.cli import main
from mhaexport.core.errors import ArtifactError
from mhaexport.exporter.adopt import adopt_onnx, default_folder
from mhaexport.exporter.onnx import dynamic_shapes
from mhaexport.models.loading import load_model
from mhaexport.runtime.foreign import detect_layout
from mhaexport.runtime.runner import Runner
from mhaexport.verify import verify_folder
from mhaexport.verify.render import markdown

pytest.importorskip("transformers")
genai = pytest.importorskip("onnxruntime_genai")

RUNTIMES = ("eager", "ort-cpu")


def build_with_genai(hf: Path, out: Path, precision: str) -> Path:
    """onnxruntime-genai's model builder on a save_pretrained folder: out/model.onnx (+ .data, genai_config)."""
    res = subprocess.run([sys.executable, "-m", "onnxruntime_genai.models.builder", "-m", "tiny-llama", "-i",
                          str(hf), "-o", str(out), "-p", precision, "-e", "cpu", "-c", str(out.parent / "cache")],
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    return out / "model.onnx"


@pytest.fixture(scope="module")
def llama(hf_dir):
    """A tiny Llama with grouped-query attention (2 layers, 4 query heads, 2 key/value heads of 16) and its
    tokenizer: (folder, LoadedModel)."""
    folder = hf_dir("llama")  # head size 16: GroupQueryAttention on CPU takes multiples of 16
    return folder, load_model(hf=folder)


@pytest.fixture(scope="module")
def builder_fp32(llama, tmp_path_factory):
    return build_with_genai(llama[0], tmp_path_factory.mktemp("genai") / "fp32", "fp32")


class OptimumStyle(torch.nn.Module):
    """Optimum's decoder signature around the same Hugging Face model: position_ids is an input, and the model
    reads it (a runner that fed wrong positions would get wrong rotary embeddings)."""

    def __init__(self, adapter) -> None:
        super().__init__()
        self.adapter = adapter

    def forward(self, input_ids, attention_mask, position_ids, past_key_values):
        a = self.adapter
        cache = a._cache_cls(tuple((k, v) for k, v in past_key_values))
        out = a.hf(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=True,
                   return_dict=True, **{a._cache_kw: cache})
        from mhaexport.models.hf import _cache_tuples, _output_cache

        return out.logits, _cache_tuples(_output_cache(out))


def export_optimum_layout(loaded, path: Path) -> Path:
    c = loaded.contract
    ids, mask, past = iospec.dummy_inputs(c, 2, 3, 2, seed=0)
    pos = (np.cumsum(mask, -1) - 1)[:, -3:]
    args = (torch.from_numpy(ids), torch.from_numpy(mask), torch.from_numpy(pos),
            tuple((torch.from_numpy(k), torch.from_numpy(v)) for k, v in past))
    ids_spec, mask_spec, past_spec = dynamic_shapes(c.n_layers, True)
    names_in = [iospec.INPUT_IDS, iospec.ATTENTION_MASK, "position_ids"] + iospec.input_names(c.n_layers)[2:]
    with torch.no_grad():
        prog = torch.onnx.export(OptimumStyle(loaded.module).eval(), args, dynamo=True, opset_version=18,
                                 dynamic_shapes=(ids_spec, mask_spec, ids_spec, past_spec), input_names=names_in,
                                 output_names=iospec.output_names(c.n_layers))
    prog.save(str(path))
    return path




def test_the_builders_file_is_verified_in_its_protocol_and_its_findings_in_the_plain_one(llama, builder_fp32):
    """The issue's case: correct under its producer's protocol (shared buffer, right padding) — the verdict —
    while a concat cache with left padding breaks padding and batched decoding: findings, reported apart."""
    _, loaded = llama
    rec = adopt_onnx(loaded, builder_fp32)
    assert rec.folder == builder_fp32.parent / "mhaexport"
    entry = rec.manifest.artifacts["onnx"]
    assert entry.details.producer == "onnxruntime-genai"
    assert (entry.details.cache.kind, entry.details.cache.padding) == ("shared", "right")
    assert {"model.onnx", "model.onnx.data", "genai_config.json", "tokenizer.json"} <= set(entry.files)
    assert os.path.samefile(rec.folder / "model.onnx", builder_fp32)  # hard-linked, not copied
    assert not (rec.folder / "model.onnx").is_symlink()  # never a symlink: readers refuse one

    report = verify_folder(rec.folder, loaded=loaded, runtimes=RUNTIMES)
    assert report.verdict.code == 0, markdown(report)
    ort = report.results["ort-cpu"]
    assert all(ort[ch].status is True for ch in ("parity", "causality", "kv-consistency", "padding", "generation"))
    assert ort["parity"].figures["max_abs"] < 1e-4
    other = report.other_protocol
    assert other is not None and other.producer_protocol == "one shared buffer per layer, right padding"
    plain = other.results["ort-cpu:plain"]
    assert plain["padding"].status is False  # left padding is not this file's protocol
    assert "ort-cpu:plain" not in report.results and report.counts["failed"] == 0
    md = markdown(report)
    assert "Under the plain protocol (concat cache, left padding): findings, not in the verdict" in md
    assert "ort-cpu:plain" in md and "made by onnxruntime-genai" in md

    # a report read back keeps the findings apart
    again = type(report).from_dict(json.loads(json.dumps(report.to_dict())))
    assert again.other_protocol.results["ort-cpu:plain"]["padding"].status is False
    assert again.verdict.code == 0


def test_generate_runs_the_adopted_file_and_agrees_with_onnxruntime_genai(llama, builder_fp32):
    from mhaexport.runtime import GenerationConfig, Generator

    _, loaded = llama
    rec = adopt_onnx(loaded, builder_fp32, builder_fp32.parent.parent / "adopted-gen")
    gen = Generator(rec.folder)
    assert gen.layout is not None and gen.layout.producer == "onnxruntime-genai"
    prompt = [1, 40, 41, 42, 43]
    ours = gen.generate([prompt], GenerationConfig(max_new_tokens=8)).tokens[0]

    model = genai.Model(str(builder_fp32.parent))
    params = genai.GeneratorParams(model)
    params.set_search_options(max_length=len(prompt) + 8, do_sample=False)
    g = genai.Generator(model, params)
    g.append_tokens(prompt)
    theirs = []
    while not g.is_done() and len(theirs) < 8:
        g.generate_next_token()
        theirs.append(int(g.get_next_tokens()[0]))
    assert ours[:len(theirs)] == theirs


def test_a_file_rebuilt_after_adoption_is_refused(llama, builder_fp32, tmp_path):
    import shutil

    _, loaded = llama
    copy = tmp_path / "fp32"
    shutil.copytree(builder_fp32.parent, copy, ignore=shutil.ignore_patterns("mhaexport"))
    rec = adopt_onnx(loaded, copy / "model.onnx", tmp_path / "adopted")
    with open(copy / "model.onnx.data", "r+b") as f:  # the producer writes other weights in place
        f.seek(64)
        f.write(b"\x01\x02\x03\x04")
    with pytest.raises(ArtifactError, match="model.onnx.data"):
        verify_folder(rec.folder, loaded=loaded, runtimes=RUNTIMES)


@pytest.mark.slow  # ~10 s: an Optimum-layout export of the tiny HF Llama and its verify
def test_the_optimum_layout_feeds_position_ids_from_the_mask(hf_dir, tmp_path):
    loaded = load_model(hf=hf_dir("llama-small"))  # no GroupQueryAttention here: the smallest Llama will do
    (tmp_path / "optimum").mkdir()
    path = export_optimum_layout(loaded, tmp_path / "optimum" / "model.onnx")
    layout, cache = detect_layout(path)
    assert (layout.producer, layout.position_ids, cache.kind, cache.padding) == \
        ("optimum", "position_ids", "concat", "left")
    rec = adopt_onnx(loaded, path)
    report = verify_folder(rec.folder, loaded=loaded, runtimes=RUNTIMES,
                           checks=("parity", "padding", "kv-consistency"))
    assert report.verdict.code == 0, markdown(report)
    assert report.results["ort-cpu"]["parity"].figures["max_abs"] < 1e-4
    assert report.other_protocol is None  # its producer's protocol is the plain one
    # eval drives the adopted file as verify does (its own runner choice had fed it the contract's names)
    from mhaexport.artifact import ExportFolder
    from mhaexport.evaluate.perplexity import _Eager, _runner
    from mhaexport.evaluate.scoring import score_text
    from mhaexport.runners.decoder import EagerRunner

    text_ids = np.random.default_rng(0).integers(0, loaded.contract.vocab_size, 40)
    got = score_text(_runner("ort-cpu", ExportFolder.open(rec.folder), _Eager()).activate(), text_ids)[0]
    want = score_text(EagerRunner("eager", loaded.contract, loaded.module).activate(), text_ids)[0]
    assert got.perplexity == pytest.approx(want.perplexity, rel=1e-4)

    # the positions matter: feeding zeros instead gives other logits (the check above could not pass by accident)
    from mhaexport.runtime.choose import ort_runner_for

    runner = ort_runner_for(ExportFolder.open(rec.folder), "o").activate()
    assert runner.feed.position_ids == "position_ids"
    ids, mask, past = iospec.dummy_inputs(loaded.contract, 1, 4, 2, seed=3)
    good = runner.run(ids, mask, past)[0]
    feed = {**runner._host_inputs(ids, mask), **dict(zip(runner.past_names, (t for kv in past for t in kv)))}
    feed["position_ids"] = np.zeros_like(feed["position_ids"])
    bad = runner.session.run([runner.feed.logits], feed)[0]
    assert np.abs(good - bad).max() > 1e-2


@pytest.mark.slow
def test_a_plain_torch_onnx_export_is_mapped_by_position(llama, tmp_path):
    _, loaded = llama
    (tmp_path / "plain").mkdir()
    path = export_plain(loaded, tmp_path / "plain" / "model.onnx")
    layout, _ = detect_layout(path)
    assert layout.producer == "torch.onnx" and "mapped by position" in layout.notes[0]
    report = verify_folder(adopt_onnx(loaded, path).folder, loaded=loaded, runtimes=RUNTIMES)
    assert report.verdict.code == 0, markdown(report)


def test_a_layout_that_cannot_be_mapped_gets_one_line_listing_the_files_io(llama, tmp_path):
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("tokens", TensorProto.INT64, ["b", "s"])
    y = helper.make_tensor_value_info("scores", TensorProto.INT64, ["b", "s"])
    graph = helper.make_graph([helper.make_node("Identity", ["tokens"], ["scores"])], "g", [x], [y])
    path = tmp_path / "odd.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10), path)
    hf, _ = llama
    res = CliRunner().invoke(main, ["verify", str(path), "--hf", str(hf)])
    assert res.exit_code == 2, res.output
    err = res.output.strip().splitlines()[-1]
    assert "cannot map this file onto the decoder contract" in err
    assert "inputs tokens int64['b', 's']" in err and "outputs scores" in err and "expected" in err


def test_a_file_of_another_model_is_refused_with_what_differs(llama, builder_fp32, hf_dir):
    other = load_model(hf=hf_dir("llama-small"))  # 1 layer, not the builder's 2
    with pytest.raises(ArtifactError, match=r"not an export of .*layers 2 \(the model: 1\)"):
        adopt_onnx(other, builder_fp32, builder_fp32.parent.parent / "wrong")


def test_cli_verify_file_needs_a_model_and_adopts_beside_the_file(llama, builder_fp32, tmp_path):
    hf, _ = llama
    res = CliRunner().invoke(main, ["verify", str(builder_fp32)])
    assert res.exit_code == 2 and "say which model it claims to be with --hf" in res.output
    res = CliRunner().invoke(main, ["verify", str(builder_fp32), "--hf", str(hf), "-o", str(builder_fp32.parent)])
    assert res.exit_code == 2 and "must be another folder" in res.output
    res = CliRunner().invoke(main, ["verify", str(builder_fp32), "--hf", str(hf), "--runtime", "ort-cpu",
                                    "-o", str(tmp_path / "v")])
    assert res.exit_code == 0, res.output
    assert "Adopted" in res.output and (tmp_path / "v" / "report-ort-cpu.json").is_file()
    assert default_folder(builder_fp32) == builder_fp32.parent / "mhaexport"


@pytest.mark.slow
def test_the_builders_int4_file_is_lossy_and_verified_on_quality(llama, tmp_path):
    _, loaded = llama
    path = build_with_genai(llama[0], tmp_path / "int4", "int4")
    rec = adopt_onnx(loaded, path)
    q = rec.manifest.artifacts["onnx"].details.quantization
    assert q.weights == "int4" and q.ops.get("MatMulNBits", 0) > 0 and q.block_size == 32
    from mhaexport.exporter.quantize import reproduce

    report = verify_folder(rec.folder, loaded=loaded, runtimes=RUNTIMES, reproduce=reproduce)
    assert report.verdict.code == 0, markdown(report)
    ort = report.results["ort-cpu"]
    assert ort["parity"].status is None and ort["parity"].figures.get("lossy")  # exact parity does not apply
    # no recipe to re-run: each int4 weight (its packed QKV too) against the model's own, within its block's step
    assert ort["weights"].status is True and "quantized by another tool" in ort["weights"].message
    assert ort["weights"].figures["not_matched"] == 0 and ort["weights"].figures["checked_against_reference"] > 0
    assert ort["quality"].status is True
    text = ort["quality"].figures["text"]  # the held-out text, read with the folder's tokenizer.json
    assert text["positions"] > 100 and 0.9 < text["ppl_ratio"] < 1.1 and text["bits_per_byte"] is None
    assert all(ort[ch].status is True for ch in ("causality", "kv-consistency", "padding", "generation"))


def _contract_named_file(folder: Path) -> Path:
    """A graph with the contract's I/O names exactly and no position_ids (what Optimum exports for Gemma, and what
    mhaexport exports): enough for ONNX Runtime to load it and detect_layout to read its I/O."""
    from onnx import TensorProto, helper

    f, i = TensorProto.FLOAT, TensorProto.INT64
    ins = [helper.make_tensor_value_info("input_ids", i, ["b", "s"]),
           helper.make_tensor_value_info("attention_mask", i, ["b", "t"])]
    outs = [helper.make_tensor_value_info("logits", f, ["b", "s", "v"])]
    nodes = [helper.make_node("Cast", ["input_ids"], ["ids_f"], to=f),
             helper.make_node("Unsqueeze", ["ids_f", "axis"], ["logits"])]
    for kind in ("key", "value"):
        ins.append(helper.make_tensor_value_info(f"past_key_values.0.{kind}", f, ["b", 2, "p", 16]))
        outs.append(helper.make_tensor_value_info(f"present.0.{kind}", f, ["b", 2, "t", 16]))
        nodes.append(helper.make_node("Identity", [f"past_key_values.0.{kind}"], [f"present.0.{kind}"]))
    axis = helper.make_tensor("axis", TensorProto.INT64, [1], [2])
    graph = helper.make_graph(nodes, "g", ins, outs, initializer=[axis])
    folder.mkdir(parents=True, exist_ok=True)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10),
              folder / "model.onnx")
    return folder / "model.onnx"


def test_a_file_with_the_contracts_names_is_optimums_unless_an_mhaexport_manifest_lists_it(tmp_path):
    """Optimum exports Gemma without position_ids, so its I/O names are the contract's exactly: it was reported
    "made by mhaexport". mhaexport's own export is told apart by its folder's manifest.json."""
    path = _contract_named_file(tmp_path / "optimum-gemma")
    layout, cache = detect_layout(path)
    assert (layout.producer, layout.position_ids, cache.kind, cache.padding) == \
        ("optimum", None, "concat", "left")
    assert layout.n_heads == 0  # the graph shows key/value heads only: adoption takes the query heads from the model
    own = _contract_named_file(tmp_path / "own")
    _write_manifest(own.parent, OnnxDetails())
    assert detect_layout(own)[0].producer == "mhaexport"
    _write_manifest(own.parent, OnnxDetails(producer="optimum"))  # an adopted folder's own link
    assert detect_layout(own)[0].producer == "optimum"


def _write_manifest(folder: Path, details) -> None:
    """A manifest.json listing folder/model.onnx as its ONNX artifact with ``details``."""
    from mhaexport.artifact import ArtifactEntry, Manifest, ModelRecord, atomic_write_json
    from mhaexport.core.iospec import ModelContract

    from mhaexport.artifact.files import file_entries

    record = ModelRecord(spec="config:toy", contract=ModelContract(1, 2, 16, 4, 32), fingerprint="0" * 16)
    entry = ArtifactEntry(format="onnx", file="model.onnx", dtype="float32", io={}, details=details,
                          files=file_entries(folder, ["model.onnx"]))
    atomic_write_json(folder / "manifest.json", Manifest(record, {"onnx": entry}).to_dict())



class _WrongWherePadded(Runner):
    """A toy runtime: zero logits and cache, plus ``off`` on the logits of a call with a padded row (what a file that
    takes positions from the cache length rather than the mask gives: Optimum's Gemma export)."""

    def __init__(self, name, contract, off):
        super().__init__(name, contract)
        self.off = off

    def run_impl(self, ids, mask, past):
        B, T = ids.shape
        kv = np.zeros((B, self.contract.n_kv_heads, mask.shape[1], self.contract.head_dim), np.float32)
        logits = np.full((B, T, self.contract.vocab_size), 0.0 if mask.all() else self.off, np.float32)
        return logits, tuple((kv, kv) for _ in past)


def test_dynamic_shapes_blames_the_padding_not_a_baked_size_when_only_padded_shapes_fail():
    from mhaexport.core.iospec import ModelContract
    from mhaexport.verify.checks import check_dynamic_shapes
    from mhaexport.verify.compare import Tolerance
    from mhaexport.verify.results import Context
    from mhaexport.verify.sweep import build_sweep

    c = ModelContract(n_layers=1, n_heads=1, head_dim=2, vocab_size=4, max_positions=32)
    cases = build_sweep(c)
    assert any(any(cs.pad) for cs in cases) and any(not any(cs.pad) for cs in cases)
    ctx = Context(contract=c, cases=cases, tol=Tolerance(1e-4, 1e-3), eager=_WrongWherePadded("eager", c, 0.0),
                  export_sizes=(3, 5))
    r = check_dynamic_shapes(_WrongWherePadded("ort-cpu", c, 0.5), ctx)
    assert r.status is False
    assert "pad=" in r.message and "the padding, not the shapes" in r.message
    assert "baked in" not in r.message  # it was: "right at the export's own sizes ...: a size baked in at export"


def test_an_mhaexport_file_is_recognised_by_its_manifest_not_its_genai_config(tiny_export):
    """Our exports carry a genai_config.json too: the manifest beside the file says who made it and how."""
    assert (tiny_export / "genai_config.json").is_file()
    layout, cache = detect_layout(tiny_export / "model.onnx")
    assert (layout.producer, cache.kind, cache.padding) == ("mhaexport", "concat", "left")


@pytest.mark.parametrize("config, said", [
    ({"model": {"decoder": []}}, None),  # raised AttributeError (a list read as an object) before
    ({"model": {"decoder": {"inputs": 5, "outputs": []}}}, None),
    ({"model": 5}, "is not a readable onnxruntime-genai config: no model object"),
    ([1, 2], "is not a readable onnxruntime-genai config: not a JSON object"),
])
def test_a_crafted_genai_config_beside_a_file_is_read_as_records_never_a_crash(tiny_export, tmp_path, config, said):
    """Adoption reads the genai_config.json beside a file through the config's records: a section of the wrong JSON
    type is no names (the file's own names map it), or an ArtifactError naming the file — never a TypeError."""
    folder = tmp_path / "bare"
    folder.mkdir()
    (folder / "model.onnx").write_bytes((tiny_export / "model.onnx").read_bytes())
    (folder / "genai_config.json").write_text(json.dumps(config))
    if said is None:
        layout, cache = detect_layout(folder / "model.onnx")
        assert layout.input_ids == "input_ids" and (cache.kind, cache.padding) == ("concat", "left")
    else:
        with pytest.raises(ArtifactError, match=said):
            detect_layout(folder / "model.onnx")
