"""Bit-exactness of the vectorized bfloat16/float16 rounding used by mixq.convert."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, numpy_helper

from mixq.convert._rounding import (BF16_MAX, bf16_bits, round_tensor_inplace, round_to_bf16, round_to_fp16,
                                    tensor_to_target)
from mixq.formats._grid import round_float_grid

BF16_MAX = float(ml_dtypes.finfo(ml_dtypes.bfloat16).max)
SPECIALS = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 1.0, -1.0, 1e-45, -1e-45, 1e-40, 1.17e-38,
                     3.4028235e38, -3.4028235e38, 3.3895e38, 3.39e38, 1.00390625, 1.01171875, 1.0039063,
                     65504.0, 65520.0, 2.0 ** -133, 2.0 ** -134, 3 * 2.0 ** -135], dtype=np.float32)


def _grid(x: np.ndarray) -> np.ndarray:
    return round_float_grid(x, mantissa_bits=7, min_exp=-126, max_value=BF16_MAX, saturate=False)


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    return bool(np.array_equal(np.isnan(a), np.isnan(b)) and
                np.array_equal(a[~np.isnan(a)], b[~np.isnan(b)]) and
                np.array_equal(np.signbit(a[~np.isnan(a)]), np.signbit(b[~np.isnan(b)])))


def test_bf16_bits_match_ml_dtypes_on_random_bit_patterns():
    rng = np.random.default_rng(0)
    x = rng.integers(0, 2 ** 32, size=1_000_000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    x = np.concatenate([x, SPECIALS])
    ours = bf16_bits(x)
    ref = x.astype(ml_dtypes.bfloat16).view(np.uint16)
    assert np.array_equal(ours, ref)  # NaN payloads included: quiet NaN 0x7FC0 with the sign


def test_bf16_values_match_round_float_grid_reference():
    rng = np.random.default_rng(1)
    x = np.concatenate([rng.standard_normal(200_000).astype(np.float32) * np.float32(10.0) **
                        rng.integers(-40, 38, 200_000).astype(np.float32), SPECIALS])
    with np.errstate(over="ignore"):
        x = x.astype(np.float32)
    assert _same(round_to_bf16(x), _grid(x))


def test_every_float16_value_to_bf16_and_back():
    x = np.arange(2 ** 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    ours = round_to_bf16(x)
    assert ours.dtype == np.float16
    with np.errstate(over="ignore"):
        ref = x.astype(ml_dtypes.bfloat16).astype(np.float16)
    assert _same(ours, ref)
    assert np.array_equal(bf16_bits(x), x.astype(ml_dtypes.bfloat16).view(np.uint16))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.floats(width=32, allow_nan=True, allow_infinity=True, allow_subnormal=True),
                min_size=1, max_size=64))
def test_bf16_property_vs_grid_and_ml_dtypes(vals):
    x = np.array(vals, dtype=np.float32)
    assert _same(round_to_bf16(x), _grid(x))
    assert np.array_equal(bf16_bits(x), x.astype(ml_dtypes.bfloat16).view(np.uint16))


def test_ties_round_to_even():
    # 1 + 2**-8 is half-way between 1 and 1 + 2**-7: ties to the even mantissa (1.0)
    x = np.array([1 + 2 ** -8, 1 + 3 * 2 ** -8, -(1 + 2 ** -8)], np.float32)
    assert round_to_bf16(x).tolist() == [1.0, 1 + 2 ** -6, -1.0]


def test_tensor_to_bf16_storage_specials():
    x = SPECIALS.copy()
    t = numpy_helper.from_array(x, "w")
    out, over = tensor_to_target(t, TensorProto.BFLOAT16)
    assert out.data_type == TensorProto.BFLOAT16 and list(out.dims) == [x.size]
    stored = np.frombuffer(out.raw_data, dtype="<u2")
    # ml_dtypes' bits, except that finite weights past the bfloat16 range saturate to its
    # largest finite value (a mask of float32's lowest value must not become -inf)
    past = np.isfinite(x) & np.isinf(x.astype(ml_dtypes.bfloat16).astype(np.float32))
    ref = x.astype(ml_dtypes.bfloat16)
    ref[past] = np.where(x[past] > 0, BF16_MAX, -BF16_MAX).astype(ml_dtypes.bfloat16)
    assert np.array_equal(stored, ref.view(np.uint16))
    # numpy_helper reads it back as the same bfloat16 values
    back = numpy_helper.to_array(out).astype(np.float32)
    assert _same(back, ref.astype(np.float32))
    assert over == int(np.sum(past))
    assert over >= 2  # float32 max rounds past the bfloat16 max


def test_round_tensor_inplace_keeps_type_and_specials():
    x = SPECIALS.copy()
    t = numpy_helper.from_array(x, "w")
    round_tensor_inplace(t, TensorProto.BFLOAT16)
    assert t.data_type == TensorProto.FLOAT and t.name == "w"
    ref = x.astype(ml_dtypes.bfloat16).astype(np.float32)
    past = np.isfinite(x) & np.isinf(ref)
    ref[past] = np.where(x[past] > 0, BF16_MAX, -BF16_MAX)  # saturated, as tensor_to_target
    assert _same(numpy_helper.to_array(t), ref)


def test_fp16_rounding_saturates_weights():
    x = np.array([1e5, -1e5, np.inf, np.nan, 1.0 + 2 ** -11, 6e-8], np.float32)
    r = round_to_fp16(x, saturate=True)
    assert r[0] == 65504 and r[1] == -65504 and np.isinf(r[2]) and np.isnan(r[3])
    assert r[4] == 1.0  # tie to even
    t, over = tensor_to_target(numpy_helper.from_array(x, "w"), TensorProto.FLOAT16)
    assert over == 2 and numpy_helper.to_array(t).dtype == np.float16


def test_rounding_speed_is_vectorized():
    import time
    x = np.random.default_rng(0).standard_normal(5_000_000).astype(np.float32)
    t = time.perf_counter()
    bf16_bits(x)
    assert time.perf_counter() - t < 0.5
