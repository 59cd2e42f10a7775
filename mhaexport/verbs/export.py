"""The export verbs: ``mhaexport onnx`` (with ``--target``: a runtime's options, its quantized file), ``torchscript``
and ``pt2`` — the decoder, or the built-in attention block on its own (``--module attention``)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mhaexport.core.errors import ConfigError
from mhaexport.verbs.common import Progress, _model, _replacing, _say, writable_output
from mhaexport.verbs.quantize import quantize

if TYPE_CHECKING:  # pragma: no cover
    from mhaexport.exporter.common import ExportRecord
    from mhaexport.models.loading import LoadedModel


def _block(module: str | None, mask: str | None, model: Any, hf: Any, **refused: tuple[Any, Any]) -> bool:
    """Whether an export is of the built-in attention block on its own (``module="attention"``, the CLI's --module),
    checked before any work: ``mask`` needs ``module``; the block comes from ``config`` (not ``model``/``hf``) and
    is exported with dynamic axes, decomposed attention and float32 (``refused``: option -> (value, default)).
    ExportOptionError (a ConfigError) otherwise."""
    from mhaexport.core.errors import ExportOptionError

    if module is None:
        if mask is not None:
            raise ExportOptionError("--mask applies to --module attention (the decoder's mask is causal, with "
                                    "padding from attention_mask)")
        return False
    if module != "attention":
        raise ExportOptionError(f"--module {module!r}: expected attention")
    if model is not None or hf is not None:
        raise ExportOptionError(f"--module {module} exports the built-in block from --config; --model and --hf are "
                                "decoders")
    for option, (value, default) in refused.items():
        if value != default:
            raise ExportOptionError(f"--module {module} is exported with dynamic axes, decomposed attention and "
                                    f"float32; {option} {value} does not apply")
    return True


def _load_block(config: str | None, checkpoint: str | Path | None, mask: str | None) -> LoadedModel:
    """The built-in attention block of ``config`` (its blocks.0.attn weights) with ``mask`` (default causal)."""
    from mhaexport.models.block import load_block

    return load_block(config, checkpoint, mask=mask or "causal")


def _block_of(loaded: LoadedModel) -> str:
    """"the attention block of preset:tiny" (a block's spec ends with the block's own name)."""
    return f"the {loaded.contract.kind} block of {loaded.spec.rsplit(' ', 1)[0]}"


def export_onnx(output: str | Path, *, model: str | LoadedModel | None = None, config: str | None = None,
                hf: str | Path | None = None, checkpoint: str | Path | None = None, revision: str | None = None,
                allow_download: bool = False, module: str | None = None, mask: str | None = None,
                opset: int | None = None, attention: str = "decomposed", dtype: str = "float32",
                kv_cache: str = "concat", max_cache: int | None = None, seq_dynamic: bool = True,
                seq_len: int | None = None, past_len: int = 0, replace: bool = False,
                progress: Progress | None = None, announce: bool = True) -> ExportRecord:
    """``mhaexport onnx``: export the model to ONNX into folder ``output`` (model.onnx + manifest.json; other
    artifacts already there stay). ``module="attention"``: the built-in attention block of ``config`` on its own
    (``mask`` "causal" or "none"; dynamic axes, decomposed attention, float32). ``replace``: ``output`` may hold
    another model (or the attention block where a decoder goes): it is replaced, its files and reports removed
    (``record.replaced`` says what went) — without it that is an ExportError before any work. Returns the
    ExportRecord (folder, files, seconds, warnings, manifest, replaced; ``.to_dict()``: what ``--json`` prints).
    Raises ConfigError / ModelLoadError / ExportError / ArtifactError. ``progress`` hears each phase (loading,
    tracing, lowering, writing, checking); ``announce`` False: no "Exporting ..." line (a caller that said it)."""
    say = _say(progress)
    if _block(module, mask, model, hf, **{"--seq-static": (not seq_dynamic, False),
                                          "--attention": (attention, "decomposed"), "--dtype": (dtype, "float32"),
                                          "--kv-cache": (kv_cache, "concat"), "--max-cache": (max_cache, None)}):
        from mhaexport.exporter.block import export_module_onnx

        writable_output(output)
        loaded = _load_block(config, checkpoint, mask)
        with _replacing(output, loaded, replace) as done:
            say(f"Exporting {_block_of(loaded)} to ONNX (opset {opset or 18}, dynamic axes, mask "
                f"{loaded.contract.mask}) ...")
            return done(export_module_onnx(loaded, output, opset=opset))
    from mhaexport.exporter.onnx import check_options, export_onnx as _export

    shown = check_options(opset=opset, seq_dynamic=seq_dynamic, seq_len=seq_len, past_len=past_len,
                          attention=attention, dtype=dtype, kv_cache=kv_cache, max_cache=max_cache)
    writable_output(output)
    # the model streamed (the built-in decoder, an --hf folder): its weights in a staging file, written to the export
    # one tensor at a time; a bfloat16 folder exported bfloat16 is staged as it is (no float32 copy)
    loading = f"Loading {model or config or (f'--hf {hf}' if hf else None) or 'the default model'} ..."
    loaded = _model(model, config, hf, checkpoint, revision, allow_download, progress, streamed=True,
                    keep_half=dtype == "bfloat16", loading=loading if announce else None)
    with _replacing(output, loaded, replace) as done:
        axes = "dynamic axes" if seq_dynamic else f"static seq={seq_len} past={past_len}"
        cache = {"concat": "", "window": ", window-sized KV cache (GroupQueryAttention)"}.get(
            kv_cache, ", shared KV cache (GroupQueryAttention)")
        if announce:
            say(f"Exporting {loaded.spec} to ONNX (opset {shown}, {axes}, attention {attention}, {dtype}{cache}) ...")
        return done(_export(loaded, output, opset=opset, seq_dynamic=seq_dynamic, seq_len=seq_len,
                            past_len=past_len, attention=attention, dtype=dtype, kv_cache=kv_cache,
                            max_cache=max_cache, progress=progress))


def export_torchscript(output: str | Path, *, model: str | LoadedModel | None = None, config: str | None = None,
                       hf: str | Path | None = None, checkpoint: str | Path | None = None,
                       revision: str | None = None, allow_download: bool = False, module: str | None = None,
                       mask: str | None = None, mode: str = "trace", replace: bool = False,
                       progress: Progress | None = None) -> ExportRecord:
    """``mhaexport torchscript``: export the model to TorchScript (``mode`` trace or script) into ``output``
    (``module``, ``mask``, ``replace`` as :func:`export_onnx`). Returns the ExportRecord."""
    say = _say(progress)
    if _block(module, mask, model, hf):
        from mhaexport.exporter.block import export_module_torchscript

        writable_output(output)
        loaded = _load_block(config, checkpoint, mask)
        with _replacing(output, loaded, replace) as done:
            say(f"Exporting {_block_of(loaded)} to TorchScript (torch.jit.{mode}, mask {loaded.contract.mask}) ...")
            return done(export_module_torchscript(loaded, output, mode=mode))
    from mhaexport.exporter.torchscript import export_torchscript as _export

    writable_output(output)
    # an --hf folder streamed (its weights staged and mapped, as for onnx); the built-in decoder in memory
    loaded = _model(model, config, hf, checkpoint, revision, allow_download, progress, streamed=hf is not None)
    with _replacing(output, loaded, replace) as done:
        say(f"Exporting {loaded.spec} to TorchScript (torch.jit.{mode}) ...")
        return done(_export(loaded, output, mode=mode))


def export_pt2(output: str | Path, *, model: str | LoadedModel | None = None, config: str | None = None,
               hf: str | Path | None = None, checkpoint: str | Path | None = None, revision: str | None = None,
               allow_download: bool = False, module: str | None = None, mask: str | None = None,
               aoti: bool = False, replace: bool = False, progress: Progress | None = None) -> list[ExportRecord]:
    """``mhaexport pt2``: export the model with torch.export into ``output`` (model.pt2) and, with ``aoti``,
    compile it with AOTInductor for CPU (model.aoti.pt2). Returns the ExportRecords, pt2 first. Both files are code:
    ``verify``/``bench`` of the folder load them only with ``trust_code=True`` (or in this same process). Raises
    ExportError in one line for a model torch.export cannot take. ``module``, ``mask``, ``replace`` as
    :func:`export_onnx`."""
    from mhaexport.exporter.pt2 import export_pt2 as _export

    say = _say(progress)
    block = _block(module, mask, model, hf)
    writable_output(output)
    loaded = (_load_block(config, checkpoint, mask) if block else  # an --hf folder streamed, as for onnx
              _model(model, config, hf, checkpoint, revision, allow_download, progress, streamed=hf is not None))
    with _replacing(output, loaded, replace) as done:
        say(f"Exporting {_block_of(loaded) if block else loaded.spec} with torch.export (dynamic axes) ...")
        records = _export(loaded, output, aoti=aoti, progress=progress)
        done(records[0])
        return records


def target_options(target: str, given: Mapping[str, str] | None = None) -> tuple[str, str, str, str | None]:
    """``--target NAME`` (portable, ort-cpu, ort-cuda): the (attention, kv_cache, dtype, weights) it sets.
    ``given``: the options the caller set itself ({"dtype": "float16"}); one that contradicts the target is a
    ConfigError rather than one of the two silently winning. ConfigError for an unknown target too."""
    from mhaexport.exporter.targets import conflicts, deploy_target

    t = deploy_target(target)
    bad = conflicts(t, dict(given or {}))
    if bad:
        raise ConfigError(f"--target {target} and {', '.join(bad)}: give one or the other")
    return t.attention, t.kv_cache, t.dtype, t.weights


def _given(**options: Any) -> dict[str, Any]:
    """The options a caller set (not None): what a --target is checked against."""
    return {k: v for k, v in options.items() if v is not None}


def export_onnx_target(output: str | Path, target: str | None = None, *, attention: str | None = None,
                       kv_cache: str | None = None, dtype: str | None = None, replace: bool = False,
                       module: str | None = None, progress: Progress | None = None, **export: Any) -> list:
    """``mhaexport onnx --target NAME``: :func:`export_onnx` with the options the target sets (``attention``,
    ``kv_cache``, ``dtype`` given too must agree with it: ConfigError otherwise, before any work). A target with
    quantized weights (ort-cpu: int4) exports the float model to ``OUTPUT-DTYPE`` and quantizes it into ``output``.
    ``export``: :func:`export_onnx`'s other keywords. Without ``target``: one :func:`export_onnx`. Returns the
    records, the export's first (then the quantization's)."""
    weights = None
    if target is not None:
        if module is not None:
            raise ConfigError(f"--module {module} is exported with dynamic axes, decomposed attention and "
                              f"float32; --target {target} does not apply")
        attention, kv_cache, dtype, weights = target_options(
            target, _given(attention=attention, kv_cache=kv_cache, dtype=dtype))
        if weights:
            writable_output(output)  # the target file's folder too, before the float export it is made from
    options = _given(attention=attention, kv_cache=kv_cache, dtype=dtype)
    float_out = Path(f"{Path(output)}-{options.get('dtype', 'float32')}") if weights else output
    records = [export_onnx(float_out, replace=replace, progress=progress, module=module, **options, **export)]
    if weights:
        records.append(quantize(float_out, output, weights=weights, replace=replace, progress=progress))
    return records
