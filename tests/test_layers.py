"""The layers of docs/DESIGN.md, read from the source: which subpackage may import which, and no cycles.

Every ``import mhaexport.X`` / ``from mhaexport.X import ...`` in the package's source (lazy imports inside
functions included) is an edge; an edge the table does not allow fails with the file and line. The same imports,
resolved to files (relative ones too), make the file graph, which must have no cycle either: a function-level
import does not make a cycle go away, it only hides it until that function runs.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# source folder -> layer name (the top-level folders pyproject.toml maps into mhaexport.*)
FOLDERS = {"core": "core", "artifact": "artifact", "models": "models", "exporter": "exporter", "runtime": "runtime",
           "runners": "runners", "verify": "verify", "bench": "bench", "diagnose": "diagnose", "evaluate": "evaluate"}
# modules that stand in another layer than their folder's: evaluate's scoring (perplexity, KL, logit error, top-1 and
# greedy agreement) stands below verification, whose quality check uses it; the rest of evaluate stands on verify
MODULES = {"evaluate/scoring.py": "scoring"}
# the top layer inside mhaexport/: the command line (cli.py, its verbs in commands/), the Python API beside it (api.py,
# its verbs in verbs/) and the pytest plugin on the API
TOP = {"cli", "commands", "__main__", "api", "verbs", "pytest_plugin", "outputs"}
# the one downward edge allowed by name: the package's __init__ re-exports the Python API lazily (mhaexport.verify(...)
# and friends), inside functions, so `import mhaexport` imports nothing of it
FACADE = {("mhaexport/__init__.py", "mhaexport.api")}
BASE = {"core"}
ALLOWED = {
    "core": BASE,
    "artifact": BASE,
    "runtime": BASE | {"artifact"},
    "models": BASE | {"artifact"},
    # the runners room: every runtime by name and its runner (the registry), shared by verify, bench, eval, diagnose
    # and the exporter's lowering self-check; it never imports verify
    "runners": BASE | {"artifact", "runtime"},
    "exporter": BASE | {"artifact", "models", "runtime", "runners"},
    "scoring": BASE | {"artifact", "models", "runtime"},
    "verify": BASE | {"artifact", "models", "runtime", "runners", "scoring"},
    "bench": BASE | {"artifact", "models", "runtime", "runners", "scoring", "verify"},
    # the rooms above verification: diagnosis (bisect, follow, attention steps) and evaluation (eval)
    "diagnose": BASE | {"artifact", "models", "runtime", "runners", "scoring", "verify"},
    "evaluate": BASE | {"artifact", "models", "runtime", "runners", "scoring", "verify"},
    "cli": BASE | {"artifact", "models", "runtime", "runners", "scoring", "exporter", "verify", "bench", "diagnose",
                   "evaluate"},
}


def _layer_of_module(name: str) -> str | None:
    """'mhaexport.verify.checks' -> 'verify'; 'mhaexport.core.iospec' -> 'core'; 'mhaexport' itself -> 'cli' (its
    __init__ is the public API's facade, above every layer: ``__version__`` is core's ``mhaexport.core.version``)."""
    parts = name.split(".")
    if parts[0] != "mhaexport":
        return None
    for path, layer in MODULES.items():  # a module in another layer than its folder's (or a name from it)
        module = "mhaexport." + path.removesuffix(".py").replace("/", ".")
        if name == module or name.startswith(module + "."):
            return layer
    if len(parts) == 1:
        return "cli"
    if parts[1] in FOLDERS:
        return FOLDERS[parts[1]]
    if parts[1] == "__init__":
        return "core"
    if parts[1] in TOP:
        return "cli"
    if (ROOT / "mhaexport" / f"{parts[1]}.py").is_file():
        return "core"  # a ground-floor module of mhaexport/ (terminal.py)
    return "cli"  # a name taken from the facade, mhaexport/__init__ (the API's re-exports, __version__)


def _sources():
    for folder, layer in FOLDERS.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            yield path, MODULES.get(str(path.relative_to(ROOT)), layer)
    for path in sorted((ROOT / "mhaexport").rglob("*.py")):
        top = path.relative_to(ROOT / "mhaexport").parts[0].removesuffix(".py")  # commands/export.py -> commands
        yield path, "cli" if top in TOP else "core"


def _edges():
    for path, layer in _sources():
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                # from mhaexport import iospec: the module iospec (core); from mhaexport import verify: the facade
                names = ([f"{node.module}.{a.name}" for a in node.names] if node.module == "mhaexport"
                         else [node.module])
            for name in names:
                target = _layer_of_module(name)
                if target is not None and target != layer and (str(path.relative_to(ROOT)), name) not in FACADE:
                    yield path.relative_to(ROOT), node.lineno, layer, target, name


def test_every_import_between_layers_is_allowed():
    bad = [f"{p}:{line}: {src} imports {name} ({dst})" for p, line, src, dst, name in _edges()
           if dst not in ALLOWED[src]]
    assert not bad, "imports against the layering of docs/DESIGN.md:\n" + "\n".join(bad)


def test_the_allowed_layers_have_no_cycle():
    seen: dict[str, int] = {}

    def visit(layer: str, stack: tuple[str, ...]) -> None:
        assert layer not in stack, f"cycle: {' -> '.join(stack + (layer,))}"
        for nxt in ALLOWED[layer] - {layer}:
            visit(nxt, stack + (layer,))
        seen[layer] = 1

    for layer in ALLOWED:
        visit(layer, ())


@pytest.mark.parametrize("layer", ["core", "artifact", "runtime", "scoring"])
def test_torch_free_layers_never_import_torch(layer):
    """The deploy path (runtime) and what it stands on import neither torch nor onnx's Python package."""
    bad = []
    for path, src in _sources():
        if src != layer:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            mods = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module] if isinstance(node, ast.ImportFrom) and node.module else [])
            bad += [f"{path.relative_to(ROOT)}:{node.lineno} {m}" for m in mods
                    if m.split(".")[0] in ("torch", "onnx", "transformers")]
    assert not bad, bad


# ---- files: no import cycle between two files of the project, lazy imports included ---------------------------

def _module_name(path: Path) -> str:
    """verify/checks.py -> 'mhaexport.verify.checks'; verify/__init__.py -> 'mhaexport.verify';
    mhaexport/cli.py -> 'mhaexport.cli' (the folders pyproject.toml maps into mhaexport.*)."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[0] != "mhaexport":
        parts.insert(0, "mhaexport")
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imported(node: ast.AST, module: str, is_package: bool, known: set[str]) -> list[str]:
    """The modules of ``known`` an import statement in ``module`` names: ``from P import x`` names P.x when that
    is a module, else P; relative imports are resolved against ``module``'s package."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name in known]
    if not isinstance(node, ast.ImportFrom):
        return []
    base = node.module or ""
    if node.level:
        package = module.split(".") if is_package else module.split(".")[:-1]
        package = package[:len(package) - (node.level - 1)]
        base = ".".join(package + ([base] if base else []))
    out = []
    for a in node.names:
        sub = f"{base}.{a.name}"
        if sub in known:
            out.append(sub)
        elif base in known:
            out.append(base)
    return out


def _type_checking_only(tree: ast.AST) -> set[int]:
    """ids of the nodes under ``if TYPE_CHECKING:`` (never run: annotations only)."""
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and (getattr(node.test, "id", None) == "TYPE_CHECKING"
                                         or getattr(node.test, "attr", None) == "TYPE_CHECKING"):
            skip |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    return skip


def file_graph(files: Iterable[tuple[str, Path]], *, type_only: bool = True) -> dict[str, dict[str, int]]:
    """{module: {module it imports: the first line}} over ``files`` ((module name, path) pairs): every import
    statement counts, at the top level or inside a function, and (``type_only``, the default) one under ``if
    TYPE_CHECKING:`` too: it never runs, but two modules that need each other's names, for annotations only, are
    still one concept in two files (the project keeps none: docs/DESIGN.md "The map")."""
    files = list(files)
    known = {m for m, _ in files}
    graph: dict[str, dict[str, int]] = {m: {} for m in known}
    for module, path in files:
        tree = ast.parse(path.read_text(), str(path))
        skip = set() if type_only else _type_checking_only(tree)
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            for target in _imported(node, module, path.name == "__init__.py", known):
                if target != module:
                    graph[module].setdefault(target, node.lineno)
    return graph


def import_cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted: every file in one is
    reached again from itself."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def _describe(graph: dict[str, dict[str, int]], cycle: list[str], paths: dict[str, Path]) -> str:
    inside = set(cycle)
    return "; ".join(f"{paths[a].relative_to(ROOT)}:{line} imports {b}" for a in cycle
                     for b, line in sorted(graph[a].items()) if b in inside)


def _project_files() -> list[tuple[str, Path]]:
    return [(_module_name(path), path) for path, _ in _sources()]


def test_no_two_files_import_each_other():
    files = _project_files()
    graph = file_graph(files)
    paths = dict(files)
    for path, target in FACADE:  # the package's lazy re-export of the Python API (on attribute access only)
        graph[_module_name(ROOT / path)].pop(target, None)
    cycles = import_cycles(graph)
    assert not cycles, "file import cycles (lazy imports included):\n" + "\n".join(
        _describe(graph, c, paths) for c in cycles)


def test_the_file_graph_sees_the_project_imports():
    """The graph is read from the real source: known edges are in it, lazy and top-level ones alike."""
    graph = file_graph(_project_files())
    assert "mhaexport.runtime.session" in graph["mhaexport.runners.names"]  # a top-level import
    assert "mhaexport.models.hf" in graph["mhaexport.models.loading"]  # a lazy one (inside load_hf)
    assert "mhaexport.core.iospec" in graph["mhaexport.diagnose.bisect"]  # `from mhaexport import iospec`: the module


def test_an_injected_edge_back_down_the_layers_is_a_cycle():
    graph = file_graph(_project_files())
    pair = {"mhaexport.runtime.session", "mhaexport.runners.names"}
    assert not any(pair <= set(c) for c in import_cycles(graph))
    graph["mhaexport.runtime.session"]["mhaexport.runners.names"] = 1  # names imports session already
    assert any(pair <= set(c) for c in import_cycles(graph))


def test_a_planted_file_cycle_hidden_in_a_function_is_found(tmp_path):
    """Two modules of a package that import each other, one lazily (inside a function, by a relative import); a
    third imports one of them one way only; a fourth imports the third and, for annotations only, the first; then
    a cycle closed by an annotation-only import, found too."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg.b import helper\n\nVALUE = 1\n")
    (pkg / "b.py").write_text("def helper():\n    from . import a\n\n    return a.VALUE\n")
    (pkg / "c.py").write_text("import pkg.a\nfrom pkg import b\n")
    (pkg / "d.py").write_text("from typing import TYPE_CHECKING\n\nimport pkg.c\n\nif TYPE_CHECKING:\n"
                              "    from pkg.a import VALUE\n")  # annotations only: no edge back to a
    files = [("pkg", pkg / "__init__.py")] + [(f"pkg.{p.stem}", p) for p in sorted(pkg.glob("[abcd].py"))]
    graph = file_graph(files, type_only=False)
    assert graph["pkg.b"] == {"pkg.a": 2} and graph["pkg.c"] == {"pkg.a": 1, "pkg.b": 2}
    assert graph["pkg.d"] == {"pkg.c": 3}
    assert import_cycles(graph) == [["pkg.a", "pkg.b"]]
    assert file_graph(files)["pkg.d"] == {"pkg.c": 3, "pkg.a": 6}  # the annotation-only import counts by default
    (pkg / "b.py").write_text("def helper():\n    return 1\n")  # the lazy import gone: no cycle
    assert import_cycles(file_graph(files)) == []
    (pkg / "a.py").write_text("from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from pkg.d import X\n")
    assert import_cycles(file_graph(files)) == [["pkg.a", "pkg.c", "pkg.d"]]  # a cycle for annotations only
    assert import_cycles(file_graph(files, type_only=False)) == []
