"""Verify an export folder: every artifact in it against eager PyTorch, every check on every runtime.

``verify_folder`` reads the folder's manifest (hashes checked), rebuilds the eager reference from the manifest's
model spec (or takes the one given), builds the runners, runs the checks and returns a :class:`VerifyReport`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Callable

from mhaexport import iospec
from mhaexport.errors import ArtifactError, ConfigError
from mhaexport.exporter.manifest import contract_from_manifest, load_verified, model_fingerprint
from mhaexport.errors import first_line
from mhaexport.verify.checks import CHECKS, CheckResult, Context, Tolerance, run_check
from mhaexport.verify.report import RuntimeInfo, VerifyReport, environment
from mhaexport.verify.runners import (ALL_RUNTIMES, DEFAULT_RUNTIMES, EAGER, ONNX_REFERENCE, ORT_CPU, ORT_CUDA,
                                      TORCHSCRIPT, EagerRunner, OnnxReferenceRunner, OrtRunner, Runner,
                                      TorchScriptRunner, skipped)
from mhaexport.verify.sweep import build_sweep

Progress = Callable[[str], None]
# The ONNX reference evaluator is pure Python: only models up to this many parameters (embedding included).
REFERENCE_MAX_PARAMS = 2_000_000
# Up to this many parameters torch runs verify's small batches on one intra-op thread: more threads gain nothing at
# these sizes and, on a busy machine, spinning threads made each call 10-50x slower (measured on 2 shared cores).
ONE_THREAD_MAX_PARAMS = 20_000_000


@contextlib.contextmanager
def torch_threads(n: int | None) -> Iterator[None]:
    """Run with torch's intra-op thread count set to n (unchanged when None), restored afterwards."""
    if n is None:
        yield
        return
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def loaded_from_manifest(manifest: dict):
    """Rebuild the eager model an export folder was made from (its spec and checkpoint), and check that it is
    the same model (fingerprint: spec, contract, config and checkpoint hash)."""
    from mhaexport.models.loading import load_model

    model = manifest["model"]
    spec, ckpt = model["spec"], model.get("checkpoint")
    kind, _, name = spec.partition(":")
    rebuild = model.get("rebuild") or {}  # absolute paths and the export's working directory
    shipped = isinstance(ckpt, str) and ckpt.startswith("shipped:")
    checkpoint = None if ckpt is None or shipped else (rebuild.get("checkpoint") or ckpt)
    if kind in ("preset", "config"):
        loaded = load_model(config=rebuild.get("config", name), checkpoint=checkpoint, random_weights=ckpt is None)
    elif kind == "factory":
        cwd = rebuild.get("cwd")
        if cwd and cwd not in sys.path:
            sys.path.insert(0, cwd)  # a module factory resolves as it did where it was exported
        loaded = load_model(model=rebuild.get("model", name), checkpoint=checkpoint)
    else:
        raise ArtifactError(f"manifest model spec {spec!r}: expected preset:, config: or factory:")
    loaded.spec, loaded.checkpoint = spec, ckpt  # as recorded: the same model, whatever folder we run from
    if model_fingerprint(loaded.describe()) != manifest.get("model_fingerprint"):
        raise ArtifactError(f"the eager model rebuilt from {spec!r} (checkpoint {ckpt}) is not the exported one "
                            "(config or weights changed since export): re-export, or verify with the model options")
    return loaded


def _export_sizes(manifest: dict) -> tuple[int, int]:
    ts = manifest.get("artifacts", {}).get(TORCHSCRIPT, {}).get("example_shapes")
    if ts:
        return int(ts["seq"]), int(ts["past"])
    from mhaexport.exporter.common import EXAMPLE_PAST, EXAMPLE_SEQ

    return EXAMPLE_SEQ, EXAMPLE_PAST


def _n_params(module) -> int:
    return sum(p.numel() for p in module.parameters())


def build_runners(folder: Path, manifest: dict, loaded, runtimes: tuple[str, ...]) -> list[Runner]:
    """One runner per requested runtime; one whose artifact is absent is a skipped runner with the reason."""
    c = loaded.contract
    arts = manifest.get("artifacts", {})
    runners: list[Runner] = [EagerRunner(name=EAGER, contract=c, module=loaded.module, providers=["torch (cpu)"])]
    onnx = arts.get("onnx")
    fixed = None
    if onnx and not onnx.get("seq_dynamic", True):
        sizes = onnx.get("static_sizes") or {}
        fixed = (int(sizes[iospec.SEQ]), int(sizes[iospec.PAST]))
    for rt in runtimes:
        if rt == EAGER:
            continue
        if rt == TORCHSCRIPT:
            if TORCHSCRIPT not in arts:
                runners.append(skipped(rt, c, f"no TorchScript export in {folder}"))
            else:
                runners.append(TorchScriptRunner(name=rt, contract=c, path=folder / arts[TORCHSCRIPT]["file"],
                                                 dtype=arts[TORCHSCRIPT].get("dtype", "float32")))
            continue
        if not onnx:
            runners.append(skipped(rt, c, f"no ONNX export in {folder}"))
            continue
        path, dtype = folder / onnx["file"], onnx.get("dtype", "float32")
        if rt == ORT_CPU:
            runners.append(OrtRunner(name=rt, contract=c, path=path, dtype=dtype, fixed=fixed))
        elif rt == ORT_CUDA:
            runners.append(OrtRunner(name=rt, contract=c, path=path, dtype=dtype, fixed=fixed,
                                     provider="CUDAExecutionProvider"))
        elif rt == ONNX_REFERENCE:
            n = _n_params(loaded.module)
            if n > REFERENCE_MAX_PARAMS:
                runners.append(skipped(rt, c, f"model has {n:,} parameters; the pure-Python reference evaluator "
                                              f"runs models up to {REFERENCE_MAX_PARAMS:,}"))
            else:
                runners.append(OnnxReferenceRunner(name=rt, contract=c, path=path, dtype=dtype, fixed=fixed))
    return runners


def verify_folder(folder: str | Path, *, loaded=None, sweep: str = "quick", seed: int = 0,
                  atol: float | None = None, rtol: float | None = None,
                  runtimes: tuple[str, ...] = DEFAULT_RUNTIMES, checks: tuple[str, ...] = CHECKS,
                  gen_tokens: int | None = None, threads: int | None = None,
                  progress: Progress | None = None) -> VerifyReport:
    """Verify every artifact in ``folder`` against eager. ``loaded``: the eager model (rebuilt from the manifest
    when None). ``threads``: torch intra-op threads for eager/TorchScript (default: 1 for models up to
    ONE_THREAD_MAX_PARAMS, else torch's own). Raises ArtifactError for a bad folder; check failures are in the
    report, not exceptions."""
    started = time.perf_counter()
    say = progress or (lambda _m: None)
    folder = Path(folder)
    unknown = [r for r in runtimes if r not in ALL_RUNTIMES]
    if unknown:
        raise ConfigError(f"unknown runtime(s) {', '.join(unknown)}; known: {', '.join(ALL_RUNTIMES)}")
    unknown = [c for c in checks if c not in CHECKS]
    if unknown:
        raise ConfigError(f"unknown check(s) {', '.join(unknown)}; known: {', '.join(CHECKS)}")
    manifest = load_verified(folder)
    if not manifest.get("artifacts"):
        raise ArtifactError(f"{folder} holds no export (its manifest lists no artifact)")
    if loaded is None:
        say(f"rebuilding the eager reference from {manifest['model']['spec']}")
        loaded = loaded_from_manifest(manifest)
    elif loaded.contract != contract_from_manifest(manifest):
        raise ArtifactError(f"the eager model's contract {loaded.contract.to_dict()} differs from the export's "
                            f"{manifest['model']['contract']}")
    c = loaded.contract
    dtypes = {a.get("dtype", "float32") for a in manifest["artifacts"].values()}
    dtype = "float16" if "float16" in dtypes else ("bfloat16" if "bfloat16" in dtypes else "float32")
    tol = Tolerance.for_dtype(dtype, atol, rtol)
    cases = build_sweep(c, sweep, seed)
    runners = build_runners(folder, manifest, loaded, tuple(runtimes))
    eager = runners[0]
    ctx = Context(contract=c, cases=cases, tol=tol, tol_override=(atol, rtol), eager=eager,
                  export_sizes=_export_sizes(manifest),
                  gen_tokens=gen_tokens or (8 if sweep == "quick" else 32), seed=seed)
    if threads is None and _n_params(loaded.module) <= ONE_THREAD_MAX_PARAMS:
        threads = 1
    with torch_threads(threads):
        infos, results = _run_all(runners, ctx, checks, say)
    return VerifyReport(
        model=manifest["model"], folder=str(folder),
        sweep={"kind": sweep, "seed": seed, "cases": len(cases), "shapes": [cs.to_dict() for cs in cases],
               "export_sizes": {"seq": ctx.export_sizes[0], "past": ctx.export_sizes[1]},
               "generation_tokens": ctx.gen_tokens},
        tolerance={"atol": tol.atol, "rtol": tol.rtol, "dtype": dtype,
                   "overridden": atol is not None or rtol is not None,
                   "per_runtime": {r.name: {"dtype": r.dtype, **vars(Tolerance.for_dtype(r.dtype, atol, rtol))}
                                   for r in runners}},
        runtimes=infos, results=results, versions=_versions(),
        artifacts={k: {kk: v.get(kk) for kk in ("format", "file", "opset", "mode", "seq_dynamic", "static_sizes",
                                                 "attention", "dtype") if kk in v}
                   for k, v in manifest["artifacts"].items()},
        environment={**environment(), "torch_threads": threads}, seconds=time.perf_counter() - started)


def _run_all(runners: list[Runner], ctx: Context, checks: tuple[str, ...], say: Progress):
    """Load each runner and run every check on it; a runner that cannot load fails (or skips) every check."""
    infos: dict[str, RuntimeInfo] = {}
    results: dict[str, dict[str, CheckResult]] = {}
    for runner in runners:
        artifact = None if runner.name == EAGER else (TORCHSCRIPT if runner.name == TORCHSCRIPT else "onnx")
        info = RuntimeInfo(name=runner.name, status="ran", artifact=artifact)
        if runner.available:
            try:
                runner.load()
            except Exception as e:  # the artifact is there but this runtime cannot load it: a failure
                info.status, info.reason = "error", f"cannot load {artifact}: {first_line(e)}"
        info.providers = list(runner.providers)
        if not runner.available:
            info.status, info.reason = "skipped", runner.skip_reason or ""
        infos[runner.name] = info
        if info.status != "ran":
            status = None if info.status == "skipped" else False
            results[runner.name] = {ch: CheckResult(ch, status, {}, info.reason) for ch in checks}
            say(f"{runner.name}: {info.status} ({info.reason})")
            continue
        results[runner.name] = {}
        t0 = time.perf_counter()
        # each runtime is held to its own artifact's dtype: an fp16 ONNX file next to an fp32 TorchScript one
        # must not loosen TorchScript's tolerance; the memoized eager references stay shared (shallow copy)
        runner_ctx = dataclasses.replace(ctx, tol=Tolerance.for_dtype(runner.dtype, ctx.tol_override[0],
                                                                      ctx.tol_override[1]))
        for ch in checks:
            results[runner.name][ch] = run_check(ch, runner, runner_ctx)
        info.calls, info.seconds = len(runner.times), round(sum(runner.times), 4)
        st = [r.status for r in results[runner.name].values()]
        failed = [ch for ch, r in results[runner.name].items() if r.status is False]
        which = f" ({', '.join(failed)})" if failed else ""
        say(f"{runner.name}: {st.count(True)} passed, {len(failed)} failed{which}, {st.count(None)} skipped "
            f"in {time.perf_counter() - t0:.1f} s ({info.calls} runs)")
    return infos, results


def _versions() -> dict:
    from mhaexport.exporter.common import tool_versions

    return tool_versions()
