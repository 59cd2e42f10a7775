"""The torch-free deploy runtime (mhaexport.runtime): parity with eager, the decode loop, sampling, stops, bad input."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from mhaexport.core.devices import no_cuda_device
from mhaexport.core.errors import ArtifactError, ConfigError, ProviderUnavailable, RuntimeInputError
from mhaexport.runtime import (STOP_EOS, STOP_MAX_NEW, STOP_MAX_POS, GenerationConfig, Generator, SamplingConfig,
                               filtered_probs, next_tokens)


@pytest.fixture(scope="module")
def gen(tiny_export):
    return Generator(tiny_export, threads=1)


def eager_greedy(module, prompts: list[list[int]], n: int) -> list[list[int]]:
    """Reference: greedy decode with the eager module, left-padded like the runtime, KV cache carried."""
    L = max(map(len, prompts))
    ids = torch.tensor([[0] * (L - len(p)) + p for p in prompts])  # (B, L)
    mask = torch.tensor([[0] * (L - len(p)) + [1] * len(p) for p in prompts])  # (B, L)
    out, past, cur = [], None, ids
    with torch.no_grad():
        for _ in range(n):
            logits, past = module(cur, mask, past)
            tok = logits[:, -1].argmax(-1)  # (B,)
            out.append(tok.tolist())
            cur = tok[:, None]
            mask = torch.cat([mask, torch.ones(len(prompts), 1, dtype=mask.dtype)], dim=1)
    return [list(row) for row in zip(*out)]


def test_import_and_generate_without_torch(tiny_export):
    code = textwrap.dedent(f"""
        import sys
        from mhaexport.runtime import Generator, GenerationConfig
        r = Generator({str(tiny_export)!r}, threads=1).generate([[5, 17, 42]], GenerationConfig(max_new_tokens=4))
        assert len(r.tokens[0]) == 4, r
        heavy = ("torch", "onnx", "mhaexport.exporter", "mhaexport.models", "mhaexport.verify")
        loaded = sorted(m for m in sys.modules if any(m == h or m.startswith(h + ".") for h in heavy))
        print("LOADED:" + ",".join(loaded))
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "LOADED:\n" in proc.stdout, proc.stdout  # no torch, no onnx package, no exporter: the deploy path


def test_forward_matches_eager(gen, tiny):
    from mhaexport.models.inputs import make_inputs

    ids, mask, past = make_inputs(tiny.contract, batch=2, seq=3, past=4, seed=7, pad=[0, 2])
    with torch.no_grad():
        ref_logits, ref_present = tiny.module(ids, mask, past)
    logits, present = gen.forward(ids.numpy(), mask.numpy(), [(k.numpy(), v.numpy()) for k, v in past])
    np.testing.assert_allclose(logits, ref_logits.numpy(), atol=1e-4, rtol=1e-4)
    assert len(present) == 2 * tiny.contract.n_layers
    np.testing.assert_allclose(present[0], ref_present[0][0].numpy(), atol=1e-5)


def test_greedy_batch_with_padding_matches_eager(gen, tiny):
    prompts = [[5, 17, 42], [1, 2, 3, 4, 5, 6, 7]]
    result = gen.generate(prompts, GenerationConfig(max_new_tokens=12))
    assert result.tokens == eager_greedy(tiny.module, prompts, 12)
    assert result.stop_reason == STOP_MAX_NEW and result.prompt_lengths == [3, 7]
    assert len(result.step_s) == 11 and result.step_positions == list(range(7, 18))
    assert result.providers == ["CPUExecutionProvider"]


def test_io_binding_and_plain_run_agree(tiny_export, gen):
    """On CPU the default is plain session.run (the cache as numpy); IO binding, asked for, carries OrtValues and
    decodes the same tokens."""
    import onnxruntime as ort

    bound = Generator(tiny_export, threads=1, io_binding=True)
    assert gen.io_binding is False and bound.io_binding is True
    prompts = [[9, 8, 7, 6], [3]]
    for g, kind in ((gen, np.ndarray), (bound, ort.OrtValue)):
        _, state = g.prefill(*g.pad_prompts(prompts)[:2])
        assert all(isinstance(v, kind) for v in state.cache)
    cfg = GenerationConfig(max_new_tokens=10, sampling=SamplingConfig(temperature=0.8, top_k=20, seed=1))
    assert bound.generate(prompts, cfg).tokens == gen.generate(prompts, cfg).tokens


def test_prefill_then_decode_one_token_grows_the_cache(gen):
    ids, mask, _ = gen.pad_prompts([[1, 2, 3]])
    logits, state = gen.prefill(ids, mask)
    assert logits.shape == (1, 256) and state.length == 3
    logits2, state2 = gen.decode_one_token(logits.argmax(-1), state)
    assert state2.length == 4 and state2.attention_mask.tolist() == [[1, 1, 1, 1]]
    # the cached step equals running the whole sequence at once
    full, _ = gen.forward(np.array([[1, 2, 3, int(logits.argmax())]]), np.ones((1, 4), dtype=np.int64))
    np.testing.assert_allclose(logits2, full[:, -1], atol=1e-4)


def test_sampling_is_seeded(gen):
    def run(seed):
        cfg = GenerationConfig(max_new_tokens=16, sampling=SamplingConfig(temperature=1.0, top_p=0.95, seed=seed))
        return gen.generate([[5, 17, 42]], cfg).tokens

    assert run(3) == run(3)
    assert run(3) != run(4)


def test_top_k_1_and_tiny_top_p_are_greedy(gen):
    greedy = gen.generate([[5, 17, 42]], GenerationConfig(max_new_tokens=8)).tokens
    for s in (SamplingConfig(temperature=1.5, top_k=1, seed=0), SamplingConfig(temperature=1.5, top_p=1e-9, seed=0)):
        assert gen.generate([[5, 17, 42]], GenerationConfig(max_new_tokens=8, sampling=s)).tokens == greedy


def test_filtered_probs_top_k_and_top_p():
    logits = np.log(np.array([[0.5, 0.3, 0.15, 0.05]]))
    p = filtered_probs(logits, SamplingConfig(temperature=1.0, top_k=2))
    np.testing.assert_allclose(p, [[0.625, 0.375, 0, 0]], atol=1e-9)
    p = filtered_probs(logits, SamplingConfig(temperature=1.0, top_p=0.79))  # 0.5 + 0.3 reaches 0.79
    np.testing.assert_allclose(p, [[0.625, 0.375, 0, 0]], atol=1e-9)
    p = filtered_probs(logits, SamplingConfig(temperature=1.0, top_p=0.81))
    assert (p > 0).sum() == 3
    draws = [int(next_tokens(logits, SamplingConfig(temperature=1.0, top_k=2, seed=0), rng)[0])
             for rng in [np.random.default_rng(0)] for _ in range(200)]
    assert set(draws) == {0, 1}


def test_top_k_keeps_exactly_k_when_tied():
    logits = np.array([[2.0, 1.0, 1.0, 1.0, 0.0], [0.0, 3.0, 3.0, 3.0, 3.0]])  # ties at the k-th value
    p = filtered_probs(logits, SamplingConfig(temperature=1.0, top_k=2))
    assert ((p > 0).sum(axis=-1) == [2, 2]).all()
    assert p[0, 0] > 0 and p[0, 4] == 0  # the largest is always kept, the smallest never
    np.testing.assert_allclose(p.sum(axis=-1), 1.0)
    np.testing.assert_allclose(p[1][p[1] > 0], [0.5, 0.5])  # two of the four tied tokens, equally likely
    assert ((filtered_probs(logits, SamplingConfig(temperature=1.0, top_k=1)) > 0).sum(axis=-1) == 1).all()


def test_kv_dtype_mapping_and_bfloat16_refused(tiny_export):
    from mhaexport.core import dtypes

    assert dtypes.numpy_dtype("float32") == np.float32 and dtypes.numpy_dtype("float16") == np.float16
    with pytest.raises(ArtifactError, match="a bfloat16 KV cache cannot be held in numpy"):
        dtypes.numpy_dtype("bfloat16")
    with pytest.raises(ArtifactError, match="dtype 'int8' is not one of float32, float16, bfloat16"):
        dtypes.numpy_dtype("int8")
    from mhaexport.artifact import ExportFolder

    ef = ExportFolder.open(tiny_export, "onnx")  # the tiny export, its manifest claiming a bfloat16 cache
    for spec in ef.entry("onnx").io["inputs"].values():
        if spec["dtype"] == "float32":
            spec["dtype"] = "bfloat16"
    with pytest.raises(ArtifactError, match="a bfloat16 KV cache cannot be held in numpy"):
        Generator(ef, threads=1)


def test_unknown_opt_level_is_a_config_error(tiny_export):
    with pytest.raises(ConfigError, match="graph optimization level 'fast' unknown; use one of disable, basic"):
        Generator(tiny_export, opt_level="fast")


def test_eos_stops_a_row(gen):
    first = gen.generate([[5, 17, 42]], GenerationConfig(max_new_tokens=1)).tokens[0][0]
    r = gen.generate([[5, 17, 42]], GenerationConfig(max_new_tokens=20, eos_token_id=first))
    assert r.tokens == [[first]] and r.stop_reason == STOP_EOS


def test_stops_cleanly_at_max_positions(gen):
    max_pos = gen.contract.max_positions  # 128 for tiny
    r = gen.generate([[1] * (max_pos - 8)], GenerationConfig(max_new_tokens=50))
    assert r.stop_reason == STOP_MAX_POS
    assert len(r.tokens[0]) == 9  # 8 fed positions left, and the token chosen after the last one
    assert f"max_positions={max_pos}" in r.message
    r = gen.generate([[1] * max_pos], GenerationConfig(max_new_tokens=5))
    assert len(r.tokens[0]) == 1 and r.stop_reason == STOP_MAX_POS


@pytest.mark.parametrize("prompts, match", [
    ([[5, 256]], r"prompt 0 holds token id 256, outside the vocabulary \[0, 256\)"),
    ([[-1]], r"token id -1"),
    ([], r"empty batch"),
    ([[1], []], r"prompt 1 is empty"),
    ([[1] * 129], r"prompt of 129 tokens is longer than the model's max_positions=128"),
])
def test_bad_prompts(gen, prompts, match):
    with pytest.raises(RuntimeInputError, match=match):
        gen.generate(prompts, GenerationConfig(max_new_tokens=2))


def test_bad_forward_inputs(gen):
    c = gen.contract
    ids = np.array([[1, 2]])
    good = np.zeros((1, c.n_heads, 3, c.head_dim), dtype=np.float32)
    bad = np.zeros((1, c.n_heads, 2, c.head_dim), dtype=np.float32)
    past = [(good, good)] * (c.n_layers - 1) + [(good, bad)]
    with pytest.raises(RuntimeInputError, match=r"past_key_values\.1\.value has shape \(1, 4, 2, 16\), expected "):
        gen.forward(ids, np.ones((1, 5), dtype=np.int64), past)
    with pytest.raises(RuntimeInputError, match=r"must hold 2 \(key, value\) pairs"):
        gen.forward(ids, np.ones((1, 5), dtype=np.int64), [(good, good)])
    with pytest.raises(RuntimeInputError, match=r"attention_mask must be"):
        gen.forward(ids, np.ones((2, 2), dtype=np.int64))
    with pytest.raises(RuntimeInputError, match=r"max_new_tokens must be >= 1"):
        gen.generate([[1]], GenerationConfig(max_new_tokens=0))
    with pytest.raises(RuntimeInputError, match=r"top_p must be in"):
        SamplingConfig(temperature=1.0, top_p=0.0)


def test_cuda_request_reports_the_providers_really_used(tiny_export):
    try:
        g = Generator(tiny_export, providers=["cuda"])
    except ProviderUnavailable as e:
        assert ("CUDAExecutionProvider requested; "
                + (no_cuda_device() or "session runs on ['CPUExecutionProvider']")) in str(e)
        lenient = Generator(tiny_export, providers=["cuda"], strict_providers=False)
        assert lenient.providers == ["CPUExecutionProvider"] and lenient.device == "cpu"
        assert "CUDAExecutionProvider requested" in lenient.warnings[0]
    else:
        assert g.providers[0] == "CUDAExecutionProvider" and g.device == "cuda"


def test_optimized_model_cache(tiny_export, tmp_path, monkeypatch):
    """The optimized graph is cached in the user's cache (keyed by the hashed file), never in the export folder: a
    folder cannot supply the graph a reader runs, and a reader writes nothing into it."""
    monkeypatch.setenv("MHAEXPORT_CACHE_DIR", str(tmp_path / "cache"))
    folder = tmp_path / "copy"
    shutil.copytree(tiny_export, folder)
    before = sorted(p.name for p in folder.iterdir())
    first = Generator(folder, cache_optimized=True)
    second = Generator(folder, cache_optimized=True)
    assert not first.optimized_from_cache and second.optimized_from_cache
    assert sorted(p.name for p in folder.iterdir()) == before
    assert list((tmp_path / "cache" / "ort").rglob("*.onnx"))
    prompts = [[5, 17, 42]]
    assert first.generate(prompts).tokens == second.generate(prompts).tokens


@pytest.mark.cuda
def test_cuda_generation_keeps_cache_on_device_and_matches_cpu(tiny_export):
    try:
        g = Generator(tiny_export, providers=["cuda"])
    except ProviderUnavailable as e:
        pytest.skip(f"ONNX Runtime's CUDA provider is not usable here: {e}")
    prompts = [[5, 17, 42], [1, 2, 3, 4]]
    ids, mask, _ = g.pad_prompts(prompts)
    _, state = g.prefill(ids, mask)
    assert all(v.device_name() == "cuda" for v in state.past)  # the cache never came back to the host
    cpu = Generator(tiny_export).generate(prompts, GenerationConfig(max_new_tokens=16)).tokens
    assert g.generate(prompts, GenerationConfig(max_new_tokens=16)).tokens == cpu
