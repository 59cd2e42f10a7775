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
