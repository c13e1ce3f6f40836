"""The torch re-implementation of Conv / ConvTranspose / Gemm / MatMul matches onnxruntime."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")

import onnx  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from mixq.errors import ModelError  # noqa: E402
from mixq.finetune.layers import LayerSpec  # noqa: E402


def _run_ort(op: str, x: np.ndarray, w: np.ndarray, b: np.ndarray | None, attrs: dict) -> tuple[np.ndarray, onnx.NodeProto]:
    inputs = ["x", "w"] + (["b"] if b is not None else [])
    node = helper.make_node(op, inputs, ["y"], name="layer", **attrs)
    inits = [numpy_helper.from_array(w, "w")] + ([numpy_helper.from_array(b, "b")] if b is not None else [])
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
    m.ir_version = 10
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0], node


def _check(op, x, w, b, attrs, atol=2e-5):
    ref, node = _run_ort(op, x, w, b, attrs)
    spec = LayerSpec.from_node(node)
    got = spec.forward(torch.from_numpy(x), torch.from_numpy(w),
                       torch.from_numpy(b) if b is not None else None).numpy()
    assert got.shape == ref.shape
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=atol)


R = np.random.default_rng(0)


def _r(*shape):
    return R.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("attrs", [
    {},
    {"pads": [1, 1, 1, 1]},
    {"pads": [0, 1, 2, 1], "strides": [2, 1]},
    {"dilations": [2, 2], "pads": [2, 2, 2, 2]},
    {"auto_pad": "SAME_UPPER", "strides": [2, 2]},
    {"auto_pad": "SAME_LOWER", "strides": [2, 2]},
    {"auto_pad": "VALID", "strides": [1, 2]},
])
def test_conv2d(attrs):
    _check("Conv", _r(2, 4, 9, 11), _r(6, 4, 3, 3), _r(6), attrs)


def test_conv_grouped_depthwise_1d_3d():
    _check("Conv", _r(2, 6, 8, 8), _r(6, 3, 3, 3), _r(6), {"group": 2, "pads": [1, 1, 1, 1]})
    _check("Conv", _r(2, 6, 8, 8), _r(6, 1, 3, 3), None, {"group": 6, "pads": [1, 1, 1, 1], "strides": [2, 2]})
    _check("Conv", _r(2, 3, 10), _r(5, 3, 3), _r(5), {"pads": [2, 0]})
    _check("Conv", _r(1, 2, 4, 5, 6), _r(3, 2, 2, 3, 3), _r(3), {"pads": [0, 1, 1, 1, 0, 1]})


@pytest.mark.parametrize("attrs", [
    {},
    {"strides": [2, 2]},
    {"strides": [2, 2], "pads": [1, 0, 0, 1]},
    {"strides": [2, 2], "output_padding": [1, 1], "pads": [1, 1, 1, 1]},
    {"strides": [3, 2], "output_shape": [13, 10]},
    {"strides": [2, 2], "auto_pad": "SAME_UPPER"},
    {"strides": [2, 2], "auto_pad": "SAME_LOWER"},
    {"dilations": [2, 1], "group": 2},
])
def test_conv_transpose(attrs):
    _check("ConvTranspose", _r(2, 4, 5, 5), _r(4, 3, 3, 3), _r(6 if attrs.get("group") == 2 else 3), attrs)


@pytest.mark.parametrize("attrs", [{}, {"transB": 1}, {"alpha": 0.5, "beta": 2.0}, {"transB": 1, "alpha": 1.5}])
def test_gemm(attrs):
    w = _r(5, 7) if attrs.get("transB") else _r(7, 5)
    _check("Gemm", _r(3, 7), w, _r(5), attrs)
    _check("Gemm", _r(3, 7), w, None, attrs)


def test_matmul():
    _check("MatMul", _r(3, 7), _r(7, 5), None, {})
    _check("MatMul", _r(2, 4, 7), _r(7, 5), None, {})


def test_unsupported_op():
    with pytest.raises(ModelError, match="cannot re-implement Relu"):
        LayerSpec.from_node(helper.make_node("Relu", ["x"], ["y"], name="r"))
