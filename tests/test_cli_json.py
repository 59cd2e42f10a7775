"""``--json`` on the verbs that report (issue 28 item 3): one JSON object on stdout and nothing else there, in the
documented shape (docs/reference.md, "Output for scripts"). The export verbs share schema mhaexport.export/1: what was written,
each file's bytes and sha256 as the manifest records them, the seconds, the details, what a --replace replaced.
(onnx: tests/test_bench.py's other-model export; pt2: tests/test_pt2.py's block export; bench, eval, generate,
verify and report merge: their own modules.)"""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from mhaexport.artifact import read_manifest, sha256_file
from mhaexport.cli import main


def check_export_json(stdout: str, command: str, folder: Path, artifacts: list[str]) -> dict:
    """The shape every export verb's --json shares, checked against the folder it wrote."""
    data = json.loads(stdout)  # the whole of stdout: one object
    assert data["schema"] == "mhaexport.export/1" and data["command"] == command
    manifest = read_manifest(folder)
    assert data["model"] == {"spec": manifest.model.spec, "fingerprint": manifest.model.fingerprint}
    assert data["manifests"][-1] == str(folder / "manifest.json")
    assert [a["artifact"] for a in data["artifacts"]] == artifacts
    for a in data["artifacts"]:
        entry = manifest.artifacts[a["artifact"]]
        assert a["folder"] == str(folder) and a["file"] == entry.file and a["dtype"] == entry.dtype
        assert set(a["files"]) == set(entry.files) and a["seconds"] >= 0 and isinstance(a["warnings"], list)
        for name, meta in a["files"].items():
            assert meta == {"bytes": (folder / name).stat().st_size, "sha256": sha256_file(folder / name)}
        assert a["details"] == entry.details.to_dict()
    return data


def test_torchscript_json_and_what_replace_replaced(tmp_path):
    out = tmp_path / "ts"
    r = CliRunner().invoke(main, ["-q", "torchscript", "--config", "tiny", "-o", str(out), "--json"])
    assert r.exit_code == 0, r.output
    data = check_export_json(r.stdout, "torchscript", out, ["torchscript"])
    assert data["replaced"] is None and data["artifacts"][0]["details"]["mode"] == "trace"
    r = CliRunner().invoke(main, ["torchscript", "--config", "tiny-llama", "-o", str(out), "--replace", "--json"])
    assert r.exit_code == 0, r.output
    data = check_export_json(r.stdout, "torchscript", out, ["torchscript"])
    assert data["replaced"]["what"] == "a decoder" and data["replaced"]["spec"] == "preset:tiny"
    assert "replaced a decoder preset:tiny" in r.stderr  # progress and the replace line stay on stderr


def test_quantize_json(tiny_export, tmp_path):
    out = tmp_path / "q"
    r = CliRunner().invoke(main, ["quantize", str(tiny_export), "-o", str(out), "--weights", "int8", "--json"])
    assert r.exit_code == 0, r.output
    data = check_export_json(r.stdout, "quantize", out, ["onnx"])
    q = data["artifacts"][0]["quantization"]
    assert q["weights"] == "int8" and q["label"].startswith("int8") and q["weights_read"]["fixed_bytes"] > 0
    assert q["source"]["onnx_sha256"] == sha256_file(tiny_export / "model.onnx")
    assert "[3/3] checking that ONNX Runtime runs it" in r.stderr  # progress on stderr, stdout the JSON alone


def test_lint_json(tiny_export):
    r = CliRunner().invoke(main, ["lint", str(tiny_export), "--json"])
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert data["ok"] is True and data["counts"] == {"error": 0, "warning": 0, "info": 0}
    assert "mask-order" in data["rules"] and data["findings"] == []
