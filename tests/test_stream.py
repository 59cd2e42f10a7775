"""models/stream.py: the built-in decoder's seeded weights drawn one tensor at a time into a safetensors file, and a
model over that file memory-mapped — the same numbers, the same outputs and the same weights fingerprint as the
model built in memory."""

import pytest
import torch

from mhaexport.models import stream
from mhaexport.models.config import load_config
from mhaexport.models.decoder import DecoderLM
from mhaexport.models.loading import weights_sha256


@pytest.mark.parametrize("preset", ["tiny", "tiny-llama", "tiny-window", "tiny-gemma", "tiny-sinks"])
def test_streamed_weights_are_the_seeded_ones(tmp_path, preset):
    cfg = load_config(preset)
    eager = DecoderLM(cfg).eval()
    path = stream.write_seeded(cfg, tmp_path / "w.safetensors")
    mapped = stream.mmap_model(cfg, path)
    want, got = eager.state_dict(), mapped.state_dict()
    assert want.keys() == got.keys()
    assert [k for k in want if not torch.equal(want[k], got[k])] == []
    assert stream.streamed_sha256(stream.mmap_state(path)) == weights_sha256(eager)
    ids = torch.randint(0, cfg.vocab_size, (2, 9), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[1, :3] = 0
    with torch.no_grad():
        assert torch.equal(eager(ids, mask)[0], mapped(ids, mask)[0])
    # the tied head is one tensor in the file, named twice
    if cfg.tie_embeddings:
        assert mapped.lm_head.weight.data_ptr() == mapped.tok_emb.weight.data_ptr()


def test_every_tensor_starts_on_a_page_and_a_short_stream_is_refused(tmp_path):
    cfg = load_config("tiny")
    path = stream.write_seeded(cfg, tmp_path / "w.safetensors")
    base, meta = stream.read_header(path)
    assert base % stream.ALIGN == 0
    assert all(e["data_offsets"][0] % stream.ALIGN == 0 for e in meta.values())
    specs = stream.param_specs(cfg)
    some = [(n, t) for n, t in stream.seeded_tensors(cfg) if n != "blocks.0.ln_1.weight"]
    with pytest.raises(ValueError, match="no tensor arrived for blocks.0.ln_1.weight"):
        stream.write_safetensors(tmp_path / "x.safetensors", specs, some, {"lm_head.weight": "tok_emb.weight"})
    assert not (tmp_path / "x.safetensors").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["w.safetensors"]  # no temporary file left
