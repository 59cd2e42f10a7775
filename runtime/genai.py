"""Run an export folder through onnxruntime-genai's own generator loop (the comparison verify and the tests use).
Torch-free. ``genai_config.json`` itself is written at export time (:mod:`mhaexport.exporter.genai`).

onnxruntime-genai batches **right-padded** with ``pad_token_id`` and derives the attention mask from it; a prompt
token equal to ``pad_token_id`` is treated as padding.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from mhaexport.artifact import ExportFolder, read_json
from mhaexport.errors import ArtifactError, MhaExportError, RuntimeInputError

GENAI_CONFIG = "genai_config.json"


class GenAIUnavailable(MhaExportError):
    """onnxruntime_genai cannot be imported."""


def right_pad(prompts: Sequence[Sequence[int]], pad_id: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Right-pad prompts the way onnxruntime-genai does: int64 ids (B, T) and attention mask (B, T), 1 = real."""
    if len(prompts) == 0:
        raise RuntimeInputError("a batch of zero prompts: give at least one prompt")
    if any(len(p) == 0 for p in prompts):
        raise RuntimeInputError("an empty prompt: every prompt needs at least one token")
    T = max(len(p) for p in prompts)
    ids = np.full((len(prompts), T), pad_id, dtype=np.int64)  # (B, T)
    mask = np.zeros((len(prompts), T), dtype=np.int64)  # (B, T)
    for b, p in enumerate(prompts):
        ids[b, :len(p)] = p
        mask[b, :len(p)] = 1
    return ids, mask


def import_og():
    try:
        import onnxruntime_genai as og
    except Exception as e:  # ImportError, or its native library failing to load
        raise GenAIUnavailable(
            f"onnxruntime_genai cannot be imported ({type(e).__name__}: {e}); install it next to onnxruntime-gpu "
            "with `pip install --no-deps onnxruntime-genai`") from None
    return og


def genai_model(folder: str | Path, threads: int | None = None):
    """onnxruntime-genai's Model over ``folder``'s genai_config.json; with ``threads`` its decoder session gets that
    many intra-op threads (an overlay on the config, the file untouched: it is hashed), as bench's other rows do."""
    og = import_og()
    if threads is None:
        return og.Model(str(folder))
    config = og.Config(str(folder))
    config.overlay(json.dumps({"model": {"decoder": {"session_options": {"intra_op_num_threads": int(threads),
                                                                          "inter_op_num_threads": 1}}}}))
    return og.Model(config)


def genai_greedy(folder: str | Path, prompts: Sequence[Sequence[int]], max_length: int) -> list[list[int]]:
    """Greedy generation through onnxruntime-genai: each prompt plus new tokens, up to ``max_length`` tokens in all
    (or eos). Prompts of different lengths are batched right-padded; pad tokens are removed from the result."""
    ef = ExportFolder.open(folder, "onnx")  # hashes of model.onnx and genai_config.json
    if GENAI_CONFIG not in ef.entry("onnx").files:
        raise ArtifactError(f"{ef.path} has no {GENAI_CONFIG}: export it with `mhaexport onnx --seq-dynamic -o "
                            f"{ef.path}`")
    cfg = read_json(ef.file("onnx", GENAI_CONFIG), "onnxruntime-genai config")["model"]
    ids, _mask = right_pad(prompts, cfg["pad_token_id"])
    if ids.max() >= cfg["vocab_size"] or ids.min() < 0:
        raise RuntimeInputError(f"prompt ids must lie in [0, {cfg['vocab_size']})")
    if max_length > cfg["context_length"]:
        raise RuntimeInputError(f"max_length={max_length} exceeds the model's context_length={cfg['context_length']}")
    og = import_og()
    model = og.Model(str(ef.root))  # the snapshot: the files whose hashes were checked
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=max_length, do_sample=False, batch_size=len(prompts))
    gen = og.Generator(model, params)
    gen.append_tokens(ids.astype(np.int32))
    while not gen.is_done():
        gen.generate_next_token()
    out = []
    for b, p in enumerate(prompts):
        new = [int(t) for t in gen.get_sequence(b)][ids.shape[1]:]
        if cfg["eos_token_id"] in new:  # a finished row is filled up with pad tokens after its eos
            new = new[:new.index(cfg["eos_token_id"]) + 1]
        out.append(list(p) + new)
    return out
