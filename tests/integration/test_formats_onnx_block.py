"""Block-format ONNX: the emitted model-local functions pass check_model(full_check=True) and
compute exactly the float32 bits of BlockFormat.fake_quant in stock onnxruntime."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mixq.errors import FormatError
from mixq.formats import MIXQ_DOMAIN, Rounding, get_format
from mixq.formats.block import BLOCK_FORMATS
from mixq.formats.onnx_util import run_emission  # runs check_model(full_check=True) first

ALL = list(BLOCK_FORMATS) + ["bfp(block=16,exp=8,mant=4)", "bfp(block=5,exp=4,mant=3)",
                             "bfp(block=32,exp=8,mant=23)", "bfp(block=12,exp=6,mant=10,sub=3)"]
BIG = np.finfo(np.float32).max


def assert_same_bits(got: np.ndarray, want: np.ndarray) -> None:
    got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
    assert got.shape == want.shape
    nan = np.isnan(want)
    np.testing.assert_array_equal(np.isnan(got), nan)
    bad = np.nonzero(got.view(np.int32)[~nan] != want.view(np.int32)[~nan])[0]
    assert bad.size == 0, f"{bad.size} mismatches, e.g. got {got[~nan][bad[:4]]} want {want[~nan][bad[:4]]}"


def tensor(shape: tuple[int, ...], seed: int, specials: bool = True) -> np.ndarray:
    """Random values over a wide exponent range plus zero blocks, subnormals, huge, NaN, inf."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * np.exp2(rng.uniform(-30, 30, shape))).astype(np.float32)
    flat = x.reshape(-1)
    n = flat.size
    flat[: min(n, 70)] = 0.0  # whole zero blocks (and -0.0 below)
    flat[rng.random(n) < 0.02] = -0.0
    sub = rng.random(n) < 0.03
    flat[sub] = rng.integers(-2 ** 23, 2 ** 23, sub.sum()).astype(np.float32) * np.float32(2.0 ** -149)
    huge = rng.random(n) < 0.01
    flat[huge] = rng.uniform(-BIG, BIG, huge.sum()).astype(np.float32)
    if specials and n > 400:
        flat[rng.integers(0, n, 3)] = np.nan
        flat[rng.integers(0, n, 2)] = np.inf
        flat[rng.integers(0, n, 2)] = -np.inf
    return x


CASES = [((1, 64, 56, 56), 1), ((256, 256, 3, 3), 1), ((37, 100), -1), ((3, 70, 5), 1),
         ((45, 6), 0), ((2, 3, 33), -1), ((4, 21, 2, 3), -3)]


@pytest.mark.parametrize("name", ALL)
class TestEmission:
    def test_bit_exact(self, name):
        fmt = get_format(name)
        for i, (shape, axis) in enumerate(CASES):
            x = tensor(shape, seed=i)
            (y,) = run_emission(fmt.emit("x", "y", axis=axis, prefix="q"), {"x": x})
            assert_same_bits(y, fmt.fake_quant(x, axis=axis))

    def test_subnormal_and_extreme_blocks(self, name):
        fmt = get_format(name)
        rng = np.random.default_rng(7)
        rows = [rng.integers(-40, 40, 64).astype(np.float32) * np.float32(2.0 ** -149),  # subnormal max
                np.full(64, 2.0 ** -126, np.float32), np.zeros(64, np.float32),
                np.full(64, -BIG, np.float32), rng.uniform(-BIG, BIG, 64).astype(np.float32),
                np.exp2(np.arange(-64, 0)).astype(np.float32) * 3]
        x = np.stack(rows)
        # the general view, and the views that end at the block axis (axis -1; known dims)
        for axis, shape in ((1, None), (-1, None), (1, x.shape)):
            (y,) = run_emission(fmt.emit("x", "y", axis=axis, prefix="q", shape=shape), {"x": x})
            assert_same_bits(y, fmt.fake_quant(x, axis=1))

    def test_bit_exact_at_an_older_opset(self, name):
        """The functions at opset 21 (no BitCast: a model with an op onnxruntime runs at 21 and
        not at 26, RoiAlign) compute the same bits, extreme blocks included, activations and
        weights."""
        fmt = get_format(name)
        for i, (shape, axis) in enumerate(CASES[2:], start=2):
            x = tensor(shape, seed=i)
            em = fmt.emit("x", "y", axis=axis, prefix="q", opset=21)
            (y,) = run_emission(em, {"x": x})
            assert_same_bits(y, fmt.fake_quant(x, axis=axis))
        rng = np.random.default_rng(7)
        x = np.stack([rng.integers(-40, 40, 64).astype(np.float32) * np.float32(2.0 ** -149),
                      np.full(64, 2.0 ** -126, np.float32), np.zeros(64, np.float32),
                      rng.uniform(-BIG, BIG, 64).astype(np.float32), np.exp2(np.arange(-64, 0)).astype(np.float32)])
        (y,) = run_emission(fmt.emit("x", "y", axis=1, prefix="q", opset=21), {"x": x})
        assert_same_bits(y, fmt.fake_quant(x, axis=1))
        assert em.opsets[""] == 21 and em.functions[0].name.endswith("_o21")
        assert [i.version for i in em.functions[0].opset_import] == [21]
        assert not any(n.op_type == "BitCast" for n in em.functions[0].node)
        w = tensor((16, 40, 3), seed=3, specials=False)
        (wy,) = run_emission(fmt.emit_weight(w, "wq", axis=1, prefix="w0", opset=21), {})
        assert_same_bits(wy, fmt.fake_quant(w, axis=1))
        with pytest.raises(FormatError, match="opset 21 or newer"):
            fmt.emit("x", "y", axis=1, prefix="q", opset=17)

    def test_emission_shape(self, name):
        fmt = get_format(name)
        em = fmt.emit("in", "out", axis=-1, prefix="p")
        assert len(em.nodes) == 1 and em.nodes[0].domain == MIXQ_DOMAIN
        assert em.nodes[0].op_type == em.functions[0].name == fmt.function_name(-1)
        assert em.opsets == {"": fmt.onnx_opset, MIXQ_DOMAIN: 1} and fmt.onnx_opset >= 24
        assert not em.initializers

    def test_weight(self, name):
        fmt = get_format(name)
        w = tensor((16, 40, 3), seed=3, specials=False)
        em = fmt.emit_weight(w, "wq", axis=1, prefix="w0")
        (y,) = run_emission(em, {})
        assert_same_bits(y, fmt.fake_quant(w, axis=1))
        assert em.nodes[0].domain == MIXQ_DOMAIN  # the format stays visible to a backend
        assert em.nodes[0].op_type.endswith("_const")  # the variant onnxruntime can fold


@pytest.mark.parametrize("name", ALL)
def test_aligned_variant(name):
    """A shape whose axis length is known selects a variant with a constant view (one Reshape,
    after a constant Pad when the length is not a multiple of the block); it gives the same
    bits, for any run-time size of the other dims (zero included)."""
    import onnxruntime as ort
    from onnx import TensorProto

    from mixq.formats.onnx_util import emission_to_model

    fmt = get_format(name)
    n = 3 * fmt.block_size
    # a short axis (fewer elements than one block, whole sub-blocks) is one block: issue 19
    short = max(fmt.sub_block, (fmt.block_size // 2) // fmt.sub_block * fmt.sub_block)
    # known dims after the axis (post) make the view's target a constant (issue 19)
    cases = [(["N", n, "H", "W"], 1), ([n, "M"], 0), (["N", n], -1), (["A", 2, n], 2),
             (["N", short, "H", "W"], 1), (["N", short], -1), (["N", n, 3, 5], 1),
             (["N", short, 2, 3], 1), (["N", "C", n, 4], 2),
             # lengths that are not whole blocks (88 or 200 channels under 32-element blocks):
             # padded by constants, for unknown and known trailing dims and on the last axis
             (["N", n + 1, "H", "W"], 1), (["N", n + 5, 3, 2], 1), (["N", n + 3], -1),
             (["N", 1, "T"], 1), (["A", "B", n - 1, "C"], 2)]
    for k, (dims, axis) in enumerate(cases):
        n = dims[axis]
        shape = tuple(d if isinstance(d, int) else None for d in dims)
        em = fmt.emit("x", "y", axis=axis, prefix="q", shape=shape)
        tail = dims[axis % len(dims) + 1:]
        post = int(np.prod(tail)) if all(isinstance(t, int) for t in tail) else None
        rank = len(dims) if post is None else None
        assert em.functions[0].name == fmt.function_name(axis % len(dims), length=n, post=post,
                                                         rank=rank)
        # no shape op computes the view per call: the targets, pads and cut are constants
        ops = [nd.op_type for nd in em.functions[0].node]
        assert ops.count("Shape") <= 1 and "Concat" not in ops and "ReduceProd" not in ops, ops
        model = emission_to_model(em, {"x": TensorProto.FLOAT}, input_shapes={"x": dims})
        sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        for j, size in enumerate((1, 3, 0)):
            concrete = tuple(d if isinstance(d, int) else size for d in dims)
            x = tensor(concrete, seed=10 * k + j)
            (y,) = sess.run(None, {"x": x})
            assert_same_bits(y, fmt.fake_quant(x, axis=axis))
    # the same views in the functions of an older opset (no BitCast; RoiAlign models)
    dims = ["N", 3 * fmt.block_size + 1, "H"]
    em = fmt.emit("x", "y", axis=1, prefix="q", shape=(None, dims[1], None), opset=21)
    model = emission_to_model(em, {"x": TensorProto.FLOAT}, input_shapes={"x": dims})
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    x = tensor((2, dims[1], 3), seed=99)
    assert_same_bits(sess.run(None, {"x": x})[0], fmt.fake_quant(x, axis=1))
    # an unknown length keeps the general function; on the last axis of a known rank, the one
    # of axis -1 (its view ends at the block axis: test_reductions_never_end_on_a_unit_dim)
    n = 3 * fmt.block_size
    assert fmt.emit("x", "y", axis=1, prefix="q", shape=(None, None, 3)).functions[0].name == fmt.function_name(1)
    assert fmt.emit("x", "y", axis=1, prefix="q").functions[0].name == fmt.function_name(1)
    assert fmt.emit("x", "y", axis=1, prefix="q", shape=(None, None)).functions[0].name == fmt.function_name(-1)


@pytest.mark.parametrize("name", ["bfp16", "mx6", "mxint8", "bfp(block=5,exp=4,mant=3)"])
def test_half_away_emission(name):
    fmt = get_format(name)
    x = tensor((6, 40), seed=11)
    ties = (np.arange(240, dtype=np.float32).reshape(6, 40) - 120) * np.float32(0.5) ** 7 + np.float32(2.0 ** -8)
    x = np.concatenate([x, ties, np.float32(0.5 - 2.0 ** -25) * np.ones((1, 40), np.float32)])
    em = fmt.emit("x", "y", axis=1, prefix="q", rounding=Rounding.HALF_AWAY)
    assert em.functions[0].name.endswith("_away")
    (y,) = run_emission(em, {"x": x})
    assert_same_bits(y, fmt.fake_quant(x, axis=1, rounding=Rounding.HALF_AWAY))


def test_float_elements_reject_half_away():
    with pytest.raises(FormatError):
        get_format("mxfp4").emit("x", "y", axis=0, prefix="q", rounding=Rounding.HALF_AWAY)


def test_functions_are_per_format_axis():
    em = get_format("mxfp4").emit("a", "b", axis=1, prefix="p")
    em.extend(get_format("mxfp4").emit("b", "c", axis=1, prefix="p2"))
    em.extend(get_format("mxfp4").emit("c", "d", axis=-1, prefix="p3"))
    assert sorted(f.name for f in em.functions) == ["MXFP4_axis1", "MXFP4_axism1"]
    assert get_format("bfp(block=16,exp=8,mant=4)").function_name(0) == "BFP_B16_E8_M4_axis0"


# -- dynamic shapes: the function must not depend on static dims, and must keep x's symbolic
#    shape on its output (onnxruntime plans memory with it; see _block_onnx) ------------------------
DYN_CASES = [(["N", 64, "H", "W"], 1, [(1, 64, 7, 9), (3, 64, 5, 4), (0, 64, 2, 2)]),
             (["N", "C", "H", "W"], 1, [(2, 37, 3, 3), (1, 70, 2, 5)]),
             (["N", 70], -1, [(5, 70), (1, 70)]),
             (["N", "L"], -1, [(3, 45), (2, 17)]),
             (["N", 21, "T"], 1, [(2, 21, 6), (1, 21, 11)]),
             (["N", 6, "K"], -2, [(4, 6, 3), (2, 6, 7)]),
             (["N", 12], 0, [(45, 12), (7, 12)])]


def _dynamic_session(fmt, shape, axis, calls=1):
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper

    from mixq.formats.base import Emission
    from mixq.formats.onnx_util import emission_to_model

    em, cur = Emission(), "x"
    for i in range(calls):
        em.extend(fmt.emit(cur, f"y{i}", axis=axis, prefix=f"q{i}"))
        if i + 1 < calls:
            em.nodes.append(helper.make_node("Abs", [f"y{i}"], [f"r{i}"], name=f"abs{i}"))
            cur = f"r{i}"
    model = emission_to_model(em, {"x": TensorProto.FLOAT}, output_names=[f"y{calls - 1}"],
                              input_shapes={"x": shape})
    onnx.checker.check_model(model, full_check=True)
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("name", ["bfp16", "mx6", "mxint8", "mxfp8_e4m3", "mxfp6_e3m2", "mxfp4",
                                  "bfp(block=5,exp=4,mant=3)", "bfp(block=12,exp=6,mant=10,sub=3)"])
def test_dynamic_shapes(name):
    fmt = get_format(name)
    for k, (shape, axis, concrete) in enumerate(DYN_CASES):
        sess = _dynamic_session(fmt, shape, axis)
        assert sess.get_outputs()[0].shape == shape  # the output keeps x's symbolic shape
        for j, cshape in enumerate(concrete):
            x = tensor(cshape, seed=100 * k + j)
            (y,) = sess.run(None, {"x": x})
            assert_same_bits(y, fmt.fake_quant(x, axis=axis))


@pytest.mark.parametrize("name", ["bfp16", "mx9", "mxfp4"])
def test_dynamic_chain(name):
    fmt = get_format(name)
    sess = _dynamic_session(fmt, ["N", 64, "H", "W"], 1, calls=3)
    for j, cshape in enumerate([(1, 64, 6, 6), (2, 64, 3, 10)]):
        x = tensor(cshape, seed=j)
        want = x
        for i in range(3):
            want = fmt.fake_quant(want, axis=1)
            if i < 2:
                want = np.abs(want)
        (y,) = sess.run(None, {"x": x})
        assert_same_bits(y, want)


@pytest.mark.parametrize("name", ["bfp16", "mx9", "mxfp4", "mxfp8_e4m3"])
def test_no_tensor_with_unknown_dims(name):
    """onnxruntime's memory planner scans its whole free list for each output whose shape has
    unknown dims (and keeps them there): such tensors made session creation quadratic in the
    number of calls. Besides one sliced shape vector, every tensor of the inlined body must have
    x's symbolic dims, static dims, or no shape at all."""
    import onnx
    import onnx.inliner
    import onnxruntime as ort
    from onnx import TensorProto, helper

    from mixq.formats.onnx_util import emission_to_model

    fmt = get_format(name)
    model = emission_to_model(fmt.emit("x", "y", axis=1, prefix="q"), {"x": TensorProto.FLOAT},
                              output_names=["y"], input_shapes={"x": ["N", 64, "H", "W"]})
    _assert_no_unknown_dims(model, ["Reshape", "Slice"])
    # the constant-target view of known trailing dims keeps x's symbolic batch dim
    model = emission_to_model(fmt.emit("x", "y", axis=1, prefix="q", shape=(None, 64, 7, 7)),
                              {"x": TensorProto.FLOAT}, output_names=["y"],
                              input_shapes={"x": ["N", 64, 7, 7]})
    assert model.functions[0].name.endswith("_p49")
    _assert_no_unknown_dims(model, ["Reshape"])  # the alias back to x's shape
    # views that end at the block axis (per-block tensors without their block dims)
    for dims, axis, allowed in ((["N", 16, 384], 2, ["Reshape"]), (["N", 64, 1, 1], 1, ["Reshape"]),
                                (["N", 16, "L"], 2, ["Reshape", "Slice"]), (["N", "L"], -1, ["Reshape", "Slice"])):
        shape = tuple(d if isinstance(d, int) else None for d in dims)
        model = emission_to_model(fmt.emit("x", "y", axis=axis, prefix="q", shape=shape),
                                  {"x": TensorProto.FLOAT}, output_names=["y"], input_shapes={"x": dims})
        _assert_no_unknown_dims(model, allowed)


def _assert_no_unknown_dims(model, allowed):
    import onnx
    import onnx.inliner
    import onnxruntime as ort
    from onnx import helper

    model = onnx.inliner.inline_local_functions(model)
    ops = {o: n.op_type for n in model.graph.node for o in n.output}
    del model.graph.output[:]
    for o, op in ops.items():
        if op != "Constant":
            model.graph.output.append(helper.make_empty_tensor_value_info(o))
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    unknown = [(ops[o.name], o.shape) for o in sess.get_outputs() if None in o.shape]
    # the sliced shape vector (planned once per call) and the Reshape back to x's rank (an alias:
    # never planned) are the only ones
    assert sorted(op for op, _ in unknown) == allowed, unknown


@pytest.mark.parametrize("element", sorted({get_format(n).element for n in BLOCK_FORMATS} - {"int"}))
def test_element_rounding_on_whole_binades(element):
    """The arithmetic element rounding of the block functions (_round_to_element: Veltkamp
    splitting, no float8 Cast) against the NumPy reference on every float32 of the binades where
    it can go wrong: half the smallest subnormal step (ties to zero), the binade below the
    smallest normal, the smallest normal binade and the top binade (saturation), both signs."""
    from mixq.formats._block_onnx import _Body, _round_to_element
    from mixq.formats.floating import FP_FORMATS
    from onnx import TensorProto, helper
    import onnxruntime as ort

    ef = FP_FORMATS[element]
    b = _Body()
    b.op("Identity", _round_to_element(b, "x", ef), out="y")
    graph = helper.make_graph(b.nodes, "round", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    m = ef.mantissa_bits
    for e in (ef.min_exp - m - 1, ef.min_exp - 1, ef.min_exp, ef.emax):
        first = np.array(2.0 ** e, np.float32).view(np.uint32)
        x = np.arange(first, first + (1 << 23), dtype=np.uint32).view(np.float32)
        x = np.concatenate([x, -x[::3], np.float32([0.0, -0.0])])
        (got,) = sess.run(None, {"x": x})
        assert_same_bits(got, ef.round_elements(x).astype(np.float32))


@pytest.mark.parametrize("name", ["bfp16", "mx9", "mxint8", "mxfp8_e4m3", "mxfp4"])
def test_nan_flag_of_huge_finite_and_nonfinite_blocks(name):
    """The per-block NaN flag comes from the sum of |v| (NaN: a NaN in the block) and the block
    maximum (inf): a block of huge finite values whose sum overflows stays finite (issue 19: the
    flag reuses |v| instead of a full-size Mul(v, 0))."""
    fmt = get_format(name)
    B = fmt.block_size
    x = np.ones((4, 2 * B), np.float32)
    x[0, :4] = [BIG, BIG, -BIG, BIG]  # sum of |v| overflows to inf; no inf in the block
    x[1, 3] = np.inf
    x[2, B + 1] = np.nan
    x[3, :2] = [np.inf, np.nan]
    (y,) = run_emission(fmt.emit("x", "y", axis=1, prefix="q"), {"x": x})
    ref = fmt.fake_quant(x, axis=1)
    assert_same_bits(y, ref)
    assert np.isfinite(y[0]).all() and np.isnan(y[1, :B]).all() and np.isfinite(y[1, B:]).all()
    assert np.isnan(y[2, B:]).all() and np.isfinite(y[2, :B]).all() and np.isnan(y[3, :B]).all()


@pytest.mark.parametrize("preset", ["BFP16", "MXINT8", "MXFP8_E4M3", "MX9"])
def test_block_weights_are_constants_at_inference(preset, tmp_path):
    """Issue 19: a block-quantized model's weights are quantized once, at write time: stored on
    the grid, their (foldable) function calls are constant-folded by onnxruntime at session
    creation, so an inference runs only the activation calls (one ReduceMax chain each)."""
    import onnx
    import onnxruntime as ort

    import mixq
    import mixq.data

    samples = mixq.data.load_default_samples()
    res = mixq.quantize(str(mixq.data.default_model_path()), preset)
    calls = [n for n in res.model.graph.node if n.domain == MIXQ_DOMAIN]
    weight_calls = [n for n in calls if n.op_type.endswith("_const")]
    assert weight_calls and len(weight_calls) < len(calls)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    so.optimized_model_filepath = str(tmp_path / "opt.onnx")
    sess = ort.InferenceSession(res.model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    ops = [n.op_type for n in onnx.load(str(tmp_path / "opt.onnx")).graph.node]
    per_call = 2 if get_format(preset.lower()).sub_block > 1 else 1  # sub-block, then block max
    assert ops.count("ReduceMax") == per_call * (len(calls) - len(weight_calls)), ops.count("ReduceMax")
    x = samples.test_images[:4]
    (y,) = sess.run(None, {sess.get_inputs()[0].name: x})
    assert np.isfinite(y).all()


@pytest.mark.parametrize("name", ["bfp16", "mx9", "mxfp8_e4m3"])
@pytest.mark.parametrize("dims,axis", [(["N", 16, 384], -1), (["N", 16, 100], -1), (["N", "L"], -1), (["N", "H", "L"], 2),
                                       (["N", 64, 1, 1], 1), (["N", 64, 7, 7], 1)])
def test_reductions_never_end_on_a_unit_dim(name, dims, axis):
    """onnxruntime's ReduceSum/ReduceMax over the block axis take a slow generic path when a
    size-1 dim follows it (20-30x slower on MatMul inputs: bench/block_reduce_bench.py); the blocked
    view must end at the block axis when nothing follows it (axis last, 1x1 spatial dims)."""
    import onnx.inliner
    import onnxruntime as ort
    from onnx import TensorProto, helper

    from mixq.formats.onnx_util import emission_to_model

    fmt = get_format(name)
    shape = tuple(d if isinstance(d, int) else None for d in dims)
    model = emission_to_model(fmt.emit("x", "y", axis=axis, prefix="q", shape=shape),
                              {"x": TensorProto.FLOAT}, output_names=["y"], input_shapes={"x": dims})
    model = onnx.inliner.inline_local_functions(model)
    reduce_in = [n.input[0] for n in model.graph.node if n.op_type.startswith("Reduce")
                 and n.op_type != "ReduceProd"]
    assert reduce_in
    for v in reduce_in:
        model.graph.output.append(helper.make_empty_tensor_value_info(v))
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    x = tensor(tuple(d if isinstance(d, int) else 2 * (i + 1) * 16 for i, d in enumerate(dims)), seed=3)
    outs = sess.run(None, {"x": x})
    (y,) = outs[:1]
    assert_same_bits(y, fmt.fake_quant(x, axis=axis))
    shapes = {v: o.shape for v, o in zip(reduce_in, outs[1:])}
    assert all(s[-1] != 1 for s in shapes.values()), shapes


# -- property: any rank, axis and mix of known / symbolic dims gives the reference's bits --------


@pytest.mark.parametrize("name", ["bfp16", "mx9", "mxfp8_e4m3", "mxint8", "bfp(block=5,exp=4,mant=3)"])
@settings(max_examples=12, deadline=None, derandomize=True)
@given(wide=st.lists(st.integers(1, 70), min_size=1, max_size=3), short=st.lists(st.integers(1, 4), max_size=2),
       known=st.lists(st.booleans(), min_size=5, max_size=5), axis_pick=st.integers(0, 4),
       seed=st.integers(0, 2 ** 16), perm_seed=st.integers(0, 100))
def test_random_shapes_with_symbolic_dims_give_the_reference_bits(name, wide, short, known, axis_pick, seed,
                                                                  perm_seed):
    """The function chosen from a shape (constant view, padded, rank-known, general) is exact
    for whatever the shape says is known: each dim is declared static or symbolic at random, the
    axis at random, and the session runs at the true dims."""
    import onnxruntime as ort
    from onnx import TensorProto

    from mixq.formats.onnx_util import emission_to_model

    fmt = get_format(name)
    dims = [int(d) for d in np.random.default_rng(perm_seed).permutation(wide + short)]  # <= 1.4M elements
    axis = axis_pick % len(dims)
    declared = [d if known[i] else f"d{i}" for i, d in enumerate(dims)]
    shape = tuple(d if known[i] else None for i, d in enumerate(dims))
    em = fmt.emit("x", "y", axis=axis, prefix="q", shape=shape)
    model = emission_to_model(em, {"x": TensorProto.FLOAT}, input_shapes={"x": declared})
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    x = tensor(tuple(dims), seed=seed)
    assert_same_bits(sess.run(None, {"x": x})[0], fmt.fake_quant(x, axis=axis))
