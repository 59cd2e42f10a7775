"""Hugging Face causal LMs under the decoder contract: ``--hf DIR`` (a local ``save_pretrained`` folder).

:func:`mhaexport.models.loading.load_hf` loads ``AutoModelForCausalLM.from_pretrained(DIR, local_files_only=True)`` (eager attention,
float32, eval) and wraps it in :class:`HFCausalLM`, whose ``forward(input_ids, attention_mask, past_key_values)``
is the contract's: positions come from the attention mask (``cumsum(mask) - 1``, so left padding, the past
offset and onnxruntime-genai's right padding all give each row its own positions), the cache goes in as the
contract's tuples (a ``DynamicCache`` is built from them inside forward) and comes out as tuples. The exports so
keep mhaexport's I/O names and every verify check applies unchanged.

transformers is an optional extra (``pip install -e '.[hf]'``), imported only here and only when ``--hf`` is
used. ``--hf org/name`` names a Hub model: :mod:`mhaexport.models.hub` finds its snapshot in the user's cache
(downloading only when allowed); transformers then reads that folder like any other. transformers itself never
downloads (``local_files_only=True``), and ``trust_remote_code=False`` (a folder that needs its own Python code is
refused, with no prompt even at a terminal, as ``--model`` is the way to run user code); it reads a private copy of
the folder's files, opened inside it without following a link (:mod:`mhaexport.models.hf_files`).
"""

from __future__ import annotations

import contextlib
import inspect
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from mhaexport.errors import ModelLoadError, first_line
from mhaexport.models.tracebacks import failing_module

INSTALL_LINE = "pip install -e '.[hf]' in the mhaexport checkout (or pip install transformers tokenizers)"
# A model that claims more positions than this gets max_positions capped here (with a note): the contract's
# max_positions sizes verify's longest prompt and genai_config's context_length.
MAX_POSITIONS_CAP = 131072
# Where configs keep the context length, in order; a model without one (ALiBi: BLOOM) gets the default, with a note.
POSITION_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")
DEFAULT_MAX_POSITIONS = 2048


@dataclass
class HFContractConfig:
    """``model.config`` of the adapter: the contract's ints, the special token ids and where the model came from."""

    n_layers: int
    n_heads: int
    head_dim: int
    vocab_size: int
    max_positions: int
    n_kv_heads: int
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    pad_token_id: int | None = None
    model_type: str = ""
    architecture: str = ""
    notes: list[str] = field(default_factory=list)


class HFCausalLM(nn.Module):
    """A transformers causal LM under the decoder contract (see the module docstring)."""

    def __init__(self, model: nn.Module, config: HFContractConfig, cache_kw: str, cache_cls: type) -> None:
        super().__init__()
        self.hf = model
        self.config = config
        self._cache_kw = cache_kw  # "cache" (transformers 5.x) or "past_key_values"
        self._cache_cls = cache_cls  # transformers.DynamicCache
        self.tokenizer: dict[str, bytes] = {}  # the folder's tokenizer files as read (hf_adapter)
        self.eval()  # inference only: the wrapped model is in eval mode, and so is its wrapper (torch.onnx warns else)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                past_key_values: tuple | None = None) -> tuple[torch.Tensor, tuple]:
        """(B, T) ids and (B, past + T) mask, past n_layers (key, value) pairs of (B, H_kv, past, D) or None ->
        (B, T, V) logits and the present pairs (B, H_kv, past + T, D)."""
        T, total = input_ids.shape[1], attention_mask.shape[1]
        if past_key_values and torch.compiler.is_exporting():
            # the contract's mask width is past + seq: said to torch.export, which then keeps the mask's width
            # the derived past + seq instead of narrowing its own Dim to the >= 4 its guards on transformers' mask
            # code would imply (it reasons with every length >= 2); torch.jit.trace and eager never see this line
            torch._check(total == past_key_values[0][0].shape[2] + T)
        # the last T positions, gathered rather than sliced: a slice of width T is contiguous only when T == total,
        # a guard that would cost the program the empty-cache prefill (mask width == ids width)
        last = torch.arange(T, device=attention_mask.device) + (total - T)  # (T,)
        positions = (attention_mask.cumsum(-1) - 1).clamp(min=0).index_select(1, last)  # (B, T) of each new token
        cache = self._cache_cls(tuple((k, v) for k, v in past_key_values or ()))  # layers of (B, H_kv, past, D)
        out = self.hf(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions,
                      use_cache=True, return_dict=True, **{self._cache_kw: cache})
        present = _cache_tuples(_output_cache(out))  # layers of (B, H_kv, past + T, D)
        return out.logits, present  # (B, T, V)


def _output_cache(out: Any) -> Any:
    for name in ("cache", "past_key_values"):
        value = getattr(out, name, None)
        if value is not None:
            return value
    return None


def _cache_tuples(cache: Any) -> tuple:
    """A transformers cache as the contract's tuple of (key, value) pairs (a legacy tuple passes through)."""
    if cache is None:
        raise ModelLoadError("the model returned no KV cache with use_cache=True")
    layers = getattr(cache, "layers", None)
    if layers is not None:
        return tuple((layer.keys, layer.values) for layer in layers)
    if isinstance(cache, (tuple, list)):
        return tuple((kv[0], kv[1]) for kv in cache)
    raise ModelLoadError(f"the model's cache is a {type(cache).__name__}, neither a transformers Cache with "
                         "layers nor a tuple of (key, value) pairs")


def import_transformers():
    """transformers, or ModelLoadError with the install line."""
    try:
        import transformers
    except ImportError as e:
        raise ModelLoadError(f"--hf needs the transformers package ({first_line(e)}): {INSTALL_LINE}") from None
    return transformers


@contextlib.contextmanager
def _quiet(transformers) -> Iterator[None]:
    """Silence transformers' progress bars, info logs and warnings while loading (library code never prints)."""
    tl = transformers.utils.logging
    verbosity, bars = tl.get_verbosity(), tl.is_progress_bar_enabled()
    tl.set_verbosity_error()
    tl.disable_progress_bar()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        tl.set_verbosity(verbosity)
        if bars:
            tl.enable_progress_bar()


def _first_int(value: Any) -> int | None:
    """A token id from a config: an int, the first of a list (Llama 3 lists several eos ids), else None."""
    if isinstance(value, (list, tuple)) and value:
        value = value[0]
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def architecture_label(path: str | Path) -> str:
    """``LlamaForCausalLM (llama)`` from ``DIR/config.json`` without importing transformers; the folder's name
    when it cannot be read."""
    from mhaexport.untrusted import load_json

    try:
        data = load_json(Path(path) / "config.json", f"{path}/config.json")
        arch = (data.get("architectures") or ["?"])[0]
        return f"{arch} ({data.get('model_type', '?')})"
    except Exception:
        return Path(path).name


def _contract_config(cfg: Any, cache: tuple, label: str) -> HFContractConfig:
    """The contract's ints from the text config and the cache a probe call returned (the cache's own shapes decide
    n_layers, n_kv_heads and head_dim, so a config that names them otherwise cannot mislead)."""
    notes = []
    shapes = {tuple(t.shape) for kv in cache for t in kv}
    bad = [s for s in shapes if len(s) != 4 or s[0] != 1 or s[2] != 2]
    if not cache or bad or len({(s[1], s[3]) for s in shapes}) != 1:
        raise ModelLoadError(f"{label}: its KV cache is not [batch, kv_heads, length, head_dim] per layer "
                             f"(a probe at batch=1 seq=2 returned shapes {sorted(shapes)}); the contract needs "
                             "that layout")
    _, n_kv, _, head_dim = next(iter(shapes))  # (1, H_kv, 2, D), the same for every layer
    n_layers = len(cache)
    n_heads = getattr(cfg, "num_attention_heads", None)
    if not isinstance(n_heads, int) or n_heads % n_kv:
        raise ModelLoadError(f"{label}: config.num_attention_heads={n_heads!r} is not a multiple of the "
                             f"cache's {n_kv} key/value heads")
    cfg_layers = getattr(cfg, "num_hidden_layers", None)
    if isinstance(cfg_layers, int) and cfg_layers != n_layers:
        raise ModelLoadError(f"{label}: config.num_hidden_layers={cfg_layers} but the cache has {n_layers} "
                             "layers (layers that share or skip a cache do not fit the contract)")
    max_pos = next((v for v in (getattr(cfg, k, None) for k in POSITION_KEYS) if isinstance(v, int) and v > 1),
                   None)
    if max_pos is None:
        notes.append(f"the config names no context length ({', '.join(POSITION_KEYS)}): max_positions set to "
                     f"{DEFAULT_MAX_POSITIONS}")
        max_pos = DEFAULT_MAX_POSITIONS
    if max_pos > MAX_POSITIONS_CAP:
        notes.append(f"config.max_position_embeddings={max_pos} capped at max_positions={MAX_POSITIONS_CAP} (the "
                     "contract's context length: verify's longest prompt and genai_config's context_length)")
        max_pos = MAX_POSITIONS_CAP
    window = getattr(cfg, "sliding_window", None)
    if isinstance(window, int) and window < max_pos and getattr(cfg, "use_sliding_window", True) is not False:
        notes.append(f"sliding_window={window} < max_positions={max_pos}: the cache keeps every position (the "
                     "window is applied by the mask); mhaexport's tests prove architectures without a window")
    eos = _first_int(getattr(cfg, "eos_token_id", None))
    pad = _first_int(getattr(cfg, "pad_token_id", None))
    vocab = getattr(cfg, "vocab_size", None)
    if not isinstance(vocab, int) or vocab < 1:
        raise ModelLoadError(f"{label}: config.vocab_size={vocab!r}")
    ids = {"bos_token_id": _first_int(getattr(cfg, "bos_token_id", None)), "eos_token_id": eos,
           "pad_token_id": pad if pad is not None else eos}  # no pad id: eos pads (onnxruntime-genai's builder)
    ids = {k: (v if v is not None and v < vocab else None) for k, v in ids.items()}
    return HFContractConfig(n_layers=n_layers, n_heads=n_heads, head_dim=head_dim, vocab_size=vocab,
                            max_positions=max_pos, n_kv_heads=n_kv, notes=notes, **ids)


# the JSON files of a Hugging Face folder that transformers or tokenizers parse (from_pretrained, the export's copy)
HF_JSON_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                 "special_tokens_map.json")


def hf_adapter(path: str | Path, shown: str | None = None, *, confine: bool = True) -> tuple[HFCausalLM, dict]:
    """The adapter module around the folder's model (``.config`` is an :class:`HFContractConfig`, ``.tokenizer``
    the tokenizer files' bytes as read) and the origin to record; see :func:`mhaexport.models.loading.load_hf`.
    ``shown``: how messages name the model (default: ``path``). ``confine``: transformers loads a private copy of
    the folder's files, each opened inside it without following a link (:mod:`mhaexport.models.hf_files`); off for
    a Hub snapshot, held to the cache's own rules. transformers never runs the folder's code
    (``trust_remote_code=False``: a config with ``auto_map`` is refused, no prompt)."""
    from mhaexport.models.hf_files import hf_files
    from mhaexport.untrusted import load_json

    folder = Path(path)
    path = shown or path
    if not (folder / "config.json").is_file():
        what = "does not exist" if not folder.exists() else "has no config.json"
        raise ModelLoadError(f"--hf {path}: {what} (expected a Hugging Face save_pretrained folder)")
    transformers = import_transformers()
    with hf_files(folder, str(path), confine=confine) as files, _quiet(transformers):
        for name in HF_JSON_FILES:  # bounded (size, depth) by mhaexport's reader before transformers parses them
            if (files.dir / name).is_file():
                load_json(files.dir / name, f"--hf {path}: {name}")
        label = architecture_label(files.dir)
        try:
            hf_config = transformers.AutoConfig.from_pretrained(str(files.dir), local_files_only=True,
                                                                trust_remote_code=False)
        except Exception as e:
            if isinstance(e, ValueError) and "custom code" in str(e):
                raise ModelLoadError(f"--hf {path} ({label}): its config.json names Python code of its own "
                                     "(auto_map): mhaexport never runs a folder's code through transformers "
                                     "(trust_remote_code=False); wrap the model with --model SPEC instead") from None
            raise ModelLoadError(f"--hf {path} ({label}): transformers cannot read config.json: "
                                 f"{first_line(e).replace(str(files.dir), str(path))}") from None
        try:
            model = transformers.AutoModelForCausalLM.from_pretrained(
                str(files.dir), local_files_only=True, attn_implementation="eager", dtype=torch.float32,
                trust_remote_code=False)
        except Exception as e:
            raise ModelLoadError(f"--hf {path} ({label}): transformers cannot load it as a causal LM: "
                                 f"{first_line(e).replace(str(files.dir), str(path))}") from None
        # torch.jit.trace reads every property of every module; `loss_function` logs once ("loss_type=None ... is
        # unrecognized") on the inner base model: read it here, where transformers' logs are silenced
        for module in model.modules():
            if hasattr(type(module), "loss_function"):
                getattr(module, "loss_function", None)
    model.eval()
    text_cfg = hf_config.get_text_config(decoder=True) if hasattr(hf_config, "get_text_config") else hf_config
    arch = (getattr(hf_config, "architectures", None) or [type(model).__name__])[0]
    model_type = getattr(hf_config, "model_type", "") or ""
    label = f"{arch} ({model_type})"
    params = inspect.signature(model.forward).parameters
    cache_kw = "cache" if "cache" in params else "past_key_values"
    cache_cls = getattr(transformers, "DynamicCache", None)
    if cache_cls is None:
        raise ModelLoadError(f"--hf needs a transformers whose KV cache is a DynamicCache: {INSTALL_LINE}")
    # the real sizes come from the cache this probe call returns
    probe = HFContractConfig(n_layers=1, n_heads=1, head_dim=1, vocab_size=1, max_positions=2, n_kv_heads=1)
    adapter = HFCausalLM(model, probe, cache_kw, cache_cls)
    ids = torch.zeros(1, 2, dtype=torch.long)  # (1, 2)
    mask = torch.ones(1, 2, dtype=torch.long)  # (1, 2)
    try:
        with torch.no_grad():
            _, cache = adapter(ids, mask, ())
    except ModelLoadError as e:
        raise ModelLoadError(f"--hf {path} ({label}): {e}") from None
    except Exception as e:
        where = failing_module(e)
        raise ModelLoadError(f"--hf {path} ({label}): forward failed{f' in {where}' if where else ''}: "
                             f"{first_line(e)}") from None
    config = _contract_config(text_cfg, cache, label)
    config.model_type, config.architecture = model_type, arch
    adapter.config = config
    adapter.tokenizer = files.tokenizer  # {name: bytes} of tokenizer.json & co as read (what an export ships)
    origin = {"kind": "hf", "path": str(folder.resolve()), "model_type": model_type, "architecture": arch}
    return adapter, origin
