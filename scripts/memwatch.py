"""Run a command and report its memory: the peak of VmRSS, RssAnon and RssFile over the process and its children,
sampled from /proc every 50 ms (Linux), beside the kernel's own peak (ru_maxrss of the children, what
`/usr/bin/time -v` prints as "Maximum resident set size").

    python scripts/memwatch.py -- mhaexport quantize DIR -o OUT

RssAnon is the memory that cannot be given back under a cap (a cgroup reclaims file-backed pages: a memory map's,
the page cache); RssFile is the mapped files' pages the process touched. Printed as one JSON line on stderr, with the
wall time and the command's exit code (the script exits with it).
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time


def _status(pid: int) -> dict[str, int]:
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in ("VmRSS", "RssAnon", "RssFile"):
                    out[key] = int(value.split()[0]) * 1024
    except OSError:
        pass
    return out


def _tree(pid: int) -> list[int]:
    pids, todo = [], [pid]
    while todo:
        p = todo.pop()
        pids.append(p)
        try:
            with open(f"/proc/{p}/task/{p}/children") as f:
                todo += [int(c) for c in f.read().split()]
        except OSError:
            pass
    return pids


def main(argv: list[str]) -> int:
    if argv and argv[0] == "--":
        argv = argv[1:]
    started = time.perf_counter()
    proc = subprocess.Popen(argv)
    peak = {"VmRSS": 0, "RssAnon": 0, "RssFile": 0}
    while proc.poll() is None:
        total: dict[str, int] = {}
        for p in _tree(proc.pid):
            for k, v in _status(p).items():
                total[k] = total.get(k, 0) + v
        for k in peak:
            peak[k] = max(peak[k], total.get(k, 0))
        time.sleep(0.05)
    wall = time.perf_counter() - started
    maxrss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    print(json.dumps({"exit": proc.returncode, "wall_s": round(wall, 1), "ru_maxrss": maxrss,
                      **{f"peak_{k}": v for k, v in peak.items()}}), file=sys.stderr)
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
