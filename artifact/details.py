"""The format-specific details of a manifest entry as typed records (the way Optimum's OnnxConfig declares a model
kind once and every consumer reads it). Torch-free.

On disk they are the entry's keys beside ``format``, ``file``, ``io``, ...: an ONNX entry's ``opset``,
``attention``, ``kv_cache``, ``max_cache``, ``padding``, ``lowering``, ``precision``, ``quantization``, an adopted
file's ``producer`` and ``layout``; a TorchScript entry's ``mode``. In memory::

    OnnxDetails(opset=18, attention="gqa", cache=CacheLayout("shared", max_cache=64, padding="right"),
                lowering=Lowering(...), precision=Precision(...), quantization=Quantization(...) | None,
                producer=None, layout=AdoptedLayout(...) | None, ...)

Reading checks every known key's type (ArtifactError naming the key: ``artifacts.onnx.max_cache is 'x' (str),
expected int or null``); keys this code does not know are kept in ``extra`` and written back. Writing gives back exactly
the JSON that was read: the keys in their order, an explicit ``null`` as ``null``, an absent key absent (a field
left None by a writer is not written). The machinery is :mod:`mhaexport.artifact.record`'s, shared with the reports.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mhaexport.artifact.record import Count, Record
from mhaexport.core.errors import ArtifactError

CONCAT, SHARED = "concat", "shared"  # the cache kinds a protocol drives (runtime/protocol.py)
LEFT, RIGHT = "left", "right"  # the sides a batch of prompts is padded on


def padding_of(cache: str | None) -> str:
    """The side a batch of prompts is padded on for a cache kind: a shared buffer's rows are packed from slot 0
    (right padding, holes kept in the mask); a concat cache takes the contract's left padding. The one place this
    is decided (runtime/protocol.py's protocols and a legacy manifest entry's cache layout read it)."""
    return RIGHT if cache == SHARED else LEFT

# ---- the records ------------------------------------------------------------------------------------------------

@dataclass
class CacheLayout(Record):
    """How the KV cache is held (keys ``kv_cache``, ``max_cache``, ``padding`` of the entry itself)."""

    kind: str | None = field(default=None, metadata={"key": "kv_cache"})  # "concat" | "shared" | "window"; None: concat
    max_cache: Count | None = None  # shared: the length of each layer's one buffer
    padding: str | None = None  # the protocol's: "left" (the contract's) | "right" (rows packed from slot 0)
    # "window": per layer, the slots a decode loop's buffer needs at most (W + slack for a sliding-window layer, whose
    # GroupQueryAttention evicts in place: sliding_window_cache=1), 0 for a full layer (max_cache)
    window_slots: list[int] | None = None

    @property
    def shared(self) -> bool:
        """One preallocated buffer per layer, bound as past and present (GroupQueryAttention writes it in place); a
        window cache is one too, whose windowed layers also take a buffer of their ``window_slots``."""
        return self.kind in ("shared", "window")

    def validate(self, where: str) -> None:
        if self.shared and self.max_cache is None:
            raise ArtifactError(f"{where}: kv_cache 'shared' without max_cache (the buffers' length)")


@dataclass
class ExampleSizes(Record):
    """The sizes the export was traced at (``example_sizes``)."""

    batch: Count
    seq: Count
    past: Count


@dataclass
class Lowering(Record):
    """How attention was lowered (``lowering``) and the lowered graph's self-check against the decomposed one."""

    attention: str | None = None
    fused_nodes: Count | None = None
    kv_cache_in_op: bool | None = None  # the cache goes through the fused op (GroupQueryAttention's past/present)
    softmax_left: Count | None = None
    op_counts: dict[str, int] | None = None
    fusions: dict[str, int] | None = None  # --attention fused: onnxscript's ort_fusions rule -> count
    self_check_max_abs_diff: float | None = None
    self_check_not_run: str | None = None  # why the self-check did not run


@dataclass
class LayerHeadroom(Record):
    """One layer's largest |activation| on eager float32 and what float16 and bfloat16 make of it."""

    layer: str | None = None  # "blocks.3", "tok_emb", "lm_head"
    module: str | None = None  # the module whose output peaked
    peak: float | None = None  # None: not finite in float32
    float16_margin: float | None = None  # 65,504 / peak: below 1 the layer overflows float16
    bfloat16_step: float | None = None  # the distance between two bfloat16 values at the peak


@dataclass
class Headroom(Record):
    """A half-precision export's numerical headroom (``precision.headroom``, models/headroom.py): eager float32's
    per-layer activation peaks on seeded inputs against float16's range and bfloat16's precision."""

    inputs: str | None = None
    peak: float | None = None
    layer: str | None = None
    module: str | None = None
    float16_margin: float | None = None
    bfloat16_step: float | None = None
    float16_overflow: str | None = None  # the first layer past 65,504, or None
    layers: list[LayerHeadroom] | None = None


@dataclass
class Precision(Record):
    """What ONNX Runtime CPU computes in float32 of a float16/bfloat16 graph (``precision``), and the model's
    numerical headroom in that dtype (``headroom``)."""

    dtype: str | None = None
    cast_by_ort_cpu: dict[str, int] | None = None  # op type -> nodes ORT CPU casts to float32; None: not checked
    casts_in_graph: Count | None = None
    ort_cpu_session_error: str | None = None
    not_run: str | None = None
    headroom: Headroom | None = None


@dataclass
class WeightsRead(Record):
    """Bytes of weights one decode step reads: fixed, plus per batch row (gathered table rows)."""

    fixed_bytes: Count
    per_row_bytes: Count


@dataclass
class QuantSource(Record):
    """The float export a quantized folder was made from (``quantization.source``)."""

    folder: str | None = None  # relative to the quantized folder
    onnx_sha256: str | None = None
    fingerprint: str | None = None
    weights_read: WeightsRead | None = None
    weight_bytes: Count | None = None  # the float file's weight bytes (the quantized entry's own are its file's)


# MatMulNBits' accuracy_level that quantizes activations to int8 at run time (the file is then piecewise continuous)
INT8_ACTIVATIONS = 4


@dataclass
class Quantization(Record):
    """A lossy artifact's weight quantization (``quantization``): mhaexport's recipe (``mhaexport quantize``), or
    what an adopted file's quantized ops say (``ops``, ``source`` in words)."""

    weights: str | None = None  # the scheme: "int4" | "int8"
    block_size: Count | None = None
    symmetric: bool | None = None
    accuracy_level: int | None = None  # MatMulNBits' compute type: 4 = int8 activations
    keep_float: list[str] | None = None
    int8_blocks: Count | None = None
    bits: Count | None = None
    label: str | None = None  # "int4 b32 sym acc4 (block 0 int8; float: embeddings)"
    method: str | None = None
    lm_head: str | None = None
    nodes: dict[str, int] | None = None  # quantized and float nodes by kind
    ops: dict[str, int] | None = None  # an adopted file's quantized ops
    weights_read: WeightsRead | None = None
    source: QuantSource | str | None = None  # mhaexport's source folder, or (adopted) where the record came from
    onnxruntime: str | None = None  # the quantizer's version


@dataclass
class AdoptedLayout(Record):
    """How a file another tool exported maps onto the contract (``layout`` of an adopted file's entry;
    :func:`mhaexport.runtime.foreign.detect_layout` finds it): its names, sizes and producer. How its producer holds
    the cache and pads a batch is the entry's own ``kv_cache`` / ``max_cache`` / ``padding`` (:class:`CacheLayout`),
    as for every ONNX file; a layout written by an earlier version (which wrote ``kv_cache`` and ``padding`` here
    too) keeps those keys (``legacy_kv_cache``, ``legacy_padding``), written back as read, and :class:`OnnxDetails`
    reads them only where the entry has none. :class:`mhaexport.runtime.feed.Feed` is the one description of how the
    file is fed."""

    producer: str  # one of runtime.foreign.PRODUCERS
    input_ids: str
    attention_mask: str
    logits: str
    past: list[str]  # 2L file input names, contract order: layer 0 key, layer 0 value, layer 1 key, ...
    present: list[str]  # 2L file output names, same order
    position_ids: str | None = None  # an input fed cumsum(mask) - 1 over the new tokens
    dtype: str = "float32"  # the cache's float dtype
    n_layers: Count = 0
    n_heads: Count = 0
    n_kv_heads: Count = 0
    head_dim: Count = 0
    vocab_size: Count = 0
    max_positions: Count = 0
    notes: list[str] = field(default_factory=list)
    # an earlier version's copy of the entry's cache layout (never written now; kept as read)
    legacy_kv_cache: str | None = field(default=None, metadata={"key": "kv_cache"})
    legacy_padding: str | None = field(default=None, metadata={"key": "padding"})

    WRITE_NONE = ("position_ids",)


@dataclass
class Details(Record):
    """What every format's entry may say: the block exported on its own (``module``, ``mask``, ``weights``), the
    cache layout, the dynamic axes and the sizes it was traced at, the exporter."""

    module: str | None = None  # "attention": the block on its own (`--module attention`)
    mask: str | None = None  # the block's mask mode: "causal" | "none"
    weights: str | None = None  # where the block's weights came from (in words)
    cache: CacheLayout = field(default_factory=CacheLayout, metadata={"flat": True})
    dynamic_axes: list[str] | None = None
    example_sizes: ExampleSizes | None = None
    example_shapes: ExampleSizes | None = None  # the name mhaexport 0.1 wrote
    exporter: str | None = None

    @property
    def traced_sizes(self) -> ExampleSizes | None:
        """The sizes the export was traced at, under either name."""
        return self.example_sizes or self.example_shapes


@dataclass
class OnnxDetails(Details):
    """An ONNX entry's details: opset, how attention is held, precision, quantization, an adopted file's layout."""

    opset: Count | None = None
    attention: str | None = None  # "decomposed" | "onnx" | "ort" | "fused" | "gqa" | "as exported" (adopted)
    lowering: Lowering | None = None
    precision: Precision | None = None
    external_data: bool | None = None
    weight_bytes: Count | None = None
    producer: str | None = None  # an adopted file's producer ("onnxruntime-genai", ...); None: mhaexport's export
    adopted_from: str | None = None  # the adopted file's path
    layout: AdoptedLayout | None = None  # an adopted file's I/O and protocol
    quantization: Quantization | None = None  # set: the weights are lossy

    KEY_ORDER = ("module", "mask", "weights", "producer", "adopted_from", "layout", "opset", "attention", "kv_cache",
                 "max_cache", "padding", "window_slots", "lowering", "precision", "external_data", "weight_bytes", "dynamic_axes",
                 "example_sizes", "exporter", "quantization")

    def validate(self, where: str) -> None:
        """An adopted layout of an earlier version whose entry states no cache of its own: the layout's keys are the
        cache's (a shared buffer's slots: the layout's max_positions)."""
        layout = self.layout
        if self.cache.kind is None and layout is not None and layout.legacy_kv_cache in ("concat", "shared"):
            shared = layout.legacy_kv_cache == "shared"
            padding = layout.legacy_padding if layout.legacy_padding in (LEFT, RIGHT) else None
            self.cache = CacheLayout(layout.legacy_kv_cache, (layout.max_positions or None) if shared else None,
                                     padding or padding_of(layout.legacy_kv_cache))
            self.cache.validate(where)


@dataclass
class TorchScriptDetails(Details):
    """A TorchScript entry's details: how the module was made."""

    mode: str | None = None  # "trace" | "script"

    KEY_ORDER = ("mode", "module", "mask", "weights", "kv_cache", "dynamic_axes", "example_sizes")


@dataclass
class Pt2Details(Details):
    """A torch.export entry's details (``mhaexport pt2``): the program saved with torch.export.save."""

    strict: bool | None = None  # torch.export.export(strict=...): False traces the Python code as it runs

    KEY_ORDER = ("module", "mask", "weights", "kv_cache", "dynamic_axes", "example_sizes", "exporter", "strict")


@dataclass
class AotiDetails(Details):
    """An AOTInductor package's details (``mhaexport pt2 --aoti``): compiled from the folder's pt2 program."""

    device: str | None = None  # "cpu" | "cuda": what the package's kernels run on
    compile_seconds: float | None = None  # aoti_compile_and_package alone (the export before it not counted)
    program_sha256: str | None = None  # the sha256 of the pt2 program it was compiled from
    compiler: str | None = None  # the C++ compiler inductor used, as it reports itself

    KEY_ORDER = ("module", "mask", "weights", "kv_cache", "dynamic_axes", "example_sizes", "exporter", "device",
                 "compile_seconds", "program_sha256", "compiler")


DETAILS: dict[str, type[Details]] = {"onnx": OnnxDetails, "torchscript": TorchScriptDetails, "pt2": Pt2Details,
                                     "aoti": AotiDetails}


def details_from_dict(fmt: str, data: dict, where: str = "details") -> Details:
    """The details record of a ``fmt`` entry (:class:`Details` for a format this code does not know)."""
    return DETAILS.get(fmt, Details).from_dict(data, where)


def onnx_weights(ef) -> tuple[int, bool]:
    """(bytes, mappable) of the ONNX file's weights in export folder ``ef``: its recorded weight bytes (else, and for
    a quantized entry written before it recorded its own — it carried its float source's —, the bytes of every file
    of the entry) and whether they are external data ONNX Runtime can memory-map. What verify's memory plan and a
    generator's choice to map the weights both read."""
    if not ef.has("onnx"):
        return 0, False
    entry = ef.entry("onnx")
    d = entry.details if isinstance(entry.details, OnnxDetails) else None
    files = sum(int(f.get("bytes") or 0) for f in entry.files.values())
    if d is None or not d.weight_bytes or (d.quantization and not _source_weight_bytes(d)):  # none, or its source's
        return files, bool(d and d.external_data)
    return int(d.weight_bytes), bool(d.external_data)


def float_weight_bytes(ef) -> int:
    """The weight bytes of the float model behind ``ef``'s ONNX file: a quantized file's float source's (recorded
    by ``mhaexport quantize``; an older record's entry carried them as its own), else the file's own."""
    if not ef.has("onnx"):
        return 0
    d = ef.entry("onnx").details
    if isinstance(d, OnnxDetails) and d.quantization:
        return int(_source_weight_bytes(d) or d.weight_bytes or onnx_weights(ef)[0])
    return onnx_weights(ef)[0]


def _source_weight_bytes(d: "OnnxDetails") -> int | None:
    src = d.quantization.source if d.quantization else None
    return src.weight_bytes if isinstance(src, QuantSource) and src.weight_bytes else None
