"""``mhaexport`` run as a child process whose own memory is measured: the one way the tests read a command's peak.

The child writes its own high-water mark (``VmHWM``: of the address space ``exec`` made) however it exits — not
``ru_maxrss``, which Linux carries over from a forked child's parent (a child of a 9 GB pytest process would read
9 GB) — and, sampled every 50 ms from ``/proc/self/status`` in a thread of the child, the peak of ``RssAnon``: the
memory a cgroup cannot reclaim (a memory map's file pages and the page cache it can).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

_MEASURED = """\
import runpy, sys, threading, time, json
out_file = sys.argv.pop(1)
sys.argv[0] = 'mhaexport'
peak = {'RssAnon': 0}
def field(name):
    for ln in open('/proc/self/status'):
        if ln.startswith(name + ':'):
            return int(ln.split()[1]) * 1024
    return 0
def watch():
    while True:
        peak['RssAnon'] = max(peak['RssAnon'], field('RssAnon'))
        time.sleep(0.05)
threading.Thread(target=watch, daemon=True).start()
try:
    runpy.run_module('mhaexport', run_name='__main__', alter_sys=True)
finally:
    peak['RssAnon'] = max(peak['RssAnon'], field('RssAnon'))
    open(out_file, 'w').write(json.dumps({'VmHWM': field('VmHWM'), 'RssAnon': peak['RssAnon']}))
"""


@dataclass
class Measured:
    """A child's exit status, output (stdout and stderr), peak resident set and peak anonymous memory (bytes)."""

    returncode: int
    output: str
    peak: int
    anon: int


def run_measured(args: list[str], *, timeout: float | None = None, env: dict | None = None,
                 cwd: str | Path | None = None) -> Measured:
    """``python -m mhaexport ARGS`` in a fresh Python (in ``cwd``; ``env``: its whole environment, default this
    process's), OMP threads 2 unless the environment says; its :class:`Measured`."""
    import json

    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "measured.json"
        proc = subprocess.run([sys.executable, "-c", _MEASURED, str(out), *map(str, args)], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, timeout=timeout, cwd=cwd,
                              env={"OMP_NUM_THREADS": "2", **(os.environ if env is None else env)})
        got = json.loads(out.read_text()) if out.is_file() else {"VmHWM": 0, "RssAnon": 0}
        return Measured(proc.returncode, proc.stdout, got["VmHWM"], got["RssAnon"])
