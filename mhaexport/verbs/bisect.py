"""``mhaexport verify --bisect``: verify's verdict, the failed check followed in its protocol, then the first module
that departs from eager."""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mhaexport.core.errors import ConfigError
from mhaexport.verbs.common import Progress, _count, _model, _names, _say
from mhaexport.verbs.export import export_onnx
from mhaexport.verbs.verify import VerifyRun

if TYPE_CHECKING:  # pragma: no cover
    from mhaexport.diagnose.follow import BisectRun
    from mhaexport.models.loading import LoadedModel


def bisect_folder(folder: str | Path, *, model: str | LoadedModel | None = None, config: str | None = None,
                  hf: str | Path | None = None, checkpoint: str | Path | None = None, revision: str | None = None,
                  allow_download: bool = False, case: Sequence[int] | None = None, seed: int = 0,
                  trust_code: bool = False, runtimes: Sequence[str] | str = (),
                  progress: Progress | None = None) -> BisectRun:
    """``mhaexport verify FOLDER --bisect``: where the folder's ONNX graph (or its torch.export program: ``runtimes``
    naming ``pt2``, a folder with a program and no ONNX file, or a report with only the program's parity failing;
    :func:`mhaexport.diagnose.bisect_pt2.bisect_target`) first departs from eager PyTorch.

    ``verify --bisect`` is verify plus a diagnosis: its verdict is verify's — the folder's newest verify report
    written since its last export, else a verify run now (every check, ``runtimes`` or the defaults) — and it
    follows the check that failed, in that check's protocol: a weights check (the tensor and its module), a check run
    in a deploy protocol (a ragged batch over a shared buffer; onnxruntime-genai's: the first step, row and tensor
    that differ in that loop) — a difference found there ends the run. Then bisect's module-by-module comparison, at
    ``case`` (batch, seq, past: the CLI's ``--case B,S,P``) when given, else at the case parity failed at worst in
    that report, else at bisect's default shapes. The eager model is rebuilt from the manifest (``trust_code``:
    also from a source that is code) or given (``model``/``config``/``hf``/``checkpoint``: the exported model).

    The folder is opened (hash-checked) once for all of it; its snapshot goes when done. Returns the
    :class:`~mhaexport.diagnose.follow.BisectRun`: ``bool(run)`` is True only when verify's verdict passed and no
    difference was found (a verify that failed is never turned green by a bisect that found nothing);
    ``run.verdict``: verify's; ``run.followed`` / ``run.report``: the two steps' reports (``.summary()``: their
    text)."""
    from mhaexport.artifact import ExportFolder
    from mhaexport.models.loading import load_recorded
    from mhaexport.diagnose.bisect import bisect as _bisect, failing_case
    from mhaexport.diagnose.bisect_pt2 import bisect_pt2, bisect_target, refuse_untrusted_program
    from mhaexport.diagnose.follow import BisectRun, failure_to_follow, follow, newest_report

    say = _say(progress)
    target = bisect_target(folder, _names(runtimes, "runtimes"))
    if target == "pt2":
        refuse_untrusted_program(folder, trust_code)  # before any work: the program is code
    _count(seed, "seed", 0, optional=False)
    if case is not None:
        case = tuple(case)
        if len(case) != 3 or any(isinstance(v, bool) or not isinstance(v, numbers.Integral) for v in case):
            raise ConfigError(f"case={case!r}: expected (batch, seq, past), e.g. (1, 121, 7)")
        if case[0] < 1 or case[1] < 1 or case[2] < 0:
            raise ConfigError(f"case={case!r}: batch and sequence must be >= 1, past >= 0",
                              cli=f"--case {','.join(map(str, case))}: batch and sequence must be >= 1, past >= 0")
    loaded = None
    if model is not None or config is not None or hf is not None or checkpoint is not None:
        loaded = _model(model, config, hf, checkpoint, revision, allow_download, progress)
    with ExportFolder.open(folder) as ef:  # every artifact: verify's verdict is the folder's
        if loaded is None:
            loaded = load_recorded(ef, trust_code=trust_code)
        verified = newest_report(ef)
        if verified is None:  # no verdict since the last export: verify runs now (not a quick parity sweep)
            from mhaexport.exporter.quantize import reproduce
            from mhaexport.verify import verify_folder

            say(f"Verifying {ef.path} (bisect follows its failed check and exits with its verdict) ...")
            verified = "run now", verify_folder(ef, loaded=loaded, runtimes=_names(runtimes, "runtimes") or None,
                                                seed=seed, reproduce=reproduce, trust_code=trust_code)
        shapes: dict = {"seed": seed}
        followed = None
        run = partial(BisectRun, verdict=verified[1].verdict, verified=verified[0])
        if case is not None:
            shapes.update(batch=case[0], seq=case[1], past=case[2], case_from="--case")
        else:
            failure = failure_to_follow(verified[1]) if target == "onnx" else None
            followed = follow(ef, loaded, seed=seed, failure=failure)  # a weights or deploy failure: in its terms
            if followed is not None and not followed.ok:
                return run(followed, None)
            found, why = failing_case(ef, loaded, verified, runtime="pt2" if target == "pt2" else "ort-cpu")
            if found is not None:
                shapes.update(batch=found.batch, seq=found.seq, past=found.past, pad=list(found.pad),
                              seed=found.seed, case_from=f"{found.name}: {why}")
            else:
                shapes["case_from"] = f"default case: {why}"
        say(f"Bisecting {ef.path} against eager PyTorch ...")
        if target == "pt2":
            return run(followed, bisect_pt2(ef, loaded, trust_code=trust_code, **shapes))
        return run(followed, _bisect(ef, loaded, trust_code=trust_code, **shapes))


def _bisect_run(folder: Path | None, loaded: Any, output: str | Path | None, seed: int, case: Any, trust_code: bool,
                runtimes: Sequence[str], progress: Progress | None, adopted: Any = None) -> VerifyRun:
    """``verify --bisect``: :func:`bisect_folder` of ``folder`` (None: ``loaded`` exported to a temporary folder
    first), its Model Explorer node data written into ``output`` (a FOLDER's run only)."""
    import tempfile
    import time

    from mhaexport.diagnose.model_explorer import NODE_DATA, write_node_data

    say = _say(progress)
    node_data = Path(output) / NODE_DATA if output is not None and folder is not None else None
    if node_data is not None:
        from mhaexport.outputs import check_outputs

        check_outputs({"-o (its node data)": node_data}, reading=[folder])
    exported: list = []
    with tempfile.TemporaryDirectory(prefix="mhaexport-bisect-") as tmp:
        if folder is None:
            say(f"Exporting {loaded.spec} to ONNX in a temporary folder ...")
            started = time.perf_counter()
            exported.append(export_onnx(tmp, model=loaded))
            say(f"exported in {time.perf_counter() - started:.0f} s")
        run = bisect_folder(folder or tmp, model=loaded, case=case, seed=seed, trust_code=trust_code,
                            runtimes=runtimes, progress=progress)
    written = []
    if node_data is not None and run.report is not None and run.report.kind == "onnx":
        from mhaexport.artifact import ensure_writable_dir

        ensure_writable_dir(node_data.parent)
        written.append(write_node_data(run.report, node_data))
    return VerifyRun(bisect=run, written=written, adopted=adopted, exported=exported, folder=folder)
