"""Speculative decoding over the one decode loop: a drafter proposes up to k tokens, the target file scores all of them
in one call with its past (k + 1 positions: the last token and the drafts), the longest prefix of drafts that agrees
with the target's own greedy choice is kept, plus the target's token at the first disagreement (or after the last
draft), and the target's cache is rewound to what was kept. Greedy output equals plain greedy decoding token for
token (the acceptance rule, not the draft's quality, decides every token; verify's ``speculative`` check holds every
runtime to it). Torch-free::

    from mhaexport.runtime import DecodeLoop, PromptLookup, speculative_generate
    result = speculative_generate(DecodeLoop(runner), prompt, GenerationConfig(max_new_tokens=64), PromptLookup())
    result.tokens, result.speculative          # the tokens, and drafted / accepted / target calls

Drafters: :class:`PromptLookup` (n-grams of the prompt and what was generated: no second model) and
:class:`DraftModel` (a smaller export sharing the vocabulary, greedy, with its own cache rewound the same way).

The rewind per cache layout (:meth:`DecodeLoop.rewind`): a concat cache is sliced to the kept positions; a shared
buffer's mask goes back (its sequence lengths: the slots after it are written over by the next call); a window cache
keeps exactness by copying its window-sized buffers before a call that would pass their slots (they evict in place,
so positions past the window cannot be taken back by the mask) and, when drafts were rejected, restoring them and
feeding the kept tokens once more (one more call, only past the window's buffer).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from mhaexport.core.errors import RuntimeInputError, RuntimeOptionError
from mhaexport.runtime.decode import (STOP_EOS, STOP_MAX_NEW, STOP_MAX_POS, DecodeLoop, DecodeState, GenerationConfig,
                                      GenerationResult, pad_prompts)

DEFAULT_DRAFT_TOKENS = 4


def accepts(logits: np.ndarray, draft: int) -> bool:
    """Whether the target keeps ``draft`` at a position whose (V,) ``logits`` it scored: exactly when it is the
    target's own greedy choice (argmax; a near-tie is not agreement — plain greedy takes the argmax)."""
    return int(np.argmax(logits)) == int(draft)


class PromptLookup:
    """Drafts by prompt lookup: the longest n-gram (``ngram`` tokens down to ``min_ngram``) ending the sequence so far
    that occurred earlier in it (the prompt and what was generated), and the tokens that followed its latest earlier
    occurrence. No second model; repetitive text (code, templates, quoting the prompt) is what it drafts well."""

    name = "prompt-lookup"

    def __init__(self, ngram: int = 3, min_ngram: int = 1) -> None:
        if not 1 <= min_ngram <= ngram:
            raise RuntimeOptionError(f"prompt lookup: 1 <= min_ngram <= ngram, got {min_ngram} and {ngram}")
        self.ngram, self.min_ngram = ngram, min_ngram

    def propose(self, sequence: Sequence[int], k: int) -> list[int]:
        seq = list(sequence)
        for n in range(min(self.ngram, len(seq) - 1), self.min_ngram - 1, -1):
            tail = seq[-n:]
            for start in range(len(seq) - n - 1, -1, -1):  # the latest earlier occurrence first
                if seq[start:start + n] == tail:
                    return seq[start + n:start + n + k]
        return []


class DraftModel:
    """Drafts with a smaller model sharing the target's vocabulary: ``loop`` over its runner, greedy, its own cache
    kept across rounds and rewound to what the target accepted (a window cache: restored as the target's is)."""

    name = "draft-model"

    def __init__(self, loop: DecodeLoop) -> None:
        self.loop = loop
        self.state: DecodeState | None = None
        self.fed: list[int] = []  # the tokens in its cache, in order
        self.mark = None
        self.calls = 0

    def start(self, prompt: Sequence[int], positions: int) -> None:
        """A fresh cache for a generation after ``prompt`` of at most ``positions`` positions."""
        self.state, self.fed, self.mark = self.loop.empty(1, min(positions, self.loop.runner.max_length)), [], None

    def propose(self, sequence: Sequence[int], k: int) -> list[int]:
        seq = list(sequence)
        common = next((i for i, (a, b) in enumerate(zip(self.fed, seq)) if a != b), min(len(self.fed), len(seq)))
        common = min(common, len(seq) - 1)  # the last token is fed now, for its logits
        self.state, kept = self.loop.rewind(self.state, common, self.mark)
        self.fed = self.fed[:kept]
        room = (self.state.capacity or self.loop.runner.max_length) - len(seq)
        k = max(0, min(k, room))
        if k == 0:
            return []
        if len(seq) - 1 > kept:  # committed tokens the draft has not seen (kept before the last)
            _, self.state = self.loop.feed(np.asarray([seq[kept:-1]], np.int64), self.state)
            self.calls += 1
        self.fed = seq[:-1]
        self.mark = self.loop.checkpoint(self.state, k)
        logits, self.state = self.loop.feed(np.asarray([seq[-1:]], np.int64), self.state)
        self.calls += 1
        self.fed.append(seq[-1])
        drafts = [int(np.argmax(logits[0, -1]))]
        while len(drafts) < k:
            logits, self.state = self.loop.feed(np.asarray([[drafts[-1]]], np.int64), self.state)
            self.calls += 1
            self.fed.append(drafts[-1])
            drafts.append(int(np.argmax(logits[0, -1])))
        return drafts


@dataclass
class SpeculativeStats:
    """What a speculative generation did: its drafter, the rounds (target calls scoring drafts), tokens drafted and
    accepted, target calls in all (a round, a plain step where nothing was drafted, a feed again after a window
    cache's restore), and the draft model's calls."""

    drafter: str
    k: int
    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    target_calls: int = 0
    refeeds: int = 0
    draft_calls: int = 0
    accepted_per_round: list[int] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"drafter": self.drafter, "k": self.k, "rounds": self.rounds, "drafted": self.drafted,
                "accepted": self.accepted, "target_calls": self.target_calls, "refeeds": self.refeeds,
                "draft_calls": self.draft_calls,
                "acceptance": round(self.accepted / self.drafted, 4) if self.drafted else None}


def speculative_generate(loop: DecodeLoop, prompt: Sequence[int] | np.ndarray, config: GenerationConfig,
                         drafter: PromptLookup | DraftModel, *, k: int = DEFAULT_DRAFT_TOKENS,
                         keep_logits: bool = False) -> GenerationResult:
    """Greedy generation after one ``prompt`` with drafts from ``drafter`` checked ``k`` at most per target call
    (see the module). The :class:`GenerationResult` of the plain loop — tokens (eos included), stop reason, timings:
    ``step_s`` one entry per target call after the prefill — with ``speculative`` (:class:`SpeculativeStats` as a
    dict) and, ``keep_logits``, the (1, V) logits each token was chosen from. RuntimeOptionError for sampling
    (greedy only: acceptance by rejection sampling is not implemented) or k < 1."""
    if not config.sampling.greedy:
        raise RuntimeOptionError("speculative decoding here is greedy only (temperature 0): its output equals plain "
                                 "greedy decoding token for token")
    if k < 1:
        raise RuntimeOptionError(f"k (draft tokens per call) must be >= 1, got {k}")
    if config.max_new_tokens < 1:
        raise RuntimeOptionError(f"max_new_tokens must be >= 1, got {config.max_new_tokens}")
    c = loop.contract
    ids, mask, lengths = pad_prompts([prompt], c.vocab_size, c.max_positions, config.pad_token_id)
    if isinstance(drafter, DraftModel):
        dc = drafter.loop.contract
        if dc.vocab_size != c.vocab_size:
            raise RuntimeInputError(f"the draft model's vocabulary ({dc.vocab_size} tokens) is not the target's "
                                    f"({c.vocab_size}): a draft model must share it")
    stats = SpeculativeStats(drafter.name, k)
    result = GenerationResult([[]], STOP_MAX_NEW, "", lengths, providers=list(loop.runner.providers))
    eos, limit = config.eos_token_id, loop.runner.max_length
    positions = min(ids.shape[1] + config.max_new_tokens + k, limit)
    clock = loop.clock
    t0 = clock()
    logits, state = loop.prefill(ids, mask, positions)
    result.prefill_s = clock() - t0
    token = int(np.argmax(logits[0]))
    result.first_token_s = clock() - t0
    out = result.tokens[0]
    out.append(token)
    if keep_logits:
        result.step_logits.append(np.asarray(logits, dtype=np.float64))
    if isinstance(drafter, DraftModel):
        drafter.start(ids[0].tolist(), positions)
    seq = ids[0].tolist() + [token]
    capacity = state.capacity or limit
    while len(out) < config.max_new_tokens and token != eos:
        if state.length + 1 > capacity:
            result.stop_reason = STOP_MAX_POS
            result.message = (f"stopped at {loop.runner.limit_text()}: the cache holds {state.length} positions "
                              f"after {len(out)} new tokens")
            break
        t1 = clock()
        room = min(k, config.max_new_tokens - len(out) - 1, capacity - state.length - 1)
        drafts = [int(d) for d in drafter.propose(seq, room)][:room] if room > 0 else []
        before = state.length
        mark = loop.checkpoint(state, 1 + len(drafts))
        logits, state = loop.feed(np.asarray([[token, *drafts]], np.int64), state)  # (1, 1 + d, V)
        stats.target_calls += 1
        if drafts:
            stats.rounds += 1
            stats.drafted += len(drafts)
        a = 0
        for i in range(len(drafts) + 1):  # the drafts the target agrees with, then its own token
            row = logits[0, i]
            agreed = i < len(drafts) and accepts(row, drafts[i])
            chosen = drafts[i] if agreed else int(np.argmax(row))
            out.append(chosen)
            a += agreed
            if keep_logits:
                result.step_logits.append(np.asarray(row[None], dtype=np.float64))
            if not agreed or chosen == eos or len(out) >= config.max_new_tokens:
                break
        if drafts:
            stats.accepted += a
            stats.accepted_per_round.append(a)
        keep = before + 1 + a  # the token fed and the drafts kept; the last chosen token is fed next call
        state, kept = loop.rewind(state, keep, mark)
        if kept < keep:  # a window cache restored past its buffer: the kept tokens fed again
            _, state = loop.feed(np.asarray([[token, *drafts[:a]][kept - before:]], np.int64), state)
            stats.target_calls += 1
            stats.refeeds += 1
        seq = seq + drafts[:a] + [out[-1]]
        token = out[-1]
        result.step_s.append(clock() - t1)
        result.step_positions.append(before)
    if isinstance(drafter, DraftModel):
        stats.draft_calls = drafter.calls
    if result.stop_reason == STOP_MAX_NEW:
        if eos is not None and out and out[-1] == eos:
            result.stop_reason, result.message = STOP_EOS, f"produced eos id {eos}"
        else:
            result.message = f"generated max_new_tokens={config.max_new_tokens}"
    result.speculative = stats.to_dict()
    return result


__all__ = ["DEFAULT_DRAFT_TOKENS", "DraftModel", "PromptLookup", "SpeculativeStats", "accepts",
           "speculative_generate"]
