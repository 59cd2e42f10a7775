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


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
