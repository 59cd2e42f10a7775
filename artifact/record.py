"""JSON objects as typed dataclasses: the one machinery behind every file mhaexport writes and reads back — the
manifest's details (:mod:`mhaexport.artifact.details`), the verify report (``verify/report.py``) and the bench result
(``bench/result.py``). Torch-free.

A :class:`Record` declares one field per key; :meth:`Record.from_dict` checks every known key's type (ArtifactError
naming the key's path: ``artifacts.onnx.max_cache is '48' (str), expected int or null``) and parses nested records,
lists and maps of them; keys it does not know are kept in ``extra`` and written back. :meth:`Record.to_dict` gives
back the JSON that was read: the keys in their order, an explicit ``null`` as ``null``, an absent key absent (a field
left None by a writer is not written unless listed in ``WRITE_NONE``).
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, TypeVar

from mhaexport.core.errors import ArtifactError
from mhaexport.core.numbers import MAX_INT, jsonable, read_float, read_int

R = TypeVar("R", bound="Record")


@dataclass
class Record:
    """A JSON object as a dataclass: one field per key (field metadata ``key`` renames it; ``flat`` marks a record
    whose keys sit in this object's own; ``json: False`` keeps a field out of the JSON; ``parse(value, where)`` and
    ``dump(value)`` read and write a type that is not a record, such as the model's contract). Keys it does not
    declare stay in ``extra``; ``read_keys`` remembers the keys read, in order, so that writing gives back the same
    JSON."""

    extra: dict[str, Any] = field(default_factory=dict, kw_only=True, repr=False)
    read_keys: tuple[str, ...] = field(default=(), kw_only=True, repr=False, compare=False)

    # keys written even when None (when not read); ("*",): every key
    WRITE_NONE: ClassVar[tuple[str, ...]] = ()
    # keys that must be present when read (fields without a default are required too)
    REQUIRED: ClassVar[tuple[str, ...]] = ()
    # keys computed on writing (the attribute of that name; called when a method) and ignored on reading
    DERIVED: ClassVar[tuple[str, ...]] = ()
    # the order of keys a writer set (keys read keep their order); keys not listed follow in declaration order
    KEY_ORDER: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def _fields(cls) -> list[_Field]:
        """(field, JSON key, type, metadata) of each declared key."""
        return _fields_of(cls)

    @classmethod
    def keys(cls) -> set[str]:
        """Every JSON key this record reads (a flat record's keys included)."""
        out: set[str] = set()
        for _f, key, hint, meta in cls._fields():
            out |= hint.keys() if meta.flat else {key}
        return out

    @classmethod
    def from_dict(cls: type[R], data: dict, where: str = "details") -> R:
        """Parse ``data``; ArtifactError naming ``where``.key when a known key holds a value of the wrong type or a
        required key is missing (``where`` "": the keys' paths alone)."""
        if not isinstance(data, dict):
            raise ArtifactError(f"{where or 'the document'} is {_shown(data)}, expected an object")
        kwargs: dict[str, Any] = {}
        known: set[str] = set(cls.DERIVED)
        for f, key, hint, meta in cls._fields():
            if meta.flat:
                sub = {k: v for k, v in data.items() if k in hint.keys()}
                kwargs[f.name] = hint.from_dict(sub, where)
                known |= hint.keys()
                continue
            known.add(key)
            if key in data and meta.parse is not None:  # a type of its own: its reader checks and builds it
                kwargs[f.name] = meta.parse(data[key], at(where, key))
            elif key in data:
                kwargs[f.name] = parse(data[key], hint, at(where, key))
            elif key in cls.REQUIRED or (f.default is dataclasses.MISSING
                                         and f.default_factory is dataclasses.MISSING):
                raise ArtifactError(f"{at(where, key)} is missing, expected {_name(hint)}")
        record = cls(**kwargs, extra={k: v for k, v in data.items() if k not in known}, read_keys=tuple(data))
        record.validate(where)
        return record

    def validate(self, where: str) -> None:
        """Checks across fields (ArtifactError); the types are checked by :meth:`from_dict`."""

    def to_dict(self) -> dict:
        out: dict[str, Any] = {}
        for f, key, _, meta in self._fields():
            value = getattr(self, f.name)
            if meta.flat:
                out.update(value.to_dict())
            elif value is not None and meta.dump is not None:
                out[key] = meta.dump(value)
            elif value is not None or key in self.read_keys or key in self.WRITE_NONE or self.WRITE_NONE == ("*",):
                out[key] = dump(value)
        for key in self.DERIVED:
            value = getattr(self, key)
            out[key] = dump(value() if callable(value) else value)
        out.update(self.extra)
        rank = {k: i for i, k in enumerate(self.KEY_ORDER)}
        fresh = sorted((k for k in out if k not in self.read_keys), key=lambda k: rank.get(k, len(rank)))
        return {k: out[k] for k in [k for k in self.read_keys if k in out] + fresh}


@dataclass(frozen=True)
class FieldMeta:
    """A Record field's metadata, typed (the keys :class:`Record` documents): its JSON ``key``, ``flat``, ``json``,
    and a ``parse`` / ``dump`` of its own."""

    key: str
    flat: bool = False
    json: bool = True
    parse: Callable[[Any, str], Any] | None = None
    dump: Callable[[Any], Any] | None = None

    @classmethod
    def of(cls, f: dataclasses.Field) -> FieldMeta:
        unknown = set(f.metadata) - {"key", "flat", "json", "parse", "dump"}
        if unknown:
            raise TypeError(f"field {f.name}: unknown Record metadata {sorted(unknown)}")
        return cls(**{"key": f.name, **f.metadata})


class _Field(typing.NamedTuple):
    """A declared key: the dataclass field, its JSON key, its type and its metadata."""

    field: dataclasses.Field
    key: str
    hint: Any
    meta: FieldMeta


@functools.cache
def _fields_of(cls: type) -> list[_Field]:
    hints = typing.get_type_hints(cls)
    metas = {f.name: FieldMeta.of(f) for f in dataclasses.fields(cls) if f.name not in ("extra", "read_keys")}
    return [_Field(f, metas[f.name].key, hints[f.name], metas[f.name]) for f in dataclasses.fields(cls)
            if f.name in metas and metas[f.name].json]


def at(where: str, key: str | int) -> str:
    """The path of ``key`` under ``where``: ``a.b``, ``a[0]``; ``where`` "" is the document itself."""
    if isinstance(key, int):
        return f"{where}[{key}]"
    return f"{where}.{key}" if where else key


_JSON_NAMES = {dict: "an object", list: "an array", type(None): "null"}


def _shown(value: Any) -> str:
    if type(value) in _JSON_NAMES:
        return _JSON_NAMES[type(value)]
    text = repr(value)
    return f"{text if len(text) <= 40 else text[:37] + '...'} ({type(value).__name__})"


def _name(hint: Any) -> str:
    origin = typing.get_origin(hint)
    if origin in (types.UnionType, typing.Union):
        return " or ".join(dict.fromkeys(_name(a) for a in typing.get_args(hint)))
    if origin is Literal:
        names = [repr(a) for a in typing.get_args(hint)]
        return " or ".join(names) if len(names) < 3 else f"{', '.join(names[:-1])} or {names[-1]}"
    base = origin or hint
    args = typing.get_args(hint)
    if base in (list, tuple) and args and args[0] in (str, int, float, bool):
        return f"an array of {args[0].__name__}"
    if base in _JSON_NAMES or base is tuple:
        return _JSON_NAMES.get(base, "an array")
    if isinstance(base, type) and (issubclass(base, Record) or dataclasses.is_dataclass(base)):
        return "an object"
    return base.__name__ if isinstance(base, type) else str(hint)


# a JSON value's type; numbers bounded here, once for every record (core/numbers.py): an int within int64, a float
# within a float's range or one of the strings a figure that is not finite is written as ("NaN", "Infinity")
_OK = {int: lambda v: read_int(v) is not None,
       float: lambda v: read_float(v) is not None,
       str: lambda v: isinstance(v, str), bool: lambda v: isinstance(v, bool),
       list: lambda v: isinstance(v, list), dict: lambda v: isinstance(v, dict)}


def check_fields(cls: type, value: Any, where: str, *, required: bool = True) -> dict[str, Any]:
    """The JSON types of a plain dataclass's fields in object ``value``, checked against the dataclass's own
    annotations (one definition: no JSON twin of the class), each present field parsed; ``required``: a field
    without a default must be present. ArtifactError naming the key otherwise. Returns the parsed fields by name
    (other keys, such as a derived one the writer adds, are left alone)."""
    if not isinstance(value, dict):
        raise ArtifactError(f"{where or 'the document'} is {_shown(value)}, expected an object")
    hints = typing.get_type_hints(cls)
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        if f.name in value:
            out[f.name] = parse(value[f.name], hints[f.name], at(where, f.name))
        elif required and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ArtifactError(f"{at(where, f.name)} is missing, expected {_name(hints[f.name])}")
    return out


def parse(value: Any, hint: Any, where: str) -> Any:
    """``value`` checked against ``hint`` (records parsed, in lists and maps too), or ArtifactError naming
    ``where``."""
    origin = typing.get_origin(hint)
    if origin in (types.UnionType, typing.Union):
        arms = [a for a in typing.get_args(hint) if a is not type(None)]
        if value is None and len(arms) < len(typing.get_args(hint)):
            return None
        fits = [a for a in arms if _fits(value, a)]
        if len(fits) == 1:  # a mistake deeper inside is named where it is
            return parse(value, fits[0], where)
        for arm in fits:
            try:
                return parse(value, arm, where)
            except ArtifactError:
                pass
        raise ArtifactError(f"{where} is {_shown(value)}, expected {_name(hint)}{_bound(value, arms)}")
    if hint is Any:
        return value
    if origin is Literal:
        if value not in typing.get_args(hint) or isinstance(value, bool) != isinstance(typing.get_args(hint)[0], bool):
            raise ArtifactError(f"{where} is {_shown(value)}, expected {_name(hint)}")
        return value
    if isinstance(hint, type) and issubclass(hint, Record):
        return hint.from_dict(value, where)
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):  # a plain dataclass: its fields by name
        return hint(**check_fields(hint, value, where, required=False))
    base = origin or hint
    if base is tuple:  # tuple[X, ...]: a JSON array
        if not isinstance(value, list):
            raise ArtifactError(f"{where} is {_shown(value)}, expected an array")
        return tuple(parse(v, typing.get_args(hint)[0], at(where, i)) for i, v in enumerate(value))
    if not _OK[base](value):
        raise ArtifactError(f"{where} is {_shown(value)}, expected {_name(hint)}{_bound(value, [base])}")
    if base is float and isinstance(value, str):  # a figure that is not finite, as written
        return read_float(value)
    args = typing.get_args(hint)
    if base is list and args:
        return [parse(v, args[0], at(where, i)) for i, v in enumerate(value)]
    if base is dict and args:
        return {k: parse(v, args[1], at(where, k)) for k, v in value.items()}
    return value


def _bound(value: Any, types_: list) -> str:
    """The bound a refused number or string broke, said after "expected ..." ("" where the type alone says it)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return ""
    if float in types_:
        return " within a float's range"
    return f" within ±{MAX_INT}" if int in types_ and isinstance(value, int) else ""


def _fits(value: Any, hint: Any) -> bool:
    """Whether ``value`` is of ``hint``'s JSON type (its contents not looked at)."""
    origin = typing.get_origin(hint)
    if hint is Any:
        return True
    if origin is Literal:
        return value in typing.get_args(hint)
    if isinstance(hint, type) and (issubclass(hint, Record) or dataclasses.is_dataclass(hint)):
        return isinstance(value, dict)
    return isinstance(value, list) if (origin or hint) is tuple else _OK[origin or hint](value)


def dump(value: Any) -> Any:
    """``value`` as JSON data: records written with :meth:`Record.to_dict`, in lists and maps too."""
    if isinstance(value, Record):
        return value.to_dict()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: dump(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (list, tuple)):
        return [dump(v) for v in value]
    if isinstance(value, dict):
        return {k: dump(v) for k, v in value.items()}
    return jsonable(value)  # a float that is not finite as its string (valid JSON; read back by a float field)


@dataclass
class Environment(Record):
    """Where a report or a bench result was made (:func:`mhaexport.core.env.environment`, plus what a verb adds:
    ``torch_threads``, ``threads``, ``cuda_device``, kept in ``extra``)."""

    host: str | None = None
    platform: str | None = None
    machine: str | None = None
    cpu: str | None = None
    cpus: int | None = None
    python: str | None = None
    ci: bool | None = None
    date: str | None = None
