"""A correct decoder written differently from the built-in one: torch.nn.functional.scaled_dot_product_attention
with an explicit boolean mask, fused QKV, rotary-free learned positions. verify must pass it with no false alarm."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from mhaexport.models.config import DecoderConfig

CONFIG = DecoderConfig(vocab_size=256, d_model=64, n_heads=4, n_layers=2, d_ff=128, max_positions=96, seed=3,
                       name="good-sdpa")


class Block(nn.Module):
    def __init__(self, c: DecoderConfig) -> None:
        super().__init__()
        self.h, self.d = c.n_heads, c.d_model // c.n_heads
        self.ln1, self.ln2 = nn.LayerNorm(c.d_model), nn.LayerNorm(c.d_model)
        self.qkv = nn.Linear(c.d_model, 3 * c.d_model)
        self.proj = nn.Linear(c.d_model, c.d_model)
        self.mlp = nn.Sequential(nn.Linear(c.d_model, c.d_ff), nn.ReLU(), nn.Linear(c.d_ff, c.d_model))

    def forward(self, x, allowed, past):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=-1)
        q, k, v = (t.view(B, T, self.h, self.d).transpose(1, 2) for t in (q, k, v))  # (B, H, T, D)
        k = torch.cat([past[0], k], dim=2)  # (B, H, S, D)
        v = torch.cat([past[1], v], dim=2)  # (B, H, S, D)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)  # (B, H, T, D)
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, C))
        return x + self.mlp(self.ln2(x)), (k, v)


class SdpaDecoder(nn.Module):
    def __init__(self, c: DecoderConfig = CONFIG) -> None:
        super().__init__()
        self.config = c
        torch.manual_seed(c.seed)  # deterministic weights: the factory can be re-run to rebuild the reference
        self.wte, self.wpe = nn.Embedding(c.vocab_size, c.d_model), nn.Embedding(c.max_positions, c.d_model)
        self.blocks = nn.ModuleList(Block(c) for _ in range(c.n_layers))
        self.ln_f = nn.LayerNorm(c.d_model)
        self.head = nn.Linear(c.d_model, c.vocab_size, bias=False)

    def forward(self, input_ids, attention_mask, past_key_values):
        B, T = input_ids.shape
        P = past_key_values[0][0].shape[2]
        S = P + T
        real = attention_mask.bool()  # (B, S)
        causal = torch.arange(S)[None, :] <= (torch.arange(T) + P)[:, None]  # (T, S)
        allowed = causal[None, None] & real[:, None, None, :]  # (B, 1, T, S)
        # A left-padded query row has no allowed key; let it see itself so SDPA stays finite (its output is unused).
        diag = torch.arange(S)[None, :] == (torch.arange(T) + P)[:, None]  # (T, S)
        allowed = allowed | diag[None, None]
        pos = (attention_mask.cumsum(-1) - 1).clamp(min=0)[:, -T:]  # (B, T)
        x = self.wte(input_ids) + self.wpe(pos)
        present = []
        for blk, past in zip(self.blocks, past_key_values):
            x, kv = blk(x, allowed, past)
            present.append(kv)
        return self.head(self.ln_f(x)), tuple(present)


def sdpa_decoder() -> nn.Module:
    return SdpaDecoder().eval()
