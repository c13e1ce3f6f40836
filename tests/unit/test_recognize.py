"""Recognition pass: written-out LayerNorm / GELU / Softmax / HardSwish / Mish / GroupNorm fused into the native ops,
exactly."""
from __future__ import annotations

import math

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from mixq.passes.recognize import recognize

B, T, C = 2, 5, 16


class _G:
    """A tiny graph builder: x of shape (B, T, C) in, nodes appended with fresh names."""

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.k = 0

    def c(self, v) -> str:
        self.k += 1
        name = f"c{self.k}"
        self.inits.append(numpy_helper.from_array(np.asarray(v, np.float32) if not isinstance(v, np.ndarray)
                                                  or v.dtype.kind == "f" else v, name))
        return name

    def ints(self, v) -> str:
        self.k += 1
        name = f"i{self.k}"
        self.inits.append(numpy_helper.from_array(np.asarray(v, np.int64), name))
        return name

    def op(self, op: str, *ins: str, **attrs) -> str:
        self.k += 1
        out = f"t{self.k}"
        self.nodes.append(helper.make_node(op, list(ins), [out], name=f"n{self.k}", **attrs))
        return out

    def mean(self, x: str, form: str = "mean") -> str:
        if form == "mean":
            return self.op("ReduceMean", x, self.ints([-1]))
        s = self.op("ReduceSum", x, self.ints([-1]))
        return self.op("Mul", s, self.c(1.0 / C)) if form == "sum_mul" else self.op("Div", s, self.c(float(C)))

    def model(self, y: str, extra_outputs: tuple[str, ...] = ()) -> onnx.ModelProto:
        outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in (y, *extra_outputs)]
        g = helper.make_graph(self.nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [B, T, C])],
                              outs, self.inits)
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
        return onnx.shape_inference.infer_shapes(m)


def _run(m: onnx.ModelProto, x: np.ndarray) -> list[np.ndarray]:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # no ORT-side fusions
    s = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return s.run(None, {"x": x})


def _check_fused(m: onnx.ModelProto, op: str, n_fused: int = 1, scale: float = 1.0) -> onnx.ModelProto:
    x = (np.random.default_rng(0).standard_normal((B, T, C)) * scale + 0.3).astype(np.float32)
    ref = _run(m, x)
    fused = onnx.ModelProto()
    fused.CopyFrom(m)
    rep = recognize(fused)
    onnx.checker.check_model(fused, full_check=True)
    assert [f.kind for f in rep.fused] == [op] * n_fused, rep
    assert sum(n.op_type == op for n in fused.graph.node) == n_fused
    got = _run(fused, x)
    for r, q in zip(ref, got):
        np.testing.assert_allclose(q, r, atol=1e-5, rtol=1e-5)
    return fused


def _layernorm(g: _G, x: str, var_form: str, mean_form: str, inv_form: str, affine: bool) -> str:
    mean = g.mean(x, mean_form)
    d = g.op("Sub", x, mean)
    if var_form == "centered":
        var = g.mean(g.op("Mul", d, d), mean_form)
    else:  # E[x^2] - E[x]^2, each mean computed on its own (JAX)
        ex2 = g.mean(g.op("Mul", x, x), mean_form)
        var = g.op("Sub", ex2, g.op("Pow", mean, g.c(2.0)))
    ve = g.op("Add", var, g.c(1e-5))
    if inv_form == "sqrt_div":
        y = g.op("Div", d, g.op("Sqrt", ve))
    elif inv_form == "recip_mul":
        y = g.op("Mul", d, g.op("Reciprocal", g.op("Sqrt", ve)))
    else:
        y = g.op("Mul", g.op("Pow", ve, g.c(-0.5)), d)
    if affine:
        rng = np.random.default_rng(1)
        y = g.op("Mul", y, g.c(rng.uniform(0.5, 1.5, C)))
        y = g.op("Add", y, g.c(rng.normal(0, 0.1, C)))
    return y


@pytest.mark.parametrize("var_form", ["centered", "ex2"])
@pytest.mark.parametrize("mean_form,inv_form", [("mean", "sqrt_div"), ("sum_mul", "recip_mul"),
                                                ("sum_div", "pow"), ("mean", "recip_mul")])
@pytest.mark.parametrize("affine", [True, False])
def test_layernorm_forms_fuse_exactly(var_form, mean_form, inv_form, affine):
    g = _G()
    y = _layernorm(g, "x", var_form, mean_form, inv_form, affine)
    fused = _check_fused(g.model(y), "LayerNormalization", scale=3.0)
    ln = next(n for n in fused.graph.node if n.op_type == "LayerNormalization")
    assert len(fused.graph.node) == 1 and len(ln.input) == (3 if affine else 2)
    assert math.isclose(helper.get_attribute_value(ln.attribute[1]) if ln.attribute[1].name == "epsilon"
                        else helper.get_attribute_value(ln.attribute[0]), 1e-5, rel_tol=1e-6)


def test_layernorm_jax_rsqrt_times_scale():
    """flax: (x - mean) * (rsqrt(max(0, var) + eps) * gamma) + beta."""
    g = _G()
    mean = g.mean("x", "sum_mul")
    var = g.op("Sub", g.mean(g.op("Mul", "x", "x"), "sum_mul"), g.op("Mul", mean, mean))
    var = g.op("Max", var, g.c(0.0))
    inv = g.op("Reciprocal", g.op("Sqrt", g.op("Add", var, g.c(1e-6))))
    inv = g.op("Mul", inv, g.c(np.linspace(0.5, 2, C)))
    y = g.op("Mul", g.op("Sub", "x", mean), inv)
    y = g.op("Add", y, g.c(np.linspace(-1, 1, C)))
    _check_fused(g.model(y), "LayerNormalization")


def test_layernorm_near_misses_do_not_fuse():
    # the mean is also a graph output: fusing would drop it
    g = _G()
    y = _layernorm(g, "x", "centered", "mean", "sqrt_div", False)
    mean = g.nodes[0].output[0]
    m = g.model(y, extra_outputs=(mean,))
    rep = recognize(m)
    assert not rep.fused and "graph output" in rep.declined[0].reason
    # 1/n of the wrong size
    g = _G()
    s = g.op("ReduceSum", "x", g.ints([-1]))
    mean = g.op("Mul", s, g.c(1.0 / (C + 1)))
    d = g.op("Sub", "x", mean)
    var = g.op("ReduceMean", g.op("Mul", d, d), g.ints([-1]))
    y = g.op("Div", d, g.op("Sqrt", g.op("Add", var, g.c(1e-5))))
    rep = recognize(g.model(y))
    assert not rep.fused and "1/n" in rep.declined[0].reason
    # the variance over another axis than the mean
    g = _G()
    mean = g.op("ReduceMean", "x", g.ints([-1]))
    d = g.op("Sub", "x", mean)
    var = g.op("ReduceMean", g.op("Mul", d, d), g.ints([1]))
    y = g.op("Div", d, g.op("Sqrt", g.op("Add", var, g.c(1e-5))))
    rep = recognize(g.model(y))
    assert not rep.fused and rep.declined


def _gelu_erf(g: _G, x: str, arrangement: int) -> str:
    t = g.op("Add", g.op("Erf", g.op("Div", x, g.c(1.4142135))), g.c(1.0))
    if arrangement == 0:
        return g.op("Mul", g.op("Mul", x, g.c(0.5)), t)
    if arrangement == 1:
        return g.op("Mul", g.op("Mul", x, t), g.c(0.5))
    return g.op("Mul", x, g.op("Mul", t, g.c(0.5)))


@pytest.mark.parametrize("arrangement", [0, 1, 2])
def test_gelu_erf_fuses(arrangement):
    g = _G()
    fused = _check_fused(g.model(_gelu_erf(g, "x", arrangement)), "Gelu", scale=2.0)
    node = fused.graph.node[0]
    assert helper.get_attribute_value(node.attribute[0]) == b"none"


@pytest.mark.parametrize("cube", ["pow", "mul"])
def test_gelu_tanh_fuses(cube):
    g = _G()
    x = "x"
    x3 = g.op("Pow", x, g.c(3.0)) if cube == "pow" else g.op("Mul", x, g.op("Mul", x, x))
    inner = g.op("Mul", g.c(math.sqrt(2 / math.pi)), g.op("Add", x, g.op("Mul", g.c(0.044715), x3)))
    cdf = g.op("Mul", g.c(0.5), g.op("Add", g.c(1.0), g.op("Tanh", inner)))
    fused = _check_fused(g.model(g.op("Mul", x, cdf)), "Gelu", scale=2.0)
    assert helper.get_attribute_value(fused.graph.node[0].attribute[0]) == b"tanh"


def test_gelu_near_misses_do_not_fuse():
    g = _G()
    t = g.op("Add", g.op("Erf", g.op("Div", "x", g.c(1.5))), g.c(1.0))  # not sqrt(2)
    y = g.op("Mul", g.op("Mul", "x", g.c(0.5)), t)
    rep = recognize(g.model(y))
    assert not rep.fused and "sqrt(2)" in rep.declined[0].reason
    g = _G()
    y = _gelu_erf(g, "x", 0)
    erf_out = g.nodes[1].output[0]
    rep = recognize(g.model(y, extra_outputs=(erf_out,)))
    assert not rep.fused and "graph output" in rep.declined[0].reason


@pytest.mark.parametrize("with_max", [True, False])
def test_softmax_fuses(with_max):
    g = _G()
    x = "x"
    if with_max:
        x = g.op("Sub", x, g.op("ReduceMax", x, g.ints([-1])))
    e = g.op("Exp", x)
    y = g.op("Div", e, g.op("ReduceSum", e, g.ints([-1])))
    fused = _check_fused(g.model(y), "Softmax", scale=4.0)
    assert len(fused.graph.node) == 1 and fused.graph.node[0].input[0] == "x"


def test_softmax_near_misses_do_not_fuse():
    g = _G()  # max over another axis than the sum: still a softmax, but not this native one
    x = g.op("Sub", "x", g.op("ReduceMax", "x", g.ints([1])))
    e = g.op("Exp", x)
    y = g.op("Div", e, g.op("ReduceSum", e, g.ints([-1])))
    rep = recognize(g.model(y))
    assert not rep.fused and "axes" in rep.declined[0].reason
    g = _G()  # the exponentials are read elsewhere
    e = g.op("Exp", "x")
    y = g.op("Div", e, g.op("ReduceSum", e, g.ints([-1])))
    y2 = g.op("Add", y, e)
    rep = recognize(g.model(y2))
    assert not rep.fused and rep.declined


# ------------------------------------------------------------- jax2tf spellings (Magika)
def _jax_model(g: _G, y: str, shape=("N", T, C)) -> onnx.ModelProto:
    """x of `shape` (a dynamic batch): what jax2tf -> tf2onnx writes."""
    g2 = helper.make_graph(g.nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                           [helper.make_tensor_value_info(y, TensorProto.FLOAT, None)], g.inits)
    m = helper.make_model(g2, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    return onnx.shape_inference.infer_shapes(m, data_prop=True)


def _broadcast_back(g: _G, t: str, kept: list[int], *, expand: bool = True, at_batch: str = "x") -> str:
    """jax2tf's BroadcastTo of a keepdims=0 reduction: Reshape to (batch, *kept) with the batch
    read from Shape(x) at run time, then an Expand to the same shape."""
    batch = g.op("Slice", g.op("Shape", at_batch), g.ints([0]), g.ints([1]))
    target = g.op("Concat", batch, g.ints(kept), axis=0)
    r = g.op("Reshape", t, target)
    return g.op("Expand", r, target) if expand else r


def _jax_layernorm(g: _G, axis: int, kept: list[int], n: int, gamma, beta) -> str:
    """flax's LayerNorm as jax2tf writes it: sums with keepdims=0 times 1/n, the variance as
    max(0, E[x^2] - E[x]^2), both broadcast back, rsqrt * gamma, then beta."""
    mean = g.op("Mul", g.op("ReduceSum", "x", g.ints([axis]), keepdims=0), g.c(1.0 / n))
    ex2 = g.op("Mul", g.op("ReduceSum", g.op("Mul", "x", "x"), g.ints([axis]), keepdims=0), g.c(1.0 / n))
    var = g.op("Max", g.c(0.0), g.op("Sub", ex2, g.op("Mul", mean, mean)))
    inv = g.op("Reciprocal", g.op("Sqrt", g.op("Add", _broadcast_back(g, var, kept), g.c(1e-6))))
    d = g.op("Sub", "x", _broadcast_back(g, mean, kept))
    return g.op("Add", g.op("Mul", d, g.op("Mul", inv, g.c(gamma))), g.c(beta))


def _check_same(m: onnx.ModelProto, fused: onnx.ModelProto, shape) -> None:
    x = (np.random.default_rng(0).standard_normal(shape) * 2.0 + 1.5).astype(np.float32)
    for r, q in zip(_run(m, x), _run(fused, x)):
        np.testing.assert_allclose(q, r, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("axis", [2, 1])
def test_jax_layernorm_with_sums_broadcast_back_fuses(axis):
    """Over the last axis: LayerNormalization. Over an inner one (Magika's first LayerNorm
    normalises axis 1 of (N, 512, 256)): Transpose, LayerNormalization, Transpose back; the
    scale and shift (1, T, 1) moved with it. Before, both were declined ('the subtracted value
    is not mean(x)'): the means were taken with keepdims=0 and broadcast back."""
    rng = np.random.default_rng(2)
    g = _G()
    if axis == 2:
        y = _jax_layernorm(g, 2, [T, 1], C, rng.uniform(0.5, 1.5, C), rng.normal(0, 0.1, C))
    else:
        y = _jax_layernorm(g, 1, [1, C], T, rng.uniform(0.5, 1.5, (1, T, 1)), rng.normal(0, 0.1, (1, T, 1)))
    m = _jax_model(g, y)
    fused = onnx.ModelProto()
    fused.CopyFrom(m)
    rep = recognize(fused)
    onnx.checker.check_model(fused, full_check=True)
    assert [f.kind for f in rep.fused] == ["LayerNormalization"], rep
    ops = [n.op_type for n in fused.graph.node if n.op_type not in ("Shape", "Slice", "Concat")]
    assert ops == (["LayerNormalization"] if axis == 2 else ["Transpose", "LayerNormalization", "Transpose"])
    _check_same(m, fused, (3, T, C))


def test_jax_layernorm_near_misses_do_not_fuse():
    """The reduced axis put back in another place ((N, C, 1) for a sum over T), and a put-back
    Reshape with two unknown dims (batch and time dynamic: nothing proves the order): declined."""
    rng = np.random.default_rng(2)
    g = _G()
    y = _jax_layernorm(g, 1, [C, 1], T, rng.uniform(0.5, 1.5, (1, T, 1)), rng.normal(0, 0.1, (1, T, 1)))
    m = _jax_model(g, y, shape=("N", T, T))  # square, so that (N, T, 1) broadcasts as well
    rep = recognize(m)
    assert not rep.fused and rep.declined, rep
    g = _G()
    y = _jax_layernorm(g, 2, [T, 1], C, np.ones(C), np.zeros(C))
    g.nodes = [n for n in g.nodes]
    m = _jax_model(g, y, shape=("N", "T", C))
    rep = recognize(m)
    assert not rep.fused, rep


@pytest.mark.parametrize("order", ["c_first", "c_last", "pow"])
def test_jax_gelu_with_the_cubic_coefficient_anywhere_fuses(order):
    """jax2tf writes 0.044715 x^3 as x * (x * (0.044715 * x)); a monomial of x in any order."""
    g = _G()
    if order == "c_first":
        c3 = g.op("Mul", "x", g.op("Mul", "x", g.op("Mul", g.c(0.044715), "x")))
    elif order == "c_last":
        c3 = g.op("Mul", g.op("Mul", g.op("Mul", "x", "x"), "x"), g.c(0.044715))
    else:
        c3 = g.op("Mul", g.op("Pow", g.op("Mul", g.c(0.35472), "x"), g.c(3.0)), g.c(0.044715 / 0.35472 ** 3))
    inner = g.op("Mul", g.c(math.sqrt(2 / math.pi)), g.op("Add", "x", c3))
    cdf = g.op("Mul", g.c(0.5), g.op("Add", g.c(1.0), g.op("Tanh", inner)))
    _check_fused(g.model(g.op("Mul", "x", cdf)), "Gelu", scale=2.0)
    g = _G()  # x^2 is no cube
    c2 = g.op("Mul", "x", g.op("Mul", g.c(0.044715), "x"))
    inner = g.op("Mul", g.c(math.sqrt(2 / math.pi)), g.op("Add", "x", c2))
    cdf = g.op("Mul", g.c(0.5), g.op("Add", g.c(1.0), g.op("Tanh", inner)))
    assert not recognize(g.model(g.op("Mul", "x", cdf))).fused


@pytest.mark.parametrize("expand", [True, False])
def test_jax_softmax_with_reductions_broadcast_back_fuses(expand):
    """max with keepdims=0 behind jax's Max(-inf, .) guard, the sum with keepdims=0, both
    Reshaped (and Expanded) back: Softmax (Magika's classifier output)."""
    g = _G()
    mx = g.op("Max", g.c(-np.inf), g.op("ReduceMax", "x", g.ints([-1]), keepdims=0))
    e = g.op("Exp", g.op("Sub", "x", _broadcast_back(g, mx, [T, 1], expand=expand)))
    s = g.op("ReduceSum", e, g.ints([-1]), keepdims=0)
    y = g.op("Div", e, _broadcast_back(g, s, [T, 1], expand=expand))
    m = _jax_model(g, y)
    fused = onnx.ModelProto()
    fused.CopyFrom(m)
    rep = recognize(fused)
    assert [f.kind for f in rep.fused] == ["Softmax"], rep
    assert [n.op_type for n in fused.graph.node if n.op_type not in ("Shape", "Slice", "Concat")] == ["Softmax"]
    _check_same(m, fused, (3, T, C))
    g = _G()  # the sum put back along another axis: no softmax
    e = g.op("Exp", "x")
    s = g.op("ReduceSum", e, g.ints([-1]), keepdims=0)
    y = g.op("Div", e, _broadcast_back(g, s, [1, T]))
    assert not recognize(_jax_model(g, y, shape=("N", T, T))).fused


def _hardswish(g: _G, x: str, form: str) -> str:
    """x * relu6(x + 3) / 6 as exporters write it."""
    if form == "hardsigmoid":  # torch before opset 14
        return g.op("Mul", x, g.op("HardSigmoid", x, alpha=1.0 / 6.0, beta=0.5))
    r6 = g.op("Clip", g.op("Add", x, g.c(3.0)), g.c(0.0), g.c(6.0))
    if form == "mul_div":  # paddle2onnx: x * relu6(x + 3), then / 6
        return g.op("Div", g.op("Mul", x, r6), g.c(6.0))
    if form == "div_mul":  # relu6(x + 3) / 6, then * x
        return g.op("Mul", g.op("Div", r6, g.c(6.0)), x)
    return g.op("Mul", g.op("Mul", g.c(1.0 / 6.0), r6), x)  # * (1/6) on the left


@pytest.mark.parametrize("form", ["mul_div", "div_mul", "sixth_mul", "hardsigmoid"])
def test_hardswish_forms_fuse(form):
    """Each intermediate of a written-out HardSwish (x + 3, the clip, the product, the sixth)
    was quantized on its own grid: four roundings where HardSwish has one."""
    g = _G()
    y = _hardswish(g, "x", form)
    fused = _check_fused(g.model(y), "HardSwish", scale=4.0)
    assert len(fused.graph.node) == 1 and list(fused.graph.node[0].input) == ["x"]


def test_a_written_hard_sigmoid_gate_fuses():
    """relu6(x + 3) / 6 that gates another tensor (a squeeze-and-excitation block) is a
    HardSigmoid of x."""
    g = _G()
    gate = g.op("Div", g.op("Clip", g.op("Add", "x", g.c(3.0)), g.c(0.0), g.c(6.0)), g.c(6.0))
    y = g.op("Mul", g.op("Tanh", "x"), gate)
    fused = _check_fused(g.model(y), "HardSigmoid", scale=4.0)
    hs = next(n for n in fused.graph.node if n.op_type == "HardSigmoid")
    assert math.isclose(hs.attribute[0].f, 1.0 / 6.0, rel_tol=1e-6) or math.isclose(hs.attribute[1].f, 1.0 / 6.0,
                                                                                      rel_tol=1e-6)


def test_hardswish_near_misses_do_not_fuse():
    g = _G()  # relu6(x + 3) * x, never divided by 6: not HardSwish
    y = g.op("Mul", "x", g.op("Clip", g.op("Add", "x", g.c(3.0)), g.c(0.0), g.c(6.0)))
    rep = recognize(g.model(y))
    assert not rep.fused and "not divided by 6" in rep.declined[0].reason
    g = _G()  # clipped at 5, not 6: another function
    y = g.op("Div", g.op("Mul", "x", g.op("Clip", g.op("Add", "x", g.c(3.0)), g.c(0.0), g.c(5.0))), g.c(6.0))
    assert not recognize(g.model(y)).fused
    g = _G()  # a Keras hard sigmoid (alpha 0.2) times x
    y = g.op("Mul", "x", g.op("HardSigmoid", "x"))
    assert not recognize(g.model(y)).fused
    g = _G()  # the clip is also read elsewhere
    r6 = g.op("Clip", g.op("Add", "x", g.c(3.0)), g.c(0.0), g.c(6.0))
    y = g.op("Add", g.op("Div", g.op("Mul", "x", r6), g.c(6.0)), r6)
    rep = recognize(g.model(y))
    assert not rep.fused and "read by 2 nodes" in rep.declined[0].reason


@pytest.mark.parametrize("form", ["softplus", "log_exp"])
def test_mish_forms_fuse(form):
    """x * tanh(softplus(x)) as torch wrote it before opset 18 (Softplus) and as tf2onnx writes
    softplus (Log(Exp(x) + 1)): three intermediates on grids of their own before, one op now."""
    g = _G()
    sp = g.op("Softplus", "x") if form == "softplus" else g.op("Log", g.op("Add", g.op("Exp", "x"), g.c(1.0)))
    y = g.op("Mul", "x", g.op("Tanh", sp))
    fused = _check_fused(g.model(y), "Mish", scale=3.0)
    assert len(fused.graph.node) == 1 and list(fused.graph.node[0].input) == ["x"]


def test_mish_near_misses_do_not_fuse():
    g = _G()  # tanh(softplus(x)) times another tensor: a gate, not Mish
    y = g.op("Mul", g.op("Sigmoid", "x"), g.op("Tanh", g.op("Softplus", "x")))
    rep = recognize(g.model(y))
    assert not rep.fused and "not multiplied by x alone" in rep.declined[0].reason
    g = _G()  # softplus read elsewhere too
    sp = g.op("Softplus", "x")
    y = g.op("Add", g.op("Mul", "x", g.op("Tanh", sp)), sp)
    rep = recognize(g.model(y))
    assert not rep.fused and "also read by" in rep.declined[0].reason
    g = _G()  # log(exp(x) + 2) is no softplus
    y = g.op("Mul", "x", g.op("Tanh", g.op("Log", g.op("Add", g.op("Exp", "x"), g.c(2.0)))))
    assert not recognize(g.model(y)).fused


def _groupnorm(g: _G, x: str, groups: int, gamma, beta, back: str = "shape", eps: float = 1e-5,
               inner_scale=1.0, inner_bias=0.0) -> str:
    """nn.GroupNorm as torch's exporter writes it: x reshaped to (N, G, -1), an
    InstanceNormalization with scale 1 and bias 0, reshaped back, times gamma, plus beta."""
    r = g.op("Reshape", x, g.ints([0, groups, -1]))
    n = g.op("InstanceNormalization", r, g.c(np.broadcast_to(inner_scale, groups)),
             g.c(np.broadcast_to(inner_bias, groups)), epsilon=eps)
    target = g.op("Shape", x) if back == "shape" else g.ints(back)
    y = g.op("Reshape", n, target)
    if gamma is not None:
        y = g.op("Mul", y, g.c(gamma))
    if beta is not None:
        y = g.op("Add", y, g.c(beta))
    return y


def _gn_model(g: _G, y: str, shape=(2, 8, 3, 3), opset: int = 21) -> onnx.ModelProto:
    gm = helper.make_graph(g.nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", *shape[1:]])],
                           [helper.make_tensor_value_info(y, TensorProto.FLOAT, None)], g.inits)
    return onnx.shape_inference.infer_shapes(helper.make_model(gm, opset_imports=[helper.make_opsetid("", opset)],
                                                               ir_version=10))


@pytest.mark.parametrize("affine,back", [("both", "shape"), ("gamma", "shape"), ("none", "shape"),
                                         ("both", "static"), ("both", "shape_1d"), ("inner", "shape")])
def test_groupnorm_as_torch_exports_it_fuses(affine, back):
    """Five nodes (and the reshape's Shape) whose normalized tensor and product were each
    quantized on a grid of their own become one GroupNormalization (opset 21: per-channel
    scale and bias), computing the same values."""
    rng = np.random.default_rng(3)
    shape = (2, 8, 3, 3) if back != "shape_1d" else (2, 8, 7)
    gamma = rng.uniform(0.5, 2, (8,) + (1,) * (len(shape) - 2)) if affine in ("both", "gamma", "inner") else None
    beta = rng.standard_normal((8,) + (1,) * (len(shape) - 2)) if affine in ("both", "inner") else None
    g = _G()
    # "inner": the InstanceNormalization scales and shifts its groups itself too (how prepare
    # expands the deprecated GroupNormalization-18); the fused op takes both affines
    y = _groupnorm(g, "x", 4, gamma, beta, back=[2, 8, 3, 3] if back == "static" else "shape",
                   inner_scale=1.0 if affine != "inner" else rng.uniform(0.5, 2, 4),
                   inner_bias=0.0 if affine != "inner" else rng.standard_normal(4))
    m = _gn_model(g, y, shape)
    if back == "static":  # a constant target needs static dims
        m.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 2
        m = onnx.shape_inference.infer_shapes(m)
    x = (rng.standard_normal(shape) * 3 + 1).astype(np.float32)
    ref = _run(m, x)[0]
    fused = onnx.ModelProto()
    fused.CopyFrom(m)
    rep = recognize(fused)
    onnx.checker.check_model(fused, full_check=True)
    assert [n.op_type for n in fused.graph.node] == ["GroupNormalization"], rep
    np.testing.assert_allclose(_run(fused, x)[0], ref, atol=1e-5, rtol=1e-5)


def test_groupnorm_near_misses_do_not_fuse():
    rng = np.random.default_rng(4)
    gamma, beta = rng.uniform(0.5, 2, (8, 1, 1)), rng.standard_normal((8, 1, 1))
    g = _G()  # a group scale that is not finite
    r = g.op("Reshape", "x", g.ints([0, 4, -1]))
    n = g.op("InstanceNormalization", r, g.c(np.array([1, 2, np.inf, 1])), g.c(np.zeros(4)))
    rep = recognize(_gn_model(g, g.op("Reshape", n, g.op("Shape", "x"))))
    assert not rep.fused and "one finite value per group" in rep.declined[0].reason
    g = _G()  # reshaped back to another shape
    rep = recognize(_gn_model(g, _groupnorm(g, "x", 4, gamma, beta, back=[0, 8, 9])))
    assert not rep.fused and "not reshaped back" in rep.declined[0].reason
    g = _G()  # the normalized tensor is read elsewhere too
    r = g.op("Reshape", "x", g.ints([0, 4, -1]))
    n = g.op("InstanceNormalization", r, g.c(np.ones(4)), g.c(np.zeros(4)))
    y = g.op("Add", g.op("Reshape", n, g.op("Shape", "x")), g.op("ReduceMean", n, g.ints([2])))
    rep = recognize(_gn_model(g, y))
    assert not rep.fused and "not reshaped back alone" in rep.declined[0].reason
    g = _G()  # opset 20: GroupNormalization takes per-group scales there
    rep = recognize(_gn_model(g, _groupnorm(g, "x", 4, gamma, beta), opset=20))
    assert not rep.fused and "needs opset 21" in rep.declined[0].reason


def test_groupnorm_leaves_a_scale_that_is_not_per_channel_after_it():
    """A Mul whose constant varies along W is no part of the GroupNorm: the fusion stops
    before it, and the model computes the same values."""
    rng = np.random.default_rng(5)
    g = _G()
    y = _groupnorm(g, "x", 2, rng.uniform(0.5, 2, (1, 1, 1, 3)), None)
    m = _gn_model(g, y)
    x = rng.standard_normal((2, 8, 3, 3)).astype(np.float32)
    ref = _run(m, x)[0]
    rep = recognize(m)
    assert [n.op_type for n in m.graph.node] == ["GroupNormalization", "Mul"], rep
    np.testing.assert_allclose(_run(m, x)[0], ref, atol=1e-5, rtol=1e-5)


def test_transformer_block_fuses_all_three():
    """LayerNorm -> MatMul -> GELU -> MatMul -> Softmax: one fusion each, outputs unchanged."""
    rng = np.random.default_rng(3)
    g = _G()
    h = _layernorm(g, "x", "ex2", "sum_mul", "recip_mul", True)
    h = g.op("MatMul", h, g.c(rng.normal(0, 0.3, (C, C))))
    h = _gelu_erf(g, h, 2)
    h = g.op("MatMul", h, g.c(rng.normal(0, 0.3, (C, C))))
    e = g.op("Exp", g.op("Sub", h, g.op("ReduceMax", h, g.ints([-1]))))
    y = g.op("Div", e, g.op("ReduceSum", e, g.ints([-1])))
    x = rng.standard_normal((B, T, C)).astype(np.float32)
    m = g.model(y)
    ref = _run(m, x)[0]
    rep = recognize(m)
    assert rep.counts() == {"LayerNormalization": 1, "Gelu": 1, "Softmax": 1}
    assert [n.op_type for n in m.graph.node] == ["LayerNormalization", "MatMul", "Gelu", "MatMul", "Softmax"]
    np.testing.assert_allclose(_run(m, x)[0], ref, atol=1e-5)


# ---------------------------------------------------------------------------- Einsum with a weight
#: (equation, weight shape, whether the weight is the first operand); x is (B, T, C)
EINSUM_PRODUCTS = [
    ("btc,cf->btf", (C, 6), False),          # a dense layer
    ("btc,fc->btf", (6, C), False),          # with the weight transposed
    ("btc,chk->bthk", (C, 2, 3), False),     # a multi-head projection (flax DenseGeneral)
    ("...c,cf->...f", (C, 6), False),        # an ellipsis for the batch dims
    ("cf,btc->btf", (C, 6), True),           # the weight written first
]


@pytest.mark.parametrize("eq,wshape,first", EINSUM_PRODUCTS, ids=[e[0] for e in EINSUM_PRODUCTS])
def test_einsum_with_a_weight_becomes_matmul(eq, wshape, first):
    g = _G()
    w = g.c(np.random.default_rng(2).standard_normal(wshape).astype(np.float32))
    y = g.op("Einsum", *((w, "x") if first else ("x", w)), equation=eq)
    fused = _check_fused(g.model(y), "MatMul")
    assert not any(n.op_type == "Einsum" for n in fused.graph.node)
    assert any(t.name.endswith("_matmul") and len(t.dims) == 2 for t in fused.graph.initializer)


def test_einsum_contracting_two_labels_becomes_reshape_matmul():
    """'bthk,hkd->btd' (a multi-head output projection): the two contracted labels are merged by
    a Reshape before the MatMul."""
    g = _G()
    h = g.op("Reshape", "x", g.ints([B, T, 4, 4]))
    w = g.c(np.random.default_rng(3).standard_normal((4, 4, 5)).astype(np.float32))
    y = g.op("Einsum", h, w, equation="bthk,hkd->btd")
    fused = _check_fused(g.model(y), "MatMul")
    assert [n.op_type for n in fused.graph.node] == ["Reshape", "Reshape", "MatMul"]


@pytest.mark.parametrize("eq,why", [
    ("btc,cf->bft", "no matrix product"),     # the output's labels in another order
    ("btc,ctf->btf", "no matrix product"),    # a label of the weight that x holds too, kept (batched)
    ("btc,cc->bt", "repeated"),               # a diagonal
    ("btc,cf", "no explicit output"),
])
def test_einsum_that_is_no_plain_matrix_product_stays(eq, why):
    g = _G()
    wshape = {"btc,cf->bft": (C, 6), "btc,ctf->btf": (C, T, 6), "btc,cc->bt": (C, C), "btc,cf": (C, 6)}[eq]
    y = g.op("Einsum", "x", g.c(np.ones(wshape, np.float32)), equation=eq)
    m = g.model(y)
    rep = recognize(m)
    assert not rep.fused and any(why in d.reason for d in rep.declined), rep
    assert any(n.op_type == "Einsum" for n in m.graph.node)


@pytest.mark.parametrize("eq,bshape,transposed", [
    ("bhqd,bhkd->bhqk", (B, 2, 7, 8), True),    # attention scores: the keys transposed
    ("bhqk,bhkd->bhqd", (B, 2, 8, 7), False),   # attention times the values
    ("...qd,...dk->...qk", (B, 2, 8, 7), False),
])
def test_einsum_of_two_run_time_tensors_becomes_matmul(eq, bshape, transposed):
    """Attention written as Einsum: a batched matrix product of two run-time tensors."""
    g = _G()
    a = g.op("Reshape", "x", g.ints([B, 2, T, 8]))
    other = g.op("Mul", g.c(np.random.default_rng(4).standard_normal(bshape).astype(np.float32)), g.c(1.0))
    y = g.op("Einsum", a, other, equation=eq)
    fused = _check_fused(g.model(y), "MatMul")
    assert any(n.op_type == "Transpose" for n in fused.graph.node) == transposed


def test_einsum_of_two_run_time_tensors_that_is_no_matmul_stays():
    g = _G()
    y = g.op("Einsum", "x", "x", equation="btc,btc->bt")  # a row-wise dot product
    m = g.model(y)
    rep = recognize(m)
    assert not rep.fused and "no batched matrix product" in rep.declined[0].reason


@pytest.mark.parametrize("with_values", [False, True])
def test_einsum_batched_products_in_any_order_become_transposes_and_matmul(with_values):
    """XLNet's attention: scores 'ibnd,jbnd->bnij' (every term in its own order), then values
    'bnij,jbnd->ibnd' (the output transposed back)."""
    g = _G()
    rng = np.random.default_rng(5)
    q = g.op("Reshape", "x", g.ints([T, B, 2, 8]))  # (i, b, n, d)
    k = g.op("Mul", g.c(rng.standard_normal((9, B, 2, 8)).astype(np.float32)), g.c(1.0))
    y = g.op("Einsum", q, k, equation="ibnd,jbnd->bnij")
    if with_values:
        v = g.op("Mul", g.c(rng.standard_normal((9, B, 2, 4)).astype(np.float32)), g.c(1.0))
        y = g.op("Einsum", y, v, equation="bnij,jbnd->ibnd")
    fused = _check_fused(g.model(y), "MatMul", n_fused=2 if with_values else 1)
    assert sum(n.op_type == "Transpose" for n in fused.graph.node) == (4 if with_values else 2)  # q, k; then v and the output


def test_schema_types_follow_a_function_op_onnx_inference_leaves_untyped():
    """GroupNormalization-21 -> Relu -> Shape: ONNX inference types none of them; the schemas
    bind GroupNormalization's T to its input's type, Relu's to GroupNormalization's, and fix
    Shape's output to int64."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    from mixq.graph import GraphIndex, schema_types

    g = helper.make_graph(
        [helper.make_node("GroupNormalization", ["x", "s", "b"], ["y"], num_groups=2),
         helper.make_node("Relu", ["y"], ["z"]), helper.make_node("Shape", ["z"], ["shp"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT16, ["N", 4, 8, 8])],
        [helper.make_tensor_value_info("shp", TensorProto.INT64, [4])],
        [numpy_helper.from_array(np.ones(4, np.float16), "s"), numpy_helper.from_array(np.zeros(4, np.float16), "b")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
    types = {"x": TensorProto.FLOAT16, "s": TensorProto.FLOAT16, "b": TensorProto.FLOAT16}
    schema_types(m, types)
    assert types["y"] == types["z"] == TensorProto.FLOAT16 and types["shp"] == TensorProto.INT64
    ix = GraphIndex.of(m)
    assert ix.elem_type("z") == TensorProto.FLOAT16 and ix.shape("z") is None
