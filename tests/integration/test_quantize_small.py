"""The static quantizer end to end on a small CNN written with onnx.helper."""
from __future__ import annotations

import re

import numpy as np
import onnx
import pytest

import mixq
from mixq.config import get_default_config
from mixq.errors import ConfigError, DataError, ModelError
from tests.graphs import RUNTIME, compare, session
from tests.conftest import feeds, small_cnn


def _q(model, preset="A8W8", batch=8, n=64, **kw):
    return mixq.quantize(model, preset, feeds(n, batch), **kw)


@pytest.mark.parametrize("preset,min_sqnr", [("A8W8", 25), ("XINT8", 20), ("A16W8", 40),
                                             ("U8S8", 25), ("S16S16", 45)])
def test_integer_presets_run_and_are_faithful(cnn, preset, min_sqnr):
    res = _q(cnn, preset)
    onnx.checker.check_model(res.model, full_check=True)
    ops = [n.op_type for n in res.model.graph.node]
    assert "BatchNormalization" not in ops, "BatchNorm should be folded into the Conv"
    assert ops.count("QuantizeLinear") >= 6
    assert res.rewrite.biases_int32 == 3
    # QDQ semantics (optimizations disabled): the numbers the quantizer is responsible for
    c = compare(cnn, res.model, feeds(64, 16, seed=7), optimize=False)
    assert c.first().sqnr_db > min_sqnr, c.first()


def test_reduce_range_makes_optimized_kernels_agree(cnn):
    cfg = get_default_config("U8S8").with_options(reduce_range=True)
    res = mixq.quantize(cnn, cfg, feeds(64, 8))
    assert res.warnings == []
    opt = compare(cnn, res.model, feeds(64, 16, seed=7), optimize=True).first().sqnr_db
    ref = compare(cnn, res.model, feeds(64, 16, seed=7), optimize=False).first().sqnr_db
    assert opt > 35 and abs(opt - ref) < 1.0


def test_kernel_check_warns_when_optimized_run_disagrees(cnn):
    from mixq.evaluate import sqnr_between_optimization_levels

    res = _q(cnn, "A8W8")
    sqnr = sqnr_between_optimization_levels(res.model, feeds(16, 8, seed=3))
    # the warning appears exactly when this machine's fused kernels disagree
    assert bool(res.warnings) == (sqnr < mixq.api.KERNEL_SQNR_WARN_DB)
    if res.warnings:
        assert "reduce_range" in res.warnings[0]


def test_saturating_kernels_are_the_summarys_verdict_and_strict_refuses_them(cnn, monkeypatch, tmp_path):
    """On a CPU without VNNI onnxruntime's fused int8 kernels can compute another model than the
    QDQ one (EfficientNet-Lite0 A8W8 on an AVX2 machine: 43.8 % agreement as run, 93.5 % in the
    QDQ semantics). The warning stands with the guard's verdict at the top of the summary, not
    after the informational notes, and --strict writes nothing (old code: the warning came last,
    and --strict wrote the model)."""
    import mixq.evaluate as ev

    monkeypatch.setattr(mixq.api, "cpu_has_vnni", lambda: False)
    monkeypatch.setattr(ev, "sqnr_between_optimization_levels", lambda model, fds: 4.5)
    res = mixq.quantize(cnn, "A8W8", feeds(64, 8))
    text = res.summary()
    warning = text.index("WARNING: onnxruntime's optimized int8 kernels disagree")
    assert warning < text.index("- GPTQ") and warning > text.index("- fidelity on")
    out = tmp_path / "q.onnx"
    # on a CPU without VNNI the guard's own runtime check may refuse it first ("looks broken")
    with pytest.raises(ModelError, match="broken"):
        mixq.quantize(cnn, "A8W8", feeds(64, 8), output_path=out, strict=True)
    assert not out.exists()


def test_one_warning_for_saturating_kernels(cnn, monkeypatch):
    """The guard's runtime check and the kernel check see the same thing on a CPU without VNNI:
    the summary gave two warnings, the guard's advising to report the model. Where the kernel
    check names the cause (and the remedy), the guard's line is left out; alone, it stays."""
    from mixq.fidelity import FidelityReport

    monkeypatch.setattr(mixq.api, "cpu_has_vnni", lambda: False)
    monkeypatch.setattr(mixq.evaluate, "sqnr_between_optimization_levels", lambda model, fds: 4.5)
    res = mixq.quantize(cnn, "A8W8", feeds(64, 8))
    res.fidelity.runtime_sqnr_db, res.fidelity.runtime_qdq_sqnr_db = 5.0, 40.0  # as such a CPU gives
    assert res.kernels_disagree and res.fidelity.runtime_disagrees
    text = res.summary()
    assert text.count("WARNING:") == 1 and "lacks VNNI" in text and "report it with the model" not in text
    alone = FidelityReport(outputs=res.fidelity.outputs, samples=32, runtime_sqnr_db=5.0,
                           runtime_qdq_sqnr_db=40.0)
    assert "report it with the model" in alone.lines()[-1]


def test_the_kernel_check_keeps_a_fixed_batch_whole(monkeypatch):
    """On a CPU without VNNI the kernel check runs the quantized model on the first feed, cut to
    2 rows: a model exported with a fixed batch of 3 crashed `quantize` there with onnxruntime's
    "invalid dimensions" (every 8-bit preset; found on an AVX2 machine). A fixed batch is now
    fed whole, a dynamic one still cut."""
    import mixq.evaluate as ev
    from tests.graphs import model

    seen = []
    real = ev.sqnr_between_optimization_levels
    monkeypatch.setattr(mixq.api, "cpu_has_vnni", lambda: False)
    monkeypatch.setattr(ev, "sqnr_between_optimization_levels",
                        lambda m, fds: seen.append(fds[0]["x"].shape) or real(m, fds))
    m = model("""<ir_version: 8, opset_import: ["": 17]>
        g (float[3,8] x) => (float[3,4] y) { y = MatMul(x, W) }""", W=(8, 4))
    rng = np.random.default_rng(0)
    data = [{"x": rng.standard_normal((3, 8)).astype(np.float32)} for _ in range(4)]
    mixq.quantize(m, "A8W8", data)
    mixq.quantize(small_cnn(), "A8W8", feeds(16, 8))
    assert seen == [(3, 8), (2, 3, 16, 16)]


def test_batch_size_does_not_change_the_output_bytes(cnn):
    a = _q(cnn, "A8W8", batch=1).model.SerializeToString()
    b = _q(cnn, "A8W8", batch=32).model.SerializeToString()
    assert a == b


def test_weights_are_stored_as_int8(cnn):
    res = _q(cnn, "A8W8")
    types = {t.name: t.data_type for t in res.model.graph.initializer}
    assert onnx.TensorProto.INT8 in types.values()
    assert not any(t.data_type == onnx.TensorProto.FLOAT and len(t.dims) == 4
                   for t in res.model.graph.initializer), "float conv weights should be gone"
    int8_elems = sum(int(np.prod(t.dims)) for t in res.model.graph.initializer
                     if t.data_type == onnx.TensorProto.INT8 and len(t.dims) >= 2)
    assert int8_elems == 8 * 3 * 9 + 8 * 8 * 9 + 10 * 8  # every weight element stored in one byte


def test_xint8_scales_are_powers_of_two(cnn):
    res = _q(cnn, "XINT8")
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in res.model.graph.initializer}
    for n in res.model.graph.node:
        if n.op_type in ("QuantizeLinear", "DequantizeLinear") and n.input[0] not in ():
            s = inits.get(n.input[1])
            if s is None or s.dtype != np.float32:
                continue
            m, _ = np.frexp(s)
            if not n.input[0].endswith("__q"):  # int32 bias scales are products of two pof2
                assert np.all(m == 0.5), (n.name, s)


def test_plan_replay_gives_identical_bytes(cnn, tmp_path):
    res = _q(cnn, "A8W8")
    plan = mixq.PrecisionPlan.from_json(res.plan.to_json())
    assert plan == res.plan
    again = _q(cnn, "A8W8", plan=plan)
    assert again.model.SerializeToString() == res.model.SerializeToString()


def test_unknown_preset_is_a_clear_error(cnn):
    with pytest.raises(ConfigError, match="A8W8"):
        get_default_config("A8W9")


def test_empty_calibration_data_is_an_error(cnn):
    with pytest.raises(DataError):
        mixq.quantize(cnn, "A8W8", [])


def test_wrong_feed_name_is_an_error(cnn):
    with pytest.raises(DataError, match="x"):
        mixq.quantize(cnn, "A8W8", [{"y": np.zeros((1, 3, 16, 16), np.float32)}])


def test_not_onnx_is_an_error(tmp_path):
    p = tmp_path / "bad.onnx"
    p.write_bytes(b"this is not onnx")
    with pytest.raises(ModelError):
        mixq.quantize(str(p), "A8W8", feeds(4, 4))


def test_output_is_written_and_input_untouched(cnn, tmp_path):
    src = tmp_path / "in.onnx"
    onnx.save(cnn, src)
    before = src.read_bytes()
    out = tmp_path / "out.onnx"
    res = mixq.quantize(str(src), "A8W8", feeds(16, 8), output_path=out)
    assert out.exists() and res.output_path == out
    assert src.read_bytes() == before
    with pytest.raises(mixq.MixqError):
        mixq.quantize(str(src), "A8W8", feeds(16, 8), output_path=src)


# measured SQNR on this model minus a margin: each format's own precision shows in the bound
@pytest.mark.parametrize("preset,min_sqnr,node", [
    ("BF16", 45, "Cast"), ("FP16", 60, "Cast"), ("BFP16", 37, "BFP16_axis1"),
    ("MXINT8", 37, "MXINT8_axis1"), ("MXFP8_E4M3", 19, "MXFP8_E4M3_axis1"),
    ("MXFP8_E5M2", 18, "MXFP8_E5M2_axis1"), ("MXFP6_E3M2", 18, "MXFP6_E3M2_axis1"),
    ("MXFP6_E2M3", 22, "MXFP6_E2M3_axis1"), ("MXFP4", 8, "MXFP4_axis1"), ("MX4", 7, "MX4_axis1"),
    ("MX6", 19, "MX6_axis1"), ("MX9", 38, "MX9_axis1")])
def test_float_and_block_presets_run_in_stock_onnxruntime(cnn, preset, min_sqnr, node):
    res = _q(cnn, preset)
    onnx.checker.check_model(res.model, full_check=True)
    assert node in [re.sub(r"(_n\d+)?(_p\d+)?(_r\d+)?$", "", n.op_type) for n in res.model.graph.node]
    c = compare(cnn, res.model, feeds(64, 16, seed=7))  # default optimizations: no custom ops
    assert c.first().sqnr_db > min_sqnr, c.first()
    # block and cast formats take their scales from live data; the casts' ranges are read from
    # the calibration data only to check them against the format's largest value (policy g)
    assert (res.calibrated > 0) if node == "Cast" else (res.calibrated == 0)


@pytest.mark.parametrize("preset", ["A8W8", "XINT8", "U8S8", "A16W8"])
def test_fused_activation_inputs_take_the_activation_parameters(preset, tmp_path):
    """On the embedded CNN (Conv/Add -> Relu): the compute output a Relu reads is quantized with
    the Relu output's parameters, which changes no value (the output is bit-identical to the
    model without those Q/DQ pairs) and lets onnxruntime fuse the 8-bit Convs into QLinearConv
    (with symmetric int8 activations it ran 5 of the 6 as float FusedConv before)."""
    import onnxruntime as ort
    from onnx import numpy_helper

    from mixq.data import default_model_path, load_default_samples

    samples = load_default_samples()
    float_model = onnx.load(default_model_path())
    name = float_model.graph.input[0].name
    q = mixq.quantize(float_model, preset, [{name: samples.calib_images[:64]}]).model
    inits = {t.name: numpy_helper.to_array(t) for t in q.graph.initializer}
    prod = {o: n for n in q.graph.node for o in n.output}
    readers: dict[str, list] = {}
    for n in q.graph.node:
        for i in n.input:
            readers.setdefault(i, []).append(n)
    pairs = []  # (Q before the Relu, Q after it)
    for relu in (n for n in q.graph.node if n.op_type == "Relu"):
        dq = prod[relu.input[0]]
        assert dq.op_type == "DequantizeLinear", relu.name
        pre_q = prod[dq.input[0]]
        assert pre_q.op_type == "QuantizeLinear" and prod[pre_q.input[0]].op_type in ("Conv", "Add")
        (post_q,) = [r for r in readers[relu.output[0]] if r.op_type == "QuantizeLinear"]
        for i in (1, 2):
            np.testing.assert_array_equal(inits[pre_q.input[i]], inits[post_q.input[i]])
        pairs.append((pre_q, dq, relu))
    assert len(pairs) == 6  # 5 Conv -> Relu, the residual Add -> Relu

    stripped = onnx.ModelProto()  # the same model without the Q/DQ pairs before the Relus
    stripped.CopyFrom(q)
    drop = {n.name for p in pairs for n in p[:2]}
    rewire = {relu.name: pre_q.input[0] for pre_q, _, relu in pairs}
    kept = [n for n in stripped.graph.node if n.name not in drop]
    for n in kept:
        if n.name in rewire:
            n.input[0] = rewire[n.name]
    del stripped.graph.node[:]
    stripped.graph.node.extend(kept)
    assert len(stripped.graph.node) == len(q.graph.node) - 12

    def run(model: onnx.ModelProto, level) -> np.ndarray:
        so = ort.SessionOptions()
        so.graph_optimization_level = level
        so.optimized_model_filepath = str(tmp_path / "opt.onnx")
        s = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        return s.run(None, {name: samples.test_images[:64]})[0]

    off = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    np.testing.assert_array_equal(run(q, off).view(np.int32), run(stripped, off).view(np.int32))
    if preset != "A16W8":  # onnxruntime has no 16-bit QLinearConv
        run(q, ort.GraphOptimizationLevel.ORT_ENABLE_ALL)
        ops = [n.op_type for n in onnx.load(str(tmp_path / "opt.onnx")).graph.node]
        # (onnxruntime 1.31 leaves c3 a float Conv under int8 activations, in its own
        # quantizer's output too; uint8 fuses all six)
        want = 6 if preset == "U8S8" else 5
        assert ops.count("QLinearConv") >= want and "FusedConv" not in ops, sorted(set(ops))


def _matmul_model(w: np.ndarray) -> onnx.ModelProto:
    from onnx import TensorProto, helper, numpy_helper

    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", w.shape[0]])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", w.shape[1]])],
                          [numpy_helper.from_array(w, "w")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _weight_scale(model: onnx.ModelProto) -> np.ndarray:
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
    dq = next(n for n in model.graph.node if n.op_type == "DequantizeLinear"
              and inits.get(n.input[0]) is not None and inits[n.input[0]].ndim == 2)
    return inits[dq.input[1]]


@pytest.mark.parametrize("preset", ["A8W8", "A16W8", "U8S8"])
def test_integer_presets_take_minmax_weight_ranges_and_weight_calibration_changes_them(preset):
    """The integer presets' weights: MinMax per output channel (absmax / 127); a heavy-tailed
    weight gets a clipped (smaller) scale under weight_calibration='minmse'."""
    rng = np.random.default_rng(0)
    w = rng.standard_t(2, (256, 8)).astype(np.float32)
    m = _matmul_model(w)
    data = [{"x": rng.standard_normal((4, 256)).astype(np.float32)} for _ in range(4)]
    cfg = get_default_config(preset)
    assert cfg.weight_method == "minmax"
    got = _weight_scale(mixq.quantize(m, cfg, data, check_kernels=False).model)
    np.testing.assert_allclose(got, np.abs(w).max(axis=0) / 127, rtol=1e-6)
    mse = _weight_scale(mixq.quantize(m, cfg.with_options(weight_calibration="minmse"), data,
                                      check_kernels=False).model)
    assert np.all(mse <= got) and np.any(mse < got)


def test_minmse_min_gain_changes_the_activation_ranges():
    """minmse_min_gain keeps MinMax where MinMSE's clip buys less than that factor of expected
    error: a Laplace-distributed input is clipped by plain MinMSE (gain about 1.27) and keeps
    its full range with a gain of 1.5."""
    rng = np.random.default_rng(1)
    m = _matmul_model(rng.standard_normal((64, 8)).astype(np.float32))
    data = [{"x": rng.laplace(size=(64, 64)).astype(np.float32)} for _ in range(8)]
    absmax = max(float(np.abs(f["x"]).max()) for f in data)

    def x_scale(gain: float) -> float:
        cfg = get_default_config("A8W8").with_options(minmse_min_gain=gain)
        q = mixq.quantize(m, cfg, data, check_kernels=False).model
        inits = {t.name: onnx.numpy_helper.to_array(t) for t in q.graph.initializer}
        ql = next(n for n in q.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == "x")
        return float(inits[ql.input[1]])

    assert x_scale(1.5) == pytest.approx(absmax / 127, rel=1e-6)
    assert x_scale(1.0) < 0.95 * absmax / 127
    with pytest.raises(ConfigError, match="minmse_min_gain"):
        get_default_config("A8W8").with_options(minmse_min_gain=0.5)
    with pytest.raises(ConfigError, match=r"in \[1, 1e6\].*calibration='minmax'"):  # the bound it checks
        get_default_config("A8W8").with_options(minmse_min_gain=1e9)
    with pytest.raises(ConfigError, match="weight_calibration"):
        get_default_config("A8W8").with_options(weight_calibration="entropy")
    # the weight method `calibration` implies is the same config, however it is spelled
    assert mixq.QuantConfig(weight_calibration="minmax") == mixq.QuantConfig()
    assert mixq.QuantConfig(calibration="minmse", weight_calibration="minmse") == \
        mixq.QuantConfig(calibration="minmse")


def test_cli_range_method_flags_reach_the_config(tmp_path):
    """--weight-calib-method and --minmse-min-gain set the config the plan carries;
    --calib-method minmse alone means plain MinMSE (gain 1), and a gain below 1 is refused."""
    import json

    from mixq.cli.main import main
    from mixq.data import default_model_path

    def carried(*flags: str) -> dict:
        out = tmp_path / "plan.json"
        assert main(["plan", str(default_model_path()), "--preset", "A8W8", *flags, "-o", str(out)]) == 0
        return json.loads(out.read_text())["config"]

    plain = mixq.QuantConfig.from_dict(carried())
    assert (plain.minmse_min_gain, plain.weight_method) == (1.5, "minmax")
    c = mixq.QuantConfig.from_dict(carried("--weight-calib-method", "minmse", "--minmse-min-gain", "2"))
    assert (c.minmse_min_gain, c.weight_method) == (2.0, "minmse")
    assert carried("--calib-method", "minmse")["minmse_min_gain"] == 1.0
    assert main(["plan", str(default_model_path()), "--minmse-min-gain", "0.5",
                 "-o", str(tmp_path / "p.json")]) == 2



def _scores_past_calibration(headroom, preset="A16W8"):
    """A linear classifier quantized on samples of N(0, 1), run in onnxruntime on unseen
    samples 1.25 times as confident (their class scores go past the calibrated extremes).
    Returns (the float scores, the quantized model's, the calibrated absmax of the scores)."""
    import onnxruntime as ort

    rng = np.random.default_rng(3)
    w = rng.standard_normal((16, 10)).astype(np.float32)
    m = _matmul_model(w)
    data = [{"x": rng.standard_normal((16, 16)).astype(np.float32)} for _ in range(4)]
    unseen = 1.25 * rng.standard_normal((256, 16)).astype(np.float32)
    cfg = get_default_config(preset) if headroom is None else \
        get_default_config(preset).with_options(range_headroom=headroom)
    q = mixq.quantize(m, cfg, data, check_kernels=False).model
    run = ort.InferenceSession(q.SerializeToString(), providers=["CPUExecutionProvider"])
    calib_max = max(float(np.abs(f["x"] @ w).max()) for f in data)
    return unseen @ w, run.run(None, {"x": unseen})[0], calib_max


def test_wide_grids_leave_headroom_for_values_past_the_calibration_extremes():
    """A16W8 widens unclipped int16 ranges twice ('auto'): unseen class scores past the
    calibrated extremes come out as they are (EfficientNet-Lite0: a crop whose top score, 11.1,
    was clipped to the calibrated 9.55 lost its class at a 1.53 lead). With the headroom off
    they are clipped at the calibrated absmax."""
    ref, got, calib_max = _scores_past_calibration(None)
    assert 1.5 * calib_max < np.abs(ref).max() < 2 * calib_max  # unseen values go past
    assert np.abs(got - ref).max() < 0.03 * calib_max  # the int8 weights' error, no clipping
    ref, off, _ = _scores_past_calibration(1.0)
    assert np.abs(off).max() <= calib_max * (1 + 1e-4)
    assert np.abs(off - ref).max() > 0.5 * calib_max
    assert (got.argmax(1) == ref.argmax(1)).mean() > (off.argmax(1) == ref.argmax(1)).mean()


def test_range_headroom_is_none_on_8_bit_grids_unless_asked():
    """'auto' leaves 8-bit ranges at the calibrated extremes (the same bytes as 1, the output's
    too: output_headroom 'auto' follows it); a number asked for widens them, and what cannot
    be a headroom is refused."""
    def q(**options):
        return mixq.quantize(_matmul_model(np.eye(4, dtype=np.float32)),
                             get_default_config("A8W8").with_options(**options),
                             [{"x": np.linspace(-1, 1, 8, dtype=np.float32).reshape(2, 4)}],
                             check_kernels=False).model.SerializeToString()

    assert q() == q(range_headroom=1) == q(output_headroom=1) != q(output_headroom=1.5)
    _, got, calib_max = _scores_past_calibration(4.0, preset="A8W8")
    assert np.abs(got).max() > 1.3 * calib_max
    for bad in ("wide", 0.5, True, 2000.0):
        with pytest.raises(ConfigError, match="range_headroom"):
            get_default_config("A16W8").with_options(range_headroom=bad)
    with pytest.raises(ConfigError, match="power_of_two"):
        get_default_config("XINT8").with_options(range_headroom=2)
    assert get_default_config("XINT8").with_options(range_headroom=1).range_headroom == 1.0



@pytest.mark.parametrize("act,bound", [("Clip", 6.0), ("Sigmoid", 1.0), ("Relu", None)])
def test_headroom_stops_at_the_bound_of_the_op_that_makes_the_tensor(act, bound):
    """MatMul -> Clip(0, 6) (a fused ReLU6: the MatMul output takes the Clip's parameters),
    MatMul -> Sigmoid: their 16-bit ranges end at the op's bound, not twice past what
    calibration saw; a Relu output (no upper bound) gets the headroom."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(5)
    w = (0.6 * rng.standard_normal((8, 8))).astype(np.float32)
    extra = [numpy_helper.from_array(np.float32(0), "lo"), numpy_helper.from_array(np.float32(6), "hi")]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"]),
             helper.make_node(act, ["y", "lo", "hi"] if act == "Clip" else ["y"], ["z"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])],
                          [helper.make_tensor_value_info("z", TensorProto.FLOAT, ["N", 8])],
                          [numpy_helper.from_array(w, "w"), *extra])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    data = [{"x": rng.standard_normal((32, 8)).astype(np.float32)}]
    cfg = get_default_config("A16W8").with_options(quantize_tail=True)  # z ends the graph
    q = mixq.quantize(m, cfg, data, check_kernels=False).model
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in q.graph.initializer}
    ql = next(n for n in q.graph.node if n.op_type == "QuantizeLinear" and n.input[0].startswith("z"))
    top = float(inits[ql.input[1]]) * 32767
    seen = float(np.max(act_of(act, data[0]["x"] @ w)))
    if bound is not None:  # calibration stayed below the bound, twice past it would not
        assert seen < bound < 2 * seen
    assert top == pytest.approx(min(2 * seen, bound or np.inf), rel=1e-5)


def act_of(act, y):
    return {"Clip": np.clip(y, 0, 6), "Sigmoid": 1 / (1 + np.exp(-y)), "Relu": np.maximum(y, 0)}[act]

def _output_scale(model: onnx.ModelProto, tensor: str = "y") -> float:
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
    dq = next(n for n in model.graph.node if n.op_type == "DequantizeLinear" and n.output[0] == tensor)
    return float(inits[dq.input[1]])


@pytest.mark.parametrize("preset", ["A8W8", "U8S8"])
def test_output_headroom_leaves_room_for_unseen_inputs_on_8_bit_grids(preset):
    """output_headroom=1.5 widens the graph output's 8-bit range 1.5 times: fresh samples of
    the calibration's own distribution go past its extremes (recurrent and attention models
    calibrated on 16 samples lost 13 to 18 dB on 64 unseen ones, the output clipped where the
    guard, scoring calibrated samples, read 35 to 43 dB) and come out unclipped; by default
    (as with 1) they are clipped at the calibrated extremes, and the interior ranges are the
    same either way."""
    import onnxruntime as ort

    rng = np.random.default_rng(11)
    w = rng.standard_normal((16, 6)).astype(np.float32)
    data = [{"x": rng.standard_normal((4, 16)).astype(np.float32)} for _ in range(4)]
    unseen = rng.standard_normal((512, 16)).astype(np.float32)
    ref = unseen @ w
    seen = np.concatenate([f["x"] @ w for f in data])
    assert np.abs(ref).max() > 1.2 * np.abs(seen).max()  # unseen samples go past the calibrated
    got, scale, x_scale = {}, {}, {}
    for oh in ("auto", 1.5):
        q = mixq.quantize(_matmul_model(w), get_default_config(preset).with_options(output_headroom=oh),
                          data, check_kernels=False).model
        got[oh] = session(q, RUNTIME).run(None, {"x": unseen})[0]
        scale[oh], x_scale[oh] = _output_scale(q), _output_scale(q, _dq_of(q, "x"))
    assert scale[1.5] == pytest.approx(1.5 * scale["auto"], rel=0.02)
    assert x_scale[1.5] == x_scale["auto"]  # the input defines no output: as calibrated
    err = {oh: float(np.sum((g - ref) ** 2)) for oh, g in got.items()}
    assert err[1.5] < 0.5 * err["auto"]  # the clipped tails cost more than the wider step
    assert got["auto"].max() <= seen.max() * 1.01 and got[1.5].max() > 1.1 * seen.max()


@pytest.mark.parametrize("method", ["percentile", "entropy"])
def test_a_clipping_range_method_on_few_samples_is_named_too(method):
    """Percentile and Entropy ranges end inside the calibrated extremes: on 16 samples the output
    is as exposed as MinMax's (before, only MinMax and MinMSE ranges were named), and the fix
    named is MinMax with headroom (output_headroom widens unclipped ranges only)."""
    rng = np.random.default_rng(3)
    w = rng.standard_normal((8, 4)).astype(np.float32)
    x = rng.standard_normal((16, 8)).astype(np.float32)
    cfg = mixq.QuantConfig(activation="int8", weight="int8", calibration=method)
    res = mixq.quantize(_matmul_model(w), cfg, [{"x": x[i:i + 4]} for i in range(0, 16, 4)], check_kernels=False)
    assert res.exposed == ("y",)
    assert f"calibrate with MinMax instead of {method} and widen these ranges with output_headroom=1.5" \
        in res.summary()



@pytest.mark.parametrize("preset", ["A8W8", "U8S8"])
def test_the_summary_says_when_few_samples_leave_the_output_range_exposed(preset):
    """Calibrated on 16 samples, an 8-bit output's range ends at their extremes, and about 1
    in 17 unseen inputs is clipped there where the guard cannot see it: the summary says so
    (naming the tensor, the count and the fix); 64 samples, an output_headroom asked for, a
    16-bit grid and an output whose data reach the bounds of the op that makes it (a Clip) say
    nothing; a Sigmoid left float names the logits it reads. A power-of-two preset, whose scale
    reaches just past the extreme, is named with the one fix it takes (more samples: it refuses
    output_headroom); before, it said nothing. Sharded calibration counts the same samples."""
    from onnx import helper

    from mixq.distributed import SerialExecutor

    rng = np.random.default_rng(3)
    w = rng.standard_normal((8, 4)).astype(np.float32)
    x = rng.standard_normal((64, 8)).astype(np.float32)
    few = [{"x": x[i:i + 4]} for i in range(0, 16, 4)]
    res = mixq.quantize(_matmul_model(w), preset, few, check_kernels=False)
    assert (res.calibration_rows, res.exposed) == (16, ("y",))
    assert "the 8-bit ranges of y, which define the output, end at (or just past) the extremes of 16 calibration" \
        in res.summary() and "1 in 17 unseen inputs" in res.summary() and "--output-headroom 1.5" in res.summary()
    with SerialExecutor(2) as ex:
        sharded = mixq.quantize(_matmul_model(w), preset, few, check_kernels=False, executor=ex)
    assert (sharded.calibration_rows, sharded.exposed) == (16, ("y",))
    quiet = [mixq.quantize(_matmul_model(w), preset, [{"x": x}], check_kernels=False),
             mixq.quantize(_matmul_model(w), get_default_config(preset).with_options(output_headroom=1.5), few,
                           check_kernels=False),
             mixq.quantize(_matmul_model(w), "A16W8", few, check_kernels=False)]
    pof2 = mixq.quantize(_matmul_model(w), "XINT8", few, check_kernels=False)
    assert pof2.exposed == ("y",) and "Calibrate on more samples (hundreds)" in pof2.summary()
    assert "output-headroom" not in pof2.summary()
    sig = _matmul_model(w)
    sig.graph.node[0].output[0] = "z"
    sig.graph.node.append(helper.make_node("Sigmoid", ["z"], ["y"]))
    tail = mixq.quantize(sig, preset, few, check_kernels=False)  # the tail float: its logits exposed
    assert tail.exposed == ("z",) and "8-bit ranges of z" in tail.summary()
    clip = _matmul_model(w)
    clip.graph.node[0].output[0] = "z"
    clip.graph.node.append(helper.make_node("Clip", ["z", "lo", "hi"], ["y"]))
    clip.graph.initializer.extend([onnx.numpy_helper.from_array(np.float32(-0.5), "lo"),
                                   onnx.numpy_helper.from_array(np.float32(0.5), "hi")])
    quiet.append(mixq.quantize(clip, preset, few, check_kernels=False))  # reaches both bounds
    for r in quiet:
        assert not r.exposed and "unseen inputs" not in r.summary(), r.summary()
    assert quiet[0].calibration_rows == 64


def test_an_output_headroom_that_moves_no_range_of_the_model_is_an_error():
    """Every option changes the output or is an error, and whether output_headroom does
    depends on the model: A16W8's outputs are already widened twice (1.5 moves nothing), a
    float last layer leaves no output-defining tensor on an integer grid, and a Clip the data
    saturate bounds its output. Each is a ConfigError that says which and to drop it; where it
    widens something, the same value is accepted."""
    from onnx import helper

    rng = np.random.default_rng(3)
    w = rng.standard_normal((8, 4)).astype(np.float32)
    few = [{"x": rng.standard_normal((4, 8)).astype(np.float32)} for _ in range(4)]
    oh = get_default_config("A8W8").with_options(output_headroom=1.5)
    assert mixq.quantize(_matmul_model(w), oh, few, check_kernels=False).model is not None
    with pytest.raises(ConfigError, match=r"output_headroom=1.5 changes nothing in this model: every tensor "
                                          r"that defines the output \(y\) is already as wide.*Drop it"):
        mixq.quantize(_matmul_model(w), get_default_config("A16W8").with_options(output_headroom=1.5), few,
                      check_kernels=False)
    two = _matmul_model(w)  # MatMul -> Relu -> MatMul (excluded: float) -> y
    two.graph.node[0].output[0] = "h"
    two.graph.node.extend([helper.make_node("Relu", ["h"], ["r"]), helper.make_node("MatMul", ["r", "w2"], ["y"], name="last")])
    two.graph.initializer.append(onnx.numpy_helper.from_array(rng.standard_normal((4, 4)).astype(np.float32), "w2"))
    with pytest.raises(ConfigError, match="no tensor that defines the output is on an integer grid"):
        mixq.quantize(two, oh.with_options(exclude_nodes=frozenset({"last"})), few, check_kernels=False)
    clip = _matmul_model(w)
    clip.graph.node[0].output[0] = "z"
    clip.graph.node.append(helper.make_node("Clip", ["z", "lo", "hi"], ["y"]))
    clip.graph.initializer.extend([onnx.numpy_helper.from_array(np.float32(-0.5), "lo"),
                                   onnx.numpy_helper.from_array(np.float32(0.5), "hi")])
    with pytest.raises(ConfigError, match="at the bound of the op that makes it"):
        mixq.quantize(clip, oh, few, check_kernels=False)


def _dq_of(model: onnx.ModelProto, tensor: str) -> str:
    """The output of the DequantizeLinear that reads `tensor`'s QuantizeLinear."""
    q = next(n for n in model.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == tensor)
    return next(n.output[0] for n in model.graph.node if n.op_type == "DequantizeLinear" and n.input[0] == q.output[0])


def test_output_headroom_widens_where_range_headroom_widens_less_and_is_checked():
    """output_headroom is a floor on the output tensors' widening: 'auto' and 1 leave
    range_headroom's (2 on 16-bit grids), a number widens them that much; wrong values are
    refused by name."""
    from mixq.formats import get_format

    int8, int16 = get_format("int8"), get_format("int16")
    cfg = get_default_config("A8W8")
    assert (cfg.headroom_for(int8), cfg.headroom_for(int8, output=True)) == (1.0, 1.0)
    assert cfg.with_options(output_headroom=1.5).headroom_for(int8, output=True) == 1.5
    assert cfg.with_options(output_headroom=1.5).headroom_for(int8) == 1.0
    assert get_default_config("A16W8").with_options(output_headroom=1.5).headroom_for(int16, output=True) == 2.0
    assert cfg.with_options(range_headroom=1, output_headroom=3).headroom_for(int8, output=True) == 3.0
    for bad in ("wide", 0.5, True):
        with pytest.raises(ConfigError, match="output_headroom"):
            cfg.with_options(output_headroom=bad)
    with pytest.raises(ConfigError, match="power_of_two"):
        get_default_config("XINT8").with_options(output_headroom=2)


def test_cli_range_headroom_reaches_the_config_and_old_plans_replay_without_it(tmp_path):
    import json

    from mixq.cli.main import main
    from mixq.data import default_model_path
    from mixq.pipeline import config_of_plan
    from mixq.plan.plan import PrecisionPlan

    out = tmp_path / "plan.json"
    assert main(["plan", str(default_model_path()), "--preset", "A16W8", "--range-headroom", "3",
                 "-o", str(out)]) == 0
    assert json.loads(out.read_text())["config"]["range_headroom"] == 3.0
    assert main(["plan", str(default_model_path()), "--range-headroom", "lots",
                 "-o", str(tmp_path / "p.json")]) == 2
    # a plan file written before the option existed carries no range_headroom: it was made
    # without any, and replays so
    d = json.loads(out.read_text())
    del d["config"]["range_headroom"]
    out.write_text(json.dumps(d))
    assert config_of_plan(PrecisionPlan.from_json(out.read_text()), None).range_headroom == 1.0
    assert main(["plan", str(default_model_path()), "--preset", "A8W8", "--output-headroom", "2.5",
                 "-o", str(out)]) == 0
    d = json.loads(out.read_text())
    assert d["config"]["output_headroom"] == 2.5
    del d["config"]["output_headroom"]  # a plan made before it: no widening of the outputs
    out.write_text(json.dumps(d))
    assert config_of_plan(PrecisionPlan.from_json(out.read_text()), None).output_headroom == 1.0

def _conv_or_gemm(op: str, w_scale: float, bias: list[float]) -> onnx.ModelProto:
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    if op == "Conv":
        w, shape = rng.standard_normal((4, 3, 3, 3)), [1, 3, 8, 8]
        node = helper.make_node("Conv", ["x", "w", "b"], ["y"], pads=[1, 1, 1, 1], name="op")
        out = [1, 4, 8, 8]
    else:
        w, shape = rng.standard_normal((4, 12)), [1, 12]
        node = helper.make_node("Gemm", ["x", "w", "b"], ["y"], transB=1, name="op")
        out = [1, 4]
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, out)],
                          [numpy_helper.from_array((w * w_scale).astype(np.float32), "w"),
                           numpy_helper.from_array(np.array(bias, np.float32), "b")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


@pytest.mark.parametrize("op", ["Conv", "Gemm"])
@pytest.mark.parametrize("preset", ["A8W8", "U8S8", "XINT8"])
def test_an_8bit_bias_beyond_int32_keeps_its_value_in_onnxruntimes_fused_kernels(op, preset):
    """Weights ~1e-3, inputs ~1e-2 and a bias of 40: the bias overflows int32 at input scale x
    weight scale. A 2**k bias scale is right in the QDQ semantics, but onnxruntime's fused
    QLinearConv / QGemm read the codes at the product and lose 3/4 of the bias; the weight
    grid is widened instead."""
    m = _conv_or_gemm(op, 1e-3, [40.0, -30.0, 25.0, 0.1])
    shape = [d.dim_value for d in m.graph.input[0].type.tensor_type.shape.dim]
    rng = np.random.default_rng(1)
    data = [{"x": (rng.standard_normal(shape) * 1e-2).astype(np.float32)} for _ in range(4)]
    res = mixq.quantize(m, preset, data)
    assert res.rewrite.bias_grids.get("w", ("", 0))[0] == "b", res.rewrite.bias_grids
    assert "so that their biases fit int32" in res.summary()
    from tests.graphs import run

    ref = run(m, data[0])[0]
    step = 40.0 / 127 * 2  # two steps of the output's 8-bit grid
    for optimize in (False, True):  # the QDQ semantics and the user's runtime
        got = run(res.model, data[0], optimize=optimize)[0]
        assert np.abs(got - ref).max() < step, (optimize, np.abs(got - ref).max())


def test_a_bias_scale_that_underflows_float32_still_gets_codes():
    """Activations near 1e-32 and weights near 1e-17: input scale x weight scale underflows
    float32 to 0, and bias / 0 had no int32 code (NaN cast to int32, the bias lost)."""
    import warnings

    m = _conv_or_gemm("Conv", 1e-15, [0.1, 0.5, -0.2, 0.0])
    rng = np.random.default_rng(1)
    data = [{"x": (rng.standard_normal((1, 3, 8, 8)) * 1e-30).astype(np.float32)} for _ in range(4)]
    from tests.graphs import run

    for preset in ("A8W8", "A16W8"):
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no invalid value in a divide or a cast
            res = mixq.quantize(m, preset, data)
        for optimize in (False, True):
            got = run(res.model, data[0], optimize=optimize)[0]
            np.testing.assert_allclose(got, run(m, data[0])[0], atol=0.5 / 127 * 2)


def test_the_guard_checks_the_model_in_onnxruntimes_default_optimizations(tmp_path, monkeypatch):
    """The guard scores the QDQ semantics; it also runs the model as users do (default
    optimizations, fused 8-bit kernels) and warns when that scores far worse. Shown on the
    2**k bias scale mixq used to emit: right in the QDQ graph, lost in QLinearConv. The output
    stays on its one int8 grid here (numerics policy (j), which would keep it float for its
    quiet fourth channel, is off: test_guard_value_heads.py tests it)."""
    from onnx import numpy_helper

    import mixq.plan.numerics
    from mixq.fidelity import check_fidelity

    monkeypatch.setattr(mixq.plan.numerics, "channel_scale_outputs", lambda *a, **kw: {})

    m = _conv_or_gemm("Conv", 1e-3, [40.0, -30.0, 25.0, 0.1])
    rng = np.random.default_rng(1)
    data = [{"x": (rng.standard_normal((1, 3, 8, 8)) * 1e-2).astype(np.float32)} for _ in range(4)]
    res = mixq.quantize(m, "A8W8", data, output_path=tmp_path / "q.onnx")
    rep = res.fidelity
    assert rep.runtime_sqnr_db is not None and not rep.runtime_disagrees
    # the fourth channel (bias 0.1 beside 40, -30, 25) is on a grid of 0.3: lost, and said so
    assert rep.broken and rep.outputs[0].part is not None and rep.outputs[0].part.channels == (3,)
    assert abs(rep.runtime_sqnr_db - rep.runtime_qdq_sqnr_db) < 3
    # the bias codes / 4 at a scale x 4: the same values in the QDQ semantics
    q = res.model
    inits = {t.name: t for t in q.graph.initializer}
    dq = next(n for n in q.graph.node if n.op_type == "DequantizeLinear"
              and numpy_helper.to_array(inits[n.input[0]]).dtype == np.int32)
    codes, scale = (numpy_helper.to_array(inits[n]) for n in dq.input[:2])
    inits[dq.input[0]].CopyFrom(numpy_helper.from_array((codes // 4).astype(np.int32), dq.input[0]))
    inits[dq.input[1]].CopyFrom(numpy_helper.from_array((scale * 4).astype(np.float32), dq.input[1]))
    bad = check_fidelity(m, q, data[2:], probe=False)
    assert bad.runtime_disagrees, bad.lines()
    assert "default optimizations" in bad.lines()[-1]
    # A16W8: onnxruntime fuses no 16-bit kernel, nothing to compare
    assert mixq.quantize(m, "A16W8", data).fidelity.runtime_sqnr_db is None


def test_a_conv_whose_input_stays_float_keeps_a_float_bias():
    """The Conv's input is kept float by a numerics policy (a -1e35 sentinel in it), its weight
    int8: the bias stays float with a reason (the bias-room pass once asked the format registry
    for a format named 'float32' there, a FormatError found by the architecture sweep)."""
    m = _conv_or_gemm("Conv", 1.0, [0.1, 0.2, 0.3, 0.4])
    rng = np.random.default_rng(1)
    data = []
    for _ in range(4):
        x = rng.standard_normal((1, 3, 8, 8)).astype(np.float32)
        x[0, 0, 0, 0] = -1e35
        data.append({"x": x})
    res = mixq.quantize(m, "A8W8", data)
    assert res.plan.tensors["x"].format is None
    assert "not integer-quantized" in res.rewrite.biases_kept_float["b"]


def _u8s8_here():
    """U8S8 as this CPU runs it right: on x86 without VNNI onnxruntime's u8 x s8 MatMul kernels
    saturate with full-range weights (README, int8 note) whatever the softmax does, so the
    softmax tests take the documented remedy there (reduce_range) and measure the softmax alone."""
    return get_default_config("U8S8").with_options(reduce_range=mixq.api.cpu_has_vnni() is False)


def test_nearly_uniform_softmax_rows_keep_their_codes_in_onnxruntimes_qlinearsoftmax():
    """Attention over 50 keys with nearly uniform rows (largest probability under 1.7 / 50): the
    calibrated uint8 scale is below 1 / (50 e^5), where onnxruntime's QLinearSoftmax overflows
    float and writes 0 for the whole row (a Whisper encoder at U8S8 in the architecture sweep:
    38.8 dB in the QDQ semantics, 26.8 dB as users run it). The scale is raised to that bound."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    n = 50
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["s"]), helper.make_node("Softmax", ["s"], ["p"], axis=-1),
         helper.make_node("MatMul", ["p", "v"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", n, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["B", n, 16])],
        [numpy_helper.from_array((rng.normal(0, 1, (16, n)) * 0.02).astype(np.float32), "w"),
         numpy_helper.from_array(rng.normal(0, 1, (n, 16)).astype(np.float32), "v")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    data = [{"x": rng.normal(0, 1, (2, n, 16)).astype(np.float32)} for _ in range(8)]
    res = mixq.quantize(m, _u8s8_here(), data)
    assert any("QLinearSoftmax" in note for note in res.rewrite.notes), res.rewrite.notes
    rep = res.fidelity
    assert abs(rep.runtime_sqnr_db - rep.runtime_qdq_sqnr_db) < 1.0 and rep.runtime_qdq_sqnr_db > 30


def test_a_softmax_axis_only_symbolic_inference_sizes_still_gets_its_bound():
    """The key length comes from a Reshape whose shape is computed at run time (Shape -> Gather ->
    Concat, as exporters write attention): ONNX shape inference leaves the softmax axis unknown,
    onnxruntime's symbolic shape inference sizes it (50), and the QLinearSoftmax bound applies
    (before: the pass declined and the fused kernel wrote 0 for every row)."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    n = 50
    nodes = [helper.make_node("MatMul", ["x", "wq"], ["q"]), helper.make_node("MatMul", ["x", "wk"], ["k"]),
             helper.make_node("Shape", ["x"], ["shp"]), helper.make_node("Gather", ["shp", "i0"], ["b"], axis=0),
             helper.make_node("Concat", ["b", "m1", "d"], ["kshape"], axis=0),
             helper.make_node("Reshape", ["k", "kshape"], ["k2"]),
             helper.make_node("Transpose", ["k2"], ["kt"], perm=[0, 2, 1]),
             helper.make_node("MatMul", ["q", "kt"], ["s"]), helper.make_node("Softmax", ["s"], ["p"], axis=-1),
             helper.make_node("MatMul", ["p", "k2"], ["y"])]
    w = lambda: numpy_helper.from_array((rng.normal(0, 1, (16, 16)) * 0.005).astype(np.float32))  # noqa: E731
    wq, wk = w(), w()
    wq.name, wk.name = "wq", "wk"
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", n, 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["B", n, 16])],
                          [wq, wk, numpy_helper.from_array(np.array([0], np.int64), "i0"),
                           numpy_helper.from_array(np.array([-1], np.int64), "m1"),
                           numpy_helper.from_array(np.array([16], np.int64), "d")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    data = [{"x": rng.normal(0, 1, (2, n, 16)).astype(np.float32)} for _ in range(8)]
    res = mixq.quantize(m, _u8s8_here(), data)
    assert any("QLinearSoftmax" in note and "50 e^5" in note for note in res.rewrite.notes), res.rewrite.notes
    rep = res.fidelity
    assert not rep.runtime_disagrees and abs(rep.runtime_sqnr_db - rep.runtime_qdq_sqnr_db) < 1.0


def test_the_runtime_check_looks_past_a_16bit_quantizelinear_without_zero_point():
    """_fusable reads every QuantizeLinear: a first one without a zero point and a 16-bit
    output_dtype says nothing about the 8-bit ones after it."""
    from onnx import TensorProto, helper, numpy_helper

    from mixq.fidelity import _fusable

    nodes = [helper.make_node("QuantizeLinear", ["x", "s"], ["q16"], output_dtype=TensorProto.INT16),
             helper.make_node("DequantizeLinear", ["q16", "s"], ["d16"]),
             helper.make_node("QuantizeLinear", ["d16", "s", "z8"], ["q8"]),
             helper.make_node("DequantizeLinear", ["q8", "s", "z8"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
                          [numpy_helper.from_array(np.float32(0.1), "s"),
                           numpy_helper.from_array(np.array(0, np.int8), "z8")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
    assert _fusable(m)
    del m.graph.node[2:]
    m.graph.node[1].output[0] = "y"
    assert not _fusable(m)


@pytest.mark.parametrize("preset", ["A8W8", "U8S8", "A16W8"])
def test_tensors_after_a_function_op_without_inferred_types_are_planned(preset):
    """ONNX type inference types neither a GroupNormalization-21 (a function op) nor anything
    after it. Before, the plan left all of it float without a word (the second Conv ran on a
    float input with an int8 weight); the op schemas type it now, and GroupNormalization is
    in the op table like InstanceNormalization."""
    from tests.graphs import groupnorm_block

    m, fd = groupnorm_block()
    res = mixq.quantize(m, preset, fd, check_kernels=False)
    want = "int16" if preset == "A16W8" else ("uint8" if preset == "U8S8" else "int8")
    for t in ("gn", "sg", "act"):
        assert res.plan.tensors[t].format == want, (t, res.plan.tensors.get(t))
    assert "GroupNormalization" not in " ".join(res.plan.float_nodes.values())
    assert compare(m, res.model, fd).first().sqnr_db >= (40.0 if preset == "A16W8" else 28.0)


def test_a_quantized_model_only_basic_optimizations_load_is_a_named_internal_error():
    """DequantizeLinear (int8, opset 21) -> Slice -> output: onnxruntime 1.31's default
    optimizations form a QuantizeLinear they then reject. The guard's optimized session was
    the first to see it and let onnxruntime's own exception out."""
    from onnx import TensorProto, helper, numpy_helper

    from mixq.fidelity import check_fidelity

    def model(qdq: bool) -> onnx.ModelProto:
        nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
                 helper.make_node("DequantizeLinear", ["q", "s", "z"], ["d"])] if qdq else \
            [helper.make_node("Identity", ["x"], ["d"])]
        nodes.append(helper.make_node("Slice", ["d", "b", "e", "ax"], ["y"]))
        inits = [numpy_helper.from_array(np.float32(0.05), "s"), numpy_helper.from_array(np.int8(0), "z"),
                 numpy_helper.from_array(np.array([0], np.int64), "b"),
                 numpy_helper.from_array(np.array([4], np.int64), "e"),
                 numpy_helper.from_array(np.array([1], np.int64), "ax")]
        g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
                              inits if qdq else inits[2:])
        return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)

    feeds_ = [{"x": np.random.default_rng(0).normal(size=(2, 8)).astype(np.float32)}]
    with pytest.raises(ModelError, match="loads in onnxruntime with basic optimizations but not with its "
                                         "default ones.*nothing was written"):
        check_fidelity(model(False), model(True), feeds_)
