"""Dense layers written as Einsum (JAX / TF exports: 'bsd,df->bsf', flax's DenseGeneral
'bsd,dhk->bshk' and 'bshk,hkd->bsd') are quantized like MatMul layers. Before, Einsum was not in
mixq's op table: every preset left those layers and their weights float, and the block presets
wrote "nothing was quantized"."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import mixq
from mixq.evaluate import compare

D, H, K, S = 16, 2, 8, 6


def _block() -> onnx.ModelProto:
    rng = np.random.default_rng(0)

    def w(name: str, *shape: int, fan: int) -> onnx.TensorProto:
        return numpy_helper.from_array((rng.standard_normal(shape) / np.sqrt(fan)).astype(np.float32), name)

    nodes = [helper.make_node("Einsum", ["x", "wq"], ["q"], equation="bsd,dhk->bshk"),
             helper.make_node("Einsum", ["q", "wo"], ["o"], equation="bshk,hkd->bsd"),
             helper.make_node("Relu", ["o"], ["r"]),
             helper.make_node("Einsum", ["r", "w1"], ["f"], equation="...d,fd->...f"),
             helper.make_node("Einsum", ["w2", "f"], ["y"], equation="fc,bsf->bsc")]
    g = helper.make_graph(nodes, "flax", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", S, D])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", S, 5])],
                          [w("wq", D, H, K, fan=D), w("wo", H, K, D, fan=H * K), w("w1", 32, D, fan=D),
                           w("w2", 32, 5, fan=32)])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _feeds(n: int = 40) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(1)
    return [{"x": rng.standard_normal((1, S, D)).astype(np.float32)} for _ in range(n)]


@pytest.mark.parametrize("preset,weight_type", [("A8W8", TensorProto.INT8), ("A16W8", TensorProto.INT8),
                                                ("BFP16", None)])
def test_einsum_layers_are_quantized(preset, weight_type):
    m, feeds = _block(), _feeds()
    res = mixq.quantize(m, preset, feeds, check_kernels=False)
    assert "Einsum (a matrix product) rewritten as MatMul: 4" in res.summary()
    assert res.rewrite.weights_quantized == 4, res.summary()
    if weight_type is not None:
        q8 = [t for t in res.model.graph.initializer if t.data_type == weight_type and len(t.dims) == 2]
        assert len(q8) == 4
    cos = compare(m, res.model, feeds, optimize=False).first().cosine
    assert cos >= (0.999 if preset == "A16W8" else 0.99), cos


def test_check_reports_what_prepare_will_do():
    """`mixq check` reads the model as given: its Einsum row says which Einsums become MatMul
    layers (the ellipsis one needs the ranks shape inference gives)."""
    from mixq.check import check_model_support

    row = next(o for o in check_model_support(_block()).ops if o.op_type == "Einsum")
    assert row.status == "quantizable" and "rewritten as MatMul" in row.reason, row
    m = _block()
    m.graph.node[0].attribute[0].s = b"bsd,dhk->bkhs"  # a reordered output: no plain product
    onnx.checker.check_model(m)
    row = next(o for o in check_model_support(m).ops if o.op_type == "Einsum")
    assert "3 of 4" in row.reason and "no matrix product" in row.reason, row
