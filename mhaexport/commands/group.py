"""The command group's errors as exit codes (1 failed, 2 bad input in one line, 3 a bug with its traceback, 4 not
verified, 130 interrupted) and the forgiving stdout / stderr: output nobody reads never changes an exit code."""

from __future__ import annotations

import errno
import os
import sys

import click

from mhaexport.commands import output  # output._stdout_is_tty, looked up per write
from mhaexport.core.errors import MhaExportError, NotVerified, VerificationFailed, first_line
from mhaexport.core.untrusted import shown, terminal_text


class BadInput(click.ClickException):
    """Exit 2 with one line: the message shown escaped (a name from a folder holds no line break nor escape that
    reaches the terminal)."""

    exit_code = 2

    def __init__(self, message: str) -> None:
        super().__init__(shown(message))


INTERNAL_ERROR = 3  # neither a verdict (0/1/4) nor bad input (2): a bug, reported with its traceback


INTERRUPTED = 130  # Ctrl-C, as a shell reports SIGINT (click's "Aborted!" would exit 1: "a check failed")


ORT_MISSING = ("ONNX Runtime is not installed: pip install -e '.[cpu]' (onnxruntime, CPU only) or -e '.[gpu]' "
               "(onnxruntime-gpu: CUDA and CPU) in the mhaexport checkout")


def _chain(e: BaseException | None):
    """``e`` and the exceptions it was raised from or while handling, each once."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        yield e
        e = e.__cause__ or e.__context__


def _os_error(e: BaseException, *errnos: int) -> OSError | None:
    return next((x for x in _chain(e) if isinstance(x, OSError) and x.errno in errnos), None)


def bad_path(e: BaseException) -> OSError | None:
    """The OSError "file name too long" or "too many levels of symbolic links" that ``e`` is or was raised from, else
    None: a path the user gave (or one made from it) that no file system takes: bad input, whichever verb met it."""
    return _os_error(e, errno.ENAMETOOLONG, errno.ELOOP)


def disk_full(e: BaseException) -> OSError | None:
    """The OSError "no space left on device" (or a quota exceeded) that ``e`` is or was raised from, else None."""
    return _os_error(e, errno.ENOSPC, errno.EDQUOT)


def interrupted(e: BaseException) -> bool:
    """Whether ``e`` is, or was raised while handling, a Ctrl-C (a library that wraps every exception of a call, as
    torch.onnx.export does, must not turn an interrupt into "export failed")."""
    return any(isinstance(x, (KeyboardInterrupt, click.exceptions.Abort)) for x in _chain(e))


def _isatty(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (OSError, ValueError, AttributeError):
        return False


class _Forgiving:
    """sys.stdout / sys.stderr for the CLI: output nobody reads (a closed pipe: ``verify … | head -1``, a closed
    descriptor: ``>&-``) is dropped instead of raising, so the verdict's exit code and the reports stand."""

    def __init__(self, stream, style=lambda: False) -> None:
        self._stream = stream
        self._style = style  # whether this stream is a terminal that takes mhaexport's own styles (asked per write)

    def _lost(self, e: OSError) -> None:
        if e.errno not in (errno.EPIPE, errno.EBADF, errno.EINVAL, errno.ECONNRESET):
            raise e
        try:  # the interpreter flushes the real stream at exit: point its descriptor at /dev/null
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self._stream.fileno())
            os.close(devnull)
        except (OSError, ValueError, AttributeError):
            pass
        self._stream = open(os.devnull, "w", encoding="utf-8")

    def write(self, text):
        if isinstance(text, (bytes, bytearray)):  # click probes for a binary stream with write(b"")
            raise TypeError("a text stream")
        text = terminal_text(text, self._style())  # the terminal sink: no control character but line breaks
        try:
            return self._stream.write(text)
        except OSError as e:
            self._lost(e)
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError as e:
            self._lost(e)

    def isatty(self) -> bool:
        try:
            return self._stream.isatty()
        except (OSError, ValueError):
            return False

    def __getattr__(self, name):
        return getattr(self._stream, name)


class Group(click.Group):
    """Turns the library's errors into the CLI's exit codes: VerificationFailed 1 (NotVerified 4), MhaExportError 2
    (its one line: the API's ConfigError family and the rest, in the CLI's words where the error carries them),
    Ctrl-C 130, and any other exception 3 with its traceback (CI must not mistake a crash for a failed check).
    A closed or broken stdout/stderr never changes the exit code (:class:`_Forgiving`)."""

    def main(self, *args, **kwargs):
        saved = sys.stdout, sys.stderr
        out, err = (s if s is not None else open(os.devnull, "w", encoding="utf-8") for s in saved)
        # on a terminal mhaexport's own styles stay (stdout asked as _show asks it: a terminal gets terminal text)
        sys.stdout, sys.stderr = _Forgiving(out, lambda: output._stdout_is_tty()), _Forgiving(err, lambda: _isatty(err))
        try:
            return super().main(*args, **kwargs)
        finally:
            try:
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                sys.stdout, sys.stderr = saved

    def invoke(self, ctx: click.Context):
        # --timeout sets the run budget for this command only (CliRunner runs many in one process); the module is
        # looked up, not imported: a refusal at parse time imports no runtime
        budget = sys.modules.get("mhaexport.runtime.budget")
        saved = budget.state() if budget is not None else None
        try:
            return self._invoke(ctx)
        finally:
            budget = sys.modules.get("mhaexport.runtime.budget")
            if budget is not None:
                budget.set_budget(*(saved or (budget.DEFAULT_SECONDS, False)))

    def _invoke(self, ctx: click.Context):
        from mhaexport.core.env import onnxruntime_clash

        if (clash := onnxruntime_clash()) is not None:  # a verb is about to run (--help/--version exited already)
            click.secho(f"warning: {clash}", fg="yellow", err=True)
        try:
            out = super().invoke(ctx)
            _say_linked()
            return out
        except VerificationFailed as e:
            _say_linked()
            label = "NOT VERIFIED" if isinstance(e, NotVerified) else "FAILED"
            click.echo(shown(f"{label}: {e}"), err=True)
            ctx.exit(e.exit_code)
        except (KeyboardInterrupt, click.exceptions.Abort):
            click.echo("interrupted", err=True)
            ctx.exit(INTERRUPTED)
        except MhaExportError as e:
            if interrupted(e):
                click.echo("interrupted", err=True)
                ctx.exit(INTERRUPTED)
            raise BadInput(e.cli or str(e)) from None  # the API's message, in the command line's words if it has them
        except (click.exceptions.ClickException, click.exceptions.Exit):
            raise
        except Exception as e:
            if interrupted(e):
                click.echo("interrupted", err=True)
                ctx.exit(INTERRUPTED)
            if isinstance(e, MemoryError):  # a size asked for that no machine holds (--batches 1,1e12): not a bug
                raise BadInput(f"out of memory ({first_line(e)}): the sizes asked for (batch, length, tokens, the "
                               "model's config) need more memory than this machine has; give smaller ones") from None
            if (bad := bad_path(e)) is not None:
                name = str(bad.filename or "a path")
                short = name if len(name) <= 80 else f"{name[:40]}…{name[-30:]} ({len(name)} characters)"
                raise BadInput(f"{short}: {bad.strerror}: give a shorter path (each name at most 255 bytes)"
                               if bad.errno == errno.ENAMETOOLONG else f"{short}: {bad.strerror}") \
                    from None
            if (full := disk_full(e)) is not None:  # not a bug: the machine's disk; the folder is as it was
                raise BadInput(f"no space left on the device{f' writing {full.filename}' if full.filename else ''}"
                               f" ({full.strerror}): free some space and run again; an export folder keeps "
                               "what it held before") from None
            if isinstance(e, ModuleNotFoundError) and e.name == "onnxruntime":  # installed without [cpu] / [gpu]
                raise BadInput(ORT_MISSING) from None
            if (refused := _library_refused(e)) is not None:
                raise refused from None
            import traceback

            traceback.print_exc()
            click.echo("internal error: this is a bug in mhaexport (exit code 3); please report it with the "
                       "traceback above", err=True)
            ctx.exit(INTERNAL_ERROR)
        except BaseException as e:  # a Rust library's panic (pyo3's PanicException) is no Exception
            if (refused := _library_refused(e)) is not None:
                raise refused from None
            raise


def _library_refused(e: BaseException) -> BadInput | None:
    """A third-party library's failure that reached the top (the places that know the file map it themselves,
    ``core.libraries.library_call``): exit 2 naming the library, never a traceback."""
    from mhaexport.core.libraries import library_of

    lib = next((lib for x in _chain(e) if (lib := library_of(x)) is not None), None)
    if lib is None:
        return None
    return BadInput(f"{lib} refused this command's input: {first_line(e)}: refused")


def _say_linked() -> None:
    """The files this command read in place instead of copying (artifact/folder.py's snapshot, when a copy would not
    fit), one note each, said even with --quiet."""
    folder = sys.modules.get("mhaexport.artifact.folder")
    for note in (folder.linked_notes() if folder is not None else []):
        click.secho(shown(f"note: {note}"), fg="yellow", err=True)
