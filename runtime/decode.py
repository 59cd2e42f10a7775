"""The one KV-cache decode loop. The deploy runtime's Generator, verify's generation and kv-consistency checks,
bench's rows and the onnxruntime-genai comparison all drive this loop over a
:class:`~mhaexport.runtime.runner.Runner`, so what bench times is what verify proved.

Split as in gpt-fast: :meth:`DecodeLoop.prefill`, :meth:`DecodeLoop.decode_one_token`,
:meth:`DecodeLoop.decode_n_tokens`; :meth:`DecodeLoop.generate` ties them together for a batch of prompts (left
padded). :meth:`DecodeLoop.feed` appends any chunk of tokens (chunked prefill, a mask with holes for right padding).
The cache stays in the runner's own form between steps (an OrtValue on the device, a torch tensor); the timings of
each step land in the :class:`GenerationResult` (the timing hooks bench reads), taken after the host has the
logits, which synchronizes any device.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mhaexport.core.errors import RuntimeInputError, RuntimeOptionError
from mhaexport.runtime.runner import Runner
from mhaexport.runtime.sampling import SamplingConfig, next_tokens

STOP_MAX_NEW = "max_new_tokens"
STOP_EOS = "eos"
STOP_MAX_POS = "max_positions"


@dataclass(frozen=True)
class GenerationConfig:
    """What to generate: how many tokens, when to stop, and how to pick each one."""

    max_new_tokens: int = 32
    eos_token_id: int | None = None  # a row stops after producing it; generation stops when every row has
    pad_token_id: int = 0  # fills left padding (masked out, so its value does not matter)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)


@dataclass
class DecodeState:
    """The KV cache between steps (in the runner's own form) and the attention mask that covers it."""

    cache: Any
    attention_mask: np.ndarray  # int64 (B, S)
    capacity: int | None = None  # the most positions the cache was made for (None: the runner's max_length)

    @property
    def length(self) -> int:
        return int(self.attention_mask.shape[1])

    @property
    def past(self) -> Any:  # the name of mhaexport 0.1
        return self.cache


@dataclass
class GenerationResult:
    """New tokens per prompt, why generation stopped, and the timings of each step (seconds)."""

    tokens: list[list[int]]  # per row: the new tokens (eos included, nothing after it)
    stop_reason: str  # "max_new_tokens" | "eos" | "max_positions"
    message: str  # one line saying why it stopped
    prompt_lengths: list[int]
    prefill_s: float = 0.0  # the prefill run alone
    first_token_s: float = 0.0  # prefill + choosing the first token
    step_s: list[float] = field(default_factory=list)  # each decode step: run + choose one token
    step_positions: list[int] = field(default_factory=list)  # cache length fed at each decode step
    providers: list[str] = field(default_factory=list)
    step_logits: list[np.ndarray] = field(default_factory=list)  # (B, V) per chosen token, when kept
    engine: str = "mhaexport"  # whose loop generated: "mhaexport" (this DecodeLoop) or "onnxruntime-genai"

    def to_dict(self, texts: list[str] | None = None) -> dict:
        """The JSON form `mhaexport generate --json` prints: tokens, text, stop_reason, message, prompt_lengths,
        providers, engine, prefill_s, first_token_s. With one prompt, ``tokens`` (and ``text``) are that prompt's, not
        lists of one. ``texts``: the decoded continuation per prompt, or None when there is no text."""
        one = len(self.tokens) == 1
        return {"tokens": self.tokens[0] if one else self.tokens,
                "text": (texts[0] if one else texts) if texts is not None else None,
                "stop_reason": self.stop_reason, "message": self.message, "prompt_lengths": self.prompt_lengths,
                "providers": self.providers, "engine": self.engine, "prefill_s": self.prefill_s,
                "first_token_s": self.first_token_s}


def pad_prompts(prompts: Sequence[Sequence[int]] | np.ndarray, vocab_size: int, max_positions: int,
                pad_token_id: int = 0, side: str = "left") -> tuple[np.ndarray, np.ndarray, list[int]]:
    """Pad a batch of prompts on the left (the contract's layout) or, ``side="right"``, on the right (a shared
    cache's and onnxruntime-genai's): (B, L) ids, (B, L) mask (0 on padding), and each prompt's length.
    RuntimeInputError for an empty batch, an empty prompt, a token outside [0, vocab_size) or a prompt longer than
    ``max_positions``."""
    rows = [list(map(int, np.asarray(p).reshape(-1))) for p in prompts]
    if not rows:
        raise RuntimeInputError("empty batch: give at least one prompt")
    for i, r in enumerate(rows):
        if not r:
            raise RuntimeInputError(f"prompt {i} is empty: each prompt needs at least one token")
        bad = [t for t in r if not 0 <= t < vocab_size]
        if bad:
            raise RuntimeInputError(f"prompt {i} holds token id {bad[0]}, outside the vocabulary [0, {vocab_size})")
    lengths = [len(r) for r in rows]
    L = max(lengths)
    if L > max_positions:
        raise RuntimeInputError(f"prompt of {L} tokens is longer than the model's max_positions={max_positions}")
    ids = np.full((len(rows), L), pad_token_id, dtype=np.int64)  # (B, L)
    mask = np.zeros((len(rows), L), dtype=np.int64)  # (B, L)
    for b, r in enumerate(rows):
        at = slice(L - len(r), L) if side == "left" else slice(0, len(r))
        ids[b, at] = r
        mask[b, at] = 1
    return ids, mask, lengths


left_pad = pad_prompts  # the name of mhaexport 0.1, when it padded on the left only


class DecodeLoop:
    """Prefill and KV-cache decode over one runner. ``clock``: the timer (injectable for tests)."""

    def __init__(self, runner: Runner, *, clock: Callable[[], float] = time.perf_counter) -> None:
        self.runner = runner
        self.contract = runner.contract
        self.clock = clock

    # ---- feeding tokens --------------------------------------------------------------------------------------
    def empty(self, batch: int, positions: int | None = None) -> DecodeState:
        """An empty state; ``positions``: the most positions it will hold (a runner with preallocated buffers sizes
        them to it, and feeding past it is refused)."""
        cap = min(positions, self.runner.max_length) if positions else None
        return DecodeState(self.runner.empty_cache(batch, cap), np.zeros((batch, 0), dtype=np.int64), cap)

    def feed(self, input_ids: np.ndarray, state: DecodeState,
             mask: np.ndarray | None = None) -> tuple[np.ndarray, DecodeState]:
        """Append (B, T) tokens to ``state``: (B, T, V) logits for each of them and the grown state. ``mask``:
        their (B, T) attention-mask columns (default ones; zeros keep holes, e.g. right padding)."""
        B, T = input_ids.shape
        new = np.ones((B, T), dtype=np.int64) if mask is None else np.asarray(mask, dtype=np.int64)
        full = np.concatenate([state.attention_mask, new], axis=1) if state.length else new  # (B, S + T)
        if full.shape[1] > (state.capacity or self.runner.max_length):  # capacity: at most max_length (empty)
            limit = (f"the {state.capacity} positions this cache was made for" if state.capacity
                     else self.runner.limit_text())
            raise RuntimeInputError(f"cannot feed past {limit}: the cache holds {state.length} positions and {T} "
                                    "more were given")
        logits, cache = self.runner.step(np.ascontiguousarray(input_ids, dtype=np.int64), full, state.cache)
        return logits, DecodeState(cache, full, state.capacity)

    def prefill(self, input_ids: np.ndarray, attention_mask: np.ndarray,
                positions: int | None = None) -> tuple[np.ndarray, DecodeState]:
        """Run the whole prompt once: each row's (B, V) logits at its last real token (the last position, or with
        right padding the last one the mask marks) and the cache it leaves. ``positions``: the most positions the
        cache will hold (prompt + new tokens; None: the most the runner takes)."""
        ids, mask = self.runner.check_ids_mask(input_ids, attention_mask, 0)
        logits, state = self.feed(ids, self.empty(ids.shape[0], positions), mask)
        last = mask.shape[1] - 1 - np.argmax(mask[:, ::-1] > 0, axis=1)  # (B,)
        return logits[np.arange(len(last)), last, :], state

    def decode_one_token(self, token: np.ndarray, state: DecodeState) -> tuple[np.ndarray, DecodeState]:
        """Feed (B,) tokens at the next position: (B, V) logits and the cache grown by one."""
        B = state.attention_mask.shape[0]
        logits, state = self.feed(np.asarray(token, dtype=np.int64).reshape(B, 1), state)
        return logits[:, -1, :], state

    def decode_n_tokens(self, token: np.ndarray, state: DecodeState, n: int, config: GenerationConfig,
                        rng: np.random.Generator, done: np.ndarray, result: GenerationResult,
                        keep_logits: bool = False, on_token: Callable[[np.ndarray], None] | None = None
                        ) -> DecodeState:
        """Feed ``token`` and up to n - 1 further ones, appending each chosen token to ``result`` (with timings).

        Stops early when every row has produced eos, or when the next position would pass max_positions. A runner
        that offers a :meth:`~mhaexport.runtime.runner.Runner.stepper` (a shared cache on the CPU) is stepped
        through it: the same calls with nothing else between them (its logits array is reused from step to step,
        which is why this loop hands them to no one but the sampler and ``keep_logits``'s copies); else each step
        is :meth:`decode_one_token`. Measured: the host's time between two runs of the bench-size Llama fell from
        ~0.58 to ~0.25 ms, onnxruntime-genai's loop's ~0.20 (docs/CHANGELOG.md, "The deploy loop's steps").
        """
        eos = config.eos_token_id
        limit = self.runner.max_length
        steps = self.runner.stepper(state.cache, state.attention_mask, n, state.capacity) if n > 0 else None
        length = state.length
        clock, sampling = self.clock, config.sampling
        left = len(done) - int(done.sum())  # rows still generating (only eos stops one)
        for _ in range(n):
            if not left:
                result.stop_reason, result.message = STOP_EOS, f"every row produced eos id {eos}"
                break
            if length + 1 > limit:
                result.stop_reason = STOP_MAX_POS
                result.message = (f"stopped at {self.runner.limit_text()}: the cache holds {length} positions, "
                                  f"the most this export accepts, after {max(map(len, result.tokens))} new tokens")
                break
            t0 = clock()
            if steps is None:
                logits, state = self.decode_one_token(token, state)
            else:
                logits = steps.step(token)
            token = next_tokens(logits, sampling, rng)
            result.step_s.append(clock() - t0)
            result.step_positions.append(length)
            length += 1
            if keep_logits:
                result.step_logits.append(np.asarray(logits, dtype=np.float64))
            live = None if on_token is None else ~done  # (no allocation on the plain loop's steps)
            left -= _append(result, token, done, eos)
            if live is not None:
                on_token(np.where(live, token, -1))
        if steps is not None:
            cache, mask = steps.finish()
            state = DecodeState(cache, mask, state.capacity)
        return state

    def generate(self, prompts: Sequence[Sequence[int]] | np.ndarray, config: GenerationConfig = GenerationConfig(),
                 *, keep_logits: bool = False, on_token: Callable[[np.ndarray], None] | None = None
                 ) -> GenerationResult:
        """Generate up to ``config.max_new_tokens`` tokens after each prompt (a batch, left-padded).
        ``keep_logits``: also keep the (B, V) logits each token was chosen from (verify's margins). ``on_token``:
        called with each step's (B,) chosen tokens as they come (-1 for a row that had already stopped): streaming.
        It runs outside the timed spans of the loop's decode steps."""
        if config.max_new_tokens < 1:
            raise RuntimeOptionError(f"max_new_tokens must be >= 1, got {config.max_new_tokens}")
        c = self.contract
        ids, mask, lengths = pad_prompts(prompts, c.vocab_size, c.max_positions, config.pad_token_id,
                                         side=getattr(self.runner, "padding", "left"))
        rng = np.random.default_rng(config.sampling.seed)
        result = GenerationResult([[] for _ in lengths], STOP_MAX_NEW, "", lengths,
                                  providers=list(self.runner.providers))
        done = np.zeros(len(lengths), dtype=bool)
        t0 = self.clock()
        # the cache sized for this generation (prompt + new tokens), as onnxruntime-genai sizes its own
        logits, state = self.prefill(ids, mask, ids.shape[1] + config.max_new_tokens)
        result.prefill_s = self.clock() - t0
        token = next_tokens(logits, config.sampling, rng)
        result.first_token_s = self.clock() - t0
        if keep_logits:
            result.step_logits.append(np.asarray(logits, dtype=np.float64))
        _append(result, token, done, config.eos_token_id)
        if on_token is not None:
            on_token(token)
        self.decode_n_tokens(token, state, config.max_new_tokens - 1, config, rng, done, result, keep_logits,
                             on_token)
        if result.stop_reason == STOP_MAX_NEW and not result.message:
            if config.eos_token_id is not None and done.all():
                result.stop_reason, result.message = STOP_EOS, f"every row produced eos id {config.eos_token_id}"
            else:
                result.message = f"generated max_new_tokens={config.max_new_tokens}"
        return result


def _append(result: GenerationResult, token: np.ndarray, done: np.ndarray, eos: int | None) -> int:
    """Append each live row's token; a row that produced ``eos`` is done. Returns how many rows this step finished."""
    finished = 0
    for b, t in enumerate(token.tolist()):
        if not done[b]:
            result.tokens[b].append(t)
            if t == eos:
                done[b] = True
                finished += 1
    return finished
