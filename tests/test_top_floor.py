"""The top floor (mhaexport/: the Python API's face over its verbs, the command line's group over its commands) stays
small and whole: no module over 500 lines (one module per verb group, docs/DESIGN.md's layout), and every verb a
module of mhaexport/verbs/ defines is the API's, reachable as ``mhaexport.api.NAME`` and in the API reference
(docs/api.md lists them: mkdocstrings shows a re-exported name only when it is listed)."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAX_LINES = 500


def test_no_module_of_the_top_floor_is_over_500_lines():
    sizes = {str(p.relative_to(ROOT)): len(p.read_text().splitlines()) for p in (ROOT / "mhaexport").rglob("*.py")}
    assert {"mhaexport/api.py", "mhaexport/cli.py", "mhaexport/verbs/verify.py",
            "mhaexport/commands/verify.py"} <= set(sizes), sorted(sizes)
    over = {p: n for p, n in sizes.items() if n > MAX_LINES}
    assert not over, f"over {MAX_LINES} lines (split it by verb): {over}"


def test_every_public_verb_is_the_apis():
    import mhaexport.api as api

    missing, verbs = [], set()
    for path in sorted((ROOT / "mhaexport" / "verbs").glob("*.py")):
        module = importlib.import_module(f"mhaexport.verbs.{path.stem}")
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and not node.name.startswith("_"):
                verbs.add(node.name)
                if getattr(api, node.name, None) is not getattr(module, node.name):
                    missing.append(f"{path.relative_to(ROOT)}: {node.name}")
    assert not missing, f"defined in mhaexport/verbs/ but not mhaexport.api's: {missing}"
    documented = set(re.findall(r"^ {8}- (\w+)$", (ROOT / "docs" / "api.md").read_text(), re.M))
    assert documented == verbs, f"docs/api.md's members differ: missing {verbs - documented}, extra {documented - verbs}"
