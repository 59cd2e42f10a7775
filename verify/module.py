"""Verify an attention-block export folder (``--module attention``): the suite's ``module`` subject — its runtimes,
its checks (verify/block.py: its context and checks), its report. ``verify_folder`` dispatches here when the
manifest's contract is a module's."""

from __future__ import annotations

import time
from typing import Callable

from mhaexport.artifact import ExportFolder
from mhaexport.core import iospec
from mhaexport.core.errors import ConfigError
from mhaexport.core.iospec import ModuleContract
from mhaexport.runners.block import ModuleRunner
from mhaexport.runners.names import EAGER, MODULE_RUNTIMES
from mhaexport.runners.pt2 import CODE_RUNTIMES, present_code_runtimes
from mhaexport.runners.registry import runner_for
from mhaexport.runners.threads import ONE_THREAD_MAX_PARAMS, torch_threads
from mhaexport.verify.block import ModuleContext, module_sweep
from mhaexport.verify.checks import cross_provider
from mhaexport.verify.compare import Tolerance
from mhaexport.verify.report import VerifyReport, build_report
from mhaexport.verify.results import MODULE_CHECKS
from mhaexport.verify.run import run_all

Progress = Callable[[str], None]


def build_module_runners(ef: ExportFolder, loaded, runtimes: tuple[str, ...], threads: int | None = None,
                         trust_code: bool = False) -> list[ModuleRunner]:
    """Eager first, then one runner per requested runtime (the registry's, runners/registry.py); an artifact that is
    absent makes its runtime skipped."""
    c = loaded.contract
    return [runner_for(ef, rt, c, eager=loaded.module, threads=threads, trust_code=trust_code)
            for rt in (EAGER,) + tuple(r for r in runtimes if r != EAGER)]


def verify_module(ef: ExportFolder, *, loaded=None, sweep: str = "quick", seed: int = 0,
                  atol: float | dict | None = None, rtol: float | dict | None = None,
                  runtimes: tuple[str, ...] | None = None, checks: tuple[str, ...] | None = None,
                  threads: int | None = None, progress: Progress | None = None, trust_code: bool = False
                  ) -> VerifyReport:
    """Verify every artifact of an attention-block export folder (``ef``, hashes checked) against eager: the
    suite's ``module`` subject (its context and checks: verify/block.py).

    ``loaded``: the block (or the built-in decoder to take it from: re-pointing with --config/--checkpoint); rebuilt
    from the manifest when None, and in every case checked against the recorded fingerprint. ``runtimes``: None =
    all of MODULE_RUNTIMES; given = requested (one skipped entirely: not verified)."""
    from mhaexport.models.block import load_recorded_block
    from mhaexport.models.loading import check_same_model

    started = time.perf_counter()
    say = progress or (lambda _m: None)
    wanted = tuple(runtimes) if runtimes else MODULE_RUNTIMES + present_code_runtimes(ef)
    if off := [r for r in wanted if r not in MODULE_RUNTIMES + CODE_RUNTIMES]:
        raise ConfigError(f"runtime(s) {', '.join(off)} do not run an attention-block export; its runtimes: "
                          f"{', '.join(MODULE_RUNTIMES)}")
    checks = tuple(checks) if checks else MODULE_CHECKS
    if off := [ch for ch in checks if ch not in MODULE_CHECKS]:
        raise ConfigError(f"check(s) {', '.join(off)} do not apply to an attention-block export; its checks: "
                          f"{', '.join(MODULE_CHECKS)}")
    if loaded is None or not isinstance(loaded.contract, ModuleContract):
        say(f"rebuilding the eager block from {ef.model.spec}")
        loaded = load_recorded_block(ef, decoder=loaded)
    else:
        check_same_model(loaded, ef.model)
    c: ModuleContract = loaded.contract
    tol = Tolerance.for_dtype("float32", atol, rtol)
    if threads is None and loaded.n_params <= ONE_THREAD_MAX_PARAMS:
        threads = 1
    runners = build_module_runners(ef, loaded, wanted, threads, trust_code)
    ctx = ModuleContext(contract=c, cases=module_sweep(c, sweep, seed), tol=tol, eager=runners[0], seed=seed,
                        tol_override=(atol, rtol))
    with torch_threads(threads):
        infos, results = run_all(runners, ctx, checks, say)
    cross = cross_provider(runners, infos, ctx) if "parity" in checks else []
    return build_report(ef, sweep=sweep, seed=seed, cases=ctx.cases, tol=tol, atol=atol, rtol=rtol, runners=runners,
                        infos=infos, results=results, checks=checks, requested=runtimes, threads=threads,
                        started=started, export_sizes=(iospec.EXAMPLE_SEQ, iospec.EXAMPLE_PAST), module=c.kind,
                        cross=cross)
