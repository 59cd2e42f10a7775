"""Helpers the tests share for running a decoder in eager PyTorch."""

from __future__ import annotations

import torch


def eager_greedy(module: torch.nn.Module, prompt: list[int], max_length: int, eos: int) -> list[int]:
    """Greedy decoding with the contract's KV cache in eager PyTorch, up to max_length tokens or eos (prompt
    included in the returned list)."""
    out = list(prompt)
    with torch.no_grad():
        ids = torch.tensor([prompt])  # (1, T)
        logits, past = module(ids, torch.ones_like(ids), None)
        while len(out) < max_length:
            t = int(logits[0, -1].argmax())
            out.append(t)
            if t == eos:
                break
            logits, past = module(torch.tensor([[t]]), torch.ones(1, len(out), dtype=torch.int64), past)
    return out
