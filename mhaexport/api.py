"""The Python API: what the command line does, as functions that return the result records.

Re-exported lazily at the package's top level (``mhaexport.verify(...)`` imports torch only when called)::

    import mhaexport

    mhaexport.export_onnx("out", config="tiny")
    mhaexport.export_torchscript("out", config="tiny")
    report = mhaexport.verify("out", runtimes=["ort-cpu"])
    if not report:                       # truthy only when the verdict passed; skipped never counts as passed
        raise SystemExit(report.verdict.message)
    print(mhaexport.generate("out", prompt_ids=[[5, 17, 42]], max_new_tokens=8).tokens)

Every function calls the library functions the CLI calls (mhaexport/cli.py) and raises the package's exceptions
(:mod:`mhaexport.core.errors`, all :class:`~mhaexport.core.errors.MhaExportError`) for bad input; a failed verification is a
report whose verdict says so, not an exception (one line checks it: ``if not report: ...``). Nothing here prints:
progress goes to an optional ``progress(message)`` callback.

The rules every function keeps:

- **Names are the CLI's**: an argument is its command's long option with ``_`` for ``-`` (``tokens`` is verify's
  ``--tokens``, ``long`` is bench's ``--long``); an option given once per item (``--runtime X --runtime Y``,
  ``--provider``, ``--prompt``, ``--compare``) is one list argument named in the plural (``runtimes``,
  ``providers``, ``prompts``; ``compare`` as bench's). Old names stay as deprecated aliases: ``gen_tokens``
  (verify) and ``long_to`` (bench) still work with a DeprecationWarning; giving both names is a ConfigError.
- **A bad argument is a ConfigError**: a value that is wrong in itself or against the model (an unknown
  ``attention``, ``dtype``, runtime or preset, a count out of range, options that contradict each other, no
  prompt) raises :class:`~mhaexport.core.errors.ConfigError` -- some as a subclass that also keeps the stage class it
  had before (``ExportOptionError`` is an ExportError too, ``RuntimeOptionError`` a RuntimeInputError), so either
  ``except`` catches them. What an argument *names* raises its stage's error: a folder with missing or altered
  files ArtifactError, a model that does not import or load ModelLoadError, a provider that does not load
  ProviderUnavailable, a runtime that fails RuntimeFailure. A keyword a function does not take is Python's
  TypeError (bench's keywords are :class:`mhaexport.bench.BenchConfig`'s fields).
- **List arguments take a bare string as one item**: ``runtimes="ort-cpu"`` is ``["ort-cpu"]`` (never its
  characters), likewise ``providers``, ``prompts``, ``keep_float``, ``compare``, ``opt_levels``; ``prompt_ids``
  takes a list of id lists (or one flat list of ids: one prompt), and a string there is a ConfigError. An item of
  the wrong type is a ConfigError.

A model is named as on the command line, by exactly one of ``config`` (a preset or a DecoderConfig JSON file),
``model`` (``package.module:factory`` or ``file.py:factory``; or an already loaded
:class:`~mhaexport.models.loading.LoadedModel`) and ``hf`` (a Hugging Face folder or Hub id ``org/name``, with
``revision`` and ``allow_download``); none means the default preset.

The verbs live one group to a module in ``mhaexport/verbs/`` (export, quantize, verify, bisect, the verify verb
whole, generate and eval, bench, adoption, reports, the main job; common.py and inputs.py hold what they share);
this module is their one public face.
"""

from __future__ import annotations

# every name imported here is the API's (mhaexport.api.VerifyRun, .TEXT_MAX_BYTES, .writable_output too); __all__ is
# what ``import *`` takes
from mhaexport.verbs.adopt import adopt
from mhaexport.verbs.bench import bench
from mhaexport.verbs.bisect import bisect_folder
from mhaexport.verbs.common import Progress, load, writable_output
from mhaexport.verbs.export import export_onnx, export_onnx_target, export_pt2, export_torchscript, target_options
from mhaexport.verbs.generate import eval_verdict, evaluate, generate
from mhaexport.verbs.inputs import TEXT_MAX_BYTES, check_input_file, check_junit, check_threads, read_text
from mhaexport.verbs.job import AllRun, all
from mhaexport.verbs.quantize import quantize
from mhaexport.verbs.reports import lint, lint_verdict, merge_reports, write_reports
from mhaexport.verbs.verify import VerifyRun, verify
from mhaexport.verbs.verify_run import verify_run

__all__ = ["adopt", "bench", "bisect_folder", "check_input_file", "check_junit", "check_threads", "eval_verdict",
           "evaluate", "export_onnx", "export_onnx_target", "export_pt2", "export_torchscript", "generate", "lint",
           "lint_verdict", "load", "merge_reports", "quantize", "read_text", "target_options", "verify", "verify_run",
           "write_reports"]
