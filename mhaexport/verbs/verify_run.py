"""``mhaexport verify [PATH]``, the whole verb: an export folder, FILE.onnx adopted first, or a model exported to a
temporary folder; its reports written (a refused folder's too) before anything is printed."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mhaexport.core.errors import ConfigError, MhaExportError
from mhaexport.verbs.adopt import _adoption_folder, adopt
from mhaexport.verbs.bisect import _bisect_run
from mhaexport.verbs.common import Progress, _model, _say, _keep_half_for, writable_output
from mhaexport.verbs.export import export_onnx, export_torchscript
from mhaexport.verbs.inputs import check_junit
from mhaexport.verbs.reports import write_reports
from mhaexport.verbs.verify import VerifyRun, verify

if TYPE_CHECKING:  # pragma: no cover
    from mhaexport.models.loading import LoadedModel


def verify_run(path: str | Path | None = None, output: str | Path | None = None, *,
               model: str | LoadedModel | None = None, config: str | None = None, hf: str | Path | None = None,
               checkpoint: str | Path | None = None, revision: str | None = None, allow_download: bool = False,
               runtimes: Sequence[str] | None = None, sweep: str = "quick", seed: int = 0,
               atol: float | dict | None = None, rtol: float | dict | None = None, tokens: int | None = None,
               quality: Any = None, junit: str | Path | None = None, trust_code: bool = False, bisect: bool = False,
               case: Sequence[int] | None = None, markdown: Callable[[Any], str] | None = None,
               progress: Progress | None = None, reference: str = "auto", record: bool = False,
               memory: str | int | None = None, mapped: bool = False) -> VerifyRun:
    """``mhaexport verify [PATH]``, the whole verb: ``path`` an export folder, an ONNX file another tool exported
    (adopted first, :func:`adopt`, into ``output`` or FILE's folder/mhaexport, and verified there), or None (the
    model named by ``model``/``config``/``hf``/``checkpoint`` exported to a temporary folder and verified). Every
    input is checked before any work. The report goes to ``output`` (a folder: default ``path``, where a run of
    named ``runtimes`` writes report-RUNTIMES.* beside the full report; a temporary export's nowhere unless given)
    and ``junit``, written before this returns (a closed stdout loses none; ``markdown``: the report's Markdown
    renderer for the JUnit file). A folder refused before any check is a verdict too ("refused", exit 2): its report
    goes to ``output`` and ``junit``, never into the refused folder itself.

    ``bisect``: verify plus a diagnosis (:func:`bisect_folder`: its exit is verify's verdict, 1 also when bisect
    finds a difference; ``case``: where to bisect; ``output``: where its Model Explorer node data goes).
    ``reference`` / ``record``: :func:`verify`'s (a recorded reference), for an export folder only; ``memory`` /
    ``mapped``: :func:`verify`'s memory plan, wherever a folder is verified.
    Returns a :class:`VerifyRun`; raises ConfigError for bad input, :class:`~mhaexport.core.errors.ReportNotWritten`
    (after writing what it could) when a report cannot be written where asked."""
    import tempfile
    import time

    say = _say(progress)
    named = model is not None or config is not None or hf is not None or checkpoint is not None
    if path is None and not named:
        raise ConfigError("verify needs the export FOLDER to verify (or --config/--model/--hf/--checkpoint to "
                          "export a model to a temporary folder and verify that): nothing was verified")
    if case is not None and not bisect:
        raise ConfigError("case is for bisect (verify itself runs its sweep)",
                          cli="--case is for --bisect (verify itself runs its sweep)")
    where = Path(path) if path is not None else None
    if (record or reference != "auto") and (bisect or where is None or not where.is_dir()):
        raise ConfigError("record and reference are for verifying an export folder (not bisect, a FILE.onnx or a "
                          "temporary export)", cli="--record and --reference are for verifying an export FOLDER "
                          "(not --bisect, a FILE.onnx or a temporary export)")
    if where is not None and where.exists() and not where.is_dir() and not where.is_file():
        raise ConfigError(f"{path} is neither a folder nor a regular file (a FIFO, socket or device)")
    if where is not None and not where.is_dir() and (str(path).endswith(".onnx") or where.is_file()):
        out = _adoption_folder(where, output, named, junit)  # a file: adopted, then verified where it was adopted
        # an --hf folder streamed: eager over its weights mapped (a half-precision one kept so, computed in float32)
        loaded = _model(model, config, hf, checkpoint, revision, allow_download, progress, streamed=hf is not None,
                        keep_half=not bisect and _keep_half_for(hf, mapped, memory))
        rec = adopt(where, out, model=loaded, junit=junit)
        if bisect:
            return _bisect_run(rec.folder, loaded, output, seed, case, trust_code, (), progress, adopted=rec)
        say(f"Verifying {rec.folder} ...")
        run = _verify_into(rec.folder, loaded, rec.folder, None, junit, markdown, progress, refused_into=rec.folder,
                           runtimes=runtimes, sweep=sweep, seed=seed, atol=atol, rtol=rtol, tokens=tokens,
                           quality=quality, memory=memory, mapped=mapped)
        run.adopted = rec
        return run
    if where is not None and not where.is_dir():
        raise ConfigError(f"{path}: no such folder (an export folder, or an ONNX file FILE.onnx)")
    if bisect:
        loaded = _model(model, config, hf, checkpoint, revision, allow_download, progress) if named else None
        return _bisect_run(where, loaded, output, seed, case, trust_code, runtimes or (), progress)
    if where is not None:  # a folder: its report beside it (or in -o), checked before any work
        from mhaexport.outputs import check_outputs

        out = Path(output) if output is not None else where
        if junit is not None:
            check_junit(junit)
        check_outputs({"--junit": junit}, reading=[where], reports=out)
        check_outputs({f"-o (its {n})": out / n for n in ("report.json", "report.md", "report.html")},
                      reading=[where])
        writable_output(out, "" if output is not None else " (give -o DIR to write the report elsewhere)")
        loaded = (_model(model, config, hf, checkpoint, revision, allow_download, progress, streamed=hf is not None,
                         keep_half=_keep_half_for(hf, mapped, memory)) if named else None)
        say(f"Verifying {where} ...")
        return _verify_into(where, loaded, out, "report" if output is not None else None, junit, markdown, progress,
                            runtimes=runtimes, sweep=sweep, seed=seed, atol=atol, rtol=rtol, tokens=tokens,
                            quality=quality, trust_code=trust_code, refused_into=output, reference=reference,
                            record=record, memory=memory, mapped=mapped)
    from mhaexport.outputs import check_outputs  # no folder: the model exported to a temporary one first

    if junit is not None:
        check_junit(junit)
    check_outputs({"--junit": junit}, reports=output)
    if output is not None:
        writable_output(output)
    else:  # the temporary export below is written under the lock too
        from mhaexport.artifact.lock import lock_timeout

        lock_timeout()
    loaded = _model(model, config, hf, checkpoint, revision, allow_download, progress, streamed=hf is not None)
    with tempfile.TemporaryDirectory(prefix="mhaexport-verify-") as tmp:
        say(f"Exporting {loaded.spec} to a temporary folder ...")
        started = time.perf_counter()
        exported = [export_onnx(tmp, model=loaded, progress=progress),
                    export_torchscript(tmp, model=loaded, progress=progress)]
        say(f"exported in {time.perf_counter() - started:.0f} s; verifying {loaded.spec} ...")
        run = _verify_into(Path(tmp), loaded, output, "report", junit, markdown, progress, runtimes=runtimes,
                           sweep=sweep, seed=seed, atol=atol, rtol=rtol, tokens=tokens, quality=quality,
                           memory=memory, mapped=mapped)
    run.exported, run.folder = exported, None
    return run


def _verify_into(folder: Path, loaded: Any, output: str | Path | None, name: str | None, junit: Any,
                 markdown: Callable[[Any], str] | None, progress: Progress | None, *,
                 refused_into: str | Path | None = None, runtimes: Sequence[str] | None = None, sweep: str = "quick",
                 seed: int = 0, **options: Any) -> VerifyRun:
    """:func:`verify` of ``folder`` with its report written (``name``: its file stem, None: the report's own) into
    ``output`` and ``junit``; a folder refused before any check gets a refused report, written into
    ``refused_into`` (never into the folder itself)."""
    from mhaexport.core.errors import ReportNotWritten, VerificationFailed
    from mhaexport.verify.report import refused_report

    try:
        report = verify(folder, model=loaded, progress=progress, runtimes=runtimes, sweep=sweep, seed=seed, **options)
    except VerificationFailed:
        raise
    except MhaExportError as e:  # a folder refused (a hash that does not match, a name leaving it...): a verdict
        if _interrupted(e):
            raise
        report = refused_report(folder, str(e), requested=list(runtimes) if runtimes else None,
                                sweep=sweep, seed=seed)
        output = refused_into
    try:
        written = write_reports(report, output, junit, name=name,
                                markdown=markdown(report) if markdown is not None else None)
    except ReportNotWritten as e:
        if report.refused is None:
            raise
        raise ReportNotWritten(f"{report.refused}; {e}", written=e.written) from None
    return VerifyRun(report=report, written=written, folder=folder)


def _interrupted(e: BaseException) -> bool:
    """Whether ``e`` is, or was raised while handling, a Ctrl-C (never a verdict)."""
    seen: set[int] = set()
    x: BaseException | None = e
    while x is not None and id(x) not in seen:
        if isinstance(x, KeyboardInterrupt):
            return True
        seen.add(id(x))
        x = x.__cause__ or x.__context__
    return False
