"""``mhaexport eval``: the perplexity of an export folder on text, on any runtime (bits per byte for a byte-level
model) — the number a user asks for first, for a float export and a quantized one alike.

Each runtime is a runner of the one protocol (verify's eager and TorchScript runners, the deploy runtime's ONNX
Runtime runner); the text is scored in sliding windows (:func:`mhaexport.evaluate.scoring.score_text`, the scoring
verify's quality check uses too).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mhaexport.artifact import ExportFolder
from mhaexport.core.errors import ConfigError, MhaExportError, ProviderUnavailable
from mhaexport.core.untrusted import md
from mhaexport.evaluate.scoring import TextScore, score_text, text_tokens, windows
from mhaexport.runners.names import EAGER, EAGER_CUDA, EVAL, RUNTIMES, TORCHSCRIPT, refuse_unknown
from mhaexport.runners.registry import runner_for
from mhaexport.runners.threads import ONE_THREAD_MAX_PARAMS, torch_threads
from mhaexport.runtime.runner import Runner


@dataclass
class EvalRow:
    """One runtime's result: ``status`` "ran", "skipped" (cannot run here) or "error" (failed), with why."""

    runtime: str
    status: str
    reason: str = ""
    providers: list[str] = field(default_factory=list)
    score: TextScore | None = None
    seconds: float = 0.0

    def to_dict(self) -> dict:
        return {"runtime": self.runtime, "status": self.status, "reason": self.reason, "providers": self.providers,
                "seconds": round(self.seconds, 3), **(self.score.to_dict() if self.score else {})}


@dataclass
class EvalReport:
    """Perplexity per runtime of one folder on one text."""

    folder: str
    spec: str
    scheme: str | None  # the ONNX artifact's quantization label, None for a float export
    text_source: str
    text_bytes: int
    window: int
    stride: int
    rows: list[EvalRow]

    def to_dict(self) -> dict:
        return {"schema": "mhaexport.eval/1", "folder": self.folder, "model": self.spec, "quantization": self.scheme,
                "text": {"source": self.text_source, "bytes": self.text_bytes}, "window": self.window,
                "stride": self.stride, "runtimes": [r.to_dict() for r in self.rows]}

    def to_markdown(self) -> str:
        what = f"{md(self.spec)}" + (f", ONNX quantized {md(self.scheme)}" if self.scheme else "")
        lines = [(f"Perplexity of {md(self.folder)} ({what}) on {md(self.text_source)} ({md(self.text_bytes)} bytes; "
                  f"windows of {md(self.window)} tokens advancing by {md(self.stride)})"), "",
                 "| runtime | providers | tokens | perplexity | bits/token | bits/byte | seconds |",
                 "|---|---|---:|---:|---:|---:|---:|"]
        for r in self.rows:
            if r.score is None:
                lines.append(f"| {md(r.runtime)} | {md(r.status)}: {md(r.reason)} | | | | | |")
                continue
            s = r.score
            bpb = "—" if s.bits_per_byte is None else md(s.bits_per_byte, ".4f")
            provs = ", ".join(md(p.replace("ExecutionProvider", "")) for p in r.providers)
            lines.append(f"| {md(r.runtime)} | {provs} | {md(s.tokens)} | {md(s.perplexity, '.4f')} | "
                         f"{md(s.bits_per_token, '.4f')} | {bpb} | {md(r.seconds, '.2f')} |")
        return "\n".join(lines) + "\n"


@dataclass
class _Eager:
    """The eager model of an eval run, rebuilt from the manifest on first use (``trust_code``: also from code)."""

    trust_code: bool = False
    loaded: Any = None


def _runner(name: str, ef: ExportFolder, eager: _Eager) -> Runner:
    """The runner for ``name`` on ``ef``'s artifacts (the eager model rebuilt from the manifest once)."""
    c = ef.contract
    if name in (EAGER, EAGER_CUDA):
        if eager.loaded is None:
            from mhaexport.models.loading import load_recorded

            eager.loaded = load_recorded(ef, trust_code=eager.trust_code)
        return runner_for(ef, name, c, eager=eager.loaded.module)
    # as verify drives it: a shared cache, an adopted file's layout; pt2/aoti only with --trust-code
    return runner_for(ef, name, c, trust_code=eager.trust_code)


def _threads_for(ef: ExportFolder, name: str) -> int | None:
    """verify's one-thread rule for the torch runtimes on small models (spinning threads cost 10x on a busy machine),
    the size read from the artifacts' files (float32: 4 bytes a parameter); None: torch's own count."""
    if name not in (EAGER, TORCHSCRIPT):
        return None
    largest = max((sum(f["bytes"] for f in a.files.values()) for a in ef.artifacts.values()), default=0)
    return 1 if largest <= 4 * ONE_THREAD_MAX_PARAMS else None


def evaluate_folder(folder: str | Path | ExportFolder, text: bytes | None = None, *, text_source: str | None = None,
                    runtimes: tuple[str, ...] = RUNTIMES[EVAL].default, window: int | None = None,
                    stride: int | None = None, trust_code: bool = False,
                    progress: Callable[[str], None] | None = None) -> EvalReport:
    """Perplexity of ``folder``'s artifacts on ``text`` (default: the held-out text of the shipped weights) on each
    of ``runtimes``. ConfigError for an unknown runtime, RuntimeInputError for text the model cannot read (not
    byte-level, too short) or a static export; a runtime that cannot run or fails is a row saying why. ``progress``
    hears one line per runtime before it scores. ``trust_code``: the eager runtime may rebuild the model from a
    manifest source that is code (``--trust-code``)."""
    from mhaexport.models.text import heldout_text
    from mhaexport.runtime.tokenizer import for_folder

    refuse_unknown(runtimes, EVAL)
    if not isinstance(folder, ExportFolder):  # opened here once, its snapshot removed when done (on errors too)
        with ExportFolder.open(folder) as ef:
            return evaluate_folder(ef, text, text_source=text_source, runtimes=runtimes, window=window,
                                   stride=stride, trust_code=trust_code, progress=progress)
    ef = folder
    c = ef.contract
    if text is None:
        text, text_source = heldout_text(), "the held-out text of the shipped weights (models/weights/small-heldout.txt)"
    ids, byte_level = text_tokens(text, c, for_folder(ef) if ef.has("onnx") else None)
    if window is not None and window < 2:
        raise ConfigError(f"--window {window}: at least 2 tokens")
    L = min(window or c.max_positions, c.max_positions)
    step = max(1, min(stride or L // 2, L))
    rows, box = [], _Eager(trust_code)
    for name in dict.fromkeys(runtimes):
        runner = _runner(name, ef, box)
        row = EvalRow(name, "ran")
        t0 = time.perf_counter()
        try:
            runner.activate()
            if runner.fixed is not None:
                raise ProviderUnavailable(f"static export (seq={runner.fixed[0]}): windows of any length need "
                                          "dynamic axes")
        except ProviderUnavailable as e:
            runner.skip_reason = str(e)
        except MhaExportError as e:
            row.status, row.reason = "error", str(e).splitlines()[0]
        if row.status == "ran" and runner.skip_reason is not None:
            row.status, row.reason = "skipped", runner.skip_reason.splitlines()[0]
        if row.status == "ran":
            if progress is not None:
                progress(f"{name}: scoring {len(ids)} tokens in {len(windows(len(ids), L, step))} window(s) of "
                         f"{L} tokens")
            try:
                with torch_threads(_threads_for(ef, name)):
                    row.score, _, _ = score_text(runner, ids, window=L, stride=step, byte_level=byte_level,
                                                 progress=progress)
                row.providers = list(runner.providers)
            except MhaExportError as e:
                row.status, row.reason = "error", str(e).splitlines()[0]
            runner.deactivate()
        row.seconds = time.perf_counter() - t0
        rows.append(row)
    q = ef.artifacts["onnx"].details.quantization if ef.has("onnx") else None
    return EvalReport(str(ef.path), ef.model.spec, q and q.label, text_source or "the given text", len(text), L, step,
                      rows)
