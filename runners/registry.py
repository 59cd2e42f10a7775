"""Runtime name -> its runner, as (runtime, protocol) pairs: the one registry verify, eval, bench and bisect build
their runners from (the runners room, below all four).

A runtime is a name (``eager``, ``torchscript``, ``ort-cpu``, ``pt2``, ...) and a way to drive one artifact of an
export folder (or the eager model itself) under the decoder's or the attention block's contract. Every verb that
runs a folder asks :func:`runner_for` for it, so a runtime means the same thing in verify, eval and bench: the same
artifact, driven as the folder's feed says (runtime/feed.py), skipped with the same reason where it cannot run.
onnxruntime-genai's own loop (``ort-genai``: runners/genai.py, checked in verify/genai_runtime.py), the eager model
without a cache (``eager-nocache``: bench's row) and a file driven in the plain protocol besides its producer's
(``protocol="plain"``: verify's findings on an adopted file, named ``ort-cpu:plain``), the file in its own protocol
(``protocol="deploy"``: bench's ONNX Runtime rows and profile, bisect's deploy loop) and verify's runner's deploy loop
(:func:`deploy_of`) are built here too. :data:`PROTOCOLS` says how each runtime is driven.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mhaexport.artifact import TWO_GB, ExportFolder
from mhaexport.core.iospec import ModelContract, ModuleContract
from mhaexport.runtime.choose import feed_of, no_decode_loop, ort_runner_for, ort_runner_over, runner_class
from mhaexport.runtime.feed import Feed
from mhaexport.runtime.ort import OrtRunner
from mhaexport.runtime.protocol import ContractOverShared, SharedBuffer, protocol_of
from mhaexport.runtime.runner import Runner, skipped
from mhaexport.runtime.session import SessionConfig
from mhaexport.runners.block import TorchMhaRunner, TorchModuleRunner, module_ort_runner
from mhaexport.runners.decoder import EagerRunner, OnnxReferenceRunner, RecomputeRunner, TorchScriptRunner
from mhaexport.runners.names import (EAGER, EAGER_CUDA, EAGER_NOCACHE, ONNX_REFERENCE, ORT_BARE, ORT_CPU, ORT_CUDA,
                                     ORT_GENAI, TORCH_MHA, TORCHSCRIPT, session_config)
from mhaexport.runners.pt2 import CODE_RUNTIMES, code_runner

__all__ = ["DEPLOY", "PLAIN", "PROTOCOLS", "REFERENCE_MAX_PARAMS", "TWIN_FILE", "deploy_of", "float_activation_twin",
           "graph_runner", "runner_for", "without_cache"]

PLAIN = "plain"  # runner_for(..., protocol=PLAIN): the contract's own protocol (concat cache, left padding)
DEPLOY = "deploy"  # runner_for(..., protocol=DEPLOY) (ort-cpu, ort-cuda): the file's own protocol, as generate drives it
# (runtime, protocol): how each runtime drives what it runs
PROTOCOLS = {
    EAGER: "the eager model, contract calls", EAGER_CUDA: "the eager model on CUDA, contract calls",
    EAGER_NOCACHE: "the eager model, the whole sequence each step (no cache)",
    TORCH_MHA: "torch's MultiheadAttention with the block's weights", TORCHSCRIPT: "contract calls",
    ORT_CPU: "the folder's feed (runtime/protocol.py: concat/left or shared buffer/right)", ORT_CUDA: "as ort-cpu",
    ONNX_REFERENCE: "contract calls (onnx.reference)", ORT_GENAI: "onnxruntime-genai's own generation loop",
    ORT_BARE: "the file's own protocol in a bare session.run loop (bench), on the ort-cpu row's session",
    **{rt: "contract calls (code: only on trust)" for rt in CODE_RUNTIMES},
}

# The ONNX reference evaluator is pure Python: only models up to this many parameters (embedding included).
REFERENCE_MAX_PARAMS = 2_000_000
# what each runtime runs: the folder's artifact of that name, or the eager model (None)
ARTIFACT = {EAGER: None, EAGER_CUDA: None, TORCH_MHA: None, TORCHSCRIPT: "torchscript", ORT_CPU: "onnx",
            ORT_CUDA: "onnx", ONNX_REFERENCE: "onnx", **{rt: rt for rt in CODE_RUNTIMES}}
_WHAT = {"torchscript": "TorchScript export", "onnx": "ONNX export"}


def without_cache(runner: Runner, name: str | None = None) -> Runner:
    """``runner`` in the recompute protocol: the whole sequence each step, no KV cache (``NAME-nocache`` unless
    ``name``): the reference a runner's cached greedy decoding is held to, and bench's eager-nocache row."""
    return RecomputeRunner(runner, name)


def runner_for(ef: ExportFolder, name: str, contract, *, eager: Any = None, n_params: int | None = None,
               trust_code: bool = False, threads: int | None = None, protocol: str | None = None,
               ours: Runner | None = None, infos: dict | None = None, config: SessionConfig | None = None) -> Runner:
    """The runner of runtime ``name`` on ``ef`` under ``contract`` (a decoder's ModelContract or the attention
    block's ModuleContract), not activated. ``eager``: the eager torch module (eager, eager-cuda, torch-mha; for
    torch-mha the attention block, whose ``attn`` is torch's MultiheadAttention's weights' source). Skipped with why
    where the artifact is absent, a code artifact may not be loaded (``trust_code``), the reference evaluator cannot
    take the file (an adopted file, past 2 GB, past :data:`REFERENCE_MAX_PARAMS` when ``n_params`` is known) or the
    runtime does not run this contract. ``threads``: the attention block's ONNX Runtime intra-op threads.
    ``protocol=PLAIN`` (ort-cpu, ort-cuda): the file driven in the contract's own protocol whatever its producer's
    (named ``ort-cpu:plain``; its failures are findings); ``protocol=DEPLOY``: the file in its own protocol (a
    shared cache's buffers in place, as generate and bench drive it), else verify's contract calls (translated into
    a shared file's, :class:`~mhaexport.runtime.protocol.ContractOverShared`); a static export is skipped in the
    file's own protocol (a decode loop needs dynamic axes). ``config`` (ort-cpu, ort-cuda): the ONNX Runtime session
    (bench's: its threads, optimization level, profiler), default verify's strict one (:func:`session_config`).
    ``ours`` / ``infos`` (ort-genai): our ort-cpu runner of
    the folder and the results so far (runners/genai.py); ``threads`` (ort-genai): its decoder session's threads.
    ``ort-bare`` (bench's bare loop): the file in its own protocol, on ``ours``' session when ``ours`` is an active
    ONNX Runtime runner of it (the two rows differ by the loop alone), else on a CPU session of its own."""
    if protocol == PLAIN:
        return ort_runner_for(ef, f"{name}:{PLAIN}", session_config(name, log_severity=4),  # failures: findings
                              contract=contract, feed=feed_of(ef, contract).plain())
    if name == EAGER_NOCACHE:  # the eager runner, asked for the whole sequence each step
        return without_cache(runner_for(ef, EAGER, contract, eager=eager), EAGER_NOCACHE)
    if name == ORT_GENAI:
        from mhaexport.runners.genai import genai_runner

        return genai_runner(ef, contract, ours, infos, trust_code, threads=threads)
    if name == ORT_BARE:  # bench's bare loop: the file's own protocol, on ``ours``' session when it has one
        if isinstance(ours, OrtRunner) and ours.session is not None:
            return ort_runner_over(ours, protocol_of(ours.feed), ORT_BARE)
        if not ef.has("onnx"):
            return skipped(name, contract, f"no {_WHAT['onnx']} in {ef.path}")
        feed = feed_of(ef, contract)
        return ort_runner_for(ef, ORT_BARE, config or SessionConfig(providers=("cpu",), threads=threads),
                              contract=contract, feed=feed, protocol=protocol_of(feed))
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
    if name in CODE_RUNTIMES:  # torch.export / AOTInductor: code, loaded only on trust (runners/pt2.py)
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
    if protocol == DEPLOY and (static := no_decode_loop(ef)) is not None:
        return skipped(name, contract, static)
    # the Generator's choice of runner, on verify's strict session, driven by contract calls (a shared file's
    # translated); protocol=DEPLOY: the file's own protocol, as generate and bench drive it
    return ort_runner_for(ef, name, config or session_config(name), contract=contract, feed=feed,
                          protocol=protocol_of(feed, contract_calls=protocol != DEPLOY))


def deploy_of(runner: Runner) -> Runner | None:
    """The runner of ``runner``'s session in its file's own protocol when ``runner`` drives that file otherwise: a
    shared-cache file's verify runner (the contract's calls translated, :class:`ContractOverShared`) -> the same
    session driven as generate, bench and onnxruntime-genai drive it (:class:`SharedBuffer`: buffers bound in place
    across steps, a ragged batch right-padded), named "NAME (deploy loop)"; None when the two are the same (a concat
    file, a runner that is no ONNX Runtime decoder's). Active when ``runner`` is (the decode loop sizes its buffers
    on the session's device before its first call). verify's checks ask for it through ``Context.deploy``."""
    if not isinstance(runner, OrtRunner) or not isinstance(runner.protocol, ContractOverShared):
        return None
    twin = ort_runner_over(runner, SharedBuffer(runner.feed), f"{runner.name} (deploy loop)")
    return twin.activate() if runner.is_active else twin


# the float-activation twin of an int8-activation file, written beside it in the reader's private snapshot
TWIN_FILE = "model.float-activations.onnx"
# a one-file model's initializers of this many bytes and more are the twin's by reference into the file, not copied
TWIN_INLINE_BYTES = 4096


def float_activation_twin(runner: Runner) -> Runner | None:
    """The twin of ``runner`` (an ONNX Runtime runner of a quantized folder file) whose MatMulNBits nodes compute
    with float activations (``accuracy_level`` 0) — the same graph, the same quantized weights (its external data
    the file's own, by reference), driven the same way — or None where ``runner`` is no ONNX Runtime runner of a
    file in a reader's private snapshot (the twin is written beside it there, never in a folder of the user's) or
    no node quantizes its activations (accuracy level 4). The twin is a graph file whose weights are the file's
    bytes where they lie (its external data, or the file itself at each tensor's offset): writing it reads no weight.

    Why: at level 4 MatMulNBits rounds each activation block to int8 at run time, so the file is only piecewise
    continuous; a cached decode step sums attention in another order than a prefill (float32 rounding), and where
    that moves an activation across an int8 step the step grows through the layers — by 18 % of the logits' RMS on
    a random 1.1 B Llama (22 layers), against 2.6 % on the trained default model. The twin computes what the file
    computes but for that rounding, so its comparisons with itself (causality, kv-consistency, padding, cached
    generation, the serving checks) hold to float32 rounding and a cache, mask or position bug shows at any size;
    the int8 activations' own effect is the quality check's, on the file itself against eager."""
    import onnx

    from mhaexport.artifact.details import INT8_ACTIVATIONS
    from mhaexport.artifact.folder import in_snapshot
    from mhaexport.runners.wire import read_graph, refer_in_place

    if not isinstance(runner, OrtRunner) or isinstance(runner.path, bytes) or runner.session_of is not None:
        return None
    path = Path(runner.path)
    if not in_snapshot(path):  # never written into a folder of the user's
        return None
    # the graph without its weights' bytes: a one-file model's are walked past in the mapped file and referenced by
    # offset into it (loading and saving one would hold its weights in memory twice and more: +2.1 GB for a 0.86 GB
    # file), an external-data model's are referenced as the file references them
    model, where = read_graph(path, TWIN_INLINE_BYTES)
    nodes = [n for n in model.graph.node if n.op_type == "MatMulNBits" and n.domain == "com.microsoft"]
    acc = [next((a for a in n.attribute if a.name == "accuracy_level"), None) for n in nodes]
    if not any(a is not None and a.i == INT8_ACTIVATIONS for a in acc):
        return None
    for a in acc:
        if a is not None:
            a.i = 0
    refer_in_place(model, where, path.name)
    twin = path.with_name(TWIN_FILE)
    onnx.save(model, str(twin))
    return type(runner)(f"{runner.name} (float activations)", runner.contract, twin, feed=runner.feed,
                        config=runner.config, io_binding=runner.io_binding, protocol=runner.protocol)


def graph_runner(name: str, contract: ModelContract, graph: str | Path | bytes, feed: Feed, *,
                 threads: int | None = 1, mapped: bool = False) -> OrtRunner:
    """The ONNX Runtime CPU runner of a graph that is no folder's file yet (the exporter's lowering self-check: the
    decomposed and the lowered graph, serialized or the file just written), fed as ``feed`` says and driven by the
    contract's calls (a shared cache's translated into its own, :class:`ContractOverShared`), as verify drives a
    folder's file. ``mapped``: its external data memory-mapped (``SessionConfig.mmap_weights``). Not activated."""
    return runner_class(feed)(name, contract, graph, feed=feed,
                              config=SessionConfig(threads=threads, mmap_weights=mapped),
                              protocol=protocol_of(feed, contract_calls=True))
