"""Several exports of one model side by side (the ``--compare`` folders, checked to hold the same model by
:func:`mhaexport.artifact.same_model_folders`; rows labelled by :func:`mhaexport.artifact.lowering_of`): the
lowerings table. Torch-free."""

from __future__ import annotations

from typing import TYPE_CHECKING

from mhaexport.bench.config import ORT_RUNTIMES
from mhaexport.bench.result import LoweringRow

if TYPE_CHECKING:
    from mhaexport.bench.result import BenchResult


def compare_lowerings(res: BenchResult) -> list[LoweringRow]:
    """The ORT rows side by side, per provider: per-token p50 and its ratio to the fastest row of that provider
    (same run, interleaved), and per-token latency near the prompt and far out (the long runs). The --opt-levels
    variants are left out: they are one lowering at another graph optimization level, not another lowering."""
    rows = [r for r in res.runtimes if r.ran and r.lowering is not None and r.opt_level is None
            and r.name.split(" [")[0] in ORT_RUNTIMES]  # the runtime's own rows, not the bare or genai loops
    out = []
    for r in rows:
        peers = [x.token_p50_ms for x in rows if x.providers[:1] == r.providers[:1] and x.token_p50_ms]
        lr = res.long_run(r.name)
        near = lr.at_position(lr.near) if lr else None
        far = lr.at_position(lr.far) if lr else None
        out.append(LoweringRow(r.name, r.label, r.lowering, r.folder, r.providers[0] if r.providers else None,
                               r.token_p50_ms,
                               round(r.token_p50_ms / min(peers), 3) if r.token_p50_ms and peers else None,
                               lr.near if lr else None, near, lr.far if lr else None, far,
                               round(far / near, 3) if near and far else None))
    return out
