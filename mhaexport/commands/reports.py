"""``mhaexport lint`` and ``mhaexport report merge``: parse, call the API, print."""

from __future__ import annotations

import os
from pathlib import Path

import click

from mhaexport.commands.options import _regular_file
from mhaexport.commands.output import _show, _wrote
from mhaexport.core.errors import ConfigError, raise_for_verdict


def _lint_path(ctx: click.Context, param: click.Parameter, value):
    """lint's PATH (a FILE.onnx or an export folder): one line when it is not there, then the regular-file check."""
    try:
        if value is not None:
            os.lstat(value)
    except FileNotFoundError:
        raise ConfigError(f"{value}: no such file or folder (an ONNX file FILE.onnx or an export folder)") from None
    except OSError as e:
        raise ConfigError(f"{value}: {e.strerror or e}") from None
    return _regular_file(ctx, param, value)


@click.command("lint")
@click.argument("path", type=click.Path(), callback=_lint_path)
@click.option("--json", "as_json", is_flag=True, help="Print the findings as one JSON object.")
def lint_cmd(path, as_json) -> None:
    """Static findings on a decoder's ONNX graph (a FILE.onnx, ours or another tool's, or an export DIR), each with
    its severity, node and a one-line fix. Exit 1 when a finding is an error, 0 otherwise."""
    from mhaexport.core.numbers import dumps

    from mhaexport import api

    report = api.lint(path)
    if as_json:
        click.echo(dumps(report.to_dict(), indent=2))
    else:
        _show(report.to_markdown("##"))
    raise_for_verdict(*api.lint_verdict(report))


@click.group("report")
def report_group() -> None:
    """Work with verify reports (report.json)."""


@report_group.command("merge")
@click.argument("reports", nargs=-1, required=True, type=click.Path(exists=True), callback=_regular_file)
@click.option("--name", "names", multiple=True, metavar="LABEL",
              help="A label per report (repeat, in order), e.g. cpu, gpu. Default: each report's host.")
@click.option("-o", "--output", type=click.Path(file_okay=False), required=True,
              help="Folder for the merged report.json, report.md and report.html.")
@click.option("--json", "as_json", is_flag=True, help="Print the merged report.json's content as one JSON object.")
def report_merge_cmd(reports, names, output, as_json=False) -> None:
    """Merge report.json files (or folders holding one) from different machines into one table.
    Exit 1 when any merged check failed."""
    from mhaexport import api
    from mhaexport.verify.render import markdown as render_markdown

    merged = api.merge_reports(reports, output, names=names)
    if as_json:
        from mhaexport.core.numbers import dumps

        click.echo(dumps(merged.to_dict()))
    else:
        _show(render_markdown(merged))
    for line in _wrote([Path(output) / f"report.{ext}" for ext in ("json", "md", "html")]):
        click.echo(line, err=True)
    v = merged.verdict  # the same rules as verify
    raise_for_verdict(v.code, f"merged reports: {v.message}")
