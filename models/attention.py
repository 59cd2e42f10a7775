"""Multi-head attention as the seed article writes it, and the causal mask it needs.

The mask is built at run time from the query length, the past length and the padding mask, so an exported
graph holds no sequence-length constant: it grows with the KV cache on every decode step.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from mhaexport.errors import ConfigError

KV = tuple[torch.Tensor, torch.Tensor]


def build_causal_mask(q_len: int | torch.SymInt, past_len: int | torch.SymInt,
                      attention_mask: torch.Tensor | None = None,
                      device: torch.device | None = None) -> torch.Tensor:
    """Boolean mask of allowed (query, key) pairs, True where attention may look.

    Query row t sits at absolute position ``past_len + t`` and sees keys ``0 .. past_len + t``.
    ``attention_mask`` ([B, past_len + q_len], 1 = real token, 0 = padding) hides padded keys.
    Returns [1, 1, T, S] without a padding mask, [B, 1, T, S] with one, where S = past_len + q_len.
    """
    q_pos = torch.arange(q_len, device=device) + past_len  # (T,)
    k_pos = torch.arange(past_len + q_len, device=device)  # (S,)
    allowed = k_pos[None, :] <= q_pos[:, None]  # (T, S)
    allowed = allowed[None, None]  # (1, 1, T, S)
    if attention_mask is not None:
        allowed = allowed & attention_mask[:, None, None, :].bool()  # (B, 1, T, S)
    return allowed


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

    def __init__(self, d_model: int, n_heads: int, n_kv_heads: int | None = None) -> None:
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
        if allowed is not None:
            scores = scores.masked_fill(~allowed, masked_fill_value(scores.dtype))  # (B, H, T, S)
        return F.softmax(scores, dim=-1)

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
        scores = (q @ self.repeat_kv(k).transpose(-2, -1)) / math.sqrt(self.d_k)  # (B, H, T, S)
        weights = self.attend(scores, allowed)  # (B, H, T, S)
        out = weights @ self.repeat_kv(v)  # (B, H, T, D)
        out = out.transpose(1, 2).reshape(B, T, self.d_model)  # (B, T, d_model): heads concatenated
        return self.W_o(out), (k, v), weights
