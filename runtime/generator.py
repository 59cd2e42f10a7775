"""Generate from an export folder with ONNX Runtime: the deploy path's public API. Torch-free.

A :class:`Generator` is the folder's hash-checked session as an :class:`~mhaexport.runtime.ort.OrtRunner` (IO
binding: the cache stays an OrtValue on the session's device) driven by the one decode loop,
:class:`~mhaexport.runtime.decode.DecodeLoop`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import numpy as np

from mhaexport.core import dtypes
from mhaexport.artifact import ExportFolder
from mhaexport.core.errors import ArtifactError, ProviderUnavailable, RuntimeInputError
from mhaexport.runtime.decode import (STOP_EOS, STOP_MAX_NEW, STOP_MAX_POS, DecodeLoop, DecodeState,  # noqa: F401
                                      GenerationConfig, GenerationResult, pad_prompts)
from mhaexport.runtime.choose import no_decode_loop, open_folder, ort_runner_for
from mhaexport.runtime.serve import Request, Scheduler, Served
from mhaexport.runtime.speculative import DEFAULT_DRAFT_TOKENS, DraftModel, PromptLookup, speculative_generate
from mhaexport.runtime.session import DEFAULT_OPT_LEVEL, SessionConfig


class Generator:
    """Generate from an export folder with ONNX Runtime, on mhaexport's decode loop (``engine == "mhaexport"``;
    :func:`mhaexport.runtime.engine.open_generator` chooses between it and onnxruntime-genai's loop).

    ``providers``: ``("cpu",)``, ``("cuda",)`` or full provider names. With ``strict_providers`` a requested
    provider the session does not really use raises ProviderUnavailable; otherwise it is listed in ``warnings``.
    ``io_binding``: carry the cache as bound OrtValues; None (the default) binds on CUDA only, where it keeps the
    cache on the device (on CPU plain ``session.run`` was the faster; see ``OrtRunner.binds``). ``mmap_weights``:
    the file's external data memory-mapped, not loaded (what :func:`~mhaexport.runtime.engine.open_generator` asks
    for weights larger than this process's memory; ``SessionConfig.mmap_weights``).
    """

    engine = "mhaexport"
    engine_reason = "mhaexport.runtime.Generator"

    def __init__(self, folder: str | Path | ExportFolder, providers: Sequence[str] | str = ("cpu",), *,
                 threads: int | None = None, opt_level: str = DEFAULT_OPT_LEVEL, strict_providers: bool = True,
                 io_binding: bool | None = None, cache_optimized: bool = False,
                 profile_prefix: str | None = None, mmap_weights: bool = False) -> None:
        if isinstance(providers, str):
            providers = (providers,)
        cfg = SessionConfig(providers=tuple(providers), threads=threads, opt_level=opt_level,
                            cache_optimized=cache_optimized, strict_providers=strict_providers,
                            profile_prefix=profile_prefix, mmap_weights=mmap_weights)
        self.export = open_folder(folder)  # the ExportFolder: manifest as typed objects, files snapshot-checked
        self.entry = self.export.entry("onnx")
        self.folder = self.export.path
        if (static := no_decode_loop(self.export)) is not None:
            raise ArtifactError(static)
        self.contract = self.export.contract
        self.runner = ort_runner_for(self.export, "ort", cfg, io_binding=io_binding).activate()
        self.feed = self.runner.feed  # how the file is fed, read from the manifest once (runtime.feed.Feed)
        self.kv_dtype = dtypes.numpy_dtype(self.feed.cache_dtype)  # numpy cannot hold bfloat16
        if self.runner.skip_reason is not None:  # strict: a requested provider that does not run here
            raise ProviderUnavailable(self.runner.skip_reason)
        self.runner.name = f"ort-{self.runner.device}"
        self.layout = self.runner.layout  # an adopted file's feed, its names for the contract's I/O (None: our own)
        self.loop = DecodeLoop(self.runner)
        self.session = self.runner.session
        self.providers = self.runner.providers
        self.device = self.runner.device
        self.warnings = self.runner.warnings
        self.optimized_from_cache = self.runner.optimized_from_cache
        self.io_binding = self.runner.binds  # None asked: IO binding on CUDA only (OrtRunner.binds)

    def forward(self, input_ids: np.ndarray, attention_mask: np.ndarray,
                past_key_values: Sequence | None = None) -> tuple[np.ndarray, list[np.ndarray]]:
        """One checked call with numpy in and out: the decoder contract's logits and the present cache as 2 *
        n_layers arrays (key, value per layer). ``past_key_values``: None, n_layers (key, value) pairs, or 2 *
        n_layers arrays, each (B, H, P, D)."""
        ids = np.asarray(input_ids)
        P = np.asarray(attention_mask).shape[1] - ids.shape[1] if ids.ndim == 2 else 0
        ids, mask = self.runner.check_ids_mask(input_ids, attention_mask)
        past = self.runner.check_past(past_key_values, ids.shape[0], P)
        logits, present = self.runner.run(ids, mask, past)
        return logits, [t for kv in present for t in kv]

    def pad_prompts(self, prompts: Sequence[Sequence[int]] | np.ndarray,
                    pad_token_id: int = 0) -> tuple[np.ndarray, np.ndarray, list[int]]:
        """Pad a batch of prompts as this export takes them (left; right for a shared cache): (B, L) ids, (B, L)
        mask (0 on padding), and each prompt's length."""
        return pad_prompts(prompts, self.contract.vocab_size, self.contract.max_positions, pad_token_id,
                           side=self.runner.padding)

    def prefill(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> tuple[np.ndarray, DecodeState]:
        """Run the whole prompt once: the last position's (B, V) logits and the cache it leaves."""
        return self.loop.prefill(input_ids, attention_mask)

    def decode_one_token(self, token: np.ndarray, state: DecodeState) -> tuple[np.ndarray, DecodeState]:
        """Feed (B,) tokens at the next position: (B, V) logits and the cache grown by one."""
        if state.length + 1 > self.runner.max_length:
            raise RuntimeInputError(f"cannot decode past {self.runner.limit_text()}")
        return self.loop.decode_one_token(token, state)

    def generate(self, prompts: Sequence[Sequence[int]] | np.ndarray,
                 config: GenerationConfig = GenerationConfig(), *,
                 on_token: Callable[[np.ndarray], None] | None = None) -> GenerationResult:
        """Generate up to ``config.max_new_tokens`` tokens after each prompt (a batch, left-padded; right-padded
        for a shared cache). ``on_token``: each step's (B,) chosen tokens as they come (streaming; see
        :meth:`DecodeLoop.generate`)."""
        return self.loop.generate(prompts, config, on_token=on_token)

    def serve(self, requests: Sequence[Request], rows: int = 4, config: GenerationConfig = GenerationConfig(), *,
              prefixes: Sequence[Sequence[int]] = ()) -> Iterator[Served]:
        """Continuous batching (:class:`~mhaexport.runtime.serve.Scheduler`): ``requests`` (each its prompt, token
        budget and arrival step) over ``rows`` rows of this file's session, each token yielded as handed out."""
        yield from Scheduler(self.loop, rows, config, prefixes=prefixes).run(requests)

    def speculative(self, prompt: Sequence[int], config: GenerationConfig = GenerationConfig(),
                    drafter: PromptLookup | DraftModel | None = None, *, k: int = DEFAULT_DRAFT_TOKENS
                    ) -> GenerationResult:
        """Greedy speculative decoding after one ``prompt`` (:func:`~mhaexport.runtime.speculative.
        speculative_generate`): drafts from ``drafter`` (default prompt lookup) checked ``k`` at a time; the tokens
        of :meth:`generate`, ``result.speculative`` the counts."""
        return speculative_generate(self.loop, prompt, config, drafter or PromptLookup(), k=k)

    def draft_model(self) -> DraftModel:
        """This file's loop as a draft model for another export sharing its vocabulary."""
        return DraftModel(DecodeLoop(self.runner))
