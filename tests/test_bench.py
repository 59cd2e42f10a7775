"""`mhaexport bench` on the tiny export: what it measures, what it writes, and how report.md gains its table."""

from __future__ import annotations

import json
import sys

import pytest
from click.testing import CliRunner

from mhaexport.cli import main
from mhaexport.errors import RuntimeInputError
from mhaexport.verify.bench import (REPORT_BEGIN, REPORT_END, BenchConfig, run_bench, weight_bytes_per_token,
                                    write_bench)

SMALL = dict(prompt_len=8, new_tokens=6, repeats=2, threads=1, long_to=40)


@pytest.fixture(scope="module")
def result(tiny_export):
    return run_bench(tiny_export, BenchConfig(**SMALL))


def test_every_runtime_ran_or_says_why(result):
    by = {r.name: r for r in result.runtimes}
    assert list(by) == ["eager", "eager-nocache", "eager-cuda", "torchscript", "ort-cpu", "ort-cuda"]
    for name in ("eager", "eager-nocache", "torchscript", "ort-cpu"):
        r = by[name]
        assert r.ran is True, (name, r.reason)
        assert r.repeats == (1 if name == "eager-nocache" else 2)
        assert r.token_min_ms <= r.token_p50_ms <= r.token_p90_ms
        assert r.ttft_ms >= r.prefill_ms > 0 and r.tokens_per_s > 0
        assert r.positions == list(range(8, 13)) and len(r.per_position_ms) == 5  # new_tokens - 1 decode steps
    assert by["ort-cpu"].providers == ["CPUExecutionProvider"]
    for name in ("eager-cuda", "ort-cuda"):
        r = by[name]
        assert r.ran is True or (r.ran is None and r.reason), (name, r.reason)  # skipped only with a reason


def test_long_run_bandwidth_floor_and_targets(result, tiny):
    lr = result.long_run
    assert lr["positions"][0] == 8 and lr["positions"][-1] == 39 and len(lr["ms"]) == len(lr["positions"])
    assert set(lr["at"]) == {"8"}
    assert result.bandwidth_gbps == max(result.bandwidth[k] for k in ("copy", "sum", "gemv")) > 0
    assert result.floor_ms == pytest.approx(result.weight_bytes_per_token / (result.bandwidth_gbps * 1e9) * 1e3,
                                            rel=1e-3, abs=1e-4)  # floor_ms is rounded to 4 decimals
    targets = {t["target"].split(" (")[0]: t for t in result.targets}
    assert len(targets) == 4
    at1000 = next(t for t in result.targets if "position 1000" in t["target"])
    assert at1000["met"] is None and at1000["measured"] is None  # tiny stops at 128: not measured, never "met"
    ratio = next(t for t in result.targets if t["target"].startswith("ORT CPU per-token p50 / eager"))
    by = {r.name: r for r in result.runtimes}
    assert ratio["measured"] == pytest.approx(by["ort-cpu"].token_p50_ms / by["eager"].token_p50_ms, abs=1e-3)


def test_weight_bytes_count_tied_head_once_and_one_position_row(tiny):
    m = tiny.module
    cfg = tiny.config
    total = sum(p.numel() for p in m.parameters()) * 4  # parameters() yields the tied matrix once
    assert weight_bytes_per_token(m, batch=1) == total - cfg.max_positions * cfg.d_model * 4 + cfg.d_model * 4


def test_writes_files_and_refreshes_report_idempotently(result, tmp_path):
    report = tmp_path / "report.md"
    report.write_text("# Verify report\n\nall checks passed\n")
    written = write_bench(result, tmp_path)
    assert {p.name for p in written} >= {"bench.json", "bench.md", "report.md"}
    data = json.loads((tmp_path / "bench.json").read_text())
    assert data["runtimes"][0]["name"] == "eager" and "floor_ms" in data
    md = (tmp_path / "bench.md").read_text()
    assert "| ort-cpu | CPUExecutionProvider |" in md and "Weight-bandwidth floor" in md
    once = report.read_text()
    write_bench(result, tmp_path)
    twice = report.read_text()
    assert once == twice and twice.count(REPORT_BEGIN) == 1 and twice.count(REPORT_END) == 1
    assert twice.startswith("# Verify report\n\nall checks passed\n")


def test_without_matplotlib_says_so_and_skips_only_the_plot(result, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    written = write_bench(result, tmp_path)
    assert not (tmp_path / "bench.png").exists() and (tmp_path / "bench.json").exists()
    assert "No plot: matplotlib is not installed" in (tmp_path / "bench.md").read_text()
    assert len(written) == 2


def test_plot_written_when_matplotlib_present(result, tmp_path):
    pytest.importorskip("matplotlib", reason="matplotlib (the 'plot' extra) is not installed")
    write_bench(result, tmp_path)
    assert (tmp_path / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bad_bench_requests(tiny_export):
    with pytest.raises(RuntimeInputError, match="exceeds the model's max_positions=128"):
        run_bench(tiny_export, BenchConfig(prompt_len=100, new_tokens=64))
    with pytest.raises(RuntimeInputError, match="unknown runtime"):
        run_bench(tiny_export, BenchConfig(runtimes=("ort-tpu",)))


def test_cli_bench(tiny_export, tmp_path):
    out = tmp_path / "b"
    r = CliRunner().invoke(main, ["bench", str(tiny_export), "--prompt-len", "4", "--new-tokens", "4", "--repeats",
                                  "1", "--threads", "1", "--runtimes", "eager,ort-cpu", "--long", "0",
                                  "--opt-levels", "basic", "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert "| ort-cpu@basic | CPUExecutionProvider |" in r.output
    names = [x["name"] for x in json.loads((out / "bench.json").read_text())["runtimes"]]
    assert names == ["eager", "ort-cpu", "ort-cpu@basic"]
    bad = CliRunner().invoke(main, ["bench", str(tiny_export), "--runtimes", "nope"])
    assert bad.exit_code == 2 and "unknown runtime(s) nope" in bad.output
