"""Export the attention block on its own (``--module attention``): ONNX and TorchScript under the module contract
of :mod:`mhaexport.core.iospec` (inputs ``x``, ``past_key``, ``past_value``; outputs ``output``, ``present_key``,
``present_value``, ``attention_weights``), with dynamic batch, sequence, past and total axes.

Both go through the same staged write and manifest record as the decoder (:func:`exporter.common.finish`): the
model record's contract is the :class:`~mhaexport.core.iospec.ModuleContract`, each artifact entry says ``module``,
``mask``, where the weights came from, and its own I/O schema. No genai_config (a block is not a generator).
"""

from __future__ import annotations

import time
from pathlib import Path

import onnx_ir as ir
import torch
from torch.export import Dim

from mhaexport.core import iospec
from mhaexport.artifact import stage_artifact
from mhaexport.artifact.details import CacheLayout, Details, ExampleSizes, OnnxDetails, TorchScriptDetails
from mhaexport.core.errors import ExportError, first_line
from mhaexport.exporter.common import ExportRecord, captured_warnings, finish
from mhaexport.exporter.genai import GENAI_CONFIG
from mhaexport.exporter.onnx import (DATA_FILE, DEFAULT_OPSET, MAX_OPSET, MIN_OPSET, ONNX_FILE,
                                     _explain_export_failure, check_onnx, refuse_fixed_axes)
from mhaexport.exporter.torchscript import MODES, TS_FILE, _summarize
from mhaexport.core.iospec import EXAMPLE_BATCH, EXAMPLE_PAST, EXAMPLE_SEQ, ModuleContract
from mhaexport.models.block import weights_note
from mhaexport.models.loading import LoadedModel

DTYPE = "float32"


def example_module_inputs(contract: ModuleContract, seq: int = EXAMPLE_SEQ, past: int = EXAMPLE_PAST,
                          batch: int = EXAMPLE_BATCH) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(x, past_key, past_value) at the exporters' example sizes (all >= 2 and distinct: no dim specialized)."""
    return tuple(torch.from_numpy(a) for a in iospec.dummy_module_inputs(contract, batch, seq, past, seed=1234))


def _contract(loaded: LoadedModel) -> ModuleContract:
    if not isinstance(loaded.contract, ModuleContract):
        raise ExportError(f"{loaded.spec} is a decoder: export it with `mhaexport onnx` (no --module)")
    return loaded.contract


def _details(loaded: LoadedModel, c: ModuleContract, kind: type[Details], **more) -> Details:
    return kind(module=c.kind, mask=c.mask, weights=weights_note(loaded), cache=CacheLayout("concat"),
                dynamic_axes=[iospec.BATCH, iospec.SEQ, iospec.PAST, iospec.TOTAL],
                example_sizes=ExampleSizes(EXAMPLE_BATCH, EXAMPLE_SEQ, EXAMPLE_PAST), **more)


def _name_output_dims(model: ir.Model) -> None:
    """present_* and attention_weights grow with the cache: name that axis total_sequence_length (the exporter
    writes 'past_sequence_length + sequence_length')."""
    axes = iospec.module_output_axes()
    for out in model.graph.outputs:
        if named := axes.get(out.name):
            dims = list(out.shape)
            for axis, name in named.items():
                dims[axis] = ir.SymbolicDim(name)
            out.shape = ir.Shape(dims)


def export_module_onnx(loaded: LoadedModel, out_dir: str | Path, *, opset: int | None = None) -> ExportRecord:
    """Export the block ``loaded`` (:func:`mhaexport.models.block.load_block`) to out_dir/model.onnx, float32, with
    dynamic batch, sequence and past axes, and record it in out_dir/manifest.json. A graph whose axes came out
    fixed is refused (ExportError), as for the decoder."""
    c = _contract(loaded)
    opset = DEFAULT_OPSET if opset is None else opset
    if not MIN_OPSET <= opset <= MAX_OPSET:
        raise ExportError(f"--opset {opset} is outside the supported range {MIN_OPSET}..{MAX_OPSET}")
    dims = {name: Dim(name) for name in (iospec.BATCH, iospec.SEQ, iospec.PAST)}
    axes = iospec.module_dynamic_input_axes()
    dynamic = tuple({ax: dims[d] for ax, d in axes[name].items()} for name in iospec.MODULE_INPUTS)
    args = example_module_inputs(c)
    started = time.perf_counter()
    with stage_artifact(out_dir, "onnx", f"export onnx --module {c.kind}") as staged, captured_warnings() as warns:
        try:
            with torch.no_grad():
                program = torch.onnx.export(loaded.module, args, dynamo=True, opset_version=opset,
                                            dynamic_shapes=dynamic, input_names=list(iospec.MODULE_INPUTS),
                                            output_names=list(iospec.MODULE_OUTPUTS), verbose=False)
        except Exception as e:
            raise ExportError(_explain_export_failure(e, f"the {c.kind} block")) from None
        if program is None:
            raise ExportError("torch.onnx.export returned no program")
        model = program.model
        refuse_fixed_axes(model, axes)
        _name_output_dims(model)
        ir.save(model, staged.dir / ONNX_FILE)
        check_onnx(staged.dir / ONNX_FILE)
        details = _details(loaded, c, OnnxDetails, opset=opset, attention="decomposed",
                           exporter="torch.onnx.export(dynamo=True)")
        # a decoder export in this folder before may have left its genai config and external data: not this one's
        return finish(loaded, staged, fmt="onnx", main_file=ONNX_FILE, files=[ONNX_FILE], dtype=DTYPE,
                      details=details, started=started, warns=list(warns), io=iospec.module_io_schema(c, DTYPE),
                      owned=(GENAI_CONFIG, DATA_FILE))


def export_module_torchscript(loaded: LoadedModel, out_dir: str | Path, *, mode: str = "trace") -> ExportRecord:
    """Trace (or script) the block ``loaded`` to out_dir/model.pt, called as m(x, past_key, past_value)."""
    c = _contract(loaded)
    if mode not in MODES:
        raise ExportError(f"--mode {mode!r}: expected one of {', '.join(MODES)}")
    args = example_module_inputs(c)
    started = time.perf_counter()
    with stage_artifact(out_dir, "torchscript", f"export torchscript --module {c.kind}") as staged, \
            captured_warnings() as warns:
        try:
            with torch.no_grad():
                module = (torch.jit.trace(loaded.module, args, check_trace=False) if mode == "trace"
                          else torch.jit.script(loaded.module))
        except Exception as e:
            hint = "; --mode trace works for the block" if mode == "script" else ""
            raise ExportError(f"torch.jit.{mode} of the {c.kind} block failed: {first_line(e)}{hint}") from None
        module.save(str(staged.dir / TS_FILE))
        details = _details(loaded, c, TorchScriptDetails, mode=mode)
        return finish(loaded, staged, fmt="torchscript", main_file=TS_FILE, files=[TS_FILE], dtype=DTYPE,
                      details=details, started=started, warns=_summarize(list(warns)),
                      io=iospec.module_io_schema(c, DTYPE))
