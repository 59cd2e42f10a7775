"""The one check suite: every check verify runs, on every runtime — the decoder's runtimes driven by contract calls,
onnxruntime-genai's own generation loop (``ort-genai``) and the attention block's runtimes — in one table,
:data:`CHECK_FUNCS`, with what does not apply to which runtime declared in its rows, and one :func:`run_check`.

A runtime is checked as one of three *subjects*, by how it is driven (its runner's ``checked_as``, :func:`subject`):

- ``contract``: contract calls (ids, mask, past -> logits, present) in the file's protocol — eager, TorchScript,
  ONNX Runtime, the reference evaluator, torch.export (verify/checks.py);
- ``loop``: onnxruntime-genai's generator, which takes no contract call: its runner provides traces of its own loop
  (a short and a long prompt alone, three as one batch, every step's logits), which the checks judge
  (verify/genai_runtime.py, its runner runners/genai.py);
- ``module``: the attention block on its own, under the module contract (verify/block.py).

A row names the function each subject runs, or why the check does not apply to it (a string: the result is "n/a",
counted nowhere), or None (not a check of that subject: verify refuses to be asked for it). Before any function,
the row's rules about the runtime and the artifact: eager is the *reference* of parity, quality and headroom;
weights and genai-config are no checks of eager (n/a); parity is not applicable to a lossy artifact, quality and
weights only to one; genai-config only to a runtime that runs the ONNX file. Every generation check decides a near-tie by the one rule
:func:`mhaexport.verify.compare.near_tie`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Union

from mhaexport.core.errors import MhaExportError, first_line
from mhaexport.runners.names import EAGER, TORCHSCRIPT
from mhaexport.runners.subjects import CONTRACT, LOOP, MODULE
from mhaexport.runtime.runner import Runner
from mhaexport.verify import block, checks, genai_runtime as loop, genai_serving, serving
from mhaexport.verify.genai_check import GENAI_CONFIG, check_genai_config
from mhaexport.verify.headroom import check_headroom
from mhaexport.verify.quality import check_quality
from mhaexport.verify.results import (CONTINUOUS_BATCHING, GENAI_CONFIG_CHECK, HEADROOM, PREFIX_REUSE, QUALITY,
                                      SPECULATIVE, WEIGHTS, CheckResult, SweepContext)

CheckFn = Callable[[Runner, SweepContext], CheckResult]
# a subject's entry in a row: the check's function, the reason it does not apply (n/a), or None (not its check)
Entry = Union[CheckFn, str, None]

SUBJECTS = (CONTRACT, LOOP, MODULE)

# onnxruntime-genai's loop feeds only its own shapes: what a check of chosen shapes cannot ask of it
LOOP_SHAPES = ("n/a: onnxruntime-genai's loop feeds only its own shapes (prefill, then one token a step); see "
               "parity at the prefill and each decode step")


def subject(runner: Runner) -> str:
    """How ``runner`` is checked: ``loop`` (onnxruntime-genai's own generator), ``module`` (the attention block's
    runtimes), else ``contract`` — what its class declares as ``checked_as``."""
    return getattr(runner, "checked_as", CONTRACT)


def _scheme(ctx) -> str:
    lossy = getattr(ctx, "lossy", None)
    return str((lossy and (lossy.label or lossy.weights)) or "quantized")


@dataclass(frozen=True)
class Check:
    """One check of the suite: ``contract`` / ``loop`` / ``module``, each subject's :data:`Entry`; ``reference``:
    eager's result is "reference: ..." (eager is what this check holds the others to); ``artifact``: ``"exact"``
    (not applicable to a lossy artifact: judged by quality) or ``"lossy"`` (only for a lossy one: an exact artifact
    is judged by parity); ``onnx_only``: not applicable to a runtime that does not run the ONNX file (TorchScript and
    the eager models); ``eager``: why it is not a check of eager (n/a); ``recorded``: how the check is judged when
    eager's references come from a record (``verify --record``, verify/reference.py; ``{logits}``/``{present}``:
    what the record keeps), or why it cannot be ("n/a: ..."; None: "n/a", the check not judged from a record). Calling it runs the check on one runner: the
    row's rules, then the subject's function."""

    name: str
    contract: Entry = None
    loop: Entry = None
    module: Entry = None
    reference: str | None = None
    artifact: str | None = None
    onnx_only: str | None = None
    recorded: str | None = None
    eager: str | None = None

    def entry(self, runner: Runner) -> Entry:
        return getattr(self, subject(runner))

    def not_applicable(self, runner: Runner, ctx) -> CheckResult | None:
        """The result the row's rules give ``runner`` without running anything (reference, n/a), or None."""
        entry = self.entry(runner)
        if entry is None:
            raise ValueError(f"{self.name} is not a check of a {subject(runner)} runtime ({runner.name})")
        if isinstance(entry, str):
            return CheckResult(self.name, None, {"not_applicable": True}, entry)
        if self.reference and runner.name == EAGER:
            return CheckResult(self.name, None, {"reference": True}, f"reference: {self.reference}")
        if self.eager and runner.name == EAGER:
            return CheckResult(self.name, None, {"not_applicable": True}, f"n/a: {self.eager}")
        lossy = getattr(ctx, "lossy", None)
        if self.artifact == "exact" and lossy:
            return CheckResult(self.name, None, {"lossy": True},
                               f"n/a: lossy artifact ({_scheme(ctx)}): exact {self.name} does not apply; see quality")
        if self.artifact == "lossy" and not lossy:
            return CheckResult(self.name, None, {"exact": True}, "exact artifact: judged by parity")
        if self.onnx_only and (runner.name == TORCHSCRIPT or runner.name.startswith(EAGER)):
            return CheckResult(self.name, None, {"not_applicable": True}, f"n/a: {self.onnx_only}")
        if getattr(ctx, "recorded", None) is not None and not self.judged_from_record:
            return CheckResult(self.name, None, {"not_applicable": True}, self.recorded_reason)
        return None

    @property
    def judged_from_record(self) -> bool:
        return self.recorded is not None and not self.recorded.startswith("n/a")

    @property
    def recorded_reason(self) -> str:
        return self.recorded or "n/a: not judged from a recorded reference"

    def __call__(self, runner: Runner, ctx) -> CheckResult:
        given = self.not_applicable(runner, ctx)  # (a CheckResult is truthy only when it passed)
        return given if given is not None else self.entry(runner)(runner, ctx)


def _suite(*rows: Check) -> dict[str, Check]:
    return {row.name: row for row in rows}


# The one table: every check verify runs, on every runtime (docs/reference.md's check tables describe each row)
CHECK_FUNCS = _suite(
    Check("parity", checks.check_parity, loop.check_parity, block.check_parity,
          reference="every runtime is compared with eager", artifact="exact",
          recorded="every case against the record: {logits}, present {present} (the float32 precision-loss probe, "
                   "which needs eager's whole cache, is not run)"),
    Check("finite", checks.check_finite, loop.check_finite, checks.check_finite, recorded="the file's own outputs"),
    Check("causality", checks.check_causality, LOOP_SHAPES, block.check_causality,
          recorded="the file against itself"),
    Check("kv-consistency", checks.check_kv_consistency, loop.check_kv_consistency,
          recorded="the file against itself (a shared cache's deploy loop: against the file's own contract calls)"),
    Check("padding", checks.check_padding, loop.check_padding, recorded="the file against itself"),
    Check("dynamic-shapes", checks.check_dynamic_shapes, LOOP_SHAPES,
          recorded="shapes from the file; values against the record, as parity"),
    Check("generation", checks.check_generation, loop.check_generation,
          recorded="greedy tokens against the record's (short and long prompt, the deploy loop's rows); step logits "
                   "on {logits}; a near-tie by the kept logits"),
    Check(CONTINUOUS_BATCHING, serving.check_continuous_batching, genai_serving.check_continuous_batching,
          recorded="the file's requests in a batch against each alone, within its dtype's rounding (a record keeps "
                   "no eager floor)"),
    Check(SPECULATIVE, serving.check_speculative, genai_serving.check_speculative,
          recorded="the file's speculative decoding against its plain greedy decoding, within its dtype's rounding"),
    Check(PREFIX_REUSE, serving.check_prefix_reuse, genai_serving.check_prefix_reuse,
          recorded="the file's reused prefix against each request alone, within its dtype's rounding"),
    Check("cache-consistency", module=block.check_cache_consistency),
    Check("demonstration", module=block.check_demonstration),
    Check(QUALITY, check_quality, loop.check_quality, reference="lossy artifacts are judged against eager",
          artifact="lossy", recorded="n/a: a lossy file is judged against eager's logits over text, which a record "
                                     "does not keep"),
    Check(WEIGHTS, checks.check_weights, checks.check_weights,
          eager="not a check of eager: the lossy file's quantized weights are checked on the runtimes that run it",
          artifact="lossy", recorded="n/a: a record keeps no weights"),
    Check(GENAI_CONFIG_CHECK, check_genai_config, check_genai_config,
          onnx_only=f"{GENAI_CONFIG} describes the ONNX file",
          recorded="the config against the graph and the manifest (not against the eager model's own config)"),
    Check(HEADROOM, check_headroom, check_headroom,
          reference="eager float32's activations are what the half-precision file must hold",
          onnx_only="the half-precision file is the ONNX file",
          recorded="n/a: a record keeps no activations"),
)


def run_check(name: str, runner: Runner, ctx: SweepContext) -> CheckResult:
    """Run one check of :data:`CHECK_FUNCS` on one runner, whatever its subject. The runtime failing inside it
    (RuntimeFailure: ONNX Runtime, onnxruntime-genai, TorchScript or the model's own code raised; or inputs it
    refused) is that check's failure, with its first line. Any other exception is a bug in mhaexport and propagates
    (the CLI exits 3 with the traceback)."""
    try:
        return CHECK_FUNCS[name](runner, ctx)
    except MhaExportError as e:
        return CheckResult(name, False, {}, first_line(e))
