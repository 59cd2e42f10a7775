"""Guess, plan, confirm: a free-running loop's calls run as one plan (block by block) without changing what it
computes.

A loop whose next call depends on the runtime's last outputs (a serving check's continuous batch, speculative
rounds, a reused prefix) cannot be written down before it runs — unless those outputs are guessed. Three steps:

1. *Guess*: the loop runs over a :class:`Tape`, a runner that answers each call with a guess — eager's logits of the
   same call, recorded while eager ran the same loop (:class:`Recorder`) — and keeps each cache as the moves that made
   it (:class:`~mhaexport.runners.calls.Derived`: an earlier call's present, its columns, a row, a row put in), so
   the loop writes down every call it would make were the runtime's outputs the guessed ones.
2. *Plan*: those calls run as one plan on the runtime (runners/plan.py: block by block where it can, each layer's
   past moved as the loop moved the cache; each layer's weights read once for the loop instead of once per call).
3. *Confirm*: the loop runs again over a Tape that answers each call with the runtime's own outputs of the planned
   call, and checks that the loop asks for exactly the call planned — the same ids, mask and past moves. Where every
   call is the planned one, every output the loop saw is the runtime's own output of the call the loop made: what it
   would have computed call by call (in pieces, to float32 rounding: runners/pieces.py).

A guess that was wrong (the runtime chose another token than eager: a divergence, a near-tie), a call that failed,
more calls than guesses: :class:`Untaped`, and the caller runs the loop on the runtime itself. A wrong guess costs
time, never a result. Only a runner whose cache moves are the contract's numpy moves (runtime/runner.py's
``pairs_*``, which a derived past replays) is taped (:func:`tape_unsupported`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from mhaexport.runners.calls import Call, Derived
from mhaexport.runtime.runner import Runner

# a Recorder stops keeping guesses past this many bytes of logits (the tape then runs out of guesses: Untaped)
GUESS_BUDGET = 1 << 30
_MOVES = ("cache_columns", "cache_row", "cache_put_row", "cache_fork", "cache_checkpoint", "cache_restore", "stepper")


class Untaped(Exception):
    """The loop over a tape left the plan (a call not planned, no guess left, a move a tape does not make): run it
    on the runtime instead."""


def tape_unsupported(runner: Runner) -> str | None:
    """Why a loop over ``runner`` cannot be taped, or None: a tape replays the contract's numpy cache moves, so the
    runner's moves must be those (a shared buffer's are its own)."""
    own = [m for m in _MOVES if getattr(type(runner), m, None) is not getattr(Runner, m)]
    return f"its cache moves are its own ({', '.join(own)})" if own else None


class Tape(Runner):
    """A runner standing in for ``like`` (its name, contract, dtype, limits and checks) whose calls are written down,
    not run: each is answered with ``answers[k]`` (the k-th call's (B, T, V) logits) and its present is the call
    itself (:meth:`Derived.present`). ``expected``: the calls a first tape wrote down — each call must be that one
    (else :class:`Untaped`). ``calls``: the calls made."""

    def __init__(self, like: Runner, answers: Sequence[np.ndarray], expected: list[Call] | None = None) -> None:
        super().__init__(like.name, like.contract, dtype=like.dtype, fixed=like.fixed)
        self.like = like
        self.protocol = getattr(like, "protocol", None)
        self.providers = list(like.providers)
        self.answers = answers
        self.expected = expected
        self.calls: list[Call] = []
        self.is_active = True

    @property
    def max_length(self) -> int:
        return self.like.max_length

    def limit_text(self) -> str:
        return self.like.limit_text()

    def check_ids_mask(self, input_ids: Any, attention_mask: Any, past_len: int | None = None):
        return self.like.check_ids_mask(input_ids, attention_mask, past_len)

    def activate(self) -> Tape:
        return self

    def deactivate(self) -> None:
        pass

    def run(self, *inputs: Any) -> Any:
        raise Untaped("a contract call outside the decode loop")

    def empty_cache(self, batch: int, positions: int | None = None) -> Derived:
        return Derived.empty(batch)

    def step(self, input_ids: np.ndarray, attention_mask: np.ndarray, cache: Any) -> tuple[np.ndarray, Derived]:
        if not isinstance(cache, Derived):
            raise Untaped("a cache the tape did not make")
        ids = np.ascontiguousarray(input_ids, dtype=np.int64)
        mask = np.ascontiguousarray(attention_mask, dtype=np.int64)
        B, T = ids.shape
        if (cache.batch, cache.length) != (B, mask.shape[1] - T):
            raise Untaped(f"a past of {cache.batch} x {cache.length} for a call of {B} x {T} with a mask of "
                          f"{mask.shape[1]}")
        if not cache.sources() and cache.length:
            raise Untaped("a past that no call made")
        call = Call(ids, mask, cache if cache.sources() else None, loop=True)
        k = len(self.calls)
        if self.expected is not None and (k >= len(self.expected) or not same_call(call, self.expected[k])):
            raise Untaped(f"the loop's call {k} is not the one planned")
        if k >= len(self.answers):
            raise Untaped(f"no answer for call {k}")
        logits = self.answers[k]
        if logits is None or tuple(logits.shape[:2]) != (B, T):
            raise Untaped(f"call {k}'s answer is not a ({B}, {T}, V) call's")
        self.calls.append(call)
        return logits, Derived.present(k, B, mask.shape[1])

    def stepper(self, cache: Any, attention_mask: np.ndarray, steps: int, capacity: int | None = None) -> None:
        return None

    def cache_numpy(self, cache: Any):
        raise Untaped("a cache read as numpy")

    def cache_from_numpy(self, past: Any):
        raise Untaped("a numpy cache given to the tape")

    def cache_columns(self, cache: Derived, start: int, stop: int) -> Derived:
        return cache.columns(start, stop)

    def cache_row(self, cache: Derived, row: int, start: int, stop: int) -> Derived:
        return cache.row(row, start, stop)

    def cache_put_row(self, cache: Derived, row: int, values: Derived) -> Derived:
        return cache.put_row(row, values)


def same_call(a: Call, b: Call) -> bool:
    """The same ids, mask and past (moves compared by value)."""
    return (a.ids.shape == b.ids.shape and a.mask.shape == b.mask.shape and np.array_equal(a.ids, b.ids)
            and np.array_equal(a.mask, b.mask) and a.past == b.past)


class Recorder:
    """``runner`` as the decode loop sees it, each step's logits kept (a later tape's guesses, in call order; on the
    runner's spilled pages where it has them, runtime/spill.py) while they fit :data:`GUESS_BUDGET` (``full`` once
    they do not). Everything else is the runner's own; its decode loop
    steps call by call (no stepper: the same calls, the same results)."""

    def __init__(self, runner: Runner, budget: int = GUESS_BUDGET) -> None:
        self._runner = runner
        self.logits: list[np.ndarray] = []
        self.budget = budget
        self.full = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._runner, name)

    def step(self, input_ids: np.ndarray, attention_mask: np.ndarray, cache: Any) -> tuple[np.ndarray, Any]:
        logits, cache = self._runner.step(input_ids, attention_mask, cache)
        if not self.full:
            self.budget -= logits.nbytes
            if self.budget < 0:
                self.full, self.logits = True, []
            else:  # a copy (a runner may reuse its buffer), on the runner's spilled pages where it has them
                spill = getattr(self._runner, "spill", None)
                kept = np.array(logits, copy=True)
                self.logits.append(spill.keep(kept) if spill is not None else kept)
        return logits, cache

    def stepper(self, cache: Any, attention_mask: np.ndarray, steps: int, capacity: int | None = None) -> None:
        return None


__all__ = ["GUESS_BUDGET", "Recorder", "Tape", "Untaped", "same_call", "tape_unsupported"]
