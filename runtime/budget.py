"""Every ONNX Runtime call mhaexport makes has a deadline. Torch-free (onnxruntime and the standard library).

A file from elsewhere can ask ONNX Runtime for work without end — a ``Loop`` of 2**62 trips, a ``Range`` to 1e18 —
and a verb must say so, not hang. :func:`watch` gives a session (every session comes from
:func:`mhaexport.runtime.session.open_session`, which calls it) ``run`` / ``run_with_iobinding`` that pass a
:class:`onnxruntime.RunOptions` of its own; one daemon thread per process (the watchdog) sets that options'
``terminate`` when a call has run longer than the budget, ONNX Runtime stops at its next node (inside a loop's body
too) and the call raises :class:`~mhaexport.core.errors.OverBudget`: a runtime failing in its check (exit 1, the
check names the budget), or exit 2 where a verb has no verdict. onnxruntime-genai's loop is watched the same way
(:func:`watching`, its generator's ``terminate_session`` option).

The budget is per call, in seconds: :func:`limit` sets it for what runs inside it (the verbs' ``--timeout``; their
default from the plan, :func:`default_seconds`); ``None`` outside any verb (the library's own callers, tests)
keeps the process default, :data:`DEFAULT_SECONDS`. A call's cost is a handful of attribute writes (no thread per
call, no lock on the fast path): bench's decode steps of a quarter of a millisecond keep their time.
"""

from __future__ import annotations

import contextlib
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any

from mhaexport.core.errors import OverBudget

# a call that runs longer than this is stopped when no verb set a budget (the largest verify sweep case on a 1.5B
# model on 2 CPU cores takes seconds; a file that needs more than ten minutes for one call is refused)
DEFAULT_SECONDS = 600.0
# how often the watchdog looks (a call stopped at most this late)
TICK_S = 0.1

_budget: list[float | None] = [DEFAULT_SECONDS]
_given: list[bool] = [False]  # whether the user set the budget (the verbs' --timeout): a plan's default then yields


def default_seconds(weight_bytes: int | None = None) -> float:
    """The budget a verb gives one call when the user gives none: :data:`DEFAULT_SECONDS`, plus a minute per GB of
    weights a call reads (a long prefill of a large model on a slow machine)."""
    return DEFAULT_SECONDS + 60.0 * max(0, weight_bytes or 0) / 1e9


def seconds() -> float | None:
    """The budget of a call made now (None: no limit)."""
    return _budget[0]


def set_budget(budget: float | None, given: bool = True) -> None:
    """Set the budget of the calls made from now on (``given``: the user's, which :func:`plan` leaves alone)."""
    _budget[0], _given[0] = budget, given


def state() -> tuple[float | None, bool]:
    """(budget, given): to restore with ``set_budget(*saved)``."""
    return _budget[0], _given[0]


def plan(weight_bytes: int | None) -> float | None:
    """The budget from a verb's plan (:func:`default_seconds` of the weights a call reads) unless the user gave one;
    returns the budget in force."""
    if not _given[0]:
        _budget[0] = default_seconds(weight_bytes)
    return _budget[0]


@contextlib.contextmanager
def limit(budget: float | None) -> Iterator[None]:
    """Calls made inside run with at most ``budget`` seconds each (None: no limit; the verbs' ``--timeout 0``)."""
    saved = _budget[0]
    _budget[0] = budget
    try:
        yield
    finally:
        _budget[0] = saved


class _Watch:
    """One watched thing: its start time while a call runs, and how to stop it."""

    __slots__ = ("started", "budget", "stop", "tripped", "over", "__weakref__")

    def __init__(self, stop: Callable[[], None]) -> None:
        self.started: float | None = None
        self.budget: float | None = None
        self.stop = stop
        self.tripped = False
        self.over: OverBudget | None = None  # set once a call was stopped

    def begin(self) -> None:
        self.tripped = False
        self.budget = _budget[0]
        self.started = time.monotonic()
        _ensure_watchdog()

    def end(self) -> None:
        self.started = None


_watches: weakref.WeakSet[_Watch] = weakref.WeakSet()
_thread: list[threading.Thread | None] = [None]
_lock = threading.Lock()


def _watchdog() -> None:
    while True:
        time.sleep(TICK_S)
        now = time.monotonic()
        for w in list(_watches):
            started, budget = w.started, w.budget
            if started is not None and budget is not None and now - started > budget and not w.tripped:
                w.tripped = True
                try:
                    w.stop()
                except Exception:  # noqa: BLE001 - a session already gone
                    pass


def _ensure_watchdog() -> None:
    if _thread[0] is None:
        with _lock:
            if _thread[0] is None:
                t = threading.Thread(target=_watchdog, name="mhaexport-budget", daemon=True)
                t.start()
                _thread[0] = t


def _over(what: str, w: _Watch) -> OverBudget:
    return OverBudget(f"{what} ran past its budget of {w.budget:g} s a call and was stopped (a file that asks for "
                      "unbounded work, or a machine far slower than the budget allows: --timeout SECONDS sets it, "
                      "0 for none)", seconds=w.budget)


def watch(session: Any, what: str = "an ONNX Runtime call") -> Any:
    """``session`` (an InferenceSession) with its ``run`` and ``run_with_iobinding`` watched: each call gets this
    session's RunOptions unless it passes its own, and a call past the budget is terminated and raises
    :class:`OverBudget`, and so does every later call of the session at once (a file that ran past its budget once is
    not waited on again). Returns the session."""
    import onnxruntime as ort

    options = ort.RunOptions()
    options.log_severity_level = 4  # ONNX Runtime's log echoes node names raw: fatal only
    w = _Watch(lambda: setattr(options, "terminate", True))
    _watches.add(w)
    cls = type(session)
    # the wrappers live in the session's own __dict__: they reach it through a weak reference, never a strong one, so
    # no cycle keeps a closed session (gigabytes of weights) alive until the cyclic collector happens to run
    own = weakref.ref(session)

    def call(method: Callable, *args: Any, run_options: Any = None) -> Any:
        if w.over is not None:  # stopped once: every later call of this session is refused at once, not waited on
            raise w.over
        w.begin()
        try:
            return method(own(), *args, run_options if run_options is not None else options)
        except Exception as e:
            if w.tripped:
                w.over = _over(what, w)
                raise w.over from None
            raise e
        finally:
            w.end()

    session.run = lambda output_names, input_feed, run_options=None: call(cls.run, output_names, input_feed,
                                                                           run_options=run_options)
    session.run_with_iobinding = lambda io, run_options=None: call(cls.run_with_iobinding, io,
                                                                   run_options=run_options)
    session._mhaexport_watch = w  # the watch lives as long as the session
    return session


# past the budget, how long a call that cannot be stopped (it holds Python's lock) is given before the process ends
BACKSTOP_S = 5.0


@contextlib.contextmanager
def watching(stop: Callable[[], None], what: str) -> Iterator[None]:
    """One call of another runtime (onnxruntime-genai's ``append_tokens`` / ``generate_next_token``) under the budget:
    ``stop`` is called when it runs past it, and the call's exception becomes :class:`OverBudget`. onnxruntime-genai
    holds Python's lock while it runs, so no Python thread can call ``stop`` then: a backstop that needs no lock
    (``faulthandler``'s timer thread) ends the process :data:`BACKSTOP_S` after the budget, exit 1 with "Timeout" and
    the stack on stderr — never a hang."""
    import faulthandler
    import sys

    w = _Watch(stop)
    _watches.add(w)
    w.begin()
    backstop = w.budget is not None
    if backstop:
        try:
            faulthandler.dump_traceback_later(w.budget + BACKSTOP_S, exit=True, file=sys.__stderr__)
        except (ValueError, OSError, AttributeError):  # no stderr to write to: the timer still ends the process
            faulthandler.dump_traceback_later(w.budget + BACKSTOP_S, exit=True)
    try:
        yield
    except Exception:
        if w.tripped:
            raise _over(what, w) from None
        raise
    finally:
        if backstop:
            faulthandler.cancel_dump_traceback_later()
        w.end()
        _watches.discard(w)
