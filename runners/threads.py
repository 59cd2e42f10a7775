"""torch's intra-op thread count during a run, and verify's one-thread rule for small models.

verify, verify --module, eval and bench set it here (bench: ``--threads``; verify: one thread for small models).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

# Up to this many parameters torch runs verify's small batches on one intra-op thread: more threads gain nothing at
# these sizes and, on a busy machine, spinning threads made each call 10-50x slower (measured on 2 shared cores).
ONE_THREAD_MAX_PARAMS = 20_000_000


@contextlib.contextmanager
def torch_threads(n: int | None) -> Iterator[None]:
    """Run with torch's intra-op thread count set to n, restored afterwards; unchanged when n is None or torch is
    not installed (bench's ONNX Runtime rows run without it)."""
    if n is None:
        yield
        return
    try:
        import torch
    except ImportError:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)
