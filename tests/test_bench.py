"""`mhaexport bench` on the tiny export: what it measures, what it writes, how report.md gains its table, and how
--compare / --lowerings put several lowerings of one model side by side."""

from __future__ import annotations

import json
import shutil
import sys

import pytest
from click.testing import CliRunner

from mhaexport.cli import main
from mhaexport.errors import ArtifactError, ConfigError, RuntimeInputError
from mhaexport.verify.bench import (REPORT_BEGIN, REPORT_END, BenchConfig, RuntimeBench, _round_robin, _Runner,
                                    export_lowerings, parse_lowerings, run_bench, weight_bytes_per_token,
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
    lr = result.long_run()
    assert lr["positions"][0] == 8 and lr["positions"][-1] == 39 and len(lr["ms"]) == len(lr["positions"])
    assert (lr["near"], lr["far"]) == (8, 31)  # tiny stops at 40: far is the last full +-8 window, not 1000
    assert set(lr["at"]) == {"8", "31"} and all(v > 0 for v in lr["at"].values())
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
    assert "plot" not in data["environment"]  # the markdown's plot line stays in the markdown
    assert not list(tmp_path.glob(".*.tmp"))  # atomic writes leave no temporary files behind
    md = (tmp_path / "bench.md").read_text()
    assert "| ort-cpu [attention=decomposed float32] | CPUExecutionProvider |" in md and "Weight-bandwidth floor" in md
    assert "this run differs, so read them as figures, not as a verdict" in md  # the targets are for `bench`
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
    assert "plot" not in json.loads((tmp_path / "bench.json").read_text())["environment"]
    assert "No plot" not in result.summary()  # the terminal summary has no plot line


def test_plot_written_when_matplotlib_present(result, tmp_path):
    pytest.importorskip("matplotlib", reason="matplotlib (the 'plot' extra) is not installed")
    write_bench(result, tmp_path)
    assert (tmp_path / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bad_bench_requests(tiny_export):
    with pytest.raises(RuntimeInputError, match="exceeds the model's max_positions=128"):
        run_bench(tiny_export, BenchConfig(prompt_len=100, new_tokens=64))
    with pytest.raises(RuntimeInputError, match="unknown runtime"):
        run_bench(tiny_export, BenchConfig(runtimes=("ort-tpu",)))
    with pytest.raises(ConfigError, match="unknown graph optimization level"):
        run_bench(tiny_export, BenchConfig(opt_levels=("basic", "basik")))


def test_bench_restores_torch_threads(tiny_export):
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        res = run_bench(tiny_export, BenchConfig(prompt_len=4, new_tokens=3, repeats=1, threads=1, long_to=0,
                                                 runtimes=("eager",)))
        assert res.get("eager").ran is True
        assert torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(before)


def test_cli_bench(tiny_export, tmp_path):
    out = tmp_path / "b"
    r = CliRunner().invoke(main, ["bench", str(tiny_export), "--prompt-len", "4", "--new-tokens", "4", "--repeats",
                                  "1", "--threads", "1", "--runtimes", "eager,ort-cpu", "--long", "0",
                                  "--opt-levels", "basic", "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert "| ort-cpu@basic [attention=decomposed float32] | CPUExecutionProvider |" in r.output
    data = json.loads((out / "bench.json").read_text())
    names = [x["name"] for x in data["runtimes"]]
    assert names == ["eager", "ort-cpu", "ort-cpu@basic"]
    assert [x["opt_level"] for x in data["runtimes"]] == [None, None, "basic"]
    assert [lw["name"] for lw in data["lowerings"]] == ["ort-cpu"]  # an opt level is not another lowering
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
                    progress=messages.append)
    return res, messages


def test_compare_adds_one_row_per_lowering(compared, tiny_export, ort_export):
    res, _ = compared
    assert [r.name for r in res.runtimes] == ["eager", "ort-cpu", ORT_LABEL]  # FOLDER itself is not compared again
    own, other = res.runtimes[1], res.runtimes[2]
    assert own.label == "ort-cpu [attention=decomposed float32]" and own.folder == str(tiny_export)
    assert other.label == ORT_LABEL and other.lowering == "attention=ort float32" and other.folder == str(ort_export)
    for r in res.runtimes:
        assert r.ran is True and r.repeats == 2 and r.positions == list(range(8, 13)), (r.name, r.reason)
    assert res.model["fingerprint"] == json.loads((ort_export / "manifest.json").read_text())["model"]["fingerprint"]


def test_setup_first_then_timed_rounds_round_robin(compared):
    _, messages = compared
    first_round = next(i for i, m in enumerate(messages) if m.startswith("timed round 1/2"))
    assert all(i < first_round for i, m in enumerate(messages) if m.startswith("loading and warming up"))
    rounds = [m for m in messages if m.startswith("timed round")]
    assert rounds == [f"timed round {k}/2: eager, ort-cpu [attention=decomposed float32], {ORT_LABEL} ..."
                      for k in (1, 2)]


def test_round_robin_order_short_runner_and_failing_runner():
    calls: list[str] = []

    def runner(name: str, repeats: int, fail_at: int | None = None) -> _Runner:
        def generate(n: int) -> tuple:
            calls.append(name)
            if fail_at is not None and calls.count(name) == fail_at:
                raise RuntimeInputError(f"{name} broke\nsecond line")
            return 0.0, 0.0, [0.001] * (n - 1), list(range(n - 1))
        return _Runner(RuntimeBench(name), generate, repeats)

    rs = [runner("a", 3), runner("nocache", 1), runner("bad", 3, fail_at=2), runner("c", 3)]
    _round_robin(rs, 4, lambda m: None)
    assert calls == ["a", "nocache", "bad", "c", "a", "bad", "c", "a", "c"]
    assert [len(r.runs) for r in rs] == [3, 1, 1, 3]
    assert rs[2].rb.ran is None and rs[2].rb.reason == "bad broke"  # skipped with the first line of why


def test_long_runs_and_lowering_table_per_lowering(compared, tmp_path):
    res, _ = compared
    assert [lr["name"] for lr in res.long_runs] == ["ort-cpu", ORT_LABEL]
    for lr in res.long_runs:
        assert lr["positions"] == list(range(8, 40)) and set(lr["at"]) == {"8", "31"}
    table = {lw["name"]: lw for lw in res.lowerings}
    assert list(table) == ["ort-cpu", ORT_LABEL]
    p50 = {n: res.get(n).token_p50_ms for n in table}
    for name, lw in table.items():
        assert lw["vs_fastest"] == pytest.approx(p50[name] / min(p50.values()), abs=1e-3)
        lr = res.long_run(name)
        assert (lw["near_ms"], lw["far_ms"]) == (lr["at"]["8"], lr["at"]["31"])
        assert lw["far_over_near"] == pytest.approx(lw["far_ms"] / lw["near_ms"], abs=1e-3)
    assert min(lw["vs_fastest"] for lw in table.values()) == 1.0
    write_bench(res, tmp_path)
    md = (tmp_path / "bench.md").read_text()
    assert "| lowering | provider | token p50 | x fastest | at 8 | at 31 | at 31 / at 8 |" in md
    assert f"| {ORT_LABEL} | CPUExecutionProvider | {table[ORT_LABEL]['token_p50_ms']:.2f} |" in md
    data = json.loads((tmp_path / "bench.json").read_text())
    assert [lw["label"] for lw in data["lowerings"]] == ["ort-cpu [attention=decomposed float32]", ORT_LABEL]


def test_two_folders_with_one_lowering_get_distinct_rows(tiny_export, ort_export, tmp_path):
    twin = tmp_path / "twin"
    shutil.copytree(ort_export, twin)
    res = run_bench(tiny_export, BenchConfig(prompt_len=4, new_tokens=3, repeats=1, threads=1, long_to=0,
                                             runtimes=("ort-cpu",), compare=(str(ort_export), str(twin))))
    assert [r.name for r in res.runtimes] == ["ort-cpu", ORT_LABEL, f"ort-cpu [attention=ort float32, {twin}]"]
    assert all(r.ran for r in res.runtimes) and res.long_runs == []


def test_compare_refuses_another_model(tiny_export, tmp_path):
    cfg = json.loads((tiny_export / "manifest.json").read_text())["model"]["config"]
    (tmp_path / "other.json").write_text(json.dumps({**cfg, "n_layers": 1, "name": "other"}))
    other = tmp_path / "other"
    assert CliRunner().invoke(main, ["onnx", "--config", str(tmp_path / "other.json"), "-o", str(other)]).exit_code == 0
    r = CliRunner().invoke(main, ["bench", str(tiny_export), "--compare", str(other), "--runtimes", "ort-cpu",
                                  "--prompt-len", "4", "--new-tokens", "3"])
    assert r.exit_code == 2
    lines = [x for x in r.output.splitlines() if x.startswith("Error:")]
    assert len(lines) == 1 and f"--compare {other} holds config:" in lines[0]
    assert "compare exports of one model only" in lines[0] and "preset:tiny" in lines[0]


def test_compare_needs_an_ort_runtime_and_an_onnx_export(tiny_export, ort_export, tmp_path):
    with pytest.raises(RuntimeInputError, match="neither ort-cpu nor ort-cuda"):
        run_bench(tiny_export, BenchConfig(prompt_len=4, new_tokens=3, runtimes=("eager",),
                                           compare=(str(ort_export),)))
    with pytest.raises(ArtifactError, match="has no manifest.json"):
        run_bench(tiny_export, BenchConfig(prompt_len=4, new_tokens=3, runtimes=("ort-cpu",),
                                           compare=(str(tmp_path),)))


def test_cli_lowerings_reuses_exports_and_rejects_unknown(tiny_export, ort_export, lowering_dir):
    r = CliRunner().invoke(main, ["bench", str(tiny_export), "--lowerings", "decomposed,ort", "-o", str(lowering_dir),
                                  "--prompt-len", "4", "--new-tokens", "3", "--repeats", "1", "--threads", "1",
                                  "--runtimes", "ort-cpu", "--long", "0"])
    assert r.exit_code == 0, r.output
    assert f"reusing {ort_export} (attention=ort float32)" in r.output and "exporting" not in r.output
    assert f"| {ORT_LABEL} | CPUExecutionProvider |" in r.output
    bad = CliRunner().invoke(main, ["bench", str(tiny_export), "--lowerings", "ort:float8"])
    assert bad.exit_code == 2 and "--lowerings 'ort:float8': expected ATTENTION[:DTYPE]" in bad.output
    assert parse_lowerings("ort, onnx:float16,ort:float32") == [("ort", "float32"), ("onnx", "float16")]
