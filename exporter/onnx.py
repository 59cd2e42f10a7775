"""ONNX export through torch.onnx's dynamo exporter, with the contract's dynamic axes."""

from __future__ import annotations

import copy
import time
from pathlib import Path

import onnx
import torch
from torch.export import Dim

from mhaexport import dtypes, iospec
from mhaexport.artifact import TWO_GB, stage_artifact
from mhaexport.errors import ExportError, first_line
from mhaexport.exporter.common import ExportRecord, captured_warnings, copy_tokenizer, example_inputs, finish
from mhaexport.exporter.failures import describe_failure
from mhaexport.exporter.genai import GENAI_CONFIG, write_genai_config
from mhaexport.exporter.lowering import ATTENTION_OPSET, LOWERINGS, lower_attention, self_check, self_check_shared
from mhaexport.exporter.precision import precision_report
from mhaexport.iospec import EXAMPLE_BATCH, EXAMPLE_PAST, EXAMPLE_SEQ
from mhaexport.models.inputs import torch_dtype as models_torch_dtype
from mhaexport.models.loading import LoadedModel
from mhaexport.runtime.tokenizer import TOKENIZER_FILES

MIN_OPSET, MAX_OPSET = 18, 23
DEFAULT_OPSET = 18
ONNX_FILE = "model.onnx"
DATA_FILE = "model.onnx.data"


def dynamic_shapes(n_layers: int, seq_dynamic: bool) -> tuple:
    """torch.export dynamic_shapes mirroring (input_ids, attention_mask, past_key_values): tuples, not lists.
    total_sequence_length gets its own Dim (Dim sums are not allowed). Static: batch only."""
    dims = {name: Dim(name) for name in (iospec.BATCH, iospec.SEQ, iospec.PAST, iospec.TOTAL)}
    axes = iospec.dynamic_input_axes(n_layers)

    def spec(name: str) -> dict:
        return {ax: dims[d] for ax, d in axes[name].items() if seq_dynamic or d == iospec.BATCH}

    past = tuple(tuple(spec(n) for n in iospec.past_names(i)) for i in range(n_layers))
    return spec(iospec.INPUT_IDS), spec(iospec.ATTENTION_MASK), past


def refuse_fixed_axes(model: onnx.ModelProto, dynamic_axes: dict[str, dict[int, str]]) -> None:
    """ExportError when an input axis of ``dynamic_axes`` ({input: {axis: dim name}}) came out a fixed number."""
    inputs = {i.name: i for i in model.graph.input}
    for name, axes in dynamic_axes.items():
        for axis, dim_name in axes.items():
            dim = inputs[name].type.tensor_type.shape.dim[axis]
            if not dim.dim_param:
                raise ExportError(
                    f"the dynamic axis {dim_name!r} ({name} axis {axis}) came out fixed at {dim.dim_value}: the "
                    "model uses that length as a constant (e.g. a mask or buffer of fixed size), so the file would "
                    "only run at the export's example length; build the mask from the input shapes")


def _name_io_dims(model: onnx.ModelProto, contract: iospec.ModelContract, seq_dynamic: bool) -> None:
    """Refuse a graph whose sequence axes came out fixed, then give present.* outputs the contract's dim name
    (the exporter writes 'past_sequence_length + sequence_length')."""
    if not seq_dynamic:
        return
    refuse_fixed_axes(model, iospec.dynamic_input_axes(contract.n_layers))
    for out in model.graph.output:
        if out.name.startswith("present."):
            dim = out.type.tensor_type.shape.dim[2]
            dim.ClearField("dim_value")
            dim.dim_param = iospec.TOTAL


def _name_cache_dims(model: onnx.ModelProto) -> None:
    """A shared cache's past inputs and present outputs are one buffer: name their length axis max_cache_length."""
    for vi in list(model.graph.input) + list(model.graph.output):
        if vi.name.startswith(("past_key_values.", "present.")):
            dim = vi.type.tensor_type.shape.dim[2]
            dim.ClearField("dim_value")
            dim.dim_param = iospec.MAX_CACHE


def check_onnx(path: Path) -> None:
    """onnx.checker full check (with shape inference) and strict shape inference, path-based (works past 2 GB)."""
    try:
        onnx.checker.check_model(str(path), full_check=True)
        onnx.shape_inference.infer_shapes_path(str(path), str(path) + ".inferred", strict_mode=True)
    except Exception as e:
        raise ExportError(f"the exported ONNX model fails onnx.checker/shape inference: {e}") from None
    finally:
        Path(str(path) + ".inferred").unlink(missing_ok=True)


def export_onnx(loaded: LoadedModel, out_dir: str | Path, *, opset: int | None = None, seq_dynamic: bool = True,
                seq_len: int | None = None, past_len: int = 0, attention: str = "decomposed",
                dtype: str = "float32", kv_cache: str = "concat", max_cache: int | None = None) -> ExportRecord:
    """Export ``loaded`` to out_dir/model.onnx and record it in out_dir/manifest.json.

    seq_dynamic: batch, sequence, past and total lengths are symbolic; the causal mask is computed in the graph.
    Otherwise sequence_length = seq_len and past_sequence_length = past_len are fixed (batch stays dynamic).
    attention: "decomposed" (MatMul/Softmax/Where as exported), "onnx" (the ONNX Attention op, opset 23) or
    "ort" (com.microsoft MultiHeadAttention); see exporter/lowering/.
    dtype: "float32", "float16" or "bfloat16": weights, KV cache and logits in that dtype.
    opset: default 18, or 23 for attention="onnx".
    kv_cache: "concat" (present = concat(past, new)) or "shared" (past and present one buffer of ``max_cache``
    slots, default max_positions, written in place by com.microsoft GroupQueryAttention; rows packed from slot 0).
    """
    if attention not in LOWERINGS:
        raise ExportError(f"--attention {attention!r}: expected one of {', '.join(LOWERINGS)}")
    if kv_cache not in iospec.KV_CACHES:
        raise ExportError(f"--kv-cache {kv_cache!r}: expected one of {', '.join(iospec.KV_CACHES)}")
    lowering_name = attention
    if kv_cache == "shared":
        if not seq_dynamic:
            raise ExportError("--kv-cache shared needs dynamic axes (a decode loop over one buffer): drop --seq-static")
        if attention == "onnx":
            raise ExportError("--kv-cache shared: the ONNX Attention op has no in-place cache; the shared buffer is "
                              "written by com.microsoft GroupQueryAttention (--attention ort or the default)")
        lowering_name = "gqa"
        max_cache = loaded.contract.max_positions if max_cache is None else max_cache
        if not 1 <= max_cache <= loaded.contract.max_positions:
            raise ExportError(f"--max-cache {max_cache}: expected 1..max_positions={loaded.contract.max_positions}")
    elif max_cache is not None:
        raise ExportError("--max-cache sizes a shared cache: give it with --kv-cache shared")
    if dtype not in dtypes.NAMES:
        raise ExportError(f"--dtype {dtype!r}: expected one of {', '.join(dtypes.NAMES)}")
    if opset is None:
        opset = ATTENTION_OPSET if attention == "onnx" else DEFAULT_OPSET
    if not MIN_OPSET <= opset <= MAX_OPSET:
        raise ExportError(f"--opset {opset} is outside the supported range {MIN_OPSET}..{MAX_OPSET}")
    if attention == "onnx" and opset < ATTENTION_OPSET:
        raise ExportError(f"--attention onnx needs --opset {ATTENTION_OPSET} (the ONNX Attention op), got {opset}")
    c = loaded.contract
    if seq_dynamic:
        seq, past = EXAMPLE_SEQ, EXAMPLE_PAST
    else:
        if seq_len is None or seq_len < 1:
            raise ExportError("--seq-static needs --seq-len N (N >= 1)")
        seq, past = seq_len, past_len
    if seq + past > c.max_positions:
        raise ExportError(f"sequence {seq} + past {past} exceeds max_positions={c.max_positions}")
    out_dir = Path(out_dir)
    torch_dtype = models_torch_dtype(dtype)
    module = loaded.module if dtype == "float32" else copy.deepcopy(loaded.module).to(torch_dtype)
    args = example_inputs(c, seq=seq, past=past, dtype=torch_dtype)
    names_in, names_out = iospec.input_names(c.n_layers), iospec.output_names(c.n_layers)
    started = time.perf_counter()
    with stage_artifact(out_dir, "onnx") as staged, captured_warnings() as warns:
        tmp = staged.dir
        try:
            with torch.no_grad():
                program = torch.onnx.export(
                    module, args, dynamo=True, opset_version=opset,
                    dynamic_shapes=dynamic_shapes(c.n_layers, seq_dynamic),
                    input_names=names_in, output_names=names_out, verbose=False)
        except Exception as e:
            raise ExportError(_explain_export_failure(e, loaded.label)) from None
        if program is None:
            raise ExportError("torch.onnx.export returned no program")
        proto = program.model_proto
        _name_io_dims(proto, c, seq_dynamic)
        decomposed = (proto.SerializeToString() if lowering_name != "decomposed" and proto.ByteSize() < TWO_GB
                      else None)
        lowering = lower_attention(proto, lowering_name, n_heads=c.n_heads, head_dim=c.head_dim,
                                   n_kv_heads=c.n_kv_heads)
        if kv_cache == "shared":
            _name_cache_dims(proto)
        if attention == "decomposed" and (n_attn := lowering.op_counts.get("Attention", 0)):
            warns.append(f"--attention decomposed: torch.onnx already wrote {n_attn} ONNX Attention node(s) (the "
                         f"model calls scaled_dot_product_attention, opset {opset}); export at --opset 18 for a "
                         "decomposed graph")
        if decomposed is None:
            checked = None
        elif kv_cache == "shared":
            checked = self_check_shared(decomposed, proto, c, dtype, seq=seq, past=past, max_cache=max_cache)
        else:
            checked = self_check(decomposed, proto, c, dtype, attention, seq=seq, past=past)
        precision = precision_report(proto, dtype) if proto.ByteSize() < TWO_GB else None
        if precision is not None and precision.session_error:
            warns.append(f"ONNX Runtime CPU cannot run this {dtype} graph ({precision.session_error}); "
                         f"it needs an execution provider with {dtype} kernels (CUDA)")
        external = proto.ByteSize() > TWO_GB if hasattr(proto, "ByteSize") else False
        files = [ONNX_FILE]
        if external:
            onnx.save_model(proto, tmp / ONNX_FILE, save_as_external_data=True, all_tensors_to_one_file=True,
                            location=DATA_FILE, size_threshold=1024)
            files.append(DATA_FILE)
        else:
            onnx.save_model(proto, tmp / ONNX_FILE)
        check_onnx(tmp / ONNX_FILE)
        if seq_dynamic:  # onnxruntime-genai's generator loop needs dynamic sequence and past axes
            files.append(write_genai_config(tmp, c, filename=ONNX_FILE,
                                            model_config=getattr(loaded.module, "config", None), kv_cache=kv_cache))
        files += copy_tokenizer(loaded, tmp)  # an --hf folder's tokenizer travels with the model
        details = {
            "opset": opset, "attention": lowering_name, "kv_cache": kv_cache,
            **({"max_cache": max_cache, "padding": "right"} if kv_cache == "shared" else {}),
            "lowering": {**lowering.to_dict(), "self_check_max_abs_diff": checked},
            "precision": precision.to_dict() if precision else None, "external_data": external,
            "dynamic_axes": [iospec.BATCH, iospec.SEQ, iospec.PAST, iospec.TOTAL] if seq_dynamic else [iospec.BATCH],
            "example_sizes": {"batch": EXAMPLE_BATCH, "seq": seq, "past": past},
            "exporter": "torch.onnx.export(dynamo=True)",
        }
        # files an earlier export of another kind (dynamic, external data) left, which this one does not write
        return finish(loaded, staged, fmt="onnx", main_file=ONNX_FILE, files=files, dtype=dtype, details=details,
                      started=started, warns=list(warns), seq_dynamic=seq_dynamic,
                      static_sizes=None if seq_dynamic else (seq, past),
                      owned=(GENAI_CONFIG, DATA_FILE, *TOKENIZER_FILES))


def _explain_export_failure(e: Exception, label: str) -> str:
    text = str(e)
    for axis in (iospec.SEQ, iospec.PAST, iospec.TOTAL, iospec.BATCH):
        if axis in text and ("specializ" in text or "Constraints violated" in text or "constant" in text):
            return (f"{label}: torch.onnx could not keep the dynamic axis {axis!r}: the model fixes it to a constant "
                    f"(e.g. a mask of fixed size). {first_line(e)}")
    return describe_failure(e, f"{label}: torch.onnx.export failed")
