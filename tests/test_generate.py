"""`mhaexport generate` (CliRunner and one real subprocess) and the shipped trained weights of the default model."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from mhaexport.core.devices import no_cuda_device
from mhaexport.cli import main
from mhaexport.runtime import GenerationConfig, Generator, SamplingConfig

ROOT = Path(__file__).resolve().parents[1]


def gen_cli(*args):
    return CliRunner().invoke(main, ["generate", *map(str, args)])


def test_json_tokens_match_the_runtime(tiny_export):
    r = gen_cli(tiny_export, "--prompt-ids", "5,17,42", "--max-new-tokens", "8", "--threads", "1", "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    want = Generator(tiny_export).generate([[5, 17, 42]], GenerationConfig(max_new_tokens=8)).tokens[0]
    assert out["tokens"] == want and len(want) == 8
    assert out["stop_reason"] == "max_new_tokens" and out["providers"] == ["CPUExecutionProvider"]
    assert set(out) >= {"tokens", "text", "stop_reason", "message", "prompt_lengths", "providers"}
    assert out["prompt_lengths"] == [3] and out["message"] == "generated max_new_tokens=8"
    assert out["text"] == bytes(t for t in want if t < 256).decode("utf-8", errors="replace")


def test_json_is_the_results_to_dict(tiny_export):
    r = gen_cli(tiny_export, "--prompt-ids", "5,17,42", "--prompt-ids", "1,2", "--max-new-tokens", "3", "--json",
                "--engine", "mhaexport")  # the Generator's loop (the default picks onnxruntime-genai's where it runs)
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    res = Generator(tiny_export).generate([[5, 17, 42], [1, 2]], GenerationConfig(max_new_tokens=3))
    texts = [bytes(t for t in toks if t < 256).decode("utf-8", errors="replace") for toks in res.tokens]
    want = res.to_dict(texts)
    timings = {"prefill_s", "first_token_s"}
    assert set(out) == set(want) and timings <= set(out)
    assert {k: v for k, v in out.items() if k not in timings} == {k: v for k, v in want.items() if k not in timings}
    assert out["tokens"] == res.tokens and out["text"] == texts  # several prompts: lists per prompt


def test_batch_and_sampling_options(tiny_export):
    args = [tiny_export, "--prompt-ids", "5,17,42", "--prompt-ids", "1,2", "--max-new-tokens", "6", "--temperature",
            "0.9", "--top-k", "40", "--top-p", "0.9", "--seed", "7", "--json", "--engine", "mhaexport"]  # our sampler
    a, b = gen_cli(*args), gen_cli(*args)
    assert a.exit_code == 0, a.output
    tokens = json.loads(a.stdout)["tokens"]
    assert tokens == json.loads(b.stdout)["tokens"] and [len(t) for t in tokens] == [6, 6]
    cfg = GenerationConfig(max_new_tokens=6, sampling=SamplingConfig(temperature=0.9, top_k=40, top_p=0.9, seed=7))
    assert tokens == Generator(tiny_export).generate([[5, 17, 42], [1, 2]], cfg).tokens


def test_text_prompt_prints_prompt_and_continuation(tiny_export):
    r = gen_cli(tiny_export, "--prompt", "Hello", "--max-new-tokens", "4")
    assert r.exit_code == 0, r.output
    assert r.stdout.startswith("Hello") and "generated max_new_tokens=4" in r.stderr


@pytest.mark.parametrize("args, message", [
    (["--prompt-ids", "5,999"], "prompt 0 holds token id 999, outside the vocabulary [0, 256)"),
    (["--prompt-ids", "5,x"], "expected comma-separated integers"),
    ([], "give --prompt TEXT or --prompt-ids"),
    (["--prompt-ids", "1", "--provider", "cuda"],
     f"CUDAExecutionProvider requested; {no_cuda_device() or 'session runs on'}"),
])
def test_bad_input_exits_2_with_one_line(tiny_export, args, message):
    r = gen_cli(tiny_export, *args)
    if "cuda" in args and r.exit_code == 0:
        pytest.skip("ONNX Runtime's CUDA provider works here")
    assert r.exit_code == 2, r.output
    assert message in r.output and "Traceback" not in r.output


def test_missing_folder_exits_2(tmp_path):
    r = gen_cli(tmp_path / "nope", "--prompt-ids", "1")
    assert r.exit_code == 2 and "does not exist" in r.output


def test_real_subprocess(tiny_export):
    proc = subprocess.run([sys.executable, "-m", "mhaexport", "generate", str(tiny_export), "--prompt-ids", "5,17,42",
                           "--max-new-tokens", "3", "--json"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert len(json.loads(proc.stdout)["tokens"]) == 3


# ---- the shipped weights of the default model ------------------------------------------------------------------

WEIGHTS = ROOT / "models" / "weights" / "small.pt"


@pytest.fixture(scope="module")
def small():
    if not WEIGHTS.is_file():
        pytest.fail(f"{WEIGHTS} is missing: run `python scripts/train_default.py`")
    from mhaexport.models.loading import load_model

    return load_model()  # the default preset, with its shipped weights


def test_default_model_loads_the_shipped_weights(small):
    assert small.spec == "preset:small" and small.checkpoint == "shipped:small.pt"


def test_shipped_weights_predict_the_corpus(small):
    text = (ROOT / "data" / "essays.txt").read_bytes()[:1024]
    ids = torch.tensor([list(text)])  # (1, 1024)
    losses = []
    with torch.no_grad():
        for i in range(0, 1024 - 1, 255):
            x = ids[:, i:i + 256]
            logits, _ = small.module(x, torch.ones_like(x), None)
            losses.append(torch.nn.functional.cross_entropy(logits[0, :-1], x[0, 1:]).item())
    loss = sum(losses) / len(losses)
    assert loss < 2.0, f"mean next-byte loss {loss:.2f} nats (random weights: {math.log(256):.2f})"


@pytest.mark.slow  # ~7 s: 200 tokens generated on the default model; test_shipped_weights_predict_the_corpus stays fast
def test_shipped_weights_continue_text_readably(small):
    ids = torch.tensor([list(b"The river ")])
    mask = torch.ones_like(ids)
    out, past, cur = [], None, ids
    with torch.no_grad():
        for _ in range(60):
            logits, past = small.module(cur, mask, past)
            cur = logits[:, -1:].argmax(-1)  # (1, 1)
            out.append(int(cur))
            mask = torch.cat([mask, torch.ones(1, 1, dtype=mask.dtype)], dim=1)
    text = bytes(out).decode("utf-8", errors="replace")
    assert all(32 <= b < 127 or b == 10 for b in out), text  # printable ASCII prose
    assert " " in text and len(set(out)) >= 8, text  # words, not one byte repeated for ever
