"""The deploy-side decode loop over an ONNX export: prefill, then one token at a time with the KV cache carried from
``present.*`` to ``past_key_values.*``. Torch-free: numpy and onnxruntime only.

The cache stays an ``OrtValue`` on the session's device between steps (IO binding): on CUDA it never comes back to
the host; only the last position's logits do, for sampling. Split as in gpt-fast: ``prefill``, ``decode_one_token``,
``decode_n_tokens``; ``generate`` ties them together for a batch of prompts (left-padded).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnxruntime as ort

from mhaexport import iospec
from mhaexport.errors import ArtifactError, RuntimeInputError
from mhaexport.exporter.manifest import contract_from_manifest
from mhaexport.runtime.sampling import SamplingConfig, next_tokens
from mhaexport.runtime.session import DEFAULT_OPT_LEVEL, SessionConfig, create_session

STOP_MAX_NEW = "max_new_tokens"
STOP_EOS = "eos"
STOP_MAX_POS = "max_positions"

# The KV cache dtypes numpy can hold without extra packages (bfloat16 needs ml_dtypes, and ONNX Runtime's numpy
# feeds have no bfloat16).
KV_DTYPES = {"float32": np.dtype(np.float32), "float16": np.dtype(np.float16)}


def kv_dtype(name: str) -> np.dtype:
    """The numpy dtype of the manifest's KV cache dtype ``name``; ArtifactError for one the runtime cannot hold."""
    if name in KV_DTYPES:
        return KV_DTYPES[name]
    if name == "bfloat16":
        raise ArtifactError("this export's KV cache is bfloat16: a bfloat16 KV cache is not supported by the numpy "
                            "runtime (mhaexport.runtime); export with --dtype float32 or float16")
    raise ArtifactError(f"KV cache dtype {name!r} in the manifest is not supported by the numpy runtime; "
                        f"expected one of {', '.join(KV_DTYPES)}")


@dataclass(frozen=True)
class GenerationConfig:
    """What to generate: how many tokens, when to stop, and how to pick each one."""

    max_new_tokens: int = 32
    eos_token_id: int | None = None  # a row stops after producing it; generation stops when every row has
    pad_token_id: int = 0  # fills left padding (masked out, so its value does not matter)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)


@dataclass
class DecodeState:
    """The KV cache between steps: 2 * n_layers values (key, value per layer) and the mask that covers them."""

    past: list  # OrtValue (IO binding) or np.ndarray, each (B, H, S, D)
    attention_mask: np.ndarray  # int64 (B, S)

    @property
    def length(self) -> int:
        return int(self.attention_mask.shape[1])


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

    def to_dict(self, texts: list[str] | None = None) -> dict:
        """The JSON form `mhaexport generate --json` prints: tokens, text, stop_reason, message, prompt_lengths,
        providers, prefill_s, first_token_s. With one prompt, ``tokens`` (and ``text``) are that prompt's, not
        lists of one. ``texts``: the decoded continuation per prompt, or None when the model is not byte-level."""
        one = len(self.tokens) == 1
        return {"tokens": self.tokens[0] if one else self.tokens,
                "text": (texts[0] if one else texts) if texts is not None else None,
                "stop_reason": self.stop_reason, "message": self.message, "prompt_lengths": self.prompt_lengths,
                "providers": self.providers, "prefill_s": self.prefill_s, "first_token_s": self.first_token_s}


class Generator:
    """Generate from an export folder with ONNX Runtime.

    ``providers``: ``("cpu",)``, ``("cuda",)`` or full provider names. With ``strict_providers`` a requested
    provider the session does not really use raises ProviderUnavailable; otherwise it is listed in ``warnings``.
    """

    def __init__(self, folder: str | Path, providers: Sequence[str] | str = ("cpu",), *, threads: int | None = None,
                 opt_level: str = DEFAULT_OPT_LEVEL, strict_providers: bool = True, io_binding: bool = True,
                 cache_optimized: bool = False, profile_prefix: str | None = None) -> None:
        if isinstance(providers, str):
            providers = (providers,)
        cfg = SessionConfig(providers=tuple(providers), threads=threads, opt_level=opt_level,
                            cache_optimized=cache_optimized, strict_providers=strict_providers,
                            profile_prefix=profile_prefix)
        loaded = create_session(folder, cfg)
        self.folder = Path(folder)
        self.session = loaded.session
        self.manifest = loaded.manifest
        self.providers = loaded.providers
        self.device = loaded.device
        self.warnings = loaded.warnings
        self.optimized_from_cache = loaded.optimized_from_cache
        self.contract = contract_from_manifest(self.manifest)
        c = self.contract
        self.past_names = [n for i in range(c.n_layers) for n in iospec.past_names(i)]
        self.present_names = [n for i in range(c.n_layers) for n in iospec.present_names(i)]
        self.kv_dtype = kv_dtype(self.manifest["io"]["inputs"][self.past_names[0]]["dtype"])
        self.io_binding = io_binding

    # ---- one model call --------------------------------------------------------------------------------------

    def _empty_past(self, batch: int) -> list:
        c = self.contract
        empty = np.zeros((batch, c.n_heads, 0, c.head_dim), dtype=self.kv_dtype)  # (B, H, 0, D)
        if not self.io_binding:
            return [empty] * len(self.past_names)
        return [ort.OrtValue.ortvalue_from_numpy(empty, self.device, 0) for _ in self.past_names]

    def _run(self, input_ids: np.ndarray, attention_mask: np.ndarray, past: list) -> tuple[np.ndarray, list]:
        """(B, T) ids, (B, S) mask, 2L past values -> (B, T, V) logits on the host, 2L present values.

        A new IOBinding per call and a mask grown by np.concatenate: measured, creating a binding costs ~1 us
        (~0.4 us to clear and reuse one) and the concatenate ~1 us, against ~250 us for the small preset's decode
        step, so neither is worth carrying extra state between steps."""
        if not self.io_binding:
            feeds = {iospec.INPUT_IDS: input_ids, iospec.ATTENTION_MASK: attention_mask,
                     **dict(zip(self.past_names, past))}
            out = self.session.run(None, feeds)
            return out[0], out[1:]
        io = self.session.io_binding()
        io.bind_cpu_input(iospec.INPUT_IDS, input_ids)
        io.bind_cpu_input(iospec.ATTENTION_MASK, attention_mask)
        for name, value in zip(self.past_names, past):
            io.bind_ortvalue_input(name, value)
        io.bind_output(iospec.LOGITS, "cpu")  # only the logits come to the host
        for name in self.present_names:
            io.bind_output(name, self.device, 0)  # the cache stays on the session's device
        self.session.run_with_iobinding(io)
        outs = io.get_outputs()
        return outs[0].numpy(), list(outs[1:])

    def forward(self, input_ids: np.ndarray, attention_mask: np.ndarray,
                past_key_values: Sequence | None = None) -> tuple[np.ndarray, list[np.ndarray]]:
        """One checked call with numpy in and out: the decoder contract's (logits, present) on the host.

        ``past_key_values``: None, n_layers (key, value) pairs, or 2 * n_layers arrays, each (B, H, P, D).
        """
        input_ids, attention_mask = self._check_ids_mask(input_ids, attention_mask)
        B, T = input_ids.shape
        past = self._check_past(past_key_values, B, attention_mask.shape[1] - T)
        if self.io_binding:
            past = [ort.OrtValue.ortvalue_from_numpy(p, self.device, 0) for p in past]
        logits, present = self._run(input_ids, attention_mask, past)
        return logits, [p.numpy() if isinstance(p, ort.OrtValue) else p for p in present]

    # ---- input checks ----------------------------------------------------------------------------------------

    def _check_ids_mask(self, input_ids, attention_mask) -> tuple[np.ndarray, np.ndarray]:
        c = self.contract
        ids = np.asarray(input_ids)
        if ids.ndim != 2 or ids.shape[0] == 0 or ids.shape[1] == 0:
            raise RuntimeInputError(f"input_ids must be a non-empty (batch, seq) array, got shape {ids.shape}")
        if not np.issubdtype(ids.dtype, np.integer):
            raise RuntimeInputError(f"input_ids must hold integers, got {ids.dtype}")
        bad = ids[(ids < 0) | (ids >= c.vocab_size)]
        if bad.size:
            raise RuntimeInputError(f"token id {int(bad[0])} is outside the vocabulary [0, {c.vocab_size})")
        mask = np.asarray(attention_mask)
        if mask.ndim != 2 or mask.shape[0] != ids.shape[0] or mask.shape[1] < ids.shape[1]:
            raise RuntimeInputError(f"attention_mask must be (batch={ids.shape[0]}, past + seq >= {ids.shape[1]}), "
                                    f"got shape {mask.shape}")
        if mask.shape[1] > c.max_positions:
            raise RuntimeInputError(f"past + seq = {mask.shape[1]} exceeds the model's max_positions="
                                    f"{c.max_positions}")
        return np.ascontiguousarray(ids, dtype=np.int64), np.ascontiguousarray(mask, dtype=np.int64)

    def _check_past(self, past, batch: int, past_len: int) -> list[np.ndarray]:
        c = self.contract
        want = (batch, c.n_heads, past_len, c.head_dim)
        if past is None:
            if past_len != 0:
                raise RuntimeInputError(f"attention_mask covers {past_len} past positions but no past_key_values "
                                        "were given")
            return [np.zeros(want, dtype=self.kv_dtype)] * len(self.past_names)
        flat = [t for pair in past for t in pair] if past and isinstance(past[0], (tuple, list)) else list(past)
        if len(flat) != len(self.past_names):
            raise RuntimeInputError(f"past_key_values must hold {c.n_layers} (key, value) pairs "
                                    f"({len(self.past_names)} arrays), got {len(flat)} arrays")
        out = []
        for name, t in zip(self.past_names, flat):
            t = np.asarray(t)
            if t.shape != want:
                raise RuntimeInputError(f"{name} has shape {t.shape}, expected {want} [batch, n_heads, past, "
                                        "head_dim] with past = attention_mask width - seq")
            out.append(np.ascontiguousarray(t, dtype=self.kv_dtype))
        return out

    def pad_prompts(self, prompts: Sequence[Sequence[int]] | np.ndarray,
                    pad_token_id: int = 0) -> tuple[np.ndarray, np.ndarray, list[int]]:
        """Left-pad a batch of prompts: (B, L) ids, (B, L) mask (0 on padding), and each prompt's length."""
        c = self.contract
        rows = [list(map(int, np.asarray(p).reshape(-1))) for p in prompts]
        if not rows:
            raise RuntimeInputError("empty batch: give at least one prompt")
        for i, r in enumerate(rows):
            if not r:
                raise RuntimeInputError(f"prompt {i} is empty: each prompt needs at least one token")
            bad = [t for t in r if not 0 <= t < c.vocab_size]
            if bad:
                raise RuntimeInputError(f"prompt {i} holds token id {bad[0]}, outside the vocabulary "
                                        f"[0, {c.vocab_size})")
        lengths = [len(r) for r in rows]
        L = max(lengths)
        if L > c.max_positions:
            raise RuntimeInputError(f"prompt of {L} tokens is longer than the model's max_positions="
                                    f"{c.max_positions}")
        ids = np.full((len(rows), L), pad_token_id, dtype=np.int64)  # (B, L)
        mask = np.zeros((len(rows), L), dtype=np.int64)  # (B, L)
        for b, r in enumerate(rows):
            ids[b, L - len(r):] = r
            mask[b, L - len(r):] = 1
        return ids, mask, lengths

    # ---- the decode loop -------------------------------------------------------------------------------------

    def prefill(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> tuple[np.ndarray, DecodeState]:
        """Run the whole prompt once: the last position's (B, V) logits and the cache it leaves."""
        input_ids, attention_mask = self._check_ids_mask(input_ids, attention_mask)
        if attention_mask.shape[1] != input_ids.shape[1]:
            raise RuntimeInputError(f"prefill takes no past: attention_mask width {attention_mask.shape[1]} != "
                                    f"seq {input_ids.shape[1]}")
        logits, present = self._run(input_ids, attention_mask, self._empty_past(input_ids.shape[0]))
        return logits[:, -1, :], DecodeState(present, attention_mask)

    def decode_one_token(self, token: np.ndarray, state: DecodeState) -> tuple[np.ndarray, DecodeState]:
        """Feed (B,) tokens at the next position: (B, V) logits and the cache grown by one."""
        if state.length + 1 > self.contract.max_positions:
            raise RuntimeInputError(f"cannot decode past max_positions={self.contract.max_positions}")
        return self._decode_step(token, state)

    def _decode_step(self, token: np.ndarray, state: DecodeState) -> tuple[np.ndarray, DecodeState]:
        """decode_one_token without the max_positions check (the caller made it)."""
        B = state.attention_mask.shape[0]
        ids = np.asarray(token, dtype=np.int64).reshape(B, 1)  # (B, 1)
        mask = np.concatenate([state.attention_mask, np.ones((B, 1), dtype=np.int64)], axis=1)  # (B, S + 1)
        logits, present = self._run(ids, mask, state.past)
        return logits[:, -1, :], DecodeState(present, mask)

    def decode_n_tokens(self, token: np.ndarray, state: DecodeState, n: int, config: GenerationConfig,
                        rng: np.random.Generator, done: np.ndarray,
                        result: GenerationResult) -> DecodeState:
        """Feed ``token`` and up to n - 1 further ones, appending each chosen token to ``result`` (with timings).

        Stops early when every row has produced eos, or when the next position would pass max_positions.
        """
        eos = config.eos_token_id
        for _ in range(n):
            if done.all():
                result.stop_reason, result.message = STOP_EOS, f"every row produced eos id {eos}"
                return state
            if state.length + 1 > self.contract.max_positions:
                result.stop_reason = STOP_MAX_POS
                result.message = (f"stopped at max_positions={self.contract.max_positions}: the cache holds "
                                  f"{state.length} positions, the most this model accepts, after "
                                  f"{max(map(len, result.tokens))} new tokens")
                return state
            t0 = time.perf_counter()
            logits, state = self._decode_step(token, state)  # max_positions checked just above
            token = next_tokens(logits, config.sampling, rng)
            result.step_s.append(time.perf_counter() - t0)
            result.step_positions.append(state.length - 1)
            self._append(result, token, done, eos)
        return state

    @staticmethod
    def _append(result: GenerationResult, token: np.ndarray, done: np.ndarray, eos: int | None) -> None:
        for b, t in enumerate(token.tolist()):
            if not done[b]:
                result.tokens[b].append(int(t))
                if eos is not None and t == eos:
                    done[b] = True

    def generate(self, prompts: Sequence[Sequence[int]] | np.ndarray,
                 config: GenerationConfig = GenerationConfig()) -> GenerationResult:
        """Generate up to ``config.max_new_tokens`` tokens after each prompt (a batch, left-padded)."""
        if config.max_new_tokens < 1:
            raise RuntimeInputError(f"max_new_tokens must be >= 1, got {config.max_new_tokens}")
        ids, mask, lengths = self.pad_prompts(prompts, config.pad_token_id)
        rng = np.random.default_rng(config.sampling.seed)
        result = GenerationResult([[] for _ in lengths], STOP_MAX_NEW, "", lengths, providers=list(self.providers))
        done = np.zeros(len(lengths), dtype=bool)
        t0 = time.perf_counter()
        logits, state = self.prefill(ids, mask)
        result.prefill_s = time.perf_counter() - t0
        token = next_tokens(logits, config.sampling, rng)
        result.first_token_s = time.perf_counter() - t0
        self._append(result, token, done, config.eos_token_id)
        self.decode_n_tokens(token, state, config.max_new_tokens - 1, config, rng, done, result)
        if result.stop_reason == STOP_MAX_NEW and not result.message:
            if config.eos_token_id is not None and done.all():
                result.stop_reason, result.message = STOP_EOS, f"every row produced eos id {config.eos_token_id}"
            else:
                result.message = f"generated max_new_tokens={config.max_new_tokens}"
        return result
