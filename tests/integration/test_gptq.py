"""GPTQ weight rounding (mixq.passes.gptq): the Conv patches it reads are what onnxruntime's Conv
reads, the codes it chooses sit on the plan's grid (same scales), and the layer outputs of the
quantized model are measurably closer to float than with nearest rounding."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import mixq
from mixq.errors import ConfigError
from mixq.evaluate import compare
from mixq.passes import gptq


def _run(model: onnx.ModelProto, feed: dict[str, np.ndarray]) -> np.ndarray:
    s = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return s.run(None, feed)[0]


CONVS = [  # (spatial, kernel, group, attributes)
    ((9, 11), (3, 3), 1, {"pads": [1, 1, 1, 1]}),
    ((9, 11), (3, 3), 4, {"strides": [2, 2], "pads": [1, 0, 2, 1]}),
    ((12, 10), (3, 2), 2, {"dilations": [2, 1], "strides": [1, 2]}),
    ((8, 9), (5, 5), 8, {"auto_pad": "SAME_UPPER", "strides": [2, 2]}),
    ((8, 9), (4, 4), 8, {"auto_pad": "SAME_LOWER"}),
    ((7, 7), (1, 1), 1, {"auto_pad": "VALID"}),
    ((17,), (3,), 2, {"pads": [2, 0], "strides": [3]}),
]


@pytest.mark.parametrize("spatial,kernel,group,attrs", CONVS)
def test_conv_patches_are_what_onnxruntime_convolves(spatial, kernel, group, attrs):
    """patches @ weight == the Conv's output at every sampled position (pads, strides,
    dilations, auto_pad, groups; 1-D and 2-D), so H is built from the right inputs."""
    _check_patches(spatial, kernel, group, attrs, len(spatial) * 10 + group)


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_conv_patches_of_random_convs_are_what_onnxruntime_convolves(data):
    """The same over random 1-D, 2-D and 3-D Convs: kernel, stride, dilation, explicit or auto
    padding and groups drawn independently."""
    nd = data.draw(st.integers(1, 3))
    kernel = tuple(data.draw(st.integers(1, 3)) for _ in range(nd))
    dil = [data.draw(st.integers(1, 2)) for _ in range(nd)]
    spatial = tuple(data.draw(st.integers((k - 1) * d + 1, (k - 1) * d + 5)) for k, d in zip(kernel, dil))
    attrs = {"strides": [data.draw(st.integers(1, 3)) for _ in range(nd)], "dilations": dil}
    auto = data.draw(st.sampled_from(["NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER"]))
    if auto == "NOTSET":
        attrs["pads"] = [data.draw(st.integers(0, k - 1)) for k in kernel * 2]
    else:
        attrs["auto_pad"] = auto
    if auto.startswith("SAME"):
        attrs.pop("dilations")  # onnxruntime sizes SAME padding without them
        dil[:] = [1] * nd
    _check_patches(spatial, kernel, data.draw(st.sampled_from([1, 2, 8])), attrs, data.draw(st.integers(0, 99)))


def _conv_rows(x, node, kernel, group):
    """The patches GPTQ reads from the batch x for `node`, positions drawn with seed 0."""
    geo = gptq._Patches(node, kernel, group, tuple(x.shape[2:]))
    return geo.rows(x, np.random.default_rng(0))


def _im2col(x, node, kernel, group):
    """The oracle: every output position's patch read element by element from the zero-padded
    batch, (group, N * positions, cin_g * prod(kernel)), positions sample-major."""
    geo = gptq._Patches(node, kernel, group, tuple(x.shape[2:]))
    nd = len(kernel)
    dil = next((list(a.ints) for a in node.attribute if a.name == "dilations"), [1] * nd)
    xp = np.pad(x, [(0, 0), (0, 0), *(geo.pads or [(0, 0)] * nd)])
    n, c = x.shape[:2]
    rows = []
    for s in range(n):
        for pos in np.ndindex(*geo.out):
            patch = [xp[(s, ch) + tuple(p * st + k * d for p, st, k, d in zip(pos, geo.strides, tap, dil))]
                     for ch in range(c) for tap in np.ndindex(*kernel)]
            rows.append(patch)
    a = np.asarray(rows, np.float32).reshape(n * int(np.prod(geo.out)), group, -1)
    return a.transpose(1, 0, 2)


def _check_patches(spatial, kernel, group, attrs, seed):
    rng = np.random.default_rng(seed)
    cin, cout = 8, 8
    w = rng.normal(size=(cout, cin // group, *kernel)).astype(np.float32)
    x = rng.normal(size=(2, cin, *spatial)).astype(np.float32)
    node = helper.make_node("Conv", ["x", "w"], ["y"], group=group, **attrs)
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(w, "w")])
    y = _run(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), {"x": x})
    rows = _conv_rows(x, node, list(kernel), group)  # all positions
    want_rows = _im2col(x, node, list(kernel), group)
    assert rows.shape == want_rows.shape and np.array_equal(rows, want_rows)  # the same bits
    one = gptq._Patches(node, list(kernel), group, tuple(x.shape[2:])).rows(x[1:], np.random.default_rng(0))
    assert np.array_equal(one, want_rows[:, want_rows.shape[1] // 2:])  # one sample: its own rows
    assert rows.shape[1] == y.shape[0] * int(np.prod(y.shape[2:]))
    wg = w.reshape(group, cout // group, -1)
    got = np.matmul(rows, wg.transpose(0, 2, 1))  # (group, N*positions, cout/group)
    want = y.reshape(y.shape[0], group, cout // group, -1).transpose(1, 0, 3, 2).reshape(got.shape)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_conv_patches_are_capped_with_a_fixed_seed(monkeypatch):
    monkeypatch.setattr(gptq, "MAX_ROWS", 50)
    x = np.random.default_rng(0).normal(size=(2, 4, 10, 10)).astype(np.float32)
    node = helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])
    a = _conv_rows(x, node, [3, 3], 1)
    b = _conv_rows(x, node, [3, 3], 1)
    assert a.shape == (1, 50, 36) and np.array_equal(a, b)
    every = _im2col(x, node, [3, 3], 1)  # the drawn positions' patches, exactly
    assert np.array_equal(a, every[:, gptq._pick(every.shape[1], np.random.default_rng(0))])


@pytest.mark.parametrize("g,k", [(1, 1), (3, 9), (1, 64), (1, 65), (2, 200), (1, 1536)])
def test_upper_cholesky_of_the_inverse_without_the_inverse(g, k):
    """GPTQ's factor u (u^T u = inv(H), upper) from a Cholesky of the reversed H and a blocked
    triangular inverse equals cholesky(inv(H)) (the textbook route, 3x the work at k = 1536)."""
    rng = np.random.default_rng(k)
    x = rng.standard_normal((g, 2 * k + 3, k)) * np.exp2(rng.uniform(-4, 4, k))
    h = np.matmul(x.transpose(0, 2, 1), x)
    h[:, np.arange(k), np.arange(k)] += 0.01 * np.einsum("gii->gi", h).mean(axis=1, keepdims=True)
    u = gptq._upper_cholesky_of_inverse(h)
    want = np.linalg.cholesky(np.linalg.inv(h)).transpose(0, 2, 1)
    assert np.array_equal(u, np.triu(u)) and u.flags.c_contiguous
    np.testing.assert_allclose(u, want, rtol=1e-9, atol=1e-9 * np.abs(want).max())


def test_grams_are_the_inputs_second_moments_shared_and_batch_size_free():
    """H of each layer is sum x^T x over the tokens it reads (float32 blocks of samples summed in
    float64, within float32 rounding of the exact sum); the query, key and value projections,
    which read one input, share one H; and no bit of it depends on the batch size."""
    from mixq.pipeline import Pipeline

    rng = np.random.default_rng(3)
    d, t, n = 16, 12, 22  # n: not a multiple of SAMPLE_BLOCK, nor of the batch sizes
    ws = {f"w{i}": rng.normal(0, 0.3, (d, d)).astype(np.float32) for i in "qkv"}
    nodes = [helper.make_node("MatMul", ["x", f"w{i}"], [i]) for i in "qkv"]
    nodes += [helper.make_node("Add", ["q", "k"], ["qk"]), helper.make_node("Add", ["qk", "v"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", t, d])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", t, d])],
                          [numpy_helper.from_array(w, k) for k, w in ws.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    x = (rng.normal(size=(n, t, d)) * np.linspace(0.1, 30, d)).astype(np.float32)
    pipe = Pipeline.load(m)
    plan = pipe.plan(mixq.get_default_config("A8W8"))
    grams = []
    for batch in (1, 3, 8):
        tap = gptq.GramTap(pipe.model, plan)
        tap.run(pipe.model, [{"x": x[i:i + batch]} for i in range(0, n, batch)])
        by = {tg.weight: tg.gram for tg in tap.targets}
        assert by["wq"] is by["wk"] is by["wv"]
        grams.append(by["wq"])
    exact = np.einsum("ntd,nte->de", x.astype(np.float64), x.astype(np.float64))
    np.testing.assert_allclose(grams[0][0], exact, rtol=1e-5, atol=1e-5 * np.abs(exact).max())
    assert all(np.array_equal(grams[0], gr) for gr in grams[1:])


@settings(max_examples=12, deadline=None)
@given(n=st.integers(1, 150), batch=st.sampled_from([1, 3, 8, 13]), shards=st.integers(1, 5),
       huge=st.booleans(), seed=st.integers(0, 2**16), capped=st.booleans())
def test_grams_of_shards_are_the_bytes_of_one_pass(n, batch, shards, huge, seed, capped):
    """Calibration cut into shards (any count, edges anywhere in a block of samples, blocks of
    SAMPLE_BLOCK samples for the Convs and ROW_BLOCK rows for the Gemm and MatMul) gives every
    layer's H the bits of one pass over the samples, rescaled blocks (values > 2^40) included;
    the grams are summed on the workers, with no float pass of the driver's own. `capped`: a
    budget that takes the Convs' H from their first 16 samples (GRAM_BUDGET), the same ones
    whatever the shards."""
    from mixq.calibration.sharded import calibrate_sharded
    from mixq.distributed import SerialExecutor
    from mixq.pipeline import Pipeline

    if capped:
        budget = gptq.GRAM_BUDGET
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(gptq, "GRAM_BUDGET", 16 * 64 * 27 * 27)  # the first Conv: 64 rows x k = 27
            mp.setattr(gptq, "MIN_SAMPLES", 8)
            test_grams_of_shards_are_the_bytes_of_one_pass.hypothesis.inner_test(
                n, batch, shards, huge, seed, False)
        assert gptq.GRAM_BUDGET == budget
        return
    m, _ = _model()
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 3, 8, 8)).astype(np.float32)
    if huge:
        x[rng.integers(n)] *= np.float32(2.0 ** 45)
    feeds = [{"x": x[i:i + batch]} for i in range(0, n, batch)]
    pipe = Pipeline.load(m)
    plan = pipe.plan(mixq.get_default_config("A8W8"))
    one = gptq.GramTap(pipe.model, plan)
    one.run(pipe.model, feeds)
    part = gptq.GramTap(pipe.model, plan)

    def no_pass(*args, **kwargs):
        raise AssertionError("the driver ran a float pass of its own for the grams")

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(gptq.GramTap, "run", no_pass)
        calibrate_sharded(pipe.model, ["c1", "h"], feeds, SerialExecutor(shards), tap=part)
    assert part.complete and part.samples == one.samples == n
    for a, b in zip(one.targets, part.targets):
        assert a.finite == b.finite
        assert a.gram is not None and a.gram.tobytes() == b.gram.tobytes(), a.weight


def test_a_wide_layers_gram_comes_from_its_first_samples(monkeypatch):
    """rows x k^2 over GRAM_BUDGET: the layer's H is its first samples' (whole blocks), the
    other layers' all of them; the summary names the layer."""
    from mixq.pipeline import Pipeline

    m, feeds = _model()
    x = np.concatenate([f["x"] for f in feeds])
    pipe = Pipeline.load(m)
    plan = pipe.plan(mixq.get_default_config("A8W8"))
    monkeypatch.setattr(gptq, "GRAM_BUDGET", 8 * 64 * 27 * 27)  # w1: 64 rows of k = 27 a sample
    monkeypatch.setattr(gptq, "MIN_SAMPLES", 8)
    tap = gptq.GramTap(pipe.model, plan)
    tap.run(pipe.model, [{"x": x[i:i + 3]} for i in range(0, len(x), 3)])
    by = {t.weight: t for t in tap.targets}
    assert by["w1"].cap == 8 and by["g"].cap is None
    first = gptq.GramTap(pipe.model, plan)
    first.run(pipe.model, [{"x": x[:8]}])
    assert by["w1"].gram.tobytes() == {t.weight: t for t in first.targets}["w1"].gram.tobytes()
    assert by["w2"].gram.tobytes() != {t.weight: t for t in first.targets}["w2"].gram.tobytes()
    res = mixq.quantize(m, "A8W8", feeds)
    assert "wide layer(s) measured on their first 8 samples" in res.summary() and "w1" in res.summary()


def _weight_codes(model: onnx.ModelProto, node_op: str) -> np.ndarray:
    """The stored codes of the weight that the (one) `node_op` node of `model` reads."""
    inits = {t.name: t for t in model.graph.initializer}
    node = next(n for n in model.graph.node if n.op_type == node_op)
    dq = next(n for n in model.graph.node if node.input[1] in n.output)
    return numpy_helper.to_array(inits[dq.input[0]])


def test_a_layer_too_wide_for_gptqs_memory_keeps_nearest_rounding(monkeypatch):
    """A layer whose H would pass MAX_GRAM_BYTES (VGG's first classifier layer: 25088 inputs,
    a 4.7 GiB H, ran a 20 GiB process out of memory in the rounding) keeps nearest rounding,
    collects no H and says why; the other layers are still rounded by GPTQ."""
    wide = helper.make_node("Gemm", ["f", "g", "gb"], ["h"])
    assert gptq.gram_bytes("gemm", wide, [25088, 4096]) > gptq.MAX_GRAM_BYTES
    assert gptq.gram_bytes("gemm", wide, [8192, 360]) <= gptq.MAX_GRAM_BYTES  # torchcrepe's k
    m, feeds = _model()
    monkeypatch.setattr(gptq, "MAX_GRAM_BYTES", 512 * 512 * 8 - 1)  # g: k = 512; the others <= 32
    cfg = mixq.get_default_config("A16W8")
    res = mixq.quantize(m, cfg.with_options(weight_rounding="gptq"), feeds, check_kernels=False)
    rep = res.weight_rounding
    assert sorted(rep.rounded) == ["m", "w1", "w2"], rep.rounded
    assert "too wide" in rep.skipped["g"] and "GiB" in rep.skipped["g"]
    assert "GPTQ skipped: g: its layer is too wide" in res.summary()
    plain = mixq.quantize(m, cfg.with_options(weight_rounding="nearest"), feeds, check_kernels=False)
    assert np.array_equal(_weight_codes(res.model, "Gemm"), _weight_codes(plain.model, "Gemm"))
    assert not np.array_equal(_weight_codes(res.model, "MatMul"), _weight_codes(plain.model, "MatMul"))
    from mixq.pipeline import Pipeline

    pipe = Pipeline.load(m)
    tap = gptq.GramTap(pipe.model, pipe.plan(cfg))
    assert "g" not in {t.weight for t in tap.targets}  # no H is collected for it


def _model() -> tuple[onnx.ModelProto, list[dict[str, np.ndarray]]]:
    """Conv -> depthwise Conv -> Gemm -> MatMul on strongly correlated inputs (a smooth image):
    rounding errors of neighbouring weights add up in the output, which GPTQ can cancel."""
    rng = np.random.default_rng(1)
    C = 8
    w1 = rng.normal(0, 0.3, (C, 3, 3, 3)).astype(np.float32)
    w2 = rng.normal(0, 0.3, (C, 1, 3, 3)).astype(np.float32)
    g = rng.normal(0, 0.1, (C * 8 * 8, 32)).astype(np.float32)
    m = rng.normal(0, 0.3, (32, 10)).astype(np.float32)
    inits = [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2"),
             numpy_helper.from_array(g, "g"), numpy_helper.from_array(np.zeros(32, np.float32), "gb"),
             numpy_helper.from_array(m, "m"), numpy_helper.from_array(np.array([0, -1], np.int64), "shape")]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["c1", "w2"], ["c2"], group=C, pads=[1, 1, 1, 1]),
             helper.make_node("Reshape", ["c2", "shape"], ["f"]),
             helper.make_node("Gemm", ["f", "g", "gb"], ["h"]),
             helper.make_node("MatMul", ["h", "m"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 10])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    base = rng.normal(size=(16, 3, 1, 1)) + np.linspace(-1, 1, 8)[None, None, :, None]
    feeds = [{"x": (base[4 * i:4 * i + 4] + rng.normal(0, 0.05, (4, 3, 8, 8))).astype(np.float32)}
             for i in range(4)]
    return model, feeds


def _weights(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


@pytest.mark.parametrize("preset,weight,gain", [("A16W8", None, 8.0), ("A16W8", "int4", 4.0),
                                                 ("A8W8", None, 1.0)])
def test_gptq_brings_the_outputs_closer_to_float_on_the_same_grid(preset, weight, gain):
    m, feeds = _model()
    cfg = mixq.get_default_config(preset)
    cfg = cfg if weight is None else cfg.with_options(weight=weight)
    plain = mixq.quantize(m, cfg.with_options(weight_rounding="nearest"), feeds, check_kernels=False)
    rounded = mixq.quantize(m, cfg.with_options(weight_rounding="gptq"), feeds, check_kernels=False)
    assert plain.weight_rounding is None
    rep = rounded.weight_rounding
    assert sorted(rep.rounded) == ["g", "m", "w1", "w2"] and rep.samples == 16
    assert all(r < 1.0 for r in rep.rounded.values()), rep.rounded  # H-weighted error below nearest's
    assert any("GPTQ: 4 weights rounded" in ln for ln in rounded.summary().splitlines())
    a, b = _weights(plain.model), _weights(rounded.model)
    scales = [k for k in a if "scale" in k]
    assert scales and all(np.array_equal(a[k], b[k]) for k in scales)  # the same grid
    codes = [k for k in a if a[k].dtype.kind not in "fb" and a[k].size > 1 and "zero" not in k]
    assert sorted(a) == sorted(b) and any(not np.array_equal(a[k], b[k]) for k in codes)  # other codes
    # in the QDQ semantics (optimizations disabled): what the rounding is responsible for; on
    # x86 CPUs without VNNI onnxruntime's fused 8-bit kernels saturate whatever the codes
    before = compare(m, plain.model, feeds, optimize=False).first().sqnr_db
    after = compare(m, rounded.model, feeds, optimize=False).first().sqnr_db
    # measured: A16W8 39.8 -> 51.6 dB; A8W8 32.8 -> 34.6 (its 8-bit activations dominate)
    assert after > before + gain, (before, after)
    again = mixq.quantize(m, cfg.with_options(weight_rounding="gptq"), feeds, check_kernels=False)
    assert again.model.SerializeToString() == rounded.model.SerializeToString()


def test_gptq_options_change_the_codes_and_are_checked():
    m, feeds = _model()
    cfg = mixq.get_default_config("A16W8").with_options(weight="int4", weight_rounding="gptq")
    out = {(d, o): mixq.quantize(m, cfg.with_options(gptq_damp=d, gptq_act_order=o), feeds,
                                 check_kernels=False).model.SerializeToString()
           for d, o in ((0.01, True), (1.0, True), (0.01, False))}
    assert len(set(out.values())) == 3
    with pytest.raises(ConfigError, match="gptq_damp"):
        cfg.with_options(gptq_damp=0.0)
    with pytest.raises(ConfigError, match="weight_rounding"):
        cfg.with_options(weight_rounding="gtpq")


def test_gptq_with_bias_correction_measures_against_the_float_weights():
    m, feeds = _model()
    cfg = mixq.get_default_config("A16W8").with_options(weight_rounding="gptq", bias_correction=True)
    res = mixq.quantize(m, cfg, feeds, check_kernels=False)
    only = mixq.quantize(m, cfg.with_options(bias_correction=False), feeds, check_kernels=False)
    assert only.weight_rounding.rounded
    assert list(res.bias_correction.corrected) == ["gb"]
    # the GPTQ weights sit on their grid already: measured against themselves the correction
    # would be zero; against the float weights it moves the bias
    bias = [k for k in _weights(res.model) if k.startswith("gb")]
    assert bias and any(not np.array_equal(_weights(res.model)[k], _weights(only.model)[k]) for k in bias)


def test_gptq_is_refused_where_it_would_change_nothing(tmp_path):
    from mixq.finetune import AdaRoundConfig
    from mixq.search import AutoConfig, auto_quantize
    from mixq.search.auto import Candidate

    m, feeds = _model()
    cfg = mixq.get_default_config("A8W8").with_options(weight_rounding="gptq")
    with pytest.raises(ConfigError, match="finetuning"):
        mixq.quantize(m, cfg, feeds, finetune=AdaRoundConfig(num_iterations=2))
    with pytest.raises(ConfigError, match="no candidate puts"):
        auto_quantize(m, AutoConfig(base=mixq.get_default_config("BF16").with_options(weight_rounding="gptq"),
                                    candidates=(Candidate("bf16", "mxint8"),), l2_target=0.1), feeds)
    # block formats have no integer codes to choose: an error where no weight is integer, a
    # reason per weight where some are
    with pytest.raises(ConfigError, match="integer weight codes"):
        mixq.quantize(m, mixq.get_default_config("MXINT8").with_options(weight_rounding="gptq"), feeds)
    mixed = cfg.with_options(tensor_formats={"w1": "mxint8"})
    res = mixq.quantize(m, mixed, feeds, check_kernels=False)
    assert "w1" not in res.weight_rounding.rounded and "not an integer grid" in res.weight_rounding.skipped["w1"]
    assert any("GPTQ skipped: w1: mxint8 is not an integer grid" in ln for ln in res.summary().splitlines())


def test_cli_weight_rounding_flag(tmp_path):
    from mixq.cli.main import main

    m, feeds = _model()
    onnx.save(m, tmp_path / "m.onnx")
    np.savez(tmp_path / "calib.npz", x=np.concatenate([f["x"] for f in feeds]))
    out = tmp_path / "q.onnx"
    assert main(["quantize", str(tmp_path / "m.onnx"), str(out), "--calib", str(tmp_path / "calib.npz"),
                 "--preset", "A16W8", "--weight-rounding", "gptq", "--gptq-damp", "0.05"]) == 0
    api = mixq.quantize(m, mixq.get_default_config("A16W8").with_options(
        weight_rounding="gptq", gptq_damp=0.05), feeds, check_kernels=False)
    assert onnx.load(out).graph == api.model.graph
    assert main(["quantize", str(tmp_path / "m.onnx"), str(tmp_path / "r.onnx"), "--calib", str(tmp_path / "calib.npz"),
                 "--preset", "A16W8", "--weight-rounding", "nearest", "--gptq-damp", "0.05"]) != 0
    # mixq auto: every plan rounded with GPTQ by default, nearest when asked
    args = ["auto", str(tmp_path / "m.onnx"), "--calib", str(tmp_path / "calib.npz"), "--l2-target",
            "0.05", "--candidates", "int16/int8,int8/int4", "--op-types", "Conv,Gemm,MatMul", "--no-cache"]
    got = {}
    for wr in ("auto", "nearest"):
        dst = tmp_path / f"auto_{wr}.onnx"
        assert main(args[:2] + [str(dst)] + args[2:] + ["--weight-rounding", wr]) == 0
        got[wr] = onnx.load(dst).SerializeToString()
    assert got["auto"] != got["nearest"]


def test_presets_round_with_gptq_where_it_can_run_and_say_why_not_elsewhere():
    """weight_rounding='auto' (every preset's default): GPTQ wherever its statistics can be
    measured; elsewhere nearest rounding, and the summary says why."""
    from mixq.finetune import AdaRoundConfig

    m, feeds = _model()
    cfg = mixq.get_default_config("A16W8")
    assert cfg.weight_rounding == "auto"
    res = mixq.quantize(m, cfg, feeds, check_kernels=False)
    gptq_bytes = mixq.quantize(m, cfg.with_options(weight_rounding="gptq"), feeds, check_kernels=False)
    assert res.model.SerializeToString() == gptq_bytes.model.SerializeToString()
    # the statistics come from the calibration pass itself: a one-shot reader is enough
    once = mixq.quantize(m, cfg, iter(feeds), check_kernels=False)
    assert once.model.SerializeToString() == gptq_bytes.model.SerializeToString()
    # calibration on workers: a float pass of its own over the feeds read for the shards, also
    # those of a one-shot reader
    from mixq.distributed import SerialExecutor

    with SerialExecutor(2) as ex:
        sharded = mixq.quantize(m, cfg, feeds, check_kernels=False, executor=ex)
        one_shot = mixq.quantize(m, cfg, iter(feeds), check_kernels=False, executor=ex)
    assert sharded.model.SerializeToString() == gptq_bytes.model.SerializeToString()
    assert one_shot.model.SerializeToString() == gptq_bytes.model.SerializeToString()
    ft = mixq.quantize(m, cfg, feeds, check_kernels=False, finetune=AdaRoundConfig(num_iterations=2))
    assert "finetuning" in ft.weight_rounding.nearest_because
    # no integer weight: nothing to say
    assert mixq.quantize(m, "MXINT8", feeds, check_kernels=False).weight_rounding is None


def test_auto_keeps_the_rounding_the_whole_model_scores_better_with(monkeypatch):
    """weight_rounding='auto' scores GPTQ's model and nearest rounding's on the guard's samples
    and keeps nearest only where it wins by ROUNDING_MARGIN_DB (measured: a detector's per-tensor
    power-of-two weights, XINT8); either way the bytes are those of the explicit setting, and
    'gptq' asked for is not second-guessed."""
    from mixq import api

    m, feeds = _model()
    cfg = mixq.get_default_config("A16W8")
    by = {wr: mixq.quantize(m, cfg.with_options(weight_rounding=wr), feeds, check_kernels=False)
          for wr in ("gptq", "nearest")}
    res = mixq.quantize(m, cfg, feeds, check_kernels=False)
    assert res.model.SerializeToString() == by["gptq"].model.SerializeToString()
    g, n, k = res.weight_rounding.compared
    g_db, n_db = g.sqnr_db, n.sqnr_db
    assert g.agreement is None and n.agreement is None  # no decision output
    assert k == 16 and g_db > n_db + 5.0, (g_db, n_db)  # both scored on the guard's samples
    assert g_db == pytest.approx(by["gptq"].fidelity.outputs[0].sqnr_db, abs=1e-6)
    assert n_db == pytest.approx(by["nearest"].fidelity.outputs[0].sqnr_db, abs=1e-6)
    assert "GPTQ kept: mean output SQNR" in res.summary()
    assert by["gptq"].weight_rounding.compared is None  # asked for: not compared
    # where nearest scores better by the margin (here: a margin that makes it so), nearest is kept
    monkeypatch.setattr(api, "ROUNDING_MARGIN_DB", n_db - g_db - 0.01)
    res = mixq.quantize(m, cfg, feeds, check_kernels=False)
    assert res.model.SerializeToString() == by["nearest"].model.SerializeToString()
    assert not res.weight_rounding.rounded and res.weight_rounding.compared is None
    assert "weights rounded to nearest, not GPTQ: measured worse on the guard's 16 samples" in res.summary()
    assert res.fidelity.outputs[0].sqnr_db == pytest.approx(n_db, abs=1e-6)
    forced = mixq.quantize(m, cfg.with_options(weight_rounding="gptq"), feeds, check_kernels=False)
    assert forced.model.SerializeToString() == by["gptq"].model.SerializeToString()


def test_auto_judges_decision_outputs_by_their_equal_elements(monkeypatch):
    """A model whose output is an ArgMax's class index: weight_rounding='auto' compares GPTQ and
    nearest rounding by the share of indices equal to float's (the SQNR of class numbers read
    "13.28 dB vs 200": how far apart two class numbers are), and decisions settle it before the
    SQNR of any value output does."""
    from mixq import api
    from mixq.fidelity import ModelScore

    m, feeds = _model()
    m.graph.node.append(helper.make_node("ArgMax", ["y"], ["label"], axis=1, keepdims=0))
    del m.graph.output[:]
    m.graph.output.append(helper.make_tensor_value_info("label", TensorProto.INT64, ["N"]))
    res = mixq.quantize(m, "A16W8", feeds, check_kernels=False)
    g, n, k = res.weight_rounding.compared
    assert g.sqnr_db is None and n.sqnr_db is None and k == 16
    assert g.agreement == pytest.approx(res.fidelity.outputs[0].top1_agreement)
    assert "decisions equal to float's" in res.summary() and "SQNR" not in res.weight_rounding.lines()[-1]
    # decisions first: 2 points more agreement beat any SQNR; within the margin, SQNR decides
    assert api._nearest_wins(ModelScore(40.0, 0.90), ModelScore(10.0, 0.92))
    assert not api._nearest_wins(ModelScore(10.0, 0.92), ModelScore(40.0, 0.90))
    assert api._nearest_wins(ModelScore(10.0, 0.92), ModelScore(40.0, 0.925))
    assert not api._nearest_wins(ModelScore(None, 0.90), ModelScore(None, 0.905))
    # A8W8: nearest rounding flips 1 of the 16 labels, GPTQ none: GPTQ kept, both in the summary
    res = mixq.quantize(m, "A8W8", feeds, check_kernels=False)
    g, n, _ = res.weight_rounding.compared
    assert (g.agreement, n.agreement) == (1.0, 15 / 16)
    assert ("GPTQ kept: decisions equal to float's: 100.0% on the guard's 16 samples; nearest rounding: "
            "decisions equal to float's: 93.8%") in res.summary()


def test_auto_says_when_no_output_can_tell_the_roundings_apart():
    """A model whose only output is a sequence: no numeric output scores either rounding, and
    the summary read "GPTQ kept: no numeric output on the guard's 8 samples; nearest rounding:
    no numeric output"."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.normal(0, 0.3, (8, 8)).astype(np.float32), "w")
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"]),
                           helper.make_node("SequenceConstruct", ["y"], ["s"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])],
                          [helper.make_tensor_sequence_value_info("s", TensorProto.FLOAT, ["N", 8])], [w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    res = mixq.quantize(m, "A8W8", [{"x": rng.normal(size=(2, 8)).astype(np.float32)} for _ in range(4)])
    assert res.weight_rounding.rounded and res.weight_rounding.compared is None
    assert "GPTQ kept, not compared with nearest rounding: the model has no numeric output" in res.summary()


def test_auto_search_measures_and_writes_gptq_rounded_plans():
    """`auto_quantize` rounds the integer weights of every plan it builds with GPTQ (each weight
    on each grid once, from the layer inputs measured in its calibration pass), measures those
    models, and the chosen plan replays through `quantize` to the bytes it measured; on an
    executor the driver ships the same weights with each candidate."""
    from dataclasses import replace

    from mixq.distributed import SerialExecutor
    from mixq.search import AutoConfig, auto_quantize
    from mixq.search.auto import Candidate

    m, feeds = _model()
    calib, held = feeds[:3], feeds[3:]
    base = mixq.get_default_config("A16W8")
    auto = AutoConfig(base=base, candidates=(Candidate("int8", "int8"), Candidate("int8", "int4")),
                      l2_target=0.03, op_types={"Conv", "Gemm", "MatMul"})
    res = auto_quantize(m, auto, calib, held)
    assert res.config.weight_rounding == "gptq"
    replay = mixq.quantize(m, res.config, calib, plan=res.plan, check_kernels=False)
    assert replay.model.SerializeToString() == res.model.SerializeToString()
    assert replay.weight_rounding.rounded  # the replay's own GPTQ, the same codes
    near = auto_quantize(m, replace(auto, base=base.with_options(weight_rounding="nearest")), calib, held)
    assert near.config.weight_rounding == "nearest"
    # the same all-wide plan (A16W8) measured with each rounding: GPTQ is closer to float
    assert res.wide_metric < 0.7 * near.wide_metric, (res.wide_metric, near.wide_metric)
    with SerialExecutor(2) as ex:
        par = auto_quantize(m, auto, calib, held, executor=ex)
    # the speculation evaluates more points; the points both evaluated measure the same
    assert par.model.SerializeToString() == res.model.SerializeToString()
    assert (par.chosen_k, par.metric, par.wide_metric, par.narrow_metric) == \
        (res.chosen_k, res.metric, res.wide_metric, res.narrow_metric)
    assert 0 < res.chosen_k < len(res.path_labels)  # a real search, not an end of the path
