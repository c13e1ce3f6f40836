"""Numerically fragile normalizations stay float in the bf16 converters (issue 18): the detector
on small graphs, and the fidelity of every bf16 format on an E[x^2]-E[x]^2 LayerNorm."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from mixq.convert import BF16_FORMATS, to_bf16
from mixq.convert._fragile import REASON_CANCEL, REASON_NORM, REASON_RMS, find_fragile
from mixq.convert.testing import layernorm_cancel_model

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def _names(g: onnx.GraphProto, regions) -> dict[str, str]:
    return {g.node[k].name: r.reason for r in regions for k in r.nodes}


@pytest.mark.parametrize("form", ["mul", "pow", "sum"])
def test_detector_finds_the_cancelling_variance_and_its_normalization(form):
    m = layernorm_cancel_model(form=form)
    found = _names(m.graph, find_fragile(m.graph))
    inner = {"mean_x", "sq_x", "mean_xx", "sq_mean", "var", "var_eps", "std", "center", "normalize"}
    inner |= {"sum_x", "sum_xx"} if form == "sum" else set()
    assert set(found) == inner  # the affine (gamma, beta) and the projection are not fragile
    assert set(found.values()) == {REASON_CANCEL}


def _graph(nodes, d=16, inits=None):
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, d])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          initializer=[numpy_helper.from_array(np.asarray(v, np.float32), k)
                                       for k, v in (inits or {}).items()])
    return g


def test_detector_written_out_layernorm_and_rmsnorm_but_not_a_loss():
    mk = helper.make_node
    ln = _graph([mk("ReduceMean", ["x"], ["m"], name="m", axes=[-1]), mk("Sub", ["x", "m"], ["d"], name="d"),
                 mk("Pow", ["d", "two"], ["d2"], name="d2"), mk("ReduceMean", ["d2"], ["v"], name="v", axes=[-1]),
                 mk("Add", ["v", "eps"], ["ve"], name="ve"), mk("Sqrt", ["ve"], ["s"], name="s"),
                 mk("Div", ["d", "s"], ["n"], name="n"), mk("Mul", ["n", "g"], ["y"], name="g")],
                inits={"two": 2.0, "eps": 1e-5, "g": np.ones(16)})
    assert _names(ln, find_fragile(ln)) == {k: REASON_NORM for k in ("m", "d", "d2", "v", "ve", "s", "n")}
    rms = _graph([mk("Mul", ["x", "x"], ["x2"], name="x2"), mk("ReduceMean", ["x2"], ["v"], name="v", axes=[-1]),
                  mk("Add", ["v", "eps"], ["ve"], name="ve"), mk("Sqrt", ["ve"], ["s"], name="s"),
                  mk("Reciprocal", ["s"], ["r"], name="r"), mk("Mul", ["x", "r"], ["y"], name="n")],
                 inits={"eps": 1e-6})
    assert _names(rms, find_fragile(rms)) == {k: REASON_RMS for k in ("x2", "v", "ve", "s", "r", "n")}
    loss = _graph([mk("Mul", ["x", "x"], ["x2"], name="x2"), mk("ReduceMean", ["x2"], ["y"], name="v")])
    assert find_fragile(loss) == []


@pytest.mark.parametrize("mu", [3.0, 6.0])
@pytest.mark.parametrize("fmt", BF16_FORMATS)
def test_cancelling_layernorm_keeps_35_db(fmt, mu):
    """x ~ N(mu, 1), d = 64: E[x^2] and E[x]^2 are ~mu^2 apart by 1. Before the fix with_cast and
    customqdq gave 32.9 dB (mu 3) and 21.8 dB (mu 6); now ~47 dB (simulate_bf16 and bf16 ~52)."""
    m = layernorm_cancel_model(d=64)
    x = (mu + np.random.default_rng(1).standard_normal((4, 16, 64))).astype(np.float32)
    out, rep = to_bf16(m, fmt, feeds={"x": x})
    assert rep.min_sqnr_db >= 35.0, rep.to_markdown()
    kept = {k.node for k in rep.kept_float if "fragile" in k.reason}
    assert {"var", "mean_xx", "normalize"} <= kept
    assert REASON_CANCEL in rep.to_markdown()
    # the variance is really computed in float: no bfloat16 Cast/function between its terms
    prod = {o: n for n in out.graph.node for o in n.output}
    sub = next(n for n in out.graph.node if n.name == "var")
    for i in sub.input:
        assert prod[i].name in ("mean_xx", "sq_mean"), prod[i].op_type
    # the projection after it still reads bfloat16-rounded values
    if fmt in ("with_cast", "customqdq"):
        proj = next(n for n in out.graph.node if n.name == "proj")
        assert prod[proj.input[0]].op_type in ("Cast", "BFloat16Dequantize")


def test_scalar_weights_stay_exact_in_the_rounding_formats():
    """x * s + t with one-element s, t (a learned affine, as in PP-LCNetV3): rounding s to bf16
    scales the whole tensor by the same wrong factor. They stay exact (and are reported); the
    matrix weight is still rounded."""
    rng = np.random.default_rng(0)
    s, t = np.float32(1.0029296875 + 2 ** -12), np.float32(-0.30078125 - 2 ** -13)  # not bf16 values
    w = rng.standard_normal((16, 16)).astype(np.float32)
    mk = helper.make_node
    # after a layer (on a graph input the pair would be the input standardization, kept float)
    g = helper.make_graph([mk("Relu", ["x"], ["xr"], name="act"), mk("Mul", ["xr", "s"], ["xs"], name="scale"),
                           mk("Add", ["xs", "t"], ["xt"], name="shift"),
                           mk("MatMul", ["xt", "w"], ["y"], name="mm")], "aff",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 16])],
                          initializer=[numpy_helper.from_array(np.array(s), "s"), numpy_helper.from_array(np.array(t), "t"),
                                       numpy_helper.from_array(w, "w")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    for fmt in ("with_cast", "customqdq", "simulate_bf16"):
        out, rep = to_bf16(m, fmt, evaluate=False)
        inits = {i.name: numpy_helper.to_array(i) for i in out.graph.initializer}
        assert inits["s"] == s and inits["t"] == t, fmt
        assert any("2 one-element weight(s)" in n for n in rep.notes), rep.notes
        stored = [a for k, a in inits.items() if a.size == 256]
        assert stored and (stored[0].dtype != np.float32 or not np.array_equal(stored[0], w)), fmt


@pytest.mark.parametrize("fmt", BF16_FORMATS)
def test_constant_shared_with_a_fragile_node_is_split(fmt):
    """A Constant read by the normalization (the eps Add) and by a node after it: the
    normalization reads an exact copy, the other node the bfloat16-rounded value."""
    m = layernorm_cancel_model()
    g = m.graph
    c = np.full(64, 1.001, np.float32)  # 1.001 is not a bfloat16 value; 1.0 is the nearest
    g.node.insert(0, helper.make_node("Constant", [], ["cvec"], name="cvec", value=numpy_helper.from_array(c)))
    next(n for n in g.node if n.name == "var_eps").input[1] = "cvec"
    g.node.append(helper.make_node("Add", ["y", "cvec"], ["y2"], name="after"))
    g.output[0].name = "y2"
    x = (3 + np.random.default_rng(1).standard_normal((4, 16, 64))).astype(np.float32)
    out, rep = to_bf16(m, fmt, feeds={"x": x})
    assert rep.min_sqnr_db >= 35.0
    vals = {t.name: numpy_helper.to_array(t) for t in out.graph.initializer}
    vals.update({n.output[0]: numpy_helper.to_array(n.attribute[0].t) for n in out.graph.node
                 if n.op_type == "Constant"})
    eps_in = next(n for n in out.graph.node if n.name == "var_eps").input[1]
    assert np.array_equal(vals[eps_in], c)
    after = next(n for n in out.graph.node if n.name == "after").input[1]
    prod = {o: n for n in out.graph.node for o in n.output}
    if after in vals:
        assert np.all(vals[after] == 1.0)
    else:  # bfloat16-stored, widened by a Cast / BFloat16Dequantize
        assert prod[after].op_type in ("Cast", "BFloat16Dequantize")


def test_input_standardization_stays_float():
    """(x - mean) / std on a graph input keeps float (a year of 2020 +- 3: bfloat16 spaces it by
    8, and rounds the mean as much); a scaling alone (x / 255) and constants applied after a
    layer are converted."""
    from mixq.convert._fragile import REASON_AFFINE, find_input_affine

    mk = helper.make_node
    c = lambda v, n: numpy_helper.from_array(np.asarray(v, np.float32), n)  # noqa: E731
    g = helper.make_graph([mk("Sub", ["x", "mean"], ["xc"]), mk("Div", ["xc", "std"], ["z"]),
                           mk("Div", ["img", "k255"], ["im"]), mk("Relu", ["z"], ["r"]), mk("Add", ["r", "b"], ["y"])],
                          "std", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4]),
                                  helper.make_tensor_value_info("img", TensorProto.FLOAT, [2, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4]),
                           helper.make_tensor_value_info("im", TensorProto.FLOAT, [2, 4])],
                          [c([2020, 350, 45, 0], "mean"), c([3, 40, 0.5, 1], "std"), c(255, "k255"), c(0.1, "b")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    regions = find_input_affine(m)
    assert [sorted(r.nodes) for r in regions] == [[0, 1]] and regions[0].reason == REASON_AFFINE
