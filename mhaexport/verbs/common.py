"""What every verb of the Python API shares: its argument checks (the CLI's option types, in Python), the model
it works on, and the output folder it writes (checked before any work; replaced only when asked)."""

from __future__ import annotations

import contextlib
import numbers
import os
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mhaexport.core.errors import ConfigError

if TYPE_CHECKING:  # pragma: no cover
    from mhaexport.models.loading import LoadedModel

Progress = Callable[[str], None]


def _budgeted(f: Callable) -> Callable:
    """A verb that runs ONNX Runtime takes ``timeout``: each of its ONNX Runtime / onnxruntime-genai calls is stopped
    past that many seconds and reported (``mhaexport.runtime.budget``; None: 600 s plus a minute per GB of weights,
    from verify's plan; 0: no limit) — the CLI's ``--timeout``."""
    import functools
    import inspect

    @functools.wraps(f)
    def run(*args: Any, timeout: float | None = None, **kwargs: Any) -> Any:
        if timeout is None:
            return f(*args, **kwargs)
        if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real) or not 0 <= timeout < float("inf"):
            raise ConfigError(f"timeout={timeout!r}: expected seconds >= 0 (0: no limit)")
        from mhaexport.runtime import budget

        saved = budget.state()
        budget.set_budget(None if timeout == 0 else float(timeout))
        try:
            return f(*args, **kwargs)
        finally:
            budget.set_budget(*saved)

    sig = inspect.signature(f)
    extra = inspect.Parameter("timeout", inspect.Parameter.KEYWORD_ONLY, default=None)
    params = list(sig.parameters.values())
    at = next((i for i, p in enumerate(params) if p.kind is inspect.Parameter.VAR_KEYWORD), len(params))
    run.__signature__ = sig.replace(parameters=params[:at] + [extra] + params[at:])  # type: ignore[attr-defined]
    return run


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
         allow_download: bool = False, streamed: bool = False, keep_half: bool = False,
         ready: Callable[[], None] | None = None) -> LoadedModel:
    """The model a command works on, checked against the decoder contract (``--model`` / ``--config`` / ``--hf`` /
    ``--checkpoint`` / ``--revision`` / ``--allow-download``). A LoadedModel given as ``model`` is returned as it
    is. Raises ConfigError or ModelLoadError. ``.notes``: what the loading had to decide (a context length the
    config left out, say). ``streamed`` / ``keep_half``: :func:`mhaexport.models.loading.load_model`'s. ``ready``:
    called once the source is checked, before the weights are read."""
    from mhaexport.models.loading import LoadedModel, load_model

    if isinstance(model, LoadedModel):
        if config is not None or hf is not None or checkpoint is not None:
            raise ConfigError("a loaded model was given: config, hf and checkpoint do not apply")
        return model
    return load_model(config=config, model=model, checkpoint=checkpoint, hf=hf, revision=revision,
                      allow_download=allow_download, streamed=streamed, keep_half=keep_half, ready=ready)


def _keep_half_for(hf: str | Path | None, mapped: bool, memory: str | None) -> bool:
    """Whether verify stages an ``--hf`` folder's half-precision weights as they are (eager's float32 reference
    computed one module at a time, ~1.6 x slower) rather than converted to float32: where memory is what is short —
    ``--mapped``, ``--memory``, or a local folder whose weights in float32 (twice its safetensors' bytes) would not
    fit the machine's memory (then verify maps them anyway, and a float32 staging file only doubles the disk and the
    pages to read: an 8 B bfloat16 folder's 32 GB instead of 16)."""
    if hf is None:
        return False
    if mapped or memory is not None:
        return True
    folder = Path(hf)
    if not folder.is_dir():
        return False  # a Hub id: its size is not read here
    from mhaexport.verify.memory import machine_memory

    have, _ = machine_memory()
    try:
        weights = sum(p.stat().st_size for p in folder.glob("*.safetensors") if p.is_file())
    except OSError:
        return False
    return have is not None and 2 * weights > have


def _model(model, config, hf, checkpoint, revision, allow_download, progress: Progress | None = None, *,
           streamed: bool = False, keep_half: bool = False, loading: str | None = None) -> LoadedModel:
    """:func:`load`; a model loaded here says its notes through ``progress`` (as :class:`mhaexport.core.progress.Note`),
    and ``loading`` (a "Loading ..." line) once its source is checked — an error in the source is the only line."""
    from mhaexport.models.loading import LoadedModel
    from mhaexport.core.progress import Note

    given = isinstance(model, LoadedModel)
    ready = (lambda: progress(loading)) if progress is not None and loading and not given else None
    loaded = load(model=model, config=config, hf=hf, checkpoint=checkpoint, revision=revision,
                  allow_download=allow_download, streamed=streamed, keep_half=keep_half, ready=ready)
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
