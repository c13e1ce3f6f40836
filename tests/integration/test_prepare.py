"""Preparation passes on small models written with onnx.helper: folding an explicit Pad into the
Conv that reads it (the TF-style "same" padding exporters write, e.g. EfficientNet)."""
from __future__ import annotations

import collections

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import mixq
from mixq.passes.prepare import fold_pad_into_conv
from tests.graphs import RUNTIME, session

RNG = np.random.default_rng(0)


def _pad_conv(pads=(0, 0, 0, 1, 0, 0, 1, 2), *, mode="constant", value=None, conv_pads=(1, 0, 1, 0),
              auto_pad=None, extra_reader=False) -> onnx.ModelProto:
    """x -> Pad -> Conv(3x3) -> Relu -> y (and optionally Pad -> Relu -> z)."""
    inits = [numpy_helper.from_array(np.array(pads, np.int64), "pads"),
             numpy_helper.from_array(RNG.standard_normal((4, 3, 3, 3)).astype(np.float32), "w"),
             numpy_helper.from_array(RNG.standard_normal(4).astype(np.float32), "b")]
    pad_inputs = ["x", "pads"]
    if value is not None:
        inits.append(numpy_helper.from_array(np.array(value, np.float32), "v"))
        pad_inputs.append("v")
    conv_attrs = {"auto_pad": auto_pad} if auto_pad else {"pads": list(conv_pads)}
    nodes = [helper.make_node("Pad", pad_inputs, ["xp"], name="pad", mode=mode),
             helper.make_node("Conv", ["xp", "w", "b"], ["c"], name="conv", **conv_attrs),
             helper.make_node("Relu", ["c"], ["y"], name="relu")]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 4, None, None])]
    if extra_reader:
        nodes.append(helper.make_node("Relu", ["xp"], ["z"], name="relu2"))
        outputs.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, [None, 3, None, None]))
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 3, 12, 12])],
                          outputs, inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


def _run(model: onnx.ModelProto, x: np.ndarray) -> list[np.ndarray]:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, {"x": x})


def test_zero_pad_folds_into_the_conv_padding_exactly():
    m = _pad_conv(value=0.0)
    x = RNG.standard_normal((2, 3, 12, 12)).astype(np.float32)
    want = _run(m, x)
    folded = onnx.ModelProto()
    folded.CopyFrom(m)
    assert fold_pad_into_conv(folded) == 1
    ops = [n.op_type for n in folded.graph.node]
    assert ops == ["Conv", "Relu"]
    conv = folded.graph.node[0]
    assert conv.input[0] == "x"
    # Conv pads [h_begin, w_begin, h_end, w_end] = (1, 0, 1, 0) + the Pad's spatial (0, 1, 1, 2)
    assert list(next(a for a in conv.attribute if a.name == "pads").ints) == [1, 1, 2, 2]
    assert "pads" not in {t.name for t in folded.graph.initializer}
    onnx.checker.check_model(folded, full_check=True)
    np.testing.assert_allclose(_run(folded, x)[0], want[0], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("case", [
    dict(mode="reflect"),
    dict(value=0.5),                                    # padding with a non-zero value
    dict(pads=(0, 1, 0, 0, 0, 0, 0, 0)),                # pads the channel dim
    dict(auto_pad="SAME_UPPER"),                        # the Conv computes its own padding
    dict(extra_reader=True),                            # another op reads the padded tensor
])
def test_pads_that_are_not_conv_padding_stay(case):
    m = _pad_conv(**case)
    before = m.SerializeToString()
    assert fold_pad_into_conv(m) == 0
    assert m.SerializeToString() == before


def test_quantized_pad_conv_runs_as_one_integer_kernel(tmp_path):
    """After quantization onnxruntime fuses the Conv into QLinearConv with no float Pad left
    between DequantizeLinear and QuantizeLinear (17 such Pads on EfficientNet-Lite0 before)."""
    m = _pad_conv()
    x = RNG.standard_normal((8, 3, 12, 12)).astype(np.float32)
    res = mixq.quantize(m, "U8S8", [{"x": x}])
    assert res.prepare.pads_folded == 1
    so = ort.SessionOptions()
    so.optimized_model_filepath = str(tmp_path / "opt.onnx")
    ort.InferenceSession(res.model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    ops = collections.Counter(n.op_type for n in onnx.load(str(tmp_path / "opt.onnx")).graph.node)
    assert ops["QLinearConv"] == 1 and ops["Pad"] == 0, ops


def test_a_pad_mode_that_is_not_utf8_is_left_alone():
    """A damaged model (the fuzz target flipped the mode's bytes): no raw UnicodeDecodeError."""
    m = _pad_conv()
    next(a for a in m.graph.node[0].attribute if a.name == "mode").s = b"\xf2\x00"
    assert fold_pad_into_conv(m) == 0


def test_opset_conversion_on_a_skeleton_is_the_whole_models():
    """convert_opset converts a skeleton (large weights without their data) and puts the
    weights back: the same model as converting the whole thing, weights byte for byte."""
    from onnx import version_converter

    from mixq.passes.prepare import _SKELETON_MIN_TENSOR, convert_opset

    rng = np.random.default_rng(0)
    big = rng.normal(size=(1024, 512)).astype(np.float32)  # 2 MB: stripped in the skeleton
    assert big.nbytes >= _SKELETON_MIN_TENSOR
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]),
             helper.make_node("ReduceMean", ["h"], ["m"], axes=[1], keepdims=1),  # axes: input from 18
             helper.make_node("Split", ["h"], ["a", "b"], axis=1, split=[256, 256])]  # split: input from 13
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", 1024])],
                          [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("m", "a", "b")],
                          [numpy_helper.from_array(big, "w")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 11)], ir_version=7)
    want = version_converter.convert_version(m, 21)
    got = convert_opset(m, 21)
    assert got.SerializeToString() == want.SerializeToString()
    w = next(t for t in got.graph.initializer if t.name == "w")
    assert w.raw_data == numpy_helper.from_array(big).raw_data
    x = rng.normal(size=(2, 1024)).astype(np.float32)
    run = lambda mm: ort.InferenceSession(mm.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    assert all(np.array_equal(p, q) for p, q in zip(run(got), run(m)))


def test_shape_inference_on_a_skeleton_is_onnxs_on_the_whole_model():
    """infer_shapes runs on a skeleton (large weights without data) but must give what onnx's
    shape inference gives on the whole model: stale declarations refined (an exporter's or the
    opset converter's, made before folds), unknown output dims filled in."""
    from mixq.passes.prepare import _SKELETON_MIN_TENSOR, infer_shapes

    rng = np.random.default_rng(0)
    w = rng.normal(size=(64, 3, 3, 3)).astype(np.float32)
    big = rng.normal(size=(64 * 30 * 30, 80)).astype(np.float32)  # ~18 MB: stripped in the skeleton
    assert big.nbytes >= _SKELETON_MIN_TENSOR
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[0, 0, 0, 0]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Flatten", ["r"], ["f"], axis=1),
             helper.make_node("MatMul", ["f", "big"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 32, 32])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, None])],
                          [numpy_helper.from_array(w, "w"), numpy_helper.from_array(big, "big")],
                          value_info=[helper.make_tensor_value_info("c", TensorProto.FLOAT, ["N", 64, None, None])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    want = onnx.shape_inference.infer_shapes(m, data_prop=True)
    got = onnx.ModelProto()
    got.CopyFrom(m)
    got = infer_shapes(got)
    assert [v.SerializeToString() for v in got.graph.value_info] == \
        [v.SerializeToString() for v in want.graph.value_info]
    assert got.graph.output[0].SerializeToString() == want.graph.output[0].SerializeToString()
    c = next(v for v in got.graph.value_info if v.name == "c")
    assert [d.dim_value for d in c.type.tensor_type.shape.dim][1:] == [64, 30, 30]  # the stale one refined


def _bn_params(c: int, tag: str) -> list[onnx.TensorProto]:
    """A trained-looking BatchNorm's gamma, beta, mean and var over `c` channels."""
    vals = [RNG.uniform(0.5, 2.0, c), RNG.standard_normal(c), RNG.standard_normal(c), RNG.uniform(0.1, 3.0, c)]
    return [numpy_helper.from_array(v.astype(np.float32), f"{tag}_{k}") for v, k in zip(vals, "gbmv")]


def _bn(x: str, y: str, tag: str) -> onnx.NodeProto:
    return helper.make_node("BatchNormalization", [x] + [f"{tag}_{k}" for k in "gbmv"], [y], name=tag, epsilon=1e-3)


def _bn_layers_model() -> onnx.ModelProto:
    """Every layer a BatchNorm folds into, and two it does not: x (N,4,6,6) -> ConvTranspose
    (group 2, no bias) -> BN -> Relu -> GAP -> Flatten -> Gemm (transB, beta 0.5, bias) -> BN ->
    Gemm (no bias) -> BN -> MatMul -> BN (not folded: MatMul is no host) and an input BN (not
    folded: nothing before it)."""
    w = lambda *s: RNG.standard_normal(s).astype(np.float32) * 0.5  # noqa: E731
    inits = [numpy_helper.from_array(w(4, 3, 3, 3), "wt"), numpy_helper.from_array(w(8, 6), "wg"),
             numpy_helper.from_array(w(8), "bg"), numpy_helper.from_array(w(8, 5), "wg2"),
             numpy_helper.from_array(w(5, 7), "wm"), numpy_helper.from_array(np.array([-1, 6], np.int64), "flat")]
    inits += _bn_params(4, "bn_in") + _bn_params(6, "bn_t") + _bn_params(8, "bn_g") + _bn_params(5, "bn_g2") \
        + _bn_params(7, "bn_m")
    nodes = [_bn("x", "xn", "bn_in"),
             helper.make_node("ConvTranspose", ["xn", "wt"], ["t"], name="convt", group=2, strides=[2, 2]),
             _bn("t", "tn", "bn_t"), helper.make_node("Relu", ["tn"], ["tr"]),
             helper.make_node("GlobalAveragePool", ["tr"], ["gp"]), helper.make_node("Reshape", ["gp", "flat"], ["f"]),
             helper.make_node("Gemm", ["f", "wg", "bg"], ["g"], name="gemm", transB=1, beta=0.5),
             _bn("g", "gn", "bn_g"), helper.make_node("Gemm", ["gn", "wg2"], ["g2"], name="gemm2"),
             _bn("g2", "g2n", "bn_g2"), helper.make_node("MatMul", ["g2n", "wm"], ["m"], name="matmul"),
             _bn("m", "y", "bn_m")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 4, 6, 6])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 7])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


def test_batchnorm_folds_into_convtranspose_and_gemm_exactly():
    """A BatchNorm after a ConvTranspose (grouped) or a Gemm (transB, beta, with and without a
    bias) folds into its weights and bias: the prepared model computes what the float one does;
    one after a MatMul or on the input is kept, and a note says why each was not folded."""
    m = _bn_layers_model()
    prepared, rep = mixq.passes.prepare.prepare(m, equalize=False)
    assert rep.batchnorms_folded == 3
    left = [n.name for n in prepared.graph.node if n.op_type == "BatchNormalization"]
    assert sorted(left) == ["bn_in", "bn_m"]
    note = [n for n in rep.notes if "BatchNormalization(s) not folded" in n]
    assert note and "fed by MatMul 'matmul'" in note[0] and "fed by a graph input" in note[0], rep.notes
    x = RNG.standard_normal((3, 4, 6, 6)).astype(np.float32)
    np.testing.assert_allclose(_run(prepared, x)[0], _run(m, x)[0], rtol=1e-4, atol=1e-4)


def test_batchnorm_params_an_exporter_passes_through_identity_are_folded():
    """torch.onnx passes a parameter equal to another (an untrained BatchNorm's running mean
    and its bias: both zeros) through an Identity: the constant fold runs first, so the
    BatchNorm still folds into its Conv."""
    m = _pad_conv()
    g = m.graph
    g.initializer.extend(_bn_params(4, "bn"))
    g.node.append(helper.make_node("Identity", ["bn_b"], ["bn_m_alias"]))
    g.node.append(helper.make_node("BatchNormalization", ["y", "bn_g", "bn_b", "bn_m_alias", "bn_v"], ["yn"], name="bn"))
    # the BatchNorm reads the Conv directly: drop the Relu between them
    relu = next(n for n in g.node if n.op_type == "Relu")
    g.node.remove(relu)
    next(n for n in g.node if n.op_type == "Conv").output[0] = "y"
    g.output[0].name = "yn"
    prepared, rep = mixq.passes.prepare.prepare(m, equalize=False)
    assert rep.batchnorms_folded == 1
    assert not [n for n in prepared.graph.node if n.op_type == "BatchNormalization"]
    x = RNG.standard_normal((2, 3, 12, 12)).astype(np.float32)
    np.testing.assert_allclose(_run(prepared, x)[0], _run(m, x)[0], rtol=1e-4, atol=1e-4)


def _bias_add_model() -> onnx.ModelProto:
    """Biases written as Adds: ConvTranspose -> Add (1,C,1,1) -> BN (paddle2onnx), Conv (with
    a bias) -> Add of a scalar, Gemm (beta 2) -> Add (N,), and two that are no bias: an Add
    varying along W, and one whose Conv output is also read elsewhere."""
    w = lambda *s: RNG.standard_normal(s).astype(np.float32) * 0.5  # noqa: E731
    inits = [numpy_helper.from_array(w(4, 3, 2, 2), "wt"), numpy_helper.from_array(w(1, 6, 1, 1), "bt"),
             numpy_helper.from_array(w(6, 6, 3, 3), "wc"), numpy_helper.from_array(w(6), "bc"),
             numpy_helper.from_array(np.float32(0.75), "s"), numpy_helper.from_array(w(6, 6, 1, 1), "wc2"),
             numpy_helper.from_array(w(12), "row"), numpy_helper.from_array(w(6, 6, 1, 1), "wc3"),
             numpy_helper.from_array(w(1, 6, 1, 1), "b3"), numpy_helper.from_array(np.array([-1, 6], np.int64), "flat"),
             numpy_helper.from_array(w(6, 5), "wg"), numpy_helper.from_array(w(5), "bg"),
             numpy_helper.from_array(w(5), "ag")] + _bn_params(6, "bn")
    nodes = [helper.make_node("ConvTranspose", ["x", "wt"], ["t"], name="convt", group=2, strides=[2, 2]),
             helper.make_node("Add", ["t", "bt"], ["tb"], name="bias_t"), _bn("tb", "tn", "bn"),
             helper.make_node("Conv", ["tn", "wc", "bc"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["s", "c"], ["cs"], name="bias_scalar"),
             helper.make_node("Conv", ["cs", "wc2"], ["c2"], name="conv2"),
             helper.make_node("Add", ["c2", "row"], ["c2r"], name="along_w"),
             helper.make_node("Conv", ["c2r", "wc3"], ["c3"], name="conv3"),
             helper.make_node("Add", ["c3", "b3"], ["c3b"], name="shared_out"),
             helper.make_node("Relu", ["c3"], ["z"]),
             helper.make_node("GlobalAveragePool", ["c3b"], ["gp"]), helper.make_node("Reshape", ["gp", "flat"], ["f"]),
             helper.make_node("Gemm", ["f", "wg", "bg"], ["g"], name="gemm", beta=2.0),
             helper.make_node("Add", ["g", "ag"], ["y"], name="bias_g")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 4, 6, 6])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 5]),
                           helper.make_tensor_value_info("z", TensorProto.FLOAT, [None, 6, 12, 12])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


def test_a_bias_written_as_an_add_folds_into_its_layer_exactly():
    """A per-channel constant Add after a ConvTranspose, a Conv or a Gemm joins the layer's
    bias (so the BatchNorm behind paddle2onnx's ConvTranspose bias folds too); an Add varying
    along another axis, or after an output read elsewhere, stays. The prepared model computes
    what the float one does."""
    m = _bias_add_model()
    prepared, rep = mixq.passes.prepare.prepare(m, equalize=False)
    assert rep.bias_adds_folded == 3 and rep.batchnorms_folded == 1
    adds = sorted(n.name for n in prepared.graph.node if n.op_type == "Add")
    assert adds == ["along_w", "shared_out"]
    assert not [n for n in prepared.graph.node if n.op_type == "BatchNormalization"]
    x = RNG.standard_normal((3, 4, 6, 6)).astype(np.float32)
    for got, want in zip(_run(prepared, x), _run(m, x)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    x8 = [{"x": RNG.standard_normal((2, 4, 6, 6)).astype(np.float32)} for _ in range(8)]
    res = mixq.quantize(m, "A8W8", x8)
    assert res.rewrite.biases_int32 == 3, res.rewrite.biases_kept_float  # the folded biases: int32 (the grouped ConvTranspose too)


def _scale_model() -> onnx.ModelProto:
    """Learned scales written as element-wise ops after a layer: Conv -> BN -> Mul (scalar) ->
    Add (scalar) -> HardSwish (PP-LCNetV3's learnable affine block), Conv -> Div (per channel)
    -> Sub (per channel), Gemm (transB) -> Mul (per column); and four that stay: a Mul varying
    along W (no scale), a Mul after a Conv whose weight another Conv reads too, a Div by a
    channel of 0, and a Mul whose output two nodes read."""
    w = lambda *s: RNG.standard_normal(s).astype(np.float32) * 0.5  # noqa: E731
    inits = [numpy_helper.from_array(w(6, 4, 3, 3), "w1"), numpy_helper.from_array(w(6), "b1"),
             numpy_helper.from_array(np.float32(0.37), "lab_s"), numpy_helper.from_array(np.float32(-0.8), "lab_b"),
             numpy_helper.from_array(w(6, 6, 1, 1), "w2"),
             numpy_helper.from_array(RNG.uniform(0.5, 2.0, (6, 1, 1)).astype(np.float32), "div_c"),
             numpy_helper.from_array(w(1, 6, 1, 1), "sub_c"),
             numpy_helper.from_array(w(6, 6, 1, 1), "w3"), numpy_helper.from_array(w(6), "along_w_c"),
             numpy_helper.from_array(w(6, 6, 1, 1), "w_tied"), numpy_helper.from_array(w(6, 1, 1), "tied_c"),
             numpy_helper.from_array(np.array([1, 0, 2, 1, 1, 1], np.float32).reshape(6, 1, 1), "zero_c"),
             numpy_helper.from_array(w(6, 6, 1, 1), "w4"), numpy_helper.from_array(w(6, 6, 1, 1), "w5"),
             numpy_helper.from_array(w(1, 6, 1, 1), "fan_c"),
             numpy_helper.from_array(np.array([-1, 6], np.int64), "flat"),
             numpy_helper.from_array(w(5, 6), "wg"), numpy_helper.from_array(w(5), "bg"),
             numpy_helper.from_array(w(5), "gs")] + _bn_params(6, "bn")
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]), _bn("c1", "n1", "bn"),
             helper.make_node("Mul", ["lab_s", "n1"], ["m1"], name="lab_scale"),
             helper.make_node("Add", ["m1", "lab_b"], ["a1"], name="lab_shift"),
             helper.make_node("HardSwish", ["a1"], ["h1"]),
             helper.make_node("Conv", ["h1", "w2"], ["c2"], name="conv2"),
             helper.make_node("Div", ["c2", "div_c"], ["d2"], name="div_scale"),
             helper.make_node("Sub", ["d2", "sub_c"], ["s2"], name="sub_shift"),
             helper.make_node("Conv", ["s2", "w3"], ["c3"], name="conv3"),
             helper.make_node("Mul", ["c3", "along_w_c"], ["m3"], name="along_w"),
             helper.make_node("Conv", ["m3", "w_tied"], ["t1"], name="tied1"),
             helper.make_node("Mul", ["t1", "tied_c"], ["tm"], name="tied_scale"),
             helper.make_node("Conv", ["tm", "w_tied"], ["t2"], name="tied2"),
             helper.make_node("Conv", ["t2", "w4"], ["c4"], name="conv4"),
             helper.make_node("Div", ["c4", "zero_c"], ["z"], name="div_zero"),
             helper.make_node("Conv", ["t2", "w5"], ["c5"], name="conv5"),
             helper.make_node("Mul", ["c5", "fan_c"], ["m5"], name="fan_scale"),
             helper.make_node("Relu", ["m5"], ["r5"]), helper.make_node("Sigmoid", ["m5"], ["g5"]),
             helper.make_node("Mul", ["r5", "g5"], ["z2"], name="gate"),
             helper.make_node("GlobalAveragePool", ["t2"], ["gp"]), helper.make_node("Reshape", ["gp", "flat"], ["f"]),
             helper.make_node("Gemm", ["f", "wg", "bg"], ["g"], name="gemm", transB=1),
             helper.make_node("Mul", ["g", "gs"], ["y"], name="gemm_scale")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 4, 6, 6])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 5]),
                           helper.make_tensor_value_info("z", TensorProto.FLOAT, [None, 6, 6, 6]),
                           helper.make_tensor_value_info("z2", TensorProto.FLOAT, [None, 6, 6, 6])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


def test_a_scale_written_as_a_mul_folds_into_its_layer_exactly():
    """A Mul or Div by a per-channel constant after a Conv or a Gemm scales the layer's weight
    and bias, after the BatchNorm before it has folded (Conv, BN, Mul, Add: the four are one
    Conv); before, each stayed an op of its own, which the quantized model rounds to the grid
    once more (PP-OCRv4 rec XINT8, bench char accuracy: 55.97 -> 80.66). A Mul varying along
    another axis, one whose layer shares its weight, a Div by 0 and one whose output several
    nodes read stay, the last three saying why. The prepared model computes what the float one
    does."""
    m = _scale_model()
    prepared, rep = mixq.passes.prepare.prepare(m, equalize=False)
    assert (rep.scales_folded, rep.bias_adds_folded, rep.batchnorms_folded) == (3, 2, 1)
    left = sorted(n.name for n in prepared.graph.node if n.op_type in ("Mul", "Div", "Add", "Sub"))
    assert left == ["along_w", "div_zero", "fan_scale", "gate", "tied_scale"]
    declined = dict(next(p for p in rep.passes if p.name.startswith("fold Add / Mul")).declined)
    assert declined.pop("fan_scale").startswith("its output has several readers"), declined
    assert declined == {"tied_scale": "the Conv weight is shared with another node (or a subgraph)",
                        "div_zero": "it divides by 0 in some channel"}
    x = RNG.standard_normal((3, 4, 6, 6)).astype(np.float32)
    for got, want in zip(_run(prepared, x), _run(m, x)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    x8 = [{"x": RNG.standard_normal((2, 4, 6, 6)).astype(np.float32)} for _ in range(8)]
    res = mixq.quantize(m, "XINT8", x8)
    assert "| scales (Mul / Div by a constant) folded into their layer | 3 |" in res.summary()


@pytest.mark.parametrize("named,kept", [("bias_t", {"bias_t"}), ("bn", {"bn"}),
                                         ("bias_*", {"bias_t", "bias_scalar", "bias_g"})])
def test_a_node_the_config_names_is_not_folded_away(named, kept):
    """exclude_nodes naming a bias Add or a BatchNorm (by name, or by a pattern) keeps the node
    as written, and float: before, the fold removed it and the config was refused ("names node
    'bn', which matches no node of the model"), though the user's model has it. A bias Add kept
    leaves the BatchNorm after it unfolded too (fed by an Add)."""
    from mixq.passes.layer_fold import KEPT_REASON

    m = _bias_add_model()
    x8 = [{"x": RNG.standard_normal((2, 4, 6, 6)).astype(np.float32)} for _ in range(8)]
    res = mixq.quantize(m, mixq.get_default_config("A8W8").with_options(exclude_nodes={named}), x8)
    assert kept <= {n.name for n in res.model.graph.node}
    assert kept <= set(res.plan.float_nodes)
    assert res.prepare.batchnorms_folded == 0
    _, rep = mixq.passes.prepare.prepare(m, equalize=False, keep_nodes=[named])
    why = dict(next(p for p in rep.passes if p.name == "fold BatchNorm").declined)["bn"]
    assert why == KEPT_REASON if named == "bn" else why.startswith("fed by Add"), why


def test_a_written_out_layernorm_a_config_names_is_not_fused():
    """A node of a written-out LayerNorm named by the config keeps the LayerNorm as written (the
    fusion declined, saying why), so that exclude_nodes still finds the node."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from bench.class_sweep import decomposed_ln

    m, _ = decomposed_ln()
    _, rep = mixq.passes.prepare.prepare(m, equalize=False)
    assert rep.recognized.counts().get("LayerNormalization")
    named = next(n.name for n in m.graph.node if n.op_type == "ReduceMean")
    _, rep = mixq.passes.prepare.prepare(m, equalize=False, keep_nodes=[named])
    assert not rep.recognized.counts().get("LayerNormalization")
    assert any(named in d.reason for d in rep.recognized.declined), rep.recognized.declined


def test_an_exclude_nodes_pattern_excludes_what_it_matches():
    """The names check accepts an fnmatch pattern in exclude_nodes that matches a node; before,
    the plan compared names exactly and the pattern excluded nothing (the Conv was quantized)."""
    x = [{"x": RNG.standard_normal((2, 3, 12, 12)).astype(np.float32)} for _ in range(4)]
    res = mixq.quantize(_pad_conv(), mixq.get_default_config("A8W8").with_options(exclude_nodes={"con*"}), x)
    assert "conv" in res.plan.float_nodes and res.rewrite.weights_quantized == 0


@pytest.mark.parametrize("opset", [18, 20])
def test_a_deprecated_group_normalization_is_expanded_and_fused_back(opset):
    """GroupNormalization-18 (scale and bias per group) is deprecated by ONNX: the checker
    refuses the model (mixq used to stop there, telling the user to re-export), the opset
    converter has no adapter for it, but onnxruntime runs it. Prepare writes it as the ops it
    computes and fuses those into GroupNormalization-21 with per-channel parameters: the same
    outputs, and every preset quantizes it."""
    rng = np.random.default_rng(opset)
    c, groups = 8, 4
    inits = [numpy_helper.from_array(rng.normal(0, 0.3, (c, 3, 3, 3)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.uniform(0.5, 2, groups).astype(np.float32), "scale"),
             numpy_helper.from_array(rng.normal(0, 1, groups).astype(np.float32), "bias")]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("GroupNormalization", ["c", "scale", "bias"], ["gn"], num_groups=groups, epsilon=1e-3),
             helper.make_node("Relu", ["gn"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 6, 6])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", c, 6, 6])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=9)
    with pytest.raises(onnx.checker.ValidationError, match="deprecated"):
        onnx.checker.check_model(m)
    feeds = [{"x": rng.normal(0, 1, (2, 3, 6, 6)).astype(np.float32)} for _ in range(4)]
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds[0])[0]
    pipe = mixq.pipeline.Pipeline.load(m)
    assert [n.op_type for n in pipe.model.graph.node] == ["Conv", "GroupNormalization"] + ["Relu"]
    got = ort.InferenceSession(pipe.model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds[0])[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    assert any("deprecated" in n for n in pipe.prepare_report.notes)
    res = mixq.quantize(m, "A8W8", feeds, check_kernels=False)
    q = session(res.model, RUNTIME).run(None, feeds[0])[0]
    assert 10 * np.log10(np.sum(want ** 2) / np.sum((want - q) ** 2)) > 25
