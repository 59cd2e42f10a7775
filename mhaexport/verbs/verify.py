"""``mhaexport verify FOLDER`` as a function (:func:`verify`: a report, written where asked) and what the verb whole
returns (:class:`VerifyRun`)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mhaexport.core.errors import MhaExportError
from mhaexport.verbs.common import (Progress, _budgeted, _count, _model, _names, _renamed, _tolerance,
                                    _keep_half_for)
from mhaexport.verbs.reports import write_reports

if TYPE_CHECKING:  # pragma: no cover
    from mhaexport.diagnose.follow import BisectRun
    from mhaexport.models.loading import LoadedModel
    from mhaexport.verify.report import VerifyReport


@_budgeted
def verify(folder: str | Path, *, model: str | LoadedModel | None = None, config: str | None = None,
           hf: str | Path | None = None, checkpoint: str | Path | None = None, revision: str | None = None,
           runtimes: Sequence[str] | None = None, sweep: str = "quick", seed: int = 0,
           atol: float | dict | None = None, rtol: float | dict | None = None, gen_tokens: int | None = None,
           output: str | Path | None = None, junit: str | Path | None = None, quality: Any = None,
           trust_code: bool = False, progress: Progress | None = None, tokens: int | None = None,
           allow_download: bool = False, reference: str = "auto", record: bool = False,
           memory: str | int | None = None, mapped: bool = False) -> VerifyReport:
    """``mhaexport verify FOLDER``: check every artifact of an export folder against eager PyTorch on each runtime.

    The eager model is rebuilt from the folder's manifest, or given (``model``/``config``/``hf``/``checkpoint``: it
    must be the exported model — same fingerprint — which re-points a folder whose source moved). ``runtimes``: None
    for the defaults (one that cannot run here is skipped without failing); named ones must run (else the verdict is
    "not verified"). ``output``: also write report.json + report.md there; ``junit``: also write JUnit XML;
    ``quality``: a :class:`mhaexport.verify.quality.QualitySettings` for a quantized folder (threshold overrides,
    the text). ``trust_code``: the folder is yours — run the code it holds: rebuild its eager model from a manifest
    source that is code (a factory file or module; without it such a folder raises UntrustedCode unless ``model``
    names the model) and load its torch.export program / AOTInductor package (without it they are skipped with the
    reason, or refused when named in ``runtimes``). Nothing runs because a folder says so.

    ``tokens``: greedy tokens for the generation check (``--tokens``; default 8 quick, 32 full; ``gen_tokens`` is its
    deprecated alias). ``allow_download``: with ``hf`` a Hub id, let huggingface_hub download what the cache lacks.

    ``record``: also write eager's outputs over this sweep into the folder (``reference.json`` + ``reference.npz``,
    hashed in the manifest under the ONNX file: ``--record``); ``reference``: ``"auto"`` (the folder's record when it
    holds one and torch cannot be imported here, else eager), ``"eager"``, ``"recorded"`` (judge the ONNX file from
    the record, without torch or the weights; a record of other weights, another sweep or another file is refused:
    ReferenceMismatch). docs/verify.md says what a record keeps and proves.
    ``memory``: the memory cap (``--memory``: ``"1.5G"``, ``"800M"`` or bytes; None: the machine's — the cgroup's
    limit or MemAvailable, the smaller); ``mapped``: hold the weights memory-mapped whatever fits (``--mapped``). The
    run is planned before any weight is read (:mod:`mhaexport.verify.memory`): weights whole when everything fits,
    memory-mapped (eager's built-in decoder and ONNX Runtime's external data) when only that fits, and refused
    (ConfigError, exit 2, one line saying what it needs and what to try) when even that does not; ``report.memory``
    says the cap, the mode and why, and the peak RSS measured.

    Returns the :class:`~mhaexport.verify.report.VerifyReport`: ``bool(report)`` is True only when the verdict
    passed (exit 0 on the command line) — a failed check and a runtime asked for that was skipped are both False;
    ``report.verdict`` says which (``.code`` 1 or 4, ``.message``). Raises ArtifactError / ConfigError for bad
    input; a folder refused that way still gets its report (verdict "refused") in ``output`` and ``junit``."""
    from mhaexport.verify import verify_folder

    gen_tokens = _renamed("tokens", tokens, "gen_tokens", gen_tokens)
    _count(gen_tokens, "tokens")
    _count(seed, "seed", 0, optional=False)
    _tolerance(atol, "atol")
    _tolerance(rtol, "rtol")
    runtimes = _names(runtimes, "runtimes")
    if memory is not None:
        from mhaexport.verify.memory import parse_size

        parse_size(memory)  # a bad size is refused before any work
    loaded = None
    if model is not None or config is not None or hf is not None or checkpoint is not None:
        # an --hf folder streamed: eager over its weights mapped; a half-precision one kept so where memory is what
        # is short (--mapped, --memory, or float32 would not fit: its float32 reference computed one module at a time)
        loaded = _model(model, config, hf, checkpoint, revision, allow_download, streamed=hf is not None,
                        keep_half=_keep_half_for(hf, mapped, memory))
    from mhaexport.exporter.quantize import reproduce

    try:
        report = verify_folder(folder, loaded=loaded, sweep=sweep, seed=seed, atol=atol, rtol=rtol,
                               runtimes=tuple(runtimes) if runtimes else None, gen_tokens=gen_tokens,
                               quality=quality, reproduce=reproduce, trust_code=trust_code, progress=progress,
                               reference=reference, record=record, memory=memory, mapped=mapped)
    except MhaExportError as e:  # a refused folder: its report (verdict "refused") where asked, then the error
        if output is not None or junit is not None:
            from mhaexport.verify.report import refused_report

            refused = refused_report(folder, str(e), requested=list(runtimes) if runtimes else None, sweep=sweep,
                                     seed=seed)
            into = output if output is not None and Path(output).resolve() != Path(folder).resolve() else None
            write_reports(refused, into, junit, name="report")
        raise
    write_reports(report, output, junit, name="report")
    return report


class VerifyRun:
    """What ``mhaexport verify [PATH]`` did (:func:`verify_run`): ``report`` (verify's
    :class:`~mhaexport.verify.report.VerifyReport`, a refused folder's with verdict "refused"; None with ``bisect``),
    ``bisect`` (the :class:`~mhaexport.diagnose.follow.BisectRun` of ``bisect=True``), ``written`` (the report files,
    the JUnit file, bisect's node data), ``adopted`` (FILE.onnx's ExportRecord), ``exported`` (the records of a
    temporary export), ``folder`` (the folder verified; None for a temporary one). ``exit``: (code, message) — the
    verdict (:func:`mhaexport.core.errors.raise_for_verdict` makes it the exit: 1 failed, 2 refused, 4 not verified);
    truthy only when it passed."""

    def __init__(self, *, report: VerifyReport | None = None, bisect: BisectRun | None = None,
                 written: list[Path] | None = None, adopted: Any = None, exported: list | None = None,
                 folder: Path | None = None) -> None:
        self.report, self.bisect, self.written = report, bisect, list(written or [])
        self.adopted, self.exported, self.folder = adopted, list(exported or []), folder

    @property
    def exit(self) -> tuple[int, str]:
        if self.bisect is not None:
            return self.bisect.exit
        v = self.report.verdict
        return v.code, v.message

    def __bool__(self) -> bool:
        return self.exit[0] == 0

    def __repr__(self) -> str:
        return f"VerifyRun({self.exit!r})"
