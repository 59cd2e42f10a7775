"""Verify an export folder: every artifact in it against eager PyTorch, every check on every runtime.

``verify_folder`` reads the folder (hashes checked), rebuilds the eager reference from the manifest's model
record (or takes the one given, which must be the same model), builds the runners, runs the checks and returns
a :class:`VerifyReport` whose :attr:`~VerifyReport.verdict` follows docs/DESIGN.md's verdict rules.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from mhaexport.core import iospec
from mhaexport.artifact import ExportFolder
from mhaexport.artifact.details import OnnxDetails, Quantization, onnx_weights
from mhaexport.core.errors import ArtifactError, ConfigError
from mhaexport.runners.genai import genai_unavailable
from mhaexport.runners.names import (ALL_RUNTIMES, DEFAULT_RUNTIMES, EAGER, MODULE, ONNX_REFERENCE,
                                     ORT_CPU, ORT_CUDA, ORT_GENAI, VERIFY, refuse_unknown, session_config)
from mhaexport.runners.pt2 import present_code_runtimes, refuse_untrusted
from mhaexport.runners.registry import ARTIFACT, PLAIN, deploy_of, runner_for, without_cache
from mhaexport.runners.threads import ONE_THREAD_MAX_PARAMS, torch_threads
from mhaexport.runtime.choose import feed_of
from mhaexport.runtime.feed import Feed
from mhaexport.runtime.runner import Runner
from mhaexport.verify.external_data import check_external_data
from mhaexport.verify.checks import cross_provider
from mhaexport.verify.compare import Tolerance
from mhaexport.verify.genai_check import genai_result, ships_genai
from mhaexport.verify.module import verify_module
from mhaexport.verify.memory import (MAPPED, MemoryInfo, activation_bytes, cap_from, folder_weights, peak_rss,
                                     plan_memory)
from mhaexport.verify.headroom import HALF, headroom_result
from mhaexport.verify.results import ALL_CHECKS, CHECKS, GENAI_CONFIG_CHECK, HEADROOM, MODULE_CHECKS, Context
from mhaexport.verify.report import OtherProtocol, VerifyReport, build_report
from mhaexport.verify.run import Tally, run_all
from mhaexport.verify.sweep import build_sweep
from mhaexport.verify.weights import check_weights

Progress = Callable[[str], None]
# where eager's outputs come from (verify_folder's ``reference``): the record when torch is missing, eager, the record
AUTO, EAGER_REFERENCE, RECORDED = "auto", "eager", "recorded"
REFERENCES = (AUTO, EAGER_REFERENCE, RECORDED)
# Models up to this max_positions (and ONE_THREAD_MAX_PARAMS) decode their whole context token by token in the
# long-context kv-consistency check; larger ones decode after prefills spread out to max_positions - 2.
LONG_FULL_MAX_POSITIONS = 512


def _export_sizes(ef: ExportFolder) -> tuple[int, int]:
    """The (seq, past) the artifacts were traced at (dynamic-shapes runs at others)."""
    for entry in ef.artifacts.values():
        sizes = entry.details.traced_sizes
        if sizes:
            return sizes.seq, sizes.past
    return iospec.EXAMPLE_SEQ, iospec.EXAMPLE_PAST


def build_runners(ef: ExportFolder, loaded, runtimes: tuple[str, ...], trust_code: bool = False,
                  plan: MemoryInfo | None = None) -> list[Runner]:
    """Eager first, then one runner per requested runtime (the registry's, runners/registry.py); a runtime whose
    artifact is absent is skipped with why. onnxruntime-genai's loop is built after the others (runners/genai.py).
    ``plan``: the memory plan — mapped: ONNX Runtime's sessions map their external data; a runtime it left out to
    fit is skipped with its reason."""
    c = loaded.contract
    eager = loaded.eager  # float32 (a bf16 folder kept bf16: computed in float32 one module at a time)
    runners: list[Runner] = [runner_for(ef, EAGER, c, eager=eager)]
    for rt in runtimes:
        if rt not in (EAGER, ORT_GENAI):
            runners.append(runner_for(ef, rt, c, eager=eager, n_params=loaded.n_params,
                                      trust_code=trust_code, config=_ort_config(rt, plan)))
            if plan is not None and rt in plan.skipped and runners[-1].available:
                runners[-1].skip_reason = plan.skipped[rt]
    return runners


def _ort_config(runtime: str, plan: MemoryInfo | None):
    """verify's ONNX Runtime session of ``runtime`` under the memory plan (None: the registry's default)."""
    if runtime not in (ORT_CPU, ORT_CUDA) or plan is None or plan.mode != MAPPED:
        return None
    return session_config(runtime, mmap_weights=True, packed_weights=plan.ort_packed)


def _spill_for(runners: list[Runner], plan: MemoryInfo):
    """The mapped mode's spill (runtime/spill.py), set on every runner that takes one (eager's, ONNX Runtime's);
    None in the whole mode."""
    if plan.mode != MAPPED:
        return None
    from mhaexport.runtime import spill as sp

    spill = sp.Spill(sp.spill_dir(), min_bytes=sp.SPILL_MIN_BYTES)
    sp.return_freed_memory()  # what a long call took goes back to the system, not to a fragmenting heap
    for r in runners:
        if hasattr(r, "spill"):
            r.spill = spill
    return spill


def memory_plan(ef: ExportFolder, runtimes: tuple[str, ...], cases: list, *, memory: str | int | None = None,
                mapped: bool = False, loaded_given: bool = False, sweep: str = "quick") -> MemoryInfo:
    """The run's memory plan (verify/memory.py), from the manifest and the sweep only — before any weight is read:
    ``memory`` the cap (None: the machine's), ``mapped`` forces the mapped mode; ConfigError (exit 2) when even the
    mapped run cannot fit. The activations are a simple bound over the sweep's ``cases``."""
    cap, source = cap_from(memory)
    acts, spilled, largest = activation_bytes(ef.contract, cases)
    return plan_memory(folder_weights(ef, runtimes, loaded_given), acts, cap, source, forced=mapped,
                       largest_case=largest, sweep=sweep, spilled=spilled)


# The protocol every file is also driven in when its producer's differs: the contract's own (verify's findings)
PLAIN_PROTOCOL = Feed.contract(0).protocol  # "concat cache, left padding"


def other_protocol_runners(ef: ExportFolder, contract, runtimes: tuple[str, ...]) -> list[Runner]:
    """For an adopted file whose producer drives it in another protocol than the plain one (a shared buffer, right
    padding: onnxruntime-genai's builder), one runner per ONNX Runtime provider asked for that drives it in the
    plain protocol, named ``ort-cpu:plain``: its results are findings, reported apart and not in the verdict."""
    feed = feed_of(ef, contract) if ef.has("onnx") else None
    if feed is None or not feed.adopted or feed.protocol == PLAIN_PROTOCOL:
        return []
    return [runner_for(ef, rt, contract, protocol=PLAIN) for rt in (ORT_CPU, ORT_CUDA) if rt in runtimes]


def lossy_artifacts(ef: ExportFolder) -> dict[str, Quantization]:
    """{artifact: its manifest's quantization record} for each lossy (quantized) artifact of the folder."""
    return {name: entry.details.quantization for name, entry in ef.artifacts.items()
            if isinstance(entry.details, OnnxDetails) and entry.details.quantization}


def verify_folder(folder: str | Path | ExportFolder, *, loaded=None, sweep: str = "quick", seed: int = 0,
                  atol: float | dict | None = None, rtol: float | dict | None = None,
                  runtimes: tuple[str, ...] | None = None, checks: tuple[str, ...] | None = None,
                  gen_tokens: int | None = None, threads: int | None = None, quality=None, reproduce=None,
                  trust_code: bool = False, progress: Progress | None = None, reference: str = AUTO,
                  record: bool = False, memory: str | int | None = None, mapped: bool = False) -> VerifyReport:
    """Verify every artifact in ``folder`` against eager (a path: opened here, its snapshot removed when done; an
    opened :class:`ExportFolder`: used as it is, its opener closes it). A folder of the attention block on its own
    (``--module attention``) gets the module's runtimes and checks (:func:`verify_module`).

    ``loaded``: the eager model (rebuilt from the manifest when None); it must be the exported model (fingerprint),
    which is how a folder whose factory moved is re-pointed. ``runtimes``: None = the defaults (a default runtime
    that cannot run here is skipped without failing the verdict); given = requested, and one skipped entirely makes
    the verdict "not verified". ``checks``: None = every check, plus ``quality`` when an artifact is lossy (its
    manifest records a quantization: exact parity does not apply, the quality check judges it against eager fp32,
    the invariants hold it to itself). ``quality``: a :class:`~mhaexport.verify.quality.QualitySettings` (threshold
    overrides, the text). ``threads``: torch intra-op threads for eager/TorchScript (default: 1 for models up to
    ONE_THREAD_MAX_PARAMS). ``reproduce``: re-runs a quantized folder's recorded recipe
    (``mhaexport.exporter.quantize.reproduce``; the CLI and the Python API pass it) for the ``weights`` check; without
    it that check is not run. ``trust_code``: the user's ``--trust-code`` — rebuild the eager model from a manifest
    source that is code (a factory file or module; without it such a folder is refused with UntrustedCode unless
    ``loaded`` names the model), and load the folder's torch.export program and AOTInductor package (code:
    :mod:`mhaexport.artifact.trust`) even though this process did not export them (without it they are skipped with
    the reason when in the default list, and refused when named in ``runtimes``). ``reference``: where eager's
    outputs come from — ``"eager"`` (the model rebuilt and run), ``"recorded"`` (the folder's record,
    verify/reference.py: the ONNX file judged without torch; ReferenceMismatch for a record of other weights, sweep
    or file), ``"auto"`` (the record when the folder holds one and torch cannot be imported here, else eager).
    ``record``: also write eager's outputs into the folder as its record (the ONNX file's entry in the manifest).
    ``memory``: the memory cap
    (``"1.5G"`` or bytes; None: the machine's, :func:`mhaexport.verify.memory.machine_memory`); ``mapped``: hold
    the weights memory-mapped whatever fits (``--mapped``). A decoder's run is planned first (:func:`memory_plan`):
    weights whole when they fit, memory-mapped when only that fits, ConfigError before any work when even that does
    not; the report's ``memory`` says the plan and the peak RSS measured. Raises ArtifactError for a bad
    folder; check failures are in the report."""
    started = time.perf_counter()
    say = progress or (lambda _m: None)
    wanted = _requested(runtimes, checks)
    if not isinstance(folder, ExportFolder):  # opened here once, its snapshot removed when done (on errors too)
        with ExportFolder.open(folder) as ef:
            return verify_folder(ef, loaded=loaded, sweep=sweep, seed=seed, atol=atol, rtol=rtol, runtimes=runtimes,
                                 checks=checks, gen_tokens=gen_tokens, threads=threads, quality=quality,
                                 reproduce=reproduce, trust_code=trust_code, progress=progress,
                                 reference=reference, record=record, memory=memory, mapped=mapped)
    ef = folder
    wanted = _checked_folder(ef, wanted, runtimes, trust_code, reference, record)
    if ef.module is not None:
        if reference == RECORDED:
            raise ConfigError("--reference recorded: an attention block on its own has no recorded reference")
        return verify_module(ef, loaded=loaded, sweep=sweep, seed=seed, atol=atol, rtol=rtol, runtimes=runtimes,
                             checks=checks, threads=threads, progress=progress, trust_code=trust_code)
    wanted, checks, lossy = _plan(ef, wanted, runtimes, checks, trust_code)
    if _use_record(ef, reference, record, loaded):
        return _verify_recorded(ef, sweep=sweep, seed=seed, atol=atol, rtol=rtol, runtimes=runtimes, wanted=wanted,
                                checks=checks, gen_tokens=gen_tokens, say=say, started=started)
    run = _load(ef, loaded, wanted, checks, lossy, sweep=sweep, seed=seed, atol=atol, rtol=rtol,
                gen_tokens=gen_tokens, threads=threads, quality=quality, reproduce=reproduce, trust_code=trust_code,
                memory=memory, mapped=mapped, say=say)
    with torch_threads(run.threads):
        infos, results, other = _run(ef, run, wanted, checks, lossy, trust_code, say)
        made = _recording(ef, run, sweep, seed, say) if record else None
    return _report(ef, run, infos, results, other, made, checks, lossy, sweep=sweep, seed=seed, atol=atol, rtol=rtol,
                   runtimes=runtimes, started=started)


def _requested(runtimes: tuple[str, ...] | None, checks: tuple[str, ...] | None) -> tuple[str, ...]:
    """verify's first phase, before the folder opens: the runtimes asked for (the defaults when None) and the checks
    known to a decoder's or an attention block's suite (which, once the folder is open). ConfigError otherwise."""
    wanted = tuple(runtimes) if runtimes else DEFAULT_RUNTIMES
    refuse_unknown(wanted, VERIFY, MODULE)  # a decoder's or an attention block's: which, once the folder is open
    unknown = [c for c in checks or () if c not in ALL_CHECKS + MODULE_CHECKS]
    if unknown:
        raise ConfigError(f"unknown check(s) {', '.join(unknown)}; known: {', '.join(ALL_CHECKS)} (an attention "
                          f"block: {', '.join(MODULE_CHECKS)})")
    return wanted


def _checked_folder(ef: ExportFolder, wanted: tuple[str, ...], runtimes, trust_code: bool, reference: str,
                    record: bool) -> tuple[str, ...]:
    """The folder's own checks (its external data, an artifact, code only on trust, ``reference`` / ``record``
    against what it holds): the runtimes it runs (the defaults: those of its artifacts and its code)."""
    check_external_data(ef)
    if not ef.artifacts:
        raise ArtifactError(f"{ef.path} holds no export (its manifest lists no artifact)")
    refuse_untrusted(ef, runtimes, trust_code)
    if not runtimes:  # the defaults: those of an artifact the folder lacks were not asked for (left out, not skipped)
        wanted = tuple(rt for rt in wanted if ARTIFACT.get(rt) is None or ef.has(ARTIFACT[rt]))
        wanted += present_code_runtimes(ef)
    if reference not in REFERENCES:
        raise ConfigError(f"reference {reference!r}: expected one of {', '.join(REFERENCES)}")
    if record and (reference == RECORDED or ef.module is not None or not ef.has("onnx") or lossy_artifacts(ef)):
        why = ("records eager's outputs: it runs eager (not --reference recorded)" if reference == RECORDED else
               "records a decoder's references for its ONNX file" + (": this folder holds the attention block on its "
                                                                      "own" if ef.module is not None else
                                                                      ": this folder holds none" if not ef.has("onnx")
                                                                      else ", not a lossy one (judged by quality)"))
        raise ConfigError(f"--record {why}")
    if record:  # the record is written into the folder after the run: a folder it cannot be written to, refused now
        from mhaexport.artifact.files import ensure_writable_dir

        ensure_writable_dir(ef.path)
    return wanted


def _plan(ef: ExportFolder, wanted: tuple[str, ...], runtimes, checks, trust_code: bool
          ) -> tuple[tuple[str, ...], tuple[str, ...], dict[str, Quantization]]:
    """A decoder's plan: (the runtimes, onnxruntime-genai's loop where it runs; the checks, with quality, genai-config
    and headroom where they apply; the lossy artifacts). ConfigError for what only an attention block runs."""
    if not runtimes and ships_genai(ef) and genai_unavailable() is None:
        wanted += (ORT_GENAI,)  # a default where onnxruntime-genai is installed and the folder ships its config
    if ORT_GENAI in wanted and ships_genai(ef):  # its options load no code, write no file: refused before any work
        from mhaexport.runtime.genai import check_options

        check_options(ef.root, ef.path, trust_code=trust_code)
    lossy = lossy_artifacts(ef)
    checks_given = bool(checks)
    checks = tuple(checks) if checks else (ALL_CHECKS if lossy else CHECKS)
    if not checks_given:  # genai-config: when the folder ships a genai_config.json (verify/genai_check.py)
        checks = tuple(ch for ch in checks if ch != GENAI_CONFIG_CHECK) + ((GENAI_CONFIG_CHECK,) if ships_genai(ef)
                                                                            else ())
        if _tolerance(ef, None, None)[0] in HALF and ef.has("onnx"):  # a half-precision file: its headroom
            checks += (HEADROOM,)
    if off := [r for r in wanted if r not in ALL_RUNTIMES] + [c for c in checks if c not in ALL_CHECKS]:
        raise ConfigError(f"{', '.join(off)}: only for an attention-block export (--module attention); "
                          f"{ef.path} holds a decoder")
    return wanted, checks, lossy


@dataclass
class _Loaded:
    """What verify's load phase made for its run: the memory plan, the eager model, the checks' context, the runners
    (eager first; the plain protocol's apart), the spill of the mapped mode, lint's findings, torch's threads."""

    plan: MemoryInfo
    loaded: Any
    ctx: Context
    cases: list
    tol: Tolerance
    dtype: str
    runners: list[Runner]
    plain: list[Runner]
    spill: Any
    lint: Any
    threads: int | None


def _load(ef: ExportFolder, loaded, wanted: tuple[str, ...], checks: tuple[str, ...], lossy, *, sweep, seed, atol,
          rtol, gen_tokens, threads, quality, reproduce, trust_code, memory, mapped, say) -> _Loaded:
    """verify's load phase: what quality reads refused before any work, the memory plan (before any weight is read;
    a run that cannot fit is refused here, exit 2), the eager model (rebuilt, or the one given checked), the
    runners and the checks' context, lint."""
    tokenizer = None
    if lossy and ef.has("onnx"):  # quality reads text with the folder's tokenizer.json, when it carries one
        from mhaexport.runtime.tokenizer import for_folder

        tokenizer = for_folder(ef)
    if lossy and quality is not None:  # refused before any work: an unknown figure, text the model cannot read
        from mhaexport.evaluate.scoring import text_tokens
        from mhaexport.verify.quality import thresholds_for

        thresholds_for(None, quality.overrides)
        if quality.text is not None:
            text_tokens(quality.text, ef.contract, tokenizer)
    # the memory plan, before any weight is read (a run that cannot fit is refused here, exit 2)
    plan = memory_plan(ef, wanted, build_sweep(ef.contract, sweep, seed), memory=memory, mapped=mapped,
                       loaded_given=loaded is not None and getattr(loaded, "weights", None) is None,
                       sweep=sweep)
    say(plan.summary())
    from mhaexport.runtime import budget

    budget.plan(sum(int(f.get("bytes") or 0) for a in ef.artifacts.values() for f in a.files.values()))
    from mhaexport.models.loading import check_same_model, load_recorded

    if loaded is None:
        say(f"rebuilding the eager reference from {ef.model.spec}"
            + (" (weights memory-mapped)" if plan.mode == MAPPED else ""))
        loaded = load_recorded(ef, trust_code=trust_code, mapped=plan.mode == MAPPED)
    else:
        check_same_model(loaded, ef.model)
    c = loaded.contract
    dtype, tol = _tolerance(ef, atol, rtol)
    cases = build_sweep(c, sweep, seed)
    runners = build_runners(ef, loaded, wanted, trust_code, plan)
    if plan.mode == MAPPED:  # weights mapped, not resident: a check's planned calls run block by block
        mapped_file = onnx_weights(ef)[1]  # (runners/plan.py), each layer's weights read once per check: eager's,
        for r in runners:  # and a file's whose weights stay mapped (external data, not a quantized file's: packed)
            cfg = getattr(r, "config", None)
            if r is runners[0] or (mapped_file and cfg is not None and cfg.mmap_weights and not cfg.packed_weights):
                r.block_order = True
        # eager's serving runs kept as the guesses of a file's taped serving checks (verify/serving.py): only where
        # a file runs block by block
        runners[0].keep_guesses = any(getattr(r, "block_order", False) for r in runners[1:])
    plain = other_protocol_runners(ef, c, wanted)
    spill = _spill_for(runners + plain, plan)
    small = loaded.n_params <= ONE_THREAD_MAX_PARAMS  # one torch thread (and the long run token by token)
    ctx = Context(contract=c, cases=cases, tol=tol, tol_override=(atol, rtol), eager=runners[0],
                  without_cache=without_cache, deploy=deploy_of, export_sizes=_export_sizes(ef),
                  gen_tokens=gen_tokens or (8 if sweep == "quick" else 32), seed=seed, quality=quality,
                  tokenizer=tokenizer, spill=spill,
                  weights=(lambda: check_weights(ef, reproduce, lambda: _linear_weights(loaded.module)))
                  if "onnx" in lossy else None,
                  long_full=c.max_positions <= LONG_FULL_MAX_POSITIONS and small,
                  genai_config=genai_result(ef, loaded) if GENAI_CONFIG_CHECK in checks and ships_genai(ef) else None,
                  headroom=headroom_result(loaded, dtype) if HEADROOM in checks and dtype in HALF else None)
    lint = _lint(ef, say)
    if threads is None and small:
        threads = 1
    return _Loaded(plan, loaded, ctx, cases, tol, dtype, runners, plain, spill, lint, threads)


def _run(ef: ExportFolder, run: _Loaded, wanted: tuple[str, ...], checks: tuple[str, ...], lossy, trust_code: bool,
         say) -> tuple[dict, dict, OtherProtocol | None]:
    """verify's run phase: every check on every runner, then the plain protocol's runners (findings) and
    onnxruntime-genai's loop, one tally counting every pass from the first step. (infos, results, other)."""
    runners, plain, ctx, c = run.runners, run.plain, run.ctx, run.ctx.contract
    # the passes to come counted from the first step: the plain protocol's runners, onnxruntime-genai's loop
    tally = Tally(later=(len(plain) + (ORT_GENAI in wanted)) * len(checks))
    infos, results = run_all(runners, ctx, checks, say, lossy=lossy, tally=tally)
    other = None
    if plain:
        say(f"the file's producer drives it as {feed_of(ef, c).protocol}; now also as "
            f"{PLAIN_PROTOCOL} (findings, not in the verdict)")
        p_infos, p_results = run_all([runners[0]] + plain, ctx, checks, say, skip_first=True, lossy=lossy,
                                     tally=tally)
        other = OtherProtocol(PLAIN_PROTOCOL, feed_of(ef, c).protocol, p_infos, p_results)
    if ORT_GENAI in wanted:  # onnxruntime-genai's own loop over the folder: the suite's loop subject
        ours = runner_for(ef, ORT_CPU, c, config=_ort_config(ORT_CPU, run.plan)) if ef.has("onnx") else None
        genai = runner_for(ef, ORT_GENAI, c, ours=ours, infos=infos, trust_code=trust_code)
        if ORT_GENAI in run.plan.skipped and genai.available:
            genai.skip_reason = run.plan.skipped[ORT_GENAI]
        g_infos, g_results = run_all([runners[0], genai], ctx, checks, say, skip_first=True, lossy=lossy,
                                     tally=tally)
        infos.update(g_infos)
        results.update(g_results)
    return infos, results, other


def _recording(ef: ExportFolder, run: _Loaded, sweep: str, seed: int, say) -> Any:
    """``--record``: eager's outputs over this sweep, made for the folder's record (written with the report)."""
    from mhaexport.verify import reference as rec
    from mhaexport.verify.checks import generation_prompts

    say("recording eager's outputs into the folder ...")
    return rec.recording(ef, run.ctx, rec.cases_of(run.ctx, run.runners), generation_prompts(run.ctx), sweep=sweep,
                         seed=seed)


def _report(ef: ExportFolder, run: _Loaded, infos, results, other, made, checks, lossy, *, sweep, seed, atol, rtol,
            runtimes, started) -> VerifyReport:
    """verify's record phase: the providers compared, the memory measured, the spill closed, the report built (and
    the folder's record written, with ``--record``)."""
    runners, plan, spill = run.runners, run.plan, run.spill
    # providers of a lossy graph legitimately differ (ORT CPU's int8 activations at accuracy level 4): each is
    # judged by quality against eager instead
    cross = cross_provider(runners, infos, run.ctx) if "parity" in checks and "onnx" not in lossy else []
    plan.peak_rss = peak_rss()
    if spill is not None:
        plan.spilled = spill.spilled_bytes
        spill.close()
    report = build_report(ef, sweep=sweep, seed=seed, cases=run.cases, tol=run.tol, atol=atol, rtol=rtol,
                          runners=runners, infos=infos, results=results, checks=checks, requested=runtimes,
                          threads=run.threads, started=started, export_sizes=run.ctx.export_sizes, dtype=run.dtype,
                          generation_tokens=run.ctx.gen_tokens, lint=run.lint, cross=cross, other=other, memory=plan)
    if made is not None:
        from mhaexport.verify import reference as rec

        report.reference = {"kind": "eager", "recorded": rec.write(ef, made)}
    return report


def _tolerance(ef: ExportFolder, atol, rtol) -> tuple[str, Tolerance]:
    """The folder's compute dtype (float16/bfloat16 when an artifact holds it, else float32) and its tolerance, with
    --atol/--rtol applied."""
    dtype = next((d for d in ("float16", "bfloat16") if any(a.dtype == d for a in ef.artifacts.values())), "float32")
    return dtype, Tolerance.for_dtype(dtype, atol, rtol)


def _lint(ef: ExportFolder, say) -> Any:
    """lint's static findings on the snapshot verify checked (not the folder opened again), said in one line; None
    without an ONNX file or where it cannot be read (the ONNX runtimes report that, once, as a load failure)."""
    if not ef.has("onnx"):
        return None
    from mhaexport.verify.lint import lint_path

    try:
        lint = lint_path(ef, genai=False)
    except ArtifactError as e:
        say(f"lint: not run ({e})")
        return None
    say(f"lint: {lint.counts()['error']} error(s), {lint.counts()['warning']} warning(s)")
    return lint


def _use_record(ef: ExportFolder, reference: str, record: bool, loaded) -> bool:
    """Whether eager's references come from the folder's record (``reference``: auto, eager, recorded); one line
    (ConfigError) where neither can be had: no record asked for, no torch for eager."""
    from mhaexport.verify.reference import has_record, torch_missing

    held = has_record(ef)
    if reference == RECORDED:
        if not held:
            raise ConfigError(f"--reference recorded: {ef.path} holds no recorded reference (reference.json; record "
                              "one with `mhaexport verify FOLDER --record` where torch and the model are)")
        return True
    if loaded is not None:  # a model given: eager it is
        return False
    missing = torch_missing()
    if missing is None:
        return False
    if held and reference == AUTO and not record:
        return True
    raise ConfigError(f"torch cannot be imported here ({missing}): verify runs the eager model in PyTorch"
                      + ("; this folder holds a recorded reference: --reference recorded judges the file from it"
                         if held else "; a folder with a recorded reference (`verify --record` where torch is) "
                                      "verifies without it"))


def _verify_recorded(ef: ExportFolder, *, sweep, seed, atol, rtol, runtimes, wanted, checks, gen_tokens, say,
                     started) -> VerifyReport:
    """verify with eager's references from the folder's record (verify/reference.py): no torch, no weights. The
    ONNX runtimes run every check the suite's ``recorded`` column judges from a record; the others are n/a with why;
    eager and the torch runtimes are not run (skipped, saying so)."""
    from mhaexport.runtime.runner import skipped
    from mhaexport.verify import reference as rec
    from mhaexport.verify.checks import generation_prompts

    c = ef.contract
    dtype, tol = _tolerance(ef, atol, rtol)
    cases = build_sweep(c, sweep, seed)
    tokens = gen_tokens or (8 if sweep == "quick" else 32)
    runners: list[Runner] = [skipped(EAGER, c, "not run: the reference is the folder's record")]
    for rt in wanted:
        if rt == EAGER:
            continue
        if rt in (ORT_CPU, ORT_CUDA, ONNX_REFERENCE):
            runners.append(runner_for(ef, rt, c))
        else:
            runners.append(skipped(rt, c, "not run: verify from a recorded reference judges the ONNX file on ONNX "
                                          "Runtime (no torch, no onnxruntime-genai loop)"))
    ctx = rec.RecordedContext(contract=c, cases=cases, tol=tol, tol_override=(atol, rtol), eager=runners[0],
                              without_cache=without_cache, deploy=deploy_of, export_sizes=_export_sizes(ef),
                              gen_tokens=tokens, seed=seed, long_full=c.max_positions <= LONG_FULL_MAX_POSITIONS)
    record = rec.load(ef, c, sweep=sweep, seed=seed, tokens=tokens, cases=rec.cases_of(ctx, runners),
                      greedies=generation_prompts(ctx))
    ctx.record = record
    if GENAI_CONFIG_CHECK in checks and ships_genai(ef):
        from types import SimpleNamespace

        ctx.genai_config = genai_result(ef, SimpleNamespace(contract=c, module=None))
    say(f"reference: {record.describe()}")
    lint = _lint(ef, say)
    infos, results = run_all(runners, ctx, checks, say, lossy=lossy_artifacts(ef))
    cross = cross_provider(runners, infos, ctx) if "parity" in checks else []
    report = build_report(ef, sweep=sweep, seed=seed, cases=cases, tol=tol, atol=atol, rtol=rtol, runners=runners,
                          infos=infos, results=results, checks=checks, requested=runtimes, threads=None,
                          started=started, export_sizes=ctx.export_sizes, dtype=dtype, generation_tokens=tokens,
                          lint=lint, cross=cross)
    report.reference = {"kind": "recorded", "describe": record.describe(), "date": record.date,
                        "fingerprint": record.index["model"]["fingerprint"], "made_with": record.index.get("made_with"),
                        "keeps": "; ".join(f"{k}: {v}" for k, v in record.keeps().items()),
                        "checks": {ch: record.how(ch) for ch in checks}}
    return report


def _linear_weights(module) -> dict[str, object]:
    """The eager model's 2-D weights (N, K), as they are (a mapped model's stay in their file: rows are read when
    compared): what a quantized MatMul's weight is checked against when its recipe cannot be re-run (embeddings
    included: a tied head quantizes the embedding table)."""
    return {name: p for name, p in module.named_parameters() if p.dim() == 2}

