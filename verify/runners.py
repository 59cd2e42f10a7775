"""verify's runtimes: eager PyTorch (CPU or CUDA), TorchScript, ONNX Runtime (CPU or CUDA) and the ONNX reference
evaluator, all under the one runner protocol of :mod:`mhaexport.runtime.runner`.

The torch runners keep the KV cache as torch tensors between decode steps (no numpy round trip per step, so eager
is timed fairly in bench); only the logits come to the host. ONNX Runtime is the deploy runtime's own
:class:`~mhaexport.runtime.ort.OrtRunner`.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mhaexport import iospec
from mhaexport.artifact.trust import AOTI, PT2
from mhaexport.devices import no_cuda_device
from mhaexport.errors import ConfigError, ProviderUnavailable, RuntimeOptionError
from mhaexport.iospec import ModelContract
from mhaexport.runtime.ort import OrtRunner
from mhaexport.runtime.runner import Cache, KVPairs, Outputs, Runner, skipped
from mhaexport.runtime.session import CUDA, SessionConfig

EAGER, EAGER_CUDA, TORCHSCRIPT = "eager", "eager-cuda", "torchscript"
ORT_CPU, ORT_CUDA, ONNX_REFERENCE = "ort-cpu", "ort-cuda", "onnx-reference"
# onnxruntime-genai's own generator on the folder (verify/genai_runtime.py): verify adds it to the defaults where it
# is installed and the folder ships a genai_config.json; asked for by name, it is skipped (never passed) elsewhere
ORT_GENAI = "ort-genai"
# the eager model without a KV cache (the whole sequence each step): bench's row of what the cache saves
EAGER_NOCACHE = "eager-nocache"
# bench's own row: a bare session.run loop over the folder's ONNX file (what the runtime's loop costs)
ORT_BARE = "ort-bare"
# an attention-block export (--module attention): torch's own attention with the block's weights is a second
# reference beside eager (verify/block.py)
TORCH_MHA = "torch-mha"
REFERENCE_RUNTIMES = (EAGER, TORCH_MHA)  # references: running them alone verifies no artifact

VERIFY, MODULE, EVAL, BENCH = "verify", "verify --module attention", "eval", "bench"


@dataclass(frozen=True)
class VerbRuntimes:
    """The runtimes one verb accepts by name (in the order it runs and shows them) and those it runs unless told;
    ``error``: what an unknown name raises (a ConfigError)."""

    accepts: tuple[str, ...]
    default: tuple[str, ...]
    error: type[ConfigError] = ConfigError


_DECODER = (EAGER, EAGER_CUDA, TORCHSCRIPT, ORT_CPU, ORT_CUDA, ONNX_REFERENCE, PT2, AOTI, ORT_GENAI)
_BENCH = (EAGER, EAGER_NOCACHE, EAGER_CUDA, TORCHSCRIPT, ORT_CPU, ORT_BARE, ORT_GENAI, ORT_CUDA, PT2, AOTI)
_MODULE = (EAGER, TORCH_MHA, TORCHSCRIPT, ORT_CPU, ORT_CUDA)
# The one table of which runtimes each verb accepts and runs by default (verify, eval and bench read it; every one
# refuses an unknown name with refuse_unknown). pt2 / aoti (torch.export, AOTInductor): code, loaded from a folder
# only on trust (verify/pt2.py); verify's and bench's defaults gain them where the folder holds them. ort-genai:
# verify adds it to its defaults where onnxruntime-genai is installed and the folder ships a genai_config.json.
# bench runs every runtime but eager-nocache unless told (recompute is O(n^2): on the default model it took more
# time than every other row together), which is opt-in by name.
RUNTIMES = {
    VERIFY: VerbRuntimes(_DECODER, (EAGER, TORCHSCRIPT, ORT_CPU, ORT_CUDA)),
    MODULE: VerbRuntimes(_MODULE, _MODULE),
    EVAL: VerbRuntimes(_DECODER, (ORT_CPU,)),
    BENCH: VerbRuntimes(_BENCH, tuple(r for r in _BENCH if r != EAGER_NOCACHE), RuntimeOptionError),
}
ALL_RUNTIMES = RUNTIMES[VERIFY].accepts  # verify's (a decoder's), under the names the API exports
DEFAULT_RUNTIMES = RUNTIMES[VERIFY].default
MODULE_RUNTIMES = RUNTIMES[MODULE].accepts


def refuse_unknown(names, *verbs: str) -> None:
    """The one refusal of runtime names a verb does not know: the first verb's error (a ConfigError) naming them and
    the names ``verbs`` accept together (:data:`RUNTIMES`; verify: a decoder's and an attention block's), in one
    line."""
    known = tuple(dict.fromkeys(n for v in verbs for n in RUNTIMES[v].accepts))
    unknown = [n for n in names if n not in known]
    if unknown:
        raise RUNTIMES[verbs[0]].error(f"unknown runtime(s) {', '.join(unknown)}; known: {', '.join(known)}")


__all__ = ["ALL_RUNTIMES", "BENCH", "DEFAULT_RUNTIMES", "EAGER", "EAGER_CUDA", "EAGER_NOCACHE", "EVAL", "MODULE",
           "MODULE_RUNTIMES", "ONNX_REFERENCE", "ORT_BARE", "ORT_CPU", "ORT_CUDA", "ORT_GENAI", "REFERENCE_RUNTIMES",
           "RUNTIMES", "TORCHSCRIPT", "TORCH_MHA", "VERIFY", "EagerRunner", "OnnxReferenceRunner", "OrtRunner",
           "Outputs", "RecomputeRunner", "Runner", "TorchScriptRunner", "VerbRuntimes", "refuse_unknown",
           "session_config", "skipped"]


class EagerRunner(Runner):
    """A torch module under the contract (the eager reference, or a CUDA copy of it), under inference_mode."""

    def __init__(self, name: str, contract: ModelContract, module: Any, *, device: str = "cpu") -> None:
        super().__init__(name, contract)
        self.source = module
        self.module = module
        self.device = device

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

        with torch.inference_mode():
            return self.module(torch.from_numpy(ids).to(self.device), torch.from_numpy(mask).to(self.device), past)

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


def session_config(name: str, *, threads: int | None = None, provider: str | None = None, log_severity: int = 3
                   ) -> SessionConfig:
    """verify's ONNX Runtime sessions, the decoder's and the attention block's: one provider (default from the name:
    ort-cuda on CUDA, else CPU), strict (a session that falls back to CPU makes ort-cuda skipped, never passed)."""
    provider = provider or (CUDA if name == ORT_CUDA else "cpu")
    return SessionConfig(providers=(provider,), threads=threads, strict_providers=True, log_severity=log_severity)

