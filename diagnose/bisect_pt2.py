"""Bisect of a torch.export program (``model.pt2``): where its values first depart from eager PyTorch, per module.

The ONNX bisect (:mod:`mhaexport.diagnose.bisect`) reads each node's module scope from torch.onnx's metadata; a
program's FX nodes keep theirs as ``nn_module_stack`` (``hf.model.layers.0.self_attn``), saved and loaded with the
program. So the program loaded from the folder (``torch.export.load(...).module()``, the bytes the manifest
vouches for, loaded only as :mod:`mhaexport.artifact.trust` allows) runs under an ``fx.Interpreter`` that keeps
every float value, eager runs with a hook on every submodule, and the ONNX bisect's comparison matches each
module's output (the last value of its shape computed in its scope) and input, and names the first divergent
tensor and the culprit: the first module whose input still agrees but whose output does not.

An AOTInductor package keeps no module scopes (one compiled kernel library): bisect its program instead.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from mhaexport.core import iospec
from mhaexport.artifact.trust import AOTI, PT2, refusal
from mhaexport.core.errors import ConfigError, MhaExportError
from mhaexport.diagnose.bisect import BisectReport, _compare, _eager_values, check_shapes

PROVIDER = "torch.export (cpu)"
_EMPTY = "_empty_nn_module_stack_from_metadata_hook"  # torch's placeholder scope for nodes it made itself


@dataclass
class _Node:
    """The face of an FX node that the comparison reads (an ONNX node's fields): op, name, inputs, output."""

    op_type: str  # "aten.linear"
    name: str  # the FX node's name, its value's name ("linear_3")
    input: list[str] = field(default_factory=list)
    output: list[str] = field(default_factory=list)
    domain: str = ""


def _path(path: str) -> str:
    """A scope as a module path: ``L['self'].hf.layers[0]`` or ``hf.layers.0`` -> ``hf.layers.0`` (root: '')."""
    path = re.sub(r"L\['self'\]\.?", "", path)
    path = re.sub(r"\[(\d+)\]", r".\1", path)
    return re.sub(r"\._modules\['([^']+)'\]", r".\1", path).strip(".")


def _scope(node) -> list[str] | None:
    """The node's scopes in the ONNX bisect's shape: ['', outermost module, ..., innermost, node name]; None when
    torch made the node outside every module."""
    stack = node.meta.get("nn_module_stack") or {}
    paths = [_path(p) for p, _ in stack.values() if p != _EMPTY]
    if not stack or all(p == _EMPTY for p, _ in stack.values()):
        return None
    return ["", *[p for p in paths if p], node.name]


def _op(node) -> str:
    """``aten.linear`` for ``aten.linear.default``; the callable's name otherwise (``add`` for operator.add)."""
    target = node.target
    text = str(target) if hasattr(target, "_schema") or "aten." in str(target) else getattr(target, "__name__",
                                                                                               str(target))
    return text[:-len(".default")] if text.endswith(".default") else text


def program_values(gm, ids, mask, past) -> tuple[dict[str, np.ndarray], tuple]:
    """Run the program's graph module on the contract's inputs, keeping every float value: ({node name: value},
    (logits, present)) — the values as float32 numpy arrays."""
    import torch

    values: dict[str, np.ndarray] = {}

    class Keep(torch.fx.Interpreter):
        def run_node(self, n):
            out = super().run_node(n)
            if n.op in ("call_function", "placeholder") and isinstance(out, torch.Tensor) and out.is_floating_point():
                values[n.name] = out.detach().float().numpy().copy()
            return out

    with torch.no_grad():
        out = Keep(gm).run(ids, mask, tuple(past))  # the program's own input and output processing (pytree)
    return values, out


def bisect_program(program, loaded, *, batch: int = 2, seq: int = 4, past: int = 3, pad: list[int] | None = None,
                   seed: int = 0, tol: float = 1e-3) -> BisectReport:
    """Compare a torch.export program — a ``.pt2`` path (the caller decided it may be loaded: it is code) or an
    ``ExportedProgram`` — with ``loaded`` (a LoadedModel) module by module, at the seeded contract inputs
    (batch, seq, past), left-padded by ``pad``. ``tol``: the relative error above which a tensor diverges."""
    import torch

    from mhaexport.models.inputs import make_inputs

    if isinstance(program, (str, Path)):
        label = str(program)
        program = torch.export.load(str(program))
    else:
        label = "<in-memory ExportedProgram>"
    c = loaded.contract
    check_shapes(c, batch, seq, past, pad)
    gm = program.module()
    graph_nodes = [n for n in gm.graph.nodes if n.op == "call_function"]
    if not any(_scope(n) for n in graph_nodes):
        raise MhaExportError(f"{label} carries no module scopes (nn_module_stack) on its nodes: bisect needs a "
                             "program saved by torch.export.save with its node metadata")
    nodes = [_Node(_op(n), n.name, [a.name for a in n.all_input_nodes], [n.name]) for n in graph_nodes]
    scopes = [_scope(n) for n in graph_nodes]
    producer = {n.name: i for i, n in enumerate(graph_nodes)}
    out_node = next(n for n in gm.graph.nodes if n.op == "output")
    leaves = torch.utils._pytree.tree_leaves(out_node.args[0])  # logits, then each layer's key and value
    contract_outputs = [iospec.LOGITS] + [n for i in range(c.n_layers) for n in iospec.present_names(i)]
    file_name = {k: getattr(v, "name", None) for k, v in zip(contract_outputs, leaves)}

    ids, mask, cache = make_inputs(c, batch=batch, seq=seq, past=past, seed=seed, pad=pad)
    eager, (logits, present) = _eager_values(loaded.module, ids, mask, cache)
    expected = {iospec.LOGITS: logits.float().numpy()}
    for i, (k, v) in enumerate(present):
        kn, vn = iospec.present_names(i)
        expected[kn], expected[vn] = k.float().numpy(), v.float().numpy()
    values, _ = program_values(gm, ids, mask, cache)
    positions = np.maximum(np.cumsum(mask.numpy(), axis=-1) - 1, 0)[:, -seq:]  # (B, T), as the model's
    report = _compare(label, nodes, scopes, values, producer, eager, expected, file_name, tol, positions)
    report.kind = PT2
    report.shapes = {"batch": batch, "seq": seq, "past": past}
    report.positions = (int(positions.min()), int(positions.max()))
    report.pad = list(pad or [])
    report.provider = PROVIDER
    return report


def bisect_pt2(folder, loaded=None, *, trust_code: bool = False, case_from: str = "",
               **kwargs) -> BisectReport:
    """Bisect an export folder's ``model.pt2`` (hashes checked first; loaded only with ``trust_code`` or as this
    process's own export, else ConfigError naming the flag) against eager PyTorch — ``loaded``, or the model the
    manifest records. Keyword arguments go to :func:`bisect_program` (batch, seq, past, pad, seed, tol)."""
    from mhaexport.artifact import opened
    from mhaexport.models.loading import check_same_model, load_recorded

    with opened(folder, PT2) as ef:  # the snapshot of the checked bytes, removed when done (when opened here)
        why = refusal(ef.entry(PT2), PT2, ef.path, trust_code)
        if why is not None:
            raise ConfigError(f"bisect of the torch.export program: {why}")
        if loaded is None:
            loaded = load_recorded(ef, trust_code=trust_code)
        else:
            check_same_model(loaded, ef.model)
        report = bisect_program(ef.file(PT2), loaded, **kwargs)
    report.model = str(ef.path / ef.entry(PT2).file)  # the file as the user knows it, not the snapshot's
    report.case_from = case_from
    return report


def bisect_target(folder: str | Path, runtimes: tuple[str, ...] | None = None) -> str:
    """What ``verify FOLDER --bisect`` bisects: ``"pt2"`` (the torch.export program) when ``--runtime pt2`` names it,
    when the folder holds a program but no ONNX file, or when the folder's verify report (written since its last
    export) has the program's parity failing and no ONNX Runtime's; else ``"onnx"``. ConfigError for ``aoti``
    (a compiled package keeps no module scopes) or a named runtime bisect cannot compare."""
    from mhaexport.artifact import read_manifest
    from mhaexport.verify.report import read_report_in

    named = tuple(runtimes or ())
    if AOTI in named:
        raise ConfigError("--bisect --runtime aoti: an AOTInductor package keeps no module scopes (one compiled "
                          "library); bisect the program it was compiled from: --runtime pt2")
    if PT2 in named:
        if any(rt.startswith("ort-") for rt in named):
            raise ConfigError("--bisect compares one artifact: name --runtime pt2 (the program) or an ONNX Runtime "
                              "(the ONNX file), not both")
        return PT2
    folder = Path(folder)
    try:
        artifacts = read_manifest(folder).artifacts
    except MhaExportError:  # the ONNX path opens the folder and says what is wrong with it, as it always did
        return "onnx"
    has_pt2, has_onnx = PT2 in artifacts, "onnx" in artifacts
    if not has_pt2 or named:
        return "onnx"
    if not has_onnx:
        return PT2
    exported = (folder / "manifest.json").stat().st_mtime
    for path in sorted((p for p in folder.glob("report*.json") if p.lstat().st_mtime >= exported),
                       key=lambda p: p.lstat().st_mtime, reverse=True):
        try:  # read confined: a link in the folder is passed over, never followed
            report = read_report_in(folder, path.name)
        except MhaExportError:
            continue
        if report is None:
            continue
        failed = {rt for rt in report.results if getattr(report.result(rt, "parity"), "status", None) is False}
        if failed:
            return PT2 if PT2 in failed and not any(rt.startswith("ort-") for rt in failed) else "onnx"
    return "onnx"


def refuse_untrusted_program(folder: str | Path, trust_code: bool) -> None:
    """ConfigError (exit 2, before any work) when ``folder``'s program may not be loaded (it is code: see
    :mod:`mhaexport.artifact.trust`), or when the folder holds none."""
    from mhaexport.artifact import read_manifest

    entry = read_manifest(folder).artifacts.get(PT2)
    if entry is None:
        raise ConfigError(f"--bisect --runtime pt2: no torch.export program in {folder} (export one with "
                          "`mhaexport pt2`)")
    why = refusal(entry, PT2, folder, trust_code)
    if why is not None:
        raise ConfigError(f"--bisect of the torch.export program: {why}")
