"""Big models: weights that stay in their external data file while mixq quantizes.

* A model whose weights exceed 2 GiB (9 MatMul layers of 8192 x 8192 float32 = 2.42 GB, in
  external data written tensor by tensor) quantized end to end with A8W8 in a subprocess: the
  peak RSS stays below 2.5x the weight bytes (about 1.05x since the weights are no longer
  loaded: onnxruntime maps them for calibration, the rewrite reads one tensor at a time) and the
  int8 output (~600 MB, one file) runs. About 1.5 min on 2 cores and 3 GB of free disk; skipped
  where the disk is smaller, or with MIXQ_BIGMODEL=0.
* The same machinery on small models (thresholds lowered): deferring the weights changes
  nothing in the output bytes.
* The two-stage MinMSE weight range search used above 4M elements stays within a few percent
  of the exhaustive search's error.
"""
from __future__ import annotations

import os
import shutil

import numpy as np
import onnx
import pytest

import mixq
from mixq import _io
from mixq.calibration import observers
from mixq.passes import prepare as prepare_mod

from . import models as M
from .bigmodel import calibration_file, measure_quantize, write_big_model
from .conftest import sha

#: Disk the > 2 GiB test needs in its temporary directory: the model and the int8 output.
_BIG_DISK = 3_200_000_000


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("MIXQ_BIGMODEL") == "0", reason="MIXQ_BIGMODEL=0")
def test_quantize_model_over_2gb_within_memory(tmp_path):
    if shutil.disk_usage(tmp_path).free < _BIG_DISK:
        pytest.skip(f"needs {_BIG_DISK / 1e9:.1f} GB of free disk in {tmp_path}")
    model = tmp_path / "big.onnx"
    weight_bytes = write_big_model(model)
    assert weight_bytes > 2**31
    hashes = (model.stat().st_mtime_ns, (tmp_path / "big.onnx.data").stat().st_mtime_ns)
    calib = calibration_file(tmp_path / "calib.npy", samples=4)
    out = tmp_path / "out" / "big.a8w8.onnx"
    r = measure_quantize(model, calib, out, "A8W8")
    assert r["peak_rss"] < 2.5 * weight_bytes, (r["peak_rss"] / weight_bytes, r)
    # the input is never written to
    assert (model.stat().st_mtime_ns, (tmp_path / "big.onnx.data").stat().st_mtime_ns) == hashes
    # int8 weights: about a quarter of the float size, one file (below the external threshold)
    assert out.exists() and not (out.parent / (out.name + ".data")).exists()
    assert 0.24 * weight_bytes < out.stat().st_size < 0.27 * weight_bytes
    m = onnx.load(str(out), load_external_data=False)
    assert sum(n.op_type == "DequantizeLinear" for n in m.graph.node) >= 9
    assert not any(t.data_type == onnx.TensorProto.FLOAT and len(t.dims) == 2 for t in m.graph.initializer)
    del m
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(str(out), so, providers=["CPUExecutionProvider"])
    y = sess.run(None, {"x": np.load(calib)[0]})[0]
    assert y.shape == (1, 8192) and np.all(np.isfinite(y))


@pytest.fixture
def deferring(monkeypatch):
    """Small models take the big-model path: every initializer of 64 bytes or more stays in
    its external data file. Shape inference and the checker use their big-model (skeleton)
    path on both sides of a comparison, as they do for every model this big."""
    monkeypatch.setattr(_io, "DEFER_MIN_MODEL_BYTES", 0)
    monkeypatch.setattr(_io, "DEFER_MIN_TENSOR_BYTES", 64)
    monkeypatch.setattr(prepare_mod, "_SKELETON_BYTES", 0)


def _save_external(model: onnx.ModelProto, path) -> None:
    onnx.save(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
              location=path.name + ".data", size_threshold=0)


@pytest.mark.parametrize("preset", ["A8W8", "U8S8", "A16W8", "BF16", "MXINT8"])
@pytest.mark.parametrize("builder", [M.mlp, M.seq_block, M.if_model])
def test_deferred_weights_give_the_same_bytes(builder, preset, deferring, tmp_path):
    m = builder()
    p = tmp_path / "m.onnx"
    _save_external(m, p)
    lazy, base = _io.load_model_deferred(p)
    assert base == tmp_path and sum(_io.has_external_data(t) for t in lazy.graph.initializer) >= 2
    assert _io.model_size(lazy) == _io.model_size(onnx.load(str(p)))  # counted as if loaded
    before = (sha(p), sha(tmp_path / "m.onnx.data"))
    fd = M.feeds(m, 3)
    # weights left in their file are rounded to nearest (GPTQ would hold them in memory), said
    # in the summary; the same rounding asked of both gives the same bytes
    cfg = mixq.get_default_config(preset)
    assert cfg.weight_rounding == "auto"
    auto = mixq.quantize(p, cfg, fd)
    if preset in ("A8W8", "U8S8", "A16W8"):
        assert "external data file" in auto.weight_rounding.nearest_because
        cfg = cfg.with_options(weight_rounding="nearest")
    whole = mixq.quantize(onnx.load(str(p)), cfg, fd)
    out = tmp_path / "o" / "q.onnx"
    deferred = mixq.quantize(p, cfg, fd, output_path=out)
    assert deferred.model.SerializeToString() == auto.model.SerializeToString()
    assert deferred.model.SerializeToString() == whole.model.SerializeToString()
    assert out.read_bytes() == whole.model.SerializeToString()
    assert (deferred.float_bytes, deferred.quant_bytes) == (whole.float_bytes, whole.quant_bytes)
    assert deferred.warnings == whole.warnings and deferred.skipped == whole.skipped
    assert (sha(p), sha(tmp_path / "m.onnx.data")) == before


def test_deferred_weights_are_never_loaded_whole(deferring, tmp_path, monkeypatch):
    """Deferred tensors are read as arrays, never loaded into the model being quantized: each
    quantized weight or constant once into a throwaway one-tensor model for its parameters
    (the int32 bias b2 not even that); only tensors left float would be loaded at the end."""
    p = tmp_path / "m.onnx"
    _save_external(M.mlp(), p)
    loaded: list[str] = []
    real = _io.load_deferred_tensor
    monkeypatch.setattr(_io, "load_deferred_tensor", lambda t, d: (loaded.append(t.name), real(t, d)))
    mixq.quantize(p, "A8W8", M.feeds(M.mlp(), 3), check_kernels=False)
    assert sorted(loaded) == ["b1", "w1", "w2"]


def test_unloaded_external_data_is_a_clear_error(tmp_path):
    p = tmp_path / "m.onnx"
    _save_external(M.mlp(), p)
    m = onnx.load(str(p), load_external_data=False)
    with pytest.raises(mixq.errors.ModelError, match="external data that is not loaded"):
        mixq.quantize(m, "A8W8", M.feeds(m, 2))


def test_deferred_data_file_missing_or_short(tmp_path):
    """A tensor whose data cannot be read as declared is loaded at once, so that it fails as
    load_model always did."""
    p = tmp_path / "m.onnx"
    _save_external(M.mlp(), p)
    data = tmp_path / "m.onnx.data"
    data.write_bytes(data.read_bytes()[:-8])
    with pytest.raises(mixq.errors.ModelError, match="external data"):
        _io.load_model_deferred(p, min_model_bytes=0, min_tensor_bytes=1)
    data.unlink()
    with pytest.raises(mixq.errors.ModelError, match="external data"):
        _io.load_model_deferred(p, min_model_bytes=0, min_tensor_bytes=1)


def _mse(m: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    scale = (hi - lo) / 255
    q = np.clip(np.rint(m / scale[:, None]), -128, 127)
    return ((q * scale[:, None] - m) ** 2).sum(axis=1)


@pytest.mark.parametrize("dist", ["normal", "laplace", "outliers"])
def test_two_stage_weight_minmse_close_to_exhaustive(dist, monkeypatch):
    rng = np.random.default_rng(0)
    shape = (4096, 48)  # per channel along axis 1: 48 rows of 4096 values
    w = {"normal": rng.standard_normal(shape), "laplace": rng.laplace(size=shape),
         "outliers": rng.standard_normal(shape) * (1 + 30 * (rng.random(shape) < 1e-3))}[dist]
    w = w.astype(np.float32)
    exhaustive = observers.compute_weight_range(w, axis=1, method="minmse", fmt=256)
    monkeypatch.setattr(observers, "_MINMSE_EXACT_ELEMENTS", 0)
    two_stage = observers.compute_weight_range(w, axis=1, method="minmse", fmt=256)
    m = w.T.astype(np.float64)
    excess = _mse(m, *two_stage) / _mse(m, *exhaustive) - 1
    # both run the golden-section search; only its coarse scan is estimated in two stages, so
    # the two may land in different local minima either way (issue 19)
    assert excess.min() >= -0.01
    assert excess.mean() < 0.01 and excess.max() < 0.06, (excess.mean(), excess.max())
