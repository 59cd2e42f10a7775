"""An ``--hf`` folder's weights streamed (``mhaexport onnx --hf``): its safetensors copied one tensor at a time into a
staging file (:func:`mhaexport.models.stream.staging_file`; floating tensors converted to float32 as they are
copied, as the in-memory load converts them), and transformers' own loader building the model over that file
memory-mapped — ``from_pretrained(None, config=..., state_dict=...)``: its renames, ties and buffer inits are
transformers' (the in-memory load's), and a tensor already in the model's dtype is assigned as it is, so the
parameters are the file's pages, read by offset when the export writes them (never resident as the model).

What cannot be streamed is loaded in memory as before, the reason said in the export's notes (:func:`why_not`,
:func:`load_streamed`): a quantized checkpoint (transformers' quantizer loads it), weights that are not safetensors
(``pytorch_model.bin``), a dtype the staging file does not hold, a forward that does not run on the meta device (the
probe that reads the cache's shapes runs there, so that no weight page is read).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import torch
from torch import nn

from mhaexport.models.stream import _TORCH_DTYPES, WeightsFile, staging_file

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
DTYPE = torch.float32  # what the in-memory load asks of from_pretrained (models/hf.py)


def checkpoint_files(folder: Path) -> tuple[list[Path], str | None]:
    """The safetensors files transformers would load from ``folder`` (a sharded checkpoint's index, else
    ``model.safetensors``), or ([], why they cannot be streamed)."""
    from mhaexport.core.untrusted import load_json

    if (folder / INDEX).is_file():
        index = load_json(folder / INDEX, INDEX)
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(weight_map, dict) or not weight_map:
            return [], f"{INDEX} has no weight_map"
        names = sorted({str(v) for v in weight_map.values()})
        bad = next((n for n in names if Path(n).name != n or not (folder / n).is_file()), None)
        if bad is not None:
            return [], f"{INDEX} names {bad!r}, not a file of the folder"
        return [folder / n for n in names], None
    if (folder / SINGLE).is_file():
        return [folder / SINGLE], None
    others = sorted(p.name for p in folder.glob("*.bin"))
    return [], (f"its weights are {others[0]}, not safetensors" if others else f"it has no {SINGLE}")


def why_not(hf_config: Any) -> str | None:
    """Why the config's model cannot be streamed (None: it can, as far as the config says)."""
    quant = getattr(hf_config, "quantization_config", None)
    if quant:
        method = quant.get("quant_method") if isinstance(quant, dict) else getattr(quant, "quant_method", None)
        return f"a quantized checkpoint ({method or 'quantization_config'}): transformers' quantizer loads it"
    return None


def model_class(transformers: Any, hf_config: Any) -> type | None:
    """The causal LM class transformers maps the config to (None: none, or one it would have to find otherwise)."""
    return transformers.MODEL_FOR_CAUSAL_LM_MAPPING.get(type(hf_config), None)


def meta_model(transformers: Any, hf_config: Any) -> nn.Module:
    """The folder's model with every parameter and buffer on the meta device (no weight allocated, none read): what
    the probe for the cache's shapes and the contract's smoke check run, shapes only."""
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(copy.deepcopy(hf_config), attn_implementation="eager",
                                                              dtype=DTYPE, trust_remote_code=False)
    return model.eval()


def stage(files: list[Path], dtype: torch.dtype = DTYPE) -> WeightsFile:
    """Every tensor of ``files`` (safetensors) written to one staging file, read from its file by offset one at a time,
    a floating tensor converted to ``dtype`` (what ``from_pretrained(dtype=...)`` converts it to); ValueError for a
    file that is not safetensors, a dtype the staging file does not hold, a name in two shards."""
    sources: list[WeightsFile] = []
    try:
        owner: dict[str, WeightsFile] = {}
        specs = []
        for path in files:
            src = WeightsFile(path, foreign=True)  # the folder's: held to the safetensors library's parser
            sources.append(src)
            for name, entry in src.meta.items():
                if name in owner:
                    raise ValueError(f"{name} is in {owner[name].path.name} and {path.name}")
                have = _TORCH_DTYPES[entry["dtype"]]
                specs.append((name, tuple(int(x) for x in entry["shape"]),
                              dtype if have.is_floating_point else have))
                owner[name] = src

        def tensors():
            for name, _, want in specs:
                yield name, owner[name].read(name).to(want)

        return staging_file(specs, tensors())
    finally:
        for src in sources:
            src.close()


def half_dtype(files: list[Path]) -> torch.dtype | None:
    """The one half-precision dtype (bfloat16 or float16) every floating tensor of ``files`` holds, else None (read
    from the safetensors headers alone)."""
    found = set()
    for path in files:
        src = WeightsFile(path)
        try:
            found |= {_TORCH_DTYPES[e["dtype"]] for e in src.meta.values()
                      if _TORCH_DTYPES[e["dtype"]].is_floating_point}
        finally:
            src.close()
    return next(iter(found)) if len(found) == 1 and next(iter(found)) in (torch.bfloat16, torch.float16) else None


def load_streamed(transformers: Any, hf_config: Any, files: list[Path], *, keep_half: bool = False
                  ) -> tuple[nn.Module, WeightsFile, list[str]]:
    """The model over ``files`` staged (:func:`stage`), loaded by transformers from that state (eager attention,
    float32): (model, the staging file its parameters map, notes). A parameter transformers made anew in memory
    (a checkpoint conversion that merges or reshapes tensors) is still the right one, only not streamed: said in the
    notes. ``keep_half``: a folder whose weights are all bfloat16 (or all float16) is staged and loaded in that
    dtype, not converted (half the bytes; :mod:`mhaexport.models.upcast` computes its float32 reference)."""
    cls = model_class(transformers, hf_config)
    dtype = (half_dtype(files) if keep_half else None) or DTYPE
    weights = stage(files, dtype)
    try:
        model = cls.from_pretrained(None, config=copy.deepcopy(hf_config), state_dict=weights.state,
                                    attn_implementation="eager", dtype=dtype)
    except BaseException:
        weights.close()
        raise
    copied = [(n, p.numel() * p.element_size()) for n, p in model.named_parameters() if weights.where(p) is None]
    notes = []
    if copied:
        total = len(list(model.parameters()))
        notes.append(f"{len(copied)} of {total} parameters ({sum(b for _, b in copied) / 1e6:.1f} MB, e.g. "
                     f"{copied[0][0]}) were made in memory by transformers' loader, not streamed")
    return model.eval(), weights, notes


def fallback_note(why: str) -> str:
    """The export's note when a folder is loaded in memory instead of streamed."""
    return f"weights loaded in memory, not streamed: {why.strip().splitlines()[0] if why.strip() else why}"
