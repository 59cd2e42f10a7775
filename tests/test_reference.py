"""verify --record and verify from a recorded reference (verify/reference.py): the record is written into the folder
and hashed in the manifest, a later verify judges the ONNX file from it in a process where torch cannot be imported,
and a record of other weights, another sweep or another file is refused (a planted edit of the weights, with the
record's and the manifest's hashes rewritten to match, fails parity)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from mhaexport import api
from mhaexport.artifact.files import sha256_file
from mhaexport.core.errors import ArtifactError, ConfigError, ReferenceMismatch
from mhaexport.verify import reference as rec
from mhaexport.verify.compare import Tolerance

BLOCK_TORCH = textwrap.dedent('''
    import importlib.abc, sys

    class _NoTorch(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "torch" or name.startswith("torch."):
                raise ImportError("torch is blocked in this test (" + name + ")")
            return None

    sys.meta_path.insert(0, _NoTorch())
''')


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns(".snapshot-*", ".staging-*", "report.*"))
    return dst


def _rehash(folder: Path) -> None:
    """Rewrite the manifest's hashes of the ONNX artifact's files to what they hold now (a planted, consistent
    folder: its integrity check passes)."""
    path = folder / "manifest.json"
    m = json.loads(path.read_text())
    for name, meta in m["artifacts"]["onnx"]["files"].items():
        meta["sha256"], meta["bytes"] = sha256_file(folder / name), (folder / name).stat().st_size
    path.write_text(json.dumps(m))


def _edit_index(folder: Path, edit) -> None:
    index = json.loads((folder / rec.INDEX).read_text())
    edit(index)
    (folder / rec.INDEX).write_text(json.dumps(index))
    _rehash(folder)


@pytest.fixture(scope="module")
def recorded(tiny_export, tmp_path_factory):
    """A copy of the tiny export with a recorded reference (verify --record, ONNX Runtime CPU)."""
    folder = _copy(tiny_export, tmp_path_factory.mktemp("recorded") / "tiny")
    report = api.verify(folder, runtimes=("eager", "ort-cpu"), record=True)
    assert report, report.verdict.message
    return folder, report


def _verify_without_torch(folder: Path, tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    """``python -m mhaexport verify FOLDER`` in a process where importing torch raises ImportError."""
    block = tmp_path / "block"
    block.mkdir(exist_ok=True)
    (block / "sitecustomize.py").write_text(BLOCK_TORCH)
    env = {**os.environ, "PYTHONPATH": str(block)}
    return subprocess.run([sys.executable, "-m", "mhaexport", "verify", str(folder), "-o", str(tmp_path / "out"),
                           "--json", *args], capture_output=True, text=True, env=env, timeout=300)


def test_record_is_in_the_manifest(recorded):
    folder, report = recorded
    files = json.loads((folder / "manifest.json").read_text())["artifacts"]["onnx"]["files"]
    assert {rec.INDEX, rec.ARRAYS} <= set(files)
    index = json.loads((folder / rec.INDEX).read_text())
    assert index["model"]["fingerprint"] == report.model.fingerprint
    assert index["files"]["model.onnx"] == files["model.onnx"]["sha256"]
    assert index["keeps"] == {"logits": "all", "vocab": 256, "present": "all"}  # the tiny preset: small enough
    assert index["made_with"]["torch"]
    assert report.reference["kind"] == "eager" and report.reference["recorded"]["bytes"] > 0
    assert api.lint(folder)  # the lint's integrity check covers the record


def test_recorded_verify_without_torch(recorded, tmp_path):
    folder, _ = recorded
    done = _verify_without_torch(folder, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    ref = report["reference"]
    assert ref["kind"] == "recorded" and ref["describe"].startswith("recorded ")
    assert ref["fingerprint"] == report["model"]["fingerprint"] and ref["made_with"]["torch"]
    results = report["results"]["ort-cpu"]
    for check in ("parity", "finite", "causality", "kv-consistency", "padding", "dynamic-shapes", "generation"):
        assert results[check]["status"] is True, (check, results[check]["message"])
    assert report["runtimes"]["eager"]["status"] == "skipped"
    assert "reference: recorded" in done.stderr


def _alter_weights(folder: Path) -> None:
    """Scale one weight matrix of model.onnx by 1.01 (a real change of the file's outputs)."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(folder / "model.onnx"))
    init = max(model.graph.initializer, key=lambda t: int(np.prod(t.dims)) if len(t.dims) == 2 else 0)
    init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) * np.float32(1.01), init.name))
    onnx.save(model, str(folder / "model.onnx"))


def test_a_file_changed_after_recording_is_refused(recorded, tmp_path):
    folder = _copy(recorded[0], tmp_path / "changed")
    _alter_weights(folder)
    _rehash(folder)  # the folder is consistent: only the record knows the file it was made for
    with pytest.raises(ReferenceMismatch, match="recorded for another file: model.onnx"):
        api.verify(folder, reference="recorded")


def test_a_planted_bug_is_caught_without_torch(recorded, tmp_path):
    """The weights altered and the record's own hashes rewritten to match (everything consistent but the numbers):
    parity against the record fails, in a process without torch."""
    folder = _copy(recorded[0], tmp_path / "planted")
    _alter_weights(folder)
    _edit_index(folder, lambda ix: ix["files"].update({"model.onnx": sha256_file(folder / "model.onnx")}))
    done = _verify_without_torch(folder, tmp_path)
    assert done.returncode == 1, done.stderr[-3000:]
    parity = json.loads(done.stdout)["results"]["ort-cpu"]["parity"]
    assert parity["status"] is False and "differ from eager" in parity["message"]


def test_a_record_of_other_weights_is_refused(recorded, tmp_path):
    folder = _copy(recorded[0], tmp_path / "other")
    _edit_index(folder, lambda ix: ix["model"].update(fingerprint="0123456789abcdef"))
    with pytest.raises(ReferenceMismatch, match="recorded from other weights"):
        api.verify(folder, reference="recorded")


def test_another_sweep_is_refused(recorded):
    with pytest.raises(ReferenceMismatch, match="--seed 0 .* asks --sweep quick --seed 1"):
        api.verify(recorded[0], reference="recorded", seed=1)


def test_a_tampered_record_fails_the_hash_check(recorded, tmp_path):
    folder = _copy(recorded[0], tmp_path / "tampered")
    data = bytearray((folder / rec.ARRAYS).read_bytes())
    data[len(data) // 2] ^= 0xFF
    (folder / rec.ARRAYS).write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match="reference.npz sha256 .* does not match the manifest"):
        api.verify(folder, reference="recorded")


def test_no_record_no_recorded_reference(tiny_export):
    with pytest.raises(ConfigError, match="holds no recorded reference"):
        api.verify(tiny_export, reference="recorded")


def test_top_k_keeps_what_it_says():
    """A top-k record judges the kept logits and the logsumexp (the whole row's mass): identity passes, a change of
    a kept value or of the tail fails; a tail change that moves no kept value is still caught by the logsumexp."""
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(2, 3, 500)).astype(np.float32)
    present = rng.normal(size=(1, 2, 2, 2, 3, 4)).astype(np.float32)
    kept: dict[str, np.ndarray] = {}
    rec._keep_logits(logits, False, "c", kept)
    case = rec.RecordedCase(None, kept["c.topk_values"], kept["c.topk_indices"], kept["c.lse"],
                            float(kept["c.absmax"]), present, None)
    tol, rows, keys = Tolerance(1e-4, 1e-3), np.ones((2, 3), bool), np.ones((2, 3), bool)
    outs = lambda lg: (lg, [(present[0, 0], present[0, 1])])  # noqa: E731
    assert all(d.ok for d in case.compare(outs(logits), tol, rows, keys).values())
    top = logits.copy()
    i = int(kept["c.topk_indices"][1, 2, 0])
    top[1, 2, i] += 0.1
    assert not case.compare(outs(top), tol, rows, keys)["logits"].ok
    tail = logits.copy()
    mask = np.ones_like(tail, bool)
    np.put_along_axis(mask, kept["c.topk_indices"].astype(np.int64), False, -1)
    tail[mask] += 1.0  # every logit outside the top-k: the kept values unchanged
    assert not case.compare(outs(tail), tol, rows, keys)["logits"].ok


def test_top_k_record_end_to_end(tiny_export, tmp_path, monkeypatch):
    """The tiny model recorded as if its vocabulary were large (top-k logits, sampled present) verifies from it."""
    monkeypatch.setattr(rec, "FULL_VOCAB", 16)
    monkeypatch.setattr(rec, "PRESENT_FULL_FLOATS", 0)
    folder = _copy(tiny_export, tmp_path / "topk")
    made = api.verify(folder, runtimes=("eager",), record=True)  # eager alone: "not verified", recorded all the same
    assert made.reference["recorded"]["keeps"] == f"logits: top-{rec.TOP_K} of 256; present: 4 key positions per case"
    index = json.loads((folder / rec.INDEX).read_text())
    assert index["keeps"]["logits"] == f"top-{rec.TOP_K}" and index["keeps"]["present"].startswith("4 key")
    report = api.verify(folder, runtimes=("ort-cpu",), reference="recorded")
    assert report, report.verdict.message
    assert "top-32 logits" in report.reference["checks"]["parity"]
    assert report.results["ort-cpu"]["generation"].status is True


@pytest.mark.parametrize("plant", ["shape", "pickle", "ids"])
def test_a_hostile_record_is_refused_in_one_line(recorded, tmp_path, plant):
    """A record whose hashes match (rewritten) but whose arrays are not what they claim: a wrong shape, an object
    array (numpy would unpickle it), a token id beyond the vocabulary — an ArtifactError naming the record."""
    folder = _copy(recorded[0], tmp_path / plant)
    with np.load(folder / rec.ARRAYS, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    if plant == "shape":
        arrays["case0.logits"] = arrays["case0.logits"][..., :3]
    elif plant == "pickle":
        arrays["case0.logits"] = np.array([{"a": 1}], dtype=object)
    else:
        arrays["greedy.short.tokens"] = arrays["greedy.short.tokens"] + 10**9
    with open(folder / rec.ARRAYS, "wb") as f:
        np.savez(f, **arrays)  # (an object array is pickled)
    _rehash(folder)
    with pytest.raises(ArtifactError, match="reference.(json|npz)"):
        api.verify(folder, reference="recorded")


@pytest.mark.slow
def test_a_shared_cache_verifies_from_its_record(tiny, tmp_path):
    """A shared-cache file (its deploy loop: buffers in place, a ragged right-padded batch): generation's deploy rows
    are judged against the record's, kv-consistency's deploy loop against the file's own contract calls."""
    from mhaexport.exporter.onnx import export_onnx

    folder = tmp_path / "shared"
    export_onnx(tiny, folder, kv_cache="shared")
    assert api.verify(folder, runtimes=("eager", "ort-cpu"), record=True)
    report = api.verify(folder, runtimes=("ort-cpu",), reference="recorded")
    assert report, report.verdict.message
    results = report.results["ort-cpu"]
    assert "the deploy loop's ragged batch matches too" in results["generation"].message
    assert "the deploy loop (in place, ragged) agrees with itself" in results["kv-consistency"].message
