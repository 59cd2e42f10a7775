"""A half-precision model computed in float32 one module at a time: the float32 reference of a bfloat16 (or float16)
folder without a float32 copy of the model.

A bf16 ``--hf`` folder staged as it is (:func:`mhaexport.models.hf_stream.stage` with ``keep_half``) keeps its
weights bf16 in the staging file: half the bytes staged and mapped, and what a bf16 export writes without a second
conversion. Where eager must compute in float32 — verify's reference, the headroom measured before a half-precision
export — :class:`Float32` runs it: a hook before each module's forward swaps its own half-precision parameters and
buffers for float32 copies (exact: every bf16/f16 value is a float32 value), and one after puts the originals back and
drops the copies, so at most one module's weights exist in float32 at a time. The activations are float32 from the
embedding on, so every operation computes what the model loaded in float32 computes (tests/test_hf_verbs.py holds the
two to the same logits).

The bulk of the weights, the plain ``nn.Linear`` and ``nn.Embedding`` layers, are not upcast whole: a linear layer
computes its output a slice of rows at a time (:func:`linear_in_float32`: each slice upcast, multiplied, dropped; a
slice of at most :data:`SLICE_BYTES` stays in the CPU's cache) and an embedding upcasts the rows it looks up. The
same float32 products are summed, in the order the matrix kernel picks for a slice's size: the output is the whole
upcast's up to float32's rounding (at most 2e-6 of the largest output on Llama-3-8B's shapes, tests/test_upcast.py;
bit for bit where one slice holds the weight). An 8 B model's decode step reads its 16 GB of bfloat16 once instead of
writing and re-reading 32 GB of float32: on Llama-3-8B's 14336 x 4096 projection, 9.5 ms a token instead of 85 ms
(docs/measurements/big-models-2026-12-06.md).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

HALF = (torch.bfloat16, torch.float16)
# the float32 slice of a weight upcast at a time: small enough to stay in a CPU's cache between its upcast and its use
SLICE_BYTES = 4 << 20


def linear_in_float32(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``F.linear(x, weight.float(), bias.float())`` for a float32 ``x`` and a half-precision ``weight``, computed
    :data:`SLICE_BYTES` of float32 weight at a time (output features in slices: each output the same dot product over
    the same float32 values, its sum ordered as the kernel does for the slice's size). Each slice is upcast into one
    buffer the process keeps (:func:`_slice_buffer`), not a new allocation: where large allocations get a mapping of
    their own (verify's mapped mode, runtime/spill.py's ``return_freed_memory``) a new 4 MB slice is a new mapping
    and a thousand page faults — 9x the time of the product on Llama-3-8B's shapes."""
    import torch.nn.functional as F

    out_f, in_f = weight.shape
    rows = max(1, SLICE_BYTES // (4 * in_f))
    b = None if bias is None else bias.to(torch.float32)
    if rows * in_f * 4 > SLICE_BYTES:  # one row is larger than a slice: upcast as it is
        return F.linear(x, weight.to(torch.float32), b)
    with _SLICE_LOCK, torch.no_grad():
        buf = _slice_buffer()
        if rows >= out_f:
            return F.linear(x, buf[:out_f * in_f].view(out_f, in_f).copy_(weight), b)
        out = torch.empty(*x.shape[:-1], out_f, dtype=torch.float32, device=x.device)
        for s in range(0, out_f, rows):
            n = min(rows, out_f - s)
            w32 = buf[:n * in_f].view(n, in_f).copy_(weight[s:s + n])
            out[..., s:s + n] = F.linear(x, w32, None if b is None else b[s:s + n])
        return out


_SLICE_LOCK = threading.Lock()
_SLICE: list[torch.Tensor] = []


def _slice_buffer() -> torch.Tensor:
    """The process's float32 buffer of :data:`SLICE_BYTES` for a slice's upcast (made on first use; its values are
    written before every read, so a slice's product is the same as over a fresh copy, bit for bit). It is made a
    normal tensor even when first used under ``torch.inference_mode`` (an inference tensor cannot be written outside
    that mode, and the buffer outlives it); writes to it are kept out of autograd (the caller's ``no_grad``)."""
    if not _SLICE:
        with torch.inference_mode(False):
            _SLICE.append(torch.empty(SLICE_BYTES // 4, dtype=torch.float32))
    return _SLICE[0]


def _sliced_forward(mod: nn.Module) -> Any:
    """The float32 forward of a plain half-precision ``nn.Linear`` or ``nn.Embedding`` that never upcasts its whole
    weight, or None for any other module (its tensors are swapped whole)."""
    import torch.nn.functional as F

    if not isinstance(mod.weight, torch.Tensor) or mod.weight.dtype not in HALF:
        return None
    if type(mod) is nn.Linear and (mod.bias is None or mod.bias.dtype == mod.weight.dtype):
        return lambda x: linear_in_float32(x.to(torch.float32), mod.weight, mod.bias)
    if type(mod) is nn.Embedding and mod.max_norm is None:  # max_norm rewrites the table: left to the swap
        return lambda ids: F.embedding(ids, mod.weight, mod.padding_idx, None, mod.norm_type,
                                       mod.scale_grad_by_freq, mod.sparse).to(torch.float32)
    return None


def half_dtype(module: nn.Module) -> torch.dtype | None:
    """The half-precision dtype of ``module``'s floating parameters when all of them hold one (else None)."""
    dtypes = {p.dtype for p in module.parameters() if p.is_floating_point()}
    return next(iter(dtypes)) if len(dtypes) == 1 and next(iter(dtypes)) in HALF else None


_NONE = object()


@contextlib.contextmanager
def computed_in_float32(module: nn.Module) -> Iterator[None]:
    """While inside, every forward of ``module`` (and its submodules) computes in float32, each submodule's own
    half-precision parameters and buffers upcast just before it runs and dropped after (a plain linear layer's or
    embedding's a slice at a time: :func:`_sliced_forward`)."""
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
    sliced: list[tuple[nn.Module, Any]] = []  # (module, the instance forward it had, or _NONE)
    for m in owners:
        if (fwd := _sliced_forward(m)) is not None and not m._buffers:
            sliced.append((m, m.__dict__.get("forward", _NONE)))
            m.forward = fwd
    swapped = {id(m) for m, _ in sliced}
    handles = [h for m in owners if id(m) not in swapped
               for h in (m.register_forward_pre_hook(before), m.register_forward_hook(after))]
    try:
        yield
    finally:
        for m, had in sliced:
            if had is _NONE:
                del m.forward
            else:
                m.forward = had
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
