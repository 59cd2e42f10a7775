"""`--hf ORG/NAME`: Hub model ids resolved from the user's Hugging Face cache, offline (mhaexport.models.hub).

The cache is laid out here the way huggingface_hub lays it out (``models--org--name/blobs/<sha256>``,
``snapshots/<commit>/<file>`` symlinks to the blobs, ``refs/<branch>`` holding the commit), in a temporary
HF_HUB_CACHE, around a tiny random Llama (tests/hf_models.py), and huggingface_hub's own ``scan_cache_dir`` must
read it as a valid cache. There is no network here: downloading is huggingface_hub's job and is not tested.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("huggingface_hub")

from click.testing import CliRunner  # noqa: E402

from mhaexport.cli import main  # noqa: E402
from mhaexport.core.errors import ModelLoadError  # noqa: E402

REPO = "tiny-org/tiny-llama"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
COMMIT_V1 = "fedcba9876543210fedcba9876543210fedcba98"


def lay_out_cache(cache: Path, repo_id: str, src: Path, commit: str, refs: tuple[str, ...] = ("main",)) -> Path:
    """Put the files of folder ``src`` into ``cache`` as huggingface_hub stores a snapshot: blobs named by sha256,
    snapshot files as relative symlinks to them, and ``refs/<ref>`` holding ``commit``. Returns the snapshot."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / commit
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    snapshot.mkdir(parents=True, exist_ok=True)
    for f in sorted(src.iterdir()):
        data = f.read_bytes()
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (snapshot / f.name).symlink_to(os.path.relpath(blob, snapshot))
    (repo / "refs").mkdir(exist_ok=True)
    for ref in refs:
        (repo / "refs" / ref).write_text(commit)
    return snapshot


@pytest.fixture(scope="module")
def hub_cache(hf_dir, tmp_path_factory):
    """A Hugging Face cache holding REPO at COMMIT (refs/main) and at COMMIT_V1 (refs/v1, another seed)."""
    cache = tmp_path_factory.mktemp("hf-hub-cache")
    lay_out_cache(cache, REPO, hf_dir("llama-small"), COMMIT)
    lay_out_cache(cache, REPO, hf_dir("llama-small", seed=1), COMMIT_V1, refs=("v1",))
    return cache


@pytest.fixture()
def offline_cache(hub_cache, monkeypatch):
    """HF_HUB_CACHE pointed at hub_cache, HF_HUB_OFFLINE=1 (nothing may reach the network)."""
    monkeypatch.setenv("HF_HUB_CACHE", str(hub_cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return hub_cache


def test_the_hand_laid_cache_is_one_huggingface_hub_reads(hub_cache):
    from huggingface_hub import scan_cache_dir

    info = scan_cache_dir(hub_cache)
    assert not info.warnings, info.warnings
    (repo,) = info.repos
    assert repo.repo_id == REPO and repo.repo_type == "model"
    assert {r.commit_hash: set(r.refs) for r in repo.revisions} == {COMMIT: {"main"}, COMMIT_V1: {"v1"}}


def test_an_id_resolves_to_its_snapshot_offline_and_records_no_path(offline_cache, tmp_path):
    from mhaexport.models import hub
    from mhaexport.models.loading import load_model

    assert hub.is_repo_id(REPO) and not hub.is_repo_id("just-a-name") and not hub.is_repo_id(str(tmp_path))
    assert hub.cache_dir() == offline_cache
    src = hub.resolve(REPO)
    assert src.commit == COMMIT and src.folder == offline_cache / f"models--{REPO.replace('/', '--')}" / \
        "snapshots" / COMMIT
    assert hub.resolve(REPO, "v1").commit == COMMIT_V1
    assert hub.resolve(REPO, COMMIT_V1).commit == COMMIT_V1
    loaded = load_model(hf=REPO)
    assert loaded.spec == f"hf:{REPO}" and loaded.origin.commit == COMMIT
    record = loaded.record(tmp_path).source.to_dict()
    assert record == {"kind": "hf", "repo_id": REPO, "revision": "main", "commit": COMMIT,
                      "model_type": "llama", "architecture": "LlamaForCausalLM"}
    v1 = load_model(hf=REPO, revision="v1")
    assert v1.spec == f"hf:{REPO}@v1" and v1.weights_sha256 != loaded.weights_sha256


def _check_source(out: Path, cache: Path) -> None:
    text = (out / "manifest.json").read_text()
    source = json.loads(text)["model"]["source"]
    assert {k: source[k] for k in ("repo_id", "revision", "commit")} == {"repo_id": REPO, "revision": "main",
                                                                          "commit": COMMIT}
    assert "path" not in source and str(cache) not in text and "snapshots" not in text


def _move_cache(cache: Path, tmp_path: Path, monkeypatch) -> Path:
    """Copy the cache to another HF_HOME (another machine) and point refs/main at another commit there."""
    moved = tmp_path / "home" / "hub"
    shutil.copytree(cache, moved, symlinks=True)
    monkeypatch.delenv("HF_HUB_CACHE")
    monkeypatch.setenv("HF_HOME", str(moved.parent))
    (moved / f"models--{REPO.replace('/', '--')}" / "refs" / "main").write_text(COMMIT_V1)
    return moved


def test_an_export_of_an_id_is_rebuilt_from_the_recorded_commit_in_another_cache(offline_cache, tmp_path,
                                                                                monkeypatch):
    from mhaexport.artifact import ExportFolder
    from mhaexport.models.loading import load_recorded

    out = tmp_path / "out"
    r = CliRunner().invoke(main, ["torchscript", "--hf", REPO, "-o", str(out)])  # the quick export
    assert r.exit_code == 0, r.output
    _check_source(out, offline_cache)
    _move_cache(offline_cache, tmp_path, monkeypatch)
    loaded = load_recorded(ExportFolder.open(out))  # the recorded commit, not refs/main's new one
    assert loaded.origin.commit == COMMIT and loaded.spec == f"hf:{REPO}"
    shutil.rmtree(tmp_path / "home" / "hub" / f"models--{REPO.replace('/', '--')}" / "snapshots" / COMMIT)
    r = CliRunner().invoke(main, ["verify", str(out), "--runtime", "torchscript"])
    assert r.exit_code == 2 and REPO in r.output and "--allow-download" in r.output, r.output


@pytest.mark.slow
def test_all_with_an_id_works_from_the_cache_and_verify_resolves_it_again(offline_cache, tmp_path, monkeypatch):
    out = tmp_path / "out"
    r = CliRunner().invoke(main, ["all", "--hf", REPO, "--runtime", "ort-cpu", "-o", str(out),
                                  "--junit", str(tmp_path / "all.xml")])
    assert r.exit_code == 0, r.output
    _check_source(out, offline_cache)
    assert f'<testsuite name="hf:{REPO} · onnx' in (tmp_path / "all.xml").read_text()
    _move_cache(offline_cache, tmp_path, monkeypatch)
    r = CliRunner().invoke(main, ["verify", str(out), "--runtime", "ort-cpu"])
    assert r.exit_code == 0, r.output


def test_a_model_missing_from_the_cache_is_one_line_naming_id_cache_and_the_flag(offline_cache, monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE")
    r = CliRunner().invoke(main, ["onnx", "--hf", "tiny-org/absent", "-o", "unused"])
    assert r.exit_code == 2, r.output
    (line,) = r.output.strip().splitlines()
    assert "tiny-org/absent" in line and str(offline_cache) in line and "--allow-download" in line, line
    assert "Traceback" not in r.output
    # a revision the cache lacks
    r = CliRunner().invoke(main, ["onnx", "--hf", REPO, "--revision", "v9", "-o", "unused"])
    assert r.exit_code == 2 and "at revision v9" in r.output and "--allow-download" in r.output, r.output
    # HF_HUB_OFFLINE wins over --allow-download, and the message says so
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    r = CliRunner().invoke(main, ["onnx", "--hf", "tiny-org/absent", "--allow-download", "-o", "unused"])
    assert r.exit_code == 2 and "HF_HUB_OFFLINE is set" in r.output, r.output


def test_revision_needs_a_hub_id(offline_cache, hf_dir):
    from mhaexport.models.loading import load_model

    with pytest.raises(ModelLoadError, match="applies to a Hub model id"):
        load_model(hf=hf_dir("llama-small"), revision="v1")
    r = CliRunner().invoke(main, ["onnx", "--config", "tiny", "--revision", "v1", "-o", "unused"])
    assert r.exit_code == 2 and "--revision applies to --hf" in r.output, r.output
