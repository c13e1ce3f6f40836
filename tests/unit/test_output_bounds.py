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


_OPS = ["Sigmoid", "Tanh", "Relu", "Clip", "Softmax", "HardSigmoid", "Erf", "Reshape", "Transpose",
        "MaxPool", "AveragePool", "GlobalAveragePool", "ReduceMean", "Pad", "Add", "Mul"]


def _chain(ops, clip):
    """x (1, 4, 8) through `ops` in turn; every intermediate is a graph output."""
    from onnx import TensorProto, numpy_helper

    nodes, inits, prev = [], [], "x"
    for i, op in enumerate(ops):
        out, ins, attrs = f"t{i}", [prev], {}
        if op == "Clip":
            lo, hi = clip
            inits += [numpy_helper.from_array(np.float32(lo), f"lo{i}"),
                      numpy_helper.from_array(np.float32(hi), f"hi{i}")]
            ins += [f"lo{i}", f"hi{i}"]
        elif op == "Reshape":
            inits.append(numpy_helper.from_array(np.array([1, 4, -1], np.int64), f"s{i}"))
            ins.append(f"s{i}")
        elif op == "Transpose":
            attrs = {"perm": [0, 2, 1]}
        elif op in ("MaxPool", "AveragePool"):
            attrs = {"kernel_shape": [1], "pads": [0, 0]}
        elif op == "ReduceMean":
            attrs = {"axes": [2], "keepdims": 1}
        elif op == "Pad":
            inits.append(numpy_helper.from_array(np.array([0, 0, 1, 0, 0, 1], np.int64), f"p{i}"))
            inits.append(numpy_helper.from_array(np.float32(-7.0), f"v{i}"))
            ins += [f"p{i}", f"v{i}"]
        elif op in ("Add", "Mul"):
            inits.append(numpy_helper.from_array(np.float32(3.0), f"c{i}"))
            ins.append(f"c{i}")
        nodes.append(helper.make_node(op, ins, [out], **attrs))
        prev = out
    outs = [helper.make_tensor_value_info(f"t{i}", TensorProto.FLOAT, None) for i in range(len(ops))]
    g = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                          [1, 4, 8])], outs, inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=8), inits


def test_every_claimed_bound_holds_in_onnxruntime_on_random_chains():
    """Property: on random chains of bounded, carrying and unbounded ops, fed wild inputs,
    every value of a tensor that `bounded_tensors` bounds lies in its interval (the bound is
    never a wrong claim); and a tensor made by Add/Mul, or a Pad with a value outside, has none."""
    import onnxruntime as ort
    from hypothesis import given, settings
    from hypothesis import strategies as hs
    from onnx import numpy_helper

    @settings(max_examples=60, deadline=None, derandomize=True)
    @given(ops=hs.lists(hs.sampled_from(_OPS), min_size=1, max_size=6),
           clip=hs.tuples(hs.floats(-5, 0), hs.floats(0.5, 8)),
           seed=hs.integers(0, 2**16))
    def check(ops, clip, seed):
        model, inits = _chain(ops, clip)
        consts = {t.name: numpy_helper.to_array(t) for t in inits}
        claimed = bounded_tensors(model.graph.node, consts.get)
        sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        x = (np.random.default_rng(seed).standard_normal((1, 4, 8)) * 50).astype(np.float32)
        values = dict(zip([f"t{i}" for i in range(len(ops))], sess.run(None, {"x": x})))
        for name, (lo, hi) in claimed.items():
            v = values[name]
            assert v.min() >= lo - 1e-6 and v.max() <= hi + 1e-6, (ops, name, (lo, hi))
        for i, op in enumerate(ops):
            if op in ("Add", "Mul", "Pad"):
                assert f"t{i}" not in claimed, ops

    check()
