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

``source`` says how to rebuild the eager model, with file paths relative to the export folder (never an absolute
path of the exporting machine). Version 1 (mhaexport 0.1: one top-level ``io`` for every artifact) is read and
upgraded in memory.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from mhaexport.artifact import schema
from mhaexport.artifact.confine import check_name
from mhaexport.artifact.details import Details, details_from_dict
from mhaexport.errors import ArtifactError, UntrustedInput
from mhaexport.iospec import Contract, ModuleContract, contract_from_dict
from mhaexport.untrusted import check_dims, shown

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


# The JSON types of the manifest's fields that code reads as such (issue 25: a crafted manifest is bad input named by
# its field, never a TypeError deep inside a verb). (type, ...): the types allowed; None among them: null allowed.
_STR, _INT, _OPT_STR, _OPT_DICT = (str,), (int,), (str, None), (dict, None)
_RECORD_TYPES = {"spec": _STR, "fingerprint": _STR, "contract": (dict,), "source": _OPT_DICT, "config": _OPT_DICT,
                 "checkpoint": _OPT_STR, "checkpoint_sha256": _OPT_STR, "weights_sha256": _OPT_STR}
_CONTRACT_TYPES = {"n_layers": _INT, "n_heads": _INT, "head_dim": _INT, "vocab_size": _INT, "max_positions": _INT,
                   "n_kv_heads": (int, None)}
_MODULE_TYPES = {"kind": _STR, "mask": _STR, "d_model": _INT, "n_heads": _INT, "n_kv_heads": _INT,
                 "max_positions": _INT}
_SOURCE_TYPES = {k: _OPT_STR for k in ("kind", "name", "file", "module", "callable", "path", "checkpoint", "repo_id",
                                       "commit", "revision")}
_ENTRY_TYPES = {"format": _STR, "file": _STR, "dtype": _STR, "files": (dict,), "io": _OPT_DICT,
                "seq_dynamic": (bool,), "static_sizes": _OPT_DICT, "versions": _OPT_DICT,
                "export_seconds": (int, float, None), "warnings": (list, None)}
_JSON = {dict: "an object", list: "an array", str: "a string", int: "an integer", float: "a number",
         bool: "true or false", None: "null"}


def check_types(data: object, types: dict[str, tuple], where: str) -> None:
    """ArtifactError naming ``where``.field when ``data`` is not an object or one of its ``types`` fields holds
    another JSON type (a missing field is left to the reader's own check). Integers are not booleans."""
    if not isinstance(data, dict):
        raise ArtifactError(f"manifest field {where}: expected an object, found {_shown(data)}")
    for key, allowed in types.items():
        if key not in data:
            continue
        value = data[key]
        ok = (value is None and None in allowed) or any(
            t is not None and isinstance(value, t) and (t is bool or not isinstance(value, bool)) for t in allowed)
        if not ok:
            raise ArtifactError(f"manifest field {where}.{key}: expected "
                                f"{' or '.join(_JSON[t] for t in allowed)}, found {_shown(value)}")


def _shown(value: object) -> str:
    if isinstance(value, (dict, list)) or value is None:
        return _JSON[type(value) if value is not None else None]
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


@dataclass
class ModelRecord:
    """The model an export folder was made from."""

    spec: str  # shown to people: "preset:small", "config:big", "factory:user_decoder.py:build"
    contract: Contract  # the decoder's ModelContract, or a ModuleContract for ``--module attention``
    fingerprint: str
    source: dict = field(default_factory=dict)  # how to rebuild it; paths relative to the export folder
    config: dict | None = None  # the built-in decoder's DecoderConfig fields
    checkpoint: str | None = None  # "shipped:small.pt", a file name, or None (the model's own weights)
    checkpoint_sha256: str | None = None
    weights_sha256: str | None = None
    legacy: bool = False  # read from a version-1 manifest (fingerprint in schema 1's formula)
    extra: dict = field(default_factory=dict)

    _KNOWN = ("spec", "contract", "fingerprint", "source", "config", "checkpoint", "checkpoint_sha256",
              "weights_sha256")
    # the source keys that hold a path, relative to the export folder: a factory file, a checkpoint, an --hf folder
    SOURCE_PATHS = ("file", "checkpoint", "path")

    def relocated(self, from_dir: str | Path, to_dir: str | Path) -> ModelRecord:
        """This record for a folder at ``to_dir`` (the same model; its source paths, relative to ``from_dir``,
        made relative to ``to_dir``)."""
        source = dict(self.source)
        for key in self.SOURCE_PATHS:
            if source.get(key):
                source[key] = os.path.relpath((Path(from_dir) / source[key]).resolve(), Path(to_dir).resolve())
        return dataclasses.replace(self, source=source, extra=dict(self.extra))

    @property
    def module(self) -> str | None:
        """The module exported on its own ("attention"), or None for a decoder."""
        return self.contract.kind if isinstance(self.contract, ModuleContract) else None

    def to_dict(self) -> dict:
        out = {"spec": self.spec, "contract": self.contract.to_dict(), "config": self.config, "source": self.source,
               "checkpoint": self.checkpoint, "checkpoint_sha256": self.checkpoint_sha256,
               "weights_sha256": self.weights_sha256, "fingerprint": self.fingerprint}
        return {**out, **self.extra}

    @classmethod
    def from_dict(cls, data: dict) -> ModelRecord:
        check_types(data, _RECORD_TYPES, "model")
        if isinstance(contract := data.get("contract"), dict):
            check_types(contract, _MODULE_TYPES if "kind" in contract else _CONTRACT_TYPES, "model.contract")
            check_dims(contract, "manifest field model.contract")
        check_types(data.get("source") or {}, _SOURCE_TYPES, "model.source")
        named = {"spec": data.get("spec"), "checkpoint": data.get("checkpoint"),
                 **{f"source.{k}": v for k, v in (data.get("source") or {}).items()}}
        for key, value in named.items():  # a path or name with a NUL: no file system takes it
            if isinstance(value, str) and "\0" in value:
                raise UntrustedInput(f"manifest field model.{shown(key)}: {value[:80]!r} holds a NUL: refused")
        try:
            contract = contract_from_dict(data["contract"])
            return cls(spec=str(data["spec"]), contract=contract, fingerprint=str(data["fingerprint"]),
                       source=dict(data.get("source") or {}), config=data.get("config"),
                       checkpoint=data.get("checkpoint"), checkpoint_sha256=data.get("checkpoint_sha256"),
                       weights_sha256=data.get("weights_sha256"),
                       extra={k: v for k, v in data.items() if k not in cls._KNOWN})
        except (KeyError, TypeError, ValueError) as e:
            raise ArtifactError(f"the manifest's model record is incomplete: {type(e).__name__}: {e}") from None


@dataclass
class ArtifactEntry:
    """One artifact (``onnx`` or ``torchscript``) in an export folder: its files, I/O schema and dtype, and how it
    was made. Format-specific details (opset, attention lowering, cache layout, precision, quantization, trace
    mode, ...) are typed records in ``details``: :class:`~mhaexport.artifact.details.OnnxDetails` or
    :class:`~mhaexport.artifact.details.TorchScriptDetails`."""

    format: str  # "onnx" | "torchscript"
    file: str  # the main file, e.g. "model.onnx"
    dtype: str  # dtype of the float inputs and outputs (KV cache, logits)
    io: dict  # {"inputs": {name: {"dtype", "shape"}}, "outputs": {...}}
    files: dict[str, dict] = field(default_factory=dict)  # every file: {name: {"sha256", "bytes"}}
    seq_dynamic: bool = True
    static_sizes: dict | None = None  # {sequence_length, past_sequence_length, total_sequence_length} if static
    versions: dict = field(default_factory=dict)  # tool versions that wrote it
    export_seconds: float | None = None
    warnings: list[str] = field(default_factory=list)
    details: Details = field(default_factory=Details)  # OnnxDetails | TorchScriptDetails

    _KNOWN = ("format", "file", "dtype", "io", "files", "seq_dynamic", "static_sizes", "versions", "export_seconds",
              "warnings")

    @property
    def fixed_sizes(self) -> tuple[int, int] | None:
        """(sequence_length, past_sequence_length) of a static export, None for a dynamic one."""
        if self.seq_dynamic or not self.static_sizes:
            return None
        from mhaexport import iospec

        return int(self.static_sizes[iospec.SEQ]), int(self.static_sizes[iospec.PAST])

    def input_dtype(self, name: str) -> str:
        """The recorded dtype of input ``name`` (ArtifactError when the schema does not list it)."""
        try:
            return str(self.io["inputs"][name]["dtype"])
        except KeyError:
            raise ArtifactError(f"the {self.format} artifact's I/O schema has no input {name!r}") from None

    def to_dict(self) -> dict:
        out = {k: getattr(self, k) for k in self._KNOWN}
        return {**out, **self.details.to_dict()}

    @classmethod
    def from_dict(cls, data: dict, where: str = "artifact") -> ArtifactEntry:
        """Parse one entry; ArtifactError for a missing key or a detail of the wrong type (naming ``where``.key)."""
        check_types(data, _ENTRY_TYPES, where)
        for key, value in (data.get("static_sizes") or {}).items():
            check_types({key: value}, {key: (int,)}, f"{where}.static_sizes")
        try:
            fmt = str(data["format"])
            files = _files(data["files"], where)
            main = check_name(data["file"], f"{where}.file")
            if main not in files:
                raise ArtifactError(f"{where}.file: {main!r} is not one of the files it lists ({', '.join(files)})")
            details = details_from_dict(fmt, {k: v for k, v in data.items() if k not in cls._KNOWN}, where)
            return cls(format=fmt, file=main, dtype=str(data.get("dtype", "float32")),
                       io=dict(data.get("io") or {}), files=files,
                       seq_dynamic=bool(data.get("seq_dynamic", True)), static_sizes=data.get("static_sizes"),
                       versions=dict(data.get("versions") or {}), export_seconds=data.get("export_seconds"),
                       warnings=list(data.get("warnings") or []),
                       details=details)
        except (KeyError, TypeError, ValueError) as e:
            raise ArtifactError(f"an artifact entry of the manifest is incomplete: {type(e).__name__}: {e}") from None


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
            data = _upgrade_v1(data)
        arts = data.get("artifacts")
        if not isinstance(arts, dict) or not isinstance(data.get("model"), dict):
            raise ArtifactError(f"{what} has no model record or artifacts map")
        model = ModelRecord.from_dict(data["model"])
        model.legacy = version == 1
        return cls(model=model, version=version,
                   artifacts={k: ArtifactEntry.from_dict(v, f"{what}: artifacts.{k}") for k, v in arts.items()})

    def with_artifact(self, name: str, entry: ArtifactEntry | None) -> Manifest:
        """A copy with ``name``'s entry replaced (or removed when ``entry`` is None)."""
        arts = {k: v for k, v in self.artifacts.items() if k != name}
        if entry is not None:
            arts[name] = entry
        return dataclasses.replace(self, artifacts=arts)


def _upgrade_v1(data: dict) -> dict:
    """Schema 1 -> 2 in memory: the top-level ``io`` goes to each artifact (TorchScript was always float32), the
    top-level versions too; the model keeps schema 1's fingerprint (``legacy``) and its rebuild arguments."""
    model = dict(data.get("model") or {})
    io = data.get("io") or {}
    arts = {}
    for name, entry in (data.get("artifacts") or {}).items():
        entry = dict(entry)
        dtype = entry.get("dtype", "float32")
        art_io = json.loads(json.dumps(io))  # a deep copy per artifact
        for part in art_io.values():
            for spec in part.values():
                if spec.get("dtype") not in ("int64", "int32"):
                    spec["dtype"] = dtype
        entry.setdefault("io", art_io)
        entry.setdefault("versions", data.get("versions") or {})
        arts[name] = entry
    rebuild = model.get("rebuild") or {}
    source: dict = {"kind": (model.get("spec") or "").partition(":")[0], "v1_rebuild": rebuild}
    upgraded = {"spec": model.get("spec", "?"), "contract": model.get("contract", {}), "config": model.get("config"),
                "source": source, "checkpoint": model.get("checkpoint"),
                "checkpoint_sha256": model.get("checkpoint_sha256"), "weights_sha256": None,
                "fingerprint": data.get("model_fingerprint", "")}
    return {"model": upgraded, "artifacts": arts}
