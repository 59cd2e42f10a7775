"""report.html (verify/html.py, verify/svg.py) on reports built here, and bisect's Model Explorer node data
(diagnose/model_explorer.py): what a page shows and leaves out, its escaping, the windows marked, the node data's
colours. A real verify run's report.html (counts, self-containment) is checked in tests/test_junit.py, on the run
that test already makes."""

from __future__ import annotations

import json
import math
import re

from mhaexport.diagnose import model_explorer
from mhaexport.diagnose.bisect import BisectReport, TensorDiff
from mhaexport.verify.html import html as page_of
from mhaexport.verify.render import cell, markdown
from mhaexport.verify.report import (Allowance, Bounds, ReportModel, RuntimeInfo, RuntimeTolerance, SweepInfo,
                                     ToleranceInfo, VerifyReport)
from mhaexport.verify.results import CheckResult
from mhaexport.verify.svg import Chart, Series, svg

HOSTILE = '<script>alert(1)</script>"\x1b[31m'
# what a page that fetches nothing has none of: a script, a stylesheet link, any src/href leaving the file
OUTSIDE = re.compile(r"<script|<link|<iframe|(?:src|href)\s*=\s*[\"']?\s*(?:https?:|//)", re.I)


def report(windows=None, parity_ok=True) -> VerifyReport:
    """A decoder's report with the figures the checks write: eager and ort-cpu ran, ort-cuda skipped."""
    contract = {"n_layers": 2, **({"windows": windows} if windows else {})}
    parity = CheckResult("parity", parity_ok, {"max_abs": 2e-7 if parity_ok else 0.2,
                                               "by_case": [[1, 7, 0, 2e-7], [2, 1, 40, 0.0], [1, 3, 90, None]]},
                         "max abs 2e-07" if parity_ok else f"differs at {HOSTILE}")
    kv = CheckResult("kv-consistency", True, {"long_to": 127, "long_max_abs": 3e-7,
                                              "long_by_position": [[p, 1e-7 * (1 + p % 3)] for p in range(128)]}, "")
    gen = CheckResult("generation", True, {"tokens": 4, "matched": 4, "step_max_abs": [1e-7, 0.0, 2e-7, 1e-7],
                                           "step_margin": [0.5, 0.02, 1.0, 0.3], "first_divergence": None}, "")
    results = {"eager": {"parity": CheckResult("parity", None, {"reference": True}, "reference"),
                         "kv-consistency": kv, "generation": gen},
               "ort-cpu": {"parity": parity, "kv-consistency": kv, "generation": gen}}
    runtimes = {"eager": RuntimeInfo("eager", "ran"), "ort-cpu": RuntimeInfo("ort-cpu", "ran", providers=["CPU"]),
                "ort-cuda": RuntimeInfo("ort-cuda", "skipped", reason="no CUDA device")}
    return VerifyReport(model=ReportModel(spec=f"user:{HOSTILE}", contract=contract), folder=f"out/{HOSTILE}",
                        sweep=SweepInfo(kind="quick", seed=0, cases=3), tolerance=ToleranceInfo(atol=1e-4, rtol=1e-3),
                        runtimes=runtimes, results=results, checks=["parity", "kv-consistency", "generation"])


def test_a_page_has_its_counts_tables_and_plots_and_fetches_nothing():
    r = report()
    page = page_of(r, cell)
    c = r.counts
    assert f"{c['passed']} passed, {c['failed']} failed, {c['skipped']} skipped" in page
    assert c == {"passed": 5, "failed": 0, "skipped": 3}  # eager: 2 (its parity is no check); ort-cuda: 3 skipped
    assert page.count("<svg") == 3  # cached decode vs position, parity over the sweep, generation
    assert "Cached decode: error against position" in page and "top-1 margin" in page
    assert "failed to run" in page  # the sweep case without a value, in the per-case table
    assert not OUTSIDE.search(page)
    assert "(layer" not in page  # a model without windows marks none


def test_names_from_folders_and_messages_are_escaped():
    page = page_of(cell=cell, report=report(parity_ok=False))
    assert "<script>" not in page and "\x1b" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;&#34;" in page  # the model, the folder and the failed message
    assert "FAILED" in page and "differs at &lt;script&gt;" in page


def test_each_layers_window_is_marked_on_the_position_plots():
    page = page_of(cell=cell, report=report(windows=[0, 16]))
    assert page.count("window 16 (layer 1)") == 2  # error against position, and parity over the sweep


def test_a_log_axis_draws_zero_at_its_floor_and_says_so():
    out = svg(Chart("t <b>", "x", "err", [Series("a&b", [(0, 0.0), (1, 1e-6), (2, None)])]))
    assert "0 drawn at 1e-7" in out and "t &lt;b&gt;" in out and "a&amp;b" in out
    assert out.count("<circle") == 2  # the point without a value is not drawn


RULE = "lossy with int8 activations, compared with itself: 10% of eager's RMS per output"


def lossy_report(recorded_as_text=False) -> VerifyReport:
    """An int4 file's report: ort-cpu's kv-consistency judged by its allowance (0.306 on logits), far above the
    float32 atol and passed; its parity n/a (lossy); eager's genai-config n/a; ort-cuda skipped for 3 checks."""
    kv = {rt: CheckResult("kv-consistency", True, {"long_to": 127, "long_max_abs": y,
                                                   "long_by_position": [[p, y] for p in range(128)]}, "agree")
          for rt, y in (("eager", 1e-5), ("ort-cpu", 0.094))}
    results = {"eager": {"parity": CheckResult("parity", None, {"reference": True}, "reference: compared"),
                         "kv-consistency": kv["eager"],
                         "genai-config": CheckResult("genai-config", None, {"not_applicable": True}, "n/a: files")},
               "ort-cpu": {"parity": CheckResult("parity", None, {"lossy": True}, "n/a: lossy artifact"),
                           "kv-consistency": kv["ort-cpu"],
                           "genai-config": CheckResult("genai-config", True, {}, "ok")}}
    own = "atol=0.0001 rtol=0.001, logits: atol=0.306 rtol=0.001, present: atol=0.0985 rtol=0.001"
    allowance = None if recorded_as_text else Allowance(Bounds(0.306, 1e-3), Bounds(0.0985, 1e-3), RULE)
    runtimes = {"eager": RuntimeInfo("eager", "ran"),
                "ort-cpu": RuntimeInfo("ort-cpu", "ran", providers=["CPU"], self_tolerance=own, allowance=allowance),
                "ort-cuda": RuntimeInfo("ort-cuda", "skipped", reason="no CUDA device")}
    tol = ToleranceInfo(atol=1e-4, rtol=1e-3, dtype="float32",
                        per_runtime={rt: RuntimeTolerance("float32", "atol=0.0001 rtol=0.001", Bounds(1e-4, 1e-3))
                                     for rt in runtimes})
    return VerifyReport(model=ReportModel(spec="preset:small", contract={"n_layers": 2}), folder="out/small-int4",
                        sweep=SweepInfo(kind="quick", seed=0, cases=3), tolerance=tol, runtimes=runtimes,
                        results=results, checks=["parity", "kv-consistency", "genai-config"])


def _svg_of(page: str, title: str) -> str:
    start = page.index(f'aria-label="{title}')
    return page[start:page.index("</figure>", start)]


def test_a_lossy_files_curve_is_drawn_against_the_allowance_that_judged_it_and_the_words_say_which_rule():
    page = page_of(lossy_report(), cell)
    chart = _svg_of(page, "Cached decode: error against position")
    assert "allowed 0.306 (ort-cpu)" in chart  # the line the ort-cpu curve was judged by ...
    assert "atol 0.0001 (eager)" in chart  # ... and eager's, each labelled with the runtimes it judged
    assert re.search(r'<line [^>]*y1="([\d.]+)" y2="\1" stroke="#D55E00" stroke-dasharray="6 3"', chart)  # ort-cpu's colour
    caption = chart[chart.index("<figcaption>"):]
    assert "ort-cpu: |error| ≤ 0.306 + 0.001 × |value| (lossy with int8 activations, compared with itself" in caption
    assert "eager: |error| ≤ 0.0001 + 0.001 × |value| (float32&#39;s tolerance)" in caption
    # the cell's tooltip names the rule that judged it
    assert re.search(r'title="judged by \|error\| ≤ 0.306 \+ 0.001 × \|value\| \(lossy with int8', page)
    text = markdown(lossy_report())
    assert "- ort-cpu: |error| ≤ 0.306 + 0.001 × |value| (lossy with int8 activations" in text
    assert "- eager: |error| ≤ 0.0001 + 0.001 × |value| (float32's tolerance)" in text


def test_a_report_written_before_the_allowance_was_recorded_is_judged_by_its_self_tolerance():
    r = lossy_report(recorded_as_text=True)
    assert r.judged_by("ort-cpu") == (Bounds(0.306, 1e-3), "lossy, compared with itself")
    assert r.judged_by("eager") == (Bounds(1e-4, 1e-3), "float32's tolerance")
    assert "allowed 0.306 (ort-cpu)" in page_of(r, cell)


def test_cells_say_what_their_figure_is_and_n_a_cells_carry_the_mark():
    r = lossy_report()
    row = next(line for line in markdown(r).splitlines() if line.startswith("| ort-cpu |"))
    assert "| ⏭ n/a (lossy) |" in row  # like every other n/a cell
    assert "| ✅ max 9.4e-02, out to pos 127 |" in row  # a max error and the position reached, not a range
    eager = next(line for line in markdown(r).splitlines() if line.startswith("| eager |"))
    assert eager.endswith("| ⏭ n/a |")  # genai-config is no check of eager
    page = page_of(r, cell)
    assert '<span class="num">9.4e-02</span>' in page  # a number never breaks at its minus


def test_a_skipped_runtime_is_one_row_and_one_reason_not_one_per_check():
    page = page_of(lossy_report(), cell)
    assert page.count("no CUDA device") == 2  # its row in the table (one cell across the checks), one note
    assert re.search(r'<td colspan="\d+">skipped: no CUDA device</td>', page)
    assert '<td title="parity, kv-consistency, genai-config">3 checks</td><td>ort-cuda skipped: no CUDA device' in page


def test_eager_is_drawn_last_and_dashed_so_a_runtime_that_matches_it_exactly_hides_neither():
    chart = _svg_of(page_of(report(), cell), "Cached decode: error against position")
    lines = re.findall(r'<polyline [^>]*stroke="(#[0-9A-Fa-f]{6})" stroke-width="1.5" stroke-dasharray="([^"]+)"',
                       chart)
    assert lines == [("#D55E00", "none"), ("#0072B2", "5 3")]  # ort-cpu, then eager dashed over it


def test_a_long_legend_label_wraps_whole_and_keeps_it_all_in_its_tooltip():
    label = "ort-cpu [attention=decomposed], long run"
    out = svg(Chart("t", "x", "y", [Series(label, [(0, 1.0), (1, 2.0)])]))
    shown = re.findall(r"<text [^>]*>([^<]*)<title>", out)
    assert " ".join(shown).replace("= ", "=") == label.replace("[", "[")  # every character shown, over lines
    assert f"<title>{label}</title>" in out


def bisect_report() -> BisectReport:
    rows = [TensorDiff("blocks.0.ln_1", "layer_norm", "LayerNormalization n0", 0, (1, 4, 64), 1e-7, 1e-7),
            TensorDiff("blocks.0.ffn.0", "linear_4", "Add n1", 1, (1, 4, 256), 0.1, 0.076),
            TensorDiff("blocks.0.ffn", "linear_5", "Add n2", 2, (1, 4, 64), math.inf, math.inf)]
    return BisectReport(model="f/model.onnx", shapes={"batch": 1, "seq": 4, "past": 0}, tol=1e-3, provider="CPU",
                        rows=rows, first_divergent=rows[1], culprit=rows[1])


def test_bisect_node_data_is_model_explorers_graph_node_data_with_the_culprit_red(tmp_path, monkeypatch):
    path = model_explorer.write_node_data(bisect_report(), tmp_path / model_explorer.NODE_DATA)
    data = json.loads(path.read_text())  # plain JSON: no Infinity
    res = data["results"]
    assert res["layer_norm"] == {"value": 1e-7}
    assert res["linear_4"] == {"value": 0.076, "bgColor": model_explorer.CULPRIT, "textColor": "#ffffff"}
    assert res["linear_5"]["value"] == model_explorer.NON_FINITE
    assert [t["value"] for t in data["thresholds"]] == [1e-3, 0.1, model_explorer.NON_FINITE]
    monkeypatch.setattr(model_explorer.importlib.util, "find_spec", lambda name: None)
    line = model_explorer.how_to_open("f/model.onnx", path)
    assert line == (f"on the graph: model-explorer f/model.onnx --node_data_paths={path} (the viewer is not "
                    "installed: pip install model-explorer-onnx)")
