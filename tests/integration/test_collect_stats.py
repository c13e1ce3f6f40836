"""collect_stats: one streaming onnxruntime pass over a small Conv+Relu+MatMul model."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from mixq.calibration import CalibMethod, TensorStats, collect_stats, compute_range
from mixq.calibration import collect as collect_mod
from mixq.errors import DataError, ModelError

N = 64


def _model(ir_version: int | None = None) -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "W")
    b = numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "B")
    fc = numpy_helper.from_array(rng.standard_normal((144, 5)).astype(np.float32) * 0.1, "FC")
    shape = numpy_helper.from_array(np.array([-1, 144], np.int64), "flat_shape")
    cond = numpy_helper.from_array(np.array(True), "cond")
    then_g = helper.make_graph([helper.make_node("Neg", ["logits"], ["in_then"])], "then", [],
                               [helper.make_tensor_value_info("in_then", TensorProto.FLOAT, None)])
    else_g = helper.make_graph([helper.make_node("Abs", ["logits"], ["in_else"])], "else", [],
                               [helper.make_tensor_value_info("in_else", TensorProto.FLOAT, None)])
    nodes = [
        helper.make_node("Conv", ["x", "W", "B"], ["conv"], pads=[0, 0, 0, 0]),
        helper.make_node("Relu", ["conv"], ["relu"]),
        helper.make_node("Reshape", ["relu", "flat_shape"], ["flat"]),
        helper.make_node("MatMul", ["flat", "FC"], ["logits"]),
        helper.make_node("Shape", ["relu"], ["relu_shape"]),
        helper.make_node("If", ["cond"], ["branch"], then_branch=then_g, else_branch=else_g),
    ]
    g = helper.make_graph(
        nodes, "calib", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 5]),
         helper.make_tensor_value_info("relu_shape", TensorProto.INT64, [4]),
         helper.make_tensor_value_info("branch", TensorProto.FLOAT, None)],
        [w, b, fc, shape, cond])
    kw = {} if ir_version is None else {"ir_version": ir_version}
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], **kw)


@pytest.fixture(scope="module")
def data() -> np.ndarray:
    x = np.random.default_rng(1).standard_normal((N, 3, 8, 8)).astype(np.float32)
    x[5, 0, 0, 0] = 30.0
    return x


NAMES = ["x", "conv", "relu", "logits", "W"]


def test_batch_1_vs_32_identical(data):
    m = _model(ir_version=10)
    r1 = collect_stats(m, NAMES, {"x": data}, batch_size=1)
    r32 = collect_stats(m, NAMES, [{"x": data[i:i + 32]} for i in range(0, N, 32)])
    assert list(r1) == NAMES and r1.skipped == {} and r1.num_batches == N
    assert r32.num_batches == 2
    for n in NAMES:
        assert r1[n] == r32[n], n
        for method in CalibMethod:
            assert compute_range(r1[n], method) == compute_range(r32[n], method)
    assert r1["x"] == TensorStats.from_array(data)
    assert r1["W"] == TensorStats.from_array(numpy_helper.to_array(m.graph.initializer[0]))
    assert r1["conv"].count == N * 4 * 6 * 6
    assert r1["relu"].min == 0.0 and r1["relu"].max == r1["conv"].max


def test_values_match_onnxruntime(data):
    import onnxruntime as ort

    m = _model(ir_version=10)
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    (logits,) = sess.run(["logits"], {"x": data})
    r = collect_stats(m, ["logits"], {"x": data}, batch_size=16)
    ref = TensorStats.from_array(logits)
    assert r["logits"].count == ref.count
    np.testing.assert_allclose([r["logits"].min, r["logits"].max], [ref.min, ref.max], rtol=1e-5)


def test_skipped_reasons_and_progress(data):
    m = _model()  # onnx's default IR version, newer than onnxruntime reads: clamped in the copy
    before = m.SerializeToString()
    seen = []
    r = collect_stats(m, ["relu", "relu_shape", "in_then", "reluu", "flat_shape"],
                      (({"x": data[i:i + 8]}) for i in range(0, N, 8)), progress=seen.append,
                      axes={"relu": 1})
    assert seen == list(range(8))
    assert list(r) == ["relu"] and r.stats.keys() == {"relu"}
    assert r["relu"].channel_max.shape == (4,)
    assert "not a float tensor" in r.skipped["relu_shape"]
    assert "subgraph" in r.skipped["in_then"]
    assert "no tensor of this name" in r.skipped["reluu"] and "Did you mean: relu" in \
        r.skipped["reluu"]
    assert "not a float tensor" in r.skipped["flat_shape"]
    assert m.SerializeToString() == before  # the caller's model is not modified


def test_external_data_path_same_stats(data, tmp_path, monkeypatch):
    m = _model(ir_version=10)
    ref = collect_stats(m, NAMES, {"x": data[:8]})
    before = m.SerializeToString()
    monkeypatch.setattr(collect_mod, "EXTERNAL_DATA_THRESHOLD", 0)
    big = collect_stats(m, NAMES, {"x": data[:8]})
    assert all(big[n] == ref[n] for n in NAMES)
    assert m.SerializeToString() == before  # weights restored after the external-data save
    path = tmp_path / "m.onnx"
    onnx.save(m, str(path))
    from_path = collect_stats(path, NAMES, {"x": data[:8]})
    assert all(from_path[n] == ref[n] for n in NAMES)


def test_errors(data, tmp_path):
    m = _model(ir_version=10)
    with pytest.raises(DataError, match="unknown input 'y'"):
        collect_stats(m, ["relu"], [{"y": data[:1]}])
    with pytest.raises(DataError, match="calibration data is empty"):
        collect_stats(m, ["relu"], [])
    with pytest.raises(DataError, match=r"'x'.*\(1, 3, 7, 7\)"):
        collect_stats(m, ["relu"], [{"x": data[:1, :, :7, :7]}])
    with pytest.raises(ModelError, match="does not exist"):
        collect_stats(tmp_path / "missing.onnx", ["relu"], [{"x": data[:1]}])
