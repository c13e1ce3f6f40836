"""Shape arithmetic done in float stays float: a torch export computes a Reshape target as
`ceil(H / patch) * patch` or `H * W / 4` on Cast(Shape(x)) values (MobileViT's unfolding), and
one rounding of those exact integers makes the quantized model fail, or reshape wrongly. The
2x range headroom of 16-bit grids broke MobileViT A16W8 that way (`python -m bench.zoo_sweep`);
the bfloat16 converter's Casts break any target past 256 with more than 8 significant bits."""
from __future__ import annotations

import dataclasses

import numpy as np
import onnx
import pytest

import mixq
from mixq.config import get_default_config
from mixq.convert import to_bf16, to_fp16
from mixq.convert._fragile import REASON_SHAPE
from mixq.errors import ConfigError
from mixq.plan.ops import SHAPE_ONLY_REASON, shape_only_tensors
from tests import graphs

# target shape [N, 8, H*W/4, 4], computed in float from the Conv output's shape; the data is
# scaled by 1/sqrt(W), also computed from the shape (a float operand of a quantized Mul)
TEXT = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[N, 8, H, W] x, float[8, 8, 3, 3] w) => (float[N, 8, A, 4] y) {
  c = Conv <pads = [1, 1, 1, 1]> (x, w)
  s = Shape (c)
  sf = Cast <to = 1> (s)
  z = Constant <value = int64[1] {0}> ()
  two = Constant <value = int64[1] {2}> ()
  three = Constant <value = int64[1] {3}> ()
  four = Constant <value = int64[1] {4}> ()
  four_f = Constant <value = float[1] {4.0}> ()
  one_f = Constant <value = float[1] {1.0}> ()
  n8 = Slice (sf, z, two)
  h = Slice (sf, two, three)
  wd = Slice (sf, three, four)
  hw = Mul (h, wd)
  q = Div (hw, four_f)
  tgt_f = Concat <axis = 0> (n8, q, four_f)
  tgt = Cast <to = 7> (tgt_f)
  root = Sqrt (wd)
  inv = Div (one_f, root)
  cs = Mul (c, inv)
  y = Reshape (cs, tgt)
}
"""


@pytest.fixture(scope="module")
def model() -> onnx.ModelProto:
    return graphs.model(TEXT, w=(8, 8, 3, 3))


def test_shape_only_tensors_are_those_computed_from_shapes_alone(model):
    got = shape_only_tensors(model.graph.node, set())
    assert {"s", "sf", "n8", "h", "wd", "hw", "q", "tgt_f", "tgt", "root", "inv"} <= got
    assert not {"c", "cs", "y", "z", "four_f"} & got  # data, and constants alone


@pytest.mark.parametrize("preset", ["A8W8", "A16W8", "XINT8", "S16S16", "BF16", "BFP16"])
def test_float_shape_arithmetic_is_left_float_and_the_model_reshapes_like_float(model, preset):
    feeds = graphs.feeds(model, n=4, batch=2)
    res = mixq.quantize(model, preset, calibration_data=feeds)
    scope = get_default_config(preset).op_types
    for t, op in (("q", "Div"), ("tgt_f", "Concat"), ("inv", "Div")):
        assert t not in res.plan.tensors, (t, res.plan.tensors.get(t))
        if scope is None or op in scope:  # else: "op type Div is not in op_types"
            assert SHAPE_ONLY_REASON in res.plan.skipped[t], res.plan.skipped[t]
    assert res.plan.tensors["x"].format is not None  # the data path is still quantized
    for x in (feeds[0]["x"], np.random.default_rng(5).standard_normal((3, 8, 10, 6)).astype(np.float32)):
        ref = graphs.run(model, {"x": x})[0]
        got = graphs.run(res.model, {"x": x})[0]
        assert got.shape == ref.shape == (x.shape[0], 8, x.shape[2] * x.shape[3] // 4, 4)
        err = float(np.sum((got - ref) ** 2)) / float(np.sum(ref ** 2))
        assert err < 0.05, (preset, err)  # 8-bit noise of a random Conv: 1.3 % at A8W8


@pytest.mark.parametrize("convert,fmt", [(to_bf16, "with_cast"), (to_bf16, "customqdq"), (to_bf16, "bf16"),
                                         (to_bf16, "simulate_bf16"), (to_fp16, "with_cast"), (to_fp16, "fp16")])
def test_the_float_converters_keep_shape_arithmetic_exact(model, convert, fmt):
    # 34 x 34 = 1156 has 9 significant bits: bfloat16 made the target 288 rows, not 289
    x = np.random.default_rng(0).standard_normal((1, 8, 34, 34)).astype(np.float32)
    out, rep = convert(model, fmt, feeds={"x": x})
    got, ref = graphs.run(out, {"x": x})[0], graphs.run(model, {"x": x})[0]
    assert got.shape == ref.shape == (1, 8, 289, 4)
    assert np.allclose(got, ref, atol=0.05), float(np.abs(got - ref).max())
    kept = [k.op_type for k in rep.kept_float if k.reason == REASON_SHAPE]
    assert len(kept) >= 8, rep.kept_float  # Slice x3, Mul, Div, Concat, Sqrt, Div (Casts too)


def test_overrides_on_shape_arithmetic_are_honoured_or_refused(model):
    """A tensor override wins where a quantized op reads the tensor (the Mul's scale); where no
    quantized op reads or writes it, the override would change nothing: an error, not a no-op."""
    feeds = graphs.feeds(model, n=2)
    # (the Mul after the Conv ends the graph: a post-processing tail, quantized on request)
    cfg = dataclasses.replace(get_default_config("A8W8"), tensor_formats=(("inv", "int16"),), quantize_tail=True)
    res = mixq.quantize(model, cfg, calibration_data=feeds)
    assert res.plan.tensors["inv"].format == "int16" and res.plan.tensors["inv"].reason == "tensor override"
    cfg = dataclasses.replace(get_default_config("A8W8"), tensor_formats=(("q", "int8"),))
    with pytest.raises(ConfigError, match=r"tensor 'q'.*would change nothing"):
        mixq.quantize(model, cfg, calibration_data=feeds)
