"""One escaper per sink, and no renderer that formats data outside it — read from the source, so a renderer that
forgets cannot be written without this test failing:

- Markdown (report.md, bench.md, lint's and eval's tables): every value an f-string in a Markdown renderer puts
  into text goes through ``md`` (core/untrusted.py) or a helper made of it; a bare attribute, call or subscript is
  data formatted raw.
- HTML (report.html, bench.html, the SVG charts): markup is made only by ``verify/markup.h`` from constant templates;
  no f-string holds a tag, and ``Markup(...)`` wraps nothing but a constant.
- XML (JUnit): ElementTree only, every attribute and text through ``junit._text``.
- Terminal: the CLI's streams pass every write through ``terminal_text`` (tested in tests/test_untrusted.py).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# the Markdown renderers: file -> the functions that build Markdown
MARKDOWN = {
    "verify/render.py": ["markdown", "_header", "_reference_lines", "_parity_lines", "_module_lines", "_details",
                         "_table", "_other_protocol_lines", "_quality_lines", "cell"],
    "bench/render.py": ["runtimes_table", "loop_text", "lowerings_table", "quantized_table", "scaling_tables",
                        "floor_text", "targets_table", "markdown_body", "report_section", "write_bench"],
    "verify/lint.py": ["to_markdown"],
    "evaluate/perplexity.py": ["to_markdown"],
}
# what may format a value into Markdown: the escaper and the helpers made of it (a figure through the one formatter)
ESCAPERS = {"md", "_x", "_n", "_fig", "_f", "_num", "_pct", "_ratio", "len", "_run_figure",
            "markdown_body"}  # (a Markdown renderer checked here, nested)
HTML = ["verify/html.py", "verify/svg.py", "bench/html.py"]


# functions of those files that write no Markdown (plots, file writing, helpers without text)
NOT_MARKDOWN = {"write_report", "_save_png", "mpl_text", "_smooth", "plot", "plot_scaling", "plot_notes",
                "update_report", "_div", "_worst", "_run_figure", "_fig", "_x", "_n", "_num", "_f", "_pct", "_ratio",
                "to_dict", "from_dict", "counts", "ok", "errors"}


# the files that are Markdown renderers whole: every function of theirs is checked (one added later included)
WHOLE = {"verify/render.py", "bench/render.py"}


def _functions(tree: ast.AST, names: list[str], whole: bool) -> list[ast.FunctionDef]:
    """The listed functions; in a renderer ``whole``, every other function not known to write no Markdown too (a
    renderer added later is checked without being listed)."""
    found = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name in names]
    assert {f.name for f in found} == set(names), set(names) - {f.name for f in found}
    if not whole:
        return found
    return found + [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name not in names
                    and n.name not in NOT_MARKDOWN and any(isinstance(m, ast.JoinedStr) for m in ast.walk(n))]


def _allowed(node: ast.AST) -> bool:
    """Whether ``node`` (a value formatted into Markdown) is escaped: an escaper's call, a local name (itself built
    by checked f-strings), a constant, an icon looked up by status, or a choice / join of such."""
    if isinstance(node, (ast.Constant, ast.Name)):
        return True
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ESCAPERS:
        return True
    if isinstance(node, ast.IfExp):
        return _allowed(node.body) and _allowed(node.orelse)
    if isinstance(node, ast.BoolOp):
        return all(_allowed(v) for v in node.values)
    if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id in ("ICONS", "ICON"):
        return True
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
            and isinstance(node.func.value, ast.Name) and node.func.value.id in ("ICONS", "ICON")):
        return True
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "join":
        arg = node.args[0] if node.args else None
        if isinstance(arg, (ast.GeneratorExp, ast.ListComp)):
            return _allowed(arg.elt)
        return isinstance(arg, ast.Name)
    if isinstance(node, ast.JoinedStr):
        return all(_allowed(v.value) for v in node.values if isinstance(v, ast.FormattedValue))
    return False


@pytest.mark.parametrize("path", sorted(MARKDOWN))
def test_every_value_a_markdown_renderer_formats_goes_through_md(path):
    tree = ast.parse((ROOT / path).read_text())
    raw = []
    for fn in _functions(tree, MARKDOWN[path], path in WHOLE):
        for node in ast.walk(fn):
            if isinstance(node, ast.JoinedStr):
                raw += [f"{path}:{v.lineno} {fn.name}: {{{ast.unparse(v.value)}}}" for v in node.values
                        if isinstance(v, ast.FormattedValue) and not _allowed(v.value)]
    assert raw == []


def _constant(node: ast.AST) -> bool:
    """A constant, or a module constant's name (CSS)."""
    return isinstance(node, ast.Constant) or (isinstance(node, ast.Name) and node.id.isupper())


@pytest.mark.parametrize("path", HTML)
def test_html_is_made_only_from_constant_templates(path):
    tree = ast.parse((ROOT / path).read_text())
    tags = [f"{path}:{n.lineno}" for n in ast.walk(tree) if isinstance(n, ast.JoinedStr)
            and any(isinstance(v, ast.Constant) and "<" in str(v.value) for v in n.values)]
    wraps = [f"{path}:{n.lineno}" for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
             and n.func.id == "Markup" and not all(_constant(a) for a in n.args)]
    templates = [f"{path}:{n.lineno}" for n in ast.walk(tree) if isinstance(n, ast.Call)
                 and isinstance(n.func, ast.Name) and n.func.id == "h" and not isinstance(n.args[0], ast.Constant)]
    assert tags == [] and wraps == [] and templates == []


def test_junit_writes_every_attribute_and_text_through_its_escaper():
    tree = ast.parse((ROOT / "verify/junit.py").read_text())
    raw = []
    for n in ast.walk(tree):
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "SubElement" \
                and len(n.args) > 2 and isinstance(n.args[2], ast.Dict):
            raw += [f"line {n.lineno}: {ast.unparse(v)}" for v in n.args[2].values
                    if not (isinstance(v, ast.Constant) or (isinstance(v, ast.Call) and isinstance(v.func, ast.Name)
                                                            and v.func.id in ("_text", "_seconds")))]
    assert raw == []


def test_one_escaper_per_sink_kind():
    """grep finds one escaper per sink kind, each defined once in the package."""
    defs = {}
    for path in ROOT.glob("*/*.py"):
        if path.parts[-2] in ("tests", "scripts", "build", ".venv", "docs"):
            continue
        for n in ast.walk(ast.parse(path.read_text())):
            if isinstance(n, ast.FunctionDef) and n.name in ("shown", "md", "terminal_text", "h", "_text", "mpl_text"):
                defs.setdefault(n.name, []).append(str(path.relative_to(ROOT)))
    assert defs == {"shown": ["core/untrusted.py"], "md": ["core/untrusted.py"],
                    "terminal_text": ["core/untrusted.py"], "h": ["verify/markup.py"], "_text": ["verify/junit.py"],
                    "mpl_text": ["bench/render.py"]}


def test_one_json_reader():
    """Every JSON mhaexport reads goes through core/untrusted.load_json (strict: a key twice, a NaN token refused):
    no other module of the package parses JSON itself."""
    raw = []
    for path in ROOT.glob("*/*.py"):
        if path.parts[-2] in ("tests", "scripts", "build", ".venv", "docs", "examples") or \
                path.relative_to(ROOT).as_posix() == "core/untrusted.py":
            continue
        for n in ast.walk(ast.parse(path.read_text())):
            if (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in ("loads", "load")
                    and isinstance(n.func.value, ast.Name) and n.func.value.id == "json"):
                raw.append(f"{path.relative_to(ROOT)}:{n.lineno}")
    assert raw == []
