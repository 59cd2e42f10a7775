"""Variants of one export: the same model with other attention lowerings or dtypes, for `mhaexport bench
--lowerings`. Finds the folders that already hold each variant and exports the missing ones; bench only times
folders (it never exports), so the API's bench (:func:`mhaexport.api.bench`) calls this first and hands bench the
folders as ``--compare``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from mhaexport.artifact import ExportFolder, OpenFolders, lowering_of, same_model_folders
from mhaexport.core.dtypes import NAMES as DTYPES
from mhaexport.core.errors import RuntimeOptionError


SHARED = "shared"  # in --lowerings: the shared KV cache (GroupQueryAttention writing one buffer in place)
FUSED_SHARED = "fused-shared"  # --attention fused over the shared KV cache


def parse_lowerings(text: str) -> list[tuple[str, str]]:
    """"decomposed,onnx,ort:float16,shared" -> [("decomposed", "float32"), ("onnx", "float32"), ("ort", "float16"),
    ("shared", "float32")] ("fused-shared": --attention fused over the shared cache); RuntimeOptionError (a ConfigError)
    naming the valid attentions and dtypes for anything else."""
    from mhaexport.exporter.lowering import LOWERINGS

    LOWERINGS = LOWERINGS + (SHARED, FUSED_SHARED)  # noqa: N806 - the names --lowerings takes
    out = []
    for item in (x.strip() for x in text.split(",")):
        if not item:
            continue
        attention, _, dtype = item.partition(":")
        dtype = dtype or "float32"
        if attention not in LOWERINGS or dtype not in DTYPES:
            raise RuntimeOptionError(f"--lowerings {item!r}: expected ATTENTION[:DTYPE] with ATTENTION one of "
                                    f"{', '.join(LOWERINGS)} and DTYPE one of {', '.join(DTYPES)}")
        if (attention, dtype) not in out:
            out.append((attention, dtype))
    return out


def export_lowerings(folder: str | Path | ExportFolder, wanted: list[tuple[str, str]], out_dir: str | Path,
                     have: tuple[str, ...] | list[str] = (),
                     progress: Callable[[str], None] | None = None, trust_code: bool = False,
                     reads: OpenFolders | None = None) -> list[Path]:
    """The export folders holding each (attention, dtype) of ``wanted`` for ``folder``'s model: ``folder`` or one of
    ``have`` when it already holds that lowering, else out_dir/lowerings/ATTENTION-DTYPE, exported there unless
    a hash-checked export of the same model and lowering is already there. Returns them in ``wanted``'s order.
    ``reads``: the command's :class:`~mhaexport.artifact.OpenFolders` (each folder opened once; it closes them)."""
    say = progress or (lambda m: None)
    with OpenFolders() as own:
        reads = reads or own
        source = reads.open(folder)
        known = {lowering_of(source): source.path}
        for other, m in same_model_folders(source.path, source, have, reads):
            known.setdefault(lowering_of(m), other)
        loaded, out = None, []
        for attention, dtype in wanted:
            lowering = {SHARED: f"attention=gqa {dtype} kv=shared", FUSED_SHARED: f"attention=fused {dtype} kv=shared"
                        }.get(attention, f"attention={attention} {dtype}")
            if lowering in known:
                out.append(known[lowering])
                continue
            sub = Path(out_dir) / "lowerings" / f"{attention}-{dtype}"
            if reads.reusable(sub, lambda m, lowering=lowering: m.model.fingerprint == source.model.fingerprint
                              and lowering_of(m) == lowering):  # else another model or lowering: exported anew below
                say(f"reusing {sub} ({lowering})")
                out.append(sub)
                continue
            if loaded is None:
                from mhaexport.models.loading import load_recorded

                loaded = load_recorded(source, trust_code=trust_code)
            from mhaexport.exporter.onnx import export_onnx

            say(f"exporting {lowering} -> {sub} ...")
            if attention in (SHARED, FUSED_SHARED):
                export_onnx(loaded, sub, dtype=dtype, kv_cache="shared", attention="fused" if attention == FUSED_SHARED
                            else "decomposed")
            else:
                export_onnx(loaded, sub, attention=attention, dtype=dtype)
            out.append(sub)
    return out
