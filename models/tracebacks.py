"""Which of a model's modules raised: the innermost ``nn.Module`` method in an exception's traceback (and its
causes'). Loading (``--hf``) and the exporter's failure reports name it."""

from __future__ import annotations

import traceback
from collections.abc import Iterator
from pathlib import Path

from torch import nn


def exception_chain(e: BaseException | None) -> Iterator[BaseException]:
    """``e`` and its causes (or contexts), outermost first, each once."""
    seen: set[int] = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        yield e
        e = e.__cause__ or e.__context__


def failing_module(e: BaseException) -> str | None:
    """``LlamaMLP.forward (modeling_llama.py:165)``: the innermost ``nn.Module`` method in the tracebacks of ``e``
    and its causes (the frame whose ``self`` is a module), or None when no module's code raised."""
    found = None
    for exc in exception_chain(e):
        for frame, lineno in traceback.walk_tb(exc.__traceback__):
            owner = frame.f_locals.get("self")
            if isinstance(owner, nn.Module):
                found = (f"{type(owner).__name__}.{frame.f_code.co_name} "
                         f"({Path(frame.f_code.co_filename).name}:{lineno})")
    return found
