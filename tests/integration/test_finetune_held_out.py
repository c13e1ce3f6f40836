"""Fast finetuning judges each layer on cached rows held out of its fit.

A layer fit on few rows learns those rows rather than the layer: on one whose inputs are
isotropic, nearest rounding is already the best rounding in expectation, so every change AdaRound
or AdaQuant makes is fit to the samples' noise. Judged on the rows it was fit on, the layer gained
+6.7 dB (and the report said 18.1 -> 24.8 dB at the output) while fresh inputs lost 0.9 dB. Judged
on held-out rows, it keeps its plain weights; where the inputs are correlated (real features),
the gain is real and is kept.
"""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

pytest.importorskip("torch")

import mixq  # noqa: E402
from mixq.finetune import AdaQuantConfig, AdaRoundConfig  # noqa: E402
from mixq.finetune.config import HELD_OUT_MIN_ROWS, held_out_rows  # noqa: E402
from mixq.finetune.core import clear_gain  # noqa: E402

K, M = 64, 8
#: a 64-input MatMul on int4 weights: the rounding matters, the output grid (int16) does not
CFG = mixq.QuantConfig(activation="int16", weight="int4", weight_rounding="nearest")
ALGOS = [AdaRoundConfig(), AdaQuantConfig()]


def _head() -> onnx.ModelProto:
    w = (np.random.default_rng(0).standard_normal((K, M)) / np.sqrt(K)).astype(np.float32)
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="head")], "head",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, K])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, M])],
                          [numpy_helper.from_array(w, "w")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def _rows(n: int, seed: int, mix: np.ndarray | None = None) -> list[dict[str, np.ndarray]]:
    z = np.random.default_rng(seed).standard_normal((n, 1, K))
    return [{"x": (r if mix is None else r @ mix).astype(np.float32)} for r in z]


def _fresh_sqnr(model: onnx.ModelProto, qmodel: onnx.ModelProto, feeds: list[dict[str, np.ndarray]]) -> float:
    a, b = (ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]) for m in (model, qmodel))
    ref = np.concatenate([a.run(None, f)[0] for f in feeds])
    got = np.concatenate([b.run(None, f)[0] for f in feeds])
    return float(10 * np.log10(np.sum(ref ** 2) / np.sum((ref - got) ** 2)))


@pytest.mark.parametrize("ft", ALGOS, ids=["adaround", "adaquant"])
def test_a_gain_fit_to_few_rows_is_not_kept(ft):
    m = _head()
    calib, fresh = _rows(12, 1), _rows(400, 2)
    plain = _fresh_sqnr(m, mixq.quantize(m, CFG, calib, check_kernels=False).model, fresh)
    res = mixq.quantize(m, CFG, calib, check_kernels=False, finetune=ft)
    layer, = res.finetune.layers
    assert layer.held_out == held_out_rows(12) == 3 and layer.samples == 12
    assert _fresh_sqnr(m, res.model, fresh) >= plain - 0.05  # before: 0.2-0.9 dB worse than plain
    assert layer.kept_plain and layer.loss_after == layer.loss_before
    assert "0 of 1 layer(s) finetuned, 1 kept their plain weights" in res.summary()


@pytest.mark.parametrize("ft", ALGOS, ids=["adaround", "adaquant"])
def test_a_gain_on_correlated_inputs_is_kept(ft):
    m = _head()
    r = np.random.default_rng(5)
    mix = r.standard_normal((K, K)) * np.exp(-np.arange(K) / 8.0)[:, None]  # a few strong directions
    calib, fresh = _rows(64, 1, mix), _rows(400, 2, mix)
    plain = _fresh_sqnr(m, mixq.quantize(m, CFG, calib, check_kernels=False).model, fresh)
    res = mixq.quantize(m, CFG, calib, check_kernels=False, finetune=ft)
    layer, = res.finetune.layers
    assert layer.held_out == 16 and not layer.kept_plain
    assert _fresh_sqnr(m, res.model, fresh) > plain + 3.0
    assert "1 of 1 layer(s) finetuned; 1 of 1 judged on held-out rows" in res.summary()


def test_a_layer_with_too_few_rows_says_it_was_judged_on_its_fit():
    m = _head()
    res = mixq.quantize(m, CFG, _rows(HELD_OUT_MIN_ROWS - 1, 1), check_kernels=False, finetune=AdaRoundConfig())
    assert res.finetune.layers[0].held_out == 0
    said = "had too few cached rows to hold any out (under 8) and were judged on the rows they were fit on"
    assert said in res.summary() and said in res.finetune.to_markdown()


def test_clear_gain_needs_more_than_the_rows_spread():
    assert clear_gain(np.array([2.0, 2.0, 2.0]), np.array([1.0, 1.0, 1.0]))
    assert not clear_gain(np.array([2.0, 2.0, 2.0]), np.array([2.0, 2.0, 2.0]))
    assert not clear_gain(np.array([2.0, 2.0, 2.0, 2.0]), np.array([0.0, 3.0, 1.9, 2.5]))  # mean gain 0.4, spread 1.3
    assert not clear_gain(np.array([1.0]), np.array([1.0])) and clear_gain(np.array([1.0]), np.array([0.5]))


def test_weights_that_lose_at_the_output_are_not_kept():
    """Each layer gains on its held-out rows, yet the output loses even on the calibration data
    (a random graph the sweep found: global pooling, Tanh, MatMul, Add, Conv on int4 weights)."""
    from .test_random_graphs import _build

    m = _build([("GlobalAveragePool", 1), ("Tanh", 6), ("MatMulT", 3), ("Add", 1), ("Conv", 3)], ["t"], 3, 2,
               792661)
    r = np.random.default_rng(1)
    calib = [{"x": r.standard_normal((1, 3, 2, 2)).astype(np.float32)} for _ in range(16)]
    cfg = mixq.QuantConfig(activation="int8", weight="int4", weight_rounding="nearest")
    plain = mixq.quantize(m, cfg, calib, check_kernels=False)
    res = mixq.quantize(m, cfg, calib, check_kernels=False, finetune=AdaQuantConfig())
    rep = res.finetune
    assert any(not layer.kept_plain for layer in rep.layers)
    assert rep.metric_after.sqnr_db < rep.metric_before.sqnr_db  # 23.18 -> 22.59 dB
    assert res.model.SerializeToString() == plain.model.SerializeToString()  # before: the finetuned weights
    assert "adaquant not kept: the finetuned weights scored worse at the output" in res.summary()
    assert "Not kept: the finetuned weights scored worse" in rep.to_markdown()


_OPS = ["Conv", "Conv", "Relu", "Add", "MatMulT", "Sigmoid", "Mul", "BN", "Tanh", "GlobalAveragePool"]


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True,
          phases=[Phase.explicit, Phase.reuse, Phase.generate])
@given(ops=st.lists(st.tuples(st.sampled_from(_OPS), st.integers(1, 6)), min_size=1, max_size=5),
       c=st.integers(1, 4), hw=st.integers(2, 5), seed=st.integers(0, 10**6), adaround=st.booleans(),
       weight=st.sampled_from(["int8", "int4"]))
# before: AdaRound 1.0-1.1 dB below plain on fresh samples (15.71 -> 14.60, 17.10 -> 16.08, 19.70 -> 18.60)
@example(ops=[("Conv", 6), ("Tanh", 5), ("Relu", 5), ("Conv", 2)], c=2, hw=3, seed=0, adaround=True, weight="int4")
@example(ops=[("Conv", 1)], c=1, hw=5, seed=5, adaround=True, weight="int4")
@example(ops=[("Add", 6), ("MatMulT", 4)], c=1, hw=5, seed=5, adaround=True, weight="int4")
def test_random_graphs_finetuned_are_never_worse_than_plain_on_fresh_inputs(ops, c, hw, seed, adaround, weight):
    """Random graphs with 16 calibration samples (too few for every layer's weights): fast
    finetuning never hands back a model much worse than plain quantization on fresh samples
    (before: 22 of 112 runs of `bench/finetune_sweep.py --graphs 40` more than 0.5 dB worse,
    while the report claimed gains), and what it keeps is what it reports."""
    from .test_random_graphs import _build

    m = _build(ops, ["t"], c, hw, seed)
    r = np.random.default_rng(seed)
    calib = [{"x": r.standard_normal((1, c, hw, hw)).astype(np.float32)} for _ in range(16)]
    fresh = [{"x": r.standard_normal((1, c, hw, hw)).astype(np.float32)} for _ in range(64)]
    cfg = mixq.QuantConfig(activation="int8", weight=weight, weight_rounding="nearest")
    plain = mixq.quantize(m, cfg, calib, check_kernels=False)
    res = mixq.quantize(m, cfg, calib, check_kernels=False, finetune=AdaRoundConfig() if adaround else AdaQuantConfig())
    rep = res.finetune
    for layer in rep.layers:
        assert layer.held_out == held_out_rows(layer.samples) and layer.loss_after <= layer.loss_before
    if rep.plain_because is not None or all(layer.kept_plain for layer in rep.layers):
        assert res.model.SerializeToString() == plain.model.SerializeToString()
    assert _fresh_sqnr(m, res.model, fresh) >= _fresh_sqnr(m, plain.model, fresh) - 0.5
