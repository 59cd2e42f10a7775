"""One traced layer for every layer: an export of a decoder whose layers are all alike traces the model cut to its
first :data:`TRACED_LAYERS` layers and writes every later layer as a copy of the last one traced, with that layer's
own weights — the graph the whole trace would give, in a fraction of torch.export's time (its cost grows with the
layers it traces: 29 s for the bench-size Llama's 8 layers, 13.5 s for 3, under the same load).

How a copy is proved to be the layer torch.onnx would have written (:func:`replicate`, before anything is copied):

- layer 2 of the trace is compared with layer 1 node by node (op, domain, attributes, arity, in graph order) and
  input by input: a value made inside the layer is the matching one; a value from the layer before is the residual
  stream carried in (the same one each time); ``past_key_values.1.*`` against ``past_key_values.2.*``; a weight
  against the same view (offset, shape, strides: a folded Transpose) of the same parameter of the next layer; and
  anything else — the mask, the rotary tables, shape constants, values torch.onnx computed once and shared
  (common-subexpression elimination) — must be the very same value. Any other difference, a node that belongs to no
  layer between them, a layer that shares a parameter with another, a subgraph: not replicated, the whole model is
  traced (the reason is the export's note);
- an initializer torch.onnx's optimizer *deduplicated* (equal bytes: a random model's norms of ones) is shared by the
  layers traced; it is kept shared only where every layer's parameters of that name hold those bytes, else the whole
  model is traced;
- layer ``i`` >= 3 is then layer 2's nodes with layer ``i``'s inputs: the previous copy's residual, its own past,
  its own parameters (the same views, read from the model's weights when written), the shared values as they are;
  its presents become ``present.i.*``; the nodes after the last layer read the last copy's residual.

Which layers are alike (:func:`layer_stack`): the one ``nn.ModuleList`` of ``n_layers`` modules in the model (the
built-in decoder's ``blocks``, a transformers model's ``model.layers``), every layer of one class, one printout
(sizes), the same parameter names, shapes and dtypes, one sliding window, every submodule's own settings (its plain
attributes: ``use_rope``, ``is_sliding``, a window) equal but for the layer's index, and no config field listing
one value per layer that are not all equal (``layer_types``, ``no_rope_layers``, a list of mixture-of-experts layers).
A model whose layers differ (local and global layers, a mixture of experts on some, rotary on some) is traced whole,
as is a model of at most ``TRACED_LAYERS + 1`` layers. What no check here sees — code that branches on the layer's
index itself past layer 2 — is verify's parity to catch: the copy is what torch.onnx wrote for layer 2.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import re
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import onnx_ir as ir
import torch
from torch import nn

from mhaexport.core import iospec
from mhaexport.models.stack import LayerStack, find_layers

# layers traced: layer 2 is the template, checked against layer 1 (layer 0 may hold what later layers share)
TRACED_LAYERS = 3
SCOPES = "pkg.torch.onnx.name_scopes"
# a deduplicated initializer larger than this is not checked layer by layer: the whole model is traced instead
DEDUP_CHECK_BYTES = 1 << 20


class NotReplicated(Exception):
    """Why a trace's layers cannot be copied: the caller traces the whole model (the message is its note)."""


def layer_stack(module: nn.Module, contract: iospec.ModelContract) -> tuple[LayerStack | None, str]:
    """The model's stack of alike layers, or (None, why not): one ``nn.ModuleList`` of ``n_layers`` modules, each of
    one class and printout, the same parameter names, shapes and dtypes, no parameter shared between two layers, one
    window for every layer, and more layers than :data:`TRACED_LAYERS` + 1."""
    n = contract.n_layers
    if n <= TRACED_LAYERS + 1:
        return None, f"{n} layers: traced whole"
    stack, why = find_layers(module, n)
    if stack is None:
        return None, why
    layers = stack.layers
    first = layers[0]
    shape = [(k, tuple(t.shape), t.dtype) for k, t in first.state_dict(keep_vars=True).items()]
    text = repr(first)
    seen: set[int] = set()
    for i, layer in enumerate(layers):
        if type(layer) is not type(first) or repr(layer) != text:
            return None, f"layer {i} is not layer 0's kind ({type(layer).__name__})"
        if [(k, tuple(t.shape), t.dtype) for k, t in layer.state_dict(keep_vars=True).items()] != shape:
            return None, f"layer {i}'s parameters are not layer 0's names and shapes"
        for t in list(layer.parameters()) + list(layer.buffers()):
            if t.numel() and t.device.type != "cpu":
                return None, f"layer {i} holds a tensor on {t.device.type}"
            if t.numel() and t.data_ptr() in seen:
                return None, f"layer {i} shares a tensor with an earlier layer"
            seen.add(t.data_ptr())
    if contract.windows is not None and len(set(contract.windows)) > 1:
        return None, "its layers have different sliding windows"
    per_layer = _per_layer_settings(module, n)
    if per_layer:
        return None, f"its config sets its layers apart ({per_layer})"
    differ = _state_differs(layers)
    if differ:
        return None, differ
    return stack, ""


# a module attribute of these types is a setting its forward may branch on (a tensor or module is checked above)
_PLAIN = (bool, int, float, str, type(None))


def _plain_settings(module: nn.Module) -> dict[str, object]:
    """A module's own settings: every attribute of a plain value (or a tuple/list of them) — what its code may
    branch on beyond its parameters (``use_rope``, ``is_sliding``, ``sliding_window``, ``layer_idx``)."""
    out = {}
    for k, v in vars(module).items():
        if k in ("training",) or k.startswith("_"):
            continue
        if isinstance(v, _PLAIN) or isinstance(v, (tuple, list)) and all(isinstance(x, _PLAIN) for x in v):
            out[k] = tuple(v) if isinstance(v, list) else v
    return out


def _state_differs(layers: nn.ModuleList) -> str:
    """Why the layers are not alike in their settings, or "": every submodule's plain settings
    (:func:`_plain_settings`) equal layer 0's, but for one that is each layer's own index (``layer_idx``: what the
    trace turns into its cache's names, checked node by node by :func:`replicate`)."""
    per: dict[tuple[str, str], list[object]] = {}
    for layer in layers:
        for name, m in layer.named_modules():
            for k, v in _plain_settings(m).items():
                per.setdefault((name, k), []).append(v)
    n = len(layers)
    for (name, k), values in per.items():
        if len(values) != n or len(set(map(repr, values))) > 1 and values != list(range(n)):
            where = f"{name}.{k}" if name else k
            return f"its layers' {where} differ ({', '.join(sorted(set(map(repr, values)))[:4])})"
    return ""


def _per_layer_settings(module: nn.Module, n: int) -> str:
    """A config field that lists one value per layer, not all equal (``layer_types``, ``no_rope_layers``, a
    mixture-of-experts layer list): the names of such fields, "" where none."""
    found = []
    for c in _configs(module):
        for k, v in vars(c).items():
            if isinstance(v, (list, tuple)) and len(v) == n and \
                    len({repr(x) for x in v}) > 1 and not k.startswith("_"):
                found.append(f"{k}: {', '.join(sorted({repr(x) for x in v})[:4])}")
    return "; ".join(found)


def _configs(module: nn.Module) -> list:
    """The config objects of ``module`` that count its layers (``num_hidden_layers``): a transformers model's and
    its text config."""
    out = []
    for m in module.modules():
        cfg = getattr(m, "config", None)
        for c in (cfg, getattr(cfg, "get_text_config", lambda **_: None)(decoder=True) if cfg is not None else None):
            if c is not None and isinstance(getattr(c, "num_hidden_layers", None), int) and \
                    all(c is not o for o in out):
                out.append(c)
    return out


@contextlib.contextmanager
def truncated(module: nn.Module, stack: LayerStack, k: int) -> Iterator[None]:
    """``module`` with only its first ``k`` layers (its configs' ``num_hidden_layers`` too) while inside."""
    configs = [(c, c.num_hidden_layers) for c in _configs(module)]
    setattr(stack.parent, stack.attr, nn.ModuleList(list(stack.layers)[:k]))
    for c, _ in configs:
        c.num_hidden_layers = k
    try:
        yield
    finally:
        setattr(stack.parent, stack.attr, stack.layers)
        for c, n in configs:
            c.num_hidden_layers = n


def contract_of_first(contract: iospec.ModelContract, k: int) -> iospec.ModelContract:
    """The contract of the model cut to its first ``k`` layers."""
    windows = None if contract.windows is None else tuple(contract.windows[:k])
    return dataclasses.replace(contract, n_layers=k, windows=windows)


# ---- the graph ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Param:
    layer: int | None  # None: outside the stack
    name: str  # within its layer (or the model)
    tensor: torch.Tensor


class _Params:
    """Every parameter and buffer of the model by the address range of its bytes (each layer's under its name
    within the layer)."""

    def __init__(self, module: nn.Module, stack: LayerStack) -> None:
        self.ranges: list[tuple[int, int, _Param]] = []
        self.by_layer: list[dict[str, torch.Tensor]] = []
        inside: set[int] = set()
        for i, layer in enumerate(stack.layers):
            named = dict(layer.named_parameters())
            named.update(dict(layer.named_buffers()))
            self.by_layer.append(named)
            for name, t in named.items():
                self._add(_Param(i, name, t))
                inside.add(id(t))
        for name, t in list(module.named_parameters()) + list(module.named_buffers()):
            if id(t) not in inside:
                self._add(_Param(None, name, t))

    def _add(self, p: _Param) -> None:
        t = p.tensor
        if t.numel() and t.device.type == "cpu" and t.is_contiguous():
            self.ranges.append((t.data_ptr(), t.data_ptr() + t.numel() * t.element_size(), p))

    def of(self, value: ir.Value) -> tuple[_Param, tuple] | None:
        """(the parameter an initializer's bytes lie in, its view: (byte offset, shape, byte strides)), or None."""
        t = value.const_value
        raw = getattr(t, "raw", None)
        if isinstance(raw, torch.Tensor):
            if raw.device.type != "cpu" or not raw.numel():
                return None
            item = raw.element_size()
            address, shape, strides = raw.data_ptr(), tuple(raw.shape), tuple(s * item for s in raw.stride())
        elif isinstance(raw, np.ndarray) and raw.size:
            address, shape, strides, item = raw.__array_interface__["data"][0], raw.shape, raw.strides, raw.itemsize
        else:
            return None
        if any(s < 0 for s in strides):
            return None
        end = address + sum((n - 1) * s for n, s in zip(shape, strides)) + item
        for start, stop, p in self.ranges:
            if start <= address and end <= stop:
                return p, (address - start, tuple(shape), tuple(strides))
        return None


def _scope_layer(node: ir.Node, prefix: str) -> int | None:
    """The layer index a node's name scopes put it in (``<prefix>.<i>``), else None."""
    text = node.metadata_props.get(SCOPES)
    if not text:
        return None
    try:
        scopes = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return None
    for s in scopes if isinstance(scopes, list) else ():
        if isinstance(s, str) and s.startswith(prefix + "."):
            head = s[len(prefix) + 1:].split(".", 1)[0]
            if head.isdigit():
                return int(head)
    return None


def _attr_equal(a: ir.Attr, b: ir.Attr) -> bool:
    if a.type != b.type or a.name != b.name:
        return False
    if a.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS):
        return False
    va, vb = a.value, b.value
    if isinstance(va, ir.TensorProtocol) or isinstance(vb, ir.TensorProtocol):
        return np.array_equal(va.numpy(), vb.numpy())
    return va == vb


def _past_layer(name: str | None) -> tuple[int, str] | None:
    m = re.fullmatch(r"past_key_values\.(\d+)\.(key|value)", name or "")
    return (int(m.group(1)), m.group(2)) if m else None


@dataclass
class _Template:
    """Layer ``k - 1`` of the trace as the pattern of every later layer: its nodes and, per input value, how a copy
    gets it."""

    nodes: list[ir.Node]
    carry: dict[ir.Value, ir.Value]  # an input from the layer before (a layer-(k-2) value) -> its match in layer k-1
    past: dict[ir.Value, str]  # past_key_values.(k-1).key|value -> "key" | "value"
    weights: dict[ir.Value, tuple[str, tuple]]  # initializer -> (parameter name in the layer, view)


def _layers_of(model: ir.Model, prefix: str, k: int) -> tuple[list[list[ir.Node]], dict[ir.Node, int | None]]:
    """Each traced layer's nodes in graph order, and every node's layer (None outside the stack). A node without a
    scope takes the latest layer among its producers (what torch.onnx's rewrites leave unscoped)."""
    where: dict[ir.Node, int | None] = {}
    for node in model.graph:
        i = _scope_layer(node, prefix)
        if i is None:
            produced = [where.get(v.producer()) for v in node.inputs if v is not None and v.producer() is not None]
            scoped = [j for j in produced if j is not None]
            if node.metadata_props.get(SCOPES) is None and scoped:
                i = max(scoped)
        where[node] = i
    layers: list[list[ir.Node]] = [[] for _ in range(k)]
    for node, i in where.items():
        if i is not None:
            if not 0 <= i < k:
                raise NotReplicated(f"a node scoped in layer {i} of a {k}-layer trace")
            layers[i].append(node)
    if any(not nodes for nodes in layers):
        raise NotReplicated("a traced layer has no node")
    return layers, where


def _template(model: ir.Model, layers: list[list[ir.Node]], where: dict, params: _Params,
              stack: LayerStack) -> _Template:
    """Layer 2 checked against layer 1 (see the module docstring); raises NotReplicated with the first difference."""
    a_nodes, b_nodes = layers[-2], layers[-1]
    ia, ib = len(layers) - 2, len(layers) - 1
    if len(a_nodes) != len(b_nodes):
        raise NotReplicated(f"layer {ia} has {len(a_nodes)} nodes, layer {ib} {len(b_nodes)}")
    inits = model.graph.initializers
    match: dict[ir.Value, ir.Value] = {}  # layer-ia value -> layer-ib value
    t = _Template(b_nodes, {}, {}, {})
    shared_inits: list[ir.Value] = []
    for na, nb in zip(a_nodes, b_nodes):
        what = f"layer {ib}'s node {nb.name} ({nb.op_type}) against {na.name}"
        if (na.op_type, na.domain, na.overload) != (nb.op_type, nb.domain, nb.overload) or \
                len(na.inputs) != len(nb.inputs) or len(na.outputs) != len(nb.outputs):
            raise NotReplicated(f"{what}: another op")
        if set(na.attributes) != set(nb.attributes) or \
                not all(_attr_equal(na.attributes[n], nb.attributes[n]) for n in na.attributes):
            raise NotReplicated(f"{what}: other attributes")
        for x, y in zip(na.inputs, nb.inputs):
            if x is None or y is None:
                if x is not y:
                    raise NotReplicated(f"{what}: an optional input given in one only")
                continue
            px, py = x.producer(), y.producer()
            lx, ly = where.get(px) if px is not None else None, where.get(py) if py is not None else None
            if px is not None and lx == ia:  # made inside layer ia: its match inside layer ib
                if match.get(x) is not y:
                    raise NotReplicated(f"{what}: its input {y.name} is not {x.name}'s match")
            elif px is not None and lx == ia - 1 and ly == ia:  # the residual carried from the layer before
                if t.carry.get(y, x) is not x:
                    raise NotReplicated(f"{what}: two carried values for {y.name}")
                t.carry[y] = x
            elif x is y:  # the same value: shared (the mask, rotary tables, constants, a value computed once)
                if x.name in inits and params.of(x) is not None and params.of(x)[0].layer is not None:
                    shared_inits.append(x)
            elif _past_layer(x.name) == (ia, _kv(x)) and _past_layer(y.name) == (ib, _kv(x)) and \
                    x.is_graph_input() and y.is_graph_input():
                t.past[y] = _kv(x)
            elif x.name in inits and y.name in inits:
                pa, pb = params.of(x), params.of(y)
                if pa is None or pb is None or pa[0].layer != ia or pb[0].layer != ib or \
                        pa[0].name != pb[0].name or pa[1] != pb[1]:
                    raise NotReplicated(f"{what}: initializers {x.name} and {y.name} are not the same view of "
                                        "the same parameter of each layer")
                t.weights[y] = (pb[0].name, pb[1])
            else:
                raise NotReplicated(f"{what}: its input {y.name} is neither {x.name}, its match, nor the next "
                                    "layer's own")
        for x, y in zip(na.outputs, nb.outputs):
            match[x] = y
    # every value layer ib takes from layer ia must be one layer ib makes in the same place (its carry out)
    for y, x in t.carry.items():
        if y not in match:
            raise NotReplicated(f"layer {ib} reads {y.name} of layer {ia}, which has no match in layer {ib}")
    _check_deduplicated(shared_inits, params, stack)
    t.carry = {y: match[y] for y in t.carry}  # the input -> the value of the template layer in the same role
    _check_leaves(model, layers, where, ia, ib)
    return t


def _kv(value: ir.Value) -> str:
    return (_past_layer(value.name) or (0, ""))[1]


def _check_leaves(model: ir.Model, layers: list[list[ir.Node]], where: dict, ia: int, ib: int) -> None:
    """Nothing outside layers ia and ib reads a value of layer ia (but its present output)."""
    outputs = set(model.graph.outputs)
    for node in layers[ia]:
        for v in node.outputs:
            if v in outputs and not v.name.startswith("present."):
                raise NotReplicated(f"layer {ia}'s {v.name} is a graph output")
            for user, _ in v.uses():
                if where.get(user) not in (ia, ib):
                    raise NotReplicated(f"{user.name} outside layers {ia} and {ib} reads layer {ia}'s {v.name}")


def _check_deduplicated(shared: list[ir.Value], params: _Params, stack: LayerStack) -> None:
    """An initializer shared by the layers traced that is a layer's parameter was deduplicated (equal bytes): it
    stays shared only where every layer's parameters that hold those bytes in the traced layers hold them in every
    layer (read one at a time); else NotReplicated."""
    for value in dict.fromkeys(shared):
        p, view = params.of(value)
        t = p.tensor
        if t.numel() * t.element_size() > DEDUP_CHECK_BYTES:
            raise NotReplicated(f"{value.name}, a parameter shared by the layers traced, is too large to check")
        want = _read(t)
        names = [n for n, q in params.by_layer[p.layer].items() if q.shape == t.shape and q.dtype == t.dtype]
        held = [n for n in names if any(torch.equal(_read(params.by_layer[j][n]), want)
                                        for j in range(TRACED_LAYERS))]
        for i, named in enumerate(params.by_layer):
            for n in held:
                if not torch.equal(_read(named[n]), want):
                    raise NotReplicated(f"torch.onnx shared {value.name} between the layers traced (equal bytes), "
                                        f"but layer {i}'s {n} differs")


_WEIGHTS = None  # the streamed model's staging file (exporter/onnx.py sets it for the call): read by offset


def _read(t: torch.Tensor) -> torch.Tensor:
    got = _WEIGHTS.read_tensor(t) if _WEIGHTS is not None else None
    return got if got is not None else t.detach()


def _view(t: torch.Tensor, view: tuple) -> np.ndarray:
    """A numpy view of ``t``'s bytes at (byte offset, shape, byte strides): no copy."""
    offset, shape, strides = view
    base = t.detach()
    if base.dtype == torch.bfloat16:  # numpy has no bfloat16: ml_dtypes' (what onnx_ir reads)
        import ml_dtypes

        flat = base.view(torch.int16).reshape(-1).numpy().view(ml_dtypes.bfloat16)
    else:
        flat = base.reshape(-1).numpy()
    start = offset // flat.itemsize
    return np.lib.stride_tricks.as_strided(flat[start:], shape=shape, strides=strides, writeable=False)


def _renamed_scopes(props: dict[str, str], prefix: str, src: int, dst: int) -> dict[str, str]:
    out = dict(props)
    pattern = re.compile(re.escape(f"{prefix}.{src}") + r"(?=[.:'/\s]|$)")
    under = re.compile(re.escape(f"{prefix.replace('.', '_')}_{src}_"))
    for key in (SCOPES, "namespace"):
        if key in out:
            out[key] = pattern.sub(f"{prefix}.{dst}", out[key])
    if "pkg.torch.onnx.fx_node" in out:
        out["pkg.torch.onnx.fx_node"] = under.sub(f"{prefix.replace('.', '_')}_{dst}_", out["pkg.torch.onnx.fx_node"])
    return out


def replicate(model: ir.Model, module: nn.Module, stack: LayerStack, n_layers: int, weights=None) -> int:
    """Make ``model``, the trace of ``module`` cut to its first :data:`TRACED_LAYERS` layers, the graph of all
    ``n_layers``: layers 3.. copied from layer 2 (checked against layer 1 first; NotReplicated with the first
    difference, ``model`` untouched). ``weights``: the streamed model's staging file (a deduplicated parameter is
    read from it by offset). Returns the nodes added."""
    global _WEIGHTS
    k = TRACED_LAYERS
    graph = model.graph
    if any(a.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS) for n in graph for a in n.attributes.values()):
        raise NotReplicated("the trace holds subgraphs")
    params = _Params(module, stack)
    layers, where = _layers_of(model, stack.path, k)
    _WEIGHTS = weights
    try:
        t = _template(model, layers, where, params, stack)
    finally:
        _WEIGHTS = None
    last = k - 1
    names = {v.name for v in graph.inputs} | set(graph.initializers) | \
        {v.name for n in graph for v in n.outputs}
    prev: dict[ir.Value, ir.Value] = {}  # template value -> the latest copy's
    inputs = list(graph.inputs)
    outputs = list(graph.outputs)
    template_out = {v: v for node in t.nodes for v in node.outputs}
    added: list[ir.Node] = []
    _presents(t)  # refused before anything is added
    for i in range(k, n_layers):
        mine: dict[ir.Value, ir.Value] = {}
        past: dict[str, ir.Value] = {}
        for y, kind in t.past.items():
            v = ir.Value(name=f"past_key_values.{i}.{kind}", shape=ir.Shape(list(y.shape)), type=y.type)
            past[kind] = v
            mine[y] = v
        for y, (pname, view) in t.weights.items():
            src = params.by_layer[i][pname]
            name = _layer_name(y.name, stack.path, last, i, names)
            tensor = ir.Tensor(_view(src, view), dtype=y.const_value.dtype, name=name)
            v = ir.Value(name=name, shape=ir.Shape(list(y.shape)), type=y.type, const_value=tensor)
            graph.register_initializer(v)
            names.add(name)
            mine[y] = v
        for node in t.nodes:
            ins = []
            for x in node.inputs:
                if x is None:
                    ins.append(None)
                elif x in mine:
                    ins.append(mine[x])
                elif x in t.carry:  # the previous layer's value in the role the template's own input had
                    role = t.carry[x]
                    ins.append(prev.get(role, role))
                else:
                    ins.append(x)  # shared
            attrs = [_copy_attr(a) for a in node.attributes.values()]
            clone = ir.Node(node.domain, node.op_type, ins, attrs, overload=node.overload,
                            num_outputs=len(node.outputs), version=node.version,
                            name=_layer_name(node.name or "node", stack.path, last, i, set()),
                            doc_string=node.doc_string,
                            metadata_props=_renamed_scopes(node.metadata_props, stack.path, last, i))
            for old, new in zip(node.outputs, clone.outputs):
                present = re.fullmatch(r"present\.\d+\.(key|value)", old.name or "")
                new.name = f"present.{i}.{present.group(1)}" if present else \
                    _layer_name(old.name, stack.path, last, i, names)
                names.add(new.name)
                new.shape = ir.Shape(list(old.shape)) if old.shape is not None else None
                new.type = old.type
                mine[old] = new
            added.append(clone)
        prev = {v: mine[v] for v in template_out}
        inputs += [past["key"], past["value"]]
        outputs += [mine[v] for v in _presents(t)]
    # the nodes after the last layer read the last copy's values
    copies = set(added)
    for v in template_out:
        for user, idx in list(v.uses()):
            if where.get(user) is None and user not in copies:
                user.replace_input_with(idx, prev[v])
    graph.insert_after(layers[last][-1], added)
    graph.inputs.clear()
    graph.inputs.extend(_ordered_inputs(inputs))
    graph.outputs.clear()
    graph.outputs.extend(_ordered_outputs(outputs))
    graph.sort()
    return len(added)


def _presents(t: _Template) -> list[ir.Value]:
    """The template layer's present.key, present.value outputs, in that order."""
    found = {}
    for node in t.nodes:
        for v in node.outputs:
            m = re.fullmatch(r"present\.\d+\.(key|value)", v.name or "")
            if m:
                found[m.group(1)] = v
    if set(found) != {"key", "value"}:
        raise NotReplicated("the template layer makes no present.key and present.value")
    return [found["key"], found["value"]]


def _ordered_inputs(values: list[ir.Value]) -> list[ir.Value]:
    def key(v: ir.Value):
        p = _past_layer(v.name)
        return (1, p[0], p[1] != "key") if p else (0, 0, 0)
    return sorted(values, key=key)


def _ordered_outputs(values: list[ir.Value]) -> list[ir.Value]:
    def key(v: ir.Value):
        m = re.fullmatch(r"present\.(\d+)\.(key|value)", v.name or "")
        return (1, int(m.group(1)), m.group(2) != "key") if m else (0, 0, 0)
    return sorted(values, key=key)


def _layer_name(name: str, prefix: str, src: int, dst: int, taken: set[str]) -> str:
    """Layer ``dst``'s name for the template's ``name``: its layer index changed where the name carries it
    (``hf.model.layers.2.mlp...`` -> ``...layers.<dst>.mlp...``), else ``name`` with ``_l<dst>``; unique in
    ``taken``."""
    scoped = re.sub(re.escape(f"{prefix}.{src}."), f"{prefix}.{dst}.", name)
    out = scoped if scoped != name else f"{name}_l{dst}"
    while out in taken:
        out += "_"
    return out


def _copy_attr(a: ir.Attr) -> ir.Attr:
    return ir.Attr(a.name, a.type, a.value, doc_string=a.doc_string)
