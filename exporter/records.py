"""What an export or quantize wrote, for scripts: the ``--json`` of ``mhaexport onnx|torchscript|pt2|quantize``.
Torch-free.

The shape is stable (``schema`` ``mhaexport.export/1``; docs/reference.md, "Output for scripts"): keys are only ever added.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

EXPORT_SCHEMA = "mhaexport.export/1"


@dataclass
class Replaced:
    """What an export with ``replace`` replaced in its folder: the model it held and the files that went."""

    what: str  # "a decoder" | "the attention block"
    spec: str
    fingerprint: str
    removed: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"what": self.what, "spec": self.spec, "fingerprint": self.fingerprint, "removed": list(self.removed)}


def record_dict(record: Any) -> dict:
    """One artifact written (an ExportRecord or a QuantizeRecord): its name, folder, main file, each file written
    with its bytes and sha256 (as the manifest records them), dtype, seconds, warnings and the manifest's details of
    how it was made; a quantized one adds ``quantization`` (the scheme, its nodes, the weight bytes read per token
    and the float source's)."""
    manifest = getattr(record, "manifest", None)
    entry = manifest.artifacts.get(record.artifact) if manifest is not None else None
    files = entry.files if entry is not None else {}
    out = {"artifact": record.artifact, "folder": str(record.folder),
           "file": entry.file if entry is not None else (record.files[0] if record.files else None),
           "files": {f: {"bytes": files.get(f, {}).get("bytes"), "sha256": files.get(f, {}).get("sha256")}
                     for f in record.files},
           "dtype": entry.dtype if entry is not None else None, "seconds": round(record.seconds, 3),
           "warnings": list(record.warnings),
           "details": entry.details.to_dict() if entry is not None and entry.details is not None else None}
    quantization = getattr(record, "quantization", None)
    if quantization is not None:
        out["quantization"] = quantization.to_dict()
    return out


def export_json(command: str, records: list) -> dict:
    """What ``mhaexport onnx|torchscript|pt2|quantize --json`` prints: ``schema``, ``command``, the ``model`` (spec,
    fingerprint), the ``manifests`` written, one entry per artifact written (:func:`record_dict`, in the order they
    were written) and ``replaced`` (the model a ``--replace`` replaced: what, spec, fingerprint, files removed; or
    null)."""
    manifests = [r.manifest for r in records if getattr(r, "manifest", None) is not None]
    model = manifests[-1].model if manifests else None
    replaced = next((r.replaced for r in records if getattr(r, "replaced", None) is not None), None)
    return {"schema": EXPORT_SCHEMA, "command": command,
            "model": None if model is None else {"spec": model.spec, "fingerprint": model.fingerprint},
            "manifests": list(dict.fromkeys(str(Path(r.folder) / "manifest.json") for r in records)),
            "artifacts": [record_dict(r) for r in records],
            "replaced": None if replaced is None else replaced.to_dict()}
