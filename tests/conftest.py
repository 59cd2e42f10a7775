"""Shared fixtures: the tiny preset, loaded once, and one export folder (ONNX + TorchScript) per session."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

import pytest
import torch

torch.set_num_threads(min(2, os.cpu_count() or 1))

# every session starts from a cache of its own (torch.onnx's traces kept across exports, ONNX Runtime's optimized
# graphs, seeded weights to map): no test passes or fails by what an earlier run left in the user's cache
_CACHE = tempfile.mkdtemp(prefix="mhaexport-test-cache-")
os.environ["MHAEXPORT_CACHE_DIR"] = _CACHE
atexit.register(shutil.rmtree, _CACHE, ignore_errors=True)


@pytest.fixture(scope="session")
def tiny():
    """The tiny preset with deterministic random weights (a LoadedModel)."""
    from mhaexport.models.loading import load_model

    return load_model("tiny", random_weights=True)


@pytest.fixture(scope="session")
def tiny_export(tiny, tmp_path_factory):
    """One folder holding the tiny model's dynamic ONNX export and its TorchScript trace. Treat as read-only."""
    from mhaexport.exporter.onnx import export_onnx
    from mhaexport.exporter.torchscript import export_torchscript

    out = tmp_path_factory.mktemp("tiny_export")
    export_onnx(tiny, out)
    export_torchscript(tiny, out)
    return out


@pytest.fixture(scope="session")
def tiny_lowered(tiny, tiny_export, tmp_path_factory):
    """{lowering: ONNX export folder} of the tiny model: tiny_export for decomposed, one export per fused lowering.
    The `ort` one keeps its weights in external data (the threshold lowered to 0 bytes), so every test of it also
    covers that path: the self-check of a lowered file with external data, sessions, bisect. Treat as read-only."""
    from mhaexport.exporter.onnx import EXTERNAL_DATA_ENV, export_onnx

    out = {"decomposed": tiny_export}
    for attention in ("onnx", "ort"):
        folder = tmp_path_factory.mktemp(f"tiny_lowered_{attention}")
        with pytest.MonkeyPatch.context() as mp:
            if attention == "ort":
                mp.setenv(EXTERNAL_DATA_ENV, "0")
            export_onnx(tiny, folder, attention=attention)
        out[attention] = folder
    return out


@pytest.fixture(scope="session")
def external_export(tiny, tmp_path_factory):
    """The tiny preset exported (decomposed attention) with the external-data threshold at 0 bytes: every weight in
    model.onnx.data, as a file larger than memory has them. Treat as read-only."""
    from mhaexport.exporter.onnx import EXTERNAL_DATA_ENV, export_onnx

    out = tmp_path_factory.mktemp("external")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(EXTERNAL_DATA_ENV, "0")
        export_onnx(tiny, out)
    return out


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models gain nothing from intra-op threads, and on a shared 2-core box spinning threads cost 10x."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture()
def altered_export(tiny_export, tmp_path):
    """A copy of tiny_export whose model.onnx has one byte flipped after export (its hash no longer matches)."""
    import shutil

    folder = tmp_path / "altered"
    # without this process's live snapshot folders (scratch, hard links): the copy is the export as a user has it
    shutil.copytree(tiny_export, folder, ignore=shutil.ignore_patterns(".snapshot-*", ".staging-*"))
    data = bytearray((folder / "model.onnx").read_bytes())
    data[-10] ^= 0xFF
    (folder / "model.onnx").write_bytes(bytes(data))
    return folder


@pytest.fixture(scope="session")
def hf_dir(tmp_path_factory):
    """A factory: ``hf_dir("llama")`` saves the tiny random Hugging Face model of that architecture (and a tokenizer
    trained here) to a temporary folder once per session and returns the folder (tests/hf_models.py)."""
    from hf_models import save_tiny

    made: dict = {}

    def make(name: str, tokenizer: bool = True, seed: int = 0):
        key = (name, tokenizer, seed)
        if key not in made:
            made[key] = save_tiny(name, tmp_path_factory.mktemp(f"hf-{name}"), tokenizer=tokenizer, seed=seed)
        return made[key]

    return make


@pytest.fixture(scope="session")
def loaded_presets():
    """{preset: its LoadedModel}, loaded once and streamed as the CLI loads it (its weights in a staging file, the
    export written from there): every path of one preset reuses its trace (exporter/trace.py)."""
    from mhaexport.models.loading import load_model

    made: dict = {}

    def get(preset: str):
        if preset not in made:
            made[preset] = load_model(preset, streamed=True)
        return made[preset]

    return get


@pytest.fixture(scope="session")
def export_path(tmp_path_factory, loaded_presets):
    """A factory: ``export_path(preset, attention, kv_cache, dtype, target=None)`` exports that path once per session
    through the API the CLI's ``onnx`` calls (``export_onnx_target``) and returns (folder, error or None)."""
    import mhaexport
    from mhaexport.core.errors import MhaExportError

    made: dict = {}

    def make(preset: str, attention: str | None, kv: str | None, dtype: str | None, target: str | None = None):
        key = (preset, attention, kv, dtype, target)
        if key not in made:
            folder = tmp_path_factory.mktemp("path") / "-".join(k or "_" for k in key)
            try:
                mhaexport.export_onnx_target(folder, target, model=loaded_presets(preset), attention=attention,
                                             kv_cache=kv, dtype=dtype)
                made[key] = (folder, None)
            except MhaExportError as e:
                made[key] = (folder, e)
        return made[key]

    return make
