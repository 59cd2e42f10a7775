"""A half-precision model computed in float32 one module at a time: the float32 reference of a bfloat16 (or float16)
folder without a float32 copy of the model.

A bf16 ``--hf`` folder staged as it is (:func:`mhaexport.models.hf_stream.stage` with ``keep_half``) keeps its
weights bf16 in the staging file: half the bytes staged and mapped, and what a bf16 export writes without a second
conversion. Where eager must compute in float32 — verify's reference, the headroom measured before a half-precision
export — :class:`Float32` runs it: a hook before each module's forward swaps its own half-precision parameters and
buffers for float32 copies (exact: every bf16/f16 value is a float32 value), and one after puts the originals back and
drops the copies, so at most one module's weights exist in float32 at a time. The activations are float32 from the
embedding on, so every operation computes what the model loaded in float32 computes (tests/test_hf_half.py holds the
two to the same logits).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

HALF = (torch.bfloat16, torch.float16)


def half_dtype(module: nn.Module) -> torch.dtype | None:
    """The half-precision dtype of ``module``'s floating parameters when all of them hold one (else None)."""
    dtypes = {p.dtype for p in module.parameters() if p.is_floating_point()}
    return next(iter(dtypes)) if len(dtypes) == 1 and next(iter(dtypes)) in HALF else None


@contextlib.contextmanager
def computed_in_float32(module: nn.Module) -> Iterator[None]:
    """While inside, every forward of ``module`` (and its submodules) computes in float32, each submodule's own
    half-precision parameters and buffers upcast just before it runs and dropped after."""
    saved: dict[int, list[tuple[dict, str, Any]]] = {}

    def before(mod: nn.Module, _args) -> None:
        swaps = []
        for store in (mod._parameters, mod._buffers):
            for name, t in store.items():
                if t is not None and t.dtype in HALF:
                    up = t.detach().to(torch.float32)
                    swaps.append((store, name, t))
                    store[name] = nn.Parameter(up, requires_grad=False) if isinstance(t, nn.Parameter) else up
        if swaps:
            saved.setdefault(id(mod), []).append(swaps)

    def after(mod: nn.Module, _args, _out) -> None:
        stack = saved.get(id(mod))
        if stack:
            for store, name, t in stack.pop():
                store[name] = t

    owners = [m for m in module.modules() if any(t is not None and t.dtype in HALF
                                                 for t in (*m._parameters.values(), *m._buffers.values()))]
    handles = [h for m in owners for h in (m.register_forward_pre_hook(before), m.register_forward_hook(after))]
    try:
        yield
    finally:
        for h in handles:
            h.remove()
        for stack in saved.values():  # a forward that raised: the originals back
            while stack:
                for store, name, t in stack.pop():
                    store[name] = t


class Float32(nn.Module):
    """``inner`` (a half-precision model under the decoder contract) called in float32 (:func:`computed_in_float32`):
    what verify's eager runner runs as the float32 reference. ``config`` is the inner model's."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    @property
    def config(self) -> Any:
        return self.inner.config

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        with computed_in_float32(self.inner):
            return self.inner(*args, **kwargs)
