"""The attention block's runtimes on its own (``--module attention``), on the one runner protocol.

:class:`ModuleRunner` replaces the base runner's input hook with the module contract's (x, past_key, past_value);
activation, timing and skipped-vs-failed stay the base's. Runtimes:

- ``eager``: the block (``models/block.py``) as rebuilt from the manifest;
- ``torch-mha``: torch's own attention loaded with the block's W_q/W_k/W_v/W_o — a second reference, the article's
  cross-check: ``torch.nn.MultiheadAttention`` where it can express the call (as many key/value heads as query
  heads, no cache), else ``F.scaled_dot_product_attention`` (``enable_gqa`` for grouped-query heads; the cached
  keys are already projected, which nn.MultiheadAttention cannot take), the causal mask passed explicitly
  (``tril``, never ``is_causal``, never the block's own ``build_causal_mask``);
- ``torchscript``: the exported ``.pt`` (torch.jit.load);
- ``ort-cpu`` / ``ort-cuda``: the exported ONNX file on the deploy runtime's session handling
  (:class:`~mhaexport.runtime.ort.OrtSessionRunner`, strict as verify's decoder runners: CUDA that does not really
  run makes ort-cuda skipped, never passed).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from mhaexport.core import dtypes, iospec
from mhaexport.core.errors import RuntimeInputError
from mhaexport.core.iospec import ModuleContract
from mhaexport.runtime.ort import OrtSessionRunner
from mhaexport.runtime.runner import Runner, to_numpy
from mhaexport.runners.decoder import _host
from mhaexport.runners.names import session_config
from mhaexport.runners.subjects import MODULE

# (output (B, T, d_model), present_key, present_value (B, H_kv, S, D), attention_weights (B, H, T, S))
ModuleOutputs = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


class ModuleRunner(Runner):
    """A runtime of the attention block: ``run(x, past_key=None, past_value=None)`` -> :data:`ModuleOutputs` as
    numpy. The base runner's input hook, for the module contract: x (B, T, d_model) with B, T >= 1; past_key and
    past_value (B, H_kv, P, D) with P >= 0, both or neither (neither: an empty cache). Checked as the suite's
    ``module`` subject (verify/suite.py)."""

    contract: ModuleContract
    checked_as = MODULE

    def check_inputs(self, x: Any, past_key: Any = None, past_value: Any = None
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        c = self.contract
        x = to_numpy(x)
        if x.ndim != 3 or x.shape[0] == 0 or x.shape[1] == 0 or x.shape[2] != c.d_model:
            raise RuntimeInputError(f"x must be a non-empty (batch, seq, d_model={c.d_model}) array, got shape "
                                    f"{tuple(x.shape)}")
        if (past_key is None) != (past_value is None):
            raise RuntimeInputError("give past_key and past_value together (or neither: an empty cache)")
        B = x.shape[0]
        np_dtype = dtypes.numpy_dtype(self.dtype)
        if past_key is None:
            past_key = past_value = np.zeros((B, c.n_kv_heads, 0, c.head_dim), dtype=np_dtype)  # (B, H_kv, 0, D)
        kv = []
        for name, t in ((iospec.PAST_KEY, past_key), (iospec.PAST_VALUE, past_value)):
            t = to_numpy(t)
            if t.ndim != 4 or (t.shape[0], t.shape[1], t.shape[3]) != (B, c.n_kv_heads, c.head_dim):
                raise RuntimeInputError(f"{name} has shape {tuple(t.shape)}, expected (batch={B}, n_kv_heads="
                                        f"{c.n_kv_heads}, past, head_dim={c.head_dim})")
            kv.append(np.ascontiguousarray(t, dtype=np_dtype))
        if kv[0].shape[2] != kv[1].shape[2]:
            raise RuntimeInputError(f"past_key holds {kv[0].shape[2]} positions, past_value {kv[1].shape[2]}")
        return np.ascontiguousarray(x, dtype=np_dtype), kv[0], kv[1]

    def describe_inputs(self, checked: tuple) -> str:
        x, past_key = checked[0], checked[1]
        return f"batch={x.shape[0]} seq={x.shape[1]} past={past_key.shape[2]}"


class TorchModuleRunner(ModuleRunner):
    """The block as a torch module under inference_mode: the eager wrapper (``module``), or the exported ``.pt``
    (``path``, loaded with torch.jit.load, never rebuilt from the Python class)."""

    def __init__(self, name: str, contract: ModuleContract, module: Any = None, *, path: str | Path | None = None
                 ) -> None:
        super().__init__(name, contract)
        self.module = module
        self.path = None if path is None else Path(path)

    def activate_impl(self) -> None:
        import torch

        if self.path is not None:
            self.module = torch.jit.load(str(self.path), map_location="cpu").eval()
            self.providers = ["torch.jit (cpu)"]
        else:
            self.providers = ["torch (cpu)"]

    def run_impl(self, x: np.ndarray, past_key: np.ndarray, past_value: np.ndarray) -> ModuleOutputs:
        import torch

        with torch.inference_mode():
            outs = self.module(torch.from_numpy(x), torch.from_numpy(past_key), torch.from_numpy(past_value))
        return tuple(_host(t) for t in outs)


class TorchMhaRunner(ModuleRunner):
    """torch's own attention loaded with the block's weights (``attn``: its MultiHeadAttention): the second
    reference. Only the weights come from the block; the masking, scaling, softmax and head handling are torch's."""

    def __init__(self, name: str, contract: ModuleContract, attn: Any) -> None:
        super().__init__(name, contract)
        self.attn = attn
        self.mha = None

    def activate_impl(self) -> None:
        import torch

        c = self.contract
        a = self.attn
        with torch.no_grad():
            self.W_q, self.W_k, self.W_v, self.W_o = (w.weight.detach().clone() for w in (a.W_q, a.W_k, a.W_v, a.W_o))
            if not c.grouped:  # nn.MultiheadAttention has as many key/value heads as query heads
                self.mha = torch.nn.MultiheadAttention(c.d_model, c.n_heads, bias=False, batch_first=True).eval()
                self.mha.in_proj_weight.copy_(torch.cat([self.W_q, self.W_k, self.W_v]))  # (3 d_model, d_model)
                self.mha.out_proj.weight.copy_(self.W_o)
        self.providers = (["nn.MultiheadAttention (past 0)", "SDPA (cached K/V)"] if self.mha is not None
                          else ["SDPA (enable_gqa)"])

    def run_impl(self, x: np.ndarray, past_key: np.ndarray, past_value: np.ndarray) -> ModuleOutputs:
        import torch
        import torch.nn.functional as F

        c = self.contract
        H, Hkv, D = c.n_heads, c.n_kv_heads, c.head_dim
        with torch.inference_mode():
            xt = torch.from_numpy(x)  # (B, T, d_model)
            B, T, _ = xt.shape
            P = past_key.shape[2]
            S = P + T
            # True = may attend: query t (absolute position P + t) sees keys 0 .. P + t
            allowed = torch.ones(T, S, dtype=torch.bool).tril(diagonal=P) if c.causal else None  # (T, S)
            k_new = F.linear(xt, self.W_k).view(B, T, Hkv, D).transpose(1, 2)  # (B, H_kv, T, D)
            v_new = F.linear(xt, self.W_v).view(B, T, Hkv, D).transpose(1, 2)  # (B, H_kv, T, D)
            keys = torch.cat([torch.from_numpy(past_key), k_new], dim=2)  # (B, H_kv, S, D)
            values = torch.cat([torch.from_numpy(past_value), v_new], dim=2)  # (B, H_kv, S, D)
            if self.mha is not None and P == 0:
                # the article's cross-check: torch's layer on x itself; its attn_mask is True where NOT allowed
                out, weights = self.mha(xt, xt, xt, attn_mask=None if allowed is None else ~allowed,
                                        need_weights=True, average_attn_weights=False)  # (B, T, E), (B, H, T, S)
            else:
                q = F.linear(xt, self.W_q).view(B, T, H, D).transpose(1, 2)  # (B, H, T, D)
                gqa = c.grouped
                o = F.scaled_dot_product_attention(q, keys, values, attn_mask=allowed, enable_gqa=gqa)  # (B, H, T, D)
                # the weights, read out by SDPA itself: attending over the identity returns softmax(QK^T/sqrt(D))
                eye = torch.eye(S, dtype=q.dtype).expand(B, Hkv, S, S)  # (B, H_kv, S, S)
                weights = F.scaled_dot_product_attention(q, keys, eye, attn_mask=allowed, enable_gqa=gqa)  # (B,H,T,S)
                out = F.linear(o.transpose(1, 2).reshape(B, T, H * D), self.W_o)  # (B, T, d_model)
        return _host(out), _host(keys), _host(values), _host(weights)


class OrtModuleRunner(ModuleRunner, OrtSessionRunner):
    """The exported ONNX block in an ONNX Runtime session on one provider: the module contract's input checks
    (:class:`ModuleRunner`) on the deploy runtime's session handling (:class:`~mhaexport.runtime.ort.
    OrtSessionRunner`: :func:`~mhaexport.runtime.session.open_session`, a provider that does not really run here is a
    skip); only the block's feed and its dynamic axes are its own."""

    def run_impl(self, x: np.ndarray, past_key: np.ndarray, past_value: np.ndarray) -> ModuleOutputs:
        feed = {iospec.X: x, iospec.PAST_KEY: past_key, iospec.PAST_VALUE: past_value}
        return tuple(self.session.run(list(iospec.MODULE_OUTPUTS), feed))

    def baked_axes(self) -> list[str]:
        return self.fixed_axes(iospec.module_dynamic_input_axes())


def module_ort_runner(name: str, contract: ModuleContract, path: str | Path, *, threads: int | None = None
                      ) -> OrtModuleRunner:
    """ort-cpu / ort-cuda for the block, as strict as verify's decoder runners (the same session config:
    :func:`~mhaexport.runners.names.session_config`)."""
    return OrtModuleRunner(name, contract, path, config=session_config(name, threads=threads))
