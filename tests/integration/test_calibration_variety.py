"""Calibration data that cannot stand for real inputs (`mixq.calibration.variety`): every float
input constant, as `np.zeros` passed as calibration data is. Before, the embedded classifier
calibrated on zeros printed "top-1 agreement 100.0%" (the guard scores the last calibration
samples: zeros too) and agreed with float on 71 % of real test images; now the summary warns,
`strict` refuses, and `mixq auto` says so first in its message."""
from __future__ import annotations

import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import mixq
from mixq.calibration.variety import ConstantDataWarning, constant_data, data_inputs, feed_extremes
from mixq.data import default_model_path, load_default_samples
from mixq.distributed import SerialExecutor
from mixq.errors import ModelError
from mixq.search import AutoConfig, Candidate, auto_quantize, base_from_candidate

WARN = "the calibration data is constant"


@pytest.fixture(scope="module")
def images():
    s = load_default_samples()
    return s.calib_images[:32], s.test_images[:400]


def _agreement(model: onnx.ModelProto, x: np.ndarray) -> float:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    f = ort.InferenceSession(str(default_model_path()), so).run(None, {"image": x})[0]
    q = ort.InferenceSession(model.SerializeToString(), so).run(None, {"image": x})[0]
    return float(np.mean(f.argmax(1) == q.argmax(1)))


def test_zeros_as_calibration_data_warn_and_strict_refuses(images, tmp_path):
    calib, test = images
    res = mixq.quantize(default_model_path(), "A16W8", np.zeros_like(calib))
    assert res.warnings and res.warnings[0].startswith(f"WARNING: {WARN}: input 'image' holds only the value 0")
    assert WARN in res.summary()
    # what the warning is about: the guard saw a perfect model, real images disagree
    assert res.fidelity.outputs[0].top1_agreement == 1.0
    assert _agreement(res.model, test) < 0.9
    out = tmp_path / "o.onnx"
    with pytest.raises(ModelError, match=f"strict.*{WARN}"):
        mixq.quantize(default_model_path(), "A16W8", np.zeros_like(calib), output_path=out, strict=True)
    assert not out.exists()


@pytest.mark.parametrize("preset", ["BFP16", "MXINT8"])
def test_block_presets_warn_of_constant_data_too(images, tmp_path, preset):
    """Block formats take no range from data, so no calibration pass watched it: the guard's
    samples are checked instead. Before, BFP16 on zeros printed a clean summary whose fidelity
    line had measured on zeros alone (the model itself is the same as with real data: the
    warning is about what the check can vouch for)."""
    calib, _ = images
    res = mixq.quantize(default_model_path(), preset, np.zeros_like(calib))
    assert res.warnings and res.warnings[0].startswith(f"WARNING: {WARN}: input 'image' holds only the value 0")
    assert "No range was fit to it" in res.warnings[0]
    ok = mixq.quantize(default_model_path(), preset, calib)
    assert not any(WARN in w for w in ok.warnings)
    out = tmp_path / "o.onnx"
    with pytest.raises(ModelError, match=f"strict.*{WARN}"):
        mixq.quantize(default_model_path(), preset, np.zeros_like(calib), output_path=out, strict=True)
    assert not out.exists()


def test_real_data_and_sharded_calibration(images):
    calib, _ = images
    ok = mixq.quantize(default_model_path(), "A16W8", calib)
    assert not any(WARN in w for w in ok.warnings)
    with SerialExecutor(3) as ex:  # the statistics of the shards, merged: the same verdict
        res = mixq.quantize(default_model_path(), "A16W8", np.ones_like(calib), executor=ex)
    assert res.warnings[0].startswith(f"WARNING: {WARN}: input 'image' holds only the value 1")


def _inputs_model() -> onnx.ModelProto:
    """x[N, 8] and state[N, 8] (float data), ids[N, 8] (token ids), t[N, 1] (a scalar per
    sample): a Gather, MatMuls and a product."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((8, 8)).astype(np.float32), "w")
    emb = numpy_helper.from_array(rng.standard_normal((50, 8)).astype(np.float32), "emb")
    nodes = [helper.make_node("Gather", ["emb", "ids"], ["e"]), helper.make_node("ReduceMean", ["e"], ["em"], axes=[1]),
             helper.make_node("Add", ["x", "state"], ["s0"]), helper.make_node("Add", ["s0", "em"], ["s"]),
             helper.make_node("MatMul", ["s", "w"], ["h"]), helper.make_node("Mul", ["h", "t"], ["y"])]
    vi = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["N", d]) for n, d in (("x", 8), ("state", 8), ("t", 1))]
    vi.insert(2, helper.make_tensor_value_info("ids", TensorProto.INT64, ["N", 8]))
    g = helper.make_graph(nodes, "g", vi, [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 8])], [w, emb])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_which_inputs_count():
    m = _inputs_model()
    assert data_inputs(m) == ["x", "state", "ids"]  # t: one value per sample, constant by design
    rng = np.random.default_rng(1)
    z = np.zeros((4, 8), np.float32)
    ids = np.zeros((4, 8), np.int64)
    t = rng.standard_normal((4, 1)).astype(np.float32)

    def feeds(**kw):
        return [{"x": z + 2, "state": z, "ids": ids + 3, "t": t, **kw}]

    const = feeds()
    msg = constant_data(m, feed_extremes(const, m))
    assert msg is not None and "'x' holds only the value 2" in msg and "'state' holds only the value 0" in msg
    # any data input that varies: a zero recurrent state, or constant floats beside real token ids
    assert constant_data(m, feed_extremes(feeds(x=rng.standard_normal((4, 8)).astype(np.float32)), m)) is None
    assert constant_data(m, feed_extremes(feeds(ids=rng.integers(0, 50, (4, 8))), m)) is None
    nan = feeds(x=np.full((4, 8), np.nan, np.float32))
    assert constant_data(m, feed_extremes(nan, m)) is None  # NaN: the non-finite warning's
    assert constant_data(m, {"x": feed_extremes(const, m)["x"]}) is None  # an input never seen
    # through quantize, on the extremes the streamed pass kept
    res = mixq.quantize(m, "A8W8", const * 3)
    assert res.warnings[0].startswith(f"WARNING: {WARN}")
    ok = feeds(ids=rng.integers(0, 50, (4, 8)))
    assert not any(WARN in w for w in mixq.quantize(m, "A8W8", ok * 3).warnings)


def test_integer_inputs_count(images):
    """A model that takes uint8 images (Cast, /255 inside), calibrated on zeros."""
    calib, _ = images
    m = onnx.load(default_model_path())
    name = m.graph.input[0].name
    for n in m.graph.node:
        n.input[:] = ["img_f" if i == name else i for i in n.input]
    m.graph.initializer.append(numpy_helper.from_array(np.array(255, np.float32), "s255"))
    m.graph.node.insert(0, helper.make_node("Div", ["img_c", "s255"], ["img_f"]))
    m.graph.node.insert(0, helper.make_node("Cast", ["img_u8"], ["img_c"], to=TensorProto.FLOAT))
    del m.graph.input[:]
    m.graph.input.append(helper.make_tensor_value_info("img_u8", TensorProto.UINT8, ["N", 1, 28, 28]))
    x = (calib * 255).clip(0, 255).astype(np.uint8)
    res = mixq.quantize(m, "A16W8", {"img_u8": np.zeros_like(x)})
    assert res.warnings[0].startswith(f"WARNING: {WARN}: input 'img_u8' holds only the value 0")
    assert not any(WARN in w for w in mixq.quantize(m, "A16W8", {"img_u8": x}).warnings)


def test_auto_says_it_first(images):
    calib, _ = images
    feeds = [{"image": np.zeros_like(calib[i:i + 8])} for i in range(0, 32, 8)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = auto_quantize(default_model_path(), AutoConfig(
            base=base_from_candidate(Candidate("int16", "int8")), candidates=(Candidate("int8", "int8"),),
            metric="cosine", target=0.01), feeds)
    assert res.target_met and res.message.startswith(f"WARNING: {WARN}")
    assert any(issubclass(w.category, ConstantDataWarning) for w in caught)


def test_inf_and_nan_in_the_data_are_named_as_such(images):
    """One image of inf (and one NaN pixel) reaches every activation, and the sentinel policy
    keeps each float as it would a -inf mask: A8W8 became weight-only with no word about the
    data. The summary now says where the values came from."""
    calib, _ = images
    x = calib.copy()
    x[3, 0, 5, 5] = np.nan
    x[10] = np.inf
    res = mixq.quantize(default_model_path(), "A8W8", x)
    assert res.rewrite.activations_quantized == 0  # what the policy did
    assert res.warnings[0].startswith("WARNING: the calibration data holds values that are not finite "
                                      "(input 'image': 784 infinite and 1 NaN of 25088 values)")
    kept = sum(1 for f in res.numerics if f.policy == "sentinel")
    assert kept > 5 and f"and {kept} were kept float for it" in res.warnings[0]
    assert not any("not finite" in w for w in mixq.quantize(default_model_path(), "A8W8", calib).warnings)


def test_missing_values_the_graph_imputes_are_no_data_error():
    """Tabular models take missing values as NaN and impute them in the graph (IsNaN and Where,
    sklearn-onnx's Imputer). No calibrated tensor past the input holds a NaN: the summary says
    so in a note where it used to call the data an error (found by `python -m bench.class_sweep
    --models nan_impute,ml_imputer,inf_clamp`), and the quantized model imputes as float does."""
    from tests.graphs import compare

    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(a, n) for n, a in (
        ("fill", np.linspace(-1, 1, 8).astype(np.float32)), ("w1", rng.normal(0, 0.35, (8, 16)).astype(np.float32)),
        ("w2", rng.normal(0, 0.25, (16, 4)).astype(np.float32)))]
    nodes = [helper.make_node("IsNaN", ["x"], ["missing"]), helper.make_node("Where", ["missing", "fill", "x"], ["f"]),
             helper.make_node("MatMul", ["f", "w1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("MatMul", ["r", "w2"], ["y"])]
    m = helper.make_model(helper.make_graph(
        nodes, "impute", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])], inits),
        opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    x = rng.normal(0, 1, (64, 8)).astype(np.float32)
    x[rng.random(x.shape) < 0.15] = np.nan
    res = mixq.quantize(m, "A8W8", x, check_kernels=False)
    note = [w for w in res.warnings if "not finite" in w]
    assert len(note) == 1 and not note[0].startswith("WARNING") and "the graph replaces them" in note[0], note
    assert res.plan.tensors["h"].format == "int8" and not res.fidelity.broken
    assert compare(m, res.model, [{"x": x[i:i + 8]} for i in range(0, 64, 8)]).first().cosine > 0.999
