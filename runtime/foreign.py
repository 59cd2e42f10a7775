"""ONNX decoders exported by other tools, mapped onto the contract. Torch-free (ONNX Runtime's own I/O metadata).

:func:`detect_layout` says how a file's I/O corresponds to the decoder contract (a :class:`Layout`: the record an
adopted folder's manifest keeps) and in which protocol its producer drives it (a
:class:`~mhaexport.artifact.details.CacheLayout`: the entry's ``kv_cache`` / ``max_cache`` / ``padding``):

- **onnxruntime-genai's model builder**: a ``genai_config.json`` next to the file names the inputs and outputs
  (``past_key_names`` templates), the sizes (``num_key_value_heads``, ``head_size``, ``context_length``) and the
  cache (``search.past_present_share_buffer``: one buffer per layer written in place, rows packed from slot 0 —
  right padding); an optional ``position_ids`` input is fed from the mask.
- **Optimum**: ``input_ids``, ``attention_mask``, ``position_ids``, ``past_key_values.N.key|value`` ->
  ``logits``, ``present.N.key|value``; a concat cache, left padding; ``position_ids`` fed from the mask. Model types
  Optimum exports without ``position_ids`` (Gemma) have the contract's names exactly (mhaexport's own exports too:
  those are told apart by the export folder's manifest.json).
- **a plain torch.onnx.export** (any names): ``input_ids``/``attention_mask`` by name or by position, then 2L cache
  inputs and 2L cache outputs in (key, value) order per layer, by position.

A file that none of these fit is refused with one line listing its inputs and outputs and what was expected.
"""

from __future__ import annotations

import re
from pathlib import Path

from mhaexport.core import dtypes, iospec
from mhaexport.artifact import ArtifactEntry, read_manifest
from mhaexport.artifact.details import AdoptedLayout, CacheLayout, OnnxDetails
from mhaexport.core.errors import ArtifactError
from mhaexport.runtime.genai_config import GenaiConfig, GenaiDecoder, GenaiModel, GenaiSearch, section
from mhaexport.runtime.protocol import SHARED, padding_of
from mhaexport.core.untrusted import load_json

GENAI_CONFIG = "genai_config.json"
POSITION_IDS = "position_ids"
PRODUCERS = ("onnxruntime-genai", "optimum", "torch.onnx", "mhaexport")


# How a foreign file maps onto the contract: the record its adopted folder's manifest keeps (``details.layout``)
Layout = AdoptedLayout
CONCAT_LEFT = ("concat", "left")  # (cache, padding): the contract's protocol, every producer's but a shared buffer's


def _io(path: Path) -> tuple[list, list]:
    from mhaexport.runtime.session import cpu_session

    try:
        sess = cpu_session(str(path))
    except Exception as e:  # noqa: BLE001 - ORT's own exception types
        raise ArtifactError(f"ONNX Runtime cannot load {path}: {str(e).splitlines()[0]}") from None
    return list(sess.get_inputs()), list(sess.get_outputs())


def _listing(inputs: list, outputs: list) -> str:
    def show(v) -> str:
        return f"{v.name} {v.type.replace('tensor(', '').rstrip(')')}{list(v.shape)}"

    return f"inputs {', '.join(map(show, inputs))}; outputs {', '.join(map(show, outputs))}"


def _expected() -> str:
    return ("expected the contract's input_ids, attention_mask, past_key_values.N.key|value -> logits, "
            "present.N.key|value (optionally position_ids: Optimum, onnxruntime-genai), or a genai_config.json "
            "naming them")


def _int(v) -> int | None:
    return v if isinstance(v, int) and v > 0 else None


def detect_layout(path: str | Path, *, max_positions: int | None = None) -> tuple[Layout, CacheLayout]:
    """Map the ONNX file ``path`` onto the contract: its layout and how its producer holds the cache (a shared
    buffer's slots: the layout's max_positions); ArtifactError (one line) when it cannot be mapped.
    Sizes the file's shapes and genai_config.json do not say are left 0 (adoption takes them from the model);
    ``max_positions``: the model's, when they do not say it."""
    path = Path(path)
    if not path.is_file():
        raise ArtifactError(f"{path} is not a file")
    inputs, outputs = _io(path)
    in_names, out_names = [i.name for i in inputs], [o.name for o in outputs]
    genai = decoder = None
    if (path.parent / GENAI_CONFIG).is_file():
        config = section(GenaiConfig, load_json(path.parent / GENAI_CONFIG, str(path.parent / GENAI_CONFIG)))
        genai = section(GenaiModel, config.model) if config is not None else None
        if genai is None:
            raise ArtifactError(f"{path.parent / GENAI_CONFIG} is not a readable onnxruntime-genai config: "
                                f"{'no model object' if config is not None else 'not a JSON object'}")
        decoder = section(GenaiDecoder, genai.decoder) or GenaiDecoder()
    if decoder is not None and decoder.filename not in (None, path.name):
        genai = None  # the config describes another file of the folder
    own = _own_export(path)
    if own is not None:
        genai = None  # mhaexport writes a genai_config.json too: its manifest says more
    layout, protocol = _from_genai(path, decoder, in_names, out_names) if genai else \
        (_by_names(in_names, out_names, path), CONCAT_LEFT)
    if layout is not None and own is not None and own.details.cache.shared:
        protocol = (SHARED, padding_of(SHARED))  # --kv-cache shared: GroupQueryAttention's protocol
    if layout is None:
        layout = _by_position(inputs, outputs)
    if layout is None:
        raise ArtifactError(f"{path}: cannot map this file onto the decoder contract: {_listing(inputs, outputs)}; "
                            f"{_expected()}")
    # sizes: from the file's shapes where they are numbers, else from the genai config
    past = {i.name: i for i in inputs}[layout.past[0]]
    logits = {o.name: o for o in outputs}[layout.logits]
    dt = dtypes.from_ort_type(past.type)
    if dt is None:
        raise ArtifactError(f"{path}: the cache input {past.name} is {past.type}: not a float cache this runtime "
                            f"holds; {_listing(inputs, outputs)}")
    layout.dtype = dt
    layout.n_layers = len(layout.past) // 2
    genai, decoder = (genai, decoder) if genai is not None else (GenaiModel(), GenaiDecoder())
    layout.n_kv_heads = _int(past.shape[1]) or _int(decoder.num_key_value_heads) or 0
    layout.head_dim = _int(past.shape[3]) or _int(decoder.head_size) or 0
    layout.vocab_size = _int(logits.shape[2]) or _int(genai.vocab_size) or 0
    layout.n_heads = _int(decoder.num_attention_heads) or 0  # the graph hides it
    layout.max_positions = _int(genai.context_length) or max_positions or 0
    shared = protocol[0] == "shared"
    return layout, CacheLayout(protocol[0], (layout.max_positions or None) if shared else None, protocol[1])


def _pairs(names: list[str], key_re: str) -> list[str] | None:
    """[layer 0 key, layer 0 value, layer 1 key, ...] from names matching ``key_re`` with groups (layer, kind)."""
    found = {}
    for n in names:
        m = re.fullmatch(key_re, n)
        if m:
            found[(int(m.group(1)), m.group(2))] = n
    layers = sorted({layer for layer, _ in found})
    if not layers or layers != list(range(len(layers))) or len(found) != 2 * len(layers):
        return None
    return [found[(i, kind)] for i in layers for kind in ("key", "value")]


def _from_genai(path: Path, dec: GenaiDecoder, ins: list[str], outs: list[str]
                ) -> tuple[Layout | None, tuple[str, str]]:
    names_in, names_out = (names if isinstance(names, dict) else {} for names in (dec.inputs, dec.outputs))

    def template(t: str | None) -> str:
        return re.escape(t or "").replace("%d", r"(\d+)")

    keys = {int(m.group(1)): n for n in ins if (m := re.fullmatch(template(names_in.get("past_key_names")), n))}
    values = {int(m.group(1)): n for n in ins if (m := re.fullmatch(template(names_in.get("past_value_names")), n))}
    pk = {int(m.group(1)): n for n in outs if (m := re.fullmatch(template(names_out.get("present_key_names")), n))}
    pv = {int(m.group(1)): n for n in outs if (m := re.fullmatch(template(names_out.get("present_value_names")), n))}
    n = len(keys)
    if not n or not (len(values) == len(pk) == len(pv) == n) or sorted(keys) != list(range(n)):
        return None, CONCAT_LEFT
    past = [x for i in range(n) for x in (keys[i], values[i])]
    present = [x for i in range(n) for x in (pk[i], pv[i])]
    ids, mask = names_in.get("input_ids", "input_ids"), names_in.get("attention_mask", "attention_mask")
    logits = names_out.get("logits", "logits")
    pos = names_in.get("position_ids") or (POSITION_IDS if POSITION_IDS in ins else None)
    known = {ids, mask, *past} | ({pos} if pos else set())
    if ids not in ins or mask not in ins or logits not in outs or set(ins) - known:
        return None, CONCAT_LEFT
    shared = bool(_search(path).past_present_share_buffer)
    return (Layout("onnxruntime-genai", ids, mask, logits, past, present, pos),
            ("shared" if shared else "concat", "right"))


def _search(path: Path) -> GenaiSearch:
    try:
        config = section(GenaiConfig, load_json(path.parent / GENAI_CONFIG, str(path.parent / GENAI_CONFIG)))
    except ArtifactError:
        return GenaiSearch()
    return (section(GenaiSearch, config.search) if config is not None else None) or GenaiSearch()


def _own_export(path: Path) -> ArtifactEntry | None:
    """The manifest entry when ``path`` is the ONNX file of an mhaexport export folder (its manifest.json lists it,
    not adopted), else None."""
    try:
        entry = read_manifest(path.parent).artifacts["onnx"]
    except (ArtifactError, KeyError):
        return None
    own = entry.file == path.name and isinstance(entry.details, OnnxDetails) and not entry.details.producer
    return entry if own else None


def _by_names(ins: list[str], outs: list[str], path: Path) -> Layout | None:
    """The contract's own names (Optimum's too), with or without position_ids. Optimum's export of a model type
    that takes no position_ids (Gemma) has none either: the names say Optimum unless an mhaexport manifest beside
    the file lists it."""
    past = _pairs(ins, r"past_key_values\.(\d+)\.(key|value)")
    present = _pairs(outs, r"present\.(\d+)\.(key|value)")
    if past is None or present is None or len(past) != len(present):
        return None
    if iospec.INPUT_IDS not in ins or iospec.ATTENTION_MASK not in ins or iospec.LOGITS not in outs:
        return None
    extra = set(ins) - {iospec.INPUT_IDS, iospec.ATTENTION_MASK, *past}
    if extra - {POSITION_IDS}:
        return None
    pos = POSITION_IDS if POSITION_IDS in ins else None
    return Layout("mhaexport" if _own_export(path) is not None else "optimum", iospec.INPUT_IDS, iospec.ATTENTION_MASK,
                  iospec.LOGITS, past, present, pos)


def _by_position(inputs: list, outputs: list) -> Layout | None:
    """A plain torch.onnx.export: (input_ids, attention_mask, 2L cache tensors) -> (logits, 2L cache tensors)."""
    ins, outs = inputs, outputs
    if len(ins) < 4 or (len(ins) - 2) % 2 or len(outs) != len(ins) - 1:
        return None
    ints = [i for i in ins[:2] if i.type == "tensor(int64)"]
    floats = [i for i in ins[2:] if dtypes.from_ort_type(i.type)]
    if len(ints) != 2 or len(floats) != len(ins) - 2 or any(len(i.shape) != 4 for i in floats):
        return None
    named = {i.name for i in ints}
    ids, mask = (iospec.INPUT_IDS, iospec.ATTENTION_MASK) if named == {iospec.INPUT_IDS, iospec.ATTENTION_MASK} \
        else (ins[0].name, ins[1].name)
    return Layout("torch.onnx", ids, mask, outs[0].name, [i.name for i in ins[2:]], [o.name for o in outs[1:]],
                  notes=["inputs and outputs mapped by position: (input_ids, attention_mask, then key, value per "
                         "layer) -> (logits, then key, value per layer)"])
