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
    from mhaexport.verify.report import VerifyReport

Progress = Callable[[str], None]

__all__ = ["bench", "export_onnx", "export_pt2", "export_torchscript", "generate", "load", "quantize", "verify"]


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
    is. Raises ConfigError or ModelLoadError."""
    from mhaexport.models.loading import LoadedModel, load_model

    if isinstance(model, LoadedModel):
        if config is not None or hf is not None or checkpoint is not None:
            from mhaexport.errors import ConfigError

            raise ConfigError("a loaded model was given: config, hf and checkpoint do not apply")
        return model
    return load_model(config=config, model=model, checkpoint=checkpoint, hf=hf, revision=revision,
                      allow_download=allow_download)


def _model(model, config, hf, checkpoint, revision, allow_download) -> LoadedModel:
    return load(model=model, config=config, hf=hf, checkpoint=checkpoint, revision=revision,
                allow_download=allow_download)


def export_onnx(output: str | Path, *, model: str | LoadedModel | None = None, config: str | None = None,
                hf: str | Path | None = None, checkpoint: str | Path | None = None, revision: str | None = None,
                allow_download: bool = False, opset: int | None = None, attention: str = "decomposed",
                dtype: str = "float32", kv_cache: str = "concat", max_cache: int | None = None,
                seq_dynamic: bool = True, seq_len: int | None = None, past_len: int = 0,
                replace: bool = False) -> ExportRecord:
    """``mhaexport onnx``: export the model to ONNX into folder ``output`` (model.onnx + manifest.json; other
    artifacts already there stay). ``replace``: ``output`` may hold another model (or the attention block where a
    decoder goes): it is replaced, its files and reports removed — without it that is an ExportError before any
    work. Returns the ExportRecord (folder, files, seconds, warnings, manifest). Raises ConfigError /
    ModelLoadError / ExportError / ArtifactError."""
    from mhaexport.artifact.files import probe_writable
    from mhaexport.exporter.onnx import export_onnx as _export

    probe_writable(output)
    loaded = _model(model, config, hf, checkpoint, revision, allow_download)
    with _replacing(output, loaded, replace):
        return _export(loaded, output, opset=opset, seq_dynamic=seq_dynamic, seq_len=seq_len, past_len=past_len,
                       attention=attention, dtype=dtype, kv_cache=kv_cache, max_cache=max_cache)


@contextlib.contextmanager
def _replacing(output: str | Path, loaded: Any, replace: bool) -> Iterator[None]:
    """An export into ``output``: refused before any work when it holds another model unless ``replace`` (then
    what that model left goes once the new export is published). ``loaded``: a LoadedModel, or a quantize source's
    recorded model."""
    from mhaexport.exporter.common import check_replace, drop_replaced

    prev = check_replace(output, loaded, replace) if loaded is not None else None
    yield
    drop_replaced(output, prev)


def export_torchscript(output: str | Path, *, model: str | LoadedModel | None = None, config: str | None = None,
                       hf: str | Path | None = None, checkpoint: str | Path | None = None,
                       revision: str | None = None, allow_download: bool = False,
                       mode: str = "trace", replace: bool = False) -> ExportRecord:
    """``mhaexport torchscript``: export the model to TorchScript (``mode`` trace or script) into ``output``
    (``replace`` as :func:`export_onnx`). Returns the ExportRecord."""
    from mhaexport.artifact.files import probe_writable
    from mhaexport.exporter.torchscript import export_torchscript as _export

    probe_writable(output)
    loaded = _model(model, config, hf, checkpoint, revision, allow_download)
    with _replacing(output, loaded, replace):
        return _export(loaded, output, mode=mode)


def export_pt2(output: str | Path, *, model: str | LoadedModel | None = None, config: str | None = None,
               hf: str | Path | None = None, checkpoint: str | Path | None = None, revision: str | None = None,
               allow_download: bool = False, aoti: bool = False, replace: bool = False,
               progress: Progress | None = None) -> list[ExportRecord]:
    """``mhaexport pt2``: export the model with torch.export into ``output`` (model.pt2) and, with ``aoti``,
    compile it with AOTInductor for CPU (model.aoti.pt2). Returns the ExportRecords, pt2 first. Both files are code:
    ``verify``/``bench`` of the folder load them only with ``trust_code=True`` (or in this same process). Raises
    ExportError in one line for a model torch.export cannot take. ``replace`` as :func:`export_onnx`."""
    from mhaexport.artifact.files import probe_writable
    from mhaexport.exporter.pt2 import export_pt2 as _export

    probe_writable(output)
    loaded = _model(model, config, hf, checkpoint, revision, allow_download)
    with _replacing(output, loaded, replace):
        return _export(loaded, output, aoti=aoti, progress=progress)


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
             providers: Sequence[str] = ("cpu",), threads: int | None = None) -> GenerationResult:
    """``mhaexport generate``: prefill and KV-cache decode with ONNX Runtime (no torch). ``prompts`` are encoded
    with the folder's tokenizer.json (an --hf export) or as UTF-8 bytes (byte-level models); ``prompt_ids`` are
    token ids; a batch is left-padded. Returns the GenerationResult (``tokens`` per prompt, ``stop_reason``,
    ``message``, timings, ``providers``) with ``texts``: the decoded continuation per text prompt (None without a
    tokenizer). Raises ConfigError for a bad argument (RuntimeOptionError: no prompt, text for a model without a
    tokenizer, a sampling setting out of range), RuntimeInputError for ids the model cannot take, ArtifactError,
    ProviderUnavailable."""
    from mhaexport.runtime import GenerationConfig, Generator, SamplingConfig
    from mhaexport.runtime.tokenizer import for_folder

    prompts = _names(prompts, "prompts")
    prompt_ids = _prompt_ids(prompt_ids)
    providers = _names(providers, "providers")
    _count(eos_id, "eos_id", 0)
    _count(threads, "threads")
    _count(seed, "seed", 0, optional=False)
    if not prompts and not prompt_ids:
        raise RuntimeOptionError("give prompts (text) or prompt_ids")
    gen = Generator(folder, providers=tuple(providers), threads=threads)
    tok = for_folder(gen.export)
    if prompts and tok is None:
        raise RuntimeOptionError(f"text prompts are encoded as bytes (ids 0..255) but this model's vocab_size is "
                                 f"{gen.contract.vocab_size} and the folder carries no tokenizer.json; use prompt_ids")
    rows = [tok.encode(p) for p in prompts] + [list(r) for r in prompt_ids]
    if eos_id is None and tok is not None:
        eos_id = tok.eos_token_id
    cfg = GenerationConfig(max_new_tokens=max_new_tokens, eos_token_id=eos_id,
                           sampling=SamplingConfig(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed))
    result = gen.generate(rows, cfg)
    result.texts = [tok.continuation(r, t) for r, t in zip(rows, result.tokens)] if tok is not None else None
    result.warnings = list(gen.warnings)
    return result


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
          **config: Any) -> BenchResult:
    """``mhaexport bench``: time the KV-cache decode loop of an export folder on each runtime. ``config``: fields
    of :class:`mhaexport.bench.BenchConfig` (prompt_len, new_tokens, batch, threads, runtimes, repeats, long_to,
    ...; ``batches=[1, 4, 16]`` / ``prompts=[32, 512, 2048]``, or the CLI's "1,4,16": how cost grows;
    ``targets=True``: the project's speed targets; the default runtimes leave out eager-nocache). ``output``:
    also write bench.json / bench.md / bench.png (bench-scaling.png) there. ``long`` is the CLI's ``--long``
    (BenchConfig's ``long_to``; ``long_to=`` still works, deprecated). Returns the BenchResult (``.get(name)``:
    a row; ``.scaling``: how cost grows; ``mhaexport.bench.markdown_body(result)``: bench.md's tables)."""
    from mhaexport import bench as _bench

    if "long_to" in config:  # the CLI's --long; long_to is its deprecated alias
        config["long"] = _renamed("long", config.get("long"), "long_to", config.pop("long_to"))
    if "long" in config:
        config["long_to"] = config.pop("long")
    for key in ("runtimes", "opt_levels", "compare"):  # a bare string is one name (one folder)
        if key in config:
            names = _names(config[key], key, paths=key == "compare")
            config[key] = names if names is not None or key == "runtimes" else ()
    for key in ("batches", "prompts"):  # ConfigError in one line for anything but positive integers
        if key in config:
            config[key] = _bench.parse_points(config[key], key)
    cfg = _bench.BenchConfig(**config)
    _bench.check_config(cfg)
    result = _bench.run_bench(folder, cfg, progress=progress)
    if output is not None:
        _bench.write_bench(result, output)
    return result


def quantize(folder: str | Path, output: str | Path, *, weights: str = "int4", block_size: int | None = None,
             symmetric: bool = True, accuracy_level: int = 4, keep_float: Sequence[str] = ("embeddings",),
             int8_blocks: int | None = None, replace: bool = False,
             progress: Progress | None = None) -> QuantizeRecord:
    """``mhaexport quantize``: the weights of ``folder``'s float ONNX export to int4/int8 into a new folder
    ``output`` (then ``verify(output)`` judges its quality against eager fp32; ``replace`` as :func:`export_onnx`).
    Returns the QuantizeRecord."""
    from mhaexport.artifact.files import probe_writable
    from mhaexport.exporter.common import previous_model
    from mhaexport.exporter.quantize import QuantConfig, quantize_folder

    cfg = QuantConfig(weights=weights, block_size=block_size, symmetric=symmetric, accuracy_level=accuracy_level,
                      keep_float=_names(keep_float, "keep_float") or (), int8_blocks=int8_blocks).check()
    probe_writable(output)
    with _replacing(output, previous_model(folder), replace):
        return quantize_folder(folder, output, cfg, progress=progress)
