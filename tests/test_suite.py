"""The one check suite (verify/suite.py): one table of checks for every runtime — contract calls, onnxruntime-genai's
own loop, the attention block — what does not apply declared in its rows, and one tie rule for every generation
check. Toy runners, no export: milliseconds."""

from __future__ import annotations

import ast
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from mhaexport.artifact.details import Quantization
from mhaexport.core.iospec import ModelContract
from mhaexport.runtime.runner import Runner
from mhaexport.verify.compare import Tolerance, near_tie
from mhaexport.runners.genai import GenAIRunner
from mhaexport.runners.subjects import LOOP
from mhaexport.verify.results import ALL_CHECKS, CHECKS, MODULE_CHECKS, Context
from mhaexport.verify.suite import CHECK_FUNCS, LOOP_SHAPES, run_check, subject

ROOT = Path(__file__).resolve().parent.parent
C = ModelContract(n_layers=1, n_heads=1, head_dim=2, vocab_size=4, max_positions=32)


def test_one_table_of_checks_in_the_package_covers_every_check_of_every_subject():
    tables = []
    for folder in ("verify", "diagnose", "evaluate", "bench", "runtime", "mhaexport"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                targets = (node.targets if isinstance(node, ast.Assign) else
                           [node.target] if isinstance(node, ast.AnnAssign) else [])
                tables += [str(path.relative_to(ROOT)) for t in targets if getattr(t, "id", "") == "CHECK_FUNCS"]
    assert tables == ["verify/suite.py"]
    assert set(CHECK_FUNCS) == set(ALL_CHECKS + MODULE_CHECKS)
    for name, row in CHECK_FUNCS.items():
        assert (row.contract is not None) is (name in ALL_CHECKS), name  # every decoder check, on contract calls
        assert (row.loop is not None) is (name in ALL_CHECKS), name  # ... and on onnxruntime-genai's loop
        assert (row.module is not None) is (name in MODULE_CHECKS), name  # the block's checks


class _Fixed(Runner):
    """A toy contract runtime: the same logits at every position, zeros for the cache."""

    def __init__(self, name, logits, contract=C):
        super().__init__(name=name, contract=contract)
        self.logits = np.asarray(logits, dtype=np.float32)

    def run_impl(self, ids, mask, past):
        B, T = ids.shape
        kv = np.zeros((B, self.contract.n_heads, mask.shape[1], self.contract.head_dim), np.float32)
        return np.broadcast_to(self.logits, (B, T, self.logits.size)).copy(), tuple((kv, kv) for _ in past)


class _Raises(_Fixed):
    def run_impl(self, ids, mask, past):
        raise AssertionError("a check the row says does not apply ran")


def _ctx(eager, **kw) -> Context:
    return Context(contract=C, cases=[], tol=Tolerance(1e-4, 1e-3), eager=eager, export_sizes=(3, 5), gen_tokens=2,
                   **kw)


def _loop(traces=None) -> GenAIRunner:
    runner = GenAIRunner(C, "unused", {})
    runner.traces = traces
    return runner


@pytest.mark.parametrize("check", ["causality", "dynamic-shapes"])
def test_what_onnxruntime_genais_loop_cannot_be_fed_is_n_a_by_the_table_not_run(check):
    runner = _loop()  # no traces: anything that ran would fail
    assert subject(runner) == LOOP
    r = run_check(check, runner, _ctx(_Raises("eager", np.zeros(4))))
    assert (r.status, r.figures, r.message, r.counted) == (None, {"not_applicable": True}, LOOP_SHAPES, False)


def test_the_rows_rules_hold_for_every_subject_alike():
    eager = _Raises("eager", np.zeros(4))
    assert run_check("parity", eager, _ctx(eager)).figures == {"reference": True}  # eager: the reference, not run
    lossy = _ctx(eager, lossy=Quantization(weights="int4", label="int4-test"))
    for runner in (_Raises("ort-cpu", np.zeros(4)), _loop()):
        parity = run_check("parity", runner, lossy)
        assert parity.status is None and parity.figures == {"lossy": True}
        assert parity.message == "n/a: lossy artifact (int4-test): exact parity does not apply; see quality"
        quality = run_check("quality", runner, _ctx(eager))
        assert (quality.status, quality.figures, quality.message) == (None, {"exact": True},
                                                                     "exact artifact: judged by parity")
    config = run_check("genai-config", _Raises("torchscript", np.zeros(4)), _ctx(eager))
    assert config.figures == {"not_applicable": True} and "describes the ONNX file" in config.message


@pytest.mark.parametrize("check", ["genai-config", "weights"])
def test_a_check_of_the_files_is_n_a_for_eager_not_its_reference(check):
    """eager is the reference of parity and quality; the folder's config and a lossy file's weights are no checks of
    eager at all: n/a (report.md's "⏭ n/a"), never "ref"."""
    eager = _Raises("eager", np.zeros(4))
    r = run_check(check, eager, _ctx(eager, lossy=Quantization(weights="int4")))
    assert (r.status, r.figures, r.counted) == (None, {"not_applicable": True}, False)
    assert r.message.startswith("n/a: ")


@pytest.mark.parametrize("flip", [2e-6, 1e-3, 0.5])
def test_every_generation_check_decides_a_tie_by_the_one_rule(flip):
    """Eager prefers token 1 by 1e-6 over token 2; the runtime prefers token 2 by ``flip``: the contract runtime
    (verify's greedy loop) and onnxruntime-genai's loop (its traces) get the verdict near_tie gives."""
    base = np.array([0.0, 1.0, 1.0 - 1e-6, -1.0], np.float32)
    other = base.copy()
    other[2] += flip
    tol = Tolerance(1e-4, 1e-3)
    tie = bool(near_tie(base, 2, tol, logits_agree=flip <= tol.atol + tol.rtol * abs(base[2]))[0])
    eager = _Fixed("eager", base)
    contract = run_check("generation", _Fixed("ort-cpu", other), _ctx(eager))
    trace = SimpleNamespace(prompts=[[3, 3, 3]], tokens=[[2, 2]], logits=[np.stack([other, other])])
    batch = SimpleNamespace(prompts=[[3, 3, 3]] * 3, tokens=[[2, 2]] * 3, logits=[np.stack([other, other])] * 3)
    loop = run_check("generation", _loop({"short": trace, "long": trace, "batch": batch}), _ctx(eager))
    assert contract.status is tie and loop.status is tie
    assert ("tie" in contract.message) is tie and ("tie" in loop.message) is tie
