"""The built-in decoder (config, attention, blocks) and loading of user models.

Importing this package imports torch.
"""

from __future__ import annotations

from mhaexport.models.attention import MultiHeadAttention, build_causal_mask
from mhaexport.models.config import PRESETS, DecoderConfig, load_config
from mhaexport.models.decoder import DecoderBlock, DecoderLM

__all__ = [
    "PRESETS",
    "DecoderBlock",
    "DecoderConfig",
    "DecoderLM",
    "MultiHeadAttention",
    "build_causal_mask",
    "load_config",
]
