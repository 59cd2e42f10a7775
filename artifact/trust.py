"""Which artifacts are code, and when a reader may load one from a folder. Torch-free.

A torch.export program (``model.pt2``) and an AOTInductor package (``model.aoti.pt2``) are not data the way an
ONNX graph is: loading them runs what the file says (docs/DESIGN.md, "Folders from elsewhere"):

- ``torch.export.load`` evaluates the program's symbolic-shape expressions with ``sympy.sympify`` (Python ``eval``
  of strings from the file), unpickles with ``torch.load(weights_only=False)`` every weight or constant the file's
  own payload config marks ``use_pickle`` (and its sample inputs when the safe unpickler refuses them), unpickles
  custom-object constants (``pickle.loads``, ``torch._C._pickle_load_obj``), and the program it returns calls
  whatever its nodes name under ``torch.*``, ``operator.*`` and ``math.*``;
- ``torch._inductor.aoti_load_package`` does all of that for the program a package may carry, extracts the archive
  and ``dlopen``s the shared library inside it (its initializers run at load; its kernels are native code), and for
  a package holding C++ source but no library, runs the compiler command its ``*_compile_flags.json`` /
  ``*_linker_flags.json`` spell.

So verify and bench load such an artifact from a folder only when the user says they trust its author
(``trust_code=True``, ``--trust-code``), or when this very process wrote those bytes (``mhaexport all --pt2``:
export then verify in one run). The second case is decided by hash: every file an exporter of this process
published is remembered by its sha256 (:func:`remember_own`), and a folder's artifact counts as its own export only
when every file's recorded sha256 is one of them — readers check the snapshot's bytes against those recorded
hashes before they load anything (:meth:`~mhaexport.artifact.folder.ExportFolder.open`).
"""

from __future__ import annotations

from mhaexport.artifact.manifest import ArtifactEntry

PT2, AOTI = "pt2", "aoti"
# artifact -> what loading it runs, in a few words (the refusal names it)
CODE_ARTIFACTS = {
    PT2: "torch.export.load unpickles and evaluates what the file says",
    AOTI: "aoti_load_package dlopens the native library inside it",
}
TRUST_FLAG = "--trust-code"

_own: set[str] = set()  # sha256 of every file this process's exporters published


def remember_own(entry: ArtifactEntry) -> None:
    """Remember the files of ``entry`` (just published by this process) as this process's own bytes."""
    _own.update(str(f["sha256"]) for f in entry.files.values())


def own_export(entry: ArtifactEntry) -> bool:
    """Whether every file of ``entry`` has a sha256 this process published (its own export)."""
    return bool(entry.files) and all(str(f["sha256"]) in _own for f in entry.files.values())


def refusal(entry: ArtifactEntry | None, artifact: str, folder: object, trust_code: bool) -> str | None:
    """Why ``artifact`` of ``folder`` must not be loaded (one line naming the flag), or None when it may: not code,
    absent, trusted by the user, or this process's own export."""
    if entry is None or artifact not in CODE_ARTIFACTS or trust_code or own_export(entry):
        return None
    return (f"not loaded: {entry.file} in {folder} is code ({CODE_ARTIFACTS[artifact]}) and this process did not "
            f"export it; pass {TRUST_FLAG} (trust_code=True) if you trust whoever wrote the folder")
