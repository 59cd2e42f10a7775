"""Bisect's divergence on the graph: Google Model Explorer's node data for the ONNX file (``model-explorer FILE
--node_data_paths=NODE_DATA.json``, the viewer from the ``model-explorer-onnx`` package).

The file is Model Explorer's ``GraphNodeData`` JSON (model_explorer/node_data_builder.py): ``results`` keyed by a
node's output tensor name (the ONNX value bisect compared) with ``value`` the relative error max|onnx - eager| /
max|eager| (and each attention step bisect compared inside the culprit), coloured by ``thresholds`` (within bisect's
tolerance, within 100x, beyond); the culprit's output and its first divergent step red, the first divergence
orange, by their own ``bgColor``. Plain JSON, written whether the viewer is installed or not.
"""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

from mhaexport.artifact import atomic_write_json
from mhaexport.diagnose.bisect import BisectReport

NODE_DATA = "bisect-node-data.json"
# JSON has no infinity: a non-finite relative error (ONNX gives inf or NaN where eager is finite) is shown as this
NON_FINITE = 1e30
CULPRIT, FIRST = "#d00000", "#f08c00"
VIEWER = "model-explorer-onnx"


def node_data(report: BisectReport) -> dict:
    """The report's rows as Model Explorer node data: one result per ONNX value compared (the largest relative
    error where several modules end at the same value)."""
    results: dict[str, dict] = {}

    def put(name: str, rel: float | None) -> None:
        value = rel if rel is not None and math.isfinite(rel) else NON_FINITE
        if name and (name not in results or value > results[name]["value"]):
            results[name] = {"value": float(f"{value:.3g}")}

    for r in report.rows:
        put(r.onnx_value, r.rel)
    for s in report.steps:  # inside the culprit's attention: scores, scale, mask fill, softmax, ...
        if s.rel is not None:
            put(s.onnx_value, s.rel)
    step = report.step if report.step is not None and report.step.onnx_value else None
    for name, colour in ((report.first_divergent and report.first_divergent.onnx_value, FIRST),
                         (report.culprit and report.culprit.onnx_value, CULPRIT), (step and step.onnx_value, CULPRIT)):
        if name in results:
            results[name].update(bgColor=colour, textColor="#ffffff")
    tol = report.tol
    return {"results": results,
            "thresholds": [{"value": tol, "bgColor": "#d8f3dc"}, {"value": 100 * tol, "bgColor": "#fff3bf"},
                           {"value": NON_FINITE, "bgColor": "#ffc9c9"}]}


def write_node_data(report: BisectReport, path: str | Path) -> Path:
    """Write :func:`node_data` to ``path`` atomically; returns it."""
    path = Path(path)
    atomic_write_json(path, node_data(report))
    return path


def how_to_open(onnx_file: str | Path, path: str | Path) -> str:
    """One line: the command that shows the node data on the graph, and the package to install when it is not."""
    have = importlib.util.find_spec("model_explorer") is not None
    need = "" if have else f" (the viewer is not installed: pip install {VIEWER})"
    return f"on the graph: model-explorer {onnx_file} --node_data_paths={path}{need}"
