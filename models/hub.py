"""Hub model ids for ``--hf``: ``org/name`` (optionally at ``--revision``) resolved to a snapshot folder of the user's
Hugging Face cache, through ``huggingface_hub`` (a dependency of transformers, in the ``hf`` extra).

Offline unless asked: the cache is read with ``local_files_only=True``; a download happens only when the caller
allows it (``--allow-download``) and ``HF_HUB_OFFLINE`` is not set. The cache searched is the one huggingface_hub
uses, read from the environment at call time (``HF_HUB_CACHE``, else ``HF_HOME/hub``, else
``~/.cache/huggingface/hub``), so a test or a user that sets it after import is honoured. Downloading itself is
huggingface_hub's job and is not exercised by mhaexport's tests (there is no network where they run).

What an export records of such a model is :attr:`HubSource.record`: the id, the revision asked for and the
snapshot's commit hash — never the machine's cache path; a later verify resolves the commit from the cache again.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from mhaexport.core.errors import ModelLoadError, UnsafeFolder, first_line

# org/name as the Hub spells it (one slash; letters, digits, '-', '_', '.'); a bare "name" is taken as a folder
REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]{0,95}/[A-Za-z0-9][\w.-]{0,95}$")
COMMIT = re.compile(r"^[0-9a-f]{40}$")
# a branch, tag or commit as --revision or a manifest may name one: git ref characters, no ".." and no leading "/"
REVISION = re.compile(r"^(?!.*\.\.)(?!/)[A-Za-z0-9][\w./-]{0,199}$")
# what a download fetches: configs, weights and tokenizer files; never other runtimes' exports or training state
ALLOW_PATTERNS = ["*.json", "*.safetensors", "*.bin", "*.model", "*.txt", "*.tiktoken"]
IGNORE_PATTERNS = ["onnx/*", "*.onnx", "*.onnx_data", "*.gguf", "original/*", "*.msgpack", "*.h5", "tf_model*",
                   "flax_model*", "training_args.bin", "optimizer*"]
TRUE = {"1", "on", "yes", "true"}


@dataclass(frozen=True)
class HubSource:
    """A Hub model resolved in the cache: its id, the revision asked for (None: main), the snapshot's commit and
    the snapshot folder (this machine's; never recorded)."""

    repo_id: str
    revision: str | None
    commit: str
    folder: Path

    @property
    def record(self) -> dict:
        """What a manifest records: id, revision, commit (no path)."""
        return {"repo_id": self.repo_id, "revision": self.revision or "main", "commit": self.commit}

    @property
    def spec(self) -> str:
        """``hf:org/name`` (``@revision`` when one other than main was asked for)."""
        at = f"@{self.revision}" if self.revision and self.revision != "main" else ""
        return f"hf:{self.repo_id}{at}"


def is_repo_id(value: str | Path) -> bool:
    """True when ``value`` names a Hub model (``org/name``) rather than a folder: it has the id's form and no such
    folder exists."""
    text = str(value)
    return bool(REPO_ID.match(text)) and not Path(text).exists()


def cache_dir() -> Path:
    """The hub cache huggingface_hub reads, from the environment now: HF_HUB_CACHE (or its old name
    HUGGINGFACE_HUB_CACHE), else HF_HOME/hub, else XDG_CACHE_HOME/huggingface/hub, else ~/.cache/huggingface/hub."""
    env = os.environ
    explicit = env.get("HF_HUB_CACHE") or env.get("HUGGINGFACE_HUB_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    home = env.get("HF_HOME") or os.path.join(env.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"),
                                               "huggingface")
    return Path(home).expanduser() / "hub"


def offline() -> bool:
    """HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) is set to a true value."""
    return any(os.environ.get(k, "").strip().lower() in TRUE for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def resolve(repo_id: str, revision: str | None = None, *, allow_download: bool = False) -> HubSource:
    """The snapshot of ``repo_id`` at ``revision`` (a branch, tag or commit; None: main) in the user's cache.

    Offline by default. With ``allow_download`` (and HF_HUB_OFFLINE unset) huggingface_hub fetches what the cache
    lacks. Raises ModelLoadError with one line naming the id, the cache searched and how to allow the download."""
    if not REPO_ID.match(repo_id):
        raise ModelLoadError(f"--hf {repo_id}: neither a folder nor a Hub model id (org/name)")
    if revision is not None and not REVISION.match(revision):
        raise ModelLoadError(f"--hf {repo_id} --revision {revision!r}: not a branch, tag or commit name")
    try:
        import huggingface_hub
        from huggingface_hub.errors import LocalEntryNotFoundError, OfflineModeIsEnabled
        from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars
    except ImportError as e:
        raise ModelLoadError(f"--hf {repo_id} (a Hub model id) needs the huggingface_hub package "
                             f"({first_line(e)}): pip install -e '.[hf]' in the mhaexport checkout "
                             "(or pip install huggingface_hub)") from None
    cache = cache_dir()
    at = f" at revision {revision}" if revision else ""
    local_only = not allow_download or offline()
    bars_off = are_progress_bars_disabled()
    disable_progress_bars()  # library code never prints
    try:
        folder = huggingface_hub.snapshot_download(
            repo_id, revision=revision, cache_dir=str(cache), local_files_only=local_only,
            allow_patterns=ALLOW_PATTERNS, ignore_patterns=IGNORE_PATTERNS)
    except (LocalEntryNotFoundError, OfflineModeIsEnabled, FileNotFoundError) as e:
        if not local_only:
            raise ModelLoadError(f"--hf {repo_id}{at}: the download into {cache} failed: {first_line(e)}") from None
        how = ("HF_HUB_OFFLINE is set: unset it and pass --allow-download to fetch it" if offline() else
               "pass --allow-download to fetch it")
        raise ModelLoadError(f"--hf {repo_id}{at}: not in the Hugging Face cache {cache} ({how}, or set "
                             "HF_HUB_CACHE / HF_HOME to the cache that holds it)") from None
    except Exception as e:  # noqa: BLE001 - the Hub's errors (no such repo, gated, network) and the cache's
        what = "the download into" if not local_only else "reading the Hugging Face cache"
        raise ModelLoadError(f"--hf {repo_id}{at}: {what} {cache} failed: {first_line(e)}") from None
    finally:
        if not bars_off:
            enable_progress_bars()
    folder = Path(folder)
    commit = folder.name
    if not COMMIT.match(commit):  # not a snapshots/<commit> folder: a layout mhaexport does not know
        raise ModelLoadError(f"--hf {repo_id}{at}: huggingface_hub returned {folder}, not a snapshots/<commit> "
                             "folder of the cache")
    confine_snapshot(cache, repo_id, folder)
    return HubSource(repo_id=repo_id, revision=revision, commit=commit, folder=folder)


def confine_snapshot(cache: Path, repo_id: str, folder: Path) -> None:
    """UnsafeFolder unless ``folder`` is a ``snapshots/<commit>`` folder of ``repo_id``'s own folder in ``cache``
    and every file in it resolves inside that repo folder (the cache's snapshot files are symlinks into its
    ``blobs/``; a ``refs/main`` holding ``../../…`` or a snapshot linking elsewhere is refused)."""
    repo_dir = (cache / f"models--{repo_id.replace('/', '--')}").resolve()
    snapshots = repo_dir / "snapshots"
    where = f"the Hugging Face cache's {repo_id}"
    real = folder.resolve()
    if real.parent != snapshots or not COMMIT.match(real.name):
        raise UnsafeFolder(f"{where}: its snapshot {folder} resolves to {real}, outside {snapshots}: refused")
    for path in real.rglob("*"):
        target = path.resolve()
        if repo_dir not in target.parents:
            raise UnsafeFolder(f"{where}: {path.relative_to(real)} in snapshot {real.name} leads to {target}, "
                               f"outside {repo_dir}: refused")
