"""DecoderConfig and its presets, looked up by name or read from a JSON file. No torch here."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from mhaexport.errors import ConfigError


@dataclass(frozen=True)
class DecoderConfig:
    vocab_size: int = 256  # byte-level by default: any text encodes without a tokenizer
    d_model: int = 128  # width of the residual stream
    n_heads: int = 4  # h: each head gets d_k = d_model / h
    n_layers: int = 4  # number of Pre-LN decoder blocks
    d_ff: int = 512  # hidden width of each block's feed-forward network
    max_positions: int = 256  # learned position embeddings: the longest past + seq the model accepts
    tie_embeddings: bool = True  # the LM head reuses the token embedding matrix
    layer_norm_eps: float = 1e-5
    seed: int = 0  # seeds the deterministic default weights
    name: str = "custom"  # preset name, or "custom" for a JSON file

    def __post_init__(self) -> None:
        for f in ("vocab_size", "d_model", "n_heads", "n_layers", "d_ff", "max_positions"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ConfigError(f"config field {f!r} must be a positive integer, got {v!r}")
        if self.d_model % self.n_heads != 0:
            raise ConfigError(
                f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}: "
                f"each head needs d_model / n_heads dimensions"
            )

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

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
            raise ConfigError(f"config file {spec} does not exist")
        try:
            data = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError(f"cannot read config file {spec}: {e}") from None
        except json.JSONDecodeError as e:
            raise ConfigError(f"config file {spec} is not valid JSON: {e}") from None
        return DecoderConfig.from_dict(data, name=path.stem)
    raise ConfigError(f"unknown config {spec!r}: use a preset ({', '.join(PRESETS)}) or a .json file")
