"""Cross-layer equalization (`include_cle`, the vendor's default): the float function is kept,
the weight ranges of each Conv pair are balanced, and per-tensor int8 quantization of a model
with unbalanced channels gets better."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from mixq.compat import (CLEConfig, Config, ModelQuantizer, QuantizationConfig, QuantType, get_default_config)
from mixq.compat.cle import equalize
from mixq.evaluate import make_session


def _model() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    # unbalanced channels that matter equally to the output (as BatchNorm folding leaves them):
    # conv1's channel c is scaled by k[c], conv2 reads it with 1 / k[c]
    k = np.array([50, 0.02, 1, 3, 0.1, 8, 0.5, 20], np.float32)
    w1 = rng.normal(size=(8, 3, 3, 3)).astype(np.float32) * k.reshape(8, 1, 1, 1)
    b1 = rng.normal(size=8).astype(np.float32) * k
    w2 = rng.normal(size=(4, 8, 3, 3)).astype(np.float32) * 0.3 / k.reshape(1, 8, 1, 1)
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["h"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("Conv", ["r", "w2"], ["y"], name="conv2", pads=[1, 1, 1, 1])]
    g = helper.make_graph(nodes, "cle", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 3, 8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 4, 8, 8])],
                          [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(b1, "b1"),
                           numpy_helper.from_array(w2, "w2")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _ranges(m, name, axis):
    w = numpy_helper.to_array(next(t for t in m.graph.initializer if t.name == name))
    return np.max(np.abs(np.moveaxis(w, axis, 0).reshape(w.shape[axis], -1)), axis=1)


def test_equalize_keeps_the_function_and_balances_ranges():
    m = _model()
    eq, n = equalize(m)
    assert n == 1
    x = np.random.default_rng(1).normal(size=(2, 3, 8, 8)).astype(np.float32)
    a, b = (make_session(k, optimize=False).run(None, {"x": x})[0] for k in (m, eq))
    assert np.max(np.abs(a - b)) <= 1e-4 * np.max(np.abs(a))
    np.testing.assert_allclose(_ranges(eq, "w1", 0), _ranges(eq, "w2", 1), rtol=1e-5)
    before = _ranges(m, "w1", 0)
    assert before.max() / before.min() > 1000 and _ranges(eq, "w1", 0).max() / _ranges(eq, "w1", 0).min() < 100


def _sqnr(path_f, path_q, x):
    f = make_session(path_f).run(None, {"x": x})[0]
    q = make_session(path_q).run(None, {"x": x})[0]
    return 10 * np.log10(np.sum(f ** 2) / np.sum((f - q) ** 2))


def test_include_cle_improves_per_tensor_int8(tmp_path):
    src = tmp_path / "m.onnx"
    onnx.save(_model(), src)
    x = np.random.default_rng(2).normal(size=(16, 3, 8, 8)).astype(np.float32)
    feeds = [{"x": x[i:i + 4]} for i in range(0, 16, 4)]
    out = {}
    for cle in (False, True):
        qc = QuantizationConfig(activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8, include_cle=cle,
                                print_summary=False)
        ModelQuantizer(Config(global_quant_config=qc)).quantize_model(str(src), str(tmp_path / f"{cle}.onnx"), list(feeds))
        out[cle] = _sqnr(str(src), str(tmp_path / f"{cle}.onnx"), x)
    assert out[True] > out[False] + 3, out
    # the same through algo_config=[CLEConfig()], and the vendor's presets switch it on
    ModelQuantizer(Config(global_quant_config=QuantizationConfig(include_cle=False, print_summary=False),
                          algo_config=[CLEConfig(cle_steps=2)])).quantize_model(str(src), str(tmp_path / "c.onnx"),
                                                                              list(feeds))
    assert get_default_config("XINT8").translate().flags["cle"]

