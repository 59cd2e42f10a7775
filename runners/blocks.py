"""A plan's contract calls run block by block (runners/plan.py): every call through layer 0, then every call through
layer 1, ... — each layer's weights read once for the plan instead of once per call (verify's block order, for a
model whose weights are mapped, not resident). The plan is known in advance: each call's ids and mask, and its
past either given or the present of an earlier call of the plan (a decode chain: step after step of one layer runs
before the next layer).

Eager PyTorch (:func:`run_eager`): each call is the model's own forward in a thread of its own, paused at the entry of
every layer (a forward pre-hook) until the scheduler's turn reaches it: in phase ``j`` the calls run, one at a time in
plan order, from the entry of layer ``j`` to the entry of layer ``j + 1`` (phase 0 from the start, the last to the
end: the final norm and the head). Only one thread runs at a time, so every call computes exactly what it computes
alone — the same operations on the same inputs, the same numbers bit for bit (tests/test_block_order.py). A call
whose past is an earlier call's present starts from placeholders of the past's shape (no memory: a broadcast zero)
and, at the entry of each layer, is handed that layer's present the earlier call made in the same phase. A present
nobody keeps is dropped once the calls extending it took it (a long decode chain holds one step's cache, not all).

The layers are the model's stack (:func:`mhaexport.models.stack.find_layers`); where a past is handed in is the one
thing that depends on the model: the built-in decoder's block takes it as an argument, the ``--hf`` adapter's
transformers layers find it in the ``DynamicCache`` they are given (:func:`eager_unsupported` says which models run
so, and why not the others).
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

import numpy as np

from mhaexport.core.errors import MhaExportError, RuntimeFailure, first_line
from mhaexport.runners.calls import Call, Result, check_plan, consumers, past_length, selected
from mhaexport.runners.decoder import _host, _spilled_tensor
from mhaexport.runtime.runner import Runner

# ---- eager PyTorch ----------------------------------------------------------------------------------------------

class _Abort(Exception):
    pass


class _Worker:
    """One call's thread: runs ``fn`` when first let go, pausing wherever :meth:`pause` is called (in the thread)."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.fn = fn
        self.go = threading.Semaphore(0)
        self.stopped = threading.Semaphore(0)
        self.done = False
        self.abort: str | None = None
        self.value: Any = None
        self.error: BaseException | None = None
        self.seconds = 0.0
        self._t0 = 0.0
        self.thread = threading.Thread(target=self._main, daemon=True)

    def _main(self) -> None:
        _local.worker = self
        self.go.acquire()
        self._t0 = time.perf_counter()
        try:
            if self.abort:
                raise _Abort(self.abort)
            self.value = self.fn()
        except BaseException as e:  # noqa: BLE001 - handed to the scheduler, which decides
            self.error = e
        finally:
            self.seconds += time.perf_counter() - self._t0
            self.done = True
            self.stopped.release()

    def pause(self) -> None:
        """In the worker's thread: hand the turn back and wait for the next one."""
        self.seconds += time.perf_counter() - self._t0
        self.stopped.release()
        self.go.acquire()
        self._t0 = time.perf_counter()
        if self.abort:
            raise _Abort(self.abort)

    def turn(self) -> None:
        """In the scheduler's thread: let the worker run to its next pause (or its end)."""
        self.go.release()
        self.stopped.acquire()


_local = threading.local()


def eager_unsupported(runner: Runner) -> str | None:
    """Why ``runner`` (eager PyTorch) cannot run a plan block by block, or None: not eager PyTorch on the CPU, or a
    model that does not say where its layers take a past (its class's ``block_handoff``: the built-in decoder and
    the ``--hf`` adapter do) or whose one stack of layers is not found."""
    module = getattr(runner, "module", None)
    if module is None or getattr(runner, "device", "cpu") != "cpu" or not hasattr(module, "modules"):
        return "not eager PyTorch on the CPU"
    return _handoff(module, runner.contract.n_layers)[1] or None


def _handoff(module: Any, n_layers: int) -> tuple[Any, str]:
    """The handoff (models/stack.py's ``Handoff``) of the model inside ``module``: the first submodule whose class
    names one (``block_handoff``), over its stack of ``n_layers`` layers; or (None, why not). Found through the model:
    runners import no model."""
    for m in module.modules():
        make = getattr(type(m), "block_handoff", None)
        if make is not None:
            return make.of(m, n_layers)
    return None, (f"{type(module).__name__} is neither the built-in decoder nor the --hf adapter: where its layers "
                  "take a past is not known")


def run_eager(runner: Runner, calls: list[Call], spill: Any = None) -> list[Result]:
    """Every call of ``calls`` on eager ``runner`` (its module), block by block (see the module docstring); each
    result is what ``runner.run`` of that call alone gives, or the error it raised (a call extending a failed one
    fails too). ``spill``: verify's mapped mode's file-backed pages, for kept presents and large logits."""
    import torch

    check_plan(calls)
    c = runner.contract
    module = runner.module
    handoff, why = _handoff(module, c.n_layers)
    if handoff is None:
        raise ValueError(f"{runner.name} cannot run block by block: {why}")
    layers = handoff.layers
    L = len(layers)
    waiting = consumers(calls)  # present of call i, still to be taken by this many calls (per layer)
    left = {(i, j): n for i, n in waiting.items() for j in range(L)}
    made: dict[tuple[int, int], tuple] = {}  # (call, layer) -> its present there, until taken and not kept
    kept: dict[int, list] = {i: [None] * L for i, call in enumerate(calls) if call.keep}
    dtype = torch.float32 if runner.dtype == "float32" else getattr(torch, runner.dtype)
    index_of: dict[_Worker, int] = {}
    threads = torch.get_num_threads()

    def placeholder(shape) -> Any:
        return torch.zeros((), dtype=dtype).expand(*shape)  # (B, H, P, D), no memory

    def taken(i: int, j: int) -> tuple:
        """Call i's past at layer j: the present its source made there (counted as taken)."""
        src = calls[i].past
        pair = made[(src, j)]
        left[(src, j)] -= 1
        if left[(src, j)] == 0 and not calls[src].keep:
            del made[(src, j)]
        return pair

    def keep(i: int, j: int, k, v) -> tuple:
        """Call i's present at layer j, as made: kept for its consumers and its result (spilled where large)."""
        if spill is not None and calls[i].keep:
            k, v = _spilled_tensor(spill, k), _spilled_tensor(spill, v)
        if waiting.get(i):
            made[(i, j)] = (k, v)
        if calls[i].keep:
            kept[i][j] = (k, v)
        return k, v

    def pre(j: int):
        def hook(mod, args, kwargs):
            w = getattr(_local, "worker", None)
            if w is None:  # not a call of the plan (nothing else runs the model meanwhile)
                return None
            if j > 0:
                w.pause()
            i = index_of[w]
            if not isinstance(calls[i].past, int):
                return None
            return handoff.put_past(j, args, kwargs, taken(i, j))
        return hook

    def post(j: int):
        def hook(mod, args, kwargs, out):
            w = getattr(_local, "worker", None)
            if w is None:
                return None
            i = index_of[w]
            k, v = keep(i, j, *handoff.present(j, args, kwargs, out))
            if not calls[i].keep:  # its cache is nobody's result: dropped once its consumers took it
                k, v = placeholder(k.shape), placeholder(v.shape)
            return handoff.replace_present(j, args, kwargs, out, (k, v))
        return hook

    def work(i: int) -> Callable[[], Any]:
        call = calls[i]

        def fn():
            torch.set_num_threads(threads)  # a new thread's intra-op threads: the scheduler's (the same sums)
            with torch.inference_mode():
                ids, mask = torch.from_numpy(call.ids), torch.from_numpy(call.mask)
                B, P = call.ids.shape[0], past_length(calls, i)
                if call.past is None:
                    past = runner.empty_cache(B)
                elif isinstance(call.past, int):
                    shape = (B, c.n_kv_heads, P, c.head_dim)
                    past = tuple((placeholder(shape), placeholder(shape)) for _ in range(L))
                else:
                    past = runner.cache_from_numpy(call.past)
                logits, _ = module(ids, mask, past)
            del past
            logits = selected(_host(logits), call.rows)  # only the rows asked for, on file-backed pages in the
            return spill.keep(logits) if spill is not None else logits  # mapped mode: held until the plan ends
        return fn

    hooks = []
    workers: list = []
    with handoff.calls():  # what the model needs around the calls (the --hf adapter's cache kept as given)
        try:
            for j, layer in enumerate(layers):
                hooks.append(layer.register_forward_pre_hook(pre(j), with_kwargs=True))
                hooks.append(layer.register_forward_hook(post(j), with_kwargs=True))
            for i, call in enumerate(calls):
                try:
                    if isinstance(call.past, int):
                        runner.check_ids_mask(call.ids, call.mask, past_length(calls, i))
                    else:
                        call.ids, call.mask, past = runner.check_inputs(call.ids, call.mask, call.past)
                        call.past = past if call.past is not None else None
                except MhaExportError as e:
                    workers.append(e)
                    continue
                w = _Worker(work(i))
                index_of[w] = i
                workers.append(w)
                w.thread.start()
            failed: dict[int, str] = {i: first_line(w) for i, w in enumerate(workers) if isinstance(w, MhaExportError)}
            for _phase in range(L):
                for i, w in enumerate(workers):
                    if isinstance(w, MhaExportError) or w.done:
                        continue
                    src = calls[i].past
                    if isinstance(src, int) and src in failed:
                        w.abort = f"the call it extends failed: {failed[src]}"
                    w.turn()
                    if w.done and w.error is not None:
                        failed[i] = first_line(w.error)
            results = []
            for i, w in enumerate(workers):
                if isinstance(w, MhaExportError):
                    results.append(Result(error=w))
                    continue
                if w.error is not None:
                    e = w.error
                    err = e if isinstance(e, MhaExportError) else RuntimeFailure(
                        f"{runner.name} failed at {runner.describe_inputs((calls[i].ids, calls[i].mask))}: "
                        f"{first_line(e)}")
                    results.append(Result(error=err, seconds=w.seconds))
                    continue
                logits = w.value
                present = tuple((_host(k), _host(v)) for k, v in kept[i]) if i in kept else None
                results.append(Result(logits, present, seconds=w.seconds))
                runner.times.append(w.seconds)
            return results
        finally:
            for w in workers:  # a thread still paused (an error of ours midway): let it end, its call aborted
                if isinstance(w, _Worker) and not w.done:
                    w.abort = "stopped"
                    w.turn()
            for h in hooks:
                h.remove()


__all__ = ["eager_unsupported", "run_eager"]
