"""ONNX export through torch.onnx's dynamo exporter, with the contract's dynamic axes."""

from __future__ import annotations

import copy
import functools
import os
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import torch
from torch.export import Dim

from mhaexport.core import dtypes, iospec
from mhaexport.artifact import TWO_GB, stage_artifact
from mhaexport.artifact.details import CacheLayout, ExampleSizes, Lowering, OnnxDetails, Precision
from mhaexport.artifact.files import (DATA_FILE, EXTERNAL_DATA_BYTES, EXTERNAL_DATA_ENV,  # noqa: F401
                                      GRAPH_HEADROOM, ONNX_FILE, external_data_threshold)
from mhaexport.core.errors import ExportError, ExportOptionError, first_line
from mhaexport.exporter.common import (HEADROOM_NOTE, TRACED_WHOLE, ExportRecord, captured_warnings,
                                       copy_tokenizer, example_inputs, finish, module_bytes)
from mhaexport.exporter.failures import describe_failure
from mhaexport.exporter.genai import GENAI_CONFIG, write_genai_config
from mhaexport.exporter.lowering import ATTENTION_OPSET, LOWERINGS, lower_attention_ir, self_check, self_check_shared
from mhaexport.exporter.lowering.guard import refuse_unexpressible, self_check_sizes
from mhaexport.exporter.precision import precision_report
from mhaexport.exporter.trace import traced
from mhaexport.exporter import replicate as rep, trace_store
from mhaexport.exporter.streamed import check_stand_in, read_when_written, save_inline
from mhaexport.core.iospec import EXAMPLE_BATCH, EXAMPLE_PAST, EXAMPLE_SEQ
from mhaexport.models.inputs import torch_dtype as models_torch_dtype
from mhaexport.models.loading import LoadedModel
from mhaexport.models.stream import restaged
from mhaexport.runtime.protocol import padding_of
from mhaexport.runtime.tokenizer import TOKENIZER_FILES
from mhaexport.runners.wire import read_graph, refer_in_place

MIN_OPSET, MAX_OPSET = 18, 23
DEFAULT_OPSET = 18
# how the graph is traced: "auto" traces the first layers of a model whose layers are all alike and copies the last
# of them for the others (exporter/replicate.py), "whole" traces every layer, both reusing a trace this user's cache
# holds (exporter/trace_store.py); "fresh" traces every layer now and neither reads nor writes the cache
# (MHAEXPORT_TRACE sets it for every export)
TRACES = ("auto", "whole", "fresh")
TRACE_ENV = "MHAEXPORT_TRACE"
# ONNX Runtime memory-maps external data (model.onnx.data shows in a session's /proc/self/maps); large tensors start
# at multiples of 64 KiB, Windows' mapping granularity and a multiple of Linux's 4 KiB pages.
EXTERNAL_DATA_ALIGNMENT = 64 * 1024


def dynamic_shapes(n_layers: int, seq_dynamic: bool) -> tuple:
    """torch.export dynamic_shapes mirroring (input_ids, attention_mask, past_key_values): tuples, not lists.
    total_sequence_length gets its own Dim (Dim sums are not allowed). Static: batch only."""
    dims = {name: Dim(name) for name in (iospec.BATCH, iospec.SEQ, iospec.PAST, iospec.TOTAL)}
    axes = iospec.dynamic_input_axes(n_layers)

    def spec(name: str) -> dict:
        return {ax: dims[d] for ax, d in axes[name].items() if seq_dynamic or d == iospec.BATCH}

    past = tuple(tuple(spec(n) for n in iospec.past_names(i)) for i in range(n_layers))
    return spec(iospec.INPUT_IDS), spec(iospec.ATTENTION_MASK), past


def weight_bytes(model: ir.Model) -> int:
    """Bytes of the main graph's initializers (the weights, and constants the exporter folded into initializers)."""
    return sum(v.const_value.nbytes for v in model.graph.initializers.values() if v.const_value is not None)


def refuse_fixed_axes(model: ir.Model, dynamic_axes: dict[str, dict[int, str]]) -> None:
    """ExportError when an input axis of ``dynamic_axes`` ({input: {axis: dim name}}) came out a fixed number."""
    inputs = {v.name: v for v in model.graph.inputs}
    for name, axes in dynamic_axes.items():
        for axis, dim_name in axes.items():
            dim = inputs[name].shape[axis]
            if not isinstance(dim, ir.SymbolicDim) or dim.value is None:
                raise ExportError(
                    f"the dynamic axis {dim_name!r} ({name} axis {axis}) came out fixed at {dim}: the "
                    "model uses that length as a constant (e.g. a mask or buffer of fixed size), so the file would "
                    "only run at the export's example length; build the mask from the input shapes")


def _name_io_dims(model: ir.Model, contract: iospec.ModelContract, seq_dynamic: bool) -> None:
    """Refuse a graph whose sequence axes came out fixed, then give present.* outputs the contract's dim name
    (the exporter writes 'past_sequence_length + sequence_length')."""
    if not seq_dynamic:
        return
    refuse_fixed_axes(model, iospec.dynamic_input_axes(contract.n_layers))
    _name_axis2(model.graph.outputs, ("present.",), iospec.TOTAL)


def _name_axis2(values, prefixes: tuple[str, ...], dim_name: str) -> None:
    """Name axis 2 (the cache length) of the values whose names start with one of ``prefixes``."""
    for v in values:
        if v.name.startswith(prefixes):
            dims = list(v.shape)
            dims[2] = ir.SymbolicDim(dim_name)
            v.shape = ir.Shape(dims)


def save_model(model: ir.Model, path: Path, *, external: bool) -> list[str]:
    """Write ``model`` to ``path``; with ``external``, every tensor over 1 kB goes to one file beside it,
    ``<name>.data`` (:data:`DATA_FILE` for model.onnx). Tensors are written one at a time from the memory the
    model holds them in (torch's own parameters for an export): no protobuf of the whole model is built.
    Returns the names of the files written, the model file first."""
    if not external:
        ir.save(model, path)
        return [path.name]
    data = f"{path.name}.data"
    _contiguous_when_written(model)
    ir.save(model, path, external_data=data, size_threshold_bytes=1024, alignment=EXTERNAL_DATA_ALIGNMENT)
    return [path.name, data]


def _contiguous_when_written(model: ir.Model) -> None:
    """Give initializers held as strided numpy views a contiguous copy made only while each one is written.

    torch.onnx's optimizer folds each Linear weight's Transpose into a numpy view of torch's own parameter (no
    copy, which keeps the export's memory near the weights' size), and ``ndarray.tofile`` writes a strided array
    slowly: measured 53 MB/s against 175 MB/s for contiguous tensors on the same disk (8.5 s of the 9.7 s that
    saving 0.66 GB took).
    A lazy tensor copies one weight at a time, so at most one weight's copy is alive."""
    for value in model.graph.initializers.values():
        t = value.const_value
        if isinstance(t, ir.Tensor) and isinstance(t.raw, np.ndarray) and not t.raw.flags.c_contiguous:
            value.const_value = ir.LazyTensor(functools.partial(_contiguous_copy, t), t.dtype, t.shape, name=t.name,
                                              doc_string=t.doc_string, metadata_props=dict(t.metadata_props))


def _contiguous_copy(tensor: ir.Tensor) -> ir.Tensor:
    raw = tensor.raw
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a read-only view: torch only reads it here
            array = torch.from_numpy(raw).contiguous().numpy()  # torch's blocked copy: ~3x numpy's on a transpose
    except (TypeError, ValueError):  # a dtype torch does not take (ml_dtypes' bfloat16), negative strides
        array = np.ascontiguousarray(raw)
    return ir.Tensor(array, dtype=tensor.dtype, name=tensor.name)


def _name_cache_dims(model: ir.Model) -> None:
    """A shared cache's past inputs and present outputs are one buffer: name their length axis max_cache_length."""
    _name_axis2([*model.graph.inputs, *model.graph.outputs], ("past_key_values.", "present."), iospec.MAX_CACHE)


def _window_sized_cache(model: ir.Model) -> None:
    """``--kv-cache window``: every GroupQueryAttention with a sliding window (``local_window_size`` > 0) takes a
    window-sized buffer and evicts in place (``sliding_window_cache=1``, onnxruntime 1.32): its rows [0, L) hold the L
    most recent positions, W <= L <= C for a buffer of C slots. A full-length buffer (C = max_cache) is still right, so
    verify's contract calls feed it as a shared cache; the decode loop and onnxruntime-genai give it W + slack.

    Such a node also takes ``query_seqlens`` (its input 16: each row's real new tokens): without it ONNX Runtime
    takes min(S, T) new tokens per row and refuses a right-padded prompt batch ("seqlens_k[1] = 3 is too small for
    sequence_length 7"), which a full-length cache accepts. A row's new tokens are min(S, its real tokens): all of a
    prompt's real tokens (no past), one in a decode step, S in a chunk after a past (batch 1) — whichever way a
    loop lays the mask out, holes before the new column (mhaexport's deploy loop, onnxruntime-genai's Generator) or
    each row's ones packed from column 0 (onnxruntime-genai's Engine, whose packed decode masks gave a short row 0
    new tokens when they were the mask's last S columns summed: its tokens went wrong from the second on)."""
    windowed = [n for n in model.graph if n.op_type == "GroupQueryAttention" and n.domain == "com.microsoft"
                and (a := n.attributes.get("local_window_size")) is not None and a.as_int() > 0]
    if not windowed:
        return
    inputs = {v.name: v for v in model.graph.inputs}
    mask, ids = inputs[iospec.ATTENTION_MASK], inputs[iospec.INPUT_IDS]

    def const(name: str, array: np.ndarray) -> ir.Value:
        return ir.node("Constant", [], attributes={"value": ir.tensor(array, name=name)}, name=name,
                       num_outputs=1).outputs[0]

    one = const("wc_axis1", np.array([1], np.int64))
    width = ir.node("Shape", [ids], attributes={"start": 1, "end": 2}, name="wc_new_tokens")  # (1,): S
    real = ir.node("ReduceSum", [mask, one], attributes={"keepdims": 0}, name="wc_real_tokens")  # (B,)
    new = ir.node("Min", [real.outputs[0], width.outputs[0]], name="wc_real_new")  # (B,): min(real, S)
    q = ir.node("Cast", [new.outputs[0]], attributes={"to": ir.DataType.INT32}, name="query_seqlens")
    q.outputs[0].name = "query_seqlens"
    nodes = [one.producer(), width, real, new, q]
    model.graph.insert_before(next(iter(model.graph)), nodes)  # graph inputs only: first is in order
    for n in windowed:
        n.attributes["sliding_window_cache"] = ir.AttrInt64("sliding_window_cache", 1)
        if len(n.inputs) < 17:
            n.resize_inputs(17)
        n.replace_input_with(16, q.outputs[0])


def window_slots(contract: iospec.ModelContract, max_cache: int) -> list[int]:
    """Per layer, a window cache's decode-loop buffer: W + slack slots (onnxruntime-genai's CPU default, so the two
    loops hold the same layout) within ``max_cache`` on a sliding-window layer, 0 (the full ``max_cache``) elsewhere."""
    return [min(w + iospec.WINDOW_SLACK, max_cache) if w else 0 for w in contract.windows or ()]


# ONNX Runtime contrib ops that ORT registers in the default ONNX domain (onnx.checker does not know them): written by
# onnxscript's ort_fusions (--attention fused) for a norm with no residual to fuse
ORT_ONNX_DOMAIN_CONTRIB = frozenset({"SimplifiedLayerNormalization"})


def check_onnx(path: Path) -> None:
    """onnx.checker full check (with shape inference) and strict shape inference, always by path, so external data
    resolves beside the file (a ``ModelProto`` in memory would resolve it against the working directory) and the
    check works past 2 GB. A graph holding ORT's contrib ops of the default domain (ORT_ONNX_DOMAIN_CONTRIB) is
    checked without them known: those nodes are moved to com.microsoft in a copy of the graph written beside the file
    (its external data not loaded, so the copy is the graph alone and names the same data files), which the checker
    leaves to ONNX Runtime as every com.microsoft op; shape inference there is not strict. The self-check and verify
    run those nodes."""
    graph, where = read_graph(path)  # a one-file model's weights stay in the file
    contrib = [n for n in graph.graph.node if n.domain in ("", "ai.onnx") and n.op_type in ORT_ONNX_DOMAIN_CONTRIB]
    if not contrib:
        del graph
        _check_path(path, strict=True)
        return
    for n in contrib:
        n.domain = "com.microsoft"
    refer_in_place(graph, where, path.name)  # the copy beside the file reads the file's own bytes
    if not any(o.domain == "com.microsoft" for o in graph.opset_import):
        graph.opset_import.add(domain="com.microsoft", version=1)
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".check.onnx", dir=path.parent)
    copy = Path(name)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(graph.SerializeToString())
        del graph
        _check_path(copy, strict=False)
    finally:
        copy.unlink(missing_ok=True)


def _check_path(path: Path, *, strict: bool) -> None:
    """onnx.checker (full) and shape inference of the file at ``path``, its external data beside it."""
    inferred = path.with_name(path.name + ".inferred")
    try:
        onnx.checker.check_model(str(path), full_check=strict)
        onnx.shape_inference.infer_shapes_path(str(path), str(inferred), strict_mode=strict)
    except Exception as e:
        raise ExportError(f"the exported ONNX model fails onnx.checker/shape inference: {e}") from None
    finally:
        inferred.unlink(missing_ok=True)


def check_cache_options(kv_cache: str, max_cache: int | None, seq_dynamic: bool = True,
                        attention: str = "decomposed") -> None:
    """ExportOptionError (a ConfigError and an ExportError) for a cache layout the other options contradict; needs
    no model (the CLI asks before loading)."""
    if kv_cache not in iospec.KV_CACHES:
        raise ExportOptionError(f"--kv-cache {kv_cache!r}: expected one of {', '.join(iospec.KV_CACHES)}")
    if kv_cache in ("shared", "window"):
        if not seq_dynamic:
            raise ExportOptionError(f"--kv-cache {kv_cache} needs dynamic axes (a decode loop over one buffer): "
                                    "drop --seq-static")
        if attention == "onnx":
            raise ExportOptionError(f"--kv-cache {kv_cache}: the ONNX Attention op has no in-place cache; the shared "
                                    "buffer is written by com.microsoft GroupQueryAttention (--attention ort, fused "
                                    "or the default)")
    elif max_cache is not None:
        raise ExportOptionError("--max-cache sizes a shared cache: give it with --kv-cache shared")


def check_options(*, opset: int | None = None, seq_dynamic: bool = True, seq_len: int | None = None,
                  past_len: int = 0, attention: str = "decomposed", dtype: str = "float32", kv_cache: str = "concat",
                  max_cache: int | None = None) -> int:
    """The ONNX export's options, checked without the model (the API checks them before loading it):
    ExportOptionError (a ConfigError) for a value that is wrong or contradicts another. Returns the opset (the
    default resolved: 18, or 23 for attention="onnx")."""
    if attention not in LOWERINGS:
        raise ExportOptionError(f"--attention {attention!r}: expected one of {', '.join(LOWERINGS)}")
    check_cache_options(kv_cache, max_cache, seq_dynamic, attention)
    if dtype not in dtypes.NAMES:
        raise ExportOptionError(f"--dtype {dtype!r}: expected one of {', '.join(dtypes.NAMES)}")
    if opset is None:
        opset = ATTENTION_OPSET if attention == "onnx" else DEFAULT_OPSET
    if not MIN_OPSET <= opset <= MAX_OPSET:
        raise ExportOptionError(f"--opset {opset} is outside the supported range {MIN_OPSET}..{MAX_OPSET}")
    if attention == "onnx" and opset < ATTENTION_OPSET:
        raise ExportOptionError(f"--attention onnx needs --opset {ATTENTION_OPSET} (the ONNX Attention op), "
                                f"got {opset}", cli=f"--attention onnx needs opset {ATTENTION_OPSET} (the ONNX "
                                                    f"Attention op), got {opset}")
    if not seq_dynamic:
        if seq_len is None or seq_len < 1:
            raise ExportOptionError("--seq-static needs --seq-len N (N >= 1)")
        if past_len < 0:
            raise ExportOptionError(f"--past-len {past_len}: a length, >= 0")
    return opset


def export_onnx(loaded: LoadedModel, out_dir: str | Path, *, opset: int | None = None, seq_dynamic: bool = True,
                seq_len: int | None = None, past_len: int = 0, attention: str = "decomposed",
                dtype: str = "float32", kv_cache: str = "concat", max_cache: int | None = None,
                trace: str | None = None, progress: Callable[[str], None] | None = None) -> ExportRecord:
    """Export ``loaded`` to out_dir/model.onnx and record it in out_dir/manifest.json.

    seq_dynamic: batch, sequence, past and total lengths are symbolic; the causal mask is computed in the graph.
    Otherwise sequence_length = seq_len and past_sequence_length = past_len are fixed (batch stays dynamic).
    attention: "decomposed" (MatMul/Softmax/Where as exported), "onnx" (the ONNX Attention op, opset 23) or
    "ort" (com.microsoft MultiHeadAttention); see exporter/lowering/.
    dtype: "float32", "float16" or "bfloat16": weights, KV cache and logits in that dtype.
    opset: default 18, or 23 for attention="onnx".
    kv_cache: "concat" (present = concat(past, new)) or "shared" (past and present one buffer of ``max_cache``
    slots, default max_positions, written in place by com.microsoft GroupQueryAttention; rows packed from slot 0).
    A model loaded streamed (``loaded.weights``, :func:`mhaexport.models.loading.load_model`) is written from its
    staging file one tensor at a time (:mod:`mhaexport.exporter.streamed`): the same bytes, never whole in memory.
    trace: "auto" (default; ``MHAEXPORT_TRACE`` when set) traces a model whose layers are all alike cut to its first
    layers and copies the last traced layer for the others, each with its own weights (:mod:`mhaexport.exporter.
    replicate`, which checks the copy against the trace first and otherwise traces every layer, saying why);
    "whole" traces every layer; both reuse a trace of the same code, config and shapes from this user's cache
    (:mod:`mhaexport.exporter.trace_store`); "fresh" traces every layer now, the cache neither read nor written.
    ``progress``: told each phase as it starts (trace, lowering, write, check, self-check).
    """
    trace = trace or os.environ.get(TRACE_ENV) or "auto"
    if trace not in TRACES:
        raise ExportOptionError(f"trace {trace!r} ({TRACE_ENV}): expected one of {', '.join(TRACES)}")
    say = progress or (lambda _m: None)
    opset = check_options(opset=opset, seq_dynamic=seq_dynamic, seq_len=seq_len, past_len=past_len,
                          attention=attention, dtype=dtype, kv_cache=kv_cache, max_cache=max_cache)
    window_cache = kv_cache == "window"  # the shared cache, its sliding-window layers' buffers window-sized
    if window_cache:
        if not loaded.contract.windowed:
            raise ExportOptionError("--kv-cache window: the model has no sliding window (every layer attends to every "
                                    "earlier token, so every buffer is full-length): use --kv-cache shared")
        if max_cache is not None and max_cache < max(loaded.contract.windows):
            raise ExportOptionError(f"--kv-cache window --max-cache {max_cache}: below the sliding window of "
                                    f"{max(loaded.contract.windows)} (GroupQueryAttention's window-sized buffer holds "
                                    "at least its window)")
        kv_cache = "shared"  # exported as the shared cache, then its windowed layers' nodes evict in place
    refuse_unexpressible(loaded.contract, attention, kv_cache)  # a file that drops a mask feature is never written
    lowering_name = attention
    if kv_cache == "shared":
        lowering_name = "fused" if attention == "fused" else "gqa"
        max_cache = loaded.contract.max_positions if max_cache is None else max_cache
        if not 1 <= max_cache <= loaded.contract.max_positions:
            raise ExportOptionError(f"--max-cache {max_cache}: expected "
                                    f"1..max_positions={loaded.contract.max_positions}")
    c = loaded.contract
    seq, past = (EXAMPLE_SEQ, EXAMPLE_PAST) if seq_dynamic else (seq_len, past_len)
    if seq + past > c.max_positions:
        raise ExportOptionError(f"sequence {seq} + past {past} exceeds max_positions={c.max_positions}")
    out_dir = Path(out_dir)
    torch_dtype = models_torch_dtype(dtype)
    headroom = half_precision_headroom(loaded, dtype)  # a float16 file that would overflow: refused here
    threshold = external_data_threshold()  # a bad MHAEXPORT_EXTERNAL_DATA_BYTES is refused before any work
    started = time.perf_counter()
    whole = "torch.onnx.export(dynamo=True)"  # the manifest's exporter: what traced the graph

    def export(module, n_layers: int) -> tuple[ir.Model, str]:
        """torch.onnx's trace of ``module`` with ``n_layers`` layers (the contract's inputs and names for as many),
        optimized as torch.onnx optimizes it: a trace this user's cache holds for the same code, config and shapes
        (:mod:`mhaexport.exporter.trace_store`) given ``module``'s weights, else traced now (and stored). Returns
        the graph and how it was had, for the manifest."""
        key = None if trace == "fresh" else trace_store.trace_key(module, n_layers,
                                                                 (dtype, opset, seq_dynamic, seq, past))
        stored = trace_store.load(key, module) if key is not None else None
        if stored is not None:
            say(f"the trace of {loaded.label}'s code, config and shapes made by an earlier export, reused from this "
                "user's cache ...")
            model, warned = stored
            warns.extend(w for w in warned if w not in warns)
            return trace_store.optimize(model), f"{whole}, its trace reused from this user's cache"
        before = len(warns)
        cut = f" cut to its first {n_layers} layers (the others copied from the last)" if n_layers != c.n_layers else ""
        say(f"tracing {loaded.label}{cut} (torch.export, then torch.onnx's translation) ...")
        sub = rep.contract_of_first(c, n_layers) if n_layers != c.n_layers else c
        try:
            with torch.no_grad():
                program = torch.onnx.export(
                    module, example_inputs(sub, seq=seq, past=past, dtype=torch_dtype), dynamo=True,
                    opset_version=opset, dynamic_shapes=dynamic_shapes(n_layers, seq_dynamic),
                    input_names=iospec.input_names(n_layers), output_names=iospec.output_names(n_layers),
                    verbose=False, optimize=False)
        except Exception as e:
            raise ExportError(_explain_export_failure(e, loaded.label)) from None
        if program is None:
            raise ExportError("torch.onnx.export returned no program")
        # onnx_ir all the way: program.model wraps torch's own parameters; a ModelProto of the model would copy
        # every weight and cannot pass 2 GB
        if key is not None:
            trace_store.save(key, program.model, module, warns[before:])
        # optimized as a stored trace is (read back first): the file's bytes are the same whether the trace was
        # reused or made now
        return trace_store.optimize(trace_store.reloaded(program.model)), whole

    traced_now = False

    def build() -> tuple[tuple, ir.Model]:
        """((the module traced, its staging file, how it was traced), the graph)."""
        nonlocal traced_now
        traced_now = True
        weights = loaded.weights  # a streamed model's staging file: its parameters are that file memory-mapped
        if dtype == "float32" and not loaded.half:
            module = loaded.module
        elif loaded.half and all(p.dtype == torch_dtype for p in loaded.module.parameters() if p.is_floating_point()):
            module = loaded.module  # a bfloat16 folder kept bfloat16 for a bfloat16 export: written as it is
        elif weights is not None:  # converted one tensor at a time into a second staging file
            weights, module = restaged(loaded.module, weights, torch_dtype)
        else:
            module = copy.deepcopy(loaded.module).to(torch_dtype)
        stack = rep.layer_stack(module, c)[0] if trace == "auto" else None
        if stack is not None:
            with rep.truncated(module, stack, rep.TRACED_LAYERS):
                model, how = export(module, rep.TRACED_LAYERS)
            try:
                added = rep.replicate(model, module, stack, c.n_layers, weights)
            except rep.NotReplicated as e:
                warns.append(f"{TRACED_WHOLE}: the layers traced could not be copied ({e})")
            else:
                return (module, weights, f"{how}: the first {rep.TRACED_LAYERS} layers; layers "
                                         f"{rep.TRACED_LAYERS}..{c.n_layers - 1} copied from layer "
                                         f"{rep.TRACED_LAYERS - 1} ({added} nodes)"), model
        model, how = export(module, c.n_layers)
        return (module, weights, how), model

    with stage_artifact(out_dir, "onnx", expected_bytes=module_bytes(loaded.module, torch_dtype)) as staged, \
            captured_warnings() as warns:
        tmp = staged.dir
        # traced once per process for this model, dtype, opset and axes (exporter/trace.py): the module traced and
        # the staging file its parameters map (a streamed model's, or its float16 restaging) are kept with it
        (module, weights, exporter), model = traced(loaded.module, (dtype, opset, seq_dynamic, seq, past, trace),
                                                    build, warns)
        if not traced_now:
            say("the trace of this model made by an earlier export in this process, reused ...")
        _name_io_dims(model, c, seq_dynamic)
        size = weight_bytes(model)
        external = size > threshold
        # the checks that hold the whole model as one protobuf (ORT sessions from bytes, ORT's saved level-0
        # graph) run only where it fits in one
        too_big = (None if size + GRAPH_HEADROOM < TWO_GB else
                   f"not run: the weights ({size / 1e9:.2f} GB) do not fit one protobuf (2 GiB)")
        decomposed = None
        if lowering_name != "decomposed" and too_big is None:
            decomposed = ir.serde.serialize_model(model).SerializeToString()
        if lowering_name != "decomposed":
            say(f"lowering the attention: {lowering_name} ...")
        lowering = lower_attention_ir(model, lowering_name, n_heads=c.n_heads, head_dim=c.head_dim,
                                      n_kv_heads=c.n_kv_heads, max_positions=c.max_positions,
                                      shared_fused=kv_cache == "shared" and attention == "fused", windows=c.windows)
        if kv_cache == "shared":
            _name_cache_dims(model)
        if window_cache:
            _window_sized_cache(model)
        if lowering_name == "decomposed" and (n_attn := lowering.op_counts.get("Attention", 0)):
            warns.append(f"--attention decomposed: torch.onnx already wrote {n_attn} ONNX Attention node(s) (the "
                         f"model calls scaled_dot_product_attention, opset {opset}); export at --opset 18 for a "
                         "decomposed graph")
        # a streamed model's weights are read from its staging file as they are written, one at a time
        say(f"writing {ONNX_FILE}{' (its weights read one at a time)' if weights is not None else ''} ...")
        streamed = read_when_written(model, weights) if weights is not None else []
        inline = None
        if streamed and not external:  # one protobuf, written field by field: never whole in memory
            inline = save_inline(model, tmp / ONNX_FILE, streamed)
            files = [ONNX_FILE]
        else:
            files = save_model(model, tmp / ONNX_FILE, external=external)
        casts = sum(n.op_type == "Cast" for n in model.graph)
        del model, module, weights  # the IR's folded tensors (transposed weights) are not needed now
        say("checking the file (onnx.checker, shape inference) ...")
        if inline is None:
            check_onnx(tmp / ONNX_FILE)
        else:  # the same graph, its streamed weights a sparse external file: the checker never loads them
            with tempfile.TemporaryDirectory() as d:
                check_onnx(check_stand_in(inline, Path(d), ONNX_FILE))
            del inline
        checked = None
        if decomposed is not None:
            say(f"self-check: the {lowering_name} file against the decomposed graph on ONNX Runtime CPU ...")
            # beyond the longest window where the axes are dynamic, so a dropped or shifted window cannot pass
            cseq, cpast = self_check_sizes(c, seq, past, max_cache) if seq_dynamic else (seq, past)
            if kv_cache == "shared":
                checked = self_check_shared(decomposed, tmp / ONNX_FILE, c, dtype, seq=cseq, past=cpast,
                                            max_cache=max_cache, option="--kv-cache window" if window_cache
                                            else "--kv-cache shared")
            else:
                checked = self_check(decomposed, tmp / ONNX_FILE, c, dtype, attention, seq=cseq, past=cpast)
            del decomposed
        precision = precision_report(tmp / ONNX_FILE, dtype, casts_in_graph=casts, not_run=too_big)
        if headroom is not None:
            precision.extra["headroom"] = headroom.to_dict()
            warns.append(f"{HEADROOM_NOTE} {headroom.summary(dtype)}")
            if dtype == "float16" and (thin := headroom.thin()) is not None:
                warns.append(f"float16 headroom is thin: {thin.module} ({thin.layer}) reaches {thin.peak:,.6g} on "
                             f"eager float32 ({headroom.inputs}), {thin.float16_margin:.3g}x under float16's 65,504: "
                             "other inputs may overflow it (bfloat16 keeps float32's range)")
        if precision.session_error:
            warns.append(f"ONNX Runtime CPU cannot run this {dtype} graph ({precision.session_error}); "
                         f"it needs an execution provider with {dtype} kernels (CUDA)")
        shipped = copy_tokenizer(loaded, tmp)  # an --hf folder's tokenizer travels with the model
        if seq_dynamic:  # onnxruntime-genai's generator loop needs dynamic sequence and past axes
            files.append(write_genai_config(tmp, c, filename=ONNX_FILE, model_config=getattr(loaded.module, "config",
                                            None), kv_cache="window" if window_cache else kv_cache,
                                            tokenizer={n: tmp / n for n in shipped}))
        files += shipped
        shared = kv_cache == "shared"
        details = OnnxDetails(
            opset=opset, attention=lowering_name,
            cache=CacheLayout("window" if window_cache else kv_cache, max_cache if shared else None,
                              padding_of(kv_cache) if shared else None,
                              window_slots=window_slots(c, max_cache) if window_cache else None),
            lowering=Lowering.from_dict({**lowering.to_dict(), "self_check_max_abs_diff": checked,
                                         "self_check_not_run": _self_check_not_run(lowering_name, dtype, too_big)}),
            precision=Precision.from_dict(precision.to_dict()), external_data=external,
            weight_bytes=size,
            dynamic_axes=[iospec.BATCH, iospec.SEQ, iospec.PAST, iospec.TOTAL] if seq_dynamic else [iospec.BATCH],
            example_sizes=ExampleSizes(EXAMPLE_BATCH, seq, past),
            exporter=exporter,
        )
        # files an earlier export of another kind (dynamic, external data) left, which this one does not write
        return finish(loaded, staged, fmt="onnx", main_file=ONNX_FILE, files=files, dtype=dtype, details=details,
                      started=started, warns=list(warns), seq_dynamic=seq_dynamic,
                      static_sizes=None if seq_dynamic else (seq, past),
                      owned=(GENAI_CONFIG, DATA_FILE, *TOKENIZER_FILES))


def half_precision_headroom(loaded: LoadedModel, dtype: str):
    """Eager float32's per-layer activation peaks (:func:`mhaexport.models.headroom.measure`) before a float16 or
    bfloat16 export (None for float32). A model whose activations pass float16's range is refused for a float16
    export (ExportOptionError, one line naming the layer): its file would compute inf there and NaN logits."""
    if dtype == "float32":
        return None
    from mhaexport.models.headroom import measure

    headroom = measure(loaded.module, loaded.contract, weights=loaded.weights, float32=loaded.half)
    if dtype == "float16" and headroom.overflow is not None:
        raise ExportOptionError(f"--dtype float16: {headroom.summary('float16')}; export --dtype bfloat16 "
                                "(float32's range) or float32")
    return headroom


def _self_check_not_run(attention: str, dtype: str, too_big: str | None) -> str | None:
    """Why the lowering's self-check did not run (None when it ran)."""
    if attention == "decomposed":
        return "nothing lowered"
    if too_big is not None:
        return too_big
    if dtype == "bfloat16":
        return "not run: numpy cannot feed bfloat16"
    return None


def _explain_export_failure(e: Exception, label: str) -> str:
    text = str(e)
    for axis in (iospec.SEQ, iospec.PAST, iospec.TOTAL, iospec.BATCH):
        if axis in text and ("specializ" in text or "Constraints violated" in text or "constant" in text):
            return (f"{label}: torch.onnx could not keep the dynamic axis {axis!r}: the model fixes it to a constant "
                    f"(e.g. a mask of fixed size). {first_line(e)}")
    return describe_failure(e, f"{label}: torch.onnx.export failed")
