"""Quality of a lossy (quantized) artifact against eager fp32, and the perplexity of any runtime on text.

Exact parity does not apply to a lossy artifact: its logits differ from eager's by design. What can be asked is how
much the model's *predictions* move, in the figures a user of a language model reads:

- **top-1 agreement**: the fraction of positions where the artifact's most likely next token is eager's;
- **KL divergence** KL(eager ‖ artifact) of the next-token distributions, per position: mean and p99;
- **relative logit error**: ‖Δ logits‖ / ‖eager logits‖ with each position's mean removed (logits are shift-free),
  a scale-free figure that still means something where eager's logits are flat (random weights);
- **perplexity** of held-out text under both, and its ratio (bits per byte for a byte-level model);
- **greedy agreement length**: greedy tokens from prompts of real text until the artifact's first differs.

The sweep's figures (random ids and caches at verify's shapes) and the text's (sliding windows over real text)
are reported side by side; the thresholds (:data:`THRESHOLDS`, per scheme, overridable) judge each figure that is
measured. Where eager's next-token distributions are nearly uniform (mean entropy above 90 % of log V: random
weights), top-1 and greedy agreement mean nothing (any noise flips a near-tie) and are reported, not judged.

Torch-free: everything here works on the runner protocol's numpy outputs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Callable

import numpy as np

from mhaexport.errors import ConfigError
from mhaexport.progress import Step
from mhaexport.runtime.decode import DecodeLoop, GenerationConfig
from mhaexport.runtime.runner import Runner
from mhaexport.verify.compare import Tolerance
from mhaexport.verify.results import CheckResult, Context

if TYPE_CHECKING:
    from mhaexport.artifact.details import Quantization

FLAT_ENTROPY = 0.9  # eager's mean entropy above this fraction of log(vocab): flat logits, top-1 is not judged
ROWS_PER_CHUNK = 256  # positions compared at once (a (256, 32000) float64 array is 65 MB)


# ---- comparing next-token distributions --------------------------------------------------------------------

def log_softmax(logits: np.ndarray) -> np.ndarray:
    """float64 log-probabilities over the last axis."""
    x = np.asarray(logits, dtype=np.float64)
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


@dataclass
class Agreement:
    """Per-position comparison of eager's next-token distributions with an artifact's, accumulated over chunks."""

    positions: int = 0
    agree: int = 0
    err_sq: float = 0.0  # sum over positions of |centered logit difference|^2
    ref_sq: float = 0.0  # sum over positions of |centered eager logits|^2
    entropy: float = 0.0  # sum of eager's entropies (nats)
    vocab: int = 0
    kl: list[np.ndarray] = field(default_factory=list)  # per-position KL(eager || artifact), chunks

    def add(self, ref: np.ndarray, got: np.ndarray) -> None:
        """Add (N, V) logits of eager (``ref``) and the artifact (``got``) at the same N positions."""
        ref = np.asarray(ref).reshape(-1, ref.shape[-1])
        got = np.asarray(got).reshape(-1, got.shape[-1])
        self.vocab = ref.shape[-1]
        for i in range(0, ref.shape[0], ROWS_PER_CHUNK):
            r, g = ref[i:i + ROWS_PER_CHUNK].astype(np.float64), got[i:i + ROWS_PER_CHUNK].astype(np.float64)
            lr, lg = log_softmax(r), log_softmax(g)
            pr = np.exp(lr)
            self.kl.append(np.maximum((pr * (lr - lg)).sum(axis=-1), 0.0))
            self.entropy += float(-(pr * lr).sum())
            self.agree += int((r.argmax(-1) == g.argmax(-1)).sum())
            rc, gc = r - r.mean(-1, keepdims=True), g - g.mean(-1, keepdims=True)
            self.err_sq += float(((gc - rc) ** 2).sum())
            self.ref_sq += float((rc ** 2).sum())
            self.positions += r.shape[0]

    @property
    def flat(self) -> bool:
        """Eager's distributions are nearly uniform: top-1 agreement there means nothing."""
        return bool(self.positions) and self.entropy / self.positions > FLAT_ENTROPY * math.log(max(self.vocab, 2))

    def figures(self) -> dict:
        """top1, kl_mean, kl_p99, logit_err, eager_entropy (mean, nats), log_vocab, flat, positions."""
        if not self.positions:
            return {"positions": 0}
        kl = np.concatenate(self.kl)
        return {"top1": _r(self.agree / self.positions), "kl_mean": _r(float(kl.mean())),
                "kl_p99": _r(float(np.quantile(kl, 0.99))),
                "logit_err": _r(math.sqrt(self.err_sq / self.ref_sq) if self.ref_sq else 0.0),
                "eager_entropy": _r(self.entropy / self.positions), "log_vocab": _r(math.log(max(self.vocab, 2))),
                "flat": self.flat, "positions": self.positions}


def _r(x: float | None) -> float | None:
    return None if x is None else float(f"{x:.4g}")  # None: a figure that does not apply (bits per byte of BPE)


# ---- text: perplexity over sliding windows -------------------------------------------------------------------

@dataclass
class TextScore:
    """Next-token loss of a runtime on a text: ``nll`` nats summed over ``tokens`` predicted positions."""

    tokens: int
    nll: float
    byte_level: bool = False  # a token is a byte: bits per token are bits per byte

    @property
    def perplexity(self) -> float:
        return math.exp(self.nll / self.tokens) if self.tokens else float("nan")

    @property
    def bits_per_token(self) -> float:
        return self.nll / self.tokens / math.log(2) if self.tokens else float("nan")

    @property
    def bits_per_byte(self) -> float | None:
        return self.bits_per_token if self.byte_level else None

    def to_dict(self) -> dict:
        return {"tokens": self.tokens, "nll": _r(self.nll), "perplexity": _r(self.perplexity),
                "bits_per_token": _r(self.bits_per_token),
                "bits_per_byte": None if self.bits_per_byte is None else _r(self.bits_per_byte)}


def windows(n: int, length: int, stride: int | None = None) -> list[tuple[int, int, int]]:
    """Sliding windows over ``n`` tokens: (start, end, first scored index within the window). Windows of
    ``length`` tokens advance by ``stride`` (default half a window); each scores the positions no earlier window
    scored, so every prediction is scored at most once, with at least ``length - stride`` tokens of context (except at
    the start). ``stride == length``: consecutive windows, the last one aligned to the text's end."""
    if n < 2:
        return []
    length = max(2, min(length, n))
    stride = max(1, min(stride or length // 2, length))
    out, scored_to = [], 0  # scored_to: the last target index scored so far (targets are tokens 1..n-1)
    start = 0
    while True:
        end = min(start + length, n)
        first = max(scored_to - start, 0)  # window position whose prediction targets token scored_to + 1
        out.append((start, end, first))
        scored_to = end - 1
        if end == n:
            return out
        start = min(start + stride, n - length)


def _window_logits(runner: Runner, ids: np.ndarray) -> np.ndarray:
    """(T, V) logits of one (T,) window, no cache."""
    x = ids.reshape(1, -1)
    logits, _ = runner.run(x, np.ones_like(x), None)
    return logits[0]


def _score(logits: np.ndarray, targets: np.ndarray) -> float:
    """Summed nats of ``targets`` under (N, V) ``logits``."""
    total = 0.0
    for i in range(0, len(targets), ROWS_PER_CHUNK):
        lp = log_softmax(logits[i:i + ROWS_PER_CHUNK])
        total -= float(lp[np.arange(lp.shape[0]), targets[i:i + ROWS_PER_CHUNK]].sum())
    return total


def text_tokens(text: bytes, contract, tokenizer=None) -> tuple[np.ndarray, bool]:
    """Text as the model's ids, and whether a token is a byte: the folder's tokenizer.json when it carries one
    (an --hf export, an adopted file), else the bytes of a byte-level model (RuntimeInputError otherwise)."""
    from mhaexport.models.text import text_ids

    if tokenizer is not None and getattr(tokenizer, "kind", "") != "byte-level":
        ids = np.asarray(tokenizer.encode(text.decode("utf-8", errors="replace")), dtype=np.int64)
        if ids.size < 2:
            from mhaexport.errors import RuntimeInputError

            raise RuntimeInputError(f"the text is {ids.size} token(s): at least 2 are needed to predict one")
        return ids, False
    return text_ids(text, contract), True


def score_text(runner: Runner, ids: np.ndarray, *, window: int | None = None, stride: int | None = None,
               byte_level: bool = False, reference: Runner | None = None, memo: dict | None = None,
               progress: Callable[[str], None] | None = None
               ) -> tuple[TextScore, TextScore | None, Agreement | None]:
    """Perplexity of ``runner`` on token ids (sliding windows of ``window`` tokens, default max_positions, advancing
    by ``stride``, default half a window); with ``reference`` also eager's perplexity and the per-position
    :class:`Agreement` of the two. ``memo`` keeps ``reference``'s window logits between calls. ``progress``: told
    each window as a counted :class:`~mhaexport.progress.Step`."""
    ids = np.asarray(ids, dtype=np.int64).reshape(-1)
    L = window or runner.contract.max_positions
    got = TextScore(0, 0.0, byte_level)
    ref = TextScore(0, 0.0, byte_level) if reference is not None else None
    agreement = Agreement() if reference is not None else None
    spans = list(windows(len(ids), L, stride))
    for k, (start, end, first) in enumerate(spans):
        if progress is not None:
            progress(Step(f"{runner.name}: window {k + 1} of {len(spans)} (tokens {start}..{end - 1})", k, len(spans)))
        w = ids[start:end]
        targets = w[first + 1:]
        logits = _window_logits(runner, w)[first:len(w) - 1]  # (N, V): predictions of targets
        got.tokens += len(targets)
        got.nll += _score(logits, targets)
        if reference is not None:
            key = ("text-window", start, end, len(ids), hash(w.tobytes()))
            if memo is not None and key in memo:
                ref_logits = memo[key]
            else:
                ref_logits = _window_logits(reference, w)[first:len(w) - 1]
                if memo is not None:
                    memo[key] = ref_logits
            ref.tokens += len(targets)
            ref.nll += _score(ref_logits, targets)
            agreement.add(ref_logits, logits)
    return got, ref, agreement


# ---- greedy agreement --------------------------------------------------------------------------------------

def greedy_tokens(runner: Runner, prompt: np.ndarray, n: int) -> list[int]:
    """n greedy tokens after a (P,) prompt through the one decode loop (the runner's own cache)."""
    r = DecodeLoop(runner).generate(prompt.reshape(1, -1), GenerationConfig(max_new_tokens=n))
    return r.tokens[0]


def agreement_length(a: list[int], b: list[int]) -> int:
    """Tokens before the first that differs."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def text_prompts(ids: np.ndarray, count: int, length: int) -> list[np.ndarray]:
    """``count`` prompts of ``length`` tokens taken at even offsets through the text."""
    if len(ids) < length + 1:
        return [ids[:max(1, len(ids) - 1)]]
    starts = np.linspace(0, len(ids) - length - 1, count).astype(int)
    return [ids[s:s + length] for s in sorted(set(starts.tolist()))]


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
# make it smaller; at float activations (accuracy level 0/1) by 1e-5. The self-comparisons (causality,
# kv-consistency, padding, cached vs recomputed generation) of such an artifact allow REQUANT_FRACTION of eager's RMS
# per output: a requantization step moves outputs by a few percent of their scale, a cache, mask or position bug by
# a large part of it (tests/test_quantize.py: a decode window planted in the model, quantized, still fails).
REQUANT_FRACTION = 0.10
INT8_ACTIVATIONS = 4  # the accuracy level that quantizes activations


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
    fig: dict = {"scheme": ctx.lossy.label or scheme, "thresholds": limits.to_dict(), "thresholds_of": table}
    # the sweep: every case eager and the artifact ran, real rows only
    sweep = Agreement()
    for case, out in ctx.sweep(runner).items():
        if isinstance(out, BaseException):
            continue
        ref = ctx.reference(case)[0]  # (B, T, V)
        rows = case.real_rows()  # (B, T)
        sweep.add(ref[rows], out[0][rows])
    fig["sweep"] = sweep.figures()
    # real text: the held-out text (byte-level models) or --text
    from mhaexport.models.text import heldout_text, is_byte_level

    # text through the folder's tokenizer.json, or as bytes for a byte-level model; else the sweep alone judges
    readable = is_byte_level(c) or getattr(ctx.tokenizer, "kind", "byte-level") != "byte-level"
    text = settings.text if settings.text is not None else (heldout_text() if readable else None)
    ids = None
    if text is None:
        fig["text"] = {"skipped": f"no text: the model is not byte-level (vocab {c.vocab_size}) and its folder "
                                  "carries no tokenizer.json"}
    else:
        ids, byte_level = text_tokens(text, c, ctx.tokenizer)
        got, ref, agreement = score_text(runner, ids, byte_level=byte_level, reference=ctx.eager, memo=ctx._ref)
        fig["text"] = {"source": settings.text_source, "bytes": len(text), **agreement.figures(),
                       "perplexity": _r(got.perplexity), "eager_perplexity": _r(ref.perplexity),
                       "ppl_ratio": _r(got.perplexity / ref.perplexity),
                       "bits_per_byte": _r(got.bits_per_byte), "eager_bits_per_byte": _r(ref.bits_per_byte)}
    # greedy agreement from prompts of the text (or seeded random prompts)
    n = max(1, min(settings.greedy_tokens, c.max_positions - settings.prompt_len))
    if ids is not None:
        prompts = text_prompts(ids, settings.prompts, min(settings.prompt_len, c.max_positions - n))
    else:
        rng = np.random.default_rng(ctx.seed + 53)
        prompts = [rng.integers(0, c.vocab_size, settings.prompt_len) for _ in range(settings.prompts)]
    lengths = []
    for i, p in enumerate(prompts):
        key = ("quality-greedy", i, n, hash(p.tobytes()))
        if key not in ctx._ref:
            ctx._ref[key] = greedy_tokens(ctx.eager, p, n)
        lengths.append(agreement_length(greedy_tokens(runner, p, n), ctx._ref[key]))
    fig["greedy"] = {"prompts": len(prompts), "tokens": n, "lengths": lengths,
                     "mean": _r(float(np.mean(lengths))), "min": int(min(lengths)),
                     "fraction": _r(float(np.mean(lengths)) / n), "from": "text" if ids is not None else "random ids"}
    return _verdict(fig, limits)


def _verdict(fig: dict, limits: Thresholds) -> CheckResult:
    """Judge every measured figure; top-1 and greedy agreement only where eager's logits are not flat, and top-1 on
    the sweep (random ids and caches, full of near-ties) only where there is no text."""
    failures, unjudged = [], []
    parts = [("text", fig.get("text") or {}), ("sweep", fig.get("sweep") or {})]
    has_text = bool(parts[0][1].get("positions"))
    flat = any(p.get("flat") for _, p in parts if p.get("positions"))
    for where, p in parts:
        if not p.get("positions"):
            continue
        for name in ("top1", "kl_mean", "kl_p99", "logit_err", "ppl_ratio"):
            if name not in p:
                continue
            if name == "top1" and where == "sweep" and has_text:
                continue  # random ids and caches: near-ties everywhere; real text says what top-1 means
            if name == "top1" and p.get("flat"):
                unjudged.append(f"{where} top-1 ({p['top1']:.3g}; eager's logits are flat: entropy "
                                f"{p['eager_entropy']:.3g} of {p['log_vocab']:.3g} nats)")
                continue
            if msg := judge(name, p[name], getattr(limits, name)):
                failures.append(f"{msg} ({where})")
    g = fig.get("greedy") or {}
    if g and flat:
        unjudged.append(f"greedy agreement ({g['mean']:.3g} of {g['tokens']} tokens; flat logits)")
    elif g and (msg := judge("greedy", g["fraction"], limits.greedy)):
        failures.append(f"{msg} (mean {g['mean']:.3g} of {g['tokens']} greedy tokens)")
    fig["not_judged"] = unjudged
    summary = _summary(fig)
    if failures:
        return CheckResult("quality", False, fig, f"{'; '.join(failures)} — {fig['scheme']} keeps less quality than "
                                                  f"its thresholds allow ({summary})")
    note = f"; not judged: {'; '.join(unjudged)}" if unjudged else ""
    return CheckResult("quality", True, fig, f"{fig['scheme']}: {summary}{note}")


def _summary(fig: dict) -> str:
    t, s, g = fig.get("text") or {}, fig.get("sweep") or {}, fig.get("greedy") or {}
    out = []
    if t.get("positions"):
        out.append(f"text: top-1 {t['top1']:.3f}, KL {t['kl_mean']:.3g}/{t['kl_p99']:.3g} (mean/p99), perplexity "
                   f"x{t['ppl_ratio']:.4g}")
    if s.get("positions"):
        out.append(f"sweep: top-1 {s['top1']:.3f}, KL {s['kl_mean']:.3g}/{s['kl_p99']:.3g}, logit error "
                   f"{s['logit_err']:.3g}")
    if g:
        out.append(f"greedy {g['mean']:.3g}/{g['tokens']} tokens")
    return "; ".join(out)
