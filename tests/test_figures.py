"""Each check's figures as a typed record (verify/figures.py): built by the checks, read by attribute, written as the
same JSON a dict gave (keys, values, order, explicit nulls), read back typed from report.json — a key this version
does not know kept, a known key of the wrong type refused with its path (exit 2), never a crash."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from mhaexport.cli import main
from mhaexport.core.errors import ArtifactError
from mhaexport.verify.figures import (RECORDS, Figures, GenerationFigures, KvFigures, OutputStats, PaddingFigures,
                                      ParityFigures, QualityFigures, Scores, figures_of)
from mhaexport.verify.render import cell
from mhaexport.verify.report import VerifyReport
from mhaexport.verify.results import CheckResult, CrossResult
from test_untrusted import _report


def test_a_check_builds_its_record_and_writes_the_dict_it_wrote_before():
    fig = PaddingFigures.of(pad=4)
    fig.set(left_prefill_max_abs=1e-7, left_decode_max_abs=0.0)
    fig.set(protocol="decode loop", deploy_ragged_max_abs=2e-7, longest_position=9)
    assert list(fig.to_dict()) == ["pad", "left_prefill_max_abs", "left_decode_max_abs", "protocol",
                                   "deploy_ragged_max_abs", "longest_position"]  # the order they were set in
    assert fig.worst == 2e-7 and fig.right_prefill_max_abs is None and "right_prefill_max_abs" not in fig
    gen = GenerationFigures.of(tokens=4, matched=4, first_divergence=None)
    assert gen.to_dict() == {"tokens": 4, "matched": 4, "first_divergence": None}  # an explicit None stays null
    with pytest.raises(TypeError, match="no figure 'matchd'"):
        GenerationFigures.of(matchd=4)  # a misspelt figure is the check's bug, not a new key


def test_a_result_types_its_figures_by_its_check_and_reads_as_a_mapping():
    r = CheckResult("parity", None, {"lossy": True}, "exact parity does not apply")
    assert type(r.figures) is ParityFigures and r.figures.not_a_check == "lossy" and not r.counted
    assert r.figures == {"lossy": True} and dict(r.figures) == {"lossy": True} and r.figures["lossy"] is True
    assert type(CheckResult("a-check-of-tomorrow", True, {"x": 1}).figures) is Figures
    cross = CrossResult("ort-cuda", "ort-cpu", True, {"max_abs": 1e-6, "compared": 10})
    assert cross.figures.max_abs == 1e-6 and cross.as_check().figures is cross.figures


def test_report_json_reads_back_typed_with_unknown_keys_kept_and_writes_the_same():
    rep = _report(host="h")
    data = rep.to_dict()
    parity = data["results"]["ort-cpu"]["parity"]["figures"]
    parity.update({"per_output": {"logits": {"mean": 1e-8, "max": 2e-7, "atol": 1e-4, "a_later_stat": 3}},
                   "a_later_figure": [1, 2]})
    data["results"]["ort-cpu"]["weird-check"] = {"status": True, "figures": {"anything": {"goes": 1}}, "message": ""}
    back = VerifyReport.from_dict(json.loads(json.dumps(data)))
    fig = back.results["ort-cpu"]["parity"].figures
    assert type(fig) is ParityFigures and isinstance(fig.per_output["logits"], OutputStats)
    assert fig.per_output["logits"].max == 2e-7 and fig.extra == {"a_later_figure": [1, 2]}
    again = back.to_dict()  # the counts follow from the records (the unknown check counts): the rest as read
    assert json.dumps(again["results"]) == json.dumps(data["results"])  # keys, values and their order
    assert {k: v for k, v in again.items() if k != "counts"} == {k: v for k, v in data.items() if k != "counts"}


@pytest.mark.parametrize("check, key, value", [("parity", "max_abs", "0.1"), ("kv-consistency", "long_to", 1.5),
                                               ("generation", "step_max_abs", [0.1, "x"]),
                                               ("quality", "sweep", [1]), ("padding", "batch", {"a": 1})])
def test_a_figure_of_the_wrong_type_is_refused_naming_its_path(check, key, value):
    data = _report(host="h").to_dict()
    data["results"]["ort-cpu"][check] = {"status": True, "figures": {key: value}, "message": ""}
    with pytest.raises(ArtifactError, match=rf"field results\.ort-cpu\.{check}\.figures\.{key}"):
        VerifyReport.from_dict(data)


def test_report_merge_refuses_a_hostile_figure_with_exit_2(tmp_path):
    data = _report(host="h").to_dict()
    data["results"]["ort-cpu"]["parity"]["figures"]["per_output"] = {"logits": {"max": "big"}}
    (tmp_path / "a.json").write_text(json.dumps(data))
    (tmp_path / "b.json").write_text(json.dumps(_report(host="g").to_dict()))
    res = CliRunner().invoke(main, ["report", "merge", str(tmp_path / "a.json"), str(tmp_path / "b.json"),
                                    "-o", str(tmp_path / "out")])
    assert res.exit_code == 2 and "per_output.logits.max" in res.output, res.output


def test_the_cells_read_records_that_lack_figures_an_older_report_did_not_write():
    for check, cls in RECORDS.items():
        r = CheckResult(check, True, {}, "ok")
        assert type(r.figures) is cls
        assert cell(r).startswith("✅"), check  # no figure: no crash
    kv = CheckResult("kv-consistency", True, KvFigures.of(decode_max_abs=1e-7, long_max_abs=3e-6, long_to=127))
    assert cell(kv) == "✅ max 3.0e-06, out to pos 127"  # a max error and how far the decode reached
    q = CheckResult("quality", False, QualityFigures.of(scheme="int4", sweep=Scores(positions=3, logit_err=0.05)))
    assert cell(q) == "❌ logit err 0.05"
    assert figures_of("parity", ParityFigures.of(errors=2)).errors == 2


def test_a_cell_never_shows_a_figure_nothing_measured_nor_hides_a_nan_behind_a_zero():
    """A check that compared nothing shows "—" (not 0.0e+00, a perfect score); a worst-of figure whose later part is
    NaN is NaN (``max(0, nan)`` is 0)."""
    for check in ("parity", "causality", "kv-consistency", "padding"):
        assert cell(CheckResult(check, True, {}, "")) == "✅ —", check
    nan = float("nan")
    kv = CheckResult("kv-consistency", False, KvFigures.of(decode_max_abs=0.0, chunked_max_abs=nan))
    assert cell(kv) == "❌ max NaN"
    pad = CheckResult("padding", False, PaddingFigures.of(left_prefill_max_abs=0.0, deploy_ragged_max_abs=nan))
    assert cell(pad) == "❌ NaN"
