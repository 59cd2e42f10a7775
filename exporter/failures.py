"""One line for a failed export: which model, which op or module failed, and the innermost error.

torch.onnx's dynamo exporter chains its errors (``TorchExportError`` / ``ConversionError`` "step N/3" → "Error
when translating node ..." → ``DispatchError: No ONNX function found for ...``) and prints pages of report around
them; torch.jit does the same with its interpreter stack. The user needs three facts: the architecture, the op or
module that failed, and why. They are read from the exception chain itself rather than from its text where
possible: the FX node being translated is a local of the frame that raised (its target is the op, its
``nn_module_stack`` the module), and a Python error inside a module's forward has that module as ``self`` in its
frame.
"""

from __future__ import annotations

import re
import traceback

import torch

from mhaexport.core.errors import clip, first_line
from mhaexport.models.tracebacks import exception_chain, failing_module

ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _fx_node(e: BaseException) -> torch.fx.Node | None:
    """The FX node torch.onnx was translating when it failed (a local named ``node`` in a raising frame)."""
    found = None
    for exc in exception_chain(e):
        for frame, _ in traceback.walk_tb(exc.__traceback__):
            node = frame.f_locals.get("node")
            if isinstance(node, torch.fx.Node) and node.op == "call_function":
                found = node
    return found


def _node_where(node: torch.fx.Node) -> str:
    """``op aten.foo.default in model.layers.0.mlp (LlamaMLP)`` from an FX node's target and module stack."""
    target = node.target
    op = str(target) if isinstance(target, torch._ops.OpOverload) else getattr(target, "__name__", str(target))
    stack = node.meta.get("nn_module_stack") or {}
    if stack:
        path, cls = list(stack.values())[-1]
        cls_name = cls if isinstance(cls, str) else getattr(cls, "__name__", str(cls))
        return f"op {op} in {_short_path(path)} ({cls_name.rsplit('.', 1)[-1]})"
    return f"op {op}"


def _short_path(path: str) -> str:
    """torch.export's module path (``L['self'].hf.model.layers[0].mlp`` or ``hf.model.layers.0.mlp``) as dots."""
    path = re.sub(r"L\['self'\]\.?", "", path)
    path = re.sub(r"\[(\d+)\]", r".\1", path)
    path = re.sub(r"\._modules\['([^']+)'\]", r".\1", path)
    return path.strip(".") or "the model"


def _root_line(e: BaseException) -> str:
    """``Type: first line`` of the innermost error of the chain (torch.onnx's wrappers say only "step N/3 failed",
    "Error when translating node ...")."""
    for exc in reversed(list(exception_chain(e))):
        lines = [ln.strip() for ln in ANSI.sub("", str(exc)).splitlines() if ln.strip()]
        if lines and "This is step" not in lines[0] and not lines[0].startswith("Error when translating node"):
            return f"{type(exc).__name__}: {clip(lines[0])}"
    return first_line(e)


def describe_failure(e: BaseException, what: str) -> str:
    """One line: ``{what}: op aten.foo in model.layers.0.mlp (LlamaMLP): DispatchError: No ONNX function ...``.

    ``what`` names the model and the exporter ("LlamaForCausalLM (llama): torch.onnx.export failed"); the op comes
    from the FX node being translated, else the module from the innermost nn.Module frame."""
    node = _fx_node(e)
    where = _node_where(node) if node is not None else failing_module(e)
    return f"{what}: {where + ': ' if where else ''}{_root_line(e)}"
