"""Range observers: from :class:`TensorStats` to a calibration range ``(lo, hi)``.

Pure numpy (never imports onnxruntime).

Conventions
-----------
* Every returned range contains 0 (``lo <= 0 <= hi``), as the zero point of an affine
  ``QuantizeLinear`` requires; a symmetric range is ``(-t, t)``.
* A tensor without any finite value, or whose values are all 0, gives ``(0.0, 0.0)``. Callers map
  a zero-width range to scale 1 (zero point 0); the quantized tensor is then exact (all zeros).
  A constant non-zero tensor ``c`` gives ``(min(c, 0), max(c, 0))``, never a zero width.
* Results are plain Python floats and never NaN.

Methods
-------
MINMAX      exact min / max.
PERCENTILE  the `percentile`-th percentile of ``|x|`` (symmetric) or the low / high tails
            separately (asymmetric), interpolated linearly inside the histogram bin.
ENTROPY     TensorRT-style KL-divergence threshold on ``|x|``: the 65536-bin histogram is re-binned
            into `num_bins` (2048) linear bins over ``[0, absmax]``; every candidate threshold
            ``i * absmax / num_bins`` (every i from `num_quant_bins` to `num_bins`) is scored
            by KL(P || Q) where P is the clipped reference distribution (outliers folded into
            the last bin) and Q its `num_quant_bins`-group quantization expanded back uniformly
            over P's non-empty bins (groups: bin k -> ``k * num_quant_bins // i``). KL is
            evaluated in closed form from prefix sums, for all candidates at once
            (candidates x num_quant_bins work, a few ms). The threshold is symmetric; an asymmetric range
            is the symmetric one intersected with ``[min, max]`` (a ReLU output gives
            ``(0, t)``) and a one-sided tensor uses all `levels` as quantization bins. Exact
            zeros (the histogram's zero bucket) are left out of P and Q: every candidate
            represents them exactly, and a ReLU6 output that is 78 % zeros (EfficientNet-Lite0)
            otherwise fills bin 0 so that spreading it over Q's first group outweighs
            everything else, and the search returned its smallest candidate (0 % top-1).
MINMSE      the range minimizing the expected quantization MSE = clipping error (exact on the
            histogram) + rounding error (``step**2 / 12`` per value, or ``x**2`` for values that
            round to 0), evaluated for all candidates at once with prefix sums of
            ``n, n*x, n*x**2`` over the histogram bins. Symmetric: 320 thresholds
            ``absmax * 2**(-j/32)``; asymmetric: a 128 x 128 grid of ``(lo, hi)`` shrink factors
            ``2**(-j/16)``. For scaled float formats (fp8/fp6/fp4) the rounding error uses the
            float grid (relative step ``2**-mantissa_bits``, subnormals, saturation at max).
            With ``min_gain`` > 1 on an integer grid, the clipped range is taken only where its
            expected error is at most ``1 / min_gain`` of the MinMax range's; otherwise MinMax.
            The per-tensor MSE models the error at the tensor, not at the model's output, on a
            calibration set that may see a thinner tail than later data: a margin keeps MinMSE
            where it wins clearly (an empirical choice, measured in docs/ACCURACY.md).
"""
from __future__ import annotations

import enum
import math
import re
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from mixq.errors import ConfigError, DataError, did_you_mean

from .stats import TensorStats

__all__ = ["CalibMethod", "compute_range", "compute_weight_range", "pof2_exponent",
           "GridModel", "grid_model"]


class CalibMethod(enum.Enum):
    """How a calibration range is chosen from the collected statistics."""

    MINMAX = "minmax"
    PERCENTILE = "percentile"
    ENTROPY = "entropy"
    MINMSE = "minmse"

    @classmethod
    def parse(cls, value: "CalibMethod | str") -> "CalibMethod":
        """Accept a member, its value or name in any case (``"MinMax"``, ``"min_mse"``...)."""
        if isinstance(value, cls):
            return value
        if isinstance(value, str):
            key = value.strip().lower().replace("_", "").replace("-", "")
            aliases = {"minmax": cls.MINMAX, "percentile": cls.PERCENTILE,
                       "entropy": cls.ENTROPY, "kl": cls.ENTROPY, "minmse": cls.MINMSE,
                       "mse": cls.MINMSE}
            if key in aliases:
                return aliases[key]
        names = [m.name for m in cls]
        raise ConfigError(f"unknown calibration method {value!r}; expected one of "
                          f"{', '.join(names)}.{did_you_mean(str(value).upper(), names)}")


# ---------------------------------------------------------------------------- quantization grids
@dataclass(frozen=True)
class GridModel:
    """What a range observer needs to know about the target format.

    kind "int": `levels` equally spaced values. kind "float": a scaled binary float grid with
    `mantissa_bits`, normal exponents >= `min_exp` and largest magnitude `max_value` (the
    calibrated range maps onto ``[-max_value, max_value]``). kind "none": the format needs no
    range (fp16/bf16/block formats); observers then return the min/max range.
    """

    kind: str
    levels: int = 256
    mantissa_bits: int = 0
    min_exp: int = 0
    max_value: float = 0.0


_FLOAT_GRIDS = {  # (total bits, mantissa bits, min normal exponent, max finite value)
    "fp8_e4m3fn": (8, 3, -6, 448.0), "fp8_e4m3": (8, 3, -6, 448.0),
    "fp8_e5m2": (8, 2, -14, 57344.0), "fp6_e3m2": (6, 2, -2, 28.0), "fp6_e2m3": (6, 3, 0, 7.5),
    "fp4_e2m1": (4, 1, 0, 6.0),
}


def grid_model(fmt: Any) -> GridModel:
    """Map an int (number of levels), a format name or a Format object to a :class:`GridModel`."""
    if isinstance(fmt, GridModel):
        return fmt
    if isinstance(fmt, (int, np.integer)) and not isinstance(fmt, bool):
        if fmt < 2:
            raise ConfigError(f"number of quantization levels must be >= 2, got {fmt}")
        return GridModel("int", levels=int(fmt))
    name = fmt if isinstance(fmt, str) else getattr(fmt, "name", None)
    if not isinstance(name, str):
        raise ConfigError(f"expected a number of levels, a format name or a Format, got {fmt!r}")
    key = name.strip().lower()
    m = re.fullmatch(r"(u?)int(\d+)(n?)", key)
    if m:
        bits = int(m.group(2))
        return GridModel("int", levels=2 ** bits - (1 if m.group(3) else 0))
    if key in _FLOAT_GRIDS:
        nbits, mb, me, mv = _FLOAT_GRIDS[key]
        return GridModel("float", levels=2 ** (nbits - 1), mantissa_bits=mb, min_exp=me,
                         max_value=mv)
    m = re.fullmatch(r"fp(\d+)_e(\d+)m(\d+)", key)
    if m:  # generic OCP-style small float without inf/nan
        e, mb = int(m.group(2)), int(m.group(3))
        bias = 2 ** (e - 1) - 1
        mv = (2.0 - 2.0 ** -mb) * 2.0 ** (2 ** e - 1 - bias)
        return GridModel("float", levels=2 ** (int(m.group(1)) - 1), mantissa_bits=mb,
                         min_exp=1 - bias, max_value=mv)
    kind = getattr(fmt, "kind", None)
    if kind == "int" and hasattr(fmt, "bits"):
        return GridModel("int", levels=2 ** int(fmt.bits))
    if getattr(fmt, "needs_qparams", True) is False or key in ("fp16", "bf16", "fp32") \
            or key.startswith(("mx", "bfp")):
        return GridModel("none")
    raise ConfigError(f"cannot calibrate a range for format {name!r}: not an integer or scaled "
                      "float format")


# ---------------------------------------------------------------------------- histogram helpers
class _Prefix:
    """Prefix sums of n, n*c, n*c^2 over sorted bin centres c, for O(log N) interval queries."""

    def __init__(self, centers: np.ndarray, counts: np.ndarray) -> None:
        self.c = centers
        n = counts.astype(np.float64)
        z = np.zeros(1)
        self.s0 = np.concatenate([z, np.cumsum(n)])
        self.s1 = np.concatenate([z, np.cumsum(n * centers)])
        self.s2 = np.concatenate([z, np.cumsum(n * centers * centers)])

    def idx(self, v: np.ndarray, side: Literal["left", "right"]) -> np.ndarray:
        return np.searchsorted(self.c, v, side=side)

    def sums(self, a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(sum n, sum n c, sum n c^2) over bins with a <= c < b (a, b broadcast)."""
        i, j = self.idx(a, "left"), self.idx(b, "left")
        j = np.maximum(i, j)
        return self.s0[j] - self.s0[i], self.s1[j] - self.s1[i], self.s2[j] - self.s2[i]


def _centers(stats: TensorStats) -> tuple[np.ndarray, np.ndarray]:
    lo, hi, cnt = stats.bins()
    c = 0.5 * (lo + hi)
    c[lo == hi] = lo[lo == hi]
    return c, cnt


def _int_mse(p: _Prefix, lo: np.ndarray, hi: np.ndarray, levels: int) -> np.ndarray:
    """Expected squared error of a `levels`-value uniform grid on [lo, hi] (lo <= 0 <= hi;
    arrays that broadcast against each other)."""
    lo = np.asarray(lo, dtype=np.float64)
    hi = np.asarray(hi, dtype=np.float64)
    step = (hi - lo) / (levels - 1)
    inf = np.full_like(step, np.inf)
    # clipping above hi and below lo
    n, s1, s2 = p.sums(np.nextafter(hi, inf), inf)
    err = s2 - 2 * hi * s1 + hi * hi * n
    n, s1, s2 = p.sums(-inf, lo)
    err = err + s2 - 2 * lo * s1 + lo * lo * n
    # rounding: x^2 for |x| < d (rounds to the exact zero), step^2/12 elsewhere in range
    d = step / math.sqrt(12.0)
    n_in, _, _ = p.sums(lo, np.nextafter(hi, inf))
    n_small, _, s2_small = p.sums(np.maximum(-d, lo), np.minimum(d, np.nextafter(hi, inf)))
    return err + s2_small + (n_in - n_small) * step * step / 12.0


def _float_mse(c: np.ndarray, n: np.ndarray, t: np.ndarray, g: GridModel) -> np.ndarray:
    """Expected squared error of a scaled float grid with max magnitude t, per candidate t."""
    s = (t / g.max_value)[:, None]
    a = np.abs(c)[None, :]
    with np.errstate(divide="ignore", invalid="ignore"):
        v = a / s
        _, e = np.frexp(v)
    exp = np.maximum(e - 1, g.min_exp)
    step = np.ldexp(1.0, exp - g.mantissa_bits) * s
    rnd = np.minimum(a * a, step * step / 12.0)
    clip = (a - t[:, None]) ** 2
    err = np.where(a > t[:, None], clip, rnd)
    return (err * n[None, :]).sum(axis=1)


def _with_zero(lo: float, hi: float) -> tuple[float, float]:
    lo, hi = float(min(lo, 0.0)), float(max(hi, 0.0))
    if not (math.isfinite(lo) and math.isfinite(hi)):
        raise DataError(f"calibration range ({lo}, {hi}) is not finite")
    return lo, hi


# ---------------------------------------------------------------------------- methods
def _percentile_signed(stats: TensorStats, q: float) -> float:
    """Value at fraction q in [0, 1] of the signed distribution (linear inside a bin)."""
    lo, hi, cnt = stats.bins()
    return _percentile_from_bins(lo, hi, cnt, q)


def _percentile_from_bins(lo: np.ndarray, hi: np.ndarray, cnt: np.ndarray, q: float) -> float:
    cum = np.cumsum(cnt)
    total = cum[-1]
    r = q * total
    k = int(np.searchsorted(cum, r, side="left"))
    k = min(max(k, 0), cnt.size - 1)
    before = cum[k - 1] if k > 0 else 0
    frac = min(max((r - before) / cnt[k], 0.0), 1.0)
    return float(lo[k] + (hi[k] - lo[k]) * frac)


#: the widest grid Entropy calibrates (9 bits): the KL search scores every candidate threshold
#: against every quantization bin, about 15 x bins^2 values: 4M (30 MB) at 512 bins, and 16 G
#: (120 GiB) at int16's 32768
ENTROPY_MAX_LEVELS = 512


def entropy_too_wide(levels: int) -> str:
    """Why calibration='entropy' refuses a grid of `levels` levels, and what to use instead."""
    return (f"calibration='entropy' (a KL-divergence threshold) is defined for grids of up to 9 bits; a "
            f"{levels}-level grid would score {16 * (levels // 2):,} candidate thresholds against {levels // 2:,} "
            "quantization bins each (about 120 GiB at 16 bits). Use calibration='percentile' or 'minmse' "
            "for wider grids (or power_of_two), or entropy with 8-bit activations.")


def _entropy_threshold(stats: TensorStats, num_quant_bins: int, num_bins: int = 2048) -> float:
    """TensorRT-style KL threshold on |x| (see module docstring)."""
    amax = stats.absmax
    alo, ahi, acnt = stats.abs_bins()
    if alo.size and alo[0] == 0.0:  # exact zeros: exact under every threshold (module docstring)
        acnt = acnt.copy()
        acnt[0] = 0
    # re-bin: the CDF is piecewise linear inside each (log) bin
    xp = np.stack([alo, ahi], axis=1).reshape(-1)
    cum = np.cumsum(acnt).astype(np.float64)
    fp = np.stack([cum - acnt, cum], axis=1).reshape(-1)
    edges = np.linspace(0.0, amax, num_bins + 1)
    cdf = np.interp(edges, xp, fp)
    cdf[-1] = cum[-1]
    hist = np.diff(cdf)
    hist[hist < 0] = 0.0
    return _kl_search(hist, int(num_quant_bins), amax)


def _kl_search(hist: np.ndarray, nq: int, amax: float) -> float:
    """Threshold minimizing KL(P || Q) over every candidate bin count i in [nq, len(hist)].

    Closed form per candidate, so the work is O(candidates x nq) instead of
    O(candidates x bins): with P the clipped reference (outliers folded into bin i-1), Pg_j its
    mass in quantization group j and Qn_j the normalized, expanded quantized value of group j,
    ``KL = sum(p log p)/S - log S - sum_j Pg_j log Qn_j / S`` (S = total mass).
    """
    B = hist.size
    if nq >= B:
        return amax
    h = hist
    nz = h > 0
    z = np.zeros(1)
    cumh = np.concatenate([z, np.cumsum(h)])
    with np.errstate(divide="ignore", invalid="ignore"):
        hlogh = np.where(nz, h * np.log(np.where(nz, h, 1.0)), 0.0)
    cum_hlogh = np.concatenate([z, np.cumsum(hlogh)])
    cumnz = np.concatenate([z, np.cumsum(nz)])
    total = cumh[-1]
    cand = np.arange(nq, B + 1)
    j = np.arange(nq)
    start = (j[None, :] * cand[:, None] + nq - 1) // nq
    end = ((j[None, :] + 1) * cand[:, None] + nq - 1) // nq
    gsum = cumh[end] - cumh[start]
    gnz = cumnz[end] - cumnz[start]
    outl = total - cumh[cand]
    last = h[cand - 1]
    plast = last + outl
    gnz[:, -1] += (last <= 0) & (outl > 0)
    pg = gsum.copy()
    pg[:, -1] += outl
    with np.errstate(divide="ignore", invalid="ignore"):
        plogp = cum_hlogh[cand - 1] + np.where(plast > 0, plast * np.log(np.where(plast > 0,
                                                                                  plast, 1.0)), 0)
        qsum = cumh[cand][:, None]
        qn = np.where((gnz > 0) & (qsum > 0), gsum / np.where(gnz > 0, gnz, 1.0) / qsum, 0.0)
        qn = np.where(qn > 0, qn, 1e-12)
        cross = np.where(pg > 0, pg * np.log(qn), 0.0).sum(axis=1)
    kl = plogp / total - np.log(total) - cross / total
    best = int(np.argmin(kl))
    return float(cand[best] * amax / B)


_SYM_FRACS = 2.0 ** (-np.arange(320) / 32.0)
_ASYM_FRACS = 2.0 ** (-np.arange(128) / 16.0)


def _minmse_range(stats: TensorStats, g: GridModel, symmetric: bool) -> tuple[float, float]:
    c, n = _centers(stats)
    if g.kind == "float":
        t = stats.absmax * _SYM_FRACS
        err = _float_mse(c, n.astype(np.float64), t, g)
        tb = float(t[int(np.argmin(err))])
        return (-tb, tb) if symmetric else (max(stats.min, -tb), min(stats.max, tb))
    p = _Prefix(c, n)
    if symmetric:
        t = stats.absmax * _SYM_FRACS
        err = _int_mse(p, -t, t, g.levels)
        tb = float(t[int(np.argmin(err))])
        return -tb, tb
    lo0, hi0 = min(stats.min, 0.0), max(stats.max, 0.0)
    # candidates from the full range inwards; argmin keeps the first (widest) of equal errors
    los = lo0 * _ASYM_FRACS if lo0 < 0 else np.zeros(1)
    his = hi0 * _ASYM_FRACS if hi0 > 0 else np.zeros(1)
    # every (lo, hi) pair, as a broadcast (lo down, hi across): the bin lookups that depend on
    # one end alone run once per end, not once per pair (the same values as a meshgrid)
    err = _int_mse(p, los[:, None], his[None, :], g.levels).ravel()
    b = int(np.argmin(err))
    return float(los[b // his.size]), float(his[b % his.size])


def compute_range(stats: TensorStats, method: CalibMethod | str = CalibMethod.MINMAX,
                  fmt: Any = 256, *, symmetric: bool = False, percentile: float = 99.999,
                  num_quant_bins: int | None = None, num_bins: int = 2048,
                  qmax_levels: int | None = None, min_gain: float = 1.0) -> tuple[float, float]:
    """Calibration range ``(lo, hi)`` of one tensor (see the module docstring for the methods).

    Parameters
    ----------
    stats: collected statistics of the tensor.
    method: a :class:`CalibMethod` or its name.
    fmt: the target: number of quantization levels (256 for 8 bits), a format name
        (``"int8"``, ``"uint8"``, ``"int8n"``, ``"fp8_e4m3fn"`` ...) or a Format object.
        ``qmax_levels`` is an alias that overrides it.
    symmetric: return ``(-t, t)``.
    percentile: for PERCENTILE, in (0, 100].
    num_quant_bins: for ENTROPY, the number of quantization bins on ``|x|`` (default
        ``levels // 2``, or `levels` for an asymmetric range of a one-sided tensor).
    num_bins: for ENTROPY, linear bins of the re-binned ``|x|`` histogram (at least 16 per
        quantization bin).
    min_gain: for MINMSE on an integer grid, the factor by which clipping must lower the
        expected error below MinMax's to be taken (1: whenever it lowers it at all).

    Returns plain floats with ``lo <= 0 <= hi``; ``(0.0, 0.0)`` when there is no non-zero
    finite value (the caller maps a zero-width range to scale 1).
    """
    method = CalibMethod.parse(method)
    g = grid_model(qmax_levels if qmax_levels is not None else fmt)
    if not isinstance(stats, TensorStats):
        raise TypeError(f"compute_range expects TensorStats, got {type(stats).__name__}")
    if stats.empty or stats.absmax == 0.0:
        return 0.0, 0.0
    amax = stats.absmax
    if method is CalibMethod.MINMAX or g.kind == "none":
        return (-amax, amax) if symmetric else _with_zero(stats.min, stats.max)
    if method is CalibMethod.PERCENTILE:
        if not (0.0 < float(percentile) <= 100.0):
            raise ConfigError(f"percentile must be in (0, 100], got {percentile}")
        q = float(percentile) / 100.0
        if symmetric:
            lo_, hi_, cnt = stats.abs_bins()
            t = _percentile_from_bins(lo_, hi_, cnt, q)
            return -t, t
        lo = _percentile_signed(stats, 1.0 - q) if stats.min < 0 else stats.min
        hi = _percentile_signed(stats, q) if stats.max > 0 else stats.max
        return _with_zero(lo, hi)
    if method is CalibMethod.ENTROPY:
        one_sided = stats.min >= 0 or stats.max <= 0
        nq = num_quant_bins or (g.levels if (one_sided and not symmetric) else g.levels // 2)
        if nq < 2:
            raise ConfigError(f"num_quant_bins must be >= 2, got {nq}")
        if nq > ENTROPY_MAX_LEVELS or (not num_quant_bins and g.levels > ENTROPY_MAX_LEVELS):
            raise ConfigError(entropy_too_wide(g.levels))
        # at least 16 histogram bins per quantization bin (TensorRT's 2048 for 128): with all
        # 256 levels on a one-sided tensor and 2048 bins, data filling fewer bins than levels
        # makes every candidate look lossless and the search keeps the outliers
        t = _entropy_threshold(stats, nq, num_bins=max(int(num_bins), 16 * nq))
        if symmetric:
            return -t, t
        return _with_zero(max(stats.min, -t), min(stats.max, t))
    lo, hi = _minmse_range(stats, g, symmetric)
    if min_gain > 1.0 and g.kind == "int":
        full = (-amax, amax) if symmetric else _with_zero(stats.min, stats.max)
        if (lo, hi) != full:
            p = _Prefix(*_centers(stats))
            err = _int_mse(p, np.array([lo, full[0]]), np.array([hi, full[1]]), g.levels)
            if err[1] < min_gain * err[0]:
                return full
    return _with_zero(lo, hi)


# ---------------------------------------------------------------------------- power of two
def _pof2_qrange(bits: int, signed: bool) -> tuple[int, int]:
    if not (isinstance(bits, (int, np.integer)) and 1 <= int(bits) <= 32):
        raise ConfigError(f"bits must be an integer in [1, 32], got {bits!r}")
    if signed:
        return -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    return 0, 2 ** bits - 1


def pof2_exponent(stats: TensorStats, method: str = "nonoverflow", bits: int = 8,
                  signed: bool = True, min_gain: float = 1.0) -> int:
    """Exponent k of a power-of-two scale ``2**k`` (zero point 0).

    nonoverflow: the smallest k with ``2**k * qmax >= absmax`` (for unsigned: ``max(max, 0)``), so
        no calibration value overflows. minmse: among k in ``[k_nonoverflow - 4, k_nonoverflow]``
        the one with the smallest histogram-estimated MSE (ties go to the larger k); a k that
        clips is taken only where it lowers that MSE `min_gain` times (as `compute_range`'s).
    A tensor with nothing to represent (no finite non-zero value) gives k = 0 (scale 1).
    """
    key = str(method).strip().lower().replace("_", "").replace("-", "")
    if key not in ("nonoverflow", "minmse"):
        raise ConfigError(f"unknown power-of-two method {method!r}; expected 'nonoverflow' or "
                          f"'minmse'.{did_you_mean(str(method), ['nonoverflow', 'minmse'])}")
    qmin, qmax = _pof2_qrange(bits, signed)
    if stats.empty:
        return 0
    amax = stats.absmax if signed else max(stats.max, 0.0)
    if amax == 0.0:
        return 0
    k = math.ceil(math.log2(amax / qmax))
    while math.ldexp(qmax, k) < amax:  # guard against log2 rounding
        k += 1
    while math.ldexp(qmax, k - 1) >= amax:
        k -= 1
    if key == "nonoverflow":
        return int(k)
    ks = np.arange(k - 4, k + 1)
    s = np.ldexp(1.0, ks)
    c, n = _centers(stats)
    err = _int_mse(_Prefix(c, n), qmin * s, qmax * s, qmax - qmin + 1)
    best = int(np.flatnonzero(err <= err.min())[-1])
    if best != len(ks) - 1 and not err[best] * min_gain <= err[-1]:
        best = len(ks) - 1  # clipping gains too little: the scale no calibration value overflows
    return int(ks[best])


# ---------------------------------------------------------------------------- weights
def compute_weight_range(w: np.ndarray, axis: int | None = None,
                         method: CalibMethod | str = CalibMethod.MINMAX, *,
                         symmetric: bool = True, fmt: Any = 256) -> tuple[Any, Any]:
    """Range of a constant weight, per tensor (`axis` None: floats) or per channel along `axis`
    (float64 arrays of length ``w.shape[axis]``).

    MINMAX: exact min/max (containing 0). MINMSE: the shrink factor ``alpha`` of the min/max
    range minimizing the exact fake-quantization MSE of `w` on a `levels` grid (int formats;
    ONNX symmetric convention ``scale = 2 t / (levels - 1)``, zero point 0), found per channel
    by a coarse scan of ``_COARSE_ALPHAS`` followed by a golden-section search around the best
    of them, vectorized over channels (see `_weight_minmse`). Other methods are not meaningful
    for weights and raise ConfigError. Non-finite weights raise DataError.
    """
    method = CalibMethod.parse(method)
    if method not in (CalibMethod.MINMAX, CalibMethod.MINMSE):
        raise ConfigError(f"weight ranges support MINMAX and MINMSE, got {method.name}")
    g = grid_model(fmt)
    w = np.asarray(w)
    if w.dtype not in (np.float32, np.float64):  # float32 stays: float64 is made a chunk at a time
        w = w.astype(np.float64)
    if not np.isfinite(w).all():
        raise DataError(f"weight of shape {tuple(w.shape)} holds "
                        f"{int((~np.isfinite(w)).sum())} non-finite values")
    if axis is None:
        m = w.reshape(1, -1)
    else:
        if w.ndim == 0 or not -w.ndim <= axis < w.ndim:
            raise ConfigError(f"channel axis {axis} is out of range for a weight of shape "
                              f"{tuple(w.shape)}")
        m = np.moveaxis(w, axis, 0).reshape(w.shape[axis], -1)
    if m.shape[1] == 0:
        lo = hi = np.zeros(m.shape[0])
    else:  # min / max are exact in either precision
        lo = np.minimum(m.min(axis=1).astype(np.float64), 0.0)
        hi = np.maximum(m.max(axis=1).astype(np.float64), 0.0)
        if symmetric:
            hi = np.maximum(-lo, hi)
            lo = -hi
        if method is CalibMethod.MINMSE and g.kind == "int":
            lo, hi = _weight_minmse(m, lo, hi, g.levels, symmetric)
    if axis is None:
        return float(lo[0]), float(hi[0])
    return lo, hi


#: Weights up to this many elements are scanned exactly; larger ones (e.g. the 67M-element
#: layers of a > 2 GB model) get their coarse scan estimated from a sample (two stages).
_MINMSE_EXACT_ELEMENTS = 1 << 22
#: Elements per block of the search: float64 blocks of 1 MB stay in cache.
_MINMSE_BLOCK = 1 << 17
#: Two-stage search: rows are cut into segments of about this many values ...
_MINMSE_SEGMENT = 8192
#: ... of which one value in this many is looked at in the coarse scan.
_MINMSE_SAMPLE = 16
#: Coarse scan of the shrink factor, largest first (ties keep the widest range): steps of
#: 2**-0.5 down to 2**-4.5, which brackets every optimum the old 100-point linear scan over
#: [0.01, 1] found in practice (8-bit weights: 0.3-1; 2-4 bits with outliers: down to ~0.05).
_COARSE_ALPHAS = 2.0 ** (-np.arange(10) / 2.0)
#: Golden-section evaluations after the coarse scan: the bracket [a_k / sqrt 2, a_k * sqrt 2]
#: shrinks to 0.707 * 0.618**(n - 1) = 0.9 % of a_k, finer than the old scan's 0.01 steps.
_GOLDEN_EVALS = 10
_INV_PHI = (math.sqrt(5.0) - 1.0) / 2.0


def _weight_minmse(m: np.ndarray, lo: np.ndarray, hi: np.ndarray, levels: int, symmetric: bool
                   ) -> tuple[np.ndarray, np.ndarray]:
    """Per row of `m`, the shrink factor ``alpha`` whose range ``(lo, hi) * alpha`` has the least
    fake-quantization MSE among those evaluated (ties: the largest alpha).

    A coarse scan over `_COARSE_ALPHAS` picks each row's best candidate a_k; a golden-section
    search then refines alpha inside the neighbours' bracket ``[a_(k+1), a_(k-1)]`` (one new
    point per row and step, all rows at once), about 20 exact evaluations instead of 100. The
    result is the best point evaluated, so it is never worse than the coarse scan's. Above
    _MINMSE_EXACT_ELEMENTS the coarse scan is estimated from a sample of each row (see
    `_minmse_estimate`); the golden-section steps are exact."""
    rows, cols = m.shape
    alphas = _COARSE_ALPHAS
    big = m.size > _MINMSE_EXACT_ELEMENTS and cols >= 1024
    if big:
        err = _minmse_estimate(m, lo, hi, alphas, levels, symmetric)
    else:
        err = _minmse_errors(m, lo, hi, np.broadcast_to(alphas, (rows, alphas.size)), levels,
                             symmetric, split=False)
    k = np.argmin(err, axis=1)  # the first minimum: the largest alpha
    r = np.arange(rows)
    best_a = alphas[k]
    best_e = np.full(rows, np.inf) if big else err[r, k]  # estimates do not compare with exact
    ext = np.append(alphas, alphas[-1] / math.sqrt(2.0))
    a, b = ext[k + 1], ext[np.maximum(k - 1, 0)]  # k = 0: [a_1, 1]
    # golden section: x1 < x2 inside [a, b]; the bracket keeps the side of the better point
    x1, x2 = b - _INV_PHI * (b - a), a + _INV_PHI * (b - a)
    f = _minmse_errors(m, lo, hi, np.stack([x1, x2], axis=1), levels, symmetric, split=big)
    f1, f2 = f[:, 0], f[:, 1]

    def keep(x: np.ndarray, fx: np.ndarray) -> None:
        better = (fx < best_e) | ((fx == best_e) & (x > best_a))
        best_a[better], best_e[better] = x[better], fx[better]

    keep(x2, f2)
    keep(x1, f1)
    for _ in range(_GOLDEN_EVALS - 2):
        right = f2 <= f1  # the minimum lies in [x1, b] (ties: toward the wider range)
        a = np.where(right, x1, a)
        b = np.where(right, b, x2)
        new = np.where(right, a + _INV_PHI * (b - a), b - _INV_PHI * (b - a))
        fn = _minmse_errors(m, lo, hi, new[:, None], levels, symmetric, split=big)[:, 0]
        keep(new, fn)
        x1, f1, x2, f2 = (np.where(right, x2, new), np.where(right, f2, fn),
                          np.where(right, new, x1), np.where(right, fn, f1))
    if big:  # the coarse winner itself was only estimated: evaluate it exactly as well
        fk = _minmse_errors(m, lo, hi, alphas[k][:, None], levels, symmetric, split=True)[:, 0]
        keep(alphas[k], fk)
    return lo * best_a, hi * best_a


def _minmse_errors(m: np.ndarray, lo: np.ndarray, hi: np.ndarray, cand: np.ndarray, levels: int,
                   symmetric: bool, split: bool) -> np.ndarray:
    """Sum of squared fake-quantization errors of every row of `m` for each of its candidates
    ``cand[row]`` (rows x K), in float64, a block of rows at a time and in place.

    Each row is summed whole (bit for bit what one big array gives) unless `split` allows
    summing rows longer than a block in parts."""
    rows, cols = m.shape
    qmin = -(levels // 2) if symmetric else 0
    qmax = qmin + levels - 1
    err = np.zeros(cand.shape)
    if split and cols > _MINMSE_BLOCK:
        blocks = [(r, r + 1, c, min(c + _MINMSE_BLOCK, cols)) for r in range(rows)
                  for c in range(0, cols, _MINMSE_BLOCK)]
    else:
        step = max(1, _MINMSE_BLOCK // max(cols, 1))
        blocks = [(r, min(r + step, rows), 0, cols) for r in range(0, rows, step)]
    for r0, r1, c0, c1 in blocks:
        x = m[r0:r1, c0:c1].astype(np.float64)
        buf = np.empty_like(x)
        for k in range(cand.shape[1]):
            a = cand[r0:r1, k]
            lk, hk = lo[r0:r1] * a, hi[r0:r1] * a
            scale = np.where(hk > lk, (hk - lk) / (levels - 1), 1.0)[:, None]
            np.divide(x, scale, out=buf)
            np.rint(buf, out=buf)
            if symmetric:  # zero point 0
                np.clip(buf, qmin, qmax, out=buf)
            else:
                zp = np.clip(np.round(qmin - lk[:, None] / scale), qmin, qmax)
                buf += zp
                np.clip(buf, qmin, qmax, out=buf)
                buf -= zp
            buf *= scale
            buf -= x
            np.square(buf, out=buf)
            err[r0:r1, k] += buf.sum(axis=1)
    return err


def _minmse_estimate(m: np.ndarray, lo: np.ndarray, hi: np.ndarray, alphas: np.ndarray,
                     levels: int, symmetric: bool) -> np.ndarray:
    """Estimated squared error (rows x candidates) of every candidate, in float32: each row is
    cut into `nseg` segments of `seg` values (a remainder of fewer than `nseg` values counts
    whole); per segment, the `tail` values largest relative to the range count exactly and a
    regular sample of `n_s` of the rest counts for all of the rest."""
    rows, cols = m.shape
    nseg = -(-cols // _MINMSE_SEGMENT)
    seg = cols // nseg
    main = nseg * seg
    tail = max(1, seg // (4 * _MINMSE_SAMPLE))
    n_s = max(1, seg // _MINMSE_SAMPLE - tail)
    stride = (seg - tail) // n_s
    qmin = -(levels // 2) if symmetric else 0
    qmax = qmin + levels - 1
    est = np.zeros((rows, alphas.size))
    block = _MINMSE_BLOCK * 4  # of which 1 / _MINMSE_SAMPLE is evaluated
    group = max(1, (_MINMSE_BLOCK * _MINMSE_SAMPLE) // block)  # candidates evaluated at once
    if cols <= block:
        step = max(1, block // cols)
        blocks = [(r0, min(r0 + step, rows), 0, main) for r0 in range(0, rows, step)]
    else:
        step = max(1, block // seg) * seg
        blocks = [(r, r + 1, c, min(c + step, main)) for r in range(rows) for c in range(0, main, step)]
    if main < cols:  # the remainder (fewer than nseg values per row): every value
        step = max(1, block // (_MINMSE_SAMPLE * (cols - main)))
        blocks += [(r0, min(r0 + step, rows), main, cols) for r0 in range(0, rows, step)]
    for r0, r1, c0, c1 in blocks:
        x = m[r0:r1, c0:c1]
        if c0 < main:
            x = x.reshape(-1, seg)
            rid = np.repeat(np.arange(r0, r1), (c1 - c0) // seg)
            if symmetric:
                rel = np.abs(x)
            else:  # position in the range: values clip in this order as alpha shrinks
                pos = np.where(hi[rid] > 0, hi[rid], 1.0)[:, None]
                neg = np.where(lo[rid] < 0, lo[rid], -1.0)[:, None]
                rel = np.where(x > 0, x / pos, x / neg)
            idx = np.argpartition(rel, seg - tail, axis=1)
            pick = np.concatenate([idx[:, seg - tail:], idx[:, :stride * n_s:stride]], axis=1)
            x = np.take_along_axis(x, pick, axis=1)
            wt = np.full(tail + n_s, (seg - tail) / n_s, np.float32)
            wt[:tail] = 1.0
        else:
            rid = np.arange(r0, r1)
            wt = np.ones(c1 - c0, np.float32)
        x = x.astype(np.float32)
        lo_r, hi_r = lo[rid], hi[rid]
        for k0 in range(0, alphas.size, group):  # a few candidates per call: fewer, larger ops
            a = alphas[k0:k0 + group, None]
            lk, hk = lo_r * a, hi_r * a
            scale = np.where(hk > lk, (hk - lk) / (levels - 1), 1.0)[:, :, None]
            buf = x * (1.0 / scale).astype(np.float32)
            np.rint(buf, out=buf)
            if symmetric:
                np.clip(buf, qmin, qmax, out=buf)
            else:
                zp = np.clip(np.round(qmin - lk[:, :, None] / scale), qmin, qmax).astype(np.float32)
                buf += zp
                np.clip(buf, qmin, qmax, out=buf)
                buf -= zp
            buf *= scale.astype(np.float32)
            buf -= x
            np.square(buf, out=buf)
            seg_err = buf @ wt  # (candidates, segments)
            for j in range(seg_err.shape[0]):
                est[r0:r1, k0 + j] += np.bincount(rid - r0, weights=seg_err[j], minlength=r1 - r0)
    return est
