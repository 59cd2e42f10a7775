"""The one KV-cache decode loop. The deploy runtime's Generator, verify's generation and kv-consistency checks,
bench's rows and the onnxruntime-genai comparison all drive this loop over a
:class:`~mhaexport.runtime.runner.Runner`, so what bench times is what verify proved.

Split as in gpt-fast: :meth:`DecodeLoop.prefill`, :meth:`DecodeLoop.decode_one_token`,
:meth:`DecodeLoop.decode_n_tokens`; :meth:`DecodeLoop.generate` ties them together for a batch of prompts (left
padded). :meth:`DecodeLoop.feed` appends any chunk of tokens (chunked prefill, a mask with holes for right padding).
Rows at their own positions, for the serving loops (:mod:`mhaexport.runtime.serve`'s continuous batching,
:mod:`mhaexport.runtime.speculative`): :meth:`DecodeLoop.with_rows` (each row's length), :meth:`DecodeLoop.feed_row`
(a request joining its row), :meth:`DecodeLoop.checkpoint` / :meth:`DecodeLoop.rewind` (positions taken back) and
:meth:`DecodeLoop.fork` (a prefix's cache reused) — the protocol says where a row's positions sit, the runner how
its cache moves.
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
from mhaexport.runtime.protocol import Concat, Protocol
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


@dataclass(frozen=True)
class Checkpoint:
    """What :meth:`DecodeLoop.rewind` needs besides the positions to keep: the state's length when it was taken and
    what the runner saved (None: nothing, the mask alone takes positions back)."""

    length: int
    saved: Any = None


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
    speculative: dict | None = None  # speculative decoding's counts (runtime/speculative.py), None without it

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
        # where a row's positions sit: the runner's protocol (an ONNX Runtime runner's), else the contract's
        self.protocol: Protocol = getattr(runner, "protocol", None) or Concat(None)

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
        ``on_token`` returning True stops the loop after that step (a serving loop's row retired). Returns the state
        after the last step fed.
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
            if live is not None and on_token(np.where(live, token, -1)):
                break  # the caller's stop (a serving loop: a row retired, a request arrives)
        if steps is not None:
            cache, mask = steps.finish()
            state = DecodeState(cache, mask, state.capacity)
        return state

    # ---- rows at their own positions (the serving loops) -----------------------------------------------------
    def with_rows(self, state: DecodeState, lengths: Sequence[int] | np.ndarray) -> DecodeState:
        """``state`` with its mask rebuilt from each row's real positions (``lengths``, the rows of a continuous
        batch, each at its own position), laid out as the protocol keeps rows (:meth:`Protocol.row_mask`). A cache
        whose rows end at its last column (concat) drops the first columns no row holds any more; a shared buffer's
        mask is as wide as its longest row."""
        lengths = np.asarray(lengths, dtype=np.int64)
        top = int(lengths.max(initial=0))
        cache, width = state.cache, state.length
        if self.protocol.in_place:
            width = top
        elif top < width:
            cache, width = self.runner.cache_columns(cache, width - top, width), top
        return DecodeState(cache, self.protocol.row_mask(lengths, width), state.capacity)

    def feed_row(self, state: DecodeState, row: int, input_ids: Sequence[int] | np.ndarray,
                 lengths: Sequence[int] | np.ndarray) -> tuple[np.ndarray, DecodeState]:
        """Feed ``input_ids`` to row ``row`` alone, after the ``lengths[row]`` positions it holds (0: a request
        starting in a free row): the row's (T, V) logits and the state with ``lengths[row]`` grown by T (its mask
        rebuilt by :meth:`with_rows` from the lengths given). A concat cache's row is copied out, fed and copied back
        (the batch widened when it grew past it); a shared buffer's is fed in place, bound by address."""
        ids = np.asarray(input_ids, dtype=np.int64).reshape(1, -1)  # (1, T)
        lengths = np.array(lengths, dtype=np.int64)
        past, T = int(lengths[row]), ids.shape[1]
        if past + T > (state.capacity or self.runner.max_length):
            limit = (f"the {state.capacity} positions this cache was made for" if state.capacity
                     else self.runner.limit_text())
            raise RuntimeInputError(f"cannot feed past {limit}: row {row} holds {past} positions and {T} more were "
                                    "given")
        start, stop = self.protocol.row_columns(state.length, past)
        one = self.runner.cache_row(state.cache, row, start, stop)
        logits, one = self.runner.step(ids, np.ones((1, past + T), dtype=np.int64), one)
        cache = self.runner.cache_put_row(state.cache, row, one)
        lengths[row] = past + T
        width = max(state.length, past + T) if not self.protocol.in_place else state.length
        return logits[0], self.with_rows(DecodeState(cache, np.zeros((len(lengths), width), np.int64),
                                                     state.capacity), lengths)

    def put_row(self, state: DecodeState, row: int, one: DecodeState,
                lengths: Sequence[int] | np.ndarray) -> DecodeState:
        """``one``'s cache (a batch of one sized as ``state``'s rows: a prefix's) copied into row ``row``, which
        then holds its ``one.length`` positions; the state's mask rebuilt from ``lengths`` with that row's so."""
        lengths = np.array(lengths, dtype=np.int64)
        lengths[row] = one.length
        cache = self.runner.cache_put_row(state.cache, row, one.cache)
        width = state.length if self.protocol.in_place else max(state.length, one.length)
        return self.with_rows(DecodeState(cache, np.zeros((len(lengths), width), np.int64), state.capacity), lengths)

    def checkpoint(self, state: DecodeState, adding: int) -> Checkpoint:
        """What :meth:`rewind` needs to take back up to ``adding`` positions fed after ``state``: its length, and
        where the cache cannot give positions back by its mask alone (a window cache's window-sized buffers, which
        evict in place once a row passes their slots) a copy of those buffers."""
        return Checkpoint(state.length, self.runner.cache_checkpoint(state.cache, state.length, adding))

    def rewind(self, state: DecodeState, keep: int, mark: Checkpoint | None = None) -> tuple[DecodeState, int]:
        """``state`` with its first ``keep`` positions only (every row: speculative decoding's rejected drafts taken
        back): a concat cache sliced, a shared buffer's mask shortened (its slots after it written over later).
        Returns the state and the positions it holds: ``keep``, or where ``mark`` saved buffers that evicted, the
        checkpoint's length — the caller feeds the positions from there to ``keep`` again."""
        if keep >= state.length:
            return state, state.length
        if mark is not None and mark.saved is not None:
            cache = self.runner.cache_restore(state.cache, mark.saved)
            keep = min(keep, mark.length)
        else:
            cache = self.runner.cache_columns(state.cache, 0, keep)
        return DecodeState(cache, np.ascontiguousarray(state.attention_mask[:, :keep]), state.capacity), keep

    def fork(self, state: DecodeState) -> DecodeState:
        """A state that grows apart from ``state`` (a prefix's cache reused by several requests): the concat cache's
        arrays shared (never written), a shared buffer's copied."""
        return DecodeState(self.runner.cache_fork(state.cache), state.attention_mask.copy(), state.capacity)

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
