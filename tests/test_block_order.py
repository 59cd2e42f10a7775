"""Block order (runners/plan.py, runners/blocks.py): a check's planned calls run through one layer before the next on
eager PyTorch compute exactly what each call computes alone — bit for bit, across the built-in decoder and the
Hugging Face families, decode chains, forks, given pasts and selected rows — and verify's mapped mode runs eager's
checks so, with the same figures and verdicts as the whole mode, a planted bug caught alike."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from mhaexport.cli import main
from mhaexport.runners.decoder import EagerRunner
from mhaexport.runners.plan import BLOCK, IN_TURN, Plan, decoded, order_of, run_in_turn, run_plan

BUGS = str(Path(__file__).parent / "planted" / "bugs.py")


def _plan(c, seed: int = 0) -> tuple[Plan, dict[str, list[int]]]:
    """A plan of every shape a check writes: a prefill, a token-by-token chain, a chunked chain, a given past, a
    second call extending the prefill (a fork), a left-padded row, and a prefill whose logits are kept at two rows."""
    rng = np.random.default_rng(seed)
    p, chains = Plan(), {}
    n = 12
    ids = rng.integers(0, c.vocab_size, (2, n), dtype=np.int64)
    mask = np.ones((2, n), np.int64)
    mask[1, :3] = 0  # left padding in row 1
    chains["prefill"] = p.chain(ids, mask, [n], keep=True)
    chains["steps"] = p.chain(ids, mask, [1] * n, keep=True)
    chains["chunks"] = p.chain(ids, mask, [4, 1, 3, 4], keep=True)
    past = tuple((rng.standard_normal((2, c.n_kv_heads, 5, c.head_dim)).astype(np.float32),
                  rng.standard_normal((2, c.n_kv_heads, 5, c.head_dim)).astype(np.float32))
                 for _ in range(c.n_layers))
    chains["given"] = [p.add(ids[:, :3], np.ones((2, 8), np.int64), past, keep=True)]
    chains["fork"] = [p.add(ids[:, :2], np.ones((2, n + 2), np.int64), chains["prefill"][0], keep=True)]
    chains["rows"] = p.chain(ids, mask, [n - 2, 1, 1], rows={0: [3, 7]})
    return p, chains


def _same(a, b, chains) -> None:
    for name, chain in chains.items():
        la, pa = decoded(a, chain)
        lb, pb = decoded(b, chain)
        assert la.shape == lb.shape and np.array_equal(la, lb), (name, float(np.abs(la - lb).max()))
        assert (pa is None) == (pb is None), name
        for (ka, va), (kb, vb) in zip(pa or (), pb or ()):
            assert np.array_equal(ka, kb) and np.array_equal(va, vb), name


def _both_orders(module, contract):
    eager = EagerRunner("eager", contract, module).activate()
    plan_a, chains = _plan(contract)
    in_turn = run_in_turn(eager, plan_a.calls)
    plan_b, _ = _plan(contract)
    eager.block_order = True
    assert order_of(eager) == (BLOCK, "")
    blocked = run_plan(eager, plan_b.calls)
    assert eager.plan_calls == {BLOCK: len(plan_b.calls)}
    return in_turn, blocked, chains


def test_the_built_in_decoder_block_by_block_is_bit_for_bit_each_call_alone(tiny):
    in_turn, blocked, chains = _both_orders(tiny.module, tiny.contract)
    _same(in_turn, blocked, chains)
    assert all(r.error is None for r in blocked)
    assert decoded(blocked, chains["rows"])[0].shape[1] == 2 + 2  # the two rows kept, then the two steps


@pytest.mark.parametrize("family", ["llama", "gpt2", "gemma2-window", "gpt-oss-window"])
def test_hugging_face_families_block_by_block_are_bit_for_bit_each_call_alone(hf_dir, family):
    from mhaexport.models.loading import load_hf

    loaded = load_hf(hf_dir(family, tokenizer=False))
    in_turn, blocked, chains = _both_orders(loaded.module, loaded.contract)
    _same(in_turn, blocked, chains)


def test_every_call_passes_a_layer_before_any_call_enters_the_next(tiny):
    """What makes the order worth it: the layers compute in non-decreasing order over the whole plan (each layer's
    weights read once), where call by call they compute 0, 1, 0, 1, ..."""
    entered: list[int] = []
    # (after each layer's forward: a pre-hook of ours would run before the scheduler's own pause at the entry)
    hooks = [b.register_forward_hook(lambda m, a, o, i=i: entered.append(i)) for i, b in enumerate(tiny.module.blocks)]
    try:
        eager = EagerRunner("eager", tiny.contract, tiny.module).activate()
        plan, _ = _plan(tiny.contract)
        run_in_turn(eager, plan.calls)
        assert entered != sorted(entered)
        entered.clear()
        eager.block_order = True
        run_plan(eager, plan.calls)
    finally:
        for h in hooks:
            h.remove()
    n = len(plan.calls)
    assert entered == sorted(entered) and len(entered) == n * tiny.contract.n_layers


def test_a_failing_call_fails_its_chain_and_nothing_else(tiny):
    c = tiny.contract
    eager = EagerRunner("eager", c, tiny.module).activate()
    eager.block_order = True
    p = Plan()
    ok = p.chain(np.ones((1, 4), np.int64), np.ones((1, 4), np.int64), [2, 2])
    bad = p.chain(np.array([[c.vocab_size] * 2 + [1] * 2]), np.ones((1, 4), np.int64), [2, 2])  # its 1st call bad
    ran = run_plan(eager, p.calls)
    assert all(ran[i].error is None for i in ok)
    assert "outside the vocabulary" in str(ran[bad[0]].error)
    assert "the call it extends failed" in str(ran[bad[1]].error)
    with pytest.raises(Exception, match="outside the vocabulary"):
        decoded(ran, bad)


def test_a_model_whose_layers_are_not_known_runs_in_turn_and_says_why(tiny):
    import torch

    class Wrapped(torch.nn.Module):  # a user's own module around nothing mhaexport knows
        def __init__(self, inner):
            super().__init__()
            self.inner = [inner]

        def forward(self, ids, mask, past):
            return self.inner[0](ids, mask, past)

    eager = EagerRunner("eager", tiny.contract, Wrapped(tiny.module)).activate()
    eager.block_order = True
    order, why = order_of(eager)
    assert order == IN_TURN and "neither the built-in decoder nor the --hf adapter" in why
    p, chains = _plan(tiny.contract)
    ran = run_plan(eager, p.calls)
    assert eager.plan_calls == {IN_TURN: len(p.calls)} and all(r.error is None for r in ran)


def _verify(folder: Path, out: Path, *extra: str) -> dict:
    res = CliRunner().invoke(main, ["verify", str(folder), "--runtime", "ort-cpu", "-o", str(out), *extra])
    assert res.exit_code in (0, 1), res.output
    return json.loads((out / "report.json").read_text())


def _eager_figures(report: dict) -> dict:
    return {ch: (r["status"], r["figures"]) for ch, r in report["results"]["eager"].items()}


def test_verify_mapped_runs_eagers_checks_block_by_block_with_the_same_results(tiny_export, tmp_path):
    whole = _verify(tiny_export, tmp_path / "whole")
    mapped = _verify(tiny_export, tmp_path / "mapped", "--mapped")
    assert _eager_figures(mapped) == _eager_figures(whole)
    assert mapped["runtimes"]["eager"]["order"][BLOCK] > 100
    assert mapped["runtimes"]["ort-cpu"]["order"] == {IN_TURN: whole["runtimes"]["ort-cpu"]["order"][IN_TURN]}
    assert BLOCK not in whole["runtimes"]["eager"]["order"]
    md = (tmp_path / "mapped" / "report.md").read_text()
    assert "**Order:** eager ran " in md and "planned calls block by block" in md
    assert "**Order:**" not in (tmp_path / "whole" / "report.md").read_text()
    assert "Order: eager ran " in (tmp_path / "mapped" / "report.html").read_text()


@pytest.mark.parametrize("bug", ["mask_zero", "no_past_offset", "left_padding_only"])
def test_a_planted_bug_is_caught_alike_in_block_order(tmp_path, bug):
    folder = tmp_path / bug
    res = CliRunner().invoke(main, ["onnx", "--model", f"{BUGS}:{bug}", "-o", str(folder)])
    assert res.exit_code == 0, res.output
    whole = _verify(folder, tmp_path / "whole", "--trust-code")
    mapped = _verify(folder, tmp_path / "mapped", "--trust-code", "--mapped")
    assert mapped["runtimes"]["eager"]["order"].get(BLOCK), mapped["runtimes"]["eager"]
    assert _eager_figures(mapped) == _eager_figures(whole)
    assert any(status is False for status, _ in _eager_figures(mapped).values()), bug


# ---- ONNX Runtime over per-layer pieces of the file --------------------------------------------------------------

def test_the_file_splits_into_one_piece_per_layer_holding_every_node_once_its_weights_by_reference(external_export,
                                                                                                    tiny):
    import onnx

    from mhaexport.runners.pieces import split

    whole = onnx.load(str(external_export / "model.onnx"), load_external_data=False)
    n = tiny.contract.n_layers
    data_bytes = (external_export / "model.onnx.data").stat().st_size
    pieces = split(external_export / "model.onnx", n)
    assert len(pieces.pieces) == n and pieces.prefix == "blocks"
    names = [node.name for p in pieces.pieces for node in onnx.load_from_string(p.model).graph.node]
    assert sorted(names) == sorted(node.name for node in whole.graph.node)  # every node, exactly once
    for p in pieces.pieces:
        proto = onnx.load_from_string(p.model)
        inline = [t for t in proto.graph.initializer if t.data_location != onnx.TensorProto.EXTERNAL]
        assert all(len(t.raw_data) <= 1024 for t in inline)  # the weights by reference (small constants inline)
        assert any(t.data_location == onnx.TensorProto.EXTERNAL for t in proto.graph.initializer)
        assert len(p.model) < data_bytes / 4  # the graph, not the weights
    assert "input_ids" in pieces.pieces[0].inputs and "logits" in pieces.pieces[-1].outputs


def test_onnx_runtime_in_pieces_computes_what_the_whole_file_does(external_export):
    """The same nodes on the same weights: equal to the whole session's outputs up to float32 rounding (each piece
    is optimized alone: a fusion across a layer boundary is not made)."""
    from mhaexport.artifact import ExportFolder
    from mhaexport.runners.registry import runner_for

    with ExportFolder.open(external_export) as ef:
        r = runner_for(ef, "ort-cpu", ef.contract).activate()
        p, chains = _plan(ef.contract)
        whole = run_in_turn(r, p.calls)
        r.block_order = True
        assert order_of(r) == (BLOCK, "")
        p2, _ = _plan(ef.contract)
        pieces = run_plan(r, p2.calls)
        r.deactivate()
    for name, chain in chains.items():
        la, pa = decoded(whole, chain)
        lb, pb = decoded(pieces, chain)
        assert la.shape == lb.shape and np.allclose(la, lb, atol=1e-5, rtol=1e-5), name
        for (ka, va), (kb, vb) in zip(pa or (), pb or ()):
            assert np.allclose(ka, kb, atol=1e-6) and np.allclose(va, vb, atol=1e-6), name


def test_a_file_that_cannot_be_split_runs_in_turn_and_says_why(tiny_lowered, tiny):
    """A fused file whose rewrites left values between layers untyped (ONNX Runtime's fusions): no piece can be
    cut; the plan runs in turn, the reason kept."""
    from mhaexport.artifact import ExportFolder
    from mhaexport.runners.registry import runner_for

    with ExportFolder.open(tiny_lowered["ort"]) as ef:
        r = runner_for(ef, "ort-cpu", ef.contract).activate()
        r.block_order = True
        order, why = order_of(r)
        assert order == IN_TURN and "records no type" in why, why
        p, _ = _plan(tiny.contract)
        ran = run_plan(r, p.calls)
        r.deactivate()
    assert r.plan_calls == {IN_TURN: len(p.calls)} and all(x.error is None for x in ran)


def test_verify_mapped_runs_the_files_checks_in_pieces_and_a_planted_file_bug_fails_alike(external_export, tmp_path):
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from planted import attention_graph
    from planted.edit import rehashed_copy

    whole = _verify(external_export, tmp_path / "whole")
    mapped = _verify(external_export, tmp_path / "mapped", "--mapped")
    assert mapped["runtimes"]["ort-cpu"]["order"][BLOCK] > 100
    assert {ch: r["status"] for ch, r in mapped["results"]["ort-cpu"].items()} == \
        {ch: r["status"] for ch, r in whole["results"]["ort-cpu"].items()}
    for ch in ("continuous-batching", "speculative", "prefix-reuse"):  # taped from eager's calls: runners/tape.py
        got, want = mapped["results"]["ort-cpu"][ch]["figures"], whole["results"]["ort-cpu"][ch]["figures"]
        assert got["order"] == BLOCK and want.get("order") is None, (ch, got.get("order"))
        assert [(r["tokens"], r["first_divergence"]) for r in got["runs"]] == \
            [(r["tokens"], r["first_divergence"]) for r in want["runs"]]
    bad = rehashed_copy(external_export, tmp_path / "bad",
                        lambda proto: attention_graph.mask_after_softmax(proto, "blocks.1.attn"))
    whole = _verify(bad, tmp_path / "bad-whole")
    mapped = _verify(bad, tmp_path / "bad-mapped", "--mapped")
    assert mapped["runtimes"]["ort-cpu"]["order"].get(BLOCK)
    failed = {ch for ch, r in whole["results"]["ort-cpu"].items() if r["status"] is False}
    assert "causality" in failed
    assert failed == {ch for ch, r in mapped["results"]["ort-cpu"].items() if r["status"] is False}


def test_the_report_says_why_a_file_asked_to_run_block_by_block_ran_call_by_call(tiny_lowered, tmp_path):
    report = _verify(tiny_lowered["ort"], tmp_path / "r", "--mapped")
    info = report["runtimes"]["ort-cpu"]
    assert BLOCK not in info["order"] and "records no type" in info["order_note"], info
    md = (tmp_path / "r" / "report.md").read_text()
    assert "planned calls call by call (not block by block: the file records no type of" in md


def test_generation_fed_the_references_tokens_is_the_free_running_decode_up_to_its_first_divergence(tiny_export):
    """The generation check feeds a runtime the reference's greedy tokens as one plan (runners/plan.py); up to and
    including the first step where they differ from the runtime's own choice its inputs are the free-running
    decode's: the same logits there, bit for bit."""
    from mhaexport.artifact import ExportFolder
    from mhaexport.runners.registry import runner_for
    from mhaexport.verify.checks import forced_greedy, greedy

    with ExportFolder.open(tiny_export) as ef:
        r = runner_for(ef, "ort-cpu", ef.contract).activate()
        prompt = np.random.default_rng(3).integers(0, ef.contract.vocab_size, (1, 7), dtype=np.int64)
        free = greedy(r, prompt, 6)
        same = forced_greedy(r, prompt, free.tokens)
        other = list(free.tokens)
        other[2] = (other[2] + 1) % ef.contract.vocab_size  # a reference that chose otherwise at step 2
        forced = forced_greedy(r, prompt, other)
        r.deactivate()
    assert same.tokens == free.tokens and all(np.array_equal(a, b) for a, b in zip(same.logits, free.logits))
    assert forced.tokens[:3] == free.tokens[:3]  # its own choice at step 2: the first divergence is seen there
    assert all(np.array_equal(forced.logits[i], free.logits[i]) for i in range(3))
    assert not np.array_equal(forced.logits[3], free.logits[3])  # after it: fed the reference's token, as told


def test_a_files_names_in_a_split_refusal_are_escaped_and_bounded():
    from mhaexport.runners.pieces import _named

    hostile = "\x1b[2J" + "x" * 10_000
    out = _named(hostile)
    assert "\x1b" not in out and out.startswith("\\x1b[2J") and len(out) <= 83
