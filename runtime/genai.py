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

from mhaexport.artifact import ExportFolder, opened, read_json
from mhaexport.core.errors import (ArtifactError, MhaExportError, RuntimeFailure, RuntimeInputError, RuntimeOptionError,
                              first_line)
from mhaexport.core.libraries import library_call
from mhaexport.runtime import budget
from mhaexport.runtime.session import QUIET_LOG
from mhaexport.runtime.decode import (STOP_EOS, STOP_MAX_NEW, STOP_MAX_POS, GenerationConfig, GenerationResult,
                                      pad_prompts)
from mhaexport.runtime.genai_config import (GenaiConfig, GenaiDecoder, GenaiModel, GenaiSessionOptions,
                                            section)

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


def check_options(folder: str | Path, shown: object = None, *, trust_code: bool = False) -> dict:
    """``folder``'s genai_config.json (read inside it, never through a link), held to the classified fields of
    :mod:`mhaexport.runtime.genai_fields` before onnxruntime-genai sees it: a name that leaves the folder is
    UnsafeFolder, an option that loads code or writes files (custom_ops_library, enable_profiling, path-valued
    config entries and provider options, unknown fields) UntrustedCode unless ``trust_code``. ``shown``: how
    messages name the folder (the folder the user named, not its snapshot). Returns the document."""
    from mhaexport.artifact.confine import read_inside
    from mhaexport.runtime.genai_fields import refuse_unsafe

    from mhaexport.core.untrusted import load_json

    where = f"{shown or folder}/{GENAI_CONFIG}"
    config = load_json(read_inside(folder, GENAI_CONFIG, where), where)  # the one bounded reader (size, depth)
    refuse_unsafe(config, shown or folder, trust_code)
    return config


def model_fields(config: dict) -> GenaiModel:
    """genai_config.json's ``model`` section with the fields mhaexport's own loop reads typed and bounded: vocab_size
    and context_length counts, pad_token_id an id, eos_token_id an id or a list of ids (ArtifactError naming the
    field otherwise: a crafted config is one line, not a KeyError)."""
    from mhaexport.core.numbers import MAX_INT

    model = GenaiModel.from_dict(GenaiConfig.from_dict(config, GENAI_CONFIG).model, f"{GENAI_CONFIG}: model")

    def count(v: object) -> bool:
        return isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_INT

    for name in ("vocab_size", "context_length", "pad_token_id"):
        if not count(getattr(model, name)):
            raise ArtifactError(f"{GENAI_CONFIG}: model.{name} is {getattr(model, name)!r:.40}, expected a count")
    eos = model.eos_token_id
    if not (count(eos) or (isinstance(eos, list) and eos and all(count(e) for e in eos))):
        raise ArtifactError(f"{GENAI_CONFIG}: model.eos_token_id is {eos!r:.40}, expected an id or a list of ids")
    return model


def budgeted(gen, call: Callable, *args):
    """One call of onnxruntime-genai's generator under the budget (runtime/budget.py): past it the generator is told
    to terminate its session's run (``terminate_session``) and the call raises OverBudget."""
    with budget.watching(lambda: gen.set_runtime_option("terminate_session", "1"), "an onnxruntime-genai call"):
        return call(*args)


def genai_model(folder: str | Path, threads: int | None = None, *, eos_token_id: int | list[int] | None = None,
                trust_code: bool = False, shown: object = None):
    """onnxruntime-genai's Model over ``folder``'s genai_config.json; with ``threads`` its decoder session gets that
    many intra-op threads (and one inter-op thread), with ``eos_token_id`` its loop stops at that id instead of the
    config's — overlays on the config, the file untouched (it is hashed), as bench's other rows set their threads.
    The config is first held to :func:`check_options` (``trust_code``: the user's ``--trust-code``; ``shown``: the
    folder as messages name it): the one place og.Model is created, so no option reaches it unchecked."""
    og = import_og()
    check_options(folder, shown, trust_code=trust_code)
    # ONNX Runtime's log of the sessions onnxruntime-genai makes off but for fatal errors: its lines echo the folder's
    # node names and its own log_id to stderr raw (every failure still comes back as an exception, shown escaped)
    session: dict = {"log_severity_level": QUIET_LOG}
    if threads is not None:
        session.update(intra_op_num_threads=int(threads), inter_op_num_threads=1)
    overlay: dict = {"decoder": {"session_options": session}}
    if eos_token_id is not None:
        overlay["eos_token_id"] = eos_token_id
    with library_call("onnxruntime-genai", f"{shown or folder}/{GENAI_CONFIG}", RuntimeFailure):
        config = og.Config(str(folder))
        config.overlay(json.dumps({"model": overlay}))
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
    budgeted(gen, gen.append_tokens, ids.astype(np.int32))
    res.prefill_s = clock() - t0
    if not gen.is_done():
        budgeted(gen, gen.generate_next_token)
        res.first_token_s = clock() - t0
    while not gen.is_done():
        t = clock()
        budgeted(gen, gen.generate_next_token)
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


def genai_greedy(folder: str | Path, prompts: Sequence[Sequence[int]], max_length: int, *,
                 trust_code: bool = False) -> list[list[int]]:
    """Greedy generation through onnxruntime-genai: each prompt plus new tokens, up to ``max_length`` tokens in all
    (or eos). Prompts of different lengths are batched right-padded; pad tokens are removed from the result.
    ``trust_code``: the config may load code or write files (:func:`check_options`)."""
    with opened(folder, "onnx") as ef:  # hashes of model.onnx and genai_config.json; the snapshot goes when done
        if GENAI_CONFIG not in ef.entry("onnx").files:
            raise ArtifactError(f"{ef.path} has no {GENAI_CONFIG}: export it with `mhaexport onnx --seq-dynamic -o "
                                f"{ef.path}`")
        model = model_fields(read_json(ef.file("onnx", GENAI_CONFIG), "onnxruntime-genai config"))
        ids, _mask, _lengths = pad_prompts(prompts, model.vocab_size, model.context_length, model.pad_token_id,
                                           side="right")
        if max_length > model.context_length:
            raise RuntimeInputError(f"max_length={max_length} exceeds the model's "
                                    f"context_length={model.context_length}")
        # the snapshot: the files whose hashes were checked
        res = genai_generate(genai_model(ef.root, trust_code=trust_code, shown=ef.path), ids, max_length,
                             eos_token_id=model.eos_token_id)
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
    budgeted(gen, gen.append_tokens, ids)
    steps = [np.asarray(gen.get_logits(), dtype=np.float32).reshape(B, -1)]  # (B, V) at each row's last token
    for _ in range(new_tokens):
        if gen.is_done():
            break
        budgeted(gen, gen.generate_next_token)
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


# ---- deploying on onnxruntime-genai's loop ---------------------------------------------------------------------

ENGINE = "onnxruntime-genai"
_SEED_RANGE = 2 ** 31  # onnxruntime-genai's random_seed is a signed 32-bit int


# onnxruntime-genai's provider names in a config's provider_options -> ONNX Runtime's
_PROVIDERS = {"cuda": "CUDAExecutionProvider", "dml": "DmlExecutionProvider", "webgpu": "WebGpuExecutionProvider",
              "qnn": "QNNExecutionProvider", "openvino": "OpenVINOExecutionProvider",
              "nvtensorrtrtx": "NvTensorRTRTXExecutionProvider"}


def config_providers(config: dict) -> list[str]:
    """The providers a genai_config.json's decoder names in ``session_options.provider_options`` ([]: the CPU)."""
    root = section(GenaiConfig, config)
    model = section(GenaiModel, root.model) if root is not None else None
    decoder = section(GenaiDecoder, model.decoder) if model is not None else None
    options = section(GenaiSessionOptions, decoder.session_options) if decoder is not None else None
    listed = options.provider_options if options is not None else None
    return [name for opt in listed if isinstance(opt, dict) for name in opt] if isinstance(listed, list) else []


def _eos_set(eos: int | Sequence[int] | None) -> set[int]:
    if eos is None or isinstance(eos, bool):
        return set()
    return {int(eos)} if isinstance(eos, (int, np.integer)) else {int(e) for e in eos}


class GenAIGenerator:
    """onnxruntime-genai's own loop (``og.Model`` / ``og.Generator``, its C++ search and KV cache) over an opened
    export folder, in the deploy runtime's shape: ``generate(prompts, GenerationConfig, on_token=...)`` returns the
    :class:`GenerationResult` mhaexport's :class:`~mhaexport.runtime.Generator` returns (tokens per prompt, eos
    included, stop reason, message, timings), ``engine == "onnxruntime-genai"``.

    It loads the folder's snapshot (``export.root``: the bytes whose hashes were checked, never the folder the
    user named), its genai_config.json with ``threads`` (and an eos, see below) overlaid. Greedy decoding gives
    mhaexport's loop's tokens (tests/test_deploy_genai.py); what differs, by onnxruntime-genai's design:

    - sampling draws from its own random generator: a seed gives the same tokens run to run, not the tokens
      mhaexport's sampler draws with that seed (``seed`` is taken modulo 2**31, its ``random_seed`` range);
    - its loop always stops at an eos: the one asked (``eos_token_id``, overlaid on the config: one model per id
      asked, loaded once), else the config's (``default_eos_token_id``; the first of a list when the folder ships
      a tokenizer, as the tokenizer's eos is);
    - it reads a prompt's trailing ``pad_token_id`` tokens as right padding, and its ``max_length`` (prompt + new
      tokens) stops at ``context_length``, one token before mhaexport's loop stops at the last position.

    Such a call (:meth:`why_not`) runs on ``fallback()`` (``engine="auto"``: mhaexport's loop over the same
    snapshot, loaded on first need; the result's ``engine`` says so) or, without one, raises RuntimeInputError
    (a prompt ending in the pad id) or stops at ``context_length`` (stop reason ``max_positions``).
    """

    engine = ENGINE

    def __init__(self, export: ExportFolder, *, threads: int | None = None, reason: str = "",
                 fallback: Callable[[], object] | None = None, clock: Callable[[], float] = time.perf_counter,
                 trust_code: bool = False) -> None:
        og = import_og()
        self.trust_code = trust_code  # the config's options may load code or write files (check_options)
        self.export, self.folder, self.contract = export, export.path, export.contract
        self.entry = export.entry("onnx")
        if GENAI_CONFIG not in self.entry.files:
            raise ArtifactError(f"{export.path} ships no {GENAI_CONFIG}: onnxruntime-genai has nothing to run")
        self.config = read_json(export.file("onnx", GENAI_CONFIG), "onnxruntime-genai config")
        model = model_fields(self.config)
        self.context_length = model.context_length
        self.pad_token_id = model.pad_token_id
        self._config_eos = eos = model.eos_token_id
        if isinstance(eos, list) and eos and "tokenizer.json" in self.entry.files:
            eos = eos[0]  # the shipped tokenizer's eos (mhaexport.runtime.tokenizer.for_folder)
        self.default_eos_token_id = eos
        self.threads, self.fallback, self.clock = threads, fallback, clock
        self.engine_reason = reason
        self.version = getattr(og, "__version__", "")
        self.providers = [_PROVIDERS.get(n.lower(), n) for n in config_providers(self.config)] + \
            ["CPUExecutionProvider"]  # the config's, in its order, then the CPU
        self.warnings: list[str] = []
        self._models: dict = {}
        self._ours = None
        self.model = self._model(None)  # loaded now, as the Generator creates its session

    def __repr__(self) -> str:
        return f"GenAIGenerator({self.folder}, onnxruntime-genai {self.version})"

    def _model(self, eos: int | None):
        """The og.Model whose loop stops at ``eos`` (None: the default eos), loaded once per id."""
        key = self.default_eos_token_id if eos is None else int(eos)
        key = tuple(key) if isinstance(key, list) else key
        if key not in self._models:
            config_eos = self._config_eos
            same = key == (tuple(config_eos) if isinstance(config_eos, list) else config_eos)
            try:
                eos = None if same else list(key) if isinstance(key, tuple) else key
                self._models[key] = genai_model(self.export.root, self.threads, eos_token_id=eos,
                                                trust_code=self.trust_code, shown=self.folder)
            except MhaExportError:
                raise
            except Exception as e:  # noqa: BLE001 - onnxruntime-genai's own exceptions (a file it cannot load)
                raise RuntimeFailure(f"onnxruntime-genai cannot load {self.folder}: {first_line(e)}") from None
        return self._models[key]

    def why_not(self, prompts: Sequence[Sequence[int]] | np.ndarray, config: GenerationConfig) -> str | None:
        """Why onnxruntime-genai's loop would not generate what mhaexport's loop does for this call, or None."""
        rows = [list(map(int, np.asarray(p).reshape(-1))) for p in prompts]
        if isinstance(self.pad_token_id, int):
            ends = [i for i, r in enumerate(rows) if r and r[-1] == self.pad_token_id]
            if ends:
                return (f"prompt {ends[0]} ends with token id {self.pad_token_id}, the config's pad_token_id: "
                        "onnxruntime-genai reads trailing pad tokens as right padding")
        longest = max((len(r) for r in rows), default=0)
        if longest + config.max_new_tokens > self.context_length:
            return (f"a prompt of {longest} tokens + max_new_tokens={config.max_new_tokens} passes "
                    f"context_length={self.context_length}: onnxruntime-genai stops one token before mhaexport's "
                    "loop does at the last position")
        return None

    def generate(self, prompts: Sequence[Sequence[int]] | np.ndarray, config: GenerationConfig = GenerationConfig(),
                 *, on_token: Callable[[np.ndarray], None] | None = None) -> GenerationResult:
        """Generate up to ``config.max_new_tokens`` tokens after each prompt (a batch: right-padded with the
        config's pad id, as onnxruntime-genai batches) on onnxruntime-genai's loop. ``on_token``: each step's (B,)
        chosen tokens as they come (-1 for a row that had already stopped), as mhaexport's loop calls it."""
        if config.max_new_tokens < 1:
            raise RuntimeOptionError(f"max_new_tokens must be >= 1, got {config.max_new_tokens}")
        c = self.contract
        pad = self.pad_token_id if isinstance(self.pad_token_id, int) else 0
        ids, _mask, lengths = pad_prompts(prompts, c.vocab_size, c.max_positions, pad, side="right")
        why = self.why_not(prompts, config)
        if why is not None and self.fallback is not None:
            if self._ours is None:
                self._ours = self.fallback()
            res = self._ours.generate(prompts, config, on_token=on_token)
            res.message = f"{res.message} (on mhaexport's loop: {why})"
            return res
        if why is not None and why.startswith("prompt"):
            raise RuntimeInputError(f"{why}; generate it with engine='mhaexport'")
        B, L = ids.shape
        max_length = min(L + config.max_new_tokens, self.context_length)
        if max_length <= L:
            raise RuntimeInputError(f"a prompt of {L} tokens leaves onnxruntime-genai no position to generate in "
                                    f"(context_length={self.context_length}); use engine='mhaexport'")
        eos = config.eos_token_id
        stops = _eos_set(self.default_eos_token_id if eos is None else eos)
        og = import_og()
        params = og.GeneratorParams(self._model(eos))
        s = config.sampling
        search: dict = {"max_length": max_length, "batch_size": B, "do_sample": not s.greedy}
        if not s.greedy:  # every option set: the config's search defaults (top_k 1) never leak in
            search.update(temperature=float(s.temperature), top_k=int(s.top_k or c.vocab_size),
                          top_p=float(s.top_p or 1.0),
                          random_seed=-1 if s.seed is None else int(s.seed) % _SEED_RANGE)
        params.set_search_options(**search)
        res = GenerationResult([[] for _ in range(B)], STOP_MAX_NEW, "", lengths, providers=list(self.providers),
                               engine=ENGINE)
        done = np.zeros(B, dtype=bool)
        clock = self.clock
        try:
            gen = og.Generator(self._model(eos), params)
            t0 = clock()
            budgeted(gen, gen.append_tokens, ids.astype(np.int32))
            res.prefill_s = clock() - t0
            first = True
            while not gen.is_done():
                t = clock()
                budgeted(gen, gen.generate_next_token)  # the first: choose from the prefill's logits; then run one token + choose
                token = np.asarray(gen.get_next_tokens(), dtype=np.int64)  # (B,)
                if first:
                    res.first_token_s, first = clock() - t0, False
                else:
                    res.step_s.append(clock() - t)
                    res.step_positions.append(L + len(res.step_s) - 1)
                live = ~done
                for b in np.flatnonzero(live):
                    res.tokens[b].append(int(token[b]))
                    if int(token[b]) in stops:
                        done[b] = True
                if on_token is not None:
                    on_token(np.where(live, token, -1))
        except MhaExportError:
            raise
        except Exception as e:  # noqa: BLE001 - onnxruntime-genai's own exceptions: one line, ours
            raise RuntimeFailure(f"onnxruntime-genai failed: {first_line(e)}") from None
        n = max(map(len, res.tokens))
        if stops and done.all():
            shown = next(iter(stops)) if len(stops) == 1 else sorted(stops)
            res.stop_reason, res.message = STOP_EOS, f"every row produced eos id {shown}"
        elif max_length < L + config.max_new_tokens and n < config.max_new_tokens:
            res.stop_reason = STOP_MAX_POS
            res.message = (f"stopped at onnxruntime-genai's context_length={self.context_length} (its max_length "
                           f"counts the prompt and every new token) after {n} new tokens")
        else:
            res.message = f"generated max_new_tokens={config.max_new_tokens}"
        return res
