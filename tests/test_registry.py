"""One registry maps runtime names to runners (runners/registry.py): verify, eval and bench build theirs there.

The spy test watches real construction: every Runner made while a verb runs is recorded with whether
a function of runners/registry.py was on the stack when it was made."""

from __future__ import annotations

import pytest

from mhaexport.artifact import ExportFolder
from mhaexport.runners.registry import ARTIFACT, runner_for
from mhaexport.runners.names import ALL_RUNTIMES, MODULE_RUNTIMES, ORT_GENAI


def test_every_runtime_name_has_one_entry():
    assert set(ALL_RUNTIMES) - {ORT_GENAI} <= set(ARTIFACT) and set(MODULE_RUNTIMES) <= set(ARTIFACT)


def test_the_registry_drives_each_runtime_or_says_why(tiny, tiny_export):
    ef = ExportFolder.open(tiny_export)
    c = tiny.contract
    got = {rt: runner_for(ef, rt, c, eager=tiny.module, n_params=tiny.n_params) for rt in ARTIFACT}
    assert {rt: r.name for rt, r in got.items()} == {rt: rt for rt in ARTIFACT}
    for rt in ("eager", "torchscript", "ort-cpu", "onnx-reference"):
        assert got[rt].available, (rt, got[rt].skip_reason)
    assert "no torch.export program" in got["pt2"].skip_reason or "pt2" in got["pt2"].skip_reason
    assert "does not run a decoder" in got["torch-mha"].skip_reason
    assert "no eager model" in runner_for(ef, "eager", c).skip_reason
    # the decoder's runners answer one step alike: the registry's ort-cpu is the eager model's export
    import numpy as np

    ids = np.array([[1, 2, 3]], dtype=np.int64)
    mask = np.ones((1, 3), dtype=np.int64)
    outs = []
    for rt in ("eager", "torchscript", "ort-cpu"):
        runner = got[rt].activate()
        logits, _ = runner.step(ids, mask, runner.empty_cache(1))
        outs.append(np.asarray(logits))
    assert np.allclose(outs[0], outs[1], atol=1e-4) and np.allclose(outs[0], outs[2], atol=1e-4)


@pytest.fixture
def made(monkeypatch):
    """[(runner class, runtime name, built inside runners/registry.py)] of every Runner constructed from now on."""
    import sys

    from mhaexport.runtime.runner import Runner
    from mhaexport.runners import registry

    made: list = []
    init = Runner.__init__
    here = registry.__file__

    def spy(self, name, *args, **kwargs):
        frame, inside = sys._getframe(1), False
        while frame is not None and not inside:
            inside = frame.f_code.co_filename == here  # runner_for, or without_cache (the recompute protocol)
            frame = frame.f_back
        made.append((type(self).__name__, name, inside))
        init(self, name, *args, **kwargs)

    monkeypatch.setattr(Runner, "__init__", spy)
    return made


def test_every_runner_eval_and_bench_make_comes_from_the_registry(tiny_export, made):
    import mhaexport

    mhaexport.evaluate(tiny_export, b"a few words of text to score", runtimes=["ort-cpu"], window=8)
    evaluated = len(made)
    res = mhaexport.bench(tiny_export, runtimes=["eager", "eager-nocache", "ort-cpu"], prompt_len=4, new_tokens=2,
                          repeats=1, profile=True)
    assert res.get("ort-cpu").ran and res.profile.ops  # bench's ORT row and its profile ran
    assert {"ort-cpu", "eager", "eager-nocache"} <= {n for _, n, _ in made}
    assert sum(n == "ort-cpu" for _, n, _ in made[evaluated:]) >= 2  # the row's runner and the profile's
    outside = [(cls, n) for cls, n, inside in made if not inside]
    assert not outside, f"runners built outside runners/registry.py: {outside}"


def test_a_shared_cache_is_driven_in_two_protocols_from_the_registry(tmp_path, made, sessions):
    """verify's ort-cpu translates the contract's calls; its deploy-loop parts run the same session in the file's
    own protocol (deploy_of); bench's row and profile run that protocol. All from the registry."""
    import mhaexport
    from mhaexport.exporter.onnx import export_onnx
    from mhaexport.runtime.protocol import ContractOverShared, SharedBuffer
    from mhaexport.verify import verify_folder
    from mhaexport.runners.registry import DEPLOY, deploy_of
    from planted.edit import peaked

    loaded = peaked("tiny")
    export_onnx(loaded, tmp_path, kv_cache="shared", max_cache=64)
    # the export's lowering self-check: the decomposed and the lowered graph, the registry's runners too
    assert {("OrtRunner", "decomposed", True), ("SharedCacheOrtRunner", "shared", True)} <= set(made)
    made.clear()
    report = verify_folder(tmp_path, loaded=loaded, runtimes=("ort-cpu",), checks=("padding",))
    assert report.passed and "deploy loop" in report.results["ort-cpu"]["padding"].figures["protocol"]
    assert ("SharedCacheOrtRunner", "ort-cpu (deploy loop)", True) in made
    res = mhaexport.bench(tmp_path, runtimes=["ort-cpu", "ort-bare"], prompt_len=4, new_tokens=2, repeats=1,
                          profile=True)
    assert res.get("ort-bare").ran, res.get("ort-bare").reason  # its bare loop binds the shared buffers
    outside = [(cls, n) for cls, n, inside in made if not inside]
    assert not outside, f"runners built outside runners/registry.py: {outside}"
    driven = [how for inside, how in sessions.values() if how]
    assert any("run_with_iobinding" in how for how in driven)
    bare = [how for inside, how in sessions.values() if how and not inside]
    assert not bare, f"{len(bare)} ONNX Runtime session(s) run that no runner opened: {bare}"
    with ExportFolder.open(tmp_path) as ef:
        verify_runner = runner_for(ef, "ort-cpu", loaded.contract)
        own = runner_for(ef, "ort-cpu", loaded.contract, protocol=DEPLOY)
        assert type(verify_runner.protocol) is ContractOverShared and type(own.protocol) is SharedBuffer
        assert verify_runner.max_length == loaded.contract.max_positions and own.max_length == 64
        twin = deploy_of(verify_runner.activate())
        assert type(twin.protocol) is SharedBuffer and twin.is_active and twin.session is verify_runner.session
        assert deploy_of(own) is None and deploy_of(runner_for(ef, "eager", loaded.contract, eager=loaded.module)) is None


@pytest.mark.slow  # verify on six runtimes, eval and bench (~13 s on 2 loaded cores)
def test_every_runner_verify_eval_and_bench_make_comes_from_the_registry(tiny_export, made):
    import mhaexport

    mhaexport.verify(tiny_export, runtimes=["eager", "torchscript", "ort-cpu", "onnx-reference", "pt2", "ort-genai"],
                     tokens=2)
    verified = list(made)
    mhaexport.evaluate(tiny_export, b"a few words of text to score", runtimes=["ort-cpu"], window=8)
    mhaexport.bench(tiny_export, runtimes=["eager", "eager-nocache", "torchscript"], prompt_len=4, new_tokens=2,
                    repeats=1)
    names = {n for _, n, _ in made}
    assert {"eager", "torchscript", "ort-cpu", "onnx-reference", "pt2", "ort-genai"} <= {n for _, n, _ in verified}
    assert "eager-nocache" in names and len(made) > len(verified)  # eval's and bench's runners were seen too
    outside = [(cls, n) for cls, n, inside in made if not inside]
    assert not outside, f"runners built outside runners/registry.py: {outside}"


def test_every_runtime_has_its_protocol():
    from mhaexport.bench.config import ALL_RUNTIMES as BENCH_RUNTIMES
    from mhaexport.runners.registry import PROTOCOLS

    missing = (set(ALL_RUNTIMES) | set(MODULE_RUNTIMES) | set(BENCH_RUNTIMES) - {"ort-bare"}) - set(PROTOCOLS)
    assert not missing, missing


def test_one_table_says_which_runtimes_each_verb_takes_and_one_function_refuses_the_rest():
    import re

    import mhaexport.bench as bench
    from mhaexport.core.errors import ConfigError, RuntimeOptionError
    from mhaexport.runners.names import BENCH, DEFAULT_RUNTIMES, EVAL, RUNTIMES, VERIFY, refuse_unknown

    for verb, table in RUNTIMES.items():
        assert table.default and set(table.default) <= set(table.accepts), verb
        refuse_unknown(table.accepts, verb)  # every name it accepts passes
        known = re.escape(", ".join(table.accepts))
        with pytest.raises(ConfigError, match=rf"^unknown runtime\(s\) nope, ort-tpu; known: {known}$"):
            refuse_unknown(["eager", "nope", "ort-tpu"], verb)
    with pytest.raises(RuntimeOptionError):  # bench's, as before: a ConfigError and a RuntimeInputError
        refuse_unknown(["nope"], BENCH)
    with pytest.raises(ConfigError, match="known: .*ort-genai, torch-mha$"):  # verify: a decoder's or a block's
        refuse_unknown(["nope"], VERIFY, "verify --module attention")
    # the names the API exports are the table's entries
    assert (ALL_RUNTIMES, DEFAULT_RUNTIMES) == (RUNTIMES[VERIFY].accepts, RUNTIMES[VERIFY].default)
    assert (bench.ALL_RUNTIMES, bench.DEFAULT_RUNTIMES) == (RUNTIMES[BENCH].accepts, RUNTIMES[BENCH].default)
    assert "eager-nocache" in bench.ALL_RUNTIMES and "eager-nocache" not in bench.DEFAULT_RUNTIMES
    assert RUNTIMES[EVAL].default == ("ort-cpu",)


@pytest.fixture
def sessions(monkeypatch):
    """Every ONNX Runtime session made from now on and every call that drives one: {id(session): (made inside a
    runner's activation, [how it was run])}. A session runs only where a runner opened it: the runner's protocol
    (runtime/protocol.py) decides the feeding, whoever holds the session (bench's bare loop holds the runner's)."""
    import sys

    import onnxruntime as ort

    from mhaexport.runtime import ort as ort_runners

    seen: dict = {}
    here = ort_runners.__file__
    init, run, run_bound = ort.InferenceSession.__init__, ort.InferenceSession.run, \
        ort.InferenceSession.run_with_iobinding

    def made(self, *args, **kwargs):
        frame, inside = sys._getframe(1), False
        while frame is not None and not inside:  # a runner's activate_impl (runtime/ort.py) opened it
            inside = frame.f_code.co_filename == here and frame.f_code.co_name == "activate_impl"
            frame = frame.f_back
        init(self, *args, **kwargs)
        seen[id(self)] = (inside, [])

    def ran(how):
        def spy(self, *args, **kwargs):
            seen.setdefault(id(self), (False, []))[1].append(how)
            return (run if how == "run" else run_bound)(self, *args, **kwargs)
        return spy

    monkeypatch.setattr(ort.InferenceSession, "__init__", made)
    monkeypatch.setattr(ort.InferenceSession, "run", ran("run"))
    monkeypatch.setattr(ort.InferenceSession, "run_with_iobinding", ran("run_with_iobinding"))
    return seen


def test_every_onnx_runtime_session_export_quantize_eval_and_bench_drive_is_a_registry_runners(tmp_path, tiny, made,
                                                                                               sessions):
    """The decision "every ORT session of every verb is driven through a protocol from the registry", checked by
    watching sessions and runners being made and run: the plain lowering self-check, quantize's smoke run, eval, and
    bench's ORT row, bare loop and onnxruntime-genai row (the shared cache's self-check, verify and bench's shared
    rows: the test above)."""
    import mhaexport

    plain, q = tmp_path / "ort", tmp_path / "int8"
    mhaexport.export_onnx(plain, model=tiny, attention="ort")  # the plain lowering self-check: two graphs
    mhaexport.quantize(plain, q, weights="int8")  # its smoke run
    assert {"decomposed", "ort", "quantized"} <= {n for _, n, inside in made if inside}
    mhaexport.evaluate(q, b"a few words of text to score", runtimes=["ort-cpu"], window=8)
    res = mhaexport.bench(plain, runtimes=["ort-cpu", "ort-bare", "ort-genai"], prompt_len=4, new_tokens=2, repeats=1)
    assert res.get("ort-bare").ran, res.get("ort-bare").reason
    assert {"ort-cpu", "ort-bare", "ort-genai"} <= {n for _, n, _ in made}
    outside = [(cls, n) for cls, n, inside in made if not inside]
    assert not outside, f"runners built outside runners/registry.py: {outside}"
    driven = {k: v for k, v in sessions.items() if v[1]}
    assert len(driven) >= 5  # two self-check graphs, the smoke run, eval's and bench's sessions
    bare = [how for inside, how in driven.values() if not inside]
    assert not bare, f"{len(bare)} ONNX Runtime session(s) run that no runner opened: {bare}"
