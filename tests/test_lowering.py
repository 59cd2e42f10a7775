"""Attention lowerings: each graph holds the op it claims and no decomposed attention, and matches eager."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from click.testing import CliRunner
from torch import nn

from mhaexport.core import iospec
from mhaexport.core.errors import ExportError
from mhaexport.exporter.common import EXAMPLE_PAST, EXAMPLE_SEQ
from mhaexport.exporter.lowering import lower_attention, op_counts, self_check
from mhaexport.exporter.lowering import rules as lowering_rules
from mhaexport.exporter.onnx import export_onnx
from mhaexport.models.inputs import make_inputs
from mhaexport.models.loading import LoadedModel, contract_of

# the issue-2 sweep: seq=1 with and without past, lengths never used at export (batch=2, seq=3, past=5)
SHAPES = [(1, 1, 0), (2, 7, 0), (1, 1, 13), (3, 5, 4), (2, 33, 0), (1, 2, 31)]
# (batch, seq, past, left padding per row): row 2's padding covers all of the past and two new tokens, so two
# of its query rows see no key at all
PADDED = [(3, 5, 4, [0, 3, 6]), (2, 1, 6, [0, 4])]
FUSED = {"onnx": "Attention", "ort": "com.microsoft.MultiHeadAttention"}


def _session(folder):
    sess = ort.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"])
    assert sess.get_providers() == ["CPUExecutionProvider"]
    return sess


def _run(sess, ids, mask, past):
    feed = iospec.make_feed(ids.numpy(), mask.numpy(), [(k.numpy(), v.numpy()) for k, v in past])
    return iospec.split_outputs(sess.run(iospec.output_names(len(past)), feed))


@pytest.mark.parametrize("attention", ["onnx", "ort"])
def test_graph_holds_the_fused_op_and_no_decomposed_attention(tiny_lowered, tiny, attention):
    model = onnx.load(str(tiny_lowered[attention] / "model.onnx"), load_external_data=False)  # op counts only
    counts = op_counts(model)
    assert counts.get(FUSED[attention]) == tiny.contract.n_layers
    assert "Softmax" not in counts
    # Q·Kᵀ and weights·V are gone: only the 4 projections per layer and the LM head remain as MatMuls
    assert counts["MatMul"] == 4 * tiny.contract.n_layers + 2 * tiny.contract.n_layers + 1
    # the KV cache goes through the op: the present.* outputs are the fused node's outputs, no Concat writes them
    producers = {o: n for n in model.graph.node for o in n.output}
    for i in range(tiny.contract.n_layers):
        for name in iospec.present_names(i):
            assert producers[name].op_type == FUSED[attention].rsplit(".", 1)[-1]
    if attention == "onnx":
        assert next(o.version for o in model.opset_import if o.domain == "") == 23
    entry = json.loads((tiny_lowered[attention] / "manifest.json").read_text())["artifacts"]["onnx"]
    assert entry["attention"] == attention and entry["dtype"] == "float32"
    assert entry["lowering"]["fused_nodes"] == tiny.contract.n_layers and entry["lowering"]["kv_cache_in_op"]
    assert entry["lowering"]["softmax_left"] == 0
    assert entry["lowering"]["self_check_max_abs_diff"] < 1e-4


def test_decomposed_graph_keeps_softmax(tiny_lowered, tiny):
    counts = op_counts(onnx.load(str(tiny_lowered["decomposed"] / "model.onnx")))
    assert counts["Softmax"] == tiny.contract.n_layers
    assert "Attention" not in counts and "com.microsoft.MultiHeadAttention" not in counts
    entry = json.loads((tiny_lowered["decomposed"] / "manifest.json").read_text())["artifacts"]["onnx"]
    assert entry["attention"] == "decomposed"


@pytest.mark.parametrize("attention", ["decomposed", "onnx", "ort"])
def test_lowering_matches_eager_on_the_sweep(tiny_lowered, tiny, attention):
    sess = _session(tiny_lowered[attention])
    cases = [(b, t, p, None) for b, t, p in SHAPES] + PADDED
    for b, t, p, pad in cases:
        ids, mask, past = make_inputs(tiny.contract, b, t, p, seed=3, pad=pad)
        with torch.no_grad():
            ref, ref_present = tiny.module(ids, mask, past)
        logits, present = _run(sess, ids, mask, past)
        where = f"{attention} at batch={b} seq={t} past={p} pad={pad}"
        assert np.isfinite(logits).all(), where
        # every row, padded ones included: the lowering gives a fully masked row eager's uniform average
        np.testing.assert_allclose(logits, ref.numpy(), atol=1e-4, rtol=0, err_msg=where)
        for (k, v), (rk, rv) in zip(present, ref_present):
            np.testing.assert_allclose(k, rk.numpy(), atol=1e-5, err_msg=where)
            np.testing.assert_allclose(v, rv.numpy(), atol=1e-5, err_msg=where)


def test_attention_onnx_needs_opset_23(tiny, tmp_path):
    with pytest.raises(ExportError, match="needs --opset 23"):
        export_onnx(tiny, tmp_path, attention="onnx", opset=18)
    with pytest.raises(ExportError, match="--attention 'flash'"):
        export_onnx(tiny, tmp_path, attention="flash")


class _OddAttention(nn.Module):
    """A contract model whose 'attention' scales the softmax weights before the V product: not the pattern."""

    def __init__(self) -> None:
        super().__init__()
        self.config = {"n_layers": 1, "n_heads": 2, "head_dim": 4, "vocab_size": 16, "max_positions": 64}
        self.emb = nn.Embedding(16, 8)
        self.head = nn.Linear(8, 16)

    def forward(self, input_ids, attention_mask, past_key_values=None):
        B, T = input_ids.shape
        x = self.emb(input_ids).view(B, T, 2, 4).transpose(1, 2)  # (B, H, T, D)
        k, v = x, x
        if past_key_values:
            k = torch.cat([past_key_values[0][0], k], dim=2)  # (B, H, S, D)
            v = torch.cat([past_key_values[0][1], v], dim=2)  # (B, H, S, D)
        w = torch.softmax(x @ k.transpose(-2, -1), dim=-1) * 0.5  # (B, H, T, S)
        out = (w @ v).transpose(1, 2).reshape(B, T, 8)  # (B, T, 8)
        return self.head(out), ((k, v),)


def test_unrecognized_attention_is_a_clear_export_error(tmp_path):
    module = _OddAttention().eval()
    loaded = LoadedModel(module, contract_of(module), spec="factory:tests:_OddAttention")
    with pytest.raises(ExportError, match=r"--attention ort: 1 of 1 Softmax node\(s\) are not a recognized "
                                          r"attention pattern .*--attention decomposed"):
        export_onnx(loaded, tmp_path / "odd", attention="ort")
    # the decomposed export of the same model works
    export_onnx(loaded, tmp_path / "odd", attention="decomposed")


def _wrong_ort_writer(monkeypatch, **change) -> None:
    """Plant a wrong rewrite: the `ort` lowering writes its fused node from a changed match (a scale, a mask)."""
    write = lowering_rules.FUSE["ort"]
    monkeypatch.setitem(lowering_rules.FUSE, "ort", lambda rule, op, a: write(rule, op, dataclasses.replace(a, **change)))


def test_a_wrong_scale_is_refused_by_the_self_check(tiny, tmp_path, monkeypatch):
    """The planted rewrite still gives a valid graph with one fused node per layer: only the self-check (lowered vs
    decomposed on ORT CPU) can tell, and the export must fail before any file is written."""
    _wrong_ort_writer(monkeypatch, scale=0.5)  # the tiny preset's is 1/sqrt(16) = 0.25
    with pytest.raises(ExportError, match=r"^--attention ort: the lowered graph differs from the decomposed one on "
                                          r"logits by \S+ \(tolerance \S+\): the rewrite is wrong for this model$"):
        export_onnx(tiny, tmp_path, attention="ort")
    assert not (tmp_path / "model.onnx").exists()


def test_a_dropped_mask_is_refused_by_the_self_check(tiny, tiny_export, monkeypatch):
    """The same on the shared decomposed export, without a new torch export: lower it with the mask dropped."""
    _wrong_ort_writer(monkeypatch, masked=None, allowed=None, bias=None)
    decomposed = (tiny_export / "model.onnx").read_bytes()
    model = onnx.load_from_string(decomposed)
    lower_attention(model, "ort", n_heads=tiny.contract.n_heads, head_dim=tiny.contract.head_dim)
    assert op_counts(model)["com.microsoft.MultiHeadAttention"] == tiny.contract.n_layers
    with pytest.raises(ExportError, match=r"--attention ort: the lowered graph differs from the decomposed one on "
                                          r"logits by .*the rewrite is wrong for this model"):
        self_check(decomposed, model, tiny.contract, "float32", "ort", seq=EXAMPLE_SEQ, past=EXAMPLE_PAST)


def test_lower_attention_rejects_a_graph_without_attention():
    x = onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2])
    y = onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2])
    model = onnx.helper.make_model(onnx.helper.make_graph([onnx.helper.make_node("Relu", ["x"], ["y"])], "g",
                                                          [x], [y]))
    with pytest.raises(ExportError, match="no Softmax"):
        lower_attention(model, "onnx", n_heads=1, head_dim=2)


@pytest.mark.slow  # the lowering through the CLI: `all --attention ort` in test_lowering_verify covers it fast
def test_cli_attention_option(tmp_path):
    from mhaexport.cli import main

    out = tmp_path / "cli"
    result = CliRunner().invoke(main, ["onnx", "--config", "tiny", "--attention", "ort", "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert "2 fused node(s)" in result.output
    entry = json.loads((out / "manifest.json").read_text())["artifacts"]["onnx"]
    assert entry["attention"] == "ort" and entry["opset"] == 18


def test_cli_attention_onnx_below_opset_23_is_refused(tmp_path):
    from mhaexport.cli import main

    bad = CliRunner().invoke(main, ["onnx", "--config", "tiny", "--attention", "onnx", "--opset", "20",
                                    "-o", str(tmp_path / "cli")])
    assert bad.exit_code == 2 and "needs opset 23" in bad.output
