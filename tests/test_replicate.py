"""One traced layer for every layer (exporter/replicate.py) and traces kept across processes (exporter/trace_store.py):
the file an export writes is the one a trace of every layer writes — node for node, input for input, the same
initializer bytes (:func:`canonical`) — for the built-in decoder and the transformers families whose layers are alike;
a model whose layers differ, or whose copy cannot be proved, is traced whole (saying why)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pytest

from mhaexport.models.config import PRESETS


def canonical(path: str | Path) -> tuple[list, list]:
    """A graph as nodes in file order, each (op, domain, attributes, inputs), an input named by where it comes from:
    the output of the n-th node, a graph input's name, or an initializer's bytes (sha256) and dims; and the graph
    outputs the same way. Two files with equal forms compute the same function with the same weights."""
    import onnx
    from onnx import numpy_helper

    m = onnx.load(str(path))
    inits = {t.name: hashlib.sha256(numpy_helper.to_array(t).tobytes()).hexdigest() + str(list(t.dims))
             for t in m.graph.initializer}
    made: dict[str, tuple] = {}
    nodes = []
    for i, n in enumerate(m.graph.node):
        ins = tuple(None if not x else made.get(x) or (("init", inits[x]) if x in inits else ("input", x))
                    for x in n.input)
        for j, o in enumerate(n.output):
            made[o] = ("node", i, j)
        attrs = sorted((a.name, str(onnx.helper.get_attribute_value(a))) for a in n.attribute)
        nodes.append((n.op_type, n.domain, attrs, ins))
    return nodes, [(o.name, made.get(o.name)) for o in m.graph.output]


def five_layers(name: str = "tiny-llama"):
    from mhaexport.models.loading import load_model

    return load_model(dataclasses.replace(PRESETS[name], n_layers=5, name="custom"), random_weights=True)


def exporter_of(folder: Path) -> str:
    return json.loads((folder / "manifest.json").read_text())["artifacts"]["onnx"]["exporter"]


def test_a_stored_trace_gives_the_file_a_fresh_trace_gives(tmp_path, monkeypatch):
    """Layers 3.. of a 5-layer decoder copied from the 3-layer trace; a second export takes that trace from the
    cache (no torch.export) and writes the same graph; a stamp that is not this user's HMAC is never read."""
    from mhaexport.exporter import trace_store
    from mhaexport.exporter.onnx import export_onnx

    monkeypatch.setenv("MHAEXPORT_CACHE_DIR", str(tmp_path / "cache"))
    loaded = five_layers()
    export_onnx(loaded, tmp_path / "a")
    assert "the first 3 layers; layers 3..4 copied from layer 2" in exporter_of(tmp_path / "a")
    assert "reused" not in exporter_of(tmp_path / "a")
    stored = sorted((tmp_path / "cache" / "traces").iterdir())
    assert [p.suffix for p in stored] == [".json", ".onnx", ".sha256"]
    export_onnx(five_layers(), tmp_path / "b")  # another process's model object: the same code, config and shapes
    assert "its trace reused from this user's cache" in exporter_of(tmp_path / "b")
    assert canonical(tmp_path / "a" / "model.onnx") == canonical(tmp_path / "b" / "model.onnx")
    # and byte for byte: a cache never changes a file (the optimizer names what it makes the same way)
    assert (tmp_path / "a" / "model.onnx").read_bytes() == (tmp_path / "b" / "model.onnx").read_bytes()
    # what the file runs is eager's model: ORT on the copied layers against eager
    from mhaexport.core.iospec import dummy_inputs
    from mhaexport.runtime.ort import OrtRunner

    ids, mask, past = dummy_inputs(loaded.contract, 2, 4, 3, seed=3, pad=(0, 2))
    with OrtRunner("ort-cpu", loaded.contract, tmp_path / "b" / "model.onnx") as r:
        got = r.run(ids, mask, past)
    import torch

    with torch.no_grad():
        want = loaded.module(torch.from_numpy(ids), torch.from_numpy(mask),
                             tuple((torch.from_numpy(k), torch.from_numpy(v)) for k, v in past))
    assert np.abs(got[0][0, :] - want[0][0].numpy()).max() < 1e-4
    assert np.abs(got[1][4][1] - want[1][4][1].numpy()).max() < 1e-4  # layer 4's present: a copied layer
    # a stamp not made under this user's key: the stored trace is not read
    key = stored[0].stem
    stamp = tmp_path / "cache" / "traces" / f"{key}.sha256"
    stamp.write_text("0" * 64 + "\n")
    assert trace_store.load(key, loaded.module) is None
    # nor a store others can write to
    stamp.unlink()
    os.chmod(tmp_path / "cache" / "traces", 0o777)
    assert trace_store.load(key, loaded.module) is None


def test_which_layers_are_copied():
    """Alike layers only: a model of at most 4 layers, layers with different windows, and a user's module class
    (whose code the store does not key) are refused with the reason, or not stored."""
    from mhaexport.core.iospec import ModelContract
    from mhaexport.exporter import replicate, trace_store
    from mhaexport.models.decoder import DecoderLM

    five = DecoderLM(dataclasses.replace(PRESETS["tiny-llama"], n_layers=5))  # small real models: a meta tensor
    windowed = DecoderLM(dataclasses.replace(PRESETS["tiny-window"], n_layers=5, layer_types=(  # has no address
        "sliding_attention", "full_attention", "sliding_attention", "full_attention", "sliding_attention")))
    four = DecoderLM(dataclasses.replace(PRESETS["tiny-llama"], n_layers=4))
    c = ModelContract(n_layers=5, n_heads=4, head_dim=16, vocab_size=256, max_positions=64, n_kv_heads=2)
    stack, why = replicate.layer_stack(five, c)
    assert stack is not None and stack.path == "blocks" and why == ""
    assert replicate.layer_stack(windowed, dataclasses.replace(c, windows=(8, 0, 8, 0, 8)))[1] == \
        "its layers have different sliding windows"
    assert replicate.layer_stack(four, dataclasses.replace(c, n_layers=4))[1] == "4 layers: traced whole"
    assert trace_store.trace_key(five, 3, ("float32",)) is not None

    class Mine(DecoderLM):  # a user's subclass: its code is not keyed, its trace is not stored
        pass

    mine = Mine(dataclasses.replace(PRESETS["tiny-llama"], n_layers=5))
    assert trace_store.trace_key(mine, 3, ("float32",)) is None


def test_layers_set_apart_by_a_setting_are_traced_whole(tmp_path, monkeypatch):
    """The class of a layer alike in weights but not in what its code reads: a module attribute (Llama 4's
    ``use_rope``, Gemma's ``is_sliding``, a score scale) that differs on a layer past the traced ones, or a config
    field listing one value per layer. Such a model is traced whole, saying which setting, and its file is eager's
    model (ORT against eager); a layer index (``layer_idx``) is not a difference."""
    from types import SimpleNamespace

    import torch
    from torch import nn

    from mhaexport.core.iospec import dummy_inputs
    from mhaexport.exporter import replicate
    from mhaexport.exporter.onnx import export_onnx
    from mhaexport.runtime.ort import OrtRunner

    monkeypatch.setenv("MHAEXPORT_CACHE_DIR", str(tmp_path / "cache"))
    loaded = five_layers()
    for i, block in enumerate(loaded.module.blocks):
        block.attn.layer_idx = i  # an index: alike
    assert replicate.layer_stack(loaded.module, loaded.contract)[1] == ""
    loaded.module.blocks[3].attn.scale = 0.9  # layer 3 scores its keys its own way
    why = replicate.layer_stack(loaded.module, loaded.contract)[1]
    assert "attn.scale" in why, why
    export_onnx(loaded, tmp_path / "x")
    assert exporter_of(tmp_path / "x") == "torch.onnx.export(dynamo=True)"  # every layer traced
    ids, mask, past = dummy_inputs(loaded.contract, 1, 5, 2, seed=1)
    with OrtRunner("ort-cpu", loaded.contract, tmp_path / "x" / "model.onnx") as r:
        got = r.run(ids, mask, past)
    with torch.no_grad():
        want = loaded.module(torch.from_numpy(ids), torch.from_numpy(mask),
                             tuple((torch.from_numpy(k), torch.from_numpy(v)) for k, v in past))
    assert np.abs(got[0] - want[0].numpy()).max() < 1e-4

    class Hf(nn.Module):  # a transformers-like model: its config lists a setting per layer
        def __init__(self, per_layer):
            super().__init__()
            self.config = SimpleNamespace(num_hidden_layers=5, no_rope_layers=per_layer)
            self.layers = nn.ModuleList(nn.Linear(2, 2) for _ in range(5))

    c = dataclasses.replace(loaded.contract, windows=None)
    assert replicate.layer_stack(Hf([1, 1, 1, 1, 1]), c)[1] == ""
    assert "no_rope_layers" in replicate.layer_stack(Hf([1, 1, 1, 0, 1]), c)[1]


# ---- slow: against a trace of every layer -----------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("options", [{}, {"dtype": "float16"}, {"kv_cache": "shared"}, {"attention": "ort"}],
                         ids=["float32", "float16", "shared", "ort"])
def test_copied_layers_are_the_whole_trace(tmp_path, monkeypatch, options):
    """The built-in decoder: the file with layers copied equals the file of a trace of every layer, whatever the
    dtype, cache layout or lowering applied after."""
    from mhaexport.exporter.onnx import export_onnx

    monkeypatch.setenv("MHAEXPORT_CACHE_DIR", str(tmp_path / "cache"))
    export_onnx(five_layers(), tmp_path / "auto", **options)
    export_onnx(five_layers(), tmp_path / "whole", trace="fresh", **options)
    assert "copied from layer 2" in exporter_of(tmp_path / "auto")
    assert canonical(tmp_path / "auto" / "model.onnx") == canonical(tmp_path / "whole" / "model.onnx")


def _hf_folder(name: str, folder: Path, layers: int = 5, edit=None) -> Path:
    import torch
    import transformers

    from hf_models import WINDOWED, configs, scale_attention

    base = configs()[name]
    data = base.to_dict()
    for attr in ("num_hidden_layers", "n_layer"):
        if attr in data:
            data[attr] = layers
    data.pop("layer_types", None)
    cfg = type(base)(**data)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg)
    if name in WINDOWED:
        scale_attention(model)
    if edit is not None:
        edit(model)
    transformers.utils.logging.disable_progress_bar()
    model.save_pretrained(str(folder))
    return folder


@pytest.mark.slow
@pytest.mark.parametrize("name", ["llama", "gpt2", "mistral", "qwen2", "phi3", "gemma", "mistral-window"])
def test_hf_families_copied_as_traced(tmp_path, monkeypatch, name):
    """Each transformers family whose layers are alike: copied layers == every layer traced."""
    from mhaexport.exporter.onnx import export_onnx
    from mhaexport.models.loading import load_model

    monkeypatch.setenv("MHAEXPORT_CACHE_DIR", str(tmp_path / "cache"))
    hf = _hf_folder(name, tmp_path / "hf")
    export_onnx(load_model(hf=hf, streamed=True), tmp_path / "auto")
    export_onnx(load_model(hf=hf, streamed=True), tmp_path / "whole", trace="fresh")
    assert "copied from layer 2" in exporter_of(tmp_path / "auto")
    assert canonical(tmp_path / "auto" / "model.onnx") == canonical(tmp_path / "whole" / "model.onnx")


@pytest.mark.slow
def test_unprovable_copies_trace_every_layer(tmp_path, monkeypatch):
    """A random Llama's norms are all ones, which torch.onnx's optimizer shares between the layers traced: with layer
    4's norm another value the copy would be wrong, so the export traces every layer, says why, and writes the file
    of a whole trace. Layers that alternate (Gemma 2's local and global) are traced whole without a copy tried."""
    import torch

    from mhaexport.exporter.onnx import export_onnx
    from mhaexport.models.loading import load_model

    monkeypatch.setenv("MHAEXPORT_CACHE_DIR", str(tmp_path / "cache"))

    def edit(model):
        with torch.no_grad():
            model.model.layers[4].input_layernorm.weight.fill_(2.0)

    hf = _hf_folder("llama", tmp_path / "hf", edit=edit)
    rec = export_onnx(load_model(hf=hf, streamed=True), tmp_path / "auto")
    note = [w for w in rec.warnings if w.startswith("traced every layer")]
    assert note and "layer 4's input_layernorm.weight differs" in note[0], rec.warnings
    export_onnx(load_model(hf=hf, streamed=True), tmp_path / "whole", trace="fresh")
    assert canonical(tmp_path / "auto" / "model.onnx") == canonical(tmp_path / "whole" / "model.onnx")
    g2 = _hf_folder("gemma2-window", tmp_path / "g2", layers=6)
    rec = export_onnx(load_model(hf=g2, streamed=True), tmp_path / "g2-out")
    assert exporter_of(tmp_path / "g2-out") == "torch.onnx.export(dynamo=True)"
    assert not [w for w in rec.warnings if w.startswith("traced every layer")]
