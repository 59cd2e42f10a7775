"""Bisect inside attention: which step of softmax(Q·Kᵀ/√d_k + mask)·V, then W_o, first departs from eager.

When bisect's culprit is an attention module, its input and output say *that* it went wrong, not *where*. This file
lines up the steps of attention on both sides and compares them in order:

    scores (Q·Kᵀ) → scale (÷√d_k) → mask fill → softmax → weighted sum (·V) → output projection

- **eager**: the module runs once more under a ``TorchFunctionMode`` that records every torch call made inside it
  (its children's included) with the calls that produced its tensor inputs and a copy of its output. Nothing in the
  model's code is hooked, so any attention written with torch calls is seen: the built-in ``MultiHeadAttention``,
  transformers' eager attention, a user's own. One call that does all of attention (``scaled_dot_product_attention``)
  has no steps to see, and bisect says so.
- **ONNX**: the nodes in the module's scope (``pkg.torch.onnx.name_scopes``).

Both sides become the same small list of ops (a kind and the ops that feed it), and one function finds the steps by
pattern in either: the first softmax; walking back from it through mask ops (Where, Add, masked_fill) and Div/Mul by
a scalar (the scale) to a MatMul (the scores), or, where the scale is applied to an operand before Q·Kᵀ, to that
scalar Div/Mul; forward from it to the MatMul that takes the weights (the weighted sum), noting a mask met on the way
(a mask applied after softmax). The output projection is the module's output.

Values are compared in eager's layout (an ONNX value of another shape is permuted, or reshaped when it has as many
elements, to eager's), at real positions only: query rows with at least one allowed key (a left-padded query's row
is fully masked). Masked scores are compared where the key is allowed, since masked positions hold whatever fill
each side uses (-inf, the dtype's minimum); the fill itself is judged by its effect: the softmax weight ONNX's masked
scores leave on masked keys.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mhaexport.core.graph import MASK_FILL_AT_MOST, GraphIndex

STEPS = ("scores", "scale", "mask fill", "softmax", "weighted sum", "output projection")
# what each step's value is called in a note ("scores match, scaled scores do not"), and whether it is plural
_WHAT = {"input": ("the module's input", False), "scores": ("scores", True), "scale": ("scaled scores", True),
         "mask fill": ("masked scores", True), "softmax": ("attention weights", True),
         "weighted sum": ("weights·V", False), "output projection": ("the output (heads merged, W_o)", False)}
FUSED_OPS = {"Attention", "MultiHeadAttention", "GroupQueryAttention", "PackedAttention", "PackedMultiHeadAttention",
             "SparseAttention"}  # one node for the whole of attention: ONNX's and com.microsoft's

_ONNX_KINDS = {"MatMul": "matmul", "Einsum": "matmul", "Div": "div", "Mul": "mul", "Where": "mask", "Add": "mask",
               "Softmax": "softmax", "Cast": "pass", "CastLike": "pass", "Identity": "pass", "Dropout": "pass",
               "Transpose": "layout", "Reshape": "layout", "Expand": "layout", "Unsqueeze": "layout",
               "Squeeze": "layout"}
_TORCH_KINDS = {"matmul": "matmul", "bmm": "matmul", "einsum": "matmul", "div": "div", "truediv": "div",
                "itruediv": "div", "mul": "mul", "rmul": "mul", "imul": "mul", "masked_fill": "mask",
                "where": "mask", "add": "mask", "radd": "mask", "iadd": "mask", "softmax": "softmax",
                "to": "pass", "type": "pass", "float": "pass", "half": "pass", "type_as": "pass",
                "dropout": "pass", "contiguous": "pass", "clone": "pass", "view": "layout", "reshape": "layout",
                "transpose": "layout", "permute": "layout", "expand": "layout", "unsqueeze": "layout",
                "squeeze": "layout", "repeat_interleave": "layout"}


@dataclass
class StepDiff:
    """One step inside attention compared: ONNX value vs eager tensor, at real positions."""

    step: str  # one of STEPS
    onnx_value: str  # the ONNX value compared ("" when the graph has no such step)
    op: str  # "Div node_div_1": the ONNX node that computes it ("" when none)
    eager_op: str  # the torch call that computes it in eager ("div", "masked_fill", "linear", ...)
    shape: tuple[int, ...]  # eager's shape
    rel: float | None  # max|onnx - eager| / max|eager| at real positions (mask fill: see below); None: not compared
    max_abs: float | None
    diverges: bool = False
    note: str = ""  # what differs, or why the step was not compared


@dataclass
class AttentionSteps:
    """Every step found, the first that diverges, and a line saying what went wrong (or why no step was compared)."""

    steps: list[StepDiff] = field(default_factory=list)
    first: StepDiff | None = None
    note: str = ""


@dataclass
class _Op:
    """One op of either side, reduced to what step finding needs."""

    kind: str  # matmul | div | mul | mask | softmax | pass | layout | other
    label: str  # "Div node_div_1" (ONNX) or "div" (the torch call)
    inputs: list[int]  # index (in the same list) of the op producing each tensor input, -1 from outside the module
    input_keys: list[Any]  # where each tensor input's value is read: ONNX value names, eager op indexes
    key: Any  # where the op's output value is read
    scalar: bool = False  # one operand is a scalar (a Python number, a one-element tensor or initializer)


def relative_error(actual: np.ndarray, expected: np.ndarray) -> tuple[float, float]:
    """(max|actual - expected|, that / max|expected|); inf for both where ``actual`` is non-finite and
    ``expected`` is finite. Non-finite differences elsewhere (-inf against -inf) are left out."""
    a, e = actual.astype(np.float64), expected.astype(np.float64)
    if not np.isfinite(a).all() and np.isfinite(e).all():
        return float("inf"), float("inf")
    diff = np.abs(a - e)
    diff = diff[np.isfinite(diff)]
    max_abs = float(diff.max()) if diff.size else 0.0
    scale = float(np.abs(e[np.isfinite(e)]).max()) if np.isfinite(e).any() else 1.0
    return max_abs, max_abs / max(scale, 1e-12)


# ---------------------------------------------------------------- finding the steps (the same on both sides)

def find_steps(ops: list[_Op]) -> dict[str, int]:
    """{step: index of the op computing it} for the first softmax in ``ops``; "mask after softmax" too when a mask
    sits between the softmax and the weighted sum. Empty when there is no softmax."""
    sm = next((i for i, o in enumerate(ops) if o.kind == "softmax"), None)
    if sm is None:
        return {}
    found = {"softmax": sm}
    path = _back_to_matmul(ops, sm, 0)  # nearest the softmax first, the scores' MatMul last
    if path:
        found["scores"] = path[-1]
        for i in path[:-1]:
            kind = ops[i].kind
            if kind in ("div", "mul") and ops[i].scalar:
                found.setdefault("scale", i)
            elif kind == "mask" or kind == "mul":
                found.setdefault("mask fill", i)
        if "scale" not in found:  # the scale applied to an operand before Q·Kᵀ (q * d**-0.5)
            for j in ops[path[-1]].inputs:
                s = _back_to_scale(ops, j, 0)
                if s is not None:
                    found["scale"] = s
                    break
    cur = sm
    for _ in range(8):  # forward: the weights' way to the MatMul with V
        nxt = next((i for i in range(cur + 1, len(ops)) if cur in ops[i].inputs), None)
        if nxt is None:
            break
        kind = ops[nxt].kind
        if kind == "matmul":
            found["weighted sum"] = nxt
            break
        if kind == "mask" or (kind == "mul" and not ops[nxt].scalar):
            found.setdefault("mask after softmax", nxt)
        elif kind not in ("pass", "layout", "div", "mul"):
            break
        cur = nxt
    return found


def _back_to_matmul(ops: list[_Op], i: int, depth: int) -> list[int] | None:
    """Ops from ``i``'s inputs back to the first MatMul, through mask, scale and layout ops (depth-first)."""
    for j in ops[i].inputs:
        if j < 0:
            continue
        if ops[j].kind == "matmul":
            return [j]
        if ops[j].kind in ("div", "mul", "mask", "pass", "layout") and depth < 8:
            rest = _back_to_matmul(ops, j, depth + 1)
            if rest:
                return [j] + rest
    return None


def _back_to_scale(ops: list[_Op], j: int, depth: int) -> int | None:
    if j < 0 or depth > 4:
        return None
    if ops[j].kind in ("div", "mul") and ops[j].scalar:
        return j
    if ops[j].kind in ("pass", "layout"):
        return next((s for k in ops[j].inputs if (s := _back_to_scale(ops, k, depth + 1)) is not None), None)
    return None


# ---------------------------------------------------------------- the two sides as op lists

def onnx_ops(graph: GraphIndex, in_scope: list[int], sizes: dict[str, int]) -> list[_Op]:
    """The nodes ``in_scope`` (graph indexes, in graph order) as ops. ``sizes``: element counts of values known
    without running (initializers, Constant outputs) and of the values the run exposed."""
    op_of = {i: k for k, i in enumerate(in_scope)}  # graph index -> op index (a producer outside the scope: -1)
    ops = []
    for i in in_scope:
        n = graph.nodes[i]
        names = [x for x in n.input if x]
        ops.append(_Op(_ONNX_KINDS.get(n.op_type, "other"), f"{n.op_type} {n.name}",
                       [op_of.get(graph.producer_index.get(x, -1), -1) for x in names], names,
                       n.output[0] if n.output else "",
                       scalar=any(sizes.get(x) == 1 for x in names)))
    return ops


class EagerTrace:
    """The torch calls one module made in its first forward: ops, a copy of each float output, the output."""

    def __init__(self) -> None:
        self.ops: list[_Op] = []
        self.values: list[np.ndarray | None] = []
        self.output: np.ndarray | None = None


def trace_module(model, path: str, run) -> EagerTrace:
    """Run ``run()`` (a forward of ``model``) with every torch call inside submodule ``path``'s first forward
    recorded."""
    import torch
    from torch.overrides import TorchFunctionMode

    trace = EagerTrace()
    producer: dict[int, int] = {}  # id(tensor) -> op index
    keep: list = []  # the recorded tensors stay alive, so their ids stay theirs

    class Recorder(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            if isinstance(out, torch.Tensor):
                flat = _flatten((args, kwargs))
                tensors = [a for a in flat if isinstance(a, torch.Tensor)]
                name = getattr(func, "__name__", str(func)).strip("_")
                scalar = any(isinstance(a, (int, float)) and not isinstance(a, bool) for a in flat) \
                    or any(t.numel() == 1 for t in tensors)
                idx = len(trace.ops)
                trace.ops.append(_Op(_TORCH_KINDS.get(name, "other"), name,
                                     [producer.get(id(t), -1) for t in tensors],
                                     [producer.get(id(t)) for t in tensors], idx, scalar=scalar))
                trace.values.append(out.detach().float().cpu().numpy().copy() if out.is_floating_point() else None)
                producer[id(out)] = idx
                keep.append(out)
            return out

    module = model.get_submodule(path)
    recorder = Recorder()
    state = {"on": False, "done": False}

    def pre(mod, args):
        if not state["done"]:
            recorder.__enter__()
            state["on"] = True

    def post(mod, args, out):
        if state["on"]:
            recorder.__exit__(None, None, None)
            state["on"], state["done"] = False, True
            t = first_tensor(out)
            trace.output = t.detach().float().cpu().numpy().copy() if t is not None else None

    handles = [module.register_forward_pre_hook(pre), module.register_forward_hook(post)]
    try:
        run()
    finally:
        if state["on"]:
            recorder.__exit__(None, None, None)
        for h in handles:
            h.remove()
    return trace


def _flatten(x: Any) -> list:
    if isinstance(x, (tuple, list)):
        return [y for item in x for y in _flatten(item)]
    if isinstance(x, dict):
        return [y for item in x.values() for y in _flatten(item)]
    return [x]


def first_tensor(x: Any):
    import torch

    if isinstance(x, torch.Tensor):
        return x
    if isinstance(x, (tuple, list)):
        return next((t for t in map(first_tensor, x) if t is not None), None)
    return None


# ---------------------------------------------------------------- comparing

def _aligned(o: np.ndarray, shape: tuple[int, ...]) -> list[np.ndarray]:
    """``o`` in eager's layout: as it is, each permutation of its axes giving ``shape``, or reshaped."""
    if o.shape == shape:
        return [o]
    if o.ndim == len(shape) and sorted(o.shape) == sorted(shape):
        perms = [p for p in itertools.permutations(range(o.ndim)) if tuple(o.shape[i] for i in p) == shape]
        return [o.transpose(p) for p in perms]
    if o.size == int(np.prod(shape)):
        return [o.reshape(shape)]
    return []


def _rows_for(shape: tuple[int, ...], rows: np.ndarray | None) -> np.ndarray | None:
    """The real-row selection broadcast to ``shape``: scores-shaped (B, H, T, S) and head-shaped (B, H, T, D)
    tensors by their leading axes, (B, T, d_model) by (B, T); None (every element) where neither fits."""
    if rows is None:
        return None
    if shape[:-1] == rows.shape:
        return np.broadcast_to(rows[..., None], shape)
    if rows.ndim == 3 and len(shape) == 3 and shape[:2] == (rows.shape[0], rows.shape[2]):
        return np.broadcast_to(rows.any(axis=1)[..., None], shape)
    return None


def _compare(o: np.ndarray | None, e: np.ndarray, select: np.ndarray | None) -> tuple[float, float] | None:
    """(max_abs, rel) of ``o`` against ``e`` at ``select`` (all where None), in the layout that fits best; None
    where ``o`` cannot be put in ``e``'s layout."""
    if o is None:
        return None
    best = None
    for cand in _aligned(o, e.shape):
        a, b = (cand[select], e[select]) if select is not None else (cand, e)
        r = relative_error(a, b) if b.size else (0.0, 0.0)
        if best is None or r[1] < best[1]:
            best = r
    return best


def _agree(step: str) -> str:
    what, plural = _WHAT[step]
    return f"{what} {'match' if plural else 'agrees' if step == 'input' else 'matches'}"


def _differ(step: str) -> str:
    what, plural = _WHAT[step]
    return f"{what} {'do' if plural else 'does'} not"


def compare_steps(trace: EagerTrace, ops: list[_Op], values: dict[str, np.ndarray],
                  onnx_output: tuple[str, str] | None, tol: float) -> AttentionSteps:
    """Find the steps on both sides and compare them in eager's order; ``onnx_output``: the ONNX value matched to the
    module's output (the output projection) and the node computing it, None when bisect found none."""
    fe, fo = find_steps(trace.ops), find_steps(ops)
    if not fe:
        single = next((o.label for o in trace.ops if "attention" in o.label), None)
        why = f"one call ({single})" if single else "no softmax among its torch calls"
        return AttentionSteps(note=f"eager computes attention with {why}: no steps to line up")

    def onnx_val(k: int | None) -> np.ndarray | None:
        return values.get(ops[k].key) if k is not None else None

    ev = trace.values
    # real positions, from eager's masked scores: a masked key holds the fill; a query row with no allowed key is
    # a padded query's
    masked = rows = None
    if "mask fill" in fe and ev[fe["mask fill"]] is not None:
        m = ev[fe["mask fill"]]
        masked = np.isneginf(m) | (m <= MASK_FILL_AT_MOST)
        rows = ~masked.all(axis=-1)

    steps: list[StepDiff] = []
    order = sorted((s for s in STEPS[:-1] if s in fe), key=lambda s: fe[s])
    for step in order:
        e = ev[fe[step]]
        k = fo.get(step)
        d = StepDiff(step, str(ops[k].key) if k is not None else "", ops[k].label if k is not None else "",
                     trace.ops[fe[step]].label, tuple(e.shape) if e is not None else (), None, None)
        steps.append(d)
        if e is None:
            d.note = "eager's value is not a float tensor"
            continue
        if step == "mask fill":
            _compare_mask(d, e, onnx_val(k), masked, rows, ops, fo, tol)
            continue
        if k is None:
            d.diverges = True
            d.note = f"the ONNX graph has no {step} step here"
            continue
        select = _rows_for(e.shape, rows)
        r = _compare(onnx_val(k), e, select)
        if r is None:
            o = onnx_val(k)
            d.note = ("not exposed by the run" if o is None else
                      f"not comparable: ONNX shape {tuple(o.shape)}, eager {tuple(e.shape)}")
            continue
        d.max_abs, d.rel = r
        d.diverges = not d.rel <= tol
        if d.diverges:
            d.note = _why(step, e, onnx_val(k), select, trace, fe, ops, fo, values, tol)

    if trace.output is not None:
        name, op = onnx_output or ("", "")
        d = StepDiff("output projection", name, op, trace.ops[-1].label if trace.ops else "",
                     tuple(trace.output.shape), None, None)
        r = _compare(values.get(name) if name else None, trace.output,
                     _rows_for(trace.output.shape, rows))
        if r is None:
            d.note = "the module's output has no ONNX value"
        else:
            d.max_abs, d.rel = r
            d.diverges = not d.rel <= tol
        steps.append(d)

    res = AttentionSteps(steps)
    res.first = next((d for d in steps if d.diverges), None)
    if res.first is not None:
        i = steps.index(res.first)
        prev = next((d.step for d in reversed(steps[:i]) if d.rel is not None and not d.diverges), "input")
        if res.first.rel is None:  # no such value in the ONNX graph: the note says what it does instead
            res.first.note = f"{_agree(prev)}, then {res.first.note}"
        else:
            head = f"{_agree(prev)}, {_differ(res.first.step)}"
            res.first.note = head + (f" ({res.first.note})" if res.first.note else "")
        res.note = res.first.note
    else:
        res.note = "every step inside agrees at real positions"
    return res


def _compare_mask(d: StepDiff, e: np.ndarray, o: np.ndarray | None, masked: np.ndarray | None,
                  rows: np.ndarray | None, ops: list[_Op], fo: dict[str, int], tol: float) -> None:
    """The mask fill: allowed positions compared as values; masked positions by the softmax weight ONNX's fill
    leaves them (``rel`` is the larger of the two)."""
    if "mask fill" not in fo:
        after = fo.get("mask after softmax")
        d.diverges = True
        if after is not None:
            d.onnx_value, d.op = str(ops[after].key), ops[after].label
            d.note = (f"the ONNX graph applies the mask after softmax ({ops[after].label}): masked keys stay in "
                      "softmax's denominator")
        else:
            d.note = "the ONNX graph applies no mask before softmax"
        return
    if o is None:
        d.note = "not exposed by the run"
        return
    allowed = ~masked & rows[..., None]
    best = None
    for cand in _aligned(o, e.shape):
        r = relative_error(cand[allowed], e[allowed]) if allowed.any() else (0.0, 0.0)
        if best is None or r[1] < best[0][1]:
            best = (r, cand)
    if best is None:
        d.note = f"not comparable: ONNX shape {tuple(o.shape)}, eager {tuple(e.shape)}"
        return
    (max_abs, rel), cand = best
    x = cand.astype(np.float64)
    w = np.exp(x - np.max(x, axis=-1, keepdims=True))
    w /= w.sum(axis=-1, keepdims=True)  # softmax of ONNX's masked scores over the keys
    hole = masked & rows[..., None]
    leak = float(np.nan_to_num(w[hole], nan=1.0).max()) if hole.any() else 0.0
    d.max_abs, d.rel = max_abs, max(rel, leak)
    d.diverges = not d.rel <= tol
    if rel > tol:
        d.note = f"allowed positions differ (rel err {rel:.1e})"
    elif leak > tol:
        d.note = (f"allowed positions agree (rel err {rel:.1e}); masked positions hold {_typical(cand[hole]):.1e} "
                  f"in ONNX (eager {_typical(e[hole]):.1e}): a fill too weak, softmax leaves masked keys weight "
                  f"up to {leak:.1e}")


def _typical(x: np.ndarray) -> float:
    return float(np.median(x.astype(np.float64)))  # float64: the middle of two -3.4e38 does not overflow


def _why(step: str, e: np.ndarray, o: np.ndarray, select: np.ndarray | None, trace: EagerTrace, fe: dict[str, int],
         ops: list[_Op], fo: dict[str, int], values: dict[str, np.ndarray], tol: float) -> str:
    """What a divergent step's values say about the bug."""
    notes = []
    cands = _aligned(o, e.shape)
    o = min(cands, key=lambda c: relative_error(c, e)[1]).astype(np.float64) if cands else None
    if step == "scale" and o is not None:
        big = np.abs(e) > 1e-3 * np.abs(e).max()
        if select is not None:
            big &= select
        ratio = o[big] / e[big]
        if ratio.size and np.isfinite(ratio).all() and np.std(ratio) <= tol * abs(np.median(ratio)):
            notes.append(f"ONNX/eager = {np.median(ratio):.3g} everywhere: the scale is off by that factor")
    if step == "softmax" and o is not None:
        real = o[select[..., 0]] if select is not None else o.reshape(-1, o.shape[-1])
        sums = real.sum(axis=-1)
        if sums.size and np.abs(sums - 1).max() > 1e-2:
            notes.append(f"ONNX's weights do not sum to 1 over the keys (row sums {sums.min():.2f} to "
                         f"{sums.max():.2f}): its softmax normalizes another axis")
    if step in ("scores", "weighted sum"):  # an operand that already differs: the bug lies before this step
        ke, ko = fe[step], fo[step]
        skip = fe.get("softmax") if step == "weighted sum" else None
        names = ("query", "key") if step == "scores" else ("weights", "value")
        for name, je, ko_key in zip(names, trace.ops[ke].input_keys, ops[ko].input_keys):
            if je is None or je == skip or trace.values[je] is None:
                continue
            r = _compare(values.get(ko_key), trace.values[je], None)
            if r is not None and not r[1] <= tol:
                where = "head split, RoPE or cache" if step == "scores" else "value projection or cache"
                notes.append(f"its {name} operand {ko_key} already differs (rel err {r[1]:.1e}): the bug lies "
                             f"before this step ({where})")
    return "; ".join(notes)
