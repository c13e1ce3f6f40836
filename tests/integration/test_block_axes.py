"""Block formats share an exponent along the axis the reading op reduces: K of a MatMul's A
(its last axis) and of its B (its second-to-last), Conv's input channels. A run-time B (the
keys and values of attention, a weight-on-the-left MatMul's input) was blocked along N, which
no MX / BFP dot product computes. Checked by value in onnxruntime: the operand the MatMul reads
is in the format along K and not along the other axis."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import mixq
from mixq.formats import get_format

from ..graphs import assert_in_format, assert_not_in_format, operand

BLOCK_PRESETS = ("BFP16", "MXINT8", "MXFP8_E4M3", "MX9")


def _model(nodes, inputs, outputs, inits=None) -> onnx.ModelProto:
    g = helper.make_graph(nodes, "g", inputs, outputs,
                          [numpy_helper.from_array(v, k) for k, v in (inits or {}).items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(m, full_check=True)
    return m


def _vi(name, shape):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def _attention():
    """scores = q @ Transpose(k): B is (N, heads, 32, 40), K = 32 along axis 2."""
    m = _model([helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
                helper.make_node("MatMul", ["q", "kt"], ["y"])],
               [_vi("q", ["N", 2, 40, 32]), _vi("k", ["N", 2, 40, 32])], [_vi("y", ["N", 2, 40, 40])])
    return m, lambda rng: {"q": rng.standard_normal((2, 2, 40, 32)).astype(np.float32),
                           "k": rng.standard_normal((2, 2, 40, 32)).astype(np.float32)}, (2, 3)


def _weight_on_the_left():
    """W (16, 32) @ x (N, 32, 40): x is B, K = 32 along axis 1."""
    w = np.random.default_rng(1).standard_normal((16, 32)).astype(np.float32)
    m = _model([helper.make_node("MatMul", ["W", "x"], ["y"])], [_vi("x", ["N", 32, 40])],
               [_vi("y", ["N", 16, 40])], {"W": w})
    return m, lambda rng: {"x": rng.standard_normal((2, 32, 40)).astype(np.float32)}, (1, 2)


@pytest.mark.parametrize("preset", BLOCK_PRESETS)
@pytest.mark.parametrize("graph", [_attention, _weight_on_the_left])
def test_a_runtime_matmul_b_is_blocked_along_its_reduction_axis(preset, graph):
    m, feed, (k_axis, other) = graph()
    rng = np.random.default_rng(0)
    res = mixq.quantize(m, preset, [feed(rng) for _ in range(2)], check_kernels=False)
    fmt = mixq.get_default_config(preset).activation
    b = next(n.input[1] for n in m.graph.node if n.op_type == "MatMul")
    assert res.plan.tensors[b].block_axis == k_axis
    got = operand(res.model, "MatMul", 1, feed(rng))
    assert_in_format(got, fmt, axis=k_axis)
    assert_not_in_format(got, fmt, axis=other)  # the axis it was blocked along before


def test_a_one_dimensional_b_is_blocked_along_its_only_axis():
    m = _model([helper.make_node("MatMul", ["x", "v"], ["y"])], [_vi("x", ["N", 64]), _vi("v", [64])],
               [_vi("y", ["N"])])
    rng = np.random.default_rng(0)
    feed = lambda: {"x": rng.standard_normal((3, 64)).astype(np.float32),  # noqa: E731
                    "v": rng.standard_normal(64).astype(np.float32)}
    res = mixq.quantize(m, "MXINT8", [feed() for _ in range(2)], check_kernels=False)
    assert res.plan.tensors["v"].block_axis == 0
    assert_in_format(operand(res.model, "MatMul", 1, feed()), "mxint8", axis=0)


def test_readers_that_reduce_along_different_axes_are_named():
    """One tensor read as A by one MatMul and as B by another: one block axis per tensor, and
    the plan's reason says which reader it does not fit."""
    m = _model([helper.make_node("MatMul", ["x", "x"], ["y"], name="xx")],
               [_vi("x", ["N", 32, 32])], [_vi("y", ["N", 32, 32])])
    rng = np.random.default_rng(0)
    res = mixq.quantize(m, "MXINT8", [{"x": rng.standard_normal((2, 32, 32)).astype(np.float32)}],
                        check_kernels=False)
    tp = res.plan.tensors["x"]
    assert tp.block_axis == 2 and "'xx' along axis 1" in tp.reason


def _check_runtime_operand(m, preset, feed, op, name, k_axis):
    """Quantize `m` under `preset` and check that input 1 of its `op` (the run-time tensor
    `name`) is in the preset's format: under a block format, blocked along `k_axis` (a rank-2
    or rank-4 operand whose other candidate axis is 1 - k_axis) and not along the other."""
    res = mixq.quantize(m, preset, [feed() for _ in range(4)], check_kernels=False)
    fmt = mixq.get_default_config(preset).activation
    tp = res.plan.tensors[name]
    assert tp.format == fmt and name not in res.plan.skipped
    got = operand(res.model, op, 1, feed())
    if get_format(fmt).kind == "block":
        assert tp.block_axis == k_axis
        assert_in_format(got, fmt, axis=k_axis)
        assert_not_in_format(got, fmt, axis=1 - k_axis)
    else:
        assert_in_format(got, fmt)
    return res


@pytest.mark.parametrize("trans_b", [0, 1])
@pytest.mark.parametrize("preset", ["MXINT8", "A8W8"])
def test_a_gemms_runtime_b_is_quantized_along_k(trans_b, preset):
    """A Gemm whose B is computed at run time was left float under every preset ("no quantized
    op reads or writes it as an activation", though the Gemm reads it): it is an operand like A,
    blocked along K (axis 0, or 1 with transB)."""
    bshape = [40, 32] if trans_b else [32, 40]
    m = _model([helper.make_node("Gemm", ["a", "b", "c"], ["y"], transB=trans_b)],
               [_vi("a", [4, 32]), _vi("b", bshape)], [_vi("y", [4, 40])],
               {"c": np.full(40, 3.0, np.float32)})
    rng = np.random.default_rng(0)
    feed = lambda: {"a": rng.standard_normal((4, 32)).astype(np.float32),  # noqa: E731
                    "b": rng.standard_normal(bshape).astype(np.float32)}
    res = _check_runtime_operand(m, preset, feed, "Gemm", "b", trans_b)
    assert res.fidelity.outputs[0].sqnr_db > 30.0  # the int32 bias at a's scale x b's scale


@pytest.mark.parametrize("op", ["Conv", "ConvTranspose"])
@pytest.mark.parametrize("preset", ["MXINT8", "A8W8"])
def test_a_convs_runtime_weight_is_quantized_along_its_input_channels(op, preset):
    """A Conv weight computed at run time (a dynamic filter) was left float with the reason that
    no quantized op reads it: it is an operand, blocked along the input channels (W's axis 1
    for Conv, axis 0 for ConvTranspose)."""
    wshape = [4, 8, 3, 3] if op == "Conv" else [8, 4, 3, 3]
    m = _model([helper.make_node(op, ["x", "w"], ["y"], pads=[1, 1, 1, 1])],
               [_vi("x", [2, 8, 8, 8]), _vi("w", wshape)], [_vi("y", [2, 4, 8, 8])])
    rng = np.random.default_rng(0)
    feed = lambda: {"x": rng.standard_normal((2, 8, 8, 8)).astype(np.float32),  # noqa: E731
                    "w": rng.standard_normal(wshape).astype(np.float32)}
    res = _check_runtime_operand(m, preset, feed, op, "w", 1 if op == "Conv" else 0)
    assert res.fidelity.outputs[0].sqnr_db > 25.0


@pytest.mark.parametrize("preset", ["A16W8", "A8W8", "BF16"])
@pytest.mark.parametrize("shape,axis", [(["N", 64, 8], 1), (["N", 64], 1)])
def test_a_block_override_no_reader_reduces_takes_the_default_axis(preset, shape, axis):
    """A tensor_formats override of a block format on a pass-through op's output that no op
    reads in a block format (a Slice read by a Neg, which mixq leaves float, in a rotary
    embedding): no reader named an axis, and the rewrite stopped with "mxint8 needs `axis`". It
    takes the producers' default (the channels of a rank-3..5 tensor, else the last axis), and
    the plan says so."""
    rank = len(shape)
    w = np.random.default_rng(1).standard_normal((64, 64)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "W"], ["c"]) if rank == 2 else
             helper.make_node("Conv", ["x", "W4"], ["c"]), helper.make_node("Identity", ["c"], ["h"]),
             helper.make_node("Neg", ["h"], ["y"])]
    inits = {"W": w} if rank == 2 else {"W4": w.reshape(64, 64, 1)}
    m = _model(nodes, [_vi("x", shape)], [_vi("y", shape)], inits)
    rng = np.random.default_rng(0)
    feed = lambda: {"x": rng.standard_normal([2, *shape[1:]]).astype(np.float32)}  # noqa: E731
    cfg = mixq.get_default_config(preset).with_options(tensor_formats=(("h", "mxint8"),))
    res = mixq.quantize(m, cfg, [feed() for _ in range(2)], check_kernels=False)
    tp = res.plan.tensors["h"]
    assert tp.format == "mxint8" and tp.block_axis == axis and "the default" in tp.reason
    assert_in_format(operand(res.model, "Neg", 0, feed()), "mxint8", axis=axis)
