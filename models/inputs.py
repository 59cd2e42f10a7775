"""Seeded contract inputs as torch tensors: :func:`mhaexport.core.iospec.dummy_inputs` (the one builder), converted."""

from __future__ import annotations

import torch

from mhaexport.core import dtypes
from mhaexport.core.iospec import ModelContract, dummy_inputs

KVCache = tuple[tuple[torch.Tensor, torch.Tensor], ...]


def torch_dtype(name: str) -> torch.dtype:
    """torch's dtype for one of :data:`mhaexport.core.dtypes.NAMES` (torch spells them the same)."""
    return getattr(torch, dtypes.get(name).name)


def make_inputs(contract: ModelContract, batch: int, seq: int, past: int, *, seed: int = 0,
                pad: list[int] | None = None,
                dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor, KVCache]:
    """(input_ids, attention_mask, past_key_values) as torch tensors, the cache in ``dtype``."""
    ids, mask, cache = dummy_inputs(contract, batch, seq, past, seed=seed, pad=pad)
    return (torch.from_numpy(ids), torch.from_numpy(mask),
            tuple((torch.from_numpy(k).to(dtype), torch.from_numpy(v).to(dtype)) for k, v in cache))
