"""bisect on fused graphs: only values both sides compute are compared (a Linear's bias added inside BiasGelu or a
skip norm, Q/K/V packed into one MatMul, rotary inside GroupQueryAttention), so a healthy export of every --attention
value and cache layout bisects clean; damage inside a fused attention op is named as that op, not as the W_o that
reads its output; damage in a fused bias or a packed projection is named at its module."""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx
import pytest
import torch
from click.testing import CliRunner
from onnx import numpy_helper

from mhaexport.cli import main
from mhaexport.diagnose.bisect import bisect, bisect_onnx
from planted.edit import rehashed_copy


def biased(preset: str, seed: int = 3):
    """A LoadedModel of ``preset`` whose biases are not zero (random init leaves them 0, which hides a bias that a
    fused op adds) and whose weights vary enough for a damaged value to show."""
    from mhaexport.models.config import PRESETS
    from mhaexport.models.decoder import DecoderLM
    from mhaexport.models.loading import LoadedModel, contract_of

    module = DecoderLM(dataclasses.replace(PRESETS[preset], seed=seed)).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name.endswith("bias") and "ln" not in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    return LoadedModel(module, contract_of(module), spec=f"test:biased-{preset}")


@pytest.fixture(scope="module")
def fused_biased(tiny, tiny_export):
    """--attention fused of the tiny model with biases, lowered in memory from tiny_export (no export here): a copy
    of the model whose Linear biases are not zero, the same biases written into the graph (one initializer per
    Linear: the export shares identical zero tensors), then the fused lowering — BiasGelu and SkipLayerNormalization
    take the Linears' biases, Q/K/V one packed MatMul, attention one MultiHeadAttention per block."""
    import copy

    from mhaexport.exporter.lowering import lower_attention
    from mhaexport.core.graph import name_scopes
    from mhaexport.models.loading import LoadedModel
    from mhaexport.diagnose.bisect import _module_paths

    module = copy.deepcopy(tiny.module)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for sub in module.modules():
            if isinstance(sub, torch.nn.Linear) and sub.bias is not None:
                sub.bias.copy_(torch.randn(sub.bias.shape, generator=g) * 0.5)
    loaded = LoadedModel(module, tiny.contract, spec="test:biased-tiny")
    proto = onnx.load(str(tiny_export / "model.onnx"))
    inits = {t.name: t for t in proto.graph.initializer}
    for n in proto.graph.node:
        paths = _module_paths(name_scopes(n))
        sub = module.get_submodule(paths[-1]) if n.op_type == "Add" and paths else None
        if not isinstance(sub, torch.nn.Linear) or sub.bias is None:
            continue
        for k, x in enumerate(n.input):
            if x in inits and tuple(inits[x].dims) == tuple(sub.bias.shape):
                name = f"{paths[-1]}.bias.own"
                proto.graph.initializer.append(numpy_helper.from_array(sub.bias.detach().numpy(), name))
                n.input[k] = name
    c = tiny.contract
    lower_attention(proto, "fused", n_heads=c.n_heads, head_dim=c.head_dim, n_kv_heads=c.n_kv_heads)
    ops = {n.op_type for n in proto.graph.node}
    assert {"BiasGelu", "SkipLayerNormalization", "MultiHeadAttention"} <= ops, ops
    return loaded, proto


def test_a_healthy_fused_graph_bisects_clean(fused_biased):
    """The issue's repro: the Linear's output is compared as the MatMul's plus the bias BiasGelu adds, the packed
    projections against eager's q|k|v — nothing blamed."""
    loaded, proto = fused_biased
    report = bisect_onnx(proto, loaded)
    assert report.ok, report.summary()
    by = {r.module: r for r in report.rows}
    assert "+bias of BiasGelu" in by["blocks.0.ffn.0"].op and by["blocks.0.ffn.0"].rel < 1e-5
    assert by["blocks.0.attn.W_q+W_k+W_v (packed)"].rel < 1e-5  # compared, no longer "not compared"
    assert not any(m.startswith("blocks.0.attn.W_") for m in report.unmatched)


@pytest.mark.slow  # the default model's export (~20 s here)
def test_the_issues_repro_exits_0(tmp_path):
    """`mhaexport onnx --attention fused -o f && mhaexport verify f --bisect` on the default model: it blamed
    blocks.0.ffn.0 (the MatMul whose bias BiasGelu adds) and exited 1."""
    f = str(tmp_path / "f")
    assert CliRunner().invoke(main, ["-q", "onnx", "--attention", "fused", "-o", f]).exit_code == 0
    res = CliRunner().invoke(main, ["verify", f, "--bisect"])
    assert res.exit_code == 0 and "no divergence" in res.output, res.output
    assert "MatMul+bias of BiasGelu" in res.output or "+bias of" in res.output


def _nodes(proto, op_type):
    return [n for n in proto.graph.node if n.op_type == op_type]


def _scale_attr(node, factor):
    a = next((a for a in node.attribute if a.name == "scale"), None)
    if a is None or a.f == 0.0:  # unset: 1/sqrt(head_dim)
        node.attribute.append(onnx.helper.make_attribute("scale", factor / np.sqrt(16)))
    else:
        a.f *= factor


def _add_to_initializer(proto, name, delta=None, factor=1.0):
    t = next(t for t in proto.graph.initializer if t.name == name)
    a = numpy_helper.to_array(t).astype(np.float32) * factor + (delta or 0.0)
    t.CopyFrom(numpy_helper.from_array(a.astype(numpy_helper.to_array(t).dtype), name))


# (the damage, planted in block 1, the culprit's module, words of the summary)
FUSED_DAMAGE = [
    ("mha-scale", lambda p: _scale_attr(_nodes(p, "MultiHeadAttention")[1], 0.5), "blocks.1.attn",
     "the fused MultiHeadAttention"),
    ("biasgelu-bias", lambda p: _add_to_initializer(p, _nodes(p, "BiasGelu")[1].input[1], delta=0.5),
     "blocks.1.ffn.0", "blocks.1.ffn.0: input agrees"),
    ("packed-qkv", lambda p: _add_to_initializer(
        p, [n for n in _nodes(p, "MatMul") if "packed" in n.name][1].input[1], factor=1.3),
     "blocks.1.attn.W_q+W_k+W_v (packed)", "input agrees"),
    # the norm's gamma inside SkipLayerNormalization: its input is input + skip, which agrees
    ("skip-norm-gamma", lambda p: _own_gamma(_nodes(p, "SkipLayerNormalization")[1], p), "blocks.1.ln_1",
     "blocks.1.ln_1: input agrees"),
]


def _own_gamma(node, proto):
    """Give the skip norm a gamma of its own (the export shares identical tensors), 1.5 x the shared one."""
    t = next(t for t in proto.graph.initializer if t.name == node.input[2])
    proto.graph.initializer.append(numpy_helper.from_array(numpy_helper.to_array(t) * 1.5, "planted_gamma"))
    node.input[2] = "planted_gamma"


@pytest.mark.parametrize("kind, plant, module, says", FUSED_DAMAGE, ids=[d[0] for d in FUSED_DAMAGE])
def test_damage_in_a_fused_graph_is_named_where_it_is(fused_biased, kind, plant, module, says):
    loaded, proto = fused_biased
    bad = onnx.ModelProto()
    bad.CopyFrom(proto)
    plant(bad)
    report = bisect_onnx(bad, loaded)
    assert not report.ok and report.block == "blocks.1", report.summary()
    assert report.culprit.module == module and says in report.summary(), report.summary()
    assert not report.culprit.module.endswith("W_o")
    if kind == "mha-scale":
        assert report.fused_op.startswith("MultiHeadAttention") and report.fused_op in report.culprit_nodes
        assert report.culprit.input_rel is not None and report.culprit.input_rel < 1e-5


# every --attention value and cache layout (on the tiny presets: the article's model with biases, and the
# Llama-shaped one with RoPE and grouped key/value heads)
LAYOUTS = [("tiny", {"attention": a}) for a in ("decomposed", "onnx", "ort")] + [
    ("tiny", {"kv_cache": "shared"}), ("tiny", {"attention": "fused", "kv_cache": "shared"}),
    ("tiny-llama", {"attention": "fused"}), ("tiny-llama", {"attention": "fused", "kv_cache": "shared"}),
    ("tiny-llama", {"kv_cache": "shared"}), ("tiny-llama", {"attention": "ort"})]


@pytest.mark.slow  # one export each (~5-10 s here)
@pytest.mark.parametrize("preset, kw", LAYOUTS, ids=[f"{p}-{'-'.join(map(str, k.values()))}" for p, k in LAYOUTS])
def test_every_healthy_layout_bisects_clean(tmp_path, preset, kw):
    from mhaexport.exporter.onnx import export_onnx

    loaded = biased(preset)
    export_onnx(loaded, tmp_path, **kw)
    report = bisect(tmp_path, loaded)
    assert report.ok, report.summary()


@pytest.mark.slow  # a shared-cache export of the Llama-shaped preset (~10 s here)
@pytest.mark.parametrize("kind", ["gqa-scale", "gqa-rotary"])
def test_damage_inside_group_query_attention_is_named_as_that_op(tmp_path, kind):
    """GroupQueryAttention holds the scale and the rotary embedding (its cos cache): damage to either, in block 1,
    is named as that node — not as W_o, whose input it damaged."""
    from mhaexport.exporter.onnx import export_onnx

    loaded = biased("tiny-llama")
    export_onnx(loaded, tmp_path / "ok", attention="fused", kv_cache="shared")

    def plant(proto):
        node = _nodes(proto, "GroupQueryAttention")[1]
        if kind == "gqa-scale":
            _scale_attr(node, 0.5)
        else:  # a copy of the cos cache for block 1 only, wrong past position 5
            cos = numpy_helper.to_array(next(t for t in proto.graph.initializer if t.name == node.input[7])).copy()
            cos[5:] *= 0.7
            proto.graph.initializer.append(numpy_helper.from_array(cos, "planted_cos"))
            node.input[7] = "planted_cos"

    bad = rehashed_copy(tmp_path / "ok", tmp_path / "bad", plant)
    report = bisect(bad, loaded, batch=2, seq=4, past=6)
    assert not report.ok and report.culprit.module == "blocks.1.attn", report.summary()
    assert report.fused_op.startswith("GroupQueryAttention") and "damage inside the fused op" in report.summary()
