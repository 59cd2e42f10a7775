"""The runtimes by name: every runtime's name, which ones each verb (verify, verify --module, eval, bench) accepts
and runs unless told (:data:`RUNTIMES`, the one table), the one refusal of a name a verb does not know
(:func:`refuse_unknown`) and the ONNX Runtime session a runtime name gets (:func:`session_config`)."""

from __future__ import annotations

from dataclasses import dataclass

from mhaexport.artifact.trust import AOTI, PT2
from mhaexport.core.errors import ConfigError, RuntimeOptionError
from mhaexport.runtime.session import CUDA, SessionConfig

EAGER, EAGER_CUDA, TORCHSCRIPT = "eager", "eager-cuda", "torchscript"
ORT_CPU, ORT_CUDA, ONNX_REFERENCE = "ort-cpu", "ort-cuda", "onnx-reference"
# onnxruntime-genai's own generator on the folder (runners/genai.py): verify adds it to the defaults where it
# is installed and the folder ships a genai_config.json; asked for by name, it is skipped (never passed) elsewhere
ORT_GENAI = "ort-genai"
# the eager model without a KV cache (the whole sequence each step): bench's row of what the cache saves
EAGER_NOCACHE = "eager-nocache"
# bench's own row: a bare session.run loop over the folder's ONNX file (what the runtime's loop costs)
ORT_BARE = "ort-bare"
# an attention-block export (--module attention): torch's own attention with the block's weights is a second
# reference beside eager (runners/block.py)
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
# only on trust (runners/pt2.py); verify's and bench's defaults gain them where the folder holds them. ort-genai:
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
           "RUNTIMES", "TORCHSCRIPT", "TORCH_MHA", "VERIFY", "VerbRuntimes", "refuse_unknown", "session_config"]


def session_config(name: str, *, threads: int | None = None, provider: str | None = None, log_severity: int = 4,
                   mmap_weights: bool = False, packed_weights: bool = False) -> SessionConfig:
    """The ONNX Runtime session of runtime ``name`` (verify's and eval's, the decoder's and the attention block's):
    one provider (default from the name: ort-cuda on CUDA, else CPU), strict (a session that falls back to CPU makes
    ort-cuda skipped, never passed); ``mmap_weights``: external data memory-mapped (verify's mapped mode), with
    ``packed_weights`` a quantized file's weights still packed (``SessionConfig.packed_weights``)."""
    provider = provider or (CUDA if name == ORT_CUDA else "cpu")
    return SessionConfig(providers=(provider,), threads=threads, strict_providers=True, log_severity=log_severity,
                         mmap_weights=mmap_weights, packed_weights=packed_weights)

