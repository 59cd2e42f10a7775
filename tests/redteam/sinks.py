"""Each sink's checker: what output in that sink's syntax may hold whatever the data was. Each returns a list of
findings (empty: the output is safe), naming what data made of it.

- HTML (report.html, bench.html): parsed (html.parser); no element, attribute or URL beyond the template's own.
- Markdown (report.md, bench.md, lint's table, the CI step summary): parsed by a real CommonMark parser
  (markdown-it-py, with GFM tables and strikethrough); no link, image or raw HTML but the template's own, no extra
  heading, and no bare URL a GFM renderer would turn into a link (checked on each text run between escapes, as
  cmark-gfm's autolinker sees them).
- Terminal (the CLI's stdout/stderr): no ESC, no other control but line breaks, no forged line.
- XML (JUnit): parses; no control character.
- JSON (Model Explorer node data, report.json, bench.json): valid strict JSON (no NaN token).
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from html.parser import HTMLParser

# the elements and attributes report.html / bench.html and their SVG charts are made of (verify/html.py, svg.py)
HTML_TAGS = {"html", "head", "meta", "title", "style", "body", "h1", "h2", "p", "b", "code", "table", "tr", "th", "td",
             "span", "figure", "figcaption", "details", "summary", "svg", "rect", "text", "line", "polyline", "circle",
             "path", "br", "ul", "li"}
HTML_ATTRS = {"lang", "charset", "name", "content", "class", "xmlns", "viewbox", "width", "height", "role",
              "aria-label", "font-family", "font-size", "font-weight", "x", "y", "x1", "x2", "y1", "y2", "fill",
              "stroke", "stroke-width", "stroke-dasharray", "text-anchor", "transform", "points", "cx", "cy", "r", "d",
              "title", "colspan"}  # a cell's tooltip (the rule that judged it, its message) and a row's one reason
# the only URL a page holds: the SVG namespace
HTML_URLS = {"http://www.w3.org/2000/svg"}
# attributes whose value a browser shows as text and never loads or follows (a tooltip): data there is text, as in a
# cell, so a URL in it is a string (still escaped: no element or attribute can come out of it)
TEXT_ATTRS = {"title"}


class _Collect(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[str] = []
        self.attrs: list[tuple[str, str, str | None]] = []
        self.comments: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self.attrs += [(tag, k, v) for k, v in attrs]

    handle_startendtag = handle_starttag

    def handle_comment(self, data):
        self.comments.append(data)

    def handle_decl(self, decl):
        if decl.lower() != "doctype html":
            self.comments.append(decl)


def html_findings(page: str) -> list[str]:
    p = _Collect()
    p.feed(page)
    p.close()
    out = [f"element <{t}>" for t in sorted(set(p.tags) - HTML_TAGS)]
    out += [f"attribute {t}.{k}" for t, k, _ in p.attrs if k not in HTML_ATTRS]
    out += [f"URL {v!r} in {t}.{k}" for t, k, v in p.attrs
            if v and k not in TEXT_ATTRS and re.search(r"(?i)\b(?:https?|javascript|data|file):|^//", v)
            and v not in HTML_URLS]
    out += [f"comment or declaration {c[:40]!r}" for c in p.comments]
    if "\x1b" in page:
        out.append("ESC")
    return out


def _markdown():
    from markdown_it import MarkdownIt

    md = MarkdownIt("commonmark").enable(["table", "strikethrough"])
    md.disable("text_join")  # escaped characters stay their own tokens: a text run is what an autolinker sees
    return md


# what mhaexport's own Markdown holds as HTML (report.md's footer, the bench section's markers)
OWN_HTML = {"<sub>", "</sub>", "<!-- bench -->", "<!-- /bench -->"}
# a bare URL or address a GFM renderer (GitHub, the step summary) turns into a link
_AUTOLINK = re.compile(r"(?i)(?:https?|ftp)://|\bwww\.|\b(?:mailto|xmpp):|[\w.+-]@[\w-]+\.\w")


def markdown_findings(text: str, headings: int | None = None) -> list[str]:
    """Findings of Markdown ``text``; ``headings``: how many headings its template makes (None: not checked)."""
    out: list[str] = []
    tokens = _markdown().parse(text)
    seen_headings = 0
    for tok in tokens:
        if tok.type == "heading_open":
            seen_headings += 1
        if tok.type == "html_block" and tok.content.strip() not in OWN_HTML:
            out.append(f"raw HTML block {tok.content.strip()[:60]!r}")
        for child in tok.children or []:
            if child.type in ("link_open", "image"):
                out.append(f"{child.type} {child.attrs.get('href') or child.attrs.get('src')!r}")
            elif child.type == "html_inline" and child.content not in OWN_HTML:
                out.append(f"raw HTML {child.content[:60]!r}")
            elif child.type == "text" and _AUTOLINK.search(child.content):
                out.append(f"bare URL a GFM renderer links: {child.content[:60]!r}")
    if headings is not None and seen_headings != headings:
        out.append(f"{seen_headings} headings, the template makes {headings}")
    if "\x1b" in text:
        out.append("ESC")
    return out


def terminal_findings(text: str) -> list[str]:
    out = []
    if "\x1b" in text:
        out.append("ESC")
    bad = sorted({repr(ch) for ch in text if not ch.isprintable() and ch not in "\n"})
    if bad:
        out.append(f"control characters {', '.join(bad[:5])}")
    out += [f"forged line {line[:40]!r}" for line in text.splitlines()
            if line.lstrip().startswith(("FORGED", "## ✅ passed", "✅ verify passed"))]
    return out


def xml_findings(data: bytes) -> list[str]:
    try:
        ET.fromstring(data)
    except ET.ParseError as e:
        return [f"not well-formed XML: {e}"]
    text = data.decode("utf-8")
    return ["ESC"] if "\x1b" in text else []


def json_findings(data: bytes | str) -> list[str]:
    from mhaexport.core.errors import MhaExportError
    from mhaexport.core.untrusted import load_json

    try:
        load_json(data.encode() if isinstance(data, str) else data, "output")
    except MhaExportError as e:
        return [f"not strict JSON: {e}"]
    return []
