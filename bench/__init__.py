"""`mhaexport bench`: time the KV-cache decode loop of an export folder on each runtime.

Per row, after warm-up generations until two in a row agree and over repeats (round-robin over the rows), on the
same seeded prompt, greedy: prefill latency, time to first token, per-token decode latency (p50 / p90 / min and
its spread), tokens/s and per-token latency against position. Every row is a runner driven by the one decode loop
(:class:`mhaexport.runtime.decode.DecodeLoop`), the loop verify's checks drive. The memory bandwidth and the
weight-bandwidth floor are measured in the same run; the speed targets are judged only where the spread allows::

    from mhaexport.bench import BenchConfig, run_bench, write_bench
    result = run_bench("artifacts/default", BenchConfig(new_tokens=64))
    write_bench(result, "artifacts/default")   # bench.json, bench.md, bench.png, report.md's bench section

``BenchConfig(batches=(1, 4, 16), prompts=(32, 512, 2048))`` adds how cost grows (``result.scaling``: per-token
latency and tokens/s per batch, TTFT per prompt length, on the ONNX Runtime rows; bench-scaling.png).

Modules: ``config`` (BenchConfig), ``probes`` (bandwidth probes, weight bytes), ``stats`` (percentiles, spread,
steadiness), ``rows`` (one timed row per runtime), ``lowerings`` (--compare folders, the lowerings table),
``targets`` (the speed targets as data), ``scaling`` (how cost grows with the batch and the prompt), ``render``
(bench.md, bench.png, bench-scaling.png, report.md, terminal), ``run`` (orchestration). This package imports
neither the exporter nor the CLI.
"""

from __future__ import annotations

from mhaexport.bench.config import (ALL_RUNTIMES, DEFAULT_RUNTIMES, EAGER_NOCACHE, BenchConfig, check_config,
                                    parse_points)
from mhaexport.bench.probes import Bandwidth, Probe, measure_bandwidth, weight_bytes_per_token
from mhaexport.bench.render import REPORT_BEGIN, REPORT_END, markdown_body, update_report, write_bench
from mhaexport.bench.result import BenchResult, RuntimeBench, load_bench
from mhaexport.bench.run import run_bench
from mhaexport.bench.targets import TARGETS, Target

__all__ = ["ALL_RUNTIMES", "DEFAULT_RUNTIMES", "EAGER_NOCACHE", "REPORT_BEGIN", "REPORT_END", "TARGETS", "Bandwidth",
           "BenchConfig", "BenchResult", "Probe", "RuntimeBench", "Target", "check_config", "load_bench",
           "markdown_body", "measure_bandwidth", "parse_points", "run_bench", "update_report", "weight_bytes_per_token",
           "write_bench"]

