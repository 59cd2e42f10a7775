"""The article's multi-head-attention block on its own, with a fixed I/O (``mhaexport onnx --module attention``).

``AttentionBlock`` wraps the built-in :class:`~mhaexport.models.attention.MultiHeadAttention` (W_q, W_k, W_v, W_o;
grouped-query heads where the config has them) under the module contract of :mod:`mhaexport.core.iospec`::

    block(x, past_key, past_value) -> (output, present_key, present_value, attention_weights)

``mask="causal"`` builds the causal mask at run time from the shapes (with the past offset, ``build_causal_mask``);
``mask="none"`` is bidirectional: every query sees every key. No attention mask input: the block has no padding.

The block's weights are ``blocks.0.attn`` of the built-in decoder of a config: the shipped trained weights where
the preset has them (``small``), the config's seeded initialization otherwise, or a decoder ``--checkpoint``.
No positions inside: RoPE belongs to the decoder, which derives positions from its attention mask.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
from torch import nn

from mhaexport.artifact import ExportFolder
from mhaexport.artifact.source import BuiltinSource
from mhaexport.core.errors import ArtifactError, ConfigError, ModelLoadError
from mhaexport.core.iospec import MASKS, ModuleContract
from mhaexport.models.attention import MultiHeadAttention, build_causal_mask
from mhaexport.models.config import DecoderConfig
from mhaexport.models.loading import LoadedModel, check_same_model, load_model, rebuild_builtin, recorded_checkpoint

BLOCK = "blocks.0.attn"  # where in the built-in decoder the block's weights come from


class AttentionBlock(nn.Module):
    """The article's MHA block: ``attn`` (MultiHeadAttention) and a mask mode, nothing else.

    forward(x (B, T, d_model), past_key, past_value (B, H_kv, P, D); P may be 0) ->
    (output (B, T, d_model), present_key, present_value (B, H_kv, P + T, D), attention_weights (B, H, T, P + T)).
    """

    def __init__(self, d_model: int, n_heads: int, n_kv_heads: int | None = None, mask: str = "causal") -> None:
        super().__init__()
        if mask not in MASKS:
            raise ConfigError(f"--mask {mask!r}: expected one of {', '.join(MASKS)}")
        self.attn = MultiHeadAttention(d_model, n_heads, n_kv_heads)
        self.mask = mask

    def forward(self, x: torch.Tensor, past_key: torch.Tensor, past_value: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        T, P = x.shape[1], past_key.shape[2]
        allowed = build_causal_mask(T, P, device=x.device) if self.mask == "causal" else None  # (1, 1, T, P + T)
        out, (k, v), weights = self.attn.forward_with_weights(x, allowed, (past_key, past_value))
        return out, k, v, weights  # (B, T, d_model), (B, H_kv, S, D) x 2, (B, H, T, S)


def contract_of_block(block: AttentionBlock, max_positions: int) -> ModuleContract:
    """The module contract of ``block``; ``max_positions``: the context length of the model it comes from."""
    a = block.attn
    return ModuleContract(d_model=a.d_model, n_heads=a.n_heads, n_kv_heads=a.n_kv_heads, mask=block.mask,
                          max_positions=max_positions)


def block_from_decoder(decoder: LoadedModel, mask: str = "causal") -> LoadedModel:
    """The block holding ``blocks.0.attn`` of a built-in decoder (its trained or seeded weights), as a LoadedModel
    under the module contract. The record keeps the decoder's source, so verify rebuilds the block the same way."""
    cfg = decoder.config
    if cfg is None:
        raise ModelLoadError(f"--module attention takes the built-in block (--config NAME|FILE.json); {decoder.spec} "
                             "is a user model under the decoder contract")
    block = AttentionBlock(cfg.d_model, cfg.n_heads, cfg.n_kv_heads, mask)
    block.attn.load_state_dict(decoder.module.blocks[0].attn.state_dict())
    block.eval()
    origin = decoder.origin
    if isinstance(origin, BuiltinSource):  # the record says the block was taken from the decoder it names
        origin = dataclasses.replace(origin, block=BLOCK, extra=dict(origin.extra))
    return dataclasses.replace(decoder, module=block, contract=contract_of_block(block, cfg.max_positions),
                               spec=f"{decoder.spec} {BLOCK}", origin=origin, _weights_sha256=None)


def weights_note(loaded: LoadedModel) -> str:
    """Where the block's weights come from, for the manifest: "blocks.0.attn of the built-in decoder: trained
    (shipped:small.pt)" or "...: seeded (config seed 0)"."""
    how = (f"trained ({loaded.checkpoint_label})" if loaded.checkpoint
           else f"seeded (config seed {loaded.config.seed if loaded.config else '?'})")
    return f"{BLOCK} of the built-in decoder: {how}"


def load_block(config: str | DecoderConfig | None = None, checkpoint: str | Path | None = None, *,
               mask: str = "causal", random_weights: bool = False) -> LoadedModel:
    """The attention block of ``config``'s built-in decoder (see :func:`block_from_decoder`)."""
    if mask not in MASKS:
        raise ConfigError(f"--mask {mask!r}: expected one of {', '.join(MASKS)}")
    return block_from_decoder(load_model(config=config, checkpoint=checkpoint, random_weights=random_weights), mask)


def load_recorded_block(folder: ExportFolder, decoder: LoadedModel | None = None) -> LoadedModel:
    """Rebuild the block an ``--module`` export folder was made from, and check it is the same (fingerprint).
    ``decoder``: the built-in decoder to take it from instead of the recorded source (re-pointing with
    ``--config``/``--checkpoint``)."""
    record = folder.model
    contract = record.contract
    if not isinstance(contract, ModuleContract):
        raise ArtifactError(f"{folder.path} holds a decoder, not a module on its own")
    if decoder is None:
        src = record.source
        checkpoint = recorded_checkpoint(folder, src, record, "this block", "--config")
        try:
            if not isinstance(src, BuiltinSource):
                raise ArtifactError(f"the manifest's model source {src.to_dict()!r} names no way to rebuild the block")
            decoder = rebuild_builtin(src, record, checkpoint, record.spec.removesuffix(f" {BLOCK}"))
        except ModelLoadError as e:
            raise ArtifactError(f"cannot rebuild the block of {folder.path} ({record.spec}): {e}; re-point it with "
                                "--config/--checkpoint") from None
    loaded = block_from_decoder(decoder, contract.mask)
    check_same_model(loaded, record)
    return loaded
