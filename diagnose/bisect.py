"""When parity fails, say where: compare the ONNX graph's intermediate values with eager PyTorch's, per module.

Like Polygraphy's mark-all or torch.onnx's ``compare_intermediates``, but it reads like the model: every float
value the graph computes is made a graph output, eager PyTorch runs with a forward hook on every submodule, and
each module's output (and input) is matched to its ONNX value through the module scopes torch.onnx records on each
node (``pkg.torch.onnx.name_scopes``). Rows are ordered as the graph runs; the report names

- the **first divergent** tensor: the first module output whose relative error exceeds the tolerance,
- the **culprit**: the first module whose input still agrees but whose output does not — the module whose own
  computation went wrong (a scale, a mask, a lowering), with the ONNX nodes that belong to it alone, and
- when the culprit is an attention module, the **step** inside it that first diverges (scores, scale, mask fill,
  softmax, weighted sum, output projection): ``attention_steps.py`` records eager's torch calls inside the module
  and finds the same steps by pattern among its ONNX nodes.

Caveat: exposing every value keeps ONNX Runtime from fusing across them, so a bug that only a fusion causes can
vanish under bisect; run it with ``opt_level="disable"`` and the default to tell the two apart.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mhaexport.core import iospec
from mhaexport.core.errors import ArtifactError, ConfigError, MhaExportError
from mhaexport.core.libraries import library_call
from mhaexport.core.untrusted import shown_fields
from mhaexport.artifact import TWO_GB, shown_path
from mhaexport.core.graph import SCOPES_KEY, GraphIndex, name_scopes
from mhaexport.artifact.details import OnnxDetails
from mhaexport.runtime.feed import Feed
from mhaexport.runtime.session import DEFAULT_OPT_LEVEL, OPT_LEVELS, SessionConfig, open_session
from mhaexport.verify.sweep import Case, build_sweep
from mhaexport.runners.wire import read_graph, refer_in_place
from mhaexport.diagnose.attention_steps import (FUSED_OPS, StepDiff, compare_steps, first_tensor, onnx_ops,
                                              relative_error, trace_module)

FLOAT_TYPES = {1, 10, 11, 16}  # onnx.TensorProto FLOAT, FLOAT16, DOUBLE, BFLOAT16
BLOCK_RE = re.compile(r"^(.*?\.\d+)(?:\.|$)")  # "blocks.1.attn.W_o" -> "blocks.1"


@dataclass
class TensorDiff:
    """One module's output (or one graph output) compared: ONNX value vs eager tensor."""

    module: str  # "blocks.1.attn", or "output present.1.key" for graph outputs
    onnx_value: str  # the ONNX value name
    op: str  # "OpType node_name" producing it
    position: int  # index of the producing node in the graph (graph order = run order)
    shape: tuple[int, ...]
    max_abs: float
    rel: float  # max|onnx - eager| / max|eager|; inf where ONNX is non-finite and eager is not
    input_rel: float | None = None  # the same for the module's input, where it was found in the graph
    depth: int = 0  # module nesting depth (children sort before parents at the same position)
    first_position: int | None = None  # a (batch, seq, ...) value beyond tolerance: the lowest token position there
    input_value: str | None = None  # the ONNX value the input was compared at
    input_abs: float | None = None  # max|onnx - eager| of the input


@dataclass
class MaskDiff:
    """One layer's mask or score feature as the graph's fused attention node writes it against the model's contract
    (issue 37): a sliding window dropped or shifted, a softcap missing. Read from the node's attributes, so it is named
    whatever case bisect runs at (a window shows in values only from position W on)."""

    layer: int
    feature: str  # the contract's field: "windows", "attn_softcap"
    node: str  # "GroupQueryAttention node_name"
    attribute: str  # "local_window_size", "softcap"
    graph: float  # the attribute's value in the graph
    model: float  # the value the model's contract asks for (the attribute's spelling: -1 / 0 for none)
    note: str  # what the difference means: "dropped: every earlier key is seen", "shifted by +1"

    def line(self) -> str:
        return (f"layer {self.layer} (blocks.{self.layer}): {self.feature} differs: the graph's {self.node} has "
                f"{self.attribute}={self.graph:g}, the model's is {self.model:g} ({self.note})")


@dataclass
class BisectReport:
    """Where the ONNX graph first departs from eager PyTorch. ``ok`` is True when nothing diverged."""

    model: str  # the ONNX file compared
    shapes: dict[str, int]
    tol: float
    provider: str
    rows: list[TensorDiff] = field(default_factory=list)
    first_divergent: TensorDiff | None = None
    culprit: TensorDiff | None = None
    block: str | None = None  # the decoder block holding the culprit ("blocks.1"), None outside blocks
    culprit_nodes: list[str] = field(default_factory=list)  # ONNX nodes in the culprit's own scope
    unmatched: list[str] = field(default_factory=list)  # eager modules whose output no ONNX value in scope computes
    # inside attention: when the culprit is an attention module (or ``steps_of`` names one), its steps compared
    steps_module: str | None = None  # the module whose steps were compared
    steps: list[StepDiff] = field(default_factory=list)  # scores, scale, mask fill, softmax, weighted sum, output
    step: StepDiff | None = None  # the first step that diverges
    steps_note: str = ""  # what the first divergent step's values say, or why no step was compared
    pad: list[int] = field(default_factory=list)  # left padding per row over past + seq (the case's positions)
    case_from: str = ""  # where the case came from: "--case", "b=1 seq=128 past=0: ort-cpu's worst parity case ..."
    protocol: str = "concat cache, left padding"  # how the file was fed
    row: int | None = None  # a shared cache, fed one row per call: the row this report is of
    rows_run: int = 1  # calls made (rows, for a shared cache); the report is the first that diverged, else the last
    notes: list[str] = field(default_factory=list)  # what was compared differently (outputs only, tolerance)
    positions: tuple[int, int] = (0, 0)  # the lowest and highest token position the (shown) call computed
    fused_op: str | None = None  # the culprit is one fused node ("GroupQueryAttention node_x"): damage inside it
    kind: str = "onnx"  # what was bisected: "onnx" (the ONNX graph) or "pt2" (a torch.export program)
    masks: list[MaskDiff] = field(default_factory=list)  # the graph's per-layer mask attributes against the model's

    @property
    def ok(self) -> bool:
        return self.first_divergent is None

    def __bool__(self) -> bool:
        return self.ok

    def to_dict(self) -> dict:
        return asdict(self) | {"ok": self.ok}

    def summary(self, all_rows: bool = False) -> str:
        """Text for the CLI: the table (divergent rows and their neighbours unless ``all_rows``), then the verdict.
        Every name from the graph is shown escaped (a node name cannot clear the screen or start a line)."""
        if not getattr(self, "_shown", False):
            escaped = shown_fields(self)
            escaped._shown = True
            return escaped.summary(all_rows)
        s = self.shapes
        pad = f" pad={self.pad}" if any(self.pad) else ""
        source = f" ({self.case_from})" if self.case_from else ""
        lines = [f"bisect {self.model} on {self.provider} at batch={s['batch']} seq={s['seq']} past={s['past']}{pad}"
                 f"{source}: relative error = max|{self.kind} - eager| / max|eager|, tolerance {self.tol:.0e}"]
        if self.protocol != "concat cache, left padding":
            row = ""
            if self.row is not None:
                row = (f"; rows compared: {self.rows_run}, all agree (the table: row {self.row})" if self.ok
                       else f"; the table: row {self.row}, the first that diverges")
            lines.append(f"  fed in the file's protocol: {self.protocol}{row}")
        lines += [f"  {note}" for note in self.notes]
        lines.append(f"  {'module':<28} {self.kind + ' value':<18} {'op':<26} {'rel err':>9} {'input':>9}")
        show = self.rows
        if not all_rows and self.first_divergent is not None:
            i = next(k for k, r in enumerate(self.rows) if r == self.first_divergent)
            show = self.rows[max(0, i - 3): i + 6]
        for r in show:
            mark = "  <-- culprit" if r == self.culprit else ("  <-- first divergence" if r == self.first_divergent
                                                               else "")
            inp = f"{r.input_rel:9.1e}" if r.input_rel is not None else f"{'-':>9}"
            lines.append(f"  {r.module:<28} {r.onnx_value:<18} {r.op[:26]:<26} {r.rel:9.1e} {inp}{mark}")
        if self.ok:
            lines.append(f"no divergence: all {len(self.rows)} compared tensors within {self.tol:.0e}")
        else:
            f, c, st = self.first_divergent, self.culprit, self.step
            if (st is not None and c is not None and self.steps_module == c.module
                    and (f.module == c.module or f.module.startswith(c.module + "."))):
                # the step is the first value that diverges: it lies inside the culprit, before its output
                val = f"value {st.onnx_value}, {st.op}" if st.onnx_value else "no such value in the ONNX graph"
                rel = f", rel err {st.rel:.1e}" if st.rel is not None else ""
                lines.append(f"first divergence: {c.module} at step '{st.step}' ({val}{rel}): {st.note}")
            else:
                lines.append(f"first divergence: {f.module} ({f.onnx_value}, {f.op}): rel err {f.rel:.1e}")
            if f.first_position is not None:
                lines.append(f"  {f.module} first differs at token position {f.first_position}"
                             + (f" (positions {self.positions[0]}-{f.first_position - 1} of this case agree)"
                                if f.first_position > self.positions[0] else ""))
            if c is not None and self.fused_op:
                where = f" in block {self.block}" if self.block else ""
                inp = (f"its inputs agree ({c.input_rel:.1e}), " if c.input_rel is not None else
                       "its inputs are no eager module's output, ")
                lines.append(f"culprit{where}: the fused {self.fused_op} ({c.module}): {inp}its output differs "
                             f"({c.rel:.1e}): damage inside the fused op, not in the module that reads it")
            elif c is not None:
                where = f" in block {self.block}" if self.block else ""
                inp = f"input agrees ({c.input_rel:.1e}), " if c.input_rel is not None else ""
                lines.append(f"culprit{where}: {c.module}: {inp}output differs ({c.rel:.1e})")
        lines += self._steps_lines()
        if self.masks:
            lines.append("the graph's masks against the model's, per layer (the fused node's attributes):")
            lines += [f"  {m.line()}" for m in self.masks]
        if not self.ok and self.culprit is not None and self.culprit_nodes:
            lines.append(f"  {self._nodes_name} nodes of {self.culprit.module} itself: {', '.join(self.culprit_nodes)}")
        if self.unmatched:
            lines.append(f"not compared (no {self._nodes_name} value in its scope computes its output): "
                         f"{', '.join(self.unmatched)}")
        return "\n".join(lines)

    @property
    def _nodes_name(self) -> str:
        return "ONNX" if self.kind == "onnx" else "program"

    def _steps_lines(self) -> list[str]:
        if self.steps_module is None:
            return []
        if not self.steps:
            return [f"  inside {self.steps_module}: {self.steps_note}"]
        lines = [f"  steps inside {self.steps_module} (eager vs ONNX at real positions):"]
        for d in self.steps:
            rel = f"{d.rel:9.1e}" if d.rel is not None else f"{'-':>9}"
            mark = "  <-- first divergent step" if d == self.step else ("" if d.rel is not None or not d.note
                                                                         else f"  ({d.note})")
            lines.append(f"    {d.step:<18} {d.onnx_value or '-':<18} {(d.op or '-')[:26]:<26} {rel}{mark}")
        if self.step is None:
            lines.append(f"  {self.steps_note}")
        return lines


def _module_paths(scopes: list[str] | None) -> list[str]:
    """Module paths a node sits in, outermost first: ['', 'blocks.1', 'blocks.1.attn', 'div_1'] -> [blocks.1, ...]."""
    return [s for s in (scopes or [])[1:-1] if s]


def _same_shaped_outputs(out: Any, shape: tuple) -> int:
    """How many float tensors of ``shape`` a module's output holds (a tuple like RoPE's (cos, sin) holds two)."""
    import torch

    if isinstance(out, torch.Tensor):
        return int(out.is_floating_point() and tuple(out.shape) == shape)
    if isinstance(out, (tuple, list)):
        return sum(_same_shaped_outputs(item, shape) for item in out)
    return 0


def _eager_values(module, ids, mask, past) -> tuple[dict[str, tuple[np.ndarray | None, np.ndarray]], Any]:
    """Run eager with a hook on every submodule: {path: (first input, first output)} of each module's first call
    (the first input: the first tensor argument, else the first tensor keyword argument).
    A module whose output holds several float tensors of its first output's shape is left out: "the last value of
    that shape in its scope" could be any of them (transformers' rotary embedding returns (cos, sin))."""
    import torch

    seen: dict[str, tuple[np.ndarray | None, np.ndarray]] = {}
    handles = []

    def hook(path):
        def fn(mod, args, kwargs, out):
            if path in seen:
                return
            # the input: the first tensor passed, positionally or by keyword (transformers' layers call their
            # attention as self_attn(hidden_states=...))
            o, i = first_tensor(out), first_tensor(args)
            if i is None:
                i = first_tensor(list(kwargs.values()))
            if o is not None and o.is_floating_point() and _same_shaped_outputs(out, tuple(o.shape)) == 1:
                inp = i.detach().float().numpy().copy() if i is not None and i.is_floating_point() else None
                seen[path] = (inp, o.detach().float().numpy().copy())
        return fn

    for path, sub in module.named_modules():
        if path:
            handles.append(sub.register_forward_hook(hook(path), with_kwargs=True))
    try:
        with torch.no_grad():
            out = module(ids, mask, past)
    finally:
        for h in handles:
            h.remove()
    return seen, out


def _expose_all(proto) -> tuple[Any, list[str]]:
    """A copy of the model whose every float node output is also a graph output; returns it and the added names."""
    import onnx

    inferred = onnx.shape_inference.infer_shapes(proto)
    types = {vi.name: vi.type.tensor_type.elem_type for vi in
             list(inferred.graph.value_info) + list(inferred.graph.output) + list(inferred.graph.input)}
    model = onnx.ModelProto()
    model.CopyFrom(proto)
    existing = {o.name for o in model.graph.output}
    added = []
    for node in model.graph.node:
        for name in node.output:
            if not name or name in existing:
                continue
            if name not in types or types[name] == 0:
                # shape inference stops at ops it does not know (com.microsoft contrib ops): expose the value
                # untyped, ONNX Runtime fills the type in; non-float values are dropped after the run
                model.graph.output.append(onnx.ValueInfoProto(name=name))
            elif types[name] in FLOAT_TYPES:
                model.graph.output.append(onnx.helper.make_tensor_value_info(name, types[name], None))
            else:
                continue
            existing.add(name)
            added.append(name)
    return model, added


def _calls(feed: Feed, ids, mask, cache) -> list[tuple[int | None, tuple]]:
    """The calls that feed the case in the file's protocol: [(row or None, (ids, mask, cache))] as torch tensors.

    The contract's concat cache (mhaexport's own exports, adopted concat files): the whole batch in one call, its
    left padding as it is. A shared buffer (``--kv-cache shared``, onnxruntime-genai's builder): the protocol's
    translation of the contract call (:meth:`mhaexport.runtime.protocol.SharedBuffer.calls`), each row alone (bisect
    compares rows one by one) — its real tokens only, at the same positions as in the padded batch (positions count
    real tokens), the row's real past in the buffer's first slots."""
    import torch

    if not feed.shared:
        return [(None, (ids, mask, cache))]
    calls, _idle = feed.protocol_object().calls(ids.numpy(), mask.numpy(), rows_alone=True)
    out = []
    for call in calls:  # one row each
        (b,), at = call.rows, torch.from_numpy(call.past_at[0])
        row_cache = tuple((k[b:b + 1][:, :, at], v[b:b + 1][:, :, at]) for k, v in cache)  # (1, H_kv, p, D)
        out.append((b, (torch.from_numpy(call.ids), torch.from_numpy(call.mask), row_cache)))
    return out


def _inputs(feed: Feed, ids, mask, cache, kv_dtype) -> dict:
    """One call's inputs under the file's own names (:meth:`Feed.token_inputs`: position_ids from the mask where the
    file takes them); a shared cache's past is its buffer of ``feed.max_cache`` slots, the real past in the first
    ones."""
    ids_np, mask_np = ids.numpy(), mask.numpy()
    inputs = feed.token_inputs(ids_np, mask_np)
    flat = [t.numpy().astype(kv_dtype) for kv in cache for t in kv]  # (B, H_kv, past, D) each
    if feed.shared:
        slots = feed.protocol_object().slots(mask_np.shape[1], at_least=True)
        bufs = []
        for t in flat:
            buf = np.zeros(t.shape[:2] + (slots,) + t.shape[3:], kv_dtype)  # (B, H_kv, slots, D)
            buf[:, :, :t.shape[2]] = t
            bufs.append(buf)
        flat = bufs
    inputs.update(zip(feed.past, flat))
    return inputs



def check_shapes(c, batch: int, seq: int, past: int, pad) -> None:
    """MhaExportError unless (batch, seq, past) and the padding counts are a case the contract ``c`` can run."""
    if seq < 1 or batch < 1 or past < 0 or past + seq > c.max_positions:
        raise MhaExportError(f"bisect shapes batch={batch} seq={seq} past={past}: need batch, seq >= 1, past >= 0 "
                             f"and past + seq <= max_positions={c.max_positions}")
    if pad is not None and (len(pad) > batch or any(p < 0 or p >= past + seq for p in pad)):
        raise MhaExportError(f"bisect padding {list(pad)} at batch={batch} seq={seq} past={past}: one count per row "
                             f"at most, each below past + seq = {past + seq}")


def bisect_onnx(onnx_model: str | Path | Any, loaded, *, batch: int = 2, seq: int = 4, past: int = 3,
                pad: list[int] | None = None, seed: int = 0, tol: float = 1e-3,
                provider: str = "CPUExecutionProvider", opt_level: str = DEFAULT_OPT_LEVEL,
                steps_of: str | None = None, feed: Feed | None = None,
                scope_hints: dict[str, list[str]] | None = None, outputs_only: str | None = None) -> BisectReport:
    """Compare an ONNX model (path or ModelProto) with ``loaded`` (a LoadedModel) module by module.

    When the culprit is an attention module (a Softmax among its own ONNX nodes), its steps are compared too
    (``diagnose/attention_steps.py``): scores, scale, mask fill, softmax, weighted sum, output projection; the report's
    ``step`` is the first that diverges. ``steps_of`` (a module path) compares that module's steps whether or not
    anything diverges.

    A path may keep its weights in external data (models over 2 GB): the graph is read without them and ONNX Runtime
    reads them from beside the file. A ModelProto must hold its weights inline (under 2 GB).

    Inputs are the seeded contract inputs at (batch, seq, past), left-padded by ``pad``, fed in the file's protocol:
    ``feed`` (:class:`~mhaexport.runtime.feed.Feed`, from the folder's manifest; default: the contract's names and
    concat cache, the cache's dtype the graph's) names the file's I/O and its cache; a shared cache (buffers of
    ``feed.max_cache`` slots) is fed one row per call (:func:`_calls`), and
    the report is the first row that diverges (else the last row's). A file another tool made that carries no
    module scopes is compared on its outputs only (logits, each layer's key and value), as is any file when
    ``outputs_only`` says why. ``scope_hints``: module scopes for nodes that lost theirs, by node name (a quantized
    file's MatMulNBits, from its float source).
    ``tol`` is the relative error above which a tensor counts as divergent (1e-3 suits float32; use 1e-2 for float16
    exports, a quantized scheme's relative logit error for quantized ones).
    """
    import onnx

    from mhaexport.models.inputs import make_inputs

    if isinstance(onnx_model, (str, Path)):
        label = str(onnx_model)
        data_dir = str(Path(onnx_model).resolve().parent)  # where ONNX Runtime finds the file's external data
        with library_call("onnx", shown_path(onnx_model)):
            # the graph; a one-file model's weights referenced in the file, external ones where they are: none read
            proto, where = read_graph(onnx_model)
            refer_in_place(proto, where, Path(onnx_model).name)
    else:
        label, proto, data_dir = "<in-memory ONNX model>", onnx_model, None
    index = GraphIndex(proto.graph)
    nodes = index.nodes
    scopes = [name_scopes(n) or (scope_hints or {}).get(n.name) for n in nodes]
    notes: list[str] = [f"{outputs_only}: compared on its outputs only (logits, each layer's key and value)"] \
        if outputs_only else []
    if not any(scopes) and not notes:
        if feed is None or feed.scoped:
            raise MhaExportError(f"{label} carries no module scopes ({SCOPES_KEY}) on its nodes: bisect needs a model "
                                 "exported by torch.onnx.export(dynamo=True) without stripping node metadata")
        notes.append(f"the file ({feed.producer}) carries no module scopes: compared on its outputs only "
                     "(logits, each layer's key and value)")
    c = loaded.contract
    check_shapes(c, batch, seq, past, pad)
    ids, mask, cache = make_inputs(c, batch=batch, seq=seq, past=past, seed=seed, pad=pad)
    shared = feed is not None and feed.shared
    protocol = (f"one shared buffer per layer ({feed.max_cache} slots), each row alone, packed from slot 0"
                if shared else "concat cache, left padding")

    # ONNX: every float value (onnx's shape inference reads the file's graph: its failure is the file's)
    with library_call("onnx", shown_path(label) if data_dir is not None else label):
        exposed, _ = _expose_all(proto)
    if data_dir is None and exposed.ByteSize() > TWO_GB:  # protobuf's limit for one serialized message
        raise MhaExportError(f"{label} holds over 2 GB inline: save it with external data (onnx.save_model(..., "
                             "save_as_external_data=True)) and bisect the file")
    if opt_level not in OPT_LEVELS:
        raise ConfigError(f"opt_level {opt_level!r}: expected one of {', '.join(OPT_LEVELS)}")
    # the exposed copy is served from memory without its weights, which ONNX Runtime reads from the original file's
    # folder (external_data_dir): no copy of a large model's external data is made
    sess = open_session(exposed.SerializeToString(), SessionConfig(providers=(provider,), opt_level=opt_level,
                                                                   external_data_dir=data_dir))[0]
    if feed is None:  # a bare model: the contract's names, the cache's dtype the graph's (fp16 exports)
        past0 = {i.name: i.type for i in sess.get_inputs()}.get(iospec.past_names(0)[0], "tensor(float)")
        feed = Feed.contract(c.n_layers, cache_dtype="float16" if past0 == "tensor(float16)" else "float32")
    kv_dtype = np.float16 if feed.cache_dtype == "float16" else np.float32
    out_names = [o.name for o in sess.get_outputs()]
    producer = index.producer_index
    # the file's output names for the contract's
    outputs = set(iospec.output_names(c.n_layers))
    file_name = {k: v for k, v in feed.file_names().items() if k in outputs}

    report = None
    biases = _fused_biases(proto, nodes, data_dir)  # values whose module's bias a fused op adds
    calls = _calls(feed, ids, mask, cache)
    for row, call in calls:
        # eager: every submodule's first input and output
        eager, (logits, present) = _eager_values(loaded.module, *call)
        if notes:
            eager = {}  # no scopes: the outputs only
        expected_out = {iospec.LOGITS: logits.float().numpy()}
        for i, (k, v) in enumerate(present):
            kn, vn = iospec.present_names(i)
            expected_out[kn], expected_out[vn] = k.float().numpy(), v.float().numpy()
        inputs = _inputs(feed, *call, kv_dtype)
        values = {n: v for n, v in zip(out_names, sess.run(out_names, inputs))
                  if isinstance(v, np.ndarray) and np.issubdtype(v.dtype, np.floating)}
        call_mask = call[1].numpy()
        positions = np.maximum(np.cumsum(call_mask, axis=-1) - 1, 0)[:, -call[0].shape[1]:]  # (B, T), as the model's
        report = _compare(label, nodes, scopes, values, producer, eager, expected_out, file_name, tol, positions,
                          biases)
        report.shapes = {"batch": batch, "seq": seq, "past": past}
        report.positions = (int(positions.min()), int(positions.max()))
        report.pad = list(pad or [])
        report.provider = sess.get_providers()[0]
        report.protocol, report.notes = protocol, list(notes)
        if shared:
            report.row = row
            report.rows_run = len(calls)
        if not report.ok:
            break
    target = steps_of or (report.culprit.module if report.culprit is not None
                          and not report.culprit.module.startswith("output ") else None)
    if target is not None:
        _inside_attention(report, target, proto, index, scopes, values, loaded.module, call,
                          explicit=steps_of is not None)
    report.masks = mask_diffs(proto.graph, c)
    return report


def mask_diffs(graph, contract) -> list[MaskDiff]:
    """Per layer, the mask and score features a GroupQueryAttention node carries as attributes (its sliding window
    ``local_window_size``, its ``softcap``) against the model's contract: a window dropped (-1 where the layer has one),
    shifted (W±1), added (where the layer attends to every key), a softcap dropped or changed. The layer is the one
    whose ``past_key_values.{i}.key`` the node reads, else the node's order. Empty where every node agrees or the graph
    has no such node (a decomposed graph builds its window from positions: a wrong one shows in values only)."""
    import onnx

    out: list[MaskDiff] = []
    gqa = [n for n in graph.node if n.op_type == "GroupQueryAttention"]
    for order, n in enumerate(gqa):
        m = re.fullmatch(r"\S*?(\d+)\S*", n.input[3]) if len(n.input) > 3 and n.input[3] else None
        layer = int(m.group(1)) if m else order
        if layer >= contract.n_layers:
            continue
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}
        label = f"GroupQueryAttention {n.name}"
        got, want = int(attrs.get("local_window_size", -1)), contract.window(layer)
        if (got if got > 0 else 0) != want:
            note = ("dropped: every earlier key is seen" if got <= 0 else
                    f"shifted by {got - want:+d}: a query sees {got} keys, not {want}" if want else
                    "a window the model does not have")
            out.append(MaskDiff(layer, "sliding window", label, "local_window_size", got, want or -1, note))
        cap, want_cap = float(attrs.get("softcap", 0.0)), float(contract.attn_softcap or 0.0)
        if not np.isclose(cap, want_cap, rtol=1e-6, atol=0.0):
            note = ("dropped: the scores are not capped" if not cap else
                    "a softcap the model does not have" if not want_cap else f"{cap:g} instead of {want_cap:g}")
            out.append(MaskDiff(layer, "attention softcap", label, "softcap", cap, want_cap, note))
    return out


def _first_position(actual: np.ndarray, expected: np.ndarray, positions: np.ndarray, tol: float) -> int | None:
    """For a value laid out (batch, seq, ...) like the call's tokens: the lowest token position (positions count
    real tokens, as the model's do) whose values differ beyond ``tol`` relative to max|eager|; None otherwise."""
    if actual.shape != expected.shape or actual.shape[:2] != positions.shape:
        return None
    diff = np.abs(actual.astype(np.float64) - expected.astype(np.float64))
    diff = np.where(np.isnan(diff), np.inf, diff).reshape(positions.shape + (-1,)).max(axis=-1)  # (B, T)
    scale = max(float(np.abs(expected[np.isfinite(expected)]).max(initial=0.0)), 1e-12)
    bad = diff > tol * scale
    return int(positions[bad].min()) if bad.any() else None


# com.microsoft ops that add a Linear's bias themselves (ONNX Runtime's fusions, the fused lowering): {op: the bias
# input's index}. The Linear's output (MatMul + bias) is then no value of the graph: it is compared as the MatMul's
# output plus that bias, read from the graph
BIAS_FUSED = {"BiasGelu": 1, "FastGelu": 1, "BiasAdd": 1, "BiasSplitGelu": 1, "BiasDropout": 1,
              "SkipLayerNormalization": 4, "SkipSimplifiedLayerNormalization": 3}
SKIP_NORMS = ("SkipLayerNormalization", "SkipSimplifiedLayerNormalization")
# ops that only move values: a fused op's output reaches the module that reads it through them
LAYOUT_OPS = {"Reshape", "Transpose", "Identity", "Cast", "Squeeze", "Unsqueeze", "Flatten", "Split", "Slice"}


def _fused_biases(proto, nodes: list, data_dir: str | None) -> dict[str, tuple[np.ndarray, str]]:
    """{value: (the bias a fused op adds to it, "OpType node")} for values a bias-fusing op reads (BIAS_FUSED)."""
    from onnx import numpy_helper

    inits = {t.name: t for t in proto.graph.initializer}
    out: dict[str, tuple[np.ndarray, str]] = {}
    for n in nodes:
        k = BIAS_FUSED.get(n.op_type)
        if n.domain != "com.microsoft" or k is None or len(n.input) <= k or not n.input[k]:
            continue
        t = inits.get(n.input[k])
        if t is None or len(t.dims) != 1:
            continue
        try:
            bias = numpy_helper.to_array(t, base_dir=data_dir or "").astype(np.float32)
        except Exception:  # noqa: BLE001 - external data that cannot be read here: that value is compared as it is
            continue
        for x in n.input[:2 if n.op_type.startswith("Skip") else 1]:  # a skip norm: its input or its skip
            if x:
                out[x] = (bias, f"{n.op_type} {n.name}")
    return out


def _packed_rows(nodes, scopes, values, eager, unmatched: list[str], tol: float, positions) -> list[TensorDiff]:
    """Rows for projections packed into one MatMul (Q, K and V): the MatMul's output against eager's outputs of
    the unmatched modules under its scope that share one input, concatenated in call order — a value both sides
    compute. The modules compared leave ``unmatched``."""
    rows = []
    order = list(eager)
    for idx, n in enumerate(nodes):
        if n.op_type not in ("MatMul", "Gemm") or not n.output or n.output[0] not in values:
            continue
        v = values[n.output[0]]
        paths = _module_paths(scopes[idx])
        under = paths[-1] + "." if paths else ""
        cand = [p for p in order if p in unmatched and p.startswith(under) and eager[p][0] is not None
                and eager[p][1].shape[:-1] == v.shape[:-1] and eager[p][1].ndim == v.ndim]
        for start in range(len(cand)):
            group, width = [], 0
            for p in cand[start:]:
                if not np.array_equal(eager[p][0], eager[cand[start]][0]):
                    continue
                group.append(p)
                width += eager[p][1].shape[-1]
                if width >= v.shape[-1]:
                    break
            if len(group) < 2 or width != v.shape[-1]:
                continue
            want = np.concatenate([eager[p][1] for p in group], axis=-1)
            max_abs, rel = relative_error(v, want)
            inp = eager[group[0]][0]
            src = next((x for x in n.input if x in values and values[x].shape == inp.shape), None)
            input_rel = relative_error(values[src], inp)[1] if src is not None else None
            head = group[0].rsplit(".", 1)
            name = group[0] + "".join("+" + p.rsplit(".", 1)[-1] if p.rsplit(".", 1)[0] == head[0] else "+" + p
                                      for p in group[1:])
            rows.append(TensorDiff(f"{name} (packed)", n.output[0], f"{n.op_type} {n.name}", idx, tuple(v.shape),
                                   max_abs, rel, input_rel, depth=group[0].count(".") + 1,
                                   first_position=_first_position(v, want, positions, tol) if not rel <= tol
                                   else None, input_value=src))
            for p in group:
                unmatched.remove(p)
            break
    return rows


def _fused_source(name: str | None, nodes: list, producer: dict) -> int | None:
    """The fused attention node (FUSED_OPS) that computes ``name`` — directly or through ops that only move
    values — or None."""
    for _ in range(8):
        idx = producer.get(name) if name else None
        if idx is None:
            return None
        if nodes[idx].op_type in FUSED_OPS:
            return idx
        if nodes[idx].op_type not in LAYOUT_OPS:
            return None
        name = nodes[idx].input[0]
    return None


def _fused_culprit(rows: list[TensorDiff], first: TensorDiff, nodes, scopes, values, producer,
                   tol: float) -> TensorDiff | None:
    """When the first divergent value comes out of a fused attention node (its output, or the input of the
    module that reads it, e.g. W_o) while every value feeding that node agrees: a row for the fused node itself."""
    if nodes[first.position].op_type in FUSED_OPS and first.onnx_value in values:
        idx, value, max_abs, rel = first.position, first.onnx_value, first.max_abs, first.rel
    elif first.input_rel is not None and not first.input_rel <= tol:
        idx = _fused_source(first.input_value, nodes, producer)
        if idx is None:
            return None
        value = nodes[idx].output[0]
        max_abs, rel = first.input_abs if first.input_abs is not None else float("inf"), first.input_rel
    else:
        return None
    node = nodes[idx]
    # the values feeding it: each input followed back through ops that only move values
    feeding: set[str] = set()
    for x in node.input:
        for _ in range(6):
            if not x:
                break
            feeding.add(x)
            j = producer.get(x)
            if j is None or nodes[j].op_type not in LAYOUT_OPS:
                break
            x = nodes[j].input[0]
    fed = [r for r in rows if r.onnx_value in feeding and r is not first]
    input_rel = max((r.rel for r in fed), default=None)
    if input_rel is not None and not input_rel <= tol:
        return None  # its inputs differ already: the damage is before it
    paths = _module_paths(scopes[idx])
    module = paths[-1] if paths else f"{node.op_type} {node.name}"
    shape = tuple(values[value].shape) if value in values else first.shape
    return TensorDiff(module, value, f"{node.op_type} {node.name}", idx, shape, max_abs, rel, input_rel,
                      depth=module.count(".") + 1)


def _compare(label: str, nodes: list, scopes: list, values: dict, producer: dict, eager: dict,
             expected_out: dict, file_name: dict, tol: float, positions: np.ndarray,
             biases: dict | None = None) -> BisectReport:
    """One call's rows: each eager module's output against its ONNX value, then the graph outputs; the first
    divergent row, the culprit and its own nodes. ``positions``: (B, T) the call's token positions."""

    def op_of(idx: int) -> str:
        return f"{nodes[idx].op_type} {nodes[idx].name}"

    rows: list[TensorDiff] = []
    unmatched: list[str] = []
    for path, (inp, out) in eager.items():
        in_scope = [i for i, s in enumerate(scopes) if path in _module_paths(s)]
        # a fused contrib op's later outputs are not its module's result (SkipLayerNormalization's 4th output is
        # the residual sum it absorbed, which belongs to the enclosing block)
        cand = [(i, o) for i in in_scope for k, o in enumerate(nodes[i].output)
                if o in values and values[o].shape == out.shape and (k == 0 or nodes[i].domain != "com.microsoft")]
        if cand:
            idx, name = cand[-1]  # the last value of the output's shape computed inside the module
            inner = _module_paths(scopes[idx])[-1]
            if inner != path and inner in eager and not np.array_equal(eager[inner][1], out):
                # computed by a submodule whose output is not this module's: the module's own last step (a
                # residual add a fusion absorbed into a later node) is not in its scope
                cand = []
        if not cand:
            unmatched.append(path)
            continue
        got, op = values[name], op_of(idx)
        max_abs, rel = relative_error(got, out)
        if not rel <= tol and name in (biases or {}) and got.shape[-1:] == biases[name][0].shape:
            # the module's bias is added inside a fused op that reads this value (BiasGelu, a skip norm): what both
            # sides compute is this value plus that bias
            b_abs, b_rel = relative_error(got + biases[name][0], out)
            op = f"{nodes[idx].op_type}+bias of {biases[name][1]}"  # the bias a fused op adds: its own or not
            if b_rel < rel:
                got, max_abs, rel = got + biases[name][0], b_abs, b_rel
        input_rel, input_value, input_abs = None, None, None
        if inp is not None:
            # every value entering the module's nodes from outside with the input's shape (a bias a fused op adds
            # included): the input agrees when one of them is eager's input
            scope_set = set(in_scope)
            for i in in_scope:
                for x in nodes[i].input:
                    if x not in values or producer.get(x) in scope_set or values[x].shape != inp.shape:
                        continue
                    tries = [values[x]] + ([values[x] + biases[x][0]] if x in (biases or {}) and
                                           values[x].shape[-1:] == biases[x][0].shape else [])
                    n = nodes[i]
                    if n.op_type in SKIP_NORMS and x == n.input[0] and len(n.input) > 1 and n.input[1] in values \
                            and values[n.input[1]].shape == inp.shape:
                        # a skip norm absorbed the residual add before it: its input is input + skip (+ bias)
                        k = BIAS_FUSED[n.op_type]
                        summed = values[x] + values[n.input[1]]
                        tries.append(summed)
                        if x in (biases or {}):
                            tries.append(summed + biases[x][0])
                    for v in tries:
                        a, r = relative_error(v, inp)
                        if input_rel is None or r < input_rel:
                            input_abs, input_rel, input_value = a, r, x
        rows.append(TensorDiff(path, name, op, idx, tuple(out.shape), max_abs, rel, input_rel,
                               depth=path.count(".") + 1,
                               first_position=_first_position(got, out, positions, tol)
                               if not rel <= tol else None, input_value=input_value, input_abs=input_abs))
    for contract_name, exp in expected_out.items():
        name = file_name.get(contract_name, contract_name)
        if name in values and name in producer:
            got = values[name]
            if got.ndim == 4 and exp.ndim == 4 and got.shape[2] > exp.shape[2]:
                got = got[:, :, :exp.shape[2]]  # a shared buffer: the slots written so far
            max_abs, rel = relative_error(got, exp)
            first = _first_position(got, exp, positions, tol) if contract_name == iospec.LOGITS and not rel <= tol \
                else None
            rows.append(TensorDiff(f"output {contract_name}", name, op_of(producer[name]), producer[name],
                                   tuple(exp.shape), max_abs, rel, depth=0, first_position=first))
    rows += _packed_rows(nodes, scopes, values, eager, unmatched, tol, positions)
    rows.sort(key=lambda r: (r.position, -r.depth))

    report = BisectReport(model=label, shapes={}, tol=tol, provider="", rows=rows, unmatched=sorted(unmatched))
    bad = [r for r in rows if not r.rel <= tol]  # NaN counts as bad
    fused = _fused_culprit(rows, bad[0], nodes, scopes, values, producer, tol) if bad else None
    if fused is not None:  # damage inside a fused op: named as that op, not as the module that reads its output
        rows.append(fused)
        rows.sort(key=lambda r: (r.position, -r.depth))
        report.first_divergent = report.culprit = fused
        report.fused_op = fused.op
    elif bad:
        report.first_divergent = bad[0]
        report.culprit = next((r for r in bad if not r.module.startswith("output ")
                               and r.input_rel is not None and r.input_rel <= tol), bad[0])
    if bad:
        m = BLOCK_RE.match(report.culprit.module)
        report.block = m.group(1) if m else None
        own = report.culprit.module
        inside = [i for i, s in enumerate(scopes) if own in _module_paths(s)]
        lo, hi = (min(inside), max(inside)) if inside else (0, -1)
        # the module's own nodes, and nodes without scopes amid them (graph rewrites, e.g. fused attention)
        report.culprit_nodes = [op_of(i) + ("" if s else " (no scope)") for i, s in enumerate(scopes)
                                if (s and _module_paths(s) and _module_paths(s)[-1] == own)
                                or (not s and lo < i < hi)]
        if report.fused_op and report.fused_op not in report.culprit_nodes:  # a fused node without a scope
            report.culprit_nodes.insert(0, report.fused_op)
    return report


def _value_sizes(proto, values: dict[str, np.ndarray]) -> dict[str, int]:
    """Element counts of the values known without their data (initializers, Constant outputs) and of the run's."""
    import onnx

    sizes = {i.name: int(np.prod(i.dims)) for i in proto.graph.initializer}
    for n in proto.graph.node:
        if n.op_type == "Constant" and n.output and n.attribute:
            a = n.attribute[0]  # value (a tensor), value_float(s), value_int(s), ...
            A = onnx.AttributeProto
            sizes[n.output[0]] = (int(np.prod(a.t.dims)) if a.type == A.TENSOR else len(a.floats) if a.type == A.FLOATS
                                  else len(a.ints) if a.type == A.INTS else 1)
    sizes.update({k: int(v.size) for k, v in values.items()})
    return sizes


def _inside_attention(report: BisectReport, target: str, proto, index: GraphIndex, scopes: list, values: dict,
                      module, inputs: tuple, explicit: bool) -> None:
    """Fill the report's steps for module ``target`` when it is an attention module: eager runs once more with the
    module's torch calls recorded, its ONNX nodes are the ones in its scope. ``explicit``: asked for by name, so a
    module that is not attention (or not there) is said so in ``steps_note``."""
    import torch

    own = [n for n, s in zip(index.nodes, scopes) if _module_paths(s) and _module_paths(s)[-1] == target]
    fused = next((n for n in own if n.op_type in FUSED_OPS), None)
    report.steps_module = target
    if not any(n.op_type == "Softmax" for n in own):
        if fused is not None:
            report.steps_note = (f"the ONNX graph computes {target} in one node ({fused.op_type} {fused.name}): "
                                 "its steps are not visible")
        elif explicit:
            report.steps_note = f"{target} is not an attention module: no Softmax among its own ONNX nodes"
        else:
            report.steps_module = None
        return
    try:
        module.get_submodule(target)
    except AttributeError:
        report.steps_note = f"the eager model has no module {target}"
        return

    def run():
        with torch.no_grad():
            module(*inputs)

    trace = trace_module(module, target, run)
    in_scope = [i for i, s in enumerate(scopes) if target in _module_paths(s)]
    row = next((r for r in report.rows if r.module == target), None)
    res = compare_steps(trace, onnx_ops(index, in_scope, _value_sizes(proto, values)), values,
                        (row.onnx_value, row.op) if row is not None else None, report.tol)
    report.steps, report.step, report.steps_note = res.steps, res.first, res.note


def _quantization(entry):
    """The ONNX artifact's quantization record (``artifact.details.Quantization``), None for a float one."""
    return entry.details.quantization if isinstance(entry.details, OnnxDetails) else None


QUANT_NODE_RE = re.compile(r"^(.*)_Q\d+$")  # MatMulNBitsQuantizer names its node after the MatMul: node_linear_Q4


def _quantized_scope_hints(ef, entry, proto_nodes) -> tuple[dict[str, list[str]], str | None]:
    """Module scopes for a quantized file's scope-less nodes (the quantizer drops node metadata), read from its
    float source (the folder the manifest records, its hashes checked and its ONNX file the one quantized):
    {node name: scopes}, or ({}, why not)."""
    import onnx

    from mhaexport.artifact import ExportFolder

    src = _quantization(entry).source
    if src is None or isinstance(src, str) or not src.folder:
        return {}, "its float source is not recorded"
    try:
        source = ExportFolder.open(Path(ef.path) / src.folder, "onnx")
    except MhaExportError as e:
        return {}, f"its float source cannot be read ({str(e).splitlines()[0]})"
    with source:
        s_entry = source.entry("onnx")
        if s_entry.files[s_entry.file]["sha256"] != src.onnx_sha256:
            return {}, f"its float source {source.path} holds another file than it was quantized from (sha256)"
        graph = read_graph(source.file("onnx"))[0].graph
    by_name = {n.name: sc for n in graph.node if (sc := name_scopes(n))}
    hints = {}
    for n in proto_nodes:
        m = QUANT_NODE_RE.match(n.name)
        if m and not name_scopes(n) and m.group(1) in by_name:
            hints[n.name] = by_name[m.group(1)]
    return hints, None


def quantized_tolerance(quantization) -> tuple[float, str]:
    """The relative error bisect allows a quantized file: its scheme's relative logit error (verify's quality
    threshold, ``verify/quality.py``), and that in words."""
    from mhaexport.verify.quality import thresholds_for

    limits, table = thresholds_for(quantization.weights)
    return float(limits.logit_err), (f"quantized ({quantization.label or quantization.weights}): "
                                     f"tolerance {limits.logit_err:g}, the {table} scheme's relative logit error")


def bisect(folder, loaded=None, **kwargs) -> BisectReport:
    """Bisect an export folder's ONNX model (a path, opened with its hashes checked, or an opened ExportFolder)
    against eager PyTorch, fed in the file's own
    protocol: a shared cache one row per call, an adopted file under its own names, a quantized file with its
    scheme's tolerance (and the module scopes its quantizer dropped read from its float source).

    ``loaded``: the eager model; by default it is rebuilt from the manifest's model spec (as ``verify`` does).
    Keyword arguments go to :func:`bisect_onnx` (batch, seq, past, pad, seed, tol, provider, opt_level, steps_of),
    and ``case_from`` (where the shapes came from) to the report; ``trust_code``: rebuild the eager model from a
    manifest source that is code (``--trust-code``).
    """
    from mhaexport.artifact import opened

    case_from = kwargs.pop("case_from", "")
    trust_code = kwargs.pop("trust_code", False)
    with opened(folder, "onnx") as ef:  # the snapshot of the checked bytes (a path: removed when done)
        report = _bisect_folder(ef, loaded, case_from, kwargs, trust_code)
    report.model = str(ef.path / ef.entry("onnx").file)  # the file as the user knows it, not the snapshot's
    return report


def _bisect_folder(ef, loaded, case_from: str, kwargs: dict, trust_code: bool = False) -> BisectReport:
    """:func:`bisect` on an opened folder: the file's protocol, tolerance and scopes from its manifest entry."""
    import onnx

    from mhaexport.models.loading import check_same_model, load_recorded

    entry = ef.entry("onnx")
    if loaded is None:
        loaded = load_recorded(ef, trust_code=trust_code)
    else:
        check_same_model(loaded, ef.model)
    notes = []
    if entry.fixed_sizes is not None:  # a static export runs at its own sizes only
        fixed = {"seq": entry.fixed_sizes[0], "past": entry.fixed_sizes[1]}
        if any(k in kwargs and kwargs[k] != v for k, v in fixed.items()):
            if case_from == "--case":
                raise ConfigError(f"{ef.path} is a static export: it runs at seq={fixed['seq']} "
                                  f"past={fixed['past']} only, not at --case")
            notes.append(f"a static export: bisected at its own seq={fixed['seq']} past={fixed['past']}, not at "
                         f"the case asked for ({case_from or 'seq=' + str(kwargs.get('seq'))})")
            case_from = ""
            kwargs.pop("pad", None)
        kwargs.update(fixed)
    if entry.dtype != "float32":
        kwargs.setdefault("tol", 1e-2)
    feed = Feed.of(entry, loaded.contract)  # how the file is fed: its names, cache and slots, dtype
    quant = _quantization(entry)
    if quant:
        tol, said = quantized_tolerance(quant)
        kwargs.setdefault("tol", tol)
        notes.append(said)
        if feed.scoped:
            nodes = read_graph(ef.file("onnx"))[0].graph.node
            hints, why = _quantized_scope_hints(ef, entry, nodes)
            if why:  # a module's last value in its scope would not be its output: outputs only
                kwargs["outputs_only"] = f"its quantized nodes carry no module scopes and {why}"
            kwargs["scope_hints"] = hints
    report = bisect_onnx(ef.file("onnx"), loaded, feed=feed, **kwargs)
    report.case_from = case_from
    report.notes = notes + report.notes
    return report


def case_of_report(report, contract, runtimes: tuple[str, ...] | None = None,
                   where: str = "") -> tuple[Case, str] | None:
    """The case parity failed at worst in a verify report (a VerifyReport, or the path of its report.json): an ONNX
    Runtime runner's parity, ort-cpu first (``runtimes``: those runtimes' only); None when parity failed nowhere (or
    the report names no case). ``where``: how the reason names the report (default: its file's name).

    A report in a folder is hashed by nobody: anyone may write one. Only the worst case's *name* is read from it;
    the case itself (batch, lengths, padding) is the one verify's own sweep of that name makes for ``contract``
    (:func:`~mhaexport.verify.sweep.build_sweep`, the report's sweep kind and seed), so a report cannot ask for a
    batch of 10**6 rows — a name the sweep does not make is not a case."""
    from mhaexport.verify.report import VerifyReport, load_report

    if not isinstance(report, VerifyReport):
        where = where or f" in {Path(report).name}"
        report = load_report(report)
    try:
        made = {cs.name: cs for cs in build_sweep(contract, report.sweep.kind, report.sweep.seed)}
    except (MhaExportError, TypeError, ValueError, OverflowError):
        return None  # a sweep verify does not make: no case from this report
    order = sorted(report.results, key=lambda rt: (rt != "ort-cpu", not rt.startswith("ort-")))
    for rt in order:
        res = report.result(rt, "parity")
        if (rt not in runtimes if runtimes else rt == "torchscript") or res is None or res.status is not False:
            continue
        name = res.figures.worst_case
        case = made.get(name) if isinstance(name, str) else None
        if case is None:
            continue  # no such case in verify's sweep
        return case, f"{rt}'s worst parity case{where}"
    return None


def failing_case(folder, loaded, verified: tuple[str, object], runtime: str = "ort-cpu") -> tuple[Case | None, str]:
    """Where to bisect when no case is given: the case parity failed at worst in the verify report bisect follows
    (``verified``: (its name — a report-*.json written since the folder's last export, or "run now" — and the
    VerifyReport)). (None, why) when parity passed there, or for a quantized file (parity does not apply): bisect's
    default case. ``runtime="pt2"``: the torch.export program's parity instead."""
    from mhaexport.artifact import opened

    ort = runtime.startswith("ort-")
    with opened(folder, "onnx" if ort else runtime, check=False) as ef:
        if ort and _quantization(ef.entry("onnx")):
            return None, "a quantized file: no exact parity case"
    name, report = verified
    where = ", run now" if name == "run now" else f" in {name}"
    found = case_of_report(report, loaded.contract, None if ort else (runtime,), where)
    if found is not None:
        return found
    return None, (f"parity passes on {runtime}" if name == "run now" else f"parity passed in {name}")
