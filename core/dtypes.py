"""The one table of float dtypes an export may use: names, numpy, ONNX and ONNX Runtime spellings, default
tolerances. Torch-free: torch's dtype of the same name is ``getattr(torch, name)`` (see ``models.inputs.torch_dtype``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mhaexport.core.errors import ArtifactError


@dataclass(frozen=True)
class DType:
    name: str  # "float16": the name in manifests, reports and the CLI
    onnx_elem: int  # onnx.TensorProto element type
    ort_type: str  # what onnxruntime's NodeArg.type says: "tensor(float16)"
    numpy: np.dtype | None  # None: numpy cannot hold it without ml_dtypes (bfloat16)
    atol: float  # verify's default tolerances: |a - e| <= atol + rtol * |e|
    rtol: float
    self_check_tol: float  # the lowering self-check's tolerance, relative to max |logits|


DTYPES: dict[str, DType] = {
    "float32": DType("float32", 1, "tensor(float)", np.dtype(np.float32), 1e-4, 1e-3, 1e-4),
    "float16": DType("float16", 10, "tensor(float16)", np.dtype(np.float16), 1e-2, 1e-2, 2e-2),
    "bfloat16": DType("bfloat16", 16, "tensor(bfloat16)", None, 5e-2, 2e-2, 1e-1),
}
NAMES = tuple(DTYPES)
_BY_ORT = {d.ort_type: d for d in DTYPES.values()}
_BY_ELEM = {d.onnx_elem: d for d in DTYPES.values()}


def get(name: str) -> DType:
    try:
        return DTYPES[name]
    except KeyError:
        raise ArtifactError(f"dtype {name!r} is not one of {', '.join(NAMES)}") from None


def numpy_dtype(name: str) -> np.dtype:
    """The numpy dtype for ``name``; ArtifactError for one numpy cannot hold (bfloat16)."""
    d = get(name)
    if d.numpy is None:
        raise ArtifactError(f"a {name} KV cache cannot be held in numpy (mhaexport.runtime, verify's runners); "
                            "export with --dtype float32 or float16")
    return d.numpy


def from_ort_type(ort_type: str) -> str | None:
    """"tensor(float16)" -> "float16"; None for a type that is not one of ours."""
    d = _BY_ORT.get(ort_type)
    return d.name if d else None


def from_onnx_elem(elem: int) -> str | None:
    d = _BY_ELEM.get(elem)
    return d.name if d else None
