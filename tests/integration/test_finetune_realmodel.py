"""Acceptance: on the embedded Fashion-MNIST CNN (a real trained model), per-tensor INT8 loses
clearly, and AdaRound and AdaQuant each recover at least half of the loss on held-out data.

The metric is the SQNR of the logits against the float model on the 500 held-out test images
(the QDQ semantics, onnxruntime optimizations off: on CPUs without VNNI the fused int8 kernels
saturate, see the README). The float model has no noise, so what quantization loses is the noise
power; recovering half of it is an SQNR gain of 10 log10(2) = 3.01 dB.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import mixq  # noqa: E402
from mixq.evaluate import compare  # noqa: E402
from mixq.finetune import AdaQuantConfig, AdaRoundConfig, quantize_with_finetune  # noqa: E402

data = pytest.importorskip("mixq.data")

HALF_THE_NOISE_DB = 10 * math.log10(2.0)
INT8_PER_TENSOR = mixq.QuantConfig(activation="int8", weight="int8", per_channel=False, activation_symmetric=True,
                                   weight_rounding="nearest")  # the baseline finetuning starts from


@pytest.fixture(scope="module")
def setup():
    try:
        path = str(data.default_model_path())
        s = data.load_default_samples()
    except FileNotFoundError as exc:  # pragma: no cover - the data ship with mixq
        pytest.skip(f"embedded model missing: {exc}")
    calib = [{"image": np.array(s.calib_images[i:i + 64])} for i in range(0, 128, 64)]
    held_out = [{"image": np.array(s.test_images[i:i + 100])} for i in range(0, 500, 100)]
    plain = mixq.quantize(path, INT8_PER_TENSOR, calib, check_kernels=False)
    base = compare(path, plain.model, held_out, optimize=False).first()
    return path, calib, held_out, base


def _held_out(path, model, held_out):
    return compare(path, model, held_out, optimize=False).first()


def test_per_tensor_int8_loses_clearly(setup):
    _, _, _, base = setup
    assert base.sqnr_db < 30.0  # per-tensor int8: well below the ~40 dB of per-channel int8


@pytest.mark.parametrize("ft", [
    AdaRoundConfig(num_iterations=80, batch_size=16, report_metric=False),
    AdaQuantConfig(num_iterations=80, batch_size=16, learning_rate=1e-4, report_metric=False),
], ids=["adaround", "adaquant"])
def test_finetuning_recovers_half_of_the_loss(setup, ft):
    path, calib, held_out, base = setup
    res = quantize_with_finetune(path, INT8_PER_TENSOR, calib, ft, check_kernels=False)
    got = _held_out(path, res.model, held_out)
    assert got.sqnr_db - base.sqnr_db >= HALF_THE_NOISE_DB, (base, got)
    assert got.top1_agreement >= base.top1_agreement
    rep = res.finetune
    assert len(rep.layers) == 7 and rep.total_seconds < 60.0
    assert sum(r.loss_after for r in rep.layers) < sum(r.loss_before for r in rep.layers)
