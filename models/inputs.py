"""Seeded, reproducible inputs in the contract's layout (shared by the exporter, verify and tests)."""

from __future__ import annotations

import torch

from mhaexport.iospec import ModelContract

KVCache = tuple[tuple[torch.Tensor, torch.Tensor], ...]


def left_pad_mask(batch: int, total: int, pad: list[int] | None) -> torch.Tensor:
    """int64 (batch, total) attention mask; row b has pad[b] leading zeros (left padding)."""
    mask = torch.ones(batch, total, dtype=torch.int64)
    for b, p in enumerate(pad or []):
        mask[b, :p] = 0
    return mask


def make_inputs(contract: ModelContract, batch: int, seq: int, past: int, *, seed: int = 0,
                pad: list[int] | None = None,
                dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor, KVCache]:
    """(input_ids, attention_mask, past_key_values) with random ids and a random past cache of length ``past``."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, contract.vocab_size, (batch, seq), generator=gen, dtype=torch.int64)  # (B, T)
    mask = left_pad_mask(batch, past + seq, pad)  # (B, past + T)
    shape = (batch, contract.n_heads, past, contract.head_dim)  # (B, H, past, D)
    cache = tuple(
        (torch.randn(shape, generator=gen).to(dtype), torch.randn(shape, generator=gen).to(dtype))
        for _ in range(contract.n_layers)
    )
    return ids, mask, cache
