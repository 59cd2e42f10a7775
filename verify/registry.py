"""Runtime name -> its runner: the one registry verify, eval and bench build their runners from.

A runtime is a name (``eager``, ``torchscript``, ``ort-cpu``, ``pt2``, ...) and a way to drive one artifact of an
export folder (or the eager model itself) under the decoder's or the attention block's contract. Every verb that
runs a folder asks :func:`runner_for` for it, so a runtime means the same thing in verify, eval and bench: the same
artifact, driven as the folder's feed says (runtime/feed.py), skipped with the same reason where it cannot run.
onnxruntime-genai's own loop (``ort-genai``) is not a runner of this protocol: verify builds it after the others
(verify/genai_runtime.py) and bench has its own row for it.
"""

from __future__ import annotations

from typing import Any

from mhaexport.artifact import TWO_GB, ExportFolder
from mhaexport.iospec import ModuleContract
from mhaexport.runtime.choose import feed_of, ort_runner_for
from mhaexport.runtime.runner import Runner, skipped
from mhaexport.verify.block_runners import TorchMhaRunner, TorchModuleRunner, module_ort_runner
from mhaexport.verify.pt2 import CODE_RUNTIMES, code_runner
from mhaexport.verify.runners import (EAGER, EAGER_CUDA, ONNX_REFERENCE, ORT_CPU, ORT_CUDA, TORCH_MHA, TORCHSCRIPT,
                                      EagerRunner, OnnxReferenceRunner, TorchScriptRunner, session_config)

__all__ = ["REFERENCE_MAX_PARAMS", "runner_for"]

# The ONNX reference evaluator is pure Python: only models up to this many parameters (embedding included).
REFERENCE_MAX_PARAMS = 2_000_000
# what each runtime runs: the folder's artifact of that name, or the eager model (None)
ARTIFACT = {EAGER: None, EAGER_CUDA: None, TORCH_MHA: None, TORCHSCRIPT: "torchscript", ORT_CPU: "onnx",
            ORT_CUDA: "onnx", ONNX_REFERENCE: "onnx", **{rt: rt for rt in CODE_RUNTIMES}}
_WHAT = {"torchscript": "TorchScript export", "onnx": "ONNX export"}


def runner_for(ef: ExportFolder, name: str, contract, *, eager: Any = None, n_params: int | None = None,
               trust_code: bool = False, threads: int | None = None) -> Runner:
    """The runner of runtime ``name`` on ``ef`` under ``contract`` (a decoder's ModelContract or the attention
    block's ModuleContract), not activated. ``eager``: the eager torch module (eager, eager-cuda, torch-mha; for
    torch-mha the attention block, whose ``attn`` is torch's MultiheadAttention's weights' source). Skipped with why
    where the artifact is absent, a code artifact may not be loaded (``trust_code``), the reference evaluator cannot
    take the file (an adopted file, past 2 GB, past :data:`REFERENCE_MAX_PARAMS` when ``n_params`` is known) or the
    runtime does not run this contract. ``threads``: the attention block's ONNX Runtime intra-op threads."""
    block = isinstance(contract, ModuleContract)
    if name not in ARTIFACT or (name == TORCH_MHA and not block) or (name == ONNX_REFERENCE and block):
        return skipped(name, contract, f"runtime {name} does not run {'an attention-block' if block else 'a decoder'}"
                                       " export")
    artifact = ARTIFACT[name]
    if artifact is None:
        if eager is None:
            return skipped(name, contract, "no eager model")
        if block:
            return (TorchMhaRunner(name, contract, eager.attn) if name == TORCH_MHA
                    else TorchModuleRunner(name, contract, eager))
        return EagerRunner(name, contract, eager, device="cuda" if name == EAGER_CUDA else "cpu")
    if name in CODE_RUNTIMES:  # torch.export / AOTInductor: code, loaded only on trust (verify/pt2.py)
        return code_runner(ef, name, contract, trust_code=trust_code, module=block)
    if not ef.has(artifact):
        return skipped(name, contract, f"no {_WHAT[artifact]} in {ef.path}")
    if name == TORCHSCRIPT:
        return (TorchModuleRunner(name, contract, path=ef.file(TORCHSCRIPT)) if block
                else TorchScriptRunner(name, contract, ef.file(TORCHSCRIPT)))
    if block:
        return module_ort_runner(name, contract, ef.file("onnx"), threads=threads)
    feed = feed_of(ef, contract)
    if name == ONNX_REFERENCE:
        onnx = ef.entry("onnx")
        if feed.adopted:
            return skipped(name, contract, f"an adopted {feed.producer} file: the reference evaluator feeds the "
                                           "contract's names and runs no com.microsoft op")
        size = sum(int(f["bytes"]) for f in onnx.files.values())
        if size > TWO_GB:
            return skipped(name, contract, f"the ONNX export holds {size / 1e9:.2f} GB with its external data; the "
                                           "pure-Python reference evaluator would load every weight into protobuf "
                                           f"and numpy (it is for models up to {REFERENCE_MAX_PARAMS:,} parameters)")
        if n_params is not None and n_params > REFERENCE_MAX_PARAMS:
            return skipped(name, contract, f"model has {n_params:,} parameters; the pure-Python reference evaluator "
                                           f"runs models up to {REFERENCE_MAX_PARAMS:,}")
        return OnnxReferenceRunner(name, contract, ef.file("onnx"), dtype=onnx.dtype, fixed=feed.fixed)
    # the Generator's choice of runner, on verify's strict session, driven by contract calls
    return ort_runner_for(ef, name, session_config(name), contract=contract, contract_steps=True, feed=feed)

