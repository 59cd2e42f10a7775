"""Every ``--hf`` verb over the mapped folder (models/hf_stream.py), not only ``onnx --hf``: ``torchscript --hf``,
``pt2 --hf``, ``verify --hf`` and ``verify`` of an ``--hf`` export in its mapped mode load the folder streamed (its
safetensors staged one tensor at a time and memory-mapped), ``all --hf`` loads it once so, and what they write or
judge is what the in-memory load gives. A bfloat16 folder kept bfloat16 (models/upcast.py): the same fingerprint and
the same float32 reference, bit for bit, computed one module at a time.
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("transformers")

import torch  # noqa: E402
from click.testing import CliRunner  # noqa: E402

from mhaexport.cli import main  # noqa: E402
from mhaexport.models import hf_stream, loading  # noqa: E402
from mhaexport.models.inputs import make_inputs  # noqa: E402
from mhaexport.models.loading import load_model  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def loads(monkeypatch):
    """Each --hf load's (streamed, keep_half) and whether it came back mapped."""
    seen = []
    real = loading.load_hf

    def spy(*args, **kw):
        loaded = real(*args, **kw)
        seen.append((kw.get("streamed", False), kw.get("keep_half", False), loaded.weights is not None))
        return loaded

    monkeypatch.setattr(loading, "load_hf", spy)
    return seen


@pytest.fixture(scope="module")
def bf16_dir(hf_dir, tmp_path_factory):
    """The tiny Llama saved in bfloat16."""
    import transformers

    out = tmp_path_factory.mktemp("hf-bf16")
    model = transformers.AutoModelForCausalLM.from_pretrained(str(hf_dir("llama", tokenizer=False)))
    model.to(torch.bfloat16).save_pretrained(str(out))
    return out


def test_torchscript_hf_traces_the_mapped_model_into_the_in_memory_exports_weights(hf_dir, tmp_path, loads):
    folder = hf_dir("llama", tokenizer=False)
    res = CliRunner().invoke(main, ["torchscript", "--hf", str(folder), "-o", str(tmp_path / "ts")])
    assert res.exit_code == 0, res.output
    assert loads == [(True, False, True)]
    mem = load_model(hf=str(folder))  # the in-memory load, as the verb loaded it before
    ts = torch.jit.load(str(tmp_path / "ts" / "model.pt"))
    a, b = ts.state_dict(), {**dict(mem.module.named_parameters()), **dict(mem.module.named_buffers())}
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    ids, mask, past = make_inputs(mem.contract, 2, 7, 3, seed=2)
    with torch.no_grad():
        assert torch.equal(ts(ids, mask, past)[0], mem.module(ids, mask, past)[0])
    manifest = json.loads((tmp_path / "ts" / "manifest.json").read_text())
    assert manifest["model"]["fingerprint"] == mem.fingerprint


@pytest.mark.slow
def test_pt2_hf_writes_the_in_memory_exports_bytes(hf_dir, tmp_path, loads):
    from mhaexport.exporter.pt2 import export_pt2

    folder = hf_dir("llama", tokenizer=False)
    res = CliRunner().invoke(main, ["pt2", "--hf", str(folder), "-o", str(tmp_path / "st")])
    assert res.exit_code == 0, res.output
    assert loads == [(True, False, True)]
    export_pt2(load_model(hf=str(folder)), tmp_path / "mem")
    assert (tmp_path / "st" / "model.pt2").read_bytes() == (tmp_path / "mem" / "model.pt2").read_bytes()


def test_verify_hf_and_a_mapped_verify_load_the_folder_streamed(hf_dir, tmp_path, loads):
    folder = hf_dir("llama", tokenizer=False)
    res = CliRunner().invoke(main, ["onnx", "--hf", str(folder), "-o", str(tmp_path / "x")])
    assert res.exit_code == 0, res.output
    loads.clear()
    res = CliRunner().invoke(main, ["verify", str(tmp_path / "x"), "--hf", str(folder), "--runtime", "ort-cpu"])
    assert res.exit_code == 0, res.output
    assert loads == [(True, False, True)]  # mapped (a half-precision folder is kept so under --mapped/--memory)
    loads.clear()
    res = CliRunner().invoke(main, ["verify", str(tmp_path / "x"), "--mapped", "--runtime", "ort-cpu",
                                    "-o", str(tmp_path / "r")])
    assert res.exit_code == 0, res.output
    assert loads == [(True, True, True)]
    memory = json.loads((tmp_path / "r" / "report.json").read_text())["memory"]
    assert memory["mode"] == "mapped"


@pytest.mark.slow
def test_all_hf_loads_the_folder_once_streamed(hf_dir, tmp_path, loads):
    folder = hf_dir("llama", tokenizer=False)
    res = CliRunner().invoke(main, ["all", "--hf", str(folder), "-o", str(tmp_path / "all"), "--runtime", "ort-cpu",
                                    "--runtime", "torchscript"])
    assert res.exit_code == 0, res.output
    assert loads == [(True, False, True)]
    manifest = json.loads((tmp_path / "all" / "manifest.json").read_text())
    assert set(manifest["artifacts"]) == {"onnx", "torchscript"}


def test_a_bfloat16_folder_kept_bfloat16_is_the_float32_models_reference_bit_for_bit(bf16_dir):
    f32 = load_model(hf=str(bf16_dir), streamed=True)
    half = load_model(hf=str(bf16_dir), streamed=True, keep_half=True)
    assert not f32.half and half.half
    assert {p.dtype for p in half.module.parameters()} == {torch.bfloat16}  # staged as it is: half the bytes
    assert half.weights.path != f32.weights.path and all(half.weights.where(p) for p in half.module.parameters())
    assert half.fingerprint == f32.fingerprint  # hashed as the float32 values it stands for
    ids, mask, past = make_inputs(f32.contract, 2, 9, 3, seed=1)
    with torch.no_grad():
        la, pa = f32.eager(ids, mask, past)
        lb, pb = half.eager(ids, mask, past)
    assert lb.dtype == torch.float32 and torch.equal(la, lb)
    assert all(torch.equal(x, y) for a, b in zip(pa, pb) for x, y in zip(a, b))
    assert {p.dtype for p in half.module.parameters()} == {torch.bfloat16}  # the upcast copies were dropped


@pytest.mark.slow
def test_verify_of_a_bfloat16_folders_export_keeps_it_bfloat16(bf16_dir, tmp_path, monkeypatch):
    res = CliRunner().invoke(main, ["onnx", "--hf", str(bf16_dir), "-o", str(tmp_path / "x")])
    assert res.exit_code == 0, res.output
    staged = []
    real = hf_stream.stage
    monkeypatch.setattr(hf_stream, "stage", lambda files, dtype=hf_stream.DTYPE: staged.append(dtype)
                        or real(files, dtype))
    res = CliRunner().invoke(main, ["verify", str(tmp_path / "x"), "--mapped", "--runtime", "ort-cpu"])
    assert res.exit_code == 0, res.output
    assert staged == [torch.bfloat16]


@pytest.mark.slow
def test_a_bfloat16_export_of_a_bfloat16_folder_is_staged_once(bf16_dir, tmp_path, monkeypatch):
    """``onnx --hf BF16 --dtype bfloat16``: the folder staged bf16 and written as it is (no float32 staging, no
    second conversion). The file differs from the converted path's in one tensor: the rotary inverse frequencies,
    which transformers keeps float32 in a bfloat16 model and ``.to(bfloat16)`` rounds."""
    import onnx

    from mhaexport.exporter import onnx as onnx_exporter

    made = []
    real = onnx_exporter.restaged
    monkeypatch.setattr(onnx_exporter, "restaged", lambda *a, **k: made.append(1) or real(*a, **k))
    res = CliRunner().invoke(main, ["onnx", "--hf", str(bf16_dir), "--dtype", "bfloat16", "-o", str(tmp_path / "k")])
    assert res.exit_code == 0, res.output
    assert not made
    onnx_exporter.export_onnx(load_model(hf=str(bf16_dir), streamed=True), tmp_path / "c", dtype="bfloat16")
    assert made
    kept = {t.name: t for t in onnx.load(str(tmp_path / "k" / "model.onnx")).graph.initializer}
    conv = {t.name: t for t in onnx.load(str(tmp_path / "c" / "model.onnx")).graph.initializer}
    same = {n for n in kept if n in conv and kept[n].SerializeToString() == conv[n].SerializeToString()}
    assert len(kept) == len(conv) and len(same) == len(kept) - 1
    (only,) = set(kept) - same
    assert "inv_freq" in only and kept[only].data_type == onnx.TensorProto.FLOAT
    fp = [json.loads((tmp_path / d / "manifest.json").read_text())["model"]["fingerprint"] for d in ("k", "c")]
    assert fp[0] == fp[1]


def test_verify_keeps_a_half_precision_folder_half_where_float32_would_not_fit(tmp_path, monkeypatch):
    """A bfloat16 folder whose float32 weights (twice its bytes) exceed the machine's memory is staged as it is —
    verify maps it anyway, and float32 would only double the staging file (an 8 B folder's 32 GB instead of 16) —
    as --mapped and --memory ask; one that fits is converted (eager's checks run faster), a Hub id is not sized."""
    from mhaexport.verbs.common import _keep_half_for
    from mhaexport.verify import memory

    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"\0" * 1000)
    monkeypatch.setattr(memory, "machine_memory", lambda: (1999, "MemAvailable"))
    assert _keep_half_for(folder, False, None) is True
    monkeypatch.setattr(memory, "machine_memory", lambda: (2001, "MemAvailable"))
    assert _keep_half_for(folder, False, None) is False
    assert _keep_half_for(folder, True, None) is True and _keep_half_for(folder, False, "1G") is True
    assert _keep_half_for("org/name", False, None) is False and _keep_half_for(None, True, None) is False
