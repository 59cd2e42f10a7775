"""The speed targets, as data: each :class:`Target` is a ratio of two figures of a run, a limit, a direction and
the run conditions its limit was set for; :func:`evaluate` judges them against a :class:`BenchResult`.

A target says yes or no only when it was measured *and* every timed figure it reads has a spread (the larger of
p90 / p50 and p50 / p10 of per-token latency with the growth with position taken out,
:func:`mhaexport.bench.stats.token_spread`) of at most ``max_spread`` (1.5 by default: a tenth of the steps half
again slower than the median, or the median half again slower than the fastest tenth, means the machine was busy
and the p50 moves with it); otherwise it says "not measured" or "spread too wide (x.x on ROW): no verdict", and
``met`` is None — never "yes".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Protocol

from mhaexport.bench.config import EAGER_NOCACHE, ORT_BARE, ORT_GENAI
from mhaexport.bench.result import BenchResult, TargetResult
from mhaexport.runners.names import EAGER, ORT_CPU

AT_MOST, AT_LEAST = "at most", "at least"
# Where the limits were set: the `bench` preset, batch 1, prompt 32, 128 new tokens, 2 threads. Keys: "spec" is the
# model's spec, the others are BenchConfig fields.
BENCH_PRESET: Mapping[str, object] = MappingProxyType(
    {"spec": "preset:bench", "batch": 1, "prompt_len": 32, "new_tokens": 128, "threads": 2})
# The peer targets (issue 20) hold for any model the builder converts: the same run conditions, no preset.
PEER_RUN: Mapping[str, object] = MappingProxyType({"batch": 1, "prompt_len": 32, "new_tokens": 128, "threads": 2})


@dataclass(frozen=True)
class Reading:
    """A figure read from a result: its value (ms), what it is, and the spread of the timings it came from (None
    for figures that are not timed rows, like the floor)."""

    value: float
    label: str
    spread: float | None = None
    unit: str = "ms"


class Figure(Protocol):
    def read(self, res: BenchResult) -> Reading | None:
        """The figure in ``res``, or None when the run did not measure it."""


@dataclass(frozen=True)
class RowFigure:
    """A field of a row that ran: ``RowFigure("ort-cpu", "token_p50_ms")``. The folder's own row must be a float
    export: when the folder is quantized, the first float row of the same runtime (a --compare folder) is read
    instead, or none (the targets are set for float weights; quantized rows have their own)."""

    row: str
    field: str

    def read(self, res: BenchResult) -> Reading | None:
        r = res.get(self.row)
        if r is not None and r.quantization:
            r = next((x for x in res.runtimes if x.ran and x.quantization is None and x.opt_level is None
                      and x.name.split(" [")[0] == self.row), None)
        value = getattr(r, self.field) if r is not None and r.ran else None
        return None if value is None else Reading(value, r.label if r.name != self.row else self.row,
                                                   r.token_spread)


def _ort_cpu_rows(res: BenchResult) -> list:
    """The ORT CPU rows that ran (the folder's own and the --compare / --builder ones; not the --opt-levels
    variants), in table order."""
    return [r for r in res.runtimes if r.ran and r.opt_level is None and r.name.split(" [")[0] == ORT_CPU]


@dataclass(frozen=True)
class QuantRowFigure:
    """A field of the first ORT CPU row whose export is quantized with ``scheme`` ("int4")."""

    scheme: str
    field: str = "token_p50_ms"

    def read(self, res: BenchResult) -> Reading | None:
        r = next((x for x in _ort_cpu_rows(res) if x.quantization == self.scheme), None)
        value = getattr(r, self.field) if r is not None else None
        return None if value is None else Reading(value, r.label, r.token_spread)


@dataclass(frozen=True)
class ProducerFigure:
    """The fastest ORT CPU row (not an --opt-levels variant) of files mhaexport exported (``ours``: lowering
    "attention=...") or of files another tool made and mhaexport adopted (onnxruntime-genai's builder's: lowering
    "onnxruntime-genai ..."), with weights ``scheme`` (None: float; "int4")."""

    ours: bool
    scheme: str | None = None
    field: str = "token_p50_ms"

    def read(self, res: BenchResult) -> Reading | None:
        rows = [x for x in _ort_cpu_rows(res) if x.lowering and getattr(x, self.field)
                and x.quantization == self.scheme and x.lowering.startswith("attention=") == self.ours]
        if not rows:
            return None
        best = min(rows, key=lambda x: getattr(x, self.field))
        return Reading(getattr(best, self.field), best.label, best.token_spread)


@dataclass(frozen=True)
class FloorFigure:
    """The weight-bandwidth floor (ms per token)."""

    def read(self, res: BenchResult) -> Reading | None:
        return Reading(res.floor_ms, "floor") if res.floor_ms else None


@dataclass(frozen=True)
class LongRunFigure:
    """A long run's per-token latency at ``position`` (median of positions +-8); None: at the prompt's end."""

    row: str
    position: int | None = None

    def read(self, res: BenchResult) -> Reading | None:
        lr = res.long_run(self.row)
        pos = self.position if self.position is not None else res.config.prompt_len
        value = lr.at_position(pos) if lr else None
        return None if value is None else Reading(value, f"{self.row} at {pos}", lr.spread)


def _cache_row(res: BenchResult, shared: bool):
    """The ORT CPU row (the folder's own or a --compare one, not an --opt-levels variant) whose export has a shared
    KV cache (``shared``) or a concat one; the folder's own row first."""
    return next((r for r in _ort_cpu_rows(res) if r.lowering and ("kv=shared" in r.lowering) == shared), None)


@dataclass(frozen=True)
class CacheRowFigure:
    """A field of the ORT CPU row of the shared-cache (``shared``) or the concat-cache export."""

    shared: bool
    field: str

    def read(self, res: BenchResult) -> Reading | None:
        r = _cache_row(res, self.shared)
        value = getattr(r, self.field) if r is not None else None
        label = "shared cache" if self.shared else "concat cache"
        return None if value is None else Reading(value, label, r.token_spread)


@dataclass(frozen=True)
class CacheLongRunFigure:
    """The shared-cache export's ORT CPU long run at ``position`` (None: at the prompt's end)."""

    position: int | None = None

    def read(self, res: BenchResult) -> Reading | None:
        r = _cache_row(res, True)
        return None if r is None else LongRunFigure(r.name, self.position).read(res)


@dataclass(frozen=True)
class CachePerByteFigure:
    """The shared-cache export's ORT CPU long run at ``position`` (None: the prompt's end), per GB a step there reads
    at least (weights + the cache so far, read once: the long run's ``bytes_at``). The ratio of two positions is
    the latency's growth beyond what the growing cache's bytes explain: 1.0 when a step costs its bytes and nothing
    else grows with position (no copy, no recompute)."""

    position: int | None = None

    def read(self, res: BenchResult) -> Reading | None:
        at = CacheLongRunFigure(self.position).read(res)
        r = _cache_row(res, True)
        lr = res.long_run(r.name) if r is not None else None
        pos = self.position if self.position is not None else res.config.prompt_len
        read = ((lr.bytes_at if lr else None) or {}).get(str(pos))
        if at is None or not read:
            return None
        return Reading(at.value / (read / 1e9), f"{at.label} ({read / 1e6:.1f} MB read)", at.spread, "ms/GB")


@dataclass(frozen=True)
class Target:
    """``numerator / denominator`` must be ``direction`` (at most / at least) ``limit``. ``name`` may hold
    ``{prompt_len}`` / ``{new_tokens}`` (filled from the run's config); ``needs`` says what a run must have to
    measure it; ``conditions`` are the run settings the limit was set for."""

    name: str
    numerator: Figure
    denominator: Figure
    limit: float
    direction: str = AT_MOST
    needs: str = ""
    conditions: Mapping[str, object] = field(default_factory=lambda: BENCH_PRESET)

    def title(self, res: BenchResult) -> str:
        return self.name.format(**vars(res.config))

    def applies(self, res: BenchResult) -> bool:
        """Whether ``res`` ran under the conditions the limit was set for."""
        have = {**vars(res.config), "spec": res.model.spec}
        return all(have.get(k) == v for k, v in self.conditions.items())

    def evaluate(self, res: BenchResult, max_spread: float) -> TargetResult:
        """This target on ``res``: measured ratio, ``met`` (True / False / None = no verdict), the verdict text, the
        widest spread among the figures read and which one, and whether the run conditions match."""
        out = TargetResult(self.title(res), self.limit, self.direction, detail=self.needs, applies=self.applies(res))
        a, b = self.numerator.read(res), self.denominator.read(res)
        if a is None or b is None or not b.value:
            return out
        measured = a.value / b.value
        out.measured = round(measured, 3)
        out.detail = f"{a.label} {a.value:.2f} {a.unit} vs {b.label} {b.value:.2f} {b.unit}"
        spreads = [(r.spread, r.label) for r in (a, b) if r.spread is not None]
        if spreads:
            out.spread, out.spread_of = max(spreads)
        if out.spread is not None and out.spread > max_spread:
            out.verdict = f"spread too wide ({out.spread:.1f} on {out.spread_of}): no verdict"
            return out
        out.met = measured <= self.limit if self.direction == AT_MOST else measured >= self.limit
        out.verdict = "yes" if out.met else "no"
        return out


TARGETS: tuple[Target, ...] = (
    Target("ORT CPU per-token p50 / eager-with-cache p50", RowFigure(ORT_CPU, "token_p50_ms"),
           RowFigure(EAGER, "token_p50_ms"), 0.55, needs="needs eager and ort-cpu"),
    Target("ORT CPU per-token p50 / weight-bandwidth floor", RowFigure(ORT_CPU, "token_p50_ms"), FloorFigure(),
           1.15, needs="needs ort-cpu"),
    Target("ORT CPU per-token p50 / a bare session.run loop's p50 (same file)", RowFigure(ORT_CPU, "token_p50_ms"),
           RowFigure(ORT_BARE, "token_p50_ms"), 1.05, needs="needs ort-cpu and ort-bare"),
    Target("shared KV cache per-token latency at position 1000 / at {prompt_len} (ORT CPU)",
           CacheLongRunFigure(1000), CacheLongRunFigure(), 1.10,
           needs="needs a shared-cache export (--lowerings ...,shared) and --long >= 1008"),
    Target("shared KV cache per-token latency per byte read at position 1000 / at {prompt_len} (ORT CPU)",
           CachePerByteFigure(1000), CachePerByteFigure(), 1.10,
           needs="needs a shared-cache export (--lowerings ...,shared) and --long >= 1008"),
    Target("shared / concat KV cache per-token p50 (ORT CPU, {new_tokens} tokens)",
           CacheRowFigure(True, "token_p50_ms"), CacheRowFigure(False, "token_p50_ms"), 1.0,
           needs="needs a concat and a shared-cache export of the model (--lowerings decomposed,shared)"),
    Target("ORT CPU per-token latency at position 1000 / at {prompt_len}", LongRunFigure(ORT_CPU, 1000),
           LongRunFigure(ORT_CPU), 1.5, needs="needs --long >= 1008 on a model with max_positions >= 1008"),
    Target("ORT CPU int4 per-token p50 / float weight-bandwidth floor", QuantRowFigure("int4"), FloorFigure(), 0.5,
           needs="needs an int4 export: --quantize int4 or --compare DIR"),
    Target("ORT CPU per-token p50 / onnxruntime-genai's loop p50 (same file)", RowFigure(ORT_CPU, "token_p50_ms"),
           RowFigure(ORT_GENAI, "token_p50_ms"), 1.03, needs="needs ort-cpu and ort-genai (onnxruntime-genai)",
           conditions=PEER_RUN),
    Target("mhaexport's fastest float export / the builder's float file (ORT CPU per-token p50)",
           ProducerFigure(True), ProducerFigure(False), 1.0, conditions=PEER_RUN,
           needs="needs the builder's float file: --builder fp32 on an --hf folder"),
    Target("mhaexport's fastest int4 export / the builder's int4 file (ORT CPU per-token p50)",
           ProducerFigure(True, "int4"), ProducerFigure(False, "int4"), 1.0, conditions=PEER_RUN,
           needs="needs an int4 export (--quantize int4) and the builder's int4 file (--builder int4)"),
    Target("recompute / cached decode time at {new_tokens} new tokens (eager)",
           RowFigure(EAGER_NOCACHE, "decode_total_ms"), RowFigure(EAGER, "decode_total_ms"), 5.0,
           direction=AT_LEAST, needs="needs eager and eager-nocache"),
)


def evaluate(res: BenchResult, max_spread: float = 1.5, targets: tuple[Target, ...] = TARGETS) -> list[TargetResult]:
    """Every target on ``res`` (bench.json's ``targets``)."""
    return [t.evaluate(res, max_spread) for t in targets]


def describe_conditions(conditions: Mapping[str, object]) -> str:
    """``BENCH_PRESET`` -> "the `bench` preset at batch 1, prompt 32, 128 new tokens, 2 threads"."""
    spec = str(conditions.get("spec", ""))
    model = (f"the `{spec.removeprefix('preset:')}` preset" if spec.startswith("preset:") else f"`{spec}`" if spec
             else "any model")
    parts = [f"batch {conditions['batch']}" if "batch" in conditions else "",
             f"prompt {conditions['prompt_len']}" if "prompt_len" in conditions else "",
             f"{conditions['new_tokens']} new tokens" if "new_tokens" in conditions else "",
             f"{conditions['threads']} threads" if "threads" in conditions else ""]
    return f"{model} at {', '.join(p for p in parts if p)}"
