"""A report's Markdown (report.md, bench.md, lint) as text for a terminal: headings and table headers in bold, tables
as aligned columns, ``**``, backticks, ``<sub>``, links and HTML comments gone; a cell too long for its column cut
short with its whole text under the table. Styles only where asked (a terminal without NO_COLOR); the text is the
same either way. Returns strings: whoever prints decides where (library code never prints)."""

from __future__ import annotations

import re
import unicodedata

import click

from mhaexport.core.untrusted import shown, unescape_md

CELL = 40  # widest table cell shown whole; a longer one is cut and told in full under its table

# mhaexport's own Markdown: a character escaped with a backslash (data, :func:`mhaexport.core.untrusted.md`) never
# starts or ends any of these
_U = r"(?<!\\)"
_INLINE = [
    (re.compile(_U + r"<!--.*?-->", re.DOTALL), ""),
    (re.compile(_U + r"</?sub>|" + _U + r"</?sup>|" + _U + r"</?details>|" + _U + r"</?summary>"), ""),
    (re.compile(_U + r"<br\s*/?>"), " "),
    (re.compile(_U + r"!" + _U + r"\[([^\]]*)" + _U + r"\]\(([^)]*)\)"), r"\1 (\2)"),  # an image: its text and file
    (re.compile(_U + r"\[([^\]]+)" + _U + r"\]\(([^)]*)\)"), r"\1"),
    (re.compile(_U + r"`([^`]*)" + _U + r"`"), r"\1"),
]
_BOLD = re.compile(_U + r"\*\*(.+?)" + _U + r"\*\*")
_SEPARATOR = re.compile(r"^\|?\s*:?-{2,}:?\s*(\|\s*:?-{2,}:?\s*)*\|?\s*$")


def wants_style(stream_is_tty: bool, env: dict | None = None) -> bool:
    """Styles (bold, colour) only on a terminal and only without NO_COLOR (https://no-color.org: any value)."""
    import os

    env = os.environ if env is None else env
    return stream_is_tty and "NO_COLOR" not in env


def width(text: str) -> int:
    """Columns ``text`` takes in a terminal (wide characters such as ✅ take two)."""
    return sum(2 if unicodedata.east_asian_width(ch) in "WF" else 0 if unicodedata.combining(ch) else 1
               for ch in text)


def _inline(text: str, style: bool) -> str:
    for pattern, repl in _INLINE:
        text = pattern.sub(repl, text)
    text = _BOLD.sub(lambda m: click.style(m.group(1), bold=True) if style else m.group(1), text)
    return unescape_md(text)


def _plain_width(text: str) -> int:
    return width(click.unstyle(text))


def _cells(line: str) -> list[str]:
    body = line.strip()
    body = body[1:] if body.startswith("|") else body
    body = body[:-1] if body.endswith("|") else body
    return [c.strip() for c in re.split(r"(?<!\\)\|", body)]


def _table(lines: list[str], style: bool, columns: int | None = None) -> list[str]:
    rows = [_cells(ln) for ln in lines if not _SEPARATOR.match(ln.strip())]
    if not rows:
        return []
    n = max(len(r) for r in rows)
    sep = next((_cells(ln) for ln in lines if _SEPARATOR.match(ln.strip())), [])
    right = [c.endswith(":") and not c.startswith(":") for c in sep] + [False] * n  # `---:`: numbers, right-aligned
    rows = [[_inline(c, style) for c in r] + [""] * (n - len(r)) for r in rows]
    notes: list[str] = []
    for r in rows[1:]:
        for j, cell in enumerate(r):
            if _plain_width(cell) > CELL:
                notes.append(f"  {click.unstyle(r[0])}: {click.unstyle(cell)}")
                r[j] = click.unstyle(cell)[:CELL - 1] + "…"
    widths = [max(_plain_width(r[j]) for r in rows) for j in range(n)]
    groups = [list(range(1, n))]
    if columns is not None and sum(widths) + 2 * (n - 1) > columns:  # too wide: the columns in groups that fit,
        groups, used = [[]], widths[0]  # one table under the other, each with the first column (the row's name)
        for j in range(1, n):
            if groups[-1] and used + 2 + widths[j] > columns:
                groups.append([])
                used = widths[0]
            groups[-1].append(j)
            used += 2 + widths[j]
    out = []
    for k, group in enumerate(groups):
        out += [""] if k else []
        for i, r in enumerate(rows):
            cells = [" " * (widths[j] - _plain_width(r[j])) + r[j] if right[j] and i
                     else r[j] + " " * (widths[j] - _plain_width(r[j])) for j in [0] + group]
            line = "  ".join(cells).rstrip()
            out.append(click.style(line, bold=True) if style and i == 0 else line)
    return out + notes


def to_terminal(markdown: str, style: bool = False, columns: int | None = None) -> str:
    """``markdown`` as terminal text (see the module docstring); ``style``: bold headings and table headers;
    ``columns``: the terminal's width, which every table is fitted to (its widest cells cut and told under it)."""
    out: list[str] = []
    lines = [shown(line) for line in markdown.split("\n")]  # before any style: no escape but mhaexport's own
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.lstrip().startswith("|"):
            block = []
            while i < len(lines) and lines[i].lstrip().startswith("|"):
                block.append(lines[i])
                i += 1
            out += _table(block, style, columns)
            continue
        if m := re.match(r"^(#{1,6})\s+(.*)$", line):  # a heading (data's "#" is escaped: never one)
            title = click.unstyle(_inline(m.group(2), False))
            out.append(click.style(title, bold=True, underline=len(m.group(1)) <= 2) if style else title)
        else:
            out.append(_inline(line, style))
        i += 1
    text = "\n".join(out)
    return re.sub(r"\n{3,}", "\n\n", text)
