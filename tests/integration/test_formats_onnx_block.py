"""Block-format ONNX: the emitted model-local functions pass check_model(full_check=True) and
compute exactly the float32 bits of BlockFormat.fake_quant in stock onnxruntime."""
from __future__ import annotations

import numpy as np
import pytest

from mixq.errors import FormatError
from mixq.formats import MIXQ_DOMAIN, Rounding, get_format
from mixq.formats.block import BLOCK_FORMATS
from mixq.formats.onnx_util import run_emission  # runs check_model(full_check=True) first

ALL = list(BLOCK_FORMATS) + ["bfp(block=16,exp=8,mant=4)", "bfp(block=5,exp=4,mant=3)",
                             "bfp(block=32,exp=8,mant=23)", "bfp(block=12,exp=6,mant=10,sub=3)"]
BIG = np.finfo(np.float32).max


def assert_same_bits(got: np.ndarray, want: np.ndarray) -> None:
    got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
    assert got.shape == want.shape
    nan = np.isnan(want)
    np.testing.assert_array_equal(np.isnan(got), nan)
    bad = np.nonzero(got.view(np.int32)[~nan] != want.view(np.int32)[~nan])[0]
    assert bad.size == 0, f"{bad.size} mismatches, e.g. got {got[~nan][bad[:4]]} want {want[~nan][bad[:4]]}"


def tensor(shape: tuple[int, ...], seed: int, specials: bool = True) -> np.ndarray:
    """Random values over a wide exponent range plus zero blocks, subnormals, huge, NaN, inf."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * np.exp2(rng.uniform(-30, 30, shape))).astype(np.float32)
    flat = x.reshape(-1)
    n = flat.size
    flat[: min(n, 70)] = 0.0  # whole zero blocks (and -0.0 below)
    flat[rng.random(n) < 0.02] = -0.0
    sub = rng.random(n) < 0.03
    flat[sub] = rng.integers(-2 ** 23, 2 ** 23, sub.sum()).astype(np.float32) * np.float32(2.0 ** -149)
    huge = rng.random(n) < 0.01
    flat[huge] = rng.uniform(-BIG, BIG, huge.sum()).astype(np.float32)
    if specials and n > 400:
        flat[rng.integers(0, n, 3)] = np.nan
        flat[rng.integers(0, n, 2)] = np.inf
        flat[rng.integers(0, n, 2)] = -np.inf
    return x


CASES = [((1, 64, 56, 56), 1), ((256, 256, 3, 3), 1), ((37, 100), -1), ((3, 70, 5), 1),
         ((45, 6), 0), ((2, 3, 33), -1), ((4, 21, 2, 3), -3)]


@pytest.mark.parametrize("name", ALL)
class TestEmission:
    def test_bit_exact(self, name):
        fmt = get_format(name)
        for i, (shape, axis) in enumerate(CASES):
            x = tensor(shape, seed=i)
            (y,) = run_emission(fmt.emit("x", "y", axis=axis, prefix="q"), {"x": x})
            assert_same_bits(y, fmt.fake_quant(x, axis=axis))

    def test_subnormal_and_extreme_blocks(self, name):
        fmt = get_format(name)
        rng = np.random.default_rng(7)
        rows = [rng.integers(-40, 40, 64).astype(np.float32) * np.float32(2.0 ** -149),  # subnormal max
                np.full(64, 2.0 ** -126, np.float32), np.zeros(64, np.float32),
                np.full(64, -BIG, np.float32), rng.uniform(-BIG, BIG, 64).astype(np.float32),
                np.exp2(np.arange(-64, 0)).astype(np.float32) * 3]
        x = np.stack(rows)
        (y,) = run_emission(fmt.emit("x", "y", axis=1, prefix="q"), {"x": x})
        assert_same_bits(y, fmt.fake_quant(x, axis=1))

    def test_emission_shape(self, name):
        fmt = get_format(name)
        em = fmt.emit("in", "out", axis=-1, prefix="p")
        assert len(em.nodes) == 1 and em.nodes[0].domain == MIXQ_DOMAIN
        assert em.nodes[0].op_type == em.functions[0].name == fmt.function_name(-1)
        assert em.opsets == {"": 21, MIXQ_DOMAIN: 1}
        assert not em.initializers

    def test_weight(self, name):
        fmt = get_format(name)
        w = tensor((16, 40, 3), seed=3, specials=False)
        em = fmt.emit_weight(w, "wq", axis=1, prefix="w0")
        (y,) = run_emission(em, {})
        assert_same_bits(y, fmt.fake_quant(w, axis=1))
        assert em.nodes[0].domain == MIXQ_DOMAIN  # the format stays visible to a backend


@pytest.mark.parametrize("name", ["bfp16", "mx6", "mxint8", "bfp(block=5,exp=4,mant=3)"])
def test_half_away_emission(name):
    fmt = get_format(name)
    x = tensor((6, 40), seed=11)
    ties = (np.arange(240, dtype=np.float32).reshape(6, 40) - 120) * np.float32(0.5) ** 7 + np.float32(2.0 ** -8)
    x = np.concatenate([x, ties, np.float32(0.5 - 2.0 ** -25) * np.ones((1, 40), np.float32)])
    em = fmt.emit("x", "y", axis=1, prefix="q", rounding=Rounding.HALF_AWAY)
    assert em.functions[0].name.endswith("_away")
    (y,) = run_emission(em, {"x": x})
    assert_same_bits(y, fmt.fake_quant(x, axis=1, rounding=Rounding.HALF_AWAY))


def test_float_elements_reject_half_away():
    with pytest.raises(FormatError):
        get_format("mxfp4").emit("x", "y", axis=0, prefix="q", rounding=Rounding.HALF_AWAY)


def test_functions_are_per_format_axis():
    em = get_format("mxfp4").emit("a", "b", axis=1, prefix="p")
    em.extend(get_format("mxfp4").emit("b", "c", axis=1, prefix="p2"))
    em.extend(get_format("mxfp4").emit("c", "d", axis=-1, prefix="p3"))
    assert sorted(f.name for f in em.functions) == ["MXFP4_axis1", "MXFP4_axism1"]
    assert get_format("bfp(block=16,exp=8,mant=4)").function_name(0) == "BFP_B16_E8_M4_axis0"
