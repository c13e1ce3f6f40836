"""Rounding onto a floating-point grid: the one primitive every float-like format uses.

Works in float64, where every float32 input and every step 2**k of the target grid are exact,
so the division by the step and the rounding are exact too."""
from __future__ import annotations

import numpy as np

from .base import Rounding


def round_half(v: np.ndarray, rounding: Rounding) -> np.ndarray:
    """Round non-negative or signed `v` to integers with the given tie rule."""
    if rounding is Rounding.HALF_EVEN:
        return np.rint(v)
    return np.sign(v) * np.floor(np.abs(v) + 0.5)


def round_float_grid(x: np.ndarray, *, mantissa_bits: int, min_exp: int, max_value: float,
                     rounding: Rounding = Rounding.HALF_EVEN, saturate: bool = True) -> np.ndarray:
    """Round `x` to the nearest value of a binary float grid, as float64.

    The grid has `mantissa_bits` explicit mantissa bits, normal exponents >= `min_exp` (smaller
    magnitudes land on the subnormal grid of step 2**(min_exp - mantissa_bits)) and largest finite
    magnitude `max_value`. Overflow saturates to +-max_value when `saturate`, else becomes +-inf
    (IEEE cast behaviour, where a result that rounds past max_value overflows). NaN stays NaN;
    +-inf stays +-inf unless `saturate`, where it becomes +-max_value.
    """
    x = np.asarray(x, dtype=np.float64)
    a = np.abs(x)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        _, e = np.frexp(a)  # a = m * 2**e with m in [0.5, 1): the binade exponent is e - 1
        exp = np.maximum(e.astype(np.int64) - 1, min_exp)
        step = np.ldexp(1.0, exp - mantissa_bits)
        q = round_half(a / step, rounding) * step
        if saturate:
            q = np.minimum(q, max_value)
        else:
            q = np.where(q > max_value, np.inf, q)
        q = np.where(np.isinf(a), max_value if saturate else np.inf, q)
        out = np.copysign(q, x)
    return np.where(np.isnan(x), x, out)
