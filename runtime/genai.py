"""Run an export folder through onnxruntime-genai's own generator loop (the comparison bench, verify and the tests
use; :func:`genai_generate` is the one place that drives it).
Torch-free. ``genai_config.json`` itself is written at export time (:mod:`mhaexport.exporter.genai`).

onnxruntime-genai batches **right-padded** with ``pad_token_id`` and derives the attention mask from it; a prompt
token equal to ``pad_token_id`` is treated as padding.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from mhaexport.artifact import opened, read_json
from mhaexport.errors import ArtifactError, MhaExportError, RuntimeInputError
from mhaexport.runtime.decode import STOP_EOS, STOP_MAX_NEW, GenerationResult, pad_prompts

GENAI_CONFIG = "genai_config.json"


class GenAIUnavailable(MhaExportError):
    """onnxruntime_genai cannot be imported."""


def import_og():
    try:
        import onnxruntime_genai as og
    except Exception as e:  # ImportError, or its native library failing to load
        raise GenAIUnavailable(
            f"onnxruntime_genai cannot be imported ({type(e).__name__}: {e}); install it with `pip install "
            "--no-deps onnxruntime-genai` (its one dependency, the CPU onnxruntime, is [cpu]'s; next to [gpu]'s "
            "onnxruntime-gpu --no-deps keeps a second onnxruntime out)") from None
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


def genai_generate(model, ids: np.ndarray, max_length: int, *, eos_token_id: int | None = None,
                   clock: Callable[[], float] = time.perf_counter) -> GenerationResult:
    """onnxruntime-genai's own greedy loop over ``model`` (:func:`genai_model`): ``ids`` (B, P) prompts (right-padded
    with the config's pad_token_id where they differ in length), generated until every row is done (its eos) or
    ``max_length`` tokens in all. ``append_tokens`` is the prefill, each ``generate_next_token`` a decode step, timed
    with ``clock`` as the decode loop times its steps (bench's onnxruntime-genai row). ``tokens``: each row's tokens
    after the P prompt columns; with ``eos_token_id``, cut after it (a finished row is filled with pad tokens)."""
    og = import_og()
    B, P = ids.shape
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=max_length, do_sample=False, batch_size=B)
    gen = og.Generator(model, params)
    res = GenerationResult([[] for _ in range(B)], STOP_MAX_NEW, "", [P] * B)
    t0 = clock()
    gen.append_tokens(ids.astype(np.int32))
    res.prefill_s = clock() - t0
    if not gen.is_done():
        gen.generate_next_token()
        res.first_token_s = clock() - t0
    while not gen.is_done():
        t = clock()
        gen.generate_next_token()
        res.step_s.append(clock() - t)
        res.step_positions.append(P + len(res.step_s) - 1)
    for b in range(B):
        new = [int(t) for t in gen.get_sequence(b)][P:]
        if eos_token_id is not None and eos_token_id in new:
            new = new[:new.index(eos_token_id) + 1]
        res.tokens[b] = new
    if eos_token_id is not None and all(eos_token_id in row for row in res.tokens):
        res.stop_reason = STOP_EOS
    return res


def genai_greedy(folder: str | Path, prompts: Sequence[Sequence[int]], max_length: int) -> list[list[int]]:
    """Greedy generation through onnxruntime-genai: each prompt plus new tokens, up to ``max_length`` tokens in all
    (or eos). Prompts of different lengths are batched right-padded; pad tokens are removed from the result."""
    with opened(folder, "onnx") as ef:  # hashes of model.onnx and genai_config.json; the snapshot goes when done
        if GENAI_CONFIG not in ef.entry("onnx").files:
            raise ArtifactError(f"{ef.path} has no {GENAI_CONFIG}: export it with `mhaexport onnx --seq-dynamic -o "
                                f"{ef.path}`")
        cfg = read_json(ef.file("onnx", GENAI_CONFIG), "onnxruntime-genai config")["model"]
        ids, _mask, _lengths = pad_prompts(prompts, cfg["vocab_size"], cfg["context_length"], cfg["pad_token_id"],
                                           side="right")
        if max_length > cfg["context_length"]:
            raise RuntimeInputError(f"max_length={max_length} exceeds the model's "
                                    f"context_length={cfg['context_length']}")
        # the snapshot: the files whose hashes were checked
        res = genai_generate(genai_model(ef.root), ids, max_length, eos_token_id=cfg["eos_token_id"])
    return [list(p) + new for p, new in zip(prompts, res.tokens)]


@dataclass
class GenAITrace:
    """What onnxruntime-genai's generator did with a batch of prompts: per row, the tokens it generated after the
    prompt and its logits for each — ``logits[b][0]`` at the prompt's last token (the prefill), ``logits[b][k]``
    after the k-th new token (a decode step), as (steps, vocab). A row that generated eos ends there."""

    prompts: list[list[int]]
    tokens: list[list[int]] = field(default_factory=list)
    logits: list[np.ndarray] = field(default_factory=list)


def genai_trace(model, prompts: Sequence[Sequence[int]], new_tokens: int, pad_token_id: int,
                eos_token_id: int | Sequence[int] | None = None) -> GenAITrace:
    """Run ``prompts`` together through onnxruntime-genai's generator as deployed (the config's search options; only
    ``max_length`` and the batch size set), right-padded with ``pad_token_id`` as it pads a batch, and record each
    step's logits (``get_logits``) and tokens: ``new_tokens`` decode steps after the prefill."""
    og = import_og()
    B, T = len(prompts), max(len(p) for p in prompts)
    ids = np.full((B, T), pad_token_id, dtype=np.int32)  # (B, T) right-padded
    for b, p in enumerate(prompts):
        ids[b, :len(p)] = p
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=T + new_tokens + 1, batch_size=B)
    gen = og.Generator(model, params)
    gen.append_tokens(ids)
    steps = [np.asarray(gen.get_logits(), dtype=np.float32).reshape(B, -1)]  # (B, V) at each row's last token
    for _ in range(new_tokens):
        if gen.is_done():
            break
        gen.generate_next_token()
        if gen.is_done():  # every row chose eos (not appended): no logits after it (asking runs the graph again)
            break
        steps.append(np.asarray(gen.get_logits(), dtype=np.float32).reshape(B, -1))
    eos = set([eos_token_id] if isinstance(eos_token_id, int) else (eos_token_id or []))
    trace = GenAITrace([list(p) for p in prompts])
    for b in range(B):
        new = [int(t) for t in gen.get_sequence(b)][T:]  # og appends after the padded prompt
        cut = next((i + 1 for i, t in enumerate(new) if t in eos), len(new))
        new = new[:min(cut, len(steps))]
        trace.tokens.append(new)
        trace.logits.append(np.stack([s[b] for s in steps[:len(new) + 1]]))  # (steps, V): up to len(new) + 1
    return trace
