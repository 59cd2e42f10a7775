"""``mhaexport quantize``: a folder's float ONNX weights to int4/int8, into a new folder."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from mhaexport.verbs.common import Progress, _names, _replacing, writable_output

if TYPE_CHECKING:  # pragma: no cover
    from mhaexport.exporter.quantize import QuantizeRecord


def quantize(folder: str | Path, output: str | Path, *, weights: str = "int4", block_size: int | None = None,
             symmetric: bool = True, accuracy_level: int = 4, keep_float: Sequence[str] = ("embeddings",),
             int8_blocks: int | None = None, replace: bool = False,
             progress: Progress | None = None) -> QuantizeRecord:
    """``mhaexport quantize``: the weights of ``folder``'s float ONNX export to int4/int8 into a new folder
    ``output`` (then ``verify(output)`` judges its quality against eager fp32; ``replace`` as :func:`export_onnx`).
    Every setting is checked before any work (ConfigError); ``folder`` is opened (hash-checked) once. Returns the
    QuantizeRecord (``.to_dict()``: what ``--json`` prints)."""
    from mhaexport.exporter.common import previous_model
    from mhaexport.exporter.quantize import QuantConfig, quantize_folder
    from mhaexport.outputs import check_export_into

    cfg = QuantConfig(weights=weights, block_size=block_size, symmetric=symmetric, accuracy_level=accuracy_level,
                      keep_float=_names(keep_float, "keep_float") or (), int8_blocks=int8_blocks)  # checked when made
    check_export_into(output, [folder])
    writable_output(output)
    with _replacing(output, previous_model(folder), replace) as done:
        return done(quantize_folder(folder, output, cfg, progress=progress))
