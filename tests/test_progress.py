"""Progress on long work: library code reports counted steps (mhaexport.core.progress.Step); the CLI shows where the
work is and an estimate of what is left, plain lines off a terminal, one rewritten line on one; --quiet silences
it."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from mhaexport.cli import main
from mhaexport.commands.output import Reporter
from mhaexport.core.progress import Estimate, Step, counted


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_a_step_is_a_string_that_knows_where_it_is():
    s = Step("ort-cpu: parity ...", 3, 14)
    assert s == "ort-cpu: parity ..." and isinstance(s, str) and (s.done, s.total) == (3, 14)
    said = []
    step = counted(said.append, 2)
    step("a")
    step("b")
    assert [(m, m.done, m.total) for m in said] == [("a", 0, 2), ("b", 1, 2)]


def test_the_estimate_is_the_mean_time_per_finished_step(capsys):
    clock = Clock()
    r = Reporter(quiet=False, tty=False, clock=clock)
    assert r.line(Step("first", 0, 4)) == "[1/4] first (0 s)"
    clock.t += 10
    assert r.line(Step("second", 1, 4)) == "[2/4] second (10 s, ~30 s left)"  # 10 s a step, 3 to go
    clock.t += 30
    assert r.line(Step("fourth", 3, 4)) == "[4/4] fourth (40 s, ~13 s left)"
    assert r.line("a plain message") == "a plain message"
    assert r.line(Step("next phase", 0, 2)) == "[1/2] next phase (0 s)"  # a new phase: its own clock


def test_an_estimate_sent_with_the_step_is_shown_as_sent():
    """bench's steps differ in cost by orders of magnitude: it sends its own elapsed time and estimate (None: not
    known yet), which the line shows instead of the mean per step."""
    r = Reporter(quiet=False, tty=False, clock=Clock())
    assert r.line(Estimate("loading eager ...", 0, 9, 0.4, None)) == \
        "[1/9] loading eager ... (0 s, estimating what is left)"
    assert r.line(Estimate("warming up eager ...", 3, 8, 12.0, 40.0)) == "[4/8] warming up eager ... (12 s, ~40 s left)"


def test_plain_lines_off_a_terminal_and_one_line_rewritten_on_one(capsys):
    Reporter(quiet=False, tty=False, clock=Clock())(Step("x", 0, 2))
    assert capsys.readouterr().err == "  [1/2] x (0 s)\n"
    r = Reporter(quiet=False, tty=True, clock=Clock())
    r(Step("x", 0, 2))
    r(Step("y", 1, 2))
    r("done")
    err = capsys.readouterr().err.replace("\x1b[K", "")  # click drops the erase code when stderr is no terminal
    assert err.startswith("\r  [....................] 1/2 x (0 s)\r  [##########..........] 2/2 y")
    assert err.endswith("\n  done\n")  # the bar's line is ended before a plain line


@pytest.mark.parametrize("quiet", [[], ["--quiet"]])
def test_verify_shows_counted_progress_unless_quiet(tiny_export, tmp_path, quiet):
    res = CliRunner().invoke(main, ["verify", str(tiny_export), "--runtime", "ort-cpu", "-o", str(tmp_path), *quiet])
    assert res.exit_code == 0, res.output
    steps = [ln for ln in res.stderr.splitlines() if ln.lstrip().startswith("[")]
    if quiet:
        assert not steps and "Verifying" not in res.stderr
        assert "verify passed" in res.stderr  # the verdict is not progress
    else:
        # 11 checks (genai-config: the folder ships a genai_config.json) on eager and ort-cpu
        assert steps[0].strip().startswith("[1/22] eager: parity ...") and steps[-1].strip().startswith("[22/22]")
        assert any("s left)" in ln for ln in steps)


def test_verify_counts_every_pass_in_one_total(tiny_export, tmp_path):
    """onnxruntime-genai's loop runs after the contract's runtimes (its own pass): the count goes on, [23/33] after
    [22/33], where it restarted at [1/11]. A pass whose runtime is skipped takes its steps out of the total."""
    import mhaexport

    pytest.importorskip("onnxruntime_genai", reason="onnxruntime-genai is not installed: one pass only")
    said = []
    mhaexport.verify(tiny_export, runtimes=["eager", "ort-cpu", "ort-genai"], output=tmp_path,
                     progress=said.append)
    steps = [(s.done, s.total) for s in said if getattr(s, "total", None)]
    assert steps[0] == (0, 33) and [d for d, _ in steps] == list(range(33))
    assert {t for _, t in steps} == {33}


def test_the_group_option_silences_any_verb(tiny_export, tmp_path):
    res = CliRunner().invoke(main, ["-q", "quantize", str(tiny_export), "-o", str(tmp_path / "q")])
    assert res.exit_code == 0, res.output
    assert "quantizing" not in res.output and "reading" not in res.output and "wrote" in res.output


def test_bench_progress_keeps_its_total_when_rows_settle_early_or_are_skipped():
    """Bench's ``[done/total]``: the total is the planned work; warm-ups a row does not need and a skipped row's
    work count as done, so the count only moves forward against one total (issue 39: [2/40] -> [2/32] -> [6/29])."""
    from mhaexport.bench.eta import Eta

    said, now = [], [0.0]
    eta = Eta(said.append, clock=lambda: now[0])
    eta.plan("a", 10)  # warm-ups at their cap + timed repeats
    eta.plan("b", 10)
    eta.plan("c", 20)
    eta.tell("loading")
    for label in ("a", "b"):
        now[0] += 1.0
        eta.ran(label, 1.0)
        eta.tell(f"ran {label}")
    eta.drop("c")  # a runtime that failed to load
    eta.tell("c skipped")
    eta.settled("a", 6)  # steady after its first warm-ups: six of its cap unused
    eta.tell("a steady")
    for _ in range(3):
        eta.ran("a", 1.0)
        eta.tell("timed a")
    assert {m.total for m in said} == {40}
    done = [m.done for m in said]
    assert done == sorted(done) and done[0] == 0 and done[-1] == 1 + 1 + 20 + 6 + 3
    assert said[-1].left_s == 9.0  # a has nothing left; b its nine generations at 1 s each


def test_the_onnx_export_says_each_phase(tmp_path, monkeypatch):
    """`mhaexport onnx -o out/small` was silent ~20 s before its first line: the export says each phase as it starts
    (tracing, lowering, writing, checking, the self-check), and a second export of the same model that reuses the
    trace says so."""
    from mhaexport.exporter import trace
    from mhaexport.exporter.onnx import export_onnx
    from mhaexport.models.loading import load_model

    monkeypatch.setenv("MHAEXPORT_TRACE", "fresh")  # traced here, whatever an earlier test left in the cache
    loaded = load_model("tiny", random_weights=True)
    said: list[str] = []
    export_onnx(loaded, tmp_path / "a", attention="ort", progress=said.append)
    phases = ["tracing preset:tiny", "lowering the attention: ort", "writing model.onnx", "checking the file",
              "self-check: the ort file"]
    at = [next(i for i, m in enumerate(said) if m.startswith(p)) for p in phases]
    assert at == sorted(at), said
    said.clear()
    export_onnx(loaded, tmp_path / "b", progress=said.append)
    assert said[0].startswith("the trace of this model made by an earlier export in this process, reused")
    assert not any(m.startswith("lowering") or m.startswith("self-check") for m in said)  # decomposed: nothing lowered
    trace.forget(loaded.module)
