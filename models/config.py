"""DecoderConfig and its presets, looked up by name or read from a JSON file. No torch here."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from mhaexport.core.errors import ConfigError
from mhaexport.core.iospec import EXAMPLE_PAST, EXAMPLE_SEQ


NORMS = ("layernorm", "rmsnorm")
MLPS = ("gelu", "swiglu")
POSITIONS = ("learned", "rope")
SLIDING, FULL = "sliding_attention", "full_attention"  # transformers' layer_types
LAYER_TYPES = (SLIDING, FULL)
MIN_POSITIONS = EXAMPLE_SEQ + EXAMPLE_PAST  # the example the export traces must fit
# Upper bounds of the integer fields: far above any model this toolkit builds (Llama-3-405B: d_model 16384, 126
# layers, d_ff 53248, vocab 128256, 131072 positions), low enough that a typo (1e12) is one line, not an allocation
# that takes the machine down
MAX_FIELD = {"vocab_size": 1 << 22, "d_model": 1 << 16, "n_heads": 1 << 10, "n_layers": 1 << 10, "d_ff": 1 << 18,
             "max_positions": 1 << 22, "n_kv_heads": 1 << 10, "seed": (1 << 32) - 1}
MAX_PARAMETERS = 1 << 36  # ~69e9 parameters (275 GB of float32): the built-in model is built in memory


@dataclass(frozen=True)
class DecoderConfig:
    vocab_size: int = 256  # byte-level by default: any text encodes without a tokenizer
    d_model: int = 128  # width of the residual stream
    n_heads: int = 4  # h: each head gets d_k = d_model / h
    n_layers: int = 4  # number of Pre-LN decoder blocks
    d_ff: int = 512  # hidden width of each block's feed-forward network
    max_positions: int = 256  # the longest past + seq the model accepts (learned positions: the table's size)
    tie_embeddings: bool = True  # the LM head reuses the token embedding matrix
    layer_norm_eps: float = 1e-5
    seed: int = 0  # seeds the deterministic default weights
    name: str = "custom"  # preset name, or "custom" for a JSON file
    n_kv_heads: int | None = None  # grouped-query attention: key/value heads (None: n_heads, the article's MHA)
    norm: str = "layernorm"  # "layernorm" (the article's) or "rmsnorm" (Llama's)
    mlp: str = "gelu"  # "gelu": Linear-GELU-Linear (the article's) or "swiglu": W2(silu(W1 x) * W3 x) (Llama's)
    positions: str = "learned"  # "learned" position embeddings (the article's) or "rope" (rotary, Llama's)
    rope_theta: float = 10000.0  # RoPE's base
    # the masks and score features of today's decoders (issue 37), each off by default (the article's decoder):
    sliding_window: int | None = None  # W: a local layer's query at position p sees positions p-W+1..p (Mistral's)
    layer_types: tuple[str, ...] | None = None  # per layer "sliding_attention" | "full_attention" (transformers'
    #                                             names); None: every layer sliding when a window is set
    attn_softcap: float | None = None  # scores -> c * tanh(scores / c) before the mask (Gemma 2's)
    final_softcap: float | None = None  # logits -> c * tanh(logits / c) (Gemma 2's final_logit_softcapping)
    query_scale: float | None = None  # the score scale replacing 1/sqrt(head_dim) (Gemma: query_pre_attn_scalar**-0.5)
    rope_local_theta: float | None = None  # RoPE's base on sliding layers (Gemma 3's rope_local_base_freq)
    attn_sinks: bool = False  # a learned sink logit per head joins every softmax denominator (gpt-oss's)

    def __post_init__(self) -> None:
        for f in ("vocab_size", "d_model", "n_heads", "n_layers", "d_ff", "max_positions"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ConfigError(f"config field {f!r} must be a positive integer, got {v!r}")
            if v > MAX_FIELD[f]:
                raise ConfigError(f"config field {f!r} is {v}, above the most this toolkit builds ({MAX_FIELD[f]})")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool) or not 0 <= self.seed <= MAX_FIELD["seed"]:
            raise ConfigError(f"config field 'seed' must be an integer from 0 to {MAX_FIELD['seed']}, got "
                              f"{self.seed!r}")
        for f in ("layer_norm_eps", "rope_theta"):
            v = getattr(self, f)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not 0 < v < float("inf"):
                raise ConfigError(f"config field {f!r} must be a finite positive number, got {v!r}")
        if not isinstance(self.tie_embeddings, bool):
            raise ConfigError(f"config field 'tie_embeddings' must be true or false, got {self.tie_embeddings!r}")
        if not isinstance(self.name, str):
            raise ConfigError(f"config field 'name' must be a string, got {self.name!r}")
        if self.max_positions < MIN_POSITIONS:
            raise ConfigError(f"max_positions={self.max_positions}: at least {MIN_POSITIONS} (the export traces "
                              f"{EXAMPLE_SEQ} new tokens after a cache of {EXAMPLE_PAST})")
        if self.d_model % self.n_heads != 0:
            raise ConfigError(
                f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}: "
                f"each head needs d_model / n_heads dimensions"
            )
        kv = self.n_kv_heads
        if kv is not None and (not isinstance(kv, int) or isinstance(kv, bool) or kv < 1 or self.n_heads % kv):
            raise ConfigError(f"n_kv_heads={kv!r} must be a positive divisor of n_heads={self.n_heads}: each "
                              "key/value head serves n_heads / n_kv_heads query heads")
        for f, allowed in (("norm", NORMS), ("mlp", MLPS), ("positions", POSITIONS)):
            if getattr(self, f) not in allowed:
                raise ConfigError(f"config field {f!r} must be one of {', '.join(allowed)}, got {getattr(self, f)!r}")
        if self.positions == "rope" and self.head_dim % 2:
            raise ConfigError(f"positions='rope' needs an even head_dim, got {self.head_dim}")
        self._check_masks()
        if self.parameters > MAX_PARAMETERS:
            raise ConfigError(f"this config has ~{self.parameters:.2e} parameters, above the most this toolkit "
                              f"builds ({MAX_PARAMETERS:.2e}): check its sizes")

    def _check_masks(self) -> None:
        w = self.sliding_window
        if w is not None and (not isinstance(w, int) or isinstance(w, bool) or not 1 <= w <= self.max_positions):
            raise ConfigError(f"config field 'sliding_window' must be an integer from 1 to max_positions="
                              f"{self.max_positions}, or null, got {w!r}")
        if self.layer_types is not None:
            types = self.layer_types
            if not isinstance(types, (list, tuple)) or len(types) != self.n_layers or any(
                    t not in LAYER_TYPES for t in types):
                raise ConfigError(f"config field 'layer_types' must list {self.n_layers} of "
                                  f"{', '.join(LAYER_TYPES)} (one per layer), got {types!r}"[:300])
            object.__setattr__(self, "layer_types", tuple(types))
            if SLIDING in types and w is None:
                raise ConfigError("config field 'layer_types' names sliding_attention layers but 'sliding_window' "
                                  "is not set")
        for f in ("attn_softcap", "final_softcap", "query_scale", "rope_local_theta"):
            v = getattr(self, f)
            if v is not None and (not isinstance(v, (int, float)) or isinstance(v, bool) or not 0 < v < float("inf")):
                raise ConfigError(f"config field {f!r} must be a finite positive number or null, got {v!r}")
        if not isinstance(self.attn_sinks, bool):
            raise ConfigError(f"config field 'attn_sinks' must be true or false, got {self.attn_sinks!r}")

    @property
    def layer_windows(self) -> tuple[int, ...] | None:
        """Per layer its sliding window, 0 for full attention; None when no layer has one (the contract's
        ``windows``, read by ``contract_of``)."""
        if self.sliding_window is None:
            return None
        types = self.layer_types or (SLIDING,) * self.n_layers
        windows = tuple(self.sliding_window if t == SLIDING else 0 for t in types)
        return windows if any(windows) else None

    @property
    def attn_scale(self) -> float | None:
        """The contract's name for ``query_scale``."""
        return self.query_scale

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def parameters(self) -> int:
        """About how many weights the model has (embeddings, blocks, an untied LM head): for the size limit."""
        d, kv = self.d_model, (self.n_kv_heads or self.n_heads) * self.head_dim
        block = 2 * d * d + 2 * d * kv + (3 if self.mlp == "swiglu" else 2) * d * self.d_ff
        table = self.max_positions * d if self.positions == "learned" else 0
        head = 0 if self.tie_embeddings else self.vocab_size * d
        return self.vocab_size * d + table + self.n_layers * block + head

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict, name: str = "custom") -> DecoderConfig:
        if not isinstance(data, dict):
            raise ConfigError(f"a config must be a JSON object, got {type(data).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"unknown config field(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        data = dict(data)
        data.setdefault("name", name)
        return cls(**data)


PRESETS: dict[str, DecoderConfig] = {
    # tests: exports and verifies in seconds
    "tiny": DecoderConfig(vocab_size=256, d_model=64, n_heads=4, n_layers=2, d_ff=256, max_positions=128,
                          name="tiny"),
    # the default model: quick to export, big enough to learn bytes of text
    "small": DecoderConfig(vocab_size=256, d_model=128, n_heads=4, n_layers=4, d_ff=512, max_positions=256,
                           name="small"),
    # GPT-2-small-like dims, used for timing everywhere
    "bench": DecoderConfig(vocab_size=32000, d_model=512, n_heads=8, n_layers=8, d_ff=2048, max_positions=1024,
                           name="bench"),
    # shaped like a small Llama: grouped-query attention (4 query heads share 2 key/value heads), RoPE, RMSNorm,
    # SwiGLU, untied LM head; seeded random weights
    "llama": DecoderConfig(vocab_size=256, d_model=128, n_heads=4, n_kv_heads=2, n_layers=4, d_ff=352,
                           max_positions=256, tie_embeddings=False, layer_norm_eps=1e-6, norm="rmsnorm",
                           mlp="swiglu", positions="rope", name="llama"),
    # tests: the Llama shape at the tiny preset's size
    "tiny-llama": DecoderConfig(vocab_size=256, d_model=64, n_heads=4, n_kv_heads=2, n_layers=2, d_ff=176,
                                max_positions=128, tie_embeddings=False, layer_norm_eps=1e-6, norm="rmsnorm",
                                mlp="swiglu", positions="rope", name="tiny-llama"),
    # issue 37's masks at the tiny size, windows far shorter than max_positions (the sweep crosses them):
    # Mistral-like: every layer slides over 8 positions
    "tiny-window": DecoderConfig(vocab_size=256, d_model=64, n_heads=4, n_kv_heads=2, n_layers=2, d_ff=176,
                                 max_positions=128, tie_embeddings=False, layer_norm_eps=1e-6, norm="rmsnorm",
                                 mlp="swiglu", positions="rope", sliding_window=8, name="tiny-window"),
    # Gemma-2/3-like: local and global layers, attention and final softcaps, a query scale, a local RoPE base. The
    # caps are far below Gemma's (50, 30) so that they bite on seeded weights (scores ~0.02, logits ~1): a file that
    # drops one differs from eager by more than verify's tolerance
    "tiny-gemma": DecoderConfig(vocab_size=256, d_model=64, n_heads=4, n_kv_heads=2, n_layers=2, d_ff=176,
                                max_positions=128, tie_embeddings=True, layer_norm_eps=1e-6, norm="rmsnorm",
                                mlp="swiglu", positions="rope", rope_theta=1000000.0, sliding_window=8,
                                layer_types=(SLIDING, FULL), attn_softcap=0.02, final_softcap=1.0,
                                query_scale=0.2, rope_local_theta=10000.0, name="tiny-gemma"),
    # gpt-oss-like: sliding and full layers alternating, a learned sink per head
    "tiny-sinks": DecoderConfig(vocab_size=256, d_model=64, n_heads=4, n_kv_heads=2, n_layers=2, d_ff=176,
                                max_positions=128, tie_embeddings=False, layer_norm_eps=1e-6, norm="rmsnorm",
                                mlp="swiglu", positions="rope", sliding_window=8, layer_types=(SLIDING, FULL),
                                attn_sinks=True, name="tiny-sinks"),
}
DEFAULT_PRESET = "small"


def load_config(spec: str | None) -> DecoderConfig:
    """A preset name, or the path of a JSON file holding DecoderConfig fields; None means the default preset."""
    if spec is None:
        return PRESETS[DEFAULT_PRESET]
    if spec in PRESETS:
        return PRESETS[spec]
    path = Path(spec)
    if spec.endswith(".json") or path.exists():
        if not path.is_file():
            raise ConfigError(f"config file {spec} {'is not a regular file' if path.exists() else 'does not exist'}")
        from mhaexport.core.untrusted import load_json

        data = load_json(path, f"config file {spec}")
        return DecoderConfig.from_dict(data, name=path.stem)
    raise ConfigError(f"unknown config {spec!r}: use a preset ({', '.join(PRESETS)}) or a .json file")
