"""Element formats (integers, floats): NumPy reference vs ml_dtypes, exhaustive code tables,
format limits, properties on 1e5 values, qparams helpers, the name registry and its errors."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mixq.errors import FormatError
from mixq.formats import (FP_FORMATS, INT_FORMATS, FloatFormat, IntFormat, QParams, Rounding,
                          expand_param, get_format, list_formats, pof2_scale)

ELEMENT_FORMATS = [*INT_FORMATS.values(), *FP_FORMATS.values()]
SMALL_FLOATS = [f for f in FP_FORMATS.values() if f.bits <= 8]
SMALL_INTS = [f for f in INT_FORMATS.values() if f.bits <= 8]
N = 100_000


def unit_qparams(fmt) -> QParams | None:
    """Scale 1 (zero point: symmetric) or None for cast formats."""
    if not fmt.needs_qparams:
        return None
    zp = fmt.symmetric_zero_point if fmt.kind == "int" else 0
    return QParams(np.float32(1.0), np.array(zp))


def same(a: np.ndarray, b: np.ndarray) -> bool:
    """Bitwise equality of float32 arrays, any NaN matching any NaN."""
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    na, nb = np.isnan(a), np.isnan(b)
    return a.shape == b.shape and np.array_equal(na, nb) and np.array_equal(
        a[~na].view(np.uint32), b[~nb].view(np.uint32))


def all_codes(fmt: FloatFormat) -> np.ndarray:
    """Every value of a <= 8-bit float type, decoded by ml_dtypes (float64)."""
    return np.arange(2 ** fmt.bits, dtype=np.uint8).view(fmt.np_dtype).astype(np.float64)


# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", ELEMENT_FORMATS, ids=str)
class TestElementFormat:
    def test_identity(self, fmt):
        assert get_format(fmt.name) == fmt
        assert get_format(fmt.name.upper()) is fmt
        assert fmt.kind in ("int", "float")
        assert fmt.avg_bits == fmt.bits
        assert fmt.needs_qparams == (fmt.name not in ("fp16", "bf16"))
        assert str(fmt) == fmt.name

    def test_float32_out_same_shape(self, fmt):
        x = np.linspace(-3, 3, 24, dtype=np.float64).reshape(2, 3, 4)  # float64 in: cast first
        y = fmt.fake_quant(x, unit_qparams(fmt))
        assert y.dtype == np.float32 and y.shape == x.shape

    def test_special_values(self, fmt):
        qp = unit_qparams(fmt)
        y = fmt.fake_quant(np.array([0.0, -0.0, np.nan, np.inf, -np.inf], np.float32), qp)
        assert y[0] == 0 and y[1] == 0
        if fmt.kind == "int":  # as onnxruntime: NaN -> qmin, inf saturates
            assert y[2] == np.float32(fmt._fbounds[0]) - np.float32(fmt.symmetric_zero_point)
            assert y[3] == fmt.dequantize(np.float32(fmt._fbounds[1]), qp)
        else:
            assert np.isnan(y[2])
            assert np.signbit(y[1])  # -0 keeps its sign
            top = np.inf if not fmt.needs_qparams else fmt.max_normal  # cast vs saturating
            assert y[3] == top and y[4] == -top

    @settings(max_examples=4, deadline=None)
    @given(seed=st.integers(0, 2**32 - 1), log_scale=st.integers(-20, 20))
    def test_properties(self, fmt, seed, log_scale):
        """Idempotence, monotonicity, sign symmetry on 1e5 values per example."""
        rng = np.random.default_rng(seed)
        qp = unit_qparams(fmt)
        if qp is not None:
            scale = np.float32(2.0 ** log_scale * rng.uniform(0.5, 1.0))
            qp = QParams(scale, qp.zero_point)
            span = float(scale) * (fmt.symmetric_limit if fmt.kind == "int" else fmt.max_normal)
            if fmt.bits == 32:  # float32 arithmetic holds the int32 grid exactly below 2**24 only
                span = float(scale) * 2.0 ** 22
        else:
            span = 2.0 ** log_scale
        x = (rng.standard_normal(N) * span).astype(np.float32)
        y = fmt.fake_quant(x, qp)
        assert same(fmt.fake_quant(y, qp), y)  # idempotent
        order = np.argsort(x, kind="stable")
        ys = y[order]
        assert np.all(ys[1:] >= ys[:-1])  # monotone (inf included)
        if fmt.kind == "int" and fmt.bits == 32:
            return  # r + zp rounds in float32 (ulp 256 near 2**31): no sign symmetry
        if fmt.kind == "float" or fmt.narrow_range:  # symmetric grid
            assert np.array_equal(fmt.fake_quant(-x, qp), -y)
        else:  # symmetric inside the range
            lim = fmt.symmetric_limit * (float(qp.scale) if qp else 1.0)
            inside = np.abs(x) <= lim
            assert np.array_equal(fmt.fake_quant(-x[inside], qp), -y[inside])


# ---------------------------------------------------------------------------------------------
class TestFloatGrids:
    @pytest.mark.parametrize("fmt", SMALL_FLOATS, ids=str)
    def test_every_code_is_fixed(self, fmt):
        v = all_codes(fmt)
        fin = np.isfinite(v)
        qp = QParams(np.float32(1.0), np.array(0))
        assert np.array_equal(fmt.fake_quant(v[fin].astype(np.float32), qp), v[fin].astype(np.float32))
        assert np.array_equal(fmt.round_elements(v[fin]), v[fin])

    @pytest.mark.parametrize("fmt", SMALL_FLOATS, ids=str)
    def test_midpoints_round_to_even(self, fmt):
        codes = np.arange(2 ** fmt.bits, dtype=np.uint8)
        v = codes.view(fmt.np_dtype).astype(np.float64)
        pos = np.isfinite(v) & (v >= 0) & ~((v == 0) & (codes != 0))  # +0 and positives
        c, v = codes[pos], v[pos]
        order = np.argsort(v)
        c, v = c[order], v[order]
        mid = (v[:-1] + v[1:]) / 2  # exact in float64 (and float32)
        got = fmt.round_elements(mid)
        even = np.where(c[:-1] % 2 == 0, v[:-1], v[1:])  # the neighbour with an even mantissa
        assert np.array_equal(got, even)
        assert np.array_equal(fmt.round_elements(-mid), -even)
        away = fmt.round_elements(mid, Rounding.HALF_AWAY)
        assert np.array_equal(away, v[1:])
        # just off the midpoint goes to the nearer neighbour
        assert np.array_equal(fmt.round_elements(np.nextafter(mid, 0)), v[:-1])
        assert np.array_equal(fmt.round_elements(np.nextafter(mid, np.inf)), v[1:])

    @pytest.mark.parametrize("fmt", list(FP_FORMATS.values()), ids=str)
    def test_random_float32_vs_ml_dtypes(self, fmt):
        rng = np.random.default_rng(3)
        x = rng.integers(0, 2**32, N, dtype=np.uint64).astype(np.uint32).view(np.float32)
        x = np.concatenate([x, np.clip(rng.standard_normal(N) * fmt.max_normal / 3, -3e38, 3e38)
                            .astype(np.float32)])
        if not fmt.has_nan:  # ml_dtypes has no NaN to cast to; ours keeps NaN (tested elsewhere)
            x = x[~np.isnan(x)]
        with np.errstate(over="ignore", invalid="ignore"):
            if fmt.needs_qparams:  # saturating: clip first (ml_dtypes fn types overflow to NaN)
                want = np.clip(x, -fmt.max_normal, fmt.max_normal).astype(fmt.np_dtype)
                got = fmt.fake_quant(x, QParams(np.float32(1.0), np.array(0)))
            else:  # IEEE cast
                want = x.astype(fmt.np_dtype)
                got = fmt.fake_quant(x)
        assert same(got, want.astype(np.float32))

    @pytest.mark.parametrize("name, emax, max_normal, min_normal, min_sub", [
        ("fp16", 15, 65504.0, 2.0**-14, 2.0**-24),
        ("bf16", 127, float(ml_dtypes.finfo(ml_dtypes.bfloat16).max), 2.0**-126, 2.0**-133),
        ("fp8_e4m3fn", 8, 448.0, 2.0**-6, 2.0**-9),
        ("fp8_e5m2", 15, 57344.0, 2.0**-14, 2.0**-16),
        ("fp6_e3m2", 4, 28.0, 0.25, 2.0**-4),
        ("fp6_e2m3", 2, 7.5, 1.0, 0.125),
        ("fp4_e2m1", 2, 6.0, 1.0, 0.5),
    ])
    def test_limits(self, name, emax, max_normal, min_normal, min_sub):
        f = FP_FORMATS[name]
        assert (f.emax, f.max_normal, f.min_normal, f.min_subnormal) == (emax, max_normal, min_normal, min_sub)
        fi = ml_dtypes.finfo(f.np_dtype)
        assert f.max_normal == float(fi.max) and f.min_subnormal == float(fi.smallest_subnormal)
        assert f.round_elements(np.array([f.min_subnormal / 2]))[0] == 0  # tie to even: 0
        assert f.round_elements(np.array([f.min_subnormal * 0.75]))[0] == f.min_subnormal

    def test_overflow(self):
        fp16, bf16, e4m3 = FP_FORMATS["fp16"], FP_FORMATS["bf16"], FP_FORMATS["fp8_e4m3fn"]
        x = np.array([65519.0, 65520.0, -65520.0, 1e30], np.float32)
        assert fp16.fake_quant(x).tolist() == [65504.0, np.inf, -np.inf, np.inf]
        assert np.isinf(bf16.fake_quant(np.array([3.4e38], np.float32)))[0]
        qp = QParams(np.float32(0.5), np.array(0))
        assert e4m3.fake_quant(np.array([1e6, -1e6, 225.0], np.float32), qp).tolist() == [224.0, -224.0, 224.0]
        fp4 = FP_FORMATS["fp4_e2m1"]
        assert fp4.fake_quant(np.array([2.5, 5.0, 7.0, 100.0], np.float32), QParams(1.0, 0)).tolist() == [2, 4, 6, 6]
        assert fp4.fake_quant(np.array([2.5], np.float32), QParams(1.0, 0), rounding=Rounding.HALF_AWAY)[0] == 3

    def test_qparams_from_range(self):
        f = FP_FORMATS["fp8_e4m3fn"]
        qp = f.qparams_from_range(-896.0, 100.0, symmetric=True)
        assert float(qp.scale) == 2.0 and int(qp.zero_point) == 0
        assert float(f.qparams_from_range(0.0, 0.0).scale) == 1.0
        qp = f.qparams_from_range(np.array([-1.0, -3.0]), np.array([2.0, 1.0]), axis=0, power_of_two=True)
        assert qp.axis == 0 and qp.scale.tolist() == [2.0**-7, 2.0**-7]
        assert f.qparams_from_range(-1, 1, symmetric=False).zero_point == 0  # always symmetric
        with pytest.raises(FormatError, match="cast format"):
            FP_FORMATS["bf16"].qparams_from_range(-1, 1)


# ---------------------------------------------------------------------------------------------
class TestIntegers:
    def test_ranges(self):
        got = {n: (f.qmin, f.qmax) for n, f in INT_FORMATS.items()}
        assert got["int8"] == (-128, 127) and got["int8n"] == (-127, 127)
        assert got["uint8"] == (0, 255) and got["uint8n"] == (1, 255)
        assert got["int4"] == (-8, 7) and got["uint4"] == (0, 15)
        assert got["int32"] == (-2**31, 2**31 - 1) and got["uint32"] == (0, 2**32 - 1)
        assert INT_FORMATS["int32"]._fbounds == (-2.0**31, 2.0**31 - 128)
        assert INT_FORMATS["uint32"]._fbounds == (0.0, 2.0**32 - 256)

    @pytest.mark.parametrize("fmt", SMALL_INTS, ids=str)
    def test_every_code_and_midpoint(self, fmt):
        zp = fmt.symmetric_zero_point
        qp = QParams(np.float32(0.25), np.array(zp))  # power of two: x = (q - zp) * s exact
        q = np.arange(fmt.qmin, fmt.qmax + 1, dtype=np.float64)
        x = ((q - zp) * 0.25).astype(np.float32)
        assert np.array_equal(fmt.fake_quant(x, qp), x)
        assert np.array_equal(fmt.quantize(x, qp), q.astype(np.float32))
        mid = ((q[:-1] + 0.5 - zp) * 0.25).astype(np.float32)
        even = np.where(q[:-1] % 2 == 0, q[:-1], q[1:])
        assert np.array_equal(fmt.quantize(mid, qp), even.astype(np.float32))
        away = np.where(q[:-1] + 0.5 - zp > 0, q[1:], q[:-1])
        assert np.array_equal(fmt.quantize(mid, qp, rounding=Rounding.HALF_AWAY), away.astype(np.float32))

    def test_golden(self):
        i8, i8n, u8 = INT_FORMATS["int8"], INT_FORMATS["int8n"], INT_FORMATS["uint8"]
        qp = QParams(np.float32(1.0), np.array(0))
        x = np.array([1000, -1000, 2.5, -2.5, 0.49999997, np.nan], np.float32)
        assert i8.fake_quant(x, qp).tolist()[:5] == [127, -128, 2, -2, 0]
        assert i8.fake_quant(x, qp)[5] == -128  # NaN -> qmin (onnxruntime)
        assert i8n.fake_quant(x, qp).tolist()[:2] == [127, -127]
        assert i8.fake_quant(x, qp, rounding=Rounding.HALF_AWAY).tolist()[2:5] == [3, -3, 0]
        qp = QParams(np.float32(0.1), np.array(128))
        assert u8.fake_quant(np.array([0.1, -12.8, -13, 13], np.float32), qp).tolist() == \
            [np.float32(0.1), np.float32(-12.8), np.float32(-12.8), np.float32(127 * np.float32(0.1))]
        # int32: huge values clip to the float32 bound inside the range
        i32 = INT_FORMATS["int32"]
        assert i32.fake_quant(np.array([3e9, -3e9], np.float32), QParams(1.0, 0)).tolist() == \
            [2.0**31 - 128, -2.0**31]

    def test_division_not_reciprocal(self):
        """x / scale, as onnxruntime: differs from x * (1 / scale) for some inputs."""
        f = INT_FORMATS["int16"]
        s = np.float32(0.1)
        x = (np.arange(-30000, 30000, dtype=np.float32) + 0.5) * s
        q = f.quantize(x, QParams(s, 0))
        assert np.array_equal(q, np.clip(np.rint(x / s), -32768, 32767))

    def test_per_channel_and_block_match_slices(self):
        f = INT_FORMATS["int8"]
        rng = np.random.default_rng(0)
        x = rng.standard_normal((4, 10, 3)).astype(np.float32) * 4
        s = rng.uniform(0.01, 0.05, 10).astype(np.float32)
        zp = rng.integers(-20, 20, 10)
        for axis in (1, -2):
            y = f.fake_quant(x, QParams(s, zp, axis=axis))
            for c in range(10):
                assert np.array_equal(y[:, c], f.fake_quant(x[:, c], QParams(s[c], zp[c])))
        sb = rng.uniform(0.01, 0.05, (4, 3, 3)).astype(np.float32)  # blocks 4, 4, 2 on axis 1
        zb = rng.integers(-20, 20, (4, 3, 3))
        y = f.fake_quant(x, QParams(sb, zb, axis=1, block_size=4))
        for b in range(3):
            blk = slice(4 * b, min(4 * b + 4, 10))
            want = f.fake_quant(x[:, blk], QParams(sb[:, b:b + 1], zb[:, b:b + 1], axis=1, block_size=4))
            assert np.array_equal(y[:, blk], want)
            for i in range(4):
                for k in range(3):
                    assert np.array_equal(y[i, blk, k], f.fake_quant(x[i, blk, k], QParams(sb[i, b, k], zb[i, b, k])))

    def test_qparams_from_range(self):
        i8, u8, i4 = INT_FORMATS["int8"], INT_FORMATS["uint8"], INT_FORMATS["int4"]
        qp = i8.qparams_from_range(-2.54, 1.0, symmetric=True)
        assert np.isclose(float(qp.scale), 2.54 / 127) and int(qp.zero_point) == 0
        qp = u8.qparams_from_range(-1.0, 1.27, symmetric=True)
        assert int(qp.zero_point) == 128 and np.isclose(float(qp.scale), 1.27 / 127)
        qp = u8.qparams_from_range(0.5, 2.55, symmetric=False)  # widened to include 0
        assert int(qp.zero_point) == 0 and np.isclose(float(qp.scale), 0.01)
        qp = i8.qparams_from_range(-1.0, 3.0, symmetric=False)
        assert i8.fake_quant(np.float32(0.0), qp) == 0.0  # 0 is exact
        for sym in (True, False):
            z = i8.qparams_from_range(0.0, 0.0, symmetric=sym)
            assert float(z.scale) == 1.0
        qp = i4.qparams_from_range(np.array([-1.0, -0.1, 0.0]), np.array([3.0, 0.2, 0.0]),
                                   symmetric=True, power_of_two=True, axis=0)
        assert qp.axis == 0 and qp.scale.tolist() == [0.5, 2.0**-5, 1.0]
        with pytest.raises(FormatError, match="non-finite"):
            i8.qparams_from_range(-np.inf, 1.0, symmetric=True)
        with pytest.raises(FormatError, match="lo > hi"):
            i8.qparams_from_range(2.0, 1.0, symmetric=False)
        qp = INT_FORMATS["int32"].qparams_from_range(-1.0, 3.0, symmetric=False)
        assert np.float32(qp.zero_point) == qp.zero_point  # float32-exact zero point

    @settings(max_examples=4, deadline=None)
    @given(seed=st.integers(0, 2**32 - 1))
    def test_pof2_scale_never_overflows(self, seed):
        rng = np.random.default_rng(seed)
        absmax = np.abs(rng.standard_normal(N) * 10.0 ** rng.integers(-30, 30, N))
        for fmt in (INT_FORMATS["int8"], INT_FORMATS["uint4"], FP_FORMATS["fp8_e4m3fn"], FP_FORMATS["fp4_e2m1"]):
            s = pof2_scale(absmax, fmt).astype(np.float64)
            m, _ = np.frexp(s)
            assert np.all(m == 0.5)  # powers of two
            assert np.all(absmax / s <= fmt.symmetric_limit)  # no clipping
            assert np.all(absmax / s > fmt.symmetric_limit / 2)  # the smallest such

    def test_int4_payload_type(self):
        assert INT_FORMATS["int4"].np_dtype is ml_dtypes.int4
        assert IntFormat(4, False) is not None and IntFormat(4, False).name == "uint4"


# ---------------------------------------------------------------------------------------------
class TestBroadcasting:
    def test_expand_param(self):
        assert expand_param(np.float32(2), (3, 4)).shape == ()
        assert expand_param(np.arange(4), (3, 4), axis=-1).shape == (1, 4)
        e = expand_param(np.arange(6).reshape(3, 2), (3, 5), axis=1, block_size=3)
        assert e.tolist() == [[0, 0, 0, 1, 1], [2, 2, 2, 3, 3], [4, 4, 4, 5, 5]]

    @pytest.mark.parametrize("kw, match", [
        ({"axis": 3}, "out of range"),
        ({"axis": None}, "needs qparams.axis"),
        ({"axis": 0}, "needs"),
    ])
    def test_bad_shapes(self, kw, match):
        with pytest.raises(FormatError, match=match):
            expand_param(np.arange(4.0), (3, 5), **kw)

    def test_bad_block(self):
        with pytest.raises(FormatError, match="per-block"):
            expand_param(np.ones((3, 3)), (3, 5), axis=1, block_size=3)
        with pytest.raises(FormatError, match="axis"):
            INT_FORMATS["int8"].fake_quant(np.ones((3, 5), np.float32),
                                           QParams(np.ones((3, 3)), np.zeros((3, 3)), block_size=2))


# ---------------------------------------------------------------------------------------------
class TestRegistryAndErrors:
    def test_every_listed_format_round_trips(self):
        fmts = list_formats()
        names = [f.name for f in fmts]
        assert len(names) == len(set(names))
        for f in fmts:
            assert get_format(f.name) == f
            assert get_format(f" {f.name.upper()} ") == f
        for n in [*INT_FORMATS, *FP_FORMATS]:
            assert n in names

    @pytest.mark.parametrize("alias, canon", [
        ("int8(narrow)", "int8n"), ("Float16", "fp16"), ("bfloat16", "bf16"),
        ("float8_e4m3fn", "fp8_e4m3fn"), ("float4_e2m1fn", "fp4_e2m1"), ("float6_e2m3fn", "fp6_e2m3"),
    ])
    def test_aliases(self, alias, canon):
        assert get_format(alias).name == canon

    def test_unknown_names(self):
        with pytest.raises(FormatError) as e:
            get_format("int9")
        msg = str(e.value)
        assert "'int9'" in msg and "int8" in msg and "Did you mean" in msg
        with pytest.raises(FormatError, match="fp8_e4m3fn"):
            get_format("fp8_e4m3fnx")
        for bad in ("", "int", "int8nn", "uint8(wide)", "fp8"):
            with pytest.raises(FormatError):
                get_format(bad)
        with pytest.raises(FormatError, match="string"):
            get_format(8)  # type: ignore[arg-type]

    def test_bad_qparams(self):
        i8, e4 = INT_FORMATS["int8"], FP_FORMATS["fp8_e4m3fn"]
        x = np.ones(4, np.float32)
        for fmt in (i8, e4):
            with pytest.raises(FormatError, match="needs qparams"):
                fmt.fake_quant(x)
            for s in (0.0, -1.0, np.nan, np.inf):
                with pytest.raises(FormatError, match="finite and > 0"):
                    fmt.fake_quant(x, QParams(np.float32(s), np.array(0)))
        with pytest.raises(FormatError, match="zero point out of"):
            i8.fake_quant(x, QParams(1.0, 200))
        with pytest.raises(FormatError, match="zero points must be 0"):
            e4.fake_quant(x, QParams(1.0, 1))
        with pytest.raises(FormatError, match="no qparams"):
            FP_FORMATS["fp16"].fake_quant(x, QParams(1.0, 0))
        with pytest.raises(FormatError, match="bits"):
            IntFormat(7, True)
