"""The one loader of an exported ONNX file in ONNX Runtime: :func:`ort_runner_for` reads how the file is fed from the
manifest once (:class:`~mhaexport.runtime.feed.Feed`: the contract's names or an adopted file's, a concat cache or
one shared buffer and its slots, the cache's dtype, a static export's sizes), picks the runner class that drives that
feed, and gives it the file's recorded sha256 for the optimized-graph cache; the runner builds its session with
:func:`~mhaexport.runtime.session.open_session`. The Generator, verify's and eval's ort-cpu / ort-cuda and every bench
row built on ONNX Runtime take their runner from here, over a folder opened once
(:class:`~mhaexport.artifact.ExportFolder`, whose snapshot holds the bytes that were hash-checked). Torch-free.
"""

from __future__ import annotations

from pathlib import Path

from mhaexport.artifact import ExportFolder
from mhaexport.core.iospec import ModelContract
from mhaexport.runtime.feed import Feed
from mhaexport.runtime.ort import OrtRunner, SharedCacheOrtRunner
from mhaexport.runtime.protocol import Protocol, protocol_of
from mhaexport.runtime.session import SessionConfig


def open_folder(folder: str | Path | ExportFolder, artifact: str = "onnx") -> ExportFolder:
    """``folder`` as an opened, hash-checked :class:`ExportFolder` (opened here when given as a path)."""
    return folder if isinstance(folder, ExportFolder) else ExportFolder.open(folder, artifact)


def feed_of(ef: ExportFolder, contract: ModelContract | None = None) -> Feed:
    """How ``ef``'s ONNX file is fed, read from its manifest entry (``contract``: the eager model's, default the
    folder's)."""
    return Feed.of(ef.entry("onnx"), contract or ef.contract)


def source_sha256(ef: ExportFolder) -> str:
    """The recorded (and hash-checked) sha256 of ``ef``'s ONNX file: the key of its optimized-graph cache."""
    entry = ef.entry("onnx")
    return entry.files[entry.file]["sha256"]


def no_decode_loop(ef: ExportFolder) -> str | None:
    """Why ``ef``'s ONNX export cannot be driven by a KV-cache decode loop (a static-shape export), or None."""
    if ef.entry("onnx").seq_dynamic:
        return None
    return (f"{ef.path} holds a static-shape ONNX export (sequence and past lengths fixed); a KV-cache decode loop "
            "needs `mhaexport onnx --seq-dynamic`")


def ort_runner_for(ef: ExportFolder, name: str, config: SessionConfig = SessionConfig(), *,
                   contract: ModelContract | None = None, io_binding: bool | None = None,
                   feed: Feed | None = None, protocol: Protocol | None = None) -> OrtRunner:
    """The ONNX Runtime runner of ``ef``'s ONNX export, not yet activated: a :class:`SharedCacheOrtRunner` for a shared
    cache, else an :class:`OrtRunner`; an adopted file fed under its own names. ``contract``: the eager model's
    contract (default: the folder's). ``feed``: another feed than the file's own (verify's plain-protocol findings:
    :meth:`Feed.plain`). ``protocol``: how it is driven (default: the file's own, :func:`protocol_of` its feed;
    verify's registry asks for the contract's calls translated, :class:`ContractOverShared`)."""
    c = contract or ef.contract
    feed = feed or feed_of(ef, c)
    return runner_class(feed)(name, c, ef.file("onnx"), feed=feed, config=config, io_binding=io_binding,
                              source_sha256=source_sha256(ef), protocol=protocol or protocol_of(feed))


def runner_class(feed: Feed) -> type[OrtRunner]:
    """The runner class that runs a file fed as ``feed`` says: :class:`SharedCacheOrtRunner` for one shared buffer
    (bound in place), else :class:`OrtRunner`. The one place this is chosen (a folder's file, a graph in memory)."""
    return SharedCacheOrtRunner if feed.shared else OrtRunner


def ort_runner_over(runner: OrtRunner, protocol: Protocol, name: str | None = None) -> OrtRunner:
    """A runner of ``runner``'s session (opened once, by ``runner``) driven in ``protocol``: one file, one session,
    two ways of driving it (verify's contract calls and the deploy loop's buffers in place). Not activated; its own
    ``times``."""
    return type(runner)(name or runner.name, runner.contract, runner.path, feed=runner.feed, config=runner.config,
                        io_binding=runner.io_binding, source_sha256=runner.source_sha256, protocol=protocol,
                        session_of=runner)
