"""Outputs never clobber inputs: the paths a command writes (-o, --junit, a quantized export, a merged report) are
compared, resolved (symlinks, ``./``, ``..``), with the files of the folder it reads and of the export it writes,
before any work. Torch-free; the CLI calls it and turns :class:`OutputClash` into exit 2."""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

from mhaexport.artifact.lock import LOCK_FILE
from mhaexport.artifact.manifest import FILENAME
from mhaexport.core.errors import MhaExportError
from mhaexport.runtime.genai import GENAI_CONFIG
from mhaexport.runtime.tokenizer import TOKENIZER_FILES
from mhaexport.core.untrusted import load_json

# what an export writes into its folder (whichever formats): never an output's name there
EXPORT_FILES = ("model.onnx", "model.onnx.data", "model.pt", "model.pt2", "model.aoti.pt2", FILENAME, GENAI_CONFIG,
                LOCK_FILE, *TOKENIZER_FILES)
# files a command's outputs may replace in a folder it reads: its own earlier outputs (reports, bench, JUnit)
REPLACEABLE = re.compile(r"^(report|bench|bisect)[\w.+@-]*\.(json|md|png|html)$|^[\w.+@-]+\.xml$")
RUN_REPORT = re.compile(r"^report[\w.+@-]*\.(json|md|html)$")


class OutputClash(MhaExportError):
    """An output path names a file the command reads or is about to write."""


def resolved(path: str | Path) -> Path:
    """``path`` made absolute with symlinks and ``..`` resolved (what it names, whether or not it exists yet)."""
    try:
        return Path(path).expanduser().resolve()
    except (OSError, RuntimeError):  # a symlink loop, a name too long: compared as written
        return Path(path).expanduser().absolute()


def _listed(folder: Path) -> list[str]:
    """The file names manifest.json lists (read leniently: a broken manifest protects only what exists)."""
    try:
        data = load_json(folder / FILENAME, str(folder / FILENAME))
    except MhaExportError:
        return []
    names: list[str] = []
    arts = data.get("artifacts") if isinstance(data, dict) else None
    for entry in (arts.values() if isinstance(arts, dict) else ()):
        if not isinstance(entry, dict):
            continue
        if isinstance(entry.get("file"), str):
            names.append(entry["file"])
        files = entry.get("files")
        names += [n for n in (files if isinstance(files, (dict, list)) else ()) if isinstance(n, str)]
    return names


def protected(folder: str | Path, writing: bool = False) -> set[Path]:
    """The resolved paths no output may name in ``folder``: every file its manifest lists, manifest.json,
    genai_config.json, the tokenizer, the lock, and every other file it holds but earlier reports; for an export
    being written (``writing``) also the files the export will write."""
    root = Path(folder)
    names = set(EXPORT_FILES) if writing else set()  # a folder being written may not exist yet
    if root.is_dir():
        names |= set(_listed(root)) | {FILENAME, GENAI_CONFIG, LOCK_FILE, *TOKENIZER_FILES}
        try:
            names |= {p.name for p in root.iterdir() if not REPLACEABLE.match(p.name) and not p.is_dir()}
        except OSError:
            pass
    return {resolved(root / n) for n in names}


def check_outputs(outputs: dict[str, str | Path | None], reading: Iterable[str | Path] = (),
                  writing: Iterable[str | Path] = (), reports: str | Path | None = None) -> None:
    """OutputClash (one line, naming the option, the path and whose file it is) when an output of ``outputs``
    (option -> path; None: not given) is a file of a folder in ``reading`` or of an export in ``writing``, or (for
    --junit and the like) the run's own report.json/report.md in ``reports``."""
    owners: dict[Path, str] = {}
    for folder in writing:
        owners.update({p: f"a file of the export {folder} this command writes" for p in protected(folder, True)})
    for folder in reading:
        owners.update({p: f"a file of {folder}, which this command reads" for p in protected(folder)})
    report_dir = resolved(reports) if reports is not None else None
    for option, path in outputs.items():
        if path is None:
            continue
        where = resolved(path)
        owner = owners.get(where)
        if owner is None and report_dir is not None and where.parent == report_dir and RUN_REPORT.match(where.name):
            owner = f"the report this run writes into {reports}"
        if owner is not None:
            raise OutputClash(f"{option} {path} is {owner}: outputs never replace inputs, give another path")


def check_export_into(output: str | Path, reading: Iterable[str | Path], option: str = "-o") -> None:
    """OutputClash when the export written into ``output`` (its EXPORT_FILES) would replace a file of a folder in
    ``reading`` (``quantize F -o F``, or -o a folder whose files are links to F's)."""
    for folder in reading:
        if resolved(output) == resolved(folder):
            raise OutputClash(f"{option} {output} is the folder this command reads ({folder}): write the new export "
                              "to another folder")
    check_outputs({f"{option} (its {name})": Path(output) / name for name in EXPORT_FILES}, reading=reading)


def check_reports_out(output: str | Path, inputs: Iterable[str | Path], names: Iterable[str]) -> None:
    """OutputClash when ``output/NAME`` for a NAME in ``names`` is one of the ``inputs`` files (report merge)."""
    given = {resolved(p if not Path(p).is_dir() else Path(p) / "report.json"): p for p in inputs}
    for name in names:
        where = resolved(Path(output) / name)
        if where in given:
            raise OutputClash(f"-o {output} would write {name} over the input {given[where]}: outputs never replace "
                              "inputs, give another folder")
