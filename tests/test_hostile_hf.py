"""Issue 35 items 2-3: a ``--hf`` folder is read like an export folder — every file transformers or the exporter
takes from it is opened inside it without following a link and copied, hashed, before use — and transformers never
runs or offers to run a folder's code (``trust_remote_code=False``, no prompt even when one would be answered "y").
Each hostile folder goes through the real CLI: one line, exit 2, nothing written, nothing run."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from mhaexport.cli import main
from test_bad_input import cli_error

pytest.importorskip("transformers")


@pytest.fixture()
def llama_copy(hf_dir, tmp_path):
    """A private copy of the tiny Llama folder (weights, config, tokenizer) to make hostile."""
    folder = tmp_path / "llama"
    shutil.copytree(hf_dir("llama"), folder)
    return folder


@pytest.mark.parametrize("name", ["model.safetensors", "tokenizer.json", "config.json"])
def test_a_file_that_is_a_link_out_of_the_folder_is_refused(llama_copy, tmp_path, name):
    outside = tmp_path / "outside"
    outside.mkdir()
    (llama_copy / name).rename(outside / name)
    (llama_copy / name).symlink_to(outside / name)  # the file lives elsewhere: it would be read, shipped, hashed
    before = {p.name: p.stat().st_mtime_ns for p in outside.iterdir()}
    msg = cli_error(["onnx", "--hf", str(llama_copy), "-o", str(tmp_path / "out")])
    assert f"{name} is a symlink" in msg and "refused" in msg
    assert not (tmp_path / "out").exists()
    assert {p.name: p.stat().st_mtime_ns for p in outside.iterdir()} == before


def test_a_fifo_among_the_files_is_refused_without_hanging(llama_copy, tmp_path):
    (llama_copy / "generation_config.json").unlink()
    os.mkfifo(llama_copy / "generation_config.json")
    msg = cli_error(["onnx", "--hf", str(llama_copy), "-o", str(tmp_path / "out")])
    assert "generation_config.json is not a regular file" in msg


CODE = """from pathlib import Path
Path({marker!r}).write_text("ran")
from transformers import LlamaConfig as Base
class CustomConfig(Base):
    model_type = "custom-llama"
"""


def test_a_folder_whose_config_needs_its_own_code_is_refused_without_running_or_asking(llama_copy, tmp_path):
    marker = tmp_path / "marker"
    (llama_copy / "custom.py").write_text(CODE.format(marker=str(marker)))
    cfg = json.loads((llama_copy / "config.json").read_text())
    cfg.update(model_type="custom-llama", auto_map={"AutoConfig": "custom.CustomConfig",
                                                    "AutoModelForCausalLM": "custom.CustomModel"})
    (llama_copy / "config.json").write_text(json.dumps(cfg))
    res = CliRunner().invoke(main, ["onnx", "--hf", str(llama_copy), "-o", str(tmp_path / "out")],
                             input="y\ny\n")  # a prompt, if transformers asked, would be answered yes
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: --hf") and "(auto_map)" in lines[0], res.output
    assert "[y/N]" not in res.output
    assert not marker.exists() and not (tmp_path / "out").exists()


def test_what_transformers_loads_is_the_copy_hashed_from_the_bytes_read(llama_copy):
    from mhaexport.models.hf_files import confined_copy

    (llama_copy / "notes.py").write_text("raise SystemExit")  # not a file transformers loads: never copied
    with confined_copy(llama_copy, "llama") as files:
        copied = sorted(p.name for p in files.dir.iterdir())
        assert "notes.py" not in copied and "model.safetensors" in copied and "config.json" in copied
        for name, digest in files.sha256.items():
            assert hashlib.sha256((llama_copy / name).read_bytes()).hexdigest() == digest
            assert (files.dir / name).read_bytes() == (llama_copy / name).read_bytes()
        assert files.tokenizer["tokenizer.json"] == (llama_copy / "tokenizer.json").read_bytes()
        private = files.dir
    assert not Path(private).exists()  # the private copy goes when loaded


@pytest.mark.slow
def test_at_a_terminal_nothing_asks_to_run_the_folders_code(llama_copy, tmp_path):
    """The same folder through a real subprocess whose stdin/stdout are a terminal (a pty), a "y" already typed."""
    import pty
    import subprocess
    import sys

    marker = tmp_path / "marker"
    (llama_copy / "custom.py").write_text(CODE.format(marker=str(marker)))
    cfg = json.loads((llama_copy / "config.json").read_text())
    cfg.update(model_type="custom-llama", auto_map={"AutoConfig": "custom.CustomConfig"})
    (llama_copy / "config.json").write_text(json.dumps(cfg))
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "mhaexport", "onnx", "--hf", str(llama_copy), "-o",
                             str(tmp_path / "out")], stdin=slave, stdout=slave, stderr=slave, close_fds=True)
    os.close(slave)
    os.write(master, b"y\ny\n")  # would answer transformers' "[y/N]"
    out = b""
    while True:
        try:
            chunk = os.read(master, 4096)
        except OSError:  # EIO: the terminal's other end closed
            break
        if not chunk:
            break
        out += chunk
    os.close(master)
    assert proc.wait(timeout=600) == 2, out
    text = out.decode(errors="replace")
    assert "(auto_map)" in text and "[y/N]" not in text and "Traceback" not in text
    assert not marker.exists() and not (tmp_path / "out").exists()
