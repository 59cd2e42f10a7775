"""The README's shell examples, run as a new user runs them: in order, on a fresh copy, as real subprocesses.

Every fenced ```bash block of README.md is an example. The HTML comment right before a block says how this test
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
line and the end of its output. Also checked: every ``#anchor`` link of the README names a heading of it, and the
promises of the Quick start (the main job's command and the test command).
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
MARKER = re.compile(r"<!--\s*readme-test:\s*(fast|slow|skip)\s*(?:\((.*?)\))?\s*-->")
# what a fresh clone puts beside the README's commands (the package itself comes from the environment)
COPIED = ("examples", "data", "scripts")


@dataclass
class Block:
    line: int     # 1-based line of the opening fence
    lang: str
    code: str
    mode: str     # fast | slow | skip
    reason: str


def fenced_blocks(text: str) -> list[Block]:
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
        blocks.append(Block(start + 1, lang, "\n".join(lines[start + 1:j]), mode, reason))
        i = j + 1
    return blocks


def bash_blocks() -> list[Block]:
    return [b for b in fenced_blocks(README.read_text()) if b.lang == "bash"]


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
    env["NO_COLOR"] = "1"
    for b in blocks:
        res = subprocess.run(["bash", "--noprofile", "--norc", "-e", "-o", "pipefail", "-c", b.code], cwd=cwd,
                             env=env, capture_output=True, text=True, timeout=timeout)
        assert res.returncode == 0, (
            f"README.md line {b.line}: the block exited {res.returncode}\n{b.code}\n--- stdout (end)\n"
            f"{res.stdout[-3000:]}\n--- stderr (end)\n{res.stderr[-3000:]}")


# ---- checks on the text ---------------------------------------------------------------------------------------

def test_markers_are_known_and_skips_say_why():
    text = README.read_text()
    for m in re.finditer(r"<!--\s*readme-test[^>]*-->", text):
        assert MARKER.fullmatch(m.group(0)), f"unknown readme-test marker: {m.group(0)}"
    blocks = bash_blocks()
    assert blocks, "README.md has no ```bash blocks"
    for b in blocks:
        if b.mode == "skip":
            assert b.reason, f"README.md line {b.line}: a skipped block must say why: <!-- readme-test: skip (why) -->"
    skipped = [b for b in blocks if b.mode == "skip"]
    assert len(skipped) <= 6, f"{len(skipped)} skipped blocks: skips must stay few"
    assert sum(b.mode == "fast" for b in blocks) >= 4


def test_every_internal_link_names_a_heading():
    text = README.read_text()
    known = anchors(text)
    links = re.findall(r"\]\(#([^)\s]+)\)", text)
    assert links, "README.md has no internal links (its table of contents?)"
    broken = sorted({a for a in links if a not in known})
    assert not broken, f"links to no heading: {broken}"


def test_relative_links_name_files_of_the_checkout():
    text = README.read_text()
    missing = []
    for target in re.findall(r"\]\(((?!https?:|#|mailto:)[^)\s]+)\)", text):
        path = target.split("#", 1)[0]
        if path and not (ROOT / path).exists():
            missing.append(target)
    assert not missing, f"links to files that are not in the checkout: {missing}"


def test_quick_start_keeps_its_promises():
    """The Quick start shows the main job and the test command, with .ci/run's install lines."""
    text = README.read_text()
    quick = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    # the CPU wheel: on Linux the package index's torch is the CUDA build with ~17 nvidia-* packages
    cpu = "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu"
    main = ("python3 -m venv .venv && . .venv/bin/activate && " + cpu + " && "
            "pip install -e '.[cpu,test]' && mhaexport all -o artifacts/default")
    tests = ("python3 -m venv .venv && . .venv/bin/activate && " + cpu + " && "
             "pip install -e '.[cpu,test]' && pip install --no-deps onnxruntime-genai==0.18.0 && python -m pytest -q")
    assert main in quick and tests in quick
    ci = (ROOT / ".ci" / "run").read_text()
    for line in ("pip install torch==2.13.0", "pip install -e '.[cpu,test]'",
                 "pip install --no-deps onnxruntime-genai==0.18.0", "python -m pytest -q"):
        assert line in ci, f".ci/run no longer has {line!r}: update the Quick start with it"


def test_install_lines_work_from_the_checkout():
    """mhaexport is installed from the checkout, not an index: no `pip install mhaexport...` in an example."""
    for b in bash_blocks():
        assert not re.search(r"pip install[^\n]*['\"]?mhaexport\[", b.code), f"README.md line {b.line}: {b.code}"


# ---- the examples, run ----------------------------------------------------------------------------------------

def test_fast_examples_run_in_order(tmp_path):
    """The fast blocks (the tiny preset: export, verify, generate, lint, report merge, --json, --junit)."""
    run_blocks([b for b in bash_blocks() if b.mode == "fast"], tmp_path, timeout=120)


@pytest.mark.slow
def test_all_examples_run_in_order(tmp_path):
    """Every block that is not skipped, in document order, as a fresh user running the README top to bottom."""
    run_blocks([b for b in bash_blocks() if b.mode != "skip"], tmp_path, timeout=1800)
