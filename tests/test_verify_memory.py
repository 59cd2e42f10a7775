"""Verify's activations are bounded (issue 38, item 5): the sweep runs case by case and keeps figures, not outputs;
compare() reduces long arrays in blocks with the same figures; eager's reference of a case is computed once for every
runtime; the planner's estimate (verify.sweep.sweep_peak_bytes) bounds what the sweep holds."""

from __future__ import annotations

import tracemalloc
import weakref

import numpy as np
import pytest

from mhaexport.core.iospec import ModelContract
from mhaexport.runtime.runner import Runner
from mhaexport.verify import compare as cmp
from mhaexport.verify.checks import check_dynamic_shapes, check_finite, check_parity, cross_provider
from mhaexport.verify.compare import Tolerance
from mhaexport.verify.report import RuntimeInfo
from mhaexport.verify.results import Context, outputs_bytes
from mhaexport.verify.sweep import Case, build_sweep, case_bytes, sweep_peak_bytes


class _Spy(Runner):
    """A toy runtime whose logits are seeded noise plus an offset; counts its live output arrays (weakrefs) and
    the most alive at once, and its runs."""

    def __init__(self, name, contract, offset=0.0):
        super().__init__(name, contract)
        self.offset, self.live, self.most, self.runs = offset, 0, 0, 0

    def _gone(self):
        self.live -= 1

    def run_impl(self, ids, mask, past):
        B, T = ids.shape
        c = self.contract
        rng = np.random.default_rng(int(ids.sum()) + T)
        logits = rng.standard_normal((B, T, c.vocab_size), dtype=np.float32) + np.float32(self.offset)
        kv = np.ones((B, c.n_kv_heads, mask.shape[1], c.head_dim), np.float32)
        self.runs += 1
        self.live += 1
        self.most = max(self.most, self.live)
        weakref.finalize(logits, self._gone)
        return logits, tuple((kv, kv.copy()) for _ in range(c.n_layers))


def _planned(contract, cases, *runners):
    ctx = Context(contract=contract, cases=cases, tol=Tolerance(1e-4, 1e-3), eager=runners[0], export_sizes=(3, 5))
    ctx.plan([(r, ctx) for r in runners])
    return ctx


def test_the_sweep_holds_one_case_at_a_time_and_runs_eager_once_per_case():
    c = ModelContract(n_layers=2, n_heads=2, head_dim=4, vocab_size=512, max_positions=64)
    cases = build_sweep(c)
    eager, cpu, cuda = _Spy("eager", c), _Spy("ort-cpu", c, 4e-5), _Spy("ort-cuda", c, -4e-5)
    ctx = _planned(c, cases, eager, cpu, cuda)
    results = [check(r, ctx) for r in (cpu, cuda) for check in (check_parity, check_finite, check_dynamic_shapes)]
    assert [r.status for r in results] == [True] * 6
    assert len(cases) >= 9 and cpu.most == 1 and cuda.most == 1  # never two of its cases' outputs alive
    assert eager.runs == len(cases) and cpu.runs == len(cases)  # eager's reference once per case, for both
    infos = {r.name: RuntimeInfo(r.name, "ran") for r in (eager, cpu, cuda)}
    (cross,) = cross_provider([eager, cpu, cuda], infos, ctx)  # from the sweep's own runs: nothing run again
    assert cpu.runs == len(cases) and cuda.runs == len(cases)
    again = Context(contract=c, cases=cases, tol=Tolerance(1e-4, 1e-3), eager=eager, export_sizes=(3, 5))
    (fallback,) = cross_provider([eager, cpu, cuda], infos, again)  # not run together: each case run again
    assert fallback.figures.to_dict() == cross.figures.to_dict() and fallback.status == cross.status


def test_a_sweep_of_large_logits_peaks_far_below_holding_them_all():
    """tracemalloc's peak over parity, finite and dynamic-shapes on 24 cases of (2, 16) x 60,000 logits: what the
    sweep of the old design held (every case's outputs of eager and the runtime) is ~4 x what it holds now, and the
    planner's estimate bounds it."""
    c = ModelContract(n_layers=1, n_heads=1, head_dim=2, vocab_size=60_000, max_positions=64)
    cases = [Case(2, 16, 0, seed=i) for i in range(24)]
    eager, ort = _Spy("eager", c), _Spy("ort-cpu", c, 1e-5)
    ctx = _planned(c, cases, eager, ort)
    tracemalloc.start()
    try:
        assert check_parity(ort, ctx).status is True
        check_finite(ort, ctx), check_dynamic_shapes(ort, ctx)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    held_all = 2 * sum(case_bytes(c, case) for case in cases)  # eager's and the runtime's outputs of every case
    assert peak < held_all / 4, (peak, held_all)
    assert peak < sweep_peak_bytes(c, cases, long_checks=False), peak


def test_compare_in_blocks_gives_the_figures_of_one_pass(monkeypatch):
    rng = np.random.default_rng(3)
    a = rng.standard_normal((3, 40, 50)).astype(np.float32)
    e = a + (rng.standard_normal(a.shape) * 1e-4).astype(np.float32)
    e[1, 7, 3] = np.nan
    rows = rng.random((3, 40, 1)) > 0.3
    tol = Tolerance(1e-4, 1e-3)
    monkeypatch.setattr(cmp, "CHUNK_ELEMENTS", 10 ** 9)
    whole = cmp.compare(a, e, tol, rows)
    for limit in (7, 50, 333, 2000):  # blocks smaller than a row, a row, rows, a slab
        monkeypatch.setattr(cmp, "CHUNK_ELEMENTS", limit)
        part = cmp.compare(a, e, tol, rows)
        assert str(part.figures()) == str(whole.figures()) and part.stats() == whole.stats()  # (NaN as NaN)
        assert (part.hist == whole.hist).all() and part.sum_abs == pytest.approx(whole.sum_abs, rel=1e-12)
    assert whole.mismatched >= 1 and whole.total == int(rows.sum()) * 50


def test_case_bytes_is_what_a_run_holds_and_the_estimate_grows_with_the_model():
    c = ModelContract(n_layers=3, n_heads=2, head_dim=4, vocab_size=100, max_positions=64)
    case = Case(2, 5, 7, (0, 3))
    ids, mask, past = case.inputs(c)
    out = _Spy("ort-cpu", c).run(ids, mask, past)
    assert case_bytes(c, case) == outputs_bytes(out) + outputs_bytes(past) + ids.nbytes + mask.nbytes
    small = ModelContract(n_layers=12, n_heads=12, head_dim=64, vocab_size=32000, max_positions=2048)
    big = ModelContract(n_layers=20, n_heads=12, head_dim=128, vocab_size=32000, max_positions=2048)
    s, m = (sweep_peak_bytes(x, build_sweep(x)) for x in (small, big))
    assert 0 < s < m and sweep_peak_bytes(small, build_sweep(small), runtimes_at_once=2) > s
    longest = case_bytes(small, Case(1, 2048, 0))
    assert longest < s < sum(case_bytes(small, x) for x in build_sweep(small, "full"))


def _generation(module, contract, stepwise_max, monkeypatch):
    from mhaexport.runners.decoder import EagerRunner
    from mhaexport.verify import checks

    monkeypatch.setattr(checks, "STEPWISE_RECOMPUTE_MAX_PROMPT", stepwise_max)
    eager = EagerRunner("eager", contract, module)
    ctx = Context(contract=contract, cases=[], tol=Tolerance(1e-4, 1e-3), eager=eager, export_sizes=(3, 5),
                  gen_tokens=6)
    return checks.check_generation(eager, ctx)


@pytest.mark.parametrize("bug", [None, "window_in_decode"])
def test_the_long_prompts_recompute_in_one_forward_proves_what_step_by_step_did(bug, tiny, monkeypatch):
    """Eager's cached greedy decode held to a recompute: step by step (n forwards) and in one forward of prompt +
    tokens (checks.recomputed) agree — the same tokens, status and figures within float32 rounding on the tiny
    model — and both fail a decode path that goes wrong past 48 positions (tests/planted/bugs.py)."""
    from planted import bugs

    module = tiny.module if bug is None else getattr(bugs, bug)()
    step = _generation(module, tiny.contract, 10 ** 6, monkeypatch)
    once = _generation(module, tiny.contract, 0, monkeypatch)
    assert step.status is once.status is (bug is None), (step.message, once.message)
    f1, f2 = step.figures.to_dict(), once.figures.to_dict()
    for key in ("tokens", "matched", "first_divergence", "long_matched", "long_first_divergence"):
        assert f1.get(key) == f2.get(key), key
    if bug is None:
        assert max(f2["step_max_abs"] + f2["long_step_max_abs"]) < 1e-4
