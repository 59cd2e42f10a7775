"""One registry maps runtime names to runners (verify/registry.py): verify, eval and bench build theirs there."""

from __future__ import annotations

import ast
from pathlib import Path

from mhaexport.artifact import ExportFolder
from mhaexport.verify.registry import ARTIFACT, runner_for
from mhaexport.verify.runners import ALL_RUNTIMES, MODULE_RUNTIMES, ORT_GENAI

ROOT = Path(__file__).resolve().parent.parent
RUNNER_CLASSES = {"EagerRunner", "TorchScriptRunner", "OnnxReferenceRunner", "TorchMhaRunner", "TorchModuleRunner",
                  "code_runner", "module_ort_runner"}


def test_runner_classes_are_built_only_in_the_registry():
    """No verb builds a runtime's runner by its own if/elif chain: every call of a runner class or factory in the
    package's source is in verify/registry.py (the classes' own modules define them; subclasses call super())."""
    calls = []
    for folder in ("artifact", "bench", "diagnose", "evaluate", "exporter", "models", "runtime", "verify", "mhaexport"):
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Call):
                    name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
                    if name in RUNNER_CLASSES:
                        calls.append(f"{path.relative_to(ROOT)}:{node.lineno} {name}")
    outside = [c for c in calls if not c.startswith("verify/registry.py:")]
    assert calls and not outside, outside


def test_every_runtime_name_has_one_entry():
    assert set(ALL_RUNTIMES) - {ORT_GENAI} <= set(ARTIFACT) and set(MODULE_RUNTIMES) <= set(ARTIFACT)


def test_the_registry_drives_each_runtime_or_says_why(tiny, tiny_export):
    ef = ExportFolder.open(tiny_export)
    c = tiny.contract
    got = {rt: runner_for(ef, rt, c, eager=tiny.module, n_params=tiny.n_params) for rt in ARTIFACT}
    assert {rt: r.name for rt, r in got.items()} == {rt: rt for rt in ARTIFACT}
    for rt in ("eager", "torchscript", "ort-cpu", "onnx-reference"):
        assert got[rt].available, (rt, got[rt].skip_reason)
    assert "no torch.export program" in got["pt2"].skip_reason or "pt2" in got["pt2"].skip_reason
    assert "does not run a decoder" in got["torch-mha"].skip_reason
    assert "no eager model" in runner_for(ef, "eager", c).skip_reason
    # the decoder's runners answer one step alike: the registry's ort-cpu is the eager model's export
    import numpy as np

    ids = np.array([[1, 2, 3]], dtype=np.int64)
    mask = np.ones((1, 3), dtype=np.int64)
    outs = []
    for rt in ("eager", "torchscript", "ort-cpu"):
        runner = got[rt].activate()
        logits, _ = runner.step(ids, mask, runner.empty_cache(1))
        outs.append(np.asarray(logits))
    assert np.allclose(outs[0], outs[1], atol=1e-4) and np.allclose(outs[0], outs[2], atol=1e-4)
