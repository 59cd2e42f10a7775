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
"""

from __future__ import annotations

import builtins
import contextlib
import numbers
import os
import warnings
from functools import partial
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mhaexport.core.errors import ConfigError, MhaExportError, RuntimeOptionError

if TYPE_CHECKING:  # pragma: no cover
    from mhaexport.bench import BenchResult
    from mhaexport.exporter.common import ExportRecord
    from mhaexport.exporter.quantize import QuantizeRecord
    from mhaexport.models.loading import LoadedModel
    from mhaexport.runtime.decode import GenerationResult
    from mhaexport.diagnose.follow import BisectRun
    from mhaexport.evaluate.perplexity import EvalReport
    from mhaexport.verify.report import VerifyReport

Progress = Callable[[str], None]

# ``all`` is the API's too (mhaexport.all), left out here so that ``from mhaexport.api import *`` keeps the builtin
__all__ = ["adopt", "bench", "bisect_folder", "check_input_file", "check_junit", "check_threads", "eval_verdict",
           "evaluate", "export_onnx", "export_onnx_target", "export_pt2", "export_torchscript", "generate", "lint",
           "lint_verdict", "load", "merge_reports", "quantize", "read_text", "target_options", "verify", "verify_run",
           "write_reports"]


def _names(value: Any, arg: str, *, paths: bool = False) -> tuple | None:
    """A list argument (``runtimes``, ``providers``, ``keep_float``, ...) as a tuple; a bare string (or, with
    ``paths``, one path) is one item, never its characters. None stays None. ConfigError for anything else."""
    if value is None:
        return None
    one = (str, os.PathLike) if paths else str
    if isinstance(value, one):
        return (value,)
    if isinstance(value, (bytes, Mapping)) or not isinstance(value, Iterable):
        raise ConfigError(f"{arg}={value!r}: expected a list of {'paths' if paths else 'names'}, e.g. "
                          f"{arg}=[...]")
    items = tuple(value)
    bad = [v for v in items if not isinstance(v, one)]
    if bad:
        raise ConfigError(f"{arg}: {bad[0]!r} is not a {'path' if paths else 'name (a string)'}")
    return items


def _renamed(name: str, value: Any, old: str, old_value: Any) -> Any:
    """The CLI's name ``name`` or its deprecated alias ``old`` (a DeprecationWarning); both given: ConfigError."""
    if old_value is None:
        return value
    if value is not None:
        raise ConfigError(f"give {name}= or its deprecated alias {old}=, not both")
    warnings.warn(f"{old}= is deprecated: use {name}= (the CLI's --{name.replace('_', '-')})", DeprecationWarning,
                  stacklevel=3)
    return old_value


def _count(value: Any, arg: str, least: int = 1, *, optional: bool = True) -> None:
    """ConfigError unless ``value`` is an integer >= ``least`` (or None, when ``optional``): the CLI's IntRange."""
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < least:
        raise ConfigError(f"{arg}={value!r}: expected an integer >= {least}")


def _tolerance(value: Any, arg: str) -> None:
    """ConfigError unless ``value`` is None, a number >= 0, or {"logits" | "present" | None: number >= 0}."""
    from mhaexport.core.iospec import OUTPUT_KINDS

    per = value if isinstance(value, dict) else {None: value}
    for key, x in per.items():
        if key is not None and key not in OUTPUT_KINDS:
            raise ConfigError(f"{arg}: output {key!r} is not one of {', '.join(OUTPUT_KINDS)}")
        if x is not None and (isinstance(x, bool) or not isinstance(x, numbers.Real) or not x >= 0):
            raise ConfigError(f"{arg}: {x!r} is not a tolerance (a number >= 0)")


def load(*, model: str | LoadedModel | None = None, config: str | None = None, hf: str | Path | None = None,
         checkpoint: str | Path | None = None, revision: str | None = None,
         allow_download: bool = False, streamed: bool = False) -> LoadedModel:
    """The model a command works on, checked against the decoder contract (``--model`` / ``--config`` / ``--hf`` /
    ``--checkpoint`` / ``--revision`` / ``--allow-download``). A LoadedModel given as ``model`` is returned as it
    is. Raises ConfigError or ModelLoadError. ``.notes``: what the loading had to decide (a context length the
    config left out, say)."""
    from mhaexport.models.loading import LoadedModel, load_model

    if isinstance(model, LoadedModel):
        if config is not None or hf is not None or checkpoint is not None:
            raise ConfigError("a loaded model was given: config, hf and checkpoint do not apply")
        return model
    return load_model(config=config, model=model, checkpoint=checkpoint, hf=hf, revision=revision,
                      allow_download=allow_download, streamed=streamed)


def _model(model, config, hf, checkpoint, revision, allow_download, progress: Progress | None = None, *,
           streamed: bool = False) -> LoadedModel:
    """:func:`load`; a model loaded here says its notes through ``progress`` (as :class:`mhaexport.core.progress.Note`)."""
    from mhaexport.models.loading import LoadedModel
    from mhaexport.core.progress import Note

    given = isinstance(model, LoadedModel)
    loaded = load(model=model, config=config, hf=hf, checkpoint=checkpoint, revision=revision,
                  allow_download=allow_download, streamed=streamed)
    if progress is not None and not given:
        for note in loaded.notes:
            progress(Note(note))
    return loaded


def _say(progress: Progress | None) -> Progress:
    return progress or (lambda _m: None)


def writable_output(output: str | Path, hint: str = "") -> Path:
    """An output folder checked before any work: writable (made if missing), and the writers' lock timeout
    (MHAEXPORT_LOCK_TIMEOUT) valid; ArtifactError / ConfigError in one line (``hint`` appended)."""
    from mhaexport.artifact.files import probe_writable
    from mhaexport.artifact.lock import lock_timeout
    from mhaexport.core.errors import ArtifactError

    lock_timeout()
    try:
        return probe_writable(output)
    except ArtifactError as e:
        if not hint:
            raise
        raise ArtifactError(f"{e}{hint}") from None


def _block(module: str | None, mask: str | None, model: Any, hf: Any, **refused: tuple[Any, Any]) -> bool:
    """Whether an export is of the built-in attention block on its own (``module="attention"``, the CLI's --module),
    checked before any work: ``mask`` needs ``module``; the block comes from ``config`` (not ``model``/``hf``) and
    is exported with dynamic axes, decomposed attention and float32 (``refused``: option -> (value, default)).
    ExportOptionError (a ConfigError) otherwise."""
    from mhaexport.core.errors import ExportOptionError

    if module is None:
        if mask is not None:
            raise ExportOptionError("--mask applies to --module attention (the decoder's mask is causal, with "
                                    "padding from attention_mask)")
        return False
    if module != "attention":
        raise ExportOptionError(f"--module {module!r}: expected attention")
    if model is not None or hf is not None:
        raise ExportOptionError(f"--module {module} exports the built-in block from --config; --model and --hf are "
                                "decoders")
    for option, (value, default) in refused.items():
        if value != default:
            raise ExportOptionError(f"--module {module} is exported with dynamic axes, decomposed attention and "
                                    f"float32; {option} {value} does not apply")
    return True


def _load_block(config: str | None, checkpoint: str | Path | None, mask: str | None) -> LoadedModel:
    """The built-in attention block of ``config`` (its blocks.0.attn weights) with ``mask`` (default causal)."""
    from mhaexport.models.block import load_block

    return load_block(config, checkpoint, mask=mask or "causal")


def _block_of(loaded: LoadedModel) -> str:
    """"the attention block of preset:tiny" (a block's spec ends with the block's own name)."""
    return f"the {loaded.contract.kind} block of {loaded.spec.rsplit(' ', 1)[0]}"


def export_onnx(output: str | Path, *, model: str | LoadedModel | None = None, config: str | None = None,
                hf: str | Path | None = None, checkpoint: str | Path | None = None, revision: str | None = None,
                allow_download: bool = False, module: str | None = None, mask: str | None = None,
                opset: int | None = None, attention: str = "decomposed", dtype: str = "float32",
                kv_cache: str = "concat", max_cache: int | None = None, seq_dynamic: bool = True,
                seq_len: int | None = None, past_len: int = 0, replace: bool = False,
                progress: Progress | None = None, announce: bool = True) -> ExportRecord:
    """``mhaexport onnx``: export the model to ONNX into folder ``output`` (model.onnx + manifest.json; other
    artifacts already there stay). ``module="attention"``: the built-in attention block of ``config`` on its own
    (``mask`` "causal" or "none"; dynamic axes, decomposed attention, float32). ``replace``: ``output`` may hold
    another model (or the attention block where a decoder goes): it is replaced, its files and reports removed
    (``record.replaced`` says what went) — without it that is an ExportError before any work. Returns the
    ExportRecord (folder, files, seconds, warnings, manifest, replaced; ``.to_dict()``: what ``--json`` prints).
    Raises ConfigError / ModelLoadError / ExportError / ArtifactError. ``progress`` hears each phase (loading,
    tracing, lowering, writing, checking); ``announce`` False: no "Exporting ..." line (a caller that said it)."""
    say = _say(progress)
    if _block(module, mask, model, hf, **{"--seq-static": (not seq_dynamic, False),
                                          "--attention": (attention, "decomposed"), "--dtype": (dtype, "float32"),
                                          "--kv-cache": (kv_cache, "concat"), "--max-cache": (max_cache, None)}):
        from mhaexport.exporter.block import export_module_onnx

        writable_output(output)
        loaded = _load_block(config, checkpoint, mask)
        with _replacing(output, loaded, replace) as done:
            say(f"Exporting {_block_of(loaded)} to ONNX (opset {opset or 18}, dynamic axes, mask "
                f"{loaded.contract.mask}) ...")
            return done(export_module_onnx(loaded, output, opset=opset))
    from mhaexport.exporter.onnx import check_options, export_onnx as _export

    shown = check_options(opset=opset, seq_dynamic=seq_dynamic, seq_len=seq_len, past_len=past_len,
                          attention=attention, dtype=dtype, kv_cache=kv_cache, max_cache=max_cache)
    writable_output(output)
    # the model streamed (the built-in decoder, an --hf folder): its weights in a staging file, written to the export
    # one tensor at a time
    if (model is None or isinstance(model, str)) and announce:  # a model to load (a LoadedModel is loaded)
        say(f"Loading {model or config or (f'--hf {hf}' if hf else None) or 'the default model'} ...")
    loaded = _model(model, config, hf, checkpoint, revision, allow_download, progress, streamed=True)
    with _replacing(output, loaded, replace) as done:
        axes = "dynamic axes" if seq_dynamic else f"static seq={seq_len} past={past_len}"
        cache = {"concat": "", "window": ", window-sized KV cache (GroupQueryAttention)"}.get(
            kv_cache, ", shared KV cache (GroupQueryAttention)")
        if announce:
            say(f"Exporting {loaded.spec} to ONNX (opset {shown}, {axes}, attention {attention}, {dtype}{cache}) ...")
        return done(_export(loaded, output, opset=opset, seq_dynamic=seq_dynamic, seq_len=seq_len,
                            past_len=past_len, attention=attention, dtype=dtype, kv_cache=kv_cache,
                            max_cache=max_cache, progress=progress))


@contextlib.contextmanager
def _replacing(output: str | Path, loaded: Any, replace: bool) -> Iterator[Callable[[Any], Any]]:
    """An export into ``output``, refused before any work when it holds another model unless ``replace``: the one
    check of ``replace``. Yields ``done(record)``: once the new export is published, what the replaced model left
    goes and ``record.replaced`` says what (returns the record). ``loaded``: a LoadedModel, or a quantize source's
    recorded model (None: nothing to check)."""
    from mhaexport.exporter.common import check_replace, drop_replaced
    from mhaexport.exporter.records import Replaced

    prev = check_replace(output, loaded, replace) if loaded is not None else None

    def done(record: Any) -> Any:
        removed = drop_replaced(output, prev)
        if prev is not None:
            record.replaced = Replaced(prev.what, prev.spec, prev.fingerprint, removed)
        return record

    yield done


def export_torchscript(output: str | Path, *, model: str | LoadedModel | None = None, config: str | None = None,
                       hf: str | Path | None = None, checkpoint: str | Path | None = None,
                       revision: str | None = None, allow_download: bool = False, module: str | None = None,
                       mask: str | None = None, mode: str = "trace", replace: bool = False,
                       progress: Progress | None = None) -> ExportRecord:
    """``mhaexport torchscript``: export the model to TorchScript (``mode`` trace or script) into ``output``
    (``module``, ``mask``, ``replace`` as :func:`export_onnx`). Returns the ExportRecord."""
    say = _say(progress)
    if _block(module, mask, model, hf):
        from mhaexport.exporter.block import export_module_torchscript

        writable_output(output)
        loaded = _load_block(config, checkpoint, mask)
        with _replacing(output, loaded, replace) as done:
            say(f"Exporting {_block_of(loaded)} to TorchScript (torch.jit.{mode}, mask {loaded.contract.mask}) ...")
            return done(export_module_torchscript(loaded, output, mode=mode))
    from mhaexport.exporter.torchscript import export_torchscript as _export

    writable_output(output)
    loaded = _model(model, config, hf, checkpoint, revision, allow_download, progress)
    with _replacing(output, loaded, replace) as done:
        say(f"Exporting {loaded.spec} to TorchScript (torch.jit.{mode}) ...")
        return done(_export(loaded, output, mode=mode))


def export_pt2(output: str | Path, *, model: str | LoadedModel | None = None, config: str | None = None,
               hf: str | Path | None = None, checkpoint: str | Path | None = None, revision: str | None = None,
               allow_download: bool = False, module: str | None = None, mask: str | None = None,
               aoti: bool = False, replace: bool = False, progress: Progress | None = None) -> list[ExportRecord]:
    """``mhaexport pt2``: export the model with torch.export into ``output`` (model.pt2) and, with ``aoti``,
    compile it with AOTInductor for CPU (model.aoti.pt2). Returns the ExportRecords, pt2 first. Both files are code:
    ``verify``/``bench`` of the folder load them only with ``trust_code=True`` (or in this same process). Raises
    ExportError in one line for a model torch.export cannot take. ``module``, ``mask``, ``replace`` as
    :func:`export_onnx`."""
    from mhaexport.exporter.pt2 import export_pt2 as _export

    say = _say(progress)
    block = _block(module, mask, model, hf)
    writable_output(output)
    loaded = (_load_block(config, checkpoint, mask) if block else
              _model(model, config, hf, checkpoint, revision, allow_download, progress))
    with _replacing(output, loaded, replace) as done:
        say(f"Exporting {_block_of(loaded) if block else loaded.spec} with torch.export (dynamic axes) ...")
        records = _export(loaded, output, aoti=aoti, progress=progress)
        done(records[0])
        return records


def verify(folder: str | Path, *, model: str | LoadedModel | None = None, config: str | None = None,
           hf: str | Path | None = None, checkpoint: str | Path | None = None, revision: str | None = None,
           runtimes: Sequence[str] | None = None, sweep: str = "quick", seed: int = 0,
           atol: float | dict | None = None, rtol: float | dict | None = None, gen_tokens: int | None = None,
           output: str | Path | None = None, junit: str | Path | None = None, quality: Any = None,
           trust_code: bool = False, progress: Progress | None = None, tokens: int | None = None,
           allow_download: bool = False, reference: str = "auto", record: bool = False,
           memory: str | int | None = None, mapped: bool = False) -> VerifyReport:
    """``mhaexport verify FOLDER``: check every artifact of an export folder against eager PyTorch on each runtime.

    The eager model is rebuilt from the folder's manifest, or given (``model``/``config``/``hf``/``checkpoint``: it
    must be the exported model — same fingerprint — which re-points a folder whose source moved). ``runtimes``: None
    for the defaults (one that cannot run here is skipped without failing); named ones must run (else the verdict is
    "not verified"). ``output``: also write report.json + report.md there; ``junit``: also write JUnit XML;
    ``quality``: a :class:`mhaexport.verify.quality.QualitySettings` for a quantized folder (threshold overrides,
    the text). ``trust_code``: the folder is yours — run the code it holds: rebuild its eager model from a manifest
    source that is code (a factory file or module; without it such a folder raises UntrustedCode unless ``model``
    names the model) and load its torch.export program / AOTInductor package (without it they are skipped with the
    reason, or refused when named in ``runtimes``). Nothing runs because a folder says so.

    ``tokens``: greedy tokens for the generation check (``--tokens``; default 8 quick, 32 full; ``gen_tokens`` is its
    deprecated alias). ``allow_download``: with ``hf`` a Hub id, let huggingface_hub download what the cache lacks.

    ``record``: also write eager's outputs over this sweep into the folder (``reference.json`` + ``reference.npz``,
    hashed in the manifest under the ONNX file: ``--record``); ``reference``: ``"auto"`` (the folder's record when it
    holds one and torch cannot be imported here, else eager), ``"eager"``, ``"recorded"`` (judge the ONNX file from
    the record, without torch or the weights; a record of other weights, another sweep or another file is refused:
    ReferenceMismatch). docs/verify.md says what a record keeps and proves.
    ``memory``: the memory cap (``--memory``: ``"1.5G"``, ``"800M"`` or bytes; None: the machine's — the cgroup's
    limit or MemAvailable, the smaller); ``mapped``: hold the weights memory-mapped whatever fits (``--mapped``). The
    run is planned before any weight is read (:mod:`mhaexport.verify.memory`): weights whole when everything fits,
    memory-mapped (eager's built-in decoder and ONNX Runtime's external data) when only that fits, and refused
    (ConfigError, exit 2, one line saying what it needs and what to try) when even that does not; ``report.memory``
    says the cap, the mode and why, and the peak RSS measured.

    Returns the :class:`~mhaexport.verify.report.VerifyReport`: ``bool(report)`` is True only when the verdict
    passed (exit 0 on the command line) — a failed check and a runtime asked for that was skipped are both False;
    ``report.verdict`` says which (``.code`` 1 or 4, ``.message``). Raises ArtifactError / ConfigError for bad
    input; a folder refused that way still gets its report (verdict "refused") in ``output`` and ``junit``."""
    from mhaexport.verify import verify_folder

    gen_tokens = _renamed("tokens", tokens, "gen_tokens", gen_tokens)
    _count(gen_tokens, "tokens")
    _count(seed, "seed", 0, optional=False)
    _tolerance(atol, "atol")
    _tolerance(rtol, "rtol")
    runtimes = _names(runtimes, "runtimes")
    if memory is not None:
        from mhaexport.verify.memory import parse_size

        parse_size(memory)  # a bad size is refused before any work
    loaded = None
    if model is not None or config is not None or hf is not None or checkpoint is not None:
        loaded = _model(model, config, hf, checkpoint, revision, allow_download)
    from mhaexport.exporter.quantize import reproduce

    try:
        report = verify_folder(folder, loaded=loaded, sweep=sweep, seed=seed, atol=atol, rtol=rtol,
                               runtimes=tuple(runtimes) if runtimes else None, gen_tokens=gen_tokens,
                               quality=quality, reproduce=reproduce, trust_code=trust_code, progress=progress,
                               reference=reference, record=record, memory=memory, mapped=mapped)
    except MhaExportError as e:  # a refused folder: its report (verdict "refused") where asked, then the error
        if output is not None or junit is not None:
            from mhaexport.verify.report import refused_report

            refused = refused_report(folder, str(e), requested=list(runtimes) if runtimes else None, sweep=sweep,
                                     seed=seed)
            into = output if output is not None and Path(output).resolve() != Path(folder).resolve() else None
            write_reports(refused, into, junit, name="report")
        raise
    write_reports(report, output, junit, name="report")
    return report


def generate(folder: str | Path, prompts: Sequence[str] = (), *, prompt_ids: Sequence[Sequence[int]] = (),
             max_new_tokens: int = 32, temperature: float = 0.0, top_k: int | None = None,
             top_p: float | None = None, seed: int = 0, eos_id: int | None = None,
             providers: Sequence[str] = ("cpu",), threads: int | None = None, engine: str = "auto",
             trust_code: bool = False) -> GenerationResult:
    """``mhaexport generate``: prefill and KV-cache decode with ONNX Runtime (no torch), on the loop ``engine``
    picks (``"auto"``: onnxruntime-genai's where it is installed and the folder's genai_config.json passes the
    genai-config check, else mhaexport's; ``"mhaexport"``; ``"onnxruntime-genai"``; the result's ``engine`` says
    which ran; :func:`mhaexport.runtime.engine.open_generator`). ``prompts`` are encoded
    with the folder's tokenizer.json (an --hf export) or as UTF-8 bytes (byte-level models); ``prompt_ids`` are
    token ids; a batch is left-padded. Returns the GenerationResult (``tokens`` per prompt, ``stop_reason``,
    ``message``, timings, ``providers``, ``engine``, ``warnings``) with ``texts``: the decoded continuation per text
    prompt (None without a tokenizer) and ``engine_reason`` (why that loop). Raises ConfigError for a bad argument
    (RuntimeOptionError: no prompt, text for a model without a tokenizer, a sampling setting out of range, an unknown
    engine), RuntimeInputError for ids the model cannot take, ArtifactError, ProviderUnavailable; UntrustedCode when
    onnxruntime-genai would load code or write files as the folder's genai_config.json asks (``trust_code``:
    ``--trust-code``). The folder is opened (hash-checked) once; its snapshot goes when done."""
    from mhaexport.artifact import ExportFolder
    from mhaexport.runtime import GenerationConfig, SamplingConfig
    from mhaexport.runtime.engine import open_generator
    from mhaexport.runtime.tokenizer import for_folder

    prompts = _names(prompts, "prompts") or ()
    prompt_ids = _prompt_ids(prompt_ids)
    providers = _names(providers, "providers")
    _count(eos_id, "eos_id", 0)
    _count(threads, "threads")
    _count(seed, "seed", 0, optional=False)
    if not prompts and not prompt_ids:
        raise RuntimeOptionError("give prompts (text) or prompt_ids", cli="give --prompt TEXT or --prompt-ids 5,17,42")
    sampling = SamplingConfig(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)
    with ExportFolder.open(folder, "onnx") as ef:
        gen = open_generator(ef, tuple(providers), threads=threads, engine=engine,  # --engine
                             trust_code=trust_code)
        tok = for_folder(ef)  # the folder's tokenizer.json, byte-level, or None
        if prompts and tok is None:
            said = (f"text prompts are encoded as bytes (ids 0..255) but this model's vocab_size is "
                    f"{gen.contract.vocab_size} and the folder carries no tokenizer.json")
            raise RuntimeOptionError(f"{said}; use prompt_ids",
                                     cli=f"--prompt encodes {said.removeprefix('text prompts are encoded')}; use "
                                         "--prompt-ids")
        rows = [tok.encode(p) for p in prompts] + [list(r) for r in prompt_ids]
        if eos_id is None and tok is not None:
            eos_id = tok.eos_token_id
        result = gen.generate(rows, GenerationConfig(max_new_tokens=max_new_tokens, eos_token_id=eos_id,
                                                     sampling=sampling))
        random = ef.manifest.model.random_weights
    result.texts = [tok.continuation(r, t) for r, t in zip(rows, result.tokens)] if tok is not None else None
    result.warnings = list(gen.warnings)
    if random is not None:  # noise is what such a model says: not a fault of the export
        result.warnings.append(f"{random}: what it generates is noise, not a fault of the export")
    result.engine_reason = gen.engine_reason
    return result


def evaluate(folder: str | Path, text: bytes | None = None, *, text_source: str | None = None,
             runtimes: Sequence[str] | None = None, window: int | None = None, stride: int | None = None,
             trust_code: bool = False, progress: Progress | None = None) -> EvalReport:
    """``mhaexport eval``: perplexity (and bits per byte) of ``folder``'s artifacts on ``text`` (UTF-8 bytes;
    default: the held-out text of the shipped weights) on each of ``runtimes`` (default ["ort-cpu"]); a runtime
    that cannot run or fails is a row saying why (``report.rows``; ``.to_dict()``: what ``--json`` prints). Raises
    ConfigError for an unknown runtime or a bad ``window``/``stride``, RuntimeInputError for text the model cannot
    read. The folder is opened (hash-checked) once; its snapshot goes when done."""
    from mhaexport.evaluate.perplexity import evaluate_folder
    from mhaexport.runners.names import EVAL, RUNTIMES

    runtimes = _names(runtimes, "runtimes") or RUNTIMES[EVAL].default
    _count(stride, "stride")
    return evaluate_folder(folder, text, text_source=text_source, runtimes=runtimes, window=window, stride=stride,
                           trust_code=trust_code, progress=progress)


def _prompt_ids(value: Any) -> list[list[int]]:
    """``prompt_ids``: a list of token-id lists, or one flat list of ids (one prompt). ConfigError for a string or
    anything but integers."""
    def ids(row: Any) -> list[int] | None:
        if isinstance(row, (str, bytes, Mapping)) or not isinstance(row, Iterable):
            return None
        row = list(row)
        ok = builtins.all(isinstance(v, numbers.Integral) and not isinstance(v, bool) for v in row)
        return [int(v) for v in row] if ok else None

    if value is None:
        return []
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Iterable):
        raise ConfigError(f"prompt_ids={value!r}: expected lists of token ids, e.g. prompt_ids=[[5, 17, 42]]")
    value = list(value)
    flat = ids(value)
    if value and flat is not None:  # one flat list of ids: one prompt
        return [flat]
    rows = [ids(row) for row in value]
    for row, given in zip(rows, value):
        if row is None:
            raise ConfigError(f"prompt_ids: {given!r} is not a list of token ids, e.g. prompt_ids=[[5, 17, 42]]")
    return rows


def bench(folder: str | Path, *, output: str | Path | None = None, progress: Progress | None = None,
          lowerings: str | Sequence[str] | None = None, quantize: str | Sequence[str] | None = None,
          builder: str | Sequence[str] | None = None, trust_code: bool = False, **config: Any) -> BenchResult:
    """``mhaexport bench``: time the KV-cache decode loop of an export folder on each runtime. ``config``: fields
    of :class:`mhaexport.bench.BenchConfig` (prompt_len, new_tokens, batch, threads, runtimes, repeats, long, ...;
    ``runtimes=["all"]``: every runtime, pt2/aoti with ``trust_code``; ``batches=[1, 4, 16]`` /
    ``prompts=[32, 512, 2048]``, or the CLI's "1,4,16": how cost grows; ``serving=[1, 4, 8]``: continuous batching
    at those rows and speculative decoding against the plain loop (bench.serving); ``targets=True``: the project's speed
    targets; the default runtimes leave out eager-nocache). ``long`` is the CLI's ``--long`` (BenchConfig's
    ``long_to``; ``long_to=`` still works, deprecated).

    The export steps of the CLI's ``--lowerings`` / ``--quantize`` / ``--builder`` (names or one comma list each):
    the same model in other lowerings ("decomposed", "onnx", "ort", "fused", "shared", "fused-shared", each with an
    optional ":DTYPE"), quantized ("int4", "int8", default settings) and built by onnxruntime-genai's model builder
    ("fp32", "int4"; FOLDER an --hf export) are exported once into ``output`` (FOLDER when None: lowerings/,
    quantized/, builder/) unless FOLDER, a ``compare`` folder or an earlier run holds them, and timed beside it.

    Everything is checked before any work (ConfigError in one line). Each folder is opened (hash-checked) once and
    every snapshot goes when the run ends, on errors too. ``output``: also write bench.json / bench.md / bench.png
    (bench-scaling.png) there (``result.written``: their paths). Returns the BenchResult (``.get(name)``: a row;
    ``.scaling``: how cost grows; ``mhaexport.bench.markdown_body(result)``: bench.md's tables)."""
    import dataclasses

    from mhaexport import bench as _bench
    from mhaexport.artifact import OpenFolders
    from mhaexport.bench.config import AOTI, PT2

    if "long_to" in config:  # the CLI's --long; long_to is its deprecated alias
        config["long"] = _renamed("long", config.pop("long", None), "long_to", config.pop("long_to"))
    if "long" in config:
        config["long_to"] = config.pop("long")
    for key in ("runtimes", "opt_levels", "compare"):  # a bare string is one name (one folder)
        if key in config:
            names = _names(config[key], key, paths=key == "compare")
            config[key] = names if names is not None or key == "runtimes" else ()
    for key in ("batches", "prompts", "serving"):  # "1,4,16" or [1, 4, 16]: ConfigError in one line naming the point
        if key in config:
            config[key] = _bench.parse_points(config[key], key)
    if "runtimes" in config and config["runtimes"] == ("all",):  # every runtime; the code ones (pt2, aoti) on trust
        config["runtimes"] = tuple(r for r in _bench.ALL_RUNTIMES if trust_code or r not in (PT2, AOTI))
    # --prompt-len / --new-tokens not given: their defaults, shrunk to fit the model once its folder is open
    defaulted = {k for k in ("prompt_len", "new_tokens") if config.get(k, None) is None}
    config = {k: v for k, v in config.items() if k not in defaulted}
    cfg = _bench.BenchConfig(**config, trust_code=trust_code)  # checked when made: the one check of the request
    steps = _bench_steps(lowerings, quantize, builder)
    out_dir = Path(output if output is not None else folder)
    if output is not None or any(steps):
        from mhaexport.outputs import check_outputs, resolved

        if output is not None:
            check_outputs({f"-o (its {n})": out_dir / n for n in ("bench.json", "bench.md", "bench.png")},
                          reading=[folder, *cfg.compare])
        writable_output(out_dir, " (give -o DIR to write the bench results elsewhere)"
                  if resolved(out_dir) == resolved(folder) else "")
    wanted, schemes, precisions = steps
    fitted = None
    with OpenFolders() as reads:
        ef = reads.open(folder)
        cfg, fitted = _fit_lengths(cfg, defaulted, ef.contract.max_positions)
        if fitted:
            _say(progress)(fitted)
        if precisions:
            from mhaexport.exporter.peer import hf_source

            hf_source(ef)  # an --hf folder, its Hugging Face folder still there: else one line, before any work
        for step, todo in ((_lowerings, wanted), (_quantized, schemes), (_builder, precisions)):
            if todo:
                found = step(ef, todo, out_dir, cfg, progress, reads)
                cfg = dataclasses.replace(cfg, compare=cfg.compare + tuple(str(f) for f in found))
        result = _bench.run_bench(ef, cfg, progress=progress, reads=reads)
    if fitted:
        result.notes.insert(0, fitted)
    if output is not None:
        result.written = _bench.write_bench(result, output)
    return result


def _fit_lengths(cfg: Any, defaulted: set[str], max_positions: int) -> tuple[Any, str | None]:
    """bench's prompt and new tokens within the model's ``max_positions``: a length left at its default (in
    ``defaulted``) shrinks to fit, and says so (the returned line); a length given that cannot fit is the run's
    one-line refusal later. (cfg, the line or None)."""
    import dataclasses

    p, n = cfg.prompt_len, cfg.new_tokens
    if p + n <= max_positions or not defaulted:
        return cfg, None
    if "prompt_len" in defaulted:
        p = max(1, min(p, max_positions // 4, max_positions - (2 if "new_tokens" in defaulted else n)))
    if "new_tokens" in defaulted:
        n = max(2, min(n, max_positions - p))
    if p + n > max_positions:  # the given length leaves no room: refused by the run, naming both
        return cfg, None
    said = [f"--{k.replace('_', '-')} {v} (default {getattr(cfg, k)})" for k, v in (("prompt_len", p),
                                                                                      ("new_tokens", n))
            if k in defaulted and v != getattr(cfg, k)]
    return (dataclasses.replace(cfg, prompt_len=p, new_tokens=n),
            f"{' and '.join(said)}: the defaults shrunk to fit the model's max_positions={max_positions}")


def _bench_steps(lowerings: Any, quantize: Any, builder: Any) -> tuple[list, list, list]:
    """bench's export steps, checked before any work: the (attention, dtype) lowerings, the QuantConfigs, the
    builder's precisions."""
    def text(value: Any, arg: str) -> str | None:
        names = _names(value, arg)
        return ",".join(names) if names else None

    wanted, schemes, precisions = [], [], []
    if (given := text(lowerings, "lowerings")) is not None:
        from mhaexport.exporter.variants import parse_lowerings

        wanted = parse_lowerings(given)
    if (given := text(quantize, "quantize")) is not None:
        from mhaexport.exporter.quantize import QuantConfig

        schemes = [QuantConfig(weights=s) for s in dict.fromkeys(x.strip() for x in given.split(",") if x.strip())]
    if (given := text(builder, "builder")) is not None:
        from mhaexport.exporter.peer import check_precisions

        precisions = check_precisions(given)
    return wanted, schemes, precisions


def _lowerings(ef, wanted, out_dir, cfg, progress, reads) -> list[Path]:
    from mhaexport.exporter.variants import export_lowerings

    return export_lowerings(ef, wanted, out_dir, have=cfg.compare, progress=progress, trust_code=cfg.trust_code,
                            reads=reads)


def _quantized(ef, schemes, out_dir, cfg, progress, reads) -> list[Path]:
    from mhaexport.exporter.quantize import export_quantized

    return export_quantized(ef, schemes, out_dir, have=cfg.compare, progress=progress, reads=reads)


def _builder(ef, precisions, out_dir, cfg, progress, reads) -> list[Path]:
    from mhaexport.exporter.peer import export_builder

    return export_builder(ef, precisions, out_dir, progress=progress, trust_code=cfg.trust_code, reads=reads)


def quantize(folder: str | Path, output: str | Path, *, weights: str = "int4", block_size: int | None = None,
             symmetric: bool = True, accuracy_level: int = 4, keep_float: Sequence[str] = ("embeddings",),
             int8_blocks: int | None = None, replace: bool = False,
             progress: Progress | None = None) -> QuantizeRecord:
    """``mhaexport quantize``: the weights of ``folder``'s float ONNX export to int4/int8 into a new folder
    ``output`` (then ``verify(output)`` judges its quality against eager fp32; ``replace`` as :func:`export_onnx`).
    Every setting is checked before any work (ConfigError); ``folder`` is opened (hash-checked) once. Returns the
    QuantizeRecord (``.to_dict()``: what ``--json`` prints)."""
    from mhaexport.exporter.common import previous_model
    from mhaexport.exporter.quantize import QuantConfig, quantize_folder
    from mhaexport.outputs import check_export_into

    cfg = QuantConfig(weights=weights, block_size=block_size, symmetric=symmetric, accuracy_level=accuracy_level,
                      keep_float=_names(keep_float, "keep_float") or (), int8_blocks=int8_blocks)  # checked when made
    check_export_into(output, [folder])
    writable_output(output)
    with _replacing(output, previous_model(folder), replace) as done:
        return done(quantize_folder(folder, output, cfg, progress=progress))


def bisect_folder(folder: str | Path, *, model: str | LoadedModel | None = None, config: str | None = None,
                  hf: str | Path | None = None, checkpoint: str | Path | None = None, revision: str | None = None,
                  allow_download: bool = False, case: Sequence[int] | None = None, seed: int = 0,
                  trust_code: bool = False, runtimes: Sequence[str] | str = (),
                  progress: Progress | None = None) -> BisectRun:
    """``mhaexport verify FOLDER --bisect``: where the folder's ONNX graph (or its torch.export program: ``runtimes``
    naming ``pt2``, a folder with a program and no ONNX file, or a report with only the program's parity failing;
    :func:`mhaexport.diagnose.bisect_pt2.bisect_target`) first departs from eager PyTorch.

    ``verify --bisect`` is verify plus a diagnosis: its verdict is verify's — the folder's newest verify report
    written since its last export, else a verify run now (every check, ``runtimes`` or the defaults) — and it
    follows the check that failed, in that check's protocol: a weights check (the tensor and its module), a check run
    in a deploy protocol (a ragged batch over a shared buffer; onnxruntime-genai's: the first step, row and tensor
    that differ in that loop) — a difference found there ends the run. Then bisect's module-by-module comparison, at
    ``case`` (batch, seq, past: the CLI's ``--case B,S,P``) when given, else at the case parity failed at worst in
    that report, else at bisect's default shapes. The eager model is rebuilt from the manifest (``trust_code``:
    also from a source that is code) or given (``model``/``config``/``hf``/``checkpoint``: the exported model).

    The folder is opened (hash-checked) once for all of it; its snapshot goes when done. Returns the
    :class:`~mhaexport.diagnose.follow.BisectRun`: ``bool(run)`` is True only when verify's verdict passed and no
    difference was found (a verify that failed is never turned green by a bisect that found nothing);
    ``run.verdict``: verify's; ``run.followed`` / ``run.report``: the two steps' reports (``.summary()``: their
    text)."""
    from mhaexport.artifact import ExportFolder
    from mhaexport.models.loading import load_recorded
    from mhaexport.diagnose.bisect import bisect as _bisect, failing_case
    from mhaexport.diagnose.bisect_pt2 import bisect_pt2, bisect_target, refuse_untrusted_program
    from mhaexport.diagnose.follow import BisectRun, failure_to_follow, follow, newest_report

    say = _say(progress)
    target = bisect_target(folder, _names(runtimes, "runtimes"))
    if target == "pt2":
        refuse_untrusted_program(folder, trust_code)  # before any work: the program is code
    _count(seed, "seed", 0, optional=False)
    if case is not None:
        case = tuple(case)
        if len(case) != 3 or any(isinstance(v, bool) or not isinstance(v, numbers.Integral) for v in case):
            raise ConfigError(f"case={case!r}: expected (batch, seq, past), e.g. (1, 121, 7)")
        if case[0] < 1 or case[1] < 1 or case[2] < 0:
            raise ConfigError(f"case={case!r}: batch and sequence must be >= 1, past >= 0",
                              cli=f"--case {','.join(map(str, case))}: batch and sequence must be >= 1, past >= 0")
    loaded = None
    if model is not None or config is not None or hf is not None or checkpoint is not None:
        loaded = _model(model, config, hf, checkpoint, revision, allow_download, progress)
    with ExportFolder.open(folder) as ef:  # every artifact: verify's verdict is the folder's
        if loaded is None:
            loaded = load_recorded(ef, trust_code=trust_code)
        verified = newest_report(ef)
        if verified is None:  # no verdict since the last export: verify runs now (not a quick parity sweep)
            from mhaexport.exporter.quantize import reproduce
            from mhaexport.verify import verify_folder

            say(f"Verifying {ef.path} (bisect follows its failed check and exits with its verdict) ...")
            verified = "run now", verify_folder(ef, loaded=loaded, runtimes=_names(runtimes, "runtimes") or None,
                                                seed=seed, reproduce=reproduce, trust_code=trust_code)
        shapes: dict = {"seed": seed}
        followed = None
        run = partial(BisectRun, verdict=verified[1].verdict, verified=verified[0])
        if case is not None:
            shapes.update(batch=case[0], seq=case[1], past=case[2], case_from="--case")
        else:
            failure = failure_to_follow(verified[1]) if target == "onnx" else None
            followed = follow(ef, loaded, seed=seed, failure=failure)  # a weights or deploy failure: in its terms
            if followed is not None and not followed.ok:
                return run(followed, None)
            found, why = failing_case(ef, loaded, verified, runtime="pt2" if target == "pt2" else "ort-cpu")
            if found is not None:
                shapes.update(batch=found.batch, seq=found.seq, past=found.past, pad=list(found.pad),
                              seed=found.seed, case_from=f"{found.name}: {why}")
            else:
                shapes["case_from"] = f"default case: {why}"
        say(f"Bisecting {ef.path} against eager PyTorch ...")
        if target == "pt2":
            return run(followed, bisect_pt2(ef, loaded, trust_code=trust_code, **shapes))
        return run(followed, _bisect(ef, loaded, trust_code=trust_code, **shapes))


class VerifyRun:
    """What ``mhaexport verify [PATH]`` did (:func:`verify_run`): ``report`` (verify's
    :class:`~mhaexport.verify.report.VerifyReport`, a refused folder's with verdict "refused"; None with ``bisect``),
    ``bisect`` (the :class:`~mhaexport.diagnose.follow.BisectRun` of ``bisect=True``), ``written`` (the report files,
    the JUnit file, bisect's node data), ``adopted`` (FILE.onnx's ExportRecord), ``exported`` (the records of a
    temporary export), ``folder`` (the folder verified; None for a temporary one). ``exit``: (code, message) — the
    verdict (:func:`mhaexport.core.errors.raise_for_verdict` makes it the exit: 1 failed, 2 refused, 4 not verified);
    truthy only when it passed."""

    def __init__(self, *, report: VerifyReport | None = None, bisect: BisectRun | None = None,
                 written: list[Path] | None = None, adopted: Any = None, exported: list | None = None,
                 folder: Path | None = None) -> None:
        self.report, self.bisect, self.written = report, bisect, list(written or [])
        self.adopted, self.exported, self.folder = adopted, list(exported or []), folder

    @property
    def exit(self) -> tuple[int, str]:
        if self.bisect is not None:
            return self.bisect.exit
        v = self.report.verdict
        return v.code, v.message

    def __bool__(self) -> bool:
        return self.exit[0] == 0

    def __repr__(self) -> str:
        return f"VerifyRun({self.exit!r})"


def verify_run(path: str | Path | None = None, output: str | Path | None = None, *,
               model: str | LoadedModel | None = None, config: str | None = None, hf: str | Path | None = None,
               checkpoint: str | Path | None = None, revision: str | None = None, allow_download: bool = False,
               runtimes: Sequence[str] | None = None, sweep: str = "quick", seed: int = 0,
               atol: float | dict | None = None, rtol: float | dict | None = None, tokens: int | None = None,
               quality: Any = None, junit: str | Path | None = None, trust_code: bool = False, bisect: bool = False,
               case: Sequence[int] | None = None, markdown: Callable[[Any], str] | None = None,
               progress: Progress | None = None, reference: str = "auto", record: bool = False,
               memory: str | int | None = None, mapped: bool = False) -> VerifyRun:
    """``mhaexport verify [PATH]``, the whole verb: ``path`` an export folder, an ONNX file another tool exported
    (adopted first, :func:`adopt`, into ``output`` or FILE's folder/mhaexport, and verified there), or None (the
    model named by ``model``/``config``/``hf``/``checkpoint`` exported to a temporary folder and verified). Every
    input is checked before any work. The report goes to ``output`` (a folder: default ``path``, where a run of
    named ``runtimes`` writes report-RUNTIMES.* beside the full report; a temporary export's nowhere unless given)
    and ``junit``, written before this returns (a closed stdout loses none; ``markdown``: the report's Markdown
    renderer for the JUnit file). A folder refused before any check is a verdict too ("refused", exit 2): its report
    goes to ``output`` and ``junit``, never into the refused folder itself.

    ``bisect``: verify plus a diagnosis (:func:`bisect_folder`: its exit is verify's verdict, 1 also when bisect
    finds a difference; ``case``: where to bisect; ``output``: where its Model Explorer node data goes).
    ``reference`` / ``record``: :func:`verify`'s (a recorded reference), for an export folder only; ``memory`` /
    ``mapped``: :func:`verify`'s memory plan, wherever a folder is verified.
    Returns a :class:`VerifyRun`; raises ConfigError for bad input, :class:`~mhaexport.core.errors.ReportNotWritten`
    (after writing what it could) when a report cannot be written where asked."""
    import tempfile
    import time

    say = _say(progress)
    named = model is not None or config is not None or hf is not None or checkpoint is not None
    if path is None and not named:
        raise ConfigError("verify needs the export FOLDER to verify (or --config/--model/--hf/--checkpoint to "
                          "export a model to a temporary folder and verify that): nothing was verified")
    if case is not None and not bisect:
        raise ConfigError("case is for bisect (verify itself runs its sweep)",
                          cli="--case is for --bisect (verify itself runs its sweep)")
    where = Path(path) if path is not None else None
    if (record or reference != "auto") and (bisect or where is None or not where.is_dir()):
        raise ConfigError("record and reference are for verifying an export folder (not bisect, a FILE.onnx or a "
                          "temporary export)", cli="--record and --reference are for verifying an export FOLDER "
                          "(not --bisect, a FILE.onnx or a temporary export)")
    if where is not None and where.exists() and not where.is_dir() and not where.is_file():
        raise ConfigError(f"{path} is neither a folder nor a regular file (a FIFO, socket or device)")
    if where is not None and not where.is_dir() and (str(path).endswith(".onnx") or where.is_file()):
        out = _adoption_folder(where, output, named, junit)  # a file: adopted, then verified where it was adopted
        loaded = _model(model, config, hf, checkpoint, revision, allow_download, progress)
        rec = adopt(where, out, model=loaded, junit=junit)
        if bisect:
            return _bisect_run(rec.folder, loaded, output, seed, case, trust_code, (), progress, adopted=rec)
        say(f"Verifying {rec.folder} ...")
        run = _verify_into(rec.folder, loaded, rec.folder, None, junit, markdown, progress, refused_into=rec.folder,
                           runtimes=runtimes, sweep=sweep, seed=seed, atol=atol, rtol=rtol, tokens=tokens,
                           quality=quality, memory=memory, mapped=mapped)
        run.adopted = rec
        return run
    if where is not None and not where.is_dir():
        raise ConfigError(f"{path}: no such folder (an export folder, or an ONNX file FILE.onnx)")
    if bisect:
        loaded = _model(model, config, hf, checkpoint, revision, allow_download, progress) if named else None
        return _bisect_run(where, loaded, output, seed, case, trust_code, runtimes or (), progress)
    if where is not None:  # a folder: its report beside it (or in -o), checked before any work
        from mhaexport.outputs import check_outputs

        out = Path(output) if output is not None else where
        if junit is not None:
            check_junit(junit)
        check_outputs({"--junit": junit}, reading=[where], reports=out)
        check_outputs({f"-o (its {n})": out / n for n in ("report.json", "report.md", "report.html")},
                      reading=[where])
        writable_output(out, "" if output is not None else " (give -o DIR to write the report elsewhere)")
        loaded = _model(model, config, hf, checkpoint, revision, allow_download, progress) if named else None
        say(f"Verifying {where} ...")
        return _verify_into(where, loaded, out, "report" if output is not None else None, junit, markdown, progress,
                            runtimes=runtimes, sweep=sweep, seed=seed, atol=atol, rtol=rtol, tokens=tokens,
                            quality=quality, trust_code=trust_code, refused_into=output, reference=reference,
                            record=record, memory=memory, mapped=mapped)
    from mhaexport.outputs import check_outputs  # no folder: the model exported to a temporary one first

    if junit is not None:
        check_junit(junit)
    check_outputs({"--junit": junit}, reports=output)
    if output is not None:
        writable_output(output)
    else:  # the temporary export below is written under the lock too
        from mhaexport.artifact.lock import lock_timeout

        lock_timeout()
    loaded = _model(model, config, hf, checkpoint, revision, allow_download, progress)
    with tempfile.TemporaryDirectory(prefix="mhaexport-verify-") as tmp:
        say(f"Exporting {loaded.spec} to a temporary folder ...")
        started = time.perf_counter()
        exported = [export_onnx(tmp, model=loaded, progress=progress),
                    export_torchscript(tmp, model=loaded, progress=progress)]
        say(f"exported in {time.perf_counter() - started:.0f} s; verifying {loaded.spec} ...")
        run = _verify_into(Path(tmp), loaded, output, "report", junit, markdown, progress, runtimes=runtimes,
                           sweep=sweep, seed=seed, atol=atol, rtol=rtol, tokens=tokens, quality=quality,
                           memory=memory, mapped=mapped)
    run.exported, run.folder = exported, None
    return run


def _verify_into(folder: Path, loaded: Any, output: str | Path | None, name: str | None, junit: Any,
                 markdown: Callable[[Any], str] | None, progress: Progress | None, *,
                 refused_into: str | Path | None = None, runtimes: Sequence[str] | None = None, sweep: str = "quick",
                 seed: int = 0, **options: Any) -> VerifyRun:
    """:func:`verify` of ``folder`` with its report written (``name``: its file stem, None: the report's own) into
    ``output`` and ``junit``; a folder refused before any check gets a refused report, written into
    ``refused_into`` (never into the folder itself)."""
    from mhaexport.core.errors import ReportNotWritten, VerificationFailed
    from mhaexport.verify.report import refused_report

    try:
        report = verify(folder, model=loaded, progress=progress, runtimes=runtimes, sweep=sweep, seed=seed, **options)
    except VerificationFailed:
        raise
    except MhaExportError as e:  # a folder refused (a hash that does not match, a name leaving it...): a verdict
        if _interrupted(e):
            raise
        report = refused_report(folder, str(e), requested=list(runtimes) if runtimes else None,
                                sweep=sweep, seed=seed)
        output = refused_into
    try:
        written = write_reports(report, output, junit, name=name,
                                markdown=markdown(report) if markdown is not None else None)
    except ReportNotWritten as e:
        if report.refused is None:
            raise
        raise ReportNotWritten(f"{report.refused}; {e}", written=e.written) from None
    return VerifyRun(report=report, written=written, folder=folder)


def _interrupted(e: BaseException) -> bool:
    """Whether ``e`` is, or was raised while handling, a Ctrl-C (never a verdict)."""
    seen: set[int] = set()
    x: BaseException | None = e
    while x is not None and id(x) not in seen:
        if isinstance(x, KeyboardInterrupt):
            return True
        seen.add(id(x))
        x = x.__cause__ or x.__context__
    return False


def _bisect_run(folder: Path | None, loaded: Any, output: str | Path | None, seed: int, case: Any, trust_code: bool,
                runtimes: Sequence[str], progress: Progress | None, adopted: Any = None) -> VerifyRun:
    """``verify --bisect``: :func:`bisect_folder` of ``folder`` (None: ``loaded`` exported to a temporary folder
    first), its Model Explorer node data written into ``output`` (a FOLDER's run only)."""
    import tempfile
    import time

    from mhaexport.diagnose.model_explorer import NODE_DATA, write_node_data

    say = _say(progress)
    node_data = Path(output) / NODE_DATA if output is not None and folder is not None else None
    if node_data is not None:
        from mhaexport.outputs import check_outputs

        check_outputs({"-o (its node data)": node_data}, reading=[folder])
    exported: list = []
    with tempfile.TemporaryDirectory(prefix="mhaexport-bisect-") as tmp:
        if folder is None:
            say(f"Exporting {loaded.spec} to ONNX in a temporary folder ...")
            started = time.perf_counter()
            exported.append(export_onnx(tmp, model=loaded))
            say(f"exported in {time.perf_counter() - started:.0f} s")
        run = bisect_folder(folder or tmp, model=loaded, case=case, seed=seed, trust_code=trust_code,
                            runtimes=runtimes, progress=progress)
    written = []
    if node_data is not None and run.report is not None and run.report.kind == "onnx":
        from mhaexport.artifact import ensure_writable_dir

        ensure_writable_dir(node_data.parent)
        written.append(write_node_data(run.report, node_data))
    return VerifyRun(bisect=run, written=written, adopted=adopted, exported=exported, folder=folder)


# The verbs the CLI used to compose itself: the one report writer, the input checks, --target, adoption, lint,
# report merge, eval's and lint's verdicts, and the main job (``mhaexport.all``). The CLI parses, calls, prints.

def write_reports(report: Any, output: str | Path | None = None, junit: str | Path | None = None, *,
                  name: str | None = None, markdown: str | None = None) -> list[Path]:
    """The one writer of a verify report (a run, a refused folder, a merge): NAME.json / .md / .html into folder
    ``output`` (when given; ``name`` None: the report's own default name, so a subset run never replaces the full
    report) and the JUnit XML file ``junit`` (when given). Returns the paths written. What cannot be written raises
    :class:`~mhaexport.core.errors.ReportNotWritten` (an ArtifactError) after everything else was written; its
    ``written`` lists those paths. Call it before printing anything: a closed stdout then loses no report."""
    from mhaexport.core.errors import ReportNotWritten

    written: list[Path] = []
    failed: list[str] = []
    if output is not None:
        from mhaexport.verify.render import write_report

        try:
            written.extend(write_report(report, output, name))
        except (OSError, MhaExportError) as e:
            failed.append(f"cannot write the report into {output}: {getattr(e, 'strerror', None) or e}")
    if junit is not None:
        from mhaexport.verify.junit import write_junit

        try:
            written.append(write_junit(report, junit, markdown))
        except (OSError, MhaExportError) as e:
            failed.append(f"--junit {junit}: {getattr(e, 'strerror', None) or e}")
    if failed:
        raise ReportNotWritten("; ".join(failed), written=written)
    return written


def check_junit(path: str | Path) -> Path:
    """A JUnit file path checked before any work: its folder may be made by the run (inside the output folder, say),
    but what exists of the path must be writable folders, and no name in it longer than the file system takes.
    ConfigError in one line otherwise. Returns the path."""
    try:
        full = Path(path).resolve()
        longest = max(len(os.fsencode(part)) for part in full.parts)
        name_max = os.pathconf("/", "PC_NAME_MAX") if hasattr(os, "pathconf") else 255
        if longest > name_max:
            raise ConfigError(f"junit={str(path)!r}: a name in the path is {longest} bytes long, longer than the file "
                              f"system takes ({name_max})", cli=f"--junit {path}: a name in the path is {longest} "
                              f"bytes long, longer than the file system takes ({name_max})")
        parent = full.parent
        while not parent.exists():
            parent = parent.parent
    except OSError as e:  # a name or path too long, a symlink loop, a folder we may not search
        raise ConfigError(f"junit={str(path)!r}: {e.strerror or e}", cli=f"--junit {path}: {e.strerror or e}") from None
    if not parent.is_dir() or not os.access(parent, os.W_OK):
        raise ConfigError(f"junit={str(path)!r}: {parent} is not a writable folder",
                          cli=f"--junit {path}: {parent} is not a writable folder")
    return Path(path)


def check_input_file(path: str | Path, *, folder_ok: bool = True) -> None:
    """A file named for reading (a text, a checkpoint, a config or model file) checked before anything opens it: a
    FIFO, socket or device would block the read (a folder too, unless ``folder_ok``). ConfigError in one line; a
    missing path passes (its reader says so)."""
    import stat

    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return
    if not stat.S_ISREG(mode) and not stat.S_ISDIR(mode):
        raise ConfigError(f"{path} is not a regular file (a FIFO, socket or device would block the read)")
    if stat.S_ISDIR(mode) and not folder_ok:
        raise ConfigError(f"{path} is a folder, not a file")


TEXT_MAX_BYTES = 1 << 20  # a text to score is read whole and scored token by token: 1 MiB of bytes is minutes


def read_text(path: str | Path, max_bytes: int = TEXT_MAX_BYTES, option: str = "") -> bytes:
    """The bytes of a text file to score (``--text``), read with a bounded read (a device or a pipe that never ends
    cannot hang it). ConfigError when it is no regular file or holds more than ``max_bytes`` (``option``: the option
    that raises the cap, if any)."""
    import stat

    def refused(why: str) -> ConfigError:
        return ConfigError(f"text {str(path)!r}: {why}", cli=f"--text {path}{'' if why[0] in ' (' else ': '}{why}")

    try:  # O_NONBLOCK: opening a FIFO nobody writes returns at once (a plain open() waits for a writer forever)
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as e:
        raise refused(str(e.strerror or e)) from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise refused(" is not a regular file (a FIFO, socket or device): give a text file")
        os.set_blocking(fd, True)
        with os.fdopen(fd, "rb") as f:
            fd = -1
            data = f.read(max_bytes + 1)
            size = os.fstat(f.fileno()).st_size
    except OSError as e:
        raise refused(str(e.strerror or e)) from None
    finally:
        if fd >= 0:
            os.close(fd)
    if len(data) > max_bytes:
        cap = f" ({option})" if option else ""
        fix = f"give a shorter text or raise {option}" if option else "give a shorter text"
        found = f"{size} bytes, above the cap of {max_bytes}{cap}" if size > max_bytes else \
            f"more than {max_bytes} bytes, the cap{cap}"
        raise refused(f" holds {found}: {fix}")
    return data


def check_threads(threads: int | None) -> int | None:
    """A thread count within this machine's cores: more threads than cores only contend (and time nothing real).
    ConfigError otherwise; None (the runtime's default) passes."""
    cores = os.cpu_count() or 1
    if threads is not None and threads > cores:
        raise ConfigError(f"threads={threads}: this machine has {cores} CPU core(s); give at most {cores}",
                          cli=f"--threads {threads}: this machine has {cores} CPU core(s); give at most {cores}")
    return threads


def target_options(target: str, given: Mapping[str, str] | None = None) -> tuple[str, str, str, str | None]:
    """``--target NAME`` (portable, ort-cpu, ort-cuda): the (attention, kv_cache, dtype, weights) it sets.
    ``given``: the options the caller set itself ({"dtype": "float16"}); one that contradicts the target is a
    ConfigError rather than one of the two silently winning. ConfigError for an unknown target too."""
    from mhaexport.exporter.targets import conflicts, deploy_target

    t = deploy_target(target)
    bad = conflicts(t, dict(given or {}))
    if bad:
        raise ConfigError(f"--target {target} and {', '.join(bad)}: give one or the other")
    return t.attention, t.kv_cache, t.dtype, t.weights


def _given(**options: Any) -> dict[str, Any]:
    """The options a caller set (not None): what a --target is checked against."""
    return {k: v for k, v in options.items() if v is not None}


def export_onnx_target(output: str | Path, target: str | None = None, *, attention: str | None = None,
                       kv_cache: str | None = None, dtype: str | None = None, replace: bool = False,
                       module: str | None = None, progress: Progress | None = None, **export: Any) -> list:
    """``mhaexport onnx --target NAME``: :func:`export_onnx` with the options the target sets (``attention``,
    ``kv_cache``, ``dtype`` given too must agree with it: ConfigError otherwise, before any work). A target with
    quantized weights (ort-cpu: int4) exports the float model to ``OUTPUT-DTYPE`` and quantizes it into ``output``.
    ``export``: :func:`export_onnx`'s other keywords. Without ``target``: one :func:`export_onnx`. Returns the
    records, the export's first (then the quantization's)."""
    weights = None
    if target is not None:
        if module is not None:
            raise ConfigError(f"--module {module} is exported with dynamic axes, decomposed attention and "
                              f"float32; --target {target} does not apply")
        attention, kv_cache, dtype, weights = target_options(
            target, _given(attention=attention, kv_cache=kv_cache, dtype=dtype))
        if weights:
            writable_output(output)  # the target file's folder too, before the float export it is made from
    options = _given(attention=attention, kv_cache=kv_cache, dtype=dtype)
    float_out = Path(f"{Path(output)}-{options.get('dtype', 'float32')}") if weights else output
    records = [export_onnx(float_out, replace=replace, progress=progress, module=module, **options, **export)]
    if weights:
        records.append(quantize(float_out, output, weights=weights, replace=replace, progress=progress))
    return records


def adopt(file: str | Path, output: str | Path | None = None, *, model: str | LoadedModel | None = None,
          config: str | None = None, hf: str | Path | None = None, checkpoint: str | Path | None = None,
          revision: str | None = None, allow_download: bool = False, replace: bool = False,
          junit: str | Path | None = None) -> ExportRecord:
    """``mhaexport verify FILE.onnx --hf DIR`` (or ``--model`` / ``--config``), its first half: adopt an ONNX
    decoder another tool exported (onnxruntime-genai's model builder, Optimum, a plain torch.onnx.export) as the ONNX
    artifact of the model it claims to be, in folder ``output`` (default: FILE's folder/mhaexport) — links to the
    file, its layout and hashes in the manifest. ``junit``: the JUnit file the verify after it will write, checked
    here before any work. :func:`verify` (``verify(record.folder, model=..., output=record.folder)``) then drives it
    in its producer's cache and padding protocol; generate and bench run on that folder. Returns the ExportRecord
    (``record.manifest.artifacts["onnx"].details``: the producer and protocol found). Raises ConfigError (no model
    named, not a file), ArtifactError (a file that does not map onto the contract or is not that model's)."""
    from mhaexport.exporter.adopt import adopt_onnx

    named = model is not None or config is not None or hf is not None or checkpoint is not None
    out = _adoption_folder(file, output, named, junit)
    loaded = _model(model, config, hf, checkpoint, revision, allow_download)
    return adopt_onnx(loaded, Path(file), out, replace=replace)


def _adoption_folder(file: str | Path, output: str | Path | None, named: bool, junit: str | Path | None) -> Path:
    """:func:`adopt`'s checks before any work (a regular file, a model ``named``, the outputs): the folder it is
    adopted into (``output``, default FILE's folder/mhaexport)."""
    from mhaexport.exporter.adopt import default_folder
    from mhaexport.outputs import check_outputs

    path = Path(file)
    if not path.is_file():
        raise ConfigError(f"{file}: not a regular file (an ONNX file FILE.onnx to adopt)")
    if not named:
        raise ConfigError(f"{file} is a file: say which model it claims to be with --hf DIR, --model SPEC or --config "
                          "NAME (verify compares it with that model in eager PyTorch)")
    out = Path(output) if output is not None else default_folder(path)
    check_outputs({"--junit": junit}, reading=[path.parent], writing=[out], reports=out)
    writable_output(out, "" if output is not None else " (give -o DIR to adopt the file elsewhere)")
    return out


def lint(path: str | Path) -> Any:
    """``mhaexport lint PATH``: static findings on a decoder's ONNX graph (a FILE.onnx, ours or another tool's, or
    an export folder), each with its severity, node and a one-line fix. Returns the
    :class:`~mhaexport.verify.lint.LintReport` (``.errors``; :func:`lint_verdict`: its verdict)."""
    from mhaexport.verify.lint import lint_path

    return lint_path(path)


def lint_verdict(report: Any) -> tuple[int, str]:
    """A lint report's verdict as (code, message): 1 when a finding is an error, else 0 (``mhaexport.core.errors.
    raise_for_verdict`` turns it into the exit)."""
    if not report.errors:
        return 0, "no error"
    return 1, (f"lint found {len(report.errors)} error(s): "
               + "; ".join(f"{f.rule} at {f.node}" for f in report.errors[:3]))


def eval_verdict(report: Any) -> tuple[int, str]:
    """An eval report's verdict as (code, message): 1 when a runtime failed, 4 when one asked for could not run
    here, else 0."""
    failed = [r for r in report.rows if r.status == "error"]
    if failed:
        return 1, "; ".join(f"{r.runtime}: {r.reason}" for r in failed)
    missing = [r for r in report.rows if r.status == "skipped"]
    if missing:
        return 4, "; ".join(f"{r.runtime} skipped ({r.reason})" for r in missing)
    return 0, "every runtime ran"


def merge_reports(reports: Sequence[str | Path], output: str | Path, *, names: Sequence[str] | None = None,
                  junit: str | Path | None = None) -> VerifyReport:
    """``mhaexport report merge``: merge report.json files (or folders holding one) from different machines into
    one table, written as report.json / .md / .html into folder ``output`` (never over one of the inputs).
    ``names``: a label per report, in order (default: each report's host). Returns the merged report: its verdict
    follows verify's rules (``bool(report)``: passed)."""
    from mhaexport.outputs import check_reports_out
    from mhaexport.verify.report import load_report, merge_reports as merge_loaded_reports

    reports = _names(reports, "reports", paths=True) or ()
    names = _names(names, "names")
    if names and len(names) != len(reports):
        raise ConfigError(f"names: {len(names)} given for {len(reports)} reports",
                          cli=f"--name given {len(names)} times for {len(reports)} reports")
    check_reports_out(output, reports, ("report.json", "report.md", "report.html"))
    writable_output(output)
    merged = merge_loaded_reports([load_report(p) for p in reports], list(names) if names else None)
    write_reports(merged, output, junit, name="report")
    return merged


class AllRun:
    """What ``mhaexport.all`` did: ``records`` (the exports and quantization, in order), ``report`` (verify's
    :class:`~mhaexport.verify.report.VerifyReport`), ``written`` (the report files and JUnit file). Truthy only
    when the verdict passed."""

    def __init__(self, records: list, report: VerifyReport, written: list[Path]) -> None:
        self.records, self.report, self.written = records, report, written

    def __bool__(self) -> bool:
        return bool(self.report)

    def __repr__(self) -> str:
        return f"AllRun({self.report.verdict.message!r}, {len(self.records)} record(s))"


def all(output: str | Path = "artifacts/default", *, model: str | LoadedModel | None = None,
        config: str | None = None, hf: str | Path | None = None, checkpoint: str | Path | None = None,
        revision: str | None = None, allow_download: bool = False, runtimes: Sequence[str] | None = None,
        sweep: str = "quick", seed: int = 0, atol: float | dict | None = None, rtol: float | dict | None = None,
        tokens: int | None = None, quality: Any = None, opset: int | None = None, attention: str | None = None,
        dtype: str | None = None, target: str | None = None, pt2: bool = False, aoti: bool = False,
        replace: bool = False, junit: str | Path | None = None, progress: Progress | None = None,
        memory: str | int | None = None, mapped: bool = False) -> AllRun:
    """``mhaexport all``, the main job: export ONNX and TorchScript into folder ``output``, verify both against
    eager PyTorch, write report.json / .md / .html there (and ``junit``). ``target`` (portable, ort-cpu, ort-cuda):
    the ONNX file for that runtime (``attention``/``dtype`` given too must agree; ort-cpu's float source goes to
    ``OUTPUT-float32``); ``pt2`` / ``aoti``: also export with torch.export (and AOTInductor) and verify those.
    Each stage is said through ``progress`` as a :class:`mhaexport.core.progress.Stage` (``[k/n]`` on the command line).
    Everything is checked before any work. Returns an :class:`AllRun` (truthy only when the verdict passed;
    ``.report``, ``.records``, ``.written``). ``memory`` / ``mapped``: verify's memory cap and mode (:func:`verify`;
    the model exported is in memory already, so only ONNX Runtime's weights can be mapped). Raises ConfigError /
    ModelLoadError / ExportError / ArtifactError."""
    from mhaexport.outputs import check_outputs
    from mhaexport.core.progress import Stage

    say = _say(progress)
    kv_cache, weights = None, None
    if target is not None:
        attention, kv_cache, dtype, weights = target_options(target, _given(attention=attention, dtype=dtype))
    attention, dtype = attention or "decomposed", dtype or "float32"
    if junit is not None:
        check_junit(junit)
    if memory is not None:
        from mhaexport.verify.memory import parse_size

        parse_size(memory)
    check_outputs({"--junit": junit}, writing=[output], reports=output)
    writable_output(output)  # every stage writes there: checked before the model loads
    stages = ["load", "export ONNX", *(["quantize ONNX"] if weights else []), "export TorchScript",
              *(["export pt2"] if pt2 or aoti else []), "verify"]
    done = [0]

    def stage(message: str) -> None:
        done[0] += 1
        say(Stage(message, done[0], len(stages)))

    named = model if isinstance(model, str) else None
    stage(f"load {named or config or (f'--hf {hf}' if hf else None) or 'the default model'}")
    loaded = _model(model, config, hf, checkpoint, revision, allow_download, progress)
    onnx_out = Path(f"{Path(output)}-{dtype}") if weights else output
    cache = "" if kv_cache in (None, "concat") else f", {kv_cache} KV cache"
    stage(f"export ONNX (opset {opset or (23 if attention == 'onnx' else 18)}, dynamic axes, attention {attention}, "
          f"{dtype}{cache}) -> {onnx_out}")
    records: list = [export_onnx(onnx_out, model=loaded, opset=opset, attention=attention, dtype=dtype,
                                 kv_cache=kv_cache or "concat", replace=replace, progress=progress, announce=False)]
    if weights:
        stage(f"quantize ONNX ({weights}) -> {output}")
        records.append(quantize(onnx_out, output, weights=weights, replace=replace))
    stage(f"export TorchScript (trace) -> {output}")
    records.append(export_torchscript(output, model=loaded, replace=replace))
    if pt2 or aoti:  # this process's own export: verify loads it without trust_code (artifact/trust.py)
        stage(f"export torch.export{' + AOTInductor (CPU)' if aoti else ''} -> {output}")
        records.extend(export_pt2(output, model=loaded, aoti=aoti, replace=replace))
    stage(f"verify {output} ({sweep} sweep)")
    report = verify(output, model=loaded, runtimes=runtimes, sweep=sweep, seed=seed, atol=atol, rtol=rtol,
                    tokens=tokens, quality=quality, progress=progress, memory=memory, mapped=mapped)
    from mhaexport.verify.render import markdown

    written = write_reports(report, output, junit, name="report", markdown=markdown(report))
    return AllRun(records, report, written)
