"""Issue 35 item 4: outputs never go through a link. Every folder a verb creates or writes — adoption's default
``mhaexport/`` folder beside ``verify FILE.onnx``, ``-o`` of an export, bench's and quantize's outputs — is refused
in one line (exit 2) when it is a symlink, and adoption never replaces another model's export; the export the link
pointed at is left byte for byte as it was."""

from __future__ import annotations

import json
import shutil

import pytest

from test_bad_input import cli_error
from test_hostile_cli import digest


@pytest.fixture()
def victim(tiny_export, tmp_path):
    """Another export, which a link in the output's place points at."""
    folder = tmp_path / "victim"
    shutil.copytree(tiny_export, folder, ignore=shutil.ignore_patterns(".snapshot-*", ".staging-*"))
    return folder


@pytest.fixture()
def onnx_file(tiny_export, tmp_path):
    """A bare ONNX file (made by "another tool") in a folder of its own."""
    src = tmp_path / "src"
    src.mkdir()
    shutil.copy(tiny_export / "model.onnx", src / "model.onnx")
    return src / "model.onnx"


def test_adoptions_default_folder_through_a_link_is_refused(onnx_file, victim):
    (onnx_file.parent / "mhaexport").symlink_to(victim, target_is_directory=True)
    before = digest(victim)
    msg = cli_error(["verify", str(onnx_file), "--config", "tiny"])
    assert "mhaexport is a symlink" in msg and "never through a link" in msg
    assert digest(victim) == before


def test_adoption_never_replaces_another_models_export(onnx_file, victim):
    manifest = json.loads((victim / "manifest.json").read_text())
    manifest["model"]["fingerprint"] = "0" * 16  # another model's export, in a real folder
    (victim / "manifest.json").write_text(json.dumps(manifest))
    shutil.move(victim, onnx_file.parent / "mhaexport")
    before = digest(onnx_file.parent / "mhaexport")
    msg = cli_error(["verify", str(onnx_file), "--config", "tiny"])
    assert "would replace it: refused" in msg and "0000000000000000" in msg
    assert digest(onnx_file.parent / "mhaexport") == before


@pytest.mark.parametrize("verb", [["onnx", "--config", "tiny"], ["bench", "{export}", "--runtimes", "ort-cpu"],
                                  ["quantize", "{export}"]])
def test_an_output_folder_that_is_a_link_is_refused(tiny_export, victim, tmp_path, verb):
    link = tmp_path / "out"
    link.symlink_to(victim, target_is_directory=True)
    before = digest(victim)
    msg = cli_error([a.format(export=tiny_export) for a in verb] + ["-o", str(link)])
    assert "is a symlink" in msg and "refused" in msg, msg
    assert digest(victim) == before
