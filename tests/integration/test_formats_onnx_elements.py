"""Bit-exactness of every element format's ONNX emission in stock onnxruntime vs the NumPy
reference: per tensor / per channel / per block, emitted activations and stored weights."""
from __future__ import annotations

import zlib

import numpy as np
import onnx
import pytest

from mixq.errors import FormatError
from mixq.formats import FP_FORMATS, INT_FORMATS, QParams, Rounding
from mixq.formats.onnx_util import emission_to_model, run_emission

ELEMENT_FORMATS = [*INT_FORMATS.values(), *FP_FORMATS.values()]
SCALED = [f for f in ELEMENT_FORMATS if f.needs_qparams]
CAST = [f for f in ELEMENT_FORMATS if not f.needs_qparams]
SHAPE = (3, 10, 5)  # block_size 4 along axis 1: blocks of 4, 4, 2 (partial last block)


def _seed(*parts: object) -> int:
    """A reproducible seed per test case (str hashes are salted per process)."""
    return zlib.crc32(repr(parts).encode())


def assert_bits_equal(got: np.ndarray, want: np.ndarray) -> None:
    """Equal bit patterns, except that any NaN matches any NaN."""
    got = np.asarray(got, np.float32)
    want = np.asarray(want, np.float32)
    assert got.shape == want.shape
    gn, wn = np.isnan(got), np.isnan(want)
    assert np.array_equal(gn, wn), f"NaN positions differ: {np.argwhere(gn != wn)[:5]}"
    g, w = got[~gn].view(np.uint32), want[~wn].view(np.uint32)
    bad = np.nonzero(g != w)[0]
    assert bad.size == 0, (f"{bad.size} values differ, e.g. got {got[~gn][bad[:5]]} "
                           f"want {want[~wn][bad[:5]]}")


def _sample(rng: np.random.Generator, shape: tuple[int, ...], amax: float) -> np.ndarray:
    """Random values spanning the range and beyond, plus zeros, -0, NaN, +-inf, ties."""
    x = np.clip(rng.standard_normal(shape) * amax * 0.6, -3e38, 3e38).astype(np.float32)
    flat = x.reshape(-1)
    n = flat.size
    flat[rng.choice(n, n // 10, replace=False)] = 0.0
    flat[rng.choice(n, n // 20, replace=False)] = -0.0
    big = np.clip(np.array([1.01, -1.01, 100.0]) * amax, -3e38, 3e38)
    spec = np.concatenate([[np.nan, np.inf, -np.inf, 1e-42, -1e-42], big]).astype(np.float32)
    flat[rng.choice(n, spec.size, replace=False)] = spec
    return x


def _qparams(fmt, x: np.ndarray, mode: str, rng: np.random.Generator, symmetric: bool) -> QParams:
    """Scales from a range a bit narrower than the data (so some values clip)."""
    finite = np.where(np.isfinite(x), x, 0.0)
    if mode == "tensor":
        lo, hi = float(np.min(finite)) * 0.8, float(np.max(finite)) * 0.8
        return fmt.qparams_from_range(lo, hi, symmetric=symmetric)
    if mode.startswith("channel"):
        axis = {"channel": 1, "channel_neg": -2, "channel_last": -1}[mode]
        red = tuple(i for i in range(x.ndim) if i != axis % x.ndim)
        lo, hi = finite.min(axis=red) * 0.8, finite.max(axis=red) * 0.8
        return fmt.qparams_from_range(lo, hi, symmetric=symmetric, axis=axis)
    # per block along axis 1, block 4: scale shape (3, 3, 5)
    base = fmt.qparams_from_range(float(finite.min()), float(finite.max()), symmetric=symmetric)
    sshape = (x.shape[0], -(-x.shape[1] // 4), x.shape[2])
    scale = (base.scale * rng.uniform(0.25, 2.0, sshape)).astype(np.float32)
    if symmetric or fmt.kind != "int":
        zp = np.broadcast_to(base.zero_point, sshape)
    else:
        zp = rng.integers(fmt.qmin, fmt.qmax, sshape, endpoint=True)
        zp = np.clip(zp.astype(np.float32), *fmt._fbounds).astype(np.int64)  # float32-exact
    return QParams(scale, zp, axis=1, block_size=4)


MODES = ["tensor", "channel", "channel_neg", "channel_last", "block"]


@pytest.mark.parametrize("fmt", SCALED, ids=str)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("symmetric", [True, False], ids=["sym", "asym"])
def test_emit_bit_exact(fmt, mode, symmetric):
    rng = np.random.default_rng(_seed(fmt.name, mode, symmetric))
    x = _sample(rng, SHAPE, 50.0)
    qp = _qparams(fmt, x, mode, rng, symmetric)
    em = fmt.emit("x", "y", qparams=qp, prefix="t")
    (got,) = run_emission(em, {"x": x})
    assert_bits_equal(got, fmt.fake_quant(x, qp))


@pytest.mark.parametrize("fmt", SCALED, ids=str)
@pytest.mark.parametrize("mode", MODES)
def test_emit_weight_bit_exact(fmt, mode):
    rng = np.random.default_rng(_seed(fmt.name, mode, "w"))
    w = (rng.standard_normal(SHAPE) * 3).astype(np.float32)
    qp = _qparams(fmt, w, mode, rng, symmetric=True)
    em = fmt.emit_weight(w, "y", qparams=qp, prefix="w")
    (got,) = run_emission(em, {})
    assert_bits_equal(got, fmt.fake_quant(w, qp))


@pytest.mark.parametrize("fmt", CAST, ids=str)
def test_cast_formats_bit_exact(fmt):
    rng = np.random.default_rng(7)
    bits = rng.integers(0, 2**32, size=200_000, dtype=np.uint64).astype(np.uint32)
    x = np.concatenate([bits.view(np.float32), _sample(rng, (1000,), float(fmt.max_normal))])
    (got,) = run_emission(fmt.emit("x", "y", prefix="c"), {"x": x})
    assert_bits_equal(got, fmt.fake_quant(x))
    w = x[np.isfinite(x)][:5000].reshape(50, 100)
    em = fmt.emit_weight(w, "y", prefix="w")
    assert em.initializers[0].data_type == fmt.onnx_type  # stored in 16 bits
    (got,) = run_emission(em, {})
    assert_bits_equal(got, fmt.fake_quant(w))


@pytest.mark.parametrize("fmt", SCALED, ids=str)
def test_emit_random_bits_per_tensor(fmt):
    """Every float32 class (subnormals, huge, NaN payloads) through QDQ at a few scales."""
    rng = np.random.default_rng(11)
    x = rng.integers(0, 2**32, size=100_000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    for scale in (1.0, 0.37, 2.0**-20, 3.0e5):
        qp = QParams(np.float32(scale), np.array(0 if fmt.kind != "int" else
                                                getattr(fmt, "symmetric_zero_point", 0)))
        (got,) = run_emission(fmt.emit("x", "y", qparams=qp, prefix="r"), {"x": x})
        assert_bits_equal(got, fmt.fake_quant(x, qp))


@pytest.mark.parametrize("fmt", ELEMENT_FORMATS, ids=str)
def test_all_zero_and_check_model(fmt):
    x = np.zeros((2, 4), np.float32)
    qp = fmt.qparams_from_range(0.0, 0.0, symmetric=True) if fmt.needs_qparams else None
    em = fmt.emit("x", "y", qparams=qp, prefix="z")
    model = emission_to_model(em, {"x": onnx.TensorProto.FLOAT}, input_shapes={"x": [2, 4]})
    onnx.checker.check_model(model, full_check=True)
    (got,) = run_emission(em, {"x": x})
    assert_bits_equal(got, fmt.fake_quant(x, qp))
    assert not np.any(np.signbit(got))


def test_weight_payload_is_compact():
    w = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)
    for name, itemsize in [("int8", 1), ("int4", 0.5), ("uint16", 2), ("int32", 4),
                           ("fp8_e4m3fn", 1), ("fp4_e2m1", 1), ("fp6_e3m2", 1)]:
        fmt = INT_FORMATS.get(name) or FP_FORMATS[name]
        qp = fmt.qparams_from_range(-3.0, 3.0, symmetric=True)
        em = fmt.emit_weight(w, "y", qparams=qp, prefix="w")
        payload = em.initializers[0]
        assert len(payload.raw_data) <= w.size * itemsize + 1, name


@pytest.mark.parametrize("fmt", SCALED, ids=str)
def test_half_away_not_emittable(fmt):
    qp = fmt.qparams_from_range(-1.0, 1.0, symmetric=True)
    with pytest.raises(FormatError, match="HALF_EVEN"):
        fmt.emit("x", "y", qparams=qp, prefix="p", rounding=Rounding.HALF_AWAY)


@pytest.mark.parametrize("fmt", SCALED, ids=str)
def test_one_element_scale_is_per_tensor(fmt):
    x = np.array([[-3.0, 0.5, 2.0, np.nan]], np.float32)
    zp = 0 if fmt.kind != "int" else fmt.symmetric_zero_point
    qp = QParams(np.array([0.25], np.float32), np.array([zp]), axis=1 if fmt.kind == "int" else None)
    (got,) = run_emission(fmt.emit("x", "y", qparams=qp, prefix="o"), {"x": x})
    assert_bits_equal(got, fmt.fake_quant(x, qp))


def test_native_int_nan_is_qmin():
    """onnxruntime's QuantizeLinear maps NaN to qmin whatever the zero point; the reference too."""
    fmt = INT_FORMATS["int8"]
    qp = QParams(np.float32(0.5), np.array(-10))
    x = np.full(64, np.nan, np.float32)
    (got,) = run_emission(fmt.emit("x", "y", qparams=qp, prefix="n"), {"x": x})
    assert np.all(got == (-128 + 10) * 0.5)
    assert_bits_equal(got, fmt.fake_quant(x, qp))
