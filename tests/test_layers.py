"""The layers of docs/DESIGN.md, read from the source: which subpackage may import which, and no cycles.

Every ``import mhaexport.X`` / ``from mhaexport.X import ...`` in the package's source (lazy imports inside
functions included) is an edge; an edge the table does not allow fails with the file and line.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# source folder -> layer name (the top-level folders pyproject.toml maps into mhaexport.*)
FOLDERS = {"artifact": "artifact", "models": "models", "exporter": "exporter", "runtime": "runtime",
           "verify": "verify", "bench": "bench"}
# the torch-free core modules inside mhaexport/ and what they are
CORE = {"errors", "iospec", "dtypes", "env"}
# the top layer inside mhaexport/: the command line, the Python API beside it and the pytest plugin on the API
TOP = {"cli", "__main__", "api", "pytest_plugin"}
# the one downward edge allowed by name: the package's __init__ re-exports the Python API lazily (mhaexport.verify(...)
# and friends), inside functions, so `import mhaexport` imports nothing of it
FACADE = {("mhaexport/__init__.py", "mhaexport.api")}
BASE = {"core"}
ALLOWED = {
    "core": BASE,
    "artifact": BASE,
    "runtime": BASE | {"artifact"},
    "models": BASE | {"artifact"},
    "exporter": BASE | {"artifact", "models", "runtime"},
    "verify": BASE | {"artifact", "models", "runtime"},
    "bench": BASE | {"artifact", "models", "runtime", "verify"},
    "cli": BASE | {"artifact", "models", "runtime", "exporter", "verify", "bench"},
}


def _layer_of_module(name: str) -> str | None:
    """'mhaexport.verify.checks' -> 'verify'; 'mhaexport.iospec' -> 'core'; 'mhaexport' (version) -> 'core'."""
    parts = name.split(".")
    if parts[0] != "mhaexport":
        return None
    if len(parts) == 1:
        return "core"
    if parts[1] in FOLDERS:
        return FOLDERS[parts[1]]
    if parts[1] in CORE or parts[1] == "__init__":
        return "core"
    if parts[1] in TOP:
        return "cli"
    return "core"  # a name from mhaexport/__init__ (__version__, MhaExportError)


def _sources():
    for folder, layer in FOLDERS.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            yield path, layer
    for path in sorted((ROOT / "mhaexport").glob("*.py")):
        stem = path.stem
        yield path, "cli" if stem in TOP else "core"


def _edges():
    for path, layer in _sources():
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module] + ([f"{node.module}.{a.name}" for a in node.names]
                                         if node.module == "mhaexport" else [])
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


@pytest.mark.parametrize("layer", ["core", "artifact", "runtime"])
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
