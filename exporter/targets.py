"""Deployment targets: one name that picks how the ONNX file is written for the runtime it will run on — the
attention lowering, the KV cache's layout, the dtype and the weights' precision. Data only; the CLI (``mhaexport onnx
--target``, ``mhaexport all --target``) and the Python API apply it with the export and quantize steps they already
have, and verify proves the result as any export (a quantized one by its quality gate)."""

from __future__ import annotations

from dataclasses import dataclass

from mhaexport.core.errors import ConfigError


@dataclass(frozen=True)
class DeployTarget:
    """How to write the file for one runtime; ``weights``: quantize the float export to this scheme (None: keep
    the dtype's weights)."""

    name: str
    attention: str  # --attention
    kv_cache: str  # --kv-cache
    dtype: str  # --dtype of the export
    weights: str | None  # mhaexport quantize --weights, after the export
    when: str  # when to use it (the CLI's help, docs/export.md's table)

    @property
    def options(self) -> dict[str, str]:
        """The export options it sets, as the CLI names them."""
        return {"attention": self.attention, "kv_cache": self.kv_cache, "dtype": self.dtype}


TARGETS: dict[str, DeployTarget] = {t.name: t for t in (
    DeployTarget("portable", "decomposed", "concat", "float32", None,
                 "any ONNX runtime: standard opset-18 ops (MatMul/Softmax/Where), concat cache, float32 (the "
                 "default)"),
    DeployTarget("ort-cpu", "fused", "shared", "float32", "int4",
                 "ONNX Runtime on CPU (and onnxruntime-genai): fused attention over a shared cache, int4 weights "
                 "(MatMulNBits, the quantize defaults); verify judges it by the quality gate"),
    DeployTarget("ort-cuda", "fused", "shared", "float16", None,
                 "ONNX Runtime with CUDA: fused attention over a shared cache in float16"),
)}
DEFAULT_TARGET = "portable"


def deploy_target(name: str) -> DeployTarget:
    """The target called ``name``; ConfigError naming the known ones otherwise."""
    if name not in TARGETS:
        raise ConfigError(f"unknown deployment target {name!r}; known: {', '.join(TARGETS)}")
    return TARGETS[name]


def conflicts(target: DeployTarget, given: dict[str, str]) -> list[str]:
    """The options given on the command line that differ from what ``target`` sets ("--dtype float32 (ort-cuda
    sets float16)"): a target and an option that contradicts it are refused rather than one silently winning."""
    return [f"--{k.replace('_', '-')} {v} ({target.name} sets {target.options[k]})" for k, v in given.items()
            if k in target.options and v != target.options[k]]
