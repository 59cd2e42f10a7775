"""Helpers the tests share to plant bugs where only the exported file has them, and a model whose greedy output
varies (random init's near-uniform logits repeat one token)."""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Callable
from pathlib import Path

import onnx
import torch

from mhaexport.artifact import atomic_write_json, read_json
from mhaexport.artifact.files import file_entries


def rehash(folder: Path, files: tuple[str, ...] = ("model.onnx",), artifact: str = "onnx") -> None:
    """Make the manifest vouch for ``files`` of ``artifact`` as they are now (as if the exporter itself had written
    them)."""
    manifest = read_json(folder / "manifest.json", "manifest")
    manifest["artifacts"][artifact]["files"].update(file_entries(folder, list(files)))
    atomic_write_json(folder / "manifest.json", manifest)


def edited_genai_config(src: Path, dst: Path, edit: Callable[[dict], object]) -> Path:
    """A copy of ``src`` whose genai_config.json ``edit`` changed in place, re-hashed (as a pipeline editing it
    would)."""
    import json

    shutil.copytree(src, dst)
    cfg = json.loads((dst / "genai_config.json").read_text())
    edit(cfg)
    (dst / "genai_config.json").write_text(json.dumps(cfg, indent=2))
    rehash(dst, ("genai_config.json",))
    return dst


def rehashed_copy(src: Path, dst: Path, plant: Callable[[onnx.ModelProto], object]) -> Path:
    """A copy of an export folder whose model.onnx ``plant`` changed in place, re-hashed: a bug only the file has."""
    shutil.copytree(src, dst)
    proto = onnx.load(str(dst / "model.onnx"))
    plant(proto)
    onnx.save_model(proto, dst / "model.onnx")
    rehash(dst)
    return dst


def peaked(preset: str, seed: int = 7):
    """A LoadedModel of ``preset`` with weights x10, so greedy decoding varies from token to token."""
    from mhaexport.models.config import PRESETS
    from mhaexport.models.decoder import DecoderLM
    from mhaexport.models.loading import LoadedModel, contract_of

    module = DecoderLM(dataclasses.replace(PRESETS[preset], seed=seed)).eval()
    with torch.no_grad():
        for p in module.parameters():
            if p.dim() > 1:
                p.mul_(10)
    return LoadedModel(module, contract_of(module), spec=f"test:peaked-{preset}")
