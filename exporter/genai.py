"""onnxruntime-genai support: the export folder's ``genai_config.json``, and small torch-free helpers to run it.

``onnxruntime_genai.Model(DIR)`` reads ``DIR/genai_config.json`` to learn the model type, file name, I/O name
templates and sizes; with it an ONNX export runs in onnxruntime-genai's generator loop unchanged:

    import onnxruntime_genai as og
    model = og.Model("out/onnx")
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=64, do_sample=False)
    gen = og.Generator(model, params)
    gen.append_tokens(np.array([[72, 105]], dtype=np.int32))
    while not gen.is_done():
        gen.generate_next_token()

Facts this module relies on (onnxruntime-genai 0.18, checked by tests/test_genai.py):

- model type ``decoder`` feeds ``input_ids``, ``attention_mask`` and the ``past_key_values.%d.key|value``
  inputs it finds in the graph; our graph has no ``position_ids`` (positions come from the mask), so none is fed.
- our cache is concat-style (present = concat(past, new)), so ``search.past_present_share_buffer`` is false;
  true would need a graph that writes into a fixed-size shared buffer.
- batches are **right-padded** with ``pad_token_id`` and the attention mask is derived from it: a prompt token
  equal to ``pad_token_id`` is treated as padding. Our decoder takes positions from ``cumsum(mask) - 1``, so right
  padding gives the same logits at real tokens as left padding does (see :func:`right_pad`).

Torch-free: the deploy path may use it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from mhaexport import iospec
from mhaexport.errors import ArtifactError, MhaExportError, RuntimeInputError
from mhaexport.exporter import manifest as mf

GENAI_CONFIG = "genai_config.json"
# The byte-level built-in models have no special tokens; NUL (0) never occurs in text, so it serves as bos, eos
# and pad unless the model's config names its own ids (``eos_token_id``, ``pad_token_id``, ``bos_token_id``).
DEFAULT_SPECIAL_ID = 0


class GenAIUnavailable(MhaExportError):
    """onnxruntime_genai cannot be imported."""


def special_ids(model_config: Any) -> dict[str, int]:
    """bos/eos/pad ids from a model's ``config`` (attribute or dict key), defaulting to :data:`DEFAULT_SPECIAL_ID`."""
    out = {}
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        v = model_config.get(key) if isinstance(model_config, dict) else getattr(model_config, key, None)
        out[key] = v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else DEFAULT_SPECIAL_ID
    return out


def genai_config(contract: iospec.ModelContract, *, filename: str = "model.onnx",
                 ids: dict[str, int] | None = None) -> dict:
    """The ``genai_config.json`` dict for an export of ``contract`` (I/O names from :mod:`mhaexport.iospec`)."""
    ids = ids or special_ids(None)
    key0, value0 = iospec.past_names(0)
    pkey0, pvalue0 = iospec.present_names(0)
    for name, value in ids.items():
        if not 0 <= value < contract.vocab_size:
            raise RuntimeInputError(f"{name}={value} is outside the vocabulary [0, {contract.vocab_size})")
    return {
        "model": {
            "type": "decoder",
            "context_length": contract.max_positions,
            "vocab_size": contract.vocab_size,
            **ids,
            "decoder": {
                "filename": filename,
                "head_size": contract.head_dim,
                "hidden_size": contract.head_dim * contract.n_heads,
                "num_attention_heads": contract.n_heads,
                "num_key_value_heads": contract.n_heads,
                "num_hidden_layers": contract.n_layers,
                "session_options": {"log_id": "mhaexport", "provider_options": []},
                "inputs": {
                    "input_ids": iospec.INPUT_IDS,
                    "attention_mask": iospec.ATTENTION_MASK,
                    "past_key_names": key0.replace(".0.", ".%d."),
                    "past_value_names": value0.replace(".0.", ".%d."),
                },
                "outputs": {
                    "logits": iospec.LOGITS,
                    "present_key_names": pkey0.replace(".0.", ".%d."),
                    "present_value_names": pvalue0.replace(".0.", ".%d."),
                },
            },
        },
        "search": {
            "do_sample": False,
            "num_beams": 1,
            "num_return_sequences": 1,
            "max_length": contract.max_positions,
            "min_length": 0,
            "top_k": 1,
            "top_p": 1.0,
            "temperature": 1.0,
            "repetition_penalty": 1.0,
            "length_penalty": 1.0,
            "no_repeat_ngram_size": 0,
            "diversity_penalty": 0.0,
            "early_stopping": True,
            # concat-style cache: present = concat(past, new), a new buffer each step
            "past_present_share_buffer": False,
        },
    }


def write_genai_config(folder: str | Path, contract: iospec.ModelContract, *, filename: str = "model.onnx",
                       model_config: Any = None) -> str:
    """Write ``folder/genai_config.json`` atomically; returns its file name (for the manifest's file list)."""
    data = genai_config(contract, filename=filename, ids=special_ids(model_config))
    mf.atomic_write_json(Path(folder) / GENAI_CONFIG, data)
    return GENAI_CONFIG


def right_pad(prompts: Sequence[Sequence[int]], pad_id: int = DEFAULT_SPECIAL_ID) -> tuple[np.ndarray, np.ndarray]:
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


def _import_og():
    try:
        import onnxruntime_genai as og
    except Exception as e:  # ImportError, or its native library failing to load
        raise GenAIUnavailable(
            f"onnxruntime_genai cannot be imported ({type(e).__name__}: {e}); install it next to onnxruntime-gpu "
            "with `pip install --no-deps onnxruntime-genai`") from None
    return og


def genai_greedy(folder: str | Path, prompts: Sequence[Sequence[int]], max_length: int) -> list[list[int]]:
    """Greedy generation through onnxruntime-genai: each prompt plus new tokens, up to ``max_length`` tokens in all
    (or eos). Prompts of different lengths are batched right-padded; pad tokens are removed from the result."""
    folder = Path(folder)
    entry = mf.load_verified(folder, "onnx")["artifacts"]["onnx"]  # hashes of model.onnx and genai_config.json
    if GENAI_CONFIG not in entry["files"]:
        raise ArtifactError(f"{folder} has no {GENAI_CONFIG}: export it with `mhaexport onnx --seq-dynamic -o {folder}`")
    cfg = json.loads((folder / GENAI_CONFIG).read_text())["model"]
    ids, mask = right_pad(prompts, cfg["pad_token_id"])
    if ids.max() >= cfg["vocab_size"] or ids.min() < 0:
        raise RuntimeInputError(f"prompt ids must lie in [0, {cfg['vocab_size']})")
    if max_length > cfg["context_length"]:
        raise RuntimeInputError(f"max_length={max_length} exceeds the model's context_length={cfg['context_length']}")
    og = _import_og()
    model = og.Model(str(folder))
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
