"""TorchScript export: torch.jit.trace (default) or torch.jit.script, saved as model.pt.

torch.jit is deprecated in recent torch; it still works and many deploy stacks still load .pt files. The
deprecation is reported once per export, not once per call.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from mhaexport.artifact import stage_artifact
from mhaexport.artifact.details import ExampleSizes, TorchScriptDetails
from mhaexport.core.errors import ExportError, ExportOptionError
from mhaexport.core.errors import clip
from mhaexport.exporter.common import (JIT_DEPRECATED, TRACED_CONSTANTS, ExportRecord, captured_warnings,
                                       example_inputs, finish, module_bytes)
from mhaexport.exporter.failures import describe_failure
from mhaexport.models.loading import LoadedModel

TS_FILE = "model.pt"
MODES = ("trace", "script")
DEPRECATION_NOTE = JIT_DEPRECATED


def _summarize(warns: list[str]) -> list[str]:
    """Fold the tracer's warnings into one line that says what they mean and what checks it (each may mark a value
    baked into the trace: verify's dynamic-shapes and kv-consistency run the file at sizes it was not traced at, and
    fail it there), and jit deprecations into one note."""
    out, deprecated, traced = [], False, []
    for w in warns:
        if "deprecat" in w.lower() and "jit" in w.lower():
            deprecated = True
        elif w.startswith("TracerWarning:"):
            traced.append(w.removeprefix("TracerWarning:").strip())
        else:
            out.append(w)
    if traced:
        first = clip(traced[0].split(". ")[0], 80)
        more = "; ..." if len(traced) > 1 else ""
        out.append(f"{TRACED_CONSTANTS} {len(traced)} value(s) as constants (TracerWarning: {first}{more}); verify "
                   "runs the file at sizes it was not traced at, and fails it if one mattered")
    if deprecated:
        out.append(DEPRECATION_NOTE)
    return out


def export_torchscript(loaded: LoadedModel, out_dir: str | Path, *, mode: str = "trace") -> ExportRecord:
    """Trace or script ``loaded`` to out_dir/model.pt, called as m(input_ids, attention_mask, past_key_values)."""
    if mode not in MODES:
        raise ExportOptionError(f"--mode {mode!r}: expected one of {', '.join(MODES)}")
    out_dir = Path(out_dir)
    started = time.perf_counter()
    args = example_inputs(loaded.contract)
    with stage_artifact(out_dir, "torchscript", expected_bytes=module_bytes(loaded.module)) as staged, \
            captured_warnings() as warns:
        try:
            with torch.no_grad():
                if mode == "trace":
                    module = torch.jit.trace(loaded.module, args, check_trace=False)
                else:
                    module = torch.jit.script(loaded.module)
        except Exception as e:
            hint = "; --mode trace works for any model that follows the contract" if mode == "script" else ""
            raise ExportError(describe_failure(e, f"{loaded.label}: torch.jit.{mode} failed") + hint) from None
        module.save(str(staged.dir / TS_FILE))
        details = TorchScriptDetails(mode=mode, example_sizes=ExampleSizes(args[0].shape[0], args[0].shape[1],
                                                                           args[2][0][0].shape[2]))
        return finish(loaded, staged, fmt="torchscript", main_file=TS_FILE, files=[TS_FILE], dtype="float32",
                      details=details, started=started, warns=_summarize(list(warns)))
