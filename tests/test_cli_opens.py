"""One open per verb (issue 26 item 5): each verb opens (snapshots and hash-checks) its export folder once, hands the
opened ExportFolder down, hashes model.onnx once, opens every other folder it reads (bench's --compare folders and
the variants --lowerings/--quantize find or make) at most once, and leaves no snapshot in TMPDIR when it ends --
on errors too. Counted by patching ExportFolder.open and the snapshot's hashing copy."""

from __future__ import annotations

import tempfile
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from mhaexport.cli import main


@pytest.fixture()
def counted(monkeypatch, tmp_path):
    """Every ExportFolder.open call per folder (``calls``) and those that returned (``opened``), every file the
    snapshots hash (``hashed``: (folder, name)), in a TMPDIR of the test's own (``snapshots()``: what is left there)."""
    from mhaexport.artifact import files, folder
    from mhaexport.bench import probes

    tmpdir = tmp_path / "tmpdir"
    tmpdir.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmpdir))
    monkeypatch.setattr(tempfile, "tempdir", str(tmpdir))  # gettempdir() caches what it found first
    monkeypatch.setattr(probes, "default_probe", lambda threads: probes.Bandwidth({"copy": 10.0, "sum": 8.0,
                                                                                  "gemv": 12.5}, threads, 256,
                                                                                 "fake"))
    calls, opened, hashed = Counter(), Counter(), Counter()
    real_open = folder.ExportFolder.open.__func__

    def open_(cls, path, artifact=None, **kw):
        calls[Path(path).resolve()] += 1
        ef = real_open(cls, path, artifact, **kw)
        opened[Path(path).resolve()] += 1
        return ef

    real_snapshot, real_sha = folder._snapshot, files.sha256_file

    def snapshot(path, names, manifest, *rest):
        hashed.update((Path(path).resolve(), n) for n in names)
        return real_snapshot(path, names, manifest, *rest)

    def sha(path, *args, **kw):
        hashed[(Path(path).parent.resolve(), Path(path).name)] += 1
        return real_sha(path, *args, **kw)

    monkeypatch.setattr(folder.ExportFolder, "open", classmethod(open_))
    monkeypatch.setattr(folder, "_snapshot", snapshot)
    monkeypatch.setattr(files, "sha256_file", sha)
    return SimpleNamespace(calls=calls, opened=opened, hashed=hashed,
                           snapshots=lambda: sorted(p.name for p in tmpdir.glob("mhaexport.snapshot-*")))


def run(args: list[str], folder: Path, tmp_path: Path):
    return CliRunner().invoke(main, ["-q", *(a.format(F=folder, T=tmp_path) for a in args)])


VERBS = {
    "verify": ["verify", "{F}", "--runtime", "ort-cpu", "-o", "{T}/report"],
    "verify --bisect": ["verify", "{F}", "--bisect"],
    "bench": ["bench", "{F}", "--runtime", "ort-cpu", "--prompt-len", "4", "--new-tokens", "2", "--repeats", "1",
              "--threads", "1", "-o", "{T}/bench"],
    "eval": ["eval", "{F}"],
    "generate": ["generate", "{F}", "--prompt-ids", "1,2,3", "--max-new-tokens", "2"],
}


@pytest.mark.parametrize("verb", list(VERBS))
def test_each_verb_opens_its_folder_once_and_leaves_no_snapshot(verb, tiny_export, tmp_path, counted, one_thread):
    res = run(VERBS[verb], tiny_export, tmp_path)
    assert res.exit_code == 0, res.output
    folder = tiny_export.resolve()
    assert counted.calls[folder] == 1 and dict(counted.opened) == {folder: 1}, (counted.calls, counted.opened)
    assert counted.hashed[(folder, "model.onnx")] == 1, counted.hashed
    assert counted.snapshots() == []


# a failure after the folder was opened: the snapshot goes all the same
ERRORS = {
    "verify": ["verify", "{F}", "--config", "tiny-llama", "--runtime", "ort-cpu", "-o", "{T}/report"],
    "verify --bisect": ["verify", "{F}", "--bisect", "--case", "1,200,0"],
    "bench": ["bench", "{F}", "--runtime", "ort-cpu", "--prompt-len", "100", "--new-tokens", "64", "-o", "{T}/b"],
    "eval": ["eval", "{F}", "--text", "{T}/one-byte.txt"],
    "generate": ["generate", "{F}", "--prompt-ids", "5,999"],
}


@pytest.mark.parametrize("verb", list(ERRORS))
def test_a_verb_that_fails_after_opening_its_folder_leaves_no_snapshot(verb, tiny_export, tmp_path, counted):
    (tmp_path / "one-byte.txt").write_bytes(b"x")
    res = run(ERRORS[verb], tiny_export, tmp_path)
    assert res.exit_code == 2 and "Traceback" not in res.output, res.output
    assert counted.opened[tiny_export.resolve()] == 1, counted.opened  # it failed after the open
    assert counted.snapshots() == []


def test_bench_with_export_steps_opens_each_folder_once(tiny_export, tmp_path, counted, one_thread):
    """--lowerings (FOLDER holds decomposed: nothing exported) and --quantize int4 (quantized into -o): FOLDER is
    opened once for the steps and the run, the quantized folder once (made, then timed), model.onnx hashed once."""
    res = run(["bench", "{F}", "--runtime", "ort-cpu", "--lowerings", "decomposed", "--quantize", "int4",
               "--prompt-len", "4", "--new-tokens", "2", "--repeats", "1", "--threads", "1", "-o", "{T}/b"],
              tiny_export, tmp_path)
    assert res.exit_code == 0, res.output
    folder, quantized = tiny_export.resolve(), (tmp_path / "b" / "quantized" / "int4").resolve()
    assert counted.calls[folder] == 1
    assert dict(counted.opened) == {folder: 1, quantized: 1}, counted.opened
    assert counted.hashed[(folder, "model.onnx")] == 1 and counted.hashed[(quantized, "model.onnx")] == 1
    assert counted.snapshots() == []
