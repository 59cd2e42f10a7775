"""ONNX Runtime as a :class:`~mhaexport.runtime.runner.Runner` on one execution provider (CPU or CUDA), torch-free.

``run`` feeds numpy and returns numpy (verify's sweep); on CUDA ``step`` keeps the KV cache as the ``OrtValue``s
ONNX Runtime returned, bound on the device (IO binding), so between decode steps the cache never crosses to the
host; only the logits come back. On CPU ``step`` is plain ``session.run`` (numpy in and out, no copy; measured
faster than IO binding there, see :attr:`OrtRunner.binds`). The deploy runtime's Generator and verify's ort-cpu /
ort-cuda rows are this one runner. Its session handling (open, the providers really used, close, the input axes a
file fixes) is :class:`OrtSessionRunner`, which verify's attention-block runner stands on too.
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import onnxruntime as ort

from mhaexport.core import dtypes, iospec
from mhaexport.core.errors import ProviderUnavailable, RuntimeFailure, first_line
from mhaexport.core.iospec import Contract, ModelContract
from mhaexport.runtime.feed import Feed
from mhaexport.runtime.protocol import Protocol, SharedBuffer, protocol_of
from mhaexport.runtime.runner import Cache, KVPairs, Outputs, Runner
from mhaexport.runtime.session import CUDA, SessionConfig, open_session
from mhaexport.runtime.spill import Spill


class OrtSessionRunner(Runner):
    """The session handling every ONNX Runtime runner shares, whatever its contract: an InferenceSession over
    ``path`` from :func:`~mhaexport.runtime.session.open_session`. ``config.providers`` says where; a provider that
    does not really run here (``get_providers()``) makes the runner skipped with ONNX Runtime's reason, never
    silently CPU. A contract's runner adds its feed (``run_impl``) and which input axes must stay dynamic
    (:meth:`fixed_axes`): the decoder's :class:`OrtRunner`, verify's attention-block runner. ``session_of``: another
    runner of the same file whose session this one drives (opened once, by that runner: one file, two protocols)."""

    def __init__(self, name: str, contract: Contract, path: str | Path | bytes, *,
                 config: SessionConfig = SessionConfig(), dtype: str = "float32", fixed: tuple[int, int] | None = None,
                 source_sha256: str | None = None, session_of: OrtSessionRunner | None = None) -> None:
        super().__init__(name, contract, dtype=dtype, fixed=fixed)
        self.path = path if isinstance(path, bytes) else Path(path)
        self.config = config
        self.source_sha256 = source_sha256  # the file's recorded sha256: keys the optimized-graph cache
        self.session_of = session_of
        self.session: ort.InferenceSession | None = None
        self.device = "cpu"
        self.warnings: list[str] = []
        self.optimized_from_cache = False
        self._in_shapes: dict[str, list] = {}

    def _adopt(self, session: ort.InferenceSession, warnings: list[str], from_cache: bool) -> None:
        self.session = session
        self.providers = list(session.get_providers())
        self.device = "cuda" if self.providers and self.providers[0] == CUDA else "cpu"
        self.warnings = list(warnings)
        self.optimized_from_cache = from_cache
        self._in_shapes = {i.name: list(i.shape) for i in session.get_inputs()}

    def activate_impl(self) -> None:
        if (owner := self.session_of) is not None:  # the same session, driven in this runner's protocol
            owner.activate()
            if owner.skip_reason is not None:
                raise ProviderUnavailable(owner.skip_reason)
            self._adopt(owner.session, owner.warnings, owner.optimized_from_cache)
            return
        session, warnings, from_cache = open_session(self.path, self.config, source_sha256=self.source_sha256)
        self._adopt(session, warnings, from_cache)

    def deactivate_impl(self) -> None:
        self.session = None

    def fixed_axes(self, dynamic: dict[str, dict[int, str]]) -> list[str]:
        """The axes of ``dynamic`` ({input name in the file: {axis: dim name}}) that the session's inputs declare as
        fixed numbers: "name axis 1 (sequence_length) = 3"."""
        baked = []
        for name, axes in dynamic.items():
            shape = self._in_shapes.get(name, [])
            for ax, dim in axes.items():
                if ax < len(shape) and isinstance(shape[ax], int):
                    baked.append(f"{name} axis {ax} ({dim}) = {shape[ax]}")
        return baked


class OrtRunner(OrtSessionRunner):
    """The decoder contract in an ONNX Runtime session (:class:`OrtSessionRunner`) fed as ``feed`` says (the file's
    names, its cache's dtype, a static export's sizes; default: the contract's names, float32): the output split, and
    the decode loop's cache as bound OrtValues. :func:`mhaexport.runtime.choose.ort_runner_for` builds it from a
    folder's manifest."""

    def __init__(self, name: str, contract: ModelContract, path: str | Path | bytes, *, feed: Feed | None = None,
                 config: SessionConfig = SessionConfig(), io_binding: bool | None = None,
                 source_sha256: str | None = None, protocol: Protocol | None = None,
                 session_of: OrtRunner | None = None) -> None:
        feed = feed or Feed.contract(contract.n_layers)
        self.protocol = protocol or protocol_of(feed)  # how the file is driven: padding, buffers, calls
        super().__init__(name, contract, path, config=config, dtype=feed.cache_dtype, fixed=feed.fixed,
                         source_sha256=source_sha256, session_of=session_of)
        self.io_binding = io_binding
        # verify's mapped mode: large outputs written straight into file-backed buffers (runtime/spill.py)
        self.spill: Spill | None = None
        self.feed = feed  # the file's names for the contract's inputs and outputs, its cache
        self.out_logits = feed.logits
        self.past_names, self.present_names = list(feed.past), list(feed.present)
        self.output_names = [self.out_logits] + self.present_names

    @property
    def padding(self) -> str:
        """The side the decode loop pads a batch of prompts on for this runner: its protocol's."""
        return self.protocol.padding

    @property
    def layout(self) -> Feed | None:
        """An adopted file's feed (its own names for the contract's I/O), None for mhaexport's own export."""
        return self.feed if self.feed.adopted else None

    @property
    def binds(self) -> bool:
        """Whether the decode loop carries the cache as bound OrtValues (IO binding): as asked, or by default on CUDA
        only, where it keeps the cache on the device. On CPU plain ``session.run`` takes and returns numpy without a
        copy, and measured on the same session it was the faster: the bench preset's decode step 1.04-1.06 x the
        bare loop's with IO binding, 0.99-1.00 x without (three runs each)."""
        return self.device == "cuda" if self.io_binding is None else self.io_binding

    def _host_inputs(self, ids: np.ndarray, mask: np.ndarray) -> dict[str, np.ndarray]:
        """The file's token inputs (:meth:`Feed.token_inputs`: positions too where the file takes them)."""
        return self.feed.token_inputs(ids, mask)

    def baked_axes(self) -> list[str]:
        file_name = self.feed.file_names()
        return self.fixed_axes({file_name.get(name, name): axes
                                for name, axes in iospec.dynamic_input_axes(self.contract.n_layers).items()})

    # ---- numpy in, numpy out ---------------------------------------------------------------------------------
    def _run_plain(self, ids: np.ndarray, mask: np.ndarray, flat_past) -> list:
        """``session.run`` on the host inputs and the 2L past values: [logits, present values...]; with a
        :attr:`spill` on a CPU session, the outputs are bound to file-backed buffers (:meth:`_run_spilled`)."""
        feed = {**self._host_inputs(ids, mask), **dict(zip(self.past_names, flat_past))}
        if self.spill is not None and self.device == "cpu" and type(self.protocol) is Protocol:
            return self._run_spilled(ids, mask, feed)
        return self.session.run(self.output_names, feed)

    def _run_spilled(self, ids: np.ndarray, mask: np.ndarray, feed: dict[str, np.ndarray]) -> list:
        """One call whose logits (B, T, V) and present values (B, H_kv, past + T, D) ONNX Runtime writes into
        :attr:`spill`'s buffers (IO binding; the inputs bound where they lie, file-backed or not), flushed after. A
        file whose outputs are not these shapes or dtypes runs plainly, its outputs spilled once made."""
        c, (B, T), S = self.contract, ids.shape, mask.shape[1]
        try:
            io = self.session.io_binding()
            for name, value in feed.items():
                io.bind_cpu_input(name, np.ascontiguousarray(value))
            logits_dtype = next(dtypes.numpy_dtype(dtypes.from_ort_type(o.type) or "float32")
                                for o in self.session.get_outputs() if o.name == self.out_logits)
            outs = [self.spill.empty((B, T, c.vocab_size), logits_dtype)]
            outs += [self.spill.empty((B, c.n_kv_heads, S, c.head_dim), dtypes.numpy_dtype(self.dtype))
                     for _ in self.present_names]
            for name, arr in zip(self.output_names, outs):
                io.bind_output(name, "cpu", 0, arr.dtype, list(arr.shape), arr.ctypes.data)
            self.session.run_with_iobinding(io)
        except Exception:  # noqa: BLE001 - ONNX Runtime's own types; the plain run raises what is really wrong
            return [self.spill.keep(a) for a in self.session.run(self.output_names, feed)]
        return [Spill.flushed(a) for a in outs]

    def run_impl(self, ids: np.ndarray, mask: np.ndarray, past: KVPairs) -> Outputs:
        return iospec.split_outputs(self._run_plain(ids, mask, [t for kv in past for t in kv]))

    # ---- the decode loop: the cache stays OrtValues on the session's device ----------------------------------
    def empty_cache(self, batch: int, positions: int | None = None) -> Cache:
        c = self.contract
        empty = np.zeros((batch, c.n_kv_heads, 0, c.head_dim), dtype=dtypes.numpy_dtype(self.dtype))  # (B, Hkv, 0, D)
        if not self.binds:
            return [empty] * len(self.past_names)
        return [ort.OrtValue.ortvalue_from_numpy(empty, self.device, 0) for _ in self.past_names]

    def cache_from_numpy(self, past: KVPairs) -> Cache:
        flat = [t for kv in past for t in kv]
        if not self.binds:
            return flat
        return [ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(t), self.device, 0) for t in flat]

    def step_impl(self, ids: np.ndarray, mask: np.ndarray, cache: Cache) -> tuple[np.ndarray, Cache]:
        """(B, T) ids, (B, S) mask, 2L cache values -> (B, T, V) logits on the host, 2L present values.

        A new IOBinding per call: measured, creating one costs ~1 us (~0.4 us to clear and reuse one) against
        ~250 us for the small preset's decode step."""
        if not self.binds:
            out = self._run_plain(ids, mask, cache)
            return out[0], out[1:]
        io = self.session.io_binding()
        for name, value in self._host_inputs(ids, mask).items():
            io.bind_cpu_input(name, value)
        for name, value in zip(self.past_names, cache):
            io.bind_ortvalue_input(name, value)
        io.bind_output(self.out_logits, "cpu")  # only the logits come to the host
        for name in self.present_names:
            io.bind_output(name, self.device, 0)  # the cache stays on the session's device
        self.session.run_with_iobinding(io)
        outs = io.get_outputs()
        return outs[0].numpy(), list(outs[1:])

    def cache_numpy(self, cache: Cache) -> KVPairs:
        flat = [t.numpy() if isinstance(t, ort.OrtValue) else t for t in cache]
        return tuple((flat[2 * i], flat[2 * i + 1]) for i in range(len(flat) // 2))


def consumed_on(session: ort.InferenceSession, names: list[str], default: str) -> str:
    """Where ``session`` reads its inputs ``names``: "cpu" where ONNX Runtime placed every node that reads them on
    the host, else ``default`` (the session's device; also where this onnxruntime cannot say: its
    ``get_input_memory_infos``). A CUDA session runs on the CPU provider the nodes its CUDA provider has no kernel
    for: onnxruntime-gpu 1.31's GroupQueryAttention has CUDA kernels for float16 and bfloat16 only, so a float32
    shared cache's attention, and the buffers it reads and writes, are the host's."""
    infos = getattr(session, "get_input_memory_infos", None)
    try:
        where = dict(zip([i.name for i in session.get_inputs()], infos())) if infos is not None else {}
    except Exception:  # noqa: BLE001  # an onnxruntime that cannot say: the session's device
        return default
    found = [where.get(n) for n in names]
    if found and all(f is not None and str(getattr(f, "name", "")).lower().startswith("cpu") for f in found):
        return "cpu"
    return default


class BoundBuffers(list):
    """A shared cache between decode steps: the per-layer buffers (the list's OrtValues) and ``io``, the IOBinding
    that binds each buffer as its layer's past and present, made by the first step and reused by the next ones."""

    io = None


class RowBuffers:
    """One row of a shared cache's buffers, as a batch of one: each layer's (1, H_kv, slots, D) slice of the batch's
    buffer, bound by address (no copy), so a call writes that row's slots in place (a request joining a running
    batch is prefilled into its row)."""

    def __init__(self, bufs: BoundBuffers, row: int) -> None:
        self.bufs, self.row = bufs, row


class SharedCacheOrtRunner(OrtRunner):
    """An export whose past and present are one preallocated buffer per layer (``--kv-cache shared``;
    onnxruntime-genai's ``past_present_share_buffer``): past_key_values.i.* and present.i.* are (B, H_kv, max_cache, D)
    and GroupQueryAttention writes each row's new keys/values into the buffer in place. Its protocol: every row's
    tokens packed from slot 0 (prompts right-padded), ``attention_mask`` telling each row's real length.

    It runs as its protocol (:mod:`mhaexport.runtime.protocol`, given by whoever builds it: the registry) says:

    - :class:`SharedBuffer` (the file's own; the deploy loop, bench): ``step`` carries the buffers between steps,
      bound as both past and present — the same OrtValue, never copied; the decode loop right-pads prompts.
    - :class:`ContractOverShared` (verify's contract calls, any padding, any past): ``run`` and ``step`` translate
      each call into the file's (:meth:`SharedBuffer.calls`) — rows packed, a past cache copied into fresh buffers,
      calls with a past split into one call per row (GroupQueryAttention takes more than one new token with a past
      only at batch 1) — and scatter the outputs back to the contract's positions (padded positions left 0: nothing
      compares them); the cache between calls is the contract's arrays.

    ``run`` translates a contract call in either protocol.

    The buffers live where the session reads them (:attr:`cache_device`, :func:`consumed_on`): on the host for a
    float32 file in a CUDA session, whose GroupQueryAttention runs on the CPU provider (onnxruntime-gpu has no
    float32 kernel for it); there the kernel writes them in place as on ort-cpu. A buffer bound on another device
    than its reader is copied when it is bound, so on any non-CPU session the past inputs are bound again before
    every call (:meth:`SharedBuffer.bind_past`): a binding reused from step to step once fed every step the
    pre-prefill copy (the CUDA deploy-loop bug, docs/measurements/gpu-check-2026-12-04.md).
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if not self.feed.shared or not self.feed.max_cache:
            raise ValueError(f"{self.name}: a shared-cache runner needs a shared feed with its slots, not "
                             f"{self.feed.protocol}")
        if not isinstance(self.protocol, SharedBuffer):
            self.protocol = protocol_of(self.feed)
        self.max_cache = self.protocol.max_cache
        self.cache_device = "cpu"  # where the session reads the buffers (set with the session: consumed_on)
        # the numpy dtype the decode loop hands ONNX Runtime the logits in (set with the session; None: ORT allocates)
        self._into: np.dtype | None = None

    @property
    def max_length(self) -> int:
        """The most positions a decode loop can feed: the buffer's slots (and the model's max_positions) where the
        buffers are carried; translated contract calls size their buffers per call, so there only max_positions."""
        return self.protocol.max_length(self.contract.max_positions)

    def limit_text(self) -> str:
        if self.max_length < self.contract.max_positions:
            return f"the shared cache's {self.max_length} slots (--max-cache)"
        return super().limit_text()

    def buffers(self, batch: int, slots: int | None = None, *, windowed: bool = False) -> BoundBuffers:
        """Zeroed (B, H_kv, slots, D) buffers (default ``max_cache`` slots), one per past/present name, where the
        session reads them (:attr:`cache_device`); ``windowed`` (the decode loop's): a window cache's sliding-window
        layers window-sized (:meth:`SharedBuffer.layer_slots`)."""
        c = self.contract
        slots = slots or self.protocol.slots()
        per_layer = self.protocol.layer_slots(slots) if windowed else [slots] * c.n_layers
        if windowed and self.cache_device == "cuda" and self.feed.window_slots:
            # ONNX Runtime's CUDA GroupQueryAttention takes a window-sized buffer of exactly W slots (its CPU kernel
            # any C >= W; onnxruntime 1.32's operator doc): not run on a GPU in this work
            per_layer = [c.window(i) if w else s for i, (w, s) in enumerate(zip(self.feed.window_slots, per_layer))]
        np_dtype = dtypes.numpy_dtype(self.dtype)
        return BoundBuffers(ort.OrtValue.ortvalue_from_numpy(np.zeros((batch, c.n_kv_heads, per_layer[i // 2],
                                                                       c.head_dim), np_dtype), self.cache_device,
                                                             0)
                            for i in range(len(self.past_names)))  # (B, H_kv, slots, D); past: k0, v0, k1, ...

    def _adopt(self, session: ort.InferenceSession, warnings: list[str], from_cache: bool) -> None:
        """The session, and whether the decode loop can hand it the array to write the logits into: on CPU, for a
        dtype numpy holds (else ONNX Runtime allocates them and they are read back)."""
        super()._adopt(session, warnings, from_cache)
        self.cache_device = consumed_on(session, self.past_names, self.device)
        out = next((o for o in session.get_outputs() if o.name == self.out_logits), None)
        name = dtypes.from_ort_type(out.type) if out is not None else None
        self._into = (dtypes.numpy_dtype(name) if self.device == "cpu" and name in ("float32", "float16")
                      else None)

    def _run_shared(self, ids: np.ndarray, mask: np.ndarray, bufs: list) -> np.ndarray:
        """One call in the file's protocol: each buffer bound as its layer's past and present; returns the logits.

        ``bufs`` a :class:`BoundBuffers` (the decode loop's cache): its IOBinding is made at the first call and kept,
        so a decode step binds only the token inputs and the logits (the buffers are the same OrtValues every step);
        on CPU the logits are written into a fresh numpy array of their shape (never read back, never shared with an
        earlier step's array). Measured on the bench-size Llama (8 layers, 2 threads, same session, paired per step): the
        loop's time outside ``run_with_iobinding`` fell from ~0.45 ms to ~0.22 ms per fp32 step."""
        io = getattr(bufs, "io", None)
        if io is None:
            io = self.session.io_binding()
            io.bind_output(self.out_logits, "cpu")  # bound first: get_outputs() follows the binding order
            self.protocol.bind(io, bufs)  # each buffer as its layer's past and present: written in place
            if isinstance(bufs, BoundBuffers):
                bufs.io = io
        elif self.device != "cpu":  # a past bound on a device other than its reader's is copied at binding time
            self.protocol.bind_past(io, bufs)
        ids = np.ascontiguousarray(ids, dtype=np.int64)
        for name, value in self._host_inputs(ids, np.ascontiguousarray(mask, dtype=np.int64)).items():
            io.bind_cpu_input(name, value)
        into = self._into
        if into is not None:
            logits = np.empty((*ids.shape, self.contract.vocab_size), dtype=into)  # (B, T, V)
            io.bind_ortvalue_output(self.out_logits, ort.OrtValue.ortvalue_from_numpy(logits))
            try:
                self.session.run_with_iobinding(io)
                return logits
            except Exception:  # noqa: BLE001  # retried below with ONNX Runtime allocating the logits
                io.bind_output(self.out_logits, "cpu")
                self.session.run_with_iobinding(io)  # a bad call raises here, as it would have without the array
                self._into = None  # it runs so: this file's logits are not (B, T, V) (e.g. the last position's only)
                return io.get_outputs()[0].numpy()
        io.bind_output(self.out_logits, "cpu")  # unallocated again (same slot): a prompt's are (B, P, V)
        self.session.run_with_iobinding(io)
        return io.get_outputs()[0].numpy()

    # ---- the decode loop -------------------------------------------------------------------------------------
    def stepper(self, cache, attention_mask: np.ndarray, steps: int,
                capacity: int | None = None) -> SharedSteps | None:
        """The decode loop's steps over these buffers with nothing but the run between them (:class:`SharedSteps`):
        on the CPU, for a file fed ids and mask only whose logits the loop hands in (``_into``), after a prefill
        that bound the buffers; None otherwise (verify's translated contract calls, CUDA — where ONNX Runtime copies
        a host input the device reads when it is bound, so arrays rewritten under a kept binding would go stale —, an
        adopted file fed positions), and where the steps would pass the buffers' ``capacity`` (the generic step
        refuses that)."""
        B, S = attention_mask.shape
        if (not self.protocol.in_place or self._into is None or self.feed.position_ids is not None
                or not isinstance(cache, BoundBuffers) or cache.io is None
                or S + steps > min(capacity or self.max_length, self.max_cache)):
            return None
        return SharedSteps(self, cache, attention_mask, min(S + steps, self.max_length))

    def empty_cache(self, batch: int, positions: int | None = None):
        """The decode loop's buffers: ``positions`` slots when the loop says how many it will fill (a generation:
        prompt + new tokens, as onnxruntime-genai sizes its own), else ``max_cache``. Measured on the bench-size
        Llama (1024 positions, prompt 32 + 128 tokens): making zeroed 1024-slot buffers took 8-25 ms inside the
        prefill (~2 ms for 160 slots), and the decode steps over 160-slot buffers ran ~2 % faster."""
        if not self.protocol.in_place:  # the contract's arrays, on the host (each call copies them into buffers)
            c = self.contract
            return [np.zeros((batch, c.n_kv_heads, 0, c.head_dim), dtypes.numpy_dtype(self.dtype))] * len(
                self.past_names)
        return self.buffers(batch, self.protocol.slots(positions), windowed=True)

    def cache_from_numpy(self, past: KVPairs):
        if not self.protocol.in_place:
            return past
        raise NotImplementedError("a shared-buffer cache is built by the decode loop, not from contract arrays")

    def step_impl(self, ids: np.ndarray, mask: np.ndarray, cache):
        if not self.protocol.in_place:  # each call translated, the cache the contract's arrays
            logits, present = self.run_impl(ids, mask, self.cache_numpy(cache))
            return logits, present
        if isinstance(cache, RowBuffers):
            return self._run_row(ids, mask, cache), cache
        return self._run_shared(ids, mask, cache), cache

    def _run_row(self, ids: np.ndarray, mask: np.ndarray, view: RowBuffers) -> np.ndarray:
        """One batch-of-one call on row ``view.row`` of the batch's buffers: each layer's row bound by address as its
        past and present (written in place, on the device the buffers live on); returns the (1, T, V) logits."""
        io = self.session.io_binding()
        np_dtype = dtypes.numpy_dtype(self.dtype)
        for past, present, buf in zip(self.feed.past, self.feed.present, view.bufs):
            shape = buf.shape()  # [B, H_kv, slots, D]
            row_bytes = int(np.prod(shape[1:])) * np.dtype(np_dtype).itemsize
            at = buf.data_ptr() + view.row * row_bytes
            io.bind_input(past, self.cache_device, 0, np_dtype, [1, *shape[1:]], at)
            io.bind_output(present, self.cache_device, 0, np_dtype, [1, *shape[1:]], at)
        for name, value in self._host_inputs(np.ascontiguousarray(ids, dtype=np.int64),
                                             np.ascontiguousarray(mask, dtype=np.int64)).items():
            io.bind_cpu_input(name, value)
        io.bind_output(self.out_logits, "cpu")
        self.session.run_with_iobinding(io)
        return io.get_outputs()[-1].numpy()

    # ---- a cache's rows and positions, in place (continuous batching, speculative decoding, prefix reuse) ------
    def cache_columns(self, cache, start: int, stop: int):
        """Positions [0, stop) of a shared buffer: the same buffers (a row's length is its mask's sum; the slots
        after it are written over by the next call). Rows are packed from slot 0, so they never lose first columns."""
        if not self.protocol.in_place:
            return super().cache_columns(cache, start, stop)
        if start:
            raise ValueError(f"{self.name}: a shared buffer's rows start at slot 0; positions [{start}, {stop}) are "
                             "not a row's")
        return cache

    def cache_row(self, cache, row: int, start: int, stop: int):
        """Row ``row`` of the batch's buffers, bound by address (:class:`RowBuffers`): its slots from 0."""
        if not self.protocol.in_place:
            return super().cache_row(cache, row, start, stop)
        return RowBuffers(cache, row)

    def cache_put_row(self, cache, row: int, values):
        """Nothing to move when ``values`` is the row itself (:class:`RowBuffers`: its call wrote the slots in place);
        a batch of one's own buffers (a prefix's cache, the same slots per layer) copied into the row."""
        if not self.protocol.in_place:
            return super().cache_put_row(cache, row, values)
        if isinstance(values, RowBuffers) and values.bufs is cache and values.row == row:
            return cache
        for buf, src in zip(cache, values):
            arr, one = buf.numpy(), src.numpy()  # on the host: a view of a host buffer, else a copy
            if arr.shape[2] != one.shape[2]:
                raise ValueError(f"{self.name}: a row of {one.shape[2]} slots into buffers of {arr.shape[2]}")
            arr[row] = one[0]
            if not (self.cache_device == "cpu" and np.shares_memory(arr, buf.numpy())):
                buf.update_inplace(arr)
        return cache

    def cache_fork(self, cache):
        """New buffers holding a copy of ``cache``'s (where the session reads them): a prefix's cache reused by
        several requests, each writing its own slots after the prefix."""
        if not self.protocol.in_place:
            return super().cache_fork(cache)
        return BoundBuffers(ort.OrtValue.ortvalue_from_numpy(np.array(buf.numpy(), copy=True), self.cache_device, 0)
                            for buf in cache)

    def windowed_slots(self) -> int | None:
        """The fewest slots of a window-sized buffer (a window cache's sliding-window layers), None without one."""
        slots = [w for w in (self.feed.window_slots or ()) if w]
        return min(slots) if slots and self.protocol.in_place else None

    def cache_checkpoint(self, cache, length: int, adding: int):
        """A window cache whose window-sized buffers evict in place once a row passes their slots
        (GroupQueryAttention's ``sliding_window_cache``: the most recent positions kept from slot 0): a rewind after
        such a call cannot take positions back by the mask alone, so the windowed layers' buffers are copied before it
        (the caller restores them and feeds the kept positions again). None below the buffers (and for every other
        cache: a rewind is the mask's sum going back)."""
        slots = self.windowed_slots()
        if slots is None or length + adding <= slots:
            return None
        return {i: np.array(buf.numpy(), copy=True) for i, buf in enumerate(cache)
                if self.feed.window_slots[i // 2]}

    def cache_restore(self, cache, saved):
        for i, arr in saved.items():
            cache[i].update_inplace(arr)
        return cache

    def cache_numpy(self, cache) -> KVPairs:
        if not cache or isinstance(cache[0], tuple):
            return cache
        return super().cache_numpy(cache)  # the buffers, (B, H_kv, max_cache, D): packed rows, not the contract

    # ---- the contract, translated ------------------------------------------------------------------------------
    def run_impl(self, ids: np.ndarray, mask: np.ndarray, past: KVPairs) -> Outputs:
        """A contract call in the file's calls (:meth:`SharedBuffer.calls`), each with fresh buffers holding its rows'
        real past; the outputs scattered back to the contract's positions (padded positions left 0: nothing compares
        them)."""
        B, T = ids.shape
        P = mask.shape[1] - T
        c = self.contract
        slots = self.protocol.slots(P + T, at_least=True)
        np_dtype = dtypes.numpy_dtype(self.dtype)
        logits = None
        present = [np.zeros((B, c.n_kv_heads, P + T, c.head_dim), np_dtype) for _ in self.past_names]
        calls, idle = self.protocol.calls(ids, mask)
        for b in idle:  # no real token in this call: its real past, if any, is its present
            real = np.flatnonzero(mask[b, :P])
            for li in range(len(present)):
                present[li][b][:, real] = past[li // 2][li % 2][b][:, real]
        for call in calls:
            host = [np.zeros((len(call.rows), c.n_kv_heads, slots, c.head_dim), np_dtype)
                    for _ in self.past_names]  # (G, H_kv, slots, D)
            for j, b in enumerate(call.rows):  # the row's real past in the buffer's first slots
                at = call.past_at[j]
                for li, arr in enumerate(host):
                    arr[j, :, :len(at)] = past[li // 2][li % 2][b][:, at]
            bufs = [ort.OrtValue.ortvalue_from_numpy(arr, self.cache_device, 0) for arr in host]
            out = self._run_shared(call.ids, call.mask, bufs)  # (G, t, V)
            if logits is None:
                logits = np.zeros((B, T, out.shape[-1]), out.dtype)
            written = [buf.numpy() for buf in bufs]  # (G, H_kv, slots, D): each row's positions packed
            for j, b in enumerate(call.rows):
                real = np.concatenate([call.past_at[j], call.new_at[j]])  # the row's positions, in order
                logits[b, call.new_at[j] - P] = out[j, :len(call.new_at[j])]
                for li in range(len(present)):
                    present[li][b][:, real] = written[li][j][:, :len(real)]
        if logits is None:  # no row had a real token: nothing ran
            logits = np.zeros((B, T, c.vocab_size), np.float32)
        return logits, tuple((present[2 * i], present[2 * i + 1]) for i in range(c.n_layers))


class SharedSteps:
    """The decode loop's steps over a shared cache (:meth:`SharedCacheOrtRunner.stepper`) with nothing but the run
    between them. The buffers' IOBinding (made by the prefill) gets, once, a (B, 1) ids array and a (B, 1, V) logits
    array that every step reuses (ONNX Runtime reads and writes the numpy memory the binding holds), and a (B,
    ``width``) mask of ones after the prompt's columns, of which each step binds one column more (a view, no copy,
    for one row). A step: the tokens into the ids array, the mask rebound, the run. Measured on the bench-size Llama
    (one thread, paired per step from ONNX Runtime's profile): the host's time between two runs fell from ~0.58 ms
    (a step through ``Runner.step``: a new mask, ids and logits array bound every step, the checks and dict of the
    generic feed) to ~0.25 ms, onnxruntime-genai's own loop's ~0.20 ms in the same run — on a model that streams
    167 MB of weights through the caches every step, each Python object the host touches between runs is a cache
    miss."""

    def __init__(self, runner: SharedCacheOrtRunner, bufs: BoundBuffers, attention_mask: np.ndarray,
                 width: int) -> None:
        B, S = attention_mask.shape
        self.runner, self.bufs, self.io, self.length = runner, bufs, bufs.io, S
        self.mask = np.ones((B, width), dtype=np.int64)  # (B, width): the prompt's columns, then ones
        self.mask[:, :S] = attention_mask
        self.ids = np.zeros((B, 1), dtype=np.int64)  # (B, 1)
        self.tokens = self.ids[:, 0]  # (B,): a view the tokens are written into
        self.logits = np.empty((B, 1, runner.contract.vocab_size), dtype=runner._into)  # (B, 1, V)
        self.last = self.logits[:, 0, :]  # (B, V): what step() returns
        # one row's first k columns are contiguous: every width's view made here, bound as it is; rows of a batch
        # are copied into a contiguous (B, k) array each step
        self.views = [self.mask[:, :k] for k in range(width + 1)] if B == 1 else None
        self.io.bind_cpu_input(runner.feed.input_ids, self.ids)
        self.io.bind_ortvalue_output(runner.out_logits, ort.OrtValue.ortvalue_from_numpy(self.logits))
        self.bind_mask = functools.partial(self.io.bind_cpu_input, runner.feed.attention_mask)
        self.run = runner.session.run_with_iobinding

    def step(self, tokens: np.ndarray) -> np.ndarray:
        """Feed (B,) ``tokens`` at the next position: the (B, V) logits (valid until the next step). Its runs are
        timed by the decode loop (``GenerationResult.step_s``), not in the runner's ``times``."""
        self.tokens[:] = tokens
        self.length += 1
        views = self.views
        self.bind_mask(views[self.length] if views is not None else
                       np.ascontiguousarray(self.mask[:, :self.length]))
        try:
            self.run(self.io)
        except Exception as e:  # what ONNX Runtime raises, named by the call's shapes as Runner.step names it
            mask = self.mask[:, :self.length]
            raise RuntimeFailure(f"{self.runner.name} failed at {self.runner.describe_inputs((self.ids, mask))}: "
                                 f"{first_line(e)}") from e
        return self.last

    def finish(self) -> tuple[BoundBuffers, np.ndarray]:
        """The cache (the same buffers) and the (B, S) mask that covers it now."""
        return self.bufs, self.mask[:, :self.length].copy()
