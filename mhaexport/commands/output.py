"""What the command line prints: an export's record, progress lines (:class:`Reporter`), a report's Markdown (text
on a terminal), the "wrote ..." lines and the verdict's exit."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from mhaexport.commands.options import _state
from mhaexport.core.errors import raise_for_verdict
from mhaexport.core.untrusted import shown


def _size(path: Path) -> str:
    n = path.stat().st_size
    return f"{n / 1e6:.1f} MB" if n >= 1e5 else f"{n / 1e3:.1f} kB"


def _warn(rec) -> None:
    """An export's warnings, one line each; what is no fault of the model (torch.jit's deprecation, the tracer's
    note that a value was traced as a constant: verify's dynamic shapes run the file at other sizes) a plain note."""
    from mhaexport.exporter.common import is_note

    for w in rec.warnings:
        if is_note(w):
            click.echo(shown(f"note: {w}"), err=True)
        else:
            click.secho(shown(f"warning: {w}"), fg="yellow", err=True)


def _show_record(rec, as_json: bool = False) -> None:
    """An export's warnings, what it wrote (stdout; not with --json) and what a --replace replaced (stderr)."""
    _warn(rec)
    if not as_json:
        files = ", ".join(f"{rec.folder / f} ({_size(rec.folder / f)})" for f in rec.files)
        click.echo(f"wrote {files} and {rec.folder / 'manifest.json'} in {rec.seconds:.1f} s")
    _show_replaced(rec)


def _show_replaced(rec) -> None:
    r = getattr(rec, "replaced", None)
    if r is not None:
        click.echo(f"replaced {r.what} {r.spec} in {rec.folder}" + (f" (removed {', '.join(r.removed)})"
                                                                    if r.removed else ""), err=True)


def _print_json(command: str, records: list) -> None:
    """--json of an export verb: one object on stdout (:func:`mhaexport.exporter.records.export_json`)."""
    from mhaexport.core.numbers import dumps

    from mhaexport.exporter.records import export_json

    _progress_done()
    click.echo(dumps(export_json(command, records)))


class Reporter:
    """The CLI's progress lines (library code reports, never prints): each message on stderr; a counted step
    (:class:`mhaexport.core.progress.Step`) with where the work is — step k of n, the time since the phase began and an
    estimate of what is left (the mean time per finished step). On a terminal the counted steps of a phase share one
    line with a bar, rewritten in place; elsewhere (CI logs, pipes) each is a plain line. Silent with --quiet."""

    def __init__(self, quiet: bool | None = None, tty: bool | None = None, clock=None) -> None:
        import time

        ctx = click.get_current_context(silent=True)
        self.quiet = bool(ctx is not None and _state(ctx).quiet) if quiet is None else quiet
        self.tty = sys.stderr.isatty() if tty is None else tty
        self.clock = clock or time.monotonic
        self.t0, self.total, self.open_line = 0.0, None, False

    def line(self, msg: str) -> str:
        """The progress line of ``msg``: one line (a name the library's message holds is shown escaped)."""
        return shown(self._line(msg))

    def _line(self, msg: str) -> str:
        done, total = getattr(msg, "done", None), getattr(msg, "total", None)
        if not total:
            return str(msg)
        if done == 0 or total != self.total:  # a new phase: its own clock
            self.t0, self.total = self.clock(), total
        elapsed = self.clock() - self.t0
        left = f", ~{elapsed / done * (total - done):.0f} s left" if done else ""
        if hasattr(msg, "left_s"):  # a progress.Estimate: the sender's own clock and estimate
            elapsed = msg.elapsed_s
            left = ", estimating what is left" if msg.left_s is None else f", ~{msg.left_s:.0f} s left"
        where = f"[{min(done + 1, total)}/{total}]"
        if self.tty:
            filled = int(20 * done / total)
            where = f"[{'#' * filled}{'.' * (20 - filled)}] {min(done + 1, total)}/{total}"
        return f"{where} {msg} ({elapsed:.0f} s{left})"

    def __call__(self, msg: str) -> None:
        from mhaexport.core.progress import Note

        if isinstance(msg, Note):  # a note on the input: said even with --quiet
            self.close()
            click.secho(shown(f"note: {msg}"), fg="yellow", err=True)
            return
        if self.quiet:
            return
        text = self.line(msg)
        if self.tty and getattr(msg, "total", None):
            click.echo("\r\033[K  " + text, nl=False, err=True)
            self.open_line = True
            return
        self.close()
        click.echo(f"  {text}", err=True)

    def close(self) -> None:
        if self.open_line:
            click.echo(err=True)
            self.open_line = False


def _progress_done() -> None:
    """End the progress line being rewritten in place (if any), so what is printed next starts on its own line."""
    reporter = _state().reporter
    if reporter is not None:
        reporter.close()


def _progress(msg: str) -> None:
    """One progress message through the current command's Reporter (made on first use)."""
    ctx = click.get_current_context()
    state = _state(ctx)
    reporter = state.reporter
    if reporter is None:
        reporter = state.reporter = Reporter()
        ctx.call_on_close(reporter.close)
    reporter(msg)


def _show(markdown: str) -> None:
    """A report's Markdown on stdout: on a terminal as terminal text (aligned tables, no ``**`` / ``|`` /
    ``<sub>``; bold unless NO_COLOR), elsewhere (a pipe, a CI log, a file) the Markdown itself, as report.md has
    it. Scripts take --json."""
    if _stdout_is_tty():
        from mhaexport.terminal import to_terminal, wants_style

        import shutil

        click.echo(to_terminal(markdown, style=wants_style(True), columns=shutil.get_terminal_size().columns))
    else:
        click.echo(markdown)


def _stdout_is_tty() -> bool:
    try:
        return sys.stdout.isatty()
    except (ValueError, AttributeError):  # closed or replaced stdout
        return False


def render_markdown(report) -> str:
    """report.md's text (verify/render.py), imported when a report is there to render."""
    from mhaexport.verify.render import markdown

    return markdown(report)


def _finish(report, markdown: str, written: list[str]):
    """Print a verify report written already (the table, or --json's object; the "wrote" lines) and exit with its
    verdict (:func:`mhaexport.core.errors.raise_for_verdict`: 1 failed, 2 refused, 4 not verified)."""
    if _state().json:
        from mhaexport.core.numbers import dumps

        click.echo(dumps(report.to_dict()))
    else:
        _show(markdown)
    for line in written:
        click.echo(line, err=True)
    v = report.verdict
    raise_for_verdict(v.code, v.message)
    click.echo(shown(f"verify passed in {report.seconds:.1f} s: {v.message}"), err=True)
    return report


def _wrote(paths: list[Path]) -> list[str]:
    """The "wrote ..." lines of :func:`mhaexport.api.write_reports`' paths: a report's .json, .md and .html on one
    line, the page to open named; a run of named runtimes says which full report it left as it was."""
    paths = list(paths)
    lines = []
    if len(paths) >= 3 and [p.suffix for p in paths[:3]] == [".json", ".md", ".html"]:
        json_, md, page = paths[:3]
        lines.append(f"wrote {json_}, {md} and {page} (open {page.name} in a browser: the checks, plots and "
                     "details)")
        full = md.with_name("report.md")
        if md.name != "report.md" and full.is_file():
            lines.append(f"  ({md.name}: a run of named runtimes; {full.name} beside it is an earlier full run's, "
                         "left as it was)")
        paths = paths[3:]
    return lines + [f"wrote {p}" for p in paths]
