"""--kv-cache shared: past and present are one preallocated buffer per layer that GroupQueryAttention writes in
place; the runtime binds the same OrtValue as both, verify translates the contract into the file's protocol, and
onnxruntime-genai runs it with past_present_share_buffer."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
import torch

from mhaexport.core.errors import RuntimeInputError
from mhaexport.exporter.onnx import export_onnx
from mhaexport.runtime import GenerationConfig, Generator
from mhaexport.verify import verify_folder
from mhaexport.verify.render import markdown
from planted.edit import peaked

PROMPTS = [[72, 101, 108, 108, 111], [200, 17, 3], [9, 8, 7, 6, 5, 4, 3, 2]]


def eager_greedy(module, prompt: list[int], n: int) -> list[int]:
    out = list(prompt)
    with torch.no_grad():
        ids = torch.tensor([prompt])
        logits, past = module(ids, torch.ones_like(ids), None)
        for _ in range(n):
            t = int(logits[0, -1].argmax())
            out.append(t)
            logits, past = module(torch.tensor([[t]]), torch.ones(1, len(out), dtype=torch.int64), past)
    return out[len(prompt):]


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    loaded = peaked("tiny")
    folder = tmp_path_factory.mktemp("shared")
    rec = export_onnx(loaded, folder, kv_cache="shared", max_cache=64)
    return loaded, folder, rec


def test_the_graph_writes_one_buffer_in_place_and_the_manifest_says_so(shared):
    loaded, folder, rec = shared
    entry = rec.manifest.artifacts["onnx"]
    assert (entry.details.cache.kind, entry.details.cache.max_cache, entry.details.attention) == ("shared", 64, "gqa")
    assert entry.io["inputs"]["past_key_values.0.key"]["shape"] == ["batch_size", 4, "max_cache_length", 16]
    assert entry.io["outputs"]["present.1.value"]["shape"] == ["batch_size", 4, "max_cache_length", 16]
    assert entry.details.lowering.self_check_max_abs_diff is not None  # checked against the decomposed graph
    model = onnx.load(str(folder / "model.onnx"))
    gqa = [n for n in model.graph.node if n.op_type == "GroupQueryAttention"]
    assert len(gqa) == 2 and {"present.0.key", "present.1.value"} <= {o for n in gqa for o in n.output}
    assert not any(n.op_type in ("Softmax", "Concat") and any(o.startswith("present.") for o in n.output)
                   for n in model.graph.node)  # nothing copies the cache into present
    cfg = json.loads((folder / "genai_config.json").read_text())
    assert cfg["search"]["past_present_share_buffer"] is True


def test_the_runtime_binds_one_buffer_and_generates_eagers_tokens(shared):
    """Right-padded batch of unequal prompts; the buffers keep their memory from step to step (never copied)."""
    loaded, folder, _ = shared
    gen = Generator(folder, threads=1)
    assert gen.runner.padding == "right"
    ids, mask, _ = gen.pad_prompts(PROMPTS)
    logits, state = gen.prefill(ids, mask)
    ptrs = [v.data_ptr() for v in state.cache]
    for _ in range(3):
        logits, state = gen.decode_one_token(logits.argmax(-1), state)
    assert [v.data_ptr() for v in state.cache] == ptrs  # the same buffers, written in place
    assert state.cache[0].shape() == [3, 4, 64, 16]
    res = gen.generate(PROMPTS, GenerationConfig(max_new_tokens=12))
    want = [eager_greedy(loaded.module, p, 12) for p in PROMPTS]
    assert res.tokens == want and len(set(want[0])) > 3
    long = gen.generate([[1] * 60], GenerationConfig(max_new_tokens=20))  # the buffer has 64 slots
    assert long.stop_reason == "max_positions" and len(long.tokens[0]) == 5
    assert "the shared cache's 64 slots (--max-cache)" in long.message


def test_a_generation_sizes_its_buffers_and_every_steps_logits_stay_its_own(shared):
    """generate sizes the buffers to prompt + new tokens (as onnxruntime-genai does); the loop's IOBinding is made
    once per cache and reused, and each step's logits are an array of their own: keeping them across steps (as
    verify does) must not see a later step's values."""
    loaded, folder, _ = shared
    gen = Generator(folder, threads=1)
    loop = gen.loop
    ids, mask, _ = gen.pad_prompts(PROMPTS[:1])
    logits, state = loop.prefill(ids, mask, positions=ids.shape[1] + 3)
    assert state.capacity == ids.shape[1] + 3 and state.cache[0].shape() == [1, 4, ids.shape[1] + 3, 16]
    io = state.cache.io
    kept = [logits]
    for _ in range(3):
        logits, state = loop.decode_one_token(kept[-1].argmax(-1), state)
        kept.append(logits)
    assert state.cache.io is io  # bound once, reused by every step
    assert len({id(x) for x in kept}) == 4 and len({x.ctypes.data for x in kept}) == 4
    # the kept logits are what a fresh full run gives at each position
    seq = ids[0].tolist() + [int(x.argmax(-1)[0]) for x in kept[:3]]
    full = gen.forward(np.array([seq]), np.ones((1, len(seq)), np.int64))[0]  # (1, S, V)
    for k, x in enumerate(kept):
        np.testing.assert_allclose(x[0], full[0, ids.shape[1] - 1 + k], atol=1e-4)
    with pytest.raises(RuntimeInputError, match="the 8 positions this cache was made for"):
        loop.decode_one_token(kept[-1].argmax(-1), state)  # a ninth position: past what it was made for
    res = gen.generate(PROMPTS[:1], GenerationConfig(max_new_tokens=12))  # sized to 5 + 12, never refused
    assert res.tokens == [eager_greedy(loaded.module, PROMPTS[0], 12)]


def test_logits_the_loop_cannot_hand_in_are_allocated_by_onnx_runtime_instead(shared):
    """A file whose logits do not fit the array the loop hands ONNX Runtime (here: a wrong dtype planted) still
    decodes, with ONNX Runtime allocating them from then on; a call that is bad in itself still raises."""
    loaded, folder, _ = shared
    gen = Generator(folder, threads=1)
    want = gen.generate(PROMPTS[:1], GenerationConfig(max_new_tokens=6)).tokens
    gen.runner._into = np.dtype(np.float64)  # ORT refuses to write there
    assert gen.generate(PROMPTS[:1], GenerationConfig(max_new_tokens=6)).tokens == want
    assert gen.runner._into is None
    with pytest.raises(Exception):
        gen.runner._run_shared(np.array([[1]]), np.ones((1, 1000), np.int64), gen.runner.buffers(1, 8))


def test_verify_translates_the_contract_and_every_check_passes(shared):
    loaded, folder, _ = shared
    report = verify_folder(folder, loaded=loaded, runtimes=("ort-cpu",))
    assert report.passed, markdown(report)
    assert all(r.status is True for r in report.results["ort-cpu"].values())


def test_verify_runs_the_deploy_loop_and_says_which_protocol_each_check_ran(shared):
    loaded, folder, _ = shared
    report = verify_folder(folder, loaded=loaded, runtimes=("ort-cpu",), checks=("kv-consistency", "padding",
                                                                                  "generation"))
    assert report.passed, markdown(report)
    for name in ("kv-consistency", "padding", "generation"):
        assert "deploy loop: buffers in place, a ragged right-padded batch" in report.results["ort-cpu"][
            name].figures["protocol"]
    assert report.results["ort-cpu"]["kv-consistency"].figures["deploy_rows"] == [10, 7]  # ragged


def test_the_loops_stepper_runs_the_same_calls_as_its_generic_step(shared, monkeypatch):
    """The decode loop steps a shared cache through SharedSteps (ids, logits and a mask bound once, rebound views):
    the same logits at every step as through Runner.step, a ragged batch, sampling and a stop at eos included."""
    from mhaexport.runtime import SamplingConfig
    from mhaexport.runtime.ort import SharedCacheOrtRunner, SharedSteps

    _, folder, _ = shared
    gen = Generator(folder, threads=1)
    made = []
    real = SharedCacheOrtRunner.stepper
    monkeypatch.setattr(SharedCacheOrtRunner, "stepper", lambda *a: made.append(real(*a)) or made[-1])
    cfg = GenerationConfig(max_new_tokens=10, sampling=SamplingConfig(temperature=1.0, seed=2))
    fast = gen.loop.generate(PROMPTS, cfg, keep_logits=True)
    assert made and all(isinstance(m, SharedSteps) for m in made)
    monkeypatch.setattr(SharedCacheOrtRunner, "stepper", lambda *a: None)  # every step through Runner.step
    slow = gen.loop.generate(PROMPTS, cfg, keep_logits=True)
    assert fast.tokens == slow.tokens and len(set(fast.tokens[0])) > 3
    assert all(np.array_equal(a, b) for a, b in zip(fast.step_logits, slow.step_logits))
    eos = fast.tokens[1][4]
    stop = GenerationConfig(max_new_tokens=10, eos_token_id=eos, sampling=cfg.sampling)
    monkeypatch.setattr(SharedCacheOrtRunner, "stepper", real)
    assert gen.generate(PROMPTS, stop).tokens[1] == fast.tokens[1][:fast.tokens[1].index(eos) + 1]


@pytest.mark.parametrize("bug", ["a reused buffer loses the last slot of row 1", "ragged rows share a length"])
def test_a_bug_only_the_deploy_loop_shows_fails_verify(shared, monkeypatch, bug):
    """A defect of the in-place protocol itself (the loop generate and bench run): verify's contract translation
    never binds a buffer across calls nor packs ragged rows in one call with a past, so only the deploy loop sees
    it; kv-consistency must fail and say the deploy loop differs."""
    from mhaexport.runtime.ort import SharedSteps

    loaded, folder, _ = shared
    real = SharedSteps.step  # the deploy loop's decode steps (the decode loop's stepper for a shared cache)

    def buggy(self, tokens):
        if bug.startswith("ragged"):
            self.mask[:] = 1  # every row fed as if as long as the longest: the shorter row's holes read
        out = real(self, tokens)
        if bug.startswith("a reused") and self.ids.shape[0] > 1:
            for buf in self.bufs:  # (B, H, max_cache, D): the slot just written for row 1, lost
                arr = buf.numpy()
                arr[1, :, int(self.mask[1, :self.length].sum()) - 1] = 0
                buf.update_inplace(arr)
        return out

    monkeypatch.setattr(SharedSteps, "step", buggy)
    report = verify_folder(folder, loaded=loaded, runtimes=("ort-cpu",), checks=("kv-consistency",))
    res = report.results["ort-cpu"]["kv-consistency"]
    assert res.status is False, res.message
    assert "the deploy loop (buffers reused in place over a ragged right-padded batch) differs from eager" in res.message


class _CudaSessionOverHostAttention:
    """A CPU session dressed as onnxruntime-gpu's CUDA session of a float32 shared cache: the CUDA provider first,
    its GroupQueryAttention on the CPU provider (no float32 CUDA kernel), so the past inputs are read on the host
    (``get_input_memory_infos``, the real CPU session's). ``copies``: its IOBinding copies each past bound, as ONNX
    Runtime's copies an input bound on another device than its reader when it is bound (IOBinding::BindInput): a
    binding reused across calls then feeds that copy, not what the last call wrote."""

    def __init__(self, session, past: list[str], copies: bool) -> None:
        self.session, self.past, self.copies, self.copied = session, set(past), copies, 0

    def get_providers(self):
        return ["CUDAExecutionProvider", "CPUExecutionProvider"]

    def io_binding(self):
        import onnxruntime as ort

        io, dressed = self.session.io_binding(), self

        class Binding:
            def bind_ortvalue_input(self, name, value):
                if dressed.copies and name in dressed.past:  # a snapshot of the buffer as it is now
                    value = ort.OrtValue.ortvalue_from_numpy(value.numpy().copy())
                    dressed.copied += 1
                io.bind_ortvalue_input(name, value)

            def __getattr__(self, name):
                return getattr(io, name)

        binding = Binding()
        binding.real = io
        return binding

    def run_with_iobinding(self, io, *args):
        return self.session.run_with_iobinding(io.real, *args)

    def __getattr__(self, name):
        return getattr(self.session, name)


def _dress_as_cuda(monkeypatch, copies: bool) -> list[_CudaSessionOverHostAttention]:
    """Every session the ONNX Runtime runners open for "cuda" is a CPU one dressed as above; the list fills as they
    are opened."""
    import dataclasses

    from mhaexport.runtime import ort as ort_runtime

    real_open = ort_runtime.open_session
    dressed: list[_CudaSessionOverHostAttention] = []

    def open_as_cuda(model, config, **kwargs):
        cuda = any("cuda" in p.lower() for p in config.providers)
        session, warnings, from_cache = real_open(model, dataclasses.replace(config, providers=("cpu",)), **kwargs)
        if not cuda:
            return session, warnings, from_cache
        past = [i.name for i in session.get_inputs() if i.name.startswith("past_key_values.")]
        dressed.append(_CudaSessionOverHostAttention(session, past, copies))
        return dressed[-1], warnings, from_cache

    monkeypatch.setattr(ort_runtime, "open_session", open_as_cuda)
    return dressed


@pytest.mark.parametrize("copies", [False, True])
def test_on_a_cuda_session_the_buffers_live_where_the_attention_reads_them(shared, monkeypatch, copies):
    """The CUDA deploy-loop bug (docs/measurements/gpu-check-2026-12-04.md): onnxruntime-gpu runs a float32
    GroupQueryAttention on the CPU provider, and the loop bound CUDA buffers once and reused the binding, so every
    step after the prefill read the copy ONNX Runtime made when the buffer was bound (its zeros). Now the buffers
    live where the session reads them (the host here), and a non-CPU session binds the past again before each call:
    a ragged batch generates eager's tokens even where each binding copies the buffer."""
    loaded, folder, _ = shared
    dressed = _dress_as_cuda(monkeypatch, copies)
    gen = Generator(folder, "cuda", threads=1)
    runner = gen.runner
    runner.activate()
    assert (runner.device, runner.cache_device) == ("cuda", "cpu")  # host buffers, never made on "cuda" here
    assert runner.buffers(1, 8)[0].device_name().lower() == "cpu"
    res = gen.generate(PROMPTS, GenerationConfig(max_new_tokens=8))
    assert res.tokens == [eager_greedy(loaded.module, p, 8) for p in PROMPTS]
    # every call after the prefill bound the past again: 2 per layer per call (prefill, 7 steps)
    assert dressed[-1].copied == (2 * 2 * 8 if copies else 0)


def test_verify_on_ort_cuda_runs_the_fixed_deploy_loop(shared, monkeypatch):
    """``verify --runtime ort-cuda`` builds its runners through the registry, so it runs the fixed loop: on CUDA
    sessions as above (each past copied when bound) its deploy-loop checks pass. The same emulation with the loop as
    it was gives the H200 report's figures to three digits (small preset: 6.85, 11.4, margin 3.24)."""
    loaded, folder, _ = shared
    dressed = _dress_as_cuda(monkeypatch, copies=True)
    report = verify_folder(folder, loaded=loaded, runtimes=("ort-cuda",),
                           checks=("kv-consistency", "padding", "generation"))
    assert dressed and dressed[-1].copied > 0  # the checks ran on the dressed CUDA session, copying
    assert report.passed, markdown(report)
    assert report.results["ort-cuda"]["kv-consistency"].figures["deploy_max_abs"] < 1e-4


def test_consumed_on_says_where_a_session_reads_its_inputs(shared):
    from mhaexport.runtime.ort import consumed_on
    from mhaexport.runtime.session import cpu_session

    _, folder, _ = shared
    session = cpu_session(folder / "model.onnx")
    assert consumed_on(session, ["past_key_values.0.key", "past_key_values.1.value"], "cuda") == "cpu"
    assert consumed_on(session, ["no such input"], "cuda") == "cuda"

    class Older:  # an onnxruntime without get_input_memory_infos: the session's device
        def get_inputs(self):
            return session.get_inputs()

    assert consumed_on(Older(), ["past_key_values.0.key"], "cuda") == "cuda"


def test_eval_drives_a_shared_cache_as_verify_does(shared):
    """eval builds its runners where verify does: on a shared-cache folder ort-cpu scores the text as eager does."""
    from mhaexport.evaluate.perplexity import evaluate_folder
    from mhaexport.evaluate.scoring import score_text, text_tokens
    from mhaexport.runners.decoder import EagerRunner

    loaded, folder, _ = shared
    text = bytes(range(32, 127)) * 3
    (row,) = evaluate_folder(folder, text, text_source="test", runtimes=("ort-cpu",)).rows
    assert row.status == "ran", row.reason
    ids, byte_level = text_tokens(text, loaded.contract)
    eager = EagerRunner("eager", loaded.contract, loaded.module).activate()
    want = score_text(eager, ids, byte_level=byte_level)[0]
    assert row.score.tokens == want.tokens and row.score.perplexity == pytest.approx(want.perplexity, rel=1e-4)


def test_bench_bare_loop_on_a_shared_cache_decodes_eagers_tokens(shared):
    """bench's ort-bare row binds the buffers once and the logits afresh each call (the prompt's are (B, P, V), a
    step's (B, 1, V)), alone and on the ort-cpu row's session."""
    from mhaexport.artifact import ExportFolder
    from mhaexport.bench import BenchConfig
    from mhaexport.bench.rows import BareRow, plan_rows

    loaded, folder, _ = shared
    prompt = np.array([PROMPTS[0]], dtype=np.int64)
    want = [eager_greedy(loaded.module, PROMPTS[0], 6)]
    cfg = BenchConfig(threads=1, repeats=1)
    rows = plan_rows(folder, ExportFolder.open(folder), cfg, ("ort-cpu", "ort-bare"), [], None, "no eager")
    for row in rows:
        row.activate()
        assert row.ok, row.record.reason
    assert isinstance(rows[1], BareRow) and rows[1].session is rows[0].runner.session
    for row in rows:
        assert row.generate(prompt, 6).tokens == want, row.record.name


@pytest.mark.slow
def test_genai_greedy_equals_eager_on_a_shared_cache(shared):
    pytest.importorskip("onnxruntime_genai")
    from mhaexport.runtime.genai import genai_greedy

    loaded, folder, _ = shared
    got = genai_greedy(folder, PROMPTS, max_length=24)
    T = max(len(p) for p in PROMPTS)  # og's max_length counts the padded prompt
    for p, g in zip(PROMPTS, got):
        assert g[len(p):] == eager_greedy(loaded.module, p, 24 - T)


def test_the_deploy_api_gives_the_same_greedy_tokens_on_both_engines(shared):
    """onnxruntime-genai's loop over the shared buffers (past_present_share_buffer) and mhaexport's IO-bound loop:
    the same greedy tokens for a right-padded batch."""
    pytest.importorskip("onnxruntime_genai")
    import mhaexport.runtime as rt

    _, folder, _ = shared
    genai, ours = rt.load(folder, threads=1), rt.load(folder, threads=1, engine="mhaexport")
    assert genai.engine == "onnxruntime-genai"
    eos = genai.eos_token_id
    a = genai.generate(PROMPTS, max_new_tokens=12, eos_token_id=eos, return_result=True)
    assert a.tokens == ours.generate(PROMPTS, max_new_tokens=12, eos_token_id=eos) and len(set(a.tokens[0])) > 3


@pytest.mark.slow
@pytest.mark.parametrize("preset,dtype", [("tiny-llama", "float32"), ("tiny", "float16"), ("tiny-llama", "float16")])
def test_grouped_heads_and_float16_on_a_shared_cache(tmp_path, preset, dtype):
    from mhaexport.models.loading import load_model

    # float16 keeps the default init: the x10 weights' activations are beyond float16's 1e-2 tolerance either way
    loaded = peaked(preset) if dtype == "float32" else load_model(preset)
    export_onnx(loaded, tmp_path, kv_cache="shared", dtype=dtype)
    report = verify_folder(tmp_path, loaded=loaded, runtimes=("ort-cpu",))
    assert report.passed, markdown(report)
    res = Generator(tmp_path, threads=1).generate(PROMPTS[:2], GenerationConfig(max_new_tokens=8))
    if dtype == "float32":
        assert res.tokens == [eager_greedy(loaded.module, p, 8) for p in PROMPTS[:2]]


def test_bad_shared_cache_options(tiny, tmp_path):
    from mhaexport.core.errors import ExportError

    with pytest.raises(ExportError, match="the ONNX Attention op has no in-place cache"):
        export_onnx(tiny, tmp_path, kv_cache="shared", attention="onnx")
    with pytest.raises(ExportError, match="--kv-cache shared needs dynamic axes"):
        export_onnx(tiny, tmp_path, kv_cache="shared", seq_dynamic=False, seq_len=4)
    with pytest.raises(ExportError, match=r"--max-cache 500: expected 1..max_positions=128"):
        export_onnx(tiny, tmp_path, kv_cache="shared", max_cache=500)
    with pytest.raises(ExportError, match="--max-cache sizes a shared cache"):
        export_onnx(tiny, tmp_path, max_cache=32)
    assert not (tmp_path / "model.onnx").exists()
