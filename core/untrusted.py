"""Input from outside, made safe to show and to read: the one escaping function for text people or CI read
(:func:`shown`) and the one JSON reader for every JSON a verb takes from outside (:func:`load_json`). Torch-free,
stdlib only.

A folder, a ``--hf`` folder, a report given to ``report merge`` or a ``--config FILE.json`` may have been made by
someone else (docs/DESIGN.md, "Folders from elsewhere"). Their text reaches a terminal, report.md, JUnit and the
GitHub step summary: a name holding an ANSI escape could clear the screen and print a green "passed", one holding
a line break could forge a "## ✅ passed" heading. Their JSON is parsed: nested deep enough it would exhaust
Python's recursion (a crash, exit 3), large enough it would exhaust memory. Both are refused or neutralised here,
once, for every reader and renderer.
"""

from __future__ import annotations

import itertools
import os
import re
import stat
from pathlib import Path
from typing import Any

from mhaexport.core.errors import UntrustedInput

# the largest JSON file read from outside (a tokenizer.json of a 256k vocabulary is ~35 MB)
MAX_JSON_BYTES = 64 << 20
# the deepest nesting of arrays and objects read (a tokenizer.json nests ~8 deep; a config 3-4)
MAX_JSON_DEPTH = 64


# the largest model dimensions a folder may declare (a manifest's contract): the largest models published have ~126
# layers, 128 heads, 256k-token vocabularies and 10M positions; a crafted 10**9 layers is one line, not an allocation
# that takes the machine down
MAX_DIMS = {"n_layers": 1 << 10, "n_heads": 1 << 10, "n_kv_heads": 1 << 10, "head_dim": 1 << 14,
            "d_model": 1 << 16, "vocab_size": 1 << 22, "max_positions": 1 << 24}
# the KV cache of one position over all layers (2 x n_layers x n_kv_heads x head_dim float32 values): a real model's
# is at most a few MB; verify's sweep holds a few hundred positions of it at once
MAX_CACHE_BYTES_PER_POSITION = 1 << 28


def check_dims(dims: dict, where: str) -> None:
    """UntrustedInput naming ``where``.field when a model dimension of ``dims`` (a manifest's contract) is not a
    positive integer within :data:`MAX_DIMS`, or the KV cache of one position exceeds
    :data:`MAX_CACHE_BYTES_PER_POSITION` (what a machine can hold for verify's sweep)."""
    for key, limit in MAX_DIMS.items():
        v = dims.get(key)
        if v is None or isinstance(v, bool) or not isinstance(v, int):
            continue  # absent or mistyped: the field's own type check says so
        if not 1 <= v <= limit:
            raise UntrustedInput(f"{where}.{key}: {v} is outside 1..{limit}, the sizes mhaexport runs: refused")
    layers, kv, dim = (dims.get(k) for k in ("n_layers", "n_kv_heads", "head_dim"))
    kv = kv if kv is not None else dims.get("n_heads")
    if all(isinstance(x, int) and not isinstance(x, bool) for x in (layers, kv, dim)):
        per_position = 2 * layers * kv * dim * 4
        if per_position > MAX_CACHE_BYTES_PER_POSITION:
            raise UntrustedInput(f"{where}: n_layers={layers} x n_kv_heads={kv} x head_dim={dim} makes a KV cache of "
                                 f"{per_position / 2**20:.0f} MiB a position, more than the "
                                 f"{MAX_CACHE_BYTES_PER_POSITION >> 20} MiB mhaexport runs: refused")


def shown(text: object) -> str:
    """``text`` as it may be shown to people or CI: every character that is not printable — control characters
    (the ESC that starts an ANSI escape, line breaks, tab, DEL, C1 controls), format characters (bidi overrides,
    zero-width), line and paragraph separators, lone surrogates — written as its Python escape (``\\n``,
    ``\\x1b``, ``\\u202e``), so the text stays on its line and cannot style, move or clear anything. Printable text,
    emoji and other scripts included, is unchanged. Every renderer (terminal, report.md, JUnit, bench.md, the CI
    step summary) passes untrusted text through this function."""
    s = str(text)
    if s.isprintable():
        return s
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in s)


# Markdown's inline syntax in text from outside: what starts a link or image ([ ]), raw HTML or an autolink (< >), an
# entity (&), code (`), emphasis or strikethrough (* ~, and _ that is not inside a word), a table cell (|), an escape
# (\\), an email autolink (an @ before a domain with a dot); a GFM bare-URL autolink is broken at its "://",
# "www." and "mailto:" / "xmpp:"
_MD_ALWAYS = re.compile(r"[\\`*\[\]<>&|~!]|@(?=[\w.+-]*\.)|(?<![0-9A-Za-z])_|_(?![0-9A-Za-z])|:(?=/)|(?<=[Ww]{3})\.|"
                        r"(?<=mailto):|(?<=xmpp):|(?<=MAILTO):")
# what starts a block when it begins a line: a heading, a quote, a list item, a setext underline, a fence, a table row
_MD_BLOCK_START = re.compile(r"^(\s*)(>|#+(?=\s|$)|([-+=])(?=\s|$|\3*\s*$)|\d{1,9}[.)](?=\s|$))")


def md(value: object, spec: str | None = None) -> str:
    """``value`` as Markdown text that renders as itself and nothing else: the one escaper of data put into report.md,
    bench.md, lint's table, the CI step summary and any other Markdown (a cell, a title, a line). Text is first
    :func:`shown` (no control character, no line break: it stays in its cell and on its line), then every character
    that could start Markdown syntax is backslash-escaped (CommonMark escapes any ASCII punctuation so), so data can
    make no link, image, raw HTML, autolink, code span, emphasis, table cell or heading. A number goes through the one
    formatter (:func:`mhaexport.core.numbers.number`, ``spec``: its format, default ``d`` for an int and ``.4g`` for
    a float)."""
    from mhaexport.core.numbers import is_real, number

    if is_real(value):
        return md(number(value, spec or ("d" if isinstance(value, int) else ".4g")))
    s = _MD_ALWAYS.sub(lambda m: "\\" + m.group(0), shown(value))
    return _MD_BLOCK_START.sub(lambda m: m.group(1) + "".join("\\" + c if not c.isdigit() else c
                                                               for c in m.group(2)), s, count=1)


_MD_ESCAPED = re.compile(r"\\([!-/:-@\[-`{-~])")


def unescape_md(text: str) -> str:
    """Text :func:`md` escaped, as it reads once rendered (each backslash escape the character itself): for a sink
    that takes a Markdown cell's text and escapes it its own way (report.html's table)."""
    return _MD_ESCAPED.sub(r"\1", text)


def fenced(text: str) -> str:
    """``text`` (lines of a log, each :func:`shown`) as a Markdown code block whose fence no line can close: one
    backtick longer than the longest run of backticks in it."""
    lines = [shown(line) for line in str(text).split("\n")]
    run = max((len(r) for r in re.findall(r"`+", "\n".join(lines))), default=0)
    fence = "`" * max(3, run + 1)
    return "\n".join([fence, *lines, fence])


def shown_fields(value: Any) -> Any:
    """``value`` with every string in it :func:`shown` — in dataclass fields, lists, tuples and dict values, recursively
    (a copy; ``value`` itself is left as it is): for a record rendered as lines of text (bisect's table of ONNX names),
    so no name can break its line however the lines are then built."""
    import dataclasses

    if isinstance(value, str):
        return shown(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.replace(value, **{f.name: shown_fields(getattr(value, f.name))
                                             for f in dataclasses.fields(value) if f.init})
    if isinstance(value, (list, tuple)):
        return type(value)(shown_fields(v) for v in value)
    if isinstance(value, dict):
        return {k: shown_fields(v) for k, v in value.items()}
    return value


# mhaexport's own terminal styling (click.style's SGR codes, the progress line's erase-to-end): kept on a terminal
_OWN_STYLE = re.compile(r"\x1b\[[0-9;]*m|\r\x1b\[K")
_CONTROL = re.compile(r"[^\n\t\x20-\x7e\xa0-\U0010ffff]|[\x7f\u2028\u2029\u200b-\u200f\u202a-\u202e\u2066-\u2069\ufeff\ufff9-\uffff]"
                      r"|[\ud800-\udfff]")


def terminal_text(text: str, style: bool = False) -> str:
    """Everything written to mhaexport's stdout and stderr (the terminal sink, applied by the CLI to its streams as a
    whole): a control character other than a line break or a tab — the ESC that starts an ANSI escape, a carriage
    return, a bidi override — written as its escape, as :func:`shown` writes it, whatever printed it (a renderer that
    forgot, a library's message, a traceback). ``style``: on a terminal that takes styles, mhaexport's own bold and
    colour codes and the progress line's carriage return stay (data reaching them was :func:`shown` already)."""
    if text.isprintable() or _CONTROL.search(text) is None:
        return text
    if not style:
        return _CONTROL.sub(lambda m: repr(m.group(0))[1:-1], text)
    parts = _OWN_STYLE.split(text)
    codes = _OWN_STYLE.findall(text)
    out = [_CONTROL.sub(lambda m: repr(m.group(0))[1:-1], parts[0])]
    for code, part in zip(codes, parts[1:]):
        out += [code, _CONTROL.sub(lambda m: repr(m.group(0))[1:-1], part)]
    return "".join(out)


_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_ONE_KIND = bytes.maketrans(b"{}", b"[]")


def json_depth(raw: bytes) -> int:
    """How deep arrays and objects nest in the JSON text ``raw``, counted without parsing it (so without recursion)
    and at C speed: brackets inside strings do not count."""
    if raw.count(b"[") + raw.count(b"{") == 0:
        return 0
    # every quote left after taking out escaped backslashes and escaped quotes opens or closes a string: the text
    # outside strings is every other piece between quotes
    plain = raw.replace(b"\\\\", b"").replace(b'\\"', b"")
    # the brackets outside strings, as one kind: a { closed by ] is not JSON, which the parser then says
    brackets = b"".join(plain.split(b'"')[::2]).translate(_ONE_KIND, _NOT_BRACKETS)
    depth = 0
    while brackets and depth <= MAX_JSON_DEPTH:  # take out the innermost pairs, one level a pass
        inner = brackets.replace(b"[]", b"")  # non-overlapping, on the text as it was: one level
        if inner == brackets:
            break
        brackets, depth = inner, depth + 1
    if not brackets:
        return depth
    # deeper than any limit, or unbalanced: count, once, how deep it opens (linear, no recursion)
    return depth + max(itertools.accumulate(1 if b == 0x5B else -1 for b in brackets))


def load_json(source: bytes | str | os.PathLike, where: str, *, max_bytes: int = MAX_JSON_BYTES,
              max_depth: int = MAX_JSON_DEPTH) -> Any:
    """The JSON value of ``source`` — the bytes of a file already read (through the folder's confined reader), or a
    path to read (a regular file only, at most ``max_bytes``) — or :class:`~mhaexport.core.errors.UntrustedInput` naming
    ``where`` (the file, e.g. "DIR/tokenizer.json") when it is not UTF-8 JSON, is larger than ``max_bytes`` or
    nests deeper than ``max_depth``. The one JSON reader for input from outside: manifest.json, genai_config.json,
    the tokenizer files, Hugging Face configs, reports, ``--config FILE.json``. Strict: a key twice in one object,
    ``NaN`` / ``Infinity`` tokens (not JSON) and a number beyond a float's range are refused. What the value must hold
    is the caller's to check (a field's type, a number's range: ``artifact.record``)."""
    where = shown(where)
    raw = check_json(source, where, max_bytes=max_bytes, max_depth=max_depth)
    import json

    try:
        return json.loads(raw.decode("utf-8-sig"), object_pairs_hook=_unique_keys, parse_constant=_no_constant,
                          parse_float=_finite_float)
    except _Refused as e:
        raise UntrustedInput(f"{where}: {e}: refused") from None
    except UnicodeDecodeError as e:
        raise UntrustedInput(f"{where}: not UTF-8 text (byte {e.start}): not a JSON file") from None
    except RecursionError:  # unreachable within max_depth; kept so no limit can turn into a crash
        raise UntrustedInput(f"{where}: JSON nested too deep to read: refused") from None
    except ValueError as e:  # JSONDecodeError, and an integer of more digits than Python converts
        raise UntrustedInput(f"{where}: not valid JSON ({shown(str(e).splitlines()[0] if str(e) else type(e).__name__)})"
                       ) from None


class _Refused(ValueError):
    """What strict JSON reading refuses (:func:`load_json`), said in the message."""


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An object whose keys are unique (RFC 8259 leaves duplicates undefined: Python keeps the last, other parsers —
    onnxruntime-genai's — may apply both, so a file two programs read must not have them)."""
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        dup = next(k for k, _ in pairs if k in seen or seen.add(k))  # type: ignore[func-returns-value]
        raise _Refused(f"the key {shown(dup)!r} appears twice in one object")
    return out


def _no_constant(name: str) -> Any:
    raise _Refused(f"{name} is not JSON (a number that is not finite is written as the string \"{name}\")")


def _finite_float(text: str) -> float:
    v = float(text)
    if v in (float("inf"), float("-inf")):
        raise _Refused(f"the number {shown(text[:40])} is beyond a float's range")
    return v


def check_json(source: bytes | str | os.PathLike, where: str, *, max_bytes: int = MAX_JSON_BYTES,
               max_depth: int = MAX_JSON_DEPTH) -> bytes:
    """The bytes of ``source`` once its size and nesting are within the limits (the first half of
    :func:`load_json`, without parsing): for a JSON file another program parses (onnxruntime-genai's C++ reader of
    a folder's tokenizer and config files), and for :func:`load_json` itself."""
    where = shown(where)
    if isinstance(source, (bytes, bytearray, memoryview)):
        raw = bytes(source)
    else:
        raw = _read_capped(Path(source), where, max_bytes)
    if len(raw) > max_bytes:
        raise UntrustedInput(f"{where}: {len(raw)} bytes, more than the {max_bytes} a JSON file may hold: refused")
    depth = json_depth(raw)
    if depth > max_depth:
        raise UntrustedInput(f"{where}: JSON nested {depth} deep, deeper than the {max_depth} levels mhaexport reads: "
                             "refused")
    return raw


def _read_capped(path: Path, where: str, max_bytes: int) -> bytes:
    """At most ``max_bytes`` + 1 bytes of the regular file ``path`` (never a FIFO that would hang, nor a device)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise UntrustedInput(f"{where}: cannot be read ({e.strerror or e})") from None
    with os.fdopen(fd, "rb") as f:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise UntrustedInput(f"{where}: not a regular file: refused")
        os.set_blocking(fd, True)
        return f.read(max_bytes + 1)
