"""torch.onnx's trace kept across processes: the graph torch.onnx made of a model's code, before its optimizer ran,
stored without weights in this user's cache and reused by a later export of any model of the same code, config and
shapes — a model whose layers are all alike is traced at :data:`~mhaexport.exporter.replicate.TRACED_LAYERS`
layers, so every depth of one architecture and width shares one trace.

Why a trace can be reused for other weights: torch.export lifts every parameter and buffer to an input of the
program it traces (fake tensors: no value is read, a forward that branches on one is refused), so the graph before
the optimizer depends on the code, the config's Python values and the tensors' shapes and dtypes — the key — never
on the weights. What does depend on them, the optimizer's folding (Transposes into weights) and deduplication
(equal initializers merged), runs on every export with the model's own weights (:func:`optimize`, the optimizer
torch.onnx runs), so a stored trace gives the graph a fresh one gives (tests/test_replicate.py holds them equal).

The key (:func:`trace_key`): the model's class and config (a transformers config's every field but its layer count
and name; the built-in decoder's config but its seed), its parameters' names, shapes and dtypes, the export's
dtype, opset, axes and example sizes, the layers traced, and the versions of torch, transformers, onnxscript,
onnx_ir, mhaexport and the source of mhaexport's models. Only the built-in decoder and the ``--hf`` adapter are
stored (a ``--model`` factory's code is not the package's to key). A stored trace is a graph (``.onnx``, its
initializers named, their data absent) and a record (``.json``: the warnings the trace gave), stamped with an HMAC
under this user's key (:func:`mhaexport.artifact.cache.cache_key`) and read only from a private cache, as the
optimized-graph cache is; anything else is traced anew.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import tempfile
from pathlib import Path

import onnx_ir as ir
import torch
from torch import nn

from mhaexport.artifact.cache import cache_root, usable, cache_key
from mhaexport.core.untrusted import load_json
from mhaexport.core.version import __version__

STORE = "traces"


def _sources_digest() -> str:
    """sha256 of mhaexport's model code (models/*.py): what the traced forward runs besides the libraries."""
    h = hashlib.sha256()
    folder = Path(__file__).resolve().parent.parent / "models"
    for path in sorted(folder.glob("*.py")):
        h.update(path.name.encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


# the packages whose module classes a stored trace may run: their code is keyed (versions, mhaexport's models' source)
KEYED_CODE = ("torch.", "transformers.", "mhaexport.models.")


def _config_of(module: nn.Module) -> dict | None:
    """What decides the traced code and its Python values: the ``--hf`` adapter's transformers config (and its
    contract config), the built-in decoder's config, and the module tree's printout (each module's class and sizes);
    None for any other model, or one holding a module class of code the key does not cover (a subclass in a user's
    file): not stored."""
    from mhaexport.models.decoder import DecoderLM
    from mhaexport.models.hf import HFCausalLM

    if type(module) not in (HFCausalLM, DecoderLM) or \
            any(not type(m).__module__.startswith(KEYED_CODE) for m in module.modules()):
        return None
    if isinstance(module, HFCausalLM):
        cfg = module.hf.config.to_dict()
        for k in ("_name_or_path", "num_hidden_layers", "transformers_version", "architectures"):
            cfg.pop(k, None)
        contract = {k: v for k, v in vars(module.config).items() if k not in ("notes", "n_layers", "layer_windows")}
        return {"class": type(module.hf).__qualname__, "tree": repr(module), "hf": cfg, "contract": contract,
                "windows": sorted(set(module.config.layer_windows or [0])),
                "plan": repr(module._window_plan), "cache_kw": module._cache_kw}
    if isinstance(module, DecoderLM):
        cfg = module.config.to_dict()
        cfg.pop("seed", None)
        cfg.pop("n_layers", None)
        return {"class": "DecoderLM", "tree": repr(module), "config": cfg}


def trace_key(module: nn.Module, layers: int, options: tuple) -> str | None:
    """The store's key of ``module``'s trace (its first ``layers`` layers when cut, see the module docstring) under
    ``options`` (dtype, opset, dynamic axes, example sizes), or None where the model is not one the store keeps."""
    cfg = _config_of(module)
    if cfg is None:
        return None
    import onnxscript

    try:
        import transformers

        tv = transformers.__version__
    except ImportError:
        tv = None
    params = [(n, list(t.shape), str(t.dtype)) for n, t in _tensors(module).items()]
    what = {"model": cfg, "params": params, "layers": layers, "options": [str(o) for o in options],
            "versions": {"mhaexport": __version__, "torch": torch.__version__, "transformers": tv,
                         "onnxscript": onnxscript.__version__, "onnx_ir": ir.__version__},
            "sources": _sources_digest()}
    return hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()


def _paths(root: Path, key: str) -> tuple[Path, Path, Path]:
    base = root / STORE / key
    return base.with_suffix(".onnx"), base.with_suffix(".json"), base.with_suffix(".sha256")


def _stamp(key: str, graph: Path, record: Path, secret: bytes) -> str:
    what = f"{key} {_sha256(graph)} {_sha256(record)}"
    return hmac.new(secret, what.encode(), hashlib.sha256).hexdigest()


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _store_root() -> tuple[Path, bytes] | None:
    """(this user's cache, its key) where the store may be read and written, else None."""
    try:
        root = cache_root()
        (root / STORE).mkdir(parents=True, exist_ok=True, mode=0o700)
        if not usable(root, [root / STORE]):
            return None
        return root, cache_key(root)
    except (OSError, Exception):  # noqa: BLE001 - an unusable cache: the model is traced, nothing is stored
        return None


def load(key: str, module: nn.Module) -> tuple[ir.Model, list[str]] | None:
    """The stored trace of ``key`` with ``module``'s own parameters and buffers as its initializers (by name), and
    the warnings its tracing gave; None when there is none, or one not stamped by this user, or not ``module``'s."""
    where = _store_root()
    if where is None:
        return None
    root, secret = where
    graph, record, stamp = _paths(root, key)
    if not (graph.is_file() and record.is_file() and stamp.is_file()) or \
            not usable(root, [graph, record, stamp]):
        return None
    if not hmac.compare_digest(stamp.read_text().strip(), _stamp(key, graph, record, secret)):
        return None
    try:
        meta = load_json(record, "a stored trace's record")
        model = ir.load(graph)
    except Exception:  # noqa: BLE001 - unreadable: traced anew
        return None
    tensors = _tensors(module)
    for name, value in model.graph.initializers.items():
        source = meta["initializers"].get(name)
        t = tensors.get(source) if source is not None else None
        if t is None or list(t.shape) != list(value.shape) or value.const_value is None:
            return None
        value.const_value = _tensor(t, name)
    return model, list(meta.get("warnings", []))


def _tensor(t: torch.Tensor, name: str) -> ir.Tensor:
    """``t``'s bytes as an initializer (no copy), as torch.onnx gives a parameter: its own tensor class where this
    torch has it, else a numpy view."""
    try:
        from torch.onnx._internal.exporter._core import TorchTensor
    except ImportError:  # another torch: the same bytes through numpy
        return ir.Tensor(t.detach().numpy(), name=name)
    return TorchTensor(t.detach(), name=name)


def save(key: str, model: ir.Model, module: nn.Module, warnings: list[str]) -> None:
    """Store ``model`` (a trace before the optimizer, its initializers ``module``'s tensors) under ``key``: the graph
    with each initializer's data left out, and which tensor of ``module`` each initializer is. Nothing is stored
    where an initializer is no tensor of ``module`` or the cache is not this user's private one."""
    where = _store_root()
    if where is None:
        return
    root, secret = where
    by_address = {}
    for name, t in _tensors(module).items():
        if t.numel():
            by_address.setdefault((t.data_ptr(), tuple(t.shape), str(t.dtype)), name)
    sources = {}
    for name, value in model.graph.initializers.items():
        raw = getattr(value.const_value, "raw", None)
        if not isinstance(raw, torch.Tensor) or not raw.numel():
            return
        src = by_address.get((raw.data_ptr(), tuple(raw.shape), str(raw.dtype)))
        if src is None:
            return
        sources[name] = src
    graph, record, stamp = _paths(root, key)
    _write(graph, _structure(model)[0].SerializeToString())
    _write(record, json.dumps({"initializers": sources, "warnings": list(warnings)}).encode())
    _write(stamp, (_stamp(key, graph, record, secret) + "\n").encode())


def _tensors(module: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter and buffer of ``module`` by name (non-persistent buffers too: a rotary table)."""
    return {**dict(module.named_parameters()), **dict(module.named_buffers())}


def _write(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _structure(model: ir.Model) -> tuple:
    """(``model`` serialized with each initializer's data left out — a reference to nothing, never read —, the
    initializer tensors by name); ``model`` is left as it was."""
    held = {}
    for name, value in model.graph.initializers.items():
        held[name] = value.const_value
        value.const_value = ir.ExternalTensor("absent", 0, value.const_value.nbytes, value.const_value.dtype,
                                              shape=value.const_value.shape, name=name)
    try:
        return ir.serde.serialize_model(model), held
    finally:
        for name, tensor in held.items():
            model.graph.initializers[name].const_value = tensor


def reloaded(model: ir.Model) -> ir.Model:
    """``model`` as :func:`load` gives a stored trace: its graph serialized without the initializers' data and read
    back, the same initializer tensors put back (no copy). The optimizer names what it makes from the graph's own
    state, so a fresh trace optimized after this and a stored one write the same bytes (a cache never changes a
    file)."""
    proto, held = _structure(model)
    again = ir.serde.deserialize_model(proto)
    for name, value in again.graph.initializers.items():
        value.const_value = held[name]
    return again


def optimize(model: ir.Model) -> ir.Model:
    """The optimizer torch.onnx runs on a trace (constant folding, deduplication, common subexpressions), on
    ``model`` in place: what ``torch.onnx.export(..., optimize=True)`` gives."""
    program = torch.onnx.ONNXProgram(model, None)
    program.optimize()
    return program.model


__all__ = ["load", "optimize", "reloaded", "save", "trace_key"]
