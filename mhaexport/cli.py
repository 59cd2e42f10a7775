"""The `mhaexport` command line: parse, call the library, print. Exit codes: 0 pass, 1 verification failed,
2 bad usage or bad input (one line, no traceback)."""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import click

from mhaexport import __version__
from mhaexport.errors import MhaExportError, VerificationFailed


class BadInput(click.ClickException):
    exit_code = 2


class Group(click.Group):
    """Turns the library's errors into the CLI's exit codes."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except VerificationFailed as e:
            click.echo(f"FAILED: {e}", err=True)
            ctx.exit(1)
        except MhaExportError as e:
            raise BadInput(str(e)) from None


def model_options(f):
    """--config / --model / --checkpoint: which model a command works on."""

    @click.option("--config", "config", metavar="NAME|FILE.json", default=None,
                  help="Built-in model: a preset (tiny, small, bench) or a JSON file of DecoderConfig fields. "
                       "Default: small.")
    @click.option("--model", "model", metavar="MODULE:FACTORY", default=None,
                  help="User model: 'package.module:factory' or 'file.py:factory', a zero-argument callable "
                       "returning a module under the decoder contract. This imports and runs that code.")
    @click.option("--checkpoint", type=click.Path(dir_okay=False), default=None,
                  help="State dict to load (torch.load weights_only=True: tensors only).")
    @functools.wraps(f)
    def wrapper(*args, **kwargs):
        return f(*args, **kwargs)

    return wrapper


def _load(config: str | None, model: str | None, checkpoint: str | None):
    from mhaexport.models.loading import load_model

    loaded = load_model(config=config, model=model, checkpoint=checkpoint)
    return loaded


def _size(path: Path) -> str:
    n = path.stat().st_size
    return f"{n / 1e6:.1f} MB" if n >= 1e5 else f"{n / 1e3:.1f} kB"


def _show_record(rec) -> None:
    for w in rec.warnings:
        click.secho(f"warning: {w}", fg="yellow", err=True)
    files = ", ".join(f"{rec.folder / f} ({_size(rec.folder / f)})" for f in rec.files)
    click.echo(f"wrote {files} and {rec.folder / 'manifest.json'} in {rec.seconds:.1f} s")


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="mhaexport")
def main() -> None:
    """Export a causal multi-head-attention decoder to ONNX and TorchScript with dynamic sequence axes,
    and prove the export against eager PyTorch."""


@main.command("onnx")
@model_options
@click.option("--seq-dynamic/--seq-static", default=True, show_default=True,
              help="Dynamic batch/sequence/past axes (the causal mask is computed in the graph), or fixed ones.")
@click.option("--seq-len", type=click.IntRange(min=1), default=None, help="With --seq-static: the fixed sequence length.")
@click.option("--past-len", type=click.IntRange(min=0), default=0, show_default=True,
              help="With --seq-static: the fixed past (KV cache) length.")
@click.option("--opset", type=click.IntRange(18, 23), default=18, show_default=True, help="ONNX opset (18..23).")
@click.option("-o", "--output", type=click.Path(file_okay=False), default="artifacts/onnx", show_default=True,
              help="Export folder (model.onnx + manifest.json).")
def onnx_cmd(config, model, checkpoint, seq_dynamic, seq_len, past_len, opset, output) -> None:
    """Export to ONNX with torch.onnx's dynamo exporter."""
    if not seq_dynamic and seq_len is None:
        raise click.BadParameter("--seq-static needs --seq-len N", param_hint="--seq-len")
    from mhaexport.exporter.onnx import export_onnx

    loaded = _load(config, model, checkpoint)
    axes = "dynamic axes" if seq_dynamic else f"static seq={seq_len} past={past_len}"
    click.echo(f"Exporting {loaded.spec} to ONNX (opset {opset}, {axes}) ...", err=True)
    _show_record(export_onnx(loaded, output, opset=opset, seq_dynamic=seq_dynamic, seq_len=seq_len,
                             past_len=past_len))


@main.command("torchscript")
@model_options
@click.option("--mode", type=click.Choice(["trace", "script"]), default="trace", show_default=True,
              help="torch.jit.trace (any model under the contract) or torch.jit.script (where the model allows).")
@click.option("-o", "--output", type=click.Path(file_okay=False), default="artifacts/torchscript",
              show_default=True, help="Export folder (model.pt + manifest.json).")
def torchscript_cmd(config, model, checkpoint, mode, output) -> None:
    """Export to TorchScript (.pt), called as m(input_ids, attention_mask, past_key_values)."""
    from mhaexport.exporter.torchscript import export_torchscript

    loaded = _load(config, model, checkpoint)
    click.echo(f"Exporting {loaded.spec} to TorchScript (torch.jit.{mode}) ...", err=True)
    _show_record(export_torchscript(loaded, output, mode=mode))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
