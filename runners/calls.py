"""A plan's calls and what they give (runners/plan.py runs them; runners/blocks.py block by block): :class:`Call`,
:class:`Result`, a past :class:`Derived` from earlier calls' presents by the decode loop's cache moves, and what a
scheduler needs to know of a plan — which calls extend which (:func:`consumers`, :func:`check_plan`), each call's
past length."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from mhaexport.core.errors import MhaExportError
from mhaexport.runtime.runner import KVPairs, pairs_columns, pairs_put_row, pairs_row

# a call's past: the contract's numpy pairs, the index of an earlier call whose present it extends, a Derived one,
# or None (empty)
Past = Any

EMPTY, PRESENT, COLUMNS, ROW, PUT_ROW = "empty", "present", "columns", "row", "put_row"


@dataclass(frozen=True)
class Derived:
    """A past made from earlier calls' presents by the moves the decode loop makes on a contract cache (a
    continuous batch's rows, a rewind, a prefix put into a row): ``op`` over ``args`` — ``empty`` (batch,),
    ``present`` (call,), ``columns`` (src, start, stop), ``row`` (src, row, start, stop), ``put_row`` (src, row,
    values) — with
    its ``batch`` and ``length`` (positions). Layer by layer the same: :meth:`evaluate` applies the moves to any
    number of layers' pairs with the runners' own numpy moves (runtime/runner.py's ``pairs_*``), so a runner that
    runs a plan one layer at a time (runners/pieces.py) builds each layer's past as the decode loop built the whole.
    Frozen and compared by value: two recordings of a loop agree exactly when their moves do."""

    op: str
    args: tuple
    batch: int
    length: int

    @staticmethod
    def empty(batch: int) -> Derived:
        return Derived(EMPTY, (), batch, 0)

    @staticmethod
    def present(call: int, batch: int, length: int) -> Derived:
        return Derived(PRESENT, (call,), batch, length)

    def columns(self, start: int, stop: int) -> Derived:
        return Derived(COLUMNS, (self, start, stop), self.batch, len(range(self.length)[start:stop]))

    def row(self, row: int, start: int, stop: int) -> Derived:
        if not 0 <= row < self.batch:
            raise ValueError(f"row {row} of a batch of {self.batch}")
        return Derived(ROW, (self, row, start, stop), 1, len(range(self.length)[start:stop]))

    def put_row(self, row: int, values: Derived) -> Derived:
        if not 0 <= row < self.batch or values.batch != 1:
            raise ValueError(f"a batch of {values.batch} into row {row} of a batch of {self.batch}")
        return Derived(PUT_ROW, (self, row, values), self.batch, max(self.length, values.length))

    def sources(self) -> list[int]:
        """The calls whose presents it reads (in order, each once)."""
        if self.op == PRESENT:
            return [self.args[0]]
        out: list[int] = []
        for a in self.args:
            if isinstance(a, Derived):
                out += [s for s in a.sources() if s not in out]
        return out

    def evaluate(self, present: Callable[[int], KVPairs], empty: Callable[[int], KVPairs]) -> KVPairs:
        """The pairs it stands for: ``present(call)`` gives a source's pairs (one layer or all), ``empty(batch)``
        an empty cache's."""
        if self.op == EMPTY:
            return empty(self.batch)
        if self.op == PRESENT:
            return present(self.args[0])
        src = self.args[0].evaluate(present, empty)
        if self.op == COLUMNS:
            return pairs_columns(src, *self.args[1:])
        if self.op == ROW:
            return pairs_row(src, *self.args[1:])
        return pairs_put_row(src, self.args[1], self.args[2].evaluate(present, empty))


@dataclass
class Call:
    """One contract call of a plan: (B, T) ``ids``, the (B, past + T) ``mask``, its ``past`` (the contract's numpy
    pairs, an earlier call's index, or None), whether its present is returned (``keep``; else only its logits), and
    whether in turn it is the decode loop's step in the runner's own cache (``loop``: a chain's calls) or one
    contract call (``runner.run``) — the same computation, which a runner whose cache is a shared buffer drives
    differently (a call extending another is always a step); ``rows``: the positions whose logits are returned (a
    long prefill whose few rows a check reads holds only those until the plan ends)."""

    ids: np.ndarray
    mask: np.ndarray
    past: Past = None
    keep: bool = False
    loop: bool = False
    rows: Any = None  # the logits' positions returned (an index of axis 1: a slice, a list), None: all of them


@dataclass
class Result:
    """What a call gave: its (B, T, V) logits and, kept, its present (numpy pairs), or the error it raised."""

    logits: np.ndarray | None = None
    present: KVPairs | None = None
    error: MhaExportError | None = None
    seconds: float = 0.0

    def outputs(self) -> tuple[np.ndarray, KVPairs]:
        """(logits, present) as a contract call returns them, or the call's error raised."""
        if self.error is not None:
            raise self.error
        return self.logits, self.present


def selected(logits: np.ndarray, rows: Any) -> np.ndarray:
    """A call's (B, T, V) logits at ``rows`` of axis 1 (a copy: the whole is not held), or all of them."""
    return logits if rows is None else np.ascontiguousarray(logits[:, rows])


def past_length(calls: list[Call], i: int) -> int:
    """The past length of call ``i`` (the mask's width less its tokens)."""
    c = calls[i]
    return c.mask.shape[1] - c.ids.shape[1]


def empty_pairs(contract: Any, dtype: Any, batch: int, layers: int) -> KVPairs:
    """An empty contract cache (past length 0) of ``batch`` rows over ``layers`` layers: a derived past's start."""
    z = np.zeros((batch, contract.n_kv_heads, 0, contract.head_dim), dtype)
    return ((z, z),) * layers


def sources(call: Call) -> list[int]:
    """The earlier calls whose presents ``call``'s past reads."""
    if isinstance(call.past, Derived):
        return call.past.sources()
    return [call.past] if isinstance(call.past, int) else []


def consumers(calls: list[Call]) -> dict[int, int]:
    """{call index: how many later calls read its present}."""
    out: dict[int, int] = {}
    for c in calls:
        for s in sources(c):
            out[s] = out.get(s, 0) + 1
    return out


def check_plan(calls: list[Call]) -> None:
    """ValueError unless every extended call names an earlier call whose mask its own mask extends, and every
    derived past reads earlier calls, is as long as the call's past and holds its batch."""
    for i, c in enumerate(calls):
        if isinstance(c.past, Derived):
            bad = [s for s in c.past.sources() if not 0 <= s < i]
            if bad:
                raise ValueError(f"call {i}'s past reads call {bad[0]}, which is not an earlier call")
            if (c.past.length, c.past.batch) != (past_length(calls, i), c.ids.shape[0]):
                raise ValueError(f"call {i}'s past ({c.past.batch} rows, {c.past.length} positions) is not its "
                                 f"batch's ({c.ids.shape[0]} rows, {past_length(calls, i)} positions)")
            if not _lengths_ok(c.past, calls):
                raise ValueError(f"call {i}'s past reads an earlier call's present at a length or batch it does "
                                 f"not have")
        elif isinstance(c.past, int):
            if not 0 <= c.past < i:
                raise ValueError(f"call {i} extends call {c.past}, which is not an earlier call")
            if past_length(calls, i) != calls[c.past].mask.shape[1]:
                raise ValueError(f"call {i}'s past ({past_length(calls, i)}) is not call {c.past}'s length "
                                 f"({calls[c.past].mask.shape[1]})")


def _lengths_ok(d: Derived, calls: list[Call]) -> bool:
    """Every ``present`` leaf of ``d`` has its call's present length and batch."""
    if d.op == PRESENT:
        c = calls[d.args[0]]
        return (d.length, d.batch) == (c.mask.shape[1], c.ids.shape[0])
    return all(_lengths_ok(a, calls) for a in d.args if isinstance(a, Derived))


__all__ = ["Call", "Derived", "Past", "Result", "check_plan", "consumers", "empty_pairs", "past_length", "selected",
           "sources"]
