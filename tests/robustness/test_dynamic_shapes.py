"""Dynamic shapes: histogram-based calibration (Percentile, Entropy, MinMSE) with varying
sequence/spatial sizes, on a small transformer block and on the PP-OCRv4 recognizer (SVTR)
with text lines of widths 160 and 320 in one calibration set."""
from __future__ import annotations

import numpy as np
import onnx
import pytest

import mixq
from mixq.evaluate import compare

from . import models as M
from .conftest import assert_runs, finite_qparams


def _seq_feeds(lengths, seed=0):
    rng = np.random.default_rng(seed)
    return [{"x": rng.standard_normal((1 + i % 3, s, M.D)).astype(np.float32)}
            for i, s in enumerate(lengths)]


@pytest.mark.parametrize("method", ["percentile", "entropy", "minmse", "minmax"])
@pytest.mark.parametrize("lengths", [(1, 64), (3, 17, 40), (128, 2, 2, 9)])
def test_histogram_calibration_with_varying_sequence_length(method, lengths):
    m = M.seq_block()
    cfg = mixq.get_default_config("A8W8").with_options(calibration=method)
    res = mixq.quantize(m, cfg, _seq_feeds(lengths), check_kernels=False)
    finite_qparams(res.model)
    assert_runs(res.model, _seq_feeds([33])[0])
    c = compare(m, res.model, _seq_feeds([7, 50], seed=5), optimize=False)
    assert c.first().sqnr_db > 15, c.first()


def test_stats_independent_of_feed_order_with_varying_lengths():
    m = M.seq_block()
    feeds = _seq_feeds((5, 60, 12, 33))
    a = mixq.quantize(m, "A8W8", feeds, check_kernels=False).model.SerializeToString()
    b = mixq.quantize(m, "A8W8", feeds[::-1], check_kernels=False).model.SerializeToString()
    assert a == b


@pytest.mark.parametrize("method", ["percentile", "entropy"])
def test_varying_spatial_size_cnn(method):
    from tests.conftest import small_cnn

    m = small_cnn()
    # make H and W dynamic: the CNN is fully convolutional up to the global pool
    for d in m.graph.input[0].type.tensor_type.shape.dim[2:]:
        d.dim_param = "HW"
    rng = np.random.default_rng(0)
    feeds = [{"x": rng.standard_normal((1, 3, s, s)).astype(np.float32)} for s in (8, 16, 30, 12)]
    cfg = mixq.get_default_config("A8W8").with_options(calibration=method)
    res = mixq.quantize(m, cfg, feeds, check_kernels=False)
    finite_qparams(res.model)
    assert_runs(res.model, {"x": rng.standard_normal((2, 3, 22, 22)).astype(np.float32)})


@pytest.fixture(scope="module")
def rec():
    from tests import realmodels

    try:
        path = realmodels.ppocr_rec_model_path()
        x160 = realmodels.rec_inputs("calib", 6, width=160)
        x320 = realmodels.rec_inputs("calib", 6, width=320, seed=1)
        ev = realmodels.rec_inputs("eval", 4, width=320)
    except (realmodels.ModelNotInstalled, FileNotFoundError) as exc:
        pytest.skip(f"PP-OCR models not installed ({exc}); {realmodels.RAPIDOCR_PIP}")
    return path, x160, x320, ev


@pytest.mark.parametrize("method", ["percentile", "minmse"])
def test_ppocr_recognizer_two_sequence_lengths(rec, method):
    """SVTR (MatMul/Softmax/LayerNorm blocks): widths 160 and 320 give sequence lengths 20 and
    40 in one calibration set."""
    path, x160, x320, ev = rec
    feeds = [{"x": x160[i:i + 3]} for i in (0, 3)] + [{"x": x320[i:i + 3]} for i in (0, 3)]
    cfg = mixq.get_default_config("A16W8").with_options(calibration=method)
    res = mixq.quantize(str(path), cfg, feeds, check_kernels=False)
    onnx.checker.check_model(res.model, full_check=True)
    finite_qparams(res.model)
    ops = {n.op_type for n in res.model.graph.node}
    assert {"QuantizeLinear", "DequantizeLinear"} <= ops
    # both widths run, and the quantized model follows the float one
    for x in (x160[:2], ev[:2]):
        c = compare(str(path), res.model, [{"x": x}], optimize=False)
        assert c.first().sqnr_db > 15, c.first()
