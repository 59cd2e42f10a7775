"""Choosing the next token from logits: greedy, or temperature / top-k / top-p sampling with a numpy Generator."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mhaexport.core.errors import RuntimeOptionError


@dataclass(frozen=True)
class SamplingConfig:
    """temperature 0 is greedy (argmax); top_k / top_p only apply when sampling."""

    temperature: float = 0.0
    top_k: int | None = None  # keep the k most likely tokens (exactly k, ties broken arbitrarily)
    top_p: float | None = None  # keep the smallest set whose probability reaches p (nucleus)
    seed: int | None = 0  # seeds numpy's Generator; None draws fresh entropy

    def __post_init__(self) -> None:
        if not (self.temperature >= 0.0 and np.isfinite(self.temperature)):
            raise RuntimeOptionError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if self.top_k is not None and self.top_k < 1:
            raise RuntimeOptionError(f"top_k must be >= 1, got {self.top_k}")
        if self.top_p is not None and not 0.0 < self.top_p <= 1.0:
            raise RuntimeOptionError(f"top_p must be in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def filtered_probs(logits: np.ndarray, cfg: SamplingConfig) -> np.ndarray:
    """(B, V) logits -> (B, V) float64 probabilities after temperature, top-k and top-p (rows sum to 1)."""
    x = logits.astype(np.float64) / cfg.temperature  # (B, V)
    V = x.shape[-1]
    if cfg.top_k is not None and cfg.top_k < V:
        # exactly k survive, also when several tokens tie with the k-th value (which of the tied ones is
        # argpartition's choice)
        top = np.argpartition(x, V - cfg.top_k, axis=-1)[:, V - cfg.top_k:]  # (B, k) indices of the k largest
        kept = np.full_like(x, -np.inf)
        np.put_along_axis(kept, top, np.take_along_axis(x, top, axis=-1), axis=-1)
        x = kept  # (B, V): -inf outside the top k
    x = x - x.max(axis=-1, keepdims=True)
    p = np.exp(x)
    p /= p.sum(axis=-1, keepdims=True)  # (B, V)
    if cfg.top_p is not None and cfg.top_p < 1.0:
        order = np.argsort(-p, axis=-1, kind="stable")  # (B, V) most likely first
        sorted_p = np.take_along_axis(p, order, axis=-1)
        before = np.cumsum(sorted_p, axis=-1) - sorted_p  # probability mass strictly before each token
        keep_sorted = before < cfg.top_p  # the first token is always kept
        keep = np.zeros_like(keep_sorted)
        np.put_along_axis(keep, order, keep_sorted, axis=-1)
        p = np.where(keep, p, 0.0)
        p /= p.sum(axis=-1, keepdims=True)
    return p


def next_tokens(logits: np.ndarray, cfg: SamplingConfig, rng: np.random.Generator) -> np.ndarray:
    """(B, V) logits of the last position -> (B,) int64 token ids."""
    if cfg.greedy:
        return logits.argmax(axis=-1).astype(np.int64, copy=False)
    p = filtered_probs(logits, cfg)  # (B, V)
    u = 1.0 - rng.random(p.shape[0])  # (B,) in (0, 1]: never selects a zero-probability first token
    cdf = np.cumsum(p, axis=-1)  # (B, V)
    idx = (cdf < u[:, None]).sum(axis=-1)  # first index whose cdf reaches u
    # u can exceed the last cdf by float rounding: fall back to the last token with any probability
    last = p.shape[-1] - 1 - np.argmax(p[:, ::-1] > 0, axis=-1)
    return np.minimum(idx, last).astype(np.int64)
