"""Export precision: float16 weights and KV cache, finite padded rows, parity with an fp32 eager reference."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
import torch.nn.functional as F

from mhaexport.core import iospec
from mhaexport.exporter.lowering import op_counts
from mhaexport.exporter.onnx import export_onnx
from mhaexport.models.attention import build_causal_mask
from mhaexport.models.inputs import make_inputs

SHAPES = [(1, 1, 0, None), (2, 7, 0, None), (1, 1, 13, None), (3, 5, 4, None), (2, 33, 0, None), (1, 2, 31, None),
          (3, 5, 4, [0, 3, 6]), (2, 1, 6, [0, 4])]
PADDED = (3, 5, 4, [0, 3, 6])  # row 2: its first two query rows see no key at all
ATOL, RTOL = 1e-2, 1e-2  # float16 against the float32 eager reference: |a - e| <= ATOL + RTOL * |e|
FUSED = {"decomposed": "Softmax", "onnx": "Attention", "ort": "com.microsoft.MultiHeadAttention",
         "fused": "com.microsoft.MultiHeadAttention"}


class _Exports(dict):
    """{lowering: float16 export folder}, each exported on first use (the fused ones run in the slow set only)."""

    def __init__(self, tiny, factory) -> None:
        super().__init__()
        self.tiny, self.factory = tiny, factory

    def __missing__(self, attention: str):
        folder = self.factory.mktemp(f"fp16_{attention}")
        export_onnx(self.tiny, folder, attention=attention, dtype="float16")
        self[attention] = folder
        return folder


@pytest.fixture(scope="module")
def fp16(tiny, tmp_path_factory):
    """{lowering: float16 export folder} of the tiny model, exported lazily."""
    return _Exports(tiny, tmp_path_factory)


# ~6 s per fused float16 export: the fused lowerings' float16 graphs are proved in the slow set
LOWERINGS = ["decomposed", pytest.param("onnx", marks=pytest.mark.slow), pytest.param("ort", marks=pytest.mark.slow),
             pytest.param("fused", marks=pytest.mark.slow)]


def _real(batch: int, seq: int, past: int, pad: list[int] | None) -> tuple[np.ndarray, np.ndarray]:
    """bool (B, seq) real query rows and (B, past + seq) real key slots (left padding excluded)."""
    keys = np.ones((batch, past + seq), dtype=bool)
    for b, p in enumerate(pad or []):
        keys[b, :p] = False
    return keys[:, past:], keys


@pytest.mark.parametrize("attention", LOWERINGS)
def test_float16_graph_io_and_manifest(fp16, tiny, attention):
    model = onnx.load(str(fp16[attention] / "model.onnx"))
    types = {v.name: v.type.tensor_type.elem_type for v in list(model.graph.input) + list(model.graph.output)}
    assert types["past_key_values.0.key"] == types["present.1.value"] == types["logits"] == onnx.TensorProto.FLOAT16
    assert types["input_ids"] == types["attention_mask"] == onnx.TensorProto.INT64
    assert not any(t.data_type == onnx.TensorProto.FLOAT for t in model.graph.initializer if len(t.dims))
    assert op_counts(model).get(FUSED[attention]) == tiny.contract.n_layers
    manifest = json.loads((fp16[attention] / "manifest.json").read_text())
    entry = manifest["artifacts"]["onnx"]
    assert entry["dtype"] == "float16" and entry["attention"] == attention
    assert entry["io"]["inputs"]["past_key_values.0.key"]["dtype"] == "float16"
    # ORT CPU has few float16 kernels: the report names the ops it computes in float32, MatMul among them
    cast = entry["precision"]["cast_by_ort_cpu"]
    assert cast is not None and cast.get("MatMul", 0) > 0


@pytest.mark.parametrize("attention", LOWERINGS)
def test_float16_matches_fp32_eager_and_padded_rows_stay_finite(fp16, tiny, attention):
    sess = ort.InferenceSession(str(fp16[attention] / "model.onnx"), providers=["CPUExecutionProvider"])
    assert sess.get_providers() == ["CPUExecutionProvider"]
    for b, t, p, pad in SHAPES:
        ids, mask, past = make_inputs(tiny.contract, b, t, p, seed=5, pad=pad)
        with torch.no_grad():
            ref, ref_present = tiny.module(ids, mask, past)  # float32 eager reference
        feed = iospec.make_feed(ids.numpy(), mask.numpy(),
                                [(k.numpy().astype(np.float16), v.numpy().astype(np.float16)) for k, v in past])
        logits, present = iospec.split_outputs(sess.run(iospec.output_names(tiny.contract.n_layers), feed))
        where = f"{attention} float16 at batch={b} seq={t} past={p} pad={pad}"
        assert logits.dtype == np.float16, where
        assert np.isfinite(logits).all(), where  # padded rows included
        rows, keys = _real(b, t, p, pad)
        np.testing.assert_allclose(logits.astype(np.float32)[rows], ref.numpy()[rows], atol=ATOL, rtol=RTOL,
                                   err_msg=where)
        for (k, v), (rk, rv) in zip(present, ref_present):
            assert np.isfinite(k).all() and np.isfinite(v).all(), where
            sel = np.broadcast_to(keys[:, None, :, None], k.shape)
            np.testing.assert_allclose(k.astype(np.float32)[sel], rk.numpy()[sel], atol=ATOL, rtol=RTOL,
                                       err_msg=where)
            np.testing.assert_allclose(v.astype(np.float32)[sel], rv.numpy()[sel], atol=ATOL, rtol=RTOL,
                                       err_msg=where)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_eager_half_precision_padded_rows_stay_finite(tiny, dtype):
    b, t, p, pad = PADDED
    ids, mask, past = make_inputs(tiny.contract, b, t, p, seed=5, pad=pad, dtype=dtype)
    module = tiny.module.__class__(tiny.module.config).to(dtype).eval()
    module.load_state_dict(tiny.module.state_dict())
    with torch.no_grad():
        logits, present = module(ids, mask, past)
        ref, _ = tiny.module(*make_inputs(tiny.contract, b, t, p, seed=5, pad=pad))
    assert logits.dtype == dtype
    assert torch.isfinite(logits).all()
    assert all(torch.isfinite(k).all() and torch.isfinite(v).all() for k, v in present)
    rows, _ = _real(b, t, p, pad)
    np.testing.assert_allclose(logits.float().numpy()[rows], ref.numpy()[rows], atol=5e-2, rtol=5e-2)


def test_additive_min_mask_is_the_classic_float16_bug():
    """The check above has teeth: adding finfo.min (instead of masked_fill) overflows to -inf in float16 and a
    fully masked row turns NaN, exactly what models/attention.py avoids."""
    # (B, H, T, S) scores below -16: min + score rounds past float16's largest finite value
    scores = -torch.rand(1, 1, 2, 3, generator=torch.Generator().manual_seed(0)).half() * 10 - 20
    allowed = build_causal_mask(2, 1, torch.tensor([[0, 0, 1]]))  # row 0 sees no key
    additive = scores + torch.where(allowed, 0.0, torch.finfo(torch.float16).min).to(torch.float16)
    assert torch.isinf(additive).any()
    assert torch.isnan(F.softmax(additive, dim=-1)[0, 0, 0]).all()
    filled = scores.masked_fill(~allowed, torch.finfo(torch.float16).min)
    assert torch.isfinite(F.softmax(filled, dim=-1)).all()


@pytest.mark.slow  # ~6 s: one more export of the tiny model
def test_bfloat16_export_records_what_ort_cpu_can_run(tiny, tmp_path):
    rec = export_onnx(tiny, tmp_path, attention="ort", dtype="bfloat16")
    model = onnx.load(str(tmp_path / "model.onnx"))
    types = {v.name: v.type.tensor_type.elem_type for v in list(model.graph.input) + list(model.graph.output)}
    assert types["past_key_values.0.key"] == types["logits"] == onnx.TensorProto.BFLOAT16
    prec = rec.manifest.artifacts["onnx"].details.precision
    assert prec.dtype == "bfloat16"
    try:
        ort.InferenceSession(str(tmp_path / "model.onnx"), providers=["CPUExecutionProvider"])
        runs = True
    except Exception:  # noqa: BLE001 - ORT's own exception types
        runs = False
    # the manifest says what a direct attempt finds: a session error and a warning, or a cast report
    assert (prec.ort_cpu_session_error is None) == runs
    assert any("cannot run this bfloat16 graph" in w for w in rec.warnings) == (not runs)


def test_the_precision_session_reads_no_weight(tiny_export):
    """The precision report's ONNX Runtime session reads the graph with its floating weights as inputs of the same
    type and shape (a one-file model walked field by field, its weights left in the file): the integer constants
    kept byte for byte, ONNX Runtime opens it, and no weight reaches the session."""
    import onnx
    import onnxruntime as ort

    from mhaexport.exporter.precision import WEIGHT_BYTES, weightless

    path = tiny_export / "model.onnx"
    whole = onnx.load(str(path))
    light = onnx.ModelProto.FromString(weightless(path))
    inputs = {i.name for i in light.graph.input}
    for t in whole.graph.initializer:
        big_float = t.data_type == onnx.TensorProto.FLOAT and len(t.raw_data) >= WEIGHT_BYTES
        if big_float:
            assert t.name in inputs and all(t.name != k.name for k in light.graph.initializer)
        else:
            (kept,) = [k for k in light.graph.initializer if k.name == t.name]
            assert kept.SerializeToString() == t.SerializeToString()
    assert len(light.SerializeToString()) < len(whole.SerializeToString()) / 4  # the graph, not the weights
    ort.InferenceSession(light.SerializeToString(), providers=["CPUExecutionProvider"])
