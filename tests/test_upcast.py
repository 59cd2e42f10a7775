"""A half-precision model's float32 reference (models/upcast.py) never upcasts a large weight whole: a plain linear
layer computes its output a slice of rows at a time, an embedding upcasts the rows it looks up — and gives what the
whole upcast gives up to float32's rounding (the same products, summed in the order the matrix kernel picks for a
slice's size), so the reference is the float32 model's."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from mhaexport.models import upcast
from mhaexport.models.upcast import Float32, computed_in_float32, linear_in_float32

pytestmark = pytest.mark.usefixtures("one_thread")


def rounding_of(got: torch.Tensor, want: torch.Tensor) -> None:
    """got is want up to float32's rounding: within 1e-5 of want's largest value (measured: at most 2e-6 on
    Llama-3-8B's shapes; a dropped slice, a wrong bias or a bfloat16 product is off by orders more)."""
    assert got.dtype == torch.float32 and got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5 * float(want.abs().max()))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("bias", [False, True])
def test_a_sliced_linear_is_the_whole_upcast(dtype, bias):
    g = torch.Generator().manual_seed(0)
    w = (torch.randn(5632, 2048, generator=g) * 0.02).to(dtype)  # TinyLlama's MLP: 11 slices of 512 rows
    b = (torch.randn(5632, generator=g) * 0.02).to(dtype) if bias else None
    assert upcast.SLICE_BYTES // (4 * 2048) < 5632  # the slicing is exercised, not one slice
    for T in (1, 7, 64):
        x = torch.randn(2, T, 2048, generator=g)
        want = F.linear(x, w.float(), None if b is None else b.float())
        got = linear_in_float32(x, w, b)
        rounding_of(got, want)
        assert not torch.equal(got, F.linear(x.to(dtype), w, b).float())  # not the half-precision product


def test_slices_that_do_not_divide_the_rows(monkeypatch):
    monkeypatch.setattr(upcast, "SLICE_BYTES", 4 * 64 * 5)  # 5 rows a slice over 23 rows: a short last slice
    w = torch.randn(23, 64).to(torch.bfloat16)
    x = torch.randn(3, 64)
    rounding_of(linear_in_float32(x, w, None), F.linear(x, w.float()))


class _Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(50, 512)
        self.norm = nn.LayerNorm(512)  # swapped whole (not a linear layer or embedding)
        self.up = nn.Linear(512, 3000)
        self.down = nn.Linear(3000, 512, bias=False)

    def forward(self, ids):
        return self.down(torch.relu(self.up(self.norm(self.emb(ids)))))


def test_a_half_models_float32_forward_never_holds_a_large_weight_in_float32(monkeypatch):
    torch.manual_seed(0)
    f32 = _Tiny()
    for p in f32.parameters():
        p.data = p.data.to(torch.bfloat16).float()  # values a bfloat16 model holds exactly
    half = _Tiny().to(torch.bfloat16)
    half.load_state_dict({k: v.to(torch.bfloat16) for k, v in f32.state_dict().items()})
    monkeypatch.setattr(upcast, "SLICE_BYTES", 512 * 4 * 100)  # 100 rows a slice: 30 slices of `up`

    largest = []
    real_to = torch.Tensor.to

    def watched(t, *args, **kwargs):
        out = real_to(t, *args, **kwargs)
        if out.dtype == torch.float32 and t.dtype == torch.bfloat16:
            largest.append(out.numel())
        return out

    ids = torch.randint(0, 50, (2, 9))
    monkeypatch.setattr(torch.Tensor, "to", watched)
    with torch.no_grad():
        got = Float32(half)(ids)
    monkeypatch.setattr(torch.Tensor, "to", real_to)
    with torch.no_grad():
        want = f32(ids)
    rounding_of(got, want)
    assert largest and max(largest) <= 100 * 3000  # a slice of `down` (100 rows of 3000): never a whole weight
    assert {p.dtype for p in half.parameters()} == {torch.bfloat16}
    assert all("forward" not in m.__dict__ for m in half.modules())  # the sliced forwards were taken back


def test_a_forward_that_raises_leaves_the_model_as_it_was():
    half = _Tiny().to(torch.bfloat16)
    with pytest.raises(IndexError):
        with torch.no_grad(), computed_in_float32(half):
            half(torch.tensor([[99]]))  # out of the table
    assert {p.dtype for p in half.parameters()} == {torch.bfloat16}
    assert all("forward" not in m.__dict__ for m in half.modules())


@pytest.mark.parametrize("first", ["inference_mode", "grad"])
def test_the_kept_slice_buffer_serves_every_autograd_mode(monkeypatch, first):
    """The buffer the process keeps for a slice's upcast is made on first use — possibly under
    ``torch.inference_mode`` (verify's checks) and then written outside it (an export's headroom pass), or first with
    autograd on: every order computes the same product (an inference tensor written outside its mode raised, CI
    2026-12-06)."""
    monkeypatch.setattr(upcast, "_SLICE", [])
    w = torch.randn(40, 64).to(torch.bfloat16)
    x = torch.randn(3, 64)
    want = F.linear(x, w.float())
    modes = [torch.inference_mode, torch.no_grad, torch.enable_grad]
    if first == "grad":
        modes = modes[::-1]
    for mode in modes + modes:
        with mode():
            rounding_of(linear_in_float32(x, w, None), want)
    assert not upcast._SLICE[0].is_inference() and upcast._SLICE[0].grad_fn is None
