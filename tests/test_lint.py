"""`mhaexport lint`: each rule fires on a graph that has its bug and stays quiet on correct exports."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper, numpy_helper

from mhaexport.cli import main
from mhaexport.verify.lint import lint_model, lint_path

F, F16, I64 = TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.INT64


def _decoder(nodes, inits=(), *, seq="sequence_length", extra_inputs=(), elem=F, opset=18, ir=10, past=True,
             outputs=None):
    """A graph with the contract's I/O around ``nodes``; the nodes compute ``scores`` -> ... -> ``logits``."""
    inputs = [helper.make_tensor_value_info("input_ids", I64, ["batch_size", seq]),
              helper.make_tensor_value_info("attention_mask", I64, ["batch_size", "total_sequence_length"])]
    if past:
        inputs += [helper.make_tensor_value_info(f"past_key_values.0.{kv}", elem,
                                                 ["batch_size", 2, "past_sequence_length", 4]) for kv in ("key", "value")]
    inputs += [helper.make_tensor_value_info(n, elem, None) for n in extra_inputs]
    outs = outputs or ["logits", "present.0.key", "present.0.value"]
    graph = helper.make_graph(
        list(nodes) + [helper.make_node("Identity", ["past_key_values.0.key"], ["present.0.key"]),
                       helper.make_node("Identity", ["past_key_values.0.value"], ["present.0.value"])],
        "decoder", inputs, [helper.make_tensor_value_info(o, elem, None) for o in outs], list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=ir)


def _attention(mask_nodes, score="scaled", *, after=(), inits=()):
    """q @ kᵀ / 2 -> mask_nodes (ending in ``masked``) -> Softmax -> after (ending in ``w``) -> @ v -> logits."""
    nodes = [helper.make_node("MatMul", ["past_key_values.0.key", "kt"], ["qk"]),
             helper.make_node("Div", ["qk", "two"], ["scaled"]), *mask_nodes,
             helper.make_node("Softmax", ["masked" if mask_nodes else score], ["sm"], axis=-1), *after,
             helper.make_node("MatMul", ["w" if after else "sm", "past_key_values.0.value"], ["logits"])]
    inits = [numpy_helper.from_array(np.array(2.0, np.float32), "two"),
             numpy_helper.from_array(np.zeros((1, 2, 4, 5), np.float32), "kt"), *inits]
    return nodes, inits


def _const(name, value):
    return numpy_helper.from_array(np.asarray(value), name)


def _rules(report, severity="error"):
    return {f.rule for f in report.findings if f.severity == severity}


def test_a_correct_export_has_no_finding(tiny_export):
    report = lint_path(tiny_export)
    assert report.findings == [] and report.ok and len(report.rules) >= 8


def test_mask_order_finds_a_zero_fill_a_mask_after_softmax_and_no_mask():
    where = helper.make_node("Where", ["cond", "zero", "scaled"], ["masked"])
    nodes, inits = _attention([where], inits=[_const("zero", np.float32(0)), _const("cond", np.ones((1, 1), bool))])
    r = lint_model(_decoder(nodes, inits))
    assert _rules(r) == {"mask-order"} and "filled with 0 before Softmax" in r.errors[0].message
    after = [helper.make_node("Where", ["cond", "sm", "zero"], ["w"])]
    nodes, inits = _attention([], after=after, inits=[_const("zero", np.float32(0)),
                                                       _const("cond", np.ones((1, 1), bool))])
    r = lint_model(_decoder(nodes, inits))
    assert any("after Softmax" in f.message for f in r.errors)
    nodes, inits = _attention([])
    r = lint_model(_decoder(nodes, inits))
    assert not r.errors and "no mask reaches the scores" in r.findings[0].message
    fill = helper.make_node("Where", ["cond", "low", "scaled"], ["masked"])
    nodes, inits = _attention([fill], inits=[_const("low", np.float32(-3.4e38)), _const("cond", np.ones((1, 1), bool))])
    assert lint_model(_decoder(nodes, inits)).findings == []  # a large negative fill before Softmax is right


def test_contract_io_and_fixed_axes():
    nodes, inits = _attention([])
    r = lint_model(_decoder(nodes, inits, seq=3, extra_inputs=["position_ids"], outputs=["logits", "present.0.key",
                                                                                          "present.0.value"]))
    fixed = [f for f in r.errors if f.rule == "fixed-axis"]
    assert fixed and "axis 1 (sequence_length) came out fixed at 3" in fixed[0].message
    assert any(f.rule == "contract-io" and f.node == "position_ids" and f.severity == "warning" for f in r.findings)
    r = lint_model(_decoder(nodes, inits, past=False, outputs=["logits"]))
    assert any(f.rule == "contract-io" and "no past_key_values" in f.message for f in r.errors)
    static = lint_model(_decoder(nodes, inits, seq=3), static=True)
    assert not static.errors and any(f.severity == "info" and f.rule == "fixed-axis" for f in static.findings)


def test_a_mask_baked_to_the_example_length_and_a_constant_range():
    where = helper.make_node("Where", ["tril", "scaled", "low"], ["masked"])
    nodes, inits = _attention([where], inits=[_const("tril", np.tril(np.ones((3, 3), bool))),
                                              _const("low", np.float32(-1e9))])
    nodes.append(helper.make_node("Range", ["r0", "r3", "r1"], ["positions"]))
    inits += [_const("r0", np.int64(0)), _const("r3", np.int64(3)), _const("r1", np.int64(1))]
    r = lint_model(_decoder(nodes, inits), max_positions=128)
    baked = [f for f in r.findings if f.rule == "baked-length"]
    assert any(f.severity == "error" and "shape [3, 3]" in f.message for f in baked)
    assert any(f.severity == "warning" and "Range(0, 3, 1)" in f.message for f in baked)
    table = [_const("tril", np.tril(np.ones((128, 128), bool))), _const("low", np.float32(-1e9))]
    assert not [f for f in lint_model(_decoder(_attention([where], inits=table)[0], _attention([where], inits=table)[1]),
                                      max_positions=128).findings if f.rule == "baked-length"]  # the model's table


def test_dropout_causal_alignment_fp16_fill_and_versions():
    nodes, inits = _attention([])
    drop = [helper.make_node("Dropout", ["logits_pre", "ratio", "train"], ["logits"])]
    nodes[-1].output[0] = "logits_pre"
    r = lint_model(_decoder(nodes + drop, inits + [_const("ratio", np.float32(0.1)), _const("train", np.bool_(True))]))
    assert any(f.rule == "dropout" and "training mode" in f.message for f in r.errors)

    attn = helper.make_node("Attention", ["q", "k", "v", "", "past_key_values.0.key", "past_key_values.0.value"],
                            ["logits", "pk", "pv"], is_causal=1)
    r = lint_model(_decoder([attn], extra_inputs=["q", "k", "v"], opset=23))
    assert any(f.rule == "causal-alignment" and "top-left" in f.message for f in r.errors)
    tril = helper.make_node("Trilu", ["ones"], ["tri"], upper=0)
    where = helper.make_node("Where", ["tri", "scaled", "low"], ["masked"])
    nodes, inits = _attention([tril, where], inits=[_const("low", np.float32(-1e9))])
    r = lint_model(_decoder(nodes, inits, extra_inputs=["ones"]))
    assert any(f.rule == "causal-alignment" and f.severity == "warning" for f in r.findings)

    add = helper.make_node("Add", ["scaled", "bias"], ["masked"])
    bias = helper.make_node("Where", ["cond", "fmin", "fzero"], ["bias"])
    nodes, inits = _attention([bias, add], inits=[_const("fmin", np.float16(-65504)), _const("fzero", np.float16(0)),
                                                  _const("cond", np.ones((1, 1), bool))])
    r = lint_model(_decoder(nodes, inits, elem=F16))
    assert any(f.rule == "fp16-min-fill" and "-65504" in f.message for f in r.errors)

    nodes, inits = _attention([])
    # IR 99: no ONNX Runtime loads it (1.31 stops at IR 13; 1.32, which [cpu] installs now, loads 14)
    r = lint_model(_decoder(nodes, inits, opset=28, ir=99))  # beyond any ONNX Runtime
    assert any(f.rule == "versions" and "cannot load IR version 99" in f.message for f in r.errors)


def test_lint_cli_exit_codes(tiny_export, tmp_path):
    assert CliRunner().invoke(main, ["lint", str(tiny_export)]).exit_code == 0
    where = helper.make_node("Where", ["cond", "zero", "scaled"], ["masked"])
    nodes, inits = _attention([where], inits=[_const("zero", np.float32(0)), _const("cond", np.ones((1, 1), bool))])
    onnx.save_model(_decoder(nodes, inits), tmp_path / "bad.onnx")
    res = CliRunner().invoke(main, ["lint", str(tmp_path / "bad.onnx")])
    assert res.exit_code == 1 and "| ❌ error | mask-order |" in res.output
    assert "FAILED: lint found 1 error(s): mask-order at Where" in res.output
    (tmp_path / "junk.onnx").write_bytes(b"not a model")
    assert CliRunner().invoke(main, ["lint", str(tmp_path / "junk.onnx")]).exit_code == 2


@pytest.mark.slow
def test_lint_names_the_planted_zero_fill_in_a_real_export(tmp_path):
    from pathlib import Path

    res = CliRunner().invoke(main, ["onnx", "--model", f"{Path(__file__).parent / 'planted' / 'bugs.py'}:mask_zero",
                                    "-o", str(tmp_path)])
    assert res.exit_code == 0, res.output
    report = lint_path(tmp_path)
    assert len(report.errors) == 2 and {f.rule for f in report.errors} == {"mask-order"}  # one per layer


def test_a_one_file_models_large_constants_stay_in_the_file_until_a_rule_asks_for_one(tmp_path):
    """lint reads a one-file model as its graph (``runners.wire.read_graph``): tensors of 64 kB and more are left in
    the file, so a 2 GB file is never held in memory twice over; a rule that needs such a constant (a baked float16
    fill beside Softmax) reads that one alone and still finds it, and a large tensor whose dims disagree with its
    stored bytes is still refused before any rule runs."""
    from mhaexport.core.errors import UntrustedInput
    from mhaexport.runners.wire import GRAPH_BYTES, read_graph

    add = helper.make_node("Add", ["scaled", "bias"], ["masked"])
    bias = helper.make_node("Where", ["cond", "fmin", "fzero"], ["bias"])
    fill = np.full((256, 256), -65504, np.float16)  # 128 kB: past what the reader keeps in memory
    assert fill.nbytes >= GRAPH_BYTES
    nodes, inits = _attention([bias, add], inits=[_const("fmin", fill), _const("fzero", np.float16(0)),
                                                  _const("cond", np.ones((1, 1), bool))])
    path = tmp_path / "model.onnx"
    onnx.save(_decoder(nodes, inits, elem=F16), str(path))
    model, left = read_graph(path)
    assert "fmin" in left and not next(t for t in model.graph.initializer if t.name == "fmin").raw_data
    r = lint_path(path)
    assert any(f.rule == "fp16-min-fill" and "-65504" in f.message for f in r.errors), r.findings

    lying = _decoder(nodes, inits, elem=F16)
    next(t for t in lying.graph.initializer if t.name == "fmin").dims[:] = [256, 512]  # claims twice its bytes
    onnx.save(lying, str(path))
    with pytest.raises(UntrustedInput, match=r"tensor 'fmin': dims \[256, 512\] declare 262144 bytes of data, the "
                                             r"tensor holds 131072"):
        lint_path(path)
