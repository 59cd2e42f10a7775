"""The verbs that run a folder's file on text: ``mhaexport generate`` (ONNX Runtime, no torch) and ``mhaexport eval``
(perplexity per runtime, with its verdict)."""

from __future__ import annotations

import builtins
import numbers
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mhaexport.core.errors import ConfigError, RuntimeOptionError
from mhaexport.verbs.common import Progress, _budgeted, _count, _names

if TYPE_CHECKING:  # pragma: no cover
    from mhaexport.evaluate.perplexity import EvalReport
    from mhaexport.runtime.decode import GenerationResult


@_budgeted
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


@_budgeted
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
