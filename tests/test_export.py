"""The exporters: files that run at shapes never used at export, agree with eager, and are causal."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from mhaexport.core import iospec
from mhaexport.core.errors import ArtifactError, ExportError
from mhaexport.artifact import ExportFolder, sha256_file
from mhaexport.exporter.onnx import export_onnx
from mhaexport.exporter.torchscript import export_torchscript
from mhaexport.models.inputs import make_inputs

# (batch, seq, past): seq=1, past=0 and lengths never used at export (it used batch=2, seq=3, past=5)
SHAPES = [(1, 1, 0), (2, 7, 0), (1, 1, 13), (3, 5, 4), (2, 33, 0), (1, 2, 31)]


def _ort(folder):
    return ort.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"])


def _run_ort(sess, ids, am, past):
    feed = iospec.make_feed(ids.numpy(), am.numpy(), [(k.numpy(), v.numpy()) for k, v in past])
    return iospec.split_outputs(sess.run(iospec.output_names(len(past)), feed))


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "b{}s{}p{}".format(*s))
def test_onnx_and_torchscript_match_eager_at_unseen_shapes(tiny, tiny_export, shape):
    b, t, p = shape
    ids, am, past = make_inputs(tiny.contract, b, t, p, seed=11)
    with torch.no_grad():
        ref, ref_present = tiny.module(ids, am, past)
        ts_logits, ts_present = torch.jit.load(str(tiny_export / "model.pt"))(ids, am, past)
    logits, present = _run_ort(_ort(tiny_export), ids, am, past)
    np.testing.assert_allclose(logits, ref.numpy(), atol=1e-4, rtol=0)
    np.testing.assert_allclose(ts_logits.numpy(), ref.numpy(), atol=1e-4, rtol=0)
    for (k, v), (rk, rv), (tk, tv) in zip(present, ref_present, ts_present):
        assert k.shape == (b, tiny.contract.n_heads, p + t, tiny.contract.head_dim)
        np.testing.assert_allclose(k, rk.numpy(), atol=1e-4)
        np.testing.assert_allclose(v, rv.numpy(), atol=1e-4)
        np.testing.assert_allclose(tv.numpy(), rv.numpy(), atol=1e-4)


def test_onnx_io_names_and_dynamic_dims(tiny, tiny_export):
    model = onnx.load(str(tiny_export / "model.onnx"))
    dims = {v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]
            for v in list(model.graph.input) + list(model.graph.output)}
    assert [i.name for i in model.graph.input] == iospec.input_names(2)
    assert [o.name for o in model.graph.output] == iospec.output_names(2)
    assert dims["input_ids"] == ["batch_size", "sequence_length"]
    assert dims["attention_mask"] == ["batch_size", "total_sequence_length"]
    assert dims["past_key_values.1.value"] == ["batch_size", 4, "past_sequence_length", 16]
    assert dims["present.0.key"] == ["batch_size", 4, "total_sequence_length", 16]
    assert dims["logits"] == ["batch_size", "sequence_length", 256]


def test_onnx_export_is_causal_and_cache_consistent(tiny, tiny_export):
    sess = _ort(tiny_export)
    ids, am, empty = make_inputs(tiny.contract, 2, 9, 0, seed=12)
    full, _ = _run_ort(sess, ids, am, empty)
    changed = ids.clone()
    changed[:, 5:] = (changed[:, 5:] + 1) % 256
    other, _ = _run_ort(sess, changed, am, empty)
    np.testing.assert_array_equal(full[:, :5], other[:, :5])  # later tokens change no earlier logit
    assert not np.allclose(full[:, 5:], other[:, 5:])
    _, cache = _run_ort(sess, ids[:, :3], am[:, :3], empty)
    steps = []
    for t in range(3, 9):  # token by token with the cache carried present -> past
        cache_t = [(torch.from_numpy(k), torch.from_numpy(v)) for k, v in cache]
        logit, cache = _run_ort(sess, ids[:, t:t + 1], am[:, :t + 1], cache_t)
        steps.append(logit)
    np.testing.assert_allclose(np.concatenate(steps, 1), full[:, 3:], atol=1e-4)


def test_manifest_records_both_artifacts_with_hashes(tiny_export):
    ef = ExportFolder.open(tiny_export)
    assert set(ef.artifacts) == {"onnx", "torchscript"}
    onnx_entry = ef.entry("onnx")
    assert onnx_entry.seq_dynamic is True and onnx_entry.details.opset == 18
    assert onnx_entry.files["model.onnx"]["sha256"] == sha256_file(tiny_export / "model.onnx")
    assert ef.model.spec == "preset:tiny" and onnx_entry.versions["torch"] == torch.__version__
    for entry in ef.artifacts.values():  # each artifact carries its own I/O schema
        assert entry.io["inputs"]["attention_mask"]["shape"] == ["batch_size", "total_sequence_length"]
    assert ef.entry("torchscript").details.mode == "trace"


@pytest.mark.slow  # ~5 s: a static export and its checks
def test_static_export_fixes_sequence_axes(tiny, tmp_path):
    export_onnx(tiny, tmp_path, seq_dynamic=False, seq_len=4)
    entry = json.loads((tmp_path / "manifest.json").read_text())["artifacts"]["onnx"]
    assert entry["seq_dynamic"] is False and entry["static_sizes"]["sequence_length"] == 4
    sess = _ort(tmp_path)
    assert sess.get_inputs()[0].shape[1] == 4
    ids, am, past = make_inputs(tiny.contract, 3, 4, 0, seed=2)  # batch stays dynamic
    logits, _ = _run_ort(sess, ids, am, past)
    with torch.no_grad():
        np.testing.assert_allclose(logits, tiny.module(ids, am, past)[0].numpy(), atol=1e-4)
    ids5, am5, past5 = make_inputs(tiny.contract, 1, 5, 0)
    with pytest.raises(Exception, match="(?i)dimension|shape"):
        _run_ort(sess, ids5, am5, past5)


@pytest.mark.slow  # ~6 s: a user factory's model exported and compared
def test_user_factory_exports_and_matches(tmp_path):
    from mhaexport.models.loading import load_model

    user = load_model(model="examples/user_decoder.py:build")
    export_onnx(user, tmp_path)
    export_torchscript(user, tmp_path)
    sess = _ort(tmp_path)
    ts = torch.jit.load(str(tmp_path / "model.pt"))
    for b, t, p in SHAPES:
        ids, am, past = make_inputs(user.contract, b, t, p, seed=3)
        with torch.no_grad():
            ref = user.module(ids, am, past)[0].numpy()
            np.testing.assert_allclose(ts(ids, am, past)[0].numpy(), ref, atol=1e-4)
        np.testing.assert_allclose(_run_ort(sess, ids, am, past)[0], ref, atol=1e-4)


def test_bad_export_arguments(tiny, tmp_path):
    with pytest.raises(ExportError, match="outside the supported range 18..23"):
        export_onnx(tiny, tmp_path, opset=17)
    with pytest.raises(ExportError, match="exceeds max_positions=128"):
        export_onnx(tiny, tmp_path, seq_dynamic=False, seq_len=200)
    with pytest.raises(ExportError, match="torch.jit.script failed"):
        export_torchscript(tiny, tmp_path, mode="script")
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(ArtifactError, match="not writable"):
        export_torchscript(tiny, blocker / "sub")


@pytest.fixture(scope="module")
def default_exports(tmp_path_factory):
    """The issue's commands on the default model: `mhaexport onnx --seq-dynamic -o out/onnx` and
    `mhaexport torchscript -o out/ts`, through the CLI."""
    from click.testing import CliRunner

    from mhaexport.cli import main

    out = tmp_path_factory.mktemp("out")
    for args in (["onnx", "--seq-dynamic", "-o", str(out / "onnx")], ["torchscript", "-o", str(out / "ts")]):
        res = CliRunner().invoke(main, args)
        assert res.exit_code == 0, res.output
    return out


def test_default_model_exports_match_eager_causal_and_cached(default_exports):
    from mhaexport.models.loading import load_model

    ref_model = load_model()  # the default: preset small with its shipped trained weights
    assert ref_model.spec == "preset:small" and ref_model.checkpoint == "shipped:small.pt"
    sess = _ort(default_exports / "onnx")
    ts = torch.jit.load(str(default_exports / "ts" / "model.pt"))
    c = ref_model.contract
    for b, t, p in SHAPES:
        ids, am, past = make_inputs(c, b, t, p, seed=21)
        with torch.no_grad():
            ref = ref_model.module(ids, am, past)[0].numpy()
            np.testing.assert_allclose(ts(ids, am, past)[0].numpy(), ref, atol=1e-4, rtol=0)
        np.testing.assert_allclose(_run_ort(sess, ids, am, past)[0], ref, atol=1e-4, rtol=0)
    ids, am, empty = make_inputs(c, 1, 12, 0, seed=22)
    full, _ = _run_ort(sess, ids, am, empty)
    changed = ids.clone()
    changed[:, 8:] = (changed[:, 8:] + 3) % c.vocab_size
    np.testing.assert_array_equal(_run_ort(sess, changed, am, empty)[0][:, :8], full[:, :8])  # causal
    with torch.no_grad():
        ts_full = ts(ids, am, empty)[0]
        ts_changed = ts(changed, am, empty)[0]
    torch.testing.assert_close(ts_changed[:, :8], ts_full[:, :8], atol=0, rtol=0)
    _, cache = _run_ort(sess, ids[:, :1], am[:, :1], empty)
    steps = []
    for i in range(1, 12):  # token by token with the cache == one prefill
        logit, cache = _run_ort(sess, ids[:, i:i + 1], am[:, :i + 1],
                                [(torch.from_numpy(k), torch.from_numpy(v)) for k, v in cache])
        steps.append(logit)
    np.testing.assert_allclose(np.concatenate(steps, 1), full[:, 1:], atol=1e-4)
