"""Standard ops that onnxruntime runs at one opset and not at another survive mixq's opset
conversions. Swish (opset 24) is an ONNX function onnxruntime 1.31 expands only at opset 24: the
block presets convert the model to opset 26 (BitCast), and before `passes.function_ops` every
block preset on a model with a Swish died in the fidelity guard with onnxruntime's raw
NOT_IMPLEMENTED traceback. Now the node is expanded into the ops of its ONNX function body (what
onnxruntime computes for it) and the summary says so. A model onnxruntime cannot load as given is
named as the user's, whichever preset (block presets run no calibration pass that said so)."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import mixq
from mixq.errors import ModelError
from mixq.graph import PassResult, walk_graphs
from mixq.passes.function_ops import expand_function_ops
from mixq.passes.prepare import convert_opset


def _swish_model(opset: int, *, in_branch: bool = False, alpha: float | None = None) -> onnx.ModelProto:
    """x (N, 16) -> MatMul -> Swish (or an If whose then-branch holds it) -> MatMul -> y (N, 8)."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array((rng.standard_normal((16, 32)) / 4).astype(np.float32), "w1"),
             numpy_helper.from_array((rng.standard_normal((32, 8)) / 6).astype(np.float32), "w2")]
    attrs = {} if alpha is None else {"alpha": alpha}
    if in_branch:
        then = helper.make_graph([helper.make_node("Swish", ["h"], ["t"], name="swish_then", **attrs)], "then",
                                 [], [helper.make_tensor_value_info("t", TensorProto.FLOAT, None)])
        other = helper.make_graph([helper.make_node("Relu", ["h"], ["e"], name="relu_else")], "else",
                                  [], [helper.make_tensor_value_info("e", TensorProto.FLOAT, None)])
        act = helper.make_node("If", ["c"], ["s"], then_branch=then, else_branch=other, name="if")
        inits.append(numpy_helper.from_array(np.array(True), "c"))
    else:
        act = helper.make_node("Swish", ["h"], ["s"], name="swish", **attrs)
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"), act,
                           helper.make_node("MatMul", ["s", "w2"], ["y"], name="mm2")], "swish",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 8])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 11
    return m


def _feeds(n: int = 48) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(1)
    return [{"x": rng.standard_normal((1, 16)).astype(np.float32)} for _ in range(n)]


def _run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def _op_types(model: onnx.ModelProto) -> set[str]:
    return {n.op_type for g in walk_graphs(model.graph) for n in g.node}


def test_onnxruntime_runs_swish_at_24_only():
    """The premise (if a later onnxruntime runs it at 26, the expansion is simply not needed)."""
    x = np.ones((2, 16), np.float32)
    _run(_swish_model(24), x)
    with pytest.raises(Exception, match="Swish"):
        _run(onnx.version_converter.convert_version(_swish_model(24), 26), x)


@pytest.mark.parametrize("in_branch", [False, True], ids=["graph", "if-branch"])
@pytest.mark.parametrize("alpha", [None, 0.75], ids=["default-alpha", "alpha"])
def test_conversion_expands_swish_to_the_same_values(in_branch, alpha):
    model = _swish_model(24, in_branch=in_branch, alpha=alpha)
    res = PassResult("opset")
    up = convert_opset(model, 26, res)
    assert "Swish" not in _op_types(up) and "Sigmoid" in _op_types(up)
    assert res.changed == 1 and "1 x Swish expanded" in res.notes[0], res.notes
    x = np.random.default_rng(2).standard_normal((5, 16)).astype(np.float32)
    np.testing.assert_array_equal(_run(up, x), _run(model, x))  # bit for bit
    assert "Swish" in _op_types(model)  # the caller's model is not changed


def test_nothing_expanded_where_onnxruntime_runs_the_op():
    """HardSwish and Mish are ONNX functions too, and onnxruntime runs them at 26: kept."""
    model = _swish_model(24)
    for n in model.graph.node:
        if n.op_type == "Swish":
            n.op_type = "HardSwish"
    res = PassResult("opset")
    assert expand_function_ops(model, 24, 26, res) is model and not res.notes
    assert expand_function_ops(_swish_model(24), 24, 24, res) is not None and not res.notes


@pytest.mark.parametrize("preset", ["BFP16", "MXINT8", "MX9"])
def test_block_presets_quantize_a_model_with_swish(tmp_path, preset):
    src = tmp_path / "swish.onnx"
    onnx.save(_swish_model(24), str(src))
    before = src.read_bytes()
    out = tmp_path / "q.onnx"
    res = mixq.quantize(str(src), preset, _feeds(), output_path=str(out))
    text = res.summary()
    assert "1 x Swish expanded into the ops of its ONNX function body" in text, text
    q = onnx.load(str(out))
    assert "Swish" not in _op_types(q)
    x = np.stack([f["x"][0] for f in _feeds(16)])
    got, ref = _run(q, x), _run(_swish_model(24), x)
    cos = float(np.sum(got * ref) / np.linalg.norm(got) / np.linalg.norm(ref))
    assert cos > 0.99, cos
    assert src.read_bytes() == before


def test_a_model_too_new_to_convert_is_refused_with_the_op_named(tmp_path):
    """Opset 27: onnxruntime runs none of it; the body ONNX gives Swish is written for opset 24."""
    with pytest.raises(ModelError, match=r"Swish.*opset 26 or lower"):
        mixq.quantize(_swish_model(27), "A8W8", _feeds())


@pytest.mark.parametrize("preset", ["A8W8", "BFP16", "BF16"])
def test_a_file_onnxruntime_refuses_is_named_as_the_users_for_every_preset(tmp_path, preset):
    """Swish in a model of opset 26 does not load in onnxruntime 1.31 at all: the error names the
    user's file, also for the block presets, which load it first in the guard (before: a raw
    NOT_IMPLEMENTED traceback from the guard's session)."""
    src = tmp_path / "swish26.onnx"
    onnx.save(_swish_model(26), str(src))
    with pytest.raises(ModelError, match="does not load in onnxruntime as given"):
        mixq.quantize(str(src), preset, _feeds(), output_path=str(tmp_path / "q.onnx"))
    assert not (tmp_path / "q.onnx").exists()


def test_rmsnormalization_is_quantized_like_layernormalization():
    """RMSNormalization (opset 23, what newer exporters write for LLM blocks) has LayerNormalization's
    semantics in the op table: its input and output take the activation format; before, it was
    'not in mixq's op table' and left float."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array((rng.standard_normal((16, 16)) / 4).astype(np.float32), "w"),
             numpy_helper.from_array(np.ones(16, np.float32), "g")]
    g = helper.make_graph([helper.make_node("RMSNormalization", ["x", "g"], ["n"], axis=-1),
                           helper.make_node("MatMul", ["n", "w"], ["y"])], "rms",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 16])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 23)])
    m.ir_version = 10
    res = mixq.quantize(m, "A8W8", _feeds(), check_kernels=False)
    assert "n" in res.plan.tensors and res.plan.tensors["n"].format == "int8"
    assert "x" in res.plan.tensors and "RMSNormalization" in res.plan.tensors["x"].reason
    assert not any("RMSNormalization" in r for r in res.plan.float_nodes.values())


# ------------------------------------------------------------------ ops with no kernel at opset 26
def _roi_model() -> tuple[onnx.ModelProto, list[dict[str, np.ndarray]]]:
    """A two-stage detector's head: Conv features (stride 2), RoiAlign of boxes in pixels, a
    layer. onnxruntime 1.31 runs RoiAlign at opset 21 and has no kernel for its opset-22
    version, which a model converted to opset 26 gets."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array((rng.standard_normal((8, 3, 3, 3)) / 5).astype(np.float32), "wc"),
             numpy_helper.from_array((rng.standard_normal((128, 4)) / 11).astype(np.float32), "wl")]
    nodes = [helper.make_node("Conv", ["img", "wc"], ["c"], pads=[1, 1, 1, 1], strides=[2, 2], name="conv"),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("RoiAlign", ["r", "rois", "bidx"], ["ra"], output_height=4, output_width=4,
                              spatial_scale=0.5, sampling_ratio=2, name="roi"),
             helper.make_node("Flatten", ["ra"], ["f"], name="flat"), helper.make_node("MatMul", ["f", "wl"], ["y"], name="mm")]
    g = helper.make_graph(nodes, "roi", [helper.make_tensor_value_info("img", TensorProto.FLOAT, ["N", 3, 32, 32]),
                                         helper.make_tensor_value_info("rois", TensorProto.FLOAT, ["R", 4]),
                                         helper.make_tensor_value_info("bidx", TensorProto.INT64, ["R"])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["R", 4])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)

    def feed() -> dict[str, np.ndarray]:
        x0 = rng.uniform(0, 20, (6, 2))
        return {"img": rng.standard_normal((2, 3, 32, 32)).astype(np.float32),
                "rois": np.concatenate([x0, x0 + rng.uniform(4, 12, (6, 2))], 1).astype(np.float32),
                "bidx": rng.integers(0, 2, 6).astype(np.int64)}
    return m, [feed() for _ in range(6)]


def test_stranded_ops_are_found_by_probing():
    from mixq.passes.function_ops import stranded_ops

    m, _ = _roi_model()
    lost = stranded_ops(m, 21, 26)
    assert list(lost) == ["RoiAlign"] and "opset-22" in lost["RoiAlign"]
    assert stranded_ops(m, 21, 21) == {}
    assert stranded_ops(_swish_model(24), 24, 26) == {}  # a function op: expand_function_ops' job
    # a VAE's sampling: RandomNormalLike has no kernel for its opset-22 version either
    g = helper.make_graph([helper.make_node("RandomNormalLike", ["x"], ["e"]), helper.make_node("Add", ["x", "e"], ["y"])],
                          "vae", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 8])])
    vae = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    assert list(stranded_ops(vae, 21, 26)) == ["RandomNormalLike"]
    # an op whose attribute became an input (ReduceMean's axes at opset 18) runs once converted:
    # the node copied as written does not, and was read as stranded
    g = helper.make_graph([helper.make_node("ReduceMean", ["x"], ["y"], axes=[1], keepdims=1)], "rm",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 1])])
    rm = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    assert stranded_ops(rm, 13, 26) == {}


@pytest.mark.parametrize("preset", ["BFP16", "MX9", "MXINT8", "MXFP8_E4M3", "MXFP4"])
def test_block_presets_run_beside_an_op_with_no_kernel_at_opset_26(preset):
    """Every block preset on a model with RoiAlign died with "internal error: the quantized model
    does not load in onnxruntime (... RoiAlign(22))": the block functions' BitCast needs opset
    26. Now the functions are emitted at the model's opset with the exponent the constant-weight
    variant computes (same bits, `test_bit_exact_at_an_older_opset`), and the summary says so.
    Measured: output SQNR 34 dB (BFP16) .. 13 dB (MXFP4) against float, as without RoiAlign."""
    m, feeds = _roi_model()
    res = mixq.quantize(m, preset, feeds, check_kernels=False)
    assert any("block formats emitted at opset 21" in n and "RoiAlign" in n for n in res.rewrite.notes), res.summary()
    assert {i.domain: i.version for i in res.model.opset_import}[""] == 21
    assert all(f.name.endswith("_o21") for f in res.model.functions) and res.model.functions
    assert "RoiAlign" in res.summary()
    s = ort.InferenceSession(res.model.SerializeToString(), providers=["CPUExecutionProvider"])
    f = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    ref = np.concatenate([f.run(None, x)[0] for x in feeds]).astype(np.float64)
    got = np.concatenate([s.run(None, x)[0] for x in feeds]).astype(np.float64)
    assert 10 * np.log10(np.sum(ref ** 2) / np.sum((ref - got) ** 2)) > (8.0 if preset == "MXFP4" else 20.0)
