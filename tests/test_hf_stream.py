"""An ``--hf`` folder loaded streamed (``mhaexport onnx --hf``; models/hf_stream.py): the model transformers builds
over the folder's safetensors staged one tensor at a time and mapped is the in-memory load's — the same state dict
(``weights_sha256``), the same buffers — and a folder that cannot be streamed is loaded in memory with the reason in
its notes. The streamed export's bytes against the in-memory export's: tests/test_hf.py (fast, Llama) and the slow
float16 / bfloat16 cases here."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("transformers")

import torch  # noqa: E402

from mhaexport.models import hf_stream  # noqa: E402
from mhaexport.models.loading import load_model  # noqa: E402


def _both(folder):
    return load_model(hf=str(folder)), load_model(hf=str(folder), streamed=True)


def _same_model(mem, st):
    """The streamed model is the in-memory one: fingerprint, every buffer, and every parameter mapped."""
    assert mem.weights is None and st.weights is not None and not st.weights.path.exists()  # unlinked at once
    assert st.weights_sha256 == mem.weights_sha256 and st.fingerprint == mem.fingerprint
    a, b = dict(mem.module.named_buffers()), dict(st.module.named_buffers())
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    params = list(st.module.parameters())
    assert params and all(st.weights.where(p) is not None for p in params)
    assert not any("not streamed" in n for n in st.notes), st.notes


@pytest.mark.parametrize("arch", ["llama", "gpt2"])  # GQA + rotary buffers + tied head; Conv1D and a tied head
def test_a_streamed_folder_is_the_in_memory_model(hf_dir, arch):
    _same_model(*_both(hf_dir(arch, tokenizer=False)))


def test_a_bfloat16_sharded_folder_streams_converted_to_float32(hf_dir, tmp_path):
    import transformers

    src = transformers.AutoModelForCausalLM.from_pretrained(str(hf_dir("llama-small", tokenizer=False)))
    src.to(torch.bfloat16).save_pretrained(str(tmp_path), max_shard_size="20KB")
    shards = sorted(p.name for p in tmp_path.glob("*.safetensors"))
    assert (tmp_path / hf_stream.INDEX).is_file() and len(shards) > 1
    mem, st = _both(tmp_path)
    _same_model(mem, st)
    assert {p.dtype for p in st.module.parameters()} == {torch.float32}
    # the staging file holds float32, each value the folder's bfloat16 exactly
    emb = st.module.hf.get_input_embeddings().weight
    assert torch.equal(emb, src.get_input_embeddings().weight.float())


def test_a_pickled_checkpoint_loads_in_memory_and_says_why(hf_dir, tmp_path):
    import shutil

    import transformers

    folder = hf_dir("llama-small", tokenizer=False)
    shutil.copy(folder / "config.json", tmp_path / "config.json")
    model = transformers.AutoModelForCausalLM.from_pretrained(str(folder))
    torch.save(model.state_dict(), tmp_path / "pytorch_model.bin")
    mem, st = _both(tmp_path)
    assert st.weights is None and st.fingerprint == mem.fingerprint
    assert "weights loaded in memory, not streamed: its weights are pytorch_model.bin, not safetensors" in st.notes


def test_a_model_whose_forward_needs_real_weights_loads_in_memory_and_says_why(hf_dir, monkeypatch):
    def refuse(*_a, **_k):
        raise RuntimeError("Tensor.item() cannot be called on meta tensors")

    monkeypatch.setattr(hf_stream, "meta_model", refuse)
    mem, st = _both(hf_dir("llama-small", tokenizer=False))
    assert st.weights is None and st.fingerprint == mem.fingerprint
    assert st.notes == ["weights loaded in memory, not streamed: its forward does not run on the meta device "
                        "(RuntimeError: Tensor.item() cannot be called on meta tensors)"]


def test_experts_transformers_merges_are_right_and_said_to_be_in_memory(tmp_path):
    """Mixtral's checkpoint keeps one tensor per expert; transformers' loader merges them into new tensors: the
    model is still the in-memory one, and the notes say what was not streamed."""
    import transformers

    from hf_models import IDS

    cfg = transformers.MixtralConfig(vocab_size=320, max_position_embeddings=64, num_hidden_layers=1, hidden_size=32,
                                     intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
                                     num_local_experts=4, num_experts_per_tok=2, **IDS)
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(cfg).save_pretrained(str(tmp_path))
    mem, st = _both(tmp_path)
    assert st.weights is not None and st.fingerprint == mem.fingerprint
    assert [n for n in st.notes if "not streamed" in n] == [
        "2 of 12 parameters (0.1 MB, e.g. model.layers.0.mlp.experts.gate_up_proj) were made in memory by "
        "transformers' loader, not streamed"]


def test_a_quantized_config_is_not_streamed():
    import transformers

    cfg = transformers.LlamaConfig(quantization_config={"quant_method": "bitsandbytes"})
    assert hf_stream.why_not(cfg) == "a quantized checkpoint (bitsandbytes): transformers' quantizer loads it"
    assert hf_stream.why_not(transformers.LlamaConfig()) is None


def test_a_shard_index_naming_a_file_outside_the_folder_is_not_streamed(tmp_path):
    (tmp_path / hf_stream.INDEX).write_text(json.dumps({"weight_map": {"a.weight": "../model.safetensors"}}))
    assert hf_stream.checkpoint_files(tmp_path) == ([], f"{hf_stream.INDEX} names '../model.safetensors', not a file "
                                                        "of the folder")


# --- slow: two exports each -------------------------------------------------------------------------------------

def _files(folder):
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.name != "manifest.json"}


@pytest.mark.slow
@pytest.mark.parametrize("arch,dtype", [("gemma2-window", "float16"), ("gpt-oss-window", "float32")])
def test_a_streamed_hf_export_writes_the_in_memory_exports_bytes(hf_dir, tmp_path, arch, dtype):
    from mhaexport.exporter.onnx import export_onnx

    mem, st = _both(hf_dir(arch))
    export_onnx(mem, tmp_path / "mem", dtype=dtype)
    export_onnx(st, tmp_path / "str", dtype=dtype)
    assert _files(tmp_path / "mem") == _files(tmp_path / "str")


@pytest.mark.slow
def test_a_bfloat16_folder_exported_bfloat16_keeps_its_values(hf_dir, tmp_path):
    """--dtype bfloat16 on a bfloat16 folder: staged float32 (exact), restaged bfloat16 (exact again): the
    initializers are the folder's own bytes, and the in-memory export's."""
    import onnx
    import transformers
    from onnx import numpy_helper

    from mhaexport.exporter.onnx import export_onnx

    src = transformers.AutoModelForCausalLM.from_pretrained(str(hf_dir("llama-small", tokenizer=False)))
    src.to(torch.bfloat16).save_pretrained(str(tmp_path / "bf16"))
    mem, st = _both(tmp_path / "bf16")
    export_onnx(mem, tmp_path / "mem", dtype="bfloat16")
    export_onnx(st, tmp_path / "str", dtype="bfloat16")
    assert _files(tmp_path / "mem") == _files(tmp_path / "str")
    graph = onnx.load(str(tmp_path / "str" / "model.onnx")).graph
    want = src.get_input_embeddings().weight.view(torch.int16).numpy()
    tables = [t for t in graph.initializer if tuple(t.dims) == tuple(want.shape)]
    assert tables and any((numpy_helper.to_array(t).view("int16") == want).all() for t in tables)


def test_a_refused_safetensors_file_closes_its_descriptor_once(hf_dir, tmp_path):
    """A header whose offsets run past the file is refused while WeightsFile opens it: the descriptor is closed there
    once, and neither close() nor the collector closes the number again (which printed 'Exception ignored in
    WeightsFile.__del__: Bad file descriptor', and could close another file that reused the number). pytest's
    filterwarnings makes an unraisable exception an error, so this test fails if __del__ raises."""
    import gc
    import struct

    from mhaexport.models.stream import WeightsFile

    raw = (hf_dir("llama") / "model.safetensors").read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    name = next(k for k in header if k != "__metadata__")
    header[name]["data_offsets"][1] += 10 ** 9
    text = json.dumps(header).encode()
    bad = tmp_path / "model.safetensors"
    bad.write_bytes(struct.pack("<Q", len(text)) + text + raw[8 + n:])
    with pytest.raises((ValueError, OSError)):
        WeightsFile(bad)
    gc.collect()
    with WeightsFile(hf_dir("llama") / "model.safetensors") as ok:
        fd = ok.fd
        assert fd >= 0
    assert ok.fd == -1
    ok.close()  # a second close does nothing
    with pytest.raises(OSError):
        import os
        os.fstat(fd)  # closed (nothing reopened it in between)
