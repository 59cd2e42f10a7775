"""The decoder's runtimes besides the deploy runtime's: eager PyTorch (CPU or CUDA), TorchScript, the ONNX reference
evaluator and any of them without a cache (recompute), all under the one runner protocol of
:mod:`mhaexport.runtime.runner` (their names: :mod:`mhaexport.runners.names`).

The torch runners keep the KV cache as torch tensors between decode steps (no numpy round trip per step, so eager
is timed fairly in bench); only the logits come to the host. ONNX Runtime is the deploy runtime's own
:class:`~mhaexport.runtime.ort.OrtRunner`.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import numpy as np

from mhaexport.core import iospec
from mhaexport.core.devices import no_cuda_device
from mhaexport.core.errors import ProviderUnavailable
from mhaexport.core.iospec import ModelContract
from mhaexport.runtime.runner import Cache, KVPairs, Outputs, Runner
from mhaexport.runtime.spill import Spill

__all__ = ["EagerRunner", "OnnxReferenceRunner", "RecomputeRunner", "TorchScriptRunner"]


class EagerRunner(Runner):
    """A torch module under the contract (the eager reference, or a CUDA copy of it), under inference_mode."""

    def __init__(self, name: str, contract: ModelContract, module: Any, *, device: str = "cpu") -> None:
        super().__init__(name, contract)
        self.source = module
        self.module = module
        self.device = device
        # verify's mapped mode (runtime/spill.py): each block's present cache and the logits moved to file-backed
        # pages as they are made, so a long case holds one block's working memory, not every block's cache
        self.spill: Spill | None = None

    def activate_impl(self) -> None:
        import torch

        if self.device == "cuda":
            if (absent := no_cuda_device()) is not None:
                raise ProviderUnavailable(absent)
            if not torch.cuda.is_available():
                raise ProviderUnavailable("torch.cuda.is_available() is False (a CUDA device is here: torch "
                                          f"{torch.__version__} is a CPU build, or its CUDA does not load)")
            self.module = copy.deepcopy(self.source).to("cuda").eval()
            self.providers = [f"torch (cuda: {torch.cuda.get_device_name(0)})"]
        else:
            self.providers = ["torch (cpu)"]

    def deactivate_impl(self) -> None:
        if self.module is not self.source:
            self.module = self.source

    def _call(self, ids: np.ndarray, mask: np.ndarray, past: Any):
        import torch

        spilled = self.spill is not None and self.device == "cpu"
        hooks = _spill_hooks(self.module, self.spill) if spilled else []
        try:
            with torch.inference_mode():
                logits, present = self.module(torch.from_numpy(ids).to(self.device),
                                              torch.from_numpy(mask).to(self.device), past)
        finally:
            for h in hooks:
                h.remove()
        if spilled:  # the logits once made; a model without blocks we know (a user's, TorchScript): its cache too
            logits = _spilled_tensor(self.spill, logits)
            if not hooks:
                present = tuple((_spilled_tensor(self.spill, k), _spilled_tensor(self.spill, v)) for k, v in present)
        return logits, present

    def _torch_past(self, past: KVPairs):
        import torch

        return tuple((torch.from_numpy(np.ascontiguousarray(k)).to(self.device),
                      torch.from_numpy(np.ascontiguousarray(v)).to(self.device)) for k, v in past)

    def run_impl(self, ids: np.ndarray, mask: np.ndarray, past: KVPairs) -> Outputs:
        logits, present = self._call(ids, mask, self._torch_past(past))
        return _host(logits), tuple((_host(k), _host(v)) for k, v in present)

    def empty_cache(self, batch: int, positions: int | None = None) -> Cache:
        return self._torch_past(self.check_past(None, batch, 0))

    def cache_from_numpy(self, past: KVPairs) -> Cache:
        return self._torch_past(past)

    def step_impl(self, ids: np.ndarray, mask: np.ndarray, cache: Cache) -> tuple[np.ndarray, Cache]:
        logits, present = self._call(ids, mask, cache)
        return _host(logits), tuple(present)  # the cache stays torch tensors on the device

    def cache_numpy(self, cache: Cache) -> KVPairs:
        return tuple((_host(k), _host(v)) for k, v in cache)


def _spilled_tensor(spill: Spill, t: Any) -> Any:
    """A CPU float tensor as one over ``spill``'s file-backed copy when it is large (no copy when it is one)."""
    import torch

    if t.dtype not in (torch.float32, torch.float16) or t.numel() * t.element_size() < spill.min_bytes:
        return t
    return torch.from_numpy(spill.keep(t.detach().contiguous().numpy()))


def _spill_hooks(module: Any, spill: Spill) -> list:
    """Forward hooks on the built-in decoder's blocks (each returns ``(x, (key, value))``) that replace the block's
    present cache by file-backed copies as it is returned; none for a module without such blocks."""
    import torch
    from torch import nn

    blocks = getattr(module, "blocks", None)
    if isinstance(module, torch.jit.ScriptModule) or not isinstance(blocks, nn.ModuleList):
        return []

    def hook(_mod, _args, out):
        if not (isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], tuple) and len(out[1]) == 2):
            return None
        x, (k, v) = out
        return x, (_spilled_tensor(spill, k), _spilled_tensor(spill, v))

    return [b.register_forward_hook(hook) for b in blocks]


def _host(t: Any) -> np.ndarray:
    """A torch tensor on the host as numpy (no copy on CPU); bfloat16, which numpy cannot hold, as float32."""
    t = t.detach()
    if str(t.dtype) == "torch.bfloat16":
        t = t.float()
    return t.cpu().numpy()


class TorchScriptRunner(EagerRunner):
    """The exported .pt file, loaded with torch.jit.load (never rebuilt from the Python class)."""

    def __init__(self, name: str, contract: ModelContract, path: str | Path) -> None:
        super().__init__(name, contract, None)
        self.path = Path(path)

    def activate_impl(self) -> None:
        import torch

        self.module = torch.jit.load(str(self.path), map_location="cpu").eval()
        self.source = self.module
        self.providers = ["torch.jit (cpu)"]


class OnnxReferenceRunner(Runner):
    """onnx.reference.ReferenceEvaluator: pure-Python ONNX semantics; slow, for small models only."""

    def __init__(self, name: str, contract: ModelContract, path: str | Path, *, dtype: str = "float32",
                 fixed: tuple[int, int] | None = None) -> None:
        super().__init__(name, contract, dtype=dtype, fixed=fixed)
        self.path = Path(path)
        self.evaluator = None

    def activate_impl(self) -> None:
        from onnx.reference import ReferenceEvaluator

        self.evaluator = ReferenceEvaluator(str(self.path))
        self.providers = ["onnx.reference"]

    def run_impl(self, ids: np.ndarray, mask: np.ndarray, past: KVPairs) -> Outputs:
        names = iospec.output_names(self.contract.n_layers)
        return iospec.split_outputs(self.evaluator.run(names, iospec.make_feed(ids, mask, past)))


class RecomputeRunner(Runner):
    """Decoding without a KV cache: each step runs ``inner`` on the whole sequence so far, from scratch. Its
    "cache" is the token history. The reference that cached decoding is checked against (verify) and the cost the
    cache saves (bench's eager-nocache row), driven by the same decode loop as every other runner."""

    def __init__(self, inner: Runner, name: str | None = None) -> None:
        super().__init__(name or f"{inner.name}-nocache", inner.contract, dtype=inner.dtype)
        self.inner = inner

    def activate_impl(self) -> None:
        self.inner.activate()
        if self.inner.skip_reason is not None:
            raise ProviderUnavailable(self.inner.skip_reason)
        self.providers = [f"{', '.join(self.inner.providers)}, no KV cache: whole sequence each step"]

    def empty_cache(self, batch: int, positions: int | None = None) -> Cache:
        return np.zeros((batch, 0), dtype=np.int64)

    def step_impl(self, ids: np.ndarray, mask: np.ndarray, cache: Cache) -> tuple[np.ndarray, Cache]:
        seq = np.concatenate([cache, ids], axis=1)  # (B, S): every token so far
        logits, _ = self.inner.step(seq, mask, self.inner.empty_cache(seq.shape[0]))
        return logits[:, -ids.shape[1]:], seq

    def run_impl(self, ids: np.ndarray, mask: np.ndarray, past: KVPairs) -> Outputs:
        return self.inner.run_impl(ids, mask, past)
