"""Continuous batching over the one decode loop: a :class:`Scheduler` keeps a fixed number of rows of one batch
busy with a stream of requests. Requests of any prompt length arrive at given decode steps; each joins a free row
(its prompt fed into that row alone, after a prefix's cache where one was given), the batch decodes one token a row
per step, each row at its own position, and a row retires at its request's eos or token budget, its slots handed to
the next request. Torch-free::

    from mhaexport.runtime import DecodeLoop, Request, serve
    for ev in serve(DecodeLoop(runner), [Request([5, 17, 42], 8), Request([7, 7], 4, arrival=2)], rows=2):
        ev.request, ev.token, ev.finished          # streamed as decoded

Every cache layout the exporter makes: the positions of each row are laid out by the file's protocol
(:meth:`~mhaexport.runtime.protocol.Protocol.row_mask`: a concat cache's rows end at its last column, a shared or
window cache's start at slot 0) and the cache moves as the runner says (:meth:`DecodeLoop.feed_row`: a concat row
copied out and back, a shared row fed in place by address; :meth:`DecodeLoop.with_rows`). The decode steps are
:meth:`DecodeLoop.decode_n_tokens`'s (a shared cache's stepper between events), stopped when a row retires or a
request can join: the loop verify proved and bench times. A request's tokens equal its run alone (greedy; verify's
``continuous-batching`` check holds every runtime to it, logits within the batching noise eager itself shows).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from mhaexport.core.errors import RuntimeInputError, RuntimeOptionError
from mhaexport.runtime.decode import STOP_EOS, STOP_MAX_NEW, DecodeLoop, DecodeState, GenerationConfig, \
    GenerationResult
from mhaexport.runtime.sampling import next_tokens

# decode steps run between two hand-outs of tokens at most (a segment of the loop ends earlier when a row retires or
# a request can join): how late a streamed token can be, in steps
SEGMENT_STEPS = 16


@dataclass(frozen=True)
class Request:
    """One request: its prompt's token ids, how many tokens it may generate, the decode step it arrives at (0: at
    the start; a request waits for a free row after it arrives)."""

    prompt: tuple[int, ...]
    max_new_tokens: int = 32
    arrival: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "prompt", tuple(int(t) for t in np.asarray(self.prompt).reshape(-1)))
        if not self.prompt:
            raise RuntimeInputError("a request's prompt needs at least one token")
        if self.max_new_tokens < 1:
            raise RuntimeOptionError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.arrival < 0:
            raise RuntimeOptionError(f"arrival must be a decode step >= 0, got {self.arrival}")


@dataclass(frozen=True)
class Served:
    """One token handed out: the request's index (in the order given), the token, its index among the request's
    new tokens, the scheduler's decode step when it was chosen (0: before any), the row it ran in, and on the
    request's last token why it finished ("eos" | "max_new_tokens"; None before); ``text``: the text the token adds
    (:meth:`mhaexport.runtime.TextModel.serve`, a text request; None otherwise)."""

    request: int
    token: int
    index: int
    step: int
    row: int
    finished: str | None = None
    text: str | None = None


@dataclass
class Outcome:
    """What became of one request: its prompt's length, the row it ran in, the decode step it joined at, its tokens
    (eos included), why it finished, the prompt tokens whose cache came from a prefix, and (``keep_logits``) the (V,)
    logits each token was chosen from."""

    prompt_length: int
    row: int | None = None
    joined: int | None = None
    tokens: list[int] = field(default_factory=list)
    finished: str | None = None
    prefix: int = 0
    logits: list[np.ndarray] = field(default_factory=list)


class Scheduler:
    """Continuous batching of requests over ``rows`` rows of one :class:`DecodeLoop`'s runner (see the module).

    ``config``: max_new_tokens is each :class:`Request`'s own; its eos and sampling apply to every request (sampled
    tokens are draws of one generator over the batch, so they repeat run to run, not the tokens a request draws
    alone; greedy tokens equal each request's run alone). ``keep_logits``: keep each token's logits in
    :attr:`outcomes` (verify). ``prefixes``: token sequences whose cache is computed once and copied into the row of
    every request whose prompt starts with one (the longest that leaves it a token of its own). ``positions``: the
    positions each row's cache holds (default: the longest request's prompt + budget, all a row ever needs)."""

    def __init__(self, loop: DecodeLoop, rows: int = 4, config: GenerationConfig = GenerationConfig(), *,
                 keep_logits: bool = False, prefixes: Sequence[Sequence[int]] = (), positions: int | None = None
                 ) -> None:
        if rows < 1:
            raise RuntimeOptionError(f"rows must be >= 1, got {rows}")
        self.loop, self.rows, self.config, self.keep_logits = loop, rows, config, keep_logits
        self.positions = positions
        self.prefixes = [tuple(int(t) for t in p) for p in prefixes if len(p)]
        self.outcomes: list[Outcome] = []
        self.steps = 0  # decode steps run
        self.step_s: list[float] = []  # each decode step's seconds (run + choose)
        self.join_s: list[float] = []  # each request's prefill in its row
        self.prefill_s: list[float] = []  # each prefix's prefill

    # ---- the bookkeeping a planted bug would break (tests/test_serving_planted.py) ------------------------------
    def _retire(self, row: int) -> None:
        """Row ``row``'s request is done: the row is free and holds nothing (its length back to 0, so the next
        request's prompt starts at the row's first position and never sees its predecessor's cache)."""
        self._owner[row] = None
        self._lengths[row] = 0

    def run(self, requests: Sequence[Request]) -> Iterator[Served]:
        """Serve ``requests``, yielding each token as a :class:`Served` as soon as its decode segment ends (at most
        :data:`SEGMENT_STEPS` steps late). :attr:`outcomes` holds each request's outcome when it is done."""
        loop, c = self.loop, self.loop.contract
        requests = list(requests)
        for i, r in enumerate(requests):
            if not isinstance(r, Request):
                raise RuntimeInputError(f"request {i}: a mhaexport.runtime.Request, not {type(r).__name__}")
            bad = [t for t in r.prompt if not 0 <= t < c.vocab_size]
            if bad:
                raise RuntimeInputError(f"request {i}'s prompt holds token id {bad[0]}, outside the vocabulary "
                                        f"[0, {c.vocab_size})")
        if not requests:
            return
        positions = max(max(len(r.prompt) + r.max_new_tokens for r in requests), self.positions or 0)
        limit = loop.runner.max_length
        if positions > limit:
            worst = max(range(len(requests)), key=lambda i: len(requests[i].prompt) + requests[i].max_new_tokens)
            raise RuntimeInputError(f"request {worst}: a {len(requests[worst].prompt)}-token prompt + max_new_tokens="
                                    f"{requests[worst].max_new_tokens} passes {loop.runner.limit_text()}")
        self.outcomes = [Outcome(len(r.prompt)) for r in requests]
        self.steps, self.step_s, self.join_s, self.prefill_s = 0, [], [], []
        eos, sampling = self.config.eos_token_id, self.config.sampling
        rng = np.random.default_rng(sampling.seed)
        prefixes = self._prefix_states(positions)
        waiting = sorted(range(len(requests)), key=lambda i: (requests[i].arrival, i))
        R = self.rows
        self._owner: list[int | None] = [None] * R
        self._lengths = np.zeros(R, dtype=np.int64)
        last = np.zeros(R, dtype=np.int64)  # each row's next token to feed
        state = loop.with_rows(loop.empty(R, positions), self._lengths)
        clock = loop.clock

        def emit(i: int, row: int, token: int, logits: np.ndarray | None) -> Served:
            rec = self.outcomes[i]
            rec.tokens.append(token)
            if logits is not None:
                rec.logits.append(np.asarray(logits, dtype=np.float64))
            done = STOP_EOS if eos is not None and token == eos else \
                STOP_MAX_NEW if len(rec.tokens) >= requests[i].max_new_tokens else None
            rec.finished = done
            return Served(i, token, len(rec.tokens) - 1, self.steps, row, done)

        while waiting or any(o is not None for o in self._owner):
            if all(o is None for o in self._owner) and requests[waiting[0]].arrival > self.steps:
                self.steps = requests[waiting[0]].arrival  # nothing to decode until it arrives
            out: list[Served] = []
            for row in range(R):  # free rows take the requests that have arrived, in order
                while self._owner[row] is None and waiting and requests[waiting[0]].arrival <= self.steps:
                    i = waiting.pop(0)
                    t0 = clock()
                    logits, state = self._join(state, row, requests[i].prompt, prefixes, self.outcomes[i])
                    token = int(next_tokens(logits[None], sampling, rng)[0])
                    self.join_s.append(clock() - t0)
                    self.outcomes[i].row, self.outcomes[i].joined = row, self.steps
                    self._owner[row] = i
                    ev = emit(i, row, token, logits if self.keep_logits else None)
                    out.append(ev)
                    if ev.finished:
                        self._retire(row)
                    else:
                        last[row] = token
            yield from out
            live = [row for row in range(R) if self._owner[row] is not None]
            if not live:
                continue
            # a segment: until a row retires, a waiting request can take a free row, or SEGMENT_STEPS
            n = min(SEGMENT_STEPS, min(requests[self._owner[r]].max_new_tokens - len(self.outcomes[self._owner[r]].tokens)
                                       for r in live))
            if waiting and any(o is None for o in self._owner):
                n = min(n, max(1, requests[waiting[0]].arrival - self.steps))
            state = loop.with_rows(state, self._lengths)
            token = np.where([o is not None for o in self._owner], last, self.config.pad_token_id).astype(np.int64)
            result = GenerationResult([[] for _ in range(R)], STOP_MAX_NEW, "", [0] * R)
            owners = list(self._owner)
            out = []

            def on_token(tokens: np.ndarray) -> bool:
                self.steps += 1
                stop = False
                for row, i in enumerate(owners):
                    if i is None or self._owner[row] != i:
                        continue  # a free row was fed a pad token: nothing it holds (its length stays)
                    self._lengths[row] += 1
                    logits = result.step_logits[-1][row] if self.keep_logits else None
                    ev = emit(i, row, int(tokens[row]), logits)
                    out.append(ev)
                    if ev.finished:
                        self._retire(row)
                        stop = True
                    else:
                        last[row] = int(tokens[row])
                return stop or (bool(waiting) and requests[waiting[0]].arrival <= self.steps
                                and any(o is None for o in self._owner))

            steps_before = len(result.step_s)
            state = loop.decode_n_tokens(token, state, n, GenerationConfig(max_new_tokens=n + 1, sampling=sampling),
                                         rng, np.zeros(R, dtype=bool), result, self.keep_logits, on_token)
            self.step_s += result.step_s[steps_before:]
            yield from out

    def _prefix_states(self, positions: int) -> dict[tuple[int, ...], DecodeState]:
        """Each prefix's cache, computed once (a batch of one sized as the rows are)."""
        states = {}
        for p in self.prefixes:
            if p in states:
                continue
            t0 = self.loop.clock()
            _, states[p] = self.loop.prefill(np.asarray([p], dtype=np.int64), np.ones((1, len(p)), np.int64),
                                             positions)
            self.prefill_s.append(self.loop.clock() - t0)
        return states

    def _join(self, state: DecodeState, row: int, prompt: tuple[int, ...], prefixes: dict,
              rec: Outcome) -> tuple[np.ndarray, DecodeState]:
        """A request's prompt into row ``row`` (after the longest prefix whose cache it can reuse: that cache copied
        into the row first): the (V,) logits at its last token and the state."""
        hit = max((p for p in prefixes if len(p) < len(prompt) and prompt[:len(p)] == p), key=len, default=None)
        if hit is not None:
            state = self.loop.put_row(state, row, prefixes[hit], self._lengths)
            self._lengths[row] = len(hit)
            rec.prefix = len(hit)
            prompt = prompt[len(hit):]
        logits, state = self.loop.feed_row(state, row, prompt, self._lengths)
        self._lengths[row] += len(prompt)
        return logits[-1], state


def serve(loop: DecodeLoop, requests: Sequence[Request], rows: int = 4, config: GenerationConfig = GenerationConfig(),
          *, prefixes: Sequence[Sequence[int]] = ()) -> Iterator[Served]:
    """Serve ``requests`` by continuous batching over ``rows`` rows (:class:`Scheduler`), yielding each token as it
    is handed out."""
    yield from Scheduler(loop, rows, config, prefixes=prefixes).run(requests)


def alone(loop: DecodeLoop, request: Request, config: GenerationConfig = GenerationConfig(), *,
          keep_logits: bool = False) -> GenerationResult:
    """``request`` generated alone by the plain loop (batch of one): what its tokens in a continuous batch equal."""
    return loop.generate([list(request.prompt)], GenerationConfig(max_new_tokens=request.max_new_tokens,
                                                                  eos_token_id=config.eos_token_id,
                                                                  pad_token_id=config.pad_token_id,
                                                                  sampling=config.sampling),
                         keep_logits=keep_logits)


__all__ = ["Outcome", "Request", "SEGMENT_STEPS", "Scheduler", "Served", "alone", "serve"]
