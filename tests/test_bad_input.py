"""Bad input everywhere a user can give it: exit 2 from the CLI with one line "Error: ...", no traceback, nothing
half-written; or a MhaExportError subclass from the API. One test per case."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from mhaexport.cli import main
from mhaexport.core.errors import ArtifactError, ConfigError, ModelLoadError
from mhaexport.artifact import ExportFolder


def cli_error(args: list[str]) -> str:
    """Run the CLI; check exit 2, no traceback, exactly one 'Error:' line and it is the last line; return it."""
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 2, (res.exit_code, res.output, res.exception)
    assert isinstance(res.exception, SystemExit), res.exception  # handled, not a crash
    assert "Traceback" not in res.output
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("Error:")]
    assert len(errors) == 1 and lines[-1] == errors[0], res.stderr
    return errors[0]


def listing(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


@pytest.fixture()
def cwd(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_unknown_preset(cwd):
    msg = cli_error(["onnx", "--config", "nope", "-o", "out"])
    assert msg == "Error: unknown config 'nope': use a preset (tiny, small, bench, llama, tiny-llama, tiny-window, tiny-gemma, tiny-sinks) or a .json file"
    assert not (cwd / "out").exists()


def test_malformed_json_config(cwd):
    (cwd / "bad.json").write_text('{"d_model": 64,')
    msg = cli_error(["torchscript", "--config", "bad.json", "-o", "out"])
    assert msg.startswith("Error: config file bad.json: not valid JSON (Expecting property name")
    assert not (cwd / "out").exists()


def test_d_model_not_divisible_by_heads(cwd):
    (cwd / "heads.json").write_text(json.dumps({"d_model": 65, "n_heads": 4}))
    msg = cli_error(["onnx", "--config", "heads.json", "-o", "out"])
    assert msg == ("Error: d_model=65 is not divisible by n_heads=4: each head needs d_model / n_heads dimensions")
    assert not (cwd / "out").exists()
    from mhaexport.models.config import DecoderConfig

    with pytest.raises(ConfigError, match="not divisible"):
        DecoderConfig(d_model=65, n_heads=4)


def test_checkpoint_that_does_not_fit_the_config(cwd, tiny):
    torch.save(tiny.module.state_dict(), cwd / "tiny.pt")
    msg = cli_error(["onnx", "--config", "small", "--checkpoint", "tiny.pt", "-o", "out"])
    assert msg == ("Error: checkpoint tiny.pt does not fit the model: 29 shape mismatch(es), first tok_emb.weight: "
                   "checkpoint (256, 64) vs model (256, 128); 24 missing key(s), first blocks.2.ln_1.weight")
    assert not (cwd / "out").exists()


def test_factory_that_does_not_import(cwd):
    msg = cli_error(["onnx", "--model", "no_such_pkg_xyz.models:make", "-o", "out"])
    assert msg == ("Error: --model 'no_such_pkg_xyz.models:make': cannot import no_such_pkg_xyz.models: "
                   "ModuleNotFoundError: No module named 'no_such_pkg_xyz'")
    assert not (cwd / "out").exists()


USER_MODULE = '''
import torch
from torch import nn

class Cfg:
    n_layers, n_heads, head_dim, vocab_size, max_positions = 1, 2, 4, 10, 8

class WrongOutput(nn.Module):
    config = Cfg()
    def forward(self, input_ids, attention_mask, past_key_values):
        return input_ids.float()  # logits only: no present_key_values

def no_config():
    return nn.Linear(2, 2)

def wrong_output():
    return WrongOutput()

def not_a_module():
    return 3
'''


@pytest.mark.parametrize("factory,message", [
    ("not_a_module", "Error: --model 'user_models.py:not_a_module': the factory returned int, expected a "
                     "torch.nn.Module"),
    ("no_config", "Error: Linear has no .config: the contract needs model.config with ints n_layers, n_heads, "
                  "head_dim, vocab_size, max_positions"),
    ("wrong_output", "Error: model output must be (logits, present_key_values) with one (key, value) pair per "
                     "layer (1); got Tensor"),
])
def test_factory_that_returns_something_off_contract(cwd, factory, message):
    (cwd / "user_models.py").write_text(USER_MODULE)
    assert cli_error(["onnx", "--model", f"user_models.py:{factory}", "-o", "out"]) == message
    assert not (cwd / "out").exists()


def test_output_folder_not_writable(cwd):
    """A path whose parent is a regular file (chmod would not stop root, who runs the tests)."""
    (cwd / "afile").write_text("x")
    before = listing(cwd)
    msg = cli_error(["onnx", "--config", "tiny", "-o", "afile/out"])
    assert msg == "Error: output folder afile/out is not writable: Not a directory"
    assert listing(cwd) == before and (cwd / "afile").read_text() == "x"


@pytest.fixture()
def export_copy(tiny_export, tmp_path) -> Path:
    dst = tmp_path / "export"
    shutil.copytree(tiny_export, dst)
    return dst


def test_export_folder_with_missing_files(export_copy):
    (export_copy / "model.onnx").unlink()
    with pytest.raises(ArtifactError, match=r"model.onnx is missing: the manifest lists it for the onnx export"):
        ExportFolder.open(export_copy, "onnx")
    (export_copy / "manifest.json").unlink()
    with pytest.raises(ArtifactError, match=r"has no manifest.json: not an export folder"):
        ExportFolder.open(export_copy)


def test_model_file_truncated(export_copy):
    path = export_copy / "model.onnx"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ArtifactError, match=r"model.onnx has \d+ bytes, the manifest recorded \d+: truncated or "
                                            r"altered, re-export it"):
        ExportFolder.open(export_copy, "onnx")


def test_model_file_altered_same_size(export_copy):
    path = export_copy / "model.pt"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match=r"model.pt sha256 \w+… does not match the manifest's \w+…: altered "
                                            r"after export, re-export it"):
        ExportFolder.open(export_copy, "torchscript")
    ExportFolder.open(export_copy, "onnx")  # the untouched artifact is still trusted


def test_checkpoint_truncated(cwd, tiny):
    torch.save(tiny.module.state_dict(), cwd / "w.pt")
    (cwd / "w.pt").write_bytes((cwd / "w.pt").read_bytes()[:1000])
    msg = cli_error(["torchscript", "--config", "tiny", "--checkpoint", "w.pt", "-o", "out"])
    assert msg == ("Error: checkpoint w.pt cannot be read as a tensors-only state dict (torch.load "
                   "weights_only=True): not a complete torch.save file (truncated or corrupted)")
    with pytest.raises(ModelLoadError, match="truncated or corrupted"):
        from mhaexport.models.loading import load_model

        load_model("tiny", checkpoint=cwd / "w.pt")
    assert not (cwd / "out").exists()


def test_zero_prompts_for_right_padding():
    from mhaexport.core.errors import RuntimeInputError
    from mhaexport.runtime.decode import pad_prompts

    with pytest.raises(RuntimeInputError, match="empty batch: give at least one prompt"):
        pad_prompts([], 256, 128, side="right")


def test_verify_export_folder_with_missing_files(export_copy):
    (export_copy / "model.onnx").unlink()
    msg = cli_error(["verify", str(export_copy)])
    assert msg == f"Error: {export_copy / 'model.onnx'} is missing: the manifest lists it for the onnx export"


def test_generate_refuses_a_truncated_model_file(export_copy):
    path = export_copy / "model.onnx"
    path.write_bytes(path.read_bytes()[:1000])
    msg = cli_error(["generate", str(export_copy), "--prompt-ids", "5,6"])
    assert msg.startswith(f"Error: {path} has 1000 bytes, the manifest recorded ")


def test_prompt_ids_out_of_vocab(tiny_export):
    msg = cli_error(["generate", str(tiny_export), "--prompt-ids", "5,300"])
    assert msg == "Error: prompt 0 holds token id 300, outside the vocabulary [0, 256)"
    from mhaexport.core.errors import RuntimeInputError
    from mhaexport.runtime import Generator

    with pytest.raises(RuntimeInputError, match=r"token id -1 is outside the vocabulary \[0, 256\)"):
        import numpy as np

        Generator(tiny_export).forward(np.array([[5, -1]]), np.ones((1, 2), np.int64))


def test_prompt_longer_than_max_positions(tiny_export):
    msg = cli_error(["generate", str(tiny_export), "--prompt-ids", ",".join(["7"] * 129)])
    assert msg == "Error: prompt of 129 tokens is longer than the model's max_positions=128"


def test_mismatched_past_shapes_through_the_runtime_api(tiny_export):
    import numpy as np

    from mhaexport.core.errors import RuntimeInputError
    from mhaexport.runtime import Generator

    gen = Generator(tiny_export)
    ids, mask = np.array([[1, 2]]), np.ones((1, 5), np.int64)  # past = 5 - 2 = 3
    short = [(np.zeros((1, 4, 2, 16), np.float32),) * 2] * 2
    with pytest.raises(RuntimeInputError, match=r"past_key_values.0.key has shape \(1, 4, 2, 16\), expected "
                                                r"\(1, 4, 3, 16\) \[batch, n_kv_heads, past, head_dim\]"):
        gen.forward(ids, mask, short)
    wrong_heads = [(np.zeros((1, 4, 3, 8), np.float32),) * 2] * 2
    with pytest.raises(RuntimeInputError, match=r"has shape \(1, 4, 3, 8\), expected \(1, 4, 3, 16\)"):
        gen.forward(ids, mask, wrong_heads)
    one_layer = [(np.zeros((1, 4, 3, 16), np.float32),) * 2]
    with pytest.raises(RuntimeInputError, match="past_key_values must hold 2 \\(key, value\\) pairs"):
        gen.forward(ids, mask, one_layer)


def test_batch_of_zero(tiny_export):
    import numpy as np

    from mhaexport.core.errors import RuntimeInputError
    from mhaexport.runtime import Generator

    gen = Generator(tiny_export)
    with pytest.raises(RuntimeInputError, match="empty batch: give at least one prompt"):
        gen.generate([])
    with pytest.raises(RuntimeInputError, match=r"input_ids must be a non-empty \(batch, seq\) array, got shape "
                                                r"\(0, 3\)"):
        gen.forward(np.zeros((0, 3), np.int64), np.zeros((0, 3), np.int64))
    msg = cli_error(["generate", str(tiny_export)])
    assert msg == "Error: give --prompt TEXT or --prompt-ids 5,17,42"
