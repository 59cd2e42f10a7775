"""Serving in the deploy runtime: continuous batching (runtime/serve.py), speculative decoding
(runtime/speculative.py) and a prefix's cache reused (DecodeLoop.fork, Scheduler's prefixes), each request equal to
its run alone, on a concat file and a shared-buffer file; verify's serving checks (verify/serving.py) pass on them
with eager's floor in their figures. The window cache and the planted bugs: tests/test_serving_planted.py (slow)."""

from __future__ import annotations

import numpy as np
import pytest

from mhaexport.core.errors import RuntimeInputError, RuntimeOptionError
from mhaexport.exporter.onnx import export_onnx
from mhaexport.runtime import DecodeLoop, GenerationConfig, PromptLookup, Request, Scheduler, speculative_generate
from mhaexport.runtime.choose import open_folder, ort_runner_for
from mhaexport.runtime.serve import alone
from mhaexport.runtime.speculative import DraftModel
from mhaexport.verify import verify_folder
from mhaexport.verify.results import SERVING_CHECKS

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def shared_folder(tiny, tmp_path_factory):
    folder = tmp_path_factory.mktemp("serve_shared")
    export_onnx(tiny, folder, kv_cache="shared", max_cache=64)
    return folder


@pytest.fixture(params=["concat", "shared"])
def loop(request, tiny_export, shared_folder):
    folder = tiny_export if request.param == "concat" else shared_folder
    runner = ort_runner_for(open_folder(folder), "ort", io_binding=None).activate()
    assert runner.protocol.in_place == (request.param == "shared")
    return DecodeLoop(runner)


def _requests(seed: int = 0) -> list[Request]:
    rng = np.random.default_rng(seed)
    return [Request(rng.integers(1, 256, p).tolist(), n, a)
            for p, n, a in [(9, 6, 0), (2, 9, 0), (6, 4, 1), (5, 7, 3), (11, 3, 3), (3, 5, 9)]]


@pytest.mark.parametrize("rows", [1, 2, 4])
def test_a_continuous_batch_gives_each_request_its_tokens_and_logits_alone(loop, rows):
    reqs = _requests()
    eos = alone(loop, reqs[1]).tokens[0][2]  # the second request retires at eos, mid-run
    cfg = GenerationConfig(eos_token_id=eos)
    sched = Scheduler(loop, rows, cfg, keep_logits=True)
    events = list(sched.run(reqs))
    for i, (r, out) in enumerate(zip(reqs, sched.outcomes)):
        ref = alone(loop, r, cfg, keep_logits=True)
        assert out.tokens == ref.tokens[0], i
        err = max(np.abs(a - b[0]).max() for a, b in zip(out.logits, ref.step_logits))
        assert err < 1e-5, (i, err)
        assert out.joined >= r.arrival and out.finished in ("eos", "max_new_tokens")
        mine = [e for e in events if e.request == i]
        assert [e.index for e in mine] == list(range(len(out.tokens))) and [e.token for e in mine] == out.tokens
        assert [e.finished for e in mine[:-1]] == [None] * (len(mine) - 1) and mine[-1].finished == out.finished
    assert sched.outcomes[1].finished == "eos"
    # never more requests running than rows: at each step, the rows in use
    for step in {e.step for e in events}:
        assert len({e.row for e in events if e.step == step}) <= rows


def test_rows_are_reused_after_a_request_retires(loop):
    reqs = [Request([5, 6, 7], 2), Request([8, 9], 6), Request([10, 11, 12, 13], 3, arrival=1)]
    sched = Scheduler(loop, 2, GenerationConfig())
    list(sched.run(reqs))
    first, second, third = sched.outcomes
    assert third.row == first.row and third.joined == 1  # the row request 0 left, at the step it left it


def test_serving_refuses_what_does_not_fit(loop):
    c = loop.contract
    with pytest.raises(RuntimeInputError, match="passes"):
        list(Scheduler(loop, 2).run([Request([1] * (c.max_positions - 2), 8)]))
    with pytest.raises(RuntimeInputError, match="outside the vocabulary"):
        list(Scheduler(loop, 2).run([Request([c.vocab_size], 2)]))
    with pytest.raises(RuntimeOptionError, match="rows"):
        Scheduler(loop, 0)
    with pytest.raises(RuntimeOptionError, match="max_new_tokens"):
        Request([1, 2], 0)


@pytest.mark.parametrize("drafter", ["prompt-lookup", "draft-model"])
@pytest.mark.parametrize("k", [1, 4])
def test_speculative_decoding_gives_plain_greedys_tokens(loop, drafter, k):
    for prompt in ([5, 17, 42, 9] * 3, [200, 3, 77, 1, 54]):
        cfg = GenerationConfig(max_new_tokens=14)
        plain = loop.generate([prompt], cfg, keep_logits=True)
        d = PromptLookup() if drafter == "prompt-lookup" else DraftModel(DecodeLoop(loop.runner))
        res = speculative_generate(loop, prompt, cfg, d, k=k, keep_logits=True)
        assert res.tokens[0] == plain.tokens[0]
        assert max(np.abs(a - b).max() for a, b in zip(res.step_logits, plain.step_logits)) < 1e-5
        s = res.speculative
        assert 0 <= s["accepted"] <= s["drafted"] and s["target_calls"] >= 1
        assert s["target_calls"] + s["accepted"] - s["refeeds"] == len(res.tokens[0]) - 1  # one call, a + 1 tokens
    if drafter == "draft-model":  # the file drafting for itself: every draft agrees, k + 1 tokens a call
        assert s["accepted"] == s["drafted"] > 0 and s["target_calls"] < len(res.tokens[0]) - 1


def test_speculative_decoding_is_greedy_only(loop):
    from mhaexport.runtime import SamplingConfig

    with pytest.raises(RuntimeOptionError, match="greedy only"):
        speculative_generate(loop, [1, 2, 3], GenerationConfig(sampling=SamplingConfig(temperature=0.7)),
                             PromptLookup())


def test_prompt_lookup_drafts_what_followed_the_last_ngram():
    d = PromptLookup(ngram=3)
    assert d.propose([1, 2, 3, 4, 5, 9, 1, 2, 3], 3) == [4, 5, 9]
    assert d.propose([7, 8, 9], 3) == []  # nothing repeats
    assert d.propose([1, 2, 1, 2], 5) == [1, 2]  # the latest earlier occurrence, cut at the end


def test_forks_of_a_prefix_grow_apart(loop):
    """Two requests reuse a prefix's cache, fed and decoded in turn: each equal to its whole prompt alone (a shared
    buffer is copied by the fork; a concat cache's arrays are shared, never written)."""
    prefix, suffixes = [9, 8, 7, 6, 5, 4], [[1, 2, 3], [100, 101, 102, 103, 104]]
    _, base = loop.prefill(np.asarray([prefix]), np.ones((1, len(prefix)), np.int64), 20)
    states, got = [], []
    for s in suffixes:  # both forks fed before either decodes: a fork sharing the other's slots would show
        lg, st = loop.feed(np.asarray([s]), loop.fork(base))
        states.append(st)
        got.append([int(np.argmax(lg[0, -1]))])
    for _ in range(4):
        for j in range(2):
            lg, states[j] = loop.decode_one_token(np.asarray([got[j][-1]]), states[j])
            got[j].append(int(np.argmax(lg[0])))
    for j, s in enumerate(suffixes):
        assert got[j] == loop.generate([prefix + s], GenerationConfig(max_new_tokens=5)).tokens[0]


def test_a_batch_given_prefixes_reuses_their_cache(loop):
    prefix = [9, 8, 7, 6, 5, 4]
    reqs = [Request(prefix + [1, 2, 3], 5), Request(prefix + [100, 101], 5), Request([3, 3, 3], 4)]
    sched = Scheduler(loop, 2, keep_logits=True, prefixes=[prefix])
    list(sched.run(reqs))
    assert [o.prefix for o in sched.outcomes] == [6, 6, 0]
    assert len(sched.prefill_s) == 1  # the prefix computed once
    for r, out in zip(reqs, sched.outcomes):
        assert out.tokens == alone(loop, r).tokens[0]


def test_text_model_serves_and_decodes_speculatively(tiny_export):
    import mhaexport.runtime as rt

    model = rt.load(tiny_export, engine="mhaexport")
    events = list(model.serve([[5, 17, 42], [7, 7, 7, 7], Request([1, 2, 3], 3, arrival=2)], rows=2,
                              max_new_tokens=5))
    by = {i: [e.token for e in events if e.request == i] for i in range(3)}
    assert by[0] == model.generate([5, 17, 42], max_new_tokens=5, eos_token_id=model.eos_token_id)[:len(by[0])]
    assert len(by[2]) <= 3 and events[-1].finished is not None
    prompt = [5, 17, 42, 5, 17, 42, 5, 17]
    res = model.generate(prompt, max_new_tokens=10, draft="prompt-lookup", return_result=True)
    assert res.tokens[0] == model.generate(prompt, max_new_tokens=10) and res.speculative["drafted"] > 0
    assert model.generate(prompt, max_new_tokens=10, draft=model) == res.tokens[0]
    with pytest.raises(RuntimeOptionError, match="one prompt"):
        model.generate([prompt, prompt], draft="prompt-lookup")


def test_text_requests_stream_their_text(tiny_export):
    import mhaexport.runtime as rt

    model = rt.load(tiny_export, engine="mhaexport")
    if model.tokenizer is None:
        pytest.skip("the tiny export ships no tokenizer")
    events = list(model.serve(["ab", "xyz"], rows=2, max_new_tokens=4))
    for i, prompt in enumerate(["ab", "xyz"]):
        text = "".join(e.text for e in events if e.request == i)
        assert text == model.generate(prompt, max_new_tokens=4)


@pytest.mark.parametrize("which", ["concat", "shared"])
def test_verify_serving_checks_pass_with_eagers_floor(tiny_export, shared_folder, which):
    folder = tiny_export if which == "concat" else shared_folder
    report = verify_folder(folder, runtimes=("ort-cpu",), checks=SERVING_CHECKS)
    for ch in SERVING_CHECKS:
        eager, ort = report.results["eager"][ch], report.results["ort-cpu"][ch]
        assert eager.status is True and ort.status is True, (ch, eager.message, ort.message)
        f = ort.figures
        assert f.floor is not None and f.floor == eager.figures.max_abs  # eager's own difference, the floor
        assert f.max_abs <= f.allowed and f.allowed >= f.floor
        assert all(run["first_divergence"] is None for run in f.runs) and len(f.runs) >= 2
    spec = report.results["ort-cpu"]["speculative"].figures.runs
    scripted = next(r for r in spec if r["drafter"] == "scripted")
    assert scripted["accepted"] < scripted["drafted"] and len(scripted["near_ties"]) == 3  # rejections probed


def test_bench_serving_times_both_against_the_plain_loop(tiny_export, tmp_path):
    from mhaexport.bench import BenchConfig, markdown_body, run_bench
    from mhaexport.bench.probes import Bandwidth

    cfg = BenchConfig(prompt_len=8, new_tokens=8, repeats=1, threads=1, runtimes=("ort-cpu",), serving="1,2",
                      max_warmups=2)
    res = run_bench(tiny_export, cfg, probe=lambda threads: Bandwidth({"sum": 10.0}, threads, 64, "fake"))
    sv = res.serving
    assert [p.rows for p in sv.batching] == [1, 2] and sv.requests == 8 and sv.tokens > 0
    assert all(p.tokens_per_s > 0 and p.ratio == pytest.approx(p.tokens_per_s / sv.plain_tokens_per_s, rel=1e-2)
               for p in sv.batching)
    assert [p.prompt for p in sv.speculative] == ["repetitive", "non-repetitive"]
    assert sv.same_tokens and all(p.same_tokens for p in sv.speculative)
    assert "| 2 rows |" in markdown_body(res) and "x plain loop" in markdown_body(res)
    again = type(res).from_dict(res.to_dict())  # bench.json round trip
    assert again.serving.batching[1].rows == 2
    with pytest.raises(Exception, match="serving"):
        BenchConfig(serving="1,x")


@pytest.mark.skipif(not __import__("importlib").util.find_spec("onnxruntime_genai"),
                    reason="onnxruntime-genai is not installed")
def test_onnxruntime_genais_engine_serves_a_shared_cache_and_cannot_batch_a_concat_one(tiny_export, shared_folder):
    """Its Engine (static batches for these files) passes on a shared buffer; on a concat cache it fails the batch
    once a request ends first (its own defect): the part is not run, with the reason, never passed. If a later
    onnxruntime-genai fixes it, this test says so."""
    report = verify_folder(shared_folder, runtimes=("ort-genai",), checks=SERVING_CHECKS)
    assert all(report.results["ort-genai"][ch].status is True for ch in SERVING_CHECKS), report.results["ort-genai"]
    assert "static batches" in report.results["ort-genai"]["continuous-batching"].figures.engine
    concat = verify_folder(tiny_export, runtimes=("ort-genai",), checks=SERVING_CHECKS).results["ort-genai"]
    r = concat["continuous-batching"]
    assert r.status is None and r.message.startswith("not run: onnxruntime-genai") and \
        "cannot batch a file without past_present_share_buffer" in r.message
    assert concat["speculative"].status is True and concat["prefix-reuse"].status is True
