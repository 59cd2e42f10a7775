"""How far each check reaches against the model's sliding windows (issue 37).

Every validator's default inputs are shorter than the window (Optimum: 16 tokens; Olive: 8), so a dropped or
shifted window passes them. Verify's checks run beyond every layer's window by default (:func:`span`), each result
says the longest position it checked and the windows it crossed (:func:`crossing`), and a check that stayed inside
the longest window is never "passed": its True becomes None ("not proved") with the reason. A query at position p
sees p-W+1..p, so a window first drops a key at position W.
"""

from __future__ import annotations

from mhaexport.core.iospec import ModelContract
from mhaexport.verify.results import CheckResult

BEYOND = 4  # positions past the longest window a check reaches by default (W-1, W, W+1 and past them)


def span(contract: ModelContract, base: int, room: int = 0) -> int:
    """A check's sequence length: ``base``, or for a windowed model long enough to reach BEYOND positions past the
    longest window, within max_positions less ``room`` (positions the check adds after it)."""
    if not contract.windowed:
        return base
    return max(1, min(max(base, max(contract.windows) + BEYOND), contract.max_positions - room))


def deploy_steps(contract: ModelContract, window_slots, prompt: int, base: int) -> int:
    """The deploy loop's decode steps after a ``prompt``-token prefill: ``base``, or over a window cache (per layer
    ``window_slots``, 0: full) enough to pass its largest window-sized buffer by BEYOND positions, so its in-place
    eviction runs (GroupQueryAttention evicts once a row's length passes the buffer's slots), within max_positions."""
    slots = max(window_slots or (0,))
    if not slots:
        return base
    return max(base, min(slots + BEYOND - prompt, contract.max_positions - prompt - 1))


def crossing(result: CheckResult, contract: ModelContract, longest: int | None) -> CheckResult:
    """``result`` with the longest position it checked (``longest``, 0-based) against the model's windows: the
    figures ``longest_position`` and ``windows_crossed``; a pass that crossed no window of the longest size is
    turned into None with its reason. Unchanged for a model without windows or a result that did not pass."""
    if not contract.windowed or longest is None:
        return result
    windows = sorted({w for w in contract.windows if w})
    crossed = [w for w in windows if longest >= w]
    result.figures.set(longest_position=longest, windows_crossed=crossed)
    if result.status is True:
        if len(crossed) < len(windows):
            result.status = None
            result.message = (f"not proved: checked only to position {longest}, inside the sliding window of "
                              f"{max(windows)} (a dropped or shifted window shows from position {max(windows)} on); "
                              f"{result.message}")
        else:
            result.message += f"; to position {longest}, beyond window{'s' if len(windows) > 1 else ''} " \
                              f"{', '.join(map(str, windows))}"
    return result
