"""The peer in every table: onnxruntime-genai's model builder run on the Hugging Face model an ``--hf`` export folder
was made from, its file adopted beside ours, so ``mhaexport bench --builder fp32,int4`` times the builder's files in
the same run as our own (rows labelled by producer: "onnxruntime-genai float32 kv=shared").

The builder ships in the onnxruntime-genai wheel (``python -m onnxruntime_genai.models.builder``); it reads the
Hugging Face folder (no download) and writes model.onnx (+ .data) and genai_config.json. Each precision is built once
into OUT/builder/PRECISION and adopted into OUT/builder/PRECISION/mhaexport (the manifest links to the builder's
files and hashes them); a later run reuses an adopted folder of the same model.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from mhaexport.artifact import ExportFolder, OpenFolders
from mhaexport.artifact.source import HfSource
from mhaexport.core.errors import ArtifactError, ConfigError, ExportError

PRECISIONS = ("fp32", "int4")  # what --builder takes (the builder's -p values that run on its CPU provider)
ADOPTED = "mhaexport"  # the adopted folder inside each build folder


def check_precisions(text: str) -> list[str]:
    """"fp32,int4" -> ["fp32", "int4"]; ConfigError naming the valid ones for anything else."""
    out = list(dict.fromkeys(x.strip() for x in text.split(",") if x.strip()))
    bad = [x for x in out if x not in PRECISIONS]
    if bad or not out:
        raise ConfigError(f"--builder {text!r}: expected a comma list of {', '.join(PRECISIONS)}")
    return out


def hf_source(ef: ExportFolder) -> Path:
    """The Hugging Face folder an export folder was made from (its recorded ``--hf`` path, or a Hub id's snapshot);
    ConfigError when the folder holds another kind of model (the builder reads only Hugging Face models)."""
    src = ef.model.source
    if not isinstance(src, HfSource):
        raise ConfigError(f"--builder: {ef.path} holds {ef.model.spec}, not a Hugging Face model; onnxruntime-genai's "
                          "builder reads a Hugging Face folder (export one with `mhaexport onnx --hf DIR`)")
    if src.repo_id:
        from mhaexport.models import hub

        return Path(hub.resolve(src.repo_id, src.commit or src.revision).folder)
    path = (ef.path / src.path).resolve()
    if not (path / "config.json").is_file():
        raise ArtifactError(f"--builder: the Hugging Face folder of {ef.model.spec} is not at {path} any more")
    return path


def export_builder(folder: str | Path | ExportFolder, precisions: list[str], out_dir: str | Path,
                   progress: Callable[[str], None] | None = None, trust_code: bool = False,
                   reads: OpenFolders | None = None) -> list[Path]:
    """The adopted folders of the builder's file at each precision for ``folder``'s Hugging Face model, built into
    out_dir/builder/PRECISION unless an adopted folder of the same model is there. Raises ConfigError (not an --hf
    folder, onnxruntime-genai missing) or ExportError (the builder failed: its last lines). ``reads``: the command's
    :class:`~mhaexport.artifact.OpenFolders` (each folder opened once; it closes them)."""
    from mhaexport.exporter.adopt import adopt_onnx
    from mhaexport.models.loading import load_recorded
    from mhaexport.runtime.genai import import_og

    say = progress or (lambda _m: None)
    import_og()  # GenAIUnavailable (exit 2) with the install line before any work
    with OpenFolders() as own:
        reads = reads or own
        ef = reads.open(folder)
        hf = hf_source(ef)
        fingerprint = ef.model.fingerprint
        loaded = None
        out = []
        for precision in precisions:
            build = Path(out_dir) / "builder" / precision
            adopted = build / ADOPTED
            try:
                if reads.open(adopted, "onnx").model.fingerprint == fingerprint:
                    say(f"reusing {adopted} (onnxruntime-genai's builder, {precision})")
                    out.append(adopted)
                    continue
                reads.forget(adopted)  # another model: built anew below
            except ArtifactError:
                pass
            say(f"onnxruntime-genai's builder: {hf} -> {build} ({precision}, cpu) ...")
            cmd = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-m", hf.name, "-i", str(hf),
                   "-o", str(build / "raw"), "-p", precision, "-e", "cpu", "-c", str(build / "cache")]
            res = subprocess.run(cmd, capture_output=True, text=True)
            if res.returncode != 0 or not (build / "raw" / "model.onnx").is_file():
                tail = " | ".join((res.stderr or res.stdout).strip().splitlines()[-3:])
                raise ExportError(f"onnxruntime-genai's builder failed on {hf} ({precision}): {tail}")
            if loaded is None:
                loaded = load_recorded(ef, trust_code=trust_code)
            adopt_onnx(loaded, build / "raw" / "model.onnx", adopted, replace=True)  # its own folder
            out.append(adopted)
    return out
