"""verify --bisect: the ONNX graph's intermediate values against eager PyTorch's, module by module; a bug planted
in the ONNX file only is traced to its block and module, and inside attention to its step (scores, scale, mask fill,
softmax, weighted sum, output projection)."""

from __future__ import annotations

import json
import re

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import numpy_helper

from mhaexport.cli import main
from planted import attention_graph
from planted.edit import rehashed_copy
from mhaexport.diagnose.attention_steps import STEPS
from mhaexport.core.graph import name_scopes
from mhaexport.diagnose.bisect import _module_paths, bisect, bisect_onnx


def plant_attention_scale_bug(proto: onnx.ModelProto, block: int) -> str:
    """Double the 1/sqrt(d_k) divisor of one block's attention, in the ONNX graph only (the divisor initializer is
    shared between blocks, so that block's Div gets its own copy). Returns the Div node's name."""
    inits = {i.name: i for i in proto.graph.initializer}
    for node in proto.graph.node:
        paths = _module_paths(name_scopes(node))
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
    assert report.steps_module is None and report.steps == [] and report.step is None  # no culprit: not looked at


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
    assert report.steps_module is None and "steps inside" not in report.summary()  # not attention: no steps


def test_cli_verify_bisect(tiny_export, tmp_path):
    runner = CliRunner()
    ok = runner.invoke(main, ["verify", str(tiny_export), "--bisect"])
    assert ok.exit_code == 0, ok.output
    assert "no divergence" in ok.stdout and "-o DIR writes DIR/bisect-node-data.json" in ok.stdout

    bad = tmp_path / "bad"
    rehashed_copy(tiny_export, bad, lambda p: plant_attention_scale_bug(p, block=1))
    res = runner.invoke(main, ["verify", str(bad), "--bisect", "-o", str(tmp_path / "r")])
    assert res.exit_code == 1, res.output
    assert "culprit in block blocks.1: blocks.1.attn: input agrees" in res.stdout
    node_data = json.loads((tmp_path / "r" / "bisect-node-data.json").read_text())  # Model Explorer's view
    assert node_data["results"]["div_1"]["bgColor"] == "#d00000"  # the culprit's output value, red
    assert f"model-explorer {bad / 'model.onnx'} --node_data_paths={tmp_path / 'r' / 'bisect-node-data.json'}" \
        in res.stdout
    assert "first divergence: blocks.1.attn at step 'scale' (value div_1, Div node_div_1, rel err 5.0e-01): " \
           "scores match, scaled scores do not (ONNX/eager = 0.5 everywhere" in res.stdout
    assert "FAILED: verify (run now): " in res.stderr and "ort-cpu/parity" in res.stderr, res.stderr  # its verdict
    assert "; the ONNX graph diverges from eager PyTorch at blocks.1.attn" in res.stderr
    assert "step 'scale'" in res.stderr


def test_model_without_scopes_is_refused(tiny_export, tiny):
    from mhaexport.core.errors import MhaExportError

    proto = onnx.load(str(tiny_export / "model.onnx"))
    for node in proto.graph.node:
        del node.metadata_props[:]
    with pytest.raises(MhaExportError, match="carries no module scopes"):
        bisect_onnx(proto, tiny)


def test_values_exposed_are_what_ort_computes(tiny_export, tiny):
    """With graph optimizations off, the logits row measures exactly what a plain session returns."""
    import onnxruntime as ort
    import torch

    from mhaexport.core import iospec
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


# the onnx lowering's export (~10 s) runs in the slow set; the ort lowering proves the same path in the default one
@pytest.mark.parametrize("attention", [pytest.param("onnx", marks=pytest.mark.slow), "ort"])
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
        assert _module_paths(name_scopes(fused[1]))[-1] == "blocks.1.attn"
        next(a for a in fused[1].attribute if a.name == "scale").f *= 0.5
        planted["node"] = f"{op_type} {fused[1].name}"

    rehashed_copy(tiny_lowered[attention], tmp_path / "bad", halve_block_1_scale)
    report = bisect(tmp_path / "bad", tiny)
    assert report.culprit.module == "blocks.1.attn" and report.block == "blocks.1"
    assert report.culprit.input_rel < 1e-5 and report.culprit.rel > 1e-2
    assert planted["node"] in report.culprit_nodes  # listed by its scope, not as a scope-less node in the span
    assert not any(n.endswith("(no scope)") for n in report.culprit_nodes)
    # one node for all of attention: no steps inside to compare, and the report says why
    assert report.steps_module == "blocks.1.attn" and report.steps == [] and report.step is None
    assert f"computes blocks.1.attn in one node ({planted['node']})" in report.steps_note
    assert report.steps_note in report.summary()


# ---------------------------------------------------------------- inside attention: the step that diverges

# (the planted step, the step bisect must name, what its note must say)
PLANTED_STEPS = [
    ("scale", "scale", "scores match, scaled scores do not (ONNX/eager = 0.5 everywhere"),
    ("mask fill", "mask fill", "masked positions hold -1.0e+00 in ONNX (eager -3.4e+38): a fill too weak"),
    ("mask after softmax", "mask fill", "the ONNX graph applies the mask after softmax"),
    ("softmax", "softmax", "masked scores match, attention weights do not (ONNX's weights do not sum to 1"),
    ("weighted sum", "weighted sum", "attention weights match, weights·V does not (its value operand"),
    ("output projection", "output projection", "weights·V matches, the output (heads merged, W_o) does not"),
]


@pytest.mark.parametrize("planted, step, says", PLANTED_STEPS, ids=[p[0] for p in PLANTED_STEPS])
def test_a_bug_planted_at_one_attention_step_is_named_at_that_step(tiny_export, tiny, planted, step, says):
    """A bug planted in block 1's attention, in the ONNX file only, at one step: bisect names that step, every
    step before it agrees, and the note says what the values show."""
    proto = onnx.load(str(tiny_export / "model.onnx"))
    node = attention_graph.PLANTS[planted](proto, "blocks.1.attn")
    report = bisect_onnx(proto, tiny)
    assert report.culprit.module == "blocks.1.attn" and report.steps_module == "blocks.1.attn"
    assert [d.step for d in report.steps] == list(STEPS)  # all six found on both sides, in eager's order
    assert report.step is not None and report.step.step == step and report.step.diverges
    i = report.steps.index(report.step)
    assert all(d.rel < 1e-5 and not d.diverges for d in report.steps[:i])
    assert report.steps[-1].diverges  # and the module's output with it
    if planted != "output projection":  # that one is planted in the Transpose before W_o, not in a step's node
        assert report.step.op.endswith(f" {node}")
    assert says in report.step.note and report.steps_note == report.step.note
    assert f"first divergence: blocks.1.attn at step '{step}' (" in report.summary()
    assert says in report.summary()
    data = json.loads(json.dumps(report.to_dict()))
    assert data["step"]["step"] == step and [d["step"] for d in data["steps"]] == list(STEPS)


def test_clean_export_every_attention_step_agrees_padded_rows_included(tiny_export, tiny):
    """steps_of compares a module's steps with nothing diverging. Left padding makes fully masked query rows
    (compared only at real positions) and masked keys holding the fill (compared by their effect)."""
    report = bisect(tiny_export, tiny, pad=[2, 0], steps_of="blocks.0.attn")
    assert report.ok and report.step is None
    assert [d.step for d in report.steps] == list(STEPS)
    assert all(d.rel < 1e-5 and not d.diverges for d in report.steps)
    assert report.steps_note == "every step inside agrees at real positions"
    summary = report.summary()
    assert "no divergence" in summary and "steps inside blocks.0.attn" in summary
    assert "steps inside" not in bisect(tiny_export, tiny, pad=[2, 0]).summary()

    other = bisect(tiny_export, tiny, steps_of="blocks.0.ffn")
    assert other.steps == [] and other.steps_note == "blocks.0.ffn is not an attention module: no Softmax among " \
                                                     "its own ONNX nodes"


def _attention_variants():
    """Attention written three other ways, each with (B, H, T, D) q, k, v and a bool mask (True = allowed)."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    class AdditiveMask(nn.Module):  # transformers' eager attention: * scaling, + mask, softmax in fp32, dropout
        def forward(self, q, k, v, allowed):
            w = torch.matmul(q, k.transpose(2, 3)) * q.shape[-1] ** -0.5
            w = w + torch.zeros(allowed.shape).masked_fill(~allowed, torch.finfo(torch.float32).min)
            w = F.softmax(w, dim=-1, dtype=torch.float32).to(q.dtype)
            w = F.dropout(w, p=0.0, training=False)
            return torch.matmul(w, v)

    class PreScaled(nn.Module):  # the query scaled before Q·Kᵀ; batched heads through bmm: (B * H, T, S)
        def forward(self, q, k, v, allowed):
            B, H, T, D = q.shape
            q = (q * D ** -0.5).reshape(B * H, T, D)
            w = torch.bmm(q, k.reshape(B * H, -1, D).transpose(1, 2))
            w = torch.where(allowed.expand(B, H, T, -1).reshape(B * H, T, -1), w, float("-inf"))
            return torch.bmm(w.softmax(-1), v.reshape(B * H, -1, D))

    class Fused(nn.Module):
        def forward(self, q, k, v, allowed):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)

    return {"additive": AdditiveMask(), "pre-scaled": PreScaled(), "fused": Fused()}


@pytest.mark.parametrize("variant, order", [
    ("additive", ["scores", "scale", "mask fill", "softmax", "weighted sum"]),
    ("pre-scaled", ["scale", "scores", "mask fill", "softmax", "weighted sum"]),
    ("fused", []),
])
def test_eager_steps_are_found_in_attention_written_other_ways(variant, order):
    """The eager trace records torch calls, not a class's methods: any attention written with them has its steps
    found (one fused call has none, and compare_steps says so)."""
    import torch
    from torch import nn

    from mhaexport.diagnose.attention_steps import compare_steps, find_steps, trace_module

    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 3, 8), torch.randn(2, 4, 5, 8), torch.randn(2, 4, 5, 8))
    allowed = torch.ones(3, 5, dtype=torch.bool).tril(2)[None, None]  # (1, 1, T, S)
    model = nn.ModuleDict({"attn": _attention_variants()[variant]})
    trace = trace_module(model, "attn", lambda: model["attn"](q, k, v, allowed))
    found = find_steps(trace.ops)
    assert sorted((s for s in found if s in STEPS), key=found.get) == order
    assert trace.output.shape == ((8, 3, 8) if variant == "pre-scaled" else (2, 4, 3, 8))  # heads in batch: B * H
    if variant == "fused":
        res = compare_steps(trace, [], {}, None, 1e-3)
        assert res.steps == [] and "one call (scaled_dot_product_attention)" in res.note
    else:
        masked = trace.values[found["mask fill"]]
        assert (masked[..., 0, 3:] <= -1e30).all()  # the fill eager wrote, where the mask says


@pytest.mark.slow
@pytest.mark.parametrize("arch, attn", [("gpt2", "hf.transformer.h.1.attn"), ("llama", "hf.model.layers.1.self_attn")])
def test_attention_steps_of_hf_models(hf_dir, tmp_path, arch, attn):
    """transformers' eager attention (scale by Mul, additive mask, softmax then a cast; GQA's repeated key/value
    heads and RoPE for Llama): every step is found on both sides and agrees on a clean export, with left padding;
    a scale planted in the ONNX file is named at its step."""
    pytest.importorskip("transformers")
    from mhaexport.exporter.onnx import export_onnx
    from mhaexport.models.loading import load_hf

    loaded = load_hf(hf_dir(arch, tokenizer=False))
    export_onnx(loaded, tmp_path)
    clean = bisect(tmp_path, loaded, pad=[2, 0], steps_of=attn)
    assert clean.ok and [d.step for d in clean.steps] == list(STEPS)
    assert all(not d.diverges for d in clean.steps), clean.summary()
    proto = onnx.load(str(tmp_path / "model.onnx"))
    attention_graph.scale(proto, attn)
    report = bisect_onnx(proto, loaded)
    assert report.culprit.module == attn and report.step.step == "scale", report.summary()
    assert "ONNX/eager = 0.5 everywhere" in report.step.note


# ---------------------------------------------------------------- every layout, at the failing case

def plant_weight_bug(proto: onnx.ModelProto, module: str) -> str:
    """Change one input feature's row of one Linear's weight in the ONNX graph only (a constant added to every
    weight would vanish after a LayerNorm); the weight gets its own copy. Returns the MatMul's name."""
    inits = {i.name: i for i in proto.graph.initializer}
    for node in proto.graph.node:
        paths = _module_paths(name_scopes(node))
        if paths and paths[-1] == module and node.op_type in ("MatMul", "Gemm"):
            name = next(x for x in node.input if x in inits)
            w = numpy_helper.to_array(inits[name]).copy()
            w[0] += 0.5
            proto.graph.initializer.append(numpy_helper.from_array(w, f"{name}_planted"))
            node.input[list(node.input).index(name)] = f"{name}_planted"
            return node.name
    pytest.fail(f"no MatMul with an initializer inside {module}")


def plant_position_row(proto: onnx.ModelProto, row: int = 100) -> None:
    """Corrupt one row of the learned position table (half its features: a shift of all would vanish in LayerNorm):
    damage only a case reaching that position can show."""
    init = next((i for i in proto.graph.initializer if i.name == "pos_emb.weight"), None)
    assert init is not None, "no pos_emb.weight initializer: the tiny preset's positions changed"
    w = numpy_helper.to_array(init).copy()
    w[row, ::2] += 0.5
    init.CopyFrom(numpy_helper.from_array(w, init.name))


@pytest.fixture(scope="module")
def tiny_shared(tiny, tmp_path_factory):
    """The tiny model exported with --kv-cache shared (GroupQueryAttention, one buffer per layer)."""
    from mhaexport.exporter.onnx import export_onnx

    folder = tmp_path_factory.mktemp("tiny_shared")
    export_onnx(tiny, folder, kv_cache="shared", max_cache=64)
    return folder


def test_a_clean_shared_cache_folder_bisects_in_its_protocol(tiny_shared, tiny):
    """GroupQueryAttention takes new tokens with a past one row at a time: bisect feeds each row alone, its real
    tokens packed from slot 0 (it crashed, exit 3, feeding the batch in the plain protocol)."""
    res = CliRunner().invoke(main, ["verify", str(tiny_shared), "--bisect"])
    assert res.exit_code == 0, res.output
    assert "no divergence" in res.stdout and "(default case: parity passes on ort-cpu)" in res.stdout
    assert "fed in the file's protocol: one shared buffer per layer (64 slots), each row alone" in res.stdout
    # a padded batch with a past (padding reaching into the new tokens): every row agrees, caches included
    report = bisect(tiny_shared, tiny, batch=3, seq=11, past=6, pad=[0, 2, 9])
    assert report.ok and report.rows_run == 3 and not report.unmatched, report.summary()
    assert {"output present.0.key", "output present.1.value", "output logits"} <= {r.module for r in report.rows}
    assert max(r.rel for r in report.rows) < 1e-5


def test_a_weight_planted_in_a_shared_cache_file_is_found_in_its_protocol(tiny_shared, tmp_path):
    bad = rehashed_copy(tiny_shared, tmp_path / "bad", lambda p: plant_weight_bug(p, "blocks.1.attn.W_v"))
    res = CliRunner().invoke(main, ["verify", str(bad), "--bisect", "--case", "2,5,9"])
    assert res.exit_code == 1, res.output
    assert "at batch=2 seq=5 past=9 (--case)" in res.stdout
    assert "the table: row 0, the first that diverges" in res.stdout
    assert "culprit in block blocks.1: blocks.1.attn.W_v: input agrees" in res.stdout
    assert "ONNX nodes of blocks.1.attn.W_v itself: MatMul node_linear_8" in res.stdout
    assert "diverges from eager PyTorch at blocks.1.attn.W_v" in res.stderr


def test_bisect_exits_with_verify_s_verdict_and_follows_the_ragged_batch(tiny_shared, tmp_path):
    """A shared-cache file whose seqlens_k is wrong for ragged batches only: every parity case agrees, the deploy
    loop's ragged batch over the shared buffer does not. --bisect used to bisect the default case in a quick parity
    sweep, print "no divergence" and exit 0; it now takes verify's verdict (run now: no report since the export),
    follows the deploy-loop check that failed, in its protocol, and exits 1 — --case too."""
    from planted.file_bugs import ragged_seqlens

    bad = rehashed_copy(tiny_shared, tmp_path / "bad", ragged_seqlens)
    res = CliRunner().invoke(main, ["verify", str(bad), "--bisect", "--runtime", "ort-cpu"])
    assert res.exit_code == 1, res.output
    assert "bisect follows ort-cpu's kv-consistency check: the deploy loop (one buffer per layer reused in place, " \
           "a ragged right-padded batch" in res.stdout, res.output
    assert "<-- first difference" in res.stdout and "no divergence" not in res.stdout
    assert "FAILED: verify (run now): " in res.stderr and "ort-cpu/kv-consistency" in res.stderr
    assert "the first difference is decode step 1, row 1" in res.stderr, res.stderr


@pytest.mark.slow  # a verify and a bisect through the CLI (~5 s here)
def test_a_case_bisect_finds_clean_does_not_turn_verify_s_failure_green(tiny_shared, tmp_path):
    from planted.file_bugs import ragged_seqlens

    bad = rehashed_copy(tiny_shared, tmp_path / "bad", ragged_seqlens)
    assert CliRunner().invoke(main, ["-q", "verify", str(bad), "--runtime", "ort-cpu"]).exit_code == 1
    res = CliRunner().invoke(main, ["verify", str(bad), "--bisect", "--case", "2,4,3"])
    assert res.exit_code == 1 and "no divergence" in res.stdout, res.output
    # the sweep's and the serving checks' failures (the seqlens of a ragged batch: kv-consistency, padding, ...)
    assert re.search(r"FAILED: verify \(report-ort-cpu\.json\): \d+ check\(s\) failed: ort-cpu/kv-consistency, "
                     r"ort-cpu/padding", res.stderr), res.stderr


def test_damage_at_high_positions_is_bisected_at_the_case_verify_failed(tiny_export, tmp_path):
    """A corrupted row 100 of the position table: verify fails (only its seq=128 case reaches it); bisect's default
    shapes (seq 4, past 3) see nothing, and bisect without --case runs at the case parity failed at — from the
    folder's report, or from a parity run of its own — and names the position table and position 100."""
    bad = rehashed_copy(tiny_export, tmp_path / "bad", plant_position_row)
    runner = CliRunner()
    res = runner.invoke(main, ["verify", str(bad), "--bisect", "--case", "2,4,3"])
    assert res.exit_code == 1 and "no divergence" in res.stdout, res.output  # the low positions agree: verify fails

    res = runner.invoke(main, ["verify", str(bad), "--bisect"])  # no report yet: parity runs first
    assert res.exit_code == 1, res.output
    assert "at batch=1 seq=128 past=0 (b=1 seq=128 past=0: ort-cpu's worst parity case, run now)" in res.stdout
    assert "culprit: pos_emb: output differs" in res.stdout
    assert "pos_emb first differs at token position 100 (positions 0-99 of this case agree)" in res.stdout

    res = runner.invoke(main, ["verify", str(bad), "--runtime", "ort-cpu"])
    assert res.exit_code == 1 and "worst at b=1 seq=128 past=0" in res.output, res.output
    res = runner.invoke(main, ["verify", str(bad), "--bisect"])
    assert res.exit_code == 1, res.output
    assert "(b=1 seq=128 past=0: ort-cpu's worst parity case in report-ort-cpu.json)" in res.stdout
    assert "pos_emb first differs at token position 100" in res.stdout


def _renamed_io(src, dst) -> None:
    """The export with its I/O renamed as a plain torch.onnx.export might name them (mapped by position)."""
    proto = onnx.load(str(src))
    ren = {"input_ids": "tokens", "attention_mask": "mask", "logits": "scores"}
    ren.update({v.name: f"cache_in_{i}" for i, v in enumerate(proto.graph.input[2:])})
    ren.update({v.name: f"cache_out_{i}" for i, v in enumerate(proto.graph.output[1:])})
    for vi in list(proto.graph.input) + list(proto.graph.output):
        vi.name = ren.get(vi.name, vi.name)
    for n in proto.graph.node:
        n.input[:] = [ren.get(x, x) for x in n.input]
        n.output[:] = [ren.get(x, x) for x in n.output]
    dst.parent.mkdir(parents=True)
    onnx.save(proto, str(dst))


def test_an_adopted_file_bisects_under_its_own_names(tiny_export, tiny, tmp_path):
    """A file another tool made, adopted: fed under its own names (the layout the adoption recorded); one without
    module scopes is compared on its outputs, by layer."""
    from mhaexport.exporter.adopt import adopt_onnx

    _renamed_io(tiny_export / "model.onnx", tmp_path / "plain" / "model.onnx")
    folder = adopt_onnx(tiny, tmp_path / "plain" / "model.onnx", tmp_path / "adopted").folder
    report = bisect(folder, tiny, batch=2, seq=5, past=2, pad=[0, 3])
    assert report.ok and not report.unmatched and not report.notes, report.summary()
    logits = next(r for r in report.rows if r.module == "output logits")
    assert logits.onnx_value == "scores" and logits.rel < 1e-5
    assert {"blocks.1.attn", "output present.1.value"} <= {r.module for r in report.rows}
    # the CLI: verify FILE.onnx --bisect adopts the file (it used to refuse any file but its own exports)
    res = CliRunner().invoke(main, ["verify", str(tmp_path / "plain" / "model.onnx"), "--config", "tiny", "--bisect",
                                    "--case", "2,3,1", "-o", str(tmp_path / "cli")])
    assert res.exit_code == 0, res.output
    assert "Adopted" in res.output and "no divergence" in res.stdout

    bare = onnx.load(str(tmp_path / "plain" / "model.onnx"))
    for node in bare.graph.node:
        del node.metadata_props[:]
    (tmp_path / "bare").mkdir()
    onnx.save(bare, str(tmp_path / "bare" / "model.onnx"))
    folder = adopt_onnx(tiny, tmp_path / "bare" / "model.onnx", tmp_path / "bare-adopted").folder
    res = CliRunner().invoke(main, ["verify", str(folder), "--bisect", "--case", "1,3,2"])
    assert res.exit_code == 0, res.output
    assert "carries no module scopes: compared on its outputs only" in res.stdout
    assert "no divergence: all 5 compared tensors" in res.stdout


def test_a_quantized_folder_bisects_clean_at_its_schemes_tolerance(tiny_export, tmp_path):
    """int4 weights are not exact: bisect holds each tensor to the scheme's relative logit error, and the module
    scopes the quantizer dropped from its MatMulNBits nodes are read from the float source (its sha256 checked)."""
    q = tmp_path / "int4"
    res = CliRunner().invoke(main, ["quantize", str(tiny_export), "-o", str(q), "--weights", "int4"])
    assert res.exit_code == 0, res.output
    res = CliRunner().invoke(main, ["verify", str(q), "--bisect"])
    assert res.exit_code == 0, res.output
    assert "tolerance 0.3, the int4 scheme's relative logit error" in res.stdout
    assert "no divergence" in res.stdout and "not compared" not in res.stdout  # every Linear found by its scope
    assert "MatMulNBits node_linear_" in res.stdout and "(default case: a quantized file: no exact parity case)" \
        in res.stdout

    import shutil

    moved = tmp_path / "elsewhere" / "int4"
    shutil.copytree(q, moved)  # its recorded source (a relative path) is not beside it any more
    report = bisect(moved)
    assert report.ok and "float source" in report.notes[-1] and "outputs only" in report.notes[-1]


def test_a_clean_fused_graph_has_no_divergence(tiny_export, tiny):
    """--attention fused: SkipLayerNormalization absorbs each block's residual add (its 4th output, the sum, is not
    the norm's output), so a block's own last step has no value in its scope: the block is listed as not compared,
    never matched to its submodule's value (which made a clean file diverge)."""
    from mhaexport.exporter.lowering import lower_attention

    c = tiny.contract
    proto = onnx.load(str(tiny_export / "model.onnx"))
    lower_attention(proto, "fused", n_heads=c.n_heads, head_dim=c.head_dim, n_kv_heads=c.n_kv_heads)
    report = bisect_onnx(proto, tiny)
    assert report.ok, report.summary()
    # the blocks (their residual add is inside the next norm) have no value of their own: not compared, never
    # mismatched; the Q/K/V projections (one packed MatMul) are compared together, against eager's q|k|v
    assert set(report.unmatched) == {f"blocks.{i}" for i in range(c.n_layers)}, report.unmatched
    packed = [r for r in report.rows if r.module.endswith("(packed)")]
    assert len(packed) == c.n_layers and all(r.rel < 1e-5 for r in packed), packed
    ln_2 = next(r for r in report.rows if r.module == "blocks.0.ln_2")
    assert ln_2.op.startswith("SkipLayerNormalization") and ln_2.rel < 1e-5
