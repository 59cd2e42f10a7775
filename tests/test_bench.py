"""`mhaexport bench` (mhaexport.bench): what it measures on the tiny export, what it writes, how report.md gains its
table, how --compare / --lowerings put several lowerings of one model side by side, and the rules — warm-up until
steady, spread per row, verdicts only where the spread allows, a floor that names its probe — on fabricated timings.

Every run here gets a fake bandwidth probe (fixed figures), so no test reads 256 MiB; one test runs the real probes
on 8 MiB."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from mhaexport import bench
from mhaexport.bench import (REPORT_BEGIN, REPORT_END, Bandwidth, BenchConfig, BenchResult, RuntimeBench, run_bench,
                             weight_bytes_per_token, write_bench)
from mhaexport.artifact.record import Environment
from mhaexport.bench import probes
from mhaexport.bench.result import BandwidthInfo, BenchModel, LongRun, load_bench
from mhaexport.bench.config import ALL_RUNTIMES, DEFAULT_RUNTIMES
from mhaexport.core.progress import Estimate
from mhaexport.bench.render import floor_text, targets_table
from mhaexport.bench.render import markdown_body as _markdown_body
from mhaexport.core.untrusted import unescape_md
from mhaexport.bench.rows import Row
from mhaexport.bench.run import run_rounds
from mhaexport.bench.stats import repeat_spread, token_spread
from mhaexport.bench.targets import evaluate
from mhaexport.cli import main
from mhaexport.core.errors import ArtifactError, ConfigError, RuntimeFailure, RuntimeInputError
from mhaexport.exporter.variants import export_lowerings, parse_lowerings
from mhaexport.core.iospec import ModelContract
from mhaexport.core.progress import Step
from mhaexport.runtime.runner import Runner

# every runtime but the code ones (pt2, aoti: tests/test_pt2.py), eager-nocache included (opt-in), and the project's
# targets (opt-in): the module's one full run
EVERY = tuple(r for r in ALL_RUNTIMES if r not in ("pt2", "aoti"))
SMALL = dict(prompt_len=8, new_tokens=6, repeats=2, threads=1, long_to=40, runtimes=EVERY, targets=True)


def markdown_body(*args, **kwargs) -> str:
    """bench.md's body as it reads rendered (data is Markdown-escaped: core.untrusted.md)."""
    return unescape_md(_markdown_body(*args, **kwargs))


def _read_md(path) -> str:
    return unescape_md(path.read_text())


def fake_probe(threads: int) -> Bandwidth:
    """Fixed bandwidths: gemv is the fastest read."""
    return Bandwidth({"copy": 10.0, "sum": 8.0, "gemv": 12.5}, threads, 256, "fake")


@pytest.fixture(autouse=True)
def no_real_probe(monkeypatch):
    """CLI runs use the fake probe too (run_bench looks the default up when it runs)."""
    monkeypatch.setattr(probes, "default_probe", fake_probe)


@pytest.fixture(scope="module")
def result(tiny_export):
    return run_bench(tiny_export, BenchConfig(**SMALL), probe=fake_probe)


def test_every_runtime_ran_or_says_why(result):
    by = {r.name: r for r in result.runtimes}
    assert list(by) == ["eager", "eager-nocache", "eager-cuda", "torchscript", "ort-cpu", "ort-bare", "ort-genai",
                        "ort-cuda"]
    genai = ["ort-genai"] if by["ort-genai"].ran else []
    if not genai:
        assert "onnxruntime_genai cannot be imported" in by["ort-genai"].reason
    for name in ["eager", "eager-nocache", "torchscript", "ort-cpu", "ort-bare"] + genai:
        r = by[name]
        assert r.ran is True, (name, r.reason)
        assert r.repeats == (1 if name == "eager-nocache" else 2)
        assert r.token_min_ms <= r.token_p50_ms <= r.token_p90_ms
        assert r.ttft_ms >= r.prefill_ms > 0 and r.tokens_per_s > 0
        assert r.positions == list(range(8, 13)) and len(r.per_position_ms) == 5  # new_tokens - 1 decode steps
        assert 2 <= r.warmups <= 5 and len(r.warmup_token_ms) == r.warmups and r.steady in (True, False)
        assert r.token_spread >= 1.0
        assert (r.repeat_spread is None) == (r.repeats == 1)
    assert by["ort-cpu"].providers == ["CPUExecutionProvider"]
    for name in ("eager-cuda", "ort-cuda"):
        r = by[name]
        assert r.ran is True or (r.ran is None and r.reason), (name, r.reason)  # skipped only with a reason


def test_long_run_bandwidth_floor_and_targets(result, tiny_export):
    lr = result.long_run()
    assert lr.positions[0] == 8 and lr.positions[-1] == 39 and len(lr.ms) == len(lr.positions)
    assert (lr.near, lr.far) == (8, 31)  # tiny stops at 40: far is the last full +-8 window, not 1000
    assert set(lr.at) == {"8", "31"} and all(v > 0 for v in lr.at.values()) and lr.spread >= 1.0
    assert result.bandwidth_gbps == 12.5 and result.bandwidth.read == 12.5  # the fake probe's fastest
    assert (result.floor_probe, result.floor_threads) == ("gemv", 1)  # the probe that set it, at BenchConfig.threads
    assert result.floor_ms == pytest.approx(result.weight_bytes_per_token / (result.bandwidth_gbps * 1e9) * 1e3,
                                            rel=1e-3, abs=1e-4)  # floor_ms is rounded to 4 decimals
    from mhaexport.artifact import ExportFolder

    c = ExportFolder.open(tiny_export).contract
    per_position = 2 * c.n_layers * c.n_kv_heads * c.head_dim * 4  # float32 keys and values, batch 1
    assert lr.bytes_at["31"] - lr.bytes_at["8"] == 23 * per_position
    assert lr.bytes_at["8"] == result.get("ort-cpu").weight_bytes_per_token + 9 * per_position
    assert len(result.targets) == 12  # every target listed, measured or not
    peer = [t for t in result.targets if "the builder's" in t.target]
    assert len(peer) == 2 and all(t.verdict == "not measured" and t.met is None for t in peer)  # no builder rows
    int4 = next(t for t in result.targets if "int4" in t.target)
    assert int4.verdict == "not measured" and int4.met is None  # no quantized export in this run
    at1000 = next(t for t in result.targets if "position 1000" in t.target)
    assert at1000.met is None and at1000.measured is None  # tiny stops at 128: not measured, never "met"
    assert at1000.verdict == "not measured"
    ratio = next(t for t in result.targets if t.target.startswith("ORT CPU per-token p50 / eager"))
    by = {r.name: r for r in result.runtimes}
    assert ratio.measured == pytest.approx(by["ort-cpu"].token_p50_ms / by["eager"].token_p50_ms, abs=1e-3)
    assert ratio.spread == max(by["ort-cpu"].token_spread, by["eager"].token_spread)
    assert ratio.applies is False  # the limits are set for the bench preset, this is tiny


def test_weight_bytes_count_tied_head_once_and_one_position_row(tiny):
    m = tiny.module
    cfg = tiny.config
    total = sum(p.numel() for p in m.parameters()) * 4  # parameters() yields the tied matrix once
    assert weight_bytes_per_token(m, batch=1) == total - cfg.max_positions * cfg.d_model * 4 + cfg.d_model * 4


def test_writes_files_and_refreshes_report_idempotently(result, tmp_path):
    from mhaexport.api import write_reports
    from mhaexport.verify.render import markdown, write_report
    from mhaexport.verify.report import ReportModel, SweepInfo, ToleranceInfo, VerifyReport

    verified = VerifyReport(model=ReportModel("preset:tiny"), folder=str(tmp_path), sweep=SweepInfo("quick", 0, 9),
                            tolerance=ToleranceInfo(1e-4, 1e-3), runtimes={}, results={})
    write_report(verified, tmp_path)  # the folder's verify report: report.md is made from its report.json
    report = tmp_path / "report.md"
    written = write_bench(result, tmp_path)
    assert {p.name for p in written} >= {"bench.json", "bench.md", "bench.html", "report.md"}
    page = (tmp_path / "bench.html").read_text()  # self-contained, its plot inline
    assert not re.search(r"<script|<link|(?:src|href)\s*=\s*[\"']?\s*(?:https?:|//)", page, re.I)
    assert "<svg" in page and "Per-token latency against position" in page and "<b>ort-cpu" in page
    data = json.loads((tmp_path / "bench.json").read_text())
    assert data["schema"] == "mhaexport.bench/1" and list(data)[0] == "schema"
    assert data["runtimes"][0]["name"] == "eager" and "floor_ms" in data
    assert data["bandwidth"]["probe"] == "gemv" and data["bandwidth"]["threads"] == 1
    assert data["versions"]["mhaexport"] and data["environment"]["threads"] == 1  # mhaexport.core.env's records
    assert "plot" not in data["environment"]  # the markdown's plot line stays in the markdown
    back = load_bench(tmp_path)  # read back into the same types, written back key for key
    assert back.to_dict() == data and back.config == result.config and back.long_run().at == result.long_run().at
    bad = {**data, "floor_ms": "fast"}
    with pytest.raises(ArtifactError, match=r"^bench result x: field floor_ms is 'fast' \(str\), expected float$"):
        BenchResult.from_dict(bad, "bench result x")
    assert not list(tmp_path.glob(".*.tmp"))  # atomic writes leave no temporary files behind
    md = _read_md(tmp_path / "bench.md")
    assert "| ort-cpu [attention=decomposed float32] | CPUExecutionProvider |" in md and "Weight-bandwidth floor" in md
    assert "(set by the gemv probe on 1 thread)" in md
    # the preset's targets are for `bench` at 2 threads: the tiny run's figures are shown, never as verdicts
    assert "(other run conditions: a figure, not a verdict)" in md or "| yes |" not in md
    assert "| spread | repeats apart |" in md
    once = report.read_text()
    write_bench(result, tmp_path)
    twice = report.read_text()
    assert once == twice and twice.count(REPORT_BEGIN) == 1 and twice.count(REPORT_END) == 1
    assert twice.startswith(markdown(verified))  # the verify report first, made again from report.json
    write_reports(verified, tmp_path)  # verify again: its report.md keeps the bench section, made from bench.json
    assert report.read_text() == twice


def test_without_matplotlib_says_so_and_skips_only_the_plot(result, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    written = write_bench(result, tmp_path)
    assert not (tmp_path / "bench.png").exists() and (tmp_path / "bench.json").exists()
    assert "No plot: matplotlib is not installed" in _read_md(tmp_path / "bench.md")
    assert len(written) == 3 and "<svg" in (tmp_path / "bench.html").read_text()  # bench.html draws its own
    assert "plot" not in json.loads((tmp_path / "bench.json").read_text())["environment"]
    assert "No plot" not in markdown_body(result)  # the terminal summary has no plot line


def test_plot_written_when_matplotlib_present(result, tmp_path):
    pytest.importorskip("matplotlib", reason="matplotlib (the 'plot' extra) is not installed")
    write_bench(result, tmp_path)
    assert (tmp_path / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bad_bench_requests(tiny_export):
    with pytest.raises(RuntimeInputError, match="exceeds the model's max_positions=128"):
        run_bench(tiny_export, BenchConfig(prompt_len=100, new_tokens=64), probe=fake_probe)
    with pytest.raises(RuntimeInputError, match="unknown runtime"):
        run_bench(tiny_export, BenchConfig(runtimes=("ort-tpu",)), probe=fake_probe)
    with pytest.raises(ConfigError, match="unknown graph optimization level"):
        run_bench(tiny_export, BenchConfig(opt_levels=("basic", "basik")), probe=fake_probe)
    with pytest.raises(ConfigError, match="steadiness compares two warm-ups"):
        run_bench(tiny_export, BenchConfig(max_warmups=1), probe=fake_probe)


def test_bench_restores_torch_threads_and_notes_a_row_that_never_steadies(tiny_export):
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        # two warm-ups that must agree within 1e-9: they never do, so the row is timed anyway, with a note
        res = run_bench(tiny_export, BenchConfig(prompt_len=4, new_tokens=3, repeats=1, threads=1, long_to=0,
                                                 runtimes=("eager",), max_warmups=2, steady_within=1e-9),
                        probe=fake_probe)
        eager = res.get("eager")
        assert eager.ran is True and eager.warmups == 2 and eager.steady is False
        assert torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(before)
    assert any(n.startswith("eager did not settle in 2 warm-ups") for n in res.notes)
    assert "| eager | torch (cpu) |" in markdown_body(res) and "| 2, not steady |" in markdown_body(res)


def test_cli_bench(tiny_export, tmp_path):
    out = tmp_path / "b"
    r = CliRunner().invoke(main, ["bench", str(tiny_export), "--prompt-len", "4", "--new-tokens", "4", "--repeats",
                                  "1", "--threads", "1", "--runtimes", "eager,ort-cpu", "--long", "0",
                                  "--opt-levels", "basic", "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert "| ort-cpu@basic [attention=decomposed float32] | CPUExecutionProvider |" in unescape_md(r.output)
    data = json.loads((out / "bench.json").read_text())
    names = [x["name"] for x in data["runtimes"]]
    assert names == ["eager", "ort-cpu", "ort-cpu@basic"]
    assert [x["opt_level"] for x in data["runtimes"]] == [None, None, "basic"]
    assert [lw["name"] for lw in data["lowerings"]] == ["ort-cpu"]  # an opt level is not another lowering
    assert data["bandwidth"]["method"] == "fake"  # the CLI ran with the injected probe
    bad = CliRunner().invoke(main, ["bench", str(tiny_export), "--runtimes", "nope"])
    assert bad.exit_code == 2 and "unknown runtime(s) nope" in bad.output


def test_cli_bench_unknown_opt_level_exits_2(tiny_export, tmp_path):
    r = CliRunner().invoke(main, ["bench", str(tiny_export), "--opt-levels", "basic,extnded", "-o", str(tmp_path)])
    assert r.exit_code == 2, r.output
    lines = [x for x in r.output.splitlines() if x.startswith("Error:")]
    assert len(lines) == 1 and "unknown graph optimization level(s) extnded" in lines[0]
    assert "valid: disable, basic, extended, all" in lines[0] and "Traceback" not in r.output
    assert not (tmp_path / "bench.json").exists() and "measuring" not in r.output  # refused before anything ran
    r = CliRunner().invoke(main, ["bench", str(tiny_export), "--lowerings", "onnx", "--opt-levels", "fast", "-o",
                                  str(tmp_path)])
    assert r.exit_code == 2 and "unknown graph optimization level(s) fast" in r.output
    assert not (tmp_path / "lowerings").exists()  # nor exported anything first


# ---- an output folder that cannot be written: exit 2, one line, nothing timed -------------------------------------

@pytest.fixture()
def nothing_timed(monkeypatch):
    """Fail the test if bench starts timing anything."""
    def refuse(*_args, **_kwargs):
        raise AssertionError("bench ran although its output folder cannot be written")

    monkeypatch.setattr(bench, "run_bench", refuse)
    monkeypatch.setattr(probes, "default_probe", refuse)


def _unwritable_outputs(tmp_path: Path) -> list[str]:
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    outs = ["/proc/x", str(a_file / "sub")]
    if os.geteuid() != 0:  # root writes into read-only folders
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o500)
        outs.append(str(ro))
    return outs


def test_cli_bench_unwritable_output_exits_2_before_timing(tiny_export, tmp_path, nothing_timed):
    for out in _unwritable_outputs(tmp_path):
        r = CliRunner().invoke(main, ["bench", str(tiny_export), "-o", out])
        assert r.exit_code == 2, (out, r.output)
        assert len(r.output.strip().splitlines()) == 1 and r.output.startswith("Error: "), r.output
        assert "Traceback" not in r.output and "measuring" not in r.output and "warming" not in r.output
    assert not (tiny_export / "bench.json").exists()


def test_cli_bench_unwritable_output_real_subprocess(tiny_export):
    proc = subprocess.run([sys.executable, "-m", "mhaexport", "bench", str(tiny_export), "-o", "/proc/x"],
                          capture_output=True, text=True, timeout=120, cwd=Path(__file__).resolve().parent.parent)
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and proc.stderr.startswith("Error: "), proc.stderr
    assert "/proc/x" in proc.stderr and proc.stdout == ""


def test_bench_imports_neither_the_exporter_nor_the_cli():
    code = ("import sys, mhaexport.bench, mhaexport.bench.run, mhaexport.bench.render\n"
            "bad = [m for m in sys.modules if m.startswith('mhaexport.exporter') or m == 'mhaexport.cli']\n"
            "assert not bad, bad")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parent.parent)
    assert proc.returncode == 0, proc.stderr


# ---- the rules, on fake runners and fabricated results -------------------------------------------------------------

CONTRACT = ModelContract(n_layers=1, n_heads=1, head_dim=2, vocab_size=5, max_positions=64)


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class FakeRunner(Runner):
    """Each call takes the next of ``generations``' step times (seconds) on ``clock``: generation g's prefill takes
    1 ms and its decode steps ``generations[g]`` each. ``fail_at``: the generation (1-based) whose prefill raises."""

    def __init__(self, name: str, clock: FakeClock, generations: list[float], fail_at: int | None = None) -> None:
        super().__init__(name, CONTRACT)
        self.clock, self.generations, self.fail_at = clock, list(generations), fail_at
        self.calls: list[str] = []
        self.generation = 0

    def empty_cache(self, batch: int, positions: int | None = None) -> int:
        return 0

    def step_impl(self, ids: np.ndarray, mask: np.ndarray, cache: int) -> tuple[np.ndarray, int]:
        if ids.shape[1] > 1:  # a prefill starts a generation
            self.generation += 1
            self.calls.append(self.name)
            if self.generation == self.fail_at:
                raise RuntimeFailure(f"{self.name} broke\nsecond line")
            self.clock.t += 0.001
        else:
            self.clock.t += self.generations[min(self.generation, len(self.generations)) - 1]
        return np.zeros((ids.shape[0], ids.shape[1], CONTRACT.vocab_size), dtype=np.float32), cache + ids.shape[1]


PROMPT = np.array([[1, 2, 3]], dtype=np.int64)


def fake_row(name: str, generations: list[float], repeats: int = 3, fail_at: int | None = None) -> Row:
    clock = FakeClock()
    runner = FakeRunner(name, clock, generations, fail_at)
    row = Row(RuntimeBench(name), lambda: runner, repeats, clock=clock)
    row.activate()
    return row


def test_warm_up_runs_until_two_in_a_row_agree_within_10_percent():
    row = fake_row("slow-start", [0.050, 0.020, 0.0105, 0.0100, 0.0100])  # 50 ms, 20 ms, 10.5 ms, 10 ms: steady
    assert row.warm_up(PROMPT, 6, within=0.10, most=5) is True
    assert row.record.warmups == 4 and row.record.steady is True
    assert row.record.warmup_token_ms == [50.0, 20.0, 10.5, 10.0]
    quick = fake_row("quick", [0.010, 0.0109])  # 9 % apart: agreed after the minimum of two
    assert quick.warm_up(PROMPT, 6, within=0.10, most=5) is True and quick.record.warmups == 2
    apart = fake_row("apart", [0.010, 0.0111])  # 11 % apart, then steady at 11.1 ms
    assert apart.warm_up(PROMPT, 6, within=0.10, most=5) is True and apart.record.warmups == 3


def test_warm_up_gives_up_after_the_cap_and_says_so():
    row = fake_row("jumpy", [0.010, 0.020, 0.010, 0.020, 0.010, 0.020])
    assert row.warm_up(PROMPT, 6, within=0.10, most=5) is False
    assert row.record.warmups == 5 and row.record.steady is False
    assert row.record.warmup_token_ms == [10.0, 20.0, 10.0, 20.0, 10.0]


def test_timings_come_from_the_decode_loop():
    row = fake_row("timed", [0.002, 0.002, 0.004, 0.004])
    row.warm_up(PROMPT, 5, within=0.10, most=5)  # 2 ms, 2 ms: steady after two
    run_rounds([row], PROMPT, 5, lambda m: None)
    row.finish(batch=1, new_tokens=5)
    rb = row.record
    assert rb.ran is True and rb.repeats == 3 and rb.positions == [3, 4, 5, 6]  # the cache length fed at each step
    assert rb.prefill_ms == 1.0 and rb.token_p50_ms == 4.0 and rb.per_position_ms == [4.0] * 4
    assert rb.decode_total_ms == 16.0 and rb.token_spread == 1.0 and rb.repeat_spread == 0.0
    assert rb.tokens_per_s == pytest.approx(5 / 0.017, abs=0.01)


def test_round_robin_order_short_row_and_failing_row():
    rows = [fake_row("a", [0.001]), fake_row("nocache", [0.001], repeats=1),
            fake_row("bad", [0.001], fail_at=2), fake_row("c", [0.001])]
    run_rounds(rows, PROMPT, 4, lambda m: None)
    calls = [rows[i].runner.calls for i in range(4)]
    assert [len(c) for c in calls] == [3, 1, 2, 3]
    assert [len(r.runs) for r in rows] == [3, 1, 1, 3]
    assert rows[2].record.ran is None and rows[2].record.reason == "bad broke"  # skipped with the first line of why


def test_a_row_over_several_sessions_warms_each_and_takes_the_median_of_their_p50s():
    from mhaexport.bench.rows import SessionsRow

    parts = [fake_row(f"s{i}", [ms, ms]) for i, ms in enumerate((0.002, 0.004, 0.003))]  # three sessions' speeds
    row = SessionsRow(RuntimeBench("ort-cpu"), parts)
    row.activate()
    assert row.ok and row.runner is parts[0].runner and row.repeats == 9 and row.warmups_planned(5) == 15
    first = row.generate(PROMPT, 5)  # bench's first warm-up generation: the first session's
    assert row.warm_up(PROMPT, 5, within=0.10, most=5, first=first) is True
    assert [p.record.warmups for p in parts] == [2, 2, 2] and row.record.warmups == 6
    other = fake_row("genai", [0.001, 0.001])
    run_rounds([row, other], PROMPT, 5, lambda m: None)
    assert [len(p.runs) for p in parts] == [3, 3, 3] and len(other.runs) == 3  # each session its repeats, in turn
    row.finish(batch=1, new_tokens=5)
    rb = row.record
    assert rb.session_p50_ms == [2.0, 4.0, 3.0] and rb.token_p50_ms == 3.0  # the median session, not all steps
    assert rb.repeats == 9 and rb.sessions_apart == pytest.approx(2 / 3)
    assert "token p50 3.00 ms is the median of the sessions' p50s (2.00, 4.00, 3.00 ms; 67 % apart)" in rb.notes[-1]
    broken = SessionsRow(RuntimeBench("ort-genai"), [fake_row("ok", [0.001]), fake_row("bad", [0.001], fail_at=1)])
    broken.activate()
    first = broken.generate(PROMPT, 5)
    with pytest.raises(RuntimeFailure):
        broken.warm_up(PROMPT, 5, within=0.10, most=5, first=first)  # a session that fails: bench skips the row


def test_sessions_rows_and_the_loop_ratio_in_a_run(tiny_export, tmp_path):
    """--sessions 2: ort-cpu and ort-genai over two sessions of the file each (two InferenceSessions, two
    onnxruntime-genai Models), bench.json's loop figure and bench.md's line; the bare loop still runs on the
    ort-cpu row's (first) session."""
    pytest.importorskip("onnxruntime_genai")
    from mhaexport.bench.rows import SessionsRow, plan_rows

    cfg = BenchConfig(prompt_len=8, new_tokens=6, repeats=2, threads=1, runtimes=("ort-cpu", "ort-bare", "ort-genai"),
                      sessions=2, max_warmups=2)
    from mhaexport.artifact import ExportFolder

    ef = ExportFolder.open(tiny_export)
    rows = plan_rows(tiny_export, ef, cfg, cfg.runtimes, [], None, "no eager")
    cpu, genai = rows[0], rows[2]
    assert isinstance(cpu, SessionsRow) and isinstance(genai, SessionsRow) and not isinstance(rows[1], SessionsRow)
    for row in (cpu, genai):
        row.activate()
    assert cpu.parts[0].runner.session is not cpu.parts[1].runner.session
    assert genai.parts[0].model is not genai.parts[1].model
    res = run_bench(tiny_export, cfg, probe=fake_probe)
    ours, theirs = res.get("ort-cpu"), res.get("ort-genai")
    assert len(ours.session_p50_ms) == 2 and len(theirs.session_p50_ms) == 2 and ours.repeats == 4
    assert ours.token_p50_ms == pytest.approx(float(np.median(ours.session_p50_ms)), abs=1e-3)
    assert res.loop.sessions == 2 and res.loop.threads == 1
    assert res.loop.ratio == pytest.approx(ours.token_p50_ms / theirs.token_p50_ms, abs=1e-3)
    assert res.get("ort-bare").notes[0] == "runs on the ort-cpu row's InferenceSession"
    body = markdown_body(res)
    assert f"**{res.loop.ratio:.3f} x** (each the median of 2 sessions' p50s" in body
    assert "(2 sessions: " in body
    one = run_bench(tiny_export, dataclasses.replace(cfg, sessions=1, runtimes=("ort-cpu", "ort-genai")),
                    probe=fake_probe)
    assert one.get("ort-cpu").session_p50_ms is None and "one session each" in markdown_body(one)
    with pytest.raises(ConfigError, match="sessions=0"):
        bench.check_config(BenchConfig(sessions=0))


def test_spread_ignores_growth_with_position_but_not_noise():
    positions = list(range(32, 160))
    steady = [0.01 + 0.0002 * (p - 32) for p in positions]  # recompute-like: 10 ms -> 35 ms across the run
    assert token_spread(positions, [steady, steady]) == pytest.approx(1.0, abs=0.01)
    spiky = [s * (20 if i % 5 == 0 else 1) for i, s in enumerate(steady)]  # every fifth step 20x slower
    assert token_spread(positions, [spiky]) > 10
    mostly_slow = [s * (1 if i % 7 == 0 else 100) for i, s in enumerate(steady)]  # slow but for its fast moments
    assert token_spread(positions, [mostly_slow]) > 50  # p50 / p10: the fast seventh is what the model can do
    slow_repeat = [s * 2 for s in steady]  # one repeat of three twice as slow
    assert token_spread(positions, [steady, steady, slow_repeat]) == pytest.approx(2.0, abs=0.05)
    assert repeat_spread([steady, steady, slow_repeat]) == pytest.approx(1.0, abs=0.01)
    assert token_spread(positions, []) is None and repeat_spread([steady]) is None


def fabricated(eager_spread: float, ort_spread: float, nocache_spread: float = 1.1) -> BenchResult:
    def row(name: str, p50: float, total: float, spread: float) -> RuntimeBench:
        return RuntimeBench(name, ran=True, repeats=3, providers=["x"], token_p50_ms=p50, token_p90_ms=p50 * spread,
                            decode_total_ms=total, token_spread=spread, warmups=2, steady=True)

    cfg = BenchConfig(prompt_len=32, new_tokens=128, threads=2)
    return BenchResult("f", cfg, BenchModel("preset:bench"), Environment(date="d"), 10.0,
                       BandwidthInfo.from_dict(fake_probe(2).to_dict()), 50_000_000, 5.0,
                       [row("eager", 10.0, 1270.0, eager_spread), row("eager-nocache", 80.0, 10160.0, nocache_spread),
                        row("ort-cpu", 5.0, 635.0, ort_spread)])


def test_verdict_only_where_the_spread_allows():
    quiet = {t.target.split(" (")[0]: t for t in evaluate(fabricated(1.2, 1.1), max_spread=1.5)}
    ratio = quiet["ORT CPU per-token p50 / eager-with-cache p50"]
    assert ratio.met is True and ratio.verdict == "yes" and ratio.measured == 0.5 and ratio.applies
    assert (ratio.spread, ratio.spread_of) == (1.2, "eager")
    floor = quiet["ORT CPU per-token p50 / weight-bandwidth floor"]
    assert floor.met is True and floor.spread == 1.1  # the floor is not a timed row: ort-cpu's spread counts
    assert quiet["recompute / cached decode time at 128 new tokens"].met is True

    noisy = {t.target.split(" (")[0]: t for t in evaluate(fabricated(3.04, 1.1), max_spread=1.5)}
    ratio = noisy["ORT CPU per-token p50 / eager-with-cache p50"]
    assert ratio.met is None and ratio.measured == 0.5  # still measured, but no verdict
    assert ratio.verdict == "spread too wide (3.0 on eager): no verdict"
    assert noisy["ORT CPU per-token p50 / weight-bandwidth floor"].met is True  # reads ort-cpu only
    assert noisy["recompute / cached decode time at 128 new tokens"].met is None

    res = fabricated(3.04, 1.1)
    res.targets = evaluate(res, max_spread=1.5)
    table = targets_table(res)
    assert "| spread too wide (3.0 on eager): no verdict |" in table and "| yes |" in table
    assert "a figure, not a verdict" not in table  # the bench preset's conditions: a verdict proper
    assert "a verdict only where every timed row a target reads has spread <= 1.5" in table


def test_floor_names_the_probe_that_set_it_and_its_threads():
    res = fabricated(1.1, 1.1)
    res.bandwidth = BandwidthInfo.from_dict(Bandwidth({"copy": 9.0, "sum": 11.0}, 2, 256, "fake").to_dict())
    res.bandwidth_gbps = res.bandwidth.read
    assert (res.floor_probe, res.floor_threads) == ("sum", 2)
    text = floor_text(res)
    assert "(set by the sum probe on 2 threads)" in text and "**11.00 GB/s**" in text and "gemv" not in text


def test_real_probes_read_with_the_threads_they_say():
    bw = probes.measure_bandwidth(threads=1, mbytes=8, repeats=2)
    assert set(bw.gbps) == {"copy", "sum", "gemv"} and all(v > 0 for v in bw.gbps.values())
    assert bw.threads == 1 and bw.method == "torch" and bw.probe in bw.gbps
    assert bw.to_dict()["read"] == max(bw.gbps.values())
    npb = probes.numpy_bandwidth(mbytes=8, repeats=2)
    assert set(npb.gbps) == {"copy", "sum"} and npb.threads == 1 and npb.method == "numpy"


# ---- comparing lowerings: --compare / --lowerings ---------------------------------------------------------------

COMPARE = {"prompt_len": 8, "new_tokens": 6, "repeats": 2, "threads": 1, "long_to": 40,
           "runtimes": ("eager", "ort-cpu")}
ORT_LABEL = "ort-cpu [attention=ort float32]"


@pytest.fixture(scope="module")
def lowering_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("bench_lowerings")


@pytest.fixture(scope="module")
def ort_export(tiny_export, lowering_dir):
    """The tiny model's `--attention ort` export, made by export_lowerings (the folder itself holds decomposed)."""
    found = export_lowerings(tiny_export, [("decomposed", "float32"), ("ort", "float32")], lowering_dir)
    assert found == [tiny_export, lowering_dir / "lowerings" / "ort-float32"]
    return found[1]


@pytest.fixture(scope="module")
def compared(tiny_export, ort_export):
    messages: list[str] = []
    res = run_bench(tiny_export, BenchConfig(**COMPARE, compare=(str(ort_export), str(tiny_export))),
                    progress=messages.append, probe=fake_probe)
    return res, messages


def test_compare_adds_one_row_per_lowering(compared, tiny_export, ort_export):
    res, _ = compared
    assert [r.name for r in res.runtimes] == ["eager", "ort-cpu", ORT_LABEL]  # FOLDER itself is not compared again
    own, other = res.runtimes[1], res.runtimes[2]
    assert own.label == "ort-cpu [attention=decomposed float32]" and own.folder == str(tiny_export)
    assert other.label == ORT_LABEL and other.lowering == "attention=ort float32" and other.folder == str(ort_export)
    for r in res.runtimes:
        assert r.ran is True and r.repeats == 2 and r.positions == list(range(8, 13)), (r.name, r.reason)
    assert res.model.fingerprint == json.loads((ort_export / "manifest.json").read_text())["model"]["fingerprint"]


def test_setup_first_then_timed_rounds_round_robin(compared):
    _, messages = compared
    first_round = next(i for i, m in enumerate(messages) if m.startswith("timed round 1/2"))
    assert all(i < first_round for i, m in enumerate(messages) if m.startswith(("loading", "warming up")))
    rounds = [m for m in messages if m.startswith("timed round")]
    labels = ["eager", "ort-cpu [attention=decomposed float32]", ORT_LABEL]
    assert rounds == [f"timed round {k}/2: {label} ..." for k in (1, 2) for label in labels]  # a line a generation


def test_progress_on_every_generation_with_an_estimate_that_never_rises(compared):
    """Each row's first warm-up is run before any estimate (so a slow row reached late cannot raise it); then every
    warm-up, timed and long generation has its line, the estimate falling (warm-ups counted at their cap), the
    count of steps moving forward against one total."""
    res, messages = compared
    steps = [m for m in messages if isinstance(m, Estimate)]
    loads = [m for m in steps if m.startswith("loading")]
    assert [m.split(" and its")[0] for m in loads] == [f"loading {r.label}" for r in res.runtimes]
    assert all(m.left_s is None for m in loads) and all(m.left_s is not None for m in steps[len(loads):])
    warm = [m for m in steps if m.startswith("warming up")]
    assert len(warm) == sum(r.warmups - 1 for r in res.runtimes)  # every warm-up after the first has its line
    assert sum(m.startswith("long run") for m in steps) == 2  # one per ORT CPU lowering
    left = [m.left_s for m in steps[len(loads):]]
    assert left == sorted(left, reverse=True) and left[0] > 0
    done = [m.done for m in steps]
    assert done == sorted(done) and all(m.done <= m.total for m in steps)
    # the total is fixed when the run is planned: warm-ups a row did not need count as done, never as a smaller total
    assert len({m.total for m in steps}) == 1 and steps[-1].done > steps[len(loads)].done


def test_long_runs_and_lowering_table_per_lowering(compared, tmp_path):
    res, _ = compared
    assert [lr.name for lr in res.long_runs] == ["ort-cpu", ORT_LABEL]
    for lr in res.long_runs:
        assert lr.positions == list(range(8, 40)) and set(lr.at) == {"8", "31"}
    table = {lw.name: lw for lw in res.lowerings}
    assert list(table) == ["ort-cpu", ORT_LABEL]
    p50 = {n: res.get(n).token_p50_ms for n in table}
    for name, lw in table.items():
        assert lw.vs_fastest == pytest.approx(p50[name] / min(p50.values()), abs=1e-3)
        lr = res.long_run(name)
        assert (lw.near_ms, lw.far_ms) == (lr.at["8"], lr.at["31"])
        assert lw.far_over_near == pytest.approx(lw.far_ms / lw.near_ms, abs=1e-3)
    assert min(lw.vs_fastest for lw in table.values()) == 1.0
    write_bench(res, tmp_path)
    md = _read_md(tmp_path / "bench.md")
    assert "| lowering | provider | token p50 | x fastest | at 8 | at 31 | at 31 / at 8 |" in md
    assert f"| {ORT_LABEL} | CPUExecutionProvider | {table[ORT_LABEL].token_p50_ms:.2f} |" in md
    data = json.loads((tmp_path / "bench.json").read_text())
    assert [lw["label"] for lw in data["lowerings"]] == ["ort-cpu [attention=decomposed float32]", ORT_LABEL]


def test_two_folders_with_one_lowering_get_distinct_rows(tiny_export, ort_export, tmp_path):
    twin = tmp_path / "twin"
    shutil.copytree(ort_export, twin)
    own_twin = tmp_path / "own_twin"  # the folder's own lowering again (e.g. two int4 schemes): its label differs too
    shutil.copytree(tiny_export, own_twin, ignore=shutil.ignore_patterns(".snapshot-*", ".staging-*"))
    res = run_bench(tiny_export, BenchConfig(prompt_len=4, new_tokens=3, repeats=1, threads=1, long_to=0,
                                             runtimes=("ort-cpu",), compare=(str(ort_export), str(twin),
                                                                             str(own_twin))),
                    probe=fake_probe)
    assert [r.name for r in res.runtimes] == ["ort-cpu", ORT_LABEL, f"ort-cpu [attention=ort float32, {twin}]",
                                              f"ort-cpu [attention=decomposed float32, {own_twin}]"]
    assert len({r.label for r in res.runtimes}) == 4  # every row told apart in the tables
    assert all(r.ran for r in res.runtimes) and res.long_runs == []


def test_compare_refuses_another_model(tiny_export, tmp_path):
    cfg = json.loads((tiny_export / "manifest.json").read_text())["model"]["config"]
    (tmp_path / "other.json").write_text(json.dumps({**cfg, "n_layers": 1, "name": "other"}))
    other = tmp_path / "other"
    made = CliRunner().invoke(main, ["onnx", "--config", str(tmp_path / "other.json"), "-o", str(other), "--json"])
    assert made.exit_code == 0, made.output
    from test_cli_json import check_export_json  # onnx --json: the export verbs' shape, checked here at no cost

    data = check_export_json(made.stdout, "onnx", other, ["onnx"])
    assert data["artifacts"][0]["details"]["opset"] == 18 and data["replaced"] is None
    r = CliRunner().invoke(main, ["bench", str(tiny_export), "--compare", str(other), "--runtimes", "ort-cpu",
                                  "--prompt-len", "4", "--new-tokens", "3", "-o", str(tmp_path / "out")])
    assert r.exit_code == 2
    lines = [x for x in r.output.splitlines() if x.startswith("Error:")]
    assert len(lines) == 1 and f"--compare {other} holds config:" in lines[0]
    assert "compare exports of one model only" in lines[0] and "preset:tiny" in lines[0]


def test_compare_needs_an_ort_runtime_and_an_onnx_export(tiny_export, ort_export, tmp_path):
    with pytest.raises(RuntimeInputError, match="neither ort-cpu nor ort-cuda"):
        run_bench(tiny_export, BenchConfig(prompt_len=4, new_tokens=3, runtimes=("eager",),
                                           compare=(str(ort_export),)), probe=fake_probe)
    with pytest.raises(ArtifactError, match="has no manifest.json"):
        run_bench(tiny_export, BenchConfig(prompt_len=4, new_tokens=3, runtimes=("ort-cpu",),
                                           compare=(str(tmp_path),)), probe=fake_probe)


def test_cli_lowerings_reuses_exports_and_rejects_unknown(tiny_export, ort_export, lowering_dir):
    r = CliRunner().invoke(main, ["bench", str(tiny_export), "--lowerings", "decomposed,ort", "-o", str(lowering_dir),
                                  "--prompt-len", "4", "--new-tokens", "3", "--repeats", "1", "--threads", "1",
                                  "--runtimes", "ort-cpu", "--long", "0"])
    assert r.exit_code == 0, r.output
    assert f"reusing {ort_export} (attention=ort float32)" in r.output and "exporting" not in r.output
    assert f"| {ORT_LABEL} | CPUExecutionProvider |" in unescape_md(r.output)
    bad = CliRunner().invoke(main, ["bench", str(tiny_export), "--lowerings", "ort:float8"])
    assert bad.exit_code == 2 and "--lowerings 'ort:float8': expected ATTENTION[:DTYPE]" in bad.output
    assert parse_lowerings("ort, onnx:float16,ort:float32") == [("ort", "float32"), ("onnx", "float16")]


def test_bare_loop_and_genai_rows_generate_the_runtimes_tokens(tiny_export):
    """The bare session.run loop and onnxruntime-genai's loop decode the same greedy tokens as the runtime's loop:
    their timings compare like with like."""
    from mhaexport.artifact import ExportFolder
    from mhaexport.bench.rows import BareRow, GenAIRow
    from mhaexport.runtime import GenerationConfig, Generator

    prompt = np.array([[5, 17, 42, 7]], dtype=np.int64)
    want = Generator(tiny_export, threads=1).generate(prompt, GenerationConfig(max_new_tokens=6)).tokens
    cfg = BenchConfig(**SMALL)
    ef = ExportFolder.open(tiny_export, "onnx")
    rows = [BareRow(RuntimeBench("ort-bare"), ef, cfg)]
    try:
        import onnxruntime_genai  # noqa: F401

        rows.append(GenAIRow(RuntimeBench("ort-genai"), ef, cfg))
    except ImportError:
        pass
    for row in rows:
        row.activate()
        assert row.ok, row.record.reason
        r = row.generate(prompt, 6)
        assert r.tokens == want, row.record.name
        assert len(r.step_s) == 5 and r.step_positions == [4, 5, 6, 7, 8] and r.first_token_s >= r.prefill_s


def test_shared_cache_targets_read_the_shared_and_concat_rows():
    from mhaexport.bench.targets import TARGETS

    def row(name, lowering, p50, spread=1.1):
        return RuntimeBench(name, ran=True, lowering=lowering, token_p50_ms=p50, token_spread=spread,
                            providers=["CPUExecutionProvider"])

    res = BenchResult("x", BenchConfig(**{**SMALL, "prompt_len": 32, "new_tokens": 128}), BenchModel("preset:bench"),
                      Environment(), 10.0, BandwidthInfo.from_dict(fake_probe(2).to_dict()), 50_000_000, 5.0,
                      [row("ort-cpu", "attention=decomposed float32", 4.0),
                       row("ort-cpu [attention=gqa float32 kv=shared]", "attention=gqa float32 kv=shared", 3.6),
                       row("ort-bare", "attention=decomposed float32", 3.9)])
    res.long_runs = [LongRun("ort-cpu [attention=gqa float32 kv=shared]", "", [], [], {"32": 3.5, "1000": 3.7}, 32,
                             1000, spread=1.1)]
    got = {t.target: t for t in evaluate(res, 1.5, TARGETS)}
    shared = got["shared / concat KV cache per-token p50 (ORT CPU, 128 tokens)"]
    assert shared.measured == pytest.approx(0.9) and shared.met is True
    flat = got["shared KV cache per-token latency at position 1000 / at 32 (ORT CPU)"]
    assert flat.measured == pytest.approx(3.7 / 3.5, abs=1e-3) and flat.met is True
    bare = got["ORT CPU per-token p50 / a bare session.run loop's p50 (same file)"]
    assert bare.measured == pytest.approx(4.0 / 3.9, abs=1e-3) and bare.met is True
    per_byte = "shared KV cache per-token latency per byte read at position 1000 / at 32 (ORT CPU)"
    assert got[per_byte].verdict == "not measured"  # the long run has no bytes_at
    # a cache that adds 20 % to the bytes a step reads at 1000: 1.2 x the latency is what the bytes explain
    res.long_runs[0].bytes_at = {"32": 100_000_000, "1000": 120_000_000}
    res.long_runs[0].at["1000"] = 3.5 * 1.2 * 1.05
    got = {t.target: t for t in evaluate(res, 1.5, TARGETS)}
    assert got[per_byte].measured == pytest.approx(1.05, abs=1e-3) and got[per_byte].met is True
    assert "ms/GB" in got[per_byte].detail and got[flat.target].met is False  # 1.26 > 1.10
    res.long_runs[0].at["1000"] = 3.5 * 1.2 * 1.3  # growth the bytes do not explain (a copy per step)
    assert next(t for t in evaluate(res, 1.5, TARGETS) if t.target == per_byte).met is False


@pytest.mark.parametrize("order", [("ort-cpu", "ort-bare"), ("ort-bare", "ort-cpu")])
def test_bare_loop_runs_on_the_ort_cpu_rows_session_when_that_row_loads_first(tiny_export, order):
    """Two sessions of one file need not decode at one speed (measured here: the first of three identical sessions
    ~1.2 x slower than the third), so the bare loop shares the ORT CPU row's session and the two rows differ by the
    loop alone; loaded before that row, it has its own session and says so."""
    from mhaexport.artifact import ExportFolder
    from mhaexport.bench.rows import BareRow, plan_rows

    cfg = BenchConfig(**SMALL)
    rows = plan_rows(tiny_export, ExportFolder.open(tiny_export), cfg, order, [], None, "no eager")
    for row in rows:
        row.activate()
        assert row.ok, row.record.reason
    bare = next(r for r in rows if isinstance(r, BareRow))
    ort_row = next(r for r in rows if r.record.name == "ort-cpu")
    if order[0] == "ort-cpu":
        assert bare.session is ort_row.runner.session
        assert bare.record.notes == ["runs on the ort-cpu row's InferenceSession"]
    else:
        assert bare.session is not ort_row.runner.session
        assert "a session of its own" in bare.record.notes[0]
    prompt = np.array([[5, 17, 42, 7]], dtype=np.int64)
    assert bare.generate(prompt, 4).tokens == ort_row.generate(prompt, 4).tokens


def test_a_bad_quantize_or_lowering_is_refused_before_anything_is_written(tiny_export, tmp_path):
    out = tmp_path / "never"
    for opt in (["--quantize", "int4,int3"], ["--lowerings", "ort:float8"],
                ["--lowerings", "ort", "--quantize", "int3"]):
        bad = CliRunner().invoke(main, ["bench", str(tiny_export), *opt, "-o", str(out)])
        assert bad.exit_code == 2, bad.output
        assert not out.exists()  # refused before the output folder, any export (the lowering too) or any timing
    assert "int3" in CliRunner().invoke(main, ["bench", str(tiny_export), "--quantize", "int3"]).output


def test_peer_targets_read_the_fastest_of_ours_against_the_builders_file_per_scheme():
    from mhaexport.bench.targets import TARGETS

    def row(name, lowering, p50, quant=None, spread=1.1):
        return RuntimeBench(name, ran=True, lowering=lowering, token_p50_ms=p50, token_spread=spread,
                            quantization=quant, providers=["CPUExecutionProvider"])

    rows = [row("ort-cpu", "attention=fused float32 kv=shared", 7.0),
            row("ort-cpu [attention=decomposed float32]", "attention=decomposed float32", 7.7),
            row("ort-cpu [attention=fused float32 int4 kv=shared]", "attention=fused float32 int4 kv=shared", 1.9,
                "int4"),
            row("ort-cpu [onnxruntime-genai float32 kv=shared]", "onnxruntime-genai float32 kv=shared", 7.4),
            row("ort-cpu [onnxruntime-genai float32 int4 kv=shared]", "onnxruntime-genai float32 int4 kv=shared", 1.5,
                "int4"),
            row("ort-genai", "attention=fused float32 kv=shared", 6.9)]
    res = BenchResult("x", BenchConfig(**{**SMALL, "prompt_len": 32, "new_tokens": 128, "batch": 1, "threads": 2}),
                      BenchModel("hf:/tmp/llama"), Environment(), 10.0,
                      BandwidthInfo.from_dict(fake_probe(2).to_dict()), 50_000_000, 5.0, rows)
    got = {t.target.split(" (")[0]: t for t in evaluate(res, 1.5, TARGETS)}
    fp32 = got["mhaexport's fastest float export / the builder's float file"]
    assert fp32.measured == pytest.approx(7.0 / 7.4, abs=1e-3) and fp32.met is True and fp32.applies
    assert "attention=fused float32 kv=shared" in fp32.detail  # the fastest of ours, named
    int4 = got["mhaexport's fastest int4 export / the builder's int4 file"]
    assert int4.measured == pytest.approx(1.9 / 1.5, abs=1e-3) and int4.met is False
    loop = got["ORT CPU per-token p50 / onnxruntime-genai's loop p50"]
    assert loop.measured == pytest.approx(7.0 / 6.9, abs=1e-3) and loop.met is True  # 1.014 <= 1.03
    assert got["ORT CPU per-token p50 / weight-bandwidth floor"].applies is False  # set for the bench preset
    res.runtimes[3].token_spread = 1.8  # a noisy builder row: no verdict on the targets that read it
    got = {t.target.split(" (")[0]: t for t in evaluate(res, 1.5, TARGETS)}
    assert got["mhaexport's fastest float export / the builder's float file"].met is None


# ---- how cost grows: --batches / --prompts --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def scaled(tiny_export, ort_export, tmp_path_factory):
    """One CLI run with the scaling phase: two ORT CPU lowerings and onnxruntime-genai (when installed) beside eager,
    batches 1 and 3, prompts up to and past the tiny model's 128 positions."""
    out = tmp_path_factory.mktemp("bench_scaling")
    r = CliRunner().invoke(main, ["bench", str(tiny_export), "--compare", str(ort_export), "--runtimes",
                                  "eager,ort-cpu,ort-genai", "--prompt-len", "8", "--new-tokens", "4", "--repeats", "2",
                                  "--threads", "1", "--long", "0", "--batches", "3,1", "--prompts", "2048,8,127,128",
                                  "-o", str(out)])
    assert r.exit_code == 0, r.output
    return out, r.output


def test_scaling_holds_every_point_for_every_ort_row(scaled):
    out, output = scaled
    data = json.loads((out / "bench.json").read_text())
    assert (data["config"]["batches"], data["config"]["prompts"]) == ([1, 3], [8, 127, 128, 2048])  # sorted
    genai = data["runtimes"][-1]["ran"] is True  # ort-genai: skipped with the reason where not installed
    want = ["ort-cpu", ORT_LABEL] + (["ort-genai"] if genai else [])
    assert [s["name"] for s in data["scaling"]] == want  # the ONNX Runtime rows; not eager
    md = _read_md(out / "bench.md")
    for s in data["scaling"]:
        assert [p["batch"] for p in s["batches"]] == [1, 3]
        for p in s["batches"]:
            assert p["reason"] is None and p["repeats"] == 2 and p["token_p50_ms"] > 0 and p["tokens_per_s"] > 0
        assert [p["prompt"] for p in s["prompts"]] == [8, 127, 128, 2048]
        p8, p127, p128, p2048 = s["prompts"]
        assert p8["reason"] is None and p8["ttft_ms"] >= p8["prefill_ms"] > 0 and p8["repeats"] == 2
        if s["name"] == "ort-genai":  # onnxruntime-genai's max_length counts the last token: one position short
            assert p127["ttft_ms"] is None and "passes its context_length=128" in p127["reason"]
        else:
            assert p127["reason"] is None and p127["ttft_ms"] > 0  # 127 + 1 positions: the model's last
        for p in (p128, p2048):  # past the model: a skipped point with the reason, not a crash
            assert p["ttft_ms"] is None and p["reason"] == "the model allows 128 positions"
        label = next(r["label"] for r in data["runtimes"] if r["name"] == s["name"])
        assert s["label"] == label and f"| {label} | " in md.split("How cost grows")[1]
    assert "| row | batch 1 | batch 3 |" in md and "| row | prompt 8 | prompt 127 | prompt 128 | prompt 2048 |" in md
    assert "prompt 128, prompt 2048: skipped for every row, the model allows 128 positions." in md
    assert "How cost grows" in output  # the terminal summary holds the tables too
    lines = output.splitlines()
    last_round = max(i for i, m in enumerate(lines) if "timed round 2/2: " in m)
    assert min(i for i, m in enumerate(lines) if "how cost grows, batch 1" in m) > last_round  # after the rounds
    if importlib.util.find_spec("matplotlib") is not None:
        assert (out / "bench-scaling.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert "![how cost grows" in md


class ScaleRunner(Runner):
    """Timings that follow the shape, on ``clock``: a prefill of (B, T) takes T * B * 0.1 ms, a decode step B * 1 ms,
    each times the generation's factor (cycling through ``factors``); ``log`` gets the name at each prefill.
    ``limit``: the runner's max_length (a shared cache's slots); ``fail_batch``: a batch whose prefill raises."""

    def __init__(self, name: str, clock: FakeClock, log: list[str], factors: list[float] = (5.0, 1.0, 3.0, 2.0),
                 limit: int | None = None, fail_batch: int | None = None) -> None:
        super().__init__(name, CONTRACT)
        self.clock, self.log, self.factors, self.limit, self.fail_batch = clock, log, list(factors), limit, fail_batch
        self.generation = -1

    @property
    def max_length(self) -> int:
        return self.limit or CONTRACT.max_positions

    def empty_cache(self, batch: int, positions: int | None = None) -> int:
        return 0

    def step_impl(self, ids: np.ndarray, mask: np.ndarray, cache: int) -> tuple[np.ndarray, int]:
        B, T = ids.shape
        if T > 1 or cache == 0:  # a prefill starts a generation
            self.generation += 1
            self.log.append(self.name)
            if B == self.fail_batch:
                raise RuntimeFailure(f"{self.name} broke at batch {B}\nsecond line")
        f = self.factors[self.generation % len(self.factors)]
        self.clock.t += (T * B * 1e-4 if cache == 0 else B * 1e-3) * f
        return np.zeros((B, T, CONTRACT.vocab_size), dtype=np.float32), cache + T


def scale_row(name: str, log: list[str], **kw) -> Row:
    clock = FakeClock()
    runner = ScaleRunner(name, clock, log, **kw)
    row = Row(RuntimeBench(name, lowering="attention=fake float32", ran=True), lambda: runner, 3, clock=clock)
    row.activate()
    return row


def test_scaling_timings_come_from_the_decode_loop():
    """Per point an untimed generation (factor 5, left out), then three timed ones round-robin (factors 1, 3, 2):
    every figure is the decode loop's timing, medians over the repeats."""
    from mhaexport.bench.scaling import scaling_runs

    log: list[str] = []
    rows = [scale_row("a", log), scale_row("b", log)]
    said: list[str] = []
    cfg = BenchConfig(prompt_len=3, new_tokens=4, repeats=3, batches=(4, 1), prompts=(10,))
    got = scaling_runs(rows, cfg, CONTRACT.max_positions, CONTRACT.vocab_size, said.append)
    assert log == ["a", "b"] * 4 * 3  # round-robin: four rounds (one untimed) at each of three points
    for entry in got:
        assert [p.batch for p in entry.batches] == [1, 4]
        for p in entry.batches:
            B = p.batch
            # steps B * {1, 3, 2} ms, three per generation: p50 over all of them is B * 2 ms
            assert p.token_p50_ms == 2.0 * B and p.repeats == 3 and p.reason is None
            # tokens/s = B * 4 / (prefill + 3 steps), the median repeat (factor 2): 4 / (2 * (0.3 + 3) ms)
            assert p.tokens_per_s == round(4 / (2 * 3.3e-3), 2)
            assert p.ttft_ms == round(2 * 3 * B * 0.1, 4)  # prefill of 3 tokens, factor 2
        (p10,) = entry.prompts
        assert (p10.prompt, p10.ttft_ms, p10.prefill_ms, p10.repeats) == (10, 2.0, 2.0, 3)
    counted = [m for m in said if isinstance(m, Step)]
    assert len(counted) == len(said) == 12 and [m.done for m in counted] == list(range(12))
    assert all(m.total == 12 for m in counted)
    assert said[1] == ("how cost grows, batch 1 (3-token prompts, 4 new tokens), round 1/3: "
                       "a [attention=fake float32], b [attention=fake float32] ...")


def test_scaling_skips_a_point_per_row_and_the_others_go_on(tmp_path, monkeypatch):
    """A prompt past the model: skipped for every row with the model's limit; past one row's cache (a shared
    cache's slots): skipped for that row; a row failing at a batch: that point says why, its other points run."""
    from mhaexport.bench.scaling import scaling_runs

    log: list[str] = []
    rows = [scale_row("fine", log), scale_row("short", log, limit=12), scale_row("broken", log, fail_batch=4)]
    cfg = BenchConfig(prompt_len=3, new_tokens=4, repeats=1, batches=(1, 4), prompts=(11, 12, 63, 64))
    got = {e.name: e for e in scaling_runs(rows, cfg, CONTRACT.max_positions, CONTRACT.vocab_size,
                                              lambda m: None)}
    assert got["broken"].batches[1].reason == "broken broke at batch 4"  # first line, that point only
    assert got["broken"].batches[1].tokens_per_s is None and got["broken"].batches[0].reason is None
    assert [p.reason for p in got["broken"].prompts][:3] == [None] * 3
    assert log.count("broken") == 2 + 1 + 3 * 2  # batch 1: untimed + timed; batch 4: the failing one; 3 prompts
    short = [p.reason for p in got["short"].prompts]
    assert short[0] is None and short[1] == short[2].replace("64", "13") == "13 positions pass max_positions=12"
    for e in got.values():
        assert e.prompts[3].to_dict() == {"prompt": 64, "ttft_ms": None, "prefill_ms": None, "repeats": 0,
                                          "reason": "the model allows 64 positions"}
        assert e.name == "short" or e.prompts[2].ttft_ms > 0  # 63 + 1 positions: the model's last
    res = fabricated(1.1, 1.1)
    res.config, res.scaling = cfg, list(got.values())
    md = markdown_body(res)
    # batch 1's one timed repeat has factor 1: 1 ms steps, 4 / (0.3 + 3) ms = 1212.1 tokens/s
    assert "| broken [attention=fake float32] | 1.00 ms, 1212.1 tokens/s | skipped: broken broke at batch 4 |" in md
    assert "| short [attention=fake float32] | 1.10 ms | skipped: 13 positions pass max_positions=12 |" in md
    assert "\nprompt 64: skipped for every row, the model allows 64 positions." in md
    assert "| fine [attention=fake float32] | 1.10 ms | 2.40 ms (x 2.18) | 6.30 ms (x 5.73) | skipped |" in md
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # without matplotlib: the tables stay, only the plot goes
    written = write_bench(res, tmp_path)
    assert not (tmp_path / "bench-scaling.png").exists() and len(written) == 3
    assert "How cost grows" in _read_md(tmp_path / "bench.md")
    page = (tmp_path / "bench.html").read_text()
    assert "Per-token latency against the batch" in page and "Time to first token against the prompt" in page
    assert json.loads((tmp_path / "bench.json").read_text())["scaling"][0]["name"] == "fine"


@pytest.mark.parametrize("opt", [["--batches", "0"], ["--batches", "1,x"], ["--prompts", "-3"],
                                 ["--prompts", "32,1.5"], ["--batches", "1", "--prompts", "0,32"]])
def test_cli_bench_bad_scaling_points_exit_2_in_one_line(tiny_export, tmp_path, nothing_timed, opt):
    r = CliRunner().invoke(main, ["bench", str(tiny_export), *opt, "-o", str(tmp_path / "out")])
    assert r.exit_code == 2, r.output
    assert len(r.output.strip().splitlines()) == 1 and r.output.startswith(f"Error: {opt[-2]} "), r.output
    assert ("is not a positive integer" in r.output or "expected comma-separated positive integers" in r.output)
    assert not (tmp_path / "out").exists()


def test_api_bench_checks_scaling_points_and_defaults_to_none(nothing_timed, tiny_export):
    import mhaexport

    with pytest.raises(ConfigError, match="--batches 1,0: 0 is not a positive integer"):
        mhaexport.bench(tiny_export, batches=[1, 0])
    with pytest.raises(ConfigError, match=r"prompts=\(32, -1\): -1 is not a positive integer"):
        bench.check_config(BenchConfig(prompts=(32, -1)))
    assert bench.parse_points(" 16, 1,4,4 ", "batches") == (1, 4, 16) and bench.parse_points(None, "prompts") == ()
    assert (BenchConfig().batches, BenchConfig().prompts) == ((), ())


def test_default_run_has_no_scaling_phase(result, compared, tmp_path):
    assert result.scaling == [] and result.scaling_of() is None
    assert not any("how cost grows" in m for m in compared[1])  # no progress line either
    write_bench(result, tmp_path)
    assert not (tmp_path / "bench-scaling.png").exists() and "How cost grows" not in _read_md(tmp_path / "bench.md")
    assert json.loads((tmp_path / "bench.json").read_text())["scaling"] == []


def test_a_default_run_is_the_quick_one_and_reads_only_the_folder(tiny_export):
    """Unless asked: no eager-nocache (said how to add it), no long run, no project targets; a --profile without an
    output folder leaves no trace in the export folder (only its summary is kept)."""
    before = sorted(p.name for p in tiny_export.iterdir())
    res = run_bench(tiny_export, BenchConfig(prompt_len=4, new_tokens=3, repeats=1, threads=1, profile=True),
                    probe=fake_probe)
    assert "eager-nocache" not in DEFAULT_RUNTIMES
    assert [r.name for r in res.runtimes] == [r for r in DEFAULT_RUNTIMES if r not in ("pt2", "aoti")]  # none here
    assert any(n.startswith("eager-nocache (eager recomputing the whole sequence every step) not timed") and
               "add it with --runtimes all" in n for n in res.notes)
    assert res.long_runs == [] and res.targets == [] and "Speed targets" not in markdown_body(res)
    assert res.profile.file is None and res.profile.ops and "not kept: give -o DIR" in markdown_body(res)
    assert sorted(p.name for p in tiny_export.iterdir()) == before


def test_cli_profile_goes_to_the_output_folder_and_json_is_one_object(tiny_export, tmp_path):
    out = tmp_path / "b"
    r = CliRunner().invoke(main, ["bench", str(tiny_export), "--prompt-len", "4", "--new-tokens", "3", "--repeats",
                                  "1", "--threads", "1", "--runtimes", "ort-cpu", "--profile", "--json", "-o",
                                  str(out)])
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert data["schema"] == "mhaexport.bench/1" and [x["name"] for x in data["runtimes"]] == ["ort-cpu"]
    assert data["targets"] == [] and Path(data["profile"]["file"]).parent == out
    assert list(out.glob("ort-profile*.json")) and not list(tiny_export.glob("ort-profile*.json"))
    t = CliRunner().invoke(main, ["bench", str(tiny_export), "--prompt-len", "4", "--new-tokens", "3", "--repeats",
                                  "1", "--threads", "1", "--runtimes", "ort-cpu", "--targets", "-o", str(out)])
    assert t.exit_code == 0 and "Speed targets" in t.stdout and "Speed targets" in _read_md(out / "bench.md")


def test_plot_one_colour_per_row_medians_with_spread_and_a_legend_over_no_data(result, tmp_path, monkeypatch):
    pytest.importorskip("matplotlib", reason="matplotlib (the 'plot' extra) is not installed")
    from matplotlib.colors import to_hex
    from matplotlib.figure import Figure

    from mhaexport.bench.render import plot

    figs = []
    save = Figure.savefig
    monkeypatch.setattr(Figure, "savefig", lambda self, *a, **k: (figs.append(self), save(self, *a, **k))[1])
    assert plot(result, tmp_path / "bench.png")
    fig = figs[0]
    fig.canvas.draw()
    bars, lines = fig.axes[:2]
    ran = [r for r in result.runtimes if r.ran]
    assert [t.get_text() for t in bars.get_yticklabels()] == [r.label for r in ran]  # the rows, named once
    dots = [ln for ln in bars.get_lines() if ln.get_marker() == "o"]
    assert [ln.get_xdata()[0] for ln in dots] == [r.token_p50_ms for r in ran]  # the medians
    colour = {r.label: to_hex(d.get_color()) for r, d in zip(ran, dots)}
    assert len(set(colour.values())) == len(ran)  # one colour per row ...
    for ln in lines.get_lines():  # ... the same in the position panel, its long run included
        label = ln.get_label().removesuffix(", long run")
        if label in colour:
            assert to_hex(ln.get_color()) == colour[label], label
    legend = fig.legends[0].get_window_extent()
    assert not any(legend.overlaps(ax.get_window_extent()) for ax in (bars, lines))


def test_default_lengths_shrink_to_fit_the_model_and_say_so():
    """`mhaexport bench out/tiny` (max_positions 128) exited 2 on its own defaults (32 + 128): a default length
    shrinks to fit, a given one stays and is refused when nothing can fit it."""
    from mhaexport.verbs.bench import _fit_lengths

    cfg, said = _fit_lengths(BenchConfig(), {"prompt_len", "new_tokens"}, 128)
    assert (cfg.prompt_len, cfg.new_tokens) == (32, 96)
    assert said == "--new-tokens 96 (default 128): the defaults shrunk to fit the model's max_positions=128"
    cfg, said = _fit_lengths(BenchConfig(), {"prompt_len", "new_tokens"}, 64)
    assert (cfg.prompt_len, cfg.new_tokens) == (16, 48) and "--prompt-len 16 (default 32) and --new-tokens 48" in said
    cfg, said = _fit_lengths(BenchConfig(prompt_len=100), {"new_tokens"}, 128)  # a given prompt: the default shrinks
    assert (cfg.prompt_len, cfg.new_tokens) == (100, 28)
    cfg, said = _fit_lengths(BenchConfig(prompt_len=127), {"new_tokens"}, 128)  # no room for 2 new tokens: unchanged
    assert (cfg.prompt_len, cfg.new_tokens, said) == (127, 128, None)
    cfg, said = _fit_lengths(BenchConfig(), set(), 128)  # both given: never changed here (the run refuses)
    assert said is None and (cfg.prompt_len, cfg.new_tokens) == (32, 128)
    cfg, said = _fit_lengths(BenchConfig(), {"prompt_len", "new_tokens"}, 4096)  # fits: unchanged, nothing said
    assert said is None and (cfg.prompt_len, cfg.new_tokens) == (32, 128)


def test_a_row_that_beats_the_floor_is_explained_not_called_bounded_by_it(tmp_path):
    """The weight-bandwidth floor reads every weight from memory each step; a row faster than that reads them from
    the CPU's cache: bench.md and bench.html say so, and bench.html draws the line by the same name."""
    from mhaexport.bench.html import html

    res = fabricated(1.1, 1.1)  # floor 5 ms; ort-cpu 5 ms: not below it
    assert "CPU's cache" not in floor_text(res) and "CPU&#39;s cache" not in html(res)
    res.runtimes[2].token_p50_ms = 3.0
    assert [r.name for r in res.below_floor] == ["ort-cpu"]
    text = unescape_md(floor_text(res))
    assert "Token p50 below it (ort-cpu 3.00 ms): the 50.0 MB of weights fit in the CPU's cache" in text
    assert "so for this model it is no floor." in text
    page = html(res)
    assert "Token p50 below it (ort-cpu 3.00 ms): the weights fit in the CPU&#39;s cache" in page


def test_bench_html_shows_the_notes_full_legend_labels_and_bench_pngs_colours(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    import matplotlib.axes

    from mhaexport.bench.html import html, row_colours
    from mhaexport.bench.render import plot

    res = fabricated(1.1, 1.1)
    label = "ort-cpu [attention=decomposed float32]"
    res.runtimes[2] = dataclasses.replace(res.runtimes[2], label=label, positions=[1, 2, 3],
                                          per_position_ms=[5.0, 5.1, 5.2])
    res.runtimes[0] = dataclasses.replace(res.runtimes[0], positions=[1, 2, 3], per_position_ms=[9.0, 9.5, 10.0])
    res.notes = ["ort-bare <x>: runs on the ort-cpu row's InferenceSession"]
    page = html(res)
    assert "<li>ort-bare &lt;x&gt;: runs on the ort-cpu row&#39;s InferenceSession</li>" in page  # bench.md's note
    assert f"<title>{label}</title>" in page and ">decomposed float32]<" in page  # wrapped, never cut
    colours = row_colours(res)
    drawn = re.findall(r'<polyline [^>]*stroke="(#[0-9A-Fa-f]{6})"', page)
    assert set(drawn) == {colours["eager"], colours[label]}
    seen = []
    real = matplotlib.axes.Axes.plot

    def recording(self, *args, **kwargs):
        seen.append(kwargs.get("color"))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(matplotlib.axes.Axes, "plot", recording)
    plot(res, tmp_path / "bench.png")
    assert {colours["eager"], colours[label]} <= set(seen)  # bench.png's rows in bench.html's colours
