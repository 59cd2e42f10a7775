"""What people and scripts read: a report on a terminal as terminal text (never raw Markdown; bold only without
NO_COLOR), the Markdown itself through a pipe (report.md unchanged), and --json as one object on stdout."""

from __future__ import annotations

import json
import re

import pytest
from click.testing import CliRunner

from mhaexport.cli import main
from mhaexport.commands import output  # where the CLI asks whether stdout is a terminal
from mhaexport.terminal import CELL, to_terminal, wants_style, width

MD = """## mhaexport verify: ✅ PASSED

**Model** `preset:tiny` · 3 passed

| runtime | providers | parity | p50 |
|---|---|---|---:|
| eager | torch (cpu) | ref | 1.5 |
| ort-cuda | skipped: CUDAExecutionProvider requested; no CUDA device on this machine (no NVIDIA driver) | — | 12.25 |

<sub>vm · 2 CPUs</sub> <!-- bench -->
"""


def test_markdown_becomes_aligned_terminal_text():
    text = to_terminal(MD)
    assert "**" not in text and "|" not in text and "<sub>" not in text and "`" not in text and "<!--" not in text
    lines = text.splitlines()
    assert lines[0] == "mhaexport verify: ✅ PASSED" and "Model preset:tiny · 3 passed" in lines
    header = next(ln for ln in lines if ln.startswith("runtime"))
    eager = next(ln for ln in lines if ln.startswith("eager"))
    cuda = next(ln for ln in lines if ln.startswith("ort-cuda"))
    assert header.index("providers") == eager.index("torch") == cuda.index("skipped")  # aligned columns
    assert eager.endswith("  1.5") and cuda.endswith("12.25")  # `---:` columns right-aligned
    cut = cuda.split("  ")[cuda.split("  ").index("ort-cuda") + 1:]
    assert any(c.endswith("…") and len(c) == CELL for c in cut)  # a long cell cut short in the table ...
    assert "  ort-cuda: skipped: CUDAExecutionProvider requested; no CUDA device on this machine (no NVIDIA " \
           "driver)" in lines  # ... and told whole under it
    assert "\x1b[" not in text and "vm · 2 CPUs" in text


def test_style_only_on_a_terminal_without_no_color():
    assert wants_style(True, {}) and not wants_style(False, {}) and not wants_style(True, {"NO_COLOR": ""})
    styled = to_terminal(MD, style=True)
    assert "\x1b[1m" in styled and "**" not in styled


@pytest.fixture
def report_json(tiny_export, tmp_path_factory):
    """`verify --json` on the tiny export: stdout is one JSON object, the report's content (report.json too)."""
    out = tmp_path_factory.mktemp("json")
    r = CliRunner().invoke(main, ["-q", "verify", str(tiny_export), "--runtime", "ort-cpu", "--json", "-o",
                                  str(out)])
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert data == json.loads((out / "report.json").read_text())
    assert data["verdict"]["status"] == "passed" and "verify passed" in r.stderr and "|" not in r.stdout
    return out / "report.json"


def test_a_terminal_gets_text_a_pipe_the_markdown_and_scripts_json(report_json, tmp_path, monkeypatch):
    piped = CliRunner().invoke(main, ["report", "merge", str(report_json), "-o", str(tmp_path / "a")])
    assert piped.exit_code == 0 and "| runtime |" in piped.stdout  # not a terminal: report.md's Markdown
    assert piped.stdout.strip() == (tmp_path / "a" / "report.md").read_text().strip()
    monkeypatch.setattr(output, "_stdout_is_tty", lambda: True)
    monkeypatch.setenv("NO_COLOR", "1")
    tty = CliRunner().invoke(main, ["report", "merge", str(report_json), "-o", str(tmp_path / "b")], color=True)
    assert tty.exit_code == 0 and "ort-cpu" in tty.stdout
    assert not any(s in tty.stdout for s in ("**", "<sub>", "\x1b[", "|---"))  # plain text, no styles (NO_COLOR)
    assert not any(ln.lstrip().startswith("|") for ln in tty.stdout.splitlines())  # tables as columns
    monkeypatch.delenv("NO_COLOR")
    bold = CliRunner().invoke(main, ["report", "merge", str(report_json), "-o", str(tmp_path / "c")], color=True)
    assert "\x1b[1m" in bold.stdout and "**" not in bold.stdout
    # the file is the Markdown of its own report, styles or not (compared within one run: each report's time differs)
    from mhaexport.verify.render import markdown
    from mhaexport.verify.report import load_report

    assert (tmp_path / "c" / "report.md").read_text().strip() == markdown(load_report(tmp_path / "c")).strip()
    js = CliRunner().invoke(main, ["report", "merge", str(report_json), "--json", "-o", str(tmp_path / "d")])
    assert json.loads(js.stdout) == json.loads((tmp_path / "d" / "report.json").read_text())


def test_a_table_is_fitted_to_the_terminal_width():
    """A 10-column table was 171-186 columns wide at 80: now, too wide for COLUMNS, its columns go in groups that
    fit, one table under the other, each led by the first column (the row's name); nothing more is cut."""
    wide = ("| runtime | a | b | c | d |\n|---|---|---|---|---|\n"
            "| ort-genai | onnxruntime-genai 0.18.0 (its generator) | ✅ 8/8 tokens, 8/8 after 119 | ✅ 4.2e-07 to 127 "
            "| ✅ 9/9 shapes |\n")
    assert max(width(ln) for ln in to_terminal(wide).splitlines()) > 80  # unfitted: one line
    lines = to_terminal(wide, columns=80).splitlines()
    assert max(width(ln) for ln in lines) <= 80
    assert [ln.split()[0] for ln in lines if ln] == ["runtime", "ort-genai", "runtime", "ort-genai"]
    assert "onnxruntime-genai 0.18.0 (its generator)" in lines[1] and lines[4].endswith("✅ 9/9 shapes")
    assert "…" not in "".join(lines)
