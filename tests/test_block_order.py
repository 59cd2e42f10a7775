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
    assert "**Order:** eager: planned calls" in md and "block by block" in md
    assert "**Order:**" not in (tmp_path / "whole" / "report.md").read_text()
    assert "Order: eager: planned calls" in (tmp_path / "mapped" / "report.html").read_text()


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
