"""Run every check on every runner of a verify run: activate each, skip what cannot run, hold each runtime to its
own dtype's tolerance, collect the results. A lossy file whose activations are int8 runs its comparisons with itself
on its float-activation twin (:func:`mhaexport.runners.registry.float_activation_twin`: the same graph and weights);
a runtime that has none (onnxruntime-genai's loop) allows a requantization step instead. The decoder's verify, its
onnxruntime-genai loop and the attention block's all drive :func:`run_all`; one check is run by the one suite's
:func:`mhaexport.verify.suite.run_check`, whatever the runner's subject.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from mhaexport.core.errors import MhaExportError, ProviderUnavailable
from mhaexport.core.progress import Step
from mhaexport.runners.names import EAGER_CUDA, REFERENCE_RUNTIMES, TORCHSCRIPT
from mhaexport.runners.plan import order_of
from mhaexport.runners.subjects import CONTRACT, MODULE
from mhaexport.runtime.runner import Runner
from mhaexport.runtime.spill import trim_freed_memory
from mhaexport.verify.compare import Tolerance
from mhaexport.verify.quality import allowance, self_tolerance, twin_allowance
from mhaexport.verify.report import RuntimeInfo
from mhaexport.verify.results import CheckResult, SweepContext
from mhaexport.verify.suite import run_check, subject

if TYPE_CHECKING:
    from mhaexport.artifact.details import Quantization

Progress = Callable[[str], None]


def _artifact_of(runner: Runner) -> str | None:
    if runner.name in (EAGER_CUDA,) + REFERENCE_RUNTIMES:
        return None
    return runner.name if runner.name in (TORCHSCRIPT, "pt2", "aoti") else "onnx"


@dataclass
class Tally:
    """The counted steps of a verify run (a check on a runtime) across :func:`run_all`'s passes: ``later`` steps are
    the passes still to come (the plain protocol's runners, onnxruntime-genai's loop), counted in the total from the
    first pass on so the count never restarts; a later runner that does not run takes its steps out."""

    done: int = 0
    total: int = 0
    later: int = 0


def run_all(runners: list[Runner], ctx: SweepContext, checks: tuple[str, ...], say: Progress,
            skip_first: bool = False,
            lossy: dict[str, Quantization] | None = None, tally: Tally | None = None):
    """Activate each runner and run every check on it (the one suite: :func:`~mhaexport.verify.suite.run_check`;
    the context says the contract: the decoder's, the attention block's). A runtime that cannot run here
    is skipped (its checks not run); one that cannot load its artifact is one failure with one message (its checks
    not run). ``skip_first``: runners[0] (eager, already run) only stays active for the checks' references. A
    runner whose artifact is in ``lossy`` gets the quality check's context (``Context.lossy``). ``tally``: the
    progress count shared with the run's other passes (:class:`Tally`)."""
    infos: dict[str, RuntimeInfo] = {}
    results: dict[str, dict[str, CheckResult]] = {}
    todo = runners[1:] if skip_first else runners
    for runner in todo:  # every runner activated first, so the progress total is known once and never jumps
        info = RuntimeInfo(name=runner.name, status="ran", artifact=_artifact_of(runner))
        infos[runner.name] = info
        results[runner.name] = {}
        if runner.available:
            try:
                runner.activate()
            except ProviderUnavailable as e:
                runner.skip_reason = str(e)
            except MhaExportError as e:  # the artifact is there but this runtime cannot load it: one failure
                info.status, info.reason = "error", (str(e).strip().splitlines() or [type(e).__name__])[0]
        info.providers = list(runner.providers)
        if not runner.available:
            info.status, info.reason = "skipped", runner.skip_reason or ""
        if info.status != "ran":
            say(f"{runner.name}: {info.status} ({info.reason})")
    tally = tally if tally is not None else Tally()
    steps = sum(infos[r.name].status == "ran" for r in todo) * len(checks)  # the counted steps: a check on a runtime
    if tally.total == 0:  # the first pass: its steps and the passes to come
        tally.total = steps + tally.later
    else:  # a later pass: its planned steps were counted; those of runners that do not run come out
        tally.total -= len(todo) * len(checks) - steps
    contexts = {}
    twins: dict[str, Runner] = {}
    for runner in todo:
        info = infos[runner.name]
        if info.status != "ran":
            continue
        # each runtime is held to its own artifact's dtype: an fp16 ONNX file next to an fp32 TorchScript one
        # must not loosen TorchScript's tolerance; eager's references and the sweep's runs stay shared (shallow copy)
        quant = (lossy or {}).get(_artifact_of(runner) or "")
        tol = Tolerance.for_dtype(runner.dtype, ctx.tol_override[0], ctx.tol_override[1])
        twin = _twin(runner, say) if quant else None
        if twin is not None:  # int8 activations: its self-comparisons on the float-activation twin, at the dtype's
            twins[runner.name] = twin  # tolerance (the int8 activations' own effect: quality, on the file itself)
            info.self_tolerance, info.allowance = tol.describe(), twin_allowance(tol, twin.name)
            contexts[twin.name] = dataclasses.replace(ctx, tol=tol, lossy=quant)
        elif quant:  # int8 activations are only piecewise continuous: its self-comparisons allow a requantization step
            tol = _requantization_tolerance(ctx, quant, tol, info)
        contexts[runner.name] = dataclasses.replace(ctx, tol=tol, **({"lossy": quant} if quant else {}))  # (module: not)
    # the sweep of every runtime driven by contract calls runs case by case, all of them together, when a check
    # first reads it: eager's reference of a case computed once, every output reduced and dropped before the next
    ctx.plan([(r, contexts[r.name]) for r in todo if r.name in contexts and subject(r) in (CONTRACT, MODULE)])
    for runner in todo:
        info = infos[runner.name]
        if info.status != "ran":
            continue
        t0 = time.perf_counter()
        runner_ctx = contexts[runner.name]
        twin = twins.get(runner.name)
        on_twin = [ch for ch in checks if twin is not None and ch in SELF_COMPARISONS]
        for ch in [ch for ch in checks if ch not in on_twin] + on_twin:  # the file's own checks, then its twin's
            if ch == (on_twin or [None])[0]:  # one session of the file at a time: the twin holds the same weights
                runner.deactivate()  # (packed: as many anonymous bytes again), so the file's session goes first
                trim_freed_memory()  # and the heap pages it freed go back before the twin's are taken
                twin, runner_ctx = _twin_turn(runner, twin, contexts, info, say)
            say(Step(f"{runner.name}: {ch} ...", tally.done, tally.total))
            if twin is not None and ch in on_twin:
                results[runner.name][ch] = run_check(ch, twin, contexts[twin.name])
            else:
                results[runner.name][ch] = run_check(ch, runner, runner_ctx)
            trim_freed_memory()  # what the check freed goes back to the system, not to the next one's peak
            tally.done += 1
        results[runner.name] = {ch: results[runner.name][ch] for ch in checks}  # the table's order
        twin = twins.get(runner.name)
        if twin is not None:
            twin.deactivate()
            trim_freed_memory()
        times = runner.times + (twin.times if twin is not None else [])
        info.calls, info.seconds = len(times), round(sum(times), 4)
        info.order = dict(getattr(runner, "plan_calls", {}))
        if getattr(runner, "block_order", False):  # asked to run block by block: why it could not, if it could not
            info.order_note = order_of(runner)[1]
        for order, n in (getattr(twin, "plan_calls", {}) if twin is not None else {}).items():
            info.order[order] = info.order.get(order, 0) + n
        st = [r.status for r in results[runner.name].values() if r.counted]  # the report's counting
        failed = [ch for ch, r in results[runner.name].items() if r.status is False]
        which = f" ({', '.join(failed)})" if failed else ""
        say(f"{runner.name}: {st.count(True)} passed, {len(failed)} failed{which}, {st.count(None)} skipped "
            f"in {time.perf_counter() - t0:.1f} s ({info.calls} runs)")
    for runner in runners[1:]:  # eager stays: the checks' memoized references came from it
        runner.deactivate()
    trim_freed_memory()
    return infos, results


# the checks that compare a runtime with itself (a lossy file's invariants): on an int8-activation file's twin
SELF_COMPARISONS = ("causality", "kv-consistency", "padding", "generation", "continuous-batching", "speculative",
                    "prefix-reuse")


def _twin(runner: Runner, say: Progress) -> Runner | None:
    """``runner``'s float-activation twin, not yet activated (its session is opened at its turn, after the file's
    is closed: :func:`_twin_turn`), or None: it has none, or it cannot be written (said, and the requantization
    allowance is used instead)."""
    from mhaexport.runners.registry import float_activation_twin

    try:
        return float_activation_twin(runner)
    except (MhaExportError, OSError) as e:
        _no_twin(runner, e, say)
        return None


def _no_twin(runner: Runner, e: BaseException, say: Progress) -> None:
    say(f"{runner.name}: no float-activation twin ({(str(e).strip().splitlines() or [type(e).__name__])[0]}): "
        "its comparisons with itself allow a requantization step")


def _requantization_tolerance(ctx: SweepContext, quant: Quantization, tol: Tolerance, info: RuntimeInfo) -> Tolerance:
    """A file with int8 activations compared with itself without a twin: its tolerance allows a requantization step
    (said in ``info``)."""
    base, tol = tol, self_tolerance(ctx, quant, tol)
    info.self_tolerance, info.allowance = tol.describe(), allowance(tol, base)
    return tol


def _twin_turn(runner: Runner, twin: Runner, contexts: dict, info: RuntimeInfo, say: Progress
               ) -> tuple[Runner | None, SweepContext]:
    """The twin's turn (the file's session closed): the twin activated, or — it cannot load — the file again, its
    comparisons with itself allowing a requantization step. (the twin or None, the file's context)."""
    try:
        twin.activate()
        if twin.skip_reason is not None:
            raise ProviderUnavailable(twin.skip_reason)
        return twin, contexts[runner.name]
    except (MhaExportError, OSError) as e:
        _no_twin(runner, e, say)
        runner.activate()
        own = contexts[runner.name]
        tol = _requantization_tolerance(own, own.lossy, own.tol, info)
        contexts[runner.name] = dataclasses.replace(own, tol=tol)
        return None, contexts[runner.name]
