"""ONNX Runtime over per-block pieces of the shipped file (verify's block order for ONNX Runtime, a plan of
runners/plan.py): every call of a plan through the piece of layer 0, then every call through the piece of layer 1,
... — a session per piece, opened for its phase and closed after, so each layer's weights are read once for the plan.

How the pieces are tied to the file (:func:`split`): the file's graph is read without its weights; each node goes to
the layer its module scope names (torch.onnx's ``pkg.torch.onnx.name_scopes``: ``blocks.3``, ``hf.model.layers.3``;
a node without a scope, made by a rewrite, to the latest layer it reads from), the nodes before the first layer join
piece 0 and those after the last (the final norm, the head) join the last piece. A piece is those nodes *as the file
holds them* (the same NodeProtos, attributes and names), its inputs the graph inputs and earlier pieces' values it
reads (types from the file's value_info), its outputs what later pieces or the graph outputs read, and its
initializers the file's TensorProtos as they are: an external one names the same data file, offset and length — the
same bytes, which the manifest hashes, never copied — and ONNX Runtime reads them from that file
(``session.model_external_initializers_file_folder_path``); an inline one (a file under the external-data threshold)
is referenced the same way, as external data naming the file itself at its bytes' offset (``runners/wire``), the
smallest (under 64 kB) copied. Every node of the file is in exactly one piece (:func:`split` checks it), and each piece
reads only values made before it.

What running pieces proves about the shipped file, and what it does not: the same nodes compute on the same weights
and the same inputs, value for value along the file's own edges; but ONNX Runtime optimizes each piece alone, so a
fusion across a layer boundary (a residual Add with the next layer's norm) is not made, and the figures can differ
from one session's by float32 rounding (tests/test_block_order.py bounds it); a fault that only that whole-file
optimization makes is not seen in this order. verify says which order each runtime ran in.
"""

from __future__ import annotations

import re
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mhaexport.core import iospec
from mhaexport.core.dtypes import numpy_dtype
from mhaexport.core.errors import MhaExportError, RuntimeFailure, first_line
from mhaexport.core.graph import name_scopes
from mhaexport.core.untrusted import shown
from mhaexport.runners.calls import (Call, Derived, Result, check_plan, consumers, empty_pairs, past_length, selected,
                                    sources)


class Unsplittable(Exception):
    """Why a file cannot be run in pieces (the runtime then runs in the normal order, saying why)."""


@dataclass
class Piece:
    """One block's piece of the file: its ModelProto (serialized), the values it reads and makes."""

    index: int
    model: bytes
    inputs: list[str]
    outputs: list[str]
    nodes: int = 0
    initializers: int = 0


@dataclass
class Pieces:
    """The file in pieces: one per layer (the first holds what comes before layer 0, the last what comes after the
    last layer), and for each value that crosses pieces the last piece that reads it."""

    pieces: list[Piece]
    last_use: dict[str, int] = field(default_factory=dict)
    prefix: str = ""

    def describe(self) -> str:
        return (f"{len(self.pieces)} pieces of the file (one per layer, scopes {self.prefix}.<i>; "
                f"{sum(p.nodes for p in self.pieces)} nodes, its initializers by reference)")


def _named(name: str, most: int = 80) -> str:
    """A name from the file as a message shows it: escaped (core/untrusted.py's ``shown``) and at most ``most``
    characters (a hostile file's names can be any length)."""
    text = shown(name)
    return text if len(text) <= most else text[:most] + "..."


def _layer_prefix(nodes: list, n_layers: int) -> str:
    """The scope prefix whose ``<prefix>.<i>`` names layers 0..n_layers-1 (``blocks``, ``hf.model.layers``)."""
    seen: dict[str, set[int]] = defaultdict(set)
    for n in nodes:
        for s in name_scopes(n):
            m = re.fullmatch(r"(.+)\.(\d+)", s)
            if m:
                seen[m.group(1)].add(int(m.group(2)))
    found = [p for p, idx in seen.items() if idx == set(range(n_layers))]
    if len(found) != 1:
        raise Unsplittable(f"no module scope names its {n_layers} layers (found "
                           f"{', '.join(_named(p) for p in sorted(seen)[:4])})")
    return found[0]


def split(path: str | Path, n_layers: int) -> Pieces:
    """The file at ``path`` (an ONNX decoder of ``n_layers`` layers under the contract's names) in pieces, its
    weights not read (see the module docstring); Unsplittable when its nodes cannot be told apart by layer or a
    piece would read a later one's value."""
    import onnx

    from mhaexport.runners.wire import read_graph, refer_in_place

    model, where = read_graph(path)  # a one-file model's weights referenced where they lie, never loaded
    refer_in_place(model, where, Path(path).name)
    g = model.graph
    if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for n in g.node for a in n.attribute):
        raise Unsplittable("the graph holds subgraphs")
    nodes = list(g.node)
    prefix = _layer_prefix(nodes, n_layers)
    producer: dict[str, int] = {}
    where: list[int | None] = []
    scoped_outside: list[bool] = []
    pattern = re.compile(re.escape(prefix) + r"\.(\d+)")
    for i, n in enumerate(nodes):
        layer = None
        scopes = name_scopes(n)
        for s in scopes:
            m = pattern.fullmatch(s)
            if m:
                layer = int(m.group(1))
                break
        ins = [where[producer[x]] for x in n.input if x in producer and where[producer[x]] is not None]
        if layer is None and not any(pattern.match(s) for s in scopes):
            layer = max(ins) if ins else None  # unscoped or outside the layers: the latest layer it reads from
            scoped_outside.append(bool([s for s in scopes if s]) and layer is not None)
        else:
            scoped_outside.append(False)
        if layer is not None and ins and max(ins) > layer:
            raise Unsplittable(f"node {_named(n.name)} of layer {layer} reads a value of layer {max(ins)}")
        where.append(layer)
        for o in n.output:
            producer[o] = i
    # before the first layer: piece 0; after the last (the final norm, the head: scoped outside the layers, reading
    # the last layer): the last piece
    piece_of = [0 if w is None else (n_layers - 1 if outside else w) for w, outside in zip(where, scoped_outside)]
    for i, n in enumerate(nodes):
        src = [piece_of[producer[x]] for x in n.input if x in producer]
        if src and max(src) > piece_of[i]:
            raise Unsplittable(f"node {_named(n.name)} would read a value made in a later piece")
    types = {v.name: v.type for v in list(g.value_info) + list(g.input) + list(g.output)}
    inits = {t.name: t for t in g.initializer}
    graph_in = {v.name for v in g.input}
    graph_out = [v.name for v in g.output]
    used_in: dict[str, set[int]] = defaultdict(set)
    for i, n in enumerate(nodes):
        for x in n.input:
            if x:
                used_in[x].add(piece_of[i])
    last_use = {name: max(ps) for name, ps in used_in.items() if name not in graph_out and name not in inits}
    pieces = []
    for k in range(n_layers):
        mine = [n for i, n in enumerate(nodes) if piece_of[i] == k]
        made = {o for n in mine for o in n.output if o}
        read = list(dict.fromkeys(x for n in mine for x in n.input if x and x not in made))
        p_inits = [inits[x] for x in read if x in inits]
        p_inputs = [x for x in read if x not in inits]
        later = {x for i, n in enumerate(nodes) if piece_of[i] > k for x in n.input}
        p_outputs = [o for o in dict.fromkeys(o for n in mine for o in n.output if o)
                     if o in later or o in graph_out]
        missing = [x for x in p_inputs + p_outputs if x not in types]
        if missing:
            raise Unsplittable(f"the file records no type of {_named(missing[0])} (a value between pieces)")
        for x in p_inputs:
            if x not in graph_in and x not in producer:
                raise Unsplittable(f"piece {k} reads {_named(x)}, which nothing makes")
        graph = onnx.helper.make_graph(
            mine, f"{g.name}-piece{k}",
            [onnx.helper.make_value_info(x, types[x]) for x in p_inputs],
            [onnx.helper.make_value_info(x, types[x]) for x in p_outputs], initializer=p_inits)
        piece = onnx.helper.make_model(graph, opset_imports=list(model.opset_import), ir_version=model.ir_version,
                                       functions=list(model.functions))
        pieces.append(Piece(k, piece.SerializeToString(), p_inputs, p_outputs, len(mine), len(p_inits)))
    if sum(p.nodes for p in pieces) != len(nodes):
        raise Unsplittable("not every node of the file is in one piece")
    return Pieces(pieces, last_use, prefix)


def pieces_unsupported(runner: Any) -> str | None:
    """Why ``runner`` cannot run a plan in pieces of its file, or None: an ONNX Runtime runner of a folder's file
    driven as the contract says (the contract's names, a concat cache: a call is one call of the file) whose nodes
    the file's module scopes put in its layers (:func:`split`, done once: ``runner.pieces``)."""
    from mhaexport.runtime.feed import CONCAT
    from mhaexport.runtime.protocol import Protocol

    feed = getattr(runner, "feed", None)
    path = getattr(runner, "path", None)
    if feed is None or not isinstance(path, (str, Path)) or getattr(runner, "session_of", None) is not None:
        return "not an ONNX Runtime runner of a file"
    if feed.adopted or feed.cache != CONCAT or type(runner.protocol) is not Protocol:
        return f"its file is driven in another protocol ({runner.protocol.name})"
    if runner.__dict__.get("pieces") is None:
        try:
            runner.pieces = split(path, runner.contract.n_layers)
        except Unsplittable as e:
            runner.pieces = str(e)
    return runner.pieces if isinstance(runner.pieces, str) else None


def run_pieces(runner: Any, pieces: Pieces, calls: list[Call], folder: str | Path, spill: Any = None
               ) -> list[Result]:
    """Every call of ``calls`` through ``pieces`` of ``runner``'s file, piece by piece: a session per piece made as
    the runner's own is (its :class:`~mhaexport.runtime.session.SessionConfig`, the external data read from
    ``folder``), opened for its phase and closed after. Each result is the file's outputs of that call, or the
    error it raised (a call extending a failed one fails too)."""
    import dataclasses

    from mhaexport.runtime.session import open_session

    check_plan(calls)
    c = runner.contract
    n = c.n_layers
    np_dtype = numpy_dtype(runner.dtype)
    waiting = consumers(calls)
    live: list[dict[str, np.ndarray]] = [{} for _ in calls]
    errors: dict[int, MhaExportError] = {}
    presents: dict[int, list] = {i: [None] * n for i, call in enumerate(calls) if call.keep}
    made: dict[tuple[int, int], tuple] = {}
    left = {(i, j): cnt for i, cnt in waiting.items() for j in range(n)}
    seconds = [0.0] * len(calls)
    for i, call in enumerate(calls):
        try:
            if isinstance(call.past, (int, Derived)):
                ids, mask = runner.check_ids_mask(call.ids, call.mask, past_length(calls, i))
                past = None
            else:
                ids, mask, past = runner.check_inputs(call.ids, call.mask, call.past)
        except MhaExportError as e:
            errors[i] = e
            continue
        live[i] = {iospec.INPUT_IDS: ids, iospec.ATTENTION_MASK: mask}
        if past is None:  # an extended call: each layer's past handed in at its piece; a shape until then
            shape = (ids.shape[0], c.n_kv_heads, past_length(calls, i), c.head_dim)
            past = [(np.broadcast_to(np.zeros((), np_dtype), shape),) * 2] * n
        for j, (k, v) in enumerate(past):
            live[i][f"past_key_values.{j}.key"], live[i][f"past_key_values.{j}.value"] = k, v
    config = dataclasses.replace(runner.config, external_data_dir=str(folder), cache_optimized=False,
                                 optimized_file=None)
    for piece in pieces.pieces:
        j = piece.index
        session, _, _ = open_session(piece.model, config)
        names = [o.name for o in session.get_outputs()]
        for i, call in enumerate(calls):
            if i in errors:
                continue
            if sources(call):
                failed = [s for s in sources(call) if s in errors]
                if failed:
                    errors[i] = RuntimeFailure(f"{runner.name}: the call it extends failed: "
                                               f"{first_line(errors[failed[0]])}")
                    live[i] = {}
                    continue
                if isinstance(call.past, Derived):  # this layer's past moved as the decode loop moved the cache
                    ((k, v),) = call.past.evaluate(lambda s: (made[(s, j)],),
                                                   lambda b: empty_pairs(c, np_dtype, b, 1))
                else:
                    k, v = made[(call.past, j)]
                for s in sources(call):
                    left[(s, j)] -= 1
                    if left[(s, j)] == 0 and not calls[s].keep:
                        del made[(s, j)]
                live[i][f"past_key_values.{j}.key"], live[i][f"past_key_values.{j}.value"] = k, v
            feed = {x: live[i][x] for x in piece.inputs}
            t0 = time.perf_counter()
            try:
                outs = session.run(names, feed)
            except Exception as e:  # noqa: BLE001 - ONNX Runtime's own types: this call's failure
                errors[i] = RuntimeFailure(f"{runner.name} failed at "
                                           f"{runner.describe_inputs((call.ids, call.mask))} (piece {j}): "
                                           f"{first_line(e)}")
                live[i] = {}
                continue
            seconds[i] += time.perf_counter() - t0
            got: dict[int, dict[str, np.ndarray]] = defaultdict(dict)
            for name, arr in zip(names, outs):
                m = re.fullmatch(r"present\.(\d+)\.(key|value)", name)
                if m:
                    got[int(m.group(1))][m.group(2)] = arr
                elif name == iospec.LOGITS:  # only the rows asked for, on file-backed pages in the mapped mode
                    arr = selected(arr, call.rows)
                    live[i][name] = spill.keep(arr) if spill is not None else arr
                else:
                    live[i][name] = arr
            for layer, kv in got.items():
                k, v = kv["key"], kv["value"]
                if spill is not None and call.keep:
                    k, v = spill.keep(k), spill.keep(v)
                if waiting.get(i):
                    made[(i, layer)] = (k, v)
                if call.keep:
                    presents[i][layer] = (k, v)
            for name in [x for x in live[i] if pieces.last_use.get(x, n) <= j and x != iospec.LOGITS]:
                del live[i][name]  # what no later piece reads
        del session
    results = []
    for i, call in enumerate(calls):
        if i in errors:
            results.append(Result(error=errors[i], seconds=seconds[i]))
            continue
        logits = live[i].pop(iospec.LOGITS)
        present = tuple(presents[i]) if call.keep else None
        if present is not None:
            present = tuple((np.asarray(k, dtype=np_dtype), np.asarray(v, dtype=np_dtype)) for k, v in present)
        results.append(Result(logits, present, seconds=seconds[i]))
        runner.times.append(seconds[i])
    return results


__all__ = ["Piece", "Pieces", "Unsplittable", "pieces_unsupported", "run_pieces", "split"]
