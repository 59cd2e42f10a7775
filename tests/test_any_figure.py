"""A verdict survives any figure: a model whose outputs are NaN or infinite fails verify with exit 1 and a full
report (report.json strict JSON, report.md, report.html with its charts, JUnit), and every renderer — report.md,
report.html and its charts, JUnit, the terminal, ``report merge``, bench.md / bench.html / bench.png — draws NaN,
±inf and huge values as such instead of raising (core/numbers.py is the one formatter)."""

from __future__ import annotations

import json
import math
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path

import pytest
from click.testing import CliRunner

from mhaexport.cli import main
from mhaexport.core.numbers import MAX_INT, dumps, number
from mhaexport.core.untrusted import load_json

PLANTED = Path(__file__).parent / "planted"
BUGS = str(PLANTED / "bugs.py")

# every kind of figure a renderer may meet (floats), and the integers a record admits at its bounds
HOSTILE = [math.nan, math.inf, -math.inf, 1e308, -1e308, 5e-324, 0.0, -1.0]
HOSTILE_INT = [MAX_INT, -MAX_INT, 0, -1]


def _strict(text: str):
    """json.loads that refuses what is not JSON (NaN, Infinity): what jq or a CI dashboard reads."""
    def refuse(name):
        raise ValueError(f"{name} is not JSON")
    return json.loads(text, parse_constant=refuse)


@pytest.fixture(scope="module")
def nan_model(tmp_path_factory):
    """The seed article's -inf mask (tests/planted/bugs.py mask_neg_inf): exported to ONNX, verified by the CLI."""
    folder = tmp_path_factory.mktemp("nan") / "nan"
    res = CliRunner().invoke(main, ["onnx", "--model", f"{BUGS}:mask_neg_inf", "-o", str(folder)])
    assert res.exit_code == 0, res.output
    res = CliRunner().invoke(main, ["verify", str(folder), "--trust-code",
                                    "--junit", str(folder / "junit.xml")])
    return folder, res


def test_a_nan_model_fails_verify_with_exit_1_and_every_report(nan_model):
    folder, res = nan_model
    assert res.exit_code == 1, res.output
    assert "Traceback" not in res.output
    failed = res.output.split("FAILED:", 1)[1]
    assert "eager/finite" in failed and "ort-cpu/finite" in failed
    report = _strict((folder / "report.json").read_text())  # strict JSON: NaN/inf written as strings
    figures = report["results"]["ort-cpu"]["kv-consistency"]["figures"]
    assert report["results"]["ort-cpu"]["kv-consistency"]["status"] is False  # an infinite error never passes
    assert "Infinity" in figures.values() or "NaN" in figures.values(), figures
    page = (folder / "report.html").read_text()
    _parse_html(page)
    assert "× at the edge" in page  # the chart says where it drew what it could not scale
    assert "inf" in (folder / "report.md").read_text()
    ET.fromstring((folder / "junit.xml").read_bytes())


def test_an_infinite_error_is_a_mismatch_whatever_the_reference_holds():
    import numpy as np

    from mhaexport.verify.compare import Tolerance, compare

    tol = Tolerance(1e-4, 1e-3)
    for a, e in ((np.inf, np.inf), (np.nan, np.nan), (np.inf, 1.0), (1.0, np.nan), (-np.inf, -np.inf)):
        d = compare(np.array([a, 0.0]), np.array([e, 0.0]), tol)
        assert d.mismatched == 1 and not d.ok and d.max_abs == math.inf, (a, e, d)
    assert compare(np.array([1.0, 2.0]), np.array([1.0, 2.0]), tol).ok


def _parse_html(page: str) -> None:
    class Strict(HTMLParser):
        pass
    Strict().feed(page)
    assert page.count("<svg") == page.count("</svg>")


def _poison(value, f: float, i: int | None):
    """Every number of a JSON value replaced: floats by ``f``, ints by ``i`` (None: ints kept)."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, float):
        return f
    if isinstance(value, int):
        return value if i is None else i
    if isinstance(value, list):
        return [_poison(v, f, i) for v in value]
    return {k: _poison(v, f, i) for k, v in value.items()}


@pytest.mark.parametrize("f", HOSTILE, ids=[number(x) for x in HOSTILE])
def test_every_renderer_draws_any_figure(nan_model, tmp_path, f):
    """Every float of a real report (the NaN model's: every check's figures, the charts' points) set to one hostile
    value and every int to a bound, read back by the typed records, then rendered by report.md, report.html, JUnit
    and the terminal, and merged by ``report merge``: none raises, the verdict stays readable."""
    folder, _ = nan_model
    base = load_json(folder / "report.json", "report.json")
    i = HOSTILE_INT[HOSTILE.index(f) % len(HOSTILE_INT)] if f == f else HOSTILE_INT[0]
    poisoned = {**base, "results": _poison(base["results"], f, i), "seconds": f,
                "tolerance": _poison(base["tolerance"], f, i)}
    _render_all(poisoned, tmp_path)
    # the whole report poisoned: read back, or refused in one line (a bound of its type), never a crash
    whole = _poison(base, f, i)
    (tmp_path / "whole.json").write_text(dumps(whole))
    for args in (["report", "merge", str(tmp_path / "report.json"), str(tmp_path / "report.json"), "-o",
                  str(tmp_path / "merged")],
                 ["report", "merge", str(tmp_path / "whole.json"), str(tmp_path / "report.json"), "-o",
                  str(tmp_path / "merged2")]):
        res = CliRunner().invoke(main, args)
        assert res.exit_code in (0, 1, 2, 4), (res.exit_code, res.output)
        assert "Traceback" not in res.output and "internal error" not in res.output, res.output
    merged = tmp_path / "merged" / "report.html"
    assert merged.is_file(), res.output
    _parse_html(merged.read_text())


def test_a_float_field_reads_the_strings_it_writes_and_refuses_what_is_not_a_number():
    from mhaexport.core.errors import ArtifactError
    from mhaexport.verify.figures import DiffFigures

    for v in (math.nan, math.inf, -math.inf, 1e308):
        back = DiffFigures.from_dict(_strict(dumps(DiffFigures.of(max_abs=v).to_dict())), "f")
        assert (math.isnan(back.max_abs) and math.isnan(v)) or back.max_abs == v
    for bad in ("nan", "1.0", 10 ** 400, True):
        with pytest.raises(ArtifactError, match=r"f\.max_abs is .*expected float"):
            DiffFigures.from_dict({"max_abs": bad}, "f")
    with pytest.raises(ArtifactError, match=r"f\.compared is .*expected int or null within"):
        DiffFigures.from_dict({"compared": 1 << 64}, "f")


def test_the_one_formatter_never_raises():
    import numpy as np

    cases = {math.nan: "NaN", math.inf: "+inf", -math.inf: "-inf", 10 ** 400: "≥1e308", -(10 ** 400): "≤-1e308",
             np.float32("nan"): "NaN", np.float64(2.5): "2.5", 3: "3", "text": "text", None: "None"}
    for value, text in cases.items():
        assert number(value) == text, value
    assert number(0.000123, ".1e") == "1.2e-04" and number(7, "d") == "7" and number(1.5, "bogus") == "1.5"


def test_bench_renderers_draw_any_figure(tmp_path):
    from mhaexport.bench.render import write_bench
    from mhaexport.bench.result import BenchResult
    from tests.test_bench import fabricated

    base = fabricated(1.2, 1.1).to_dict()
    for f in HOSTILE:
        # the measured figures (the config is bounded where it is read: a NaN steady_within is refused there)
        res = BenchResult.from_dict(_strict(dumps({**_poison(base, f, None), "config": base["config"]})), "bench")
        out = tmp_path / number(f).replace("+", "p")
        written = write_bench(res, out)
        assert (out / "bench.md").is_file() and (out / "bench.html") in written
        _parse_html((out / "bench.html").read_text())
        _strict((out / "bench.json").read_text())


def _render_all(report_dict: dict, where: Path) -> None:
    from mhaexport.terminal import to_terminal
    from mhaexport.verify.html import html
    from mhaexport.verify.junit import to_junit_xml
    from mhaexport.verify.render import cell, markdown
    from mhaexport.verify.report import VerifyReport

    report = VerifyReport.from_dict(load_json(dumps(report_dict).encode(), "report.json"), "report")
    md = markdown(report)
    _parse_html(html(report, cell))
    ET.fromstring(to_junit_xml(report, md))
    assert "\x1b" not in to_terminal(md, style=False)
    (where / "report.json").write_text(dumps(report.to_dict()))
