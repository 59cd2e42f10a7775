"""How a file is driven: one protocol object per way, made from its :class:`~mhaexport.runtime.feed.Feed`.
Torch-free and onnx-free (numpy, and ONNX Runtime's IOBinding where a buffer is bound).

A :class:`~mhaexport.runtime.feed.Feed` *describes* a file (its names, its cache, its dtype); a protocol *drives*
it: the side a batch of prompts is padded on, how a cache buffer is sized and bound, and how one call of the
decoder contract (any padding, any past) becomes the file's calls. Three ways exist today:

- :class:`Concat` — the contract's own: a concat cache (present = concat(past, new)), left padding, one call per
  contract call (mhaexport's default export, every adopted concat file);
- :class:`SharedBuffer` — one buffer per layer of ``max_cache`` slots, bound as past and present and written in
  place (``--kv-cache shared``, onnxruntime-genai's ``past_present_share_buffer``): every row's tokens packed from
  slot 0, so prompts pad **right**; the deploy loop, bench and onnxruntime-genai drive a shared file so;
- :class:`ContractOverShared` — verify's contract calls (left padding, any past) translated into a shared file's
  calls (:meth:`SharedBuffer.calls`): rows packed, a call with a past split into one call per row
  (GroupQueryAttention takes more than one new token with a past only at batch 1), the outputs scattered back.

The rule "a shared cache pads right" is :func:`~mhaexport.artifact.details.padding_of`, one place (beside the
manifest's cache layout, which a legacy entry fills from it). A windowed cache (a ring of ``window``
slots) is one more subclass: its padding, its buffer sizing and its translation of a contract call.

**Rows at their own positions.** A serving loop keeps each row of a batch at its own length (continuous batching:
rows join and leave; speculative decoding: positions taken back; a prefix's cache forked). Where a row's real
positions sit is the protocol's (:meth:`Protocol.row_mask`, :meth:`Protocol.row_columns`): the concat cache's rows
end at the last column (left padding: a row of length l holds the last l columns, so every row's positions are its
own, ``cumsum(mask) - 1``), a shared buffer's start at slot 0 (right padding: GroupQueryAttention reads a row's
length from its mask's sum). How the cache itself moves — columns copied (concat: its arrays are never written, a
call's present is a new array) or written in place (a shared buffer: a row's slots, bound by address) — is the
runner's (``Runner.cache_columns``, ``cache_row``, ``cache_put_row``, ``cache_fork``), driven by
:class:`~mhaexport.runtime.decode.DecodeLoop`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

# the cache kinds, the padding sides and the one rule that ties them: the manifest's cache layout (artifact/details.py)
from mhaexport.artifact.details import CONCAT, LEFT, RIGHT, SHARED, padding_of  # noqa: F401 (re-exported)


@dataclass
class Call:
    """One call of the file that (part of) a contract call becomes: ``rows`` of the contract batch, their (G, t)
    ``ids`` and (G, p + t) ``mask``; per row, the contract positions of its real past (copied into the buffer's
    first slots) and of its new tokens (where its logits and cache go back to)."""

    rows: list[int]
    ids: np.ndarray  # (G, t) int64
    mask: np.ndarray  # (G, p + t) int64
    past_at: list[np.ndarray] = field(default_factory=list)  # per row: (p_b,) contract positions in [0, P)
    new_at: list[np.ndarray] = field(default_factory=list)  # per row: (t_b,) contract positions in [P, P + T)


class Protocol:
    """The contract's concat cache, left padding: a contract call is one call of the file, as it is."""

    name = "concat cache, left padding"
    padding = LEFT
    # whether the decode loop's cache is one buffer per layer bound as past and present and carried across calls
    # (written in place); else the cache between calls is the contract's (key, value) arrays
    in_place = False

    def __init__(self, feed) -> None:  # a mhaexport.runtime.feed.Feed (which imports this module)
        self.feed = feed

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name})"

    def max_length(self, max_positions: int) -> int:
        """The most positions (past + seq) a decode loop can feed the file in this protocol: the model's
        ``max_positions`` (a shared buffer's slots cap it where the buffers are carried)."""
        return max_positions

    def row_columns(self, width: int, length: int) -> tuple[int, int]:
        """The columns [start, stop) of a cache ``width`` positions wide that hold a row of ``length`` real
        positions: the last ``length`` (left padding)."""
        return width - length, width

    def row_mask(self, lengths: np.ndarray, width: int) -> np.ndarray:
        """The (B, ``width``) attention mask of rows holding ``lengths`` real positions each, laid out as this
        protocol keeps them (:meth:`row_columns`): a continuous batch's rows, each at its own position."""
        mask = np.zeros((len(lengths), width), dtype=np.int64)  # (B, width)
        for b, n in enumerate(np.asarray(lengths).tolist()):
            start, stop = self.row_columns(width, int(n))
            mask[b, start:stop] = 1
        return mask

    def calls(self, ids: np.ndarray, mask: np.ndarray, *, rows_alone: bool = False) -> tuple[list[Call], list[int]]:
        """The file's calls for one contract call of (B, T) ``ids`` and (B, P + T) ``mask``, and the rows none runs
        (all padding in this call). The concat cache: the whole batch in one call."""
        B, T = ids.shape
        P = mask.shape[1] - T
        everything = [np.arange(P)] * B, [np.arange(P, P + T)] * B
        return [Call(list(range(B)), ids, mask, *everything)], []


Concat = Protocol


class SharedBuffer(Protocol):
    """One buffer per layer bound as past and present, written in place; rows packed from slot 0 (right padding)."""

    name = "one shared buffer per layer, right padding"
    padding = padding_of(SHARED)
    in_place = True

    def __init__(self, feed) -> None:
        super().__init__(feed)
        if not feed.shared or not feed.max_cache:
            raise ValueError(f"a shared-buffer protocol needs a shared feed with its slots, not {feed.protocol}")
        self.max_cache = feed.max_cache

    def max_length(self, max_positions: int) -> int:
        return min(max_positions, self.max_cache)

    def slots(self, positions: int | None = None, *, at_least: bool = False) -> int:
        """A buffer's slots for ``positions``: the loop's own need, capped at ``max_cache`` (as onnxruntime-genai
        sizes its buffers by max_length); ``at_least``: never fewer than ``positions`` (a translated contract call
        may need more than the file's default, and the buffer's length is the graph's to take)."""
        if positions is None:
            return self.max_cache
        return max(self.max_cache, positions) if at_least else min(positions, self.max_cache)

    def row_columns(self, width: int, length: int) -> tuple[int, int]:
        """A row's real positions start at slot 0 (right padding): the first ``length`` columns. GroupQueryAttention
        reads only the mask's sum per row (``seqlens_k``) and its width, so any holes after them are never read."""
        return 0, length

    def layer_slots(self, slots: int) -> list[int]:
        """Per layer, the slots of the decode loop's buffer of ``slots``: a window cache's sliding-window layer holds
        its ``window_slots`` whatever the loop's length (GroupQueryAttention's ``sliding_window_cache=1`` evicts in
        place, the most recent positions kept from row 0, and refuses a buffer shorter than its window: "KV cache
        capacity (48) must be at least local_window_size (64)"), every other layer ``slots``."""
        windows = self.feed.window_slots or (0,) * self.feed.n_layers
        return [w if w else slots for w in windows]

    def bind(self, io, buffers) -> None:
        """Bind each layer's buffer as its past and its present (the same OrtValue: written in place)."""
        self.bind_past(io, buffers)
        for present, buf in zip(self.feed.present, buffers):
            io.bind_ortvalue_output(present, buf)

    def bind_past(self, io, buffers) -> None:
        """Bind each layer's buffer as its past. ONNX Runtime copies an input bound on another device than the
        node that reads it *when it is bound* (``IOBinding::BindInput``), so a binding reused across calls then
        feeds that copy, not what the last call wrote: such buffers are bound again before each call."""
        for past, buf in zip(self.feed.past, buffers):
            io.bind_ortvalue_input(past, buf)

    def calls(self, ids: np.ndarray, mask: np.ndarray, *, rows_alone: bool = False) -> tuple[list[Call], list[int]]:
        """A contract call in the file's protocol: a prompt (no past) is one call of every row that has real tokens,
        each row's tokens packed to the left; with a past (or ``rows_alone``: bisect, which compares rows one by one)
        one call per row, its real past in the buffer's first slots and its real new tokens after them."""
        B, T = ids.shape
        P = mask.shape[1] - T
        live = [b for b in range(B) if mask[b, P:].any()]
        idle = [b for b in range(B) if b not in live]
        if P == 0 and not rows_alone and live:
            real = [np.flatnonzero(mask[b]) for b in live]
            width = max(len(r) for r in real)
            g_ids = np.zeros((len(live), width), np.int64)  # (G, t): right-padded
            g_mask = np.zeros((len(live), width), np.int64)
            for j, (b, r) in enumerate(zip(live, real)):
                g_ids[j, :len(r)] = ids[b, r]
                g_mask[j, :len(r)] = 1
            return [Call(live, g_ids, g_mask, [np.arange(0)] * len(live), real)], idle
        calls = []
        for b in live:
            real_past, real_new = np.flatnonzero(mask[b, :P]), P + np.flatnonzero(mask[b, P:])
            calls.append(Call([b], np.ascontiguousarray(ids[b, real_new - P][None], dtype=np.int64),  # (1, t)
                              np.ones((1, len(real_past) + len(real_new)), np.int64), [real_past], [real_new]))
        return calls, idle


class ContractOverShared(SharedBuffer):
    """verify's contract calls on a shared file: the contract's left padding and any past, each call translated
    into the file's (:meth:`SharedBuffer.calls`) with fresh buffers, the outputs scattered back."""

    name = "the contract's calls, translated into one shared buffer per layer"
    padding = LEFT
    in_place = False  # fresh buffers per call, sized to it: the cache between calls is the contract's arrays

    def max_length(self, max_positions: int) -> int:
        return max_positions  # each call's buffers are sized to it (SharedBuffer.slots(at_least=True))


def protocol_of(feed, *, contract_calls: bool = False) -> Protocol:
    """The protocol that drives a file as ``feed`` describes it: its own (:class:`Concat`, :class:`SharedBuffer`),
    or with ``contract_calls`` verify's contract calls translated into it (:class:`ContractOverShared` for a shared
    file; a concat file takes them as they are)."""
    if not feed.shared:
        return Concat(feed)
    return ContractOverShared(feed) if contract_calls else SharedBuffer(feed)
