"""verify's checks of the ``ort-genai`` runtime (its runner: runners/genai.py): onnxruntime-genai's own generator
on the folder, as deployed — its genai_config.json, its search options, its cache handling (share buffer or not),
its right padding of a batch.

onnxruntime-genai exposes no contract call (ids, mask, past -> logits, present): only its loop. So this runtime is
the suite's ``loop`` subject (verify/suite.py: the one table of checks): what its runner provides is a few traces of
that loop (:func:`mhaexport.runtime.genai.genai_trace`): a short and a long
prompt each alone, and the three prompts of different lengths as one batch, ``gen_tokens`` decode steps each,
every step's logits recorded. Then

- ``parity``: its logits at the prefill and at each decode step against eager's at the same positions (the
  artifact's dtype tolerance; a lossy file: ``quality`` instead),
- ``finite``: no NaN/inf among them,
- ``kv-consistency``: its decode steps (its cache) against the same file recomputed on the whole sequence by
  verify's own ONNX Runtime runner: a file right in our loop and wrong in onnxruntime-genai's is caught here,
- ``padding``: each row of the batch (padded as onnxruntime-genai pads) against the same prompt alone,
- ``generation``: its greedy tokens against eager's argmax at each step (ties within tolerance allowed; a lossy
  file: against the file's own logits recomputed in our loop),
- ``quality`` (lossy): its logits against eager fp32 by the scheme's thresholds (KL, relative logit error),
- ``weights`` and ``genai-config``: the folder's results, shown here as on the other ONNX rows (the suite's row
  runs the same function for both subjects).

causality and dynamic-shapes are not applicable (the loop feeds only its own shapes), and a lossy file's parity and
an exact file's quality are not either: the suite's rows say so.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from mhaexport.core.errors import MhaExportError, RuntimeFailure, first_line
from mhaexport.runners.genai import GenAIRunner
from mhaexport.runtime.runner import Runner
from mhaexport.verify.compare import Diff, compare, near_tie
from mhaexport.verify.figures import (FiniteFigures, GenerationFigures, KvFigures, PaddingFigures, ParityFigures,
                                      Limits, QualityFigures, Scores, built)
from mhaexport.verify.results import QUALITY, CheckResult, Context

SHORT_PROMPT = 4  # tokens
LONG_PROMPT = 24  # tokens, at most (a quarter of the model's positions when that is less)


# ---- the traces ------------------------------------------------------------------------------------------------

def _ids_of(value) -> set[int]:
    if isinstance(value, bool):
        return set()
    if isinstance(value, int):
        return {value}
    return {v for v in value if isinstance(v, int)} if isinstance(value, list) else set()


def _prompts(runner: GenAIRunner, ctx: Context) -> tuple[list[int], list[int], list[int], int]:
    """(short, long, middle prompt, new tokens): seeded ids that are none of the config's special tokens
    (onnxruntime-genai takes a pad id in a prompt for padding)."""
    c = ctx.contract
    model = runner.model_section
    special = set().union(*map(_ids_of, (model.bos_token_id, model.eos_token_id, model.pad_token_id)))
    allowed = np.array([i for i in range(c.vocab_size) if i not in special])
    n = max(1, min(ctx.gen_tokens, c.max_positions // 4))
    long_len = max(SHORT_PROMPT + 2, min(LONG_PROMPT, c.max_positions // 4, c.max_positions - n - 2))
    rng = np.random.default_rng(ctx.seed + 127)
    short, long_, mid = (rng.choice(allowed, size=k).tolist() for k in
                         (SHORT_PROMPT, long_len, (SHORT_PROMPT + long_len) // 2))
    return short, long_, mid, n


def traces(runner: GenAIRunner, ctx: Context) -> dict:
    """The loop's traces, run once per runner: {"short", "long"} alone and "batch" (long, short, middle together).
    onnxruntime-genai failing is a RuntimeFailure (each check reports it)."""
    if runner.traces is None:
        from mhaexport.runtime.genai import genai_trace

        short, long_, mid, n = _prompts(runner, ctx)
        model = runner.model_section
        pad = model.pad_token_id if isinstance(model.pad_token_id, int) else 0
        out: dict[str, Any] = {}
        t0 = time.perf_counter()
        try:
            for name, prompts in (("short", [short]), ("long", [long_]), ("batch", [long_, short, mid])):
                out[name] = genai_trace(runner.model, prompts, n, pad, model.eos_token_id)
        except MhaExportError as e:
            out = {"error": e}
        except Exception as e:  # noqa: BLE001 - onnxruntime-genai's own exceptions: its loop failing is a result
            out = {"error": RuntimeFailure(f"onnxruntime-genai failed: {first_line(e)}")}
        runner.times.append(time.perf_counter() - t0)
        runner.traces = out
    if "error" in runner.traces:
        raise runner.traces["error"]
    return runner.traces


def _rows(tr: dict) -> list[tuple[str, list[int], list[int], np.ndarray]]:
    """(label, prompt, new tokens, logits (steps, V)) of every traced row."""
    out = []
    for name in ("short", "long", "batch"):
        t = tr[name]
        for b, (p, toks, lg) in enumerate(zip(t.prompts, t.tokens, t.logits)):
            label = f"{name} prompt ({len(p)} tokens)" if name != "batch" else f"batch row {b} ({len(p)} tokens)"
            out.append((label, p, toks, lg))
    return out


def _full_logits(reference: Runner, ctx: Context, seq: list[int], key: str) -> np.ndarray:
    """``reference``'s logits (S, V) over the whole sequence in one call (eager, or our runner of the file)."""
    memo = (key, tuple(seq))
    if memo not in ctx._ref:
        ids = np.array([seq], dtype=np.int64)  # (1, S)
        ctx._ref[memo] = np.asarray(reference.run(ids, np.ones_like(ids), None)[0][0], dtype=np.float32)
    return ctx._ref[memo]


def _against(reference: Runner, ctx: Context, key: str, tr: dict, tol) -> tuple[Diff, list[str]]:
    """Each row's logits at the prefill and every decode step against ``reference``'s at the same positions."""
    total, where = Diff(), []
    for label, p, toks, lg in _rows(tr):
        seq = p + toks[:lg.shape[0] - 1]
        ref = _full_logits(reference, ctx, seq, key)[len(p) - 1:len(p) - 1 + lg.shape[0]]  # (steps, V)
        d = compare(lg, ref, tol)
        if not d.ok:
            err = np.abs(lg.astype(np.float64) - ref)  # (steps, V)
            step = int(np.argmax(~(np.nan_to_num(err, nan=np.inf) <= tol.atol + tol.rtol * np.abs(ref)).all(-1)))
            where.append(f"{label} at {'the prefill' if step == 0 else f'decode step {step}'} (max abs {d.max_abs:.3g})")
        total = total.merge(d)
    return total, where


# ---- the checks ------------------------------------------------------------------------------------------------

def check_parity(runner: GenAIRunner, ctx: Context) -> CheckResult:
    tr = traces(runner, ctx)
    d, where = _against(ctx.eager, ctx, "eager", tr, ctx.ltol)
    fig = ParityFigures.of(**d.figures(), rows=len(_rows(tr)), tolerance=ctx.ltol.describe())
    if where:
        return CheckResult("parity", False, fig, f"onnxruntime-genai's logits differ from eager beyond "
                                                 f"{ctx.ltol.describe()}: {'; '.join(where[:3])}")
    return CheckResult("parity", True, fig, f"prefill and every decode step of {fig.rows} rows within "
                                            f"{ctx.ltol.describe()} of eager (max abs {d.max_abs:.3g})")


def check_finite(runner: GenAIRunner, ctx: Context) -> CheckResult:
    tr = traces(runner, ctx)
    bad = [f"{label}: {int((~np.isfinite(lg)).sum())} non-finite logits" for label, _, _, lg in _rows(tr)
           if not np.isfinite(lg).all()]
    if bad:
        return CheckResult("finite", False, FiniteFigures.of(cases=len(_rows(tr)), non_finite_rows=len(bad)), bad[0])
    return CheckResult("finite", True, FiniteFigures.of(cases=len(_rows(tr))), "every logit of the loop finite")


def check_kv_consistency(runner: GenAIRunner, ctx: Context) -> CheckResult:
    tr = traces(runner, ctx)
    if runner.ours is None or not runner.ours.available:
        return CheckResult("kv-consistency", None, {}, "not run: no ONNX Runtime runner of the file to compare with")
    d, where = _against(runner.ours, ctx, "ours", tr, ctx.ltol)
    share = bool(runner.search.past_present_share_buffer)
    fig = KvFigures.of(**d.figures(), past_present_share_buffer=share)
    if where:
        return CheckResult("kv-consistency", False, fig,
                           f"onnxruntime-genai's loop (past_present_share_buffer={share}) gives other logits than the "
                           f"same file recomputed in verify's loop: {'; '.join(where[:3])} — the config makes it feed "
                           "the file differently")
    return CheckResult("kv-consistency", True, fig, f"its cache (past_present_share_buffer={share}) gives the logits "
                                                    f"the file gives recomputed (max abs {d.max_abs:.3g})")


def _until_eos(tokens: list[int], eos: set[int]) -> list[int]:
    return next((tokens[:i] for i, t in enumerate(tokens) if t in eos), tokens)


def check_padding(runner: GenAIRunner, ctx: Context) -> CheckResult:
    tr = traces(runner, ctx)
    batch, tol = tr["batch"], ctx.ltol
    eos = _ids_of(runner.model_section.eos_token_id)
    total, bad = Diff(), []
    for b, name in ((0, "long"), (1, "short")):
        alone = tr[name]
        # a row alone ends when its next token is eos (onnxruntime-genai is done before appending it); in a batch
        # the others go on and the row shows its eos
        got, want = _until_eos(batch.tokens[b], eos), _until_eos(alone.tokens[0], eos)
        if got != want:
            k = next((i for i, (x, y) in enumerate(zip(got, want)) if x != y), min(len(got), len(want)))
            bad.append(f"the {name} prompt's tokens in the batch differ from alone at step {k}")
        n = min(batch.logits[b].shape[0], alone.logits[0].shape[0])
        d = compare(batch.logits[b][:n], alone.logits[0][:n], tol)
        if not d.ok:
            bad.append(f"the {name} prompt's logits in the batch differ from alone (max abs {d.max_abs:.3g})")
        total = total.merge(d)
    fig = PaddingFigures.of(**total.figures(), batch=[len(p) for p in batch.prompts])
    if bad:
        return CheckResult("padding", False, fig, f"onnxruntime-genai's right-padded batch: {'; '.join(bad)}")
    return CheckResult("padding", True, fig, f"a batch of {len(batch.prompts)} prompts of lengths "
                                             f"{fig.batch} (right-padded by onnxruntime-genai) = each alone")


def check_generation(runner: GenAIRunner, ctx: Context) -> CheckResult:
    tr = traces(runner, ctx)
    reference, key, against = (runner.ours, "ours", "the file in verify's loop") if ctx.lossy else \
        (ctx.eager, "eager", "eager")
    if reference is None:
        return CheckResult("generation", None, {}, "not run: no ONNX Runtime runner of the file to compare with")
    tol = ctx.ltol
    matched, total, ties = 0, 0, 0
    for label, p, toks, lg in _rows(tr):
        ref = _full_logits(reference, ctx, p + toks, key)
        agree = True  # its logits agree with the reference's at every step so far (the tie rule's condition)
        for k, t in enumerate(toks):
            r = ref[len(p) - 1 + k]
            total += 1
            agree = agree and lg is not None and k < len(lg) and compare(np.asarray(lg[k]), r, tol).ok
            best = int(np.argmax(r))
            if t == best:
                matched += 1
                continue
            tie, margin = near_tie(r, t, tol, agree)  # the one tie rule
            if tie:
                ties += 1
                break  # a tie: the rest follows another path
            return CheckResult("generation", False, GenerationFigures.of(matched=matched, step=k,
                                                                         margin=round(margin, 6)),
                               f"onnxruntime-genai's greedy tokens diverge from {against} after the {label} at step "
                               f"{k}: it chose {t}, {against} {best} (margin {margin:.3g})")
    fig = GenerationFigures.of(matched=matched, tokens=total, ties=ties)
    return CheckResult("generation", True, fig, f"{matched}/{total} greedy tokens of its loop match {against}"
                                                + (f" ({ties} tie(s) within tolerance)" if ties else ""))


def check_quality(runner: GenAIRunner, ctx: Context) -> CheckResult:
    from mhaexport.evaluate.scoring import Agreement
    from mhaexport.verify.quality import judge, thresholds_for

    tr = traces(runner, ctx)
    limits, table = thresholds_for(ctx.lossy.weights, getattr(ctx.quality, "overrides", None))
    agree = Agreement()
    for _, p, toks, lg in _rows(tr):
        seq = p + toks[:lg.shape[0] - 1]
        agree.add(_full_logits(ctx.eager, ctx, seq, "eager")[len(p) - 1:len(p) - 1 + lg.shape[0]], lg)
    judged = ("kl_mean", "kl_p99", "logit_err")  # top-1 over a few greedy steps of random prompts: near-ties
    loop = agree.figures()
    # the loop's figures in the report's "sweep" column (its positions: the prefill and decode steps of its traces)
    fig = QualityFigures.of(scheme=ctx.lossy.label or ctx.lossy.weights, thresholds_of=table,
                            sweep=built(Scores, loop),
                            thresholds=built(Limits, {k: getattr(limits, k) if k in judged else None
                                                      for k in limits.to_dict()}),
                            positions_of="onnxruntime-genai's prefill and decode steps")
    failures = [m for name in judged if (m := judge(name, loop.get(name), getattr(limits, name)))]
    said = (f"KL {loop['kl_mean']:.3g}/{loop['kl_p99']:.3g} (mean/p99), logit error {loop['logit_err']:.3g} over "
            f"{loop['positions']} steps of its loop")
    if failures:
        return CheckResult(QUALITY, False, fig, f"{'; '.join(failures)} — onnxruntime-genai's logits keep less "
                                                f"quality than {fig.scheme} allows ({said})")
    return CheckResult(QUALITY, True, fig, f"{fig.scheme} in onnxruntime-genai's loop: {said}")
