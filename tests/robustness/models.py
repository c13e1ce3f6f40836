"""Small hostile-but-valid models built with onnx.helper for the robustness suite.

Every builder returns a checked ModelProto and `feeds(model, n)` makes matching calibration feeds
(dynamic dims get a size that varies from feed to feed)."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

D = 16  # feature width of the small models


def _w(rng, *shape, scale=0.3):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def _model(nodes, name, inputs, outputs, inits, opset=21, ir=None, extra_opsets=(), functions=()):
    g = helper.make_graph(nodes, name, inputs, outputs, inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset), *extra_opsets],
                          functions=list(functions))
    m.ir_version = ir if ir is not None else _ir_for(opset)
    return m


def _ir_for(opset: int) -> int:
    # the IR version the opset was released with (onnxruntime 1.31 reads up to 11)
    table = {11: 6, 12: 7, 13: 7, 14: 7, 15: 8, 16: 8, 17: 8, 18: 8, 19: 9, 20: 9, 21: 10}
    return table.get(opset, 10)


def _vi(name, shape, et=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, et, shape)


def mlp(opset: int = 21, seed: int = 0, batch="N") -> onnx.ModelProto:
    """x[N, 16] -> MatMul -> Add -> Relu -> Gemm -> Softmax -> y[N, 8]."""
    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array(_w(rng, D, 32), "w1"), numpy_helper.from_array(_w(rng, 32), "b1"),
             numpy_helper.from_array(_w(rng, 32, 8), "w2"), numpy_helper.from_array(_w(rng, 8), "b2")]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"),
             helper.make_node("Add", ["h", "b1"], ["hb"], name="add1"),
             helper.make_node("Relu", ["hb"], ["r"], name="relu"),
             helper.make_node("Gemm", ["r", "w2", "b2"], ["z"], name="fc"),
             helper.make_node("Softmax", ["z"], ["y"], axis=1, name="softmax")]
    return _model(nodes, "mlp", [_vi("x", [batch, D])], [_vi("y", [batch, 8])], inits, opset)


def seq_block(opset: int = 21, seed: int = 0, with_layernorm: bool = True) -> onnx.ModelProto:
    """A transformer-like block on x[N, S, 16] (N and S dynamic): LayerNorm, single-head
    attention (MatMul Q/K/V, Transpose, MatMul, Softmax, MatMul), output MatMul, residual Add."""
    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array(_w(rng, D, D), n) for n in ("wq", "wk", "wv", "wo")]
    inits += [numpy_helper.from_array(np.ones(D, np.float32), "ln_g"),
              numpy_helper.from_array(np.zeros(D, np.float32), "ln_b"),
              numpy_helper.from_array(np.array(0.25, np.float32), "inv_sqrt_d")]
    nodes = []
    src = "x"
    if with_layernorm and opset >= 17:
        nodes.append(helper.make_node("LayerNormalization", ["x", "ln_g", "ln_b"], ["ln"], axis=-1, name="ln"))
        src = "ln"
    nodes += [helper.make_node("MatMul", [src, "wq"], ["q"], name="q"),
              helper.make_node("MatMul", [src, "wk"], ["k"], name="k"),
              helper.make_node("MatMul", [src, "wv"], ["v"], name="v"),
              helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1], name="kt"),
              helper.make_node("MatMul", ["q", "kt"], ["s"], name="qk"),
              helper.make_node("Mul", ["s", "inv_sqrt_d"], ["ss"], name="scale"),
              helper.make_node("Softmax", ["ss"], ["p"], axis=-1, name="softmax"),
              helper.make_node("MatMul", ["p", "v"], ["a"], name="pv"),
              helper.make_node("MatMul", ["a", "wo"], ["o"], name="o"),
              helper.make_node("Add", ["o", "x"], ["y"], name="residual")]
    return _model(nodes, "seq_block", [_vi("x", ["N", "S", D])], [_vi("y", ["N", "S", D])], inits, opset)


def int_chain(seed: int = 0) -> onnx.ModelProto:
    """int64/bool tensors on the way: Shape -> Gather -> Cast -> Equal -> Where around a MatMul,
    plus a Reshape driven by a computed shape (x[N, S, 16])."""
    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array(_w(rng, D, D), "w"),
             numpy_helper.from_array(np.array(1, np.int64), "one"),
             numpy_helper.from_array(np.array([-1, D], np.int64), "flat_shape"),
             numpy_helper.from_array(np.array(0.0, np.float32), "zero"),
             numpy_helper.from_array(np.array(0, np.int64), "zero_i")]
    nodes = [helper.make_node("Shape", ["x"], ["shp"], name="shape"),
             helper.make_node("Gather", ["shp", "one"], ["seq"], axis=0, name="gather_seq"),
             helper.make_node("Cast", ["seq"], ["seq_f"], to=TensorProto.FLOAT, name="cast"),
             helper.make_node("Reshape", ["x", "flat_shape"], ["x2"], name="flatten"),
             helper.make_node("MatMul", ["x2", "w"], ["h"], name="mm"),
             helper.make_node("Gather", ["shp", "zero_i"], ["n"], axis=0, name="gather_n"),
             helper.make_node("Reshape", ["n", "one_shape"], ["n1"], name="n1"),
             helper.make_node("Unsqueeze", ["seq", "zero_axes"], ["s1"], name="unsq_s"),
             helper.make_node("Concat", ["n1", "s1", "d1"], ["back_shape"], axis=0, name="cat_shape"),
             helper.make_node("Reshape", ["h", "back_shape"], ["h3"], name="unflatten"),
             helper.make_node("Greater", ["h3", "zero"], ["pos"], name="gt"),
             helper.make_node("Equal", ["seq_f", "seq_f"], ["same"], name="eq"),
             helper.make_node("And", ["pos", "same"], ["mask"], name="and"),
             helper.make_node("Where", ["mask", "h3", "zero"], ["y"], name="where")]
    inits += [numpy_helper.from_array(np.array([1], np.int64), "one_shape"),
              numpy_helper.from_array(np.array([0], np.int64), "zero_axes"),
              numpy_helper.from_array(np.array([D], np.int64), "d1")]
    return _model(nodes, "int_chain", [_vi("x", ["N", "S", D])], [_vi("y", ["N", "S", D])], inits, 21)


def with_string(seed: int = 0) -> onnx.ModelProto:
    """A float path (MatMul, Relu) and a string input passed to a string output."""
    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array(_w(rng, D, D), "w")]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
             helper.make_node("Relu", ["h"], ["y"], name="relu"),
             helper.make_node("Identity", ["s"], ["s_out"], name="id_s")]
    return _model(nodes, "with_string", [_vi("x", ["N", D]), _vi("s", ["N"], TensorProto.STRING)],
                  [_vi("y", ["N", D]), _vi("s_out", ["N"], TensorProto.STRING)], inits, 21)


def if_model(seed: int = 0, opset: int = 21) -> onnx.ModelProto:
    """MatMul -> If(ReduceSum > 0: MatMul with an outer weight | Relu) -> MatMul."""
    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array(_w(rng, D, D), n) for n in ("w1", "w_then", "w2")]
    inits.append(numpy_helper.from_array(np.array(0.0, np.float32), "zero"))
    then_g = helper.make_graph([helper.make_node("MatMul", ["h", "w_then"], ["t_out"], name="then_mm")],
                               "then", [], [_vi("t_out", None)])
    else_g = helper.make_graph([helper.make_node("Relu", ["h"], ["e_out"], name="else_relu")],
                               "else", [], [_vi("e_out", None)])
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"),
             helper.make_node("ReduceSum", ["h"], ["tot"], keepdims=0, name="sum"),
             helper.make_node("Greater", ["tot", "zero"], ["cond"], name="gt"),
             helper.make_node("If", ["cond"], ["branch"], then_branch=then_g, else_branch=else_g, name="if"),
             helper.make_node("MatMul", ["branch", "w2"], ["y"], name="mm2")]
    return _model(nodes, "if_model", [_vi("x", ["N", D])], [_vi("y", ["N", D])], inits, opset)


def loop_model(seed: int = 0) -> onnx.ModelProto:
    """MatMul -> Loop (3 iterations of MatMul with an outer weight + Tanh) -> MatMul."""
    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array(_w(rng, D, D), n) for n in ("w1", "w_loop", "w2")]
    inits += [numpy_helper.from_array(np.array(3, np.int64), "trip"),
              numpy_helper.from_array(np.array(True), "cond0")]
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"], name="b_cond"),
         helper.make_node("MatMul", ["acc_in", "w_loop"], ["bm"], name="b_mm"),
         helper.make_node("Tanh", ["bm"], ["acc_out"], name="b_tanh")],
        "body", [_vi("i", [], TensorProto.INT64), _vi("cond_in", [], TensorProto.BOOL), _vi("acc_in", None)],
        [_vi("cond_out", [], TensorProto.BOOL), _vi("acc_out", None)])
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"),
             helper.make_node("Loop", ["trip", "cond0", "h"], ["looped"], body=body, name="loop"),
             helper.make_node("MatMul", ["looped", "w2"], ["y"], name="mm2")]
    return _model(nodes, "loop_model", [_vi("x", ["N", D])], [_vi("y", ["N", D])], inits, 21)


def custom_function_model(seed: int = 0) -> onnx.ModelProto:
    """A model-local function in a custom domain (onnxruntime inlines it) between two MatMuls."""
    rng = np.random.default_rng(seed)
    fn = helper.make_function("my.domain", "Swishish", ["a"], ["b"],
                              [helper.make_node("Sigmoid", ["a"], ["sa"]),
                               helper.make_node("Mul", ["a", "sa"], ["b"])],
                              [helper.make_opsetid("", 21)])
    inits = [numpy_helper.from_array(_w(rng, D, D), n) for n in ("w1", "w2")]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"),
             helper.make_node("Swishish", ["h"], ["s"], domain="my.domain", name="custom"),
             helper.make_node("MatMul", ["s", "w2"], ["y"], name="mm2")]
    return _model(nodes, "custom_fn", [_vi("x", ["N", D])], [_vi("y", ["N", D])], inits, 21,
                  extra_opsets=[helper.make_opsetid("my.domain", 1)], functions=[fn])


def contrib_op_model(seed: int = 0) -> onnx.ModelProto:
    """An onnxruntime contrib op (com.microsoft.Gelu) between two MatMuls."""
    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array(_w(rng, D, D), n) for n in ("w1", "w2")]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"),
             helper.make_node("Gelu", ["h"], ["g"], domain="com.microsoft", name="ms_gelu"),
             helper.make_node("MatMul", ["g", "w2"], ["y"], name="mm2")]
    return _model(nodes, "contrib", [_vi("x", ["N", D])], [_vi("y", ["N", D])], inits, 21,
                  extra_opsets=[helper.make_opsetid("com.microsoft", 1)])


def unknown_domain_model(seed: int = 0) -> onnx.ModelProto:
    """A custom-domain op with no implementation anywhere (needs a custom op library)."""
    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array(_w(rng, D, D), n) for n in ("w1", "w2")]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"),
             helper.make_node("FancyAct", ["h"], ["g"], domain="acme.ops", name="fancy"),
             helper.make_node("MatMul", ["g", "w2"], ["y"], name="mm2")]
    return _model(nodes, "unknown_domain", [_vi("x", ["N", D])], [_vi("y", ["N", D])], inits, 21,
                  extra_opsets=[helper.make_opsetid("acme.ops", 1)])


def unsupported_op_model(op: str, seed: int = 0) -> onnx.ModelProto:
    """A default-domain op mixq has no semantics for, between two MatMuls."""
    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array(_w(rng, D, D), n) for n in ("w1", "w2")]
    inits.append(numpy_helper.from_array(np.array(1, np.int64), "axis1"))
    extra = {"CumSum": (["h", "axis1"], {}), "Hardmax": (["h"], {}), "Neg": (["h"], {}),
             "Abs": (["h"], {}), "Einsum": (["h", "h"], {"equation": "ij,ij->ij"}),
             "Round": (["h"], {}), "Ceil": (["h"], {}),
             "Softplus": (["h"], {}), "LogSoftmax": (["h"], {}), "Celu": (["h"], {}),
             "ThresholdedRelu": (["h"], {}), "Reciprocal": (["h"], {}), "Exp": (["h"], {}),
             "Floor": (["h"], {}), "Sign": (["h"], {}), "Selu": (["h"], {})}
    ins, attrs = extra[op]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"),
             helper.make_node(op, ins, ["u"], name="odd", **attrs),
             helper.make_node("MatMul", ["u", "w2"], ["y"], name="mm2")]
    return _model(nodes, f"unsupported_{op}", [_vi("x", ["N", D])], [_vi("y", ["N", D])], inits, 21)


UNSUPPORTED_OPS = ["CumSum", "Hardmax", "Neg", "Abs", "Einsum", "Round", "Ceil", "Softplus",
                   "LogSoftmax", "Celu", "ThresholdedRelu", "Reciprocal", "Exp", "Floor", "Sign", "Selu"]


def zero_size_model(seed: int = 0) -> onnx.ModelProto:
    """A zero-size initializer concatenated in, and a zero-size intermediate (Slice 0:0)."""
    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array(_w(rng, D, D), "w"),
             numpy_helper.from_array(np.zeros((0, D), np.float32), "empty"),
             numpy_helper.from_array(np.array([0], np.int64), "s0"),
             numpy_helper.from_array(np.array([0], np.int64), "e0"),
             numpy_helper.from_array(np.array([1], np.int64), "ax1")]
    nodes = [helper.make_node("Concat", ["x", "empty"], ["xc"], axis=0, name="cat"),
             helper.make_node("MatMul", ["xc", "w"], ["h"], name="mm"),
             helper.make_node("Slice", ["h", "s0", "e0", "ax1"], ["hs"], name="slice_empty"),
             helper.make_node("Relu", ["hs"], ["hsr"], name="relu_empty"),
             helper.make_node("Relu", ["h"], ["y"], name="relu")]
    return _model(nodes, "zero_size", [_vi("x", ["N", D])], [_vi("y", ["N", D]), _vi("hsr", ["N", 0])],
                  inits, 21)


def feeds(model: onnx.ModelProto, n: int = 4, seed: int = 1, dyn=(1, 2, 3, 5)) -> list[dict]:
    """Calibration feeds for `model`: dynamic dims cycle through `dyn`."""
    rng = np.random.default_rng(seed)
    inits = {t.name for t in model.graph.initializer}
    out = []
    for i in range(n):
        f = {}
        for vi in model.graph.input:
            if vi.name in inits:
                continue
            tt = vi.type.tensor_type
            shape = [d.dim_value if d.HasField("dim_value") else dyn[(i + j) % len(dyn)]
                     for j, d in enumerate(tt.shape.dim)]
            if tt.elem_type == TensorProto.STRING:
                f[vi.name] = np.array([f"s{i}{k}" for k in range(int(np.prod(shape)))], dtype=object).reshape(shape)
            else:
                dt = helper.tensor_dtype_to_np_dtype(tt.elem_type)
                f[vi.name] = rng.standard_normal(shape).astype(dt)
        out.append(f)
    return out
