"""How long the rest of a bench run takes, for its progress lines: every row's cost of one generation is measured
by its first warm-up generation, and what is left is each row's cost times the generations it has still to run — the
warm-ups counted at their cap, so the estimate is an upper bound that falls as rows settle early, and never rises
because a slow row was reached (every row's cost is known before the first estimate). The count of steps is fixed
when the run is planned: work that a row no longer needs (a row skipped, warm-ups left unused when a row settles)
counts as done, so ``[done/total]`` only moves forward and its total never jumps. Nothing here prints."""

from __future__ import annotations

import time
from collections.abc import Callable

from mhaexport.core.progress import Estimate


class Eta:
    """The generations a run plans per row (the warm-ups at their cap, the timed repeats, the long runs as
    ``long_factor`` generations' worth), what each costs once measured, and the progress line after each one."""

    def __init__(self, say: Callable[[str], None], clock: Callable[[], float] = time.perf_counter) -> None:
        self.say, self.clock, self.t0 = say, clock, clock()
        self.left: dict[str, float] = {}  # row label -> generations still to run (long runs in generations' worth)
        self.planned = 0.0  # generations planned in all: the progress lines' fixed total
        self.cost: dict[str, float] = {}  # row label -> seconds per generation (its first warm-up's)

    def plan(self, label: str, generations: float) -> None:
        self.left[label] = self.left.get(label, 0.0) + generations
        self.planned += generations

    def drop(self, label: str) -> None:
        """A row skipped: nothing more to run."""
        self.left.pop(label, None)

    def ran(self, label: str, seconds: float, generations: float = 1.0) -> None:
        """``label`` ran ``generations`` (worth) in ``seconds``; the first sets its cost."""
        self.cost.setdefault(label, seconds / max(generations, 1e-9))
        if label in self.left:
            self.left[label] = max(0.0, self.left[label] - generations)

    def settled(self, label: str, unused_warmups: int) -> None:
        """``label`` became steady with ``unused_warmups`` of its cap left: they are not run (counted as done)."""
        if label in self.left:
            self.left[label] = max(0.0, self.left[label] - unused_warmups)

    def seconds_left(self) -> float | None:
        """What is left, or None while a row with work left has not run once."""
        if any(n > 0 and label not in self.cost for label, n in self.left.items()):
            return None
        return sum(self.cost[label] * n for label, n in self.left.items() if n > 0)

    def tell(self, message: str) -> None:
        total = max(1, round(self.planned))
        done = round(self.planned - sum(n for n in self.left.values() if n > 0))
        self.say(Estimate(message, min(max(done, 0), total), total, self.clock() - self.t0, self.seconds_left()))
