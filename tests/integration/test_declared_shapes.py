"""The quantized model declares its intermediate shapes (issue 19: onnxruntime creates its
session 2-4x faster from declared shapes, for the user and for every session mixq opens), and
what it declares is what onnxruntime computes."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from mixq import quantize
from mixq.evaluate import make_session
from tests.conftest import feeds, small_cnn

_NP = {TensorProto.FLOAT: np.float32, TensorProto.FLOAT16: np.float16, TensorProto.INT8: np.int8,
       TensorProto.UINT8: np.uint8, TensorProto.INT16: np.int16, TensorProto.UINT16: np.uint16,
       TensorProto.INT32: np.int32, TensorProto.INT64: np.int64}


def _declared_match_onnxruntime(model: onnx.ModelProto, feed: dict[str, np.ndarray]) -> int:
    """Run `model` with every declared intermediate as an output: each one's dtype and the dims
    it declares are the computed ones. Returns how many were checked."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    declared = [v for v in m.graph.value_info if v.type.tensor_type.elem_type in _NP]
    m.graph.output.extend(declared)
    got = make_session(m, optimize=False).run([v.name for v in declared], feed)
    for v, a in zip(declared, got):
        tt = v.type.tensor_type
        assert a.dtype == _NP[tt.elem_type], v.name
        assert len(tt.shape.dim) == a.ndim, v.name
        for d, n in zip(tt.shape.dim, a.shape):
            assert not d.HasField("dim_value") or d.dim_value == n, (v.name, a.shape)
    return len(declared)


@pytest.mark.parametrize("preset", ["A8W8", "A16W8", "U8S8", "BF16", "BFP16", "MXINT8"])
def test_every_intermediate_is_declared_as_onnxruntime_computes_it(preset):
    r = quantize(small_cnn(), preset, feeds(16, 8))
    outputs = {o.name for o in r.model.graph.output}
    produced = {o for n in r.model.graph.node for o in n.output if o and o not in outputs}
    declared = {v.name for v in r.model.graph.value_info}
    assert produced <= declared, sorted(produced - declared)[:5]
    assert _declared_match_onnxruntime(r.model, feeds(3, 3, seed=5)[0]) >= len(r.model.graph.node) // 2


def _neg_dim_model() -> onnx.ModelProto:
    """A model whose exporter wrote -1 for "any batch" (as PaddlePaddle's do)."""
    rng = np.random.default_rng(0)
    w = helper.make_tensor("w", TensorProto.FLOAT, [8, 4], rng.standard_normal((8, 4)).astype(np.float32).ravel())
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])],
                          "neg", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [-1, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [-1, 4])], [w])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_a_negative_dim_is_declared_unknown_and_said():
    x = np.random.default_rng(1).standard_normal((6, 8)).astype(np.float32)
    r = quantize(_neg_dim_model(), "A8W8", [{"x": x[:3]}, {"x": x[3:]}])
    for v in (r.model.graph.input[0], r.model.graph.output[0]):
        d = v.type.tensor_type.shape.dim[0]
        assert not d.HasField("dim_value")  # unknown (or symbolic): any batch
    assert any("dim 0 was -1" in n for n in r.prepare.notes)
    assert make_session(r.model).run(None, {"x": x[:5]})[0].shape == (5, 4)
    assert _declared_match_onnxruntime(r.model, {"x": x[:2]}) > 0


def test_a_model_with_an_ir_version_newer_than_onnxruntime_reads_is_quantized():
    """The onnx package writes its newest IR version by default (14 with onnx 1.23), which
    onnxruntime 1.31 refuses whole: prepare writes the newest onnxruntime reads, and says so."""
    from mixq.evaluate import onnxruntime_max_ir_version

    m = _neg_dim_model()
    m.ir_version = onnxruntime_max_ir_version() + 1
    x = np.random.default_rng(1).standard_normal((6, 8)).astype(np.float32)
    r = quantize(m, "A8W8", [{"x": x}])
    assert r.model.ir_version == onnxruntime_max_ir_version()
    assert any("newer than onnxruntime reads" in n for n in r.prepare.notes)
    assert r.fidelity.outputs and not r.fidelity.broken
