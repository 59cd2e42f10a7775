"""Load the model a command works on: a built-in preset or JSON config, or a user factory
``package.module:factory`` (or ``path/to/file.py:factory``), optionally with a checkpoint, or a local Hugging Face
folder (``--hf``: :func:`load_hf` over the adapter of :mod:`mhaexport.models.hf`).

A user factory is imported and run: ``--model`` executes user code, exactly as ``python -c "import ..."`` would.
Checkpoints are read with ``torch.load(weights_only=True)``: tensors only, never arbitrary pickles.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import importlib.util
import os
import re
import sys
import tempfile
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from mhaexport.artifact import ExportFolder, ModelRecord, fingerprint_of, legacy_fingerprint, sha256_file
from mhaexport.artifact.source import (BuiltinSource, ConfigSource, FactorySource, HfSource, LegacySource,
                                       PresetSource, Source)
from mhaexport.core.errors import (ArtifactError, ConfigError, MhaExportError, ModelLoadError, UntrustedCode,
                              first_line)
from mhaexport.core.iospec import ModelContract, ModuleContract
from mhaexport.models.config import PRESETS, DecoderConfig, load_config
from mhaexport.models.decoder import DecoderLM
from mhaexport.models.stream import WeightsFile, meta_model, mmap_state, param_specs, staged_weights

WEIGHTS_DIR = Path(__file__).parent / "weights"


@dataclass
class LoadedModel:
    """A model under the decoder contract (or, from ``models/block.py``, the attention block under the module
    contract), and where it came from (recorded in manifests and reports)."""

    module: nn.Module
    contract: ModelContract | ModuleContract
    spec: str  # shown to people: "preset:small", "config:big.json", "factory:pkg.mod:fn"
    config: DecoderConfig | None = None  # the built-in model's config; None for a user factory
    checkpoint: str | None = None  # "shipped:small.pt", the checkpoint path as given, or None
    checkpoint_sha256: str | None = None
    # how to load it again (:mod:`mhaexport.artifact.source`: a preset, a config, a factory file or module, a Hugging
    # Face folder or Hub model, and the checkpoint loaded): paths absolute here, made relative to the export folder in
    # the manifest; a Hub model's "path" is the cache's snapshot, never recorded
    origin: Source = field(default_factory=Source)
    notes: list[str] = field(default_factory=list)  # what loading changed or cannot prove (the CLI shows them)
    # a model loaded streamed (``load_model(streamed=True)``: the built-in decoder, an --hf folder): the staging file
    # its parameters map
    weights: WeightsFile | None = field(default=None, repr=False)
    # a half-precision folder kept in its dtype (``load_hf(keep_half=True)``): the module's bfloat16/float16 weights
    # stand for the float32 model (its fingerprint hashes them as float32; :attr:`eager` computes in float32)
    half: bool = False
    _weights_sha256: str | None = field(default=None, repr=False)
    _n_params: int | None = field(default=None, repr=False)

    @property
    def weights_sha256(self) -> str:
        """sha256 of the module's state dict (names, dtypes, shapes and bytes), computed once."""
        if self._weights_sha256 is None:
            self._weights_sha256 = weights_sha256(self.module, self.weights, as_float32=self.half)
        return self._weights_sha256

    @property
    def eager(self) -> nn.Module:
        """The module eager PyTorch runs as the float32 reference: :attr:`module`, or for a half-precision folder kept
        in its dtype the same module computed in float32 one module at a time (:class:`mhaexport.models.upcast.Float32`)."""
        if not self.half:
            return self.module
        from mhaexport.models.upcast import Float32

        return Float32(self.module)

    @property
    def n_params(self) -> int:
        """How many parameters the module holds (embeddings included), counted once."""
        if self._n_params is None:
            self._n_params = sum(p.numel() for p in self.module.parameters())
        return self._n_params

    @property
    def fingerprint(self) -> str:
        return fingerprint_of(self.contract, self.weights_sha256)

    def record(self, folder: str | Path) -> ModelRecord:
        """The manifest's model record for an export into ``folder``: file paths relative to that folder."""
        folder = Path(folder).resolve()
        source = self.origin
        if isinstance(source, HfSource) and source.repo_id:
            # a Hub model is recorded by id, revision and commit; its snapshot path is this machine's
            source = dataclasses.replace(source, path=None, extra=dict(source.extra))
        source = source.with_paths(lambda p: os.path.relpath(Path(p).resolve(), folder))
        return ModelRecord(spec=self.spec, contract=self.contract, fingerprint=self.fingerprint, source=source,
                           config=self.config.to_dict() if self.config else None, checkpoint=self.checkpoint_label,
                           checkpoint_sha256=self.checkpoint_sha256, weights_sha256=self.weights_sha256)

    @property
    def label(self) -> str:
        """How error messages name the model: the architecture of an ``--hf`` model (``LlamaForCausalLM (llama)``),
        else the spec."""
        return self.origin.label if isinstance(self.origin, HfSource) else self.spec

    @property
    def checkpoint_label(self) -> str | None:
        """The checkpoint as reports show it: "shipped:small.pt" or the file's name (never a full path)."""
        if self.checkpoint is None or self.checkpoint.startswith("shipped:"):
            return self.checkpoint
        return Path(self.checkpoint).name


def weights_sha256(module: nn.Module, weights: WeightsFile | None = None, *, as_float32: bool = False) -> str:
    """sha256 over the state dict in key order: each key, dtype, shape and the tensor's bytes; a streamed model's
    (``weights``: the staging file its parameters map) read from that file by offset, never through the map.
    ``as_float32``: half-precision tensors hashed as their float32 values (the model a float32 load of the same
    folder gives: the same sha256)."""
    from mhaexport.models.stream import streamed_sha256

    return streamed_sha256(module.state_dict(), weights, as_float32=as_float32)


def contract_of(module: nn.Module) -> ModelContract:
    """Read the contract's ints from ``module.config``, or raise ModelLoadError naming what is missing."""
    cfg = getattr(module, "config", None)
    if cfg is None:
        raise ModelLoadError(f"{type(module).__name__} has no .config: the contract needs model.config with "
                             f"ints {', '.join(ModelContract.FIELDS)}")
    values = {}
    for f in ModelContract.FIELDS + ModelContract.OPTIONAL:
        v = cfg.get(f) if isinstance(cfg, dict) else getattr(cfg, f, None)
        if v is None and f in ModelContract.OPTIONAL:
            continue
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ModelLoadError(f"model.config.{f} must be a positive int, found {v!r}")
        values[f] = v
    windows = cfg.get("layer_windows") if isinstance(cfg, dict) else getattr(cfg, "layer_windows", None)
    if windows is not None:
        values["windows"] = tuple(windows)
    for f in ModelContract.SCORE_FIELDS + ("attn_sinks",):
        v = cfg.get(f) if isinstance(cfg, dict) else getattr(cfg, f, None)
        if v is not None:
            values[f] = v
    try:
        return ModelContract(**values)
    except ConfigError as e:
        raise ModelLoadError(f"model.config: {e}") from None


def _import_factory(spec: str):
    if ":" not in spec:
        raise ModelLoadError(f"--model {spec!r}: expected 'package.module:factory' or 'file.py:factory'")
    target, _, attr = spec.rpartition(":")
    if not target or not attr:
        raise ModelLoadError(f"--model {spec!r}: expected 'package.module:factory' or 'file.py:factory'")
    try:
        if target.endswith(".py"):
            path = Path(target)
            if not path.is_file():
                raise ModelLoadError(f"--model {spec!r}: file {target} does not exist")
            path = path.resolve()
            # one module per file: two factories in files with the same name must not share a module
            name = f"mhaexport_user_{path.stem}_{hashlib.sha256(str(path).encode()).hexdigest()[:8]}"
            mod_spec = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(mod_spec)
            sys.modules[name] = module
            mod_spec.loader.exec_module(module)
        else:
            if os.getcwd() not in sys.path and "" not in sys.path:
                sys.path.insert(0, os.getcwd())  # like `python -m`: the current folder is importable
            module = importlib.import_module(target)
    except MhaExportError:
        raise
    except Exception as e:  # user code: any error while importing is a bad --model
        raise ModelLoadError(f"--model {spec!r}: cannot import {target}: {type(e).__name__}: {e}") from None
    factory = getattr(module, attr, None)
    if factory is None or not callable(factory):
        raise ModelLoadError(f"--model {spec!r}: {target} has no callable {attr!r}")
    return factory


def _state_misfit(module: nn.Module, state: dict) -> str:
    """One line naming how a state dict differs from the module's (first key of each kind), or '' if it fits."""
    want = module.state_dict()
    missing = [k for k in want if k not in state]
    unexpected = [k for k in state if k not in want]
    shapes = [k for k in want if k in state and isinstance(state[k], torch.Tensor)
              and tuple(state[k].shape) != tuple(want[k].shape)]
    parts = []
    if shapes:
        k = shapes[0]
        parts.append(f"{len(shapes)} shape mismatch(es), first {k}: checkpoint {tuple(state[k].shape)} vs model "
                     f"{tuple(want[k].shape)}")
    if missing:
        parts.append(f"{len(missing)} missing key(s), first {missing[0]}")
    if unexpected:
        parts.append(f"{len(unexpected)} unexpected key(s), first {unexpected[0]}")
    return "; ".join(parts)


def _load_failure(e: Exception) -> str:
    """The one informative line of a torch.load failure (weights_only names the refused global deep inside)."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(e))
    if m := re.search(r"(?:Unsupported global: GLOBAL|unsupported GLOBAL) (\S+)", text):
        return f"it holds a non-tensor object ({m.group(1)}), refused without unpickling it"
    if "central directory" in text or "zip archive" in text:
        return "not a complete torch.save file (truncated or corrupted)"
    if "Weights only load failed" in text:
        return "not a tensors-only torch.save file, refused without unpickling it"
    return first_line(e)


def read_state(path: str | Path, *, mmap: bool = False) -> dict:
    """A checkpoint's state dict (tensors only: ``torch.load(weights_only=True)``, or a ``.safetensors`` file;
    ``mmap``: memory-mapped, each tensor read when used); ModelLoadError for a file that is missing or is not one."""
    path = Path(path)
    if not path.is_file():
        raise ModelLoadError(f"checkpoint {path} does not exist")
    if path.suffix == ".safetensors":
        try:
            state = mmap_state(path)
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ModelLoadError(f"checkpoint {path} cannot be read as safetensors: {first_line(e)}") from None
        return state if mmap else {k: v.clone() for k, v in state.items()}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # e.g. "Detected pickle protocol 4": the error below says what matters
            state = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except Exception as e:
        raise ModelLoadError(f"checkpoint {path} cannot be read as a tensors-only state dict "
                             f"(torch.load weights_only=True): {_load_failure(e)}") from None
    if isinstance(state, dict) and "state_dict" in state and isinstance(state["state_dict"], dict):
        state = state["state_dict"]
    if not isinstance(state, dict):
        raise ModelLoadError(f"checkpoint {path} holds a {type(state).__name__}, expected a state dict")
    return state


def load_checkpoint(module: nn.Module, path: str | Path) -> str:
    """Load a state dict (tensors only) into module; returns its sha256. Mismatches raise ModelLoadError."""
    state = read_state(path)
    if misfit := _state_misfit(module, state):
        raise ModelLoadError(f"checkpoint {path} does not fit the model: {misfit}")
    try:
        module.load_state_dict(state, strict=True)
    except RuntimeError as e:
        first = [ln.strip() for ln in str(e).splitlines() if ln.strip()][:3]
        raise ModelLoadError(f"checkpoint {path} does not fit the model: {' '.join(first)}") from None
    return sha256_file(path)


def streamed_checkpoint(cfg: DecoderConfig, path: str | Path) -> WeightsFile:
    """A checkpoint of the built-in decoder copied one tensor at a time into a staging file (:func:`staged_weights`):
    a ``.pt`` read with ``torch.load(mmap=True)``, a ``.safetensors`` read by offset; each tensor converted to the
    model's dtype as ``load_state_dict`` would. A tied LM head takes the checkpoint's ``lm_head.weight`` where it has
    one (``load_state_dict`` copies it last into the shared tensor). ModelLoadError when it does not fit."""
    path = Path(path)
    if path.suffix == ".safetensors":
        if not path.is_file():
            raise ModelLoadError(f"checkpoint {path} does not exist")
        try:
            source = WeightsFile(path)
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ModelLoadError(f"checkpoint {path} cannot be read as safetensors: {first_line(e)}") from None
        state, read = source.state, source.read
    else:
        state = read_state(path, mmap=True)
        read = state.__getitem__
    meta = meta_model(cfg)
    if misfit := _state_misfit(meta, state):
        raise ModelLoadError(f"checkpoint {path} does not fit the model: {misfit}")
    bad = next((k for k, v in state.items() if not isinstance(v, torch.Tensor)), None)
    if bad is not None:
        raise ModelLoadError(f"checkpoint {path} does not fit the model: {bad} is not a tensor")
    tied = cfg.tie_embeddings

    def tensors():
        for name, _, dtype in param_specs(cfg):
            if tied and name == "lm_head.weight":
                yield name, None
                continue
            src = "lm_head.weight" if tied and name == "tok_emb.weight" else name
            yield name, read(src).detach().to(dtype).contiguous()

    return staged_weights(cfg, tensors())


def smoke_check(module: nn.Module, contract: ModelContract, device: str = "cpu") -> None:
    """Call the model once at (batch, seq, past) = (1, 2, 0) and check the contract's output structure; ``device``
    "meta": shapes only (a model on the meta device: nothing computed, no weight read)."""
    from mhaexport.models.inputs import make_inputs

    ids, mask, past = make_inputs(contract, batch=1, seq=2, past=0)
    if device != "cpu":
        ids, mask = ids.to(device), mask.to(device)
        past = tuple((k.to(device), v.to(device)) for k, v in past)
    try:
        with torch.no_grad():
            out = module(ids, mask, past)
    except Exception as e:
        raise ModelLoadError(f"model(input_ids, attention_mask, past_key_values) failed at batch=1 seq=2 "
                             f"past=0: {first_line(e)}") from None
    ok = (isinstance(out, (tuple, list)) and len(out) == 2 and isinstance(out[0], torch.Tensor)
          and isinstance(out[1], (tuple, list)) and len(out[1]) == contract.n_layers)
    if not ok:
        raise ModelLoadError("model output must be (logits, present_key_values) with one (key, value) pair per "
                             f"layer ({contract.n_layers}); got {type(out).__name__}")
    logits, present = out
    want = (1, 2, contract.vocab_size)
    if tuple(logits.shape) != want:
        raise ModelLoadError(f"logits shape {tuple(logits.shape)} != expected {want} [batch, seq, vocab_size]")
    kv_want = (1, contract.n_kv_heads, 2, contract.head_dim)
    for i, kv in enumerate(present):
        if not (isinstance(kv, (tuple, list)) and len(kv) == 2):
            raise ModelLoadError(f"present[{i}] must be a (key, value) pair")
        for t in kv:
            if tuple(t.shape) != kv_want:
                raise ModelLoadError(f"present[{i}] shape {tuple(t.shape)} != expected {kv_want} "
                                     "[batch, n_kv_heads, past + seq, head_dim]")


def load_hf(path: str | Path, revision: str | None = None, *, allow_download: bool = False,
            streamed: bool = False, keep_half: bool = False,
            ready: Callable[[], None] | None = None) -> LoadedModel:
    """Load the Hugging Face causal LM in folder ``path`` — or, when ``path`` is a Hub id ``org/name``, its snapshot
    at ``revision`` in the user's cache (:mod:`mhaexport.models.hub`; downloaded only with ``allow_download``) —
    under the decoder contract, as a checked LoadedModel: spec ``hf:<folder name>`` (``hf:org/name``), origin an
    :class:`~mhaexport.artifact.source.HfSource` (``path`` absolute; relative in the manifest; for a Hub id the
    snapshot, never recorded) with, for a Hub id, its ``repo_id``, ``revision``, ``commit``; notes from loading (a
    capped context length, a sliding window). Raises ModelLoadError with one line: transformers missing (with the
    install line), not a model folder, a Hub id not in the cache, an architecture transformers cannot load as a
    causal LM, or one whose outputs are not the contract's (no cache, another cache layout). ``streamed``: its
    weights staged one tensor at a time and its parameters that file mapped (``.weights``;
    :mod:`mhaexport.models.hf_stream`), or, where the folder cannot be, loaded in memory with the reason in the notes;
    ``keep_half`` (with ``streamed``): a bfloat16/float16 folder staged in its own dtype (``.half``: the float32
    reference computed one module at a time, :attr:`LoadedModel.eager`). ``ready``: called once the folder and its
    config are checked, before its weights are read."""
    from mhaexport.models import hub
    from mhaexport.models.hf import hf_adapter

    source = None
    if hub.is_repo_id(path):
        source = hub.resolve(str(path), revision, allow_download=allow_download)
    elif revision is not None:
        raise ModelLoadError(f"--revision {revision} applies to a Hub model id (org/name); --hf {path} is a folder")
    if source is None:
        got = hf_adapter(path, streamed=streamed, keep_half=keep_half, ready=ready)
        spec = f"hf:{Path(path).resolve().name}"
        origin = got.origin
    else:
        got = hf_adapter(source.folder, shown=source.repo_id, confine=False, streamed=streamed,  # the cache's rules
                         keep_half=keep_half, ready=ready)
        origin = dataclasses.replace(got.origin, **source.record)
        spec = source.spec
    module = got.adapter
    from mhaexport.models.upcast import half_dtype

    loaded = LoadedModel(module, contract_of(module), spec=spec, origin=origin, notes=list(module.config.notes),
                         weights=got.weights, half=got.weights is not None and half_dtype(module) is not None)
    if got.meta is not None:  # shapes only: a forward would read every weight's pages
        smoke_check(got.meta, loaded.contract, "meta")
    else:
        smoke_check(module, loaded.contract)
    return loaded


def shipped_weights(config: DecoderConfig) -> Path | None:
    """Trained weights shipped with the package for a preset, if any."""
    path = WEIGHTS_DIR / f"{config.name}.pt"
    return path if path.is_file() else None


def _factory_origin(model: str) -> tuple[str, FactorySource]:
    """The spec to show and the origin to record for ``--model``: a file factory by absolute path (made relative to
    the export folder in the manifest), a module factory by module name."""
    target, _, attr = model.rpartition(":")
    if target.endswith(".py"):
        path = Path(target)
        shown = target if not path.is_absolute() else path.name
        return f"factory:{shown}:{attr}", FactorySource(file=str(path.resolve()), callable=attr)
    return f"factory:{model}", FactorySource(module=target, callable=attr)


def load_model(config: str | DecoderConfig | None = None, model: str | None = None,
               checkpoint: str | Path | None = None, *, hf: str | Path | None = None,
               random_weights: bool = False, revision: str | None = None,
               allow_download: bool = False, streamed: bool = False, mapped: bool = False,
               keep_half: bool = False, ready: Callable[[], None] | None = None) -> LoadedModel:
    """Build the model a command works on. ``config``, ``model`` and ``hf`` are exclusive; none means the default
    preset.

    ``config``: a preset name, a JSON file or a DecoderConfig. The built-in presets load the package's shipped
    trained weights where they exist (unless ``random_weights``); ``checkpoint`` overrides both.
    ``hf``: a local Hugging Face causal LM folder (``save_pretrained`` layout), wrapped under the contract by
    :mod:`mhaexport.models.hf`; it holds its own weights, so ``checkpoint`` does not apply. ``hf`` may also be a Hub
    model id ``org/name`` (at ``revision``), read from the user's Hugging Face cache, downloaded only with
    ``allow_download`` (:mod:`mhaexport.models.hub`).
    ``streamed`` (the built-in decoder and an ``--hf`` folder, :func:`load_hf`; ignored for a factory): its weights —
    seeded, shipped, the checkpoint's or the folder's — are written one tensor at a time to a staging file (unlinked at
    once, gone with the model) and the module's parameters are that file memory-mapped (read-only): nothing holds the
    model in memory; ``.weights`` reads it by offset.
    ``mapped`` (the built-in decoder; ``streamed`` wins): its parameters memory-mapped from a file instead of held in memory
    (:mod:`mhaexport.models.stream`; verify's mapped mode): the seeded weights written once into this user's cache
    (:func:`~mhaexport.models.stream.cached_seeded`), a checkpoint mapped by ``torch.load(mmap=True)`` (one torch
    cannot map is loaded whole, said in ``notes``). A user factory is loaded whole, and so is a Hugging Face model
    unless ``streamed``. ``keep_half`` (an ``--hf`` folder, with ``streamed``): see :func:`load_hf`.
    """
    given = [f"--{n}" for n, v in (("config", config), ("model", model), ("hf", hf)) if v is not None]
    if len(given) > 1:
        raise ConfigError(f"give one of --config, --model, --hf, not {' and '.join(given)}")
    if revision is not None and hf is None:
        raise ConfigError("--revision applies to --hf ORG/NAME (a Hub model id)")
    if hf is not None and checkpoint is not None:
        raise ConfigError("--checkpoint loads weights into mhaexport's own models; an --hf folder holds its weights")
    if hf is not None:
        return load_hf(hf, revision, allow_download=allow_download, streamed=streamed, keep_half=keep_half,
                       ready=ready)
    if model is not None:
        factory = _import_factory(model)
        if ready is not None:
            ready()
        try:
            module = factory()
        except MhaExportError:
            raise
        except Exception as e:
            raise ModelLoadError(f"--model {model!r}: the factory raised {type(e).__name__}: {e}") from None
        if not isinstance(module, nn.Module):
            raise ModelLoadError(f"--model {model!r}: the factory returned {type(module).__name__}, "
                                 "expected a torch.nn.Module")
        contract = contract_of(module)
        spec, origin = _factory_origin(model)
        loaded = LoadedModel(module, contract, spec=spec, origin=origin)
    else:
        cfg = config if isinstance(config, DecoderConfig) else load_config(config)
        if ready is not None:
            ready()
        is_preset = isinstance(config, str) and config in PRESETS or config is None
        shipped = None if checkpoint is not None or random_weights or not is_preset else shipped_weights(cfg)
        notes: list[str] = []
        if streamed:
            given = checkpoint if checkpoint is not None else shipped
            try:
                weights = staged_weights(cfg) if given is None else streamed_checkpoint(cfg, given)
            except OSError as e:
                raise ArtifactError(f"cannot stage the weights in {tempfile.gettempdir()} ({first_line(e)}): the "
                                    "weights are written there before they are read, streamed; set TMPDIR to a folder "
                                    "with room for them") \
                    from None
            module = weights.model(cfg)
        else:
            weights = None
            module = _mapped_builtin(cfg, checkpoint or shipped, notes) if mapped else None
            if module is None:
                module = DecoderLM(cfg)
        if is_preset:
            spec, origin = f"preset:{cfg.name}", PresetSource(name=cfg.name)
        else:
            shown = Path(config).name if isinstance(config, str) else cfg.name
            spec, origin = f"config:{shown}", ConfigSource()
        loaded = LoadedModel(module, contract_of(module), spec=spec, config=cfg, origin=origin, weights=weights,
                             notes=notes)
        mapped = mapped and not streamed and not notes  # the module is over the cache's file, memory-mapped
        if shipped is not None:
            loaded.checkpoint_sha256 = (sha256_file(shipped) if streamed or mapped
                                        else load_checkpoint(module, shipped))
            loaded.checkpoint = f"shipped:{shipped.name}"
        elif checkpoint is not None and mapped:
            if not Path(checkpoint).is_file():
                raise ModelLoadError(f"checkpoint {checkpoint} does not exist")
            loaded.checkpoint_sha256 = sha256_file(checkpoint)
            loaded.checkpoint = str(checkpoint)
            loaded.origin.checkpoint = str(Path(checkpoint).resolve())
            checkpoint = None  # mapped already
    if checkpoint is not None:
        loaded.checkpoint_sha256 = (sha256_file(checkpoint) if loaded.weights is not None
                                    else load_checkpoint(loaded.module, checkpoint))
        loaded.checkpoint = str(checkpoint)
        loaded.origin.checkpoint = str(Path(checkpoint).resolve())
    loaded.module.eval()
    if loaded.weights is not None:  # shapes only: a forward would read every weight's pages
        smoke_check(meta_model(loaded.config), loaded.contract, "meta")
    else:
        smoke_check(loaded.module, loaded.contract)
    return loaded


def _mapped_builtin(cfg: DecoderConfig, checkpoint: str | Path | None, notes: list[str]) -> nn.Module | None:
    """The built-in decoder of ``cfg`` with its parameters memory-mapped: over ``checkpoint`` (torch's map of it),
    else over its seeded weights cached once (:func:`~mhaexport.models.stream.cached_seeded`). None, with the
    reason in ``notes``, when the checkpoint cannot be mapped (it is then loaded whole)."""
    from mhaexport.models.stream import cached_seeded, mmap_model, model_over, param_specs

    if checkpoint is None:
        return mmap_model(cfg, cached_seeded(cfg))
    if not Path(checkpoint).is_file():
        return None  # the whole load says so
    whole = f"checkpoint {Path(checkpoint).name} is loaded whole, not memory-mapped"
    try:
        state = read_state(checkpoint, mmap=True)
    except ModelLoadError as e:  # e.g. torch cannot map the legacy format: the whole load reads it, or says why
        notes.append(f"{whole}: {e}")
        return None
    specs = {n: (s, d) for n, s, d in param_specs(cfg)}
    required = set(specs) - ({"lm_head.weight"} if cfg.tie_embeddings else set())
    if not required <= set(state) <= set(specs) or any(
            not isinstance(state[n], torch.Tensor) or (tuple(state[n].shape), state[n].dtype) != specs[n]
            for n in state):
        notes.append(f"{whole}: its tensors are not the model's names, shapes and dtypes")
        return None
    return model_over(cfg, state, strict=set(state) == set(specs))


def code_source(record: ModelRecord) -> str | None:
    """What code rebuilding ``record``'s model would import and run ("the factory file ../net.py:build"), or None
    when its source is data only (a built-in preset or config, a Hugging Face folder or Hub model, which transformers
    loads without remote code)."""
    if record.legacy:
        kind = record.spec.partition(":")[0]
        model = record.source.v1_rebuild.model if isinstance(record.source, LegacySource) else None
        return None if kind in ("preset", "config") else f"the schema-1 model {model or record.spec!r}"
    return record.source.code


def load_recorded(folder: ExportFolder, *, trust_code: bool = False, mapped: bool = False) -> LoadedModel:
    """Rebuild the eager model an export folder was made from (its recorded source and checkpoint, paths relative
    to the folder) and check that it is the same model (fingerprint). ArtifactError says how to re-point it
    (``--model`` / ``--config`` / ``--checkpoint`` / ``--hf``) when the source cannot be found or no longer matches.

    A source that is code (a factory file or module: :func:`code_source`) is a name the folder supplies: it is
    imported only with ``trust_code`` (the user's ``--trust-code``), else UntrustedCode says how to allow it or name
    the model instead — nothing runs because a folder says so.

    ``mapped``: a built-in decoder's parameters memory-mapped (:func:`load_model` ``mapped``; its seeded weights
    cached once, a cached file that is not the recorded model's written again), a Hugging Face folder's streamed
    (``streamed=True``: staged one tensor at a time and mapped; one that cannot be is loaded whole, the reason in its
    notes); a factory's is loaded whole."""
    record = folder.model
    code = code_source(record)
    if code is not None and not trust_code:
        raise UntrustedCode(f"{folder.path}'s model ({record.spec}) is rebuilt by running {code}, which the folder "
                            "names: mhaexport runs a folder's code only when you ask — pass --trust-code if the "
                            "folder is yours, or name the model with --model SPEC (API: trust_code=True / model=)")
    if record.module is not None:  # the block on its own: models.block.load_recorded_block rebuilds it
        raise ArtifactError(f"{folder.path} holds the {record.module} block on its own (`--module "
                            f"{record.module}`), not a decoder: only `mhaexport verify` reads such a folder")
    if record.legacy:
        return _load_legacy(record)
    src = record.source
    checkpoint = recorded_checkpoint(folder, src, record, "this folder", "the model options")
    try:
        if isinstance(src, BuiltinSource):
            loaded = rebuild_builtin(src, record, checkpoint, record.spec, mapped=mapped)
        elif isinstance(src, FactorySource) and src.file is not None:
            path = (folder.path / src.file).resolve()
            if not path.is_file():
                raise ArtifactError(f"the factory file of {record.spec} is not at {path} any more: re-point the "
                                    "folder with --model FILE.py:FACTORY (accepted when the model is the same)")
            loaded = load_model(model=f"{path}:{src.callable}", checkpoint=checkpoint)
            loaded.spec = record.spec
        elif isinstance(src, FactorySource):
            loaded = load_model(model=f"{src.module}:{src.callable}", checkpoint=checkpoint)
        elif isinstance(src, HfSource) and src.repo_id:
            # the recorded commit, from the cache (offline): the same snapshot, wherever this machine's cache is
            loaded = load_model(hf=src.repo_id, revision=src.commit or src.revision, streamed=mapped, keep_half=mapped)
            loaded.spec = record.spec
        elif isinstance(src, HfSource):
            path = (folder.path / src.path).resolve()
            if not path.is_dir():
                raise ArtifactError(f"the Hugging Face folder of {record.spec} is not at {path} any more: re-point "
                                    "the folder with --hf DIR (accepted when the model is the same)")
            loaded = load_model(hf=path, streamed=mapped, keep_half=mapped)
        else:
            raise ArtifactError(f"the manifest's model source {src.to_dict()!r} names no way to rebuild the model")
    except ModelLoadError as e:
        raise ArtifactError(f"cannot rebuild the eager model of {folder.path} ({record.spec}): {e}; re-point it "
                            "with --model/--config/--checkpoint/--hf") from None
    check_same_model(loaded, record)
    return loaded


def recorded_checkpoint(folder: ExportFolder, src: Source, record: ModelRecord, what: str, options: str
                        ) -> Path | None:
    """The checkpoint a folder's model was exported with (its source path, relative to the folder), or None;
    ArtifactError when it is not there any more (``what`` was exported with it; ``options`` re-point it)."""
    if not src.checkpoint:
        return None
    checkpoint = (folder.path / src.checkpoint).resolve()
    if not checkpoint.is_file():
        raise ArtifactError(f"the checkpoint {what} was exported with ({record.checkpoint}) is not at {checkpoint} "
                            f"any more: give it with --checkpoint (and {options})")
    return checkpoint


def rebuild_builtin(src: BuiltinSource, record: ModelRecord, checkpoint: Path | None, spec: str, *,
                    mapped: bool = False) -> LoadedModel:
    """The built-in decoder of a recorded ``preset`` or ``config`` source, with its checkpoint (a preset recorded
    without one gets its seeded random weights); ``spec``: the name it is shown under (a config's). ``mapped``: its
    parameters memory-mapped (:func:`load_model`); seeded weights cached that are not the recorded model's (a file
    damaged in the cache) are written again once."""
    def load() -> LoadedModel:
        if isinstance(src, PresetSource):
            return load_model(config=src.name, checkpoint=checkpoint, random_weights=record.checkpoint is None,
                              mapped=mapped)
        out = load_model(config=DecoderConfig.from_dict(record.config or {}), checkpoint=checkpoint, mapped=mapped)
        out.spec = spec
        return out

    loaded = load()
    seeded = mapped and loaded.checkpoint is None and not record.legacy
    if seeded and loaded.fingerprint != record.fingerprint:  # a damaged cache file: written again, once
        from mhaexport.models.stream import cached_seeded

        cached_seeded(loaded.config, rebuild=True)
        loaded = load()
    return loaded


def check_same_model(loaded: LoadedModel, record: ModelRecord) -> None:
    """ArtifactError naming both fingerprints unless ``loaded`` is the model ``record`` describes."""
    if record.legacy:
        got = legacy_fingerprint(record.spec, loaded.contract.to_dict(),
                                 loaded.config.to_dict() if loaded.config else None, loaded.checkpoint_sha256)
    else:
        got = loaded.fingerprint
    if got != record.fingerprint:
        raise ArtifactError(f"{loaded.spec} (fingerprint {got}) is not the model this folder was exported from "
                            f"({record.spec}, fingerprint {record.fingerprint}): its config or weights differ; "
                            "re-export, or name the exported model")


def _load_legacy(record: ModelRecord) -> LoadedModel:
    """A schema-1 folder: its rebuild arguments held absolute paths and the exporting working directory."""
    rebuild = record.source.v1_rebuild if isinstance(record.source, LegacySource) else None
    kind, _, name = record.spec.partition(":")
    ckpt = record.checkpoint
    shipped = isinstance(ckpt, str) and ckpt.startswith("shipped:")
    if rebuild is None:
        raise ArtifactError(f"the schema-1 model record of {record.spec} holds no rebuild arguments: re-export")
    checkpoint = None if ckpt is None or shipped else (rebuild.checkpoint or ckpt)
    try:
        if kind in ("preset", "config"):
            loaded = load_model(config=rebuild.config or name, checkpoint=checkpoint, random_weights=ckpt is None)
        else:
            if rebuild.cwd and rebuild.cwd not in sys.path:
                sys.path.insert(0, rebuild.cwd)
            loaded = load_model(model=rebuild.model or name, checkpoint=checkpoint)
    except ModelLoadError as e:
        raise ArtifactError(f"cannot rebuild the eager model of this schema-1 folder ({record.spec}): {e}; "
                            "re-point it with --model/--config/--checkpoint or re-export") from None
    loaded.spec, loaded.checkpoint = record.spec, ckpt
    check_same_model(loaded, record)
    return loaded
