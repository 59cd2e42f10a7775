"""Pre-LN decoder block and the decoder LM with the contract's KV cache in and out."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from mhaexport.models.attention import KV, MultiHeadAttention, build_causal_mask, rope_tables
from mhaexport.models.config import DecoderConfig
from mhaexport.models.stack import BlockHandoff


def make_norm(config: DecoderConfig) -> nn.Module:
    """LayerNorm (the article's) or RMSNorm (Llama's) over d_model."""
    if config.norm == "rmsnorm":
        return nn.RMSNorm(config.d_model, eps=config.layer_norm_eps)
    return nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)


class SwiGLU(nn.Module):
    """Llama's feed-forward: W2(silu(W1 x) * W3 x), no biases."""

    def __init__(self, d_model: int, d_ff: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(d_model, d_ff, bias=False)
        self.w3 = nn.Linear(d_model, d_ff, bias=False)
        self.w2 = nn.Linear(d_ff, d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))  # (B, T, d_model)


class DecoderBlock(nn.Module):
    """x + attn(norm(x)), then x + FFN(norm(x))."""

    def __init__(self, config: DecoderConfig) -> None:
        super().__init__()
        self.ln_1 = make_norm(config)
        self.attn = MultiHeadAttention(config.d_model, config.n_heads, config.n_kv_heads,
                                       softcap=config.attn_softcap, scale=config.query_scale, sinks=config.attn_sinks)
        self.ln_2 = make_norm(config)
        if config.mlp == "swiglu":
            self.ffn = SwiGLU(config.d_model, config.d_ff)
        else:
            self.ffn = nn.Sequential(
                nn.Linear(config.d_model, config.d_ff),
                nn.GELU(),
                nn.Linear(config.d_ff, config.d_model),
            )

    def forward(self, x: torch.Tensor, allowed: torch.Tensor, past: KV | None,
                rope: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor, KV]:
        a, present = self.attn(self.ln_1(x), allowed, past, rope)
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
    """Token embeddings (+ learned position embeddings, or RoPE inside attention), N Pre-LN blocks, a final norm,
    the LM head (tied by default).

    forward(input_ids, attention_mask, past_key_values) -> (logits, present_key_values), as in docs/DESIGN.md.
    """

    block_handoff = BlockHandoff  # where a block takes its past and gives its present (verify's block order)

    def __init__(self, config: DecoderConfig) -> None:
        super().__init__()
        self.config = config
        self.tok_emb = nn.Embedding(config.vocab_size, config.d_model)
        if config.positions == "learned":
            self.pos_emb = nn.Embedding(config.max_positions, config.d_model)
        self.blocks = nn.ModuleList(DecoderBlock(config) for _ in range(config.n_layers))
        self.ln_f = make_norm(config)
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
        for block in self.blocks:  # after every other weight: a model without sinks draws exactly as before
            if block.attn.sinks is not None:
                with torch.no_grad():
                    block.attn.sinks.copy_(torch.randn(block.attn.sinks.shape, generator=gen))

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                past_key_values: tuple[KV, ...] | None = None) -> tuple[torch.Tensor, tuple[KV, ...]]:
        B, T = input_ids.shape
        past_len = past_key_values[0][0].shape[2] if past_key_values else 0
        cfg = self.config
        windows = cfg.layer_windows or (0,) * cfg.n_layers
        allowed = {w: build_causal_mask(T, past_len, attention_mask, device=input_ids.device, window=w)
                   for w in sorted(set(windows))}  # per window: (B, 1, T, S)
        pos = position_ids_from_mask(attention_mask, T)  # (B, T)
        x = self.tok_emb(input_ids)  # (B, T, d_model)
        rope = {}
        if cfg.positions == "rope":
            rope[0] = rope_tables(pos, cfg.head_dim, cfg.rope_theta, x.dtype)  # (B, 1, T, D) each
            local = cfg.rope_local_theta
            rope[1] = rope[0] if local is None else rope_tables(pos, cfg.head_dim, local, x.dtype)  # sliding layers
        else:
            x = x + self.pos_emb(pos)
        present = []
        for i, block in enumerate(self.blocks):
            w = windows[i]
            x, kv = block(x, allowed[w], past_key_values[i] if past_key_values else None, rope.get(int(w > 0)))
            present.append(kv)
        logits = self.lm_head(self.ln_f(x))  # (B, T, vocab)
        if cfg.final_softcap is not None:
            logits = cfg.final_softcap * torch.tanh(logits / cfg.final_softcap)  # (B, T, vocab)
        return logits, tuple(present)
