"""Each check's figures as a typed record (:class:`Figures` and one subclass per check, or per kind of figures where
checks share them): the checks build them, the renderers (report.md, report.html, JUnit) and diagnose read them by
attribute, report.json holds them as ``results.<runtime>.<check>.figures`` — the same keys and values a plain dict
gave, in the same order. Read back (:func:`figures_of`), every known key is typed (a report is untrusted input: a
wrong type is an ArtifactError naming its path, exit 2) and a key this version does not know — an earlier or a later
version's — is kept in ``extra`` and written back.

A record is also a read-only mapping of its JSON keys (``figures["max_abs"]``, ``figures == {"lossy": True}``), the
view the Python API gave before the figures were typed. Torch-free.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from mhaexport.artifact.details import LayerHeadroom
from mhaexport.artifact.record import Record, parse

F = TypeVar("F", bound="Figures")

# Figures that mark a result as no check at all (CheckResult.counted): the reference against itself, a check that
# does not apply to this runtime by design (exact parity of a lossy artifact, quality or weights of an exact one,
# causality of a bidirectional block, what onnxruntime-genai's own loop cannot be fed)
NOT_A_CHECK = ("reference", "lossy", "exact", "not_applicable")


R = TypeVar("R", bound=Record)


def built(cls: type[R], figures: dict[str, Any], strict: bool = True) -> R:
    """A figures record as a writer builds it: ``figures`` by JSON key, written back in that order, an explicit None
    as null; a key ``cls`` does not declare is a TypeError (``strict``) or kept in ``extra``."""
    names = {key: f.name for f, key, _, _ in cls._fields()}
    unknown = [k for k in figures if k not in names]
    if unknown and strict:
        raise TypeError(f"{cls.__name__} has no figure {unknown[0]!r}")
    return cls(**{names[k]: v for k, v in figures.items() if k in names},
               extra={k: figures[k] for k in unknown}, read_keys=tuple(figures))


def largest(*values: float | None) -> float | None:
    """The largest of the figures measured (None: not measured), NaN where any is NaN — ``max`` keeps whichever of a
    NaN and a number comes first, so a NaN after a 0 would read as 0 — and None where none was measured (a cell
    shows "—", never a 0 nothing measured)."""
    vals = [v for v in values if v is not None]
    if any(v != v for v in vals):
        return float("nan")
    return max(vals) if vals else None


@dataclass(eq=False)
class Figures(Record, Mapping):
    """What every check's figures may hold: why a result is no check at all (:data:`NOT_A_CHECK`), a static
    export's skip (``static``) and how far a windowed model's check reached (``longest_position``,
    ``windows_crossed``: verify/windows.py). The figures of a check without a record of its own (and of a check
    this version does not know) stay in ``extra``."""

    reference: bool | None = None
    lossy: bool | None = None
    exact: bool | None = None
    not_applicable: bool | None = None
    static: bool | None = None
    longest_position: int | None = None
    windows_crossed: list[int] | None = None

    STRICT = False  # of(): refuse a key the record does not declare (a check's own record: a misspelt figure)

    @classmethod
    def of(cls: type[F], **figures: Any) -> F:
        """The record a check builds: its figures by key, written in the order given (an explicit None as null)."""
        return built(cls, figures, strict=cls.STRICT)

    @property
    def not_a_check(self) -> str | None:
        """The flag that marks the result as no check at all (:data:`NOT_A_CHECK`), or None."""
        return next((k for k in NOT_A_CHECK if getattr(self, k)), None)

    def set(self, **figures: Any) -> None:
        """Add or change figures after the check built them (a declared key is typed; another one goes to
        ``extra``)."""
        for key, value in figures.items():
            self[key] = value

    # --- the mapping view of the JSON keys ---------------------------------------------------------------------
    def __getitem__(self, key: str) -> Any:
        return self.to_dict()[key]

    def __iter__(self):
        return iter(self.to_dict())

    def __len__(self) -> int:
        return len(self.to_dict())

    def keys(self):  # the mapping's keys (Record.keys, the keys a class reads, serves flat records: none is one)
        return self.to_dict().keys()

    def __setitem__(self, key: str, value: Any) -> None:
        """Set a figure as a dict would: written after the others (null when None), a key not declared to ``extra``."""
        if key in {f.name for f in dataclasses.fields(self)} - {"extra", "read_keys"}:
            setattr(self, key, value)
        else:
            self.extra[key] = value
        if key not in self.read_keys:
            self.read_keys += (key,)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Mapping):
            return self.to_dict() == dict(other.items())
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]


@dataclass(eq=False)
class DiffFigures(Figures):
    """An element-wise comparison (``verify.compare.Diff.figures``): provider against provider (report.json's
    ``cross``) and the start of parity's figures."""

    max_abs: float | None = None
    max_rel: float | None = None
    mismatch_fraction: float | None = None
    min_atol: float | None = None
    compared: int | None = None


@dataclass
class OutputStats(Record):
    """Parity's |error| statistics of one output kind (``Diff.stats`` and the kind's tolerance)."""

    mean: float | None = None
    median: float | None = None
    p99: float | None = None
    max: float | None = None
    mismatch_fraction: float | None = None
    compared: int | None = None
    atol: float | None = None
    rtol: float | None = None


@dataclass(eq=False)
class ParityFigures(DiffFigures):
    """parity: the sweep against eager overall (the Diff's figures), per output kind, per case ([batch, seq, past,
    max abs or null: failed to run], report.html's plot), the worst case and the failures to run; the present
    tensors that differ, by name; a graph with baked axes (the block's); onnxruntime-genai's rows and tolerance."""

    cases: int | None = None
    worst_case: str | None = None
    errors: int | None = None
    per_output: dict[str, OutputStats] | None = None
    by_case: list[list[Any]] | None = field(default=None, metadata={"parse": lambda v, where: _cases(v, where)})
    present_failing: dict[str, float] | None = None
    baked_axes: int | None = None
    rows: int | None = None
    tolerance: str | None = None

    STRICT = True


@dataclass(eq=False)
class FiniteFigures(Figures):
    """finite: the cases (onnxruntime-genai's: its rows) and those with a non-finite output."""

    cases: int | None = None
    non_finite_outputs: int | None = None
    non_finite_rows: int | None = None

    STRICT = True


@dataclass(eq=False)
class CausalityFigures(Figures):
    """causality: the largest change of an earlier position's outputs when a later token changes, and of the later
    ones."""

    max_abs_earlier: float | None = None
    max_abs_later: float | None = None

    STRICT = True


@dataclass(eq=False)
class KvFigures(DiffFigures):
    """kv-consistency: token-by-token decode, chunked prefill and recompute against one prefill; the long context
    (``long_*``: how far, the curve against position for report.html); the protocol driven and the deploy loop's
    figures (``deploy_*``); onnxruntime-genai's: the Diff of its loop and its cache's share-buffer setting."""

    decode_max_abs: float | None = None
    chunked_max_abs: float | None = None
    recompute_max_abs: float | None = None
    long_to: int | None = None
    long_positions: int | None = None
    long_max_abs: float | None = None
    long_first_bad: int | None = None
    long_by_position: list[list[float]] | None = None
    protocol: str | None = None
    deploy_rows: list[int] | None = None
    deploy_steps: int | None = None
    deploy_max_abs: float | None = None
    deploy_chunked_max_abs: float | None = None
    past_present_share_buffer: bool | None = None

    STRICT = True

    @property
    def worst(self) -> float | None:
        """The largest difference of decode, chunked prefill, recompute and the long context (report.md's cell):
        NaN where any is NaN (``max`` keeps whichever NaN or number came first), None where none was measured."""
        return largest(self.decode_max_abs, self.chunked_max_abs, self.recompute_max_abs, self.long_max_abs)


@dataclass(eq=False)
class PaddingFigures(DiffFigures):
    """padding: the pads, each side's prefill and decode difference against the row unpadded, the protocol driven
    and the deploy loop's ragged batch; onnxruntime-genai's: the Diff of its batch and the prompts' lengths."""

    pad: int | None = None
    left_prefill_max_abs: float | None = None
    left_decode_max_abs: float | None = None
    right_prefill_max_abs: float | None = None
    right_decode_max_abs: float | None = None
    protocol: str | None = None
    deploy_ragged_max_abs: float | None = None
    batch: list[int] | None = None

    STRICT = True

    @property
    def worst(self) -> float | None:
        """The largest of the sides' and the deploy loop's differences (report.md's cell; see :func:`largest`)."""
        return largest(self.left_prefill_max_abs, self.left_decode_max_abs, self.right_prefill_max_abs,
                       self.right_decode_max_abs, self.deploy_ragged_max_abs)


@dataclass(eq=False)
class ShapesFigures(Figures):
    """dynamic-shapes: the unseen shapes, their lengths, the difference against eager, those that failed and the
    first position that differs; a graph with baked axes."""

    shapes: int | None = None
    seq: str | None = None
    past: str | None = None
    max_abs: float | None = None
    failed_shapes: int | None = None
    first_bad_position: int | None = None
    baked_axes: int | None = None

    STRICT = True


@dataclass(eq=False)
class GenerationFigures(Figures):
    """generation: greedy tokens against the reference from a short prompt (bare keys), a long one (``long_*``, its
    length ``long_prompt``) and the deploy loop's ragged batch (``deploy_*``): tokens matched, the first divergence,
    the logits' difference per step and the reference's top-1 margin per step (report.html's plot), a near-tie;
    onnxruntime-genai's: its steps and ties."""

    tokens: int | None = None
    matched: int | None = None
    first_divergence: int | None = None
    max_abs: float | None = None
    step_max_abs: list[float] | None = None
    step_margin: list[float] | None = None
    margin: float | None = None
    tie: bool | None = None
    row: int | None = None
    rows: int | None = None
    step: int | None = None
    ties: int | None = None
    long_tokens: int | None = None
    long_matched: int | None = None
    long_first_divergence: int | None = None
    long_max_abs: float | None = None
    long_step_max_abs: list[float] | None = None
    long_step_margin: list[float] | None = None
    long_margin: float | None = None
    long_tie: bool | None = None
    long_prompt: int | None = None
    protocol: str | None = None
    deploy_tokens: int | None = None
    deploy_matched: int | None = None
    deploy_first_divergence: int | None = None
    deploy_max_abs: float | None = None
    deploy_margin: float | None = None
    deploy_row: int | None = None
    deploy_rows: int | None = None

    STRICT = True


@dataclass
class Scores(Record):
    """The scoring's figures over a set of positions (``evaluate.scoring.Agreement.figures``: the sweep's, the
    loop's) and, for real text, where it came from, its perplexities and bits per byte (null for BPE), or why no
    text was scored."""

    top1: float | None = None
    kl_mean: float | None = None
    kl_p99: float | None = None
    logit_err: float | None = None
    ppl_ratio: float | None = None
    eager_entropy: float | None = None
    log_vocab: float | None = None
    flat: bool | None = None
    positions: int | None = None
    source: str | None = None
    bytes: int | None = None
    perplexity: float | None = None
    eager_perplexity: float | None = None
    bits_per_byte: float | None = None
    eager_bits_per_byte: float | None = None
    skipped: str | None = None


@dataclass
class GreedyAgreement(Record):
    """Greedy agreement: per prompt, the tokens until the first that differs from eager's; their mean and least."""

    prompts: int | None = None
    tokens: int | None = None
    lengths: list[int] | None = None
    mean: float | None = None
    min: int | None = None
    fraction: float | None = None
    source: str | None = field(default=None, metadata={"key": "from"})  # "text" or "random ids"


@dataclass
class Limits(Record):
    """The thresholds a lossy file's figures were judged by (null: not judged)."""

    top1: float | None = None
    kl_mean: float | None = None
    kl_p99: float | None = None
    logit_err: float | None = None
    ppl_ratio: float | None = None
    greedy: float | None = None


@dataclass(eq=False)
class QualityFigures(Figures):
    """quality: the scheme and its thresholds (where they come from), the sweep's figures, the text's, greedy
    agreement and what was not judged (evaluate/scoring.py computes the figures, verify/quality.py judges them)."""

    scheme: str | None = None
    thresholds: Limits | None = None
    thresholds_of: Any = None
    sweep: Scores | None = None
    positions_of: str | None = None
    text: Scores | None = None
    greedy: GreedyAgreement | None = None
    not_judged: list[str] | None = None

    STRICT = True


@dataclass(eq=False)
class WeightsFigures(Figures):
    """weights: a lossy file's quantized tensors against the recipe re-run (tensors, quantized, differing, the first
    difference) or against the reference model's weights (checked, not matched by shape); why not run."""

    tensors: int | None = None
    quantized_tensors: int | None = None
    differing_tensors: int | None = None
    checked_against_reference: int | None = None
    not_matched: int | None = None
    reason: str | None = None
    recipe: str | None = None
    first_difference: str | None = None

    STRICT = True


@dataclass(eq=False)
class GenaiConfigFigures(Figures):
    """genai-config: every finding on genai_config.json ({field, message, severity}) and the fields in error."""

    findings: list[dict[str, Any]] | None = None
    fields: list[str] | None = None

    STRICT = True


@dataclass(eq=False)
class HeadroomFigures(Figures):
    """headroom: the file's dtype, eager float32's peak |activation| (the layer and module, float16's margin over it,
    bfloat16's step at it), the first layer past float16's range, and every layer's figures; the inputs used."""

    dtype: str | None = None
    inputs: str | None = None
    peak: float | None = None
    layer: str | None = None
    module: str | None = None
    float16_margin: float | None = None
    bfloat16_step: float | None = None
    float16_overflow: str | None = None
    layers: list[LayerHeadroom] | None = None  # per layer: its module, peak, float16 margin, bfloat16 step

    STRICT = True


@dataclass(eq=False)
class CacheFigures(Figures):
    """The attention block's cache-consistency: decode and chunked calls with the cache against one call."""

    decode_max_abs: float | None = None
    chunked_max_abs: float | None = None
    tokens: int | None = None

    STRICT = True


@dataclass(eq=False)
class DemonstrationFigures(Figures):
    """The attention block's demonstration: position 1's weight on position 3 (largest, smallest over batch and
    heads), how far its row's sum is from 1, the row itself, the mask and the pairs read."""

    weight_1_3_max: float | None = None
    weight_1_3_min: float | None = None
    row_sum_error: float | None = None
    row_1: list[float] | None = None
    mask: str | None = None
    pairs: int | None = None

    STRICT = True


@dataclass(eq=False)
class ServingFigures(Figures):
    """continuous-batching, speculative, prefix-reuse (verify/serving.py, verify/genai_serving.py): per run (a
    request, a drafter's generation) where it came from, its tokens, its first divergence from the run it is held to
    (null: none), the margin there and whether that is a near-tie, its logits' max abs; the runtime's worst, eager's
    floor (its own difference over the same runs), the dtype's rounding at the logits' scale, the allowance they
    give, the near-ties, the protocol; onnxruntime-genai's: its engine or options, and why a part does not apply."""

    runs: list[dict[str, Any]] | None = None
    max_abs: float | None = None
    floor: float | None = None
    rounding: float | None = None
    allowed: float | None = None
    ties: int | None = None
    protocol: str | None = None
    order: str | None = None
    engine: str | None = None

    STRICT = True


# each check's record (the decoder's, the block's, provider against provider); a check not listed (lint's rules, a
# runtime that failed to load, a check this version does not know) keeps its figures in Figures' extra
RECORDS: dict[str, type[Figures]] = {
    "parity": ParityFigures, "finite": FiniteFigures, "causality": CausalityFigures, "kv-consistency": KvFigures,
    "padding": PaddingFigures, "dynamic-shapes": ShapesFigures, "generation": GenerationFigures,
    "quality": QualityFigures, "weights": WeightsFigures, "genai-config": GenaiConfigFigures, "headroom": HeadroomFigures,
    "cache-consistency": CacheFigures, "demonstration": DemonstrationFigures, "cross-provider": DiffFigures,
    "continuous-batching": ServingFigures, "speculative": ServingFigures, "prefix-reuse": ServingFigures}


def figures_of(check: str, figures: Mapping | None, where: str = "figures") -> Figures:
    """``check``'s figures as its record: a dict a check gave or a report held (typed: ArtifactError naming
    ``where``.key on a wrong type), or a record of another class (retyped)."""
    cls = RECORDS.get(check, Figures)
    if type(figures) is cls:
        return figures
    return cls.from_dict(figures.to_dict() if isinstance(figures, Figures) else dict(figures or {}), where)


def _cases(value: Any, where: str) -> list[list[Any]]:
    """Parity's ``by_case`` read back: each entry [batch, seq, past, max abs or null], the sizes integers (within
    int64: any renders) and the figure a float (a crafted entry is named, never added to a number in report.html's
    plot)."""
    rows = parse(value, list[Any], where)
    out = []
    for i, row in enumerate(rows):
        if not isinstance(row, list) or len(row) != 4:
            from mhaexport.core.errors import ArtifactError

            raise ArtifactError(f"{where}[{i}] is not [batch, seq, past, max abs]")
        b, s, p = (parse(v, int, f"{where}[{i}][{j}]") for j, v in enumerate(row[:3]))
        out.append([b, s, p, parse(row[3], float | None, f"{where}[{i}][3]")])
    return out
