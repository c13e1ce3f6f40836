"""Configs checked at the door (issue 15): each case raised a raw TypeError/ValueError before;
now a ConfigError naming the option and the fix."""
from __future__ import annotations

import json

import pytest

import mixq
from mixq.cli.main import main
from mixq.data import default_model_path
from mixq.errors import ConfigError


@pytest.mark.parametrize("make,match", [
    (lambda: mixq.QuantConfig(activaton="int8"), "did you mean: activation"),
    (lambda: mixq.QuantConfig("int8"), "keyword"),
    (lambda: mixq.QuantConfig(percentile="abc"), "percentile"),
    (lambda: mixq.QuantConfig(percentile=True), "percentile"),
    (lambda: mixq.QuantConfig(tensor_formats=["abc"]), "pair"),
    (lambda: mixq.QuantConfig(tensor_formats=[("a", "int8", "x")]), "pair"),
    (lambda: mixq.QuantConfig(tensor_formats="a"), "string"),
    (lambda: mixq.QuantConfig(reduce_range="yes"), "True or False"),
    (lambda: mixq.QuantConfig(per_channel="no"), "True or False"),
    (lambda: mixq.QuantConfig.from_dict({"op_types": 5}), "invalid config value"),
    (lambda: mixq.QuantConfig.from_dict({"tensor_formats": [["a"]]}), "pairs"),
])
def test_bad_config_values_are_config_errors(make, match):
    with pytest.raises(ConfigError, match=f"(?i){match}"):
        make()


@pytest.mark.parametrize("content", ["[" * 100000 + "]" * 100000, json.dumps({"op_types": 5}),
                                     json.dumps({"activation": ["int8"]}), "{" * 10])
def test_cli_bad_config_files(content, tmp_path, capsys):
    cfg = tmp_path / "cfg.json"
    cfg.write_text(content)
    assert main(["plan", str(default_model_path()), "--config", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("mixq: error:") and "Traceback" not in err


def test_cli_plan_output_onto_a_directory(tmp_path, capsys):
    d = tmp_path / "plans"
    d.mkdir()
    assert main(["plan", str(default_model_path()), "-o", str(d)]) == 2
    assert "directory" in capsys.readouterr().err


@pytest.mark.parametrize("cfg,match", [
    (dict(exclude_nodes=frozenset({"conv_9"})), "exclude_nodes names node 'conv_9'"),
    (dict(op_types=frozenset({"Conv", "Matmul"})), "'Matmul' is not an ONNX op type.*MatMul"),
    (dict(layer_rules=(mixq.LayerRule(nodes=("dense*",), activation="int16"),)), "matches no node"),
])
def test_names_that_match_nothing_are_errors(cfg, match):
    with pytest.raises(ConfigError, match=match):
        mixq.pipeline.Pipeline.load(str(default_model_path())).plan(mixq.QuantConfig(**cfg))


@pytest.mark.parametrize("preset", ["A16W8", "S16S16"])
def test_entropy_on_16_bit_activations_says_why_before_it_calibrates(preset, tmp_path, capsys):
    """`--calib-method entropy` on a 16-bit preset ran the calibration pass, then asked numpy for
    120 GiB per tensor (MemoryError, a traceback); it is refused at the door now, naming the fix."""
    import numpy as np

    from mixq.data import load_default_samples

    out, data = tmp_path / "q.onnx", tmp_path / "calib.npy"
    np.save(data, load_default_samples().calib_images[:8])
    assert main(["quantize", str(default_model_path()), str(out), "--preset", preset, "--calib-method",
                 "entropy", "--calib", str(data)]) == 2
    err = capsys.readouterr().err
    assert "calibration='entropy'" in err and "'percentile' or 'minmse'" in err and "Traceback" not in err
    assert not out.exists()


def test_entropy_on_a_layer_rules_16_bit_grid_names_the_tensor():
    import numpy as np
    import onnx

    m = onnx.load(default_model_path())
    name = m.graph.node[0].output[0]
    x = np.random.default_rng(0).standard_normal((4, *[d.dim_value or 1 for d in
                                                         m.graph.input[0].type.tensor_type.shape.dim[1:]]))
    cfg = mixq.QuantConfig(activation="int8", calibration="entropy", tensor_formats=((name, "int16"),))
    with pytest.raises(ConfigError, match=rf"tensor '{name}' \(int16\): calibration='entropy'"):
        mixq.quantize(m, cfg, [{m.graph.input[0].name: x.astype(np.float32)}], check_kernels=False)
