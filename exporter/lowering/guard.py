"""Which lowering can express which mask and score feature of a model's contract, and the refusal when one cannot.

Read from the contract (``windows``, ``attn_softcap``, ``final_softcap``, ``attn_scale``, ``attn_sinks``), never
guessed from the graph, so a Hugging Face model gets the same guarantee as the built-in one: a file that drops a
window, a softcap, a scale or a sink is never written. How each one travels:

- ``decomposed``: the graph is the eager model's, every feature included.
- ``onnx`` / ``ort`` / ``fused`` over a concat cache: the model's own boolean mask (causal, padding, sliding
  window) becomes the fused op's ``attention_bias``; the score scale is read from the graph's constant into the op's
  ``scale``; the final softcap acts on the logits, outside attention.
- ``gqa`` (``--kv-cache shared``): GroupQueryAttention builds its own causal mask from sequence lengths, so a
  window is written as its per-layer ``local_window_size`` (and the self-check crosses it); the scale as ``scale``.
- A softcap on the scores: GroupQueryAttention's ``softcap`` (its CPU kernel caps before its causal mask, as the
  model does); MultiHeadAttention has none, and the ONNX ``Attention`` op's ``softcap`` is not lowered here (where it
  sits against the mask bias is untested), so the concat-cache lowerings refuse it.
- A sink in the softmax (a Concat before the Softmax and a Slice after): no rewrite here matches it yet, though
  onnxruntime 1.32's GroupQueryAttention takes a ``head_sink`` input with the same meaning (tried on the op alone);
  every fused lowering refuses it (decomposed exports it).
"""

from __future__ import annotations

from mhaexport.core.errors import ExportOptionError
from mhaexport.core.iospec import ModelContract

# lowering ("gqa": the shared cache's) -> contract features it expresses
EXPRESSES: dict[str, frozenset[str]] = {
    "decomposed": frozenset({"windows", "attn_softcap", "final_softcap", "attn_scale", "attn_sinks"}),
    "onnx": frozenset({"windows", "final_softcap", "attn_scale"}),
    "ort": frozenset({"windows", "final_softcap", "attn_scale"}),
    "fused": frozenset({"windows", "final_softcap", "attn_scale"}),
    "gqa": frozenset({"windows", "final_softcap", "attn_scale", "attn_softcap"}),
}
WHY = {"attn_softcap": "a tanh softcap between the scores and the mask, which only GroupQueryAttention takes: "
                       "--kv-cache shared",
       "attn_sinks": "a sink logit joining the Softmax's denominator, which no fused attention here takes",
       "windows": "a sliding window", "final_softcap": "a softcap on the logits",
       "attn_scale": "a score scale"}


def features(contract: ModelContract) -> dict[str, object]:
    """The contract's mask and score features that are set: {field: value}."""
    out: dict[str, object] = {"windows": contract.windows} if contract.windowed else {}
    return {**out, **contract.score_features}


def first_layer(contract: ModelContract, feature: str) -> int:
    """The first layer a feature acts on (a window: the first windowed layer; the others act on every layer)."""
    if feature == "windows":
        return next(i for i, w in enumerate(contract.windows or ()) if w)
    return 0


def refuse_unexpressible(contract: ModelContract, attention: str, kv_cache: str = "concat") -> None:
    """Raise ExportOptionError (one line, before any work) when the lowering of ``attention`` over ``kv_cache``
    cannot express a feature of ``contract``, naming the feature and the first layer it acts on."""
    lowering = "gqa" if kv_cache == "shared" else attention
    what = f"--attention {attention}" + (" --kv-cache shared" if kv_cache == "shared" else "")
    for name, value in features(contract).items():
        if name not in EXPRESSES.get(lowering, EXPRESSES["decomposed"]):
            shown = list(value) if isinstance(value, tuple) else value
            raise ExportOptionError(
                f"{what} cannot express {name}={shown} of layer {first_layer(contract, name)} ({WHY[name]}): "
                "export with --attention decomposed" + (" --kv-cache concat" if kv_cache == "shared" else ""))


def self_check_sizes(contract: ModelContract, seq: int, past: int, max_cache: int | None = None) -> tuple[int, int]:
    """The (seq, past) the lowering's self-check runs at: the export's example, or, for a windowed model, a past
    reaching two positions beyond the longest window (the padded row still crosses it), within max_positions and
    the shared cache's buffer."""
    if not contract.windowed:
        return seq, past
    room = min(contract.max_positions, max_cache or contract.max_positions) - seq
    return seq, max(past, min(room, max(contract.windows) + 4))
