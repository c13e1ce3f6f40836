"""A float16 model (exported with .half(), or converted) is quantized like its float32 twin:
prepare computes it in float32 between Casts at its float16 inputs and outputs. Before, every
preset planned nothing on it and wrote the model back unquantized."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import mixq
from mixq.passes.float16 import compute_float16_in_float32
from mixq.passes.prepare import prepare

F16 = TensorProto.FLOAT16


def _half_model() -> onnx.ModelProto:
    """Conv -> Relu -> a Cast to float16 (a no-op here) -> MatMul, then an If whose branches
    compute in float16, and a ConstantOfShape with a float16 value; float16 input and output."""
    rng = np.random.default_rng(0)
    w = rng.normal(0, 0.3, (8, 3, 3, 3)).astype(np.float16)
    b = rng.normal(0, 0.1, 8).astype(np.float16)
    wm = rng.normal(0, 0.3, (8, 5)).astype(np.float16)
    then_g = helper.make_graph([helper.make_node("Mul", ["mm", "two"], ["r"])], "then", [],
                               [helper.make_tensor_value_info("r", F16, None)])
    else_g = helper.make_graph([helper.make_node("Identity", ["mm"], ["r2"])], "else", [],
                               [helper.make_tensor_value_info("r2", F16, None)])
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r0"]),
        helper.make_node("Cast", ["r0"], ["r1"], to=F16),
        helper.make_node("ReduceMean", ["r1", "axes"], ["p"], keepdims=0),
        helper.make_node("MatMul", ["p", "wm"], ["mm"]),
        helper.make_node("ConstantOfShape", ["shape"], ["ones"],
                         value=numpy_helper.from_array(np.array([1.0], np.float16))),
        helper.make_node("If", ["flag"], ["branch"], then_branch=then_g, else_branch=else_g),
        helper.make_node("Add", ["branch", "ones"], ["y"]),
    ]
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b"), numpy_helper.from_array(wm, "wm"),
             numpy_helper.from_array(np.array([2, 3], np.int64), "axes"),
             numpy_helper.from_array(np.array([1, 5], np.int64), "shape"),
             numpy_helper.from_array(np.array(2.0, np.float16), "two"),
             numpy_helper.from_array(np.array(True), "flag")]
    g = helper.make_graph(nodes, "half", [helper.make_tensor_value_info("x", F16, ["N", 3, 8, 8])],
                          [helper.make_tensor_value_info("y", F16, ["N", 5])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)], ir_version=9)


def _feeds(n=6):
    rng = np.random.default_rng(1)
    return [{"x": rng.normal(0, 1, (2, 3, 8, 8)).astype(np.float16)} for _ in range(n)]


def _run(model: onnx.ModelProto, feed: dict) -> np.ndarray:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feed)[0]


def test_widening_keeps_values_and_the_interface():
    m = _half_model()
    wide = onnx.ModelProto()
    wide.CopyFrom(m)
    res = compute_float16_in_float32(wide)
    assert res.changed and res.notes
    onnx.checker.check_model(wide)
    assert wide.graph.input[0].type.tensor_type.elem_type == F16
    assert wide.graph.output[0].type.tensor_type.elem_type == F16
    assert all(t.data_type != F16 for t in wide.graph.initializer)
    casts = [n for n in wide.graph.node if n.op_type == "Cast"]
    assert [a.i for n in casts for a in n.attribute] == [TensorProto.FLOAT, TensorProto.FLOAT, F16]
    for f in _feeds(2):
        ref, got = _run(m, f).astype(np.float32), _run(wide, f)
        assert got.dtype == np.float16
        np.testing.assert_allclose(got.astype(np.float32), ref, rtol=2e-2, atol=2e-2)
    # a float32 model is left alone
    from mixq.data import default_model_path

    _, rep = prepare(onnx.load(default_model_path()))
    assert [p.changed for p in rep.passes if p.name == "float16 computed in float32"] == [0]


@pytest.mark.parametrize("preset", ["A8W8", "A16W8", "BF16", "MX9"])
def test_a_float16_model_is_quantized(preset, tmp_path):
    m = _half_model()
    feeds = _feeds()
    res = mixq.quantize(m, preset, feeds, output_path=str(tmp_path / "q.onnx"))
    planned = [tp for tp in res.plan.tensors.values() if tp.role == "activation" and tp.format is not None]
    assert len(planned) >= 2, res.summary()  # at least the Conv and MatMul inputs
    assert "computed in float32" in res.summary()
    q = onnx.load(tmp_path / "q.onnx")
    assert q.graph.input[0].type.tensor_type.elem_type == F16  # the model's own interface
    got = _run(q, feeds[0])
    assert got.dtype == np.float16
    ref = _run(m, feeds[0]).astype(np.float64)
    cos = float(ref.ravel() @ got.astype(np.float64).ravel()
                / np.sqrt((ref.ravel() @ ref.ravel()) * (got.astype(np.float64).ravel() @ got.astype(np.float64).ravel())))
    assert cos > 0.99 and not res.fidelity.broken, (cos, res.summary())
    if preset in ("A8W8", "A16W8"):
        assert any(n.op_type == "QuantizeLinear" for n in q.graph.node)


def test_a_model_with_nothing_to_quantize_says_so_loudly():
    """A float64 model: no tensor takes a format, and the summary says the output is the float
    model, not the preset (before: a table of zeros and no word)."""
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.DOUBLE, ["N", 4])],
                          [helper.make_tensor_value_info("y", TensorProto.DOUBLE, ["N", 3])],
                          [numpy_helper.from_array(np.ones((4, 3)), "w")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    res = mixq.quantize(m, "A8W8", [{"x": np.ones((2, 4))}])
    assert res.rewrite.activations_quantized == res.rewrite.weights_quantized == 0
    assert "WARNING: nothing was quantized" in res.summary() and "double tensor" in res.summary()


def test_a_bfloat16_model_is_quantized_too():
    """bfloat16 widens exactly as well. A model that computes in bfloat16 behind float32 inputs
    and outputs (an autocast export) does not even run on onnxruntime's CPU provider, which
    has no bfloat16 MatMul; widened, it calibrates and quantizes."""
    import ml_dtypes

    rng = np.random.default_rng(2)
    w = rng.normal(0, 0.3, (16, 8)).astype(ml_dtypes.bfloat16)
    bf = TensorProto.BFLOAT16
    nodes = [helper.make_node("Cast", ["x"], ["xb"], to=bf), helper.make_node("MatMul", ["xb", "w"], ["h"]),
             helper.make_node("Relu", ["h"], ["r"]), helper.make_node("Cast", ["r"], ["y"], to=TensorProto.FLOAT)]
    g = helper.make_graph(nodes, "bf", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 8])],
                          [numpy_helper.from_array(w, "w")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)], ir_version=9)
    with pytest.raises(Exception):  # the model as exported: no bfloat16 MatMul kernel here
        _run(m, {"x": np.zeros((1, 16), np.float32)})
    feeds = [{"x": rng.normal(0, 1, (4, 16)).astype(np.float32)} for _ in range(6)]
    res = mixq.quantize(m, "A8W8", feeds)
    assert res.rewrite.activations_quantized >= 2 and res.rewrite.weights_quantized == 1, res.summary()
    ref = np.maximum(feeds[0]["x"] @ w.astype(np.float32), 0).ravel()
    got = _run(res.model, feeds[0]).ravel()
    assert ref @ got / np.sqrt((ref @ ref) * (got @ got)) > 0.99 and not res.fidelity.broken
