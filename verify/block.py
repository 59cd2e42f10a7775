"""The attention block on its own (``mhaexport onnx|torchscript --module attention``): its context and its checks,
the suite's ``module`` subject (verify/suite.py: the one table of checks; verify/module.py: ``verify_module``).

Same report, verdicts and exit codes as the decoder (:class:`~mhaexport.verify.report.VerifyReport`); runtimes
``eager``, ``torch-mha`` (torch's own attention with the same weights: the second reference), ``torchscript``,
``ort-cpu``, ``ort-cuda``; checks:

- **parity**: output, present key/value and attention weights against eager over a seeded sweep of (batch, seq,
  past) — seq 1, lengths never used at export, past 0, 1 and many;
- **finite**: no NaN/inf in any output (the decoder's own check, on the block's named outputs);
- **causality** (causal mask): changing x after position k changes no output, weight or cache entry before k;
  bidirectional: not applicable (reported skipped, never passed);
- **cache-consistency**: attention over [past; new] fed with the cache (token by token and in chunks) == one call
  over the whole sequence without a cache (bidirectional: the rows of the last chunk, which see every key);
- **demonstration**, the article's: position 1's weight on position 3 is exactly 0 with the causal mask and > 0
  without, and position 1's weights sum to 1 (a mask applied after softmax leaves them short of 1).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from mhaexport.core import iospec
from mhaexport.core.iospec import ModuleContract
from mhaexport.runners.block import ModuleOutputs, ModuleRunner
from mhaexport.verify.checks import causality_by_perturbation, parity_over_sweep
from mhaexport.verify.compare import Diff, Tolerance, compare, rounded
from mhaexport.verify.figures import CacheFigures, CausalityFigures, DemonstrationFigures, ParityFigures
from mhaexport.verify.results import CheckResult, SweepContext
from mhaexport.verify.sweep import Case, build_sweep

OUTPUTS = ("output", "present", "attention_weights")  # what parity reports per output (present: key and value)
DEMO_QUERY, DEMO_KEY = 1, 3  # the article's demonstration: does position 1 attend to position 3?


def module_sweep(contract: ModuleContract, kind: str = "quick", seed: int = 0) -> list[Case]:
    """The decoder sweep's (batch, seq, past) shapes without padding (the block has none): seq 1 and 2, lengths
    the exporter never used (it traced seq=3, past=5) up to max_positions, past 0, 1 and many."""
    cases, seen = [], set()
    for case in build_sweep(contract, kind, seed):
        key = (case.batch, case.seq, case.past)
        if key not in seen:
            seen.add(key)
            cases.append(Case(case.batch, case.seq, case.past, (), seed=case.seed))
    return cases


@dataclass(kw_only=True)
class ModuleContext(SweepContext):
    """The module checks' context: the decoder's machinery (sweep memo, eager's references, one cross-provider
    comparison) on the block's contract, inputs and outputs."""

    contract: ModuleContract
    eager: ModuleRunner

    output_kinds: ClassVar[tuple[str, ...]] = OUTPUTS

    def inputs(self, case: Case) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return iospec.dummy_module_inputs(self.contract, case.batch, case.seq, case.past, seed=case.seed)

    def compare(self, case: Case, actual: ModuleOutputs, expected: ModuleOutputs, tol: Tolerance
                ) -> dict[str, Diff]:
        return compare_module(actual, expected, tol)

    def named_outputs(self, outputs: ModuleOutputs) -> list[tuple[str, np.ndarray]]:
        return list(zip(iospec.MODULE_OUTPUTS, outputs))


def compare_module(actual: ModuleOutputs, expected: ModuleOutputs, tol: Tolerance) -> dict[str, Diff]:
    """{"output", "present" (key and value), "attention_weights"}: each a Diff at ``tol`` (``present`` at its
    per-output override when given)."""
    (o, k, v, w), (oe, ke, ve, we) = actual, expected
    tp = tol.for_output("present")
    return {"output": compare(o, oe, tol), "present": compare(k, ke, tp).merge(compare(v, ve, tp)),
            "attention_weights": compare(w, we, tol)}


def check_parity(runner: ModuleRunner, ctx: ModuleContext) -> CheckResult:
    """Every sweep case against eager: output, present key/value and attention weights (eager itself: the suite's
    row, verify/suite.py)."""
    baked = runner.baked_axes()
    if baked:
        return CheckResult("parity", False, ParityFigures.of(baked_axes=len(baked)),
                           f"the graph fixes dynamic axes to the export's sizes: {'; '.join(baked[:3])}")
    return parity_over_sweep(ctx.sweep(runner), ctx.output_kinds, ctx.tol, lambda case, run: run.by_kind)


def check_causality(runner: ModuleRunner, ctx: ModuleContext) -> CheckResult:
    """Causal mask: change x after position k; the outputs and weight rows before k and the cache before k must
    not change. Bidirectional: not applicable (never passed)."""
    c = ctx.contract
    if not c.causal:
        return CheckResult("causality", None, CausalityFigures.of(not_applicable=True),
                           "n/a: bidirectional block (--mask none): every position attends to every other by design")
    shapes = [(seq, past) for seq, past in ((min(10, c.max_positions), 0), (min(6, c.max_positions - 4), 4))
              if seq >= 2]

    def probe(seq: int, past: int, k: int) -> tuple[Diff, float]:
        x, pk, pv = iospec.dummy_module_inputs(c, 2, seq, past, seed=ctx.seed + 11)
        changed = x.copy()
        changed[:, k:] += np.random.default_rng(ctx.seed + 7).standard_normal(changed[:, k:].shape).astype(x.dtype)
        base, pert = runner.run(x, pk, pv), runner.run(changed, pk, pv)
        d = Diff()
        d = d.merge(compare(pert[0][:, :k], base[0][:, :k], ctx.tol))  # outputs before k
        d = d.merge(compare(pert[1][:, :, :past + k], base[1][:, :, :past + k], ctx.tol))  # cached keys before k
        d = d.merge(compare(pert[2][:, :, :past + k], base[2][:, :, :past + k], ctx.tol))  # cached values before k
        d = d.merge(compare(pert[3][:, :, :k], base[3][:, :, :k], ctx.tol))  # weight rows of queries before k
        return d, float(np.abs(pert[0][:, k:] - base[0][:, k:]).max())

    return causality_by_perturbation(shapes, probe, "changing x at positions {k}..{last} changed earlier outputs "
                                     "or weights", "earlier outputs, weights and cache unchanged (max abs "
                                     "{earlier:.3g}; later outputs moved by {later:.3g})")


def _fed(runner: ModuleRunner, x: np.ndarray, chunks: list[int]) -> list[tuple[int, ModuleOutputs]]:
    """x (B, N, E) fed chunk by chunk, each call's present fed back as the next past: [(start, outputs), ...]."""
    c = runner.contract
    empty = np.zeros((x.shape[0], c.n_kv_heads, 0, c.head_dim), dtype=x.dtype)  # (B, H_kv, 0, D)
    pk, pv, pos, out = empty, empty, 0, []
    for n in chunks:
        o = runner.run(x[:, pos:pos + n], pk, pv)
        out.append((pos, o))
        pk, pv = o[1], o[2]
        pos += n
    return out


def check_cache_consistency(runner: ModuleRunner, ctx: ModuleContext) -> CheckResult:
    """Attention over [past; new] with the cache == one call over the whole sequence without one.

    Causal: token by token and in chunks, every call's outputs and weight rows equal the whole call's rows (their
    weights over the keys so far), and the final cache equals its present. Bidirectional: a prefix, then the rest
    with the prefix's cache: the rest's rows see every key, so they equal the whole call's rows."""
    c = ctx.contract
    N = min(12, c.max_positions)
    x = iospec.dummy_module_inputs(c, 2, N, 0, seed=ctx.seed + 23)[0]  # (2, N, d_model)
    full = runner.run(x)  # no cache: output (2, N, E), present (2, H_kv, N, D), weights (2, H, N, N)
    plans = ({"token by token": [1] * N, "chunked " + "+".join(map(str, (N // 3, 1, N - N // 3 - 1))):
              [N // 3, 1, N - N // 3 - 1]} if c.causal else
             {f"prefix {N - 1} + 1": [N - 1, 1], f"prefix {N // 2} + {N - N // 2}": [N // 2, N - N // 2]})
    parts: dict[str, Diff] = {}
    for label, chunks in plans.items():
        d = Diff()
        calls = _fed(runner, x, chunks)
        for start, (o, k, v, w) in (calls if c.causal else calls[-1:]):
            end = start + o.shape[1]
            d = d.merge(compare(o, full[0][:, start:end], ctx.tol))
            d = d.merge(compare(w, full[3][:, :, start:end, :end], ctx.tol))  # over the keys 0 .. end - 1
        _, (_, k, v, _) = calls[-1]
        tp = ctx.tol.for_output("present")
        parts[label] = d.merge(compare(k, full[1], tp)).merge(compare(v, full[2], tp))
    fig = CacheFigures.of(**{f"{'decode' if i == 0 else 'chunked'}_max_abs": rounded(d.max_abs)
                             for i, d in enumerate(parts.values())}, tokens=N)
    bad = [f"{label} with the cache differs from one call over all {N} positions (max abs {d.max_abs:.3g})"
           for label, d in parts.items() if not d.ok]
    if bad:
        return CheckResult("cache-consistency", False, fig, "; ".join(bad))
    worst = max(d.max_abs for d in parts.values())
    return CheckResult("cache-consistency", True, fig,
                       f"{' and '.join(parts)} with the cache == one call over {N} positions (max abs {worst:.3g})")


def check_demonstration(runner: ModuleRunner, ctx: ModuleContext) -> CheckResult:
    """The article's demonstration on 5 positions (batch 2, every head): with the causal mask, position 1's weight
    on position 3 is exactly 0; without a mask it is > 0. Either way position 1's weights sum to 1 (softmax over
    the allowed keys: a mask applied after softmax leaves the row short of 1)."""
    c = ctx.contract
    x = iospec.dummy_module_inputs(c, 2, 5, 0, seed=ctx.seed + 53)[0]  # (2, 5, d_model)
    weights = runner.run(x)[3]  # (2, H, 5, 5)
    w13 = weights[:, :, DEMO_QUERY, DEMO_KEY].astype(np.float64)  # (2, H)
    sums = weights[:, :, DEMO_QUERY, :].astype(np.float64).sum(-1)  # (2, H): a softmax row sums to 1
    worst_sum = float(sums.flat[np.argmax(np.abs(sums - 1.0))])
    row_sum_err = abs(worst_sum - 1.0)
    row = [float(f"{v:.3g}") for v in weights[0, 0, DEMO_QUERY]]
    fig = DemonstrationFigures.of(weight_1_3_max=float(w13.max()), weight_1_3_min=float(w13.min()),
                                  row_sum_error=rounded(row_sum_err), row_1=row, mask=c.mask, pairs=int(w13.size))
    shown = "[" + ", ".join(f"{v:.3g}" for v in row) + "]"
    sums_to_1 = row_sum_err <= ctx.tol.atol + ctx.tol.rtol
    if c.causal:
        if not (w13 == 0.0).all():
            return CheckResult("demonstration", False, fig,
                               f"causal, yet weights[b, h, 1, 3] != 0 for {int((w13 != 0).sum())}/{w13.size} "
                               f"(batch, head) pairs (max {w13.max():.3g}): position 1 attends to position 3, a "
                               f"future position — the mask is missing or does not reach the softmax; row 1 of head "
                               f"0: {shown}")
        if not sums_to_1:
            return CheckResult("demonstration", False, fig,
                               f"weights[b, h, 1, 3] = 0, but position 1's weights sum to {worst_sum:.3g}, not 1: "
                               f"the mask is applied after softmax (future keys stayed in its denominator); row 1 of "
                               f"head 0: {shown}")
        return CheckResult("demonstration", True, fig,
                           f"causal: weights[b, h, 1, 3] = 0 exactly for all {w13.size} (batch, head) pairs: position "
                           f"1 does not attend to position 3; row 1 of head 0: {shown}")
    if not (w13 > 0.0).all():
        return CheckResult("demonstration", False, fig,
                           f"bidirectional, yet weights[b, h, 1, 3] = 0 for {int((w13 <= 0).sum())}/{w13.size} "
                           f"(batch, head) pairs: a mask is applied where none was asked; row 1 of head 0: {shown}")
    if not sums_to_1:
        return CheckResult("demonstration", False, fig, f"position 1's weights sum to {worst_sum:.3g}, not 1; row 1 "
                                                        f"of head 0: {shown}")
    return CheckResult("demonstration", True, fig,
                       f"bidirectional: weights[b, h, 1, 3] > 0 for all {w13.size} (batch, head) pairs (min "
                       f"{w13.min():.3g}): position 1 attends to position 3; row 1 of head 0: {shown}")
