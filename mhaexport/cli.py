"""The `mhaexport` command line: parse, call the library, print.

Exit codes: 0 passed, 1 verification failed, 2 bad usage or bad input (one line, no traceback), 3 a bug in
mhaexport (traceback printed), 4 not verified (a runtime asked for by name could not run here), 130 interrupted.
"""

from __future__ import annotations

import dataclasses
import errno
import functools
import os
import sys
from pathlib import Path
from typing import Any

import click

from mhaexport.core.version import __version__
from mhaexport.core.errors import ConfigError, MhaExportError, NotVerified, VerificationFailed, first_line, raise_for_verdict
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
        sys.stdout, sys.stderr = _Forgiving(out, lambda: _stdout_is_tty()), _Forgiving(err, lambda: _isatty(err))
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
            return super().invoke(ctx)
        except VerificationFailed as e:
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


@dataclasses.dataclass
class CliState:
    """What the options that are no verb's parameter set (kept in ctx.meta, which the group and its verb share):
    --quiet, --json (verify's printing), --junit, --revision / --allow-download (model loading), and the verb's
    progress Reporter (made on first use)."""

    quiet: bool = False
    json: bool = False
    junit: str | None = None
    revision: str | None = None
    allow_download: bool = False
    reporter: Any = None


def _state(ctx: click.Context | None = None) -> CliState:
    """This command line's :class:`CliState`."""
    ctx = ctx or click.get_current_context()
    return ctx.meta.setdefault("mhaexport.state", CliState())


def _remember(ctx: click.Context, param: click.Parameter, value):
    """Keep an option that only model loading reads (--revision, --allow-download) and --junit in the command
    line's :class:`CliState`, so every command keeps its signature."""
    setattr(_state(ctx), param.name, value)
    return value


def _set_timeout(ctx: click.Context, param: click.Parameter, value: float | None):
    if value is not None:
        from mhaexport.runtime import budget

        budget.set_budget(None if value == 0 else float(value))
    return value


def timeout_option(f):
    """--timeout SECONDS: the budget of each ONNX Runtime / onnxruntime-genai call (runtime/budget.py)."""
    return click.option("--timeout", type=click.FloatRange(min=0, max=1e7), default=None, expose_value=False,
                        callback=_set_timeout, metavar="SECONDS",
                        help="Stop any one ONNX Runtime or onnxruntime-genai call that runs longer than this and report "
                             "it (a check failed, or exit 2): a file that asks for unbounded work never hangs the "
                             "command. Default: 600 s plus a minute per GB of weights; 0: no limit.")(f)


def model_options(f):
    """--config / --model / --checkpoint / --hf: which model a command works on."""

    @click.option("--config", "config", metavar="NAME|FILE.json", default=None, callback=_regular_file,
                  help="Built-in model: a preset (tiny, small, bench, llama, tiny-llama) or a JSON file of DecoderConfig fields. "
                       "Default: small.")
    @click.option("--model", "model", metavar="MODULE:FACTORY", default=None, callback=_regular_file,
                  help="User model: 'package.module:factory' or 'file.py:factory', a zero-argument callable "
                       "returning a module under the decoder contract. This imports and runs that code.")
    @click.option("--checkpoint", type=click.Path(dir_okay=False), default=None, callback=_regular_file,
                  help="State dict to load (torch.load weights_only=True: tensors only).")
    @click.option("--hf", "hf", metavar="DIR|ORG/NAME", type=click.Path(file_okay=False), default=None,
                  help="A Hugging Face causal LM: a save_pretrained folder, or a Hub model id read from the Hugging "
                       "Face cache (HF_HUB_CACHE / HF_HOME), wrapped under the decoder contract; needs the [hf] "
                       "extra (pip install -e '.[hf]'). Nothing is downloaded unless --allow-download.")
    @click.option("--revision", metavar="REV", default=None, expose_value=False, callback=_remember,
                  help="With --hf ORG/NAME: the branch, tag or commit (default: main).")
    @click.option("--allow-download", is_flag=True, default=False, expose_value=False, callback=_remember,
                  help="With --hf ORG/NAME: let huggingface_hub download what the cache lacks (not with "
                       "HF_HUB_OFFLINE=1).")
    @functools.wraps(f)
    def wrapper(*args, **kwargs):
        return f(*args, **kwargs)

    return wrapper


def module_options(f):
    """--module / --mask: export a module on its own (the article's attention block) instead of the decoder."""

    @click.option("--module", "module", type=click.Choice(["attention"]), default=None,
                  help="Export the built-in MultiHeadAttention block on its own (inputs x, past_key, past_value; "
                       "outputs output, present_key, present_value, attention_weights), with the weights of "
                       "--config's blocks.0.attn. Default: the whole decoder.")
    @click.option("--mask", type=click.Choice(["causal", "none"]), default=None,
                  help="With --module attention: causal (built at run time from the shapes; the default) or none "
                       "(bidirectional).")
    @functools.wraps(f)
    def wrapper(*args, **kwargs):
        return f(*args, **kwargs)

    return wrapper


def _typed(**given: str) -> dict[str, str | None]:
    """The options as typed on the command line, None where the default stands (a --target sets those)."""
    ctx = click.get_current_context()
    return {k: v if ctx.get_parameter_source(k) == click.core.ParameterSource.COMMANDLINE else None
            for k, v in given.items()}


def _model_args(config: str | None, model: str | None, checkpoint: str | None, hf: str | None) -> dict:
    """The model options as the API's keywords (--revision / --allow-download from the CliState)."""
    state = _state()
    return {"config": config, "model": model, "checkpoint": checkpoint, "hf": hf, "revision": state.revision,
            "allow_download": bool(state.allow_download)}


replace_option = click.option(
    "--replace", is_flag=True, default=False,
    help="The -o folder holds another model's export (or the attention block where a decoder goes, or the other way "
         "round): replace it; that model's files, genai_config.json, reports and bench results go. Without it such "
         "an export is refused (one folder, one model).")


def _regular_file(ctx: click.Context, param: click.Parameter, value):
    """A file the user names for reading (--text, --checkpoint, a --config/--model file) checked before anything
    opens it (:func:`mhaexport.api.check_input_file`: a FIFO or a device would hang the read in open())."""
    from mhaexport.api import check_input_file

    for v in (value if isinstance(value, tuple) else (value,)):
        if not v:
            continue
        path = v
        if param.name == "model" and ":" in v:  # file.py:factory (a module:callable names no file)
            path = v.rsplit(":", 1)[0]
        try:
            check_input_file(path, folder_ok=param.name not in ("checkpoint", "quality_text", "text_file"))
        except MhaExportError as e:
            raise click.BadParameter(str(e), param_hint=param.opts[0] if param.opts else param.name) from None
    return value


def _runtime_names(ctx, param, values: tuple[str, ...]) -> tuple[str, ...]:
    """``--runtime X --runtime Y`` and ``--runtime X,Y`` alike (bench's ``--runtimes X,Y`` too): the names in order,
    each once (the API checks them)."""
    return tuple(dict.fromkeys(n.strip() for v in values for n in v.split(",") if n.strip()))


def runtime_option(help_text: str, *aliases: str):
    """--runtime NAME, repeated or a comma list, on every verb that runs runtimes (``aliases``: bench's --runtimes)."""
    return click.option("--runtime", *aliases, "runtimes", multiple=True, metavar="NAME[,NAME..]",
                        callback=_runtime_names, help=help_text)


SEED = click.IntRange(0, 2**32 - 1)  # numpy's and torch's seeds alike: a negative one is bad input, not a crash


TEXT_MAX_BYTES = 1 << 20  # eval's --max-bytes default (mhaexport.api.TEXT_MAX_BYTES)


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


json_option = click.option("--json", "as_json", is_flag=True,
                           help="Print what was written as one JSON object on stdout (schema mhaexport.export/1: the "
                                "files with their bytes and sha256, seconds, details; docs/reference.md, \"Output for "
                                "scripts\"); progress, warnings and errors stay on stderr.")


def _set_quiet(ctx: click.Context, _param, value: bool) -> None:
    if value:
        _state(ctx).quiet = True


# --quiet on the group (`mhaexport -q verify ...`) or on a long verb (`mhaexport verify ... --quiet`)
quiet_option = click.option("--quiet", "-q", is_flag=True, expose_value=False, is_eager=True, callback=_set_quiet,
                            help="No progress lines (the report, the verdict and errors are still printed).")


trust_code_option = click.option(
    "--trust-code", "trust_code", is_flag=True, default=False,
    help="The folder is yours: run the code it holds — rebuild its eager model from a manifest source that is code "
         "(a factory file or module) and load its torch.export program (model.pt2, unpickled) and AOTInductor "
         "package (model.aoti.pt2, a native library), and let its genai_config.json's onnxruntime-genai options load a "
         "custom-op library, profile or name paths. Without it such a model source is refused (name the model "
         "with --model instead), pt2/aoti are skipped with the reason (refused when named) and such options are "
         "refused: nothing runs because a folder says so.")


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="mhaexport")
@quiet_option
def main() -> None:
    """Export a causal multi-head-attention decoder to ONNX and TorchScript with dynamic sequence axes,
    and prove the export against eager PyTorch."""


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


def lowering_options(f):
    """--opset / --attention / --dtype: how the ONNX graph is written (onnx, all, verify with model options)."""

    @click.option("--opset", type=click.IntRange(18, 23), default=None,
                  help="ONNX opset (18..23). Default: 18, or 23 with --attention onnx.")
    @click.option("--attention", type=click.Choice(["decomposed", "onnx", "ort", "fused"]), default="decomposed",
                  show_default=True,
                  help="How attention reaches the graph: MatMul/Softmax/Where as exported, the ONNX Attention op "
                       "(opset 23), ONNX Runtime's com.microsoft MultiHeadAttention, or `fused`: that attention "
                       "plus onnxscript's ort_fusions (skip/RMS norms, Gelu, RotaryEmbedding).")
    @click.option("--dtype", type=click.Choice(["float32", "float16", "bfloat16"]), default="float32",
                  show_default=True, help="Weights, KV cache and logits in this dtype.")
    @functools.wraps(f)
    def wrapper(*args, **kwargs):
        return f(*args, **kwargs)

    return wrapper


def _folder_exists(ctx, param, value: str | None) -> str | None:
    """An export FOLDER that is not there, refused while the command line is parsed: one line before any of the
    verb's imports (torch, onnx: seconds)."""
    if value is not None:
        try:
            os.lstat(value)
        except FileNotFoundError:
            raise ConfigError(f"export folder {value} does not exist") from None
        except OSError as e:  # a name no file system takes (ENAMETOOLONG), a path through a loop
            raise ConfigError(f"export folder {value}: {e.strerror or e}") from None
    return value


@main.command("onnx")
@quiet_option
@model_options
@module_options
@click.option("--seq-dynamic/--seq-static", default=True, show_default=True,
              help="Dynamic batch/sequence/past axes (the causal mask is computed in the graph), or fixed ones.")
@click.option("--seq-len", type=click.IntRange(min=1), default=None, help="With --seq-static: the fixed sequence length.")
@click.option("--past-len", type=click.IntRange(min=0), default=0, show_default=True,
              help="With --seq-static: the fixed past (KV cache) length.")
@lowering_options
@click.option("--kv-cache", "kv_cache", type=click.Choice(["concat", "shared", "window"]), default="concat",
              show_default=True,
              help="concat: present = concat(past, new), a new tensor each step; shared: past and present are one "
                   "preallocated buffer per layer, written in place by com.microsoft GroupQueryAttention "
                   "(onnxruntime-genai's past_present_share_buffer; prompts right-padded); window: the shared "
                   "buffer, its sliding-window layers window-sized (W + 16 slots; GroupQueryAttention evicts in "
                   "place: sliding_window_cache=1; genai_config's sliding_window).")
@click.option("--max-cache", "max_cache", type=click.IntRange(min=1), default=None,
              help="With --kv-cache shared: the buffer's length (default: max_positions).")
@click.option("--target", type=click.Choice(["portable", "ort-cpu", "ort-cuda"]), default=None,
              help="The runtime the file is for; it picks --attention, --kv-cache, --dtype and the weights: "
                   "portable (the default: decomposed, concat, float32, any ONNX runtime), ort-cpu (fused, shared, "
                   "int4 weights: ONNX Runtime / onnxruntime-genai on CPU; the float export it is quantized from "
                   "goes to OUTPUT-float32), ort-cuda (fused, shared, float16).")
@click.option("-o", "--output", type=click.Path(file_okay=False), default="artifacts/onnx", show_default=True,
              help="Export folder (model.onnx + manifest.json).")
@replace_option
@json_option
def onnx_cmd(config, model, checkpoint, hf, module, mask, seq_dynamic, seq_len, past_len, opset, attention, dtype,
             kv_cache, max_cache, output, replace=False, target=None, as_json=False) -> None:
    """Export to ONNX with torch.onnx's dynamo exporter (the decoder, or with --module attention the MHA block on
    its own)."""
    from mhaexport import api
    from mhaexport.artifact.details import Lowering, Precision

    options = {"attention": attention, "kv_cache": kv_cache, "dtype": dtype}
    records = api.export_onnx_target(output, target, **(_typed(**options) if target else options),
                                     **_model_args(config, model, checkpoint, hf), module=module, mask=mask,
                                     opset=opset, seq_dynamic=seq_dynamic, seq_len=seq_len, past_len=past_len,
                                     max_cache=max_cache, replace=replace, progress=_progress)
    rec = records[0]
    _show_record(rec, as_json)
    details = rec.manifest.artifacts["onnx"].details
    low, prec = getattr(details, "lowering", None) or Lowering(), getattr(details, "precision", None) or Precision()
    if not as_json and module is None and details.attention != "decomposed":
        click.echo(f"attention {details.attention}: {low.fused_nodes} fused node(s), KV cache through the op: "
                   f"{low.kv_cache_in_op}, Softmax left: {low.softmax_left}")
    if not as_json and prec.cast_by_ort_cpu:
        ops = ", ".join(f"{k} x{v}" for k, v in prec.cast_by_ort_cpu.items())
        click.echo(f"{prec.dtype or dtype}: ONNX Runtime CPU computes these in float32 (it casts them): {ops}")
    if len(records) > 1:  # the --target's quantized file, made from the float export
        q, float_out = records[1], rec.folder
        _warn(q)
        _show_replaced(q)
        if not as_json:
            files = ", ".join(f"{q.folder / f} ({_size(q.folder / f)})" for f in q.files)
            click.echo(f"wrote {files} and {q.folder / 'manifest.json'} ({q.quantization.label}) in "
                       f"{q.seconds:.1f} s: the --target {target} file; its float source stays in {float_out}")
    if as_json:
        _print_json("onnx", records)


@main.command("torchscript")
@quiet_option
@model_options
@module_options
@click.option("--mode", type=click.Choice(["trace", "script"]), default="trace", show_default=True,
              help="torch.jit.trace (any model under the contract) or torch.jit.script (where the model allows).")
@click.option("-o", "--output", type=click.Path(file_okay=False), default="artifacts/torchscript",
              show_default=True, help="Export folder (model.pt + manifest.json).")
@replace_option
@json_option
def torchscript_cmd(config, model, checkpoint, hf, module, mask, mode, output, replace=False, as_json=False) -> None:
    """Export to TorchScript (.pt), called as m(input_ids, attention_mask, past_key_values) — or, with --module
    attention, the MHA block on its own, called as m(x, past_key, past_value)."""
    from mhaexport import api

    rec = api.export_torchscript(output, **_model_args(config, model, checkpoint, hf), module=module, mask=mask,
                                 mode=mode, replace=replace, progress=_progress)
    _show_record(rec, as_json)
    if as_json:
        _print_json("torchscript", [rec])


@main.command("pt2")
@quiet_option
@model_options
@module_options
@click.option("--aoti", is_flag=True, default=False,
              help="Also compile the program with AOTInductor for CPU into model.aoti.pt2 (needs a C++ compiler; "
                   "about a minute for tiny-llama). Its compile time is recorded in the manifest.")
@click.option("-o", "--output", type=click.Path(file_okay=False), default="artifacts/pt2", show_default=True,
              help="Export folder (model.pt2 [+ model.aoti.pt2] + manifest.json).")
@replace_option
@json_option
def pt2_cmd(config, model, checkpoint, hf, module, mask, aoti, output, replace=False, as_json=False) -> None:
    """Export with torch.export (an ExportedProgram saved as model.pt2, dynamic batch/sequence/past axes, the causal
    mask built at run time), and with --aoti compile it with AOTInductor — the decoder, or with --module attention
    the MHA block on its own. Both files are code: verify and bench load them from a folder only with --trust-code
    (or right after exporting them, in `mhaexport all --pt2`)."""
    from mhaexport import api

    records = api.export_pt2(output, **_model_args(config, model, checkpoint, hf), module=module, mask=mask, aoti=aoti,
                             replace=replace, progress=_progress)
    for rec in records:
        _show_record(rec, as_json)
        compiled = getattr(rec.manifest.artifacts[rec.artifact].details, "compile_seconds", None)
        if compiled is not None and not as_json:
            click.echo(f"AOTInductor compile: {compiled:.1f} s")
    if as_json:
        _print_json("pt2", records)


def _parse_groups(ctx, param, value: str) -> tuple[str, ...]:
    """"embeddings,lm_head" -> ("embeddings", "lm_head"); "none" or "" -> () (the names are checked by the API)."""
    given = [x.strip() for x in value.split(",") if x.strip()]
    items = tuple(dict.fromkeys(x for x in given if x != "none"))
    if "none" in given and items:
        raise click.BadParameter(f"{value!r}: none (everything quantized) contradicts {','.join(items)}; give one "
                                 "or the other")
    return items


@main.command("quantize")
@quiet_option
@click.argument("folder", type=click.Path(file_okay=False), callback=_folder_exists)
@click.option("-o", "--output", type=click.Path(file_okay=False), required=True,
              help="The quantized export folder (another folder: the float one stays verify's and bench's reference).")
@click.option("--weights", type=click.Choice(["int4", "int8"]), default="int4", show_default=True,
              help="Bits per weight of every MatMul with a constant weight (MatMulNBits).")
@click.option("--block-size", type=int, default=None,
              help="Weights per scale, along K: 16, 32, 64, 128 or 256 (what ONNX Runtime's MatMulNBits takes); "
                   "a layer with a shorter K gets the largest block that fits.  [default: 128 for int4, 32 for int8]")
@click.option("--symmetric/--asymmetric", default=True, show_default=True,
              help="Symmetric blocks (no zero points) or asymmetric ones (a zero point per block).")
@click.option("--accuracy-level", type=click.IntRange(0, 4), default=4, show_default=True,
              help="MatMulNBits' compute type on CPU: 4 = int8 activations (fast), 0/1 = float (slower, exact "
                   "self-consistency).")
@click.option("--keep-float", default="embeddings", show_default=True, callback=_parse_groups,
              metavar="embeddings,lm_head|none",
              help="What stays in float: the gathered token/position tables (one row read per token), the LM head.")
@click.option("--int8-blocks", type=click.IntRange(min=0), default=None,
              help="With int4: the first N decoder blocks get 8-bit weights (default 2, at most all blocks but one: the "
                   "most sensitive ones).")
@replace_option
@json_option
def quantize_cmd(folder, output, weights, block_size, symmetric, accuracy_level, keep_float, int8_blocks,
                 replace=False, as_json=False) -> None:
    """Quantize the weights of FOLDER's float ONNX export into a new export folder, with ONNX Runtime's
    MatMulNBitsQuantizer. The tied LM head is untied and quantized too. `mhaexport verify OUTPUT` then judges its
    quality against eager fp32; generate, eval, bench and onnxruntime-genai run it as any export."""
    from mhaexport import api

    rec = api.quantize(folder, output, weights=weights, block_size=block_size, symmetric=symmetric,
                       accuracy_level=accuracy_level, keep_float=keep_float, int8_blocks=int8_blocks, replace=replace,
                       progress=_progress)
    _show_record(rec, as_json=True)  # warnings and what --replace replaced; the lines below say what was written
    if as_json:
        _print_json("quantize", [rec])
        return
    q = rec.quantization
    files = ", ".join(f"{rec.folder / f} ({_size(rec.folder / f)})" for f in rec.files)
    read = q.weights_read.fixed_bytes + q.weights_read.per_row_bytes
    src = q.source.weights_read.fixed_bytes + q.source.weights_read.per_row_bytes
    nodes = ", ".join(f"{k} x{v}" for k, v in q.nodes.items())
    click.echo(f"wrote {files} and {rec.folder / 'manifest.json'} in {rec.seconds:.1f} s")
    click.echo(f"{q.label}: {nodes}; LM head {q.lm_head}; weights read per token {read / 1e6:.2f} MB "
               f"(float: {src / 1e6:.2f} MB, x{read / src:.3f})")
    click.echo(f"next: mhaexport verify {rec.folder}   (quality against eager fp32)", err=True)


@main.command("eval")
@quiet_option
@timeout_option
@click.argument("folder", type=click.Path(file_okay=False), callback=_folder_exists)
@click.option("--text", "text_file", type=click.Path(dir_okay=False), default=None, callback=_regular_file,
              help="Text to score (UTF-8 bytes; byte-level models). Default: the held-out text of the shipped "
                   "weights (models/weights/small-heldout.txt), which they never trained on.")
@runtime_option("Runtime(s) to score on (repeat, or a comma list): eager, torchscript, ort-cpu, ort-cuda, "
                "eager-cuda, onnx-reference. Default: ort-cpu.")
@click.option("--window", type=click.IntRange(min=2), default=None,
              help="Tokens per window (default: the model's max_positions).")
@click.option("--stride", type=click.IntRange(min=1), default=None,
              help="Tokens a window advances (default: half a window; = window: consecutive windows).")
@click.option("--max-bytes", type=click.IntRange(min=2, max=1 << 30), default=TEXT_MAX_BYTES, show_default=True,
              help="Refuse a --text file larger than this (it is scored token by token: 1 MiB takes minutes).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@trust_code_option
def eval_cmd(folder, text_file, runtimes, window, stride, max_bytes, as_json, trust_code) -> None:
    """Perplexity (and bits per byte) of an export FOLDER on text, on any runtime. Exit 0 when every runtime asked
    for ran, 1 when one failed, 4 when one could not run here."""
    from mhaexport.core.numbers import dumps

    from mhaexport import api

    text = None if text_file is None else api.read_text(text_file, max_bytes, "--max-bytes")
    report = api.evaluate(folder, text, text_source=text_file, runtimes=runtimes or None, window=window,
                          stride=stride, trust_code=trust_code, progress=_progress)
    _progress_done()
    if as_json:
        click.echo(dumps(report.to_dict(), indent=1))
    else:
        _show(report.to_markdown())
    raise_for_verdict(*api.eval_verdict(report))


def _threads(ctx, param, value: int | None) -> int | None:
    """--threads within this machine's cores: more threads than cores only contend (and time nothing real)."""
    from mhaexport.api import check_threads

    if ctx.get_parameter_source(param.name) is not click.core.ParameterSource.DEFAULT:
        try:
            check_threads(value)
        except MhaExportError as e:
            raise click.BadParameter(str(e.cli).removeprefix("--threads ")) from None
    return value


def _parse_ids(ctx, param, values: tuple[str, ...]) -> list[list[int]]:
    rows = []
    for v in values:
        try:
            rows.append([int(t) for t in v.replace(" ", "").split(",") if t != ""])
        except ValueError:
            raise click.BadParameter(f"{v!r}: expected comma-separated integers like 5,17,42") from None
    return rows


@main.command("generate")
@timeout_option
@click.argument("folder", type=click.Path(file_okay=False), callback=_folder_exists)
@click.option("--prompt", "prompts", multiple=True, metavar="TEXT",
              help="Prompt text, encoded with the folder's tokenizer.json (an --hf export) or as UTF-8 bytes "
                   "(byte-level models, vocab >= 256). Repeat for a batch.")
@click.option("--prompt-ids", "prompt_ids", multiple=True, metavar="5,17,42", callback=_parse_ids,
              help="Prompt token ids. Repeat for a batch (left-padded).")
@click.option("--max-new-tokens", type=click.IntRange(min=1), default=32, show_default=True)
@click.option("--temperature", type=click.FloatRange(min=0.0), default=0.0, show_default=True,
              help="0 = greedy; otherwise sample from softmax(logits / T).")
@click.option("--top-k", type=click.IntRange(min=1), default=None, help="Sample among the k most likely tokens.")
@click.option("--top-p", type=click.FloatRange(0.0, 1.0, min_open=True), default=None,
              help="Sample among the smallest set of tokens whose probability reaches p.")
@click.option("--seed", type=SEED, default=0, show_default=True, help="Seed of the sampler (0 to 2**32-1).")
@click.option("--eos-id", type=click.IntRange(min=0), default=None,
              help="Stop a row when it produces this id. Default: the model config's eos id for a folder with a "
                   "tokenizer.json (an --hf export), none otherwise.")
@click.option("--provider", "providers", multiple=True, default=("cpu",), show_default=True,
              metavar="cpu|cuda|NAME", help="ONNX Runtime execution provider(s), in order of preference.")
@click.option("--threads", type=click.IntRange(min=1), default=None, callback=_threads,
              help="ONNX Runtime intra-op threads (at most the machine's cores).")
@click.option("--engine", type=click.Choice(["auto", "mhaexport", "onnxruntime-genai"]), default="auto",
              show_default=True,
              help="Whose decode loop: onnxruntime-genai's where it is installed and the folder's genai_config.json "
                   "passes the genai-config check (auto), or mhaexport's. Greedy tokens are the same; sampling "
                   "draws from each loop's own random generator.")
@click.option("--json", "as_json", is_flag=True,
              help="Print one JSON object: tokens, text, stop reason, providers, engine.")
@trust_code_option
def generate_cmd(folder, prompts, prompt_ids, max_new_tokens, temperature, top_k, top_p, seed, eos_id, providers,
                 threads, engine, as_json, trust_code) -> None:
    """Generate from an ONNX export with ONNX Runtime (no torch): prefill, then KV-cache decode.

    With --json, "tokens" is the list of new ids for one prompt, or a list of such lists for several.
    """
    from mhaexport.core.numbers import dumps

    from mhaexport import api

    result = api.generate(folder, prompts, prompt_ids=prompt_ids, max_new_tokens=max_new_tokens,
                          temperature=temperature, top_k=top_k, top_p=top_p, seed=seed, eos_id=eos_id,
                          providers=providers, threads=threads, engine=engine, trust_code=trust_code)
    for w in result.warnings:
        click.secho(shown(f"warning: {w}"), fg="yellow", err=True)
    if as_json:
        click.echo(dumps(result.to_dict(result.texts)))
        return
    click.echo(shown(f"providers: {', '.join(result.providers)}"), err=True)
    click.echo(shown(f"engine: {result.engine} ({result.engine_reason})"), err=True)
    for i, toks in enumerate(result.tokens):
        if i < len(prompts):
            click.echo(prompts[i] + result.texts[i])
        else:
            click.echo(",".join(map(str, toks)))
    click.echo(shown(result.message), err=True)


@main.command("bench")
@quiet_option
@timeout_option
@click.argument("folder", type=click.Path(file_okay=False), callback=_folder_exists)
@click.option("--prompt-len", type=click.IntRange(min=1), default=None,
              help="Prompt tokens (default 32, shrunk to fit the model's max_positions with the new tokens).")
@click.option("--new-tokens", type=click.IntRange(min=2), default=None,
              help="Tokens generated (default 128, shrunk to fit the model's max_positions).")
@click.option("--batch", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--threads", type=click.IntRange(min=1), default=2, show_default=True, callback=_threads,
              help="Threads for torch and ONNX Runtime alike (at most the machine's cores).")
@runtime_option("Runtimes to time (repeat, or a comma list; --runtimes A,B is the same option): eager, "
                "eager-nocache, eager-cuda, torchscript, ort-cpu, ort-bare (a bare session.run loop over the same "
                "file), ort-genai (onnxruntime-genai's loop), ort-cuda, pt2, aoti (with --trust-code), or 'all'. "
                "Default: all but eager-nocache (recompute, O(n^2): slow; ask for it by name); pt2/aoti where the "
                "folder holds them.", "--runtimes")
@click.option("--repeats", type=click.IntRange(min=1), default=3, show_default=True,
              help="Timed generations per runtime, round-robin (after untimed warm-ups until two in a row agree "
                   "within 10 %, at most 5).")
@click.option("--sessions", type=click.IntRange(min=1), default=1, show_default=True,
              help="Sessions per loop row (ort-cpu rows, ort-genai): each is warmed up and timed --repeats times, "
                   "in turn; the row's token p50 is the median of its sessions' p50s (identical sessions of one "
                   "file can decode at different speeds). bench.md gives mhaexport's loop / onnxruntime-genai's.")
@click.option("--long", "long_to", type=click.IntRange(min=0), default=0, metavar="POSITION",
              help="Also time one ORT CPU generation per lowering from the prompt up to this position (per-token "
                   "latency against position). Default: 0, off.")
@click.option("--long-repeats", type=click.IntRange(min=1), default=1, show_default=True,
              help="Long runs per lowering, round-robin; per position, the median.")
@click.option("--opt-levels", default="", metavar="basic,extended,all",
              help="Also time ORT CPU at these graph optimization levels (disable, basic, extended, all; rows "
                   "'ort-cpu@LEVEL').")
@click.option("--profile", is_flag=True, help="Also write ONNX Runtime's profile of the ORT CPU decode (JSON).")
@click.option("--compare", "compare", multiple=True, type=click.Path(file_okay=False), metavar="DIR",
              help="Another ONNX export of the same model (another --attention or --dtype; repeat): adds ORT rows "
                   "labelled by lowering, timed round-robin with the rest, and a table of the lowerings.")
@click.option("--lowerings", default=None, metavar="ATTENTION[:DTYPE],..",
              help="Compare these lowerings, e.g. 'decomposed,onnx,ort,fused,ort:float16,shared' ('shared': the "
                   "shared KV cache; 'fused-shared': --attention fused over it): those that neither FOLDER nor a --compare folder holds are exported (once) to "
                   "OUTPUT/lowerings/ATTENTION-DTYPE.")
@click.option("--quantize", "quantize", default=None, metavar="int4,int8",
              help="Time quantized exports of the same model beside the float one: those that neither FOLDER nor a "
                   "--compare folder holds are quantized (once, default settings) to OUTPUT/quantized/SCHEME.")
@click.option("--builder", default=None, metavar="fp32,int4",
              help="Also time onnxruntime-genai's model builder's files of the same Hugging Face model (FOLDER an "
                   "--hf export; onnxruntime-genai installed): built once to OUTPUT/builder/PRECISION, adopted, and "
                   "timed in the same run, rows labelled by producer.")
@click.option("--batches", default=None, metavar="1,4,16",
              help="Also time how cost grows with the batch: per-token latency and tokens/s of every ONNX Runtime row "
                   "(and ort-genai) at each batch size (--prompt-len prompts, --new-tokens tokens), after the main "
                   "rounds; a table in bench.md and bench-scaling.png. Default: off.")
@click.option("--prompts", default=None, metavar="32,512,2048",
              help="Also time the time to first token of every ONNX Runtime row (and ort-genai) at batch 1 for each "
                   "prompt length (one the model cannot hold is a skipped point with its reason). Default: off.")
@click.option("--serving", default=None, metavar="1,4,8",
              help="Also time serving on the ort-cpu row, after the main rounds: continuous batching's tokens/s at "
                   "each number of rows against the plain loop (the same requests one at a time), and speculative "
                   "decoding (prompt lookup) against plain greedy on a repetitive and a non-repetitive prompt. "
                   "Default: off.")
@click.option("--targets", is_flag=True,
              help="Also judge the project's own speed targets (a project benchmark: set for the bench preset and "
                   "the peer comparison) and add their table.")
@click.option("--json", "as_json", is_flag=True, help="Print bench.json's content as one JSON object on stdout.")
@click.option("-o", "--output", type=click.Path(file_okay=False), default=None,
              help="Where bench.json/bench.md/bench.png (and --profile's trace) go. Default: the export folder (the "
                   "trace is then summed up and not kept).")
@trust_code_option
def bench_cmd(folder, prompt_len, new_tokens, batch, threads, runtimes, repeats, sessions, long_to, long_repeats,
              opt_levels, profile, compare, lowerings, quantize, builder, batches, prompts, serving, targets, as_json,
              output, trust_code) -> None:
    """Time the KV-cache decode loop of an export folder on each runtime; write bench.json, bench.md, bench.png."""
    from mhaexport import api, bench

    result = api.bench(folder, output=output or folder, progress=_progress, lowerings=lowerings, quantize=quantize,
                       builder=builder, prompt_len=prompt_len, new_tokens=new_tokens, batch=batch, threads=threads,
                       runtimes=runtimes or None, repeats=repeats, sessions=sessions, long=long_to,
                       long_repeats=long_repeats,
                       opt_levels=tuple(x.strip() for x in opt_levels.split(",") if x.strip()), profile=profile,
                       profile_dir=output, targets=targets, compare=compare, batches=batches, prompts=prompts,
                       serving=serving, trust_code=trust_code)
    _progress_done()
    if as_json:
        from mhaexport.core.numbers import dumps

        click.echo(dumps(result.to_dict()))
    else:
        _show(bench.markdown_body(result))  # the tables, the floor and the targets (no plot line)
    click.echo("wrote " + ", ".join(str(p) for p in result.written), err=True)


# --- verify, all, report merge (issue 3) -------------------------------------------------------------------------

def _parse_tolerance(ctx, param, values: tuple[str, ...]) -> dict | None:
    """("1e-4", "logits=1e-3") -> {None: 1e-4, "logits": 1e-3}; None when not given."""
    if not values:  # nothing to parse: import nothing (a bad FOLDER is refused before verify's imports)
        return None
    from mhaexport.core.iospec import OUTPUT_KINDS

    out: dict = {}
    for v in values:
        key, _, num = v.rpartition("=")
        key = key.strip() or None
        if key is not None and key not in OUTPUT_KINDS:
            raise click.BadParameter(f"{v!r}: OUTPUT must be one of {', '.join(OUTPUT_KINDS)}")
        try:
            x = float(num)
        except ValueError:
            raise click.BadParameter(f"{v!r}: expected a number or OUTPUT=number, e.g. logits=1e-3") from None
        if not x >= 0:
            raise click.BadParameter(f"{v!r}: a tolerance must be >= 0")
        out[key] = x
    return out or None


def _parse_quality(ctx, param, values: tuple[str, ...]) -> dict | None:
    """("top1=0.9", "kl_mean=0.05") -> {"top1": 0.9, "kl_mean": 0.05}; None when not given."""
    if not values:
        return None
    from mhaexport.core.errors import ConfigError
    from mhaexport.verify.quality import QUALITY_FIGURES, check_threshold

    out: dict = {}
    for v in values:
        key, _, num = v.partition("=")
        key = key.strip()
        if key not in QUALITY_FIGURES:
            raise click.BadParameter(f"{v!r}: FIGURE must be one of {', '.join(QUALITY_FIGURES)}")
        try:
            out[key] = float(num)
        except ValueError:
            raise click.BadParameter(f"{v!r}: expected FIGURE=number, e.g. top1=0.9") from None
        try:
            check_threshold(key, out[key])
        except ConfigError as e:
            raise click.BadParameter(str(e).removeprefix("--quality ")) from None
    return out or None


def _quality_settings(quality: dict | None, text_file: str | None):
    """verify's QualitySettings from --quality / --text (None when neither was given)."""
    if quality is None and text_file is None:
        return None
    from mhaexport.verify.quality import QualitySettings

    if text_file is None:
        return QualitySettings(overrides=quality)
    from mhaexport.api import read_text

    return QualitySettings(overrides=quality, text=read_text(text_file), text_source=text_file)


def _remember_json(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    """--json: kept in the CliState for the verb's printing (verify, all)."""
    if value:
        _state(ctx).json = True


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


def _remember_junit(ctx: click.Context, param: click.Parameter, value: str | None):
    """--junit FILE: checked before any work (its folder may be made by the run, e.g. inside -o, but what exists of
    its path must be writable folders); kept in ctx.meta for the verb."""
    if value is not None:
        from mhaexport.api import check_junit

        try:
            check_junit(value)
        except MhaExportError as e:
            raise click.BadParameter(str(e.cli).removeprefix("--junit "), param_hint="--junit") from None
    return _remember(ctx, param, value)


def _parse_memory(ctx, param, value):
    """--memory SIZE: refused at parsing when it is no size (the API checks it again)."""
    if value is None:
        return None
    from mhaexport.verify.memory import parse_size

    try:
        parse_size(value)
    except MhaExportError as e:
        raise click.BadParameter(str(e).removeprefix("--memory "), param_hint="--memory") from None
    return value


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


def render_markdown(report) -> str:
    """report.md's text (verify/render.py), imported when a report is there to render."""
    from mhaexport.verify.render import markdown

    return markdown(report)


def verify_options(f):
    """--sweep / --seed / --atol / --rtol / --runtime / --tokens: how verify checks an export."""

    @click.option("--sweep", type=click.Choice(["quick", "full"]), default="quick", show_default=True,
                  help="Input shapes: quick (9 shapes, seconds) or full (57 shapes incl. random ones).")
    @click.option("--seed", type=SEED, default=0, show_default=True, help="Seed of the input sweep (0 to 2**32-1).")
    @click.option("--atol", multiple=True, metavar="[OUTPUT=]X", callback=_parse_tolerance,
                  help="Absolute tolerance, for every output or per output: --atol 1e-4 --atol logits=1e-3 "
                       "(OUTPUT: logits or present; default by dtype: float32 1e-4, float16 1e-2).")
    @click.option("--rtol", multiple=True, metavar="[OUTPUT=]X", callback=_parse_tolerance,
                  help="Relative tolerance, likewise (default by dtype: float32 1e-3, float16 1e-2).")
    @runtime_option("Runtimes to verify (repeat, or a comma list): eager, torchscript, ort-cpu, ort-cuda, and on "
                    "request eager-cuda, onnx-reference, ort-genai; pt2 and aoti (torch.export, AOTInductor: with "
                    "--trust-code on `verify`). Default: eager, torchscript, ort-cpu, ort-cuda, and pt2/aoti where "
                    "the folder holds them. An attention block (--module attention) adds torch-mha: torch's own "
                    "attention with the same weights.")
    @click.option("--tokens", "gen_tokens", type=click.IntRange(min=1), default=None,
                  help="Greedy tokens for the generation check (default: 8 quick, 32 full).")
    @click.option("--memory", "memory", metavar="SIZE", default=None, callback=_parse_memory,
                  help="The memory verify may use, e.g. 1.5G or 800M (default: the machine's: the cgroup's limit or "
                       "MemAvailable, the smaller). verify plans before loading: weights whole when they fit, "
                       "memory-mapped when only that fits, exit 2 when even that cannot (docs/verify.md).")
    @click.option("--mapped", "mapped", is_flag=True, default=False,
                  help="Hold the weights memory-mapped (eager's built-in decoder, ONNX Runtime's external data) "
                       "whatever fits.")
    @click.option("--quality", "quality", multiple=True, metavar="FIGURE=X", callback=_parse_quality,
                  help="Override a lossy artifact's threshold (repeat): top1, greedy (at least), kl_mean, kl_p99, "
                       "logit_err, ppl_ratio (at most), e.g. --quality top1=0.9. Defaults per scheme (docs/quantize.md).")
    @click.option("--text", "quality_text", type=click.Path(dir_okay=False), default=None, callback=_regular_file,
                  help="Real text for a lossy artifact's quality figures (UTF-8 bytes; byte-level models). Default: "
                       "the held-out text of the shipped weights.")
    @click.option("--junit", metavar="FILE.xml", type=click.Path(dir_okay=False), default=None, expose_value=False,
                  callback=_remember_junit,
                  help="Also write the verdict as JUnit XML (one test case per runtime x check) for CI test reports.")
    @click.option("--json", "as_json", is_flag=True, expose_value=False, callback=_remember_json,
                  help="Print the report (report.json's content) as one JSON object on stdout instead of its table; "
                       "progress and the verdict line stay on stderr, the exit code is the verdict's.")
    @timeout_option
    @functools.wraps(f)
    def wrapper(*args, **kwargs):
        return f(*args, **kwargs)

    return wrapper


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


def _parse_case(ctx, param, value):
    """--case B,S,P: batch, new tokens, cached tokens."""
    if value is None:
        return None
    parts = value.split(",")
    try:
        b, s, p = (int(x) for x in parts)
    except ValueError:
        raise click.BadParameter(f"{value!r}: expected B,S,P (batch, sequence, past), e.g. 1,121,7") from None
    return b, s, p  # (the API checks the sizes)


def _show_bisect(run) -> None:
    """verify --bisect's findings (:class:`mhaexport.api.VerifyRun` with its ``bisect``), then its exit: verify's
    verdict, 1 also when bisect found a difference."""
    from mhaexport.diagnose.model_explorer import NODE_DATA, how_to_open

    _progress_done()
    followed, report = run.bisect.followed, run.bisect.report
    if followed is not None:
        click.echo(followed.summary())
    if report is not None:
        click.echo(report.summary())
        if report.kind == "onnx" and run.written:  # Model Explorer's node data
            click.echo(f"wrote {run.written[0]}: {how_to_open(report.model, run.written[0])}")
        elif report.kind == "onnx" and run.folder is not None:
            click.echo(f"(-o DIR writes DIR/{NODE_DATA}: this divergence on the graph, for Model Explorer)")
    raise_for_verdict(*run.exit)


@main.command("verify")
@quiet_option
@click.argument("folder", required=False, type=click.Path())
@model_options
@verify_options
@click.option("-o", "--output", type=click.Path(file_okay=False), default=None,
              help="Where report.json, report.md and report.html go (default: FOLDER, where a run of named "
                   "--runtime's writes report-RUNTIMES.json/.md/.html instead, never replacing the full report; with "
                   "model options only: not written); with --bisect, where bisect-node-data.json goes (Model "
                   "Explorer's view of the divergence). For FILE.onnx: the folder it is adopted into (default: FILE's "
                   "folder/mhaexport).")
@click.option("--bisect", "bisect_", is_flag=True, default=False,
              help="Verify plus a diagnosis: take verify's verdict (FOLDER's report since its export, or a verify "
                   "run now; the exit is that verdict's, 1 also when bisect finds a difference) and follow the check "
                   "that failed in its protocol (a deploy loop's ragged batch step by step), else compare the ONNX "
                   "graph's intermediate values with eager PyTorch's, module by module, and name the first block and "
                   "tensor that diverge. Runs at the case parity failed at unless --case says. The "
                   "torch.export program (model.pt2) instead with --runtime pt2, in a folder without an ONNX file, "
                   "or when FOLDER's report has its parity failing and no ONNX Runtime's (with --trust-code).")
@click.option("--case", "case", default=None, metavar="B,S,P", callback=_parse_case,
              help="With --bisect: the batch, sequence and past to bisect at, e.g. --case 1,121,7.")
@click.option("--record", "record", is_flag=True, default=False,
              help="Also write eager's outputs over this sweep into FOLDER (reference.json + reference.npz, hashed "
                   "in the manifest): a later verify judges the ONNX file from them without torch or the weights "
                   "(docs/verify.md).")
@click.option("--reference", "reference", type=click.Choice(["auto", "eager", "recorded"]), default="auto",
              show_default=True,
              help="Where eager's outputs come from: eager (run the model), recorded (FOLDER's record, no torch), "
                   "auto (the record when torch cannot be imported here and FOLDER holds one, else eager).")
@trust_code_option
def verify_cmd(folder, config, model, checkpoint, hf, sweep, seed, atol, rtol, runtimes, gen_tokens, quality,
               quality_text, output, bisect_=False, case=None, trust_code=False, record=False,
               reference="auto", memory=None, mapped=False) -> None:
    """Verify an export FOLDER (ONNX and/or TorchScript) against eager PyTorch on every runtime, or, with
    --config/--model/--hf only, export both formats to a temporary folder first and verify that (one of the two is
    required: verify alone verifies nothing and exits 2). A folder refused before any check (a file that does not
    match its manifest, a name leaving it) is a verdict too: exit 2, with its report in -o and the --junit file. FOLDER with
    --model/--config/--checkpoint/--hf re-points the folder at its model (accepted when it is the same model: the
    fingerprints of contract and weights match).

    FILE.onnx with --hf/--model/--config: an ONNX decoder another tool exported (onnxruntime-genai's model
    builder, Optimum, a plain torch.onnx.export) is adopted into a folder (-o; links to the file, the manifest
    records its layout and hashes) and verified against that model, driven in its producer's cache and padding
    protocol (the verdict) and also in the plain one (findings). generate and bench then run on that folder.

    Checks per runtime: parity, finite, causality, kv-consistency, padding, dynamic-shapes, generation; a quantized
    (lossy) artifact gets quality against eager fp32 instead of exact parity, and its invariants against itself;
    an attention block on its own (--module attention): parity (against eager and torch's own attention), finite,
    causality, cache-consistency, demonstration.
    Exit 0 passed, 1 a check failed, 2 bad input, 4 not verified (a --runtime asked for could not run here)."""
    from mhaexport import api
    from mhaexport.core.errors import ReportNotWritten

    ctx = click.get_current_context()
    try:  # verify's modules import once the input is checked: a missing FOLDER is refused at once
        run = api.verify_run(folder, output, **_model_args(config, model, checkpoint, hf), runtimes=runtimes or None,
                             sweep=sweep, seed=seed, atol=atol, rtol=rtol, tokens=gen_tokens,
                             quality=_quality_settings(quality, quality_text), junit=_state(ctx).junit,
                             trust_code=trust_code, bisect=bisect_, case=case, markdown=render_markdown,
                             progress=_progress, reference=reference, record=record,
                             memory=memory, mapped=mapped)
    except ReportNotWritten as e:  # what could be written is said before the error
        for line in _wrote(e.written):
            click.echo(line, err=True)
        raise
    if run.adopted is not None:
        details = run.adopted.manifest.artifacts["onnx"].details
        click.echo(f"Adopted {folder} ({details.producer} layout, driven as {details.cache.kind} cache, "
                   f"{details.cache.padding} padding) into {run.adopted.folder}", err=True)
        _warn(run.adopted)
    for rec in run.exported:  # a temporary export's warnings
        _show_record(rec, as_json=True)
    if run.bisect is not None:
        _show_bisect(run)
        return
    _progress_done()  # the report starts on a line of its own
    _finish(run.report, render_markdown(run.report), _wrote(run.written))


@main.command("all")
@quiet_option
@model_options
@verify_options
@lowering_options
@click.option("--target", type=click.Choice(["portable", "ort-cpu", "ort-cuda"]), default=None,
              help="The runtime the ONNX file is for (as `mhaexport onnx --target`): portable (the default), ort-cpu "
                   "(fused, shared cache, int4; its float source in OUTPUT-float32), ort-cuda (fused, shared, "
                   "float16).")
@click.option("--pt2", "pt2", is_flag=True, default=False,
              help="Also export with torch.export (model.pt2) and verify it as runtime pt2.")
@click.option("--aoti", "aoti", is_flag=True, default=False,
              help="Also export with torch.export and compile it with AOTInductor for CPU (model.pt2 and "
                   "model.aoti.pt2), verified as runtimes pt2 and aoti.")
@click.option("-o", "--output", type=click.Path(file_okay=False), default="artifacts/default", show_default=True,
              help="Folder for model.onnx, model.pt, manifest.json, report.json and report.md.")
@replace_option
def all_cmd(config, model, checkpoint, hf, sweep, seed, atol, rtol, runtimes, gen_tokens, quality, quality_text,
            opset, attention, dtype, output, pt2=False, aoti=False, replace=False, target=None, memory=None,
            mapped=False) -> None:
    """The main job: export ONNX and TorchScript into one folder, verify both against eager, write the report
    (:func:`mhaexport.api.all`)."""
    from mhaexport import api
    from mhaexport.core.progress import Stage
    from mhaexport.verify.render import markdown as render_markdown

    quiet = _state().quiet

    def progress(msg: str) -> None:
        if isinstance(msg, Stage):
            _progress_done()
            if not quiet:
                click.secho(f"[{msg.index}/{msg.total}] {msg}", err=True, bold=True)
        else:
            _progress(msg)

    given = _typed(attention=attention, dtype=dtype) if target else {"attention": attention, "dtype": dtype}
    run = api.all(output, **_model_args(config, model, checkpoint, hf), runtimes=runtimes or None, sweep=sweep,
                  seed=seed, atol=atol, rtol=rtol, tokens=gen_tokens, quality=_quality_settings(quality, quality_text),
                  opset=opset, **given, target=target, pt2=pt2, aoti=aoti, replace=replace,
                  junit=_state().junit, progress=progress, memory=memory, mapped=mapped)
    _progress_done()
    for rec in run.records:
        _show_record(rec, as_json=True)
    _finish(run.report, render_markdown(run.report), _wrote(run.written))


@main.command("lint")
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


@main.group("report")
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


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
