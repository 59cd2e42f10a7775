"""onnxruntime-genai support at export time: the export folder's ``genai_config.json``.
(Running a folder through onnxruntime-genai is deploy-side: :mod:`mhaexport.runtime.genai`.)

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
- ``search.past_present_share_buffer`` says which cache the graph has: false for the concat-style cache (present =
  concat(past, new)), true for ``--kv-cache shared`` (one buffer per layer that GroupQueryAttention writes in place;
  onnxruntime-genai then binds the same buffer as past and present and sizes it by ``max_length``).
- batches are **right-padded** with ``pad_token_id`` and the attention mask is derived from it: a prompt token
  equal to ``pad_token_id`` is treated as padding. Our decoder takes positions from ``cumsum(mask) - 1``, so right
  padding gives the same logits at real tokens as left padding does (see :func:`mhaexport.runtime.decode.pad_prompts`
  with ``side="right"``).

Torch-free.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mhaexport.core import iospec
from mhaexport.artifact import atomic_write_json
from mhaexport.core.errors import RuntimeInputError
from mhaexport.runtime.genai import GENAI_CONFIG
from mhaexport.runtime.genai_config import DEFAULT_SPECIAL_ID, sliding_window_entry, special_ids  # noqa: F401


def genai_config(contract: iospec.ModelContract, *, filename: str = "model.onnx",
                 ids: dict[str, int] | None = None, kv_cache: str = "concat") -> dict:
    """The ``genai_config.json`` dict for an export of ``contract`` (I/O names from :mod:`mhaexport.core.iospec`)."""
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
                "num_key_value_heads": contract.n_kv_heads,
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
            # concat-style cache: present = concat(past, new), a new buffer each step; shared: one buffer
            "past_present_share_buffer": kv_cache in ("shared", "window"),
        },
    }


def write_genai_config(folder: str | Path, contract: iospec.ModelContract, *, filename: str = "model.onnx",
                       model_config: Any = None, kv_cache: str = "concat",
                       tokenizer: dict[str, Path] | None = None) -> str:
    """Write ``folder/genai_config.json`` atomically; returns its file name (for the manifest's file list). Its
    special ids are :func:`mhaexport.runtime.genai_config.special_ids` of ``model_config`` and the ``tokenizer``
    files the export ships (name -> path): the rule the genai-config check holds it to."""
    data = genai_config(contract, filename=filename, ids=special_ids(model_config, tokenizer), kv_cache=kv_cache)
    # a full-length cache (concat, shared) has none: the graph windows itself; a window cache's windowed layers are
    # window-sized, as onnxruntime-genai sizes them from this entry
    window = sliding_window_entry(contract, window_sized_cache=kv_cache == "window")
    if window is not None:
        data["model"]["decoder"]["sliding_window"] = window
    atomic_write_json(Path(folder) / GENAI_CONFIG, data)
    return GENAI_CONFIG
