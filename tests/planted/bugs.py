"""The article's classic causal-attention bugs, each planted into a copy of the built-in decoder (tiny preset).

Every factory follows the decoder contract and is deterministic (weights from the config's seed), so an export
folder made from it can be verified later by re-running the factory. Each bug is the only difference from the
built-in ``DecoderLM``; the docstring says which check is expected to catch it.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import nn

from mhaexport.models.attention import MultiHeadAttention, build_causal_mask
from mhaexport.models.config import PRESETS
from mhaexport.models.decoder import DecoderLM, position_ids_from_mask

CONFIG = dataclasses.replace(PRESETS["tiny"], name="planted")


class _Attention(MultiHeadAttention):
    """MultiHeadAttention; each bug overrides ``attend``, the masking step."""


def _with_attention(model: DecoderLM, cls: type[_Attention]) -> DecoderLM:
    """Swap every block's attention for ``cls``, keeping the seeded weights."""
    for block in model.blocks:
        new = cls(model.config.d_model, model.config.n_heads)
        new.load_state_dict(block.attn.state_dict())
        block.attn = new
    return model.eval()


class _ZeroFill(_Attention):
    def attend(self, scores, allowed):
        return F.softmax(scores.masked_fill(~allowed, 0.0), dim=-1)  # BUG: 0 is not -inf: future keys get weight


class _NegInfFill(_Attention):
    def attend(self, scores, allowed):
        return F.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)  # BUG: an all-masked row is NaN


class _AfterSoftmax(_Attention):
    def attend(self, scores, allowed):
        return F.softmax(scores, dim=-1).masked_fill(~allowed, 0.0)  # BUG: future keys still in the denominator


class _NoMask(_Attention):
    def attend(self, scores, allowed):
        return F.softmax(scores, dim=-1)  # BUG: no mask at all


class _NoPastOffset(DecoderLM):
    def forward(self, input_ids, attention_mask, past_key_values=None):
        B, T = input_ids.shape
        past_len = past_key_values[0][0].shape[2] if past_key_values else 0
        q_pos = torch.arange(T)  # BUG: should be arange(T) + past_len: row t sees keys 0..t, not 0..past+t
        k_pos = torch.arange(past_len + T)
        allowed = (k_pos[None, :] <= q_pos[:, None])[None, None] & attention_mask[:, None, None, :].bool()
        return self._run(input_ids, attention_mask, past_key_values, allowed,
                         position_ids_from_mask(attention_mask, T))

    def _run(self, input_ids, attention_mask, past_key_values, allowed, pos):
        x = self.tok_emb(input_ids) + self.pos_emb(pos)  # (B, T, d_model)
        present = []
        for i, block in enumerate(self.blocks):
            x, kv = block(x, allowed, past_key_values[i] if past_key_values else None)
            present.append(kv)
        return self.lm_head(self.ln_f(x)), tuple(present)


class _PositionsNoPast(_NoPastOffset):
    def forward(self, input_ids, attention_mask, past_key_values=None):
        B, T = input_ids.shape
        past_len = past_key_values[0][0].shape[2] if past_key_values else 0
        allowed = build_causal_mask(T, past_len, attention_mask)
        new = attention_mask[:, -T:]  # BUG: counts positions over the new tokens only, as if the cache were empty
        pos = (torch.cumsum(new, dim=-1) - 1).clamp(min=0)  # (B, T)
        return self._run(input_ids, attention_mask, past_key_values, allowed, pos)


class _FixedSizeMask(_NoPastOffset):
    def forward(self, input_ids, attention_mask, past_key_values=None):
        past_len = past_key_values[0][0].shape[2] if past_key_values else 0
        T, S = int(input_ids.shape[1]), int(past_len) + int(input_ids.shape[1])  # BUG: Python ints: the size is
        causal = torch.ones(T, S, dtype=torch.bool).tril(diagonal=S - T)  # baked into a traced or exported graph
        allowed = causal[None, None] & attention_mask[:, None, None, :].bool()
        return self._run(input_ids, attention_mask, past_key_values, allowed,
                         position_ids_from_mask(attention_mask, int(input_ids.shape[1])))


class _LeftPaddingOnly(_NoPastOffset):
    def forward(self, input_ids, attention_mask, past_key_values=None):
        B, T = input_ids.shape
        past_len = past_key_values[0][0].shape[2] if past_key_values else 0
        allowed = build_causal_mask(T, past_len, attention_mask)
        n_pads = (attention_mask == 0).sum(dim=-1, keepdim=True)  # (B, 1)
        # BUG: assumes every pad sits before the tokens (left padding); wrong for right-padded batches
        pos = (torch.arange(T)[None, :] + past_len - n_pads).clamp(min=0)  # (B, T)
        return self._run(input_ids, attention_mask, past_key_values, allowed, pos)


class _WindowInDecode(_Attention):
    WINDOW = 48  # < the tiny preset's max_positions (128): a few dozen positions in, decoding goes wrong

    def attend(self, scores, allowed):
        T, S = scores.shape[-2], scores.shape[-1]
        if T == 1 and S > self.WINDOW:  # BUG: one-token steps see only the last WINDOW keys; prefill sees them all
            allowed = allowed & (torch.arange(S) >= S - self.WINDOW)
        return super().attend(scores, allowed)


class _PositionsRunOut(_NoPastOffset):
    LIMIT = 63  # half the tiny preset's max_positions

    def forward(self, input_ids, attention_mask, past_key_values=None):
        B, T = input_ids.shape
        past_len = past_key_values[0][0].shape[2] if past_key_values else 0
        allowed = build_causal_mask(T, past_len, attention_mask)
        pos = position_ids_from_mask(attention_mask, T)
        if past_len > 0:  # BUG: the decode path's positions stop at LIMIT (a position table that runs out early)
            pos = pos.clamp(max=self.LIMIT)
        return self._run(input_ids, attention_mask, past_key_values, allowed, pos)


def window_in_decode() -> nn.Module:
    """Cached decode steps attend to the last 48 keys only, the prefill to all: right at short lengths, wrong past
    48 positions — caught by the long-context part of kv-consistency and by generation from a long prompt."""
    return _with_attention(DecoderLM(CONFIG), _WindowInDecode)


def positions_run_out() -> nn.Module:
    """Decode-path positions clamped at 63 (half of max_positions): caught only by the long-context checks."""
    return _PositionsRunOut(CONFIG).eval()


def left_padding_only() -> nn.Module:
    """Positions that assume left padding: right for the contract's layout, wrong for onnxruntime-genai's
    right-padded batches: caught by padding (its right-padded half)."""
    return _LeftPaddingOnly(CONFIG).eval()


def mask_zero() -> nn.Module:
    """Mask filled with 0 instead of -inf / the dtype's minimum: caught by causality."""
    return _with_attention(DecoderLM(CONFIG), _ZeroFill)


def mask_neg_inf() -> nn.Module:
    """Mask filled with -inf: a query row with no allowed key (a left-padded row's padding) softmaxes to NaN, which
    spreads to the next layer's real rows through the padded keys' values: caught by finite (and every comparison
    after it)."""
    return _with_attention(DecoderLM(CONFIG), _NegInfFill)


def mask_after_softmax() -> nn.Module:
    """Mask applied to the weights after softmax: caught by causality and kv-consistency."""
    return _with_attention(DecoderLM(CONFIG), _AfterSoftmax)


def no_mask() -> nn.Module:
    """No mask at all: caught by causality, kv-consistency and padding."""
    return _with_attention(DecoderLM(CONFIG), _NoMask)


def no_past_offset() -> nn.Module:
    """Causal mask without the past offset (query t sees keys 0..t): caught by kv-consistency."""
    return _NoPastOffset(CONFIG).eval()


def positions_no_past() -> nn.Module:
    """Positions 0..T-1 even with a cache: caught by kv-consistency."""
    return _PositionsNoPast(CONFIG).eval()


def fixed_size_mask() -> nn.Module:
    """Mask sized from Python ints: right in eager, baked to the export length by tracing (dynamic-shapes)
    and refused by torch.onnx (naming the dynamic axis)."""
    return _FixedSizeMask(CONFIG).eval()


ALL = {f.__name__: f for f in (mask_zero, mask_after_softmax, fixed_size_mask, no_past_offset, no_mask,
                               positions_no_past, window_in_decode, positions_run_out)}
