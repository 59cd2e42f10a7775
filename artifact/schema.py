"""The one convention for every JSON file mhaexport writes: ``"schema": "mhaexport.<kind>/<version>"``.

manifest.json (``mhaexport.manifest/2``; version 1 wrote ``"schema_version": 1``, still read), report.json
(``mhaexport.verify.report/2``; /1 still read) and bench.json (``mhaexport.bench/1``).
"""

from __future__ import annotations

from mhaexport.core.errors import ArtifactError

PREFIX = "mhaexport."


def tag(kind: str, version: int) -> str:
    """``tag("manifest", 2)`` -> ``"mhaexport.manifest/2"``."""
    return f"{PREFIX}{kind}/{version}"


def version_of(data: object, kind: str, readable: tuple[int, ...], what: str) -> int:
    """The schema version of ``data`` if it is a ``kind`` document this code reads, else ArtifactError naming
    what was found and what was expected. Version-1 manifests (``schema_version: 1``) are recognized too."""
    if isinstance(data, dict):
        found = data.get("schema")
        if found is None and kind == "manifest" and data.get("schema_version") == 1:
            found = tag("manifest", 1)
    else:
        found = type(data).__name__
    if isinstance(found, str) and found.startswith(f"{PREFIX}{kind}/"):
        try:
            version = int(found.rsplit("/", 1)[1])
        except ValueError:
            version = -1
        if version in readable:
            return version
    want = " or ".join(repr(tag(kind, v)) for v in readable)
    raise ArtifactError(f"{what} has schema {found!r}, expected {want}")
