"""The intervals ops put their outputs in by construction (`plan.ops.bounded_tensors`), where
an activation range's headroom stops, and the range chosen from them."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from mixq.calibration.stats import TensorStats
from mixq.config import get_default_config
from mixq.formats import get_format
from mixq.plan.ops import bounded_tensors
from mixq.plan.qparams import _choose

CONSTS = {"zero": np.float32(0.0), "six": np.float32(6.0), "pair": np.zeros(2, np.float32)}


def _bounds(*nodes):
    return bounded_tensors(nodes, lambda name: None if name not in CONSTS else np.asarray(CONSTS[name]))


def test_bounded_ops_and_what_carries_their_bounds():
    b = _bounds(
        helper.make_node("Clip", ["x", "zero", "six"], ["relu6"]),
        helper.make_node("Reshape", ["relu6", "shape"], ["flat"]),
        helper.make_node("GlobalAveragePool", ["relu6"], ["gap"]),
        helper.make_node("Sigmoid", ["x"], ["sig"]),
        helper.make_node("Pad", ["sig", "pads"], ["padded"]),
        helper.make_node("Softmax", ["x"], ["sm"]),
        helper.make_node("Tanh", ["x"], ["th"]),
        helper.make_node("MaxPool", ["th"], ["mp"], kernel_shape=[2]),
        helper.make_node("AveragePool", ["th"], ["ap"], kernel_shape=[2]),
        helper.make_node("Relu", ["x"], ["r"]),
        helper.make_node("Clip", ["x", "", "six"], ["upper"]),
        helper.make_node("Clip", ["x", "zero", "y"], ["runtime_max"]),
        helper.make_node("Clip", ["x", "pair", "six"], ["not_scalar"]),
        helper.make_node("Clip", ["x"], ["clip6"], min=-1.0, max=1.0),
        helper.make_node("Conv", ["relu6", "w"], ["conv"]),
        helper.make_node("Sigmoid", ["x"], ["custom"], domain="com.example"),
    )
    assert b == {"relu6": (0.0, 6.0), "flat": (0.0, 6.0), "gap": (0.0, 6.0), "sig": (0.0, 1.0),
                 "sm": (0.0, 1.0), "th": (-1.0, 1.0), "mp": (-1.0, 1.0), "ap": (-1.0, 1.0),
                 "r": (0.0, np.inf), "upper": (-np.inf, 6.0), "clip6": (-1.0, 1.0)}


@pytest.mark.parametrize("fmt,symmetric", [("int16", True), ("uint16", False), ("int8", True)])
def test_headroom_stops_at_the_bound(fmt, symmetric):
    """A Softmax output seen up to 0.9: a 16-bit grid ends at 1 (its bound), not at 1.8; an
    unbounded tensor gets the headroom; an 8-bit grid gets none ('auto')."""
    st = TensorStats()
    st.update(np.linspace(0.0, 0.9, 1001, dtype=np.float32))
    cfg = get_default_config("A16W8").with_options(activation=fmt, activation_symmetric=symmetric,
                                                    calibration="minmax")
    f = get_format(fmt)
    top = float(f.qmax) if symmetric or f.signed else float(f.qmax - f.qmin)

    def hi(bound):
        qp = _choose(f, st, cfg, bound)
        return float(np.asarray(qp.scale)) * top

    h = cfg.headroom_for(f)
    assert hi(None) == pytest.approx(0.9 * h, rel=1e-6)
    assert hi((0.0, 1.0)) == pytest.approx(1.0 if h > 1 else 0.9, rel=1e-6)
    assert hi((0.0, 0.5)) == pytest.approx(0.9, rel=1e-6)  # a bound never narrows the range seen
