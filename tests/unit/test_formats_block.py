"""Block formats (BFP, shared microexponents, OCP MX): names, hand-worked blocks, every element
code, and properties of the NumPy reference."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mixq.errors import FormatError
from mixq.formats import FP_FORMATS, Rounding, get_format, list_formats
from mixq.formats.block import BLOCK_FORMATS, BlockFormat, make_bfp, parse_block_format

EXTRA = ["bfp(block=16,exp=8,mant=4)", "bfp(block=5,exp=4,mant=3)", "bfp(block=32,exp=8,mant=23)",
         "bfp(block=12,exp=6,mant=10,sub=3)"]
ALL = list(BLOCK_FORMATS) + EXTRA


def f32(*v: float) -> np.ndarray:
    return np.array(v, dtype=np.float32)


def fq(name: str, x, axis: int = -1, rounding: Rounding = Rounding.HALF_EVEN) -> np.ndarray:
    return get_format(name).fake_quant(np.asarray(x, np.float32), axis=axis, rounding=rounding)


# -- names ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ALL)
def test_canonical_name_round_trips(name):
    fmt = get_format(name)
    assert isinstance(fmt, BlockFormat) and fmt.kind == "block" and not fmt.needs_qparams
    assert get_format(fmt.name) == fmt
    assert get_format(fmt.name.upper().replace(",", ", ")) == fmt


def test_presets_are_listed_and_aliases_canonicalize():
    listed = {f.name for f in list_formats()}
    assert set(BLOCK_FORMATS) <= listed
    assert get_format("bfp(block=8,exp=8,mant=7)") is BLOCK_FORMATS["bfp16"]
    assert get_format("bfp(mant=7,exp=8,block=16,sub=2)") is BLOCK_FORMATS["mx9"]
    assert get_format("bfp(mant=4)").name == "bfp(block=8,exp=8,mant=4)"
    assert parse_block_format("int8") is None


@pytest.mark.parametrize("name,bits,avg", [
    ("bfp16", 8, 9.0), ("mx4", 3, 4.0), ("mx6", 5, 6.0), ("mx9", 8, 9.0), ("mxint8", 8, 8.25),
    ("mxfp8_e4m3", 8, 8.25), ("mxfp8_e5m2", 8, 8.25), ("mxfp6_e3m2", 6, 6.25),
    ("mxfp6_e2m3", 6, 6.25), ("mxfp4", 4, 4.25), ("bfp(block=16,exp=8,mant=4)", 5, 5.5)])
def test_widths(name, bits, avg):
    fmt = get_format(name)
    assert fmt.bits == bits and fmt.avg_bits == pytest.approx(avg)


@pytest.mark.parametrize("bad", [
    "bfp(", "bfp()", "bfp(block=0)", "bfp(block=8,exp=9,mant=4)", "bfp(foo=1)", "bfp(block=8,block=8)",
    "bfp(block=x)", "bfp(block=-4)", "bfp(mant=24)", "bfp(block=8,sub=3)", "bfp(block=8,sub=8)",
    "bfp(block=8 exp=8)", "bfp(exp=0)", "mxfp5", "bfp17"])
def test_malformed_names_raise(bad):
    with pytest.raises(FormatError):
        get_format(bad)


def test_make_bfp_validates():
    with pytest.raises(FormatError):
        make_bfp(block=8, exp=8, mant=23, sub=2)  # finest step 2**-150
    assert make_bfp(block=8, exp=8, mant=22, sub=2).name == "bfp(block=8,exp=8,mant=22,sub=2)"


def test_call_errors():
    fmt = get_format("mxfp4")
    with pytest.raises(FormatError):
        fmt.fake_quant(np.ones(4, np.float32))  # axis required
    with pytest.raises(FormatError):
        fmt.fake_quant(np.ones(4, np.float32), axis=1)
    with pytest.raises(FormatError):
        fmt.emit("x", "y", prefix="p")
    from mixq.formats import QParams
    with pytest.raises(FormatError):
        fmt.fake_quant(np.ones(4, np.float32), QParams(1.0, 0), axis=0)


def test_element_specs_agree_with_floating():
    for fmt in BLOCK_FORMATS.values():
        if fmt.element != "int":
            assert fmt.element_format is FP_FORMATS[fmt.element]


# -- hand-worked blocks -------------------------------------------------------------------------
def test_mxfp4_saturates_block_max():
    x = np.zeros(32, np.float32)
    x[:6] = [7.0, -7.0, 0.25, 0.75, 2.5, 5.0]
    y = fq("mxfp4", x)
    # X = 2**(floor(log2 7) - 2) = 1: 7 -> 6 (saturate), 0.25 -> 0 (tie to even), 0.75 -> 1
    # (tie to even 1.0), 2.5 -> 2 (tie to even), 5 -> 4 (tie to even between 4 and 6)
    np.testing.assert_array_equal(y[:6], f32(6.0, -6.0, 0.0, 1.0, 2.0, 4.0))
    assert not y[6:].any()


def test_mxfp4_scale_from_max():
    x = np.full(32, 0.1, np.float32)
    x[3] = 100.0  # E = 6, X = 2**4 = 16: 100/16 = 6.25 -> 6 -> 96; 0.1/16 -> 0
    y = fq("mxfp4", x)
    assert y[3] == 96.0 and not np.delete(y, 3).any()


def test_mxint8():
    x = np.zeros(32, np.float32)
    x[:5] = [1.5, 1.99, -1.99, 0.01, 2 ** -7]
    y = fq("mxint8", x)  # X = 1, elements k / 64, |k| <= 127
    np.testing.assert_array_equal(y[:5], f32(1.5, 127 / 64, -127 / 64, 1 / 64, 0.0))


def test_nan_or_inf_makes_the_block_nan():
    x = np.arange(64, dtype=np.float32)
    x[5] = np.nan
    x[40] = -np.inf
    for name in ALL:
        fmt = get_format(name)
        y = fmt.fake_quant(x, axis=0)
        blk = np.arange(64) // fmt.block_size
        hit = np.isin(blk, [5 // fmt.block_size, 40 // fmt.block_size])
        assert np.isnan(y[hit]).all() and not np.isnan(y[~hit]).any(), name


def test_zero_block_and_partial_block():
    x = np.zeros(40, np.float32)
    x[35] = 3.0  # partial last block of 8: the padding is not data
    for name in ALL:
        y = fq(name, x)
        assert y.shape == x.shape and not y[:32].any() and not np.signbit(y[:32]).any()
        assert y[35] == 3.0


def test_subnormal_scale_is_clamped():
    x = np.zeros(32, np.float32)
    x[0], x[1] = 2.0 ** -130, 2.0 ** -149
    # E = -130: X = 2**(-130 - 2) clamps to 2**-127; 2**-130 / 2**-127 = 0.125 -> 0 in fp4
    assert not fq("mxfp4", x).any()
    # fp8_e4m3: X = 2**-127 (clamped from -138), 2**-3 is a normal e4m3 value; 2**-22 -> 0
    y = fq("mxfp8_e4m3", x)
    assert y[0] == np.float32(2.0 ** -130) and y[1] == 0
    # mxint8: X = 2**-127 (clamped from -130); step 2**-133: 2**-130 kept, 2**-149 -> 0
    y = fq("mxint8", x)
    assert y[0] == np.float32(2.0 ** -130) and y[1] == 0


def test_near_float32_max():
    big = np.finfo(np.float32).max
    x = np.full(32, -big, np.float32)
    for name in ALL:
        y = fq(name, x)
        assert np.isfinite(y).all() and (y < 0).all() and (np.abs(y) <= big).all(), name
    assert fq("bfp16", f32(big, *[0] * 7))[0] == np.float32(127 * 2.0 ** 121)  # 128 steps -> 127


def test_bfp16_rounding_modes():
    x = f32(1.0, 2.0 ** -7 * 2.5, -(2.0 ** -7) * 2.5, 2.0 ** -7 * 3.5, 0, 0, 0, 0)
    # E = 0, step 2**-6: 2.5 * 2**-7 = 1.25 steps -> 1 step; use exact ties with mant=7:
    even = fq("bfp16", x)
    np.testing.assert_array_equal(even[:4], f32(1.0, 2.0 ** -6, -(2.0 ** -6), 2.0 ** -6 * 2))
    tie = f32(1.0, 2.0 ** -6 * 2.5, -(2.0 ** -6) * 2.5, 2.0 ** -6 * 0.5, 0, 0, 0, 0)
    np.testing.assert_array_equal(fq("bfp16", tie)[:4], f32(1.0, 2.0 ** -6 * 2, -(2.0 ** -6) * 2, 0.0))
    np.testing.assert_array_equal(fq("bfp16", tie, rounding=Rounding.HALF_AWAY)[:4],
                                  f32(1.0, 2.0 ** -6 * 3, -(2.0 ** -6) * 3, 2.0 ** -6))


def test_bfp_saturates_instead_of_bumping_the_exponent():
    x = f32(1.999, 0, 0, 0, 0, 0, 0, 0)  # rounds to 128 steps of 2**-6 -> saturates to 127
    assert fq("bfp16", x)[0] == np.float32(127 / 64)


def test_small_exponent_field_clamps():
    fmt = get_format("bfp(block=4,exp=3,mant=3)")  # bias 3: s in [-3, 4]
    y = fmt.fake_quant(f32(1000.0, 1.0, 2.0 ** -10, 0), axis=0)
    # s = 4, step 2**2: 1000 -> 7 * 4 = 28 (saturated), 1 -> 0 (0.25 steps), tiny -> 0
    np.testing.assert_array_equal(y, f32(28.0, 0.0, 0.0, 0.0))
    y = fmt.fake_quant(f32(2.0 ** -6, 2.0 ** -7, 0, 0), axis=0)  # s clamps up to -3: step 2**-5
    np.testing.assert_array_equal(y, f32(0.0, 0.0, 0.0, 0.0))


def test_mx9_microexponent_rule():
    x = np.zeros(16, np.float32)
    x[0] = 1.5            # E = 0; sub-block 0 keeps step 2**-6
    x[1] = 2.0 ** -7 * 3  # 3 * 2**-7 on step 2**-6: tie 1.5 -> 2 steps
    x[2] = 2.0 ** -7 * 3  # sub-block 1: max < 1 -> one binade lower, step 2**-7: exact
    x[4] = 0.99999        # sub-block 2: max < 1, step 2**-7: 127.99 -> 128 -> saturates to 127
    y = fq("mx9", x)
    assert y[0] == 1.5 and y[1] == 2.0 ** -5 and y[2] == 2.0 ** -7 * 3
    assert y[4] == np.float32(127 * 2.0 ** -7)
    # MX4: 2 magnitude bits. E = 0, step 0.5 / 0.25 in the lower binade
    y = fq("mx4", f32(1.0, 0.3, 0.3, 0.3, *[0] * 12))
    np.testing.assert_array_equal(y[:4], f32(1.0, 0.5, 0.25, 0.25))


# -- every element code -----------------------------------------------------------------------------
def _element_grid(fmt: BlockFormat) -> np.ndarray:
    """Every finite element value (unscaled) of `fmt`."""
    if fmt.element == "int":
        k = np.arange(-fmt.max_code, fmt.max_code + 1, dtype=np.float64)
        return k * 2.0 ** (1 - fmt.mant_bits)  # shared exponent 0
    ef = fmt.element_format
    codes = np.arange(2 ** ef.bits, dtype=np.uint8).view(ef.np_dtype).astype(np.float64)
    return np.unique(codes[np.isfinite(codes)])


@pytest.mark.parametrize("name", [n for n in BLOCK_FORMATS] + ["bfp(block=16,exp=8,mant=4)"])
@pytest.mark.parametrize("scale_exp", [-127, -3, 0, 20])
def test_every_element_code_is_reproduced(name, scale_exp):
    fmt = get_format(name)
    grid = _element_grid(fmt)
    top = grid.max()  # pins the shared exponent: the block max is the element max
    B = fmt.block_size
    emax = 0 if fmt.element == "int" else fmt.element_format.emax
    X = 2.0 ** scale_exp
    # blocks of B: element 0 (and every sub-block's first element) pins the scale
    free = [i for i in range(B) if i % fmt.sub_block] if fmt.sub_block > 1 else list(range(1, B))
    nblk = -(-grid.size // len(free))
    vals = np.concatenate([grid, np.zeros(nblk * len(free) - grid.size)])
    blocks = np.full((nblk, B), top)
    blocks[:, free] = vals.reshape(nblk, len(free))
    x = (blocks * X).astype(np.float32)
    assert np.array_equal(x.astype(np.float64), blocks * X)  # the codes are float32 values
    assert emax >= 0
    y = fmt.fake_quant(x, axis=1)
    np.testing.assert_array_equal(y, x)


# -- properties on 1e5+ values per format ----------------------------------------------------------
def _random(seed: int, n: int, spread: float) -> np.ndarray:
    rng = np.random.default_rng(seed)
    mag = np.exp2(rng.uniform(-spread, spread, n)) * rng.standard_normal(n)
    x = np.clip(mag, -3e38, 3e38).astype(np.float32)
    x[rng.random(n) < 0.05] = 0
    return x


PROP = settings(max_examples=10, deadline=None, derandomize=True)


@pytest.mark.parametrize("name", ALL)
class TestProperties:
    @PROP
    @given(seed=st.integers(0, 2 ** 32 - 1), spread=st.sampled_from([1.0, 8.0, 40.0, 140.0]),
           half_away=st.booleans())
    def test_idempotent_and_odd(self, name, seed, spread, half_away):
        fmt = get_format(name)
        rounding = Rounding.HALF_AWAY if half_away else Rounding.HALF_EVEN
        x = _random(seed, 10_080, spread).reshape(-1, 48)  # 48: partial blocks for 32
        y = fmt.fake_quant(x, axis=1, rounding=rounding)
        np.testing.assert_array_equal(fmt.fake_quant(y, axis=1, rounding=rounding), y)
        np.testing.assert_array_equal(fmt.fake_quant(-x, axis=1, rounding=rounding), -y)
        assert np.isfinite(y).all()

    @PROP
    @given(seed=st.integers(0, 2 ** 32 - 1), log_max=st.integers(-140, 126))
    def test_monotone_with_fixed_scale(self, name, seed, log_max):
        fmt = get_format(name)
        B, S = fmt.block_size, fmt.sub_block
        rng = np.random.default_rng(seed)
        M = np.float32(2.0 ** log_max * rng.uniform(1, 1.99))
        nblk = 10_000 // B + 1
        pins = [i for i in range(B) if i % S == 0] if S > 1 else [0]
        free = [i for i in range(B) if i not in pins]
        vals = np.sort(rng.uniform(-1, 1, nblk * len(free))).astype(np.float32) * M
        x = np.empty((nblk, B), np.float32)
        x[:, pins] = M  # every (sub-)block's scale is pinned by M
        x[:, free] = vals.reshape(nblk, len(free))
        y = fmt.fake_quant(x, axis=1)[:, free].ravel()
        assert (np.diff(y) >= 0).all()
