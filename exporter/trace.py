"""torch.onnx's trace of a model, made once per process for each (dtype, opset, axes) and reused by every later
ONNX export of the same model: another ``--attention`` lowering, another ``--kv-cache`` layout (bench's variants,
``mhaexport all``'s targets, a test's matrix of paths). The trace is most of an export's time (torch.export and
its decompositions: ~90 % of a tiny export); what a lowering or a cache layout does to the graph runs on a clone of
the traced graph, so every path's own code runs as it would alone.

Kept for a model of at most :data:`MAX_CACHED_BYTES`, and only while the model is what it was: its module structure
and each tensor's storage and version counter (bumped by every in-place change: an optimizer step,
``load_state_dict``) are part of the key. The cache holds what the trace needs (the module converted to the
export's dtype — for float16 a copy, or a streamed model's restaged weights file — kept beside the trace) and dies
with the model (a weak reference). Torch-dependent; the exporter's own.
"""

from __future__ import annotations

import copy
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import onnx_ir as ir
from torch import nn

# a model larger than this is traced anew for each export: its trace and converted copy would hold its weights
MAX_CACHED_BYTES = 256 << 20


@dataclass
class _Trace:
    state: tuple  # the model's structure and parameter versions when traced
    held: Any  # what the trace needs kept (the module traced, the staging file its parameters map)
    model: ir.Model  # the traced graph as torch.onnx returned it, never lowered (exports take clones)
    warnings: list[str]  # what torch.onnx warned while tracing (every export of the trace reports them)


_TRACES: weakref.WeakKeyDictionary[nn.Module, dict[tuple, _Trace]] = weakref.WeakKeyDictionary()


def _state(source: nn.Module) -> tuple:
    """What must not have changed for a trace of ``source`` to stand: every tensor's name, shape, dtype and in-place
    version, and the module tree's printout (its kinds and sizes)."""
    tensors = tuple((n, tuple(t.shape), str(t.dtype), t._version, t.data_ptr())
                    for n, t in list(source.named_parameters()) + list(source.named_buffers()))
    return tensors, repr(source)


def _nbytes(source: nn.Module) -> int:
    return sum(t.numel() * t.element_size() for t in list(source.parameters()) + list(source.buffers()))


def _clone(model: ir.Model) -> ir.Model:
    """A clone of ``model`` that names new nodes and values as the original would: onnx_ir's clone starts a fresh
    name authority, so a rewrite on the clone would number its nodes from 0 where one on the original continues
    torch.onnx's numbering — another file's bytes (tests/test_export_paths.py holds them equal)."""
    out = model.clone()
    authority = copy.deepcopy(model.graph._name_authority)  # its counters and the names it has handed out
    out.graph._name_authority = authority
    return out


def traced(source: nn.Module, key: tuple, build: Callable[[], tuple[Any, ir.Model]], warnings: list[str],
           *, cacheable: bool = True) -> tuple[Any, ir.Model]:
    """(what ``build`` holds, a graph to lower and write) for ``source`` under ``key`` (dtype, opset, axes, the
    example sizes): a clone of this process's earlier trace when there is one for the model as it is now, else
    ``build()`` — which converts ``source`` and calls torch.onnx, returning (what the trace needs kept alive, the
    graph) — kept for the next export. ``warnings``: the caller's list of export warnings (a reused trace appends
    what its tracing warned). ``cacheable`` False: always built, never kept."""
    cacheable = cacheable and _nbytes(source) <= MAX_CACHED_BYTES
    state = _state(source) if cacheable else None
    kept = _TRACES.get(source, {}).get(key) if cacheable else None
    if kept is not None and kept.state == state:
        warnings.extend(w for w in kept.warnings if w not in warnings)
        return kept.held, _clone(kept.model)
    before = len(warnings)
    held, model = build()
    if cacheable:
        _TRACES.setdefault(source, {})[key] = _Trace(state, held, _clone(model), list(warnings[before:]))
    return held, model


def forget(source: nn.Module | None = None) -> None:
    """Drop the traces kept for ``source`` (None: every model's)."""
    if source is None:
        _TRACES.clear()
    else:
        _TRACES.pop(source, None)
