"""Hostile values by kind: what a crafted folder, report or record puts into a text field, a number field, a key or the
JSON text itself. Each kind is a class of attack on a sink (docs/untrusted-folders.md "Sinks"); the red team
(tests/redteam/cross.py) crosses every kind with every field of every source it knows and every sink."""

from __future__ import annotations

# text a field may hold, by kind: each aims at one sink's syntax
TEXT = {
    # HTML: an element, an attribute breaking out of its quotes, a URL
    "html-script": '<script>alert(1)</script>',
    "html-attribute": '" onmouseover="alert(1)" x="',
    "html-image": "<img src=https://evil.example/x.png onerror=alert(1)>",
    "svg-break": "</text></svg><script>alert(1)</script>",
    # Markdown: an image that loads from the network, a link, an autolink, raw HTML, a heading, a table cell, code
    "md-image": "![tracking](https://evil.example/pixel.png)",
    "md-link": "[click here](https://evil.example/)",
    "md-autolink": "<https://evil.example/> https://evil.example/x www.evil.example someone@evil.example",
    "md-html": "<sub>small</sub><details open>x</details><!-- hidden -->",
    "md-heading": "# ✅ verify passed",
    "md-table": "a | b | c",
    "md-code": "`x` ```fence",
    "md-emphasis": "**bold** _em_ ~~gone~~",
    "md-reference": "[x]: https://evil.example/",
    # terminal: clear the screen, green "passed", a forged line, a carriage return, a bidi override
    "ansi": "\x1b[2J\x1b[32mverify passed\x1b[0m",
    "osc": "\x1b]0;owned\x07\x1b]8;;https://evil.example\x07link\x1b]8;;\x07",
    "newline": "x\n## ✅ passed\nFORGED LINE",
    "cr": "ok\rFORGED",
    "bidi": "abc\u202eevil\u2066x\u2069",
    "nul": "a\x00b",
    "surrogate": "\ud800x",
    # matplotlib's mathtext (bench.png): an unterminated expression
    "mathtext": "$\\frac{$",
    # XML: a CDATA end, an entity
    "xml": "]]><!DOCTYPE x [<!ENTITY e SYSTEM 'file:///etc/passwd'>]>&e;",
    "long": "x" * 5000,
}

# numbers a field may hold
NUMBERS = {
    "huge": 10 ** 400,
    "huge-float": 1.7976931348623157e308,
    "negative": -(2 ** 63),
    "tiny": 5e-324,
    "nan": "NaN",  # as mhaexport writes a figure that is not finite
    "inf": "Infinity",
    "-inf": "-Infinity",
}

# JSON text that is not one document two parsers read alike
RAW_JSON = {
    "duplicate-key": b'{"a": 1, "a": 2}',
    "nan-token": b'{"a": NaN}',
    "infinity-token": b'{"a": Infinity}',
    "beyond-float": b'{"a": 1e400}',
    "deep": b"[" * 100_000 + b"]" * 100_000,
    "not-utf8": b'{"a": "\xff\xfe"}',
}

# the markers every hostile text carries, so a sink's checker can find where data landed
FORGED = ("FORGED", "✅ verify passed", "✅ passed")
