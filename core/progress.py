"""Progress of long work, as library code reports it (it never prints): a message that may say how far along it is.

A :class:`Step` is a ``str`` (every ``progress`` callback that takes text keeps working) that also carries ``done``
and ``total``: the steps of the work finished before this one and how many there are in all, so whoever shows it
(the CLI: a line with the time elapsed and an estimate of what is left) can say where the work is. Torch-free.
"""

from __future__ import annotations

from collections.abc import Callable


class Step(str):
    """A progress message; ``done`` of ``total`` steps finished when it was said (None: not counted)."""

    done: int | None
    total: int | None

    def __new__(cls, message: str, done: int | None = None, total: int | None = None) -> Step:
        obj = super().__new__(cls, message)
        obj.done, obj.total = done, total
        return obj


class Estimate(Step):
    """A counted step whose sender knows better than the mean time per step: ``elapsed_s`` since the work began and
    ``left_s``, its own estimate of what is left (None: not known yet, shown as such). Bench sends these: its steps
    (one generation of one row) differ in cost by orders of magnitude, so a mean per step would rise and fall."""

    elapsed_s: float
    left_s: float | None

    def __new__(cls, message: str, done: int, total: int, elapsed_s: float, left_s: float | None) -> Estimate:
        obj = super().__new__(cls, message, done, total)
        obj.elapsed_s, obj.left_s = elapsed_s, left_s
        return obj


class Note(str):
    """A note on the input the user should see even where progress is not shown (the CLI's --quiet): a setting the
    model's config left out or capped, say. The Python API sends the loaded model's notes through ``progress`` so."""


class Stage(str):
    """One stage of a verb made of stages (``mhaexport.all``: load, export, quantize, verify): stage ``index`` of
    ``total``, said as it starts (the CLI prints it as ``[index/total] message``, bold)."""

    index: int
    total: int

    def __new__(cls, message: str, index: int, total: int) -> Stage:
        obj = super().__new__(cls, message)
        obj.index, obj.total = index, total
        return obj


Progress = Callable[[str], None]


def counted(say: Progress | None, total: int) -> Callable[[str], None]:
    """A function that says each message as the next of ``total`` counted steps (the first is step 0 done)."""
    box = [0]

    def step(message: str) -> None:
        if say is not None:
            say(Step(message, min(box[0], total), total))
        box[0] += 1

    return step
