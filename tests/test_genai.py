"""onnxruntime-genai: the export folder's genai_config.json, and greedy generation through og == eager PyTorch."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from mhaexport.core import iospec
from mhaexport.artifact import ExportFolder
from mhaexport.exporter.genai import genai_config
from mhaexport.runtime.decode import pad_prompts
from mhaexport.runtime.genai import GENAI_CONFIG, genai_greedy
from eager import eager_greedy
from planted.edit import peaked as peaked_model

PROMPTS = [[72, 101, 108, 108, 111], [200, 17, 3], [9, 8, 7, 6, 5, 4, 3, 2]]


@pytest.fixture(scope="module")
def peaked(tmp_path_factory):
    """The tiny decoder with weights scaled x10 (greedy output varies from token to token), exported to ONNX with its
    genai_config.json."""
    from mhaexport.exporter.onnx import export_onnx

    loaded = peaked_model("tiny")
    out = tmp_path_factory.mktemp("genai")
    export_onnx(loaded, out)
    return loaded, out


def test_genai_config_matches_contract_and_iospec(tiny_export, tiny):
    cfg = json.loads((tiny_export / GENAI_CONFIG).read_text())
    c = tiny.contract
    m, d = cfg["model"], cfg["model"]["decoder"]
    assert m["type"] == "decoder" and m["context_length"] == c.max_positions and m["vocab_size"] == c.vocab_size
    assert (d["head_size"], d["num_attention_heads"], d["num_key_value_heads"], d["num_hidden_layers"]) == (
        c.head_dim, c.n_heads, c.n_heads, c.n_layers)
    assert d["filename"] == "model.onnx"
    assert cfg["search"]["past_present_share_buffer"] is False  # concat-style cache
    for i in range(c.n_layers):  # the templates expand to iospec's names
        assert (d["inputs"]["past_key_names"] % i, d["inputs"]["past_value_names"] % i) == iospec.past_names(i)
        assert (d["outputs"]["present_key_names"] % i,
                d["outputs"]["present_value_names"] % i) == iospec.present_names(i)
    # recorded and hashed in the manifest with the ONNX artifact
    assert GENAI_CONFIG in ExportFolder.open(tiny_export, "onnx").entry("onnx").files


def test_genai_config_rejects_special_id_outside_vocab(tiny):
    from mhaexport.core.errors import MhaExportError

    with pytest.raises(MhaExportError, match=r"eos_token_id=999 is outside the vocabulary \[0, 256\)"):
        genai_config(tiny.contract, ids={"bos_token_id": 0, "eos_token_id": 999, "pad_token_id": 0})


@pytest.mark.slow  # test_integrity's static re-export asserts the same on every fast run
def test_static_export_has_no_genai_config(tiny, tmp_path):
    from mhaexport.exporter.onnx import export_onnx

    rec = export_onnx(tiny, tmp_path, seq_dynamic=False, seq_len=4)
    assert GENAI_CONFIG not in rec.files and not (tmp_path / GENAI_CONFIG).exists()


def test_right_pad_layout():
    ids, mask, lengths = pad_prompts([[5, 6, 7], [8]], 256, 128, pad_token_id=0, side="right")
    assert ids.tolist() == [[5, 6, 7], [8, 0, 0]] and mask.tolist() == [[1, 1, 1], [1, 0, 0]]
    assert lengths == [3, 1]


def test_right_padded_batch_matches_unpadded_in_onnxruntime(peaked):
    """What onnxruntime-genai feeds (right-padded prefill, then a decode step whose mask keeps the pad holes)
    gives each row the logits eager PyTorch gives that prompt alone."""
    import onnxruntime as ort

    loaded, folder = peaked
    c = loaded.contract
    sess = ort.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"])
    ids, mask, _ = pad_prompts(PROMPTS, c.vocab_size, c.max_positions, side="right")  # (B, T)
    B, T = ids.shape
    feed = {iospec.INPUT_IDS: ids, iospec.ATTENTION_MASK: mask}
    for i in range(c.n_layers):
        for name in iospec.past_names(i):
            feed[name] = np.zeros((B, c.n_heads, 0, c.head_dim), np.float32)
    outs = sess.run(None, feed)
    logits, present = outs[0], outs[1:]
    nxt = np.array([[17], [99], [4]], dtype=np.int64)  # (B, 1)
    feed2 = {iospec.INPUT_IDS: nxt, iospec.ATTENTION_MASK: np.concatenate([mask, np.ones((B, 1), np.int64)], 1)}
    for i in range(c.n_layers):
        feed2.update(dict(zip(iospec.past_names(i), present[2 * i:2 * i + 2])))
    logits2 = sess.run([iospec.LOGITS], feed2)[0]
    with torch.no_grad():
        for b, p in enumerate(PROMPTS):
            want = loaded.module(torch.tensor([p + [int(nxt[b, 0])]]), torch.ones(1, len(p) + 1, dtype=torch.int64),
                                 None)[0][0].numpy()  # (len(p) + 1, vocab)
            np.testing.assert_allclose(logits[b, :len(p)], want[:len(p)], atol=1e-4, rtol=1e-4)
            np.testing.assert_allclose(logits2[b, 0], want[len(p)], atol=1e-4, rtol=1e-4)


def _og_or_skip():
    try:
        import onnxruntime_genai  # noqa: F401
    except Exception as e:
        pytest.skip(f"onnxruntime_genai cannot be imported ({type(e).__name__}: {e}); "
                    "install with `pip install --no-deps onnxruntime-genai`")


def test_genai_greedy_equals_eager_single_prompt(peaked):
    _og_or_skip()
    loaded, folder = peaked
    got = genai_greedy(folder, [PROMPTS[0]], max_length=40)
    want = eager_greedy(loaded.module, PROMPTS[0], 40, eos=0)
    assert got[0] == want
    assert len(set(want[len(PROMPTS[0]):])) > 3  # the comparison is not between two constant runs


def test_genai_greedy_equals_eager_right_padded_batch(peaked):
    """og pads the batch on the right; every row still generates what eager PyTorch generates for it alone."""
    _og_or_skip()
    loaded, folder = peaked
    max_length = 24
    got = genai_greedy(folder, PROMPTS, max_length=max_length)
    T = max(len(p) for p in PROMPTS)  # og's max_length counts the padded prompt length
    for p, g in zip(PROMPTS, got):
        assert g == eager_greedy(loaded.module, p, max_length - T + len(p), eos=0)


def test_the_deploy_api_gives_the_same_greedy_tokens_on_both_engines(peaked):
    """mhaexport.runtime.load on onnxruntime-genai's loop (auto) and on mhaexport's: the same greedy tokens for a
    batch of prompts of different lengths (each engine pads it its own way), ids and text, streamed or not."""
    _og_or_skip()
    import mhaexport.runtime as rt

    _, folder = peaked
    genai, ours = rt.load(folder, threads=1), rt.load(folder, threads=1, engine="mhaexport")
    assert (genai.engine, ours.engine) == ("onnxruntime-genai", "mhaexport")
    eos = genai.eos_token_id  # onnxruntime-genai's loop always stops at one: give ours the same
    a = genai.generate(PROMPTS, max_new_tokens=16, eos_token_id=eos, return_result=True)
    b = ours.generate(PROMPTS, max_new_tokens=16, eos_token_id=eos, return_result=True)
    assert a.tokens == b.tokens and a.stop_reason == b.stop_reason and a.engine == "onnxruntime-genai"
    assert len(set(a.tokens[0])) > 3  # not two constant runs
    text = [genai.generate("Hello", max_new_tokens=16, eos_token_id=eos)]
    assert text == [ours.generate("Hello", max_new_tokens=16, eos_token_id=eos)]
    assert "".join(genai.stream("Hello", max_new_tokens=16, eos_token_id=eos)) == text[0]


@pytest.mark.slow
def test_genai_greedy_equals_eager_on_a_grouped_query_model(tmp_path):
    """num_key_value_heads in genai_config.json: onnxruntime-genai runs the Llama-shaped preset's (B, 2, S, D) cache
    and gives eager's greedy tokens."""
    _og_or_skip()
    import json

    from mhaexport.exporter.onnx import export_onnx

    loaded = peaked_model("tiny-llama")
    module = loaded.module
    export_onnx(loaded, tmp_path, attention="onnx")
    cfg = json.loads((tmp_path / GENAI_CONFIG).read_text())["model"]["decoder"]
    assert (cfg["num_attention_heads"], cfg["num_key_value_heads"]) == (4, 2)
    got = genai_greedy(tmp_path, [PROMPTS[0]], max_length=32)
    want = eager_greedy(module, PROMPTS[0], 32, eos=0)
    assert got[0] == want and len(set(want[len(PROMPTS[0]):])) > 3
