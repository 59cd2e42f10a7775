"""The one source of truth for ONNX I/O names and dynamic axes.

Used by the exporter, the runners (mhaexport.runners) and the torch-free deploy runtime (so: no torch here).
Names follow the ONNX Runtime GenAI / Optimum convention.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import ClassVar

import numpy as np

BATCH = "batch_size"
SEQ = "sequence_length"
PAST = "past_sequence_length"
TOTAL = "total_sequence_length"
MAX_CACHE = "max_cache_length"  # a shared KV cache's buffer length (past and present are one buffer)
KV_CACHES = ("concat", "shared", "window")  # present = concat(past, new) | one preallocated buffer written in place
# | "window": the shared buffer, its sliding-window layers window-sized (GroupQueryAttention sliding_window_cache=1)
WINDOW_SLACK = 16  # a window-sized buffer holds W + this many slots (onnxruntime-genai's CPU default cache_slack)

INPUT_IDS = "input_ids"
ATTENTION_MASK = "attention_mask"
LOGITS = "logits"
OUTPUT_KINDS = ("logits", "present")  # the outputs a per-output tolerance and its statistics are keyed by

# Example sizes every exporter traces with: all >= 2 and pairwise distinct, so torch.export neither specializes a
# dynamic dim to 0/1 nor mistakes one axis for another. Verify's dynamic-shapes check runs at other sizes.
EXAMPLE_BATCH, EXAMPLE_SEQ, EXAMPLE_PAST = 2, 3, 5


def past_names(layer: int) -> tuple[str, str]:
    return f"past_key_values.{layer}.key", f"past_key_values.{layer}.value"


def present_names(layer: int) -> tuple[str, str]:
    return f"present.{layer}.key", f"present.{layer}.value"


def input_names(n_layers: int) -> list[str]:
    names = [INPUT_IDS, ATTENTION_MASK]
    for i in range(n_layers):
        names.extend(past_names(i))
    return names


def output_names(n_layers: int) -> list[str]:
    names = [LOGITS]
    for i in range(n_layers):
        names.extend(present_names(i))
    return names


def dynamic_input_axes(n_layers: int) -> dict[str, dict[int, str]]:
    """Every input's dynamic axes: {input name: {axis: dim name}} (exporter, verify and runtime read this)."""
    axes = {INPUT_IDS: {0: BATCH, 1: SEQ}, ATTENTION_MASK: {0: BATCH, 1: TOTAL}}
    for i in range(n_layers):
        for name in past_names(i):
            axes[name] = {0: BATCH, 2: PAST}
    return axes


def io_schema(contract: ModelContract, dtype: str = "float32", *, seq_dynamic: bool = True,
              sizes: tuple[int, int] | None = None, kv_cache: str = "concat") -> dict:
    """Names, element types and symbolic shapes of every input and output (recorded per artifact in the manifest).
    A static export (``seq_dynamic=False``) has its (sequence, past) ``sizes`` in place of the names; a shared
    cache (``kv_cache="shared"``) has past and present of the buffer's length, ``max_cache_length``."""
    seq, past, total = SEQ, PAST, TOTAL
    if not seq_dynamic and sizes is not None:
        seq, past, total = sizes[0], sizes[1], sizes[0] + sizes[1]
    n_layers, vocab_size = contract.n_layers, contract.vocab_size
    kv_past = [BATCH, contract.n_kv_heads, MAX_CACHE if kv_cache == "shared" else past, contract.head_dim]
    kv_present = [BATCH, contract.n_kv_heads, MAX_CACHE if kv_cache == "shared" else total, contract.head_dim]
    inputs = {INPUT_IDS: {"dtype": "int64", "shape": [BATCH, seq]},
              ATTENTION_MASK: {"dtype": "int64", "shape": [BATCH, total]}}
    outputs = {LOGITS: {"dtype": dtype, "shape": [BATCH, seq, vocab_size]}}
    for i in range(n_layers):
        for name in past_names(i):
            inputs[name] = {"dtype": dtype, "shape": list(kv_past)}
        for name in present_names(i):
            outputs[name] = {"dtype": dtype, "shape": list(kv_present)}
    return {"inputs": inputs, "outputs": outputs}


@dataclass(frozen=True)
class ModelContract:
    """The ints every model under the decoder contract exposes on ``model.config``.

    ``n_kv_heads`` (optional, default ``n_heads``): grouped-query attention, fewer key/value heads than query heads;
    ``n_heads`` must be a multiple of it. The KV cache (past and present) is [batch, n_kv_heads, length, head_dim].
    """

    n_layers: int
    n_heads: int
    head_dim: int
    vocab_size: int
    max_positions: int
    n_kv_heads: int | None = None  # None: n_heads (multi-head attention)
    # per layer, the sliding window W (query position p sees key positions p-W+1..p, counted on each row's own
    # tokens) or 0 for full causal attention; None: every layer full (the article's decoder). A model exposes it as
    # ``model.config.layer_windows`` (a sequence of n_layers ints).
    windows: tuple[int, ...] | None = None
    # what acts on the scores, each off (None/False) for the article's decoder and recorded only when set; a model
    # exposes them under the same names on ``model.config``:
    attn_softcap: float | None = None  # scores become attn_softcap * tanh(scores / attn_softcap) before the mask
    final_softcap: float | None = None  # logits become final_softcap * tanh(logits / final_softcap)
    attn_scale: float | None = None  # the score scale replacing 1/sqrt(head_dim) (Gemma: query_pre_attn_scalar**-0.5)
    attn_sinks: bool = False  # a learned per-head sink logit joins every softmax denominator (gpt-oss)

    FIELDS: ClassVar[tuple[str, ...]] = ("n_layers", "n_heads", "head_dim", "vocab_size", "max_positions")
    OPTIONAL: ClassVar[tuple[str, ...]] = ("n_kv_heads",)
    SCORE_FIELDS: ClassVar[tuple[str, ...]] = ("attn_softcap", "final_softcap", "attn_scale")

    def __post_init__(self) -> None:
        if self.n_kv_heads is None:
            object.__setattr__(self, "n_kv_heads", self.n_heads)
        if self.n_kv_heads < 1 or self.n_heads % self.n_kv_heads:
            from mhaexport.core.errors import ConfigError

            raise ConfigError(f"n_heads={self.n_heads} is not a multiple of n_kv_heads={self.n_kv_heads}: grouped-"
                              "query attention shares each key/value head among n_heads / n_kv_heads query heads")
        if self.windows is not None:
            from mhaexport.core.errors import ConfigError

            w = tuple(self.windows)
            if len(w) != self.n_layers or any(not isinstance(x, int) or isinstance(x, bool) or x < 0 for x in w):
                raise ConfigError(f"windows must be {self.n_layers} non-negative ints (0: full attention), got "
                                  f"{list(w)!r}"[:200])
            object.__setattr__(self, "windows", w if any(w) else None)
        for name in ("attn_softcap", "final_softcap", "attn_scale"):
            v = getattr(self, name)
            if v is not None:
                if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                    from mhaexport.core.errors import ConfigError

                    raise ConfigError(f"{name} must be a positive finite number or absent, got {v!r}"[:200])
                object.__setattr__(self, name, float(v))
        object.__setattr__(self, "attn_sinks", bool(self.attn_sinks))

    @property
    def windowed(self) -> bool:
        """True when some layer attends to a sliding window rather than every earlier token."""
        return self.windows is not None

    def window(self, layer: int) -> int:
        """Layer ``layer``'s sliding window, 0 for full causal attention."""
        return self.windows[layer] if self.windows is not None else 0

    @property
    def score_features(self) -> dict:
        """What acts on the attention scores or logits besides the causal mask, by contract field name (only those
        set): the features every lowering must honour or refuse."""
        out = {name: getattr(self, name) for name in self.SCORE_FIELDS if getattr(self, name) is not None}
        if self.attn_sinks:
            out["attn_sinks"] = True
        return out

    @property
    def grouped(self) -> bool:
        """True for grouped-query attention (fewer key/value heads than query heads)."""
        return self.n_kv_heads != self.n_heads

    def to_dict(self) -> dict:
        """The fields; ``n_kv_heads`` only when it differs from ``n_heads`` (so an MHA model's record is unchanged)."""
        out = {f: getattr(self, f) for f in self.FIELDS}
        if self.grouped:
            out["n_kv_heads"] = self.n_kv_heads
        if self.windows is not None:
            out["windows"] = list(self.windows)
        out.update(self.score_features)
        return out

    @classmethod
    def from_dict(cls, data: dict) -> ModelContract:
        given = {f.name: data[f.name] for f in fields(cls) if data.get(f.name) is not None}  # null: the default
        given.update({f: int(data[f]) for f in cls.FIELDS + tuple(n for n in cls.OPTIONAL if n in given)})
        if "windows" in given:
            given["windows"] = tuple(given["windows"])
        given["attn_sinks"] = bool(given.pop("attn_sinks", False))
        return cls(**given)


KVPairs = tuple  # n_layers (key, value) pairs of arrays, each (B, H_kv, past, D)


def dummy_inputs(contract: ModelContract, batch: int, seq: int, past: int, *, seed: int = 0,
                 pad: list[int] | tuple[int, ...] | None = None,
                 dtype: np.dtype | type = np.float32) -> tuple[np.ndarray, np.ndarray, KVPairs]:
    """The one builder of seeded inputs in the contract's layout, as numpy: (input_ids (B, T) int64,
    attention_mask (B, past + T) int64 with ``pad[b]`` leading zeros in row b, past_key_values: n_layers pairs of
    (B, H_kv, past, D)). The exporter's example inputs, verify's sweep, bisect and the self-check all use it."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, contract.vocab_size, (batch, seq), dtype=np.int64)  # (B, T)
    mask = np.ones((batch, past + seq), dtype=np.int64)  # (B, past + T)
    for b, p in enumerate(pad or ()):
        mask[b, :p] = 0
    shape = (batch, contract.n_kv_heads, past, contract.head_dim)  # (B, H_kv, past, D)
    cache = tuple((rng.standard_normal(shape).astype(dtype), rng.standard_normal(shape).astype(dtype))
                  for _ in range(contract.n_layers))
    return ids, mask, cache


# ---- the attention block on its own (``mhaexport onnx --module attention``): a second, small contract ----------------
#
# inputs  x           float [batch, sequence_length, d_model]
#         past_key    float [batch, n_kv_heads, past_sequence_length, head_dim]   (length 0 allowed)
#         past_value  float [batch, n_kv_heads, past_sequence_length, head_dim]
# outputs output             float [batch, sequence_length, d_model]
#         present_key        float [batch, n_kv_heads, total_sequence_length, head_dim]
#         present_value      float [batch, n_kv_heads, total_sequence_length, head_dim]
#         attention_weights  float [batch, n_heads, sequence_length, total_sequence_length]

MODULE_ATTENTION = "attention"
MODULES = (MODULE_ATTENTION,)
MASKS = ("causal", "none")  # causal: built at run time from the shapes (past offset); none: bidirectional

X = "x"
PAST_KEY, PAST_VALUE = "past_key", "past_value"
OUTPUT = "output"
PRESENT_KEY, PRESENT_VALUE = "present_key", "present_value"
ATTENTION_WEIGHTS = "attention_weights"
MODULE_INPUTS = (X, PAST_KEY, PAST_VALUE)
MODULE_OUTPUTS = (OUTPUT, PRESENT_KEY, PRESENT_VALUE, ATTENTION_WEIGHTS)


def module_dynamic_input_axes() -> dict[str, dict[int, str]]:
    """The block's dynamic input axes: {input name: {axis: dim name}} (the exporter's Dims and its fixed-axis
    refusal, verify's baked-axis report)."""
    return {X: {0: BATCH, 1: SEQ}, PAST_KEY: {0: BATCH, 2: PAST}, PAST_VALUE: {0: BATCH, 2: PAST}}


def module_output_axes() -> dict[str, dict[int, str]]:
    """The block's output axes that grow with the cache: named ``total_sequence_length`` in the graph."""
    return {PRESENT_KEY: {2: TOTAL}, PRESENT_VALUE: {2: TOTAL}, ATTENTION_WEIGHTS: {3: TOTAL}}


@dataclass(frozen=True)
class ModuleContract:
    """What the attention block on its own takes and gives (``kind`` "attention"): its widths and its mask.

    Recorded as the model record's contract of an ``--module attention`` export (``{"kind": "attention", ...}``;
    a decoder's contract has no ``kind``). ``max_positions`` is the context length of the model the block was
    taken from: the longest past + seq verify sweeps; the block itself has no position limit.
    """

    d_model: int
    n_heads: int
    mask: str  # "causal" | "none"
    max_positions: int
    n_kv_heads: int | None = None  # None: n_heads (multi-head attention)
    kind: str = MODULE_ATTENTION

    FIELDS: ClassVar[tuple[str, ...]] = ("d_model", "n_heads", "mask", "max_positions")
    # the block on its own has the decoder's mask or none: no sliding window, no score features (the decoder
    # contract's names, so the sweep and the window figures read either contract)
    windows: ClassVar[None] = None
    windowed: ClassVar[bool] = False
    score_features: ClassVar[dict] = {}

    def __post_init__(self) -> None:
        from mhaexport.core.errors import ConfigError

        if self.n_kv_heads is None:
            object.__setattr__(self, "n_kv_heads", self.n_heads)
        if self.kind not in MODULES:
            raise ConfigError(f"module {self.kind!r}: expected one of {', '.join(MODULES)}")
        if self.mask not in MASKS:
            raise ConfigError(f"--mask {self.mask!r}: expected one of {', '.join(MASKS)}")
        if self.d_model % self.n_heads or self.n_kv_heads < 1 or self.n_heads % self.n_kv_heads:
            raise ConfigError(f"d_model={self.d_model}, n_heads={self.n_heads}, n_kv_heads={self.n_kv_heads}: "
                              "d_model must split into n_heads heads, each key/value head serving n_heads / "
                              "n_kv_heads of them")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def causal(self) -> bool:
        return self.mask == "causal"

    @property
    def grouped(self) -> bool:
        return self.n_kv_heads != self.n_heads

    def to_dict(self) -> dict:
        return {"kind": self.kind, "d_model": self.d_model, "n_heads": self.n_heads, "n_kv_heads": self.n_kv_heads,
                "head_dim": self.head_dim, "mask": self.mask, "max_positions": self.max_positions}

    @classmethod
    def from_dict(cls, data: dict) -> ModuleContract:
        return cls(d_model=int(data["d_model"]), n_heads=int(data["n_heads"]), mask=str(data["mask"]),
                   max_positions=int(data["max_positions"]), n_kv_heads=int(data["n_kv_heads"]),
                   kind=str(data["kind"]))


Contract = ModelContract | ModuleContract  # what an export folder's model record holds


def contract_from_dict(data: dict) -> Contract:
    """A recorded contract: a module's (it has ``kind``) or the decoder's."""
    return ModuleContract.from_dict(data) if "kind" in data else ModelContract.from_dict(data)


def module_io_schema(contract: ModuleContract, dtype: str = "float32") -> dict:
    """Names, element types and symbolic shapes of the block's inputs and outputs (per artifact in the manifest)."""
    kv_past = [BATCH, contract.n_kv_heads, PAST, contract.head_dim]
    kv_present = [BATCH, contract.n_kv_heads, TOTAL, contract.head_dim]
    return {"inputs": {X: {"dtype": dtype, "shape": [BATCH, SEQ, contract.d_model]},
                       PAST_KEY: {"dtype": dtype, "shape": list(kv_past)},
                       PAST_VALUE: {"dtype": dtype, "shape": list(kv_past)}},
            "outputs": {OUTPUT: {"dtype": dtype, "shape": [BATCH, SEQ, contract.d_model]},
                        PRESENT_KEY: {"dtype": dtype, "shape": list(kv_present)},
                        PRESENT_VALUE: {"dtype": dtype, "shape": list(kv_present)},
                        ATTENTION_WEIGHTS: {"dtype": dtype, "shape": [BATCH, contract.n_heads, SEQ, TOTAL]}}}


def dummy_module_inputs(contract: ModuleContract, batch: int, seq: int, past: int, *, seed: int = 0,
                        dtype: np.dtype | type = np.float32) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Seeded inputs of the block, as numpy: x (B, T, d_model), past_key and past_value (B, H_kv, past, D)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch, seq, contract.d_model)).astype(dtype)  # (B, T, d_model)
    shape = (batch, contract.n_kv_heads, past, contract.head_dim)  # (B, H_kv, past, D)
    return x, rng.standard_normal(shape).astype(dtype), rng.standard_normal(shape).astype(dtype)


def make_feed(input_ids, attention_mask, past_key_values) -> dict:
    """Name the contract's inputs for an ONNX Runtime session: arrays in, {name: array} out (no conversion)."""
    feed = {INPUT_IDS: input_ids, ATTENTION_MASK: attention_mask}
    for i, (k, v) in enumerate(past_key_values):
        kn, vn = past_names(i)
        feed[kn], feed[vn] = k, v
    return feed


def split_outputs(outputs: list) -> tuple:
    """ONNX Runtime's outputs in output_names() order -> (logits, ((key, value), ...))."""
    logits, rest = outputs[0], outputs[1:]
    return logits, tuple((rest[2 * i], rest[2 * i + 1]) for i in range(len(rest) // 2))
