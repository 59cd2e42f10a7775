"""evaluate's scoring: how good a runtime's next-token predictions are, in the figures a user of a language model
reads — used by ``mhaexport eval`` (evaluate/perplexity.py) and by verify's quality check (verify/quality.py), one
implementation for both.

- **top-1 agreement**, **KL divergence** KL(eager ‖ artifact) per position (mean, p99) and the **relative logit
  error** (‖Δ logits‖ / ‖eager logits‖, each position's mean removed): :class:`Agreement`;
- **perplexity** (bits per token, bits per byte for a byte-level model) over sliding windows of a text:
  :class:`TextScore`, :func:`windows`, :func:`score_text`, the text as the model's ids (:func:`text_tokens`);
- **greedy agreement length**: :func:`greedy_tokens` (:func:`greedy_tokens_each`: prompts of one length as one batch),
  :func:`agreement_length`, :func:`text_prompts`.

Judging the figures (thresholds per scheme) is verify's (verify/quality.py). This module stands below verification
(docs/DESIGN.md, "Layers": evaluate's scoring imports runtime, models and core only, so verify may import it while
the rest of evaluate stands on verify's runners). Torch-free: it works on the runner protocol's numpy outputs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from mhaexport.core.progress import Step
from mhaexport.runtime.decode import DecodeLoop, GenerationConfig
from mhaexport.runtime.runner import Runner

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
        return {"top1": rounded4(self.agree / self.positions), "kl_mean": rounded4(float(kl.mean())),
                "kl_p99": rounded4(float(np.quantile(kl, 0.99))),
                "logit_err": rounded4(math.sqrt(self.err_sq / self.ref_sq) if self.ref_sq else 0.0),
                "eager_entropy": rounded4(self.entropy / self.positions),
                "log_vocab": rounded4(math.log(max(self.vocab, 2))),
                "flat": self.flat, "positions": self.positions}


def rounded4(x: float | None) -> float | None:
    """x to 4 significant digits: how the scoring's figures are recorded (None: a figure that does not apply, bits
    per byte of BPE)."""
    return None if x is None else float(f"{x:.4g}")


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
        return {"tokens": self.tokens, "nll": rounded4(self.nll), "perplexity": rounded4(self.perplexity),
                "bits_per_token": rounded4(self.bits_per_token),
                "bits_per_byte": None if self.bits_per_byte is None else rounded4(self.bits_per_byte)}


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
            from mhaexport.core.errors import RuntimeInputError

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
    each window as a counted :class:`~mhaexport.core.progress.Step`."""
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


def greedy_tokens_each(runner: Runner, prompts: list[np.ndarray], n: int) -> list[list[int]]:
    """n greedy tokens after each (P,) prompt: prompts of one length as one batch through the decode loop (no
    padding: each row is fed what it would be fed alone, and stops at eos as it would alone), others one at a time.
    A batch step reads the weights once for every row: for a model whose weights are streamed or mapped (an 8 B
    model's quality check: eager's 8 prompts x 32 tokens, ~3.5 s a token one prompt at a time) that is 8 times fewer
    passes over them. A row's tokens are its tokens alone up to the kernels' rounding of a wider batch."""
    rows = [np.asarray(p).reshape(-1) for p in prompts]
    if len({len(r) for r in rows}) == 1:
        r = DecodeLoop(runner).generate(np.stack(rows), GenerationConfig(max_new_tokens=n))
        return [list(t) for t in r.tokens]
    return [greedy_tokens(runner, r, n) for r in rows]


def agreement_length(a: list[int], b: list[int]) -> int:
    """Tokens before the first that differs."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def text_prompts(ids: np.ndarray, count: int, length: int) -> list[np.ndarray]:
    """``count`` prompts of ``length`` tokens taken at even offsets through the text."""
    if len(ids) < length + 1:
        return [ids[:max(1, len(ids) - 1)]]
    starts = np.linspace(0, len(ids) - length - 1, count).astype(int)
    return [ids[s:s + length] for s in sorted(set(starts.tolist()))]
