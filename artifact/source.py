"""How to rebuild the model an export folder was made from — the model record's ``source`` — as one typed record per
kind, parsed once where the manifest is read (and made once where a model is loaded: ``LoadedModel.origin``).
Torch-free.

On disk (paths relative to the export folder; in a LoadedModel's ``origin``, absolute)::

    {"kind": "preset", "name": "small", "checkpoint"?: path, "block"?: "blocks.0.attn"}      PresetSource
    {"kind": "config", "checkpoint"?: path, "block"?: ...}     (the fields: the record's config) ConfigSource
    {"kind": "factory", "file": path | "module": name, "callable": name, "checkpoint"?: path}  FactorySource
    {"kind": "hf", "path": path, "model_type", "architecture"}                                    HfSource
    {"kind": "hf", "repo_id", "revision", "commit", "model_type", "architecture"}  (a Hub model)  HfSource
    {"kind": <the spec's prefix>, "v1_rebuild": {"model", "config", "checkpoint", "cwd"}}         LegacySource

A kind this code does not know reads as :class:`Source` itself (kept as read, written back, refused when the
model is rebuilt). Reading checks every key's type and refuses a value holding a NUL (no file system takes it).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Callable, ClassVar, Literal

from mhaexport.artifact.record import R, Record, at
from mhaexport.core.errors import ArtifactError, UntrustedInput
from mhaexport.core.untrusted import shown


@dataclass
class Source(Record):
    """A model's source: its ``kind`` and the checkpoint loaded into it (a path). Reading this class dispatches on
    ``kind`` to the record of that kind."""

    kind: str | None = None
    checkpoint: str | None = None  # the checkpoint file loaded into the model

    PATHS: ClassVar[tuple[str, ...]] = ("checkpoint",)  # the keys that hold a file system path
    KEY_ORDER = ("kind", "name", "file", "module", "callable", "path", "model_type", "architecture", "repo_id",
                 "revision", "commit", "checkpoint", "block", "v1_rebuild")

    @classmethod
    def from_dict(cls: type[R], data: dict, where: str = "source") -> R:
        if cls is Source and isinstance(data, dict):
            kind = data.get("kind")
            sub = LegacySource if "v1_rebuild" in data else KINDS.get(kind) if isinstance(kind, str) else None
            if sub is not None:
                return sub.from_dict(data, where)
        return super().from_dict(data, where)

    def validate(self, where: str) -> None:
        for key, value in self.to_dict().items():  # a path or name with a NUL: no file system takes it
            if isinstance(value, str) and "\0" in value:
                raise UntrustedInput(f"{at(where, shown(key))}: {value[:80]!r} holds a NUL: refused")

    def with_paths(self, move: Callable[[str], str]) -> Source:
        """A copy with each path it holds passed through ``move`` (absolute -> relative to a folder, or one folder's
        relative path -> another's)."""
        moved = {key: move(getattr(self, key)) for key in self.PATHS if getattr(self, key)}
        return dataclasses.replace(self, **moved, extra=dict(self.extra))

    @property
    def code(self) -> str | None:
        """What code rebuilding the model would import and run, in words, or None when the source is data only."""
        return None


@dataclass
class BuiltinSource(Source):
    """mhaexport's own decoder; ``block``: the attention block taken from it (``--module attention``)."""

    block: str | None = None


@dataclass
class PresetSource(BuiltinSource):
    """A built-in preset by name (with its shipped or seeded weights unless a checkpoint is given)."""

    kind: Literal["preset"] = "preset"
    name: str = ""

    REQUIRED = ("name",)


@dataclass
class ConfigSource(BuiltinSource):
    """The built-in decoder of a JSON config: its fields are the model record's ``config``."""

    kind: Literal["config"] = "config"


@dataclass
class FactorySource(Source):
    """A user's factory, imported and called: in a file (a path) or a module (by name). Code: rebuilt only on
    trust."""

    kind: Literal["factory"] = "factory"
    callable: str = ""
    file: str | None = None
    module: str | None = None

    REQUIRED = ("callable",)
    PATHS = ("checkpoint", "file")

    def validate(self, where: str) -> None:
        super().validate(where)
        if (self.file is None) == (self.module is None):
            raise ArtifactError(f"{where}: a factory source names a file or a module (one of them), found "
                                f"{'both' if self.file else 'neither'}")

    @property
    def code(self) -> str:
        if self.file is not None:
            return f"the factory file {self.file}:{self.callable}"
        return f"the module {self.module}:{self.callable}"


@dataclass
class HfSource(Source):
    """A Hugging Face model: a folder (a path) or a Hub model by id, revision and commit (its snapshot path is the
    loading machine's, never recorded)."""

    kind: Literal["hf"] = "hf"
    path: str | None = None
    model_type: str | None = None
    architecture: str | None = None
    repo_id: str | None = None
    revision: str | None = None
    commit: str | None = None

    PATHS = ("checkpoint", "path")

    def validate(self, where: str) -> None:
        super().validate(where)
        if not self.path and not self.repo_id:
            raise ArtifactError(f"{where}: a Hugging Face source names a folder (path) or a Hub model (repo_id), "
                                "found neither")

    @property
    def label(self) -> str:
        """``LlamaForCausalLM (llama)``."""
        return f"{self.architecture or '?'} ({self.model_type or '?'})"


@dataclass
class V1Rebuild(Record):
    """A schema-1 manifest's rebuild arguments, as mhaexport 0.1 wrote them (absolute paths)."""

    model: str | None = None
    config: str | None = None
    checkpoint: str | None = None
    cwd: str | None = None  # the exporting working directory (where a factory module was imported from)


@dataclass
class LegacySource(Source):
    """A schema-1 folder's source (upgraded in memory): ``kind`` the spec's prefix, and its rebuild arguments."""

    v1_rebuild: V1Rebuild = field(default_factory=V1Rebuild)


KINDS: dict[str, type[Source]] = {"preset": PresetSource, "config": ConfigSource, "factory": FactorySource,
                                  "hf": HfSource}
