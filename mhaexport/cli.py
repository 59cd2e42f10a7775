"""The `mhaexport` command line: parse, call the library, print.

Exit codes: 0 passed, 1 verification failed, 2 bad usage or bad input (one line, no traceback), 3 a bug in
mhaexport (traceback printed), 4 not verified (a runtime asked for by name could not run here), 130 interrupted.

The group is here; each verb group's commands are in ``mhaexport/commands/`` (export, generate, bench, verify, job,
reports; group.py turns errors into exit codes, options.py and output.py hold what the verbs share).
"""

from __future__ import annotations

import sys

import click

from mhaexport.commands.bench import bench_cmd
from mhaexport.commands.export import onnx_cmd, pt2_cmd, quantize_cmd, torchscript_cmd
from mhaexport.commands.generate import eval_cmd, generate_cmd
from mhaexport.commands.group import Group
from mhaexport.commands.job import all_cmd
from mhaexport.commands.options import quiet_option
from mhaexport.commands.reports import lint_cmd, report_group
from mhaexport.commands.verify import verify_cmd
from mhaexport.core.version import __version__


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="mhaexport")
@quiet_option
def main() -> None:
    """Export a causal multi-head-attention decoder to ONNX and TorchScript with dynamic sequence axes,
    and prove the export against eager PyTorch."""


for _command in (onnx_cmd, torchscript_cmd, pt2_cmd, quantize_cmd, eval_cmd, generate_cmd, bench_cmd, verify_cmd,
                 all_cmd, lint_cmd, report_group):
    main.add_command(_command)


def run() -> None:
    """The console script (``mhaexport``, ``python -m mhaexport``): :func:`main`, then the process ends as soon as
    its exit handlers ran and its output is flushed — without the interpreter's teardown of torch's, transformers'
    and onnx's modules, which took 1.1 s of every command here (``python -c "import mhaexport.cli, torch,
    transformers, onnx, onnxscript; from transformers import LlamaForCausalLM"``: 4.86 s, 3.72 s ending so). Everything a command writes is closed by then (``with``); what runs at exit
    (``atexit``: snapshot folders removed, ``weakref.finalize``: temporary folders, ``logging``) still runs.
    ``main`` itself (CliRunner, the tests) returns as any click group does.

    The cyclic garbage collector's first generation runs every 10,000 allocations instead of Python's 700: importing
    torch, transformers and onnx allocates millions of objects that stay, and collecting them again and again took
    0.5 s of each command here (3.82 s against 3.35 s for those imports, medians of 3); what is freed by reference
    counting — every tensor not in a cycle — is freed as before."""
    import atexit
    import gc
    import os

    gc.set_threshold(10_000, *gc.get_threshold()[1:])
    try:
        main()
        code = 0
    except SystemExit as e:  # click's standalone mode ends here, always
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if e.code is not None and not isinstance(e.code, int):
            print(e.code, file=sys.stderr)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:  # None: the descriptor was closed (`>&-`)
                stream.flush()
        except (OSError, ValueError):  # a closed or broken pipe: the exit code stands
            pass
    os._exit(code)


if __name__ == "__main__":  # pragma: no cover
    run()
