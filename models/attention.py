"""Multi-head attention as the seed article writes it, and the causal mask it needs.

The mask is built at run time from the query length, the past length and the padding mask, so an exported
graph holds no sequence-length constant: it grows with the KV cache on every decode step.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from mhaexport.core.errors import ConfigError

KV = tuple[torch.Tensor, torch.Tensor]


# ---- the mask rules -------------------------------------------------------------------------------------------
# As transformers' masking_utils writes them: each rule is one small function saying which (query, key) pairs may
# attend, and a mask is their ``and``. Each rule takes the Positions of one call and returns a bool tensor that
# broadcasts to (B, T, S). Positions are counted two ways: ``*_slot`` is the index in the key sequence (past + T
# slots, padding included); ``*_pos`` is the token's position among its row's REAL tokens (what RoPE and learned
# positions use). The causal rule compares slots; the sliding window compares positions, so left padding, right
# padding with holes (onnxruntime-genai's layout) and a shared cache all give a row the same keys.


@dataclass(frozen=True)
class Positions:
    """Where the queries and keys of one call sit. q_slot (T,), k_slot (S,): slot indices; q_pos (B|1, T), k_pos
    (B|1, S): positions among each row's real tokens; real (B, S) bool, or None without a padding mask."""

    q_slot: torch.Tensor
    k_slot: torch.Tensor
    q_pos: torch.Tensor
    k_pos: torch.Tensor
    real: torch.Tensor | None


MaskRule = Callable[[Positions], torch.Tensor]  # Positions -> bool, broadcasting to (B, T, S)


def positions_of(q_len: int | torch.SymInt, past_len: int | torch.SymInt, attention_mask: torch.Tensor | None = None,
                 device: torch.device | None = None, *, own: bool = True) -> Positions:
    """The Positions of ``q_len`` queries after ``past_len`` cached keys. ``attention_mask`` ([B, past + T], 1 =
    real token) gives each row's own token positions (its running count of real tokens, minus one); without it, or
    with ``own`` False (no rule reads them: the graph then holds no CumSum for them), the slots are the positions."""
    q_slot = torch.arange(q_len, device=device) + past_len  # (T,)
    k_slot = torch.arange(past_len + q_len, device=device)  # (S,)
    real = None if attention_mask is None else attention_mask.bool()  # (B, S)
    if attention_mask is None or not own:
        return Positions(q_slot, k_slot, q_slot[None], k_slot[None], real)
    k_pos = torch.cumsum(attention_mask, dim=-1) - 1  # (B, S): padded slots repeat the last real position
    return Positions(q_slot, k_slot, k_pos[:, -q_len:], k_pos, real)


def causal(p: Positions) -> torch.Tensor:
    """A query sees keys at its own slot and before: (1, T, S)."""
    return (p.k_slot[None, :] <= p.q_slot[:, None])[None]


def padding(p: Positions) -> torch.Tensor:
    """No query sees a padded key: (B, 1, S)."""
    return p.real[:, None, :]


def sliding_window(window: int) -> MaskRule:
    """A query at position p sees keys at positions p-W+1..p (W keys, the current token included, as transformers'
    ``sliding_window``), counted on the row's own tokens: (B, T, S)."""

    def rule(p: Positions) -> torch.Tensor:
        return (p.q_pos[:, :, None] - p.k_pos[:, None, :]) < window

    return rule


def and_masks(*rules: MaskRule) -> MaskRule:
    """The rule allowing what every one of ``rules`` allows."""

    def rule(p: Positions) -> torch.Tensor:
        out = rules[0](p)
        for r in rules[1:]:
            out = out & r(p)
        return out

    return rule


def mask_rule(window: int = 0, padded: bool = False) -> MaskRule:
    """Causal, then the padding rule where there is a padding mask, then a sliding window when ``window`` > 0."""
    return and_masks(causal, *([padding] if padded else []), *([sliding_window(window)] if window else []))


def build_causal_mask(q_len: int | torch.SymInt, past_len: int | torch.SymInt,
                      attention_mask: torch.Tensor | None = None,
                      device: torch.device | None = None, window: int = 0) -> torch.Tensor:
    """Boolean mask of allowed (query, key) pairs, True where attention may look.

    Query row t sits at slot ``past_len + t`` and sees keys ``0 .. past_len + t``.
    ``attention_mask`` ([B, past_len + q_len], 1 = real token, 0 = padding) hides padded keys; ``window`` > 0 keeps
    only the last ``window`` positions of the row's own tokens (:func:`sliding_window`).
    Returns [1, 1, T, S] without a padding mask, [B, 1, T, S] with one (or with a window), where S = past_len + q_len.
    """
    p = positions_of(q_len, past_len, attention_mask, device, own=window > 0)
    return mask_rule(window, attention_mask is not None)(p)[:, None]  # (B|1, 1, T, S)


def masked_fill_value(dtype: torch.dtype) -> float:
    """The fill for masked scores: the dtype's most negative finite value.

    -inf would make a fully masked row (a left-padded query) NaN after softmax; the finite minimum gives a
    uniform, finite row there and exactly 0 weight wherever any key is allowed (exp underflows). It is written
    with masked_fill, never added to the scores, so ``min + negative score`` cannot overflow to -inf.
    """
    return torch.finfo(dtype).min


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """(x1, x2) -> (-x2, x1) over the last dim's two halves (RoPE's rotation by 90 degrees). Written as two slices
    (Hugging Face's form, not ``chunk``): the export is then the Slice/Neg/Concat that onnxscript's RotaryEmbedding
    fusion matches (``--attention fused``); ``chunk`` exports as a Split it does not."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]  # (..., D/2) each
    return torch.cat([-x2, x1], dim=-1)


def rope_tables(positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype) -> tuple[torch.Tensor,
                                                                                                 torch.Tensor]:
    """cos and sin of rotary position embeddings at ``positions`` (B, T): each (B, 1, T, D).

    Computed as Hugging Face's Llama does (inv_freq @ positions, then cos/sin, cast, unsqueeze): the same numbers as
    ``positions * inv_freq`` (one product per element either way), and the export is the graph onnxscript's
    cos/sin-cache fusion turns into one com.microsoft RotaryEmbedding per use (``--attention fused``)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32)
                                / head_dim))  # (D/2,)
    pos = positions[:, None, :].to(torch.float32)  # (B, 1, T)
    freqs = (inv_freq[None, :, None] @ pos).transpose(1, 2)  # (1, D/2, 1) @ (B, 1, T) -> (B, T, D/2)
    emb = torch.cat([freqs, freqs], dim=-1)  # (B, T, D)
    return emb.cos().to(dtype).unsqueeze(1), emb.sin().to(dtype).unsqueeze(1)  # (B, 1, T, D) each


class MultiHeadAttention(nn.Module):
    """W_q, W_k, W_v, W_o (no bias); h heads of d_k = d_model / h; softmax(QK^T / sqrt(d_k) + mask) V.

    ``n_kv_heads`` < h is grouped-query attention: W_k and W_v project to n_kv_heads heads, each shared by
    h / n_kv_heads query heads; the KV cache holds the n_kv_heads heads. ``rope`` (cos, sin) rotates Q and K by their
    positions before K is cached (rotary embeddings).
    """

    def __init__(self, d_model: int, n_heads: int, n_kv_heads: int | None = None, *, softcap: float | None = None,
                 scale: float | None = None, sinks: bool = False) -> None:
        super().__init__()
        if d_model % n_heads != 0:
            raise ConfigError(f"d_model={d_model} is not divisible by n_heads={n_heads}")
        n_kv_heads = n_kv_heads or n_heads
        if n_heads % n_kv_heads != 0:
            raise ConfigError(f"n_heads={n_heads} is not a multiple of n_kv_heads={n_kv_heads}")
        self.d_model = d_model
        self.n_heads = n_heads
        self.n_kv_heads = n_kv_heads
        self.d_k = d_model // n_heads
        self.W_q = nn.Linear(d_model, d_model, bias=False)
        self.W_k = nn.Linear(d_model, n_kv_heads * self.d_k, bias=False)
        self.W_v = nn.Linear(d_model, n_kv_heads * self.d_k, bias=False)
        self.W_o = nn.Linear(d_model, d_model, bias=False)
        self.softcap = softcap  # scores -> softcap * tanh(scores / softcap), before the mask
        self.scale = scale  # None: 1/sqrt(d_k)
        # one learned logit per head that joins the softmax's denominator (gpt-oss): weight may go "nowhere"
        self.sinks = nn.Parameter(torch.zeros(n_heads)) if sinks else None

    def split_heads(self, x: torch.Tensor, heads: int | None = None) -> torch.Tensor:
        B, T, _ = x.shape
        return x.view(B, T, heads or self.n_heads, self.d_k).transpose(1, 2)  # (B, H, T, D)

    def repeat_kv(self, x: torch.Tensor) -> torch.Tensor:
        """(B, H_kv, S, D) -> (B, H, S, D): each key/value head repeated for the query heads it serves."""
        rep = self.n_heads // self.n_kv_heads
        return x if rep == 1 else x.repeat_interleave(rep, dim=1)

    def attend(self, scores: torch.Tensor, allowed: torch.Tensor | None) -> torch.Tensor:
        """Attention weights: masked scores, the mask applied BEFORE softmax (the step the classic bugs get wrong).
        ``allowed`` None: every key is allowed (bidirectional attention)."""
        if self.softcap is not None:
            scores = self.softcap * torch.tanh(scores / self.softcap)  # (B, H, T, S)
        if allowed is not None:
            scores = scores.masked_fill(~allowed, masked_fill_value(scores.dtype))  # (B, H, T, S)
        if self.sinks is None:
            return F.softmax(scores, dim=-1)
        B, H, T, _ = scores.shape
        sink = self.sinks.to(scores.dtype)[None, :, None, None].expand(B, H, T, 1)  # (B, H, T, 1)
        return F.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]  # (B, H, T, S): the sink's share dropped

    def forward(self, x: torch.Tensor, allowed: torch.Tensor | None, past: KV | None = None,
                rope: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor, KV]:
        """x: (B, T, d_model); allowed: bool (B|1, 1, T, past + T), or None for no mask; past: (B, H_kv, past, D)
        pair; rope: (cos, sin), each (B, 1, T, D), or None. Returns the output and the (key, value) cache."""
        out, present, _ = self.forward_with_weights(x, allowed, past, rope)
        return out, present

    def forward_with_weights(self, x: torch.Tensor, allowed: torch.Tensor | None, past: KV | None = None,
                             rope: tuple[torch.Tensor, torch.Tensor] | None = None
                             ) -> tuple[torch.Tensor, KV, torch.Tensor]:
        """:meth:`forward`, also returning the attention weights (B, H, T, past + T): softmax over the keys, the
        article's demonstration (what position t attends to). The decoder drops them; the block on its own
        (``models/block.py``) returns them."""
        B, T, _ = x.shape
        q = self.split_heads(self.W_q(x))  # (B, H, T, D)
        k = self.split_heads(self.W_k(x), self.n_kv_heads)  # (B, H_kv, T, D)
        v = self.split_heads(self.W_v(x), self.n_kv_heads)  # (B, H_kv, T, D)
        if rope is not None:
            cos, sin = rope
            q = q * cos + rotate_half(q) * sin  # (B, H, T, D)
            k = k * cos + rotate_half(k) * sin  # (B, H_kv, T, D): cached already rotated
        if past is not None:
            k = torch.cat([past[0], k], dim=2)  # (B, H_kv, S, D)
            v = torch.cat([past[1], v], dim=2)  # (B, H_kv, S, D)
        scores = q @ self.repeat_kv(k).transpose(-2, -1)  # (B, H, T, S)
        scores = scores / math.sqrt(self.d_k) if self.scale is None else scores * self.scale
        weights = self.attend(scores, allowed)  # (B, H, T, S)
        out = weights @ self.repeat_kv(v)  # (B, H, T, D)
        out = out.transpose(1, 2).reshape(B, T, self.d_model)  # (B, T, d_model): heads concatenated
        return self.W_o(out), (k, v), weights
