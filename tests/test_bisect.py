"""verify --bisect: the ONNX graph's intermediate values against eager PyTorch's, module by module; a bug planted
in the ONNX file only is traced to its block and module."""

from __future__ import annotations


import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import numpy_helper

from mhaexport.cli import main
from planted.edit import rehashed_copy
from mhaexport.verify.bisect import _module_paths, _scopes, bisect, bisect_onnx


def plant_attention_scale_bug(proto: onnx.ModelProto, block: int) -> str:
    """Double the 1/sqrt(d_k) divisor of one block's attention, in the ONNX graph only (the divisor initializer is
    shared between blocks, so that block's Div gets its own copy). Returns the Div node's name."""
    inits = {i.name: i for i in proto.graph.initializer}
    for node in proto.graph.node:
        paths = _module_paths(_scopes(node))
        if paths and paths[-1] == f"blocks.{block}.attn" and node.op_type == "Div" and node.input[1] in inits:
            val = numpy_helper.to_array(inits[node.input[1]])
            planted = numpy_helper.from_array((val * 2).astype(val.dtype), f"{node.input[1]}_planted")
            proto.graph.initializer.append(planted)
            node.input[1] = planted.name
            return node.name
    pytest.fail(f"no Div by an initializer inside blocks.{block}.attn: the attention lowering changed")


def plant_bias_bug(proto: onnx.ModelProto, module: str) -> None:
    """Add 0.05 to one Linear's bias in the ONNX graph only (weights are folded into val_* initializers; the bias
    keeps its name, and the exporter may share it with equal biases of later blocks)."""
    for init in proto.graph.initializer:
        if init.name == f"{module}.bias":
            w = numpy_helper.to_array(init)
            init.CopyFrom(numpy_helper.from_array((w + 0.05).astype(w.dtype), init.name))
            return
    pytest.fail(f"no initializer named {module}.bias")


def test_clean_export_has_no_divergence_and_covers_every_block(tiny_export, tiny):
    report = bisect(tiny_export, tiny)
    assert report.ok and report.first_divergent is None and report.culprit is None
    modules = {r.module for r in report.rows}
    for i in range(tiny.contract.n_layers):
        assert {f"blocks.{i}", f"blocks.{i}.attn", f"blocks.{i}.attn.W_q", f"blocks.{i}.ffn",
                f"output present.{i}.key"} <= modules
    assert "output logits" in modules and not report.unmatched
    assert max(r.rel for r in report.rows) < 1e-5
    positions = [r.position for r in report.rows]
    assert positions == sorted(positions)  # graph (run) order


def test_planted_attention_scale_bug_is_traced_to_block_1_attention(tiny_export, tiny):
    proto = onnx.load(str(tiny_export / "model.onnx"))
    div = plant_attention_scale_bug(proto, block=1)
    report = bisect_onnx(proto, tiny)
    assert not report.ok
    assert report.block == "blocks.1"
    assert report.culprit.module == "blocks.1.attn"
    assert report.culprit.input_rel < 1e-5 and report.culprit.rel > 1e-2
    assert report.first_divergent.module.startswith("blocks.1.attn")
    assert any(div in n for n in report.culprit_nodes)
    before = report.rows[: report.rows.index(report.first_divergent)]
    assert before and all(r.rel < 1e-5 for r in before)  # everything up to it agrees, block 0 included
    assert "culprit in block blocks.1: blocks.1.attn" in report.summary()


def test_planted_bias_bug_is_traced_to_the_linear(tiny_export, tiny):
    proto = onnx.load(str(tiny_export / "model.onnx"))
    plant_bias_bug(proto, "blocks.0.ffn.0")
    report = bisect_onnx(proto, tiny)
    assert report.culprit.module == "blocks.0.ffn.0" and report.block == "blocks.0"
    assert report.first_divergent.module == "blocks.0.ffn.0"


def test_cli_verify_bisect(tiny_export, tmp_path):
    runner = CliRunner()
    ok = runner.invoke(main, ["verify", str(tiny_export), "--bisect"])
    assert ok.exit_code == 0, ok.output
    assert "no divergence" in ok.stdout

    bad = tmp_path / "bad"
    rehashed_copy(tiny_export, bad, lambda p: plant_attention_scale_bug(p, block=1))
    res = runner.invoke(main, ["verify", str(bad), "--bisect"])
    assert res.exit_code == 1, res.output
    assert "culprit in block blocks.1: blocks.1.attn: input agrees" in res.stdout
    assert "FAILED: the ONNX graph diverges from eager PyTorch at blocks.1.attn" in res.stderr


def test_model_without_scopes_is_refused(tiny_export, tiny):
    from mhaexport.errors import MhaExportError

    proto = onnx.load(str(tiny_export / "model.onnx"))
    for node in proto.graph.node:
        del node.metadata_props[:]
    with pytest.raises(MhaExportError, match="carries no module scopes"):
        bisect_onnx(proto, tiny)


def test_values_exposed_are_what_ort_computes(tiny_export, tiny):
    """With graph optimizations off, the logits row measures exactly what a plain session returns."""
    import onnxruntime as ort
    import torch

    from mhaexport import iospec
    from mhaexport.models.inputs import make_inputs

    report = bisect(tiny_export, tiny, batch=1, seq=3, past=2, seed=5, opt_level="disable")
    row = next(r for r in report.rows if r.module == "output logits")
    ids, mask, cache = make_inputs(tiny.contract, batch=1, seq=3, past=2, seed=5)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(str(tiny_export / "model.onnx"), so, providers=["CPUExecutionProvider"])
    logits = sess.run([iospec.LOGITS], iospec.make_feed(ids.numpy(), mask.numpy(),
                                                         [(k.numpy(), v.numpy()) for k, v in cache]))[0]
    with torch.no_grad():
        want = tiny.module(ids, mask, cache)[0].numpy()
    assert row.max_abs == pytest.approx(float(np.abs(logits.astype(np.float64) - want).max()), rel=1e-9, abs=0)


@pytest.mark.parametrize("attention", ["onnx", "ort"])
def test_fused_attention_keeps_its_scope_and_a_planted_scale_is_traced_to_it(tiny_lowered, tiny, tmp_path, attention):
    """Each lowering's fused node carries the module scope of the attention it replaced. A wrong `scale` attribute
    in block 1's fused node, planted in the ONNX file only (the manifest re-hashed, as if the exporter wrote it),
    is traced to blocks.1.attn, with the fused node among that module's own nodes. (com.microsoft
    MultiHeadAttention defeats onnx shape inference: its outputs are exposed untyped and still compared.)"""
    clean = bisect(tiny_lowered[attention], tiny)
    assert clean.ok and not clean.unmatched
    op_type = {"onnx": "Attention", "ort": "MultiHeadAttention"}[attention]
    planted = {}

    def halve_block_1_scale(proto: onnx.ModelProto) -> None:
        fused = [n for n in proto.graph.node if n.op_type == op_type]
        assert len(fused) == tiny.contract.n_layers
        assert _module_paths(_scopes(fused[1]))[-1] == "blocks.1.attn"
        next(a for a in fused[1].attribute if a.name == "scale").f *= 0.5
        planted["node"] = f"{op_type} {fused[1].name}"

    rehashed_copy(tiny_lowered[attention], tmp_path / "bad", halve_block_1_scale)
    report = bisect(tmp_path / "bad", tiny)
    assert report.culprit.module == "blocks.1.attn" and report.block == "blocks.1"
    assert report.culprit.input_rel < 1e-5 and report.culprit.rel > 1e-2
    assert planted["node"] in report.culprit_nodes  # listed by its scope, not as a scope-less node in the span
    assert not any(n.endswith("(no scope)") for n in report.culprit_nodes)
