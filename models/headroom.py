"""Numerical headroom for half precision: how large eager's activations get, layer by layer, against float16's range
(65,504: a larger value is inf, and the logits after it NaN) and bfloat16's precision (8 significant bits: the step
between two bfloat16 values near an activation of 45,000 is 256).

:func:`measure` runs the float32 model once on seeded inputs with a forward hook on every module and keeps, for each
*layer* (a decoder block — ``blocks.3``, ``model.layers.3`` — or a module outside the blocks: the embedding, the
final norm, the LM head), the largest finite |value| any of its modules outputs and which module it was. The export
of a float16 file refuses a model that overflows (``mhaexport onnx --dtype float16``: one line naming the layer,
exit 2) and notes a thin margin; verify's ``headroom`` check holds a half-precision folder to the same figures.
"""

from __future__ import annotations

import contextlib
import math
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from mhaexport.core.iospec import ModelContract

if TYPE_CHECKING:
    from mhaexport.models.stream import WeightsFile

FLOAT16_MAX = 65504.0  # the largest finite float16
# below this margin (float16's range over the peak: two bits of exponent) a float16 export is noted as thin: an input
# unlike the seeded ones may reach the range (gpt-oss checkpoints reach ~45,000: a margin of 1.46)
THIN_MARGIN = 4.0
BFLOAT16_BITS = 8  # significant bits of bfloat16 (7 stored and the implicit one)
# the seeded inputs: batch x tokens (at most max_positions), no past
BATCH, TOKENS = 2, 64


def bfloat16_step(x: float) -> float:
    """The distance between two consecutive bfloat16 values at magnitude ``x`` (its unit in the last place)."""
    if not x or not math.isfinite(x):
        return 0.0 if not x else math.inf
    return 2.0 ** (math.floor(math.log2(abs(x))) - (BFLOAT16_BITS - 1))


@dataclass
class LayerPeak:
    """One layer's largest finite |activation| on the seeded inputs, the module that output it, and what float16 and
    bfloat16 make of it."""

    layer: str
    module: str
    peak: float

    @property
    def float16_margin(self) -> float:
        """float16's range over the peak: below 1 the layer overflows (inf)."""
        return FLOAT16_MAX / self.peak if self.peak else math.inf

    @property
    def overflows(self) -> bool:
        return self.peak > FLOAT16_MAX

    def to_dict(self) -> dict[str, Any]:
        return {"layer": self.layer, "module": self.module, "peak": _num(self.peak),
                "float16_margin": _num(self.float16_margin), "bfloat16_step": _num(bfloat16_step(self.peak))}


@dataclass
class Headroom:
    """Every layer's peak, in the model's order, and the inputs they were measured on."""

    layers: list[LayerPeak] = field(default_factory=list)
    inputs: str = ""

    @property
    def worst(self) -> LayerPeak | None:
        """The layer with the largest peak."""
        return max(self.layers, key=lambda p: p.peak, default=None)

    @property
    def overflow(self) -> LayerPeak | None:
        """The first layer (in the model's order) whose activations pass float16's range, or None."""
        return next((p for p in self.layers if p.overflows), None)

    def summary(self, dtype: str) -> str:
        """One line: the worst layer, its margin under float16 and the bfloat16 step there."""
        w = self.worst
        if w is None:
            return "no floating activation was measured"
        first = self.overflow
        if dtype == "float16" and first is not None:
            return (f"{first.module} ({first.layer}) reaches {first.peak:,.6g} on eager float32 ({self.inputs}): "
                    f"past float16's 65,504 (margin {first.float16_margin:.3g}x), so a float16 file computes inf "
                    "there and NaN logits after it")
        step = f"bfloat16's step there is {bfloat16_step(w.peak):.3g}"
        return (f"peak |activation| {w.peak:,.6g} at {w.module} ({w.layer}; {self.inputs}): float16 margin "
                f"{w.float16_margin:.3g}x, {step}")

    def thin(self) -> LayerPeak | None:
        """The worst layer when its float16 margin is under :data:`THIN_MARGIN` (and it does not overflow)."""
        w = self.worst
        return w if w is not None and not w.overflows and w.float16_margin < THIN_MARGIN else None

    def to_dict(self) -> dict[str, Any]:
        w = self.worst
        first = self.overflow
        return {"inputs": self.inputs, "peak": _num(w.peak) if w else None, "layer": w.layer if w else None,
                "module": w.module if w else None, "float16_margin": _num(w.float16_margin) if w else None,
                "bfloat16_step": _num(bfloat16_step(w.peak)) if w else None,
                "float16_overflow": first.layer if first else None, "layers": [p.to_dict() for p in self.layers]}


def _num(x: float) -> float | None:
    """A figure for JSON: finite floats as they are (rounded to 6 significant digits), inf as None."""
    return float(f"{x:.6g}") if math.isfinite(x) else None


_NUMBERED = re.compile(r"^(.*?\d+)(?:\.|$)")


def layer_of(name: str) -> str:
    """The layer a module belongs to: the module path up to its first numbered part (``blocks.3.attn.q`` ->
    ``blocks.3``, ``model.model.layers.3.mlp`` -> ``model.model.layers.3``); a module outside any numbered list is
    its own layer (``tok_emb``, ``lm_head``, ``model.model.norm``)."""
    m = _NUMBERED.match(name)
    return m.group(1) if m else name


def _tensors(out: Any) -> list[torch.Tensor]:
    """The floating tensors of a module's output: itself, or those of a tuple/list (one level, then theirs)."""
    if isinstance(out, torch.Tensor):
        return [out] if out.is_floating_point() else []
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in _tensors(o)]
    return []


def measure(module: nn.Module, contract: ModelContract, *, seed: int = 0, weights: WeightsFile | None = None,
            float32: bool = False) -> Headroom:
    """Run ``module`` (float32, the decoder contract) once on seeded inputs (:data:`BATCH` rows of :data:`TOKENS`
    tokens, at most max_positions) with a hook on every module, and return each layer's peak finite |activation|
    (a module that outputs a non-finite value in float32 counts as inf). ``weights``: the staging file a streamed
    model's parameters map, whose pages each module drops again once it ran (the resident set holds one module's).
    ``float32``: ``module`` holds half-precision weights standing for the float32 model (a bf16 folder kept bf16):
    computed in float32 one module at a time (:func:`mhaexport.models.upcast.computed_in_float32`)."""
    from mhaexport.models.inputs import make_inputs

    tokens = max(1, min(TOKENS, contract.max_positions))
    ids, mask, past = make_inputs(contract, BATCH, tokens, 0, seed=seed)
    peaks: dict[str, tuple[float, str]] = {}
    order: list[str] = []

    def hook(name: str):
        def record(_mod, _args, out) -> None:
            for t in _tensors(out):
                if not t.numel() or t.device.type == "meta":
                    continue
                a = t.detach().abs()
                peak = float(a.max()) if bool(torch.isfinite(a).all()) else math.inf
                layer = layer_of(name)
                if layer not in peaks:
                    order.append(layer)
                if peak > peaks.get(layer, (-1.0, ""))[0]:
                    peaks[layer] = (peak, name)
        return record

    handles = [m.register_forward_hook(hook(n)) for n, m in module.named_modules() if n]
    released = weights.released_after_use(module) if weights is not None else contextlib.nullcontext()
    upcast = contextlib.nullcontext()
    if float32:
        from mhaexport.models.upcast import computed_in_float32

        upcast = computed_in_float32(module)
    try:
        with torch.no_grad(), released, upcast:
            module(ids, mask, past)
    finally:
        for h in handles:
            h.remove()
    return Headroom([LayerPeak(layer, peaks[layer][1], peaks[layer][0]) for layer in order],
                    inputs=f"seed {seed}, {BATCH} x {tokens} tokens")
