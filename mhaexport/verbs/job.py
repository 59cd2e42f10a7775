"""``mhaexport all``, the main job: export both formats (a target's quantized file, torch.export on request) into
one folder, verify them, write the report — each stage said as ``[k/n]``."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mhaexport.verbs.common import Progress, _budgeted, _model, _say, writable_output
from mhaexport.verbs.export import _given, export_onnx, export_pt2, export_torchscript, target_options
from mhaexport.verbs.inputs import check_junit
from mhaexport.verbs.quantize import quantize
from mhaexport.verbs.reports import write_reports
from mhaexport.verbs.verify import verify

if TYPE_CHECKING:  # pragma: no cover
    from mhaexport.models.loading import LoadedModel
    from mhaexport.verify.report import VerifyReport


class AllRun:
    """What ``mhaexport.all`` did: ``records`` (the exports and quantization, in order), ``report`` (verify's
    :class:`~mhaexport.verify.report.VerifyReport`), ``written`` (the report files and JUnit file). Truthy only
    when the verdict passed."""

    def __init__(self, records: list, report: VerifyReport, written: list[Path]) -> None:
        self.records, self.report, self.written = records, report, written

    def __bool__(self) -> bool:
        return bool(self.report)

    def __repr__(self) -> str:
        return f"AllRun({self.report.verdict.message!r}, {len(self.records)} record(s))"


@_budgeted
def all(output: str | Path = "artifacts/default", *, model: str | LoadedModel | None = None,
        config: str | None = None, hf: str | Path | None = None, checkpoint: str | Path | None = None,
        revision: str | None = None, allow_download: bool = False, runtimes: Sequence[str] | None = None,
        sweep: str = "quick", seed: int = 0, atol: float | dict | None = None, rtol: float | dict | None = None,
        tokens: int | None = None, quality: Any = None, opset: int | None = None, attention: str | None = None,
        dtype: str | None = None, target: str | None = None, pt2: bool = False, aoti: bool = False,
        replace: bool = False, junit: str | Path | None = None, progress: Progress | None = None,
        memory: str | int | None = None, mapped: bool = False) -> AllRun:
    """``mhaexport all``, the main job: export ONNX and TorchScript into folder ``output``, verify both against
    eager PyTorch, write report.json / .md / .html there (and ``junit``). ``target`` (portable, ort-cpu, ort-cuda):
    the ONNX file for that runtime (``attention``/``dtype`` given too must agree; ort-cpu's float source goes to
    ``OUTPUT-float32``); ``pt2`` / ``aoti``: also export with torch.export (and AOTInductor) and verify those.
    Each stage is said through ``progress`` as a :class:`mhaexport.core.progress.Stage` (``[k/n]`` on the command line).
    Everything is checked before any work. Returns an :class:`AllRun` (truthy only when the verdict passed;
    ``.report``, ``.records``, ``.written``). ``memory`` / ``mapped``: verify's memory cap and mode (:func:`verify`).
    The model is loaded streamed (a factory's in memory): its weights in one staging file, memory-mapped, which the
    exports write from and verify's eager reads. Raises ConfigError /
    ModelLoadError / ExportError / ArtifactError."""
    from mhaexport.outputs import check_outputs
    from mhaexport.core.progress import Stage

    say = _say(progress)
    kv_cache, weights = None, None
    if target is not None:
        attention, kv_cache, dtype, weights = target_options(target, _given(attention=attention, dtype=dtype))
    attention, dtype = attention or "decomposed", dtype or "float32"
    if junit is not None:
        check_junit(junit)
    if memory is not None:
        from mhaexport.verify.memory import parse_size

        parse_size(memory)
    check_outputs({"--junit": junit}, writing=[output], reports=output)
    writable_output(output)  # every stage writes there: checked before the model loads
    stages = ["load", "export ONNX", *(["quantize ONNX"] if weights else []), "export TorchScript",
              *(["export pt2"] if pt2 or aoti else []), "verify"]
    done = [0]

    def stage(message: str) -> None:
        done[0] += 1
        say(Stage(message, done[0], len(stages)))

    named = model if isinstance(model, str) else None
    stage(f"load {named or config or (f'--hf {hf}' if hf else None) or 'the default model'}")
    # streamed (the built-in decoder, an --hf folder): one staging file of the weights, mapped, that every stage reads
    loaded = _model(model, config, hf, checkpoint, revision, allow_download, progress, streamed=True)
    onnx_out = Path(f"{Path(output)}-{dtype}") if weights else output
    cache = "" if kv_cache in (None, "concat") else f", {kv_cache} KV cache"
    stage(f"export ONNX (opset {opset or (23 if attention == 'onnx' else 18)}, dynamic axes, attention {attention}, "
          f"{dtype}{cache}) -> {onnx_out}")
    records: list = [export_onnx(onnx_out, model=loaded, opset=opset, attention=attention, dtype=dtype,
                                 kv_cache=kv_cache or "concat", replace=replace, progress=progress, announce=False)]
    if weights:
        stage(f"quantize ONNX ({weights}) -> {output}")
        records.append(quantize(onnx_out, output, weights=weights, replace=replace))
    stage(f"export TorchScript (trace) -> {output}")
    records.append(export_torchscript(output, model=loaded, replace=replace))
    if pt2 or aoti:  # this process's own export: verify loads it without trust_code (artifact/trust.py)
        stage(f"export torch.export{' + AOTInductor (CPU)' if aoti else ''} -> {output}")
        records.extend(export_pt2(output, model=loaded, aoti=aoti, replace=replace))
    stage(f"verify {output} ({sweep} sweep)")
    report = verify(output, model=loaded, runtimes=runtimes, sweep=sweep, seed=seed, atol=atol, rtol=rtol,
                    tokens=tokens, quality=quality, progress=progress, memory=memory, mapped=mapped)
    from mhaexport.verify.render import markdown

    written = write_reports(report, output, junit, name="report", markdown=markdown(report))
    return AllRun(records, report, written)
