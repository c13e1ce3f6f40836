"""Every conversion format on every test model (float32 and float16 twins): checker, runs in
onnxruntime CPU, fidelity, defining structure. `check_conversion` takes any model path or proto."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import pytest

import mixq.convert._rewrite
from onnx import TensorProto, helper, numpy_helper

from mixq.convert import BF16_FORMATS, PROBE_CACHE, to_bf16, to_fp16
from mixq.convert.testing import (TEST_MODELS, bf16_representable, check_conversion, if_model,
                                  to_fp16_model)
from mixq.errors import ConfigError, FormatError, ModelError

from ..graphs import (bucketized_feature, groupnorm_block, rotary_at_run_time, standardized_features,
                      timestep_embedding)

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

# measured minimum over these models: ~45 dB (fp16 with_cast), bound with margin
MIN_SQNR = 35.0


def _model(name: str, fp16: bool) -> onnx.ModelProto:
    m = TEST_MODELS[name]()
    return to_fp16_model(m) if fp16 else m


@pytest.mark.parametrize("fmt", BF16_FORMATS)
@pytest.mark.parametrize("fp16", [False, True], ids=["fp32", "fp16"])
@pytest.mark.parametrize("name", sorted(TEST_MODELS))
def test_bf16_formats(name, fp16, fmt):
    out, rep = check_conversion(_model(name, fp16), fmt, min_sqnr_db=MIN_SQNR)
    assert rep.source == ("fp16" if fp16 else "fp32") and rep.target == "bfloat16"
    assert "SQNR" in rep.to_markdown()


@pytest.mark.parametrize("fmt", ["fp16", "fp16:with_cast", "simulate_fp16"])
@pytest.mark.parametrize("name", sorted(TEST_MODELS))
def test_fp16_formats(name, fmt):
    check_conversion(TEST_MODELS[name](), fmt, min_sqnr_db=50.0)


def test_model_path_input(tmp_path):
    p = tmp_path / "m.onnx"
    onnx.save(TEST_MODELS["classifier"](), str(p))
    check_conversion(p, "bf16")


def test_bf16_graph_boundaries_and_kept_float_reasons():
    m = TEST_MODELS["transformer"]()
    out, rep = to_bf16(m, "bf16")
    assert out.graph.input[0].type.tensor_type.elem_type == TensorProto.FLOAT
    assert out.graph.output[0].type.tensor_type.elem_type == TensorProto.FLOAT
    kept = {k.node: k.reason for k in rep.kept_float}
    for node in out.graph.node:
        assert node.name  # every node named (reports refer to them)
    for k in rep.kept_float:
        assert k.reason and k.op_type
    # every kept node is really float: its data inputs are float32 tensors
    assert rep.nodes_converted + len(rep.kept_float) <= rep.nodes_total
    # the probe cache holds per (provider, op, opset, types) answers
    assert any(key[0] == "CPUExecutionProvider" and key[2] == "MatMul" for key in PROBE_CACHE)
    md = rep.to_markdown()
    assert "kept in fp32" in md
    for reason in set(kept.values()):
        assert reason in md


def test_bf16_keeps_int64_paths_and_resize_scales():
    m = TEST_MODELS["shape_paths"]()
    for fmt in BF16_FORMATS:
        out, _ = to_bf16(m, fmt, evaluate=False)
        inits = {t.name: t for t in out.graph.initializer}
        scales = numpy_helper.to_array(inits["scales"])
        assert scales.dtype == np.float32 and scales.tolist() == [1, 1, 2, 2]
        for name in ("idx0", "minus1"):
            assert inits[name].data_type == TensorProto.INT64
        resize = next(n for n in out.graph.node if n.op_type == "Resize")
        assert resize.input[2] == "scales"
        shape = next(n for n in out.graph.node if n.op_type == "Shape")
        producers = {o: n for n in out.graph.node for o in n.output}
        # nothing is inserted on the int64 path
        for n in out.graph.node:
            if n.op_type in ("Gather", "Concat", "Reshape") and n.name in ("gather_batch", "concat_shape"):
                for i in n.input:
                    assert i not in producers or producers[i].op_type != "Cast"
        assert shape is not None


def test_subgraph_node_left_float_and_reported():
    m = if_model()
    out, rep = to_bf16(m, "bf16", feeds={"x": np.ones((2, 8), np.float32), "cond": np.array(True)})
    reasons = {k.op_type: k.reason for k in rep.kept_float}
    assert "If" in reasons and "subgraph" in reasons["If"]
    assert any("subgraph" in n for n in rep.notes)
    onnx.checker.check_model(out, full_check=True)
    for cond in (True, False):
        _, rep2 = to_bf16(m, "with_cast", feeds={"x": np.ones((2, 8), np.float32), "cond": np.array(cond)})
        assert rep2.min_sqnr_db > MIN_SQNR


@pytest.mark.parametrize("fmt", BF16_FORMATS)
def test_a_body_with_weights_is_reported_kept_not_untouched(fmt):
    """Silero VAD's layout: every layer inside an If's branches, each with its own weight. The
    converters rewrite the main graph only, and reported the If as having nothing to convert
    ("untouched"): a file whose layers all stay float32 with no word of it. Now the If is kept
    in the source type with the reason, and the branches' weights are left as they were."""
    rng = np.random.default_rng(0)

    def branch(name: str) -> onnx.GraphProto:
        w = rng.normal(0, 0.5, (4, 2, 3)).astype(np.float32)
        return helper.make_graph([helper.make_node("Conv", ["x", f"{name}_w"], [f"{name}_y"], pads=[1, 1])],
                                 name, [], [helper.make_tensor_value_info(f"{name}_y", TensorProto.FLOAT, None)],
                                 [numpy_helper.from_array(w, f"{name}_w")])
    g = helper.make_graph([helper.make_node("If", ["c"], ["z"], then_branch=branch("hi"),
                                            else_branch=branch("lo"), name="by_rate"),
                           helper.make_node("Relu", ["z"], ["y"], name="relu")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 16]),
                           helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 16])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    out, rep = to_bf16(m, fmt, feeds={"x": np.ones((1, 2, 16), np.float32), "c": np.array(True)})
    kept = {k.op_type: k.reason for k in rep.kept_float}
    assert "If" in kept and "2 float32 weight(s)" in kept["If"], kept
    assert next(c for c in rep.op_counts if c.op_type == "If").untouched == 0
    def then_weight(model: onnx.ModelProto) -> bytes:
        body = next(a.g for n in model.graph.node if n.op_type == "If" for a in n.attribute
                    if a.name == "then_branch")
        return numpy_helper.to_array(body.initializer[0]).tobytes()
    assert then_weight(out) == then_weight(m)


def _special_model(dtype=np.float32) -> tuple[onnx.ModelProto, np.ndarray]:
    w = np.array([1.0, 1.00390625, 1.01171875, 3.14159265, -2.5e-39, 1e-45, 9.2e-41, np.inf, -np.inf,
                  np.nan, 3.38e38, -1e-30, 65504.0, 0.0, -0.0, 1e-6], dtype=dtype)
    t = TensorProto.FLOAT if dtype == np.float32 else TensorProto.FLOAT16
    g = helper.make_graph([helper.make_node("Mul", ["x", "w"], ["y"], name="mul")], "s",
                          [helper.make_tensor_value_info("x", t, [w.size])],
                          [helper.make_tensor_value_info("y", t, [w.size])],
                          initializer=[numpy_helper.from_array(w, "w")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m, w


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_stored_and_simulated_weights_bit_exact_with_specials(dtype):
    m, w = _special_model(dtype)
    with np.errstate(over="ignore", invalid="ignore"):
        ref_bits = w.astype(ml_dtypes.bfloat16).view(np.uint16)
        ref_vals = w.astype(ml_dtypes.bfloat16).astype(dtype)
    out, rep = to_bf16(m, "bf16", evaluate=False)
    t = next(t for t in out.graph.initializer if t.name == "w")
    assert t.data_type == TensorProto.BFLOAT16
    assert np.array_equal(np.frombuffer(t.raw_data, "<u2"), ref_bits)
    out, _ = to_bf16(m, "simulate_bf16", evaluate=False)
    sim = numpy_helper.to_array(out.graph.initializer[0])
    assert sim.dtype == dtype
    assert np.array_equal(np.isnan(sim), np.isnan(ref_vals))
    ok = ~np.isnan(sim)
    assert np.array_equal(sim[ok], ref_vals[ok]) and np.array_equal(np.signbit(sim[ok]), np.signbit(ref_vals[ok]))
    if dtype == np.float32:
        assert bf16_representable(sim)
    # customqdq stores the same bf16 bits behind a BFloat16Dequantize
    out, _ = to_bf16(m, "customqdq", evaluate=False)
    t = next(t for t in out.graph.initializer if t.data_type == TensorProto.BFLOAT16)
    assert np.array_equal(np.frombuffer(t.raw_data, "<u2"), ref_bits)


@pytest.mark.parametrize("fmt", ["with_cast", "customqdq", "bf16", "simulate_bf16", "fp16:fp16",
                                 "fp16:with_cast", "fp16:simulate_fp16"])
def test_a_float32_lowest_mask_stays_float(fmt):
    """An additive mask of float32's lowest value with a fully masked row (a padded query):
    float32 softmaxes that row to a uniform one; cast to bf16 / fp16 the mask is -inf and the
    row NaN. The nodes that read it stay float, with the reason in the report."""
    import onnxruntime as ort

    T = 6
    mask = np.zeros((T, T), np.float32)
    mask[:, -2:] = np.finfo(np.float32).min
    mask[-1, :] = np.finfo(np.float32).min
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["s"], name="mm"),
             helper.make_node("Add", ["s", "mask"], ["m"], name="add"),
             helper.make_node("Softmax", ["m"], ["y"], axis=-1, name="sm")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, T, T])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, T, T])],
                          [numpy_helper.from_array(rng.normal(0, 0.5, (T, T)).astype(np.float32), "w"),
                           numpy_helper.from_array(mask, "mask")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    x = rng.normal(0, 1, (2, T, T)).astype(np.float32)
    target, _, f = fmt.rpartition(":")
    out, rep = (to_fp16 if target == "fp16" else to_bf16)(m, f, feeds={"x": x})
    so = ort.SessionOptions()
    so.log_severity_level = 3
    s = ort.InferenceSession(out.SerializeToString(), so, providers=["CPUExecutionProvider"])
    y = s.run(None, {s.get_inputs()[0].name: x.astype(np.float16) if "float16" in s.get_inputs()[0].type else x})[0]
    assert np.isfinite(y).all()
    np.testing.assert_allclose(y[:, -1].astype(np.float32), 1.0 / T, rtol=1e-2)  # the padded row: uniform
    assert any("largest finite value" in k.reason for k in rep.kept_float), rep.kept_float


@pytest.mark.parametrize("fmt", ["with_cast", "customqdq", "bf16"])
def test_runtime_rounding_matches_ml_dtypes(fmt):
    """The inserted Casts / functions round activations exactly like ml_dtypes (incl. NaN/inf)."""
    import onnxruntime as ort

    g = helper.make_graph([helper.make_node("Identity", ["x"], ["y"], name="id")], "i",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    out, _ = to_bf16(m, fmt, evaluate=False)
    rng = np.random.default_rng(0)
    x = rng.integers(0, 2 ** 32, 100_000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    y = ort.InferenceSession(out.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    ref = x.astype(ml_dtypes.bfloat16).astype(np.float32)
    nan = np.isnan(ref)
    assert np.array_equal(np.isnan(y), nan)
    assert np.array_equal(y[~nan].view(np.uint32), ref[~nan].view(np.uint32))


def test_input_model_not_modified_and_report_fields():
    m = TEST_MODELS["classifier"]()
    before = m.SerializeToString()
    for fmt in BF16_FORMATS:
        _, rep = to_bf16(m, fmt)
        assert m.SerializeToString() == before
        assert rep.size_before == len(before)
        assert rep.wall_time_s > 0 and rep.eval_time_s > 0
        d = rep.to_dict()
        assert d["format"] == fmt and d["fidelity"][0]["name"] == "logits"
    _, rep = to_bf16(m, "bf16")
    assert rep.size_after < rep.size_before  # weights stored in 2 bytes


def test_given_feeds_and_shapes():
    m = TEST_MODELS["classifier"]()
    feeds = {"input": np.random.default_rng(3).standard_normal((4, 3, 16, 16)).astype(np.float32)}
    _, rep = to_bf16(m, "with_cast", feeds=feeds)
    assert rep.fidelity[0].sqnr_db > MIN_SQNR
    _, rep = to_bf16(m, "with_cast", shapes={"input": [2, 3, 16, 16]})
    assert rep.fidelity[0].sqnr_db > MIN_SQNR


def test_source_detection_and_override():
    m16 = to_fp16_model(TEST_MODELS["classifier"]())
    _, rep = to_bf16(m16, "with_cast", evaluate=False)
    assert rep.source == "fp16"
    with pytest.raises(ModelError, match="fp16"):
        to_bf16(m16, "with_cast", source="fp32")
    with pytest.raises(ModelError, match="fp32"):
        to_bf16(TEST_MODELS["classifier"](), "with_cast", source="fp16")
    with pytest.raises(ModelError):
        to_fp16(m16)
    with pytest.raises(ConfigError, match="Did you mean"):
        to_bf16(m16, "with_cast", source="fp61")


def test_bad_arguments():
    m = TEST_MODELS["classifier"]()
    with pytest.raises(FormatError, match="Did you mean: simulate_bf16"):
        to_bf16(m, "simulate")
    with pytest.raises(FormatError, match="Did you mean: customqdq"):
        to_bf16(m, "custom_qdq")
    with pytest.raises(ConfigError, match="CPUExecutionProvider"):
        to_bf16(m, "bf16", provider="CPUExecutionprovider")
    with pytest.raises(ModelError, match="does not exist"):
        to_bf16("/nonexistent/model.onnx", "bf16")


def test_old_opset_is_upgraded_for_bf16_casts():
    rng = np.random.default_rng(0)
    g = helper.make_graph([helper.make_node("Gemm", ["x", "w", "b"], ["h"], name="fc"),
                           helper.make_node("Relu", ["h"], ["y"], name="relu")], "old",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
                          initializer=[numpy_helper.from_array(rng.standard_normal((8, 4)).astype(np.float32), "w"),
                                       numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "b")])
    old = helper.make_model(g, opset_imports=[helper.make_opsetid("", 11)])
    old.ir_version = 6
    out, rep = to_bf16(old, "with_cast")
    assert any("opset upgraded" in n for n in rep.notes)
    assert rep.min_sqnr_db > MIN_SQNR


def test_report_says_per_op_type_what_was_converted_and_why_not():
    """The newcomer trial (issue 18): `bf16` on CPU converts few nodes; the report says, per op
    type, how many nodes were converted, kept float (with the reason) or had nothing to convert,
    and why: the CPU provider has no bfloat16 kernel (the format targets onnxruntime-gpu)."""
    m = TEST_MODELS["transformer"]()
    _, rep = to_bf16(m, "bf16")
    counts = {c.op_type: c for c in rep.op_counts}
    assert sum(c.nodes for c in rep.op_counts) == len(m.graph.node)
    for c in rep.op_counts:
        assert c.converted + c.kept_float + c.untouched == c.nodes
    assert sum(c.converted for c in rep.op_counts) == rep.nodes_converted
    assert counts["MatMul"].kept_float == 8 and counts["Transpose"].converted == 1
    assert counts["Constant"].untouched == 1
    md = rep.to_markdown()
    assert "### Nodes per op type" in md and "| MatMul | 8 | 0 | 8 | 0 |" in md
    note = next(n for n in rep.notes if "cannot run" in n)
    assert "MatMul" in note and "CUDAExecutionProvider" in note and "with_cast" in note
    _, rep = to_bf16(m, "with_cast")
    assert {c.op_type: c.converted for c in rep.op_counts}["MatMul"] == 8
    assert not any("cannot run" in n for n in rep.notes)
    assert rep.to_dict()["op_counts"][0]["op_type"] == "MatMul"


@pytest.mark.parametrize("fmt", [*BF16_FORMATS, "fp16", "fp16:with_cast", "simulate_fp16"])
@pytest.mark.parametrize("build", [rotary_at_run_time, timestep_embedding], ids=["rotary", "timestep"])
def test_phases_computed_from_positions_stay_float(build, fmt, monkeypatch):
    """Positions near 2000 (a rotary embedding computed from position_ids) or a timestep up to
    1000, times frequencies, into Sin / Cos: bfloat16 spaces 2000 by 8, float16 by 1, and the
    frequency row rounded moves the phase as much. Measured: bf16 formats 46.6-56.0 dB, fp16
    63.7-73.2 dB; with the phases converted: 1.3-30.2 dB (bf16), 25.6-42.7 dB (fp16)."""
    m, feeds = build()
    bf16 = fmt in BF16_FORMATS
    out, rep = check_conversion(m, fmt, feeds=feeds[0], min_sqnr_db=45.0 if bf16 else 60.0)
    assert any("phase of a Sin / Cos" in k.reason for k in rep.kept_float), rep.kept_float
    monkeypatch.setattr(mixq.convert._rewrite, "find_phases", lambda *a: [])
    _, off = check_conversion(m, fmt, feeds=feeds[0], min_sqnr_db=None, min_cosine=None)
    assert off.fidelity[0].sqnr_db < (31.0 if bf16 else 43.0), off.fidelity


@pytest.mark.parametrize("fmt", [*BF16_FORMATS, "fp16", "fp16:with_cast"])
def test_ops_after_a_function_op_without_inferred_types_are_converted(fmt):
    """ONNX type inference leaves GroupNormalization-21 (a function op) and everything after it
    untyped. Before, the converters skipped those tensors: the bf16 format fed a bfloat16
    tensor to a float Conv and the model did not load (ModelError), and with_cast / customqdq
    left the SiLU after it in float32. The op schemas type them now."""
    m, feeds = groupnorm_block()
    out, rep = check_conversion(m, fmt, feeds=feeds[0])
    if fmt in ("with_cast", "fp16:with_cast", "customqdq"):  # the SiLU reads a rounded tensor
        producer = {o: n for n in out.graph.node for o in n.output}
        sig = next(n for n in out.graph.node if n.op_type == "Sigmoid")
        assert producer[sig.input[0]].op_type in ("Cast", "BFloat16Dequantize"), \
            "the SiLU after the GroupNormalization was not converted"


@pytest.mark.parametrize("fmt", BF16_FORMATS)
def test_features_standardized_in_the_graph_stay_float(fmt, monkeypatch):
    """(x - mean) / std on features in their own units (a year of 2020 +- 3): bfloat16 spaces
    the year and the mean by 8. Measured 44.6-50.9 dB; converted as before: 6.8-7.5 dB."""
    m, feeds = standardized_features()
    out, rep = check_conversion(m, fmt, feeds=feeds[0], min_sqnr_db=40.0)
    assert any("standardizes a graph input" in k.reason for k in rep.kept_float), rep.kept_float
    monkeypatch.setattr(mixq.convert._rewrite, "find_input_affine", lambda *a: [])
    _, off = check_conversion(m, fmt, feeds=feeds[0], min_sqnr_db=None, min_cosine=None)
    assert off.fidelity[0].sqnr_db < 10.0, off.fidelity


@pytest.mark.parametrize("fmt", ["with_cast", "customqdq", "fp16", "fp16:with_cast", "simulate_fp16"])
def test_a_feature_bucketized_in_the_graph_keeps_its_buckets(fmt, monkeypatch):
    """Floor(age * 0.1) picks a decade's embedding; bfloat16 spaces ages 64 .. 128 by 0.5 and
    float16 rounds the 0.1: ages near a decade's edge move to the next bucket (on 256 samples:
    15.3 dB with_cast, 25.9 fp16; kept float now: 50.7 and 68.7 dB). The bf16 format and
    simulate_bf16 were unaffected (no bf16 Mul / Floor kernel on CPU; a one-element weight
    stays exact)."""
    m, feeds = bucketized_feature()
    batch = {k: np.concatenate([f[k] for f in feeds]) for k in feeds[0]}
    out, rep = check_conversion(m, fmt, feeds=batch, min_sqnr_db=45.0)
    assert any("Floor / Ceil / Round" in k.reason for k in rep.kept_float), rep.kept_float
    monkeypatch.setattr(mixq.convert._rewrite, "find_phases", lambda *a: [])
    _, off = check_conversion(m, fmt, feeds=batch, min_sqnr_db=None, min_cosine=None)
    assert off.fidelity[0].sqnr_db < 30.0, off.fidelity


def _si_scaled_output():
    """A regression head whose output is brought to SI units by a constant of 1e-6 (float16's
    smallest normal value is 6.1e-5: cast, the constant is a subnormal off by up to 3 %)."""
    rng = np.random.default_rng(5)
    inits = [numpy_helper.from_array(a, n) for n, a in (
        ("w1", rng.normal(0, 0.4, (6, 16)).astype(np.float32)), ("w2", rng.normal(0, 0.25, (16, 3)).astype(np.float32)),
        ("micro", np.float32(1.3e-6)))]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Tanh", ["h"], ["t"]),
             helper.make_node("MatMul", ["t", "w2"], ["z"]), helper.make_node("Mul", ["z", "micro"], ["y"])]
    m = helper.make_model(helper.make_graph(nodes, "si", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 6])],
                                            [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])], inits),
                          opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    return m, {"x": rng.normal(0, 1, (16, 6)).astype(np.float32)}


@pytest.mark.parametrize("fmt", ["fp16", "with_cast", "simulate_fp16"])
def test_a_constant_under_the_float16_range_stays_exact(fmt):
    """A constant under float16's normal range rounds to a subnormal (1.3e-6 by 2 %): every value
    it scales moves together. The node reading it stays float with the exact constant, and a
    kept node's graph output is not rounded after it (with_cast rounded it to a subnormal too).
    Measured SQNR before: 34-39 dB; now over 60 dB."""
    m, feeds = _si_scaled_output()
    out, rep = to_fp16(m, fmt, feeds=feeds)
    assert rep.fidelity[0].sqnr_db > 60, rep.fidelity
    why = [k.reason for k in rep.kept_float if k.op_type == "Mul"]
    assert why and "'micro'" in why[0] and "smallest normal" in why[0], rep.kept_float
    assert rep.initializers_converted == 2  # w1 and w2 are converted; the constant is not
