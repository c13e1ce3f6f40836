"""Hostile model files and graphs: every case ends in a model that passes the checker and runs
in onnxruntime, or in a MixqError naming the problem; the input file is never modified."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import mixq
from mixq.check import check_model_support
from mixq.errors import ModelError

from . import models as M
from .conftest import outcome

VALID = M.mlp(17)
VALID_BYTES = VALID.SerializeToString()
FEEDS = M.feeds(VALID, 3)


# ---------------------------------------------------------------------------- not ONNX at all
NOT_ONNX = {
    "empty": b"",
    "text": b"hello, this is not a model\n",
    "json": b'{"graph": {"node": []}}',
    "zip": b"PK\x03\x04" + bytes(60),
    "png": b"\x89PNG\r\n\x1a\n" + bytes(40),
    "one_byte": b"\x08",
    "zeros_1k": bytes(1024),
    "ff_1k": b"\xff" * 1024,
    "onnx_text_format": b'<ir_version: 8, opset_import: ["" : 17]>\nagraph (float[N] x) => (float[N] y) { y = Relu(x) }',
    "tensor_proto": numpy_helper.from_array(np.ones(4, np.float32), "t").SerializeToString(),
    "graph_proto": VALID.graph.SerializeToString(),
    "node_proto": helper.make_node("Relu", ["x"], ["y"]).SerializeToString(),
    "random_a": np.random.default_rng(1).bytes(300),
    "random_b": np.random.default_rng(2).bytes(5000),
    "model_twice": VALID_BYTES + VALID_BYTES[:50],
}


@pytest.mark.parametrize("name", sorted(NOT_ONNX))
def test_not_onnx_bytes_as_file(name, tmp_path):
    p = tmp_path / "m.onnx"
    p.write_bytes(NOT_ONNX[name])
    outcome(lambda: mixq.quantize(p, "A8W8", FEEDS, output_path=tmp_path / "o.onnx"),
            input_path=p, output_path=tmp_path / "o.onnx", feed=FEEDS[0])


@pytest.mark.parametrize("name", ["empty", "text", "zeros_1k", "random_a", "tensor_proto"])
def test_not_onnx_bytes_in_memory(name):
    res = outcome(lambda: mixq.quantize(NOT_ONNX[name], "A8W8", FEEDS), feed=FEEDS[0])
    assert isinstance(res, ModelError)


@pytest.mark.parametrize("frac", [0.0001, 0.01, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8,
                                  0.9, 0.95, 0.99, 0.999])
def test_truncated_model(frac, tmp_path):
    p = tmp_path / "m.onnx"
    p.write_bytes(VALID_BYTES[:max(1, int(len(VALID_BYTES) * frac))])
    outcome(lambda: mixq.quantize(p, "A8W8", FEEDS, output_path=tmp_path / "o.onnx"),
            input_path=p, output_path=tmp_path / "o.onnx", feed=FEEDS[0])



@pytest.mark.parametrize("name", [b"mm1", b"add1", b"relu", b"softmax"])
def test_node_name_that_is_not_utf8(name, tmp_path):
    """The fuzz target flipped a node name's first byte (0x6d -> 0xed): Python's protobuf hands
    such a name back as bytes and writing it back raised a raw UnicodeDecodeError."""
    i = VALID_BYTES.index(name)
    p = tmp_path / "m.onnx"
    p.write_bytes(VALID_BYTES[:i] + bytes([name[0] | 0x80]) + VALID_BYTES[i + 1:])
    with pytest.raises(ModelError, match=r"node\[\d\]\.name is not valid UTF-8.*re-export"):
        mixq.quantize(p, "A8W8", FEEDS, output_path=tmp_path / "o.onnx")
    assert not (tmp_path / "o.onnx").exists()

@pytest.mark.parametrize("preset", ["A8W8", "BF16", "MXINT8"])
def test_a_model_without_outputs_is_a_clear_error(preset, tmp_path):
    """The fuzz target deleted the graph's one output: the checker and onnxruntime accept such a
    model, and the rounding check stopped with onnxruntime's raw "At least one output should
    be requested"."""
    m = onnx.ModelProto()
    m.CopyFrom(VALID)
    del m.graph.output[:]
    p = tmp_path / "m.onnx"
    onnx.save(m, p)
    with pytest.raises(ModelError, match="declares no graph outputs.*Declare the tensors it returns"):
        mixq.quantize(p, preset, FEEDS, output_path=tmp_path / "o.onnx")
    assert not (tmp_path / "o.onnx").exists()
    if preset == "BF16":  # the converter said "give input shapes with --shape" to onnxruntime's error
        from mixq.convert import to_bf16

        with pytest.raises(ModelError, match="declares no graph outputs.*convert again"):
            to_bf16(p, "with_cast")


@pytest.mark.parametrize("where", ["input", "output", "initializer"])
def test_an_element_type_onnx_does_not_define_is_a_clear_error(where, tmp_path):
    """The fuzz target set the input's elem_type to 33: the checker lets the code through, and
    calibration's message naming the type raised protobuf's raw "Enum DataType has no name
    defined for value 33"."""
    m = onnx.ModelProto()
    m.CopyFrom(VALID)
    if where == "initializer":
        m.graph.initializer[0].data_type = 33
    else:
        getattr(m.graph, where)[0].type.tensor_type.elem_type = 33
    p = tmp_path / "m.onnx"
    onnx.save(m, p)
    name = m.graph.initializer[0].name if where == "initializer" else getattr(m.graph, where)[0].name
    with pytest.raises(ModelError, match=f"graph {where} '{name}' has element type 33, which onnx .* does "
                                         "not define.*quantize again"):
        mixq.quantize(p, "A8W8", FEEDS, output_path=tmp_path / "o.onnx")
    assert not (tmp_path / "o.onnx").exists()
    from mixq.convert import to_bf16

    with pytest.raises(ModelError, match="has element type 33.*convert again"):
        to_bf16(p, "with_cast")


@pytest.mark.parametrize("seed", range(25))
def test_bit_flipped_model(seed, tmp_path):
    rng = np.random.default_rng(seed)
    b = bytearray(VALID_BYTES)
    for _ in range(1 + seed % 4):
        i = int(rng.integers(len(b)))
        b[i] ^= 1 << int(rng.integers(8))
    p = tmp_path / "m.onnx"
    p.write_bytes(bytes(b))
    outcome(lambda: mixq.quantize(p, "A8W8", FEEDS, output_path=tmp_path / "o.onnx"),
            input_path=p, output_path=tmp_path / "o.onnx", feed=FEEDS[0])


# ---------------------------------------------------------------------------- checker failures
def _broken(kind: str) -> onnx.ModelProto:
    m = M.mlp(17)
    g = m.graph
    if kind == "dangling_input":
        g.node[2].input[0] = "nowhere"
    elif kind == "duplicate_output":
        g.node[1].output[0] = "h"
    elif kind == "unsorted_nodes":
        nodes = list(g.node)
        del g.node[:]
        g.node.extend(reversed(nodes))
    elif kind == "opset_99":
        m.opset_import[0].version = 99
    elif kind == "no_opset_import":
        del m.opset_import[:]
    elif kind == "unknown_default_op":
        g.node[2].op_type = "NotARealOp"
    elif kind == "output_never_produced":
        g.output[0].name = "ghost"
    elif kind == "ir_version_0":
        m.ir_version = 0
    elif kind == "ir_version_huge":
        m.ir_version = 99
    elif kind == "bad_attribute":
        g.node[4].attribute[0].type = onnx.AttributeProto.STRING
    elif kind == "missing_required_attr":
        g.node.append(helper.make_node("Concat", ["y", "y"], ["yy"], name="cat_no_axis"))
        g.output.append(helper.make_tensor_value_info("yy", TensorProto.FLOAT, None))
    elif kind == "initializer_bad_dims":
        t = g.initializer[0]
        t.dims[0] = 999
    elif kind == "empty_graph":
        del g.node[:]
        del g.output[:]
        del g.input[:]
        del g.initializer[:]
    elif kind == "input_type_undefined":
        g.input[0].type.tensor_type.elem_type = 0
    elif kind == "duplicate_initializer":
        g.initializer.append(g.initializer[0])
    return m


BROKEN = ["dangling_input", "duplicate_output", "unsorted_nodes", "opset_99", "no_opset_import",
          "unknown_default_op", "output_never_produced", "ir_version_0", "ir_version_huge",
          "bad_attribute", "missing_required_attr", "initializer_bad_dims", "empty_graph",
          "input_type_undefined", "duplicate_initializer"]


@pytest.mark.parametrize("kind", BROKEN)
def test_model_failing_checker(kind, saved, tmp_path):
    p = saved(_broken(kind))
    res = outcome(lambda: mixq.quantize(p, "A8W8", FEEDS, output_path=tmp_path / "o.onnx"),
                  input_path=p, output_path=tmp_path / "o.onnx", feed=FEEDS[0])
    assert isinstance(res, ModelError), f"{kind}: expected a ModelError, got {res!r}"


@pytest.mark.parametrize("kind", ["dangling_input", "duplicate_output", "unsorted_nodes"])
def test_checker_message_names_the_problem(kind, saved):
    p = saved(_broken(kind))
    res = outcome(lambda: mixq.quantize(p, "A8W8", FEEDS), input_path=p)
    msg = str(res)
    assert "checker" in msg and "re-export" in msg
    assert {"dangling_input": "nowhere", "duplicate_output": "'h'", "unsorted_nodes": "sorted"}[kind] in msg


# ---------------------------------------------------------------- inputs and outputs without a shape
def _shapeless_output(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` with its output declared by type only (what onnx.helper.make_tensor_value_info
    with shape=None writes, as graph-editing tools do): ONNX requires a shape, onnxruntime runs it."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    o = m.graph.output[0]
    o.type.tensor_type.ClearField("shape")
    return m


@pytest.mark.parametrize("preset", ["A8W8", "BF16", "BFP16"])
def test_an_output_without_a_shape_is_declared_as_computed(preset, saved, tmp_path):
    """Before, every preset refused such a model as failing the ONNX checker; now prepare
    declares the shape inference computes, says so, and the output passes the checker."""
    m = _shapeless_output(VALID)
    p = saved(m)
    out = tmp_path / "o.onnx"
    res = outcome(lambda: mixq.quantize(p, preset, FEEDS, output_path=out), input_path=p, output_path=out,
                  feed=FEEDS[0])
    assert not isinstance(res, Exception), res
    assert any("declared no shape" in n and "'y'" in n for n in res.prepare.notes), res.prepare.notes
    onnx.checker.check_model(onnx.load(out), full_check=True)
    assert [d.dim_value or d.dim_param for d in onnx.load(out).graph.output[0].type.tensor_type.shape.dim][1] == 8
    rep = check_model_support(m)
    assert rep.ok and rep.checker.startswith("ok once 1 output"), (rep.checker, rep.problems)


def test_an_output_whose_shape_cannot_be_inferred_is_named():
    """Reshape to a target fed at run time: inference cannot tell the output's rank."""
    m = _shapeless_output(VALID)
    g = m.graph
    y = g.output[0].name
    for n in g.node:
        n.output[:] = [f"{o}_pre" if o == y else o for o in n.output]
    g.node.append(helper.make_node("Reshape", [f"{y}_pre", "target"], [y], name="reshape_rt"))
    g.input.append(helper.make_tensor_value_info("target", TensorProto.INT64, ["K"]))
    with pytest.raises(ModelError, match=r"graph output 'y' declares no shape.*cannot compute it.*make_tensor_value_info"):
        mixq.quantize(m, "A8W8", [{**f, "target": np.array([-1, 8], np.int64)} for f in FEEDS])


def test_an_input_without_a_shape_is_named():
    m = onnx.ModelProto()
    m.CopyFrom(VALID)
    m.graph.input[0].type.tensor_type.ClearField("shape")
    with pytest.raises(ModelError, match=r"graph input 'x' declares no shape"):
        mixq.quantize(m, "A8W8", FEEDS)


def test_a_shapeless_output_does_not_hide_the_checkers_real_problem():
    """A Concat without its required axis, feeding an output declared without a shape: the
    error names the checker's problem, not the shape (inference fails on the Concat too)."""
    m = _broken("missing_required_attr")
    with pytest.raises(ModelError, match="fails the ONNX checker.*axis"):
        mixq.quantize(m, "A8W8", FEEDS)


# ---------------------------------------------------------------------------- opsets
@pytest.mark.parametrize("opset", list(range(11, onnx.defs.onnx_opset_version() + 1)))
def test_every_opset(opset, saved, tmp_path):
    m = M.mlp(opset)
    p = saved(m)
    fd = M.feeds(m, 3)
    res = outcome(lambda: mixq.quantize(p, "A8W8", fd, output_path=tmp_path / "o.onnx"),
                  input_path=p, output_path=tmp_path / "o.onnx", feed=fd[0])
    assert not isinstance(res, Exception), res
    assert res.rewrite.weights_quantized == 3  # w1, the Add constant b1, w2
    if opset > mixq.passes.prepare.MAX_RUNTIME_OPSET:
        assert any("converted down" in n for n in res.prepare.notes)


def _model_zoo_classic(opset: int) -> onnx.ModelProto:
    """A CNN as the ONNX Model Zoo's oldest files hold one: IR version 3, every initializer also
    listed as a graph input, Conv + BatchNormalization + Dropout, Upsample (opset < 10), Gemm."""
    rng = np.random.default_rng(0)
    arrays = {"c1": rng.normal(0, 0.3, (8, 3, 3, 3)), "b1": rng.normal(0, 0.1, 8), "g": np.ones(8),
              "be": np.zeros(8), "mu": np.zeros(8), "var": np.ones(8), "scales": np.array([1, 1, 2, 2]),
              "fc": rng.normal(0, 0.05, (10, 8 * 16 * 16)), "fb": rng.normal(0, 0.1, 10)}
    inits = [numpy_helper.from_array(np.asarray(a, np.float32), k) for k, a in arrays.items()]
    up = (helper.make_node("Upsample", ["p", "scales"], ["u"], mode="nearest") if opset >= 9 else
          helper.make_node("Upsample", ["p"], ["u"], mode="nearest", scales=[1.0, 1.0, 2.0, 2.0]))
    nodes = [helper.make_node("Conv", ["x", "c1", "b1"], ["a"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["a", "g", "be", "mu", "var"], ["bn"], epsilon=1e-5),
             helper.make_node("Relu", ["bn"], ["r"]), helper.make_node("Dropout", ["r"], ["d"]),
             helper.make_node("MaxPool", ["d"], ["p"], kernel_shape=[2, 2], strides=[2, 2]), up,
             helper.make_node("Flatten", ["u"], ["f"]), helper.make_node("Gemm", ["f", "fc", "fb"], ["y"], transB=1)]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])] + [
        helper.make_tensor_value_info(t.name, TensorProto.FLOAT, list(t.dims)) for t in inits]
    g = helper.make_graph(nodes, "zoo", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 3
    return m


@pytest.mark.parametrize("preset", ["A8W8", "BFP16"])
@pytest.mark.parametrize("opset", [7, 8, 9])
def test_ir3_models_whose_initializers_are_inputs(opset, preset, tmp_path):
    """Before, the BatchNorm fold and the opset conversion replaced initializers and left their
    graph-input entries behind, so calibration asked the data to feed 'b1', 'g', 'be', ...;
    the shadowing inputs are now dropped first (and the IR version raised to 4, the first that
    allows it, since the opset converter reads IR 3 initializers through the inputs)."""
    m = _model_zoo_classic(opset)
    onnx.checker.check_model(m)
    rng = np.random.default_rng(1)
    feeds = [{"x": rng.standard_normal((1, 3, 16, 16)).astype(np.float32)} for _ in range(16)]
    out = tmp_path / "q.onnx"
    res = mixq.quantize(m, preset, feeds, output_path=out)
    assert any("initializers were also listed as graph inputs" in n for n in res.prepare.notes)
    import onnxruntime as ort

    q = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    assert [i.name for i in q.get_inputs()] == ["x"]
    f = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    ref, got = f.run(None, feeds[0])[0], q.run(None, feeds[0])[0]
    assert float(np.sum(ref * got) / np.linalg.norm(ref) / np.linalg.norm(got)) > 0.99


@pytest.mark.parametrize("preset", ["A8W8", "BF16"])
@pytest.mark.parametrize("opset", [6, 9])
def test_ir3_models_with_constant_nodes(opset, preset):
    """An IR 3 model without initializers, its constants in Constant nodes (onnx's own
    pytorch-operator test models: Add with broadcast=1, Gemm, Tile). The Constants become
    initializers that no graph input lists, and the opset converter, which reads IR 3
    initializers through the inputs, refused the model ("Input 1 is undefined!") for every
    preset; the IR version is now raised to 4 with the move."""
    rng = np.random.default_rng(0)
    c = numpy_helper.from_array(rng.normal(0, 1, (4,)).astype(np.float32), "c")
    w = numpy_helper.from_array(rng.normal(0, 0.5, (4, 3)).astype(np.float32), "w")
    add = (helper.make_node("Add", ["x", "cv"], ["a"], broadcast=1) if opset < 7 else
           helper.make_node("Add", ["x", "cv"], ["a"]))
    nodes = [helper.make_node("Constant", [], ["cv"], value=c), helper.make_node("Constant", [], ["wv"], value=w),
             add, helper.make_node("Relu", ["a"], ["r"]), helper.make_node("MatMul", ["r", "wv"], ["y"])]
    g = helper.make_graph(nodes, "ir3", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 3
    onnx.checker.check_model(m)
    feeds = [{"x": rng.standard_normal((2, 4)).astype(np.float32)} for _ in range(8)]
    res = mixq.quantize(m, preset, feeds)
    import onnxruntime as ort

    got = ort.InferenceSession(res.model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds[0])[0]
    ref = np.maximum(feeds[0]["x"] + numpy_helper.to_array(c), 0) @ numpy_helper.to_array(w)
    assert np.allclose(got, ref, rtol=0.05, atol=0.05 * float(np.abs(ref).max())), (got, ref)


@pytest.mark.parametrize("preset", ["A8W8", "BF16"])
def test_a_model_of_onnx_ml_ops_only_is_written_unchanged_and_said(preset):
    """A scikit-learn export (onnxruntime's logreg_iris.onnx: LinearClassifier, Normalizer,
    ZipMap) imports no default-domain opset: the opset upgrade failed on "opset 0" with the
    converter's assertion. Nothing there is quantizable: the model is written as it computes,
    and the summary says nothing was quantized."""
    node = helper.make_node("LinearRegressor", ["x"], ["y"], domain="ai.onnx.ml",
                            coefficients=[0.5, -1.0, 2.0], intercepts=[0.25])
    g = helper.make_graph([node], "skl", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 1])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("ai.onnx.ml", 1)], ir_version=8)
    onnx.checker.check_model(m)
    feeds = [{"x": np.random.default_rng(k).normal(0, 1, (4, 3)).astype(np.float32)} for k in range(4)]
    res = mixq.quantize(m, preset, feeds)
    assert "nothing was quantized" in res.summary()
    assert "ONNX-ML op 'ai.onnx.ml.LinearRegressor' is not in mixq's op table" in res.summary()
    import onnxruntime as ort

    got = ort.InferenceSession(res.model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds[0])[0]
    assert np.allclose(got[:, 0], feeds[0]["x"] @ np.array([0.5, -1.0, 2.0], np.float32) + 0.25, atol=1e-5)


@pytest.mark.parametrize("opset", [11, 13, 17, 21])
def test_seq_block_opsets(opset):
    m = M.seq_block(opset)
    fd = M.feeds(m, 4)
    res = outcome(lambda: mixq.quantize(m, "A8W8", fd), feed=fd[0])
    assert res.rewrite.weights_quantized >= 4


# ---------------------------------------------------------------------------- ops mixq leaves float
@pytest.mark.parametrize("op", M.UNSUPPORTED_OPS)
def test_unsupported_op_left_float_with_reason(op):
    m = M.unsupported_op_model(op)
    fd = M.feeds(m, 3)
    res = outcome(lambda: mixq.quantize(m, "A8W8", fd), feed=fd[0])
    assert "odd" in res.plan.float_nodes and op in res.plan.float_nodes["odd"]
    assert res.rewrite.weights_quantized == 2


@pytest.mark.parametrize("preset", ["A8W8", "BF16", "MXFP4"])
def test_custom_domain_ops_left_float(preset):
    m = M.custom_function_model()
    fd = M.feeds(m, 3)
    res = outcome(lambda: mixq.quantize(m, preset, fd), feed=fd[0])
    assert "custom-domain" in res.plan.float_nodes["custom"]
    assert res.rewrite.weights_quantized == 2


@pytest.mark.parametrize("preset", ["A8W8", "BF16", "MXFP4"])
def test_an_onnxruntime_contrib_op_is_expanded(preset):
    """com.microsoft.Gelu between two MatMuls is the standard Gelu once prepared
    (mixq.passes.unfuse): planned like any op, not left float as a custom-domain one."""
    m = M.contrib_op_model()
    fd = M.feeds(m, 3)
    res = outcome(lambda: mixq.quantize(m, preset, fd), feed=fd[0])
    assert "ms_gelu" not in res.plan.float_nodes
    assert not [n for n in res.model.graph.node if n.domain == "com.microsoft"]
    assert res.prepare.ort_ops_expanded == 1
    assert res.rewrite.weights_quantized == 2


@pytest.mark.parametrize("preset", ["A8W8", "MXFP4"])
def test_custom_function_whose_ops_change_across_an_opset_upgrade(preset):
    """A local function at opset 21 using Reshape (changed in opset 25): a block format moves
    the model to opset 26, so the function is inlined and converted with the graph; one whose
    ops do not change keeps its node (custom_function_model above)."""
    m = M.custom_function_model()
    fn = m.functions[0]
    del fn.node[:]
    fn.node.extend([helper.make_node("Constant", [], ["shp"], value=numpy_helper.from_array(
                        np.array([-1, M.D], np.int64), "shp")),
                    helper.make_node("Reshape", ["a", "shp"], ["r"]),
                    helper.make_node("Sigmoid", ["r"], ["sa"]),
                    helper.make_node("Mul", ["r", "sa"], ["b"])])
    fd = M.feeds(m, 3)
    res = outcome(lambda: mixq.quantize(m, preset, fd), feed=fd[0])
    kept = [n for n in res.model.graph.node if n.domain == "my.domain"]
    assert bool(kept) == (preset == "A8W8")  # opset 21 needs no upgrade: the call stays
    for f in res.model.functions:
        assert all(i.version == 26 for i in f.opset_import if i.domain == "") or preset == "A8W8"


def test_unknown_custom_op_with_calibration_is_a_clear_error():
    m = M.unknown_domain_model()
    res = outcome(lambda: mixq.quantize(m, "A8W8", M.feeds(m, 2)), expect_error=ModelError,
                  match="acme.ops.FancyAct.*custom op library")
    assert "BF16" in str(res)


def test_a_file_onnxruntime_refuses_is_named_as_the_users(tmp_path):
    """An exported model onnxruntime cannot load (a Clip of an int64 tensor with float bounds,
    what torch writes for DeBERTa-v2 at opset 11): the error says the file as given does not
    load, before mixq changes anything, rather than that mixq's calibration copy does not."""
    nodes = [helper.make_node("Cast", ["x"], ["xi"], to=onnx.TensorProto.INT64),
             helper.make_node("Clip", ["xi", "lo", "hi"], ["ci"]),
             helper.make_node("Cast", ["ci"], ["cf"], to=onnx.TensorProto.FLOAT),
             helper.make_node("MatMul", ["cf", "w"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 4])],
                          [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 3])],
                          [numpy_helper.from_array(np.array(-2, np.float32), "lo"),
                           numpy_helper.from_array(np.array(2, np.float32), "hi"),
                           numpy_helper.from_array(np.ones((4, 3), np.float32), "w")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 11)], ir_version=7)
    path = tmp_path / "bad.onnx"
    onnx.save(m, path)
    feeds = [{"x": np.random.default_rng(0).normal(0, 3, (2, 4)).astype(np.float32)}]
    with pytest.raises(ModelError, match="does not load in onnxruntime as given, before mixq"):
        mixq.quantize(str(path), "A8W8", feeds)


def test_a_file_onnxruntime_refuses_whose_converted_copy_fails_on_the_data_is_named(tmp_path):
    """onnx's opset-6 PRelu test model: onnxruntime has no PRelu-6 kernel, so the file does not
    load as given; onnx's converter carries its per-channel slope (C,) to opset 21 unchanged,
    where it broadcasts over the last axis, and calibration failed with a DataError on "batch 0",
    as if the data were wrong. The error now names the user's file and why it does not load,
    then what the converted copy did."""
    slope = numpy_helper.from_array(np.array([0.1, 0.2, 0.3], np.float32), "s")
    g = helper.make_graph([helper.make_node("PRelu", ["x", "s"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4]),
                           helper.make_tensor_value_info("s", TensorProto.FLOAT, [3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, 4])], [slope])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 6)])
    m.ir_version = 3
    path = tmp_path / "prelu6.onnx"
    onnx.save(m, path)
    feeds = [{"x": np.random.default_rng(k).normal(0, 1, (2, 3, 4)).astype(np.float32)} for k in range(4)]
    with pytest.raises(ModelError, match=r"prelu6.onnx does not load in onnxruntime as given.*PRelu.*"
                                         r"opset 6 -> 21\) then failed on the data: onnxruntime failed on "
                                         r"calibration batch 0"):
        mixq.quantize(str(path), "A8W8", feeds)


@pytest.mark.parametrize("preset", ["A8W8", "BFP16", "MXFP4"])
def test_a_model_onnxruntime_cannot_run_is_a_data_error_for_every_preset(tmp_path, preset):
    """A model that loads and then fails when onnxruntime runs it (a dilated Conv with
    auto_pad=SAME_UPPER, which onnxruntime's Conv refuses at run time): the integer presets stop
    at the first calibration batch, the block presets (no calibration pass) at the guard's first
    sample, each with a DataError naming the input shapes; before, the block presets raised
    onnxruntime's raw InvalidArgument from the guard."""
    w = numpy_helper.from_array(np.random.default_rng(0).normal(0, 0.3, (4, 2, 3)).astype(np.float32), "w")
    g = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"], auto_pad="SAME_UPPER", dilations=[2], group=2)],
                          "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4, 20])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4, 20])], [w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    feeds = [{"x": np.random.default_rng(k).normal(0, 1, (1, 4, 20)).astype(np.float32)} for k in range(8)]
    out = tmp_path / "q.onnx"
    with pytest.raises(mixq.errors.DataError, match=r"onnxruntime failed .*input shapes x: \(1, 4, 20\)"):
        mixq.quantize(m, preset, feeds, output_path=out)
    assert not out.exists()


def test_unknown_custom_op_bf16_with_calibration_data_still_converts():
    """BF16 needs no calibration; given data it checks its casts' range in onnxruntime, which
    cannot run a custom op: the check is skipped and the summary says so (not an error that
    names BF16 as the way out)."""
    m = M.unknown_domain_model()
    res = outcome(lambda: mixq.quantize(m, "BF16", M.feeds(m, 2)), runs=False)
    assert res.rewrite.activations_quantized > 0
    assert "custom op library" in res.skipped["bf16/fp16 casts"]
    assert "not calibrated: bf16/fp16 casts" in res.summary()


@pytest.mark.parametrize("preset", ["BF16", "MXFP4", "MX6"])
def test_unknown_custom_op_without_calibration_warns(preset):
    m = M.unknown_domain_model()
    res = outcome(lambda: mixq.quantize(m, preset, None), runs=False)
    onnx.checker.check_model(res.model)
    assert any("acme.ops.FancyAct" in w for w in res.warnings)
    assert "fancy" in res.plan.float_nodes


# ---------------------------------------------------------------------------- control flow
@pytest.mark.parametrize("preset", ["A8W8", "A16W8", "BF16", "MXFP4"])
@pytest.mark.parametrize("builder,node", [(M.if_model, "if"), (M.loop_model, "loop")])
def test_control_flow_left_float_outside_quantized(builder, node, preset):
    m = builder()
    fd = M.feeds(m, 4)
    res = outcome(lambda: mixq.quantize(m, preset, fd), feed=fd[0])
    assert "control flow" in res.plan.float_nodes[node]
    assert res.rewrite.weights_quantized == 2  # mm1 and mm2, outside the subgraph
    q = next(n for n in res.model.graph.node if n.op_type == node.capitalize())
    sub = [a.g for a in q.attribute if a.type == onnx.AttributeProto.GRAPH]
    orig = next(n for n in m.graph.node if n.op_type == node.capitalize())
    assert [list(a.g.node) for a in orig.attribute if a.type == onnx.AttributeProto.GRAPH] == [list(g.node) for g in sub]


# ---------------------------------------------------------------------------- tensors of other types
@pytest.mark.parametrize("preset", ["A8W8", "U8S8", "BF16", "MXFP4", "MXINT8"])
@pytest.mark.parametrize("builder", [M.int_chain, M.with_string, M.zero_size_model])
def test_non_float_and_empty_tensors(builder, preset):
    m = builder()
    fd = M.feeds(m, 4)
    res = outcome(lambda: mixq.quantize(m, preset, fd), feed=fd[0])
    assert not isinstance(res, Exception), res
    assert res.rewrite.weights_quantized >= 1


# ---------------------------------------------------------------------------- every preset, dynamic dims
@pytest.mark.parametrize("preset", sorted(mixq.config.PRESETS) if hasattr(mixq.config, "PRESETS") else
                         ["XINT8", "A8W8", "A16W8", "U8S8", "S16S16", "BF16", "FP16", "BFP16",
                          "MXINT8", "MXFP8_E4M3", "MXFP8_E5M2", "MXFP6_E3M2", "MXFP6_E2M3",
                          "MXFP4", "MX4", "MX6", "MX9"])
def test_every_preset_on_dynamic_seq_block(preset, saved, tmp_path):
    m = M.seq_block()
    p = saved(m)
    fd = M.feeds(m, 4)
    res = outcome(lambda: mixq.quantize(p, preset, fd, output_path=tmp_path / "o.onnx"),
                  input_path=p, output_path=tmp_path / "o.onnx", feed=fd[0])
    assert not isinstance(res, Exception), res
    import onnxruntime as ort

    sess = ort.InferenceSession(res.model.SerializeToString(), providers=["CPUExecutionProvider"])
    for n, s in [(1, 1), (2, 7), (3, 33)]:  # any batch and sequence length
        x = np.random.default_rng(n).standard_normal((n, s, M.D)).astype(np.float32)
        assert sess.run(None, {"x": x})[0].shape == (n, s, M.D)
