"""Numbers as mhaexport writes, reads and shows them: the one formatter every renderer calls (:func:`number`), and
the JSON form of a figure that is not finite. Torch-free, stdlib only.

A verdict must survive any figure. A model whose logits are NaN or infinite has NaN and infinite figures; a report
given to ``report merge`` may hold any number at all. So:

- **Shown**: :func:`number` formats any real value — a float, an int of any size, a numpy scalar, NaN, ±inf — and
  never raises: ``NaN``, ``+inf``, ``-inf``, and an integer beyond a float's range as a power of ten bound.
- **Written**: JSON has no NaN or infinity (a ``NaN`` token is not JSON; strict readers refuse it). A figure that is
  not finite is written as one of the strings of :data:`NONFINITE` (:func:`jsonable`), and every JSON mhaexport
  writes goes through :func:`dumps`, which refuses anything else that is not JSON.
- **Read**: a float field of a record (``artifact.record``) reads a JSON number within a float's range or one of
  those strings (:func:`read_float`); an int field an integer within :data:`MAX_INT`. Anything else is refused where
  the record is read, naming the key: the bound lives in the type, once.
"""

from __future__ import annotations

import json
import math
from typing import Any

# the JSON strings of the figures that are not finite (what `jsonable` writes and `read_float` reads)
NONFINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
# the largest integer a JSON figure may hold (int64: a byte count, a token id, a position)
MAX_INT = (1 << 63) - 1


def is_real(value: object) -> bool:
    """Whether ``value`` is a real number (an int, a float or a numpy scalar of either; a bool is not)."""
    if isinstance(value, bool):
        return False
    if isinstance(value, (int, float)):
        return True
    kind = getattr(getattr(value, "dtype", None), "kind", None)
    return kind in ("i", "u", "f") and getattr(value, "ndim", 1) == 0


def finite(value: object) -> float | None:
    """``value`` as a finite float, or None where it is not a real number, not finite or beyond a float's range."""
    if not is_real(value):
        return None
    try:
        v = float(value)  # type: ignore[arg-type]
    except (OverflowError, ValueError, TypeError):
        return None
    return v if math.isfinite(v) else None


def number(value: object, spec: str = ".3g") -> str:
    """``value`` formatted with ``spec`` (a ``format`` spec for floats: ``.3g``, ``.1e``, ``.2f``), whatever it is:
    ``NaN``, ``+inf``, ``-inf`` for the values that are not finite, ``≥1e308`` / ``≤-1e308`` for an integer beyond a
    float's range, and ``str(value)`` for what is not a number (never an exception: a renderer must not fail on a
    figure)."""
    if not is_real(value):
        return str(value)
    try:
        v = float(value)  # type: ignore[arg-type]
    except OverflowError:
        return "≥1e308" if value > 0 else "≤-1e308"  # type: ignore[operator]
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+inf" if v > 0 else "-inf"
    if isinstance(value, int) and (spec == "" or spec.endswith("d")):
        return format(value, spec)
    try:
        return format(v, spec)
    except (ValueError, TypeError):
        return format(v, ".3g")


def jsonable(value: Any) -> Any:
    """``value`` with every float that is not finite (in lists, tuples and dicts too) replaced by its string of
    :data:`NONFINITE`: what :func:`dumps` writes."""
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if is_real(value) and not isinstance(value, int):  # a numpy scalar
        return jsonable(value.item())  # type: ignore[union-attr]
    return value


def dumps(value: Any, *, indent: int | None = None, sort_keys: bool = False,
          separators: tuple[str, str] | None = None) -> str:
    """The JSON text of ``value``, figures that are not finite written as strings (:func:`jsonable`): always valid
    JSON (``allow_nan=False``), so a strict reader — ours, ``jq``, a CI dashboard — reads every file mhaexport
    writes."""
    return json.dumps(jsonable(value), indent=indent, sort_keys=sort_keys, separators=separators, allow_nan=False)


def read_float(value: object) -> float | None:
    """A JSON figure read as a float: a number within a float's range, or one of :data:`NONFINITE`'s strings; None
    for anything else (the reader names the key and refuses it)."""
    if isinstance(value, str):
        return NONFINITE.get(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        return float(value)
    except OverflowError:
        return None


def read_int(value: object) -> int | None:
    """A JSON figure read as an integer within :data:`MAX_INT` either way; None for anything else."""
    if isinstance(value, bool) or not isinstance(value, int) or not -MAX_INT <= value <= MAX_INT:
        return None
    return value
