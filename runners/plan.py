"""A check's calls known in advance — a *plan* — and the two orders a runner runs one in.

A check whose inputs do not depend on a runtime's outputs (parity over the sweep, causality, padding, kv-consistency's
teacher-forced decodes: the tokens are given) first writes down every call it will make: each :class:`Call`'s ids and
mask, its past either given (the contract's numpy pairs), empty, or the present of an earlier call of the plan (a
decode chain); then :func:`run_plan` runs them and the check judges the :class:`Result` s. Free-running generation
(the next token is the runtime's own) cannot be planned and runs call by call as before.

The orders (:func:`order_of` says which a runner takes, and why):

- *in turn* (:func:`run_in_turn`, every runner): call after call, each through the runner's decode-loop step in its
  own cache form, a chain's cache handed from call to call as the decode loop hands it — the calls the check made
  before it had a plan;
- *block by block* (runners/blocks.py, eager PyTorch where verify asks for it: its weights mapped, not resident):
  every call through layer 0, then every call through layer 1, ... — each layer's weights read once per plan instead
  of once per call, and each call computing exactly what it computes alone (the same operations on the same inputs,
  the same numbers bit for bit: tests/test_block_order.py).

A runner counts the calls each order ran (``runner.plan_calls``: {order: calls}); verify's report names them per
runtime.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mhaexport.core.dtypes import numpy_dtype
from mhaexport.core.errors import MhaExportError, RuntimeFailure, RuntimeInputError, first_line
from mhaexport.runners.blocks import eager_unsupported, run_eager
from mhaexport.runners.calls import (Call, Derived, Past, Result, check_plan, consumers, empty_pairs, past_length,
                                    selected, sources)
from mhaexport.runners.pieces import pieces_unsupported, run_pieces
from mhaexport.runtime.ort import OrtRunner
from mhaexport.runtime.runner import KVPairs, Runner

IN_TURN = "call by call"
BLOCK = "block by block"


@dataclass
class Plan:
    """Calls written down before any runs: :meth:`add` one, :meth:`chain` a sequence fed in chunks (a decode)."""

    calls: list[Call] = field(default_factory=list)

    def add(self, ids: np.ndarray, mask: np.ndarray, past: Past = None, keep: bool = False,
            loop: bool = False, rows: Any = None) -> int:
        self.calls.append(Call(np.ascontiguousarray(ids, dtype=np.int64), np.ascontiguousarray(mask, dtype=np.int64),
                               past, keep, loop, rows))
        return len(self.calls) - 1

    def chain(self, ids: np.ndarray, mask: np.ndarray, chunks: list[int], keep: bool = False,
              rows: dict[int, Any] | None = None) -> list[int]:
        """(B, N) ``ids`` fed in ``chunks`` from an empty cache, each call with the mask's columns so far (what the
        decode loop feeds); ``keep``: the last call's present returned; ``rows``: {chunk: the positions of its logits
        returned} (else all). The calls' indices."""
        out, pos, prev = [], 0, None
        for i, n in enumerate(chunks):
            prev = self.add(ids[:, pos:pos + n], mask[:, :pos + n], prev, keep and i == len(chunks) - 1, loop=True,
                            rows=(rows or {}).get(i))
            out.append(prev)
            pos += n
        return out

    def run(self, runner: Runner) -> list[Result]:
        return run_plan(runner, self.calls)


def decoded(results: list[Result], chain: list[int]) -> tuple[np.ndarray, KVPairs | None]:
    """A chain's (B, N, V) logits, every chunk's in order, and its last call's present (kept, else None); a call's
    error raised."""
    outs = [results[i].outputs()[0] for i in chain]
    return (outs[0] if len(outs) == 1 else np.concatenate(outs, axis=1)), results[chain[-1]].present


def order_of(runner: Runner) -> tuple[str, str]:
    """(the order ``runner`` runs a plan in, why): block by block where verify asked for it (``runner.block_order``)
    and the runner can — eager PyTorch over its model's layers (runners/blocks.py's
    :func:`~mhaexport.runners.blocks.eager_unsupported`), ONNX Runtime over per-layer pieces of its file
    (runners/pieces.py's :func:`~mhaexport.runners.pieces.pieces_unsupported`) — else in turn."""
    if not getattr(runner, "block_order", False):
        return IN_TURN, ""
    why = pieces_unsupported(runner) if isinstance(runner, OrtRunner) else eager_unsupported(runner)
    return (IN_TURN, why) if why else (BLOCK, "")


def run_plan(runner: Runner, calls: list[Call]) -> list[Result]:
    """Every call of ``calls`` on ``runner``, in the order :func:`order_of` gives it; each result is what the call
    gives alone, or the error it raised (a call extending a failed one fails too)."""
    check_plan(calls)
    order, _ = order_of(runner)
    if order == BLOCK and not isinstance(runner, OrtRunner) and any(isinstance(c.past, Derived) for c in calls):
        order = IN_TURN  # eager's layers take a chain's past, not a derived one (runners/blocks.py)
    if order == BLOCK and isinstance(runner, OrtRunner):
        runner._require_active()
        results = run_pieces(runner, runner.pieces, calls, Path(runner.path).parent, spill=runner.spill)
    elif order == BLOCK:
        results = run_eager(runner, calls, spill=getattr(runner, "spill", None))
    else:
        results = run_in_turn(runner, calls)
    counts = runner.__dict__.setdefault("plan_calls", {})
    counts[order] = counts.get(order, 0) + len(calls)
    return results


def run_in_turn(runner: Runner, calls: list[Call]) -> list[Result]:
    """The calls one after another: a chain's through the runner's step in its own cache form, as the decode loop
    drives it, its cache handed on (forked where several calls extend it); a lone contract call through ``run``."""
    runner._require_active()
    left = consumers(calls)
    caches: dict[int, Any] = {}
    results: list[Result] = []
    for i, call in enumerate(calls):
        try:
            if isinstance(call.past, Derived):
                failed = [s for s in sources(call) if results[s].error is not None]
                if failed:
                    raise RuntimeFailure(f"the call it extends failed: {first_line(results[failed[0]].error)}")
                pairs = call.past.evaluate(lambda s: runner.cache_numpy(caches[s]),
                                           lambda b: empty_pairs(runner.contract, numpy_dtype(runner.dtype), b,
                                                                 runner.contract.n_layers))
                for s in sources(call):
                    left[s] -= 1
                    if not left[s]:
                        caches.pop(s)
                cache = runner.cache_from_numpy(pairs)
                ids, mask = runner.check_ids_mask(call.ids, call.mask, past_length(calls, i))
            elif isinstance(call.past, int):
                src = results[call.past]
                if src.error is not None:
                    raise RuntimeFailure(f"the call it extends failed: {first_line(src.error)}")
                left[call.past] -= 1
                cache = caches[call.past] if left[call.past] else caches.pop(call.past)
                if left[call.past]:
                    cache = runner.cache_fork(cache)
                ids, mask = runner.check_ids_mask(call.ids, call.mask, past_length(calls, i))
            elif not call.loop and not left.get(i):
                n = len(runner.times)
                logits, present = runner.run(call.ids, call.mask, call.past)
                results.append(Result(selected(logits, call.rows), present if call.keep else None,
                                      seconds=sum(runner.times[n:])))
                continue
            else:
                ids, mask, past = runner.check_inputs(call.ids, call.mask, call.past)
                cache = (runner.empty_cache(ids.shape[0]) if call.past is None else runner.cache_from_numpy(past))
            if mask.shape[1] > runner.max_length:  # the decode loop's own limit (a shared cache's buffer)
                raise RuntimeInputError(f"cannot feed past {runner.limit_text()}: the cache holds "
                                        f"{past_length(calls, i)} positions and {ids.shape[1]} more were given")
            n = len(runner.times)
            logits, cache = runner.step(ids, mask, cache)
            present = runner.cache_numpy(cache) if call.keep else None
            if left.get(i):
                caches[i] = cache
            results.append(Result(selected(logits, call.rows), present, seconds=sum(runner.times[n:])))
        except MhaExportError as e:
            results.append(Result(error=e))
    return results


__all__ = ["BLOCK", "IN_TURN", "Call", "Plan", "Result", "decoded", "order_of", "run_in_turn", "run_plan"]
