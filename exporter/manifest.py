"""The export folder's manifest.json: what was exported, how, and the sha256 of every file.

Torch-free: the deploy runtime reads it too. Files are written to a temporary name and renamed, so an
interrupted export never leaves a file that looks complete; readers check hashes before trusting a file.

One folder may hold several artifacts of the same model (``onnx``, ``torchscript``): each export adds or
replaces its own entry. Exporting a different model into a folder drops the other model's entries.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from pathlib import Path

from mhaexport.errors import ArtifactError
from mhaexport.iospec import ModelContract

SCHEMA_VERSION = 1
MANIFEST = "manifest.json"


def sha256_file(path: str | Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write to a temporary file in the same folder, fsync, then rename over ``path``."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o644)  # mkstemp makes 0600; an export is read by other users and services
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def atomic_write_json(path: str | Path, data: dict) -> None:
    atomic_write_bytes(path, (json.dumps(data, indent=2, sort_keys=False) + "\n").encode())


def ensure_writable_dir(path: str | Path) -> Path:
    """Create the output folder if needed and prove it is writable, or raise ArtifactError."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".probe-"):
            pass
    except OSError as e:
        raise ArtifactError(f"output folder {path} is not writable: {e.strerror or e}") from None
    return path


def model_fingerprint(model: dict) -> str:
    """Identity of the exported model: its spec, contract, config and weights."""
    key = {k: model.get(k) for k in ("spec", "contract", "config", "checkpoint_sha256")}
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def read_manifest(folder: str | Path) -> dict:
    folder = Path(folder)
    if not folder.is_dir():
        raise ArtifactError(f"export folder {folder} does not exist")
    path = folder / MANIFEST
    if not path.is_file():
        raise ArtifactError(f"{folder} has no {MANIFEST}: not an export folder (run `mhaexport onnx -o {folder}`)")
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ArtifactError(f"{path} is not readable JSON: {e}") from None
    if not isinstance(data, dict) or data.get("schema_version") != SCHEMA_VERSION:
        raise ArtifactError(f"{path} has schema_version {data.get('schema_version') if isinstance(data, dict) else None!r},"
                            f" expected {SCHEMA_VERSION}")
    return data


def contract_from_manifest(manifest: dict) -> ModelContract:
    return ModelContract.from_dict(manifest["model"]["contract"])


def verify_files(folder: str | Path, manifest: dict, artifact: str | None = None) -> None:
    """Check that every file of ``artifact`` (or of all artifacts) exists and matches its recorded sha256."""
    folder = Path(folder)
    names = list(manifest.get("artifacts", {})) if artifact is None else [artifact]
    for name in names:
        entry = manifest.get("artifacts", {}).get(name)
        if entry is None:
            raise ArtifactError(f"{folder} holds no {name} export (manifest lists: "
                                f"{', '.join(manifest.get('artifacts', {})) or 'nothing'})")
        for fname, meta in entry["files"].items():
            path = folder / fname
            if not path.is_file():
                raise ArtifactError(f"{path} is missing: the manifest lists it for the {name} export")
            size = path.stat().st_size
            if size != meta["bytes"]:
                raise ArtifactError(f"{path} has {size} bytes, the manifest recorded {meta['bytes']}: "
                                    "truncated or altered, re-export it")
            digest = sha256_file(path)
            if digest != meta["sha256"]:
                raise ArtifactError(f"{path} sha256 {digest[:12]}… does not match the manifest's "
                                    f"{meta['sha256'][:12]}…: altered after export, re-export it")


def load_verified(folder: str | Path, artifact: str | None = None) -> dict:
    """Read the manifest and check the hashes of ``artifact``'s files (all artifacts when None)."""
    manifest = read_manifest(folder)
    verify_files(folder, manifest, artifact)
    return manifest


def file_entries(folder: Path, names: list[str]) -> dict:
    return {n: {"sha256": sha256_file(folder / n), "bytes": (folder / n).stat().st_size} for n in names}


def record_artifact(folder: str | Path, *, model: dict, io: dict, artifact: str, entry: dict, files: list[str],
                    versions: dict) -> dict:
    """Add or replace ``artifact``'s entry in folder/manifest.json (hashing ``files``); returns the manifest."""
    folder = Path(folder)
    old = None
    with contextlib.suppress(ArtifactError, KeyError):
        old = read_manifest(folder)
    fingerprint = model_fingerprint(model)
    artifacts = {}
    if old is not None and old.get("model_fingerprint") == fingerprint:
        artifacts = {k: v for k, v in old.get("artifacts", {}).items() if k != artifact}
    artifacts[artifact] = {**entry, "files": file_entries(folder, files)}
    manifest = {
        "schema_version": SCHEMA_VERSION,
        "model": model,
        "model_fingerprint": fingerprint,
        "io": io,
        "artifacts": artifacts,
        "versions": versions,
    }
    atomic_write_json(folder / MANIFEST, manifest)
    return manifest


def forget_artifact(folder: str | Path, artifact: str) -> None:
    """Drop ``artifact``'s entry before its files are replaced, so a crash mid-export leaves nothing trusted."""
    folder = Path(folder)
    try:
        old = read_manifest(folder)
    except ArtifactError:
        return
    if artifact in old.get("artifacts", {}):
        del old["artifacts"][artifact]
        atomic_write_json(folder / MANIFEST, old)
