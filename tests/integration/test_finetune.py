"""Fast finetuning end to end on a small synthetic CNN (Conv, grouped Conv, Gemm, MatMul)."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

torch = pytest.importorskip("torch")

import mixq  # noqa: E402
from mixq.errors import ConfigError, DataError  # noqa: E402
from mixq.finetune import AdaQuantConfig, AdaRoundConfig, EarlyStop, quantize_with_finetune  # noqa: E402

INT8_PT = mixq.QuantConfig(activation="int8", weight="int8", per_channel=False, activation_symmetric=True,
                           weight_rounding="nearest")  # the baseline finetuning starts from


def _model() -> onnx.ModelProto:
    r = np.random.default_rng(7)
    w = {
        "w1": r.standard_normal((8, 3, 3, 3)) * 0.3, "b1": r.standard_normal(8) * 0.1,
        "w2": r.standard_normal((8, 4, 3, 3)) * 0.2, "b2": r.standard_normal(8) * 0.1,
        "w3": r.standard_normal((6, 8)) * 0.5, "b3": r.standard_normal(6) * 0.1,
        "w4": r.standard_normal((6, 4)) * 0.5,
    }
    w["w1"][0, 0, 0, 0] = 3.0  # an outlier: per-tensor int8 loses on the other channels
    inits = [numpy_helper.from_array(v.astype(np.float32), k) for k, v in w.items()]
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], name="conv2", group=2, strides=[2, 2],
                         pads=[0, 0, 1, 1]),
        helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
        helper.make_node("GlobalAveragePool", ["r2"], ["p"], name="gap"),
        helper.make_node("Flatten", ["p"], ["f"], name="flat"),
        helper.make_node("Gemm", ["f", "w3", "b3"], ["g"], name="fc1", transB=1, alpha=1.5),
        helper.make_node("Relu", ["g"], ["r3"], name="relu3"),
        helper.make_node("MatMul", ["r3", "w4"], ["y"], name="fc2"),
    ]
    g = helper.make_graph(nodes, "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 12, 12])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


@pytest.fixture(scope="module")
def model() -> onnx.ModelProto:
    return _model()


def _data(n: int, seed: int) -> list[dict[str, np.ndarray]]:
    x = np.random.default_rng(seed).standard_normal((n, 3, 12, 12)).astype(np.float32)
    return [{"x": x[i:i + 16]} for i in range(0, n, 16)]


CALIB = _data(64, 0)
EVAL = _data(64, 1)


def _bytes(res) -> bytes:
    return res.model.SerializeToString(deterministic=True)


def _sqnr(model, qmodel) -> float:
    from mixq.evaluate import compare

    return compare(model, qmodel, EVAL, optimize=False).first().sqnr_db


def test_zero_iterations_is_the_plain_model(model):
    plain = mixq.quantize(model, INT8_PT, CALIB, check_kernels=False)
    for cfg in (AdaRoundConfig(num_iterations=0), AdaQuantConfig(num_iterations=0)):
        res = quantize_with_finetune(model, INT8_PT, CALIB, cfg, check_kernels=False)
        assert _bytes(res) == _bytes(plain)
        assert res.finetune.layers == []


def test_adaround_deterministic_on_grid_and_improves(model):
    # report_metric off: on this model's N(0, 1) inputs the output loses with the finetuned weights
    # (21.14 -> 20.39 dB), and the model would keep its plain ones (test_finetune_held_out.py)
    cfg = AdaRoundConfig(num_iterations=60, batch_size=16, max_samples=32, seed=3, report_metric=False)
    a = quantize_with_finetune(model, INT8_PT, CALIB, cfg, check_kernels=False)
    b = quantize_with_finetune(model, INT8_PT, CALIB, cfg, check_kernels=False)
    assert _bytes(a) == _bytes(b)  # same seed: same bytes
    rep = a.finetune
    assert [r.node for r in rep.layers] == ["conv1", "conv2", "fc1", "fc2"]  # topological order
    assert all(r.loss_after <= r.loss_before for r in rep.layers)
    assert any(r.loss_after < r.loss_before for r in rep.layers)
    # the adjusted weights are on the int8 grid: the rewrite stores exactly the learned codes
    from mixq.finetune import finetune, with_weights
    from mixq.passes.prepare import prepare
    from mixq.plan.qparams import activation_qparams, constant_qparams
    from mixq.plan.rules import build_plan
    from mixq.calibration.collect import collect_stats
    from mixq.formats import get_format

    prepared, _ = prepare(model)
    plan = build_plan(prepared, INT8_PT)
    stats = collect_stats(prepared, plan.calibrated_tensors(lambda f: get_format(f).needs_qparams), CALIB).stats
    qp = activation_qparams(plan, stats, INT8_PT)
    qp.update(constant_qparams(prepared, plan, INT8_PT))
    weights, _ = finetune(prepared, plan, qp, CALIB, cfg)
    assert set(weights) <= {"w1", "w2", "w3", "w4"} and weights
    stored = {t.name: numpy_helper.to_array(t) for t in a.model.graph.initializer}
    int8 = get_format("int8")
    for name, w in weights.items():
        codes = int8.quantize(w, qp[name])
        assert np.array_equal(int8.dequantize(codes, qp[name]), w)  # exactly on the grid
        q = [v for k, v in stored.items() if k.startswith(name) and v.dtype == np.int8 and v.shape == w.shape]
        assert len(q) == 1 and np.array_equal(q[0].astype(np.float32), codes)


def test_adaquant_mxfp4_improves(model):
    cfg = mixq.QuantConfig(activation="mxfp8_e4m3", weight="mxfp4")
    plain = mixq.quantize(model, cfg, CALIB, check_kernels=False)
    res = quantize_with_finetune(model, cfg, CALIB, AdaQuantConfig(num_iterations=100, learning_rate=3e-3,
                                                                    batch_size=16, max_samples=32), check_kernels=False)
    rep = res.finetune
    assert {r.weight_format for r in rep.layers} == {"mxfp4"}
    assert any(r.loss_after < 0.9 * r.loss_before for r in rep.layers)
    assert _sqnr(model, res.model) > _sqnr(model, plain.model)


def test_bf16_seed_snippet_through_quantize(model):
    from mixq.compat import BFloat16Spec, QConfig, QLayerConfig

    input_tensors_spec = BFloat16Spec()
    weight_spec = BFloat16Spec()
    algo_conf = [AdaQuantConfig(num_iterations=1000, learning_rate=1e-6)]
    config = QConfig(global_config=QLayerConfig(input_tensors=input_tensors_spec, weight=weight_spec),
                     algo_config=algo_conf)
    res = mixq.quantize(model, config, CALIB)
    rep = res.finetune
    assert rep is not None and rep.algorithm == "adaquant" and len(rep.layers) == 4
    assert {r.weight_format for r in rep.layers} == {"bf16"}
    assert all(r.loss_after <= r.loss_before for r in rep.layers)
    assert "| conv1" in rep.to_markdown()
    assert res.config.activation == "bf16"


def test_include_exclude_and_early_stop(model):
    res = quantize_with_finetune(model, INT8_PT, CALIB, AdaQuantConfig(
        num_iterations=400, learning_rate=1e-3, include_layers=["conv1", "fc1"], exclude_layers=["fc1"],
        early_stop=EarlyStop(patience=1, interval=10, min_delta=0.5), report_metric=False), check_kernels=False)
    rep = res.finetune
    assert [r.node for r in rep.layers] == ["conv1"]
    assert rep.skipped == {"fc1": "excluded by exclude_layers"}
    assert rep.layers[0].stopped_early and rep.layers[0].iterations < 400
    with pytest.raises(ConfigError, match="no .* node named 'conv9'.*Did you mean: .*conv1"):
        quantize_with_finetune(model, INT8_PT, CALIB, AdaQuantConfig(include_layers=["conv9"]))


def test_rejected_combinations(model):
    with pytest.raises(ConfigError, match="AdaRound needs integer weight formats.*AdaQuantConfig"):
        quantize_with_finetune(model, "BF16", CALIB, AdaRoundConfig(num_iterations=5))
    with pytest.raises(ConfigError, match="output_index=3"):
        quantize_with_finetune(model, INT8_PT, CALIB, AdaQuantConfig(num_iterations=5, output_index=3))
    with pytest.raises(ConfigError, match="finetune_config"):
        quantize_with_finetune(model, INT8_PT, CALIB, None)
    with pytest.raises(DataError, match="one-shot"):
        quantize_with_finetune(model, INT8_PT, iter(CALIB), AdaQuantConfig(num_iterations=5), check_kernels=False)


def test_memory_cap_and_progress(model, capsys):
    res = quantize_with_finetune(model, INT8_PT, CALIB, AdaQuantConfig(
        num_iterations=5, max_samples=10, verbose=True, report_metric=False), check_kernels=False)
    assert all(r.samples == 10 for r in res.finetune.layers)
    err = capsys.readouterr().err
    assert "[mixq finetune] 1/4 conv1" in err
    res = quantize_with_finetune(model, INT8_PT, CALIB, AdaQuantConfig(
        num_iterations=5, max_cache_mb=0.01, report_metric=False), check_kernels=False)
    assert res.finetune.layers[0].samples == int(0.01 * 2**20) // (4 * (3 * 144 + 8 * 144))
