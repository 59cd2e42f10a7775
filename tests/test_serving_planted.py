"""Detection power of the serving checks (verify/serving.py): a bug planted in the deploy runtime's serving loops
(monkeypatched into this process, then `mhaexport verify` run through the real CLI) makes the check that must catch
it fail (exit 1, the check named on the FAILED line), while every healthy preset x lowering x cache passes the
serving checks (the window cache included). Slow: each case exports a folder and verifies it.

The bugs, one per check (docs/verify.md, "Serving"):

- a row's positions taken from the batch's longest row (every row's mask as long as the longest's);
- a retired row's length not reset, so the next request in its row is fed after its predecessor's cache;
- a rollback that does not rewind the cache (rejected drafts left in it);
- a draft token accepted on a near-tie (its probability within 10 % of the target's top token's);
- a reused prefix's cache written through by one request (the fork hands out the prefix's own buffers).
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from click.testing import CliRunner

from mhaexport.cli import main

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]


def _positions_from_longest(mp):
    from mhaexport.runtime.protocol import Protocol

    real = Protocol.row_mask

    def row_mask(self, lengths, width):
        lengths = np.asarray(lengths)
        return real(self, np.where(lengths > 0, lengths.max(initial=0), 0), width)

    mp.setattr(Protocol, "row_mask", row_mask)


def _seqlens_not_reset(mp):
    from mhaexport.runtime.serve import Scheduler

    def retire(self, row):
        self._owner[row] = None  # the row is free, its length left as its last request's

    mp.setattr(Scheduler, "_retire", retire)


def _rollback_not_rewinding(mp):
    from mhaexport.runtime.decode import DecodeLoop

    mp.setattr(DecodeLoop, "rewind", lambda self, state, keep, mark=None: (state, state.length))


def _near_tie_accepted(mp):
    from mhaexport.runtime import speculative

    mp.setattr(speculative, "accepts", lambda logits, draft: float(logits[draft]) >= float(np.max(logits)) -
               float(np.log(1 / 0.9)))


def _prefix_written_through(mp):
    from mhaexport.runtime.decode import DecodeLoop

    mp.setattr(DecodeLoop, "fork", lambda self, state: state)


# bug -> (plant, the check that must fail, the caches it can happen in)
BUGS = {
    "positions_from_longest_row": (_positions_from_longest, "continuous-batching", ("concat", "shared", "window")),
    "retired_row_not_reset": (_seqlens_not_reset, "continuous-batching", ("concat", "shared", "window")),
    "rollback_not_rewinding": (_rollback_not_rewinding, "speculative", ("concat", "shared", "window")),
    "near_tie_accepted": (_near_tie_accepted, "speculative", ("concat", "shared", "window")),
    # a concat cache is never written (a call's present is a new array): handing out its arrays is what a fork does
    "prefix_written_through": (_prefix_written_through, "prefix-reuse", ("shared", "window")),
}

# (preset, lowering, cache) the exporter makes: the healthy ones the serving checks must pass
HEALTHY = [("tiny", "decomposed", "concat"), ("tiny", "onnx", "concat"), ("tiny", "ort", "concat"),
           ("tiny", "ort", "shared"), ("tiny-llama", "decomposed", "concat"), ("tiny-llama", "onnx", "concat"),
           ("tiny-llama", "ort", "shared"), ("tiny-window", "decomposed", "concat"),
           ("tiny-window", "onnx", "concat"), ("tiny-window", "ort", "concat"), ("tiny-window", "ort", "shared"),
           ("tiny-window", "ort", "window"), ("tiny-gemma", "decomposed", "concat"), ("tiny-gemma", "ort", "shared"),
           ("tiny-gemma", "ort", "window"), ("tiny-sinks", "decomposed", "concat")]
SERVING = ("continuous-batching", "speculative", "prefix-reuse")


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    made: dict = {}

    def get(preset: str, lowering: str, cache: str):
        key = (preset, lowering, cache)
        if key not in made:
            folder = tmp_path_factory.mktemp(f"{preset}-{lowering}-{cache}")
            args = ["onnx", "--config", preset, "--attention", lowering, "-o", str(folder)]
            if cache != "concat":
                args += ["--kv-cache", cache]
            res = CliRunner().invoke(main, args)
            assert res.exit_code == 0, res.output
            made[key] = folder
        return made[key]

    return get


def _verify(folder, out) -> tuple[int, str, dict]:
    res = CliRunner().invoke(main, ["verify", str(folder), "--runtime", "ort-cpu", "-o", str(out)])
    return res.exit_code, res.output, json.loads((out / "report.json").read_text())


def _failed(output: str) -> set[str]:
    line = next((ln for ln in output.splitlines() if ln.startswith("FAILED:")), "")
    return set(re.findall(r"([\w-]+/[\w-]+)", line.split(":", 1)[-1]))


@pytest.mark.parametrize("bug,cache", [(bug, cache) for bug in sorted(BUGS) for cache in BUGS[bug][2]])
def test_each_planted_serving_bug_fails_its_check(bug, cache, exports, tmp_path, monkeypatch):
    plant, check, _ = BUGS[bug]
    folder = exports("tiny-window" if cache == "window" else "tiny-llama", "ort" if cache != "concat" else
                     "decomposed", cache)
    plant(monkeypatch)
    code, output, report = _verify(folder, tmp_path / "report")
    assert code == 1, output
    assert f"ort-cpu/{check}" in _failed(output), (bug, _failed(output))
    res = report["results"]["ort-cpu"][check]
    fig = res["figures"]
    # caught as a request diverging from its run alone (its first divergence in the figures), or as a row that
    # runs past the positions its requests need (a retired row's predecessor still in it)
    diverged = [r for r in fig.get("runs") or [] if r["first_divergence"] is not None or r["max_abs"] > fig["allowed"]]
    assert diverged or "cannot feed past" in res["message"], res["message"]
    if diverged:
        assert re.search(r"diverges from|logits differ|stops after \d+ tokens where", res["message"])
    assert f"ort-cpu / {check}" in (tmp_path / "report" / "report.md").read_text()


@pytest.fixture(scope="module")
def external_llama(tmp_path_factory):
    """tiny-llama with every weight in external data: verify's mapped mode runs its file in pieces, block by block."""
    from mhaexport.exporter.onnx import EXTERNAL_DATA_ENV

    folder = tmp_path_factory.mktemp("tiny-llama-external")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(EXTERNAL_DATA_ENV, "0")
        res = CliRunner().invoke(main, ["onnx", "--config", "tiny-llama", "-o", str(folder)])
    assert res.exit_code == 0, res.output
    return folder


@pytest.mark.parametrize("bug", sorted(b for b in BUGS if "concat" in BUGS[b][2]))
def test_each_planted_serving_bug_fails_its_check_taped_block_by_block(bug, external_llama, tmp_path, monkeypatch):
    """The mapped mode runs the serving checks' calls as one plan in pieces of the file (runners/tape.py): the same
    loops run over the tape, so a bug in them is in the plan, and the check fails as it does call by call."""
    plant, check, _ = BUGS[bug]
    plant(monkeypatch)
    res = CliRunner().invoke(main, ["verify", str(external_llama), "--runtime", "ort-cpu", "--mapped", "-o",
                                    str(tmp_path / "report")])
    assert res.exit_code == 1, res.output
    assert f"ort-cpu/{check}" in _failed(res.output), (bug, _failed(res.output))
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    assert report["runtimes"]["ort-cpu"]["order"].get("block by block")
    fig = report["results"]["ort-cpu"][check]["figures"]
    assert fig["order"] == "block by block", fig["order"]  # the buggy loop ran over the tape: its calls planned


def test_the_healthy_runtime_passes_the_same_cases(exports, tmp_path):
    """The folders the bugs are planted in pass untouched (the serving checks and everything else)."""
    for cache in ("concat", "shared", "window"):
        folder = exports("tiny-window" if cache == "window" else "tiny-llama",
                         "ort" if cache != "concat" else "decomposed", cache)
        code, output, report = _verify(folder, tmp_path / cache)
        assert code == 0, output
        assert all(report["results"]["ort-cpu"][ch]["status"] is True for ch in SERVING)


@pytest.mark.parametrize("preset,lowering,cache", HEALTHY)
def test_serving_checks_pass_on_every_healthy_export(preset, lowering, cache, exports):
    from mhaexport.verify import verify_folder

    folder = exports(preset, lowering, cache)
    report = verify_folder(folder, runtimes=("ort-cpu", "ort-genai"), checks=SERVING)
    for ch in SERVING:
        for rt in ("eager", "ort-cpu"):
            r = report.results[rt][ch]
            assert r.status is True, (rt, ch, r.message)
            if "window" in preset or "gemma" in preset or "sinks" in preset:  # past every window (and its buffer)
                assert r.figures.windows_crossed and r.figures.longest_position >= 28
        genai = report.results.get("ort-genai", {}).get(ch)
        if genai is not None and report.runtimes["ort-genai"].status == "ran":
            # onnxruntime-genai's Engine cannot batch a concat cache (its own defect, not run, never passed)
            want = {None} if ch == "continuous-batching" and cache == "concat" else {True}
            assert genai.status in want, (ch, genai.message)
