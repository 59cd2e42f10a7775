"""``mhaexport onnx``, ``torchscript``, ``pt2`` and ``quantize``: parse, call the API, print."""

from __future__ import annotations

import click

from mhaexport.commands.options import (_folder_exists, _model_args, _typed, json_option, lowering_options,
                                        model_options, module_options, quiet_option, replace_option)
from mhaexport.commands.output import _print_json, _progress, _show_record, _show_replaced, _size, _warn


@click.command("onnx")
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


@click.command("torchscript")
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


@click.command("pt2")
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


@click.command("quantize")
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
