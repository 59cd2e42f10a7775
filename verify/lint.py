"""`mhaexport lint`: static findings on a decoder's ONNX graph — ours or another tool's — before anything runs.

Each rule reads the graph only (``runners.wire.read_graph``: a one-file model's weights left in the file, an
external-data model's not loaded; a rule that asks for one constant reads it alone) and says
what it found, where (the node), how bad (error / warning / info) and a one-line fix. The rules cover the classes of
bug users of torch.onnx, Optimum and ONNX Runtime meet again and again:

- ``mask-order``: the article's classic masking bugs, visible in the graph: masked scores filled with 0 (not a
  large negative) before Softmax, a mask applied to the weights *after* Softmax, a Softmax over scores no mask
  reaches;
- ``contract-io``: the contract's inputs/outputs (``input_ids``, ``attention_mask``, ``past_key_values.i.*`` ->
  ``logits``, ``present.i.*``) missing or renamed;
- ``fixed-axis``: a batch, sequence or past axis that came out as a fixed number;
- ``baked-length``: a mask or position range built from a constant of the example's length (a ``Range`` over
  constants, a 2-D constant mask before Softmax that no dynamic Slice cuts);
- ``dropout``: Dropout (or BatchNormalization) in training mode, or Dropout left in the graph;
- ``causal-alignment``: an attention op or a ``Trilu`` mask with causal masking aligned top-left while a past cache
  makes the query shorter than the keys (ONNX ``Attention(is_causal=1)`` with past, ``Trilu(k=0)``);
- ``fp16-min-fill``: a float16 graph that *adds* a ``finfo(float16).min``-scale constant to scores (a negative
  score plus -65504 overflows to -inf; a fully masked row becomes NaN);
- ``versions``: an IR version or opset the installed ONNX Runtime cannot load (probed on a one-node model).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import onnx
from onnx import numpy_helper

from mhaexport.core import iospec
from mhaexport.artifact import ExportFolder, shown_path
from mhaexport.core.untrusted import md, shown
from mhaexport.artifact.record import Record
from mhaexport.core.errors import ArtifactError
from mhaexport.core.graph import MASK_FILL_AT_MOST, MS_DOMAIN, GraphIndex

SEVERITIES = ("error", "warning", "info")
ICON = {"error": "❌", "warning": "⚠️", "info": "ℹ️"}
FP16_MIN_SCALE = -6.0e4  # finfo(float16).min is -65504: adding this much to a negative score overflows
PAST_RE = re.compile(r"^past_key_values\.(\d+)\.(key|value)$")


@dataclass
class Finding(Record):
    """One lint finding: ``severity`` error | warning | info, the ``rule`` that found it, the ``node`` (or I/O
    name) it is about, what was found and a one-line fix."""

    severity: Literal["error", "warning", "info"]
    rule: str
    node: str
    message: str
    fix: str

    def line(self) -> str:
        return f"{self.severity}: [{self.rule}] {self.node}: {self.message} — fix: {self.fix}"


@dataclass
class LintReport(Record):
    """The findings on one ONNX file; ``errors`` are the error-level ones (``mhaexport lint`` exits 1 on any).
    As JSON (``lint --json``, a verify report's ``lint``): ``{"model", "ok", "counts", "rules", "findings"}``."""

    model: str = "?"
    findings: list[Finding] = field(default_factory=list)
    rules: list[str] = field(default_factory=list)  # the rules that ran

    DERIVED = ("ok", "counts")
    KEY_ORDER = ("model", "ok", "counts", "rules", "findings")

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "error"]

    @property
    def ok(self) -> bool:
        return not self.errors

    def counts(self) -> dict[str, int]:
        return {s: sum(f.severity == s for f in self.findings) for s in SEVERITIES}

    def to_markdown(self, heading: str = "###") -> str:
        c = self.counts()
        lines = [f"{heading} Lint: {md(c['error'])} error(s), {md(c['warning'])} warning(s), {md(c['info'])} note(s)",
                 ""]
        if not self.findings:
            rules = ", ".join(md(r) for r in self.rules)
            return "\n".join(lines + [f"No findings ({md(len(self.rules))} rules: {rules}).", ""])
        lines += ["| severity | rule | node | finding | fix |", "| --- | --- | --- | --- | --- |"]
        for f in self.findings:
            lines.append(f"| {ICON.get(f.severity, '')} {md(f.severity)} | {md(f.rule)} | {md(f.node)} | "
                         f"{md(f.message)} | {md(f.fix)} |")
        return "\n".join(lines + [""])  # every value through md: a node name from the file is text in its cell


class _Graph(GraphIndex):
    """Producers, consumers and constants of one graph (the main graph; subgraphs are not linted)."""

    def __init__(self, model: onnx.ModelProto, stored: Callable[[str], bytes | None] | None = None) -> None:
        super().__init__(model.graph)
        self.model = model
        self.stored = stored
        g = model.graph
        self.inputs = {i.name: i for i in g.input if i.name not in self.initializers}
        self.outputs = {o.name: o for o in g.output}

    def const(self, name: str) -> np.ndarray | None:
        """A constant's value (initializer, Constant node, through Cast/Identity); None otherwise. Tensors kept in
        external data are not read (their shape is known from the initializer); one whose bytes the reader left in
        a one-file model is read now, alone (``stored``)."""
        t = self.initializers.get(name)
        if t is not None:
            if t.data_location == onnx.TensorProto.EXTERNAL:
                return None
            if not t.raw_data and self.stored is not None and (data := self.stored(name)) is not None:
                whole = onnx.TensorProto()
                whole.CopyFrom(t)
                whole.raw_data = data
                return numpy_helper.to_array(whole)
            return numpy_helper.to_array(t)
        n = self.producer.get(name)
        if n is None:
            return None
        if n.op_type == "Constant":
            for a in n.attribute:
                if a.name == "value":
                    return numpy_helper.to_array(a.t)
                if a.name in ("value_float", "value_int"):
                    return np.array(a.f if a.name == "value_float" else a.i)
                if a.name in ("value_floats", "value_ints"):
                    return np.array(list(a.floats) or list(a.ints))
            return None
        if n.op_type in ("Cast", "Identity"):
            return self.const(n.input[0])
        return None

    def const_shape(self, name: str) -> tuple[int, ...] | None:
        t = self.initializers.get(name)
        if t is not None:
            return tuple(t.dims)
        v = self.const(name)
        return None if v is None else v.shape

    def ancestors(self, name: str, depth: int, stop=lambda n: False) -> list[onnx.NodeProto]:
        """Nodes up to ``depth`` producers back from ``name`` (breadth first), not expanding past ``stop``."""
        seen, out, frontier = set(), [], [name]
        for _ in range(depth):
            nxt = []
            for v in frontier:
                n = self.producer.get(v)
                if n is None or id(n) in seen:
                    continue
                seen.add(id(n))
                out.append(n)
                if not stop(n):
                    nxt.extend(i for i in n.input if i)
            frontier = nxt
        return out


def _label(n: onnx.NodeProto) -> str:
    return f"{n.op_type} {n.name or n.output[0]}"


def _attr(n: onnx.NodeProto, name: str, default=None):
    for a in n.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default


def _n_layers(g: _Graph) -> int:
    layers = {int(m.group(1)) for name in g.inputs if (m := PAST_RE.match(name))}
    return max(layers) + 1 if layers else 0


@dataclass(frozen=True)
class LintContext:
    """What every rule knows besides the graph (:func:`lint_model`'s keywords)."""

    max_positions: int | None = None
    static: bool = False
    feed: Any = None
    contract: Any = None


# ---- the rules --------------------------------------------------------------------------------------------------

def rule_contract_io(g: _Graph, ctx: LintContext) -> list[Finding]:
    feed = ctx.feed
    if feed is not None:  # an adopted file: its I/O mapped onto the contract when it was adopted
        extra = f", {feed.position_ids} fed from the mask" if feed.position_ids else ""
        return [Finding("info", "contract-io", "graph inputs", f"made by {feed.producer}: its I/O mapped onto the "
                        f"contract ({feed.input_ids}, {feed.attention_mask}, {feed.past[0]}, ... -> "
                        f"{feed.logits}, {feed.present[0]}, ...{extra}); driven as {feed.protocol}",
                        "none needed")]
    out = []
    n_layers = _n_layers(g)
    want_in = iospec.input_names(n_layers) if n_layers else [iospec.INPUT_IDS, iospec.ATTENTION_MASK]
    want_out = iospec.output_names(n_layers) if n_layers else [iospec.LOGITS]
    missing_in = [n for n in want_in if n not in g.inputs]
    missing_out = [n for n in want_out if n not in g.outputs]
    found = f"inputs {', '.join(g.inputs) or 'none'}; outputs {', '.join(g.outputs) or 'none'}"
    if not n_layers:
        out.append(Finding("error", "contract-io", "graph inputs", "no past_key_values.{i}.key/value input: not a "
                           f"KV-cache decoder under the contract, or its cache inputs are renamed ({found})",
                           "export with the contract's I/O names (mhaexport onnx does), or map the layout with "
                           "mhaexport verify FILE --hf/--model"))
    for name in missing_in + missing_out:
        out.append(Finding("error", "contract-io", name, f"the contract's {'input' if name in want_in else 'output'} "
                           f"{name} is missing ({found})", "name the graph's I/O as the contract does "
                           "(input_ids, attention_mask, past_key_values.i.key|value -> logits, present.i.key|value)"))
    extra = [n for n in g.inputs if n not in want_in]
    for name in extra:
        out.append(Finding("warning", "contract-io", name, f"input {name} is not in the contract (positions come "
                           "from the attention mask)", "a runtime feeding only the contract's inputs cannot run "
                           "this file; verify it with the producer's layout mapped (mhaexport verify FILE --hf DIR)"))
    return out


def rule_fixed_axis(g: _Graph, ctx: LintContext) -> list[Finding]:
    out = []
    static = ctx.static
    feed = ctx.feed
    n_layers = feed.n_layers if feed is not None else _n_layers(g)
    file_name = feed.file_names() if feed is not None else {}  # contract name -> the file's (an adopted file's)
    for name, axes in iospec.dynamic_input_axes(n_layers).items():
        name = file_name.get(name, name)
        inp = g.inputs.get(name)
        if inp is None:
            continue
        dims = inp.type.tensor_type.shape.dim
        for axis, dim_name in axes.items():
            if axis < len(dims) and dims[axis].HasField("dim_value"):
                size = dims[axis].dim_value
                if static and dim_name != iospec.BATCH:
                    out.append(Finding("info", "fixed-axis", name, f"axis {axis} ({dim_name}) is fixed at {size}: a "
                                       "static export, as requested", "none needed (--seq-static)"))
                    continue
                out.append(Finding("error", "fixed-axis", name, f"axis {axis} ({dim_name}) came out fixed at {size}:"
                                   " the file runs only at that length", "export with dynamic axes (mhaexport onnx "
                                   "--seq-dynamic; torch.onnx dynamic_shapes) and build masks from the input shapes"))
    return out


_MASK_PATH_OPS = {"Where", "Add", "Sub", "Mul", "Cast", "Not", "And", "Or", "Expand", "Unsqueeze", "Reshape",
                  "Squeeze", "Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "Neg", "Trilu", "Transpose"}


def rule_baked_length(g: _Graph, ctx: LintContext) -> list[Finding]:
    out, seen = [], set()
    max_pos = ctx.max_positions
    softmax_in = [n.input[0] for n in g.nodes if n.op_type == "Softmax"]
    for value in softmax_in:
        # walk the mask side back from the scores: through mask arithmetic, not through a dynamic Slice
        for n in g.ancestors(value, 14, stop=lambda n: n.op_type not in _MASK_PATH_OPS):
            if n.op_type not in _MASK_PATH_OPS:  # the scores' own MatMul (and its weights) are not the mask
                continue
            for i in n.input:
                shape = g.const_shape(i) if i else None
                if not shape or len(shape) < 2 or i in seen:
                    continue
                t, s = shape[-2], shape[-1]
                if t > 1 and s > 1 and (max_pos is None or max(t, s) < max_pos):
                    seen.add(i)
                    out.append(Finding("info" if ctx.static else "error", "baked-length", _label(n), f"the attention mask is built from a "
                                       f"constant {i} of shape {list(shape)}: a mask of the example's length, so "
                                       "other lengths get a wrong mask or fail", "build the mask from the input "
                                       "shapes (e.g. arange(q_len) + past_len against arange(past_len + q_len))"))
    for n in g.nodes:
        if n.op_type == "Range" and all(g.const(i) is not None for i in n.input):
            start, limit, delta = (float(g.const(i).reshape(())) for i in n.input)
            length = int(max(0, np.ceil((limit - start) / delta))) if delta else 0
            if length > 1 and (max_pos is None or length < max_pos):
                out.append(Finding("info" if ctx.static else "warning", "baked-length", _label(n), f"Range({start:g}, {limit:g}, {delta:g}) "
                                   f"over constants: {length} positions whatever the input's length", "compute the "
                                   "range from the input's shape (torch.arange(seq_len) traces to a dynamic Range)"))
    return out


def rule_dropout(g: _Graph, ctx: LintContext) -> list[Finding]:
    out = []
    for n in g.nodes:
        if n.op_type == "Dropout":
            training = g.const(n.input[2]) if len(n.input) > 2 and n.input[2] else None
            ratio = g.const(n.input[1]) if len(n.input) > 1 and n.input[1] else np.array(0.5)
            if training is not None and bool(np.asarray(training).reshape(())) and float(np.asarray(ratio)) > 0:
                out.append(Finding("error", "dropout", _label(n), f"Dropout in training mode (ratio {float(ratio):g}): "
                                   "outputs are random", "export the model in eval mode (model.eval())"))
            else:
                out.append(Finding("warning", "dropout", _label(n), "a Dropout node is left in the graph (an identity "
                                   "at inference, but a sign of a training-mode export)", "export in eval mode; "
                                   "onnxscript's optimizer removes inference-mode Dropout"))
        elif n.op_type == "BatchNormalization" and _attr(n, "training_mode", 0):
            out.append(Finding("error", "dropout", _label(n), "BatchNormalization in training mode: statistics of "
                               "the batch instead of the running ones", "export the model in eval mode"))
    return out


def rule_causal_alignment(g: _Graph, ctx: LintContext) -> list[Finding]:
    out = []
    has_past = any(PAST_RE.match(i) for i in g.inputs)
    for n in g.nodes:
        if n.op_type == "Attention" and n.domain in ("", "ai.onnx") and _attr(n, "is_causal", 0):
            with_past = len(n.input) > 4 and any(n.input[4:6])
            if with_past or has_past:
                out.append(Finding("error", "causal-alignment", _label(n), "ONNX Attention with is_causal=1 and a KV "
                                   "cache: its causal mask is aligned top-left, so a query shorter than its keys "
                                   "(every decode step) is masked as if it stood at position 0", "pass the causal "
                                   "mask as attn_mask (built from past_len + arange(q_len)) and set is_causal=0"))
        elif n.domain == MS_DOMAIN and n.op_type in ("MultiHeadAttention", "Attention") and \
                _attr(n, "unidirectional", 0) and has_past:
            out.append(Finding("warning", "causal-alignment", _label(n), f"{n.op_type} with unidirectional=1 and a "
                               "past cache: ONNX Runtime has mis-aligned this when the query is shorter than the keys",
                               "pass the mask as attention_bias and unidirectional=0"))
        elif n.op_type == "Trilu" and not _attr(n, "upper", 1) and has_past:
            k = g.const(n.input[1]) if len(n.input) > 1 and n.input[1] else np.array(0)
            feeds_scores = any(c.op_type in ("Where", "Add", "Softmax")
                               for o in n.output for c in g.consumers.get(o, []))
            if k is not None and int(np.asarray(k).reshape(())) == 0 and feeds_scores:
                out.append(Finding("warning", "causal-alignment", _label(n), "a lower-triangular causal mask with k=0 "
                                   "next to a past cache: aligned top-left, so with past_len > 0 a query does not see "
                                   "its own recent keys", "offset the diagonal by past_len (Trilu k = past_len), or "
                                   "compare arange(q_len) + past_len with arange(past_len + q_len)"))
    return out


def rule_window(g: _Graph, ctx: LintContext) -> list[Finding]:
    """Per layer, GroupQueryAttention's local_window_size against the model's sliding window (when the folder's
    contract says it): a window dropped (-1), shifted (W±1) or added where the model has none."""
    contract = ctx.contract
    if contract is None:
        return []
    from mhaexport.verify.genai_check import gqa_windows

    out = []
    for layer, gqa in sorted(gqa_windows(g.model.graph).items()):
        got, want = gqa.local_window_size, contract.window(layer) if layer < contract.n_layers else 0
        if (got if got > 0 else 0) != want:
            what = ("dropped: every key is seen" if got <= 0 else
                    f"shifted by {got - want:+d}" if want else "a window the model does not have")
            out.append(Finding("error", "window", f"GroupQueryAttention of layer {layer}",
                               f"local_window_size {got} but the model's layer {layer} has "
                               f"{f'a sliding window of {want}' if want else 'full attention'} ({what})",
                               f"re-export: local_window_size {want if want else -1} (W keys, the current included)"))
    return out


def rule_fp16_min_fill(g: _Graph, ctx: LintContext) -> list[Finding]:
    logits = g.outputs.get(iospec.LOGITS)
    elem = logits.type.tensor_type.elem_type if logits is not None else None
    if elem != onnx.TensorProto.FLOAT16:
        return []
    out = []
    for sm in (n for n in g.nodes if n.op_type == "Softmax"):
        for n in g.ancestors(sm.input[0], 3):
            if n.op_type != "Add":
                continue
            for i in n.input:
                lows = [c for c in (g.const(x) for a in g.ancestors(i, 6) for x in a.input) if c is not None]
                lows += [g.const(i)] if g.const(i) is not None else []
                worst = min((float(np.min(c)) for c in lows if c.size and np.issubdtype(c.dtype, np.floating)),
                            default=0.0)
                if worst <= FP16_MIN_SCALE:
                    out.append(Finding("error", "fp16-min-fill", _label(n), f"float16 scores get {worst:g} added "
                                       "(finfo(float16).min scale): a negative score plus it overflows to -inf, and a "
                                       "fully masked (padded) row turns NaN", "fill masked scores with Where / "
                                       "masked_fill, or add at most finfo.min / 2"))
                    break
    return out


_probed: dict[tuple, str | None] = {}


def rule_versions(g: _Graph, ctx: LintContext) -> list[Finding]:
    """Build a one-node model with this file's IR version and opsets and let ONNX Runtime load it."""
    import onnxruntime as ort

    from mhaexport.runtime.session import cpu_session

    m = g.model
    opsets = tuple(sorted((o.domain, o.version) for o in m.opset_import))
    key = (m.ir_version, opsets)
    if key not in _probed:
        node = onnx.helper.make_node("Identity", ["x"], ["y"])
        graph = onnx.helper.make_graph([node], "probe",
                                       [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])],
                                       [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])])
        probe = onnx.helper.make_model(graph, ir_version=m.ir_version,
                                       opset_imports=[onnx.helper.make_opsetid(d, v) for d, v in opsets])
        try:
            cpu_session(probe.SerializeToString())
            _probed[key] = None
        except Exception as e:  # noqa: BLE001 - ORT's own exception types
            text = str(e).replace("\n", " ")
            _probed[key] = text[text.find("Unsupported"):][:200] if "Unsupported" in text else text[-200:]
    if _probed[key] is None:
        return []
    opset = next((v for d, v in opsets if d in ("", "ai.onnx")), None)
    return [Finding("error", "versions", "model", f"ONNX Runtime {ort.__version__} cannot load IR version "
                    f"{m.ir_version} with opset {opset}: {_probed[key]}", "export at an opset and IR version this "
                    "ONNX Runtime supports (mhaexport onnx --opset 18..23), or upgrade onnxruntime")]


def _is_mask_where(g: _Graph, n: onnx.NodeProto) -> tuple[str, float] | None:
    """A Where that fills masked elements of a tensor with a scalar constant: (which branch, the fill value). A
    Where of two constants (building an additive bias, e.g. SDPA's Where(mask, 0, -inf)) is not one."""
    if n.op_type != "Where":
        return None
    consts = {b: g.const(i) for b, i in (("then", n.input[1]), ("else", n.input[2]))}
    if all(c is not None for c in consts.values()):
        return None
    for branch, c in consts.items():
        if c is not None and c.size == 1 and np.issubdtype(c.dtype, np.floating):
            return branch, float(c.reshape(()))
    return None


def rule_mask_order(g: _Graph, ctx: LintContext) -> list[Finding]:
    out = []
    fused = any(n.op_type in ("Attention", "MultiHeadAttention", "GroupQueryAttention") for n in g.nodes)
    for sm in (n for n in g.nodes if n.op_type == "Softmax"):
        before = g.ancestors(sm.input[0], 4, stop=lambda n: n.op_type == "MatMul")
        fills = [(n, w) for n in before if (w := _is_mask_where(g, n)) is not None]
        small = [(n, w) for n, w in fills if w[1] > MASK_FILL_AT_MOST]
        masked = bool(fills) or any(n.op_type == "Add" for n in before)
        if small:
            n, (_, value) = small[0]
            out.append(Finding("error", "mask-order", _label(n), f"masked scores are filled with {value:g} before "
                               "Softmax: masked (future, padded) keys still get weight", "fill with a large negative "
                               "(the dtype's minimum, or -inf) — masked_fill(~allowed, finfo.min)"))
        after = [c for o in sm.output for c in g.consumers.get(o, [])]
        for c in after:
            w = _is_mask_where(g, c)
            nan_guard = c.op_type == "Where" and (p := g.producer.get(c.input[0])) is not None and                 p.op_type == "IsNaN"
            zeroing_mul = c.op_type == "Mul" and any(g.producer.get(i) is not None and
                                                     g.producer[i].op_type in ("Cast", "Where", "Not") for i in c.input
                                                     if i not in sm.output)
            if (w is not None and w[1] == 0.0 and not nan_guard) or zeroing_mul:
                out.append(Finding("error", "mask-order", _label(c), "the mask is applied to the weights after Softmax:"
                                   " masked keys stay in the denominator, so the weights no longer sum to 1 over the "
                                   "allowed keys", "mask the scores before Softmax"))
        if not masked and not fused:
            out.append(Finding("warning", "mask-order", _label(sm), "no mask reaches the scores before this Softmax: "
                               "every position attends to every key, future ones included", "apply the causal "
                               "(and padding) mask to the scores before Softmax"))
    return out


RULES = {
    "mask-order": rule_mask_order,
    "contract-io": rule_contract_io,
    "fixed-axis": rule_fixed_axis,
    "baked-length": rule_baked_length,
    "dropout": rule_dropout,
    "causal-alignment": rule_causal_alignment,
    "fp16-min-fill": rule_fp16_min_fill,
    "versions": rule_versions,
    "window": rule_window,
}


def lint_model(model: onnx.ModelProto, label: str = "<model>", *, max_positions: int | None = None,
               static: bool = False, feed=None, contract=None,
               stored: Callable[[str], bytes | None] | None = None) -> LintReport:
    """Run every rule on ``model`` (graph only; weights in external data are not read). ``max_positions``: the
    contract's, when known (constants of that size are the model's own tables, not an example length);
    ``static``: the file is a static export by request (fixed sequence axes are then expected); ``feed``: an
    adopted file's :class:`~mhaexport.runtime.feed.Feed` (its names for the contract's I/O); ``contract``: the
    model's, when known (its per-layer sliding windows); ``stored``: the bytes of an initializer the reader left in
    the file, by name (``runners.wire.read_graph``), read only when a rule asks for that constant."""
    g = _Graph(model, stored)
    ctx = LintContext(max_positions=max_positions, static=static, feed=feed, contract=contract)
    report = LintReport(label, rules=list(RULES))
    for rule in RULES.values():
        report.findings.extend(rule(g, ctx))
    order = {s: i for i, s in enumerate(SEVERITIES)}
    report.findings.sort(key=lambda f: order[f.severity])
    return report


def lint_path(path: str | Path | ExportFolder, *, genai: bool = True) -> LintReport:
    """Lint an ONNX file, or the ONNX artifact of an export folder (a path: opened and hash-checked here; an opened
    :class:`ExportFolder`: its checked snapshot; its contract and static sizes inform the rules). ``genai``: also the
    ``genai-config`` rule on the genai_config.json beside the file (verify runs that as its own check instead)."""
    if not isinstance(path, ExportFolder) and Path(path).is_dir():
        with ExportFolder.open(path, "onnx") as opened:  # the snapshot removed when the lint is done
            return lint_path(opened, genai=genai)
    max_positions, static, feed, ef, contract = None, False, None, None, None
    if isinstance(path, ExportFolder):
        from mhaexport.runtime.feed import Feed

        from mhaexport.verify.external_data import check_external_data

        ef = path
        check_external_data(ef)
        entry = ef.entry("onnx")
        max_positions, static, feed = ef.contract.max_positions, not entry.seq_dynamic, Feed.of(entry, ef.contract)
        contract = ef.contract
        feed = feed if feed.adopted else None  # mhaexport's own export: the contract's names, checked as such
        path = ef.file("onnx")
    path = Path(path)
    if not path.is_file():
        raise ArtifactError(f"{path} is neither an ONNX file nor an export folder")
    from mhaexport.runners.wire import read_graph, stored_bytes

    try:
        model, left = read_graph(path)
    except Exception as e:  # noqa: BLE001 - protobuf's DecodeError and friends
        raise ArtifactError(f"{shown_path(path)} is not a readable ONNX model: {type(e).__name__}: {e}") from None
    if not model.graph.node and not model.graph.input and not model.graph.output:  # protobuf reads 0 bytes as empty
        raise ArtifactError(f"{shown_path(path)} is not a readable ONNX model: it holds no graph "
                            f"({path.stat().st_size} bytes)")
    if ef is None:  # a file on its own (a folder's are checked with its external data)
        from mhaexport.verify.external_data import check_tensors

        check_tensors(model, shown_path(path), left)
    report = lint_model(model, str(shown_path(path)), max_positions=max_positions, static=static, feed=feed,
                        contract=contract, stored=lambda name: stored_bytes(path, left, name))
    if genai:  # the genai_config.json beside the file, on its own (verify checks it against the model too)
        from mhaexport.verify.genai_check import GENAI_CHECK, lint_findings

        found = lint_findings(model, path, ef)
        report.rules.append(GENAI_CHECK)
        report.findings.extend(Finding(f.severity, GENAI_CHECK, f.field, f.message, "write the value that "
                               "describes the file and greedy decoding (or re-export)") for f in found or [])
        report.findings.sort(key=lambda f: SEVERITIES.index(f.severity))
    return report
