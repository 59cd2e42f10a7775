"""verify: comparisons, sweep, runners, the report, and the CLI on the tiny preset's export."""

from __future__ import annotations

import json
import re
import shutil

import numpy as np
import pytest
from click.testing import CliRunner

from mhaexport.core.devices import no_cuda_device
from mhaexport.cli import main
from mhaexport.core.errors import RuntimeInputError
from mhaexport.artifact import ExportFolder
from mhaexport.models.loading import load_recorded
from mhaexport.verify import CHECKS, build_sweep, load_report, merge_reports
from mhaexport.verify.compare import Tolerance, compare
from mhaexport.artifact.record import Environment
from mhaexport.verify.report import ReportModel, SweepInfo, ToleranceInfo, VerifyReport
from mhaexport.verify.results import CheckResult
from mhaexport.runtime.choose import ort_runner_for
from mhaexport.runners.decoder import EagerRunner
from mhaexport.runners.names import session_config
from mhaexport.runtime.runner import Runner
from mhaexport.verify.render import markdown, write_report

pytestmark = pytest.mark.usefixtures("one_thread")


# --- pure pieces --------------------------------------------------------------------------------------------------

def test_compare_figures_and_smallest_passing_atol():
    e = np.array([1.0, 2.0, -3.0])
    a = np.array([1.0, 2.01, -3.0])
    d = compare(a, e, Tolerance(1e-4, 1e-3))
    assert not d.ok and d.mismatched == 1 and d.total == 3
    assert d.max_abs == pytest.approx(0.01)
    assert d.min_atol == pytest.approx(0.01 - 2e-3)
    assert compare(a, e, Tolerance(d.min_atol * 1.0001, 1e-3)).ok  # the reported atol does pass
    assert not compare(a, e, Tolerance(d.min_atol * 0.99, 1e-3)).ok


def test_compare_selects_real_positions_and_counts_nan():
    e = np.zeros((2, 3))
    a = e.copy()
    a[1, 0] = 5.0  # a padded position
    where = np.array([[True, True, True], [False, True, True]])
    assert compare(a, e, Tolerance(1e-4, 0), where).ok
    a[0, 0] = np.nan
    assert compare(a, e, Tolerance(1e-4, 0), where).mismatched == 1


def test_sweep_covers_the_brief(tiny):
    c = tiny.contract
    cases = build_sweep(c, "quick", seed=0)
    assert cases == build_sweep(c, "quick", seed=0)  # reproducible
    seqs, pasts = {x.seq for x in cases}, {x.past for x in cases}
    assert {1, 2} <= seqs and 0 in pasts and 1 in pasts and max(pasts) > 5
    assert any(x.batch == 1 for x in cases) and any(x.batch > 1 for x in cases)
    assert any(any(x.pad) for x in cases)
    assert any(x.seq + x.past == c.max_positions for x in cases)
    assert all(x.seq + x.past <= c.max_positions for x in build_sweep(c, "full", seed=3))
    assert len(build_sweep(c, "full")) > len(cases)
    ids1, _, _ = cases[2].inputs(c)
    ids2, _, _ = cases[2].inputs(c)
    assert (ids1 == ids2).all()


def test_runner_checks_inputs(tiny):
    r = EagerRunner(name="eager", contract=tiny.contract, module=tiny.module)
    ids, mask, past = build_sweep(tiny.contract)[3].inputs(tiny.contract)
    logits, present = r.run(ids, mask, past)
    assert logits.shape == (1, 1, tiny.contract.vocab_size) and present[0][0].shape[2] == 2
    with pytest.raises(RuntimeInputError, match="attention_mask"):
        r.run(ids, mask[:, 1:], past)
    with pytest.raises(RuntimeInputError, match="input_ids must hold integers"):
        r.run(ids.astype(np.float32), mask, past)
    with pytest.raises(RuntimeInputError, match="pairs"):
        r.run(ids, mask, past[:1])


def test_ort_cuda_is_skipped_with_the_real_reason_unless_the_session_uses_it(tiny, tiny_export):
    r = ort_runner_for(ExportFolder.open(tiny_export), "ort-cuda", session_config("ort-cuda")).activate()
    if "CUDAExecutionProvider" in r.providers:
        assert r.available
    else:
        assert not r.available
        # no device: that sentence, not a library error; a device CUDA cannot use: what the session fell back to
        assert (no_cuda_device() or "session runs on ['CPUExecutionProvider']") in r.skip_reason


def test_the_recorded_model_is_rebuilt_the_same(tiny, tiny_export):
    loaded = load_recorded(ExportFolder.open(tiny_export))
    assert loaded.fingerprint == tiny.fingerprint
    ids, mask, past = build_sweep(tiny.contract)[2].inputs(tiny.contract)
    a = EagerRunner(name="a", contract=tiny.contract, module=loaded.module).run(ids, mask, past)[0]
    b = EagerRunner(name="b", contract=tiny.contract, module=tiny.module).run(ids, mask, past)[0]
    assert np.array_equal(a, b)


def _report(status_by_rt: dict[str, bool | None], host: str, requested: list[str] | None = None) -> VerifyReport:
    from mhaexport.verify.report import RuntimeInfo

    infos = {rt: RuntimeInfo(rt, "ran" if s is not None else "skipped", "" if s is not None else "no GPU")
             for rt, s in status_by_rt.items()}
    results = {rt: {ch: CheckResult(ch, s, {"max_abs": 1e-6}, "") for ch in CHECKS} for rt, s in status_by_rt.items()}
    return VerifyReport(model=ReportModel("preset:tiny"), folder="x", sweep=SweepInfo("quick", 0, 9),
                        tolerance=ToleranceInfo(1e-4, 1e-3), runtimes=infos, results=results,
                        environment=Environment(host=host), requested=requested)


def test_report_json_round_trip_and_skipped_is_not_passed(tmp_path):
    rep = _report({"eager": True, "ort-cpu": True, "ort-cuda": None}, "cpu-box")
    assert rep.passed and rep.verdict.code == 0 and rep.counts["skipped"] == len(CHECKS)
    only_eager = _report({"eager": True, "ort-cuda": None}, "cpu-box")
    assert not only_eager.passed and only_eager.verdict.code == 4  # eager checking itself verifies no artifact
    assert "nothing was verified" in only_eager.verdict.message
    only_skipped = _report({"ort-cuda": None}, "cpu-box")
    assert not only_skipped.passed  # nothing passed: skipped never counts as passed
    js, md, page = write_report(rep, tmp_path)
    assert page.name == "report.html" and page.is_file()
    back = load_report(js)
    assert back.to_dict()["results"] == rep.to_dict()["results"]
    assert json.loads(js.read_text())["schema"].startswith("mhaexport.verify.report/")
    assert "⏭" in md.read_text() and "✅" in md.read_text()


def test_a_runtime_requested_by_name_and_skipped_is_not_verified():
    """`verify --runtime ort-cuda` where CUDA does not load: not "passed" (exit 4), with the reason."""
    rep = _report({"eager": True, "ort-cuda": None}, "cpu-box", requested=["ort-cuda"])
    v = rep.verdict
    assert (v.status, v.code) == ("not verified", 4) and not rep.passed
    assert v.message == "nothing requested was verified: ort-cuda skipped (no GPU)"
    some = _report({"eager": True, "ort-cpu": True, "ort-cuda": None}, "cpu-box", requested=["ort-cpu", "ort-cuda"])
    assert some.verdict.code == 4 and some.verdict.message.startswith("not verified as requested: ort-cuda skipped")
    failed = _report({"eager": True, "ort-cpu": False, "ort-cuda": None}, "cpu-box", requested=["ort-cpu", "ort-cuda"])
    assert failed.verdict.code == 1  # a failure outranks a skip
    assert "NOT VERIFIED" in markdown(rep) and rep.default_name() == "report-ort-cuda"


def test_merge_keeps_runs_over_skips_and_labels_hosts():
    cpu = _report({"eager": True, "ort-cpu": True, "ort-cuda": None}, "cpu")
    gpu = _report({"eager": True, "ort-cpu": True, "ort-cuda": False}, "gpu")
    merged = merge_reports([cpu, gpu])
    assert set(merged.runtimes) == {"eager@cpu", "ort-cpu@cpu", "eager@gpu", "ort-cpu@gpu", "ort-cuda@gpu"}
    assert not merged.passed and merged.counts["failed"] == len(CHECKS)
    assert "ort-cuda@gpu" in markdown(merged)


# --- the CLI on the tiny export -----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def verified(tiny_export, tmp_path_factory):
    """`mhaexport verify DIR` on a copy of the tiny export (report files land in the copy)."""
    folder = tmp_path_factory.mktemp("verified") / "export"
    shutil.copytree(tiny_export, folder)
    result = CliRunner().invoke(main, ["verify", str(folder)])
    return folder, result


def test_verify_cli_passes_the_builtin_model_and_writes_the_report(verified):
    folder, result = verified
    assert result.exit_code == 0, result.output
    data = json.loads((folder / "report.json").read_text())
    assert data["passed"] is True
    for rt in ("eager", "torchscript", "ort-cpu"):
        assert data["runtimes"][rt]["status"] == "ran"
        for ch in CHECKS:
            want = None if (rt, ch) == ("eager", "parity") else True
            assert data["results"][rt][ch]["status"] is want, (rt, ch, data["results"][rt][ch])
    assert data["runtimes"]["ort-cpu"]["providers"] == ["CPUExecutionProvider"]
    cuda = data["runtimes"]["ort-cuda"]
    if "CUDAExecutionProvider" not in cuda["providers"]:
        assert cuda["status"] == "skipped" and cuda["reason"]
        assert all(r["status"] is None for r in data["results"]["ort-cuda"].values())
    md = (folder / "report.md").read_text()
    assert md.startswith("## mhaexport verify: ✅ PASSED")
    assert "| ort-cpu | CPU |" in md


def test_report_merge_cli(verified, tmp_path):
    folder, _ = verified
    result = CliRunner().invoke(main, ["report", "merge", str(folder), str(folder / "report.json"),
                                       "--name", "cpu", "--name", "gpu", "-o", str(tmp_path)])
    assert result.exit_code == 0, result.output
    md = (tmp_path / "report.md").read_text()
    assert "| ort-cpu@cpu |" in md and "| ort-cpu@gpu |" in md
    page = (tmp_path / "report.html").read_text()  # the merged report's page: both machines' rows and plots
    assert "<b>ort-cpu@cpu</b>" in page and "<b>ort-cpu@gpu</b>" in page and "Merged from: " in page
    assert re.search(r"<text [^>]*>ort-cpu@gpu<", page)  # in the plots' legends


def test_verify_refuses_a_tampered_export_with_exit_2(tiny_export, tmp_path):
    folder = tmp_path / "bad"
    shutil.copytree(tiny_export, folder)
    with open(folder / "model.onnx", "ab") as f:
        f.write(b"\0")
    result = CliRunner().invoke(main, ["verify", str(folder)])
    assert result.exit_code == 2
    assert "model.onnx" in result.output and "Traceback" not in result.output


def test_verify_bad_usage_exits_2(tmp_path):
    assert CliRunner().invoke(main, ["verify", str(tmp_path)]).exit_code == 2  # no manifest
    assert CliRunner().invoke(main, ["verify", str(tmp_path), "--config", "tiny"]).exit_code == 2
    res = CliRunner().invoke(main, ["report", "merge", str(tmp_path / "nope.json"), "-o", str(tmp_path)])
    assert res.exit_code == 2


def test_tighter_tolerance_fails_and_reports_the_atol_that_would_pass(tiny, tiny_export, tmp_path):
    from mhaexport.verify import verify_folder

    rep = verify_folder(tiny_export, loaded=tiny, atol=0.0, rtol=0.0, runtimes=("ort-cpu",), checks=("parity",))
    parity = rep.results["ort-cpu"]["parity"]
    if parity.figures["max_abs"] == 0:
        pytest.skip("ORT matched eager bit for bit on this machine: nothing to tighten")  # pragma: no cover
    assert not rep.passed and parity.status is False
    assert parity.figures["min_atol"] > 0 and "would pass" in parity.message
    loose = verify_folder(tiny_export, loaded=tiny, atol=parity.figures["min_atol"] * 1.01, rtol=0.0,
                          runtimes=("ort-cpu",), checks=("parity",))
    assert loose.results["ort-cpu"]["parity"].status is True  # the reported atol really passes


# --- generation: a divergence at a near-tie is a tie, a real one is a failure ---------------------------------------

class _FixedLogits(Runner):
    """A toy runtime: the same logits at every position, zeros for the cache (enough for greedy decoding)."""

    def __init__(self, name, contract, logits):
        super().__init__(name=name, contract=contract)
        self.logits = np.asarray(logits, dtype=np.float32)

    def run_impl(self, ids, mask, past):
        B, T = ids.shape
        S = mask.shape[1]
        kv = np.zeros((B, self.contract.n_heads, S, self.contract.head_dim), np.float32)
        return np.broadcast_to(self.logits, (B, T, self.logits.size)).copy(), tuple((kv, kv) for _ in past)


@pytest.mark.parametrize("flip, want", [(2e-6, True), (0.5, False)])
def test_generation_reports_a_near_tie_as_a_tie(flip, want):
    from mhaexport.core.iospec import ModelContract
    from mhaexport.verify.checks import check_generation
    from mhaexport.verify.results import Context

    c = ModelContract(n_layers=1, n_heads=1, head_dim=2, vocab_size=4, max_positions=32)
    base = np.array([0.0, 1.0, 1.0 - 1e-6, -1.0])  # eager: token 1 by a 1e-6 margin
    other = base.copy()
    other[2] += flip  # the artifact prefers token 2
    eager = _FixedLogits("eager", c, base)
    ctx = Context(contract=c, cases=[], tol=Tolerance(1e-4, 1e-3), eager=eager, export_sizes=(3, 5), gen_tokens=4)
    r = check_generation(_FixedLogits("ort-cpu", c, other), ctx)
    assert r.figures["first_divergence"] == 0
    assert r.status is want
    assert ("tie" in r.message) is want


class _StepLogits(_FixedLogits):
    """Logits that depend on the step (the mask's width): ``first`` at the prefill, ``later`` after it."""

    def __init__(self, name, contract, first, later, prompt_len):
        super().__init__(name, contract, first)
        self.first, self.later, self.prompt_len = (np.asarray(first, np.float32), np.asarray(later, np.float32),
                                                   prompt_len)

    def run_impl(self, ids, mask, past):
        self.logits = self.first if mask.shape[1] == self.prompt_len else self.later
        return super().run_impl(ids, mask, past)


def test_a_tie_after_earlier_logit_mismatches_is_a_failure():
    from mhaexport.core.iospec import ModelContract
    from mhaexport.verify.checks import check_generation
    from mhaexport.verify.results import Context

    c = ModelContract(n_layers=1, n_heads=1, head_dim=2, vocab_size=4, max_positions=32)
    base = np.array([0.0, 1.0, 1.0 - 1e-6, -1.0])
    wrong_first = base + np.array([0, 0, 0, 0.5])  # step 0: same greedy token, a logit off by 0.5
    tie_later = base + np.array([0, 0, 2e-6, 0])  # step 1: flips at a near-tie
    ctx = Context(contract=c, cases=[], tol=Tolerance(1e-4, 1e-3), eager=_FixedLogits("eager", c, base),
                  export_sizes=(3, 5), gen_tokens=4)
    r = check_generation(_StepLogits("ort-cpu", c, wrong_first, tie_later, prompt_len=6), ctx)
    assert r.figures["first_divergence"] == 1
    assert r.status is False and "tie" not in r.message


def test_report_padding_cell_shows_the_worst_figure_and_merge_keeps_same_host_reports_apart():
    failing = _report({"eager": True}, "box")
    failing.results["eager"]["padding"] = CheckResult("padding", False, {"left_prefill_max_abs": 0.0,
                                                                         "right_decode_max_abs": 0.25}, "right pads")
    assert "❌ 2.5e-01" in markdown(failing)
    passing = _report({"eager": True}, "box")
    merged = merge_reports([failing, passing])
    assert set(merged.runtimes) == {"eager@box", "eager@box#2"}
    assert not merged.passed and merged.counts["failed"] == 1


def test_report_merge_of_only_skipped_runs_is_not_verified(tmp_path):
    a = _report({"ort-cuda": None}, "a")
    write_report(a, tmp_path / "a")
    res = CliRunner().invoke(main, ["report", "merge", str(tmp_path / "a"), "-o", str(tmp_path / "m")])
    assert res.exit_code == 4, res.output
    assert "nothing was verified" in res.output


def test_report_merge_as_a_real_subprocess(verified, tmp_path):
    import subprocess
    import sys

    folder, _ = verified
    proc = subprocess.run([sys.executable, "-m", "mhaexport", "report", "merge", str(folder), "-o", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "## mhaexport verify: ✅ PASSED" in proc.stdout
    assert (tmp_path / "report.json").is_file()


def test_a_static_export_is_reported_static_not_failed(tiny, tmp_path):
    from mhaexport.exporter.onnx import export_onnx

    export_onnx(tiny, tmp_path, seq_dynamic=False, seq_len=6, past_len=0)
    res = CliRunner().invoke(main, ["verify", str(tmp_path), "--runtime", "ort-cpu"])
    assert res.exit_code == 0, res.output
    # a run of named runtimes writes its own report (it would not replace a full report.json)
    assert not (tmp_path / "report.json").exists()
    ort = json.loads((tmp_path / "report-ort-cpu.json").read_text())["results"]["ort-cpu"]
    assert ort["parity"]["status"] is True and ort["causality"]["status"] is True
    for check in ("dynamic-shapes", "kv-consistency", "padding", "generation"):
        assert ort[check]["status"] is None and ort[check]["figures"]["static"] is True, check
    assert "⏭ static" in (tmp_path / "report-ort-cpu.md").read_text()


def test_report_write_keeps_sections_other_commands_own(tmp_path):
    """Sections other commands own are made again from their records (bench's from bench.json), never carried over
    from the old report.md: an output folder's files are input too."""
    rep = _report({"eager": True}, "cpu")
    (tmp_path / "report.md").write_text("old table\n<!-- bench -->\n## Bench\nrow\n<!-- /bench -->\n")
    _, md, _ = write_report(rep, tmp_path, sections=("<!-- bench -->\n## Bench\n\nmade again\n<!-- /bench -->",))
    text = md.read_text()
    assert "old table" not in text and "row" not in text and "## Bench\n\nmade again" in text
    assert text.startswith("## mhaexport verify")


def test_verify_dir_rebuilds_a_file_factory_and_checkpoint_from_another_folder(tiny, tmp_path, monkeypatch):
    """Relative --model/--checkpoint paths recorded at export still resolve when verify runs elsewhere."""
    import torch

    src = tmp_path / "proj"
    (src / "sub").mkdir(parents=True)
    shutil.copy("examples/user_decoder.py", src / "sub" / "user_decoder.py")
    monkeypatch.chdir(src)
    from mhaexport.models.loading import load_model

    user = load_model(model="sub/user_decoder.py:build")
    torch.save(user.module.state_dict(), src / "w.pt")
    res = CliRunner().invoke(main, ["torchscript", "--model", "sub/user_decoder.py:build", "--checkpoint", "w.pt",
                                    "-o", "out"])
    assert res.exit_code == 0, res.output
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(main, ["verify", "proj/out", "--trust-code"])  # the folder is ours: its factory runs
    assert res.exit_code == 0, res.output
    assert json.loads((src / "out" / "report.json").read_text())["model"]["spec"] == "factory:sub/user_decoder.py:build"


def test_per_output_tolerances_from_the_cli(tiny_export, tmp_path):
    """--atol logits=X --atol present=Y: each output is held to its own tolerance; the report says which."""
    res = CliRunner().invoke(main, ["verify", str(tiny_export), "--runtime", "ort-cpu", "--atol", "logits=1e-3",
                                    "--atol", "present=0", "--rtol", "present=0", "-o", str(tmp_path)])
    data = json.loads((tmp_path / "report.json").read_text())
    per = data["results"]["ort-cpu"]["parity"]["figures"]["per_output"]
    assert per["logits"]["atol"] == 1e-3 and per["present"]["atol"] == 0 and per["present"]["rtol"] == 0
    assert data["tolerance"]["per_output"]["present"] == {"atol": 0.0, "rtol": 0.0}
    if per["present"]["max"] > 0:  # exact zero tolerance on present: any rounding difference fails it alone
        assert res.exit_code == 1 and "present" in data["results"]["ort-cpu"]["parity"]["message"]
    bad = CliRunner().invoke(main, ["verify", str(tiny_export), "--atol", "weights=1"])
    assert bad.exit_code == 2 and "OUTPUT must be one of logits, present" in bad.output


def test_error_statistics_are_exact_where_they_can_be():
    from mhaexport.verify.compare import Diff

    e = np.zeros(1000)
    a = np.concatenate([np.full(990, 1e-6), np.full(10, 1e-2)])
    d = compare(a, e, Tolerance(1e-4, 0))
    st = d.stats()
    assert st["max"] == pytest.approx(1e-2) and st["mean"] == pytest.approx((990e-6 + 0.1) / 1000, rel=1e-3)
    assert 1e-6 <= st["median"] <= 1.13e-6 and 1e-6 <= st["p99"] <= 1.13e-6  # bin upper edges: within 12 %
    assert st["mismatch_fraction"] == pytest.approx(0.01)
    merged = d.merge(Diff())
    assert merged.stats() == st


class _Offset(Runner):
    """A toy runtime: zero logits and cache plus a constant offset (a provider's systematic error)."""

    def __init__(self, name, contract, offset):
        super().__init__(name, contract)
        self.offset = offset

    def run_impl(self, ids, mask, past):
        B, T = ids.shape
        kv = np.zeros((B, self.contract.n_kv_heads, mask.shape[1], self.contract.head_dim), np.float32)
        logits = np.full((B, T, self.contract.vocab_size), self.offset, np.float32)
        return logits, tuple((kv, kv) for _ in past)


@pytest.mark.parametrize("offset,agree", [(4e-5, True), (8e-5, False)])
def test_ort_cuda_and_ort_cpu_are_compared_with_each_other(offset, agree):
    """Each provider within tolerance of eager (|±offset| < 1e-4) can still disagree with the other by 2 x offset."""
    from mhaexport.core.iospec import ModelContract
    from mhaexport.verify.checks import check_parity, cross_provider
    from mhaexport.verify.report import RuntimeInfo
    from mhaexport.verify.results import Context

    c = ModelContract(n_layers=1, n_heads=1, head_dim=2, vocab_size=4, max_positions=32)
    runners = [_Offset("eager", c, 0.0), _Offset("ort-cpu", c, offset), _Offset("ort-cuda", c, -offset)]
    ctx = Context(contract=c, cases=build_sweep(c), tol=Tolerance(1e-4, 1e-3), eager=runners[0], export_sizes=(3, 5))
    for r in runners[1:]:
        assert check_parity(r, ctx).status is True  # each alone is "close to eager"
    infos = {r.name: RuntimeInfo(r.name, "ran") for r in runners}
    (cross,) = cross_provider(runners, infos, ctx)
    assert (cross.a, cross.b, cross.status) == ("ort-cuda", "ort-cpu", agree)
    assert cross.figures["max_abs"] == pytest.approx(2 * offset, rel=1e-3)
    infos["ort-cuda"] = RuntimeInfo("ort-cuda", "skipped", "no CUDA")
    assert cross_provider(runners, infos, ctx) == []  # only when both ran


def test_a_default_run_leaves_out_the_runtimes_of_artifacts_the_folder_lacks(tiny_lowered, tiny):
    """An ONNX-only folder verified with the default runtimes: TorchScript was not asked for, so it is neither a row
    nor a skipped check (it was "8 skipped" per run); named, it is skipped and the verdict says not verified."""
    folder = tiny_lowered["onnx"]  # the ONNX lowering's export: no model.pt
    from mhaexport.verify import verify_folder

    report = verify_folder(folder, loaded=tiny, checks=("finite",))
    assert "torchscript" not in report.runtimes and "ort-cpu" in report.runtimes
    assert report.counts["skipped"] == sum(info.status == "skipped" for info in report.runtimes.values())  # ort-cuda
    named = verify_folder(folder, loaded=tiny, checks=("finite",), runtimes=("torchscript", "ort-cpu"))
    assert named.runtimes["torchscript"].status == "skipped" and named.verdict.code == 4
