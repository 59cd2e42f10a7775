"""Hugging Face causal LMs under the decoder contract: ``--hf DIR`` (a local ``save_pretrained`` folder).

:func:`mhaexport.models.loading.load_hf` loads ``AutoModelForCausalLM.from_pretrained(DIR, local_files_only=True)`` (eager attention,
float32, eval) and wraps it in :class:`HFCausalLM`, whose ``forward(input_ids, attention_mask, past_key_values)``
is the contract's: positions come from the attention mask (``cumsum(mask) - 1``, so left padding, the past
offset and onnxruntime-genai's right padding all give each row its own positions), the cache goes in as the
contract's tuples (a ``DynamicCache`` is built from them inside forward) and comes out as tuples. The exports so
keep mhaexport's I/O names and every verify check applies unchanged.

Sliding windows (Mistral, Phi-3, Gemma 2/3, Qwen2/3 with ``use_sliding_window``, gpt-oss) are read from the config:
``layer_types`` where the config has it (Qwen2Config, Gemma2Config... build it themselves), else one
``sliding_window`` for every layer (Mistral, Phi-3). transformers places a window on cache *slots* (``kv_idx >
q_idx - W``), which right padding inside the window shifts; the adapter instead hands transformers its own 4D masks,
one per layer type, with the window on each row's own token positions (query position p sees p-W+1..p, the current
token inside), so an unpadded row gets exactly transformers' mask and a padded row the same attention as unpadded.
Softcaps, the query scale and attention sinks stay transformers' own code; the adapter's config names them
(``attn_softcap``, ``final_softcap``, ``attn_scale``, ``attn_sinks``) for the contract and the lowerings.

``mhaexport onnx --hf`` loads the folder streamed (:mod:`mhaexport.models.hf_stream`): its safetensors staged one
tensor at a time, the model's parameters that file memory-mapped, the probe below run on the meta device.

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
import tempfile
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import torch
from torch import nn

from mhaexport.artifact.source import HfSource
from mhaexport.core.untrusted import shown
from mhaexport.core.errors import ArtifactError, MhaExportError, ModelLoadError, first_line
from mhaexport.models.stack import CacheHandoff
from mhaexport.models.tracebacks import failing_module

if TYPE_CHECKING:
    from mhaexport.models.stream import WeightsFile

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
    # per layer the sliding window W (query position p sees p-W+1..p on the row's own positions) or 0 for full;
    # None: every layer full
    layer_windows: list[int] | None = None
    attn_softcap: float | None = None  # scores -> c * tanh(scores / c) before the mask (Gemma 2/3)
    final_softcap: float | None = None  # the same on the logits (Gemma 2)
    attn_scale: float | None = None  # the score scale when it is not 1/sqrt(head_dim) (Gemma's query_pre_attn_scalar)
    attn_sinks: bool = False  # a learned per-head logit in the softmax's denominator (gpt-oss)


@dataclass(frozen=True)
class WindowPlan:
    """How the adapter masks a windowed model: the window of each transformers layer type (0: full), and whether
    transformers takes them as a dict keyed by layer type (models with ``layer_types``) or as one 4D mask."""

    windows: dict[str, int]
    by_type: bool


def window_masks(attention_mask: torch.Tensor, last: torch.Tensor, plan: WindowPlan,
                 dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """{layer type: (B, 1, T, S) additive mask} for the query slots ``last`` (T of the mask's S): causal on slots,
    padding, and each type's window on the row's own positions (``cumsum(mask) - 1``), so padding never moves a
    window."""
    slots = torch.arange(attention_mask.shape[1], device=attention_mask.device)  # (S,)
    pos = attention_mask.cumsum(-1) - 1  # (B, S) each key's own position
    q_pos = pos.index_select(1, last)  # (B, T)
    seen = (slots[None, None, :] <= last[None, :, None]) & attention_mask[:, None, :].bool()  # (B, T, S)
    # a padding query sees itself: its row stays finite (float16's min fill overflows a row of nothing to -inf,
    # and its NaN keys and values would reach real rows through 0 * NaN); real rows see themselves already
    seen = seen | (slots[None, None, :] == last[None, :, None])  # (B, T, S)
    out = {}
    for kind, W in plan.windows.items():
        allowed = seen & (pos[:, None, :] > q_pos[:, :, None] - W) if W else seen  # (B, T, S)
        blocked = torch.zeros(allowed.shape, dtype=dtype, device=attention_mask.device)
        out[kind] = blocked.masked_fill(~allowed, torch.finfo(dtype).min)[:, None]  # (B, 1, T, S)
    return out


class HFCausalLM(nn.Module):
    """A transformers causal LM under the decoder contract (see the module docstring)."""

    block_handoff = CacheHandoff  # where a layer takes its past and gives its present (verify's block order)

    def __init__(self, model: nn.Module, config: HFContractConfig, cache_kw: str, cache_cls: type,
                 window_plan: WindowPlan | None = None) -> None:
        super().__init__()
        self.hf = model
        self.config = config
        self._cache_kw = cache_kw  # "cache" (transformers 5.x) or "past_key_values"
        self._cache_cls = cache_cls  # transformers.DynamicCache
        self.tokenizer: dict[str, bytes] = {}  # the folder's tokenizer files as read (hf_adapter)
        self._window_plan = window_plan  # None: no layer has a window, transformers builds its masks
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
        mask: Any = attention_mask
        if self._window_plan is not None:
            dtype = self.hf.get_input_embeddings().weight.dtype
            masks = window_masks(attention_mask, last, self._window_plan, dtype)  # type -> (B, 1, T, total)
            mask = masks if self._window_plan.by_type else next(iter(masks.values()))
        out = self.hf(input_ids=input_ids, attention_mask=mask, position_ids=positions,
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
    from mhaexport.core.untrusted import load_json

    try:
        data = load_json(Path(path) / "config.json", f"{path}/config.json")
        arch = (data.get("architectures") or ["?"])[0]
        return f"{arch} ({data.get('model_type', '?')})"
    except Exception:
        return Path(path).name


def _contract_config(cfg: Any, cache: tuple, label: str) -> tuple[HFContractConfig, WindowPlan | None]:
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
    windows, plan = _windows(cfg, n_layers, max_pos, label)
    eos = _first_int(getattr(cfg, "eos_token_id", None))
    pad = _first_int(getattr(cfg, "pad_token_id", None))
    vocab = getattr(cfg, "vocab_size", None)
    if not isinstance(vocab, int) or vocab < 1:
        raise ModelLoadError(f"{label}: config.vocab_size={vocab!r}")
    ids = {"bos_token_id": _first_int(getattr(cfg, "bos_token_id", None)), "eos_token_id": eos,
           "pad_token_id": pad if pad is not None else eos}  # no pad id: eos pads (onnxruntime-genai's builder)
    ids = {k: (v if v is not None and v < vocab else None) for k, v in ids.items()}
    config = HFContractConfig(n_layers=n_layers, n_heads=n_heads, head_dim=head_dim, vocab_size=vocab,
                              max_positions=max_pos, n_kv_heads=n_kv, notes=notes, layer_windows=windows, **ids)
    config.attn_softcap = _positive(getattr(cfg, "attn_logit_softcapping", None))
    config.final_softcap = _positive(getattr(cfg, "final_logit_softcapping", None))
    scalar = _positive(getattr(cfg, "query_pre_attn_scalar", None))
    if scalar is not None and scalar != head_dim:
        config.attn_scale = scalar ** -0.5
    return config, plan


def _positive(value: Any) -> float | None:
    """A config's optional float (a softcap, a scalar): None when unset or not a positive number."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0
    return float(value) if ok else None


# transformers' names of the layer types the adapter masks itself: a window, or full causal attention
SLIDING, FULL = "sliding_attention", "full_attention"


def _windows(cfg: Any, n_layers: int, max_pos: int, label: str) -> tuple[list[int] | None, WindowPlan | None]:
    """Each layer's window from the config and how to hand transformers the masks; (None, None) when no layer has
    one. ``layer_types`` decides where the config has it (every family that mixes local and global layers builds it
    in its config class: Qwen2's from ``use_sliding_window`` and ``max_window_layers``); a config without it windows
    every layer with ``sliding_window`` (Mistral, Phi-3). A window that covers ``max_positions`` is full attention."""
    W = getattr(cfg, "sliding_window", None)
    W = W if isinstance(W, int) and not isinstance(W, bool) and 0 < W < max_pos else 0
    if getattr(cfg, "use_sliding_window", True) is False:
        W = 0
    types = getattr(cfg, "layer_types", None)
    if isinstance(types, (list, tuple)) and types:
        types = [str(t) for t in types]
        if len(types) != n_layers:
            raise ModelLoadError(f"{label}: config.layer_types names {len(types)} layers, the cache has {n_layers}")
        other = sorted(set(types) - {SLIDING, FULL})
        if other:
            raise ModelLoadError(f"{label}: config.layer_types has {other[0]!r}; mhaexport masks "
                                 f"{SLIDING!r} and {FULL!r} layers only")
        windows = [W if t == SLIDING else 0 for t in types]
        plan = WindowPlan({t: (W if t == SLIDING else 0) for t in dict.fromkeys(types)}, by_type=True)
    else:
        windows = [W] * n_layers
        plan = WindowPlan({SLIDING if W else FULL: W}, by_type=False)
    if not any(windows):
        return None, None
    return windows, plan


# transformers' mixture-of-experts implementation the adapter runs: each token's experts gathered and multiplied as
# batched matrices (plain ops). Its default, "grouped_mm", is a custom op (``transformers::grouped_mm_fallback``
# on CPU) that torch.onnx cannot translate, and "eager" loops over the experts a batch hits (data-dependent).
EXPERTS = "batched_mm"


def _exportable_experts(model: nn.Module) -> None:
    """Switch a mixture-of-experts model (gpt-oss, Qwen3-MoE, ...) to :data:`EXPERTS`; other models are untouched."""
    can = getattr(model, "_can_set_experts_implementation", None)
    if callable(can) and can() and getattr(model.config, "_experts_implementation", EXPERTS) != EXPERTS:
        model.set_experts_implementation(EXPERTS)


# a Hugging Face config's sizes, bounded before transformers builds a module (a config asking for a million layers
# builds modules for minutes and GBs before anything else refuses it): the built-in decoder's bounds
# (models/config.py MAX_FIELD), the fields under their transformers names
HF_SIZES = {"num_hidden_layers": "n_layers", "n_layer": "n_layers", "num_layers": "n_layers",
            "hidden_size": "d_model", "n_embd": "d_model", "d_model": "d_model",
            "num_attention_heads": "n_heads", "n_head": "n_heads", "num_key_value_heads": "n_heads",
            "head_dim": "d_model", "vocab_size": "vocab_size", "intermediate_size": "d_ff", "n_inner": "d_ff",
            "num_local_experts": "n_layers", "num_experts": "n_layers", "moe_intermediate_size": "d_ff"}


def check_sizes(hf_config, where: str) -> None:
    """ModelLoadError (exit 2) naming the field when a size of ``hf_config`` (its text config too) is not an integer
    within the built-in decoder's bounds, or the parameters it implies pass :data:`MAX_PARAMETERS`: checked before
    transformers builds any module."""
    from mhaexport.models.config import MAX_FIELD, MAX_PARAMETERS

    configs = [hf_config]
    text = hf_config.get_text_config(decoder=True) if hasattr(hf_config, "get_text_config") else None
    if text is not None and text is not hf_config:
        configs.append(text)
    for cfg in configs:
        sizes = {}
        for key, kind in HF_SIZES.items():
            v = getattr(cfg, key, None)
            if v is None:
                continue
            if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= MAX_FIELD[kind]:
                raise ModelLoadError(f"{where}: {key}={shown(repr(v)[:40])} is outside 0..{MAX_FIELD[kind]}, the sizes "
                                     "mhaexport builds: refused before any module is built")
            sizes[kind] = max(sizes.get(kind, 0), v)
        layers, d, ff, vocab = (sizes.get(k, 0) for k in ("n_layers", "d_model", "d_ff", "vocab_size"))
        experts = max(getattr(cfg, "num_local_experts", 0) or 0, getattr(cfg, "num_experts", 0) or 0, 1)
        parameters = layers * (4 * d * d + 3 * d * (ff or 4 * d) * experts) + 2 * vocab * d
        if parameters > MAX_PARAMETERS:
            raise ModelLoadError(f"{where}: its sizes make about {parameters:.3g} parameters, more than the "
                                 f"{MAX_PARAMETERS:.3g} mhaexport builds: refused before any module is built")


# the JSON files of a Hugging Face folder that transformers or tokenizers parse (from_pretrained, the export's copy)
HF_JSON_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                 "special_tokens_map.json")


class HfModel(NamedTuple):
    """What :func:`hf_adapter` loads: the adapter, the origin to record, and for a streamed load the staging file its
    parameters map and the same adapter on the meta device (shapes only: the smoke check)."""

    adapter: HFCausalLM
    origin: HfSource
    weights: WeightsFile | None = None
    meta: HFCausalLM | None = None


def _weights_bytes(folder: Path) -> int:
    """The bytes of a folder's safetensors/bin weights (0 where they cannot be listed)."""
    try:
        return sum(p.stat().st_size for p in folder.iterdir() if p.suffix in (".safetensors", ".bin") and p.is_file())
    except OSError:
        return 0


def hf_adapter(path: str | Path, shown: str | None = None, *, confine: bool = True,
               streamed: bool = False, keep_half: bool = False,
               ready: Callable[[], None] | None = None) -> HfModel:
    """The adapter module around the folder's model (``.config`` is an :class:`HFContractConfig`, ``.tokenizer``
    the tokenizer files' bytes as read) and the origin to record; see :func:`mhaexport.models.loading.load_hf`.
    ``shown``: how messages name the model (default: ``path``). ``confine``: transformers loads a private copy of
    the folder's files, each opened inside it without following a link (:mod:`mhaexport.models.hf_files`); off for
    a Hub snapshot, held to the cache's own rules. transformers never runs the folder's code
    (``trust_remote_code=False``: a config with ``auto_map`` is refused, no prompt). ``streamed``: the weights
    staged one tensor at a time and mapped (:mod:`mhaexport.models.hf_stream`), the probe run on the meta device; a
    folder that cannot be is loaded in memory, the reason in the config's notes. ``keep_half`` (with ``streamed``):
    a bfloat16/float16 folder staged in its own dtype (:func:`mhaexport.models.hf_stream.load_streamed`). ``ready``:
    called once the folder and its config are read and checked, before the weights are (a caller's "Loading ..."
    line: never before an error the checks give)."""
    from mhaexport.models.hf_files import hf_files
    from mhaexport.core.untrusted import load_json

    folder = Path(path)
    path = shown or path
    if not (folder / "config.json").is_file():
        what = "does not exist" if not folder.exists() else "has no config.json"
        raise ModelLoadError(f"--hf {path}: {what} (expected a Hugging Face save_pretrained folder)")
    transformers = import_transformers()
    cache_cls = getattr(transformers, "DynamicCache", None)
    if cache_cls is None:
        raise ModelLoadError(f"--hf needs a transformers whose KV cache is a DynamicCache: {INSTALL_LINE}")
    model = weights = meta = cache = None
    load_notes: list[str] = []
    # a streamed load stages the weights beside the private copy: float32 (a half-precision folder's twice its
    # bytes) unless kept in their own dtype
    reserve = (1 if keep_half else 2) * _weights_bytes(folder) if streamed else 0
    with hf_files(folder, str(path), confine=confine, reserve=reserve) as files, _quiet(transformers):
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
        check_sizes(hf_config, f"--hf {path}: config.json")  # before transformers builds a module
        if ready is not None:
            ready()
        if streamed:
            try:
                model, weights, meta, cache, load_notes = _load_streamed(transformers, hf_config, files.dir,
                                                                         cache_cls, keep_half)
            except MhaExportError as e:  # named by the user's folder, not the private copy read
                if str(files.dir) not in str(e):
                    raise
                raise type(e)(str(e).replace(str(files.dir), str(path))) from None
        if model is None:
            try:
                model = transformers.AutoModelForCausalLM.from_pretrained(
                    str(files.dir), local_files_only=True, attn_implementation="eager", dtype=torch.float32,
                    trust_remote_code=False)
            except Exception as e:
                raise ModelLoadError(f"--hf {path} ({label}): transformers cannot load it as a causal LM: "
                                     f"{first_line(e).replace(str(files.dir), str(path))}") from None
        _exportable_experts(model)
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
    cache_kw = _cache_kw(model)
    # the real sizes come from the cache this probe call returns
    adapter = HFCausalLM(model, _probe_config(), cache_kw, cache_cls)
    if cache is None:
        try:
            cache = _probe(adapter, "cpu")
        except ModelLoadError as e:
            raise ModelLoadError(f"--hf {path} ({label}): {e}") from None
        except Exception as e:
            where = failing_module(e)
            raise ModelLoadError(f"--hf {path} ({label}): forward failed{f' in {where}' if where else ''}: "
                                 f"{first_line(e)}") from None
    config, plan = _contract_config(text_cfg, cache, label)
    config.model_type, config.architecture = model_type, arch
    config.attn_sinks = any(isinstance(getattr(m, "sinks", None), nn.Parameter) for m in model.modules())
    config.notes += load_notes
    adapter.config = config
    adapter.tokenizer = files.tokenizer  # {name: bytes} of tokenizer.json & co as read (what an export ships)
    adapter._window_plan = plan
    if meta is not None:
        meta.config, meta._window_plan = config, plan
    return HfModel(adapter, HfSource(path=str(folder.resolve()), model_type=model_type, architecture=arch), weights,
                   meta)


def _cache_kw(model: nn.Module) -> str:
    """The keyword the model's forward takes its cache by: "cache" (transformers 5.x) or "past_key_values"."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def _probe_config() -> HFContractConfig:
    return HFContractConfig(n_layers=1, n_heads=1, head_dim=1, vocab_size=1, max_positions=2, n_kv_heads=1)


def _probe(adapter: HFCausalLM, device: str) -> tuple:
    """The cache one call at batch 1, seq 2 returns (its shapes are the contract's); ``device`` "meta": shapes only."""
    ids = torch.zeros(1, 2, dtype=torch.long, device=device)  # (1, 2)
    mask = torch.ones(1, 2, dtype=torch.long, device=device)  # (1, 2)
    with torch.no_grad():
        _, cache = adapter(ids, mask, ())
    return cache


def _load_streamed(transformers, hf_config, folder: Path, cache_cls: type, keep_half: bool = False) -> tuple:
    """(model over its staged weights, the staging file, the adapter on the meta device, the probe's cache, notes),
    or (None, None, None, None, [why not]) for a folder loaded in memory instead (:mod:`mhaexport.models.hf_stream`).
    The probe runs on the meta device first: a model that cannot is never staged."""
    from mhaexport.models import hf_stream

    why = hf_stream.why_not(hf_config)
    files: list[Path] = []
    if why is None:
        files, why = hf_stream.checkpoint_files(folder)
    if why is None and hf_stream.model_class(transformers, hf_config) is None:
        why = f"transformers maps no causal LM class to {type(hf_config).__name__} directly"
    meta = cache = None
    if why is None:
        try:
            meta_model = hf_stream.meta_model(transformers, hf_config)
            _exportable_experts(meta_model)
            meta = HFCausalLM(meta_model, _probe_config(), _cache_kw(meta_model), cache_cls)
            cache = _probe(meta, "meta")
        except Exception as e:
            why = f"its forward does not run on the meta device ({first_line(e)})"
    if why is None:
        try:
            model, weights, notes = hf_stream.load_streamed(transformers, hf_config, files, keep_half=keep_half)
            return model, weights, meta, cache, notes
        except OSError as e:  # no room in TMPDIR: loading the model in memory instead would not fit either
            raise ArtifactError(f"cannot stage the weights in {tempfile.gettempdir()} ({first_line(e)}): the folder's "
                                "weights are written there before they are read, streamed; set TMPDIR to a folder "
                                "with room for them") from None
        except MhaExportError:  # a file the strict readers refuse (a header's key twice): refused, not loaded by
            raise               # transformers' laxer parser instead
        except Exception as e:  # the in-memory load says what is wrong, if anything is
            why = f"staging its weights failed ({first_line(e)})"
    return None, None, None, None, [hf_stream.fallback_note(why)]
