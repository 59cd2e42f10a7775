"""Bisect's divergence on the graph: Google Model Explorer's node data for the ONNX file (``model-explorer FILE
--node_data_paths=NODE_DATA.json``, the viewer from the ``model-explorer-onnx`` package).

The file is Model Explorer's ``GraphNodeData`` JSON (model_explorer/node_data_builder.py): ``results`` keyed by a
node's output tensor name (the ONNX value bisect compared) with ``value`` the relative error max|onnx - eager| /
max|eager|, coloured by ``thresholds`` (within bisect's tolerance, within 100x, beyond); the culprit red and the
first divergence orange by their own ``bgColor``. Plain JSON, written whether the viewer is installed or not.
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
    for r in report.rows:
        value = r.rel if math.isfinite(r.rel) else NON_FINITE
        if r.onnx_value not in results or value > results[r.onnx_value]["value"]:
            results[r.onnx_value] = {"value": float(f"{value:.3g}")}
    for row, colour in ((report.first_divergent, FIRST), (report.culprit, CULPRIT)):
        if row is not None and row.onnx_value in results:
            results[row.onnx_value].update(bgColor=colour, textColor="#ffffff")
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
