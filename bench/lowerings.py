"""Several exports of one model side by side: how a folder's ONNX graph holds attention (its row label), the
``--compare`` folders (checked to hold the same model) and the lowerings table. Torch-free; the exporter's
:mod:`mhaexport.exporter.variants` uses the first two to find which variants already exist."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from mhaexport.artifact import ExportFolder
from mhaexport.errors import ArtifactError

if TYPE_CHECKING:
    from mhaexport.bench.result import BenchResult


def lowering_of(ef: ExportFolder) -> str | None:
    """How an export folder's ONNX graph holds attention, as a row label: "attention=ort float16"."""
    onnx_art = ef.artifacts.get("onnx")
    if onnx_art is None:
        return None
    return f"attention={onnx_art.get('attention', 'decomposed')} {onnx_art.dtype}"


def compare_exports(folder: Path, manifest: ExportFolder,
                    others: tuple[str, ...] | list[str]) -> list[tuple[Path, ExportFolder]]:
    """Read and hash-check each --compare folder's ONNX export; each must hold the same model as ``folder``
    (ArtifactError otherwise). ``folder`` itself and repeats are dropped."""
    out = []
    want = manifest.model.fingerprint
    seen = {Path(folder).resolve()}
    for other in others:
        other = Path(other)
        if other.resolve() in seen:  # the folder itself, or named twice: one row is enough
            continue
        seen.add(other.resolve())
        m = ExportFolder.open(other, "onnx")
        if m.model.fingerprint != want:
            raise ArtifactError(
                f"--compare {other} holds {m.model.spec} (model fingerprint {m.model.fingerprint}), "
                f"not the model of {folder} ({manifest.model.spec}, fingerprint {want}): compare exports "
                "of one model only")
        out.append((other, m))
    return out


def compare_lowerings(res: BenchResult) -> list[dict]:
    """The ORT rows side by side, per provider: per-token p50 and its ratio to the fastest row of that provider
    (same run, interleaved), and per-token latency near the prompt and far out (the long runs). The --opt-levels
    variants are left out: they are one lowering at another graph optimization level, not another lowering."""
    rows = [r for r in res.runtimes if r.ran and r.lowering is not None and r.opt_level is None]
    out = []
    for r in rows:
        peers = [x.token_p50_ms for x in rows if x.providers[:1] == r.providers[:1] and x.token_p50_ms]
        lr = res.long_run(r.name)
        near = lr["at"].get(str(lr["near"])) if lr else None
        far = lr["at"].get(str(lr["far"])) if lr else None
        out.append({"name": r.name, "label": r.label, "lowering": r.lowering, "folder": r.folder,
                    "provider": r.providers[0] if r.providers else None, "token_p50_ms": r.token_p50_ms,
                    "vs_fastest": round(r.token_p50_ms / min(peers), 3) if r.token_p50_ms and peers else None,
                    "near": lr["near"] if lr else None, "near_ms": near, "far": lr["far"] if lr else None,
                    "far_ms": far, "far_over_near": round(far / near, 3) if near and far else None})
    return out
