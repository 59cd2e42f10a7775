"""The checks of a runtime driven by contract calls, eager included (the suite's ``contract`` subject:
verify/suite.py holds the one table and run_check): each returns a :class:`CheckResult` (data, not text).

parity and dynamic-shapes compare a runtime with eager; causality, kv-consistency and padding compare a
runtime with *itself* under attention's invariants, so a bug that is wrong in eager and ONNX alike (a mask
filled with 0, a cache mask without the past offset) fails there too; generation compares greedy decoding
with eager's (and eager's cached decode with a full recompute).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from mhaexport.core import iospec
from mhaexport.core.errors import MhaExportError, first_line
from mhaexport.runners.decoder import RecomputeRunner
from mhaexport.runners.names import EAGER
from mhaexport.runners.plan import Plan, decoded
from mhaexport.runtime.decode import DecodeLoop, GenerationConfig
from mhaexport.runtime.runner import Runner
from mhaexport.verify.compare import Diff, Tolerance, compare, compare_outputs, merged, near_tie, rounded
from mhaexport.verify.figures import (CausalityFigures, DiffFigures, FiniteFigures, GenerationFigures, KvFigures,
                                      OutputStats, PaddingFigures, ParityFigures, ShapesFigures)
from mhaexport.verify.results import CROSS_PAIRS, WEIGHTS, CheckResult, Context, CrossResult, SweepContext
from mhaexport.verify.sweep import Case, unseen
from mhaexport.verify.windows import crossing, deploy_steps, span


def _static_reason(runner: Runner) -> str:
    return f"n/a: static export (runs only at seq={runner.fixed[0]} past={runner.fixed[1]})"


def check_parity(runner: Runner, ctx: Context) -> CheckResult:
    """Every sweep case against eager: logits on real rows, present on real keys (eager itself and a lossy
    artifact: not applicable, the suite's row says so)."""
    outputs = ctx.sweep(runner)  # {case: CaseRun}: each case's figures against eager, reduced as it ran
    scale = max((run.scale for run in outputs.values() if not isinstance(run, BaseException)),
                default=0.0)  # max |eager logits|
    dtype = runner.dtype if runner.dtype in _EPS else "float32"
    res = parity_over_sweep(outputs, ctx.output_kinds, ctx.tol, lambda case, run: run.by_kind,
                            rounding=(dtype, _EPS[dtype] * scale) if scale else None)
    present = (res.figures.per_output or {}).get("present")
    ran = [case for case, out in outputs.items() if not isinstance(out, BaseException)]
    res = crossing(res, ctx.contract, max((case.past + case.seq - 1 for case in ran), default=None))
    if res.status is True and dtype == "float32" and scale and ctx.recorded is None:  # float32 all through?
        lost = _precision_lost(runner, ctx)
        if lost:
            res.status, res.message = False, lost
            return res
    if res.status is False and present is not None and present.mismatch_fraction and ctx.recorded is None:
        names = _present_by_name(runner, ctx)
        bad = [(n, d) for n, d in names.items() if not d.ok]
        if bad:
            res.figures.set(present_failing={n: rounded(d.max_abs) for n, d in bad})
            shown = ", ".join(f"{n} (max abs {d.max_abs:.3g})" for n, d in bad[:4])
            more = f" (+{len(bad) - 4} more)" if len(bad) > 4 else ""
            res.message += (f"; present differs at {shown}{more}, the others agree" if len(bad) < len(names) else
                            "; present differs at every layer's key and value")
    return res


# A float32 file's output whose error against eager is this many float32 epsilons of its own scale has passed
# through a lower precision: ORT against eager differs by at most a few tens on the presets (accumulated float32
# rounding), a float16 round trip by ~4,000 (2^-11 / 2^-23), bfloat16 by ~65,000
PRECISION_EPSILONS = 1000.0


def _precision_lost(runner: Runner, ctx: Context) -> str | None:
    """For a float32 artifact that passed parity: one cache output (present.i.key/value) whose error is far beyond
    float32 rounding at its own scale — precision lost in that layer's cache (a float16 round trip), which stays
    under the tolerance on most values and so passes a sweep of a few cases — named, else None."""
    eps = _EPS["float32"]
    worst: dict[str, tuple[float, float]] = {}  # name -> (max abs error, max |eager|) on real keys
    for run in ctx.sweep(runner).values():
        if isinstance(run, BaseException) or run.present is None:
            continue
        for name, d in run.present.items():
            old = worst.get(name, (0.0, 0.0))
            worst[name] = (max(old[0], d.max_abs), max(old[1], run.present_scale[name]))
    ratio = {n: (err / (eps * big) if big else 0.0) for n, (err, big) in worst.items()}
    lost = sorted((n for n, r in ratio.items() if r > PRECISION_EPSILONS), key=lambda n: -ratio[n])
    if not lost or len(lost) == len(ratio):  # every output alike: the computation's own rounding, not one cache
        return None
    n = lost[0]
    fine = max((r for m, r in ratio.items() if m not in lost), default=0.0)
    return (f"precision lost in {n}{f' (and {len(lost) - 1} more)' if len(lost) > 1 else ''}: max abs "
            f"{worst[n][0]:.3g} is {ratio[n]:,.0f} x float32's epsilon at its scale while the other outputs stay within "
            f"{fine:.2g}: a float32 file whose cache passed through a lower precision (within the tolerance on "
            "most values, so a few cases can pass it)")


def _present_by_name(runner: Runner, ctx: Context) -> dict[str, Diff]:
    """{present.i.key|value: Diff over the sweep's real keys} of the cases that ran."""
    c = ctx.contract
    out: dict[str, Diff] = {n: Diff() for i in range(c.n_layers) for n in iospec.present_names(i)}
    for run in ctx.sweep(runner).values():
        if isinstance(run, BaseException) or run.present is None:
            continue
        for name, d in run.present.items():
            out[name] = out.get(name, Diff()).merge(d)
    return out


def parity_over_sweep(outputs: dict, kinds: tuple[str, ...], tol: Tolerance,
                      compare_case: Callable[[Case, Any], dict[str, Diff]],
                      rounding: tuple[str, float] | None = None) -> CheckResult:
    """The parity result of a sweep (``outputs``: {case: what the sweep kept of a runtime's run (a CaseRun), or
    the exception it raised}): ``compare_case`` gives each case's {kind: Diff} against eager; figures overall and
    per kind, the worst case,
    and one message (the first case that failed to run, or which kinds differ and the atol that would pass)."""
    total, worst_case, errors = Diff(), None, []
    by_kind = {k: Diff() for k in kinds}
    by_case = []  # [batch, seq, past, max abs or None (failed to run)]: report.html's error over the sweep
    for case, out in outputs.items():
        if isinstance(out, BaseException):
            errors.append(f"{case.name}: {first_line(out)}")
            by_case.append([case.batch, case.seq, case.past, None])
            continue
        by = compare_case(case, out)
        d = merged(by.values())
        by_case.append([case.batch, case.seq, case.past, rounded(d.max_abs)])
        if worst_case is None or d.max_abs > total.max_abs:
            worst_case = case.name
        total = total.merge(d)
        by_kind = {k: by_kind[k].merge(by[k]) for k in kinds}
    fig = ParityFigures.of(**total.figures(), cases=len(outputs), worst_case=worst_case, errors=len(errors),
                           per_output={k: OutputStats(**v.stats(), atol=tol.for_output(k).atol,
                                                      rtol=tol.for_output(k).rtol) for k, v in by_kind.items()},
                           by_case=by_case)
    differ = ""
    if not total.ok:
        bad = ", ".join(f"{k} {v.mismatched}/{v.total} (max abs {v.max_abs:.3g})" for k, v in by_kind.items()
                        if not v.ok)
        differ = (f"{total.mismatched}/{total.total} values differ from eager beyond {tol.describe()}: "
                  f"{bad}; worst at {worst_case}; {_tolerance_hint(total, rounding)}")
    if errors:  # the cases that ran still count: a failure to run must not hide what they show
        ran = (f"; in the {len(outputs) - len(errors)} case(s) that ran, {differ}" if differ else
               f"; the {len(outputs) - len(errors)} case(s) that ran agree (max abs {total.max_abs:.3g})"
               if len(outputs) > len(errors) else "")
        return CheckResult("parity", False, fig, f"failed to run at {len(errors)} case(s): {errors[0]}{ran}")
    if differ:
        return CheckResult("parity", False, fig, differ)
    return CheckResult("parity", True, fig, f"max abs {total.max_abs:.3g} over {fig.cases} cases")


# A difference reads as the dtype's rounding when its max abs is at most this many epsilons of the outputs' scale
# (max |eager logits|): ORT against eager in float32 differs by well under one such epsilon on the presets; a real
# edit of a weight by hundreds to thousands
ROUNDING_EPSILONS = 100.0
_EPS = {"float32": float(np.finfo(np.float32).eps), "float16": float(np.finfo(np.float16).eps),
        "bfloat16": 2.0 ** -7}


def _tolerance_hint(total: Diff, rounding: tuple[str, float] | None) -> str:
    """"atol X would pass" only where the difference is the size of the dtype's rounding at the outputs' scale
    (``rounding``: (dtype, eps x scale)); otherwise say that it is not, so nobody loosens a tolerance over a real
    change. Without a scale (the attention block), the plain hint."""
    if rounding is None:
        return f"atol {total.min_atol:.3g} would pass"
    dtype, unit = rounding
    times = total.max_abs / unit if unit else float("inf")
    if times <= ROUNDING_EPSILONS:
        return f"atol {total.min_atol:.3g} would pass (the size of {dtype} rounding at this scale)"
    return (f"not rounding: max abs {total.max_abs:.3g} is {times:,.0f} x {dtype}'s epsilon at this scale "
            f"(eps x max |eager| = {unit:.3g}), over {total.mismatch_fraction:.1%} of the values: a real change, "
            "not a tolerance to loosen")


def check_finite(runner: Runner, ctx: SweepContext) -> CheckResult:
    """No NaN or inf in any output of the sweep (the decoder's padded rows included); the decoder's and the
    attention block's alike (``ctx.named_outputs``)."""
    ran = [(c, o) for c, o in ctx.sweep(runner).items() if not isinstance(o, BaseException)]
    if not ran:
        return CheckResult("finite", None, {}, "no sweep case ran (see parity)")
    bad = [f"{n} non-finite in {name} at {case.name}" for case, run in ran for name, n in run.non_finite]
    fig = FiniteFigures.of(cases=len(ran), non_finite_outputs=len(bad))
    if bad:
        return CheckResult("finite", False, fig, bad[0])
    return CheckResult("finite", True, fig, f"all outputs finite over {len(ran)} cases")


def _perturbed(ids: np.ndarray, start: int, vocab: int, seed: int) -> np.ndarray:
    out = ids.copy()
    rng = np.random.default_rng(seed + 7)
    shift = rng.integers(1, vocab, size=out[:, start:].shape) if vocab > 1 else 0
    out[:, start:] = (out[:, start:] + shift) % max(vocab, 1)  # every future token changes
    return out


def check_causality(runner: Runner, ctx: Context) -> CheckResult:
    """Change the tokens after position k: logits before k, and the cache before k, must not change."""
    c = ctx.contract
    if runner.fixed is not None:
        shapes = [runner.fixed] if runner.fixed[0] >= 2 else []
        if not shapes:
            return CheckResult("causality", None, {"static": True},
                               _static_reason(runner) + " with seq=1: nothing to perturb")
    else:
        shapes = [(min(10, c.max_positions), 0), (min(6, c.max_positions - 4), 4)]
    shapes = [(seq, past) for seq, past in shapes if seq >= 2 and past >= 0]
    if not shapes:
        return CheckResult("causality", None, {}, f"max_positions={c.max_positions} leaves no sequence to perturb")

    plan, calls = Plan(), {}  # every shape's two calls written down first, run as one plan
    for seq, past in shapes:
        ids, mask, kv = ctx.inputs(Case(2, seq, past, (), seed=ctx.seed + 11))
        calls[seq, past] = (plan.add(ids, mask, kv, keep=True),
                            plan.add(_perturbed(ids, seq // 2, c.vocab_size, ctx.seed), mask, kv, keep=True))
    ran = plan.run(runner)

    def probe(seq: int, past: int, k: int) -> tuple[Diff, float]:
        base, pert = (ran[i].outputs() for i in calls[seq, past])
        rows = np.zeros((2, seq), dtype=bool)
        rows[:, :k] = True  # earlier query positions
        keys = np.zeros((2, past + seq), dtype=bool)
        keys[:, :past + k] = True  # earlier cache entries
        return compare_outputs(pert, base, ctx.tol, rows, keys), float(np.abs(pert[0][:, k:] - base[0][:, k:]).max())

    return causality_by_perturbation(shapes, probe, "changing tokens {k}..{last} changed earlier logits",
                                     "earlier outputs unchanged (max abs {earlier:.3g})")


def causality_by_perturbation(shapes: list[tuple[int, int]], probe: Callable[[int, int, int], tuple[Diff, float]],
                              failed: str, passed: str) -> CheckResult:
    """The causality check's loop, for the decoder and the MHA block alike: for each (seq, past) ``probe(seq,
    past, k)`` changes the inputs at positions k = seq // 2 .. seq - 1 and returns the Diff of everything before
    k (outputs, cache, weights) and how far the later outputs moved. ``failed`` / ``passed``: the messages, with
    ``{k}``, ``{last}`` (failed) and ``{earlier}``, ``{later}`` (passed) filled in."""
    worst, later, msgs = Diff(), 0.0, []
    for seq, past in shapes:
        k = seq // 2
        d, moved = probe(seq, past, k)
        later = max(later, moved)
        if not d.ok:
            msgs.append(failed.format(k=k, last=seq - 1) + f" (seq={seq} past={past}, max abs {d.max_abs:.3g})")
        worst = worst.merge(d)
    fig = CausalityFigures.of(max_abs_earlier=rounded(worst.max_abs), max_abs_later=rounded(later))
    if msgs:
        return CheckResult("causality", False, fig, msgs[0])
    return CheckResult("causality", True, fig, passed.format(earlier=worst.max_abs, later=later))


def _decode(runner: Runner, ids: np.ndarray, mask: np.ndarray, chunks: list[int]):
    """Feed ids in chunks through the decode loop (the cache growing in the runner's own form), each chunk with its
    mask columns; returns logits for every position (B, N, V) and the final cache as numpy pairs. (A check whose
    decodes are all known first writes them into one :class:`Plan` instead: runners/plan.py.)"""
    plan = Plan()
    chain = plan.chain(ids, mask, chunks, keep=True)
    return decoded(plan.run(runner), chain)


# What a check ran, in the report's figures: every decode check names its protocol
CONTRACT_PROTOCOL = "decode loop in the runner's own cache"
TRANSLATED_PROTOCOL = "contract calls translated into the shared buffer"
DEPLOY_PROTOCOL = "deploy loop: buffers in place, a ragged right-padded batch"


def _deploy_of(runner: Runner, ctx: Context) -> Runner | None:
    """The registry's runner of ``runner``'s session in its file's own protocol (the deploy loop generate and bench
    run: a shared cache's buffers in place, a ragged right-padded batch), None where ``runner`` drives its file so
    already or the Context has no registry (tests' bare Contexts)."""
    return ctx.deploy(runner) if ctx.deploy is not None else None


def _protocols(runner: Runner, ctx: Context) -> str:
    return (CONTRACT_PROTOCOL if _deploy_of(runner, ctx) is None
            else f"{TRANSLATED_PROTOCOL} + {DEPLOY_PROTOCOL}")


def ragged_prompts(ctx: Context, n_new: int, seed: int) -> list[np.ndarray]:
    """Two prompts of different lengths (the deploy loop pads them to one batch), leaving room for n_new tokens."""
    c = ctx.contract
    L = max(2, min(10, c.max_positions - n_new - 1))
    rng = np.random.default_rng(seed)
    return [rng.integers(0, c.vocab_size, L, dtype=np.int64), rng.integers(0, c.vocab_size, max(1, L - 3),
                                                                           dtype=np.int64)]


def _deploy_reference(runner: Runner, ctx: Context) -> Runner:
    """What the deploy loop is held to: eager; a lossy artifact, like its other invariants, and a file judged from a
    recorded reference (which keeps no run of the deploy loop's own tokens), to itself (the same file through the
    contract translation: one prefill of the whole sequence)."""
    return runner if ctx.lossy or ctx.recorded is not None else ctx.eager


def _deploy_run(runner: Runner, ctx: Context, n_new: int, seed: int):
    """The deploy loop (the registry's runner of the same session in the file's protocol) generating n_new greedy
    tokens for a ragged batch of two prompts, keeping each step's logits: (the prompts, the GenerationResult)."""
    prompts = ragged_prompts(ctx, n_new, seed)
    return prompts, DecodeLoop(_deploy_of(runner, ctx)).generate(
        [p.tolist() for p in prompts], GenerationConfig(max_new_tokens=n_new), keep_logits=True)


def _deploy_steps(runner: Runner, ctx: Context, n_new: int) -> tuple[Diff, dict, list[np.ndarray], list[list[int]]]:
    """The deploy loop over a ragged batch, greedy for n_new tokens (prefill, then n_new - 1 steps reusing the
    buffers in place), judged position by position against eager (a lossy file: itself, through the contract) fed
    the same tokens one row at a time. Returns the
    Diff of the logits, its figures, the prompts and each row's tokens."""
    prompts, res = _deploy_run(runner, ctx, n_new, ctx.seed + 43)
    d = Diff()
    for b, p in enumerate(prompts):
        seq = np.concatenate([p, np.array(res.tokens[b][:-1], dtype=np.int64)])[None]  # (1, P + n - 1)
        ref, _ = _decode(_deploy_reference(runner, ctx), seq, np.ones_like(seq), [seq.shape[1]])  # (1, S, V)
        for i, logits in enumerate(res.step_logits):
            d = d.merge(compare(logits[b], ref[0, len(p) - 1 + i], ctx.ltol))
    fig = {"deploy_rows": [len(p) for p in prompts], "deploy_steps": n_new, "deploy_max_abs": rounded(d.max_abs)}
    return d, fig, prompts, res.tokens


def _deploy_chunked(runner: Runner, ctx: Context) -> Diff:
    """The deploy loop's chunked prefill at batch 1 (the shared buffer takes several new tokens after a past only
    at batch 1): two chunks against one eager prefill."""
    twin = _deploy_of(runner, ctx)
    c = ctx.contract
    N = min(9, c.max_positions)
    ids = np.random.default_rng(ctx.seed + 47).integers(0, c.vocab_size, (1, N), dtype=np.int64)
    got, _ = _decode(twin, ids, np.ones_like(ids), [N // 2, N - N // 2])
    want, _ = _decode(_deploy_reference(runner, ctx), ids, np.ones_like(ids), [N])
    return compare(got, want, ctx.ltol)


def check_kv_consistency(runner: Runner, ctx: Context) -> CheckResult:
    """Token-by-token decode == one prefill; chunked prefill == one prefill; step t with the cache == a full
    forward of tokens 0..t without a cache (from-scratch recompute)."""
    if runner.fixed is not None:
        return CheckResult("kv-consistency", None, {"static": True}, _static_reason(runner))
    c = ctx.contract
    N = span(c, min(12, c.max_positions))
    case = Case(2, N, 0, (0, 3), seed=ctx.seed + 23)
    ids, mask, _ = ctx.inputs(case)
    rows, keys = case.real_rows(), case.real_keys()
    chunks = [x for x in (N // 3, 1, N // 4) if x] + [N - N // 3 - 1 - N // 4]
    chunks = [x for x in chunks if x > 0]
    recomputed = sorted({0, 1, N // 2, N - 1})
    plan = Plan()  # every decode of the check written down first (the tokens are given), run as one plan
    full_c, step_c, chunked_c = (plan.chain(ids, mask, ch, keep=True) for ch in ([N], [1] * N, chunks))
    scratch_c = {t: plan.chain(ids[:, :t + 1], mask[:, :t + 1], [t + 1], rows={0: [t]}) for t in recomputed}
    long_done = _long_context(plan, ctx)
    ran = plan.run(runner)
    full, full_kv = decoded(ran, full_c)
    parts: dict[str, Diff] = {}
    step, step_kv = decoded(ran, step_c)
    parts["token-by-token decode"] = compare_outputs((step, step_kv), (full, full_kv), ctx.tol, rows, keys)
    chunked, chunked_kv = decoded(ran, chunked_c)
    parts["chunked prefill " + "+".join(map(str, chunks))] = compare_outputs(
        (chunked, chunked_kv), (full, full_kv), ctx.tol, rows, keys)
    rec = Diff()
    for t in recomputed:
        scratch, _ = decoded(ran, scratch_c[t])  # (B, 1, V): position t's row
        rec = rec.merge(compare(step[:, t], scratch[:, 0], ctx.ltol, rows[:, t, None]))
    parts["cached decode vs from-scratch recompute"] = rec
    long_label, long_diff, first_bad, long_fig = long_done(ran)
    parts[long_label] = long_diff
    fig = KvFigures.of(decode_max_abs=rounded(parts["token-by-token decode"].max_abs),
                       chunked_max_abs=rounded(next(d for n, d in parts.items() if n.startswith("chunked")).max_abs),
                       recompute_max_abs=rounded(rec.max_abs), **long_fig, protocol=_protocols(runner, ctx))
    if _deploy_of(runner, ctx) is not None:  # in addition: the loop generate and bench run, in place and ragged
        n_deploy = deploy_steps(c, runner.feed.window_slots, 10, min(4, max(1, c.max_positions - 12)))
        steps, deploy_fig, _, _ = _deploy_steps(runner, ctx, n_deploy)
        parts["the deploy loop (buffers reused in place over a ragged right-padded batch)"] = steps
        chunked_deploy = _deploy_chunked(runner, ctx)
        parts["the deploy loop's chunked prefill"] = chunked_deploy
        fig.set(**deploy_fig, deploy_chunked_max_abs=rounded(chunked_deploy.max_abs))
    itself = ctx.lossy or ctx.recorded is not None
    against = "its own prefill of the same tokens" if itself else "eager fed the same tokens"
    bad = [f"{name} differs from {against} (max abs {d.max_abs:.3g})" if "deploy" in name
           else f"{name} differs from one prefill (max abs {d.max_abs:.3g})" if "recompute" not in name
           else f"{name} differ (max abs {d.max_abs:.3g})" for name, d in parts.items()
           if not d.ok and name != long_label]
    if not long_diff.ok:
        bad.append(f"{long_label} differs from one prefill of the whole sequence from position {first_bad} on "
                   f"(max abs {long_diff.max_abs:.3g}): the decode path goes wrong past some length")
    longest = max(N - 1, long_fig["long_to"])
    if bad:
        return crossing(CheckResult("kv-consistency", False, fig, "; ".join(bad)), c, longest)
    worst = max(d.max_abs for d in parts.values())
    deploy = (f"; the deploy loop (in place, ragged) agrees with {'itself' if itself else 'eager'}"
              if fig.deploy_max_abs is not None else "")
    return crossing(CheckResult("kv-consistency", True, fig,
                                f"decode, chunked prefill and recompute agree, out to position {long_fig['long_to']}"
                                f"{deploy} (max abs {worst:.3g})"), c, longest)


def _long_context(plan: Plan, ctx: Context) -> Callable[[list], tuple[str, Diff, int | None, dict]]:
    """Cached decode at the far end of the model, its calls written into ``plan``: one prefill of a
    max_positions-long sequence is the reference; small models decode the whole of it token by token
    (``ctx.long_full``), larger ones prefill to positions spread up to max_positions - 2 and decode two tokens after
    each. Returns what judges the plan's results: a label, the Diff on logits, the first position that differs (None)
    and the figures."""
    c = ctx.contract
    L = c.max_positions
    ids = np.random.default_rng(ctx.seed + 29).integers(0, c.vocab_size, (1, L), dtype=np.int64)  # (1, L)
    mask = np.ones((1, L), dtype=np.int64)
    tol = ctx.ltol
    if ctx.long_full or L <= 3:
        full_c = plan.chain(ids, mask, [L])  # (1, L, V): a small model's whole context
        step_c = plan.chain(ids, mask, [1] * L)  # (1, L, V)
        positions = list(range(L))
        label = f"token-by-token decode to position {L - 1}"

        def got_want(ran: list) -> tuple[np.ndarray, np.ndarray]:
            return decoded(ran, step_c)[0][0], decoded(ran, full_c)[0][0]
    else:
        starts = sorted({p for p in (L // 4, L // 2, 3 * L // 4, L - 2) if 1 <= p <= L - 2})
        positions = [q for P in starts for q in (P, P + 1)]
        full_c = plan.chain(ids, mask, [L], rows={0: positions})  # the prefill's rows at those positions, kept
        # a prefill to P, then two decode steps: only the two steps' rows kept
        step_cs = [plan.chain(ids[:, :P + 2], mask[:, :P + 2], [P, 1, 1], rows={0: []}) for P in starts]
        label = f"decode after a prefill to positions {', '.join(map(str, starts))}"

        def got_want(ran: list) -> tuple[np.ndarray, np.ndarray]:
            got = np.concatenate([decoded(ran, ch)[0][0] for ch in step_cs])
            return got, decoded(ran, full_c)[0][0]

    def judged(ran: list) -> tuple[str, Diff, int | None, dict]:
        got, want = got_want(ran)
        d = compare(got, want, tol)
        first = None
        if not d.ok:
            err = np.abs(got.astype(np.float64) - want.astype(np.float64))
            bad = (err > tol.atol + tol.rtol * np.abs(want)).any(axis=-1)
            first = positions[int(np.argmax(bad))]
        err = np.abs(got.astype(np.float64) - want.astype(np.float64)).max(axis=-1)  # (len(positions),)
        return label, d, first, {"long_to": positions[-1], "long_positions": len(positions),
                                 "long_max_abs": rounded(d.max_abs), "long_first_bad": first,
                                 "long_by_position": by_position(positions, err)}
    return judged


# at most this many [position, error] points per curve in a report (a long model's curve keeps each bin's worst)
CURVE_POINTS = 128


def by_position(positions: list[int], err: np.ndarray) -> list[list]:
    """[[position, max abs error], ...] for report.html's error-against-position plot: every position up to
    :data:`CURVE_POINTS`, beyond that each bin's last position with its bin's worst error."""
    if len(positions) <= CURVE_POINTS:
        return [[int(p), rounded(float(e))] for p, e in zip(positions, err)]
    bins = np.array_split(np.arange(len(positions)), CURVE_POINTS)
    return [[int(positions[b[-1]]), rounded(float(err[b].max()))] for b in bins]


def check_padding(runner: Runner, ctx: Context) -> CheckResult:
    """A padded row equals the same tokens unpadded, at prefill and over two decode steps after it.

    Both layouts: left padding (the contract's, what mhaexport.runtime uses) and right padding with the holes kept
    in the mask on every decode step (what onnxruntime-genai does with a batch of prompts).
    """
    if runner.fixed is not None:
        return CheckResult("padding", None, {"static": True}, _static_reason(runner))
    c = ctx.contract
    T, p, steps = span(c, min(10, c.max_positions - 2), room=2), 4, 2
    p = min(p, T - 1)
    if p < 1:
        return CheckResult("padding", None, {}, f"max_positions={c.max_positions} leaves no room for padding")
    case = Case(2, T, 0, seed=ctx.seed + 31)
    ids, mask, _ = ctx.inputs(case)
    rng = np.random.default_rng(ctx.seed + 37)
    nxt = rng.integers(0, c.vocab_size, (2, steps), dtype=np.int64)
    fig = PaddingFigures.of(pad=p)
    worst = 0.0
    plan, chains = Plan(), {}  # both sides' decodes written down first, run as one plan
    for side in ("left", "right"):
        real = slice(p, T) if side == "left" else slice(0, T - p)  # the padded row's real tokens
        side_ids, side_mask = ids.copy(), mask.copy()
        pads = slice(0, p) if side == "left" else slice(T - p, T)
        side_ids[1, pads], side_mask[1, pads] = 0, 0  # pad token 0, masked out
        all_ids = np.concatenate([side_ids, nxt], axis=1)  # (2, T + steps)
        all_mask = np.concatenate([side_mask, np.ones((2, steps), np.int64)], axis=1)
        solo_ids = np.concatenate([side_ids[1:, real], nxt[1:]], axis=1)  # unpadded: real tokens, then the steps
        chains[side] = (real, plan.chain(all_ids, all_mask, [T] + [1] * steps),  # (2, T + steps, V)
                        plan.chain(solo_ids, np.ones_like(solo_ids), [T - p] + [1] * steps))
    ran = plan.run(runner)
    for side in ("left", "right"):
        real, padded_chain, solo_chain = chains[side]
        padded, _ = decoded(ran, padded_chain)
        solo, _ = decoded(ran, solo_chain)
        d_prefill = compare(padded[1:, real], solo[:, :T - p], ctx.ltol)
        d_decode = compare(padded[1:, T:], solo[:, T - p:], ctx.ltol)
        fig.set(**{f"{side}_prefill_max_abs": rounded(d_prefill.max_abs),
                   f"{side}_decode_max_abs": rounded(d_decode.max_abs)})
        if not d_prefill.ok:
            return CheckResult("padding", False, fig, f"a row with {p} {side} pads differs from the same tokens "
                                                      f"unpadded (max abs {d_prefill.max_abs:.3g})")
        if not d_decode.ok:
            return CheckResult("padding", False, fig, f"decode steps after a {side}-padded prefill differ from the "
                                                      f"unpadded sequence (max abs {d_decode.max_abs:.3g})")
        worst = max(worst, d_prefill.max_abs, d_decode.max_abs)
    fig.set(protocol=_protocols(runner, ctx))
    if (twin := _deploy_of(runner, ctx)) is not None:  # the file's own padding: ragged rows right-padded, in place
        prompts, batch = _deploy_run(runner, ctx, steps, ctx.seed + 53)
        d = Diff()
        for b, q in enumerate(prompts):
            alone = DecodeLoop(twin).generate([q.tolist()], GenerationConfig(max_new_tokens=steps), keep_logits=True)
            for got, want in zip(batch.step_logits, alone.step_logits):
                d = d.merge(compare(got[b], want[0], ctx.ltol))
        fig.set(deploy_ragged_max_abs=rounded(d.max_abs))
        if not d.ok:
            return CheckResult("padding", False, fig, f"in the deploy loop a row of a ragged right-padded batch "
                                                      f"differs from the same row alone (max abs {d.max_abs:.3g})")
        worst = max(worst, d.max_abs)
        return crossing(CheckResult("padding", True, fig, f"left- and right-padded == unpadded, and in the deploy "
                                                          f"loop a ragged batch's rows == each row alone (max abs "
                                                          f"{worst:.3g})"), c, T - p + steps - 1)
    return crossing(CheckResult("padding", True, fig, f"left- and right-padded == unpadded (max abs {worst:.3g})"),
                    c, T - p + steps - 1)


def check_dynamic_shapes(runner: Runner, ctx: Context) -> CheckResult:
    """The artifact runs at lengths never used at export, with the contract's output shapes and eager's values."""
    if runner.fixed is not None:
        return CheckResult("dynamic-shapes", None, {"static": True}, _static_reason(runner))
    baked = runner.baked_axes()
    if baked:
        return CheckResult("dynamic-shapes", False, {"baked_axes": len(baked)},
                           f"the graph fixes dynamic axes to the export's sizes: {'; '.join(baked[:3])}"
                           + (f" (+{len(baked) - 3} more)" if len(baked) > 3 else ""))
    cases = [cs for cs in ctx.sweep(runner) if unseen(cs, ctx.export_sizes)]
    if not cases:
        return CheckResult("dynamic-shapes", None, {}, "the sweep holds no unseen length")
    worst, problems, wrong_values = Diff(), [], []
    for case in cases:
        run = ctx.sweep(runner)[case]
        if isinstance(run, BaseException):
            problems.append(f"does not run at {case.name}: {first_line(run)}")
            continue
        if run.shape_problem:
            problems.append(run.shape_problem)
            continue
        if run.by_kind is not None:  # eager is the reference; a lossy artifact's values are judged by quality
            d = merged(run.by_kind.values())
            if not d.ok:
                problems.append(f"wrong values at {case.name} (max abs {d.max_abs:.3g} vs eager)")
                wrong_values.append(case)
            worst = worst.merge(d)
    seqs = sorted({cs.seq for cs in cases})
    pasts = sorted({cs.past for cs in cases})
    fig = ShapesFigures.of(shapes=len(cases), seq=f"{seqs[0]}..{seqs[-1]}", past=f"{pasts[0]}..{pasts[-1]}",
                           max_abs=rounded(worst.max_abs), failed_shapes=len(problems))
    if problems:
        # wrong only where rows are padded, right at every unpadded shape: the padding, not a size baked in
        padded_only = (len(wrong_values) == len(problems) and all(any(cs.pad) for cs in wrong_values)
                       and any(not any(cs.pad) for cs in cases))
        why = ("; every shape that failed has padded rows and the unpadded shapes are right: the padding, not the "
               "shapes (see padding and parity)") if padded_only else _diagnose_sizes(runner, ctx, wrong_values)
        if first := _first_bad_position(runner, ctx, wrong_values):
            fig.set(first_bad_position=first)
        return CheckResult("dynamic-shapes", False, fig,
                           f"{len(problems)}/{len(cases)} unseen shapes: {problems[0]}{why}")
    values = "; values judged by quality (lossy)" if ctx.lossy else ""
    return CheckResult("dynamic-shapes", True, fig,
                       f"{len(cases)} unseen shapes (seq {fig.seq}, past {fig.past}){values}")


def _diagnose_sizes(runner: Runner, ctx: Context, wrong: list[Case]) -> str:
    """Why values are wrong at unseen shapes. "A size baked in" only with evidence in the graph: right at the
    export's own sizes *and* a constant equal to one of them feeding a shape (Reshape, Expand, Range, Slice, Tile,
    ConstantOfShape). Right there without such a constant: damage that depends on position or length, named with
    the first position where it appears. Wrong there too: the values are wrong at every size."""
    seq, past = ctx.export_sizes
    if seq + past > ctx.contract.max_positions or ctx.recorded is not None:  # a record: no case beyond the sweep
        return ""
    case = Case(2, seq, past, (0, 0), seed=ctx.seed + 47)
    try:
        d = compare_outputs(runner.run(*ctx.inputs(case)), ctx.reference(case), ctx.tol, case.real_rows(),
                            case.real_keys())
    except MhaExportError:
        return ""
    if not d.ok:
        return (f"; wrong at the export's own sizes too (seq={seq} past={past}, max abs {d.max_abs:.3g}): the "
                "values are wrong at every size, not a size baked in (see parity)")
    right = f"right at the export's own sizes (seq={seq} past={past}, max abs {d.max_abs:.3g})"
    if evidence := _size_constant(runner, {"seq": seq, "past": past, "total": seq + past}):
        return f"; {right} and {evidence}: a size baked in at export"
    first = _first_bad_position(runner, ctx, wrong)
    where = f", first at position {first}" if first is not None else ""
    return (f"; {right}, and no constant of those sizes feeds a shape in the graph: damage that depends on position "
            f"or length{where} (a row of a position or rotary table, precision lost in the cache), not a size baked "
            "in")


SHAPE_INPUTS = {"Reshape": (1,), "Expand": (1,), "Range": (0, 1), "Slice": (1, 2), "Tile": (1,),
                "ConstantOfShape": (0,)}


def _size_constant(runner: Runner, sizes: dict[str, int]) -> str | None:
    """A constant (initializer or Constant node) of exactly one of ``sizes`` feeding a shape input, in the ONNX file
    the runner runs: the evidence that a size was baked in; None without a file or such a constant."""
    path = getattr(runner, "path", None)
    if path is None or isinstance(path, bytes) or not str(path).endswith(".onnx"):
        return None
    import onnx
    from onnx import numpy_helper

    from mhaexport.core.graph import GraphIndex

    from mhaexport.runners.wire import read_graph

    try:
        model = read_graph(path)[0]  # the constants sought hold at most 8 values: none is left in the file
    except Exception:  # noqa: BLE001 - unreadable here: no evidence either way
        return None
    index = GraphIndex(model.graph)
    consts: dict[str, list] = {}
    for t in model.graph.initializer:
        if t.data_type in (onnx.TensorProto.INT64, onnx.TensorProto.INT32) and len(t.dims) <= 1 and \
                (not t.dims or t.dims[0] <= 8):
            consts[t.name] = numpy_helper.to_array(t).reshape(-1).tolist()
    for n in model.graph.node:
        if n.op_type == "Constant":
            for a in n.attribute:
                if a.name == "value" and a.t.data_type in (onnx.TensorProto.INT64, onnx.TensorProto.INT32) \
                        and len(a.t.dims) <= 1:
                    consts[n.output[0]] = numpy_helper.to_array(a.t).reshape(-1).tolist()
    for n in index.nodes:
        for k in SHAPE_INPUTS.get(n.op_type, ()):
            if k < len(n.input) and n.input[k] in consts:
                for what, size in sizes.items():
                    if size > 1 and size in consts[n.input[k]]:
                        return (f"a constant {consts[n.input[k]]} holding the export's {what} length {size} feeds "
                                f"{n.op_type} {n.name}")
    return None


def _first_bad_position(runner: Runner, ctx: Context, cases: list[Case]) -> int | None:
    """The lowest token position (past + index in the call) whose logits differ from eager's in ``cases`` (each
    case's, found as the sweep ran: CaseRun.first_bad)."""
    runs = ctx.sweep(runner)
    found = [run.first_bad for case in cases if not isinstance(run := runs.get(case), BaseException)
             and run is not None and run.first_bad is not None]
    return min(found, default=None)


@dataclass
class Greedy:
    tokens: list[int]
    logits: list[np.ndarray]  # per step: (V,) for row 0


def greedy(runner: Runner, prompt: np.ndarray, n: int) -> Greedy:
    """Greedy decode n tokens from a (1, P) prompt through the decode loop (the runner's own cache; a
    RecomputeRunner recomputes the whole sequence every step)."""
    r = DecodeLoop(runner).generate(prompt, GenerationConfig(max_new_tokens=n), keep_logits=True)
    return Greedy(r.tokens[0], [lg[0] for lg in r.step_logits])


def forced_greedy(runner: Runner, prompt: np.ndarray, tokens: list[int]) -> Greedy:
    """What greedy decoding on ``runner`` gives after ``prompt`` (1, P) wherever it chose ``tokens`` (the reference's)
    so far: the decode loop's calls — a prefill, then one step per token with the runner's own cache — fed those
    tokens, written down as one plan (runners/plan.py: block by block where the runner runs so). Up to and including
    the first step where the runner's choice differs from ``tokens`` the inputs are the free-running decode's, so its
    tokens and logits there are the free-running decode's; the generation check reads no further."""
    P, n = prompt.shape[1], len(tokens)
    seq = np.concatenate([prompt, np.array([tokens[:-1]], dtype=np.int64)], axis=1)  # (1, P + n - 1)
    plan = Plan()
    chain = plan.chain(seq, np.ones_like(seq), [P] + [1] * (n - 1), rows={0: [P - 1]})  # the prefill's last row
    logits, _ = decoded(plan.run(runner), chain)  # (1, n, V): step i's logits
    rows = [logits[0, i] for i in range(n)]
    return Greedy([int(np.argmax(r)) for r in rows], rows)


def reference_greedy(ctx: Context, key: str, prompt: np.ndarray, n: int) -> Greedy:
    """Eager's greedy decoding of ``n`` tokens after ``prompt``, memoized under ``key`` (a record's context serves it
    from the record: verify/reference.py)."""
    own = getattr(ctx, "greedy_reference", None)
    if own is not None:
        return own(key, prompt, n)
    memo = ("greedy", key, n)
    if memo not in ctx._ref:
        ctx._ref[memo] = greedy(ctx.eager, prompt, n)
    return ctx._ref[memo]


def generation_prompts(ctx: Context) -> list[tuple[str, np.ndarray, int]]:
    """Every greedy reference the generation check asks of eager, as (key, prompt (1, P), n): from a short prompt,
    from a long one ending n + 1 positions before max_positions (when longer than the short), and the deploy loop's
    two rows alone (verify --record keeps them all)."""
    c = ctx.contract
    P = min(6, c.max_positions - 1)
    n = max(1, min(ctx.gen_tokens, c.max_positions - P))
    rng = np.random.default_rng(ctx.seed + 41)
    out = [("short", rng.integers(0, c.vocab_size, (1, P), dtype=np.int64), n)]
    P_long = c.max_positions - n - 1
    if P_long > P:
        out.append(("long", rng.integers(0, c.vocab_size, (1, P_long), dtype=np.int64), n))
    out += [(f"deploy{b}", p[None], n) for b, p in enumerate(ragged_prompts(ctx, n, ctx.seed + 59))]
    return out


# prompts up to this many tokens are recomputed step by step (n forwards: cheap, the figures as they always were);
# longer ones in one forward (:func:`recomputed`): the long prompt of a model past the presets' 256 positions
STEPWISE_RECOMPUTE_MAX_PROMPT = 256


def recomputed(recompute: Runner, prompt: np.ndarray, tokens: list[int]) -> Greedy:
    """What greedy decoding without a cache (``recompute``: a RecomputeRunner, the whole sequence each step) gives
    after ``prompt`` (1, P) wherever it chose ``tokens`` so far, in *one* call: the recompute protocol's forward of
    the prompt and tokens[:-1] at once, whose row P - 1 + i is step i's logits given the prefix prompt + tokens[:i]
    (a from-scratch recompute of that prefix, by causality: its row depends on no later token; a forward that is
    not causal differs here too, and fails causality). Up to and including the first step where the cached decode
    and this reference choose differently the figures are those of the step-by-step recompute, which the
    generation check reads no further; n forwards of up to P + n - 1 tokens become one."""
    seq = np.concatenate([prompt, np.array([tokens[:-1]], dtype=np.int64)], axis=1)  # (1, P + n - 1)
    loop = DecodeLoop(recompute)
    logits, _ = loop.feed(seq, loop.empty(1), np.ones_like(seq))  # (1, P + n - 1, V)
    rows = [np.asarray(logits[0, prompt.shape[1] - 1 + i], dtype=np.float64) for i in range(len(tokens))]  # (V,)
    del logits
    return Greedy([int(np.argmax(r)) for r in rows], rows)


def check_generation(runner: Runner, ctx: Context) -> CheckResult:
    """Greedy N tokens against eager's (eager, and a lossy artifact: its cached decode against its own full
    recompute every step), from a short prompt and from a long one that ends N + 1 positions before max_positions
    (the far end of the cache).

    At the first divergent step the reference's logit margin (top-1 minus top-2) is reported; a divergence where
    that margin is within tolerance is a near-tie, reported as such and not as a failure."""
    if runner.fixed is not None:
        return CheckResult("generation", None, {"static": True}, _static_reason(runner))
    c = ctx.contract
    prompts = {key: (prompt, n) for key, prompt, n in generation_prompts(ctx)}
    short = _generation_from(runner, ctx, *prompts["short"], "short")
    if "long" not in prompts:
        return short
    long = _generation_from(runner, ctx, *prompts["long"], "long")
    P_long, n = prompts["long"][0].shape[1], prompts["long"][1]
    fig = GenerationFigures.of(**short.figures, **{f"long_{k}": v for k, v in long.figures.items()},
                               long_prompt=P_long, protocol=_protocols(runner, ctx))
    if _deploy_of(runner, ctx) is not None and not ctx.lossy:  # the loop generate runs: ragged batch, in place
        deploy = _deploy_generation(runner, ctx, n)
        fig.set(**{f"deploy_{k}": v for k, v in deploy.figures.items()})
        if deploy.status is False:
            return CheckResult("generation", False, fig, f"the deploy loop (ragged batch, buffers in place): "
                                                         f"{deploy.message}")
    if long.status is False:
        return CheckResult("generation", False, fig, f"from a {P_long}-token prompt: {long.message}")
    if short.status is False:
        return CheckResult("generation", False, fig, short.message)
    tie = " (a near-tie)" if fig.tie or fig.long_tie else ""
    deploy = "; the deploy loop's ragged batch matches too" if fig.deploy_tokens is not None else ""
    return crossing(CheckResult("generation", True, fig, f"{short.message}; from a {P_long}-token prompt: "
                                                         f"{long.message}{tie}{deploy}"), c, P_long + n - 1)


def _deploy_generation(runner: Runner, ctx: Context, n: int) -> CheckResult:
    """Greedy tokens of the deploy loop over a ragged batch against eager's greedy tokens for each prompt alone; at a
    divergence, eager's margin there (a near-tie within tolerance passes, as for the other generations)."""
    prompts, res = _deploy_run(runner, ctx, n, ctx.seed + 59)
    worst = Diff()
    for b, p in enumerate(prompts):
        ref = reference_greedy(ctx, f"deploy{b}", p[None], n)
        got = res.tokens[b]
        div = next((i for i, (a, r) in enumerate(zip(got, ref.tokens)) if a != r), None)
        for i in range(n if div is None else div + 1):
            worst = worst.merge(ctx.ref_compare(res.step_logits[i][b], ref.logits[i], ctx.ltol))
        if div is not None:
            tie, margin = near_tie(ref.logits[div], got[div], ctx.ltol, worst.ok)
            if not tie:
                return CheckResult("generation", False,
                                   GenerationFigures.of(row=b, first_divergence=div, margin=rounded(margin),
                                                        max_abs=rounded(worst.max_abs)),
                                   f"row {b} ({len(p)}-token prompt) diverges from eager at step {div} "
                                   f"(margin {margin:.3g}, logits max abs {worst.max_abs:.3g})")
    if not worst.ok:
        return CheckResult("generation", False, GenerationFigures.of(max_abs=rounded(worst.max_abs)),
                           f"same tokens but step logits differ from eager (max abs {worst.max_abs:.3g})")
    return CheckResult("generation", True, GenerationFigures.of(rows=len(prompts), tokens=n,
                                                                 max_abs=rounded(worst.max_abs)),
                       f"{n}/{n} greedy tokens of each row match eager")


def _generation_from(runner: Runner, ctx: Context, prompt: np.ndarray, n: int, key: str) -> CheckResult:
    """Greedy decoding of n tokens after ``prompt`` judged against the reference (see check_generation)."""
    if runner.name == EAGER or ctx.lossy:  # a lossy artifact is held to itself; its agreement is quality's
        recompute = ctx.without_cache or RecomputeRunner  # verify's: the registry's; a bare Context's (tests): the class
        memo = ("greedy", key, n)
        got = ctx._ref.get(memo) if runner is ctx.eager else None
        if got is None:
            got = greedy(runner, prompt, n)
            if runner is ctx.eager:  # the other runtimes' reference of the same prompt: decoded once
                ctx._ref[memo] = got
        ref = (greedy(recompute(runner), prompt, n) if prompt.shape[1] <= STEPWISE_RECOMPUTE_MAX_PROMPT else
               recomputed(recompute(runner), prompt, got.tokens))
        against = "recompute"
    else:  # fed the reference's tokens: the free-running decode's inputs up to its first divergence (one plan)
        ref = reference_greedy(ctx, key, prompt, n)
        got, against = forced_greedy(runner, prompt, ref.tokens), "eager" if ctx.recorded is None else \
            "the recorded eager"
    tol = ctx.ltol
    div = next((i for i, (a, b) in enumerate(zip(got.tokens, ref.tokens)) if a != b), None)
    upto = n if div is None else div + 1
    logit_diff, steps = Diff(), []
    for i in range(upto):
        step = ctx.ref_compare(got.logits[i], ref.logits[i], tol) if against != "recompute" else \
            compare(got.logits[i], ref.logits[i], tol)
        steps.append(rounded(step.max_abs))
        logit_diff = logit_diff.merge(step)
    # per step, the reference's top-1 minus top-2 logit: a step's error beyond it can flip the token (report.html)
    margins = [rounded(float(t[1] - t[0])) for t in (np.sort(lg)[-2:] for lg in ref.logits[:upto])]
    fig = GenerationFigures.of(tokens=n, matched=n if div is None else div, first_divergence=div,
                               max_abs=rounded(logit_diff.max_abs), step_max_abs=steps, step_margin=margins)
    if div is None:
        if not logit_diff.ok:
            return CheckResult("generation", False, fig, f"same {n} tokens but step logits differ from {against} "
                                                         f"(max abs {logit_diff.max_abs:.3g})")
        return CheckResult("generation", True, fig, f"{n}/{n} greedy tokens match {against}")
    tie, margin = near_tie(ref.logits[div], got.tokens[div], tol, logit_diff.ok)  # the one tie rule
    fig.set(margin=rounded(margin))
    if tie:  # every step up to and including the divergence agrees within tolerance
        fig.set(tie=True)
        return CheckResult("generation", True, fig, f"tie: diverges from {against} at step {div} where its margin "
                                                    f"{margin:.3g} over the chosen token is within tolerance")
    return CheckResult("generation", False, fig, f"greedy tokens diverge from {against} at step {div} "
                                                 f"(margin {margin:.3g}, logits max abs {logit_diff.max_abs:.3g})")


def cross_provider(runners: list[Runner], infos: dict, ctx: SweepContext) -> list[CrossResult]:
    """Each pair of CROSS_PAIRS that both ran, compared case by case with the first's tolerance: providers can
    disagree with each other while each is "close to eager". The sweep compares a pair as it runs them together
    (``ctx._cross``); a pair that did not run together runs each case again, one case at a time. The decoder's and
    the attention block's alike: ``ctx.compare`` says how two runs of a case compare."""
    by_name = {r.name: r for r in runners}
    out = []
    for a, b in CROSS_PAIRS:
        if not all(n in by_name and infos.get(n) is not None and infos[n].status == "ran" for n in (a, b)):
            continue
        tol = Tolerance.for_dtype(by_name[a].dtype, *ctx.tol_override)
        runs_a, runs_b = ctx.sweep(by_name[a]), ctx.sweep(by_name[b])
        total = Diff()
        if (a, b) in ctx._cross:
            for _case, d in ctx._cross[(a, b)]:
                total = total.merge(d)
        else:
            for case, run_a in runs_a.items():
                run_b = runs_b.get(case)
                if isinstance(run_a, BaseException) or run_b is None or isinstance(run_b, BaseException):
                    continue
                try:
                    out_a, out_b = by_name[a].run(*ctx.inputs(case)), by_name[b].run(*ctx.inputs(case))
                except MhaExportError:
                    continue
                total = total.merge(merged(ctx.compare(case, out_a, out_b, tol).values()))
                del out_a, out_b
        status = total.ok
        msg = (f"{a} and {b} agree within {tol.describe()} (max abs {total.max_abs:.3g})" if status else
               f"{total.mismatched}/{total.total} values of {a} differ from {b} beyond {tol.describe()} (max abs "
               f"{total.max_abs:.3g}): the providers disagree with each other")
        out.append(CrossResult(a, b, status, DiffFigures.of(**total.figures()), msg))
    return out


def check_weights(runner: Runner, ctx: Context) -> CheckResult:
    """A lossy ONNX artifact's quantized weights against its recorded recipe (verify/weights.py): one result for the
    file, shown on each ONNX Runtime row that runs it (onnxruntime-genai's included; eager and an exact artifact:
    the suite's row)."""
    if ctx.weights is None:
        return CheckResult(WEIGHTS, None, {}, "not run: this runtime's artifact has no quantized weights")
    if WEIGHTS not in ctx._ref:
        ctx._ref[WEIGHTS] = ctx.weights()
    return ctx._ref[WEIGHTS]
