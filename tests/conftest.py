"""Shared fixtures: small models written with onnx.helper."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper


def small_cnn(seed: int = 0, opset: int = 17) -> onnx.ModelProto:
    """Conv-BN-Relu, a residual Add, MaxPool, GlobalAveragePool, Flatten, Gemm: 1x3x16x16 -> 10."""
    rng = np.random.default_rng(seed)
    f = lambda *s: (rng.standard_normal(s) * 0.3).astype(np.float32)  # noqa: E731
    inits = [
        numpy_helper.from_array(f(8, 3, 3, 3), "w1"), numpy_helper.from_array(f(8), "b1"),
        numpy_helper.from_array((1 + 0.1 * rng.standard_normal(8)).astype(np.float32), "g1"),
        numpy_helper.from_array(f(8), "be1"), numpy_helper.from_array(f(8), "m1"),
        numpy_helper.from_array((0.5 + rng.random(8)).astype(np.float32), "v1"),
        numpy_helper.from_array(f(8, 8, 3, 3), "w2"), numpy_helper.from_array(f(8), "b2"),
        numpy_helper.from_array(f(10, 8), "wf"), numpy_helper.from_array(f(10), "bf"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
        helper.make_node("BatchNormalization", ["c1", "g1", "be1", "m1", "v1"], ["bn1"], name="bn1"),
        helper.make_node("Relu", ["bn1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1], name="conv2"),
        helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
        helper.make_node("Add", ["r1", "r2"], ["a"], name="add"),
        helper.make_node("MaxPool", ["a"], ["p"], kernel_shape=[2, 2], strides=[2, 2], name="pool"),
        helper.make_node("GlobalAveragePool", ["p"], ["gp"], name="gap"),
        helper.make_node("Flatten", ["gp"], ["fl"], name="flat"),
        helper.make_node("Gemm", ["fl", "wf", "bf"], ["logits"], transB=1, name="fc"),
    ]
    g = helper.make_graph(nodes, "small_cnn",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 16, 16])],
                          [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 10])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    onnx.checker.check_model(m, full_check=True)
    return m


def feeds(n: int, batch: int, seed: int = 1, name: str = "x", shape=(3, 16, 16)):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, *shape)).astype(np.float32)
    return [{name: x[i:i + batch]} for i in range(0, n, batch)]


@pytest.fixture
def cnn() -> onnx.ModelProto:
    return small_cnn()
