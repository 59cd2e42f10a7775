"""The shell examples of README.md and of the documentation pages, run as a new user runs them: in order, on a fresh
copy, as real subprocesses.

The documents are README.md (the landing page) then the pages of mkdocs.yml's ``nav`` under docs/, in the nav's order
(``DOCUMENTS``; a test checks that it is the nav's order). Every fenced ```bash block of them is an example. The HTML comment right before a block says how this test
treats it:

- ``<!-- readme-test: fast -->``: run by the fast test (``test_fast_examples_run_in_order``), in document order in
  one temporary folder. Fast blocks may use only what earlier fast blocks made.
- ``<!-- readme-test: skip (REASON) -->``: never run (an install line, a GPU, a model from the network); the reason
  is required.
- no marker, or ``<!-- readme-test: slow (REASON) -->``: run only by the slow test
  (``test_all_examples_run_in_order``), which runs every block that is not skipped, fast ones included, in order.

Both tests run each block with ``bash -e -o pipefail`` from a temporary folder holding a copy of the checkout's
``examples/``, ``data/`` and ``scripts/`` (what a fresh clone has next to the commands), with this environment's
``mhaexport`` and ``python`` first on PATH, and fail on the first block whose exit code is not 0, naming the block's
file, line and the end of its output. Also checked: every ``#anchor`` link of a document names a heading of it,
every ``page.md#anchor`` link a heading of that page, and the promises of the Quick start (the main job's command and
the test command).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
MKDOCS = ROOT / "mkdocs.yml"
MARKER = re.compile(r"<!--\s*readme-test:\s*(fast|slow|skip)\s*(?:\((.*?)\))?\s*-->")
# what a fresh clone puts beside the README's commands (the package itself comes from the environment)
COPIED = ("examples", "data", "scripts")


def documents() -> list[Path]:
    """README.md, then the nav's pages (docs/), in the nav's order: the order the examples run in."""
    pages = re.findall(r"^\s*- (?:[^:\n]+: )?([\w/.-]+\.md)\s*$", MKDOCS.read_text(), re.M)
    return [README] + [ROOT / "docs" / p for p in pages if p != "index.md"]


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


@dataclass
class Block:
    file: str     # the document, relative to the checkout
    line: int     # 1-based line of the opening fence
    lang: str
    code: str
    mode: str     # fast | slow | skip
    reason: str


def fenced_blocks(text: str, file: str = "README.md") -> list[Block]:
    """Every fenced code block with the readme-test marker on the last non-blank line before it (if any)."""
    blocks, lines, i = [], text.split("\n"), 0
    while i < len(lines):
        m = re.match(r"^(\s*)(`{3,}|~{3,})(\w*)", lines[i])
        if not m:
            i += 1
            continue
        fence, lang, start = m.group(2), m.group(3), i
        j = i + 1
        while j < len(lines) and not lines[j].strip().startswith(fence):
            j += 1
        k = start - 1
        while k >= 0 and not lines[k].strip():
            k -= 1
        marker = MARKER.search(lines[k]) if k >= 0 else None
        mode, reason = (marker.group(1), (marker.group(2) or "").strip()) if marker else ("slow", "")
        blocks.append(Block(file, start + 1, lang, "\n".join(lines[start + 1:j]), mode, reason))
        i = j + 1
    return blocks


def bash_blocks() -> list[Block]:
    """Every ```bash block of every document, in run order."""
    return [b for doc in documents() for b in fenced_blocks(doc.read_text(), rel(doc)) if b.lang == "bash"]


def headings_outside_code(text: str) -> list[str]:
    out, in_code, fence = [], False, ""
    for line in text.split("\n"):
        m = re.match(r"^\s*(`{3,}|~{3,})", line)
        if m:
            if not in_code:
                in_code, fence = True, m.group(1)
            elif line.strip().startswith(fence):
                in_code = False
            continue
        if not in_code and (h := re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)):
            out.append(h.group(1))
    return out


def github_anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, markup and punctuation dropped, spaces to hyphens."""
    s = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)   # links keep their text
    s = s.strip().lower().replace("`", "")
    s = re.sub(r"[^\w\- ]", "", s)                          # \w keeps letters, digits and _
    return s.replace(" ", "-")


def anchors(text: str) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for h in headings_outside_code(text):
        a = github_anchor(h)
        n = seen.get(a, 0)
        seen[a] = n + 1
        out.add(a if n == 0 else f"{a}-{n}")
    return out


def run_blocks(blocks: list[Block], cwd: Path, timeout: float) -> None:
    for name in COPIED:
        shutil.copytree(ROOT / name, cwd / name, ignore=shutil.ignore_patterns("__pycache__"))
    env = dict(os.environ)
    bindir = str(Path(sys.executable).parent)
    env["PATH"] = bindir + os.pathsep + env.get("PATH", "")
    env.setdefault("MHAEXPORT_HOST_LABEL", "readme-test")
    env.setdefault("MHAEXPORT_CACHE_DIR", str(cwd / ".cache"))  # verify --mapped's weights: not in the user's cache
    env["NO_COLOR"] = "1"
    for b in blocks:
        res = subprocess.run(["bash", "--noprofile", "--norc", "-e", "-o", "pipefail", "-c", b.code], cwd=cwd,
                             env=env, capture_output=True, text=True, timeout=timeout)
        assert res.returncode == 0, (
            f"{b.file} line {b.line}: the block exited {res.returncode}\n{b.code}\n--- stdout (end)\n"
            f"{res.stdout[-3000:]}\n--- stderr (end)\n{res.stderr[-3000:]}")


# ---- checks on the text ---------------------------------------------------------------------------------------

def test_documents_are_the_nav_in_order():
    """Every Markdown page under docs/ but the measurements is in the nav (so its examples run), README first."""
    docs = documents()
    assert docs[0] == README and len(docs) == len(set(docs)) and all(d.exists() for d in docs), docs
    pages = {p for p in (ROOT / "docs").rglob("*.md") if "measurements" not in p.parts}
    assert pages <= set(docs), f"pages missing from mkdocs.yml's nav: {sorted(map(rel, pages - set(docs)))}"


def test_markers_are_known_and_skips_say_why():
    for doc in documents():
        for m in re.finditer(r"<!--\s*readme-test[^>]*-->", doc.read_text()):
            assert MARKER.fullmatch(m.group(0)), f"{rel(doc)}: unknown readme-test marker: {m.group(0)}"
    blocks = bash_blocks()
    assert blocks, "README.md and the pages have no ```bash blocks"
    for b in blocks:
        if b.mode == "skip":
            assert b.reason, f"{b.file} line {b.line}: a skipped block must say why: <!-- readme-test: skip (why) -->"
    skipped = [b for b in blocks if b.mode == "skip"]
    assert len(skipped) <= 6, f"{len(skipped)} skipped blocks: skips must stay few"
    assert sum(b.mode == "fast" for b in blocks) >= 4


def test_every_internal_link_names_a_heading():
    """``#a`` names a heading of the same document, ``page.md#a`` one of that page (README's links into the pages,
    the pages' links between them and back to the README's Quick start)."""
    broken, count, known = [], 0, {}
    for doc in documents() + [ROOT / "docs" / "measurements" / "README-figures.md"]:
        text = doc.read_text()
        for target, anchor in re.findall(r"\]\(((?!https?:)[^)\s#]*)#([^)\s]+)\)", text):
            dest = (doc.parent / target).resolve() if target else doc
            count += 1
            if dest.exists() and dest not in known:
                known[dest] = anchors(dest.read_text())
            if anchor not in known.get(dest, ()):
                broken.append(f"{rel(doc)}: {target}#{anchor}")
    assert count > 50, "the README and the pages have no internal links (the README's contents?)"
    assert not broken, f"links to no heading: {broken}"


def test_relative_links_name_files_of_the_checkout():
    missing = []
    for doc in documents():
        for target in re.findall(r"\]\(((?!https?:|#|mailto:)[^)\s]+)\)", doc.read_text()):
            path = target.split("#", 1)[0]
            if path and not (doc.parent / path).exists():
                missing.append(f"{rel(doc)}: {target}")
    assert not missing, f"links to files that are not in the checkout: {missing}"


def test_quick_start_keeps_its_promises():
    """The Quick start shows the main job and the test command, with .ci/run's install lines."""
    text = README.read_text()
    quick = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    quick = re.sub(r" \\\n +", " ", quick)  # a command continued over lines (\ at a line's end) read as one
    # the CPU wheel: on Linux the package index's torch is the CUDA build with ~17 nvidia-* packages
    cpu = "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu"
    main = ("python3 -m venv .venv && . .venv/bin/activate && " + cpu + " && "
            "pip install -e '.[cpu,test]' && mhaexport all -o artifacts/default")
    tests = ("python3 -m venv .venv && . .venv/bin/activate && " + cpu + " && "
             "pip install -e '.[cpu,test]' && pip install --no-deps onnxruntime-genai==0.18.0 && python -m pytest -q")
    assert main in quick and tests in quick
    ci = (ROOT / ".ci" / "run").read_text()
    # .ci/run installs the docs and browser extras too (the site's build, the slow set's browser tests)
    for line in ("pip install torch==2.13.0", "pip install -e '.[cpu,test,docs,browser]'",
                 "pip install --no-deps onnxruntime-genai==0.18.0", "python -m pytest -q"):
        assert line in ci, f".ci/run no longer has {line!r}: update the Quick start with it"


def test_install_lines_work_from_the_checkout():
    """mhaexport is installed from the checkout, not an index: no `pip install mhaexport...` in an example."""
    for b in bash_blocks():
        assert not re.search(r"pip install[^\n]*['\"]?mhaexport\[", b.code), f"{b.file} line {b.line}: {b.code}"


# ---- the examples, run ----------------------------------------------------------------------------------------

def test_fast_examples_run_in_order(tmp_path):
    """The fast blocks (the tiny preset: export, verify, generate, lint, report merge, --json, --junit)."""
    run_blocks([b for b in bash_blocks() if b.mode == "fast"], tmp_path, timeout=120)


@pytest.mark.slow
def test_all_examples_run_in_order(tmp_path):
    """Every block that is not skipped, in document order, as a fresh user running the README top to bottom."""
    run_blocks([b for b in bash_blocks() if b.mode != "skip"], tmp_path, timeout=1800)
