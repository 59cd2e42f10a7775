"""The options verbs share (the model, the runtimes, --quiet, --json, --timeout, --trust-code, ...), the command
line's state (:class:`CliState`) and the checks a value gets while the command line is parsed."""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import Any

import click

from mhaexport.core.errors import ConfigError, MhaExportError


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


def _threads(ctx, param, value: int | None) -> int | None:
    """--threads within this machine's cores: more threads than cores only contend (and time nothing real)."""
    from mhaexport.api import check_threads

    if ctx.get_parameter_source(param.name) is not click.core.ParameterSource.DEFAULT:
        try:
            check_threads(value)
        except MhaExportError as e:
            raise click.BadParameter(str(e.cli).removeprefix("--threads ")) from None
    return value
