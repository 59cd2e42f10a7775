"""Adoption: an ONNX decoder another tool exported, made the ONNX artifact of the model it claims to be (``mhaexport
verify FILE.onnx --hf DIR``'s first half)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from mhaexport.core.errors import ConfigError
from mhaexport.verbs.common import _model, writable_output

if TYPE_CHECKING:  # pragma: no cover
    from mhaexport.exporter.common import ExportRecord
    from mhaexport.models.loading import LoadedModel


def adopt(file: str | Path, output: str | Path | None = None, *, model: str | LoadedModel | None = None,
          config: str | None = None, hf: str | Path | None = None, checkpoint: str | Path | None = None,
          revision: str | None = None, allow_download: bool = False, replace: bool = False,
          junit: str | Path | None = None) -> ExportRecord:
    """``mhaexport verify FILE.onnx --hf DIR`` (or ``--model`` / ``--config``), its first half: adopt an ONNX
    decoder another tool exported (onnxruntime-genai's model builder, Optimum, a plain torch.onnx.export) as the ONNX
    artifact of the model it claims to be, in folder ``output`` (default: FILE's folder/mhaexport) — links to the
    file, its layout and hashes in the manifest. ``junit``: the JUnit file the verify after it will write, checked
    here before any work. :func:`verify` (``verify(record.folder, model=..., output=record.folder)``) then drives it
    in its producer's cache and padding protocol; generate and bench run on that folder. Returns the ExportRecord
    (``record.manifest.artifacts["onnx"].details``: the producer and protocol found). Raises ConfigError (no model
    named, not a file), ArtifactError (a file that does not map onto the contract or is not that model's)."""
    from mhaexport.exporter.adopt import adopt_onnx

    named = model is not None or config is not None or hf is not None or checkpoint is not None
    out = _adoption_folder(file, output, named, junit)
    loaded = _model(model, config, hf, checkpoint, revision, allow_download)
    return adopt_onnx(loaded, Path(file), out, replace=replace)


def _adoption_folder(file: str | Path, output: str | Path | None, named: bool, junit: str | Path | None) -> Path:
    """:func:`adopt`'s checks before any work (a regular file, a model ``named``, the outputs): the folder it is
    adopted into (``output``, default FILE's folder/mhaexport)."""
    from mhaexport.exporter.adopt import default_folder
    from mhaexport.outputs import check_outputs

    path = Path(file)
    if not path.is_file():
        raise ConfigError(f"{file}: not a regular file (an ONNX file FILE.onnx to adopt)")
    if not named:
        raise ConfigError(f"{file} is a file: say which model it claims to be with --hf DIR, --model SPEC or --config "
                          "NAME (verify compares it with that model in eager PyTorch)")
    out = Path(output) if output is not None else default_folder(path)
    check_outputs({"--junit": junit}, reading=[path.parent], writing=[out], reports=out)
    writable_output(out, "" if output is not None else " (give -o DIR to adopt the file elsewhere)")
    return out
