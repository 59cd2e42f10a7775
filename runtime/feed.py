"""How an ONNX file is fed, in one typed description: :class:`Feed`. Torch-free and onnx-free.

A feed says under which names the file takes the contract's inputs and gives its outputs (the contract's own, or an
adopted file's: ``input_ids``, ``attention_mask``, ``position_ids`` fed from the mask, ``logits``, 2L past and
present names), how its KV cache is held (a ``concat`` cache, or one ``shared`` buffer per layer of ``max_cache``
slots written in place), which side a batch of prompts is padded on, the cache's dtype, and the sizes a static
export fixes. It is derived once from the manifest entry (:meth:`Feed.of`), where each of those facts is stored
once: the names in ``details.layout`` (adopted files only), the cache and padding in the entry's ``kv_cache`` /
``max_cache`` / ``padding``, the dtypes in ``io``, the static sizes in ``static_sizes``.

Every consumer of an ONNX file takes its feed from here: the deploy runtime's runners (:mod:`mhaexport.runtime.ort`,
chosen by :func:`mhaexport.runtime.choose.ort_runner_for` for the Generator, verify, eval and bench), bench's bare
loop, bisect and lint.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from mhaexport.core import iospec
from mhaexport.artifact import ArtifactEntry
from mhaexport.artifact.details import OnnxDetails
from mhaexport.core.errors import ArtifactError
from mhaexport.runtime.protocol import CONCAT, LEFT, RIGHT, SHARED, padding_of  # noqa: F401 (re-exported)


@dataclass(frozen=True)
class Feed:
    """How one ONNX file is fed (see the module's docstring). ``producer``: None for mhaexport's own export, else
    the producer of an adopted file ("onnxruntime-genai", "optimum", "torch.onnx", "mhaexport")."""

    input_ids: str
    attention_mask: str
    logits: str
    past: tuple[str, ...]  # 2L input names, contract order: layer 0 key, layer 0 value, layer 1 key, ...
    present: tuple[str, ...]  # 2L output names, same order
    position_ids: str | None = None  # an input fed cumsum(mask) - 1 over the new tokens
    cache: str = CONCAT  # "concat" | "shared" (one buffer per layer, bound as past and present, written in place)
    max_cache: int | None = None  # shared: each buffer's slots (the capacity)
    padding: str = LEFT  # "left" (the contract's) | "right" (rows packed from slot 0: a shared cache's protocol)
    cache_dtype: str = "float32"  # the cache's dtype as the file takes it
    fixed: tuple[int, int] | None = None  # a static export's (sequence_length, past_sequence_length)
    producer: str | None = None
    # a window cache (``--kv-cache window``): per layer, the slots a decode loop's buffer needs at most (W + slack on a
    # sliding-window layer, whose GroupQueryAttention evicts in place), 0 for a full layer; None: every buffer full
    window_slots: tuple[int, ...] | None = None

    @classmethod
    def contract(cls, n_layers: int, *, cache: str = CONCAT, max_cache: int | None = None,
                 cache_dtype: str = "float32", fixed: tuple[int, int] | None = None) -> Feed:
        """The contract's own names for a decoder of ``n_layers`` layers; a shared cache pads right."""
        return cls(iospec.INPUT_IDS, iospec.ATTENTION_MASK, iospec.LOGITS,
                   tuple(n for i in range(n_layers) for n in iospec.past_names(i)),
                   tuple(n for i in range(n_layers) for n in iospec.present_names(i)),
                   cache=cache, max_cache=max_cache if cache == SHARED else None,
                   padding=padding_of(cache), cache_dtype=cache_dtype, fixed=fixed)

    @classmethod
    def of(cls, entry: ArtifactEntry, contract=None) -> Feed:
        """The feed of the ONNX file a manifest entry describes: an adopted file's recorded layout names its own I/O,
        mhaexport's export takes the contract's names for ``contract``'s layers (without it: the layers its I/O
        schema lists)."""
        details = entry.details
        layout = details.layout if isinstance(details, OnnxDetails) else None
        cache = details.cache
        kind = SHARED if cache.shared else CONCAT
        if layout is None:
            n_layers = contract.n_layers if contract is not None else _layers_in(entry.io)
            feed = cls.contract(n_layers, cache=kind, max_cache=cache.max_cache)
        else:
            feed = cls(layout.input_ids, layout.attention_mask, layout.logits, tuple(layout.past),
                       tuple(layout.present), layout.position_ids, kind, cache.max_cache if cache.shared else None,
                       producer=details.producer or layout.producer)
        padding = cache.padding or padding_of(kind)
        dtype = entry.dtype
        if feed.past:
            try:
                dtype = entry.input_dtype(feed.past[0])
            except ArtifactError:  # an I/O schema that does not list it: the artifact's dtype
                pass
        window_slots = tuple(cache.window_slots) if cache.kind == "window" and cache.window_slots else None
        return dataclasses.replace(feed, padding=padding, cache_dtype=dtype, fixed=entry.fixed_sizes,
                                   window_slots=window_slots)

    # ---- what it says ------------------------------------------------------------------------------------------
    @property
    def shared(self) -> bool:
        """One preallocated buffer per layer, bound as past and present (GroupQueryAttention writes it in place)."""
        return self.cache == SHARED

    @property
    def adopted(self) -> bool:
        """A file another tool exported (or mhaexport's, adopted as a file), fed under its recorded layout."""
        return self.producer is not None

    @property
    def scoped(self) -> bool:
        """Whether the graph is mhaexport's own export (its nodes carry the module scopes bisect reads)."""
        return self.producer in (None, "mhaexport")

    @property
    def n_layers(self) -> int:
        return len(self.past) // 2

    @property
    def protocol(self) -> str:
        """The protocol in words (reports): "concat cache, left padding", "one shared buffer per layer, right
        padding"."""
        cache = ("one shared buffer per layer" + (", window-sized on sliding-window layers" if self.window_slots else "")
                 if self.shared else "concat cache")
        return f"{cache}, {self.padding} padding"

    def protocol_object(self, *, contract_calls: bool = False):
        """The object that drives the file as this feed describes it (:func:`mhaexport.runtime.protocol.protocol_of`)."""
        from mhaexport.runtime.protocol import protocol_of

        return protocol_of(self, contract_calls=contract_calls)

    def plain(self) -> Feed:
        """The same names in the plain protocol: a concat cache, left padding (verify drives an adopted file in it
        too when its producer's differs: findings)."""
        return dataclasses.replace(self, cache=CONCAT, max_cache=None, padding=LEFT)

    def file_names(self) -> dict[str, str]:
        """{the contract's name: the file's} for the token inputs, the cache and the outputs."""
        n = self.n_layers
        contract_past = [x for i in range(n) for x in iospec.past_names(i)]
        contract_present = [x for i in range(n) for x in iospec.present_names(i)]
        return {iospec.INPUT_IDS: self.input_ids, iospec.ATTENTION_MASK: self.attention_mask,
                iospec.LOGITS: self.logits, **dict(zip(contract_past, self.past)),
                **dict(zip(contract_present, self.present))}

    # ---- feeding -----------------------------------------------------------------------------------------------
    def token_inputs(self, ids: np.ndarray, mask: np.ndarray) -> dict[str, np.ndarray]:
        """The file's token inputs for (B, T) ``ids`` and (B, S) ``mask``: ids, mask and, where the file takes them,
        positions (cumsum(mask) - 1 over the new tokens, as the contract's models compute them)."""
        feed = {self.input_ids: ids, self.attention_mask: mask}
        if self.position_ids is not None:
            pos = np.maximum(np.cumsum(mask, axis=-1) - 1, 0)[:, -ids.shape[1]:]  # (B, T)
            feed[self.position_ids] = np.ascontiguousarray(pos, dtype=np.int64)
        return feed


def _layers_in(io: dict) -> int:
    """How many layers' past an I/O schema lists under the contract's names."""
    names = set((io or {}).get("inputs") or {})
    n = 0
    while set(iospec.past_names(n)) <= names:
        n += 1
    return n
