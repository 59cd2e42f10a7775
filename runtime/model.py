"""Deploy from Python, text in and text out: an export folder loaded once, with the ``generate()`` people know.
Torch-free and transformers-free (numpy, onnxruntime, and ``tokenizers`` for a folder that carries a tokenizer)::

    import mhaexport.runtime as rt
    model = rt.load("out/small")                             # hash-checked session + the folder's tokenizer
    model.generate("The river ", max_new_tokens=32)          # -> the continuation, a str
    for piece in model.stream("The river ", max_new_tokens=32):
        print(piece, end="", flush=True)                     # text as it is decoded
    model.generate("The river ", streamer=print_piece)       # a callable gets each piece; transformers'
                                                             # TextStreamer (put/end) gets the token ids
    for ev in model.serve(["The river ", "Once upon"], rows=4):   # continuous batching: requests join and
        ev.request, ev.text                                  # leave a running batch, tokens streamed
    model.generate("The river ", draft="prompt-lookup")      # speculative decoding (or draft=a smaller export)

It runs on onnxruntime-genai's own loop where that is installed and the folder ships a genai_config.json the
genai-config check accepts, else on the decode loop verify proved and bench timed
(:class:`~mhaexport.runtime.decode.DecodeLoop`); ``model.engine`` says which ("onnxruntime-genai" or "mhaexport"),
``model.engine_reason`` why, ``load(..., engine="mhaexport")`` forces ours (:mod:`mhaexport.runtime.engine`). Greedy
decoding gives the same tokens on both. The folder's tokenizer: :mod:`mhaexport.runtime.tokenizer` (tokenizer.json,
or UTF-8 bytes for the built-in models).
It is not a transformers ``GenerationMixin`` model: transformers' ``generate`` runs torch tensors and torch caches
through ``forward``, which this runtime never imports (Optimum's ``ORTModelForCausalLM`` is that adapter, on torch).
"""

from __future__ import annotations

import dataclasses
import queue
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from mhaexport.core.errors import RuntimeInputError, RuntimeOptionError
from mhaexport.runtime.decode import DecodeLoop, GenerationConfig, GenerationResult
from mhaexport.runtime.engine import AUTO, open_generator
from mhaexport.runtime.generator import Generator
from mhaexport.runtime.genai import GenAIGenerator
from mhaexport.runtime.sampling import SamplingConfig
from mhaexport.runtime.serve import Request, Served
from mhaexport.runtime.speculative import DEFAULT_DRAFT_TOKENS, DraftModel, PromptLookup
from mhaexport.runtime.tokenizer import TextTokenizer, for_folder

# a streamer: a callable taking text pieces, or an object with put(ids) / end() (transformers' BaseStreamer)
Streamer = Any


def load(folder: str | Path, providers: Sequence[str] | str = ("cpu",), *, threads: int | None = None,
         engine: str = AUTO, **session: Any) -> TextModel:
    """Load an export folder for generation: its hash-checked snapshot on the loop ``engine`` picks (``"auto"``:
    onnxruntime-genai's where it runs the folder as deployed, else mhaexport's; ``"mhaexport"``;
    ``"onnxruntime-genai"``: see :func:`mhaexport.runtime.engine.open_generator`) on ``providers`` (``"cpu"``,
    ``"cuda"``; a requested provider that does not really run raises ProviderUnavailable), and its tokenizer.
    ``threads``: intra-op threads of either loop's session. ``session``: more :class:`~mhaexport.runtime.Generator`
    options (opt_level, io_binding, cache_optimized; mhaexport's loop only, so ``"auto"`` picks it)."""
    return TextModel(open_generator(folder, providers, threads=threads, engine=engine, **session))


class _Pieces:
    """The text a row's new tokens add, handed out piece by piece: each call decodes all the new tokens so far
    (so a tokenizer that merges or spells spaces into tokens stays right) and returns what was not handed out yet,
    holding back an unfinished UTF-8 character (U+FFFD at the end) until its bytes are all there."""

    def __init__(self, tok: TextTokenizer, prompt: list[int]) -> None:
        self.tok, self.prompt, self.new, self.said = tok, prompt, [], ""

    def add(self, token: int) -> str:
        self.new.append(token)
        text = self.tok.continuation(self.prompt, self.new)
        if text.endswith("\ufffd"):
            return ""
        piece, self.said = text[len(self.said):] if text.startswith(self.said) else text, text
        return piece

    def rest(self) -> str:
        text = self.tok.continuation(self.prompt, self.new)
        piece = text[len(self.said):] if text.startswith(self.said) else ""
        self.said = text
        return piece


class TextModel:
    """A loaded export folder: ``generate`` (text or ids in, the same out), ``stream`` (an iterator of text
    pieces), ``tokenizer`` (encode / decode), ``engine`` (whose loop generates: "onnxruntime-genai" or
    "mhaexport") and ``engine_reason`` (why), ``generator`` (mhaexport's :class:`Generator` — prefill,
    decode_one_token, forward — or onnxruntime-genai's :class:`GenAIGenerator`), ``providers`` (what the session
    really runs on), ``eos_token_id`` (where a generation stops unless told: the tokenizer's; on
    onnxruntime-genai, whose loop always has one, else the config's)."""

    def __init__(self, generator: Generator | GenAIGenerator) -> None:
        self.generator = generator
        self._loop: Generator | None = None  # mhaexport's loop beside onnxruntime-genai's (serve, speculative)
        self.engine, self.engine_reason = generator.engine, generator.engine_reason
        self.tokenizer: TextTokenizer | None = for_folder(generator.export)
        self.providers = generator.providers
        self.eos_token_id = self.tokenizer.eos_token_id if self.tokenizer is not None else None
        if self.eos_token_id is None:
            self.eos_token_id = getattr(generator, "default_eos_token_id", None)

    def __repr__(self) -> str:
        kind = self.tokenizer.kind if self.tokenizer is not None else "no tokenizer: token ids only"
        return f"TextModel({self.generator.folder}, {self.engine}, {self.providers[0]}, {kind})"

    def _config(self, max_new_tokens: int, do_sample: bool, temperature: float | None, top_k: int | None,
                top_p: float | None, seed: int | None, eos_token_id: int | None) -> GenerationConfig:
        if do_sample or (temperature or 0.0) > 0.0:
            sampling = SamplingConfig(temperature=1.0 if temperature is None else temperature, top_k=top_k,
                                      top_p=top_p, seed=seed)
        else:  # greedy, as transformers' generate without do_sample
            sampling = SamplingConfig(seed=seed)
        eos = self.eos_token_id if eos_token_id is None else eos_token_id
        return GenerationConfig(max_new_tokens=max_new_tokens, eos_token_id=eos, sampling=sampling)

    def _rows(self, inputs: Any) -> tuple[list[list[int]], bool, bool]:
        """(token ids per prompt, whether the input was text, whether it was one prompt)."""
        if isinstance(inputs, str):
            return [self._encode(inputs)], True, True
        if isinstance(inputs, np.ndarray):
            inputs = inputs.tolist()
        if isinstance(inputs, Sequence) and inputs and all(isinstance(x, str) for x in inputs):
            return [self._encode(x) for x in inputs], True, False
        if isinstance(inputs, Sequence) and inputs and all(isinstance(x, (int, np.integer)) for x in inputs):
            return [[int(x) for x in inputs]], False, True
        if isinstance(inputs, Sequence) and inputs and all(isinstance(x, (Sequence, np.ndarray)) for x in inputs):
            return [[int(t) for t in x] for x in inputs], False, False
        raise RuntimeInputError("inputs: give a str, a list of str, a list of token ids or a list of such lists, "
                                f"not {type(inputs).__name__} {inputs!r:.60}")

    def _encode(self, text: str) -> list[int]:
        if self.tokenizer is None:
            raise RuntimeInputError(f"{self.generator.folder} has no tokenizer (vocab_size "
                                    f"{self.generator.contract.vocab_size}, no tokenizer.json): give token ids")
        return self.tokenizer.encode(text)

    def ours(self) -> Generator:
        """mhaexport's loop over this folder: the generator itself, or where onnxruntime-genai's loop generates, a
        :class:`Generator` opened once over the same snapshot (continuous batching and speculative decoding run on
        it; onnxruntime-genai 0.18's Engine batches a file without PagedAttention in static batches only)."""
        if isinstance(self.generator, Generator):
            return self.generator
        if self._loop is None:
            self._loop = Generator(self.generator.export, threads=self.generator.threads)
        return self._loop

    def serve(self, requests: Sequence[str | Sequence[int] | Request], *, rows: int = 4, max_new_tokens: int = 32,
              eos_token_id: int | None = None, prefixes: Sequence[str | Sequence[int]] = ()) -> Iterator[Served]:
        """Continuous batching (:mod:`mhaexport.runtime.serve`): ``requests`` — text, token ids, or
        :class:`~mhaexport.runtime.serve.Request` (its own budget and arrival step) — served over ``rows`` rows of
        one batch, each token yielded as a :class:`~mhaexport.runtime.serve.Served` as it is handed out (``request``:
        the index given, ``token``, ``text``: the text it adds for a text request, ``finished``: "eos" or
        "max_new_tokens" on its last). Greedy: each request's tokens are its tokens alone. ``prefixes``: prompts'
        shared beginnings (a system prompt) whose cache is computed once and reused by every request starting with
        one. Runs on mhaexport's loop (:meth:`ours`)."""
        reqs, texts = [], []
        for i, r in enumerate(requests):
            if isinstance(r, Request):
                reqs.append(r)
                texts.append(False)
            elif isinstance(r, str):
                reqs.append(Request(self._encode(r), max_new_tokens))
                texts.append(True)
            else:
                reqs.append(Request(r, max_new_tokens))
                texts.append(False)
        pre = [self._encode(p) if isinstance(p, str) else [int(t) for t in p] for p in prefixes]
        eos = self.eos_token_id if eos_token_id is None else eos_token_id
        pieces = {i: _Pieces(self.tokenizer, list(r.prompt)) for i, r in enumerate(reqs)
                  if texts[i] and self.tokenizer is not None}
        for ev in self.ours().serve(reqs, rows, GenerationConfig(eos_token_id=eos), prefixes=pre):
            if ev.request in pieces:
                text = pieces[ev.request].add(ev.token)
                if ev.finished:
                    text += pieces[ev.request].rest()
                ev = dataclasses.replace(ev, text=text)
            yield ev

    def _drafter(self, draft: Any) -> PromptLookup | DraftModel:
        """``draft`` as a drafter: "prompt-lookup", a loaded TextModel or Generator, or an export folder's path."""
        if isinstance(draft, (PromptLookup, DraftModel)):
            return draft
        if draft == PromptLookup.name:
            return PromptLookup()
        if isinstance(draft, TextModel):
            return DraftModel(DecodeLoop(draft.ours().runner))
        if isinstance(draft, Generator):
            return draft.draft_model()
        if isinstance(draft, (str, Path)):
            return Generator(draft, ("cpu",)).draft_model()
        raise RuntimeOptionError(f"draft: 'prompt-lookup', a loaded model or an export folder, not "
                                 f"{type(draft).__name__}")

    def generate(self, inputs: str | Sequence[str] | Sequence[int] | Sequence[Sequence[int]] | np.ndarray, *,
                 max_new_tokens: int = 32, do_sample: bool = False, temperature: float | None = None,
                 top_k: int | None = None, top_p: float | None = None, seed: int | None = 0,
                 eos_token_id: int | None = None, streamer: Streamer | None = None,
                 return_result: bool = False, draft: Any = None,
                 num_draft_tokens: int = DEFAULT_DRAFT_TOKENS) -> Any:
        """Generate after ``inputs``: a str gives the continuation (a str), a list of str a list of them; token
        ids (one list, or a list of lists) give the new token ids the same way (only the new ones: transformers'
        ``generate`` also repeats the prompt). Greedy unless ``do_sample`` (or a temperature > 0); stops at
        ``eos_token_id`` (default: the folder's) or ``max_new_tokens``. ``streamer``: a callable given each text
        piece as it is decoded (one prompt), or an object with ``put(ids)`` / ``end()`` — transformers'
        ``TextStreamer`` protocol: the prompt's ids, then each new token, as numpy arrays. ``return_result``: the
        :class:`GenerationResult` (tokens, stop reason, timings, ``engine``) with ``texts``, instead. On
        onnxruntime-genai's loop greedy decoding gives the same tokens; sampling draws from its own random generator
        (a seed repeats its tokens, not mhaexport's sampler's). ``draft``: speculative decoding of one prompt,
        greedy, on mhaexport's loop — "prompt-lookup" (n-grams of the prompt) or a smaller export sharing the
        vocabulary (a loaded model or its folder), ``num_draft_tokens`` checked per call of this model; the same
        tokens as without, ``return_result``'s ``speculative`` the counts (:mod:`mhaexport.runtime.speculative`)."""
        rows, text, one = self._rows(inputs)
        cfg = self._config(max_new_tokens, do_sample, temperature, top_k, top_p, seed, eos_token_id)
        if draft is not None:
            if len(rows) != 1 or streamer is not None:
                raise RuntimeOptionError("speculative decoding (draft=...) takes one prompt and no streamer")
            result = self.ours().speculative(rows[0], cfg, self._drafter(draft), k=num_draft_tokens)
            streamer = None
        on_token = None
        if streamer is not None:
            on_token, finish = self._streaming(streamer, rows)
        if draft is None:
            result = self.generator.generate(rows, cfg, on_token=on_token)
        if streamer is not None:
            finish()
        texts = ([self.tokenizer.continuation(r, t) for r, t in zip(rows, result.tokens)]
                 if self.tokenizer is not None else None)
        if return_result:
            result.texts = texts
            return result
        out = texts if text else result.tokens
        return out[0] if one else out

    def _streaming(self, streamer: Streamer, rows: list[list[int]]) -> tuple[Callable, Callable]:
        if hasattr(streamer, "put") and hasattr(streamer, "end"):  # transformers' BaseStreamer protocol
            if len({len(r) for r in rows}) > 1:  # its put() takes one (batch, length) array of prompt ids
                raise RuntimeInputError("a put/end streamer takes one prompt or prompts of one length (transformers' "
                                        f"streamers take a (batch, length) array); these have lengths "
                                        f"{sorted({len(r) for r in rows})}")
            streamer.put(np.asarray(rows[0] if len(rows) == 1 else rows, dtype=np.int64))
            return (lambda tokens: streamer.put(np.asarray(tokens[tokens >= 0], dtype=np.int64))), streamer.end
        if not callable(streamer):
            raise RuntimeInputError(f"streamer: a callable taking text, or an object with put/end, not "
                                    f"{type(streamer).__name__}")
        if len(rows) != 1 or self.tokenizer is None:
            raise RuntimeInputError("a text streamer takes one prompt of a folder with a tokenizer")
        pieces = _Pieces(self.tokenizer, rows[0])

        def on_token(tokens: np.ndarray) -> None:
            if tokens[0] >= 0 and (piece := pieces.add(int(tokens[0]))):
                streamer(piece)

        def finish() -> None:
            if piece := pieces.rest():
                streamer(piece)

        return on_token, finish

    def stream(self, prompt: str, **options: Any) -> Iterator[str]:
        """The continuation of ``prompt`` as an iterator of text pieces, each as soon as it is decoded (the
        generation runs in a worker thread; an error in it is raised here). ``options``: as :meth:`generate`."""
        pieces: queue.Queue = queue.Queue()
        done = object()

        def work() -> None:
            try:
                self.generate(prompt, streamer=pieces.put, **options)
            except BaseException as e:  # noqa: BLE001 - handed to the reading thread, raised there
                pieces.put(e)
            pieces.put(done)

        worker = threading.Thread(target=work, name="mhaexport-stream", daemon=True)
        worker.start()
        while (item := pieces.get()) is not done:
            if isinstance(item, BaseException):
                worker.join()
                raise item
            yield item
        worker.join()
