"""TensorStats: exactness, mergeability, non-finite handling, serialization."""
from __future__ import annotations

import json
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from mixq.calibration import CalibMethod, TensorStats, compute_range
from mixq.errors import DataError


def _batched(x: np.ndarray, bs: int) -> TensorStats:
    s = TensorStats()
    for i in range(0, x.shape[0], bs):
        s.update(x[i:i + bs])
    return s


@pytest.fixture(scope="module")
def acts() -> np.ndarray:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 8, 16)).astype(np.float32) * 2
    x[3, 0, :4] = 40.0
    x[7, 1, 1] = -25.0
    x[10] = np.maximum(x[10], 0)
    return x


def test_batch_split_exact_for_stats_and_every_range(acts):
    one = _batched(acts, 1)
    many = _batched(acts, 32)
    whole = TensorStats.from_array(acts)
    rng = np.random.default_rng(1)
    shuffled = TensorStats()
    for i in rng.permutation(acts.shape[0]):
        shuffled.update(acts[i])
    assert one == many == whole == shuffled
    assert np.array_equal(one.histogram(), many.histogram())
    for method in CalibMethod:
        for sym in (True, False):
            r1 = compute_range(one, method, symmetric=sym)
            r32 = compute_range(many, method, symmetric=sym)
            assert r1 == r32, (method, sym)


def test_merge_equals_concat(acts):
    a = TensorStats.from_array(acts[:20])
    b = TensorStats.from_array(acts[20:])
    merged = a.copy().merge(b)
    assert merged == TensorStats.from_array(acts)
    assert b.copy().merge(a) == merged
    assert a == TensorStats.from_array(acts[:20])  # merge did not touch its argument


@settings(max_examples=40, deadline=None)
@given(hnp.arrays(np.float32, st.integers(0, 300),
                  elements=st.floats(width=32, allow_nan=True, allow_infinity=True)),
       st.integers(1, 7))
def test_property_split_and_counts(x, k):
    whole = TensorStats.from_array(x)
    parts = TensorStats()
    for chunk in np.array_split(x, k):
        parts.merge(TensorStats.from_array(chunk))
    assert whole == parts
    fin = x[np.isfinite(x)]
    assert whole.count == x.size
    assert whole.nan_count == int(np.isnan(x).sum())
    assert whole.inf_count == int(np.isinf(x).sum())
    assert int(whole.histogram().sum()) == fin.size == whole.finite_count
    if fin.size:
        assert whole.min == float(fin.min()) and whole.max == float(fin.max())
        lo, hi, cnt = whole.bins()
        assert lo[0] == fin.min() and hi[-1] == fin.max() and cnt.sum() == fin.size
        assert np.all(lo <= hi) and np.all(hi[:-1] <= lo[1:])
    d = json.loads(json.dumps(whole.to_dict()))
    assert TensorStats.from_dict(d) == whole


def test_histogram_is_bfloat16_truncation():
    x = np.array([1.0, 1.00390625, 1.0078125, -2.5, 0.0, -0.0, 3e-42], dtype=np.float32)
    s = TensorStats.from_array(x)
    h = s.histogram()
    expect = np.bincount(x.view(np.uint32) >> 16, minlength=65536)
    assert np.array_equal(h, expect)


def test_non_finite_excluded():
    x = np.array([1.0, np.nan, np.inf, -np.inf, -3.0, 2.0], dtype=np.float32)
    s = TensorStats.from_array(x)
    assert (s.count, s.nan_count, s.inf_count, s.finite_count) == (6, 1, 2, 3)
    assert (s.min, s.max, s.absmax) == (-3.0, 2.0, 3.0)
    for method in CalibMethod:
        lo, hi = compute_range(s, method)
        assert np.isfinite([lo, hi]).all() and lo >= -3.0 and hi <= 2.0


def test_all_non_finite_and_empty():
    s = TensorStats.from_array(np.array([np.nan, np.inf], dtype=np.float32))
    assert s.empty and s.absmax == 0.0 and s.min == np.inf
    assert TensorStats.from_array(np.zeros((0, 3), np.float32)).count == 0
    for method in CalibMethod:
        assert compute_range(s, method) == (0.0, 0.0)
        assert compute_range(TensorStats(), method, symmetric=True) == (0.0, 0.0)
    d = json.loads(json.dumps(s.to_dict()))
    assert TensorStats.from_dict(d) == s


def test_other_dtypes_exact():
    rng = np.random.default_rng(2)
    x = rng.standard_normal(1000).astype(np.float32)
    h16 = x.astype(np.float16)
    assert TensorStats.from_array(h16) == TensorStats.from_array(h16.astype(np.float32))
    b16 = x.astype(ml_dtypes.bfloat16)
    assert TensorStats.from_array(b16) == TensorStats.from_array(b16.astype(np.float32))
    with pytest.raises(DataError, match="cannot collect statistics"):
        TensorStats.from_array(np.array(["a"]))


def test_per_channel_min_max():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((6, 4, 5)).astype(np.float32)
    x[0, 2, 0] = np.nan
    s = TensorStats(axis=1)
    for i in range(6):
        s.update(x[i:i + 1])
    ref = np.nanmin(np.moveaxis(x, 1, 0).reshape(4, -1), axis=1)
    assert np.array_equal(s.channel_min, ref)
    assert np.array_equal(s.channel_max, np.nanmax(np.moveaxis(x, 1, 0).reshape(4, -1), axis=1))
    assert TensorStats.from_dict(json.loads(json.dumps(s.to_dict()))) == s
    with pytest.raises(DataError, match="channels"):
        s.update(np.zeros((1, 3, 5), np.float32))
    with pytest.raises(DataError, match="axis"):
        TensorStats(axis=None).merge(TensorStats(axis=1))


def test_from_dict_rejects_garbage():
    with pytest.raises(DataError, match="version"):
        TensorStats.from_dict({"version": 9})
    with pytest.raises(DataError, match="malformed"):
        TensorStats.from_dict({"version": 1})


def test_pure_import_has_no_onnxruntime():
    code = ("import sys, mixq.calibration.stats, mixq.calibration.observers, mixq.calibration; "
            "assert 'onnxruntime' not in sys.modules, 'onnxruntime imported'")
    subprocess.run([sys.executable, "-c", code], check=True)
