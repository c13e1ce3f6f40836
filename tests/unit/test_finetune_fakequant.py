"""The torch fake quantization of mixq.finetune equals the NumPy reference bit for bit."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from mixq.formats import Rounding, get_format  # noqa: E402
from mixq.finetune.fakequant import TorchQuantizer, torch_fake_quant  # noqa: E402

R = np.random.default_rng(1234)


def _rand(shape: tuple[int, ...]) -> np.ndarray:
    """Values over many binades, with zeros, a subnormal, +-inf and NaN."""
    x = (R.standard_normal(shape) * np.exp(R.uniform(-10, 10, shape))).astype(np.float32)
    x.reshape(-1)[:6] = [0.0, -0.0, np.float32(1e-40), np.inf, -np.inf, np.nan]
    return x


def _bits_equal(ref: np.ndarray, got: np.ndarray) -> None:
    assert ref.dtype == got.dtype == np.float32 and ref.shape == got.shape
    nan_r, nan_g = np.isnan(ref), np.isnan(got)
    np.testing.assert_array_equal(nan_r, nan_g)
    np.testing.assert_array_equal(ref.view(np.uint32)[~nan_r], got.view(np.uint32)[~nan_g])


@pytest.mark.parametrize("name", ["bf16", "fp16"])
@pytest.mark.parametrize("rounding", list(Rounding))
def test_cast_formats(name, rounding):
    x = _rand((5, 33, 7))
    ref = get_format(name).fake_quant(x, rounding=rounding)
    _bits_equal(ref, torch_fake_quant(torch.from_numpy(x), name, rounding=rounding).numpy())


@pytest.mark.parametrize("name", ["bfp16", "mxfp8_e4m3", "mxfp4", "mxfp6_e3m2", "mx6", "mxint8",
                                  "bfp(block=16,exp=8,mant=4)"])
@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("rounding", list(Rounding))
def test_block_formats(name, axis, rounding):
    x = _rand((6, 70, 5))
    ref = get_format(name).fake_quant(x, axis=axis, rounding=rounding)
    got = torch_fake_quant(torch.from_numpy(x), name, axis=axis, rounding=rounding).numpy()
    _bits_equal(ref, got)


@pytest.mark.parametrize("name", ["int8", "uint8", "int4", "int16", "int8n", "int32"])
@pytest.mark.parametrize("rounding", list(Rounding))
def test_int_formats_per_tensor_and_channel(name, rounding):
    fmt = get_format(name)
    x = _rand((4, 6, 3))
    per_tensor = fmt.qparams_from_range(-3.0, 5.0, symmetric=False)
    per_channel = fmt.qparams_from_range(np.full(6, -2.0), np.linspace(0.1, 4.0, 6), symmetric=True, axis=1)
    for qp in (per_tensor, per_channel):
        ref = fmt.fake_quant(x, qp, rounding=rounding)
        _bits_equal(ref, torch_fake_quant(torch.from_numpy(x), name, qp, rounding=rounding).numpy())


@pytest.mark.parametrize("name", ["fp8_e4m3fn", "fp4_e2m1", "fp6_e2m3"])
def test_scaled_float_formats(name):
    fmt = get_format(name)
    x = _rand((4, 6))
    for qp in (fmt.qparams_from_range(-3.0, 5.0), fmt.qparams_from_range(np.full(6, -2.0), np.linspace(0.1, 4, 6), axis=1)):
        _bits_equal(fmt.fake_quant(x, qp), torch_fake_quant(torch.from_numpy(x), name, qp).numpy())


def test_ste_gradient_masks_clipped_values():
    fmt = get_format("int8")
    qp = fmt.qparams_from_range(-1.0, 1.0, symmetric=True)
    q = TorchQuantizer(fmt, (4,), qp)
    x = torch.tensor([0.3, -0.2, 5.0, -7.0], requires_grad=True)
    y = q.ste(x)
    _bits_equal(fmt.fake_quant(x.detach().numpy(), qp), y.detach().numpy())
    y.sum().backward()
    assert x.grad.tolist() == [1.0, 1.0, 0.0, 0.0]
    # block formats pass the gradient everywhere (no clipping)
    xb = torch.randn(2, 64, requires_grad=True)
    TorchQuantizer("mxfp4", (2, 64), axis=1).ste(xb).sum().backward()
    assert bool(torch.all(xb.grad == 1))


@pytest.mark.parametrize("name", ["bf16", "fp16"])
def test_cast_ties_overflow_and_subnormals(name):
    bits = R.integers(0, 2**32, 4096, dtype=np.uint64).astype(np.uint32)
    bits[:1024] = (bits[:1024] & 0xFFFF0000) | 0x8000  # exact bf16 ties
    bits[1024:2048] = (bits[1024:2048] & 0xFFFFE000) | 0x1000  # exact fp16 ties (normal range)
    x = bits.view(np.float32)
    x = np.concatenate([x, np.float32([65519.0, 65520.0, 3.3961776e38, 3.4028235e38, 1e-8, -6e-8])])
    ref = get_format(name).fake_quant(x)
    _bits_equal(ref, torch_fake_quant(torch.from_numpy(x), name).numpy())
