"""The export folder, torch-free: manifest.json as typed objects, hashes, atomic writes, the folder lock and the
one way to write an artifact. Every other layer reads and writes export folders through this package."""

from __future__ import annotations

from mhaexport.artifact.files import (TWO_GB, atomic_write_bytes, atomic_write_json, ensure_free_space,
                                      ensure_writable_dir, read_json, sha256_file)
from mhaexport.artifact.folder import (ExportFolder, OpenFolders, Staging, lowering_of, opened, read_manifest,
                                       same_model_folders, shown_path, stage_artifact)
from mhaexport.artifact.lock import FolderLock
from mhaexport.artifact.manifest import (ArtifactEntry, Manifest, ModelRecord, fingerprint_of,
                                         legacy_fingerprint)

__all__ = ["TWO_GB", "ArtifactEntry", "ExportFolder", "FolderLock", "Manifest", "ModelRecord", "OpenFolders",
           "Staging", "opened",
           "atomic_write_bytes", "atomic_write_json", "ensure_free_space", "ensure_writable_dir", "fingerprint_of",
           "legacy_fingerprint", "lowering_of", "read_json", "read_manifest", "same_model_folders", "sha256_file",
           "shown_path", "stage_artifact"]
