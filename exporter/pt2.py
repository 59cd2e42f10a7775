"""torch.export and AOTInductor: the decoder (or the attention block on its own) as an ``ExportedProgram`` saved with
``torch.export.save`` (``model.pt2``, artifact ``pt2``) and, on request, compiled for CPU by AOTInductor into a
package ``aoti_load_package`` runs (``model.aoti.pt2``, artifact ``aoti``).

Both under the contract and dynamic axes of the ONNX export: batch, sequence and past are ``Dim``s, the mask's
width has a ``Dim`` of its own (torch.export refuses a Dim sum as a spec), and the causal mask is built at run
time. Each artifact goes through the folder's staged publish and manifest record like the other formats; the
program is published before the (slow) compile starts, so an interrupted compile leaves the program trusted.

Both files are code to whoever loads them (see :mod:`mhaexport.artifact.trust`): this process remembers the
bytes it published, so ``mhaexport all --pt2`` verifies what it just wrote without ``--trust-code``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch.export import Dim

from mhaexport.core import iospec
from mhaexport.artifact import stage_artifact
from mhaexport.artifact.details import AotiDetails, CacheLayout, Details, ExampleSizes, Pt2Details
from mhaexport.artifact.trust import AOTI, PT2, remember_own
from mhaexport.core.errors import ExportError, first_line
from mhaexport.exporter.common import ExportRecord, captured_warnings, example_inputs, finish, module_bytes
from mhaexport.exporter.failures import describe_failure
from mhaexport.exporter.onnx import dynamic_shapes
from mhaexport.core.iospec import EXAMPLE_BATCH, EXAMPLE_PAST, EXAMPLE_SEQ, ModelContract, ModuleContract
from mhaexport.models.loading import LoadedModel

PT2_FILE = "model.pt2"
AOTI_FILE = "model.aoti.pt2"  # torch's package loader wants the .pt2 suffix too
DTYPE = "float32"
EXPORTER = "torch.export.export(strict=False)"
AXES = [iospec.BATCH, iospec.SEQ, iospec.PAST, iospec.TOTAL]
# What to change, when torch.export cannot take a model (docs/torch-export.md, "torch.export and AOTInductor", says more)
DATA_DEPENDENT_HINT = ("forward branches on a tensor's values (data-dependent control flow): compute both sides "
                       "with torch.where, use torch.cond, or move the decision out of forward")
GUARD_HINT = ("forward fixes or branches on that length (an `if seq > n`, a buffer or mask of fixed size): build "
              "masks from the input shapes and keep Python branches off the dynamic lengths")


def _block_inputs(c: ModuleContract) -> tuple:
    from mhaexport.exporter.block import example_module_inputs

    return example_module_inputs(c)


def _spec(loaded: LoadedModel) -> tuple[tuple, tuple, Details]:
    """(example args, dynamic_shapes, the details record's common part) for the decoder or the block."""
    c = loaded.contract
    if isinstance(c, ModuleContract):
        from mhaexport.models.block import weights_note

        dims = {name: Dim(name) for name in (iospec.BATCH, iospec.SEQ, iospec.PAST)}
        axes = iospec.module_dynamic_input_axes()
        dynamic = tuple({ax: dims[d] for ax, d in axes[name].items()} for name in iospec.MODULE_INPUTS)
        common = dict(module=c.kind, mask=c.mask, weights=weights_note(loaded), cache=CacheLayout("concat"))
        return _block_inputs(c), dynamic, common
    assert isinstance(c, ModelContract)
    return example_inputs(c), dynamic_shapes(c.n_layers, True), {}


def explain_failure(e: BaseException, label: str) -> str:
    """One line for a model torch.export cannot take: the reason (data-dependent control flow, a dynamic length the
    model fixes), what to change, and the innermost error."""
    from mhaexport.models.tracebacks import exception_chain

    names = {type(x).__name__ for x in exception_chain(e)}
    text = " ".join(str(x) for x in exception_chain(e))
    if {"GuardOnDataDependentSymNode", "DataDependentOutputException"} & names or "data-dependent" in text:
        return f"{label}: torch.export cannot take it: {DATA_DEPENDENT_HINT}. {first_line(e)[:200]}"
    violated = violated_axes(e)
    # the longest names first: sequence_length is part of past_sequence_length and total_sequence_length
    for axis in (violated[:1] or sorted(AXES, key=len, reverse=True)):
        if axis in text and ("Constraints violated" in text or "specializ" in text or "guard" in text.lower()):
            return (f"{label}: torch.export cannot keep the dynamic axis {axis!r}: {GUARD_HINT}. "
                    f"{first_line(e)[:200]}")
    return describe_failure(e, f"{label}: torch.export.export failed")


def violated_axes(e: BaseException) -> list[str]:
    """The dynamic axes a torch.export ``Constraints violated (a, b)!`` error names, in its order ([] for others)."""
    import re

    found = re.search(r"Constraints violated \(([^)]*)\)", str(e))
    return [a.strip() for a in found.group(1).split(",")] if found else []


def _probe_inputs(loaded: LoadedModel) -> list[tuple[tuple[int, int, int], tuple]]:
    """Inputs at contract shapes the export never saw — seq=1 with an empty cache, a longer prompt, a longer cache,
    a wider batch — within max_positions: where a guard the export deferred to run time must hold."""
    c = loaded.contract
    limit = c.max_positions
    shapes = [(1, 1, 0), (1, EXAMPLE_SEQ + 4, 0), (1, 1, EXAMPLE_PAST + 6), (3, 2, 1)]
    shapes = [(b, s, p) for b, s, p in shapes if s + p <= limit]
    if isinstance(c, ModuleContract):
        from mhaexport.exporter.block import example_module_inputs

        return [((b, s, p), example_module_inputs(c, seq=s, past=p, batch=b)) for b, s, p in shapes]
    return [((b, s, p), example_inputs(c, seq=s, past=p, batch=b)) for b, s, p in shapes]


def _raised_minimums(old: tuple, new: tuple) -> dict[str, int] | None:
    """{axis: new minimum} when torch's suggested fixes (``new``) only raise some Dims' minimums of ``old``; None
    when they do anything else (fix an axis to a number, lower a maximum, relate two axes)."""
    flat_old, flat_new = torch.utils._pytree.tree_leaves(old), torch.utils._pytree.tree_leaves(new)
    if len(flat_old) != len(flat_new):
        return None
    raised = {}
    for a, b in zip(flat_old, flat_new):
        if not (hasattr(b, "__name__") and hasattr(b, "min") and a.__name__ == b.__name__ and a.max == b.max):
            return None
        if b.min != a.min:
            raised[b.__name__] = int(b.min)
    return raised


def _refined_export(loaded: LoadedModel, args: tuple, dynamic: tuple, error: BaseException
                    ) -> tuple[torch.export.ExportedProgram, dict[str, int]]:
    """The export again with torch's suggested fixes applied (what torch.onnx's exporter does), accepted only when
    they raise minimums and the program then agrees with eager at :func:`_probe_inputs`' shapes at or above them.
    A mask code's guard total >= past + seq (transformers' has one) becomes, with every length reasoned >= 2,
    total_sequence_length >= 4: the program then refuses a shorter mask at run time (recorded, and verify reports
    the shapes it refuses). The --hf wrapper avoids that narrowing by saying total == past + seq
    (``torch._check``, models/hf.py)."""
    new = torch.export.dynamic_shapes.refine_dynamic_shapes_from_suggested_fixes(getattr(error, "msg", str(error)),
                                                                                 dynamic)
    raised = _raised_minimums(dynamic, new)
    if not raised:
        raise error
    with torch.no_grad():
        program = torch.export.export(loaded.module, args, dynamic_shapes=new, strict=False)
        module = program.module()
        for (b, s, p), inputs in _probe_inputs(loaded):
            if s + p < raised.get(iospec.TOTAL, 0) or s < raised.get(iospec.SEQ, 0) or p < raised.get(iospec.PAST, 0):
                continue  # below the narrowed range: refused by the program's own input check, as recorded
            try:
                got = module(*inputs)[0]
            except Exception as e:  # a guard the program checks at run time: one program cannot serve the contract
                where = f"batch={b} seq={s} past={p}"
                raise ExportError(f"{loaded.label}: torch.export cannot keep the dynamic axes: the program it makes "
                                  f"checks '{first_line(e).split(': ', 2)[-1]}' and refuses {where} (one program "
                                  "cannot serve the empty-cache prefill and the decode step)") from None
            torch.testing.assert_close(got, loaded.module(*inputs)[0], atol=1e-3, rtol=1e-3)
    return program, raised


def export_program(loaded: LoadedModel) -> tuple[torch.export.ExportedProgram, tuple, list[str]]:
    """``torch.export.export`` of ``loaded`` (decoder or block) with the contract's dynamic axes: (program, the
    example args, the warnings worth showing). Where torch.export's guards violate the axes' ranges, the export is
    tried once more with those guards as run-time asserts (:func:`_deferred_export`). ExportError in one line when
    torch.export cannot take the model."""
    args, dynamic, _ = _spec(loaded)
    with captured_warnings() as warns:
        try:
            with torch.no_grad():
                program = torch.export.export(loaded.module, args, dynamic_shapes=dynamic, strict=False)
        except Exception as e:
            if not violated_axes(e):
                raise ExportError(explain_failure(e, loaded.label)) from None
            try:
                program, raised = _refined_export(loaded, args, dynamic, e)
            except ExportError:
                raise
            except Exception:
                raise ExportError(explain_failure(e, loaded.label)) from None
            shown = ", ".join(f"{k} >= {v}" for k, v in raised.items())
            warns.append(f"torch.export narrowed the dynamic axes to {shown} (its guards on this model, which it "
                         "reasons about with every length >= 2); the program refuses shorter inputs at run time")
    return program, args, list(warns)


def _details(loaded: LoadedModel, kind: type[Details], **more) -> Details:
    _, _, common = _spec(loaded)
    return kind(dynamic_axes=list(AXES),
                example_sizes=ExampleSizes(EXAMPLE_BATCH, EXAMPLE_SEQ, EXAMPLE_PAST), exporter=EXPORTER,
                **common, **more)


def _io(loaded: LoadedModel) -> dict | None:
    c = loaded.contract
    return iospec.module_io_schema(c, DTYPE) if isinstance(c, ModuleContract) else None


def compiler_name() -> str | None:
    """The C++ compiler inductor builds with and its version ("g++: gcc version 12.2.0"), or None."""
    import re

    try:
        from torch._inductor.cpp_builder import get_compiler_version_info, get_cpp_compiler

        cc = get_cpp_compiler()
        info = get_compiler_version_info(cc)  # `cc -v` with newlines as "_"
    except Exception:  # an introspection helper of torch's private API: absent is fine
        return None
    found = re.search(r"([A-Za-z]+ version [0-9][\w.+-]*)", info or "")
    return f"{cc.rsplit('/', 1)[-1]}: {found.group(1)}" if found else cc


def export_pt2(loaded: LoadedModel, out_dir: str | Path, *, aoti: bool = False,
               progress: Callable[[str], None] | None = None) -> list[ExportRecord]:
    """Export ``loaded`` with torch.export to out_dir/model.pt2 (artifact ``pt2``) and, with ``aoti``, compile that
    program with AOTInductor for CPU into out_dir/model.aoti.pt2 (artifact ``aoti``, compile time recorded).
    Returns the records, pt2 first. ExportError (one line) for a model torch.export cannot take. ``progress``
    hears one line before the compile and one after it, with its time."""
    out_dir = Path(out_dir)
    started = time.perf_counter()
    records = []
    with stage_artifact(out_dir, PT2, f"export {PT2}", expected_bytes=module_bytes(loaded.module)) as staged:
        program, _, warns = export_program(loaded)
        torch.export.save(program, staged.dir / PT2_FILE)
        rec = finish(loaded, staged, fmt=PT2, main_file=PT2_FILE, files=[PT2_FILE], dtype=DTYPE,
                     details=_details(loaded, Pt2Details, strict=False), started=started, warns=warns,
                     io=_io(loaded))
    remember_own(rec.manifest.artifacts[PT2])
    records.append(rec)
    if aoti:
        if progress is not None:
            progress(f"compiling {PT2_FILE} with AOTInductor for CPU ({compiler_name() or 'the C++ compiler'}) ...")
        records.append(compile_aoti(loaded, program, out_dir,
                                    program_sha256=rec.manifest.artifacts[PT2].files[PT2_FILE]["sha256"]))
        if progress is not None:  # 30-80 s on a small CPU: the line after says it is done, and how long it took
            progress(f"compiled {AOTI_FILE} in {records[-1].manifest.artifacts[AOTI].details.compile_seconds:.0f} s")
    return records


def compile_aoti(loaded: LoadedModel, program: torch.export.ExportedProgram, out_dir: str | Path, *,
                 program_sha256: str | None = None) -> ExportRecord:
    """AOTInductor-compile ``program`` (``loaded``'s, from :func:`export_program`) for CPU into
    out_dir/model.aoti.pt2 (artifact ``aoti``). ExportError naming the compiler's complaint when the compile fails."""
    started = time.perf_counter()
    with stage_artifact(out_dir, AOTI, f"compile {AOTI}", expected_bytes=2 * module_bytes(loaded.module)) as staged, \
            captured_warnings() as warns:
        t0 = time.perf_counter()
        try:
            with torch.no_grad():
                torch._inductor.aoti_compile_and_package(program, package_path=str(staged.dir / AOTI_FILE))
        except Exception as e:
            raise ExportError(describe_failure(e, f"{loaded.spec}: AOTInductor compile (CPU) failed")) from None
        seconds = round(time.perf_counter() - t0, 3)
        details = _details(loaded, AotiDetails, device="cpu", compile_seconds=seconds, program_sha256=program_sha256,
                           compiler=compiler_name())
        # inductor's own use of torch.jit says nothing about the model
        shown = [w for w in warns if not ("deprecat" in w.lower() and "torch.jit" in w)]
        rec = finish(loaded, staged, fmt=AOTI, main_file=AOTI_FILE, files=[AOTI_FILE], dtype=DTYPE, details=details,
                     started=started, warns=shown, io=_io(loaded))
    remember_own(rec.manifest.artifacts[AOTI])
    return rec
