"""The one runner protocol every runtime follows (Polygraphy's shape), torch-free.

A :class:`Runner` is activated once (``activate_impl``: load the artifact, create the session), then run on the
decoder contract's inputs as numpy, then deactivated. The base class owns what every runtime shares: the input
checks against the contract, timing, and the two ways a runtime can be unavailable —

- **skipped** (``skip_reason``): the runtime cannot run here at all (CUDA requested but not in use, no artifact);
  never counted as passed;
- **failed** (:class:`~mhaexport.core.errors.RuntimeFailure`): it was there but raised while loading or running (a
  truncated model, a kernel missing for a dtype, the user model's own exception).

Each runtime writes only ``activate_impl``, ``run_impl`` and, where its cache should stay in its own form between
decode steps (an OrtValue on the device, a torch tensor), ``empty_cache``/``step_impl``/``cache_numpy``. The decode
loop (:mod:`mhaexport.runtime.decode`) drives ``step``; checks and the sweep drive ``run``.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from mhaexport.core import dtypes
from mhaexport.core.errors import MhaExportError, ProviderUnavailable, RuntimeFailure, RuntimeInputError, first_line
from mhaexport.core.iospec import Contract

KVPairs = tuple[tuple[np.ndarray, np.ndarray], ...]


# ---- the contract's cache moved by numpy (one implementation: the runners' cache_* methods and a plan's derived
# pasts, runners/calls.py, both call these) --------------------------------------------------------------------
def pairs_columns(pairs: KVPairs, start: int, stop: int) -> KVPairs:
    """Positions [start, stop) of every row of every layer's (B, H, S, D) pair."""
    return tuple((np.ascontiguousarray(k[:, :, start:stop]), np.ascontiguousarray(v[:, :, start:stop]))
                 for k, v in pairs)


def pairs_row(pairs: KVPairs, row: int, start: int, stop: int) -> KVPairs:
    """Row ``row``'s positions [start, stop) as a batch of one."""
    return tuple((np.ascontiguousarray(k[row:row + 1, :, start:stop]),
                  np.ascontiguousarray(v[row:row + 1, :, start:stop])) for k, v in pairs)


def pairs_put_row(pairs: KVPairs, row: int, values: KVPairs) -> KVPairs:
    """``pairs`` with row ``row`` replaced by ``values`` (a batch of one), right-aligned as left padding keeps rows:
    the batch widened to the longer of the two, the other rows' new first columns zeros (masked)."""
    out = []
    for (k, v), (rk, rv) in zip(pairs, values):
        pair = []
        for t, r in ((k, rk), (v, rv)):
            B, H, S, D = t.shape
            W = max(S, r.shape[2])
            grown = np.zeros((B, H, W, D), dtype=t.dtype)  # (B, H, W, D)
            grown[:, :, W - S:] = t
            grown[row] = 0
            grown[row, :, W - r.shape[2]:] = r[0]
            pair.append(grown)
        out.append(tuple(pair))
    return tuple(out)
Outputs = tuple[np.ndarray, KVPairs]  # (logits (B, T, V), present: n_layers x (key, value) (B, H, S, D))
Cache = Any  # a runner's own form of the KV cache between decode steps


class Runner:
    """Base runner: activate / run / step / deactivate with contract checks and timing in one place.

    ``contract``: the decoder's, which :meth:`check_inputs` checks; a runner of the attention block on its own
    (verify's ``ModuleRunner``) overrides that hook for its own contract and inputs. ``dtype``: the artifact's float dtype (the KV cache it takes). ``fixed``: for a static export, the only
    (sequence_length, past_sequence_length) it accepts.
    """

    def __init__(self, name: str, contract: Contract, *, dtype: str = "float32",
                 fixed: tuple[int, int] | None = None, skip_reason: str | None = None) -> None:
        self.name = name
        self.contract = contract
        self.dtype = dtype
        self.fixed = fixed
        self.skip_reason = skip_reason
        self.providers: list[str] = []  # what the runtime really runs on, as it reports it
        self.times: list[float] = []  # seconds per run/step call
        self.is_active = False

    @property
    def max_length(self) -> int:
        """The most positions (past + seq) a decode loop can feed this runner: the model's max_positions here; a
        shared cache's buffer may hold fewer."""
        return self.contract.max_positions

    def limit_text(self) -> str:
        """The length limit as messages name it: "max_positions=N" (a shared cache's runner names its slots)."""
        return f"max_positions={self.max_length}"

    # ---- lifecycle ------------------------------------------------------------------------------------------
    @property
    def available(self) -> bool:
        return self.skip_reason is None

    def activate(self) -> Runner:
        """Load the artifact. A runtime that cannot run here becomes skipped (``skip_reason``); one that is here but
        cannot load the artifact raises RuntimeFailure."""
        if self.skip_reason is not None or self.is_active:
            return self
        try:
            self.activate_impl()
        except ProviderUnavailable as e:
            self.skip_reason = str(e)
            return self
        except RuntimeFailure:
            raise
        except MhaExportError:
            raise
        except Exception as e:  # the runtime's own exception types (ONNX Runtime, torch.jit, user code)
            raise RuntimeFailure(f"{self.name} cannot load its artifact: {first_line(e)}") from e
        self.is_active = True
        return self

    def deactivate(self) -> None:
        if self.is_active:
            self.deactivate_impl()
        self.is_active = False

    def __enter__(self) -> Runner:
        return self.activate()

    def __exit__(self, *exc) -> None:
        self.deactivate()

    def _require_active(self) -> None:
        if self.skip_reason is not None:
            raise RuntimeInputError(f"{self.name} is skipped: {self.skip_reason}")
        if not self.is_active:
            self.activate()
            if self.skip_reason is not None:
                raise RuntimeInputError(f"{self.name} is skipped: {self.skip_reason}")

    # ---- inputs ---------------------------------------------------------------------------------------------
    def accepts(self, seq: int, past: int) -> bool:
        """Whether this artifact can run at (seq, past): always for dynamic exports, only its sizes for static."""
        return self.fixed is None or self.fixed == (seq, past)

    def check_ids_mask(self, input_ids: Any, attention_mask: Any, past_len: int | None = None
                       ) -> tuple[np.ndarray, np.ndarray]:
        """(B, T) int64 ids inside the vocabulary and a (B, past + T) int64 mask within max_positions."""
        c = self.contract
        ids, mask = to_numpy(input_ids), to_numpy(attention_mask)
        if ids.ndim != 2 or ids.shape[0] == 0 or ids.shape[1] == 0:
            raise RuntimeInputError(f"input_ids must be a non-empty (batch, seq) array, got shape {tuple(ids.shape)}")
        if not np.issubdtype(ids.dtype, np.integer):
            raise RuntimeInputError(f"input_ids must hold integers, got {ids.dtype}")
        bad = ids[(ids < 0) | (ids >= c.vocab_size)]
        if bad.size:
            raise RuntimeInputError(f"token id {int(bad[0])} is outside the vocabulary [0, {c.vocab_size})")
        B, T = ids.shape
        want = None if past_len is None else past_len + T
        if mask.ndim != 2 or mask.shape[0] != B or mask.shape[1] < T or (want is not None and mask.shape[1] != want):
            shape = f"(batch={B}, past + seq={want})" if want is not None else f"(batch={B}, past + seq >= {T})"
            raise RuntimeInputError(f"attention_mask must be {shape} [batch, past + seq], got shape "
                                    f"{list(mask.shape)}")
        if mask.shape[1] > c.max_positions:
            raise RuntimeInputError(f"past + seq = {mask.shape[1]} exceeds the model's max_positions="
                                    f"{c.max_positions}")
        return np.ascontiguousarray(ids, dtype=np.int64), np.ascontiguousarray(mask, dtype=np.int64)

    def check_past(self, past: Any, batch: int, past_len: int) -> KVPairs:
        """n_layers (key, value) pairs (or 2 * n_layers arrays) of (B, H, past, D) in the artifact's dtype."""
        c = self.contract
        want = (batch, c.n_kv_heads, past_len, c.head_dim)
        np_dtype = dtypes.numpy_dtype(self.dtype)
        if past is None or (len(past) == 0 and c.n_layers > 0):
            if past_len != 0:
                raise RuntimeInputError(f"attention_mask covers {past_len} past positions but no past_key_values "
                                        "were given")
            empty = np.zeros(want, dtype=np_dtype)
            return tuple((empty, empty) for _ in range(c.n_layers))
        items = list(past)
        flat = [t for pair in items for t in pair] if items and isinstance(items[0], (tuple, list)) else items
        if len(flat) != 2 * c.n_layers:
            raise RuntimeInputError(f"past_key_values must hold {c.n_layers} (key, value) pairs "
                                    f"({2 * c.n_layers} arrays), got {len(flat)} arrays")
        out = []
        for i, t in enumerate(flat):
            t = to_numpy(t)
            if tuple(t.shape) != want:
                kind = "key" if i % 2 == 0 else "value"
                raise RuntimeInputError(f"past_key_values.{i // 2}.{kind} has shape {tuple(t.shape)}, expected "
                                        f"{want} [batch, n_kv_heads, past, head_dim] with past = attention_mask width "
                                        "- seq")
            out.append(np.ascontiguousarray(t, dtype=np_dtype))
        return tuple((out[2 * i], out[2 * i + 1]) for i in range(c.n_layers))

    def check_inputs(self, input_ids: Any, attention_mask: Any, past_key_values: Any = None
                     ) -> tuple[np.ndarray, np.ndarray, KVPairs]:
        """The hook :meth:`run` checks its inputs with: the decoder contract's here (a runner of another contract,
        e.g. verify's attention-block runners, overrides it and :meth:`describe_inputs`). Returns the inputs as
        ``run_impl`` takes them, or raises RuntimeInputError."""
        ids = to_numpy(input_ids)
        P = _past_len(past_key_values)
        ids, mask = self.check_ids_mask(ids, attention_mask, P)
        past = self.check_past(past_key_values, ids.shape[0], P)
        if not self.accepts(ids.shape[1], P):
            raise RuntimeInputError(f"{self.name} is a static export for seq={self.fixed[0]} past={self.fixed[1]}, "
                                    f"got seq={ids.shape[1]} past={P}")
        return ids, mask, past

    # ---- running --------------------------------------------------------------------------------------------
    def describe_inputs(self, checked: tuple) -> str:
        """Checked inputs as a failure message names them: "batch=2 seq=3 past=5"."""
        ids, mask = checked[0], checked[1]
        return f"batch={ids.shape[0]} seq={ids.shape[1]} past={mask.shape[1] - ids.shape[1]}"

    def run(self, *inputs: Any) -> Any:
        """One checked call on the contract's inputs — (input_ids, attention_mask, past_key_values=None) for the
        decoder — returning its outputs as numpy on the host: (logits, present) for the decoder."""
        self._require_active()
        checked = self.check_inputs(*inputs)
        return self._timed(self.run_impl, *checked, inputs=checked)

    def stepper(self, cache: Cache, attention_mask: np.ndarray, steps: int, capacity: int | None = None) -> Any:
        """The decode loop's steps after a state (``cache`` and its (B, S) ``attention_mask``; ``capacity``: the most
        positions the cache was made for) with the least work between two runs, for up to ``steps`` steps: an
        object with ``step(tokens) -> (B, V) logits`` (valid until the next step) and ``finish() -> (cache, mask)``;
        None (the default) where the loop steps through :meth:`step`. Same calls, same results: only what the host
        does between them differs."""
        return None

    def empty_cache(self, batch: int, positions: int | None = None) -> Cache:
        """An empty cache (past length 0) in this runner's own form. ``positions``: the most positions it will hold
        (a hint: a runner with preallocated buffers sizes them to it; None: the most the runner takes)."""
        return self.check_past(None, batch, 0)

    def step(self, input_ids: np.ndarray, attention_mask: np.ndarray, cache: Cache) -> tuple[np.ndarray, Cache]:
        """One decode-loop call: (B, T) ids, the (B, past + T) mask, the cache in this runner's form ->
        ((B, T, V) logits on the host, the grown cache). Unchecked beyond what the loop guarantees; timed."""
        self._require_active()
        return self._timed(self.step_impl, input_ids, attention_mask, cache, inputs=(input_ids, attention_mask))

    def _timed(self, impl, *args: Any, inputs: tuple):
        """Call ``impl(*args)``, timed into ``times``; what the runtime raises becomes RuntimeFailure naming the
        call by its shapes (:meth:`describe_inputs` of ``inputs``, formatted only then); our own errors pass
        through."""
        t0 = time.perf_counter()
        try:
            out = impl(*args)
        except MhaExportError:
            raise
        except Exception as e:
            raise RuntimeFailure(f"{self.name} failed at {self.describe_inputs(inputs)}: {first_line(e)}") from e
        self.times.append(time.perf_counter() - t0)
        return out

    def cache_numpy(self, cache: Cache) -> KVPairs:
        """The cache as the contract's numpy (key, value) pairs (for comparisons)."""
        return cache

    def cache_from_numpy(self, past: KVPairs) -> Cache:
        """The contract's numpy (key, value) pairs in this runner's own cache form."""
        return past

    # ---- a cache's rows and positions (continuous batching, speculative decoding, prefix reuse) ---------------
    # The contract's cache (concat: a call's present is a new array, the past is never written) moves by copying
    # columns through numpy; a runner whose cache is written in place (a shared buffer) overrides these.
    def cache_columns(self, cache: Cache, start: int, stop: int) -> Cache:
        """The cache's positions [start, stop) of every row (a rewind keeps [0, keep); a batch whose longest row got
        shorter drops its first columns)."""
        return self.cache_from_numpy(pairs_columns(self.cache_numpy(cache), start, stop))

    def cache_row(self, cache: Cache, row: int, start: int, stop: int) -> Cache:
        """Row ``row``'s positions [start, stop) as a batch of one, fed as that row's past (a request joining a
        running batch, fed after what its row holds)."""
        return self.cache_from_numpy(pairs_row(self.cache_numpy(cache), row, start, stop))

    def cache_put_row(self, cache: Cache, row: int, values: Cache) -> Cache:
        """The cache with row ``row`` replaced by ``values`` (a batch of one, as :meth:`cache_row` gave and a call
        grew), right-aligned as left padding keeps rows: the batch widened to the longer of the two, the other rows'
        new first columns zeros (masked)."""
        return self.cache_from_numpy(pairs_put_row(self.cache_numpy(cache), row, self.cache_numpy(values)))

    def cache_fork(self, cache: Cache) -> Cache:
        """A cache that can grow apart from ``cache`` (a prefix's cache reused by several requests): the same arrays
        here — the contract's past is never written (each call's present is a new array)."""
        return cache

    def cache_checkpoint(self, cache: Cache, length: int, adding: int) -> Any:
        """What a rewind after feeding ``adding`` positions to a cache of ``length`` needs besides dropping
        positions (a window-sized buffer that will evict: its contents), or None: nothing here."""
        return None

    def cache_restore(self, cache: Cache, saved: Any) -> Cache:
        """The cache as :meth:`cache_checkpoint` saved it."""
        return cache

    # ---- what each runtime writes ---------------------------------------------------------------------------
    def activate_impl(self) -> None:
        """Load the artifact; raise ProviderUnavailable when the runtime cannot run here."""

    def deactivate_impl(self) -> None:
        """Release what activate_impl loaded."""

    def run_impl(self, ids: np.ndarray, mask: np.ndarray, past: KVPairs) -> Outputs:
        raise NotImplementedError

    def step_impl(self, ids: np.ndarray, mask: np.ndarray, cache: Cache) -> tuple[np.ndarray, Cache]:
        return self.run_impl(ids, mask, cache)

    def baked_axes(self) -> list[str]:
        """Dynamic axes the artifact declares as fixed numbers (only runtimes that can inspect a graph say)."""
        return []


def to_numpy(x: Any) -> np.ndarray:
    """A torch tensor or array-like as a numpy array (no copy where possible)."""
    if hasattr(x, "detach"):
        return x.detach().cpu().numpy()
    return np.asarray(x)


def _past_len(past: Any) -> int:
    if past is None:
        return 0
    items = list(past)
    if not items:
        return 0
    first = items[0][0] if isinstance(items[0], (tuple, list)) else items[0]
    shape = getattr(first, "shape", None)
    return int(shape[2]) if shape is not None and len(shape) == 4 else 0


def skipped(name: str, contract: Contract, reason: str) -> Runner:
    """A runner reported as skipped with ``reason`` (never as passed)."""
    return Runner(name, contract, skip_reason=reason)
