"""The weight-bandwidth floor: how fast this machine reads memory, and how many bytes of weights a decode step reads.

A probe is any callable ``probe(threads) -> Bandwidth``; :func:`run_bench <mhaexport.bench.run.run_bench>` takes one
(``probe=``), so tests pass a fake returning fixed figures instead of reading 256 MiB each. The default,
:func:`measure_bandwidth`, reads arrays far larger than the caches three ways — a copy, a sum and a float32 gemv —
with torch on exactly ``threads`` intra-op threads (the runtimes' own count). The floor uses the fastest (a floor
must be a lower bound on time, so it takes the fastest read measured) and names the probe and thread count.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

PROBES = ("copy", "sum", "gemv")


@dataclass(frozen=True)
class Bandwidth:
    """Each probe's memory bandwidth (GB/s, median of repeats), the threads they read with, the array size and how
    they were measured ("torch", "numpy", or an injected probe's own name)."""

    gbps: dict[str, float]
    threads: int
    mbytes: int
    method: str

    @property
    def probe(self) -> str:
        """The probe that measured the fastest read: it sets the floor."""
        return max(self.gbps, key=lambda k: self.gbps[k])

    @property
    def read_gbps(self) -> float:
        """The fastest read measured (GB/s)."""
        return self.gbps[self.probe]

    def to_dict(self) -> dict[str, Any]:
        """bench.json's ``bandwidth``: each probe's GB/s, ``read`` (the fastest), and which probe, threads, size."""
        return {**self.gbps, "read": self.read_gbps, "probe": self.probe, "threads": self.threads,
                "mbytes": self.mbytes, "method": self.method}


Probe = Callable[[int], Bandwidth]


def _median_s(fn: Callable[[], object], repeats: int) -> float:
    fn()  # touch every page first
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure_bandwidth(threads: int, mbytes: int = 256, repeats: int = 7) -> Bandwidth:
    """Memory bandwidth on ``mbytes`` MiB of float32, with torch on ``threads`` intra-op threads (restored after):
    ``copy`` (STREAM convention: bytes read + bytes written, / time), ``sum`` and ``gemv`` (a (n / 4096, 4096)
    matrix times a vector; bytes read / time). Without torch, :func:`numpy_bandwidth`."""
    try:
        import torch
    except ImportError:
        return numpy_bandwidth(mbytes, repeats)
    from mhaexport.runners.threads import torch_threads

    n = mbytes * (1 << 20) // 4
    src = torch.ones(n)
    dst = torch.empty_like(src)
    mat = src.view(-1, 4096)  # (n / 4096, 4096)
    vec = torch.ones(4096)
    nbytes = src.element_size() * n
    with torch_threads(threads), torch.inference_mode():
        gbps = {"copy": 2 * nbytes / _median_s(lambda: dst.copy_(src), repeats) / 1e9,
                "sum": nbytes / _median_s(lambda: src.sum(), repeats) / 1e9,
                "gemv": nbytes / _median_s(lambda: torch.mv(mat, vec), repeats) / 1e9}
    return Bandwidth({k: round(v, 3) for k, v in gbps.items()}, threads, mbytes, "torch")


def numpy_bandwidth(mbytes: int = 256, repeats: int = 7) -> Bandwidth:
    """The fallback without torch: a numpy copy (read + write bytes) and a numpy sum, each on one thread (numpy's
    own loops; a BLAS gemv is left out because numpy cannot say how many threads its BLAS uses)."""
    import numpy as np

    src = np.ones(mbytes * (1 << 20) // 4, dtype=np.float32)
    dst = np.empty_like(src)
    gbps = {"copy": 2 * src.nbytes / _median_s(lambda: np.copyto(dst, src), repeats) / 1e9,
            "sum": src.nbytes / _median_s(lambda: src.sum(), repeats) / 1e9}
    return Bandwidth({k: round(v, 3) for k, v in gbps.items()}, 1, mbytes, "numpy")


def default_probe(threads: int) -> Bandwidth:
    """The probe run_bench uses unless given one: :func:`measure_bandwidth` on 256 MiB."""
    return measure_bandwidth(threads)


def weight_bytes_per_token(module: Any, batch: int = 1) -> int:
    """Bytes of parameters one decode step reads: every parameter once (shared ones once), except embedding
    tables that are only gathered (a position table, an untied token table), which cost ``batch`` rows."""
    from torch import nn

    linear_ptrs = {m.weight.data_ptr() for m in module.modules() if isinstance(m, nn.Linear)}
    gathered = {m.weight.data_ptr() for m in module.modules()
                if isinstance(m, nn.Embedding) and m.weight.data_ptr() not in linear_ptrs}
    total, seen = 0, set()
    for p in module.parameters():
        if p.data_ptr() in seen:
            continue
        seen.add(p.data_ptr())
        if p.data_ptr() in gathered:
            total += batch * p.shape[1] * p.element_size()
        else:
            total += p.numel() * p.element_size()
    return total
