#!/usr/bin/env python
"""The shared-cache deploy loop on CUDA, diagnosed: one short run (under a minute on an H200) that proves where the
bug of docs/measurements/gpu-check-2026-12-04.md (runs 2 and 3) came from and that the fix removes it.

The bug: a ``--kv-cache shared`` float32 file passed every contract check on ort-cuda but its deploy loop (buffers
reused in place, a ragged right-padded batch) left eager at the first decode step (max abs 6.85 on the small
preset). The cause, as found in ONNX Runtime's source: onnxruntime-gpu 1.31 has CUDA GroupQueryAttention kernels
for float16 and bfloat16 only, so a float32 GroupQueryAttention runs on the CPU provider inside the CUDA session;
its past inputs are then read on the host, and ONNX Runtime copies an input bound on another device than its
reader *when it is bound* (IOBinding::BindInput). The deploy loop made its buffers on CUDA and bound them once, at
the prefill, reusing that binding at every step: every decode step read the copy taken before the prefill (zeros).
The fix (runtime/ort.py): the buffers live where the session reads them (``consumed_on``: the host there), and a
non-CPU session binds the past again before each call.

For each export (small and tiny-window presets, float32, ``--kv-cache shared``; small at float16 too, where the
real CUDA GroupQueryAttention kernel runs) and each provider (ort-cuda when CUDA runs here, ort-cpu), it prints
where ONNX Runtime placed GroupQueryAttention and reads the cache, then one line per variant of the deploy loop x
batch: max abs against eager (fed the same tokens one row at a time, as verify does) and whether the greedy tokens
agree with eager's; then verify's kv-consistency, padding and generation checks on the float32 folders (the
runtime the registry builds: what ``mhaexport verify --runtime ort-cuda`` runs). Variants: ``before`` (the loop before the fix: buffers on the session's device, bound once),
``rebind`` (buffers on the session's device, bound again each call: the cause alone removed), ``fix`` (the runner
as it is now: what ``verify --runtime ort-cuda`` and the Generator run). Batches: one 10-token prompt; a ragged
right-padded batch of 10 and 7 tokens (verify's deploy check); two 10-token prompts; a chunked prefill at batch 1
(4 + 5 tokens, verify's "deploy loop's chunked prefill").

usage: PYTHONPATH=. python scripts/gpu_diag_shared.py [--cpu-only] [--presets small,tiny-window] [--new 8]
       [--no-float16] [--out DIR]
Always exits 0 when it ran (it reports, it does not judge); 2 on bad usage.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import multiprocessing
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

T0 = time.perf_counter()


def log(msg: str) -> None:
    print(msg, flush=True)


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cpu-only", action="store_true", help="skip CUDA even where it runs")
    ap.add_argument("--presets", default="small,tiny-window")
    ap.add_argument("--new", type=int, default=8, help="greedy tokens per prompt (default 8)")
    ap.add_argument("--no-float16", action="store_true", help="skip the float16 export (the real CUDA kernel)")
    ap.add_argument("--out", default=None, help="where the exports go (default: a temporary folder); exports "
                    "already there are reused")
    return ap.parse_args()


def main() -> int:
    args = parse()
    import onnxruntime as ort
    import torch

    from mhaexport import api
    from mhaexport.runtime.choose import feed_of, open_folder, ort_runner_for, source_sha256
    from mhaexport.runtime.decode import DecodeLoop, GenerationConfig
    from mhaexport.runtime.ort import SharedCacheOrtRunner, consumed_on
    from mhaexport.runtime.session import PROVIDER_OPTIONS, SessionConfig, provider_unavailable

    torch.set_num_threads(min(8, os.cpu_count() or 1))
    log(f"onnxruntime {ort.__version__} ({', '.join(ort.get_available_providers())}); torch {torch.__version__}")
    providers = ["cpu"]
    why = "--cpu-only given" if args.cpu_only else provider_unavailable("cuda")
    if why is None:
        providers.insert(0, "cuda")
        name = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "torch sees no CUDA device"
        log(f"CUDA runs here: ONNX Runtime's CUDAExecutionProvider ({name})")
    else:
        log(f"CUDA NOT AVAILABLE ({why}): the CPU rows only; run it on the GPU machine for the ort-cuda rows")

    class BoundOnce(SharedCacheOrtRunner):
        """The deploy loop before the fix: buffers on the session's device, the prefill's binding reused as is."""

        def _adopt(self, *a):
            super()._adopt(*a)
            self.cache_device = self.device

        def _run_shared(self, ids, mask, bufs):
            device, self.device = self.device, "cpu"  # (the fix rebinds on a non-CPU session only)
            try:
                return super()._run_shared(ids, mask, bufs)
            finally:
                self.device = device

    class Rebind(SharedCacheOrtRunner):
        """Buffers on the session's device (CUDA), bound again before each call: the cause alone removed."""

        def _adopt(self, *a):
            super()._adopt(*a)
            self.cache_device = self.device

    variants = {"before": BoundOnce, "rebind": Rebind, "fix": SharedCacheOrtRunner}
    root = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="gpu_diag_shared_"))
    rng = np.random.default_rng(0)
    p10, p7, q10 = (rng.integers(0, 256, n).tolist() for n in (10, 7, 10))
    batches = {"batch 1 [10]": [p10], "ragged [10,7]": [p10, p7], "equal [10,10]": [p10, q10]}
    exports = [(p, "float32") for p in args.presets.split(",") if p]
    if not args.no_float16 and "small" in args.presets.split(","):
        exports.append(("small", "float16"))
    t = time.perf_counter()
    folders = {(p, d): root / f"{p}-{d}-shared" for p, d in exports}
    todo = [(p, d, str(f)) for (p, d), f in folders.items() if not (f / "manifest.json").exists()]
    if todo:  # one process each, side by side (torch.export is one core's work; ~10 s each on the H200)
        ctx = multiprocessing.get_context("spawn")
        with concurrent.futures.ProcessPoolExecutor(len(todo), mp_context=ctx) as pool:
            list(pool.map(export_one, todo))
    log(f"exports ({len(todo)} made, {len(exports) - len(todo)} reused) in {time.perf_counter() - t:.1f} s "
        f"under {root}")
    summary = []
    for preset, dtype in exports:
        loaded = api.load(config=preset)  # the preset's seeded weights: the exported ones (the CPU rows show it)
        folder = folders[(preset, dtype)]
        log(f"\n== {preset} {dtype} --kv-cache shared ({folder})")
        module = loaded.module.eval()

        def eager(seq: list[int]) -> np.ndarray:  # (S, V) float32 logits of one row, no cache
            with torch.no_grad():
                ids = torch.tensor([seq])
                return module(ids, torch.ones_like(ids), None)[0][0].float().numpy()

        greedy: dict[tuple, list[int]] = {}

        def eager_tokens(prompt: list[int], n: int) -> list[int]:
            key = (tuple(prompt), n)
            if key not in greedy:
                seq = list(prompt)
                for _ in range(n):
                    seq.append(int(eager(seq)[-1].argmax()))
                greedy[key] = seq[len(prompt):]
            return greedy[key]

        tol = 1e-3 if dtype == "float32" else 1e-1
        ef = open_folder(folder)
        for prov in providers:
            cfg = SessionConfig(providers=(prov,), threads=4 if prov == "cpu" else None)
            base = ort_runner_for(ef, f"ort-{prov}", cfg)
            base.activate()
            if base.skip_reason is not None:
                log(f"  ort-{prov}: skipped: {base.skip_reason}")
                continue
            log(f"  ort-{prov}: providers {base.providers}; " + placement(ort, folder / "model.onnx", prov,
                                                                         PROVIDER_OPTIONS, consumed_on))
            feed = feed_of(ef)
            for vname, cls in variants.items():
                if prov == "cpu" and vname == "rebind":
                    continue  # on CPU rebind == fix == before (no copy is ever made)
                runner = cls(f"ort-{prov}", ef.contract, ef.file("onnx"), feed=feed, config=cfg,
                             source_sha256=source_sha256(ef), session_of=base)
                runner.activate()
                for bname, prompts in batches.items():
                    try:
                        res = DecodeLoop(runner).generate(prompts, GenerationConfig(max_new_tokens=args.new),
                                                          keep_logits=True)
                        worst, agree = 0.0, True
                        for b, p in enumerate(prompts):
                            ref = eager(p + res.tokens[b][:-1])
                            for i, lg in enumerate(res.step_logits):
                                worst = max(worst, float(np.abs(lg[b] - ref[len(p) - 1 + i]).max()))
                            agree &= res.tokens[b] == eager_tokens(p, args.new)
                        line = (f"max abs {worst:9.3g}  tokens agree with eager: {'yes' if agree else 'NO '}  "
                                f"{'ok' if agree and worst < tol else 'WRONG'}")
                    except Exception as e:  # noqa: BLE001  # a diagnosis reports, it does not stop
                        worst, agree, line = float("inf"), False, f"raised {type(e).__name__}: {str(e)[:160]}"
                    row = f"  ort-{prov:4} {preset:11} {dtype:7} {vname:6} buffers on {runner.cache_device:4} " \
                          f"{bname:15} {line}"
                    log(row)
                    summary.append(row)
                # the chunked prefill at batch 1: two feeds, the second with a past of 4
                try:
                    loop = DecodeLoop(runner)
                    state = loop.empty(1, 9)
                    seq = np.array([p10[:9]], np.int64)
                    got1, state = loop.feed(seq[:, :4], state)
                    got2, state = loop.feed(seq[:, 4:], state)
                    got = np.concatenate([got1, got2], axis=1)[0]
                    worst = float(np.abs(got - eager(p10[:9])).max())
                    line = f"max abs {worst:9.3g}  {'ok' if worst < tol else 'WRONG'}"
                except Exception as e:  # noqa: BLE001
                    line = f"raised {type(e).__name__}: {str(e)[:160]}"
                row = f"  ort-{prov:4} {preset:11} {dtype:7} {vname:6} buffers on {runner.cache_device:4} " \
                      f"{'chunked 4+5':15} {line}"
                log(row)
                summary.append(row)
            base.deactivate()
    # what `mhaexport verify --runtime ort-cuda` reports now: the registry's runners (the fix with them)
    from mhaexport.verify.verify import verify_folder

    runtime = f"ort-{providers[0]}"
    for preset, dtype in exports:
        if dtype != "float32":
            continue
        report = verify_folder(folders[(preset, dtype)], runtimes=(runtime,),
                               checks=("kv-consistency", "padding", "generation"))
        for check, r in report.results.get(runtime, {}).items():
            figs = r.figures if isinstance(r.figures, dict) else getattr(r.figures, "__dict__", {})
            deploy = {k: v for k, v in dict(figs).items() if "deploy" in k and v is not None}
            row = (f"  verify {runtime:8} {preset:11} {dtype:7} {check:15} "
                   f"{'passed' if r.status else 'FAILED' if r.status is False else 'n/a'}: {str(r.message)[:110]}"
                   + (f" {deploy}" if deploy else ""))
            log(row)
            summary.append(row.replace("FAILED", "WRONG"))
    log(f"\n== done in {time.perf_counter() - T0:.1f} s: {sum('WRONG' in r or 'raised' in r for r in summary)} of "
        f"{len(summary)} lines wrong (expected wrong: ort-cuda 'before' rows of the float32 files only)")
    return 0


def export_one(job: tuple[str, str, str]) -> str:
    """Export preset ``job[0]`` at dtype ``job[1]`` with ``--kv-cache shared`` into folder ``job[2]``."""
    import torch

    from mhaexport import api

    torch.set_num_threads(2)
    preset, dtype, folder = job
    api.export_onnx(folder, config=preset, dtype=dtype, kv_cache="shared", replace=True)
    return folder


def placement(ort, model: Path, prov: str, provider_options: dict, consumed_on) -> str:
    """Where ONNX Runtime placed GroupQueryAttention in a session of ``prov`` (its graph-assignment record, where
    this onnxruntime keeps one) and where it reads past_key_values.0.key (get_input_memory_infos)."""
    so = ort.SessionOptions()
    so.log_severity_level = 3
    try:
        so.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
    except Exception:  # noqa: BLE001
        pass
    full = {"cuda": "CUDAExecutionProvider", "cpu": "CPUExecutionProvider"}[prov]
    provs = [(full, provider_options.get(full, {}))] + ([] if prov == "cpu" else ["CPUExecutionProvider"])
    s = ort.InferenceSession(str(model), so, providers=provs)
    where = "GroupQueryAttention placement: unknown (no get_provider_graph_assignment_info)"
    try:
        gqa: dict[str, int] = {}
        for sub in s.get_provider_graph_assignment_info():
            ep = getattr(sub, "ep_name", None) or getattr(sub, "execution_provider", None) or str(sub)
            nodes = getattr(sub, "get_nodes", None)
            nodes = nodes() if callable(nodes) else getattr(sub, "nodes", [])
            n = sum(1 for nd in nodes if "GroupQueryAttention" in str(getattr(nd, "op_type", nd)))
            if n:
                gqa[str(ep)] = gqa.get(str(ep), 0) + n
        where = f"GroupQueryAttention nodes on {gqa or 'no provider that says so'}"
    except Exception as e:  # noqa: BLE001
        where = f"GroupQueryAttention placement: not recorded ({type(e).__name__}: {str(e)[:100]})"
    try:
        infos = dict(zip([i.name for i in s.get_inputs()], s.get_input_memory_infos()))
        info = infos.get("past_key_values.0.key")
        read = f"past_key_values.0.key read on {getattr(info, 'name', info)}"
    except Exception as e:  # noqa: BLE001
        read = f"input memory infos: unavailable ({type(e).__name__})"
    return f"{where}; {read}; consumed_on -> {consumed_on(s, ['past_key_values.0.key'], prov)}"


if __name__ == "__main__":
    sys.exit(main())
