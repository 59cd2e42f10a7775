"""The seeded input sweep: which (batch, seq, past, left padding) shapes verify runs every artifact at.

Covers batch 1 and > 1; seq 1, 2, lengths the exporter never used (it traced batch=2, seq=3, past=5) up to
max_positions; past 0, 1 and many; left-padded rows; for a windowed model, prompts and cached decodes at each
layer's window W-1, W, W+1 and far beyond it. Same seed, same inputs, on every machine.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from mhaexport.core.errors import ConfigError
from mhaexport.core.iospec import ModelContract, dummy_inputs

SWEEPS = ("quick", "full")


@dataclass(frozen=True)
class Case:
    """One input shape: batch rows, new tokens, cached tokens, and left padding per row (over past + seq)."""

    batch: int
    seq: int
    past: int
    pad: tuple[int, ...] = field(default_factory=tuple)
    seed: int = 0

    @property
    def name(self) -> str:
        p = f" pad={list(self.pad)}" if any(self.pad) else ""
        return f"b={self.batch} seq={self.seq} past={self.past}{p}"

    def to_dict(self) -> dict:
        return {**asdict(self), "pad": list(self.pad), "name": self.name}

    def inputs(self, contract: ModelContract, dtype=np.float32):
        """(input_ids, attention_mask, past_key_values) as numpy, reproducible from ``seed``."""
        return dummy_inputs(contract, self.batch, self.seq, self.past, seed=self.seed, pad=self.pad, dtype=dtype)

    def real_rows(self) -> np.ndarray:
        """bool (B, seq): query positions holding real tokens (left padding excluded)."""
        mask = np.ones((self.batch, self.past + self.seq), dtype=bool)
        for b, p in enumerate(self.pad):
            mask[b, :p] = False
        return mask[:, self.past:]

    def real_keys(self) -> np.ndarray:
        """bool (B, past + seq): key positions holding real tokens."""
        mask = np.ones((self.batch, self.past + self.seq), dtype=bool)
        for b, p in enumerate(self.pad):
            mask[b, :p] = False
        return mask


def build_sweep(contract: ModelContract, kind: str = "quick", seed: int = 0) -> list[Case]:
    """The cases for ``kind`` ("quick" or "full"), clipped to max_positions, deduplicated, in a stable order.
    None uses the exporter's (seq=3, past=5), so every case runs at lengths never seen at export."""
    if kind not in SWEEPS:
        raise ConfigError(f"sweep {kind!r}: expected one of {', '.join(SWEEPS)}")
    M = contract.max_positions
    specs: list[tuple[int, int, int, tuple[int, ...]]] = [
        (1, 1, 0, ()),          # one token, empty cache
        (1, 2, 0, ()),          # seq=2 (torch.export specializes 0/1; 2 must be general)
        (2, 7, 0, (0, 3)),      # unseen length, a left-padded row
        (1, 1, 1, ()),          # decode step with past=1
        (2, 1, 17, (0, 5)),     # decode with a longer, padded cache
        (3, 11, 6, (0, 2, 9)),  # batch 3, padding reaching into the new tokens
        (1, 4, 9, ()),          # chunked prefill after a cache
        (1, M, 0, ()),          # the longest prompt
        (1, 1, M - 1, ()),      # the last decode step max_positions allows
    ]
    for w in sorted({w for w in contract.windows or () if w}):  # across every sliding window (issue 37)
        specs += [
            (1, w - 1, 0, ()), (1, w, 0, ()), (1, w + 1, 0, ()),  # prompts ending at W-2, W-1 (inside), W (beyond)
            (2, w + 2, 0, (0, 3)),      # a left-padded row whose real tokens still cross W
            (1, 1, w - 1, ()), (1, 1, w, ()), (1, 1, w + 1, ()),  # cached decodes at positions W-1, W, W+1
            (2, 3, 2 * w, (0, w)),      # chunked prefill far beyond, one row padded by a whole window
            (1, 1, 4 * w, ()),          # a decode far beyond
        ]
    if kind == "full":
        rng = np.random.default_rng(seed)
        for past in (0, 1, 2, 8, 33, M // 2):
            for seq in (1, 2, 5, 16, 31, 64):
                if seq + past <= M:
                    specs.append((2, seq, past, ()))
        specs += [(4, 13, 0, (0, 1, 6, 12)), (2, 9, 40, (0, 30)), (1, M - 7, 7, ()), (8, 1, 63, tuple(range(0, 64, 8)))]
        for _ in range(8):  # random shapes: reproducible from the seed
            total = int(rng.integers(2, M + 1))
            seq = int(rng.integers(1, total + 1))
            b = int(rng.integers(1, 5))
            pad = tuple(int(rng.integers(0, total)) if i else 0 for i in range(b))
            specs.append((b, seq, total - seq, pad))
    cases, seen = [], set()
    for i, (b, seq, past, pad) in enumerate(specs):
        if seq < 1 or seq + past > M:
            continue
        pad = tuple(min(p, seq + past - 1) for p in pad)  # every row keeps at least one real token
        key = (b, seq, past, pad)
        if key in seen:
            continue
        seen.add(key)
        cases.append(Case(b, seq, past, pad, seed=seed * 1000 + i))
    return cases


def unseen(case: Case, export_sizes: tuple[int, int]) -> bool:
    """True when the case's seq or past length differs from the ones used at export."""
    return (case.seq, case.past) != tuple(export_sizes)


# ---- what the sweep holds at once: the estimate a memory planner reads before the run ---------------------------

# eager's references of the sweep's cases kept for later checks (results.SweepContext.reference), at most this many
# bytes in all (the small cases': a long case's reference is computed again where a check asks for it again; the
# sweep itself computes each once)
REFERENCE_CACHE_BYTES = 16 << 20
_ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8}


def case_bytes(contract, case: Case, dtype: str = "float32") -> int:
    """Bytes of one run of ``case``: its inputs (ids, mask, the past cache) and its outputs (the decoder's logits
    (B, T, V) and present (B, H_kv, past + T, D) per layer; the attention block's output, present and attention
    weights), at ``dtype``'s width (ids and mask: int64)."""
    n = _ITEMSIZE.get(dtype, 4)
    b, t, p = case.batch, case.seq, case.past
    ints = 8 * b * (t + p + t)  # input_ids (B, T) and attention_mask (B, past + T), int64
    if hasattr(contract, "vocab_size"):  # the decoder
        kv = 2 * contract.n_layers * b * contract.n_kv_heads * contract.head_dim
        return ints + n * (kv * p + b * t * contract.vocab_size + kv * (p + t))
    e, h, hk = contract.d_model, contract.n_heads, contract.n_kv_heads or contract.n_heads  # the attention block
    d = e // h
    return n * (b * t * e + 2 * b * hk * p * d + b * t * e + 2 * b * hk * (p + t) * d + b * h * t * (p + t))


def call_bytes(contract, case: Case, dtype: str = "float32", scores: float = 2) -> int:
    """A runtime's own working memory for one call of ``case``, beyond its inputs and outputs (an estimate: one
    layer's attention scores and probabilities, ``scores`` tensors of (B, H, T, past + T) alive at once, and its MLP
    activation (B, T, d_ff ~ 4 x d), which a runtime holds at its widest point)."""
    n = _ITEMSIZE.get(dtype, 4)
    b, t, s = case.batch, case.seq, case.past + case.seq
    d = contract.n_heads * contract.head_dim if hasattr(contract, "head_dim") else contract.d_model
    return int(n * (scores * b * contract.n_heads * t * s + 4 * b * t * d))


# score-sized tensors a runtime holds at once inside one attention layer when nothing else of the call is in memory:
# measured, ONNX Runtime's CPU session without an arena (a 2,048-token prompt, d 1536, 12 heads: 0.84 GB above the
# session, ~4 x the (1, 12, 2048, 2048) scores; eager's attention holds ~3); whole mapped verify runs peaked at 4.4
# (M: d 1536, 12 heads) and 4.6 (L: d 2048, 16 heads) above the baseline while freed blocks stayed in the heap, at
# 3.8 (M) since they are returned (spill.return_freed_memory): 4.5, the larger runs' figure with a margin
SPILLED_SCORES = 4.5


def spilled_peak_bytes(contract, cases: list[Case], dtype: str = "float32", long_checks: bool = True
                       ) -> tuple[int, Case | None]:
    """:func:`sweep_peak_bytes` of the mapped mode, where every large input and output lives in file-backed pages
    (runtime/spill.py): one call's working memory (:data:`SPILLED_SCORES` score tensors and the MLP's) or eager's
    logits before they are spilled, whichever is larger, plus the comparison's blocks and the small references kept.
    Returns the bytes and the case that needs the most."""
    n = _ITEMSIZE.get(dtype, 4)
    cases = list(cases)
    if long_checks and hasattr(contract, "vocab_size"):
        cases.append(Case(1, contract.max_positions, 0))
    peak, largest = 0, None
    for case in cases:
        logits = n * case.batch * case.seq * getattr(contract, "vocab_size", 0)
        one = max(call_bytes(contract, case, dtype, scores=SPILLED_SCORES), logits)
        if one > peak:
            peak, largest = one, case
    return int(peak + _compare_workspace() + REFERENCE_CACHE_BYTES), largest


def _compare_workspace() -> int:
    """compare()'s working memory: its float64 temporaries of one block (~10) and the selection."""
    from mhaexport.verify.compare import CHUNK_ELEMENTS

    return 12 * 8 * CHUNK_ELEMENTS


def sweep_peak_bytes(contract, cases: list[Case], dtype: str = "float32", runtimes_at_once: int = 1,
                     long_checks: bool = True) -> int:
    """The most bytes of activations verify's checks hold at once for this sweep, weights and sessions not
    included: the sweep runs case by case, holding a case's inputs, eager's reference, ``runtimes_at_once``
    runtimes' outputs (2 where a provider pair is compared with each other: ort-cuda and ort-cpu), one call's working
    memory and the comparison's float64 blocks (compare.CHUNK_ELEMENTS), plus the small references kept for later checks
    (REFERENCE_CACHE_BYTES at most). ``long_checks``: also the checks that prefill max_positions tokens once
    (kv-consistency's long context, generation's long prompt: one such call's outputs and working memory, and the
    rows they keep). A planner compares this plus the weights held (eager's and each session's) with its cap."""
    workspace = _compare_workspace()
    kept = 0  # the references kept: the small ones, up to the budget
    peak = 0
    for case in cases:
        one = case_bytes(contract, case, dtype)
        if kept + one <= REFERENCE_CACHE_BYTES:
            kept += one
        peak = max(peak, one * (1 + runtimes_at_once) + call_bytes(contract, case, dtype))
    if long_checks and hasattr(contract, "vocab_size"):
        long = Case(1, contract.max_positions, 0)
        peak = max(peak, case_bytes(contract, long, dtype) + call_bytes(contract, long, dtype))
    return int(peak + workspace + kept)
