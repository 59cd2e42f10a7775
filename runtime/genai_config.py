"""What onnxruntime-genai's ``genai_config.json`` must say, field by field, against the graph it drives, the manifest
that vouches for the file, the model it claims to be and the tokenizer that ships with it: the ``genai-config``
check's findings, torch- and onnx-free (the deploy runtime reads them before it lets onnxruntime-genai run a folder;
verify and lint report them: :mod:`mhaexport.verify.genai_check`).

onnxruntime-genai believes its config: a ``context_length`` below the model's positions makes it refuse lengths the
model handles, one above them feeds positions the model never learned; wrong head or layer counts size its cache
wrong; a ``past_present_share_buffer`` the graph cannot honour feeds it a buffer it does not write; a name template
that misses the graph's inputs leaves a cache unfed; ``search`` defaults (sampling, a repetition penalty, beams)
make what it generates differ from greedy decoding. Each finding names the field.

:func:`config_findings` needs the config and the graph's I/O (a :class:`GraphIO`: read from the graph with onnx by
verify and lint, from the manifest's record of it by :func:`deploy_findings`); given the model's contract, the
manifest's file and cache layout and the tokenizer's ids it checks those too.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mhaexport.artifact.record import R, Record
from mhaexport.core.errors import ArtifactError, UntrustedInput
from mhaexport.core.untrusted import load_json, shown

GENAI_CONFIG = "genai_config.json"
GENAI_CHECK = "genai-config"
CACHE_OPS_IN_PLACE = ("GroupQueryAttention", "PagedAttention")  # the ops that write a shared past/present buffer
# the inputs onnxruntime-genai's decoder feeds besides the named ones (its defaults when the config names none)
DEFAULT_NAMES = {"input_ids": "input_ids", "attention_mask": "attention_mask", "position_ids": "position_ids",
                 "past_key_names": "past_key_values.%d.key", "past_value_names": "past_key_values.%d.value",
                 "logits": "logits", "present_key_names": "present.%d.key", "present_value_names": "present.%d.value"}
# inputs it may feed that are not the model's tokens or cache
OTHER_FED = ("past_sequence_length", "total_sequence_length", "cache_indirection", "inputs_embeds",
             "current_sequence_length", "seqlens_k")


@dataclass
class ConfigFinding:
    """One field of the config that disagrees with what it describes: ``field`` is its JSON path
    ("model.decoder.num_key_value_heads", "search.repetition_penalty"), ``message`` what was found and expected."""

    field: str
    message: str
    severity: str = "error"

    def line(self) -> str:
        return f"{self.field}: {self.message}"


@dataclass
class AttentionAttrs:
    """The graph's first attention op and its head counts (None: not an attribute of that op)."""

    op: str | None = None
    num_heads: int | None = None
    q_num_heads: int | None = None
    kv_num_heads: int | None = None


@dataclass
class GqaWindow:
    """A layer's GroupQueryAttention window: ``local_window_size`` (-1: full attention) and
    ``sliding_window_cache`` (1: it evicts in a window-sized cache; 0 unless set)."""

    local_window_size: int = -1
    sliding_window_cache: int = 0


@dataclass
class GraphIO:
    """What a config is checked against in the graph: input/output names with their shapes (ints or dim names),
    the op types present and the first attention op's head counts."""

    inputs: dict[str, list] = field(default_factory=dict)
    outputs: dict[str, list] = field(default_factory=dict)
    ops: set[str] = field(default_factory=set)
    attention: AttentionAttrs = field(default_factory=AttentionAttrs)
    # per layer (from its past_key_values.{i}.key input) its GroupQueryAttention's window; None where not read
    # (the manifest)
    windows: dict[int, GqaWindow] | None = None


@dataclass
class Expected:
    """What the config must say, where it is known: the model's contract, the manifest's file name and cache
    layout, and the special ids of the model's config and the shipped tokenizer."""

    contract: Any = None  # iospec.ModelContract
    filename: str | None = None  # the manifest's hashed ONNX file (its name inside the folder)
    shared: bool | None = None  # the manifest's cache layout: one buffer written in place
    capacity: int | None = None  # a shared buffer's length when the graph fixes it
    special: dict[str, tuple[set[int], str]] = field(default_factory=dict)  # {bos_token_id: ({ids}, "where from")}


# ---- the fields onnxruntime-genai reads, as records -------------------------------------------------------------
#
# Each key is declared once, with onnxruntime-genai's default where it has one. The values are not type-checked on
# reading (every value is ``Any``): a config is checked by the findings, which name a wrong value's field; reading
# one never refuses it.

@dataclass
class GenaiSearch(Record):
    """``search``: how onnxruntime-genai generates, its defaults where a key is absent."""

    do_sample: Any = False
    num_beams: Any = 1
    num_return_sequences: Any = 1
    repetition_penalty: Any = 1.0
    no_repeat_ngram_size: Any = 0
    min_length: Any = 0
    max_length: Any = None
    temperature: Any = 1.0
    top_k: Any = None
    top_p: Any = 1.0
    length_penalty: Any = 1.0
    diversity_penalty: Any = 0.0
    past_present_share_buffer: Any = False


@dataclass
class GenaiDecoder(Record):
    """``model.decoder``: the file, its I/O names (``inputs``/``outputs``: field -> graph name or template) and
    sizes, and a window-sized cache's ``sliding_window``."""

    filename: Any = None
    inputs: Any = None
    outputs: Any = None
    hidden_size: Any = None
    head_size: Any = None
    num_attention_heads: Any = None
    num_key_value_heads: Any = None
    num_hidden_layers: Any = None
    sliding_window: Any = None
    session_options: Any = None  # GenaiSessionOptions


@dataclass
class GenaiSessionOptions(Record):
    """``model.decoder.session_options``: what onnxruntime-genai sets on the decoder's session (its providers)."""

    provider_options: Any = None  # [{provider name: {option: value}}, ...]


@dataclass
class GenaiModel(Record):
    """``model``: the decoder (an object when onnxruntime-genai can run it), the vocabulary, the context length and
    the special ids."""

    decoder: Any = None
    vocab_size: Any = None
    context_length: Any = None
    bos_token_id: Any = None
    eos_token_id: Any = None
    pad_token_id: Any = None


@dataclass
class GenaiConfig(Record):
    """The whole file: ``model`` and ``search`` (other sections kept as read)."""

    model: Any = None
    search: Any = None


@dataclass
class GenaiSlidingWindow(Record):
    """``model.decoder.sliding_window``: the window and the layers (none listed: every layer) that keep a
    window-sized cache."""

    window_size: Any = None
    layers: Any = None


def section(cls: type[R], value: Any) -> R | None:
    """``value`` read as ``cls`` when it is an object, else None (never a refusal: every field is ``Any``)."""
    return cls.from_dict(value) if isinstance(value, dict) else None


def _ints(v) -> list[int] | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return [v]
    if isinstance(v, list) and v and all(isinstance(x, int) and not isinstance(x, bool) for x in v):
        return list(v)
    return None


def _search_findings(search: GenaiSearch) -> list[ConfigFinding]:
    """``search`` defaults that make onnxruntime-genai's output differ from greedy decoding."""
    out = []

    def f(key: str, why: str) -> None:
        out.append(ConfigFinding(f"search.{key}", f"{getattr(search, key)!r}: {why}"))

    sampling = search.do_sample is True
    if sampling:
        f("do_sample", "onnxruntime-genai samples by default instead of decoding greedily (what verify proves)")
    beams = search.num_beams
    if isinstance(beams, int) and beams > 1:
        f("num_beams", "beam search by default, not greedy decoding")
    if search.num_return_sequences not in (1, None):
        f("num_return_sequences", "several sequences per prompt: the batch onnxruntime-genai runs is not the prompts'")
    rp = search.repetition_penalty
    if isinstance(rp, (int, float)) and rp != 1.0:
        f("repetition_penalty", "penalizes tokens already generated: the tokens differ from greedy decoding")
    ngram = search.no_repeat_ngram_size
    if isinstance(ngram, int) and ngram > 0:
        f("no_repeat_ngram_size", "forbids repeated n-grams: the tokens differ from greedy decoding")
    ml = search.min_length
    if isinstance(ml, int) and ml > 0:
        f("min_length", "suppresses eos before that length: the tokens differ from greedy decoding")
    if sampling:  # only with sampling do these change the output
        if search.temperature not in (1, 1.0, None):
            f("temperature", "with do_sample: scales the logits before sampling")
        if isinstance(search.top_k, int) and search.top_k not in (0, 1):
            f("top_k", "with do_sample: samples among the top k")
        if search.top_p not in (1, 1.0, None, 0, 0.0):
            f("top_p", "with do_sample: nucleus sampling")
    if isinstance(beams, int) and beams > 1:
        if search.length_penalty not in (1, 1.0, None):
            f("length_penalty", "with beams: rescores sequences by length")
        if search.diversity_penalty not in (0, 0.0, None):
            f("diversity_penalty", "with beams: penalizes similar beams")
    return out


def config_findings(cfg: dict, graph: GraphIO, expected: Expected | None = None) -> list[ConfigFinding]:
    """Every field onnxruntime-genai reads, against the graph (always) and ``expected`` (what is known of the model,
    the manifest and the tokenizer). Returns the findings; [] when the config describes the file and greedy
    decoding."""
    exp = expected or Expected()
    out: list[ConfigFinding] = []

    def bad(path: str, message: str, severity: str = "error") -> None:
        out.append(ConfigFinding(path, message, severity))

    config = section(GenaiConfig, cfg) or GenaiConfig()
    model = section(GenaiModel, config.model)
    if model is None or not isinstance(model.decoder, dict):
        return [ConfigFinding("model.decoder", "missing: onnxruntime-genai has no decoder to run")]
    dec = GenaiDecoder.from_dict(model.decoder)
    search = section(GenaiSearch, config.search) or GenaiSearch()
    c = exp.contract

    # --- the file -------------------------------------------------------------------------------------------
    fname = dec.filename
    if not isinstance(fname, str) or not fname:
        bad("model.decoder.filename", f"{fname!r}: not a file name")
    elif Path(fname).name != fname or fname in (".", ".."):
        bad("model.decoder.filename", f"{fname!r}: not a file inside the folder (onnxruntime-genai would load "
                                      "another file than the one verified)")
    elif exp.filename is not None and fname != exp.filename:
        bad("model.decoder.filename", f"{fname!r}: the manifest's hashed ONNX file is {exp.filename!r} — "
                                      "onnxruntime-genai would run a file verify never checked")

    # --- names: every input onnxruntime-genai feeds exists, every graph input is fed ---------------------------
    names_in, names_out = ({k: v for k, v in group.items() if isinstance(v, str)} if isinstance(group, dict) else {}
                           for group in (dec.inputs, dec.outputs))
    for where in ("inputs", "outputs"):  # a name that is not a string: said once, then the default name is checked
        group = getattr(dec, where)
        for k, v in (group.items() if isinstance(group, dict) else ()):
            if not isinstance(v, str):
                bad(f"model.decoder.{where}.{shown(k)}", f"{shown(repr(v))[:60]}: not a name")
    layers = dec.num_hidden_layers
    n_layers = layers if isinstance(layers, int) and not isinstance(layers, bool) and layers > 0 else None
    fed: set[str] = set()
    for key, where, group in (("input_ids", "inputs", names_in), ("attention_mask", "inputs", names_in),
                              ("logits", "outputs", names_out)):
        name = group.get(key, DEFAULT_NAMES[key])
        have = graph.inputs if where == "inputs" else graph.outputs
        if name not in have:
            bad(f"model.decoder.{where}.{key}", f"{name!r} is not a graph {where[:-1]} (the graph's: "
                                                f"{', '.join(list(have)[:6])}{' ...' if len(have) > 6 else ''})")
        fed.add(name)
    pos = names_in.get("position_ids", DEFAULT_NAMES["position_ids"])
    if pos in graph.inputs:
        fed.add(pos)
    elif "position_ids" in names_in:
        bad("model.decoder.inputs.position_ids", f"{pos!r} is not a graph input")
    templates = (("inputs", "past_key_names", names_in, graph.inputs), ("inputs", "past_value_names", names_in,
                 graph.inputs), ("outputs", "present_key_names", names_out, graph.outputs),
                 ("outputs", "present_value_names", names_out, graph.outputs))
    for where, key, group, have in templates:
        t = group.get(key, DEFAULT_NAMES[key])
        if not isinstance(t, str) or "%d" not in t:
            bad(f"model.decoder.{where}.{key}", f"{t!r}: not a per-layer name template (with %d)")
            continue
        pattern = re.compile(re.escape(t).replace("%d", r"(\d+)") + "$")
        found = sorted(int(m.group(1)) for n in have if (m := pattern.match(n)))
        if where == "inputs":
            fed.update(t % i for i in found)
        if n_layers is not None and found != list(range(n_layers)):
            missing = [t % i for i in range(n_layers) if i not in found][:2]
            extra = [t % i for i in found if i >= n_layers][:2]
            said = (f"{', '.join(missing)} not a graph {where[:-1]}" if missing else
                    f"the graph has {len(found)} layers' ({', '.join(extra)} beyond num_hidden_layers={n_layers})")
            bad(f"model.decoder.{where}.{key}", f"{t!r}: {said}")
    unfed = [n for n in graph.inputs if n not in fed and n not in OTHER_FED]
    if unfed:
        bad("model.decoder.inputs", f"the graph input(s) {', '.join(unfed)} are named by no field: "
                                    "onnxruntime-genai would not feed them")

    # --- sizes ------------------------------------------------------------------------------------------------
    past_key = names_in.get("past_key_names", DEFAULT_NAMES["past_key_names"])
    shape0 = graph.inputs.get(past_key % 0, []) if isinstance(past_key, str) and "%d" in past_key else []
    graph_kv = shape0[1] if len(shape0) == 4 and isinstance(shape0[1], int) else None
    graph_hd = shape0[3] if len(shape0) == 4 and isinstance(shape0[3], int) else None
    graph_layers = None
    if isinstance(past_key, str) and "%d" in past_key:
        pattern = re.compile(re.escape(past_key).replace("%d", r"(\d+)") + "$")
        graph_layers = sum(1 for n in graph.inputs if pattern.match(n)) or None
    logits_shape = graph.outputs.get(names_out.get("logits", "logits"), [])
    graph_vocab = logits_shape[-1] if logits_shape and isinstance(logits_shape[-1], int) else None
    heads_attr = graph.attention.num_heads or graph.attention.q_num_heads
    kv_attr = graph.attention.kv_num_heads  # GroupQueryAttention's (MultiHeadAttention may repeat them)
    sizes = (
        ("model.decoder.head_size", dec.head_size, [(graph_hd, "the graph's cache"),
                                                          (c and c.head_dim, "the model's head_dim")]),
        ("model.decoder.num_attention_heads", dec.num_attention_heads,
         [(heads_attr, f"the graph's {graph.attention.op} num_heads"), (c and c.n_heads, "the model's")]),
        ("model.decoder.num_key_value_heads", dec.num_key_value_heads,
         [(graph_kv, "the graph's cache"), (kv_attr, f"the graph's {graph.attention.op} kv_num_heads"),
          (c and c.n_kv_heads, "the model's")]),
        ("model.decoder.num_hidden_layers", n_layers if n_layers is not None else layers,
         [(graph_layers, "the graph's past inputs"), (c and c.n_layers, "the model's")]),
        ("model.vocab_size", model.vocab_size, [(graph_vocab, "the graph's logits"),
                                                       (c and c.vocab_size, "the model's")]),
    )
    for path, value, against in sizes:
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            bad(path, f"{value!r}: not a positive integer")
            continue
        for want, where in against:
            if isinstance(want, int) and want > 0 and want != value:
                bad(path, f"{value} but {where} is {want}")
                break
    hs, nh, hd = dec.hidden_size, dec.num_attention_heads, dec.head_size
    if isinstance(hs, int) and isinstance(nh, int) and isinstance(hd, int) and hs != nh * hd and \
            (c is None or hs != c.n_heads * c.head_dim):
        bad("model.decoder.hidden_size", f"{hs} but num_attention_heads x head_size is {nh * hd}")

    # --- lengths ----------------------------------------------------------------------------------------------
    ctx_len = model.context_length
    if not isinstance(ctx_len, int) or isinstance(ctx_len, bool) or ctx_len <= 0:
        bad("model.context_length", f"{ctx_len!r}: not a positive integer")
    else:
        if c is not None and ctx_len > c.max_positions:
            bad("model.context_length", f"{ctx_len} but the model has {c.max_positions} positions: "
                                        "onnxruntime-genai would feed positions the model never learned")
        elif c is not None and ctx_len < c.max_positions:
            bad("model.context_length", f"{ctx_len} but the model has {c.max_positions} positions: "
                                        f"onnxruntime-genai refuses any max_length above {ctx_len}")
        if exp.capacity is not None and ctx_len > exp.capacity:
            bad("model.context_length", f"{ctx_len} but the file's cache holds {exp.capacity} positions")
        ml = search.max_length
        if isinstance(ml, int) and ml > ctx_len:
            bad("search.max_length", f"{ml} but context_length is {ctx_len}: onnxruntime-genai refuses it")

    # --- the cache layout ---------------------------------------------------------------------------------------
    share = search.past_present_share_buffer
    if exp.shared is not None and bool(share) != exp.shared:
        bad("search.past_present_share_buffer",
            f"{share!r} but the file's cache is {'one shared buffer per layer, written in place' if exp.shared else 'concat-style (present = concat(past, new))'}: "  # noqa: E501
            f"onnxruntime-genai would {'allocate a new present each step and lose the in-place writes' if exp.shared else 'bind one buffer as past and present, which the graph does not write in place'}")  # noqa: E501
    elif share and graph.ops and not graph.ops & set(CACHE_OPS_IN_PLACE):
        bad("search.past_present_share_buffer", f"{share!r} but no op of the graph writes its cache in place "
                                                f"({'/'.join(CACHE_OPS_IN_PLACE)}): a concat-style cache")

    # --- special tokens -----------------------------------------------------------------------------------------
    vocab = c.vocab_size if c is not None else model.vocab_size
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        v = getattr(model, key)
        ids = _ints(v)
        if ids is None:
            if v is not None or key == "eos_token_id":
                bad(f"model.{key}", f"{v!r}: not a token id")
            continue
        if isinstance(vocab, int) and any(not 0 <= i < vocab for i in ids):
            bad(f"model.{key}", f"{v!r} is outside the vocabulary [0, {vocab})")
            continue
        want = exp.special.get(key)
        if want is not None:
            allowed, where = want
            # eos may be a list that adds end-of-turn ids to the model's: one of them is the model's
            ok = bool(set(ids) & allowed) if key == "eos_token_id" else set(ids) <= allowed
            if not ok:
                bad(f"model.{key}", f"{v!r} but {where} says {sorted(allowed)[0] if len(allowed) == 1 else sorted(allowed)}")

    out += window_findings(dec, graph, c)
    out += _search_findings(search)
    return out


# ---- sliding windows: one rule for the writer and the checker -----------------------------------------------------
#
# onnxruntime-genai reads ``model.decoder.sliding_window`` ({window_size, layers, slide_key_value_cache,
# slide_inputs, alignment, pad_value, cache_slack}) as "these layers keep a window-sized cache" (window_size plus a
# slack, 16 slots on CPU; its builder writes it only with GroupQueryAttention's ``sliding_window_cache=1``). A graph
# whose cache is full-length (mhaexport's, concat or shared: the window lives in the graph's mask or in
# GroupQueryAttention's local_window_size) must not have one: measured with onnxruntime-genai 0.18 on CPU, both
# layouts fail at the first step past window_size + 16 ("present.0.key has shape {1,2,24,16} but the computed
# output shape ... is {1,2,25,16}").

SLIDING_WINDOW = "model.decoder.sliding_window"


def sliding_window_entry(contract: Any, window_sized_cache: bool = False) -> dict | None:
    """What genai_config.json's ``sliding_window`` says for a model of ``contract`` (its per-layer windows):
    nothing unless the graph keeps a window-sized cache (``window_sized_cache``), then the window and the layers
    that have it. The writer writes it; :func:`window_findings` checks a config against the same rule."""
    if contract is None or not contract.windowed or not window_sized_cache:
        return None
    sizes = {w for w in contract.windows if w}
    if len(sizes) != 1:
        return None  # onnxruntime-genai takes one window_size for every listed layer
    return {"window_size": sizes.pop(), "slide_key_value_cache": False, "slide_inputs": False,
            "layers": [i for i, w in enumerate(contract.windows) if w]}


def window_findings(dec: dict | GenaiDecoder, graph: GraphIO, contract: Any = None) -> list[ConfigFinding]:
    """``sliding_window`` of ``dec`` (``model.decoder``) against the graph's GroupQueryAttention windows (per layer,
    where read) and the model's contract: the same window on the same layers, and a window-sized cache only over a
    graph that keeps one."""
    if not isinstance(dec, GenaiDecoder):
        dec = GenaiDecoder.from_dict(dec)
    if dec.sliding_window is None:
        return []
    entry = section(GenaiSlidingWindow, dec.sliding_window)
    if entry is None:
        return [ConfigFinding(SLIDING_WINDOW, f"{type(dec.sliding_window).__name__}, not an object")]
    w = entry.window_size
    if not isinstance(w, int) or isinstance(w, bool) or w <= 0:
        return [ConfigFinding(f"{SLIDING_WINDOW}.window_size", f"{w!r}: not a positive integer")]
    n = dec.num_hidden_layers if isinstance(dec.num_hidden_layers, int) else None
    listed = entry.layers
    if listed in (None, []):
        layers = list(range(n)) if n else []
    elif isinstance(listed, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in listed) and \
            len(listed) <= 4096:
        layers = sorted(set(listed))
    else:
        return [ConfigFinding(f"{SLIDING_WINDOW}.layers", f"{str(listed)[:80]}: not a list of layer indices")]
    out: list[ConfigFinding] = []
    for i in layers:
        where = f"{SLIDING_WINDOW} (layer {i})"
        if n is not None and not 0 <= i < n:
            out.append(ConfigFinding(where, f"no such layer (num_hidden_layers={n})"))
            continue
        if contract is not None and contract.window(i) != w:
            out.append(ConfigFinding(where, f"window {w} but the model's layer {i} has "
                                            f"{contract.window(i) or 'full attention'}"))
        if graph.windows is None:
            continue
        gqa = graph.windows.get(i)
        if gqa is None:
            out.append(ConfigFinding(where, f"window {w} but the graph's cache for layer {i} is full-length "
                                            "(no GroupQueryAttention there): onnxruntime-genai would keep a "
                                            "window-sized cache the graph does not write"))
            continue
        lws = gqa.local_window_size
        if lws != w:
            out.append(ConfigFinding(where, f"window {w} but the graph's GroupQueryAttention has "
                                            f"local_window_size {lws}{' (full attention)' if lws <= 0 else ''}"))
        elif not gqa.sliding_window_cache:
            out.append(ConfigFinding(where, f"window {w} over a full-length cache (GroupQueryAttention without "
                                            "sliding_window_cache=1): onnxruntime-genai would keep window_size + "
                                            "slack slots and fail past them"))
    if graph.windows is not None:
        for i, gqa in sorted(graph.windows.items()):
            if gqa.local_window_size > 0 and i not in layers:
                out.append(ConfigFinding(f"{SLIDING_WINDOW} (layer {i})",
                                         f"not listed, but the graph's layer {i} has local_window_size "
                                         f"{gqa.local_window_size}"))
    return out


# ---- what a folder ships: the special ids of the tokenizer's and the model's configs ------------------------------

def _token_id(tok: Any, tokenizer_json: dict | None) -> int | None:
    """A tokenizer_config.json token (a string or {"content": ...}) as its id in tokenizer.json."""
    content = tok.get("content") if isinstance(tok, dict) else tok
    if not isinstance(content, str) or tokenizer_json is None:
        return None
    added_tokens = tokenizer_json.get("added_tokens")
    for added in added_tokens if isinstance(added_tokens, list) else []:  # any field may be junk in a crafted file
        if isinstance(added, dict) and added.get("content") == content and isinstance(added.get("id"), int):
            return added["id"]
    model = tokenizer_json.get("model")
    vocab = model.get("vocab") if isinstance(model, dict) else None
    if isinstance(vocab, dict) and isinstance(vocab.get(content), int):
        return vocab[content]
    return None


def _load_json(files: dict[str, Path] | None, name: str) -> dict | None:
    p = (files or {}).get(name)
    if p is None:
        return None
    try:
        data = load_json(Path(p), name)  # the one bounded reader: a hostile file is no ids, never a crash
    except UntrustedInput:
        return None
    return data if isinstance(data, dict) else None


def _tokenizer_ids(files: dict[str, Path] | None) -> dict[str, int]:
    """{bos/eos/pad_token_id: id} of the special tokens the shipped tokenizer_config.json names (resolved through
    tokenizer.json)."""
    tj, tc = _load_json(files, "tokenizer.json"), _load_json(files, "tokenizer_config.json")
    out = {}
    for key in ("bos", "eos", "pad"):
        if tc is not None and f"{key}_token" in tc:
            tid = _token_id(tc[f"{key}_token"], tj)
            if tid is not None:
                out[f"{key}_token_id"] = tid
    return out


def tokenizer_special_ids(files: dict[str, Path]) -> dict[str, tuple[set[int], str]]:
    """{bos/eos/pad_token_id: ({ids}, where from)} read from the shipped tokenizer_config.json (tokens resolved
    through tokenizer.json), generation_config.json and config.json where the folder has them (``files``: name ->
    the checked path): what another producer's config may say."""
    out: dict[str, tuple[set[int], str]] = {}
    tokenizer = _tokenizer_ids(files)
    for key in ("bos", "eos", "pad"):
        ids: set[int] = set()
        where = []
        for name in ("generation_config.json", "config.json"):
            d = _load_json(files, name)
            got = _ints(d.get(f"{key}_token_id")) if d else None
            if got:
                ids.update(got)
                where.append(name)
        if f"{key}_token_id" in tokenizer:
            ids.add(tokenizer[f"{key}_token_id"])
            where.append("tokenizer_config.json")
        if ids:
            out[f"{key}_token_id"] = (ids, " and ".join(where))
    return out


# The byte-level built-in models have no special tokens; NUL (0) never occurs in text, so it serves as bos, eos
# and pad unless the model's config or its tokenizer names its own ids.
DEFAULT_SPECIAL_ID = 0


def special_ids(model_config: Any, files: dict[str, Path] | None = None) -> dict[str, int]:
    """The bos/eos/pad ids mhaexport's genai_config.json says — the one decision its writer
    (:func:`mhaexport.exporter.genai.write_genai_config`) and the ``genai-config`` check of its exports share.
    ``model_config``: the model's ``config`` (attributes or dict keys); ``files``: the tokenizer files the export
    ships (name -> path). pad: the tokenizer's pad token (the tokenizer pads the batches onnxruntime-genai reads
    back), else the model's pad id; bos and eos: the model's ids (it was trained to stop at its eos), else the
    tokenizer's; else NUL (:data:`DEFAULT_SPECIAL_ID`). A GPT-2 whose config has ``pad_token_id: null`` (the
    loader pads with eos then) and whose tokenizer pads with 0 gets 0."""
    return {key: v for key, (v, _where) in _decided_ids(model_config, files).items()}


def _decided_ids(model_config: Any, files: dict[str, Path] | None) -> dict[str, tuple[int, str]]:
    """:func:`special_ids` with where each id came from."""
    tokenizer = _tokenizer_ids(files)
    out = {}
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        v = model_config.get(key) if isinstance(model_config, dict) else getattr(model_config, key, None)
        own = v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None
        tok = tokenizer.get(key)
        order = [(tok, "tokenizer_config.json"), (own, "the model's config")]
        if key != "pad_token_id":
            order.reverse()
        out[key] = next(((i, where) for i, where in order if i is not None),
                        (DEFAULT_SPECIAL_ID, "mhaexport's export of this model (no id in its config or tokenizer: NUL)"))
    return out


def model_special_ids(model_config: Any) -> dict[str, tuple[set[int], str]]:
    """The special ids the model's config states (what another producer's config of this model may say)."""
    out: dict[str, tuple[set[int], str]] = {}
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        v = model_config.get(key) if isinstance(model_config, dict) else getattr(model_config, key, None)
        ids = _ints(v)
        if ids and all(i >= 0 for i in ids):
            out[key] = (set(ids), "the model's config")
    return out


def expected_special_ids(files: dict[str, Path], model_config: Any = None,
                         own_export: bool = True) -> dict[str, tuple[set[int], str]]:
    """The special ids the ``genai-config`` check holds a folder's config to ({key: ({ids}, where from)}): for
    mhaexport's own export, exactly what its writer decided (:func:`special_ids` of the model's config and the
    shipped tokenizer ``files``; without the model's config, the shipped tokenizer's pad token and the ids the
    tokenizer files state); for another producer's file, any id its shipped configs state (else the model's)."""
    special = tokenizer_special_ids(files)
    if own_export and model_config is not None:
        return {key: ({i}, f"{where} ({key} as mhaexport decides it: genai_config.special_ids)")
                for key, (i, where) in _decided_ids(model_config, files).items()}
    if own_export and "pad_token_id" in _tokenizer_ids(files):  # the tokenizer's pad decides, as for the writer
        special["pad_token_id"] = ({_tokenizer_ids(files)["pad_token_id"]}, "tokenizer_config.json")
    if model_config is not None and not special:
        special = model_special_ids(model_config)
    return special


def folder_expected(ef, contract=None, model_config: Any = None) -> Expected:
    """What the config of an opened export folder's ONNX artifact must say: the manifest's hashed file and cache
    layout, and — with ``contract`` / ``model_config`` (verify) — the model's sizes and ids."""
    from mhaexport.artifact.details import OnnxDetails

    entry = ef.entry("onnx")
    details = entry.details
    layout = details.layout if isinstance(details, OnnxDetails) else None
    files = {name: ef.file("onnx", name) for name in entry.files}
    special = expected_special_ids(files, model_config, own_export=layout is None)
    # an adopted file's layout was read from this config: its cache layout is the graph's to say (the ops)
    shared = details.cache.shared if layout is None else None
    return Expected(contract=contract, filename=entry.file, shared=shared, special=special)


def findings_for(cfg: dict, graph: GraphIO, exp: Expected) -> list[ConfigFinding]:
    """:func:`config_findings`, with a shared buffer's length read from the graph where it fixes one."""
    shape0 = next(iter(v for k, v in graph.inputs.items() if k not in ("input_ids", "attention_mask")), [])
    if exp.shared and len(shape0) == 4 and isinstance(shape0[2], int):
        exp.capacity = shape0[2]  # a buffer whose length the graph fixes
    return config_findings(cfg, graph, exp)


def manifest_graph(entry) -> GraphIO:
    """The graph's I/O as the manifest records it (names, dtypes and shapes written from the graph at export or
    adoption, and the op types the lowering counted): what :func:`config_findings` reads, without onnx."""
    io = entry.io or {}

    def shapes(part: str) -> dict[str, list]:
        return {name: list(spec.get("shape") or []) for name, spec in (io.get(part) or {}).items()
                if isinstance(spec, dict)}

    lowering = getattr(entry.details, "lowering", None)
    counts = getattr(lowering, "op_counts", None) or {}
    return GraphIO(shapes("inputs"), shapes("outputs"), {op.rsplit(".", 1)[-1] for op in counts})


def deploy_findings(ef) -> list[ConfigFinding] | None:
    """The ``genai-config`` findings on an opened export folder's genai_config.json for deploying it (the graph's
    I/O from the manifest, the model's contract, the manifest's file and cache layout, the shipped tokenizer's ids);
    None when its ONNX artifact ships none. Torch- and onnx-free: the deploy runtime's test before it runs the
    folder on onnxruntime-genai."""
    entry = ef.entry("onnx")
    if GENAI_CONFIG not in entry.files:
        return None
    try:
        cfg = load_json(Path(ef.file("onnx", GENAI_CONFIG)), GENAI_CONFIG)
    except UntrustedInput as e:
        return [ConfigFinding(GENAI_CONFIG, str(e).removeprefix(f"{GENAI_CONFIG}: "))]
    if not isinstance(cfg, dict):
        return [ConfigFinding(GENAI_CONFIG, f"{type(cfg).__name__}, not a JSON object")]
    try:
        contract = ef.contract
    except ArtifactError:
        contract = None
    return findings_for(cfg, manifest_graph(entry), folder_expected(ef, contract))
