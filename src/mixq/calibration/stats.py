"""Mergeable, exact streaming statistics of one activation tensor.

Pure numpy (never imports onnxruntime).

The histogram
-------------
Every finite float32 value is bucketed by the top 16 bits of its bit pattern (sign, 8 exponent
bits, 7 mantissa bits: the value truncated to bfloat16). That gives 65536 fixed, data-independent
buckets with a relative width of at most 2**-7 (2**-8 on average) over the whole float32 range,
so no range has to be known in advance and merging two histograms is plain addition of integer
counts. Consequently every statistic here is *exactly* independent of how the data was split
into batches and in which order the batches arrived.

Storage is sparse-ish: the positive and the negative half are each kept as a window
``counts[off : off + len]`` over the 15-bit magnitude index ``bits >> 16 & 0x7FFF``, so a tensor
whose values span ~30 binades costs ~30 KiB instead of 512 KiB.

Non-finite values (NaN, +-inf) are counted in ``nan_count`` / ``inf_count`` and excluded from
min/max/histogram, so one bad value never poisons a calibration range.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from mixq.errors import DataError

#: Number of histogram buckets in the full (dense) index space: the 16-bit bfloat16 patterns.
NUM_BINS = 65536
#: Magnitude index of +inf (0x7F80); every finite magnitude index is below it.
_MAG_INF = 0x7F80
#: Below this many elements an update uses a sort-based count instead of bincount.
_SMALL = 8192
#: Elements per bincount call of a large update: the bucket indices are written to a buffer of
#: this many intp that stays in cache (bincount would otherwise copy the whole tensor to intp).
_CHUNK = 1 << 18


def _empty_counts() -> np.ndarray:
    return np.zeros(0, dtype=np.int64)


def _add_window(off_a: int, a: np.ndarray, off_b: int, b: np.ndarray) -> tuple[int, np.ndarray]:
    """Sum of two windowed count arrays."""
    if b.size == 0:
        return off_a, a
    if a.size == 0:
        return off_b, b.copy()
    lo = min(off_a, off_b)
    hi = max(off_a + a.size, off_b + b.size)
    if lo == off_a and hi == off_a + a.size:
        out = a  # in place: b fits inside a
    else:
        out = np.zeros(hi - lo, dtype=np.int64)
        out[off_a - lo: off_a - lo + a.size] += a
    out[off_b - lo: off_b - lo + b.size] += b
    return lo, out


def _trim(off: int, counts: np.ndarray) -> tuple[int, np.ndarray]:
    nz = np.flatnonzero(counts)
    if nz.size == 0:
        return 0, _empty_counts()
    return off + int(nz[0]), counts[nz[0]: nz[-1] + 1].copy()


def _bucket_counts(flat: np.ndarray) -> np.ndarray:
    """Dense counts (NUM_BINS) of the top 16 bits of the float32 values `flat`, by chunks."""
    bits = flat.view(np.uint32)
    buf = np.empty(min(_CHUNK, bits.size), dtype=np.intp)
    h = np.zeros(NUM_BINS, dtype=np.int64)
    for i in range(0, bits.size, _CHUNK):
        part = bits[i:i + _CHUNK]
        top = buf[:part.size]
        np.right_shift(part, np.uint32(16), out=top, casting="unsafe")
        h += np.bincount(top, minlength=NUM_BINS)
    return h


def _mag_to_float(mag: np.ndarray) -> np.ndarray:
    """float64 value whose float32 bit pattern is ``mag << 16`` (a non-negative bin edge)."""
    return (np.asarray(mag, dtype=np.uint32) << np.uint32(16)).view(np.float32).astype(np.float64)


class TensorStats:
    """Streaming statistics of one float tensor: exact, mergeable, batch/order independent.

    Attributes
    ----------
    count: total number of elements seen (finite and non-finite).
    nan_count, inf_count: non-finite elements (excluded from everything else).
    min, max: smallest / largest finite value (``+inf`` / ``-inf`` while none was seen).
    axis: channel axis of the optional per-channel min/max (``channel_min`` / ``channel_max``,
        float64 arrays, ``+inf``/``-inf`` for channels that only held non-finite values).

    Use :meth:`from_array`, :meth:`update` and :meth:`merge`; the histogram is read through
    :meth:`histogram` (dense, 65536 bins) or :meth:`bins` / :meth:`abs_bins` (non-empty bins with
    their value edges, what the range observers use).
    """

    __slots__ = ("count", "nan_count", "inf_count", "min", "max", "axis", "channel_min",
                 "channel_max", "_pos_off", "_pos", "_neg_off", "_neg")

    def __init__(self, axis: int | None = None) -> None:
        self.count = 0
        self.nan_count = 0
        self.inf_count = 0
        self.min = float("inf")
        self.max = float("-inf")
        self.axis = axis
        self.channel_min: np.ndarray | None = None
        self.channel_max: np.ndarray | None = None
        self._pos_off = 0
        self._pos = _empty_counts()
        self._neg_off = 0
        self._neg = _empty_counts()

    # ------------------------------------------------------------------ building
    @classmethod
    def from_array(cls, x: np.ndarray, axis: int | None = None) -> "TensorStats":
        """Statistics of one array (any float dtype; cast to float32 first)."""
        s = cls(axis=axis)
        s.update(x)
        return s

    def update(self, x: np.ndarray) -> "TensorStats":
        """Add the values of `x` (in place; returns self).

        `x` must be a real numeric array; float64 is rounded to float32 (the precision the
        quantized model computes in), float16/bfloat16/integers are converted exactly.
        """
        x = np.asarray(x)
        if x.dtype.kind not in "fiub" and x.dtype.name != "bfloat16":
            raise DataError(f"cannot collect statistics of a {x.dtype} tensor; expected a real "
                            "numeric tensor")
        x32 = np.ascontiguousarray(x, dtype=np.float32)
        if self.axis is not None:
            self._update_channels(x32, self.axis)
        flat = x32.reshape(-1)
        self.count += flat.size
        if flat.size == 0:
            return self
        if flat.size < _SMALL:
            idx, cnt = np.unique(flat.view(np.uint32) >> np.uint32(16), return_counts=True)
        else:
            h = _bucket_counts(flat)
            idx = np.flatnonzero(h)
            cnt = h[idx]
        idx = idx.astype(np.int64, copy=False)
        cnt = cnt.astype(np.int64, copy=False)
        mag = idx & 0x7FFF
        finite = mag < _MAG_INF
        if finite.all():
            lo, hi = float(flat.min()), float(flat.max())
        else:
            n_nonfin = int(cnt[~finite].sum())
            n_nan = int(np.isnan(flat).sum())
            self.nan_count += n_nan
            self.inf_count += n_nonfin - n_nan
            idx, cnt, mag = idx[finite], cnt[finite], mag[finite]
            if idx.size == 0:
                return self
            fin = flat[np.isfinite(flat)]
            lo, hi = float(fin.min()), float(fin.max())
        self.min = min(self.min, lo)
        self.max = max(self.max, hi)
        neg = idx >= 0x8000  # idx is sorted: positives first
        k = int(np.searchsorted(neg, True))
        for sign, m, c in ((0, mag[:k], cnt[:k]), (1, mag[k:], cnt[k:])):
            if m.size == 0:
                continue
            off = int(m[0])
            win = np.zeros(int(m[-1]) - off + 1, dtype=np.int64)
            win[m - off] = c
            if sign:
                self._neg_off, self._neg = _add_window(self._neg_off, self._neg, off, win)
            else:
                self._pos_off, self._pos = _add_window(self._pos_off, self._pos, off, win)
        return self

    def _update_channels(self, x32: np.ndarray, axis: int) -> None:
        if x32.ndim == 0:
            raise DataError("per-channel statistics need a tensor of rank >= 1, got a scalar")
        ax = axis if axis >= 0 else axis + x32.ndim
        if not 0 <= ax < x32.ndim:
            raise DataError(f"channel axis {axis} is out of range for a tensor of shape "
                            f"{tuple(x32.shape)}")
        moved = np.moveaxis(x32, ax, 0).reshape(x32.shape[ax], -1)
        fin = np.isfinite(moved)
        cmin = np.where(fin, moved, np.inf).min(axis=1, initial=np.inf).astype(np.float64)
        cmax = np.where(fin, moved, -np.inf).max(axis=1, initial=-np.inf).astype(np.float64)
        self._merge_channels(cmin, cmax)

    def _merge_channels(self, cmin: np.ndarray | None, cmax: np.ndarray | None) -> None:
        # channel_min and channel_max are always set together (both None or both arrays)
        if cmin is None or cmax is None:
            return
        if self.channel_min is None or self.channel_max is None:
            self.channel_min, self.channel_max = cmin.copy(), cmax.copy()
            return
        if self.channel_min.shape != cmin.shape:
            raise DataError(f"per-channel statistics along axis {self.axis} have "
                            f"{self.channel_min.size} channels but the new data has {cmin.size}")
        np.minimum(self.channel_min, cmin, out=self.channel_min)
        np.maximum(self.channel_max, cmax, out=self.channel_max)

    def merge(self, other: "TensorStats") -> "TensorStats":
        """Add the statistics of `other` into self (in place; returns self). Exact."""
        if not isinstance(other, TensorStats):
            raise TypeError(f"can only merge TensorStats, got {type(other).__name__}")
        if other.axis != self.axis:
            raise DataError(f"cannot merge statistics collected along axis {other.axis} into "
                            f"statistics along axis {self.axis}")
        self.count += other.count
        self.nan_count += other.nan_count
        self.inf_count += other.inf_count
        self.min = min(self.min, other.min)
        self.max = max(self.max, other.max)
        self._merge_channels(other.channel_min, other.channel_max)
        self._pos_off, self._pos = _add_window(self._pos_off, self._pos.copy(), other._pos_off,
                                               other._pos)
        self._neg_off, self._neg = _add_window(self._neg_off, self._neg.copy(), other._neg_off,
                                               other._neg)
        return self

    def copy(self) -> "TensorStats":
        """An independent copy."""
        return TensorStats(axis=self.axis).merge(self)

    # ------------------------------------------------------------------ reading
    @property
    def finite_count(self) -> int:
        """Number of finite values (the histogram total)."""
        return self.count - self.nan_count - self.inf_count

    @property
    def absmax(self) -> float:
        """Largest finite magnitude (0.0 when no finite value was seen)."""
        if self.finite_count == 0:
            return 0.0
        return max(abs(self.min), abs(self.max))

    @property
    def empty(self) -> bool:
        """True when no finite value was seen."""
        return self.finite_count == 0

    def histogram(self) -> np.ndarray:
        """Dense int64 histogram of 65536 bins indexed by the float32 bit pattern >> 16."""
        h = np.zeros(NUM_BINS, dtype=np.int64)
        h[self._pos_off: self._pos_off + self._pos.size] = self._pos
        h[0x8000 + self._neg_off: 0x8000 + self._neg_off + self._neg.size] = self._neg
        return h

    def bins(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Non-empty bins of the signed values, ascending: ``(lo, hi, counts)``.

        Bin k holds `counts[k]` values in ``[lo[k], hi[k]]`` (float64 edges). The outermost edges
        are tightened to the exact min / max, so the support is exactly ``[min, max]``.
        """
        pi = np.flatnonzero(self._pos)
        ni = np.flatnonzero(self._neg)[::-1]  # largest magnitude first = ascending values
        pmag = pi + self._pos_off
        nmag = ni + self._neg_off
        lo = np.concatenate([-_mag_to_float(nmag + 1), _mag_to_float(pmag)])
        hi = np.concatenate([-_mag_to_float(nmag), _mag_to_float(pmag + 1)])
        cnt = np.concatenate([self._neg[ni], self._pos[pi]])
        if cnt.size:
            lo = np.clip(lo, self.min, self.max)
            hi = np.clip(hi, self.min, self.max)
        return lo, hi, cnt

    def abs_bins(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Non-empty bins of ``|x|``, ascending: ``(lo, hi, counts)``.

        The top edge is tightened to absmax, and the bottom edge to min |x| when all values have
        one sign."""
        off, both = _add_window(self._pos_off, self._pos.copy(), self._neg_off, self._neg)
        idx = np.flatnonzero(both)
        mag = idx + off
        lo = _mag_to_float(mag)
        hi = _mag_to_float(mag + 1)
        cnt = both[idx]
        if cnt.size:
            amax = self.absmax
            # smallest |x| is known exactly when all values have one sign
            amin = self.min if self.min > 0 else (-self.max if self.max < 0 else 0.0)
            lo = np.clip(lo, amin, amax)
            hi = np.clip(hi, amin, amax)
        return lo, hi, cnt

    # ------------------------------------------------------------------ (de)serialization
    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict (ints, floats or None, lists); :meth:`from_dict` inverts it exactly."""
        def f(v: float) -> float | None:
            return None if not np.isfinite(v) else float(v)

        return {
            "version": 1,
            "count": int(self.count),
            "nan_count": int(self.nan_count),
            "inf_count": int(self.inf_count),
            "min": f(self.min),
            "max": f(self.max),
            "axis": self.axis,
            "channel_min": None if self.channel_min is None else
            [f(v) for v in self.channel_min.tolist()],
            "channel_max": None if self.channel_max is None else
            [f(v) for v in self.channel_max.tolist()],
            "pos_off": int(self._pos_off),
            "pos": self._pos.tolist(),
            "neg_off": int(self._neg_off),
            "neg": self._neg.tolist(),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "TensorStats":
        """Rebuild statistics saved with :meth:`to_dict`."""
        try:
            if d.get("version") != 1:
                raise DataError(f"unsupported TensorStats version {d.get('version')!r}; "
                                "expected 1 (re-run calibration to refresh the cache)")
            s = cls(axis=d["axis"])
            s.count, s.nan_count, s.inf_count = int(d["count"]), int(d["nan_count"]), \
                int(d["inf_count"])
            s.min = float("inf") if d["min"] is None else float(d["min"])
            s.max = float("-inf") if d["max"] is None else float(d["max"])
            if d["channel_min"] is not None:
                s.channel_min = np.array([np.inf if v is None else v for v in d["channel_min"]],
                                         dtype=np.float64)
                s.channel_max = np.array([-np.inf if v is None else v for v in d["channel_max"]],
                                         dtype=np.float64)
            s._pos_off, s._pos = _trim(int(d["pos_off"]), np.asarray(d["pos"], dtype=np.int64))
            s._neg_off, s._neg = _trim(int(d["neg_off"]), np.asarray(d["neg"], dtype=np.int64))
        except (KeyError, TypeError, ValueError) as e:
            if isinstance(e, DataError):
                raise
            raise DataError(f"malformed TensorStats dict ({type(e).__name__}: {e}); expected the "
                            "output of TensorStats.to_dict()") from e
        return s

    # ------------------------------------------------------------------ comparison
    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TensorStats):
            return NotImplemented
        a, b = self._canon(), other._canon()
        if (self.count, self.nan_count, self.inf_count, self.min, self.max, self.axis) != \
                (other.count, other.nan_count, other.inf_count, other.min, other.max, other.axis):
            return False
        sc, oc = self._channel_range(), other._channel_range()
        if (sc is None) != (oc is None):
            return False
        if sc is not None and oc is not None and not (
                np.array_equal(sc[0], oc[0]) and np.array_equal(sc[1], oc[1])):
            return False
        return all(x[0] == y[0] and np.array_equal(x[1], y[1]) for x, y in zip(a, b))

    # __eq__ without __hash__ leaves instances unhashable, as they should be (mutable)

    def _channel_range(self) -> tuple[np.ndarray, np.ndarray] | None:
        if self.channel_min is None or self.channel_max is None:
            return None
        return self.channel_min, self.channel_max

    def _canon(self) -> tuple[tuple[int, np.ndarray], tuple[int, np.ndarray]]:
        return _trim(self._pos_off, self._pos), _trim(self._neg_off, self._neg)

    def __repr__(self) -> str:
        return (f"TensorStats(count={self.count}, min={self.min:.6g}, max={self.max:.6g}, "
                f"nan={self.nan_count}, inf={self.inf_count}, axis={self.axis})")
