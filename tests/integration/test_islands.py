"""Quantized islands without a layer stay float (`plan.rules._drop_layerless_islands`): a
Transpose between a graph input and an LSTM, a Squeeze between two LSTMs. Quantized, they
were rounding between float ops that no integer kernel runs: a speaker encoder whose input is a
linear power mel (median 2e-4, maximum 18) lost it to the int8 grid (resemblyzer: A8W8 cosine
0.50, A16W8 0.93; onnxruntime, which leaves them float, 0.9996)."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import mixq
from tests.graphs import compare
from mixq.plan import rules

F, H, O = 8, 16, 6


def _encoder() -> onnx.ModelProto:
    """x (N, T, F) -> Transpose -> LSTM -> Squeeze -> LSTM -> last hidden state -> Gemm."""
    rng = np.random.default_rng(0)
    arrays = {"W": rng.normal(0, 4, (1, 4 * H, F)), "R": rng.normal(0, 0.3, (1, 4 * H, H)),
              "W2": rng.normal(0, 0.8, (1, 4 * H, H)), "R2": rng.normal(0, 0.3, (1, 4 * H, H)),
              "G": rng.normal(0, 0.5, (O, H))}
    inits = [numpy_helper.from_array(a.astype(np.float32), n) for n, a in arrays.items()]
    inits += [numpy_helper.from_array(np.array([0], np.int64), "ax0"),
              numpy_helper.from_array(np.array([1], np.int64), "ax1")]
    nodes = [helper.make_node("Transpose", ["x"], ["xt"], perm=[1, 0, 2]),
             helper.make_node("LSTM", ["xt", "W", "R"], ["y1", "h1"], hidden_size=H),
             helper.make_node("Squeeze", ["y1", "ax1"], ["y1s"]),
             helper.make_node("LSTM", ["y1s", "W2", "R2"], ["y2", "h2"], hidden_size=H),
             helper.make_node("Squeeze", ["h2", "ax0"], ["h"]),
             helper.make_node("Gemm", ["h", "G"], ["emb"], transB=1)]
    g = helper.make_graph(nodes, "enc", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 20, F])],
                          [helper.make_tensor_value_info("emb", TensorProto.FLOAT, ["N", O])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _feeds(seed: int, n: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)  # a power spectrum: most values tiny, a few large
    return [{"x": (rng.exponential(1, (4, 20, F)) ** 4 * 1e-2).astype(np.float32)} for _ in range(n)]


@pytest.mark.parametrize("preset", ["A8W8", "U8S8", "XINT8", "A16W8"])
def test_an_island_between_float_ops_stays_float(preset, monkeypatch):
    m = _encoder()
    calib, fresh = _feeds(1, 16), _feeds(2, 8)
    res = mixq.quantize(m, preset, calib)
    for t in ("x", "xt", "y1", "y1s"):
        tp = res.plan.tensors[t]
        assert tp.format is None and "no quantized layer" in tp.reason, (t, tp)
    assert "LSTM" in res.plan.tensors["xt"].reason and "graph input 'x'" in res.plan.tensors["x"].reason
    assert res.plan.tensors["h"].format is not None  # the Gemm's input: read by a layer
    assert compare(m, res.model, fresh).outputs[0].cosine > 0.999
    if preset == "A16W8":  # 16 bits hold the input: the policy is not what keeps it
        return
    monkeypatch.setattr(rules, "_drop_layerless_islands", lambda *a: None)
    before = mixq.quantize(m, preset, calib)
    assert before.plan.tensors["x"].format is not None
    assert compare(m, before.model, fresh).outputs[0].cosine < 0.95


def test_an_override_keeps_its_island_and_a_model_without_layers_keeps_its_plan():
    m = _encoder()
    calib = _feeds(1, 8)
    cfg = mixq.QuantConfig(activation="int8", weight="int8", tensor_formats={"xt": "int16"})
    plan = mixq.pipeline.Pipeline.load(m).plan(cfg)
    assert plan.tensors["xt"].format == "int16" and plan.tensors["x"].format == "int8"
    g = helper.make_graph([helper.make_node("Transpose", ["x"], ["xt"], perm=[1, 0, 2]),
                           helper.make_node("Sigmoid", ["xt"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 2, 4])])
    elementwise = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    plan = mixq.pipeline.Pipeline.load(elementwise).plan(mixq.get_default_config("A8W8"))
    assert plan.tensors["x"].format == "int8"
    assert mixq.quantize(elementwise, "A8W8", [{"x": np.ones((2, 3, 4), np.float32)}] * 2).model is not None


def _branch(name: str, w: np.ndarray) -> onnx.GraphProto:
    """An If branch: Conv -> Relu on the outer x."""
    return helper.make_graph([helper.make_node("Conv", ["x", f"{name}_w"], [f"{name}_c"], pads=[1, 1]),
                              helper.make_node("Relu", [f"{name}_c"], [f"{name}_y"])], name, [],
                             [helper.make_tensor_value_info(f"{name}_y", TensorProto.FLOAT, None)],
                             [numpy_helper.from_array(w, f"{name}_w")])


@pytest.mark.parametrize("preset", ["A8W8", "BF16", "BFP16"])
def test_a_model_whose_layers_all_sit_in_control_flow_bodies_is_not_rounded_around_them(preset):
    """Silero VAD's file with the If on the sample rate: every layer is in the If's branches,
    which mixq leaves float, and the plan rounded only the If's outputs to int8 (an island:
    float compute, then rounding, no integer kernel anywhere) with no warning, since the model
    has no top-level layer and so read as an element-wise model quantized on purpose. Now the
    island stays float and the summary says nothing was quantized, naming the If body; in
    bf16 and the block formats too (they rounded the If's output to bf16 in silence)."""
    rng = np.random.default_rng(0)
    then_g, else_g = (_branch(n, rng.normal(0, 0.5, (4, 2, 3)).astype(np.float32)) for n in ("hi", "lo"))
    nodes = [helper.make_node("Equal", ["sr", "k"], ["is16"]),
             helper.make_node("If", ["is16"], ["z"], then_branch=then_g, else_branch=else_g, name="by_rate"),
             helper.make_node("Identity", ["z"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 2, 16]),
                                       helper.make_tensor_value_info("sr", TensorProto.INT64, [])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4, 16])],
                          [numpy_helper.from_array(np.array(16000, np.int64), "k")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    feeds = [{"x": rng.normal(0, 1, (1, 2, 16)).astype(np.float32), "sr": np.array(16000, np.int64)}
             for _ in range(8)]
    res = mixq.quantize(m, preset, feeds)
    z = res.plan.tensors.get("z")  # a block preset plans only what its op scope reads
    assert z is None or z.format is None, z
    assert res.rewrite.activations_quantized == 0
    assert "nothing was quantized" in res.summary() and "inside the body of If node 'by_rate'" in res.summary()


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
def test_every_recurrent_op_says_why_it_stays_float(op):
    """Each recurrent op left float gives the same reason (GRU and RNN said only "recurrent
    op", LSTM why), and the model around it still quantizes and runs."""
    gates = {"LSTM": 4, "GRU": 3, "RNN": 1}[op]
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(0, 0.3, (1, gates * H, F)).astype(np.float32), "W"),
             numpy_helper.from_array(rng.normal(0, 0.3, (1, gates * H, H)).astype(np.float32), "R"),
             numpy_helper.from_array(rng.normal(0, 0.3, (H, O)).astype(np.float32), "Wo"),
             numpy_helper.from_array(np.array([0], np.int64), "ax0")]
    nodes = [helper.make_node(op, ["x", "W", "R"], ["y", "h"], hidden_size=H),
             helper.make_node("Squeeze", ["h", "ax0"], ["last"]),
             helper.make_node("MatMul", ["last", "Wo"], ["out"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [10, "N", F])],
                          [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["N", O])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    feeds = [{"x": rng.normal(size=(10, 4, F)).astype(np.float32)} for _ in range(8)]
    res = mixq.quantize(m, "A8W8", feeds)
    assert "1 x recurrent op: no QDQ form in stock onnxruntime" in res.summary()
    assert res.plan.tensors["last"].format is not None  # the MatMul's input is quantized
    assert compare(m, res.model, feeds[:2]).outputs[0].cosine > 0.999
