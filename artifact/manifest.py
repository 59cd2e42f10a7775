"""manifest.json as typed objects: what was exported (the model and how to rebuild it) and, per artifact, its files
with their hashes, its I/O schema and dtype, and how it was made. Torch-free.

Schema ``mhaexport.manifest/2``::

    {"schema": "mhaexport.manifest/2",
     "model": {"spec", "contract", "config", "source", "checkpoint", "checkpoint_sha256", "weights_sha256",
               "fingerprint"},
     "artifacts": {"onnx": {"format", "file", "files": {name: {"sha256", "bytes"}}, "dtype", "io",
                            "seq_dynamic", "static_sizes", "versions", "export_seconds", "warnings", ...details},
                   "torchscript": {...}}}

``...details`` (opset, attention, kv_cache, quantization, mode, ...) are read into typed records
(:mod:`mhaexport.artifact.details`) and written back key for key.

``source`` says how to rebuild the eager model, one typed record per kind (:mod:`mhaexport.artifact.source`), with
file paths relative to the export folder (never an absolute path of the exporting machine). The model record and the
entries are :class:`~mhaexport.artifact.record.Record` s: reading checks every key's type, naming its path
(``manifest.json: model.contract.n_layers is '2' (str), expected int``). Version 1 (mhaexport 0.1: one top-level
``io`` for every artifact) is read as records too and upgraded in memory.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mhaexport.artifact import schema
from mhaexport.artifact.confine import check_name
from mhaexport.artifact.details import Details, details_from_dict
from mhaexport.artifact.record import Record, at, check_fields
from mhaexport.artifact.source import LegacySource, Source, V1Rebuild
from mhaexport.core.errors import ArtifactError, UntrustedInput
from mhaexport.core.iospec import Contract, ModelContract, ModuleContract, contract_from_dict
from mhaexport.core.untrusted import check_dims

KIND = "manifest"
VERSION = 2
READABLE = (1, 2)
FILENAME = "manifest.json"


def fingerprint_of(contract: Contract, weights_sha256: str | None, config: dict | None = None) -> str:
    """The model's identity: its contract and the sha256 of its weights (and, without weights, its config)."""
    key = {"contract": contract.to_dict(), "weights_sha256": weights_sha256,
           "config": None if weights_sha256 else config}
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def legacy_fingerprint(spec: str, contract: dict, config: dict | None, checkpoint_sha256: str | None) -> str:
    """Schema 1's fingerprint (spec, contract, config, checkpoint hash), to recognize a version-1 folder's model."""
    key = {"spec": spec, "contract": contract, "config": config, "checkpoint_sha256": checkpoint_sha256}
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def _contract(value: object, where: str) -> Contract:
    """A recorded contract read: its JSON types (ArtifactError naming the key), its sizes within what mhaexport
    runs (UntrustedInput), then the contract itself (a module's when it has ``kind``, else the decoder's)."""
    check_fields(ModuleContract if isinstance(value, dict) and "kind" in value else ModelContract, value, where)
    check_dims(value, where)
    try:
        return contract_from_dict(value)
    except (KeyError, TypeError, ValueError) as e:
        raise ArtifactError(f"{where}: {type(e).__name__}: {e}") from None


def _no_nul(record: Record, keys: tuple[str, ...], where: str) -> None:
    """UntrustedInput when a name or path among ``keys`` holds a NUL: no file system takes it."""
    for key in keys:
        value = getattr(record, key)
        if isinstance(value, str) and "\0" in value:
            raise UntrustedInput(f"{at(where, key)}: {value[:80]!r} holds a NUL: refused")


@dataclass
class ModelRecord(Record):
    """The model an export folder was made from."""

    spec: str  # shown to people: "preset:small", "config:big", "factory:user_decoder.py:build"
    # the decoder's ModelContract, or a ModuleContract for ``--module attention``
    contract: Contract = field(metadata={"parse": _contract, "dump": lambda c: c.to_dict()})
    fingerprint: str
    # how to rebuild it, one record per kind; paths relative to the export folder (null reads as an empty source)
    source: Source | None = field(default_factory=Source)
    config: dict[str, Any] | None = None  # the built-in decoder's DecoderConfig fields
    checkpoint: str | None = None  # "shipped:small.pt", a file name, or None (the model's own weights)
    checkpoint_sha256: str | None = None
    weights_sha256: str | None = None
    # read from a version-1 manifest (fingerprint in schema 1's formula)
    legacy: bool = field(default=False, metadata={"json": False})

    WRITE_NONE = ("*",)
    KEY_ORDER = ("spec", "contract", "config", "source", "checkpoint", "checkpoint_sha256", "weights_sha256",
                 "fingerprint")

    def validate(self, where: str) -> None:
        if self.source is None:
            self.source = Source()
        _no_nul(self, ("spec", "checkpoint"), where)

    @property
    def random_weights(self) -> str | None:
        """Why this model's weights are random — a built-in preset or config exported without a checkpoint (its
        seeded init) — or None where they may be trained (a checkpoint, shipped weights, a user's module, an --hf
        folder)."""
        if self.checkpoint is None and self.source is not None and self.source.kind in ("preset", "config"):
            return f"{self.spec} has random weights (its seeded init: no checkpoint)"
        return None

    def relocated(self, from_dir: str | Path, to_dir: str | Path) -> ModelRecord:
        """This record for a folder at ``to_dir`` (the same model; its source paths, relative to ``from_dir``,
        made relative to ``to_dir``)."""
        def move(path: str) -> str:
            return os.path.relpath((Path(from_dir) / path).resolve(), Path(to_dir).resolve())

        return dataclasses.replace(self, source=self.source.with_paths(move), extra=dict(self.extra))

    @property
    def module(self) -> str | None:
        """The module exported on its own ("attention"), or None for a decoder."""
        return self.contract.kind if isinstance(self.contract, ModuleContract) else None


@dataclass
class ArtifactEntry(Record):
    """One artifact (``onnx`` or ``torchscript``) in an export folder: its files, I/O schema and dtype, and how it
    was made. Format-specific details (opset, attention lowering, cache layout, precision, quantization, trace
    mode, ...) are typed records in ``details``: :class:`~mhaexport.artifact.details.OnnxDetails` or
    :class:`~mhaexport.artifact.details.TorchScriptDetails` (the entry's other keys, read by :meth:`from_dict`)."""

    format: str  # "onnx" | "torchscript"
    file: str  # the main file, e.g. "model.onnx"
    dtype: str = "float32"  # dtype of the float inputs and outputs (KV cache, logits)
    # {"inputs": {name: {"dtype", "shape"}}, "outputs": {...}}; null reads as {}
    io: dict[str, Any] | None = field(default_factory=dict)
    files: dict[str, dict] = field(default_factory=dict)  # every file: {name: {"sha256", "bytes"}}
    seq_dynamic: bool = True
    static_sizes: dict[str, int] | None = None  # {sequence_length, past_sequence_length, total_sequence_length}
    versions: dict[str, Any] | None = field(default_factory=dict)  # tool versions that wrote it; null reads as {}
    export_seconds: float | None = None
    warnings: list[str] | None = field(default_factory=list)  # null reads as []
    details: Details = field(default_factory=Details, metadata={"json": False})  # OnnxDetails | TorchScriptDetails

    WRITE_NONE = ("*",)
    REQUIRED = ("files",)
    KEY_ORDER = ("format", "file", "dtype", "io", "files", "seq_dynamic", "static_sizes", "versions",
                 "export_seconds", "warnings")

    @property
    def fixed_sizes(self) -> tuple[int, int] | None:
        """(sequence_length, past_sequence_length) of a static export, None for a dynamic one."""
        if self.seq_dynamic or not self.static_sizes:
            return None
        from mhaexport.core import iospec

        return int(self.static_sizes[iospec.SEQ]), int(self.static_sizes[iospec.PAST])

    def input_dtype(self, name: str) -> str:
        """The recorded dtype of input ``name`` (ArtifactError when the schema does not list it)."""
        try:
            return str(self.io["inputs"][name]["dtype"])
        except KeyError:
            raise ArtifactError(f"the {self.format} artifact's I/O schema has no input {name!r}") from None

    def to_dict(self) -> dict:
        return {**super().to_dict(), **self.details.to_dict()}

    @classmethod
    def from_dict(cls, data: dict, where: str = "artifact") -> ArtifactEntry:
        """Parse one entry: its own keys (ArtifactError naming ``where``.key for a missing key or one of the wrong
        type, UnsafeFolder for a file name outside the folder), the rest its format's details."""
        if not isinstance(data, dict):
            return super().from_dict(data, where)  # the refusal: not an object
        own = cls.keys()
        entry = super().from_dict({k: v for k, v in data.items() if k in own}, where)
        entry.details = details_from_dict(entry.format, {k: v for k, v in data.items() if k not in own}, where)
        return entry

    def validate(self, where: str) -> None:
        self.io = self.io or {}
        self.versions = self.versions or {}
        self.warnings = self.warnings or []
        self.files = _files(self.files, where)
        self.file = check_name(self.file, f"{where}.file")
        if self.file not in self.files:
            raise ArtifactError(f"{where}.file: {self.file!r} is not one of the files it lists "
                                f"({', '.join(self.files)})")


_SHA256 = re.compile(r"^[0-9a-f]{64}$")


def _files(files: object, where: str) -> dict[str, dict]:
    """An entry's ``files`` map checked: every name a plain relative name inside the folder (UnsafeFolder
    otherwise), every record a sha256 (64 hex digits) and a byte count (ArtifactError naming the field)."""
    if not isinstance(files, dict) or not files:
        raise ArtifactError(f"{where}.files: expected a map of file name -> {{sha256, bytes}}, found "
                            f"{type(files).__name__ if files else 'nothing'}")
    out = {}
    for name, meta in files.items():
        check_name(name, f"{where}.files")
        field_ = f"{where}.files[{name!r}]"
        if not isinstance(meta, dict):
            raise ArtifactError(f"{field_}: expected {{sha256, bytes}}, found {type(meta).__name__}")
        sha, size = meta.get("sha256"), meta.get("bytes")
        if not isinstance(sha, str) or not _SHA256.match(sha):
            raise ArtifactError(f"{field_}.sha256: expected 64 hex digits, found {sha!r}")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise ArtifactError(f"{field_}.bytes: expected a byte count, found {size!r}")
        out[name] = dict(meta)
    return out


@dataclass
class Manifest:
    """The whole manifest.json: one model, its artifacts."""

    model: ModelRecord
    artifacts: dict[str, ArtifactEntry] = field(default_factory=dict)
    version: int = VERSION  # the schema version it was read from (written: always VERSION)

    def to_dict(self) -> dict:
        return {"schema": schema.tag(KIND, VERSION), "model": self.model.to_dict(),
                "artifacts": {k: v.to_dict() for k, v in self.artifacts.items()}}

    @classmethod
    def from_dict(cls, data: dict, what: str = FILENAME) -> Manifest:
        version = schema.version_of(data, KIND, READABLE, what)
        if version == 1:
            data = _upgrade_v1(data, what)
        arts = data.get("artifacts")
        if not isinstance(arts, dict) or not isinstance(data.get("model"), dict):
            raise ArtifactError(f"{what} has no model record or artifacts map")
        model = ModelRecord.from_dict(data["model"], f"{what}: model")
        model.legacy = version == 1
        return cls(model=model, version=version,
                   artifacts={k: ArtifactEntry.from_dict(v, f"{what}: artifacts.{k}") for k, v in arts.items()})

    def with_artifact(self, name: str, entry: ArtifactEntry | None) -> Manifest:
        """A copy with ``name``'s entry replaced (or removed when ``entry`` is None)."""
        arts = {k: v for k, v in self.artifacts.items() if k != name}
        if entry is not None:
            arts[name] = entry
        return dataclasses.replace(self, artifacts=arts)


@dataclass
class _V1Tensor(Record):
    """A schema-1 I/O entry (``io.inputs.<name>``)."""

    dtype: str | None = None
    shape: list[Any] | None = None


@dataclass
class _V1Entry(Record):
    """What a schema-1 artifact entry says beyond a schema-2 one's keys (its dtype; no io, no versions)."""

    dtype: str = "float32"
    io: dict[str, Any] | None = None
    versions: dict[str, Any] | None = None


@dataclass
class _V1Model(Record):
    """A schema-1 model record: no source, its rebuild arguments instead."""

    spec: str = "?"
    contract: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] | None = None
    checkpoint: str | None = None
    checkpoint_sha256: str | None = None
    rebuild: V1Rebuild | None = None


@dataclass
class _V1Manifest(Record):
    """A schema-1 manifest (mhaexport 0.1): one top-level ``io`` and ``versions`` for every artifact."""

    model: _V1Model = field(default_factory=_V1Model)
    io: dict[str, dict[str, _V1Tensor]] | None = None
    artifacts: dict[str, _V1Entry] = field(default_factory=dict)
    versions: dict[str, Any] | None = None
    model_fingerprint: str = ""


def _upgrade_v1(data: dict, what: str) -> dict:
    """Schema 1 -> 2 in memory: the top-level ``io`` goes to each artifact (TorchScript was always float32), the
    top-level versions too; the model keeps schema 1's fingerprint (``legacy``) and its rebuild arguments."""
    v1 = _V1Manifest.from_dict(data, f"{what} (schema 1)")
    arts = {}
    for name, entry in v1.artifacts.items():
        if entry.io is None:  # the top-level io, its float tensors in the artifact's dtype
            entry.io = {part: {n: dataclasses.replace(t, dtype=t.dtype if t.dtype in ("int64", "int32")
                                                      else entry.dtype).to_dict() for n, t in specs.items()}
                        for part, specs in (v1.io or {}).items()}
        if entry.versions is None:
            entry.versions = v1.versions or {}
        arts[name] = entry.to_dict()
    m = v1.model
    source = LegacySource(kind=m.spec.partition(":")[0], v1_rebuild=m.rebuild or V1Rebuild())
    upgraded = {"spec": m.spec, "contract": m.contract, "config": m.config, "source": source.to_dict(),
                "checkpoint": m.checkpoint, "checkpoint_sha256": m.checkpoint_sha256, "weights_sha256": None,
                "fingerprint": v1.model_fingerprint}
    return {"model": upgraded, "artifacts": arts}
