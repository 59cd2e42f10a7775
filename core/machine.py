"""How much memory this process may use: the cgroup's limit or MemAvailable, the smaller (stdlib only: any layer may
ask — verify's memory plan, generate's choice to map a file's weights)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

# Python + torch + onnxruntime + mhaexport's verify imported and running a tiny model: RSS 0.26 GB after the imports
# (RssAnon 0.17 GB) on this project's CPU machine, ~0.35 GB once both runtimes ran (allocator arenas, ORT's thread
# pools, lint's graph): docs/measurements/verify-memory-2026-12-04.md. What a process holds beside the weights it runs
# (verify's memory plan, a generator's choice to map a file's weights).
BASELINE_BYTES = 400 * 2**20


def _cgroup_limit(proc_cgroup: str = "/proc/self/cgroup", root: str = "/sys/fs/cgroup") -> int | None:
    """This process's cgroup memory limit (v2: the smallest ``memory.max`` from its group up; v1: the memory
    controller's ``hierarchical_memory_limit``), or None where there is none or it cannot be read."""
    try:
        lines = Path(proc_cgroup).read_text().splitlines()
    except OSError:
        return None
    limits: list[int] = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        path = path.lstrip("/")
        if controllers == "" and Path(root, "cgroup.controllers").exists():  # v2, unified
            here = Path(root, path)
            while True:
                try:
                    value = (here / "memory.max").read_text().strip()
                    if value != "max":
                        limits.append(int(value))
                except (OSError, ValueError):
                    pass
                if here == Path(root):
                    break
                here = here.parent
        elif "memory" in controllers.split(","):  # v1
            for base in (Path(root, "memory", path), Path(root, "memory")):
                try:
                    stat = (base / "memory.stat").read_text()
                except OSError:
                    continue
                if m := re.search(r"^hierarchical_memory_limit (\d+)$", stat, re.MULTILINE):
                    limits.append(int(m.group(1)))
                break
    limits = [n for n in limits if n < 2**60]  # v1 says "no limit" with a huge number
    return min(limits) if limits else None


def _mem_available(meminfo: str = "/proc/meminfo") -> int | None:
    try:
        m = re.search(r"^MemAvailable:\s+(\d+) kB", Path(meminfo).read_text(), re.MULTILINE)
    except OSError:
        return None
    return int(m.group(1)) * 1024 if m else None


def machine_memory() -> tuple[int | None, str]:
    """(bytes, where from) of the memory this process may use: the cgroup's limit or MemAvailable, the smaller;
    (None, why) where neither can be read (not Linux)."""
    found = [(n, what) for n, what in ((_cgroup_limit(), "the cgroup's memory limit"),
                                       (_mem_available(), "MemAvailable")) if n is not None]
    if not found:
        return None, f"no cgroup limit nor MemAvailable readable on {sys.platform}"
    return min(found)
