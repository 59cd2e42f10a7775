"""An ONNX file's external-data locations, confined to the files its artifact hashes (docs/DESIGN.md, "Folders from
elsewhere"): ONNX Runtime would read weights from wherever a location leads, and onnx has had path-traversal CVEs
here. The reader's snapshot holds only hashed files and ONNX Runtime refuses an absolute location or one that leaves
the model's folder; this check names the entry in one line before any runtime loads the file."""

from __future__ import annotations

from pathlib import Path

import onnx
from onnx.external_data_helper import _get_all_tensors

from mhaexport.artifact import ExportFolder
from mhaexport.artifact.confine import check_name
from mhaexport.artifact.manifest import FILENAME
from mhaexport.core.errors import UnsafeFolder, UntrustedInput
from mhaexport.core.graph import tensor_size_error
from mhaexport.core.untrusted import shown


def external_data_names(onnx_path: str | Path, tensors: list | None = None) -> list[str]:
    """The external-data locations an ONNX file names (initializers and tensor attributes, subgraphs included), in
    first-reference order; the file is parsed without its data (``tensors``: its tensors, already read)."""
    if tensors is None:
        from mhaexport.runners.wire import read_graph

        tensors = list(_get_all_tensors(read_graph(onnx_path)[0]))
    found: list[str] = []
    for t in tensors:
        if t.data_location == onnx.TensorProto.EXTERNAL:
            loc = next((e.value for e in t.external_data if e.key == "location"), "")
            if loc not in found:
                found.append(loc)
    return found


def check_tensors(tensors, where: str | Path, stored: dict[str, tuple[int, int]] | None = None) -> None:
    """UntrustedInput naming ``where`` and the tensor when an in-file tensor's dims disagree with its data (or are
    negative): refused before lint's rules or a runtime read it (numpy would raise, or allocate what the dims
    claim). ``tensors``: a ModelProto's tensors (``_get_all_tensors``: its main graph's initializers first), or the
    ModelProto itself; ``stored``: the main-graph initializers whose bytes ``runners.wire.read_graph`` left in the
    file, with (offset, byte count) — their count is checked instead."""
    main = 0
    if isinstance(tensors, onnx.ModelProto):
        main = len(tensors.graph.initializer) if stored else 0
        tensors = _get_all_tensors(tensors)
    for i, t in enumerate(tensors):
        left = stored.get(t.name) if i < main and not t.raw_data else None
        if (why := tensor_size_error(t, None if left is None else left[1])) is not None:
            raise UntrustedInput(f"{where}: tensor {shown(t.name)!r}: {why}: refused")


def check_external_data(ef: ExportFolder, artifact: str = "onnx") -> None:
    """UnsafeFolder unless every external-data location of each ONNX file of ``ef``'s ``artifact`` is one of the
    artifact's hashed files. A file onnx cannot parse is left to the runtimes, which report it."""
    from mhaexport.runners.wire import read_graph

    if not ef.has(artifact):
        return
    entry = ef.entry(artifact)
    where = f"{ef.path / FILENAME}: artifacts.{artifact}"
    for fname in entry.files:
        if not fname.endswith(".onnx") or not ef.file(artifact, fname).is_file():
            continue
        try:
            model, stored = read_graph(ef.file(artifact, fname))
            tensors = list(_get_all_tensors(model))
        except Exception:  # noqa: BLE001 - protobuf's DecodeError and friends: an unreadable file, reported later
            continue
        check_tensors(model, ef.path / fname, stored)
        locations = external_data_names(ef.file(artifact, fname), tensors)
        for loc in locations:
            check_name(loc, f"{ef.path / fname}: external data")
            if loc not in entry.files:
                raise UnsafeFolder(f"{ef.path / fname}: external data {loc!r} is not one of the files {where} "
                                   "hashes: refused")
