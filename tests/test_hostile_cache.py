"""Issue 35 item 7: the optimized-graph cache (``MHAEXPORT_CACHE_DIR``) is never inside a folder being read — a
relative value resolved from the working directory included — and a cached graph runs only when its stamp, an HMAC
under this user's private key over the source file's sha256 and the cache's own files, checks: a stamp anyone can
compute from the hashes is not enough, and a cache others can write is neither read nor written."""

from __future__ import annotations

import hashlib
import os
import shutil

import pytest

from mhaexport.core.errors import ConfigError
from mhaexport.runtime import Generator


@pytest.fixture()
def folder(tiny_export, tmp_path):
    out = tmp_path / "export"
    shutil.copytree(tiny_export, out, ignore=shutil.ignore_patterns(".snapshot-*", ".staging-*"))
    return out


@pytest.mark.parametrize("value", ["cache", "{folder}/cache", "{folder}"])
def test_a_cache_inside_the_folder_being_read_is_refused(folder, monkeypatch, value):
    monkeypatch.chdir(folder)  # a relative value lands in the folder
    monkeypatch.setenv("MHAEXPORT_CACHE_DIR", value.format(folder=folder))
    before = sorted(p.name for p in folder.iterdir())
    with pytest.raises(ConfigError, match=r"MHAEXPORT_CACHE_DIR=.* is inside .*export, a folder being read"):
        Generator(folder, cache_optimized=True)
    assert sorted(p.name for p in folder.iterdir()) == before  # nothing written there


def _sha(path):
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "-"


def test_a_stamp_computed_from_the_hashes_does_not_make_a_graph_run(folder, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("MHAEXPORT_CACHE_DIR", str(cache))
    first = Generator(folder, cache_optimized=True)
    assert not first.optimized_from_cache and Generator(folder, cache_optimized=True).optimized_from_cache
    (graph,) = (cache / "ort").rglob("*.onnx")
    # a graph put in the cache's place, with the stamp anyone can compute (the source's and the files' sha256)
    shutil.copy(folder / "model.onnx", graph)
    source = hashlib.sha256((folder / "model.onnx").read_bytes()).hexdigest()
    graph.with_suffix(".sha256").write_text(f"{source} {_sha(graph)} {_sha(graph.with_name(graph.name + '.data'))}\n")
    again = Generator(folder, cache_optimized=True)
    assert not again.optimized_from_cache  # rebuilt from the file, the forged graph not run
    assert again.generate([[5, 17, 42]]).tokens == first.generate([[5, 17, 42]]).tokens
    assert Generator(folder, cache_optimized=True).optimized_from_cache  # and the cache is good again


def test_a_cache_others_can_write_is_neither_read_nor_written(folder, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    cache.mkdir()
    os.chmod(cache, 0o777)
    monkeypatch.setenv("MHAEXPORT_CACHE_DIR", str(cache))
    assert not Generator(folder, cache_optimized=True).optimized_from_cache
    assert not Generator(folder, cache_optimized=True).optimized_from_cache
    assert list(cache.rglob("*.onnx")) == [] and not (cache / "key").exists()
