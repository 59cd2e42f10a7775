"""Guess, plan, confirm (runners/tape.py): a free-running serving loop's calls written down over a tape answering
with eager's logits, run as one plan (ONNX Runtime in pieces, block by block), then confirmed call by call — the
same tokens and logits as the loop run on the runtime itself; a wrong guess leaves the plan (Untaped), never
changes a result. And verify's mapped mode runs the serving checks so, with the same verdicts."""

from __future__ import annotations

import numpy as np
import pytest

from mhaexport.runners.calls import Derived
from mhaexport.runners.decoder import EagerRunner
from mhaexport.runners.plan import BLOCK, order_of, run_in_turn, run_plan
from mhaexport.runners.tape import Recorder, Tape, Untaped, tape_unsupported
from mhaexport.runtime import DecodeLoop, GenerationConfig, PromptLookup, Request, Scheduler, speculative_generate
from mhaexport.runtime.runner import Runner
from mhaexport.runtime.serve import alone

pytestmark = pytest.mark.usefixtures("one_thread")


def _serve(runner) -> list[tuple[list[int], list[np.ndarray]]]:
    """A continuous batch (a request retiring at eos, rows reused), a speculative generation (rewinds) and a
    prefix's cache forked into two requests: each one's tokens and logits."""
    loop = DecodeLoop(runner)
    rng = np.random.default_rng(5)
    reqs = [Request(rng.integers(1, 256, p).tolist(), n, a) for p, n, a in [(9, 6, 0), (2, 7, 0), (6, 4, 1), (5, 5, 3)]]
    eos = alone(loop, reqs[1]).tokens[0][2]
    sched = Scheduler(loop, 2, GenerationConfig(eos_token_id=eos), keep_logits=True)
    for _ in sched.run(reqs):
        pass
    out = [(o.tokens, o.logits) for o in sched.outcomes]
    gram = rng.integers(1, 256, 4).tolist()
    res = speculative_generate(loop, gram * 3, GenerationConfig(max_new_tokens=8), PromptLookup(), k=3,
                               keep_logits=True)
    out.append((res.tokens[0], [lg[0] for lg in res.step_logits]))
    prefix = rng.integers(1, 256, 6).tolist()
    sched = Scheduler(loop, 2, GenerationConfig(max_new_tokens=4), keep_logits=True, prefixes=[prefix])
    for _ in sched.run([Request(prefix + rng.integers(1, 256, s).tolist(), 4) for s in (2, 3)]):
        pass
    return out + [(o.tokens, o.logits) for o in sched.outcomes]


def _close(a, b, atol: float) -> None:
    assert len(a) == len(b)
    for (ta, la), (tb, lb) in zip(a, b):
        assert ta == tb
        assert all(np.allclose(x, y, atol=atol, rtol=atol) for x, y in zip(la, lb))


def test_a_derived_past_replays_the_runners_own_cache_moves():
    rng = np.random.default_rng(0)
    pairs = [tuple((rng.standard_normal((b, 2, s, 4)).astype(np.float32),) * 2 for _ in range(3))
             for b, s in ((2, 7), (1, 4))]
    r = Runner("numpy", None)
    want = r.cache_columns(r.cache_put_row(pairs[0], 1, r.cache_row(pairs[1], 0, 1, 4)), 2, 7)
    d = Derived.present(0, 2, 7).put_row(1, Derived.present(1, 1, 4).row(0, 1, 4)).columns(2, 7)
    got = d.evaluate(lambda i: pairs[i], lambda b: None)
    assert (d.batch, d.length) == (2, 5) and d.sources() == [0, 1]
    assert all(np.array_equal(x, y) for p, q in zip(got, want) for x, y in zip(p, q))
    with pytest.raises(ValueError):
        Derived.present(0, 2, 7).row(2, 0, 7)


def test_a_serving_loop_taped_from_eagers_calls_runs_in_pieces_as_it_runs_call_by_call(external_export, tiny):
    from mhaexport.artifact import ExportFolder
    from mhaexport.runners.registry import runner_for

    eager = Recorder(EagerRunner("eager", tiny.contract, tiny.module).activate())
    _serve(eager)
    with ExportFolder.open(external_export) as ef:
        r = runner_for(ef, "ort-cpu", ef.contract).activate()
        assert tape_unsupported(r) is None
        itself = _serve(r)
        r.block_order = True
        assert order_of(r) == (BLOCK, "")
        tape = Tape(r, eager.logits)
        _serve(tape)
        assert len(tape.calls) == len(eager.logits) > 30
        assert any(isinstance(c.past, Derived) and c.past.op != "present" for c in tape.calls)  # rows, rewinds
        results = run_plan(r, tape.calls)
        assert r.plan_calls == {BLOCK: len(tape.calls)} and all(x.error is None for x in results)
        confirm = Tape(r, [x.logits for x in results], tape.calls)
        taped = _serve(confirm)
        assert len(confirm.calls) == len(tape.calls)
        in_turn = run_in_turn(r, tape.calls)  # the same plan call by call: the derived pasts on whole caches
        r.deactivate()
    _close(taped, itself, 1e-5)
    assert all(np.allclose(a.logits, b.logits, atol=1e-5) for a, b in zip(in_turn, results))


def test_a_wrong_guess_leaves_the_plan_and_changes_no_result(tiny_export, tiny):
    from mhaexport.artifact import ExportFolder
    from mhaexport.runners.registry import runner_for

    eager = Recorder(EagerRunner("eager", tiny.contract, tiny.module).activate())
    _serve(eager)
    wrong = [lg.copy() for lg in eager.logits]
    last = wrong[5][0, -1]
    last[int(np.argsort(last)[-2])] = last.max() + 1.0  # eager "chose" its runner-up at call 5
    with ExportFolder.open(tiny_export) as ef:
        r = runner_for(ef, "ort-cpu", ef.contract).activate()
        tape = Tape(r, wrong)
        _serve(tape)
        results = run_in_turn(r, tape.calls)
        confirm = Tape(r, [x.logits for x in results], tape.calls)
        with pytest.raises(Untaped, match="not the one planned"):
            _serve(confirm)
        r.deactivate()


def test_a_recorder_past_its_budget_keeps_no_guesses(tiny):
    eager = Recorder(EagerRunner("eager", tiny.contract, tiny.module).activate(), budget=10_000)
    _serve(eager)
    assert eager.full and eager.logits == []


def test_a_shared_buffers_runner_is_not_taped(tiny, tmp_path):
    from mhaexport.exporter.onnx import export_onnx
    from mhaexport.runtime.choose import open_folder, ort_runner_for

    export_onnx(tiny, tmp_path, kv_cache="shared", max_cache=64)
    r = ort_runner_for(open_folder(tmp_path), "ort", io_binding=None)
    assert "its cache moves are its own" in tape_unsupported(r)
