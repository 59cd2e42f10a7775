"""docs/DESIGN.md's map (one home per concept) read against the source: each row's symbol is defined at the top
level of its file and of no other file of the package."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ("core", "artifact", "bench", "diagnose", "evaluate", "exporter", "models", "runners", "runtime", "verify",
           "mhaexport")
ROW = re.compile(r"^\| (?P<concept>[^|]+) \| `(?P<file>[\w/]+\.py)` \| `(?P<symbol>\w+)` \|$")


def _rows() -> list[tuple[str, str, str]]:
    text = (ROOT / "docs" / "DESIGN.md").read_text()
    section = text.split("## The map: one home per concept", 1)[1].split("\n## ", 1)[0]
    return [(m["concept"].strip(), m["file"], m["symbol"]) for line in section.splitlines()
            if (m := ROW.match(line))]


def _top_level_names(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


def test_the_map_names_one_file_per_concept():
    rows = _rows()
    assert len(rows) >= 20, "the map's table was not found or lost its rows"
    defined: dict[str, list[str]] = {}
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            for name in _top_level_names(path):
                defined.setdefault(name, []).append(str(path.relative_to(ROOT)))
    wrong = []
    for concept, file, symbol in rows:
        homes = defined.get(symbol, [])
        if file not in homes:
            wrong.append(f"{concept}: {symbol} is not defined in {file} (defined in: {homes or 'nowhere'})")
        elif len(homes) > 1:
            wrong.append(f"{concept}: {symbol} has more than one home: {homes}")
    assert not wrong, "\n".join(wrong)
