"""A user model under the decoder contract, written differently from the built-in one.

Fused QKV projection, torch's scaled_dot_product_attention with an explicit boolean mask, RMS-free plain
LayerNorm, and a config that is a plain dict-like object. Use it as

    mhaexport onnx --model examples/user_decoder.py:build -o out/user
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import nn


class Block(nn.Module):
    def __init__(self, d: int, h: int) -> None:
        super().__init__()
        self.h, self.d = h, d
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.out = nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.ReLU(), nn.Linear(4 * d, d))

    def forward(self, x, allowed, past):
        B, T, _ = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(self.d, dim=-1)  # 3 x (B, T, d)
        q, k, v = (t.view(B, T, self.h, self.d // self.h).transpose(1, 2) for t in (q, k, v))  # (B, H, T, D)
        k = torch.cat([past[0], k], dim=2)  # (B, H, S, D)
        v = torch.cat([past[1], v], dim=2)
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)  # (B, H, T, D)
        x = x + self.out(a.transpose(1, 2).reshape(B, T, self.d))
        return x + self.mlp(self.norm2(x)), (k, v)


class UserDecoder(nn.Module):
    def __init__(self, vocab: int = 300, d: int = 48, h: int = 3, layers: int = 2, max_pos: int = 96) -> None:
        super().__init__()
        self.config = SimpleNamespace(n_layers=layers, n_heads=h, head_dim=d // h, vocab_size=vocab,
                                      max_positions=max_pos)
        self.emb = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(max_pos, d)
        self.blocks = nn.ModuleList(Block(d, h) for _ in range(layers))
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, input_ids, attention_mask, past_key_values):
        T = input_ids.shape[1]
        P = past_key_values[0][0].shape[2]
        q_pos = torch.arange(T) + P  # (T,)
        k_pos = torch.arange(P + T)  # (S,)
        allowed = k_pos[None, :] <= q_pos[:, None]  # (T, S)
        allowed = allowed[None, None] & attention_mask[:, None, None, :].bool()  # (B, 1, T, S)
        # a fully padded query row would be all False (NaN in SDPA): let every query see itself
        allowed = allowed | (k_pos[None, :] == q_pos[:, None])[None, None]
        pos = (attention_mask.cumsum(-1) - 1).clamp(min=0)[:, -T:]  # (B, T)
        x = self.emb(input_ids) + self.pos(pos)
        present = []
        for block, kv in zip(self.blocks, past_key_values):
            x, new_kv = block(x, allowed, kv)
            present.append(new_kv)
        return self.head(self.norm(x)), tuple(present)


def build() -> UserDecoder:
    torch.manual_seed(0)
    return UserDecoder().eval()
