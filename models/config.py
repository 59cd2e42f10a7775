"""DecoderConfig and its presets, looked up by name or read from a JSON file. No torch here."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from mhaexport.errors import ConfigError
from mhaexport.iospec import EXAMPLE_PAST, EXAMPLE_SEQ


NORMS = ("layernorm", "rmsnorm")
MLPS = ("gelu", "swiglu")
POSITIONS = ("learned", "rope")
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
        if self.parameters > MAX_PARAMETERS:
            raise ConfigError(f"this config has ~{self.parameters:.2e} parameters, above the most this toolkit "
                              f"builds ({MAX_PARAMETERS:.2e}): check its sizes")

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
        from mhaexport.untrusted import load_json

        data = load_json(path, f"config file {spec}")
        return DecoderConfig.from_dict(data, name=path.stem)
    raise ConfigError(f"unknown config {spec!r}: use a preset ({', '.join(PRESETS)}) or a .json file")
