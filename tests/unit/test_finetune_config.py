"""Finetune configs and the QConfig vocabulary: validated on creation, translated exactly."""
from __future__ import annotations

import subprocess
import sys

import pytest

from mixq.config import QuantConfig
from mixq.errors import ConfigError
from mixq.finetune import AdaQuantConfig, AdaRoundConfig, EarlyStop
from mixq.compat import (BFloat16Spec, Int8Spec, Int16Spec, MXFP4Spec, QConfig, QLayerConfig,
                         XInt8Spec)


def test_defaults_and_frozen():
    r = AdaRoundConfig()
    assert (r.num_iterations, r.reg_param, r.beta_range, r.warm_start) == (1000, 0.01, (20.0, 2.0), 0.2)
    assert AdaQuantConfig().learning_rate == 1e-5
    with pytest.raises(Exception):
        r.num_iterations = 3  # type: ignore[misc]
    assert AdaRoundConfig(early_stop=True).early_stop == EarlyStop()
    assert AdaRoundConfig(early_stop=False).early_stop is None
    assert AdaQuantConfig(include_layers=["a"]).include_layers == frozenset({"a"})


@pytest.mark.parametrize("cls, kwargs, match", [
    (AdaRoundConfig, {"num_iterations": -1}, "num_iterations"),
    (AdaRoundConfig, {"num_iterations": 2.5}, "num_iterations"),
    (AdaRoundConfig, {"learning_rate": 0}, "learning_rate"),
    (AdaQuantConfig, {"learning_rate": float("nan")}, "learning_rate"),
    (AdaQuantConfig, {"batch_size": 0}, "batch_size"),
    (AdaRoundConfig, {"reg_param": -1}, "reg_param"),
    (AdaRoundConfig, {"beta_range": (2, 20)}, "beta_range"),
    (AdaRoundConfig, {"beta_range": (20,)}, "beta_range"),
    (AdaRoundConfig, {"warm_start": 1.0}, "warm_start"),
    (AdaQuantConfig, {"early_stop": 5}, "early_stop"),
    (AdaQuantConfig, {"include_layers": "conv1"}, "include_layers"),
    (AdaQuantConfig, {"exclude_layers": [1]}, "exclude_layers"),
    (AdaQuantConfig, {"op_types": ["Relu"]}, "op_types"),
    (AdaQuantConfig, {"output_index": -1}, "output_index"),
    (AdaQuantConfig, {"seed": -3}, "seed"),
    (AdaQuantConfig, {"max_cache_mb": 0}, "max_cache_mb"),
    (AdaQuantConfig, {"update_bias": 1}, "update_bias"),
])
def test_invalid_options(cls, kwargs, match):
    with pytest.raises(ConfigError, match=match):
        cls(**kwargs)


def test_early_stop_validation_and_with_options():
    with pytest.raises(ConfigError, match="patience"):
        EarlyStop(patience=0)
    with pytest.raises(ConfigError, match="min_delta"):
        EarlyStop(min_delta=1.5)
    c = AdaQuantConfig().with_options(num_iterations=5)
    assert c.num_iterations == 5
    with pytest.raises(ConfigError, match="num_iteration.*Did you mean"):
        AdaQuantConfig().with_options(num_iteration=5)


def test_seed_snippet_translates():
    # the documented snippet, with only the import changed
    input_tensors_spec = BFloat16Spec()
    weight_spec = BFloat16Spec()
    algo_conf = [AdaQuantConfig(num_iterations=1000, learning_rate=1e-6)]
    config = QConfig(global_config=QLayerConfig(input_tensors=input_tensors_spec, weight=weight_spec),
                     algo_config=algo_conf)
    q = config.to_mixq()
    assert isinstance(q, QuantConfig) and (q.activation, q.weight) == ("bf16", "bf16")
    assert config.finetune_config == AdaQuantConfig(num_iterations=1000, learning_rate=1e-6)


def test_qconfig_int_options_and_layer_configs():
    cfg = QConfig(global_config=QLayerConfig(input_tensors=Int8Spec(symmetric=True, calibration_method="minmse"),
                                             weight=Int8Spec(per_channel=True)),
                  specific_layer_config={Int16Spec(): ["conv1"]}, layer_type_config={None: ["MatMul"]},
                  exclude=["fc"])
    q = cfg.to_mixq()
    assert q.activation_symmetric and q.per_channel_weights and q.calibration == "minmse"
    assert q.exclude_nodes == frozenset({"fc"}) and q.exclude_op_types == frozenset({"MatMul"})
    assert q.layer_rules[0].nodes == ("conv1",) and q.layer_rules[0].activation == "int16"
    assert cfg.finetune_config is None
    assert XInt8Spec() != Int8Spec()
    assert QConfig(global_config=QLayerConfig(XInt8Spec(), XInt8Spec())).to_mixq().power_of_two == "minmse"


@pytest.mark.parametrize("make, match", [
    (lambda: Int8Spec(symetric=True), "Did you mean: symmetric"),
    (lambda: BFloat16Spec(symmetric=True), "does not apply to bf16"),
    (lambda: MXFP4Spec(per_channel=True), "does not apply to mxfp4"),
    (lambda: Int8Spec(calibration_method="best"), "calibration_method"),
    (lambda: QLayerConfig(input_tensors=Int8Spec()), "weight="),
    (lambda: QLayerConfig(input_tensors="int8", weight=Int8Spec()), "input_tensors"),
    (lambda: QLayerConfig(Int8Spec(), Int8Spec(), output_tensors=Int16Spec()), "output_tensors"),
    (lambda: QConfig(global_config=None), "global_config"),
    (lambda: QConfig(global_config=QLayerConfig(Int8Spec(), Int8Spec()), algo_config=[object()]), "algo_config"),
    (lambda: QConfig(global_config=QLayerConfig(Int8Spec(), Int8Spec()),
                     algo_config=[AdaQuantConfig(), AdaRoundConfig()]), "at most one"),
])
def test_compat_errors(make, match):
    with pytest.raises(ConfigError, match=match):
        make()


def test_mixq_does_not_import_torch():
    code = ("import sys, mixq, mixq.compat, mixq.finetune, mixq.compat.qconfig; "
            "from mixq.finetune import AdaQuantConfig; AdaQuantConfig(); print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_missing_torch_is_a_config_error(monkeypatch):
    from mixq.finetune._torch import require_torch

    monkeypatch.setitem(sys.modules, "torch", None)  # import torch -> ImportError
    with pytest.raises(ConfigError, match=r"pip install mixq\[finetune\]"):
        require_torch()
