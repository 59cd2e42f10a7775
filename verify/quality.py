"""verify's quality check: a lossy (quantized) artifact against eager fp32, judged by its scheme's thresholds.

Exact parity does not apply to a lossy artifact: its logits differ from eager's by design. What can be asked is how
much the model's *predictions* move, in the figures evaluate's scoring computes (evaluate/scoring.py, the one
implementation ``mhaexport eval`` uses too): top-1 agreement, KL(eager ‖ artifact) per position (mean, p99), the
relative logit error, the perplexity of held-out text under both and its ratio, the greedy agreement length. Here:
the thresholds per scheme (:data:`THRESHOLDS`), the check that measures and judges them, and the tolerance a lossy
artifact's self-comparisons allow (:func:`self_tolerance`).

The sweep's figures (random ids and caches at verify's shapes) and the text's (sliding windows over real text)
are reported side by side; the thresholds (:data:`THRESHOLDS`, per scheme, overridable) judge each figure that is
measured. Where eager's next-token distributions are nearly uniform (mean entropy above 90 % of log V: random
weights), top-1 and greedy agreement mean nothing (any noise flips a near-tie) and are reported, not judged.

Torch-free: everything here works on the runner protocol's numpy outputs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from mhaexport.artifact.details import INT8_ACTIVATIONS
from mhaexport.core.errors import ConfigError
from mhaexport.evaluate.scoring import (Agreement, agreement_length, greedy_tokens_each, rounded4, score_text,
                                        text_prompts, text_tokens)
from mhaexport.runtime.runner import Runner
from mhaexport.verify.compare import Tolerance
from mhaexport.verify.figures import GreedyAgreement, Limits, QualityFigures, Scores, built, figures_of
from mhaexport.verify.results import QUALITY, CheckResult, Context

if TYPE_CHECKING:
    from mhaexport.artifact.details import Quantization


# ---- thresholds --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Thresholds:
    """What a lossy artifact must keep. ``None``: not judged. Names are those of ``--quality NAME=X``."""

    top1: float | None = None  # at least: top-1 agreement with eager
    kl_mean: float | None = None  # at most: mean KL(eager || artifact), nats
    kl_p99: float | None = None  # at most: p99 of KL per position, nats
    logit_err: float | None = None  # at most: relative logit error
    ppl_ratio: float | None = None  # at most: artifact perplexity / eager perplexity on the text
    greedy: float | None = None  # at least: mean greedy agreement, as a fraction of the tokens generated

    AT_LEAST = ("top1", "greedy")

    def with_overrides(self, overrides: dict[str, float] | None) -> Thresholds:
        """A copy with ``{name: value}`` from --quality; ConfigError for an unknown name."""
        if not overrides:
            return self
        unknown = [k for k in overrides if k not in QUALITY_FIGURES]
        if unknown:
            raise ConfigError(f"--quality {unknown[0]}=...: unknown figure; known: {', '.join(QUALITY_FIGURES)}")
        for name, value in overrides.items():
            check_threshold(name, value)
        return replace(self, **overrides)

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in QUALITY_FIGURES}


QUALITY_FIGURES = ("top1", "kl_mean", "kl_p99", "logit_err", "ppl_ratio", "greedy")
# the range each threshold lives in (low, high; inclusive), as its figure does: agreements are fractions, KL and the
# relative logit error are >= 0, a perplexity ratio of at most less than 1 would ask the artifact to beat eager
RANGES = {"top1": (0.0, 1.0), "greedy": (0.0, 1.0), "kl_mean": (0.0, math.inf), "kl_p99": (0.0, math.inf),
          "logit_err": (0.0, math.inf), "ppl_ratio": (1.0, math.inf)}
LABELS = {"top1": "top-1 agreement", "kl_mean": "KL mean", "kl_p99": "KL p99", "logit_err": "relative logit error",
          "ppl_ratio": "perplexity ratio", "greedy": "greedy agreement"}

# Per scheme. Set from measurements on the trained default model (`small`, held-out text; docs/measurements/
# quantize-2026-11-30.md), with room for the noise of another ONNX Runtime build, and far from a quantization too
# coarse to keep quality (the int4 scheme planted at 2 bits: top-1 0.69, KL mean 0.35 / p99 2.6, logit error 0.23,
# perplexity x0.99 — this overfit model's perplexity does not see it):
#   int4 (default scheme): top-1 0.911, KL mean 0.023 / p99 0.21, logit error 0.068, perplexity x1.001
#   int4, all blocks:      top-1 0.863, KL mean 0.066 / p99 0.56, logit error 0.090, perplexity x1.017
#   int8:                  top-1 0.978, KL mean 0.002 / p99 0.028, logit error 0.014, perplexity x0.999
# and on random weights, where only the scale-free figures mean something: logit error int4 0.11 (tiny preset; all
# blocks int4: 0.16) and 0.20 (bench preset), the planted 2-bit quantization 0.45 (tiny).
THRESHOLDS: dict[str, Thresholds] = {
    "int4": Thresholds(top1=0.85, kl_mean=0.10, kl_p99=1.0, logit_err=0.30, ppl_ratio=1.10, greedy=0.125),
    "int8": Thresholds(top1=0.95, kl_mean=0.01, kl_p99=0.10, logit_err=0.05, ppl_ratio=1.02, greedy=0.5),
}
# A scheme this table does not know is held to int4's (the loosest here) and says so.
FALLBACK = "int4"


def check_threshold(name: str, value: float) -> float:
    """``value`` when it is a finite number in ``name``'s range (:data:`RANGES`), else ConfigError saying the range."""
    low, high = RANGES[name]
    if not (low <= value <= high and math.isfinite(value)):
        where = f"in [{low:g}, {high:g}]" if math.isfinite(high) else f"a finite number >= {low:g}"
        raise ConfigError(f"--quality {name}={value:g}: {LABELS[name]} thresholds are {where}")
    return value


def thresholds_for(scheme: str | None, overrides: dict[str, float] | None = None) -> tuple[Thresholds, str]:
    """The thresholds for ``scheme`` with overrides, and which table entry they came from."""
    key = scheme if scheme in THRESHOLDS else FALLBACK
    return THRESHOLDS[key].with_overrides(overrides), key


def judge(name: str, value: float | None, limit: float | None) -> str | None:
    """A failure message ("top-1 agreement 0.71 < 0.85") or None when the figure keeps its threshold (or either is
    missing)."""
    if value is None or limit is None:
        return None
    if name in Thresholds.AT_LEAST:
        return None if value >= limit else f"{LABELS[name]} {value:.3g} < {limit:g}"
    return None if value <= limit else f"{LABELS[name]} {value:.3g} > {limit:g}"


# ---- the invariants of a lossy artifact --------------------------------------------------------------------

# MatMulNBits at accuracy level 4 quantizes its activations to int8 per block at run time: the graph is only
# piecewise continuous. A cached decode step sums attention in another order than a prefill (float32 rounding,
# ~1e-7), which can move an activation to the next int8 step, and the step shows in the outputs. Measured, as a
# fraction of eager's RMS: decode vs prefill differ by up to 2.6 % (int4) and 2.4 % (int8) on the trained default
# model, 6.0 % and 6.2 % on the bench preset's random weights — the activations' rounding, so int8 weights do not
# make it smaller; at float activations (accuracy level 0/1) by 1e-5 — and, compounding through depth, by 18 % on a
# random 1.1 B Llama (22 layers). So an ONNX Runtime file's self-comparisons (causality, kv-consistency, padding,
# cached vs recomputed generation, serving) run on its float-activation twin at the dtype's tolerance
# (runners/registry.float_activation_twin, verify/run.py); only a runtime without one (onnxruntime-genai's own loop)
# allows REQUANT_FRACTION of eager's RMS per output: a requantization step moves outputs by a few percent of their
# scale, a cache, mask or position bug by a large part of it (tests/test_quantize.py: a decode window planted in the
# model, quantized, still fails).
REQUANT_FRACTION = 0.10


def self_tolerance(ctx: Context, quant: Quantization, base):
    """The tolerance a lossy artifact's self-comparisons use: ``base`` (the dtype's) when its activations stay
    float; with int8 activations (accuracy level 4), per output (logits, present) the larger of ``base.atol`` and
    REQUANT_FRACTION x the RMS of eager's outputs over the sweep's real positions (logits with each position's mean
    removed)."""
    if quant.accuracy_level != INT8_ACTIVATIONS:
        return base
    sq = {"logits": [0.0, 0], "present": [0.0, 0]}
    for case in ctx.cases:
        logits, present = ctx.reference(case)
        rows, keys = case.real_rows(), case.real_keys()
        sel = logits[rows].astype(np.float64)
        sel -= sel.mean(-1, keepdims=True)
        sq["logits"][0] += float((sel ** 2).sum())
        sq["logits"][1] += sel.size
        for kv in present:
            for t in kv:
                v = t.transpose(0, 2, 1, 3)[keys].astype(np.float64)  # (N, H, D) at real keys
                sq["present"][0] += float((v ** 2).sum())
                sq["present"][1] += v.size
    per = []
    for kind, (total, n) in sq.items():
        b = base.for_output(kind)
        rms = math.sqrt(total / n) if n else 0.0
        per.append((kind, max(b.atol, float(f"{REQUANT_FRACTION * rms:.3g}")), b.rtol))
    return Tolerance(base.atol, base.rtol, tuple(per))


def allowance(tol: Tolerance, base: Tolerance):
    """The report's record of what a lossy artifact's comparisons with itself allowed (``tol``, from
    :func:`self_tolerance` over ``base``, its dtype's): the logits' and present outputs' bounds and the rule in
    words (report.md and report.html say it and draw the logits' bound)."""
    from mhaexport.verify.report import Allowance, Bounds

    lg, pr = tol.for_output("logits"), tol.for_output("present")
    if tol == base:
        rule = "lossy, compared with itself at its dtype's tolerance (its activations stay float)"
    else:
        rule = (f"lossy with int8 activations, compared with itself: {REQUANT_FRACTION:.0%} of eager's RMS per "
                "output (a requantization step moves outputs by a few percent; a cache, mask or position bug by "
                "far more)")
    return Allowance(Bounds(lg.atol, lg.rtol), Bounds(pr.atol, pr.rtol), rule)


def twin_allowance(tol: Tolerance, twin: str):
    """The report's record of an int8-activation file's comparisons with itself run on its float-activation twin
    (``twin``'s name; :func:`mhaexport.runners.registry.float_activation_twin`) at its dtype's tolerance ``tol``."""
    from mhaexport.verify.report import Allowance, Bounds

    lg, pr = tol.for_output("logits"), tol.for_output("present")
    return Allowance(Bounds(lg.atol, lg.rtol), Bounds(pr.atol, pr.rtol),
                     f"lossy with int8 activations: its comparisons with itself run on {twin} — the same graph and "
                     "quantized weights, MatMulNBits at accuracy level 0 — at its dtype's tolerance; the int8 "
                     "activations' own effect is judged by quality, the file itself against eager")


# ---- the quality check ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class QualitySettings:
    """What verify's quality check reads besides the sweep: threshold overrides (``--quality NAME=X``), the text
    (None: the held-out text for a byte-level model) and how many greedy prompts and tokens."""

    overrides: dict | None = None
    text: bytes | None = None
    text_source: str = "held-out text (models/weights/small-heldout.txt)"
    prompts: int = 8
    prompt_len: int = 32
    greedy_tokens: int = 32


def check_quality(runner: Runner, ctx: Context) -> CheckResult:
    """A lossy artifact against eager fp32: the sweep's and the text's figures, greedy agreement, each judged by
    the scheme's thresholds (exact artifacts and eager: not applicable, the suite's row, verify/suite.py)."""
    settings = ctx.quality or QualitySettings()
    scheme = ctx.lossy.weights
    limits, table = thresholds_for(scheme, settings.overrides)
    c = ctx.contract
    fig = QualityFigures.of(scheme=ctx.lossy.label or scheme, thresholds=built(Limits, limits.to_dict()),
                            thresholds_of=table)
    # the sweep: every case eager and the artifact ran, real rows only
    sweep = ctx.sweep(runner).agreement or Agreement()  # accumulated case by case as the sweep ran
    fig.set(sweep=built(Scores, sweep.figures()))
    # real text: the held-out text (byte-level models) or --text
    from mhaexport.models.text import heldout_text, is_byte_level

    # text through the folder's tokenizer.json, or as bytes for a byte-level model; else the sweep alone judges
    readable = is_byte_level(c) or getattr(ctx.tokenizer, "kind", "byte-level") != "byte-level"
    text = settings.text if settings.text is not None else (heldout_text() if readable else None)
    ids = None
    if text is None:
        fig.set(text=Scores(skipped=f"no text: the model is not byte-level (vocab {c.vocab_size}) and its folder "
                                    "carries no tokenizer.json"))
    else:
        ids, byte_level = text_tokens(text, c, ctx.tokenizer)
        got, ref, agreement = score_text(runner, ids, byte_level=byte_level, reference=ctx.eager, memo=ctx._ref)
        fig.set(text=built(Scores, {"source": settings.text_source, "bytes": len(text), **agreement.figures(),
                                    "perplexity": rounded4(got.perplexity), "eager_perplexity": rounded4(ref.perplexity),
                                    "ppl_ratio": rounded4(got.perplexity / ref.perplexity),
                                    "bits_per_byte": rounded4(got.bits_per_byte),
                                    "eager_bits_per_byte": rounded4(ref.bits_per_byte)}))
    # greedy agreement from prompts of the text (or seeded random prompts)
    n = max(1, min(settings.greedy_tokens, c.max_positions - settings.prompt_len))
    if ids is not None:
        prompts = text_prompts(ids, settings.prompts, min(settings.prompt_len, c.max_positions - n))
    else:
        rng = np.random.default_rng(ctx.seed + 53)
        prompts = [rng.integers(0, c.vocab_size, settings.prompt_len) for _ in range(settings.prompts)]
    # every prompt at once on each side (one batch where the prompts are of one length: each step reads the weights
    # once for all of them), eager's memoized for the other runtimes
    keys = [("quality-greedy", i, n, hash(p.tobytes())) for i, p in enumerate(prompts)]
    missing = [i for i, key in enumerate(keys) if key not in ctx._ref]
    if missing:
        for i, tokens in zip(missing, greedy_tokens_each(ctx.eager, [prompts[i] for i in missing], n)):
            ctx._ref[keys[i]] = tokens
    lengths = [agreement_length(got, ctx._ref[key]) for got, key in zip(greedy_tokens_each(runner, prompts, n), keys)]
    fig.set(greedy=built(GreedyAgreement, {"prompts": len(prompts), "tokens": n, "lengths": lengths,
                                           "mean": rounded4(float(np.mean(lengths))), "min": int(min(lengths)),
                                           "fraction": rounded4(float(np.mean(lengths)) / n),
                                           "from": "text" if ids is not None else "random ids"}))
    return _verdict(fig, limits)


def _verdict(figures: QualityFigures | dict, limits: Thresholds) -> CheckResult:
    """Judge every measured figure; top-1 and greedy agreement only where eager's logits are not flat, and top-1 on
    the sweep (random ids and caches, full of near-ties) only where there is no text."""
    fig = figures_of(QUALITY, figures)
    failures, unjudged = [], []
    parts = [("text", fig.text or Scores()), ("sweep", fig.sweep or Scores())]
    has_text = bool(parts[0][1].positions)
    flat = any(p.flat for _, p in parts if p.positions)
    for where, p in parts:
        if not p.positions:
            continue
        for name in ("top1", "kl_mean", "kl_p99", "logit_err", "ppl_ratio"):
            if getattr(p, name) is None:
                continue
            if name == "top1" and where == "sweep" and has_text:
                continue  # random ids and caches: near-ties everywhere; real text says what top-1 means
            if name == "top1" and p.flat:
                unjudged.append(f"{where} top-1 ({p.top1:.3g}; eager's logits are flat: entropy "
                                f"{p.eager_entropy or 0:.3g} of {p.log_vocab or 0:.3g} nats)")
                continue
            if msg := judge(name, getattr(p, name), getattr(limits, name)):
                failures.append(f"{msg} ({where})")
    g = fig.greedy
    if g is not None and flat:
        unjudged.append(f"greedy agreement ({g.mean or 0:.3g} of {g.tokens} tokens; flat logits)")
    elif g is not None and (msg := judge("greedy", g.fraction, limits.greedy)):
        failures.append(f"{msg} (mean {g.mean or 0:.3g} of {g.tokens} greedy tokens)")
    fig.set(not_judged=unjudged)
    summary = _summary(fig)
    if failures:
        return CheckResult("quality", False, fig, f"{'; '.join(failures)} — {fig.scheme} keeps less quality than "
                                                  f"its thresholds allow ({summary})")
    note = f"; not judged: {'; '.join(unjudged)}" if unjudged else ""
    return CheckResult("quality", True, fig, f"{fig.scheme}: {summary}{note}")


def _summary(fig: QualityFigures) -> str:
    t, s, g = fig.text or Scores(), fig.sweep or Scores(), fig.greedy
    out = []
    if t.positions:
        out.append(f"text: top-1 {_g(t.top1, '.3f')}, KL {_g(t.kl_mean)}/{_g(t.kl_p99)} (mean/p99), perplexity "
                   f"x{_g(t.ppl_ratio, '.4g')}")
    if s.positions:
        out.append(f"sweep: top-1 {_g(s.top1, '.3f')}, KL {_g(s.kl_mean)}/{_g(s.kl_p99)}, logit error "
                   f"{_g(s.logit_err)}")
    if g is not None:
        out.append(f"greedy {_g(g.mean)}/{g.tokens} tokens")
    return "; ".join(out)


def _g(x: float | None, spec: str = ".3g") -> str:
    return "—" if x is None else format(x, spec)
