"""verify's memory plan (issue 38): before anything is loaded, how much memory the run needs and how it holds the
weights, within a cap (``--memory``; default the machine's: the cgroup's limit or MemAvailable, the smaller).

The estimate, from the manifest alone (no weight read): the anonymous baseline of Python + torch + ONNX Runtime
(:data:`BASELINE_BYTES`, measured), each runtime's weights — eager PyTorch's (float32), ONNX Runtime's (the file's
weight bytes), TorchScript's (its file) — and the largest activations one check holds (:func:`activation_bytes`,
from the sweep's cases). Three outcomes (:func:`plan_memory`):

- ``whole``: everything fits — weights loaded as they always were;
- ``mapped``: it fits only with the weights memory-mapped (eager's from a safetensors file or a checkpoint mapped by
  torch, :func:`mhaexport.models.loading.load_recorded` ``mapped=True``; ONNX Runtime's external data mapped,
  ``SessionConfig.mmap_weights``) and the large inputs and outputs spilled (runtime/spill.py: a long case's logits
  and KV caches in unlinked files of the user's cache): file-backed pages the kernel reads per block and may drop
  again under the cap, so only the anonymous part (baseline, one call's working memory, weights that cannot be
  mapped) must fit;
- refused: the anonymous part alone exceeds the cap — :class:`~mhaexport.core.errors.ConfigError` (exit 2) before any
  work, one line saying what it needs and what to try.

The run's measured peak (``resource.getrusage`` ``ru_maxrss``) goes into the report with the plan
(:class:`MemoryInfo`)."""

from __future__ import annotations

import re
import resource
import sys
from dataclasses import dataclass, field
from typing import Iterable

from mhaexport.artifact.record import Record
from mhaexport.core.errors import ConfigError
from mhaexport.core.machine import BASELINE_BYTES, machine_memory
from mhaexport.core.iospec import ModelContract

WHOLE, MAPPED = "whole", "mapped"
_UNITS = {"": 1, "b": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}
_ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8}


def parse_size(text: str | int) -> int:
    """Bytes from ``1.5G``, ``800M``, ``2GiB``, ``1073741824`` (binary units: K = 1024); ConfigError otherwise."""
    if isinstance(text, int) and not isinstance(text, bool):
        size = text
    else:
        m = re.fullmatch(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([kmgt]?)(?:i?b)?\s*", str(text), re.IGNORECASE)
        if not m:
            raise ConfigError(f"--memory {text!r}: expected a size such as 1.5G, 800M or a number of bytes")
        size = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    if size < 1:
        raise ConfigError(f"--memory {text!r}: expected a positive size")
    return size


def gib(n: int | float) -> str:
    """``1.50 GB`` (GiB, two decimals): how the plan shows a size."""
    return f"{n / 2**30:.2f} GB"


def activation_bytes(contract: ModelContract, cases: Iterable) -> tuple[int, int, str]:
    """The activations verify holds over ``cases`` (the sweep's), two bounds — with its arrays in memory (the whole
    mode) and with the large ones spilled to file-backed pages (the mapped mode) — and the name of the case that
    drives the second (what a refusal names). The checks run case by case and keep figures, not outputs
    (:func:`mhaexport.verify.sweep.sweep_peak_bytes`: one case's inputs, eager's reference and two runtimes'
    outputs — a provider pair compared with each other —, one call's working memory, the comparison's blocks, the
    small references kept, and the checks that prefill max_positions once;
    :func:`~mhaexport.verify.sweep.spilled_peak_bytes`: one call's working memory)."""
    from mhaexport.verify.sweep import spilled_peak_bytes, sweep_peak_bytes

    cases = list(cases)
    spilled, largest = spilled_peak_bytes(contract, cases)
    return (sweep_peak_bytes(contract, cases, runtimes_at_once=2), spilled,
            largest.name if largest is not None else "no case")


@dataclass
class MemoryInfo(Record):
    """The memory plan of a verify run (the report's ``memory``): the cap and where it came from, the mode chosen
    (``whole`` | ``mapped``) and why, the estimate's parts (bytes) and the run's measured peak RSS."""

    cap: int | None = None
    cap_source: str | None = None
    mode: str | None = None
    reason: str | None = None
    forced: bool = False  # --mapped
    need_whole: int | None = None  # bytes the run needs with every weight loaded whole
    need_mapped: int | None = None  # the anonymous part with the weights mapped
    parts: dict[str, int] = field(default_factory=dict)
    largest_case: str | None = None
    skipped: dict[str, str] = field(default_factory=dict)  # runtimes left out to fit: {name: why}
    # mapped: ONNX Runtime keeps a quantized file's weights packed (SessionConfig.packed_weights), where they fit
    ort_packed: bool = False
    peak_rss: int | None = None  # ru_maxrss after the run (anonymous and file-backed pages alike)
    spilled: int | None = None  # bytes of inputs and outputs the mapped mode wrote to file-backed pages

    def summary(self) -> str:
        """One line: ``memory: mapped under 1.50 GB (the cgroup's memory limit): ...; peak RSS 1.21 GB``."""
        cap = f"{gib(self.cap)} ({self.cap_source})" if self.cap else f"no cap ({self.cap_source})"
        peak = f"; peak RSS {gib(self.peak_rss)}" if self.peak_rss else ""
        if self.spilled:
            peak += f"; {gib(self.spilled)} of inputs and outputs spilled to file-backed pages"
        return f"memory: weights {self.mode} under {cap}: {self.reason}{peak}"


def peak_rss() -> int:
    """This process's peak resident set so far, in bytes (``ru_maxrss``: kB on Linux, bytes on macOS)."""
    n = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(n if sys.platform == "darwin" else n * 1024)


@dataclass(frozen=True)
class Weights:
    """Each runtime's weight bytes, from the manifest: ``eager`` (float32 in memory; ``eager_mappable``: it can be
    rebuilt over a map), ``ort`` (the ONNX file's weights; ``ort_mappable``: they are external data ONNX Runtime can
    map), ``whole_only``: {runtime: bytes} of runtimes that always load their weights whole (TorchScript:
    torch.jit.load maps nothing; onnxruntime-genai: its own session, which mhaexport does not configure).
    ``ort_packed``: the anonymous bytes ONNX Runtime's sessions of a quantized file (MatMulNBits) take to keep its
    weights packed in the mapped mode (each runtime's session its copy; a float-activation twin's session is opened
    only after the file's is closed: verify/run.py), 0 for a float file (whose prepacking the mapped mode always
    turns off)."""

    eager: int = 0
    ort: int = 0
    ort_mappable: bool = False
    eager_mappable: bool = True
    whole_only: dict[str, int] = field(default_factory=dict)
    ort_packed: int = 0


def plan_memory(weights: Weights, activations: int, cap: int | None, cap_source: str, *, forced: bool = False,
                largest_case: str = "", sweep: str = "quick", spilled: int | None = None) -> MemoryInfo:
    """Choose how verify holds its weights within ``cap`` bytes (None: no cap known, weights whole unless
    ``forced``). ``forced``: ``--mapped`` (mapped whatever fits). In the mapped mode a runtime of
    ``weights.whole_only`` whose weights do not fit beside the rest is skipped, its reason in ``skipped``. Raises
    ConfigError (exit 2), one line, when the anonymous part alone — baseline, activations, the weights that cannot be
    mapped — exceeds the cap."""
    w = weights
    whole = BASELINE_BYTES + activations + w.eager + w.ort + sum(w.whole_only.values())
    unmapped = (0 if w.eager_mappable else w.eager) + (0 if w.ort_mappable else w.ort)
    spilled = activations if spilled is None else spilled  # the mapped mode's activations (large arrays on disk)
    mapped = BASELINE_BYTES + spilled + unmapped
    parts = {"baseline": BASELINE_BYTES, "activations": activations, "activations_spilled": spilled,
             "eager_weights": w.eager, "ort_weights": w.ort,
             **{f"{rt}_weights": n for rt, n in w.whole_only.items()}}
    info = MemoryInfo(cap=cap, cap_source=cap_source, forced=forced, need_whole=whole, need_mapped=mapped,
                      parts=parts, largest_case=largest_case or None)
    if cap is not None and mapped > cap:
        held = [f"{gib(BASELINE_BYTES)} baseline", f"{gib(spilled)} of activations ({largest_case})"]
        if not w.ort_mappable and w.ort:
            held.append(f"{gib(w.ort)} of ONNX weights inside model.onnx, not external data (re-export with "
                        "MHAEXPORT_EXTERNAL_DATA_BYTES=0 to let them be mapped)")
        if not w.eager_mappable and w.eager:
            held.append(f"{gib(w.eager)} of eager weights loaded whole")
        tries = ["--sweep quick" if sweep != "quick" else None, f"--memory above {gib(mapped)}"]
        raise ConfigError(f"verify needs about {gib(mapped)} even with its weights memory-mapped ({', '.join(held)}) "
                          f"and the cap is {gib(cap)} ({cap_source}): try {' or '.join(t for t in tries if t)}")
    if forced:
        info.mode, info.reason = MAPPED, f"--mapped (needs about {gib(mapped)} mapped, {gib(whole)} whole)"
    elif cap is None or whole <= cap:
        info.mode = WHOLE
        info.reason = f"needs about {gib(whole)} with every weight loaded" + (f", within {gib(cap)}" if cap else "")
    else:
        info.mode = MAPPED
        info.reason = (f"needs about {gib(whole)} with every weight loaded, over the cap; about {gib(mapped)} with "
                       "the weights memory-mapped")
    if info.mode == MAPPED and w.ort_packed:  # unpacked, MatMulNBits dequantizes every weight on every call
        if cap is None or mapped + w.ort_packed <= cap:
            info.ort_packed = True
            info.parts["ort_packed"] = w.ort_packed
            info.reason += f"; the quantized weights packed in memory ({gib(w.ort_packed)}) for ONNX Runtime's speed"
        else:
            info.reason += (f"; the quantized weights left unpacked ({gib(w.ort_packed)} packed would not fit): "
                            "every call dequantizes every weight, tens of times slower (a 1.1 B int4 file's decode "
                            "step: 5.0 s against 0.06 s)")
    if info.mode == MAPPED and cap is not None:
        for rt, n in w.whole_only.items():  # each in its own phase of the run: held beside the mapped rest
            if mapped + n > cap:
                info.skipped[rt] = (f"loads its weights whole ({gib(n)}), which do not fit beside the rest "
                                    f"({gib(mapped)}) under the memory cap of {gib(cap)} ({cap_source})")
    return info


def folder_weights(ef, runtimes: Iterable[str], loaded_given: bool = False) -> Weights:
    """The weight bytes of each runtime of ``runtimes`` that verify holds for folder ``ef`` (an opened
    :class:`~mhaexport.artifact.ExportFolder`), read from its manifest: eager float32 (from the built-in config's
    parameters, else the ONNX file's weights at 4 bytes each, else the TorchScript file); ``loaded_given``: the
    eager model was handed in already loaded (it cannot be mapped any more)."""
    from mhaexport.artifact.details import OnnxDetails, float_weight_bytes
    from mhaexport.artifact.details import onnx_weights as onnx_weights_of

    def file_bytes(art: str) -> int:
        return sum(int(f.get("bytes") or 0) for f in ef.entry(art).files.values()) if ef.has(art) else 0

    rts = set(runtimes)
    ort, ort_mappable, onnx_eager, ort_packed = 0, False, 0, 0
    onnx_weights, external = onnx_weights_of(ef)
    if onnx_weights:
        onnx_eager = float_weight_bytes(ef) * 4 // _ITEMSIZE.get(ef.entry("onnx").dtype, 4)
        ort_rts = rts & {"ort-cpu", "ort-cuda"}
        if ort_rts:
            ort, ort_mappable = onnx_weights, external
            d = ef.entry("onnx").details
            q = d.quantization if isinstance(d, OnnxDetails) else None
            nbits = q is not None and (q.bits or any("MatMulNBits" in k for k in (q.ops or q.nodes or {})))
            if nbits:  # MatMulNBits: its packed weights, per runtime's session (a float-activation twin's replaces
                ort_packed = onnx_weights * len(ort_rts)  # the file's: never both at once, verify/run.py)
    whole_only = {}
    if "torchscript" in rts and ef.has("torchscript"):
        whole_only["torchscript"] = file_bytes("torchscript")
    if "ort-genai" in rts and onnx_weights:
        whole_only["ort-genai"] = onnx_weights
    eager = _builtin_bytes(ef.model.config) or onnx_eager or file_bytes("torchscript")
    from mhaexport.artifact.source import HfSource

    # the built-in decoder is rebuilt over a map, an --hf folder's weights staged and mapped (models/hf_stream.py)
    mappable = not loaded_given and not ef.model.legacy and (ef.model.config is not None
                                                             or isinstance(ef.model.source, HfSource))
    return Weights(eager=eager, ort=ort, ort_mappable=ort_mappable, eager_mappable=mappable, whole_only=whole_only,
                   ort_packed=ort_packed)


def _builtin_bytes(config: dict | None) -> int:
    """float32 bytes of the built-in decoder of ``config`` (:attr:`DecoderConfig.parameters`), 0 if none."""
    if not config:
        return 0
    from mhaexport.models.config import DecoderConfig

    try:
        return DecoderConfig.from_dict(config).parameters * 4
    except Exception:  # noqa: BLE001 - a config the loader will refuse, in its own words, later
        return 0


def cap_from(memory: str | int | None) -> tuple[int | None, str]:
    """(bytes, where from) of the cap: ``memory`` as given (``--memory``) or the machine's (:func:`machine_memory`)."""
    if memory is not None:
        return parse_size(memory), f"--memory {memory}"
    return machine_memory()


__all__ = ["BASELINE_BYTES", "MAPPED", "WHOLE", "MemoryInfo", "Weights", "activation_bytes", "cap_from",
           "folder_weights", "machine_memory", "parse_size", "peak_rss", "plan_memory"]

