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
(:mod:`mhaexport.errors`, all :class:`~mhaexport.errors.MhaExportError`) for bad input; a failed verification is a
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
  prompt) raises :class:`~mhaexport.errors.ConfigError` -- some as a subclass that also keeps the stage class it
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

import contextlib
import numbers
import os
import warnings
from functools import partial
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mhaexport.errors import ConfigError, MhaExportError, RuntimeOptionError

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

__all__ = ["bench", "bisect_folder", "evaluate", "export_onnx", "export_pt2", "export_torchscript", "generate", "load",
           "quantize", "verify"]


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
    from mhaexport.verify.compare import OUTPUT_KINDS

    per = value if isinstance(value, dict) else {None: value}
    for key, x in per.items():
        if key is not None and key not in OUTPUT_KINDS:
            raise ConfigError(f"{arg}: output {key!r} is not one of {', '.join(OUTPUT_KINDS)}")
        if x is not None and (isinstance(x, bool) or not isinstance(x, numbers.Real) or not x >= 0):
            raise ConfigError(f"{arg}: {x!r} is not a tolerance (a number >= 0)")


def load(*, model: str | LoadedModel | None = None, config: str | None = None, hf: str | Path | None = None,
         checkpoint: str | Path | None = None, revision: str | None = None,
         allow_download: bool = False) -> LoadedModel:
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
                      allow_download=allow_download)


def _model(model, config, hf, checkpoint, revision, allow_download, progress: Progress | None = None) -> LoadedModel:
    """:func:`load`; a model loaded here says its notes through ``progress`` (as :class:`mhaexport.progress.Note`)."""
    from mhaexport.models.loading import LoadedModel
    from mhaexport.progress import Note

    given = isinstance(model, LoadedModel)
    loaded = load(model=model, config=config, hf=hf, checkpoint=checkpoint, revision=revision,
                  allow_download=allow_download)
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
    from mhaexport.errors import ArtifactError

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
    from mhaexport.errors import ExportOptionError

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
                progress: Progress | None = None) -> ExportRecord:
    """``mhaexport onnx``: export the model to ONNX into folder ``output`` (model.onnx + manifest.json; other
    artifacts already there stay). ``module="attention"``: the built-in attention block of ``config`` on its own
    (``mask`` "causal" or "none"; dynamic axes, decomposed attention, float32). ``replace``: ``output`` may hold
    another model (or the attention block where a decoder goes): it is replaced, its files and reports removed
    (``record.replaced`` says what went) — without it that is an ExportError before any work. Returns the
    ExportRecord (folder, files, seconds, warnings, manifest, replaced; ``.to_dict()``: what ``--json`` prints).
    Raises ConfigError / ModelLoadError / ExportError / ArtifactError."""
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
    loaded = _model(model, config, hf, checkpoint, revision, allow_download, progress)
    with _replacing(output, loaded, replace) as done:
        axes = "dynamic axes" if seq_dynamic else f"static seq={seq_len} past={past_len}"
        cache = {"concat": "", "window": ", window-sized KV cache (GroupQueryAttention)"}.get(
            kv_cache, ", shared KV cache (GroupQueryAttention)")
        say(f"Exporting {loaded.spec} to ONNX (opset {shown}, {axes}, attention {attention}, {dtype}{cache}) ...")
        return done(_export(loaded, output, opset=opset, seq_dynamic=seq_dynamic, seq_len=seq_len,
                            past_len=past_len, attention=attention, dtype=dtype, kv_cache=kv_cache,
                            max_cache=max_cache))


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
           allow_download: bool = False) -> VerifyReport:
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
    loaded = None
    if model is not None or config is not None or hf is not None or checkpoint is not None:
        loaded = _model(model, config, hf, checkpoint, revision, allow_download)
    from mhaexport.exporter.quantize import reproduce

    from mhaexport.verify.junit import write_junit
    from mhaexport.verify.render import write_report

    try:
        report = verify_folder(folder, loaded=loaded, sweep=sweep, seed=seed, atol=atol, rtol=rtol,
                               runtimes=tuple(runtimes) if runtimes else None, gen_tokens=gen_tokens,
                               quality=quality, reproduce=reproduce, trust_code=trust_code, progress=progress)
    except MhaExportError as e:  # a refused folder: its report (verdict "refused") where asked, then the error
        if output is not None or junit is not None:
            from mhaexport.verify.report import refused_report

            refused = refused_report(folder, str(e), requested=list(runtimes) if runtimes else None, sweep=sweep,
                                     seed=seed)
            if output is not None and Path(output).resolve() != Path(folder).resolve():
                write_report(refused, output, "report")
            if junit is not None:
                write_junit(refused, junit)
        raise
    if output is not None:
        write_report(report, output, "report")
    if junit is not None:
        write_junit(report, junit)
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
    result.texts = [tok.continuation(r, t) for r, t in zip(rows, result.tokens)] if tok is not None else None
    result.warnings = list(gen.warnings)
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

    runtimes = _names(runtimes, "runtimes") or ("ort-cpu",)
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
        ok = all(isinstance(v, numbers.Integral) and not isinstance(v, bool) for v in row)
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
          builder: str | Sequence[str] | None = None, **config: Any) -> BenchResult:
    """``mhaexport bench``: time the KV-cache decode loop of an export folder on each runtime. ``config``: fields
    of :class:`mhaexport.bench.BenchConfig` (prompt_len, new_tokens, batch, threads, runtimes, repeats, long, ...;
    ``runtimes=["all"]``: every runtime, pt2/aoti with ``trust_code``; ``batches=[1, 4, 16]`` /
    ``prompts=[32, 512, 2048]``, or the CLI's "1,4,16": how cost grows; ``targets=True``: the project's speed
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
        config["long"] = _renamed("long", config.get("long"), "long_to", config.pop("long_to"))
    if "long" in config:
        config["long_to"] = config.pop("long")
    for key in ("runtimes", "opt_levels", "compare"):  # a bare string is one name (one folder)
        if key in config:
            names = _names(config[key], key, paths=key == "compare")
            config[key] = names if names is not None or key == "runtimes" else ()
    for key in ("batches", "prompts"):  # "1,4,16" or [1, 4, 16]: ConfigError in one line naming the point
        if key in config:
            config[key] = _bench.parse_points(config[key], key)
    if config.get("runtimes") == ("all",):  # every runtime; the code runtimes (pt2, aoti) only on trust
        config["runtimes"] = tuple(r for r in _bench.ALL_RUNTIMES if config.get("trust_code") or r not in (PT2, AOTI))
    cfg = _bench.BenchConfig(**config)  # checked when made: the one check of the request
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
    with OpenFolders() as reads:
        ef = reads.open(folder)
        if precisions:
            from mhaexport.exporter.peer import hf_source

            hf_source(ef)  # an --hf folder, its Hugging Face folder still there: else one line, before any work
        for step, todo in ((_lowerings, wanted), (_quantized, schemes), (_builder, precisions)):
            if todo:
                found = step(ef, todo, out_dir, cfg, progress, reads)
                cfg = dataclasses.replace(cfg, compare=cfg.compare + tuple(str(f) for f in found))
        result = _bench.run_bench(ef, cfg, progress=progress, reads=reads)
    if output is not None:
        result.written = _bench.write_bench(result, output)
    return result


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
