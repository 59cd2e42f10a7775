"""The quality figures themselves (evaluate/scoring.py, judged by verify/quality.py), the held-out text and bench's
quantized rows, on numbers made up for the purpose: no export, no session, milliseconds."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from mhaexport.bench.result import RuntimeBench
from mhaexport.bench.run import quantized_rows
from mhaexport.models.text import HELDOUT_FILE, heldout_text, split_corpus
from mhaexport.evaluate.scoring import Agreement, agreement_length, windows
from mhaexport.verify.quality import THRESHOLDS, _verdict, judge, thresholds_for

ROOT = Path(__file__).resolve().parent.parent


def test_heldout_text_is_exactly_what_training_never_read():
    corpus = b"\n\n".join(f.read_bytes() for f in sorted((ROOT / "data").glob("*.txt")))  # train_default's corpus
    train, held = split_corpus(corpus)
    assert heldout_text() == held and len(held) == 1377
    assert train + held == corpus
    assert HELDOUT_FILE.parent.name == "weights" and not list((ROOT / "data").glob("**/small-heldout.txt"))


@pytest.mark.parametrize("n, length, stride", [(1377, 256, None), (1377, 256, 256), (100, 256, None), (10, 4, 1),
                                               (257, 256, 128), (2, 256, None)])
def test_windows_score_every_prediction_at_most_once_with_context(n, length, stride):
    scored = []
    for start, end, first in windows(n, length, stride):
        assert end - start == min(length, n) and 0 <= first < end - start - 0
        scored += [start + k + 1 for k in range(first, end - start - 1)]  # the tokens predicted
        if start:  # after the first window every prediction has the overlap as context
            assert first >= min(length, n) - (stride or length // 2) - 1
    assert len(scored) == len(set(scored)) and min(scored) == 1 and max(scored) == n - 1
    if stride in (None, 1) or stride < length:
        assert scored == list(range(1, n))  # overlapping windows: every next token is scored


def test_agreement_figures_on_made_up_logits():
    rng = np.random.default_rng(0)
    ref = rng.normal(0, 3, (50, 16))
    a = Agreement()
    a.add(ref, ref)
    f = a.figures()
    assert f["top1"] == 1.0 and f["kl_mean"] == 0.0 and f["logit_err"] == 0.0 and not f["flat"]
    b = Agreement()
    b.add(ref, ref + 5.0)  # a shift changes no probability: logits are shift-free
    assert b.figures()["kl_mean"] == pytest.approx(0.0, abs=1e-12) and b.figures()["logit_err"] < 1e-12
    c = Agreement()
    c.add(ref, -ref)
    assert c.figures()["top1"] == 0.0 and c.figures()["logit_err"] == pytest.approx(2.0, rel=1e-6)
    flat = Agreement()
    flat.add(rng.normal(0, 1e-3, (20, 16)), rng.normal(0, 1e-3, (20, 16)))
    assert flat.figures()["flat"] is True and flat.figures()["eager_entropy"] == pytest.approx(math.log(16), 1e-3)


def test_judge_names_the_figure_and_its_threshold():
    assert judge("top1", 0.71, 0.85) == "top-1 agreement 0.71 < 0.85"
    assert judge("kl_mean", 0.2, 0.1) == "KL mean 0.2 > 0.1"
    assert judge("ppl_ratio", 1.05, 1.10) is None and judge("top1", None, 0.9) is None
    assert agreement_length([1, 2, 3, 4], [1, 2, 9, 4]) == 2 and agreement_length([1, 2], [1, 2]) == 2
    assert THRESHOLDS["int8"].ppl_ratio == 1.02 and THRESHOLDS["int4"].ppl_ratio == 1.10
    limits, table = thresholds_for("int3")
    assert table == "int4" and limits == THRESHOLDS["int4"]  # an unknown scheme: the loosest table, said so


def _fig(top1_text, flat=False):
    text = {"positions": 100, "top1": top1_text, "kl_mean": 0.01, "kl_p99": 0.1, "logit_err": 0.05, "ppl_ratio": 1.0,
            "flat": flat, "eager_entropy": 5.5 if flat else 1.0, "log_vocab": 5.545}
    sweep = {"positions": 50, "top1": 0.5, "kl_mean": 0.01, "kl_p99": 0.1, "logit_err": 0.05, "flat": flat,
             "eager_entropy": 1.0, "log_vocab": 5.545}
    return {"scheme": "int4", "text": text, "sweep": sweep,
            "greedy": {"prompts": 8, "tokens": 32, "lengths": [2] * 8, "mean": 2.0, "min": 2, "fraction": 0.0625}}


def test_verdict_judges_text_top1_and_leaves_flat_or_synthetic_top1_alone():
    limits = THRESHOLDS["int4"]
    r = _verdict(_fig(0.71), limits)
    assert r.status is False and "top-1 agreement 0.71 < 0.85 (text)" in r.message
    assert "(sweep)" not in r.message.split(" — ")[0]  # the sweep's top-1 (random ids) is not judged beside text
    assert "greedy agreement 0.0625 < 0.125" in r.message
    r = _verdict(_fig(0.71, flat=True), limits)
    assert r.status is True and any("flat" in w for w in r.figures["not_judged"])


def test_bench_notes_a_quantized_row_slower_than_float():
    def row(label, quant, p50, wbytes=None):
        return RuntimeBench(label, ran=True, label=label, lowering="attention=decomposed float32", quantization=quant,
                            providers=["CPUExecutionProvider"], token_p50_ms=p50, weight_bytes_per_token=wbytes)

    rows = [row("ort-cpu", None, 5.0), row("ort-cpu [int4]", "int4", 2.0, 26_000_000),
            row("ort-cpu [int8]", "int8", 6.2, 45_000_000)]
    notes = quantized_rows(rows, 166_000_000, floor_ms=3.7)
    assert rows[0].weight_bytes_per_token == 166_000_000 and rows[1].floor_ratio == pytest.approx(2.0 / 3.7, 1e-3)
    assert len(notes) == 1 and notes[0].startswith("ort-cpu [int8] is slower than float on this machine (6.20 ms")


def test_float_targets_read_a_float_row_when_the_folder_is_quantized():
    from mhaexport.artifact.record import Environment
    from mhaexport.bench import BenchConfig
    from mhaexport.bench.result import BandwidthInfo, BenchModel, BenchResult
    from mhaexport.bench.targets import evaluate

    def row(name, quant, p50):
        return RuntimeBench(name, ran=True, lowering="attention=decomposed float32" + (f" {quant}" if quant else ""),
                            quantization=quant, providers=["CPUExecutionProvider"], token_p50_ms=p50, token_spread=1.1)

    runs = [row("ort-cpu", "int4", 2.0), row("ort-cpu [attention=decomposed float32]", None, 7.0)]
    res = BenchResult("f", BenchConfig(prompt_len=32, new_tokens=128, batch=1, threads=2), BenchModel("preset:bench"),
                      Environment(), 28.5, BandwidthInfo(28.5, "sum", 2), 166_000_000, 5.83, runs)
    by = {t.target: t for t in evaluate(res)}
    floor = by["ORT CPU per-token p50 / weight-bandwidth floor"]
    assert floor.measured == pytest.approx(7.0 / 5.83, abs=1e-3)  # the float row, not the folder's int4 one
    assert "float32]" in floor.detail
    assert by["ORT CPU int4 per-token p50 / float weight-bandwidth floor"].measured == pytest.approx(2.0 / 5.83,
                                                                                                     abs=1e-3)


def test_greedy_prompts_of_one_length_run_as_one_batch_with_each_prompts_own_tokens():
    """verify's quality check decodes its prompts together where they are of one length: one prefill and n - 1
    steps for all of them (an 8 B model's eager reference reads its weights once per step, not once per prompt and
    step), each row's tokens those the prompt gives alone; prompts of other lengths run one at a time."""
    from mhaexport.evaluate.scoring import greedy_tokens, greedy_tokens_each, text_prompts, text_tokens
    from mhaexport.models.loading import load_model
    from mhaexport.models.text import heldout_text
    from mhaexport.runners.decoder import EagerRunner

    loaded = load_model("small")  # trained: peaked logits, no near-tie for a wider batch's rounding to flip
    runner = EagerRunner("eager", loaded.contract, loaded.module).activate()
    ids, _ = text_tokens(heldout_text(), loaded.contract, None)
    prompts = text_prompts(ids, 4, 16)
    alone = [greedy_tokens(runner, p, 8) for p in prompts]
    calls = []
    real_step = runner.step
    runner.step = lambda ids, *a, **kw: calls.append(ids.shape) or real_step(ids, *a, **kw)
    assert greedy_tokens_each(runner, prompts, 8) == alone
    assert calls == [(4, 16)] + [(4, 1)] * 7  # one batch: a prefill of every prompt, then 7 steps
    calls.clear()
    ragged = [prompts[0], prompts[1][:12]]
    assert greedy_tokens_each(runner, ragged, 8) == [alone[0], greedy_tokens(runner, ragged[1], 8)]
    assert calls[:8] == [(1, 16)] + [(1, 1)] * 7  # one at a time
    assert len(set(map(tuple, alone))) > 1  # the prompts' tokens differ: rows were not mixed up unseen
