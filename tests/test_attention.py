"""MultiHeadAttention and build_causal_mask: the seed article's points, cross-checked against torch's own."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from mhaexport.core.errors import ConfigError
from mhaexport.models.attention import MultiHeadAttention, build_causal_mask, masked_fill_value
from mhaexport.models.config import DecoderConfig


def _mha(d_model=32, heads=4, seed=0):
    torch.manual_seed(seed)
    return MultiHeadAttention(d_model, heads).eval()


def test_head_split_and_separate_projections():
    m = _mha(32, 4)
    assert m.d_k == 8
    for name in ("W_q", "W_k", "W_v", "W_o"):
        lin = getattr(m, name)
        assert lin.weight.shape == (32, 32) and lin.bias is None


@pytest.mark.parametrize("d_model,heads", [(10, 3), (64, 5)])
def test_d_model_not_divisible_names_both_numbers(d_model, heads):
    with pytest.raises(ConfigError, match=rf"d_model={d_model} is not divisible by n_heads={heads}"):
        MultiHeadAttention(d_model, heads)
    with pytest.raises(ConfigError, match=rf"d_model={d_model} is not divisible by n_heads={heads}"):
        DecoderConfig(d_model=d_model, n_heads=heads)


def test_causal_mask_rows_see_past_offset():
    allowed = build_causal_mask(3, 4)[0, 0]  # (T=3, S=7)
    expected = torch.tensor([[k <= 4 + t for k in range(7)] for t in range(3)])
    assert torch.equal(allowed, expected)


def test_causal_mask_combines_left_padding():
    am = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])
    allowed = build_causal_mask(2, 2, am)  # (B, 1, 2, 4)
    assert allowed.shape == (2, 1, 2, 4)
    assert not allowed[0, 0, :, :2].any()  # padded keys are never seen
    assert torch.equal(allowed[1, 0], build_causal_mask(2, 2)[0, 0])


def test_matches_sdpa_is_causal():
    m = _mha()
    x = torch.randn(2, 9, 32)
    with torch.no_grad():
        out, _ = m(x, build_causal_mask(9, 0))
        q, k, v = (m.split_heads(w(x)) for w in (m.W_q, m.W_k, m.W_v))
        ref = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # scale 1/sqrt(d_k) by default
        ref = m.W_o(ref.transpose(1, 2).reshape(2, 9, 32))
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def test_matches_torch_multihead_attention_with_same_weights():
    m = _mha()
    ref = torch.nn.MultiheadAttention(32, 4, bias=False, batch_first=True).eval()
    with torch.no_grad():
        ref.in_proj_weight.copy_(torch.cat([m.W_q.weight, m.W_k.weight, m.W_v.weight]))
        ref.out_proj.weight.copy_(m.W_o.weight)
        x = torch.randn(3, 6, 32)
        out, _ = m(x, build_causal_mask(6, 0))
        # torch's attn_mask: True means "not allowed"
        want, _ = ref(x, x, x, attn_mask=~build_causal_mask(6, 0)[0, 0], need_weights=False)
    torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)


def test_scores_are_scaled_by_sqrt_dk():
    m = _mha(16, 1)
    x = torch.randn(1, 2, 16)
    with torch.no_grad():
        out, _ = m(x, build_causal_mask(2, 0))
        q, k, v = m.W_q(x), m.W_k(x), m.W_v(x)
        s = q @ k.transpose(-2, -1) / math.sqrt(16)
        s = s.masked_fill(~build_causal_mask(2, 0)[0], float("-inf"))
        want = m.W_o(torch.softmax(s, -1) @ v)
    torch.testing.assert_close(out, want, atol=1e-6, rtol=1e-5)


def test_cached_attention_equals_full_recompute():
    m = _mha()
    x = torch.randn(2, 10, 32)
    with torch.no_grad():
        full, _ = m(x, build_causal_mask(10, 0))
        first, kv = m(x[:, :6], build_causal_mask(6, 0))
        rest, kv2 = m(x[:, 6:], build_causal_mask(4, 6), kv)
    torch.testing.assert_close(torch.cat([first, rest], 1), full, atol=1e-5, rtol=1e-5)
    assert kv2[0].shape == (2, 4, 10, 8)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_fully_masked_rows_stay_finite(dtype):
    m = _mha().to(dtype)
    x = torch.randn(1, 4, 32).to(dtype)
    am = torch.tensor([[0, 0, 1, 1]])  # two left-padded queries see no real key at all
    with torch.no_grad():
        out, _ = m(x, build_causal_mask(4, 0, am))
    assert torch.isfinite(out).all()
    assert masked_fill_value(dtype) == torch.finfo(dtype).min
