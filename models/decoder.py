"""Pre-LN decoder block and the decoder LM with the contract's KV cache in and out."""

from __future__ import annotations

import torch
from torch import nn

from mhaexport.models.attention import KV, MultiHeadAttention, build_causal_mask
from mhaexport.models.config import DecoderConfig


class DecoderBlock(nn.Module):
    """x + attn(LN(x)), then x + FFN(LN(x))."""

    def __init__(self, config: DecoderConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.attn = MultiHeadAttention(config.d_model, config.n_heads)
        self.ln_2 = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.ffn = nn.Sequential(
            nn.Linear(config.d_model, config.d_ff),
            nn.GELU(),
            nn.Linear(config.d_ff, config.d_model),
        )

    def forward(self, x: torch.Tensor, allowed: torch.Tensor, past: KV | None) -> tuple[torch.Tensor, KV]:
        a, present = self.attn(self.ln_1(x), allowed, past)
        x = x + a
        x = x + self.ffn(self.ln_2(x))
        return x, present


def position_ids_from_mask(attention_mask: torch.Tensor, q_len: int | torch.SymInt) -> torch.Tensor:
    """Positions of the last q_len tokens, counted over real tokens only (left padding starts at 0).

    attention_mask: (B, past + T) -> (B, T). Padded slots get position 0 (their output is never used).
    """
    pos = torch.cumsum(attention_mask, dim=-1) - 1  # (B, S)
    pos = pos.clamp(min=0)
    return pos[:, -q_len:]  # (B, T)


class DecoderLM(nn.Module):
    """Token + learned position embeddings, N Pre-LN blocks, final LayerNorm, LM head (tied by default).

    forward(input_ids, attention_mask, past_key_values) -> (logits, present_key_values), as in docs/DESIGN.md.
    """

    def __init__(self, config: DecoderConfig) -> None:
        super().__init__()
        self.config = config
        self.tok_emb = nn.Embedding(config.vocab_size, config.d_model)
        self.pos_emb = nn.Embedding(config.max_positions, config.d_model)
        self.blocks = nn.ModuleList(DecoderBlock(config) for _ in range(config.n_layers))
        self.ln_f = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Deterministic weights from config.seed (GPT-2 style init), without touching the global RNG."""
        gen = torch.Generator().manual_seed(self.config.seed)
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                with torch.no_grad():
                    module.weight.copy_(torch.randn(module.weight.shape, generator=gen) * 0.02)
                    if getattr(module, "bias", None) is not None:
                        module.bias.zero_()
        if self.config.tie_embeddings:
            self.lm_head.weight = self.tok_emb.weight

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                past_key_values: tuple[KV, ...] | None = None) -> tuple[torch.Tensor, tuple[KV, ...]]:
        B, T = input_ids.shape
        past_len = past_key_values[0][0].shape[2] if past_key_values else 0
        allowed = build_causal_mask(T, past_len, attention_mask, device=input_ids.device)  # (B, 1, T, S)
        pos = position_ids_from_mask(attention_mask, T)  # (B, T)
        x = self.tok_emb(input_ids) + self.pos_emb(pos)  # (B, T, d_model)
        present = []
        for i, block in enumerate(self.blocks):
            x, kv = block(x, allowed, past_key_values[i] if past_key_values else None)
            present.append(kv)
        logits = self.lm_head(self.ln_f(x))  # (B, T, vocab)
        return logits, tuple(present)
