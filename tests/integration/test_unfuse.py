"""onnxruntime's fused contrib ops (com.microsoft) expanded into standard ops
(mixq.passes.unfuse): each expansion computes what onnxruntime's kernel computes, and a model
onnxruntime saved after its graph optimizations is quantized, not handed back float."""
from __future__ import annotations

import os
from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import mixq
from mixq.graph import PassResult
from mixq.passes.unfuse import MS_DOMAIN, unfuse

F = TensorProto.FLOAT


def _model(node: onnx.NodeProto, inputs: dict[str, np.ndarray], inits: dict[str, np.ndarray],
           n_out: int = 1) -> onnx.ModelProto:
    g = helper.make_graph(
        [node], "fused",
        [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), list(v.shape))
         for k, v in inputs.items()],
        [helper.make_tensor_value_info(o, F, None) for o in node.output[:n_out] if o],
        [numpy_helper.from_array(v, k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(MS_DOMAIN, 1)])
    m.ir_version = 10
    return m


def _run(m: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """`m` in onnxruntime as it is: no graph optimization rewrites the fused op into another kernel."""
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, feeds)


def _saved_optimized(model: onnx.ModelProto, tmp_path, level=ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
                     ) -> onnx.ModelProto:
    """`model` as onnxruntime saves it after its graph optimizations at `level`
    (`SessionOptions.optimized_model_filepath`)."""
    so = ort.SessionOptions()
    so.graph_optimization_level = level
    so.optimized_model_filepath = os.fspath(tmp_path / "opt.onnx")
    ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return onnx.load(so.optimized_model_filepath)


def _sqnr(a: np.ndarray, b: np.ndarray) -> float:
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    return float(10 * np.log10(np.sum(a64 ** 2) / np.sum((a64 - b64) ** 2)))


def _ms(op: str, ins: list[str], outs: list[str], **attrs) -> onnx.NodeProto:
    return helper.make_node(op, ins, outs, name=op.lower(), domain=MS_DOMAIN, **attrs)


r = np.random.default_rng(0)
x4 = r.standard_normal((2, 3, 8, 8)).astype(np.float32)
z4 = r.standard_normal((2, 4, 8, 8)).astype(np.float32)
w4 = (r.standard_normal((4, 3, 3, 3)) * 0.3).astype(np.float32)
b4 = (r.standard_normal(4) * 0.1).astype(np.float32)
x3 = r.standard_normal((2, 5, 16)).astype(np.float32)
s3 = r.standard_normal((2, 5, 16)).astype(np.float32)
v16 = (r.standard_normal(16) * 0.2).astype(np.float32)
g16 = (1 + r.standard_normal(16) * 0.2).astype(np.float32)
w2 = (r.standard_normal((16, 8)) * 0.3).astype(np.float32)
x2 = r.standard_normal((6, 16)).astype(np.float32)
wqkv = (r.standard_normal((16, 48)) * 0.3).astype(np.float32)
bqkv = (r.standard_normal(48) * 0.1).astype(np.float32)
conv = dict(pads=[1, 1, 1, 1])
ids = r.integers(0, 30, (2, 5)).astype(np.int32)
segs = r.integers(0, 2, (2, 5)).astype(np.int32)
mask = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], np.int32)
word, pos, segt = (r.standard_normal((n, 16)).astype(np.float32) for n in (30, 5, 2))
kv7 = r.standard_normal((2, 7, 16)).astype(np.float32)
ab = (r.standard_normal((1, 2, 5, 5)) * 2).astype(np.float32)  # a relative position bias
past = r.standard_normal((2, 2, 2, 5, 8)).astype(np.float32)  # [K/V, B, H, P, head size]

#: (case, node, graph inputs, initializers, outputs compared)
CASES = [
    ("FusedConv Relu", _ms("FusedConv", ["x", "w", "b"], ["y"], activation="Relu", **conv), {"x": x4}, {"w": w4, "b": b4}, 1),
    ("FusedConv LeakyRelu", _ms("FusedConv", ["x", "w", "b"], ["y"], activation="LeakyRelu",
                                activation_params=[0.2], **conv), {"x": x4}, {"w": w4, "b": b4}, 1),
    ("FusedConv Clip, no bias", _ms("FusedConv", ["x", "w"], ["y"], activation="Clip", activation_params=[0.0, 0.5],
                                    **conv), {"x": x4}, {"w": w4}, 1),
    ("FusedConv HardSigmoid", _ms("FusedConv", ["x", "w", "b"], ["y"], activation="HardSigmoid",
                                  activation_params=[0.2, 0.5], **conv), {"x": x4}, {"w": w4, "b": b4}, 1),
    ("FusedConv Sigmoid, stride", _ms("FusedConv", ["x", "w", "b"], ["y"], activation="Sigmoid", strides=[2, 2], **conv),
     {"x": x4}, {"w": w4, "b": b4}, 1),
    ("FusedConv sum input Z", _ms("FusedConv", ["x", "w", "b", "z"], ["y"], activation="Relu", **conv),
     {"x": x4, "z": z4}, {"w": w4, "b": b4}, 1),
    ("FusedGemm LeakyRelu", _ms("FusedGemm", ["x", "w", "c"], ["y"], activation="LeakyRelu", activation_alpha=0.3),
     {"x": x2}, {"w": w2, "c": v16[:8]}, 1),
    ("FusedGemm transB alpha beta Relu", _ms("FusedGemm", ["x", "w", "c"], ["y"], activation="Relu", transB=1, alpha=0.5,
                                            beta=2.0), {"x": x2}, {"w": np.ascontiguousarray(w2.T), "c": v16[:8]}, 1),
    ("FusedMatMul transB alpha", _ms("FusedMatMul", ["x", "w"], ["y"], transB=1, alpha=0.125), {"x": x3},
     {"w": np.ascontiguousarray(w2.T)}, 1),
    ("FusedMatMul transA", _ms("FusedMatMul", ["x", "w"], ["y"], transA=1), {"x": np.ascontiguousarray(x3.transpose(0, 2, 1))},
     {"w": w2}, 1),
    ("TransposeMatMul", _ms("TransposeMatMul", ["x", "w"], ["y"], transB=1), {"x": x3}, {"w": np.ascontiguousarray(w2.T)}, 1),
    ("BiasGelu", _ms("BiasGelu", ["x", "b"], ["y"]), {"x": x3}, {"b": v16}, 1),
    ("FastGelu with bias", _ms("FastGelu", ["x", "b"], ["y"]), {"x": x3}, {"b": v16}, 1),
    ("FastGelu", _ms("FastGelu", ["x"], ["y"]), {"x": x3}, {}, 1),
    ("Gelu", _ms("Gelu", ["x"], ["y"]), {"x": x3}, {}, 1),
    ("QuickGelu", _ms("QuickGelu", ["x"], ["y"], alpha=1.5), {"x": x3}, {}, 1),
    ("SkipLayerNormalization", _ms("SkipLayerNormalization", ["x", "s", "g", "beta", "b"], ["y", "", "", "sum"],
                                   epsilon=1e-5), {"x": x3, "s": s3}, {"g": g16, "beta": v16, "b": v16[::-1].copy()}, 4),
    ("SkipLayerNormalization, no beta", _ms("SkipLayerNormalization", ["x", "s", "g"], ["y"]), {"x": x3, "s": s3},
     {"g": g16}, 1),
    ("SkipSimplifiedLayerNormalization", _ms("SkipSimplifiedLayerNormalization", ["x", "s", "g"], ["y", "", "", "sum"],
                                             epsilon=1e-6), {"x": x3, "s": s3}, {"g": g16}, 4),
    ("Attention", _ms("Attention", ["x", "w", "b"], ["y"], num_heads=2), {"x": x3}, {"w": wqkv, "b": bqkv}, 1),
    ("Attention 1-D lengths", _ms("Attention", ["x", "w", "b", "m"], ["y"], num_heads=4),
     {"x": x3, "m": np.array([3, 5], np.int32)}, {"w": wqkv, "b": bqkv}, 1),
    ("Attention 2-D mask, scale", _ms("Attention", ["x", "w", "b", "m"], ["y"], num_heads=2, scale=0.3),
     {"x": x3, "m": np.array([[1, 1, 0, 1, 0], [1, 1, 1, 1, 1]], np.int32)}, {"w": wqkv, "b": bqkv}, 1),
    ("Attention causal", _ms("Attention", ["x", "w", "b"], ["y"], num_heads=2, unidirectional=1), {"x": x3},
     {"w": wqkv, "b": bqkv}, 1),
    ("Attention causal, 2-D mask", _ms("Attention", ["x", "w", "b", "m"], ["y"], num_heads=2, unidirectional=1),
     {"x": x3, "m": np.array([[1, 1, 0, 1, 0], [1, 1, 1, 1, 1]], np.int32)}, {"w": wqkv, "b": bqkv}, 1),
    ("MultiHeadAttention", _ms("MultiHeadAttention", ["q", "k", "v"], ["y"], num_heads=2),
     {"q": x3, "k": s3, "v": x3[::-1].copy()}, {}, 1),
    ("MultiHeadAttention bias, 2-D key mask", _ms("MultiHeadAttention", ["q", "k", "v", "b", "m"], ["y"], num_heads=4),
     {"q": x3, "k": s3, "v": x3[::-1].copy(), "m": np.array([[1, 1, 0, 1, 0], [1, 1, 1, 1, 1]], np.int32)},
     {"b": bqkv}, 1),
    ("MultiHeadAttention cross, 1-D lengths", _ms("MultiHeadAttention", ["q", "k", "v", "", "m"], ["y"], num_heads=2,
                                                 scale=0.2),
     {"q": x3, "k": kv7, "v": kv7[..., ::-1].copy(), "m": np.array([4, 7], np.int32)}, {}, 1),
    ("MultiHeadAttention attention_bias", _ms("MultiHeadAttention", ["q", "k", "v", "", "", "ab"], ["y"], num_heads=2),
     {"q": x3, "k": s3, "v": x3[::-1].copy()}, {"ab": ab}, 1),
    ("Attention attention_bias, 1-D lengths", _ms("Attention", ["x", "w", "b", "m", "", "ab"], ["y"], num_heads=2),
     {"x": x3, "m": np.array([3, 5], np.int32)}, {"w": wqkv, "b": bqkv, "ab": ab}, 1),
    ("Attention past, present, causal, 2-D mask",
     _ms("Attention", ["x", "w", "b", "m", "past"], ["y", "present"], num_heads=2, unidirectional=1),
     {"x": x3, "m": np.array([[1] * 10, [0, 0] + [1] * 8], np.int32), "past": past}, {"w": wqkv, "b": bqkv}, 2),
    ("MultiHeadAttention past, present, causal",
     _ms("MultiHeadAttention", ["q", "k", "v", "", "", "", "pk", "pv"], ["y", "pres_k", "pres_v"], num_heads=2,
         unidirectional=1),
     {"q": x3, "k": s3, "v": x3[::-1].copy(), "pk": past[0], "pv": past[1]}, {}, 3),
    ("MultiHeadAttention present, no past",
     _ms("MultiHeadAttention", ["q", "k", "v"], ["y", "pres_k", "pres_v"], num_heads=2),
     {"q": x3, "k": s3, "v": x3[::-1].copy()}, {}, 3),
    ("MultiHeadAttention causal", _ms("MultiHeadAttention", ["q", "k", "v"], ["y"], num_heads=2, unidirectional=1),
     {"q": x3, "k": s3, "v": x3[::-1].copy()}, {}, 1),
    ("EmbedLayerNormalization", _ms("EmbedLayerNormalization", ["ids", "seg", "word", "pos", "segt", "g", "beta", "m"],
                                    ["y", "mi", "sum"], epsilon=1e-5),
     {"ids": ids, "seg": segs, "m": mask}, {"word": word, "pos": pos, "segt": segt, "g": g16, "beta": v16}, 3),
    ("EmbedLayerNormalization, no segments, no mask", _ms("EmbedLayerNormalization", ["ids", "", "word", "pos", "", "g",
                                                           "beta"], ["y", "mi"]),
     {"ids": ids}, {"word": word, "pos": pos, "g": g16, "beta": v16}, 2),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_each_fused_op_expands_to_what_onnxruntime_computes(case):
    _, node, inputs, inits, n_out = case
    m = _model(node, inputs, inits, n_out)
    if node.op_type == "EmbedLayerNormalization" and n_out > 1:  # mask_index is int32
        m.graph.output[1].type.tensor_type.elem_type = TensorProto.INT32
    ref = _run(m, inputs)
    res = PassResult("unfuse")
    assert unfuse(m, res) == 1, res.declined
    assert not [n for n in m.graph.node if n.domain == MS_DOMAIN]
    onnx.shape_inference.infer_shapes(m, check_type=True, strict_mode=True)  # standard ops, well typed
    got = _run(m, inputs)
    for a, b in zip(ref, got):
        assert a.dtype == b.dtype
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=2e-5)


def _wide_v_attention() -> onnx.ModelProto:
    """An Attention whose values are wider than its queries and keys (qkv_hidden_sizes 16, 16,
    32): a form the expansion declines."""
    w = np.concatenate([wqkv, wqkv[:, 32:]], axis=1)
    b = np.concatenate([bqkv, bqkv[32:]])
    return _model(_ms("Attention", ["x", "w", "b"], ["y"], num_heads=2, qkv_hidden_sizes=[16, 16, 32]), {"x": x3},
                  {"w": w, "b": b})


def test_a_form_the_expansion_would_not_reproduce_is_kept_with_why():
    m = _wide_v_attention()
    res = PassResult("unfuse")
    assert unfuse(m, res) == 0
    assert [n.op_type for n in m.graph.node] == ["Attention"]
    assert "unequal qkv_hidden_sizes" in res.declined[0][1]


def test_a_malformed_fused_node_is_kept_as_written():
    """A FusedConv without its weight input: kept, so that onnxruntime's error names the user's
    node (the expansion's Conv would have been named instead)."""
    m = _model(_ms("FusedConv", ["x"], ["y"], activation="Relu"), {"x": x4}, {})
    res = PassResult("unfuse")
    assert unfuse(m, res) == 0
    assert [(n.domain, n.op_type) for n in m.graph.node] == [(MS_DOMAIN, "FusedConv")]
    assert "fewer than the op takes" in res.declined[0][1]


def test_a_fused_node_with_an_output_the_expansion_does_not_write_is_kept():
    """An output the rule does not compute (here a second output on a FusedConv, as a newer
    schema could add one) would be left a dangling name: the node is kept instead."""
    m = _model(_ms("FusedConv", ["x", "w", "b"], ["y", "extra"], activation="Relu", **conv), {"x": x4},
               {"w": w4, "b": b4})
    res = PassResult("unfuse")
    assert unfuse(m, res) == 0
    assert [n.op_type for n in m.graph.node] == ["FusedConv"]
    assert "'extra' is not one the expansion computes" in res.declined[0][1]


def _cnn() -> onnx.ModelProto:
    rr = np.random.default_rng(1)
    inits, nodes, x = [], [], "x"
    for i, (cin, cout, act) in enumerate(((3, 16, "Relu"), (16, 16, "Sigmoid"), (16, 16, "Relu"))):
        inits += [numpy_helper.from_array((rr.standard_normal((cout, cin, 3, 3)) / np.sqrt(9 * cin)).astype(np.float32),
                                          f"w{i}"),
                  numpy_helper.from_array((rr.standard_normal(cout) * 0.05).astype(np.float32), f"b{i}")]
        nodes += [helper.make_node("Conv", [x, f"w{i}", f"b{i}"], [f"c{i}"], pads=[1] * 4),
                  helper.make_node(act, [f"c{i}"], [f"a{i}"])]
        x = f"a{i}"
    inits += [numpy_helper.from_array((rr.standard_normal((10, 16)) / 4).astype(np.float32), "wg"),
              numpy_helper.from_array(np.zeros(10, np.float32), "bg")]
    nodes += [helper.make_node("GlobalAveragePool", [x], ["gap"]), helper.make_node("Flatten", ["gap"], ["f"]),
              helper.make_node("Gemm", ["f", "wg", "bg"], ["g"], transB=1), helper.make_node("Relu", ["g"], ["y"])]
    g = helper.make_graph(nodes, "cnn", [helper.make_tensor_value_info("x", F, ["N", 3, 16, 16])],
                          [helper.make_tensor_value_info("y", F, ["N", 10])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


@pytest.mark.parametrize("preset", ["A8W8", "BFP16"])
def test_a_model_onnxruntime_saved_optimized_is_quantized(tmp_path, preset):
    """What `SessionOptions.optimized_model_filepath` writes at the extended level: FusedConv and
    FusedGemm. Before the expansion nothing of it was quantized (the output was the float model,
    with a warning)."""
    m = _saved_optimized(_cnn(), tmp_path)
    assert Counter(n.op_type for n in m.graph.node if n.domain == MS_DOMAIN) == {"FusedConv": 3, "FusedGemm": 1}
    rr = np.random.default_rng(2)
    calib = [{"x": rr.standard_normal((4, 3, 16, 16)).astype(np.float32)} for _ in range(8)]
    res = mixq.quantize(m, preset, calib, check_kernels=False)
    assert not [n for n in res.model.graph.node if n.domain == MS_DOMAIN]
    quantized = sum(1 for n in res.model.graph.node if n.op_type in ("DequantizeLinear",) or n.domain == "com.mixq")
    assert quantized >= 4, f"{quantized} quantize nodes: the layers stayed float"
    assert not any(w.startswith("WARNING") for w in res.warnings), res.warnings
    assert res.prepare.ort_ops_expanded == 4
    assert "onnxruntime-specific op(s)" in res.summary()
    feeds = {"x": rr.standard_normal((4, 3, 16, 16)).astype(np.float32)}
    a, = _run(m, feeds)
    b, = _run(res.model, feeds)
    sqnr = _sqnr(a, b)
    assert sqnr > 20, sqnr


def _bert_layer() -> onnx.ModelProto:
    """A BERT layer in standard ops (additive 0/1 mask, erf GELU, LayerNormalization after each
    residual Add): onnxruntime fuses it into SkipLayerNormalization, FusedMatMul and BiasGelu."""
    rr = np.random.default_rng(3)
    D, H, hd = 32, 2, 16
    inits: list[onnx.TensorProto] = []
    nodes: list[onnx.NodeProto] = []

    def c(a: np.ndarray) -> str:
        inits.append(numpy_helper.from_array(np.asarray(a), f"c{len(inits)}"))
        return f"c{len(inits) - 1}"

    def op(t: str, ins: list[str], **kw) -> str:
        out = f"{t.lower()}{len(nodes)}"
        nodes.append(helper.make_node(t, ins, [out], **kw))
        return out

    def lin(x: str, i: int, o: int) -> str:
        w = (rr.standard_normal((i, o)) / np.sqrt(i)).astype(np.float32)
        return op("Add", [op("MatMul", [x, c(w)]), c((rr.standard_normal(o) * 0.05).astype(np.float32))])

    def heads(t: str, perm: list[int]) -> str:
        return op("Transpose", [op("Reshape", [t, c(np.array([0, 0, H, hd], np.int64))])], perm=perm)

    x = lin("x", 16, D)
    q, k, v = heads(lin(x, D, D), [0, 2, 1, 3]), heads(lin(x, D, D), [0, 2, 3, 1]), heads(lin(x, D, D), [0, 2, 1, 3])
    mask = op("Unsqueeze", ["mask", c(np.array([1, 2], np.int64))])
    add = op("Mul", [op("Sub", [c(np.float32(1)), op("Cast", [mask], to=F)]), c(np.float32(-10000))])
    s = op("Add", [op("Div", [op("MatMul", [q, k]), c(np.float32(4))]), add])
    a = op("MatMul", [op("Softmax", [s], axis=-1), v])
    a = op("Reshape", [op("Transpose", [a], perm=[0, 2, 1, 3]), c(np.array([0, 0, D], np.int64))])
    ones, zeros = np.ones(D, np.float32), np.zeros(D, np.float32)
    y = op("LayerNormalization", [op("Add", [lin(a, D, D), x]), c(ones), c(zeros)], axis=-1, epsilon=1e-12)
    f = lin(y, D, 4 * D)
    erf = op("Erf", [op("Div", [f, c(np.float32(np.sqrt(2)))])])
    g = op("Mul", [op("Mul", [f, op("Add", [erf, c(np.float32(1))])]), c(np.float32(0.5))])
    z = op("LayerNormalization", [op("Add", [lin(g, 4 * D, D), y]), c(ones), c(zeros)], axis=-1, epsilon=1e-12)
    out = op("MatMul", [op("ReduceMean", [z], axes=[1], keepdims=0), c((rr.standard_normal((D, 4)) / 6).astype(np.float32))])
    gr = helper.make_graph(nodes, "bert", [helper.make_tensor_value_info("x", F, ["N", 8, 16]),
                                           helper.make_tensor_value_info("mask", TensorProto.INT64, ["N", 8])],
                           [helper.make_tensor_value_info(out, F, ["N", 4])], inits)
    m = helper.make_model(gr, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def test_a_transformer_onnxruntime_saved_optimized_is_quantized(tmp_path):
    m = _saved_optimized(_bert_layer(), tmp_path)
    fused = Counter(n.op_type for n in m.graph.node if n.domain == MS_DOMAIN)
    assert fused["SkipLayerNormalization"] == 2 and fused["BiasGelu"] == 1, fused
    rr = np.random.default_rng(4)

    def feed() -> dict[str, np.ndarray]:
        return {"x": rr.standard_normal((4, 8, 16)).astype(np.float32),
                "mask": (np.arange(8)[None] < rr.integers(3, 9, (4, 1))).astype(np.int64)}

    res = mixq.quantize(m, "A8W8", [feed() for _ in range(8)], check_kernels=False)
    assert res.prepare.ort_ops_expanded == sum(fused.values())
    assert not [n for n in res.model.graph.node if n.domain == MS_DOMAIN]
    assert res.rewrite.weights_quantized >= 7  # every linear layer's weight (the four fused ones too)
    assert not any(w.startswith("WARNING") for w in res.warnings), res.warnings
    f = feed()
    a, = _run(m, f)
    b, = _run(res.model, f)
    sqnr = _sqnr(a, b)
    assert sqnr > 15, sqnr


def test_layers_left_float_for_an_unknown_op_warn():
    """A layer whose op mixq does not know (here an Attention the expansion declines) is float
    in the output whatever the preset: the result says so as a warning, not only in the
    left-float counts. Before, only "Left float: 1 x custom-domain op ..." said it."""
    m = _wide_v_attention()
    m.graph.node.extend([helper.make_node("MatMul", ["y", "w3"], ["z"], name="head")])
    m.graph.initializer.append(numpy_helper.from_array((r.standard_normal((32, 8)) / 6).astype(np.float32), "w3"))
    del m.graph.output[:]
    m.graph.output.append(helper.make_tensor_value_info("z", F, [2, 5, 8]))
    rr = np.random.default_rng(5)
    res = mixq.quantize(m, "A8W8", [{"x": rr.standard_normal((2, 5, 16)).astype(np.float32)} for _ in range(4)],
                        check_kernels=False)
    warn = [w for w in res.warnings if "layer(s) with weights stayed float" in w]
    assert warn and "com.microsoft.Attention x 1" in warn[0], res.warnings
    assert "unequal qkv_hidden_sizes" in res.summary()  # the expansion's reason for keeping it


def test_an_onnxruntime_op_that_is_no_layer_does_not_warn():
    """RotaryEmbedding (com.microsoft) reads cos / sin caches of rank 2: constants, no layer's
    weights; the two MatMuls around it are quantized, and no layer stayed float."""
    S, heads, hd = 8, 2, 16
    ang = np.arange(S)[:, None] * (1.0 / 10000 ** (np.arange(hd // 2) / (hd // 2)))[None]
    inits = {"cos": np.cos(ang).astype(np.float32), "sin": np.sin(ang).astype(np.float32),
             "w1": (r.standard_normal((8, heads * hd)) / 3).astype(np.float32),
             "w2": (r.standard_normal((heads * hd, 4)) / 6).astype(np.float32)}
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["q"]),
             _ms("RotaryEmbedding", ["q", "pos", "cos", "sin"], ["qr"], num_heads=heads),
             helper.make_node("MatMul", ["qr", "w2"], ["y"])]
    g = helper.make_graph(nodes, "rope", [helper.make_tensor_value_info("x", F, ["N", S, 8]),
                                          helper.make_tensor_value_info("pos", TensorProto.INT64, ["N", S])],
                          [helper.make_tensor_value_info("y", F, ["N", S, 4])],
                          [numpy_helper.from_array(v, k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(MS_DOMAIN, 1)])
    m.ir_version = 10
    rr = np.random.default_rng(8)
    feeds = [{"x": rr.standard_normal((2, S, 8)).astype(np.float32), "pos": np.tile(np.arange(S), (2, 1))}
             for _ in range(4)]
    res = mixq.quantize(m, "A8W8", feeds, check_kernels=False)
    assert res.rewrite.weights_quantized == 2
    assert not [w for w in res.warnings if "layer(s) with weights stayed float" in w], res.warnings


def test_a_kept_matmul_of_two_activations_does_not_warn():
    """A FusedMatMul with transBatchB (declined) multiplies two activations: no layer's weights
    stay float with it, so no warning (the layer ops' rule also asks for a weight input)."""
    inits = {"w1": (r.standard_normal((16, 16)) / 4).astype(np.float32),
             "w2": (r.standard_normal((5, 4)) / 2).astype(np.float32)}
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]),
             helper.make_node("Transpose", ["h"], ["ht"], perm=[2, 0, 1]),
             _ms("FusedMatMul", ["h", "ht"], ["s"], transBatchB=1),
             helper.make_node("MatMul", ["s", "w2"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, [2, 5, 16])],
                          [helper.make_tensor_value_info("y", F, [2, 5, 4])],
                          [numpy_helper.from_array(v, k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(MS_DOMAIN, 1)])
    m.ir_version = 10
    rr = np.random.default_rng(9)
    res = mixq.quantize(m, "A8W8", [{"x": rr.standard_normal((2, 5, 16)).astype(np.float32)} for _ in range(4)],
                        check_kernels=False)
    assert "transBatch" in res.summary()  # kept, with why
    assert res.rewrite.weights_quantized == 2
    assert not [w for w in res.warnings if "layer(s) with weights stayed float" in w], res.warnings


def test_a_model_saved_at_the_layout_specific_level_says_what_to_do(tmp_path):
    m = _saved_optimized(_cnn(), tmp_path, ort.GraphOptimizationLevel.ORT_ENABLE_ALL)
    if not any(n.domain == "com.microsoft.nchwc" for n in m.graph.node):
        pytest.skip("onnxruntime wrote no NCHWc ops on this CPU")
    rr = np.random.default_rng(2)
    res = mixq.quantize(m, "A8W8", [{"x": rr.standard_normal((4, 3, 16, 16)).astype(np.float32)} for _ in range(4)],
                        check_kernels=False)
    warn = [w for w in res.warnings if "layer(s) with weights stayed float" in w]
    assert warn and "ORT_ENABLE_EXTENDED" in warn[0], res.warnings


def test_an_attention_reading_an_expanded_embedding_mask_is_expanded_too():
    """The transformer optimizer's BERT: EmbedLayerNormalization's mask_index (valid lengths)
    feeds Attention. No shape inference knows a contrib op's output rank; the pass carries the
    rank of what it expanded, so the Attention is expanded too (it was kept before)."""
    nodes = [_ms("EmbedLayerNormalization", ["ids", "seg", "word", "pos", "segt", "g", "beta", "m"], ["e", "mi"]),
             helper.make_node("Attention", ["e", "w", "b", "mi"], ["y"], name="attn", domain=MS_DOMAIN, num_heads=2)]
    inputs = {"ids": ids, "seg": segs, "m": mask}
    inits = {"word": word, "pos": pos, "segt": segt, "g": g16, "beta": v16, "w": wqkv, "b": bqkv}
    g = helper.make_graph(nodes, "bert", [helper.make_tensor_value_info(k, TensorProto.INT32, list(v.shape))
                                          for k, v in inputs.items()],
                          [helper.make_tensor_value_info("y", F, None)],
                          [numpy_helper.from_array(v, k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(MS_DOMAIN, 1)])
    m.ir_version = 10
    ref = _run(m, inputs)
    res = PassResult("unfuse")
    assert unfuse(m, res) == 2, res.declined
    np.testing.assert_allclose(_run(m, inputs)[0], ref[0], rtol=1e-4, atol=2e-5)


def _norm_model(rms: bool, opset: int = 13) -> onnx.ModelProto:
    """MatMul, a LayerNorm (or an RMSNorm) written out, MatMul (ReduceMean's axes an attribute:
    opset 17 at most)."""
    rr = np.random.default_rng(6)
    D = 16
    inits = {"w1": (rr.standard_normal((8, D)) / 3).astype(np.float32),
             "w2": (rr.standard_normal((D, 4)) / 4).astype(np.float32),
             "two": np.float32(2.0), "eps": np.float32(1e-6), "g": (1 + 0.1 * rr.standard_normal(D)).astype(np.float32),
             "b": (0.1 * rr.standard_normal(D)).astype(np.float32)}
    n = [helper.make_node("MatMul", ["x", "w1"], ["h"])]
    if rms:
        n += [helper.make_node("Pow", ["h", "two"], ["sq"]), helper.make_node("ReduceMean", ["sq"], ["ms"], axes=[-1]),
              helper.make_node("Add", ["ms", "eps"], ["mse"]), helper.make_node("Sqrt", ["mse"], ["rt"]),
              helper.make_node("Div", ["h", "rt"], ["nx"]), helper.make_node("Mul", ["nx", "g"], ["y0"])]
        del inits["b"]
    else:
        n += [helper.make_node("ReduceMean", ["h"], ["mu"], axes=[-1]), helper.make_node("Sub", ["h", "mu"], ["c"]),
              helper.make_node("Pow", ["c", "two"], ["sq"]), helper.make_node("ReduceMean", ["sq"], ["var"], axes=[-1]),
              helper.make_node("Add", ["var", "eps"], ["ve"]), helper.make_node("Sqrt", ["ve"], ["sd"]),
              helper.make_node("Div", ["c", "sd"], ["nx"]), helper.make_node("Mul", ["nx", "g"], ["ng"]),
              helper.make_node("Add", ["ng", "b"], ["y0"])]
    n.append(helper.make_node("MatMul", ["y0", "w2"], ["y"]))
    g = helper.make_graph(n, "norm", [helper.make_tensor_value_info("x", F, ["N", 5, 8])],
                          [helper.make_tensor_value_info("y", F, ["N", 5, 4])],
                          [numpy_helper.from_array(v, k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 7
    return m


@pytest.mark.parametrize("rms", [False, True], ids=["LayerNormalization", "SimplifiedLayerNormalization"])
def test_onnxruntime_default_domain_norms_of_an_opset_13_model(tmp_path, rms):
    """onnxruntime fuses a written-out LayerNorm (RMSNorm) of an opset-13 model into
    LayerNormalization (SimplifiedLayerNormalization) in the default domain, an op the standard
    has only from opset 17 (never). The ONNX checker refused such a saved model ("No Op
    registered for LayerNormalization with domain_version of 13"); it is read as onnxruntime
    defines those ops now, the prepared model computes the same, and it is quantized."""
    from mixq.passes.prepare import prepare

    m = _saved_optimized(_norm_model(rms), tmp_path)
    op = "SimplifiedLayerNormalization" if rms else "LayerNormalization"
    assert [n.domain for n in m.graph.node if n.op_type == op] == [""]
    rr = np.random.default_rng(7)
    feeds = [{"x": rr.standard_normal((4, 5, 8)).astype(np.float32)} for _ in range(8)]
    p, rep = prepare(m)
    assert not [n for n in p.graph.node if n.domain not in ("", "ai.onnx")]
    np.testing.assert_allclose(_run(p, feeds[0])[0], _run(m, feeds[0])[0], rtol=1e-4, atol=1e-5)
    res = mixq.quantize(m, "A8W8", feeds, check_kernels=False)
    a, = _run(m, feeds[0])
    b, = _run(res.model, feeds[0])
    sqnr = _sqnr(a, b)
    assert sqnr > 20, sqnr
    assert res.rewrite.weights_quantized >= 2


@pytest.mark.parametrize("fmt", ["with_cast", "customqdq", "simulate_bf16", "bf16", "fp16", "simulate_fp16"])
@pytest.mark.parametrize("rms,opset", [(False, 13), (True, 13), (True, 17)],
                         ids=["LayerNormalization", "SimplifiedLayerNormalization", "SimplifiedLayerNormalization-17"])
def test_the_conversion_tool_converts_a_model_onnxruntime_saved(tmp_path, rms, opset, fmt):
    """The conversion tool on the same saved models: the `bf16` and `fp16` formats failed to
    load ("MatMul bound to different types"), the default-domain LayerNormalization leaving
    what follows it untyped at opset 13. At opset 17, where no upgrade is needed, the held
    RMSNorm was once left in the holding domain (nothing loaded it)."""
    from mixq.convert import to_bf16, to_fp16

    convert = to_fp16 if "fp16" in fmt else to_bf16
    out, rep = convert(_saved_optimized(_norm_model(rms, opset), tmp_path), fmt)
    assert not [n for n in out.graph.node if n.domain == "com.mixq.held"]
    assert min(f.sqnr_db for f in rep.fidelity) > 35, rep.fidelity


def test_mixq_check_says_what_quantize_does_with_them(tmp_path):
    """`mixq check` agreed with nothing above: it called the fused layers left float, and the
    opset-13 model one that fails the checker (so quantization would fail)."""
    from mixq.check import QUANTIZABLE, check_model_support

    for model, op in ((_cnn(), "FusedConv"), (_norm_model(rms=False), "LayerNormalization"),
                      (_norm_model(rms=True), "SimplifiedLayerNormalization")):
        rep = check_model_support(_saved_optimized(model, tmp_path))
        assert not rep.problems, rep.problems
        assert [o.status for o in rep.ops if o.op_type == op] == [QUANTIZABLE]


# the TorchScript exporter on purpose: the transformer optimizer's patterns are written for its graphs
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_what_the_transformer_optimizer_writes_for_a_pytorch_bert_is_quantized(tmp_path):
    """A BERT layer written in PyTorch (embeddings, attention with a padding mask, GELU, two
    LayerNorms), exported by torch.onnx at opset 14 and given to onnxruntime's transformer
    optimizer (`onnxruntime.transformers.optimizer`, model_type='bert'): it writes
    EmbedLayerNormalization, Attention, SkipLayerNormalization and BiasGelu. Every one is
    expanded and every linear layer quantized; the output follows the optimized float model.
    The model the optimizer returns in memory imports no com.microsoft opset (it adds one when
    saving); that failed the checker, and is declared now."""
    torch = pytest.importorskip("torch")
    from onnxruntime.transformers import optimizer

    D, H, V, S = 32, 2, 100, 8

    class Layer(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb, self.pos, self.tok = (torch.nn.Embedding(n, D) for n in (V, 16, 2))
            self.q, self.k, self.v, self.o = (torch.nn.Linear(D, D) for _ in range(4))
            self.f1, self.f2, self.cls = torch.nn.Linear(D, 4 * D), torch.nn.Linear(4 * D, D), torch.nn.Linear(D, 3)
            self.ln0, self.ln1, self.ln2 = (torch.nn.LayerNorm(D) for _ in range(3))

        def heads(self, t):
            return t.view(t.shape[0], t.shape[1], H, D // H).permute(0, 2, 1, 3)

        def forward(self, ids, mask, types):
            x = self.ln0(self.emb(ids) + self.pos(torch.arange(ids.shape[1]).unsqueeze(0)) + self.tok(types))
            add = (1.0 - mask[:, None, None, :].to(torch.float32)) * -10000.0
            q, k, v = self.heads(self.q(x)), self.heads(self.k(x)), self.heads(self.v(x))
            a = torch.softmax(q @ k.transpose(-1, -2) / (D // H) ** 0.5 + add, -1) @ v
            x = self.ln1(self.o(a.permute(0, 2, 1, 3).reshape(x.shape)) + x)
            x = self.ln2(self.f2(torch.nn.functional.gelu(self.f1(x))) + x)
            return self.cls(x[:, 0])

    torch.manual_seed(0)
    names = ["input_ids", "attention_mask", "token_type_ids"]
    example = (torch.randint(0, V, (2, S)), torch.ones(2, S, dtype=torch.int64), torch.zeros(2, S, dtype=torch.int64))
    torch.onnx.export(Layer().eval(), example, tmp_path / "bert.onnx", input_names=names, output_names=["logits"],
                      dynamic_axes={n: {0: "B", 1: "S"} for n in names}, opset_version=14, dynamo=False)
    opt = optimizer.optimize_model(str(tmp_path / "bert.onnx"), model_type="bert", num_heads=H, hidden_size=D,
                                   opt_level=0)
    m = opt.model
    fused = Counter(n.op_type for n in m.graph.node if n.domain == MS_DOMAIN)
    assert {"EmbedLayerNormalization", "Attention", "SkipLayerNormalization"} <= set(fused), fused
    rr = np.random.default_rng(10)

    def feed() -> dict[str, np.ndarray]:
        lengths = rr.integers(3, S + 1, (4, 1))
        return {"input_ids": rr.integers(0, V, (4, S)).astype(np.int64),
                "attention_mask": (np.arange(S)[None] < lengths).astype(np.int64),
                "token_type_ids": np.zeros((4, S), np.int64)}

    assert not any(o.domain == MS_DOMAIN for o in m.opset_import)
    from mixq.check import check_model_support

    assert not check_model_support(m).problems  # `mixq check` reads it as quantize does
    res = mixq.quantize(m, "A8W8", [feed() for _ in range(8)], check_kernels=False)
    assert "its opset 1 declared" in res.summary()
    assert res.prepare.ort_ops_expanded == sum(fused.values())
    assert not [n for n in res.model.graph.node if n.domain == MS_DOMAIN]
    assert res.rewrite.weights_quantized >= 6  # qkv, output, two FFN, classifier, embeddings...
    assert not any(w.startswith("WARNING") for w in res.warnings), res.warnings
    f = feed()
    assert _sqnr(_run(m, f)[0], _run(res.model, f)[0]) > 20
