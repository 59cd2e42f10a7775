"""Issue 35 items 1-2: every field onnxruntime-genai's config parser knows is classified in
mhaexport/runtime/genai_fields.py (the vendored list tests/data/genai_config_fields.txt comes from its own source,
src/config.cpp), and a folder's genai_config.json options that load code or write files are refused through the real
CLI — one line, exit 2, naming the field, nothing run, nothing written — unless --trust-code."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from mhaexport.cli import main
from mhaexport.runtime.genai_fields import CLASSES, FIELDS, classify, unsafe_fields, walk
from test_bad_input import cli_error

VENDORED = Path(__file__).parent / "data" / "genai_config_fields.txt"


def vendored() -> list[tuple[str, str, str]]:
    rows = [ln.split() for ln in VENDORED.read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    assert all(len(r) == 3 for r in rows)
    return [tuple(r) for r in rows]


def test_every_field_of_onnxruntime_genais_parser_is_classified():
    rows = vendored()
    assert len(rows) > 250  # the whole parser, not a sample
    missing = []
    for element, key, kind in rows:
        cls = classify(element, key)
        if cls is None:
            missing.append(f"{element}.{key}")
        elif kind == "value":
            assert cls in CLASSES, (element, key, cls)
        else:  # an object or an array: a nested element, or a leaf list of data
            assert cls in CLASSES or cls[1:] in FIELDS, (element, key, cls)
    assert missing == [], f"classify these in runtime/genai_fields.py: {missing}"
    known = {(e, k) for e, k, _ in rows}
    assert {(e, k) for e, keys in FIELDS.items() for k in keys} - known == set()  # nothing invented


def test_what_loads_code_or_writes_files_is_code():
    assert classify("SessionOptions", "custom_ops_library") == "code"
    assert classify("SessionOptions", "enable_profiling") == "code"
    assert classify("SessionOptions", "session.optimized_model_filepath") == "code"  # any config entry
    assert classify("RunOptions", "anything") == "code"
    assert classify("ProviderOptions", "backend_path") == "code"
    assert {classify(e, "filename") for e in ("Decoder", "Encoder", "Vision", "PipelineModel")} == {"name"}
    assert classify("Model", "tokenizer_dir") == "name"


def test_mhaexports_own_config_passes(tiny_export):
    config = json.loads((tiny_export / "genai_config.json").read_text())
    assert unsafe_fields(config) == []
    assert {f.cls for f in walk(config)} <= set(CLASSES)


MARKER_C = r"""
#include <stdio.h>
__attribute__((constructor)) static void ran(void) {
    FILE *f = fopen("%s", "w");
    if (f) { fputs("ran", f); fclose(f); }
}
"""


@pytest.fixture(scope="module")
def custom_op_library(tmp_path_factory):
    """A shared library whose initializer writes a marker file: (library, marker)."""
    if shutil.which("gcc") is None:
        pytest.skip("gcc is needed to build the custom-op library")
    where = tmp_path_factory.mktemp("customop")
    marker = where / "marker"
    (where / "ops.c").write_text(MARKER_C % marker)
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(where / "libops.so"), str(where / "ops.c")], check=True)
    return where / "libops.so", marker


def hostile(tiny_export, dst: Path, options: dict) -> Path:
    from planted.edit import edited_genai_config

    return edited_genai_config(tiny_export, dst, lambda c: c["model"]["decoder"]["session_options"].update(options))


GENERATE = ["generate", "--prompt-ids", "5,17", "--max-new-tokens", "2", "--engine", "onnxruntime-genai"]


def test_a_custom_op_library_is_refused_and_never_loaded(tiny_export, custom_op_library, tmp_path, monkeypatch):
    pytest.importorskip("onnxruntime_genai")
    from planted.edit import rehash

    lib, marker = custom_op_library
    folder = hostile(tiny_export, tmp_path / "f", {"custom_ops_library": "libops.so"})
    shutil.copy(lib, folder / "libops.so")  # the folder ships it and its manifest vouches for it, as in the issue
    rehash(folder, ("libops.so",))
    monkeypatch.chdir(tmp_path)
    msg = cli_error([*GENERATE, str(folder)])
    assert "model.decoder.session_options.custom_ops_library loads a native library" in msg and "--trust-code" in msg
    msg = cli_error(["generate", "--prompt-ids", "5,17", "--max-new-tokens", "2", str(folder)])  # auto: no fallback
    assert "custom_ops_library" in msg
    msg = cli_error(["verify", str(folder), "--runtime", "ort-genai"])
    assert "custom_ops_library" in msg
    msg = cli_error(["bench", str(folder), "--runtimes", "ort-genai", "--prompt-len", "4", "--new-tokens", "2",
                     "-o", str(tmp_path / "bench")])
    assert "custom_ops_library" in msg and not (tmp_path / "bench").exists()
    assert not marker.exists()  # nothing ran
    # the library really runs when loaded: with --trust-code onnxruntime-genai loads it (and then fails: it
    # registers no op), so the absence above is the refusal's doing
    res = CliRunner().invoke(main, [*GENERATE, "--trust-code", str(folder)])
    assert marker.read_text() == "ran", res.output


@pytest.mark.parametrize("options, field", [
    ({"enable_profiling": "trace"}, "session_options.enable_profiling writes a profile trace"),
    ({"session.optimized_model_filepath": "opt.onnx"}, "session.optimized_model_filepath is an ONNX Runtime config"),
    ({"provider_options": [{"qnn": {"backend_path": "libQnnHtp.so"}}]}, "qnn.backend_path is a provider option"),
    ({"log_idx": "x", "session.x": "1"}, "log_idx is an ONNX Runtime config entry"),
])
def test_options_that_write_or_name_paths_are_refused(tiny_export, tmp_path, monkeypatch, options, field):
    pytest.importorskip("onnxruntime_genai")
    folder = hostile(tiny_export, tmp_path / "f", options)
    monkeypatch.chdir(tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    msg = cli_error([*GENERATE, str(folder)])
    assert field in msg and msg.endswith("pass --trust-code if the folder is yours"), msg
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no trace, no optimized model in the cwd


def test_a_name_that_leaves_the_folder_is_refused_even_with_trust_code(tiny_export, tmp_path):
    pytest.importorskip("onnxruntime_genai")
    from planted.edit import edited_genai_config

    folder = edited_genai_config(tiny_export, tmp_path / "f", lambda c: c["model"].update(tokenizer_dir="../x"))
    for extra in ([], ["--trust-code"]):
        msg = cli_error([*GENERATE, *extra, str(folder)])
        assert "model.tokenizer_dir" in msg and "leaves the folder" in msg
