"""A plan's calls and what they give (runners/plan.py runs them; runners/blocks.py block by block): :class:`Call`,
:class:`Result`, and what a scheduler needs to know of a plan — which calls extend which (:func:`consumers`,
:func:`check_plan`), each call's past length."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from mhaexport.core.errors import MhaExportError
from mhaexport.runtime.runner import KVPairs

# a call's past: the contract's numpy pairs, the index of an earlier call whose present it extends, or None (empty)
Past = Any


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


def consumers(calls: list[Call]) -> dict[int, int]:
    """{call index: how many later calls extend its present}."""
    out: dict[int, int] = {}
    for c in calls:
        if isinstance(c.past, int):
            out[c.past] = out.get(c.past, 0) + 1
    return out


def check_plan(calls: list[Call]) -> None:
    """ValueError unless every extended call names an earlier call whose mask its own mask extends."""
    for i, c in enumerate(calls):
        if isinstance(c.past, int):
            if not 0 <= c.past < i:
                raise ValueError(f"call {i} extends call {c.past}, which is not an earlier call")
            if past_length(calls, i) != calls[c.past].mask.shape[1]:
                raise ValueError(f"call {i}'s past ({past_length(calls, i)}) is not call {c.past}'s length "
                                 f"({calls[c.past].mask.shape[1]})")


__all__ = ["Call", "Past", "Result", "check_plan", "consumers", "past_length", "selected"]
