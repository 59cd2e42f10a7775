"""DecoderLM: the contract's shapes, KV cache == recompute, causality, left padding, configs, checkpoints."""

from __future__ import annotations

import json

import pytest
import torch

from mhaexport.core.errors import ConfigError, ModelLoadError
from mhaexport.models.config import PRESETS, DecoderConfig, load_config
from mhaexport.models.decoder import DecoderLM
from mhaexport.models.inputs import make_inputs
from mhaexport.models.loading import load_model


def test_presets_and_default():
    assert load_config(None).name == "small"
    b = PRESETS["bench"]
    assert (b.vocab_size, b.d_model, b.n_heads, b.n_layers, b.d_ff, b.max_positions, b.tie_embeddings) == (
        32000, 512, 8, 8, 2048, 1024, True)
    assert PRESETS["tiny"].head_dim == 16


def test_json_config(tmp_path):
    p = tmp_path / "mine.json"
    p.write_text(json.dumps({"d_model": 96, "n_heads": 3, "n_layers": 1, "vocab_size": 50}))
    cfg = load_config(str(p))
    assert (cfg.d_model, cfg.head_dim, cfg.name) == (96, 32, "mine")


@pytest.mark.parametrize("text,match", [
    ("{not json", "not valid JSON"),
    ('{"d_model": 10, "n_heads": 4}', "d_model=10 is not divisible by n_heads=4"),
    ('{"layers": 3}', "unknown config field"),
    ('[1, 2]', "must be a JSON object"),
])
def test_bad_json_configs(tmp_path, text, match):
    p = tmp_path / "bad.json"
    p.write_text(text)
    with pytest.raises(ConfigError, match=match):
        load_config(str(p))


def test_unknown_preset():
    with pytest.raises(ConfigError, match="unknown config 'huge'"):
        load_config("huge")


def test_seeded_weights_are_deterministic():
    a, b = DecoderLM(PRESETS["tiny"]), DecoderLM(PRESETS["tiny"])
    for (n, p), (_, q) in zip(a.state_dict().items(), b.state_dict().items()):
        assert torch.equal(p, q), n
    c = DecoderLM(DecoderConfig(**{**PRESETS["tiny"].to_dict(), "seed": 1}))
    assert not torch.equal(a.tok_emb.weight, c.tok_emb.weight)
    assert a.lm_head.weight is a.tok_emb.weight  # tied


def test_contract_shapes(tiny):
    ids, am, past = make_inputs(tiny.contract, batch=3, seq=5, past=4)
    with torch.no_grad():
        logits, present = tiny.module(ids, am, past)
    assert logits.shape == (3, 5, 256)
    assert len(present) == 2 and all(k.shape == v.shape == (3, 4, 9, 16) for k, v in present)


def test_token_by_token_decode_equals_prefill(tiny):
    ids, am, empty = make_inputs(tiny.contract, batch=2, seq=12, past=0, seed=3)  # past=0: empty tensors
    with torch.no_grad():
        full, _ = tiny.module(ids, am, empty)
        _, cache = tiny.module(ids[:, :4], am[:, :4], empty)
        steps = []
        for t in range(4, 12):
            logit, cache = tiny.module(ids[:, t:t + 1], am[:, :t + 1], cache)
            steps.append(logit)
    torch.testing.assert_close(torch.cat(steps, 1), full[:, 4:], atol=1e-5, rtol=1e-4)


def test_future_tokens_do_not_change_earlier_logits(tiny):
    ids, am, _ = make_inputs(tiny.contract, batch=1, seq=10, past=0, seed=4)
    changed = ids.clone()
    changed[:, 6:] = (changed[:, 6:] + 17) % 256
    with torch.no_grad():
        a, _ = tiny.module(ids, am, None)
        b, _ = tiny.module(changed, am, None)
    torch.testing.assert_close(a[:, :6], b[:, :6], atol=0, rtol=0)
    assert not torch.allclose(a[:, 6:], b[:, 6:])


def test_left_padding_matches_unpadded(tiny):
    ids, _, _ = make_inputs(tiny.contract, batch=1, seq=6, past=0, seed=5)
    padded = torch.cat([torch.zeros(1, 3, dtype=torch.int64), ids], 1)
    am = torch.tensor([[0, 0, 0] + [1] * 6])
    with torch.no_grad():
        ref, _ = tiny.module(ids, torch.ones(1, 6, dtype=torch.int64), None)
        out, _ = tiny.module(padded, am, None)
    assert torch.isfinite(out).all()  # padded query rows too
    torch.testing.assert_close(out[:, 3:], ref, atol=1e-5, rtol=1e-4)


def test_checkpoint_round_trip_and_mismatch(tmp_path, tiny):
    good = tmp_path / "good.pt"
    torch.save(tiny.module.state_dict(), good)
    loaded = load_model("tiny", checkpoint=str(good))
    assert loaded.checkpoint_sha256 and torch.equal(loaded.module.tok_emb.weight, tiny.module.tok_emb.weight)
    bad = tmp_path / "bad.pt"
    torch.save(DecoderLM(PRESETS["small"]).state_dict(), bad)
    with pytest.raises(ModelLoadError, match="does not fit the model"):
        load_model("tiny", checkpoint=str(bad))


def test_checkpoint_with_code_is_refused(tmp_path):
    evil = tmp_path / "evil.pt"
    torch.save({"w": torch.zeros(1), "obj": DecoderConfig()}, evil)  # a pickled non-tensor object
    with pytest.raises(ModelLoadError, match="tensors-only"):
        load_model("tiny", checkpoint=str(evil))


def test_user_factory_loads(tmp_path):
    loaded = load_model(model="examples/user_decoder.py:build")
    assert loaded.contract.vocab_size == 300 and loaded.spec == "factory:examples/user_decoder.py:build"


@pytest.mark.parametrize("spec,match", [
    ("no_such_module_xyz:build", "cannot import no_such_module_xyz"),
    ("examples/user_decoder.py:missing", "has no callable 'missing'"),
    ("nocolon", "expected 'package.module:factory'"),
    ("torch.nn:Identity", "model.config|has no .config"),
])
def test_bad_factories(spec, match):
    with pytest.raises(ModelLoadError, match=match):
        load_model(model=spec)


# --- the Llama-shaped preset: grouped-query attention, RoPE, RMSNorm, SwiGLU -----------------------------------------

def test_llama_preset_has_a_grouped_cache_and_decodes_like_prefill():
    m = load_model("tiny-llama")
    c = m.contract
    assert (c.n_heads, c.n_kv_heads, c.grouped) == (4, 2, True) and c.to_dict()["n_kv_heads"] == 2
    assert load_model("tiny").contract.to_dict().keys() == {"n_layers", "n_heads", "head_dim", "vocab_size",
                                                            "max_positions"}  # MHA records stay as they were
    ids, am, empty = make_inputs(c, batch=2, seq=10, past=0, seed=3, pad=[0, 3])
    with torch.no_grad():
        full, present = m.module(ids, am, empty)
        assert present[0][0].shape == (2, 2, 10, 16)  # (B, H_kv, S, D): the cache holds the shared heads only
        _, cache = m.module(ids[:, :4], am[:, :4], empty)
        steps = []
        for t in range(4, 10):
            logit, cache = m.module(ids[:, t:t + 1], am[:, :t + 1], cache)
            steps.append(logit)
    torch.testing.assert_close(torch.cat(steps, 1)[0], full[0, 4:], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(torch.cat(steps, 1)[1], full[1, 4:], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("bad,match", [({"n_kv_heads": 3}, "n_kv_heads=3 must be a positive divisor of n_heads=4"),
                                       ({"norm": "batchnorm"}, "'norm' must be one of layernorm, rmsnorm")])
def test_bad_llama_fields(bad, match):
    with pytest.raises(ConfigError, match=match):
        DecoderConfig(**{**PRESETS["tiny-llama"].to_dict(), **bad})


def test_llama_preset_matches_hugging_face_llama_with_the_same_weights():
    """Cross-check against transformers' LlamaForCausalLM (the reference implementation of the shape): same
    weights, same positions, same logits — RoPE's convention, RMSNorm, SwiGLU and the grouped heads included."""
    transformers = pytest.importorskip("transformers")
    m = load_model("tiny-llama")
    cfg = m.config
    hf_cfg = transformers.LlamaConfig(vocab_size=cfg.vocab_size, hidden_size=cfg.d_model,
                                      intermediate_size=cfg.d_ff, num_hidden_layers=cfg.n_layers,
                                      num_attention_heads=cfg.n_heads, num_key_value_heads=cfg.n_kv_heads,
                                      max_position_embeddings=cfg.max_positions, rms_norm_eps=cfg.layer_norm_eps,
                                      rope_theta=cfg.rope_theta, tie_word_embeddings=False,
                                      attention_bias=False, mlp_bias=False)
    hf = transformers.LlamaForCausalLM(hf_cfg).eval()
    names = {"tok_emb": "model.embed_tokens", "ln_f": "model.norm", "lm_head": "lm_head"}
    per_block = {"ln_1": "input_layernorm", "ln_2": "post_attention_layernorm", "attn.W_q": "self_attn.q_proj",
                 "attn.W_k": "self_attn.k_proj", "attn.W_v": "self_attn.v_proj", "attn.W_o": "self_attn.o_proj",
                 "ffn.w1": "mlp.gate_proj", "ffn.w3": "mlp.up_proj", "ffn.w2": "mlp.down_proj"}
    state = {}
    for k, v in m.module.state_dict().items():
        if k.startswith("blocks."):
            _, i, rest = k.split(".", 2)
            mod, param = rest.rsplit(".", 1)
            state[f"model.layers.{i}.{per_block[mod]}.{param}"] = v
        else:
            mod, param = k.rsplit(".", 1)
            state[f"{names[mod]}.{param}"] = v
    hf.load_state_dict(state, strict=True)
    ids, am, empty = make_inputs(m.contract, batch=1, seq=12, past=0, seed=7)
    with torch.no_grad():
        ours, _ = m.module(ids, am, empty)
        theirs = hf(input_ids=ids, attention_mask=am).logits
    torch.testing.assert_close(ours, theirs, atol=2e-5, rtol=1e-4)
