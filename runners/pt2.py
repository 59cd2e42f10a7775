"""The torch.export program (``pt2``) and the AOTInductor package (``aoti``) as runtimes of verify and bench, under
the one runner protocol: the decoder's (:class:`~mhaexport.runners.decoder.EagerRunner`'s torch-tensor cache between
decode steps) and the attention block's (:class:`~mhaexport.runners.block.TorchModuleRunner`).

Each loads the folder's checked file, never the Python class: ``torch.export.load(...).module()`` and
``torch._inductor.aoti_load_package(...)``. Both files are code (:mod:`mhaexport.artifact.trust`): a runner is only
built when :func:`code_runner` finds the user trusts the folder or this process wrote it; otherwise it is skipped
with the reason, never passed.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from mhaexport.artifact import ExportFolder
from mhaexport.artifact.trust import AOTI, CODE_ARTIFACTS, PT2, refusal
from mhaexport.core.errors import ConfigError
from mhaexport.runtime.runner import Runner, skipped
from mhaexport.runners.block import TorchModuleRunner
from mhaexport.runners.decoder import EagerRunner

CODE_RUNTIMES = (PT2, AOTI)  # runtime name = artifact name
_WHAT = {PT2: "torch.export program", AOTI: "AOTInductor package"}


def load_code(runtime: str, path: str | Path):
    """The callable module of ``path``: the program's ``.module()`` (pt2) or the compiled package (aoti), and the
    providers line. Only call after :func:`refusal` said yes."""
    import torch

    if runtime == PT2:
        return torch.export.load(str(path)).module(), ["torch.export (cpu)"]
    return torch._inductor.aoti_load_package(str(path)), ["AOTInductor (cpu)"]


def _dense(t):
    """``t`` (numpy or torch) as a contiguous torch tensor: an AOTInductor package indexes its inputs with the strides
    it was compiled at (contiguous) and checks none of them unless AOTI_RUNTIME_CHECK_INPUTS=1 — a strided view, such
    as the decode loop's slice of a prompt batch, gives wrong logits without an error (measured on the small preset:
    max abs 3.6). No copy for what is already contiguous."""
    import torch

    return (torch.from_numpy(np.ascontiguousarray(t)) if isinstance(t, np.ndarray) else t.contiguous())


class CodeRunner(EagerRunner):
    """The decoder's ``model.pt2`` or ``model.aoti.pt2``, loaded from the folder's snapshot, fed contiguous tensors."""

    def __init__(self, name: str, contract, path: str | Path) -> None:
        super().__init__(name, contract, None)
        self.path = Path(path)
        self.load_s: float | None = None

    def activate_impl(self) -> None:
        import time

        t0 = time.perf_counter()
        self.module, self.providers = load_code(self.name, self.path)
        self.source = self.module
        self.load_s = time.perf_counter() - t0

    def _call(self, ids: np.ndarray, mask: np.ndarray, past):
        import torch

        with torch.inference_mode():
            return self.module(_dense(ids), _dense(mask), tuple((_dense(k), _dense(v)) for k, v in past))


class CodeBlockRunner(TorchModuleRunner):
    """The attention block's ``model.pt2`` or ``model.aoti.pt2`` (``--module attention``), called as m(x, past_key,
    past_value)."""

    def __init__(self, name: str, contract, path: str | Path) -> None:
        super().__init__(name, contract, path=path)

    def activate_impl(self) -> None:
        self.module, self.providers = load_code(self.name, self.path)

    def run_impl(self, x: np.ndarray, past_key: np.ndarray, past_value: np.ndarray):
        return super().run_impl(*(np.ascontiguousarray(a) for a in (x, past_key, past_value)))


def code_runner(ef: ExportFolder, rt: str, c, *, trust_code: bool = False, module: bool = False) -> Runner:
    """The runner of ``ef``'s ``rt`` artifact (pt2 or aoti), or one skipped with why: absent, or code this process
    may not load (:func:`~mhaexport.artifact.trust.refusal`). ``module``: the attention block's runner."""
    if not ef.has(rt):
        return skipped(rt, c, f"no {_WHAT[rt]} in {ef.path} (export one with `mhaexport pt2"
                              f"{' --aoti' if rt == AOTI else ''}`)")
    why = refusal(ef.entry(rt), rt, ef.path, trust_code)
    if why is not None:
        return skipped(rt, c, why)
    return (CodeBlockRunner if module else CodeRunner)(rt, c, ef.file(rt))


def present_code_runtimes(ef: ExportFolder) -> tuple[str, ...]:
    """The code runtimes whose artifact ``ef`` holds: what the default runtime list gains for this folder."""
    return tuple(rt for rt in CODE_RUNTIMES if ef.has(rt))


def refuse_untrusted(ef: ExportFolder, requested: tuple[str, ...] | None, trust_code: bool,
                     option: str = "--runtime") -> None:
    """ConfigError (exit 2, before any work) for a code runtime asked for by name whose artifact is in ``ef`` but may
    not be loaded. Absent artifacts are left to the runner (skipped: "not verified")."""
    for rt in requested or ():
        if rt in CODE_ARTIFACTS and ef.has(rt):
            why = refusal(ef.entry(rt), rt, ef.path, trust_code)
            if why is not None:
                raise ConfigError(f"{option} {rt}: {why}")
