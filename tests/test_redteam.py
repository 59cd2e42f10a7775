"""A red team of our own, by class (tests/redteam/): every field of every source a renderer reads — a verify report
given to ``report merge``, a bench.json, bisect's names from a graph — crossed with every hostile value kind (markup
for HTML and Markdown, terminal controls, bidi, huge / negative / non-finite numbers, keys), rendered into every sink
(report.md alone and merged, report.html, JUnit, the terminal, bench.md, bench.html, report.md's bench section,
Model Explorer data) and each output held to its sink's checker: HTML parsed (no element, attribute or URL beyond the
template's own), Markdown parsed by markdown-it-py (no link, image or raw HTML from data, no bare URL a GFM renderer
would link), the terminal free of ESC and forged lines, XML well-formed, JSON strict. A case either is refused by
the reader in one line or renders safely; a crash fails it.

The default run takes a deterministic sample (every Nth case, a few seconds); ``-m slow`` runs every case, draws
bench.png for each bench case, and drives the CLI end to end (a crafted folder through verify, the CI step summary).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("markdown_it")

from redteam import cross  # noqa: E402
from redteam.sinks import markdown_findings, terminal_findings  # noqa: E402
from redteam.values import RAW_JSON, TEXT  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
# the default run's sample: every Nth case of each source (a few seconds; a report case renders six sinks)
FAST_EVERY = {"report": 503, "bench": 211}


def _run(source: str, every: int, png_every: int = 0) -> tuple[int, int, list[str]]:
    """(cases, refused, failures) of ``source``'s crossing, every ``every``-th case (``png_every``: bench.png drawn
    for every such case too)."""
    doc = cross.report_doc() if source == "report" else cross.bench_doc()
    n = refused = 0
    failures = []
    for field, kind, case in cross.sample(cross.cases(doc), every):
        n += 1
        out = (cross.render_report(case) if source == "report" else
               cross.render_bench(case, png=bool(png_every) and n % png_every == 0))
        if out == "refused":
            refused += 1
            continue
        failures += [f"{source}.{field} <- {kind}: {sink}: {f}" for sink, fs in out.items() for f in fs]
    return n, refused, failures


def test_the_template_itself_passes_every_checker():
    """The checkers accept what mhaexport writes from its own data (a checker that flags the template proves
    nothing)."""
    for out in (cross.render_report(cross.report_doc()), cross.render_bench(cross.bench_doc())):
        assert out != "refused" and all(fs == [] for fs in out.values()), out


def test_the_checkers_see_each_class_they_check():
    """Each checker finds its class in output that was not escaped (the red team's own self-check)."""
    from redteam.sinks import html_findings

    assert html_findings(f"<p>{TEXT['html-script']}</p>") and html_findings(f'<p class="{TEXT["html-attribute"]}">')
    assert markdown_findings(TEXT["md-image"]) and markdown_findings(TEXT["md-link"])
    assert markdown_findings(TEXT["md-html"]) and markdown_findings("see https://evil.example/x")
    assert markdown_findings(TEXT["md-heading"], headings=0)
    assert terminal_findings(TEXT["ansi"]) and terminal_findings(TEXT["newline"])


@pytest.mark.parametrize("source", ["report", "bench"])
def test_a_sample_of_every_source_field_and_value_kind_is_refused_or_rendered_safe(source):
    n, refused, failures = _run(source, FAST_EVERY[source])
    assert n > 10 and failures == [], failures[:20]


def test_graph_names_reach_bisects_table_and_model_explorer_data_safe():
    failures = [f"{kind}: {sink}: {f}" for kind, text in TEXT.items()
                for rel in (0.5, float("nan"), float("inf"))
                for sink, fs in cross.render_bisect(text, rel).items() for f in fs]
    assert failures == []


@pytest.mark.slow  # every field x every kind: ~11,000 cases (~5 min on 2 cores), every 10th bench case drawn as bench.png
@pytest.mark.parametrize("source", ["report", "bench"])
def test_every_source_field_and_value_kind_is_refused_or_rendered_safe(source):
    n, refused, failures = _run(source, 1, png_every=10)
    assert n > 500 and failures == [], failures[:20]


@pytest.mark.slow  # a real export, verify and the CI action's script: about a minute
def test_a_crafted_folder_through_verify_and_the_step_summary(tmp_path, tiny_export):
    """A folder whose manifest names its model with every markup kind at once: verify's report.md, report.html,
    JUnit, the terminal and the CI step summary all show it as text."""
    import shutil

    from mhaexport.artifact import atomic_write_json, read_json
    from redteam.sinks import html_findings, xml_findings

    folder = tmp_path / "crafted"
    shutil.copytree(tiny_export, folder)
    manifest = read_json(folder / "manifest.json", "manifest")
    spec = " ".join(v for k, v in TEXT.items() if k not in ("long", "nul", "surrogate"))
    manifest["model"]["spec"] = spec
    atomic_write_json(folder / "manifest.json", manifest)
    summary, out = tmp_path / "summary.md", tmp_path / "ci"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("INPUT_", "GITHUB_"))}
    env.update({"GITHUB_STEP_SUMMARY": str(summary), "GITHUB_OUTPUT": str(tmp_path / "output.txt"),
                "GITHUB_ACTION_PATH": str(ROOT), "INPUT_INSTALL": "none", "INPUT_OUTPUT": str(out),
                "INPUT_FOLDER": str(folder), "INPUT_RUNTIMES": "ort-cpu", "INPUT_NAME": TEXT["md-image"]})
    p = subprocess.run([sys.executable, str(ROOT / "scripts" / "ci_action.py")], capture_output=True, text=True,
                       env=env, timeout=600)
    reports = out / "reports"
    assert (reports / "report.md").is_file(), p.stdout[-2000:] + p.stderr[-2000:]
    assert markdown_findings((reports / "report.md").read_text()) == []
    assert markdown_findings(summary.read_text()) == []
    assert html_findings((reports / "report.html").read_text()) == []
    assert xml_findings((reports / "junit.xml").read_bytes()) == []
    assert terminal_findings(p.stdout + p.stderr) == []


# --- every JSON source: text that is no document two parsers read alike, and a link ------------------------------

def _sources(folder: Path) -> dict:
    """Each JSON file a verb reads from a folder, and its reader as the verb calls it."""
    from mhaexport.artifact.folder import read_manifest
    from mhaexport.bench.result import read_result_in
    from mhaexport.models.config import load_config
    from mhaexport.runtime.genai import check_options
    from mhaexport.verify.report import read_report_in

    return {"manifest.json": lambda: read_manifest(folder), "report.json": lambda: read_report_in(folder),
            "bench.json": lambda: read_result_in(folder), "genai_config.json": lambda: check_options(folder),
            "config.json": lambda: load_config(str(folder / "config.json"))}


@pytest.mark.parametrize("kind", sorted(RAW_JSON))
def test_every_json_source_refuses_a_document_two_parsers_read_apart(tmp_path, kind):
    """A key twice (onnxruntime-genai applies both, Python keeps the last), a NaN token, a number beyond a float,
    nesting 100 000 deep, bytes that are not UTF-8: every reader refuses in one line naming the file."""
    from mhaexport.core.errors import MhaExportError

    for name, read in _sources(tmp_path).items():
        (tmp_path / name).write_bytes(RAW_JSON[kind])
        with pytest.raises(MhaExportError) as e:
            read()
        assert name in str(e.value) and "\n" not in str(e.value), (name, str(e.value))


def test_every_json_source_refuses_a_link_out_of_its_folder(tmp_path):
    from mhaexport.core.errors import MhaExportError

    folder, outside = tmp_path / "folder", tmp_path / "outside.json"
    folder.mkdir()
    outside.write_text("{}")
    for name, read in _sources(folder).items():
        if name == "config.json":  # a --config FILE.json the user names: their own path
            continue
        (folder / name).symlink_to(outside)
        with pytest.raises(MhaExportError, match="symlink|link"):
            read()
