"""Bias correction (mixq.passes.bias_correction): on layers whose quantized weights shift the
output mean, the corrected model is measurably closer to float in onnxruntime."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import mixq
from mixq.errors import ConfigError
from mixq.evaluate import compare


def _model() -> tuple[onnx.ModelProto, list[dict[str, np.ndarray]]]:
    """A depthwise 3x3 Conv (each channel's kernel has one large tap, so int8 rounds the small
    ones coarsely) and a Gemm, on inputs with a large per-channel mean: the weights' rounding
    error times that mean is a constant offset in every output."""
    rng = np.random.default_rng(0)
    C = 8
    w = rng.normal(0, 0.05, (C, 1, 3, 3)).astype(np.float32)
    w[:, 0, 1, 1] = 4.0
    g = rng.normal(0, 0.3, (C * 16 * 16, 10)).astype(np.float32)
    g[::37] *= 20.0
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.zeros(C, np.float32), "b"),
             numpy_helper.from_array(g, "g"), numpy_helper.from_array(np.full(10, 0.5, np.float32), "gb"),
             numpy_helper.from_array(np.array([0, -1], np.int64), "shape")]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], group=C, pads=[1, 1, 1, 1]),
             helper.make_node("Reshape", ["c", "shape"], ["f"]),
             helper.make_node("Gemm", ["f", "g", "gb"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", C, 16, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 10])], inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    mean = rng.uniform(2.0, 4.0, (1, C, 1, 1)).astype(np.float32)
    feeds = [{"x": (mean + rng.normal(0, 0.5, (4, C, 16, 16))).astype(np.float32)} for _ in range(8)]
    return m, feeds


@pytest.mark.parametrize("preset", ["A16W8", "A8W8"])
def test_bias_correction_removes_the_mean_error_of_quantized_weights(preset):
    m, feeds = _model()
    cfg = mixq.get_default_config(preset).with_options(weight_rounding="nearest")  # the correction alone
    test = [{"x": f["x"] + np.float32(0.1)} for f in feeds[:4]]  # unseen samples, same means
    plain = mixq.quantize(m, cfg, feeds, check_kernels=False)
    fixed = mixq.quantize(m, cfg.with_options(bias_correction=True), feeds, check_kernels=False)
    assert plain.bias_correction is None
    assert sorted(fixed.bias_correction.corrected) == ["b", "gb"] and fixed.bias_correction.samples == 32
    assert any("2 biases corrected" in ln for ln in fixed.summary().splitlines())
    before = compare(m, plain.model, test).first().sqnr_db
    after = compare(m, fixed.model, test).first().sqnr_db
    assert after > before + 4.0, (before, after)  # measured: A16W8 33.5 -> 42.6 dB, A8W8 32.7 -> 39.4
    # the input model's biases are untouched (the correction lands in the quantized copy)
    assert not numpy_helper.to_array(next(t for t in m.graph.initializer if t.name == "b")).any()


def test_bias_correction_is_refused_where_it_would_change_nothing():
    from mixq.finetune import AdaRoundConfig
    from mixq.search import AutoConfig
    from mixq.search.auto import Candidate

    m, feeds = _model()
    cfg = mixq.get_default_config("A8W8").with_options(bias_correction=True)
    with pytest.raises(ConfigError, match="finetuning"):
        mixq.quantize(m, cfg, feeds, finetune=AdaRoundConfig(num_iterations=2))
    with pytest.raises(ConfigError, match="second time"):
        mixq.quantize(m, cfg, iter(feeds))
    with pytest.raises(ConfigError, match="bias_correction"):
        AutoConfig(base=cfg, candidates=(Candidate("int8", "int4"),), l2_target=0.1)


def test_cli_bias_correction_flag(tmp_path):
    from mixq.cli.main import main

    m, feeds = _model()
    onnx.save(m, tmp_path / "m.onnx")
    np.savez(tmp_path / "calib.npz", x=np.concatenate([f["x"] for f in feeds]))
    out = tmp_path / "q.onnx"
    assert main(["quantize", str(tmp_path / "m.onnx"), str(out), "--calib", str(tmp_path / "calib.npz"),
                 "--preset", "A16W8", "--bias-correction"]) == 0
    api = mixq.quantize(m, mixq.get_default_config("A16W8").with_options(
        bias_correction=True, name="A16W8+custom"), str(tmp_path / "calib.npz"), check_kernels=False)
    assert out.read_bytes() == api.model.SerializeToString()
