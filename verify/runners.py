"""Runners: one way to call the model per runtime, all with the contract's inputs and outputs as numpy.

The base :class:`Runner` owns what every runtime shares (Polygraphy style): input checks against the contract,
conversion to numpy, timing and the "skipped with a reason" state. Each runtime writes only ``_load`` and
``_run``: eager PyTorch (the loaded module), TorchScript (``torch.jit.load`` of the exported file, never rebuilt
from Python), ONNX Runtime on the CPU and CUDA execution providers, and the ONNX reference evaluator.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mhaexport import iospec
from mhaexport.errors import ProviderUnavailable, RuntimeInputError
from mhaexport.iospec import ModelContract

KVPairs = tuple[tuple[np.ndarray, np.ndarray], ...]
Outputs = tuple[np.ndarray, KVPairs]  # (logits [B, T, V], present: n_layers x (key, value) [B, H, S, D])

EAGER, TORCHSCRIPT, ORT_CPU, ORT_CUDA, ONNX_REFERENCE = "eager", "torchscript", "ort-cpu", "ort-cuda", "onnx-reference"
ALL_RUNTIMES = (EAGER, TORCHSCRIPT, ORT_CPU, ORT_CUDA, ONNX_REFERENCE)
DEFAULT_RUNTIMES = (EAGER, TORCHSCRIPT, ORT_CPU, ORT_CUDA)


def to_numpy(x: Any) -> np.ndarray:
    """A torch tensor or array-like as a numpy array (no copy where possible)."""
    if hasattr(x, "detach"):
        return x.detach().cpu().numpy()
    return np.asarray(x)


@dataclass
class Runner:
    """Base runner: checks inputs against the contract, times each call, and may be skipped with a reason.

    ``fixed``: for a static export, the only (sequence_length, past_sequence_length) it accepts.
    """

    name: str
    contract: ModelContract
    dtype: str = "float32"
    fixed: tuple[int, int] | None = None
    skip_reason: str | None = None
    providers: list[str] = field(default_factory=list)
    times: list[float] = field(default_factory=list)

    @property
    def available(self) -> bool:
        return self.skip_reason is None

    def accepts(self, seq: int, past: int) -> bool:
        """Whether this artifact can run at (seq, past): always for dynamic exports, only its sizes for static."""
        return self.fixed is None or self.fixed == (seq, past)

    def load(self) -> Runner:
        """Load the artifact; a runtime that cannot run here sets ``skip_reason`` instead of raising."""
        try:
            self._load()
        except ProviderUnavailable as e:
            self.skip_reason = str(e)
        return self

    def check_inputs(self, input_ids: Any, attention_mask: Any,
                     past_key_values: Any) -> tuple[np.ndarray, np.ndarray, KVPairs]:
        """Convert to numpy and check dtypes and shapes against the contract; raise RuntimeInputError otherwise."""
        c = self.contract
        ids, mask = to_numpy(input_ids), to_numpy(attention_mask)
        if ids.dtype != np.int64 or ids.ndim != 2:
            raise RuntimeInputError(f"input_ids must be int64 [batch, seq], got {ids.dtype} {list(ids.shape)}")
        B, T = ids.shape
        past = tuple((to_numpy(k), to_numpy(v)) for k, v in (past_key_values or ()))
        if len(past) != c.n_layers:
            raise RuntimeInputError(f"past_key_values has {len(past)} (key, value) pairs, the model has "
                                    f"n_layers={c.n_layers}")
        P = past[0][0].shape[2] if past else 0
        for i, (k, v) in enumerate(past):
            for t in (k, v):
                if tuple(t.shape) != (B, c.n_heads, P, c.head_dim):
                    raise RuntimeInputError(f"past_key_values[{i}] shape {list(t.shape)} != "
                                            f"{[B, c.n_heads, P, c.head_dim]} [batch, n_heads, past, head_dim]")
        if mask.dtype != np.int64 or tuple(mask.shape) != (B, P + T):
            raise RuntimeInputError(f"attention_mask must be int64 {[B, P + T]} [batch, past + seq], got "
                                    f"{mask.dtype} {list(mask.shape)}")
        if P + T > c.max_positions:
            raise RuntimeInputError(f"past {P} + seq {T} exceeds max_positions={c.max_positions}")
        if ids.size and (ids.min() < 0 or ids.max() >= c.vocab_size):
            raise RuntimeInputError(f"input_ids must lie in [0, {c.vocab_size}), found {ids.min()}..{ids.max()}")
        if not self.accepts(T, P):
            raise RuntimeInputError(f"{self.name} is a static export for seq={self.fixed[0]} past={self.fixed[1]}, "
                                    f"got seq={T} past={P}")
        return ids, mask, past

    def run(self, input_ids: Any, attention_mask: Any, past_key_values: Any) -> Outputs:
        """(logits, present) as numpy for the contract's inputs (numpy or torch)."""
        if self.skip_reason is not None:
            raise RuntimeInputError(f"{self.name} is skipped: {self.skip_reason}")
        ids, mask, past = self.check_inputs(input_ids, attention_mask, past_key_values)
        start = time.perf_counter()
        logits, present = self._run(ids, mask, past)
        self.times.append(time.perf_counter() - start)
        return logits, present

    def baked_axes(self) -> list[str]:
        """Dynamic axes the artifact declares as fixed numbers (only runtimes that can inspect a graph say)."""
        return []

    # --- what each runtime writes -------------------------------------------------------------------------
    def _load(self) -> None:
        pass

    def _run(self, ids: np.ndarray, mask: np.ndarray, past: KVPairs) -> Outputs:
        raise NotImplementedError


def _np_dtype(dtype: str) -> np.dtype:
    return np.dtype({"float32": np.float32, "float16": np.float16}.get(dtype, np.float32))


@dataclass
class EagerRunner(Runner):
    """The PyTorch module itself, under torch.no_grad (the reference every artifact is compared with)."""

    module: Any = None

    def _run(self, ids, mask, past):
        return _call_torch(self.module, ids, mask, past)


def _call_torch(module, ids, mask, past):
    """Call a torch module (eager or TorchScript) on numpy inputs; numpy outputs."""
    import torch

    t_past = tuple((torch.from_numpy(np.ascontiguousarray(k)), torch.from_numpy(np.ascontiguousarray(v)))
                   for k, v in past)
    with torch.no_grad():
        logits, present = module(torch.from_numpy(ids), torch.from_numpy(mask), t_past)
    return to_numpy(logits), tuple((to_numpy(k), to_numpy(v)) for k, v in present)


@dataclass
class TorchScriptRunner(Runner):
    """The exported .pt file, loaded with torch.jit.load (not rebuilt from the Python class)."""

    path: Path | None = None
    module: Any = None

    def _load(self) -> None:
        import torch

        self.module = torch.jit.load(str(self.path), map_location="cpu")
        self.module.eval()
        self.providers = ["torch.jit (cpu)"]

    def _run(self, ids, mask, past):
        return _call_torch(self.module, ids, mask, past)


@dataclass
class OrtRunner(Runner):
    """ONNX Runtime InferenceSession on one execution provider; CUDA that falls back to CPU is skipped."""

    path: Path | None = None
    provider: str = "CPUExecutionProvider"
    session: Any = None

    def _load(self) -> None:
        from mhaexport.runtime.session import resolve_providers, start_session

        self.session, missing = start_session(self.path, resolve_providers([self.provider]))
        self.providers = list(self.session.get_providers())
        if missing:
            raise ProviderUnavailable(missing)
        self._out_names = [o.name for o in self.session.get_outputs()]
        self._in_shapes = {i.name: list(i.shape) for i in self.session.get_inputs()}

    def baked_axes(self) -> list[str]:
        baked = []
        for name, axes in iospec.dynamic_input_axes(self.contract.n_layers).items():
            shape = self._in_shapes.get(name, [])
            for ax, dim in axes.items():
                if ax < len(shape) and isinstance(shape[ax], int):
                    baked.append(f"{name} axis {ax} ({dim}) = {shape[ax]}")
        return baked

    def _run(self, ids, mask, past):
        dt = _np_dtype(self.dtype)
        feeds = iospec.make_feed(ids, mask, [(k.astype(dt, copy=False), v.astype(dt, copy=False)) for k, v in past])
        return iospec.split_outputs(self.session.run(iospec.output_names(self.contract.n_layers), feeds))


@dataclass
class OnnxReferenceRunner(Runner):
    """onnx.reference.ReferenceEvaluator: pure-Python ONNX semantics; slow, for small models only."""

    path: Path | None = None
    evaluator: Any = None

    def _load(self) -> None:
        from onnx.reference import ReferenceEvaluator

        self.evaluator = ReferenceEvaluator(str(self.path))
        self.providers = ["onnx.reference"]

    def _run(self, ids, mask, past):
        names = iospec.output_names(self.contract.n_layers)
        return iospec.split_outputs(self.evaluator.run(names, iospec.make_feed(ids, mask, past)))


def skipped(name: str, contract: ModelContract, reason: str) -> Runner:
    """A runner that is reported as skipped with ``reason`` (never as passed)."""
    return Runner(name=name, contract=contract, skip_reason=reason)
