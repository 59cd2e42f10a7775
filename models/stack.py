"""A decoder's stack of layers: the one ``nn.ModuleList`` of ``n_layers`` modules in the model (the built-in decoder's
``blocks``, a transformers model's ``model.layers``). The exporter traces a model cut to its first layers and copies
the last (exporter/replicate.py); verify's block order runs every call of a check through one layer before the next
(runners/blocks.py). Neither knows a model family: both find the layers here.

Block order also needs *where a layer takes its past and gives its present* — the one thing that differs between
the built-in decoder (a block's third argument, its output's second item) and the ``--hf`` adapter (the transformers
``DynamicCache`` a layer is called with). Each model class names its :class:`Handoff` as ``block_handoff``
(``DecoderLM.block_handoff``, ``HFCausalLM.block_handoff``); the runner finds it on the model and calls
:meth:`Handoff.of` (runners import no model: the layering of docs/DESIGN.md).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from torch import nn


@dataclass
class LayerStack:
    """The model's layers: the ``nn.ModuleList`` at ``path`` (its parent's attribute ``attr``)."""

    path: str
    parent: nn.Module
    attr: str
    layers: nn.ModuleList


def find_layers(module: nn.Module, n_layers: int) -> tuple[LayerStack | None, str]:
    """The model's stack of ``n_layers`` layers, or (None, why not): exactly one ``nn.ModuleList`` of that length in
    the module tree, not the model itself."""
    found = [(name, m) for name, m in module.named_modules()
             if isinstance(m, nn.ModuleList) and len(m) == n_layers]
    if len(found) != 1:
        return None, f"{len(found)} lists of {n_layers} modules in the model (one stack of layers expected)"
    path, layers = found[0]
    if not path:
        return None, "the model is its own list of layers"
    parent_path, _, attr = path.rpartition(".")
    parent = module.get_submodule(parent_path) if parent_path else module
    return LayerStack(path, parent, attr, layers), ""


class Handoff:
    """Where a model's layer ``j`` takes a past and gives its present, for a scheduler that runs a call one layer at a
    time (forward hooks on each layer): :meth:`put_past` (a pre-hook's return), :meth:`present` and
    :meth:`replace_present` (a forward hook's), and :meth:`calls` (what the model needs around the calls: the
    ``--hf`` adapter's cache kept as given)."""

    def __init__(self, model: nn.Module, stack: LayerStack) -> None:
        self.model = model
        self.layers = list(stack.layers)

    @classmethod
    def of(cls, model: nn.Module, n_layers: int) -> tuple[Handoff | None, str]:
        """This handoff over ``model``'s stack of ``n_layers`` layers, or (None, why not)."""
        stack, why = find_layers(model, n_layers)
        return (cls(model, stack), "") if stack is not None else (None, why)

    def put_past(self, j: int, args: tuple, kwargs: dict, kv: tuple) -> tuple | None:
        """The layer's (args, kwargs) with ``kv`` as its past (None: set in place)."""
        raise NotImplementedError

    def present(self, j: int, args: tuple, kwargs: dict, out: Any) -> tuple:
        """The (key, value) the layer made."""
        raise NotImplementedError

    def replace_present(self, j: int, args: tuple, kwargs: dict, out: Any, kv: tuple) -> Any:
        """The layer's output with ``kv`` as its present (None: set in place)."""
        raise NotImplementedError

    @contextlib.contextmanager
    def calls(self) -> Iterator[None]:
        yield


class BlockHandoff(Handoff):
    """The built-in decoder: ``DecoderBlock(x, allowed, past, rope) -> (x, (key, value))``."""

    def put_past(self, j: int, args: tuple, kwargs: dict, kv: tuple) -> tuple | None:
        args = list(args)
        args[2] = kv
        return tuple(args), kwargs

    def present(self, j: int, args: tuple, kwargs: dict, out: Any) -> tuple:
        return out[1]

    def replace_present(self, j: int, args: tuple, kwargs: dict, out: Any, kv: tuple) -> Any:
        return out[0], kv


class CacheHandoff(Handoff):
    """A transformers decoder layer called with the ``DynamicCache`` the ``--hf`` adapter builds from the contract's
    past: layer ``j``'s keys and values in ``cache.layers[j]``, set before the layer and read after it. Around the
    calls the adapter builds its cache over the pasts as given (:func:`uncopied_cache`: a placeholder past is never
    concatenated into memory)."""

    def _cache(self, args: tuple, kwargs: dict) -> Any:
        for v in list(kwargs.values()) + list(args):
            if hasattr(v, "layers") and hasattr(v, "get_seq_length"):
                return v
        raise ValueError("the decoder layer was called without its cache")

    def put_past(self, j: int, args: tuple, kwargs: dict, kv: tuple) -> tuple | None:
        layer = self._cache(args, kwargs).layers[j]
        layer.keys, layer.values = kv
        return None

    def present(self, j: int, args: tuple, kwargs: dict, out: Any) -> tuple:
        layer = self._cache(args, kwargs).layers[j]
        return layer.keys, layer.values

    def replace_present(self, j: int, args: tuple, kwargs: dict, out: Any, kv: tuple) -> Any:
        layer = self._cache(args, kwargs).layers[j]
        layer.keys, layer.values = kv
        return None

    @contextlib.contextmanager
    def calls(self) -> Iterator[None]:
        owner = self.model
        before = owner.__dict__.get("_cache_cls")
        owner._cache_cls = uncopied_cache(owner._cache_cls)
        try:
            yield
        finally:
            owner._cache_cls = before


def uncopied_cache(real_cls: type) -> Callable:
    """A maker of ``real_cls`` (transformers' DynamicCache) holding the given (key, value) pairs as they are: what
    ``real_cls(pairs)`` holds, without concatenating each onto an empty tensor first."""
    from transformers.cache_utils import DynamicLayer

    def make(pairs):
        cache = real_cls()
        for k, v in pairs:
            layer = DynamicLayer()
            layer.lazy_initialization(k, v)
            layer.keys, layer.values = k, v
            cache.layers.append(layer)
        return cache
    return make
