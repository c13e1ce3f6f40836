"""The documented vocabulary end to end on the embedded model: the measured failures of issue 18
(get_default_config in a Config, QConfig with algo_config, include_fast_ft + FastFinetune, the
CLI's --finetune: the three finetune spellings write the same bytes), names checked against the
model, and the documented AutoMixprecision walk measured as the vendor measures it."""
from __future__ import annotations

import numpy as np
import onnx
import pytest

import mixq
from mixq.cli.main import main as cli_main
from mixq.compat import (AdaQuantConfig, CalibrationMethod, Config, ExtendedQuantType, Int8Spec, Int16Spec,
                         ModelQuantizer, QConfig, QLayerConfig, QuantizationConfig, QuantType, average_l2,
                         get_default_config)
from mixq.data import default_model_path, load_default_samples
from mixq.errors import ConfigError
from mixq.evaluate import make_session

pytest.importorskip("torch")
MODEL = str(default_model_path())


class Reader:
    """A one-shot onnxruntime-style data reader (what the documentation's readers are)."""

    def __init__(self, x: np.ndarray, batch: int = 1) -> None:
        self.it = iter([{"image": x[i:i + batch]} for i in range(0, len(x), batch)])

    def get_next(self):
        return next(self.it, None)


@pytest.fixture(scope="module")
def calib():
    return np.ascontiguousarray(load_default_samples().calib_images[:8])


def _dq_scales(model):
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
    return [inits[n.input[1]] for n in model.graph.node
            if n.op_type == "DequantizeLinear" and n.input[0] in inits and inits[n.input[0]].ndim == 4]


def test_get_default_config_in_a_config(calib, tmp_path, capsys):
    config = Config(global_quant_config=get_default_config("A8W8"))
    quantizer = ModelQuantizer(config)
    model = quantizer.quantize_model(MODEL, str(tmp_path / "a8w8.onnx"), Reader(calib))
    scales = _dq_scales(model)
    assert scales and all(s.ndim == 0 for s in scales)  # the vendor preset is per tensor
    assert "## mixq" in capsys.readouterr().out  # print_summary=True, the vendor default
    # the documented one-shot reader still gets the fidelity guard (its samples kept in calibration)
    assert quantizer.result.fidelity.not_checked is None and quantizer.result.fidelity.samples == 8
    q = ModelQuantizer(Config(global_quant_config=get_default_config("A8W8")))
    q.translation.print_summary = False
    q.quantize_model(MODEL, str(tmp_path / "b.onnx"), Reader(calib))
    assert capsys.readouterr().out == ""


def test_three_finetune_spellings_write_the_same_bytes(calib, tmp_path):
    calib = calib[:4]
    iters, lr = 20, 1e-4
    # 1. QConfig + algo_config
    q1 = QConfig(global_config=QLayerConfig(input_tensors=Int16Spec(), weight=Int8Spec()),
                 algo_config=[AdaQuantConfig(num_iterations=iters, learning_rate=lr)])
    ModelQuantizer(q1).quantize_model(MODEL, str(tmp_path / "q1.onnx"), Reader(calib))
    # 2. QuantizationConfig + include_fast_ft + FastFinetune (the same quantization settings)
    qc = QuantizationConfig(calibrate_method=CalibrationMethod.Percentile, activation_type=ExtendedQuantType.QInt16,
                            weight_type=QuantType.QInt8, include_fast_ft=True, include_cle=False,
                            extra_options={"ActivationSymmetric": True, "FastFinetune": {
                                "OptimAlgorithm": "adaquant", "NumIterations": iters, "LearningRate": lr}})
    assert qc.translate().config == q1.to_mixq()
    ModelQuantizer(Config(global_quant_config=qc)).quantize_model(MODEL, str(tmp_path / "q2.onnx"), Reader(calib))
    # 3. the command line, with that QuantConfig as a JSON file
    import json

    (tmp_path / "cfg.json").write_text(json.dumps(q1.to_mixq().to_dict()))
    np.save(tmp_path / "calib.npy", calib)
    rc = cli_main(["quantize", MODEL, str(tmp_path / "q3.onnx"), "--calib", str(tmp_path / "calib.npy"),
                   "--config", str(tmp_path / "cfg.json"), "--finetune", "adaquant", "--ft-iters", str(iters),
                   "--ft-lr", str(lr)])
    assert rc == 0
    b1, b2, b3 = ((tmp_path / f"q{i}.onnx").read_bytes() for i in (1, 2, 3))
    assert b1 == b2 == b3
    # and finetuning changed the weights (the same bytes are not those of no finetuning)
    mixq.quantize(MODEL, q1.to_mixq(), [{"image": calib[i:i + 1]} for i in range(len(calib))],
                  output_path=tmp_path / "plain.onnx")
    assert (tmp_path / "plain.onnx").read_bytes() != b1


def test_cli_finetune_flags_are_checked(tmp_path, capsys):
    assert cli_main(["quantize", MODEL, str(tmp_path / "x.onnx"), "--ft-iters", "3"]) == 2
    assert "--finetune" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli_main(["quantize", MODEL, str(tmp_path / "x.onnx"), "--finetune", "adarond"])


@pytest.mark.parametrize("config, match", [
    (QuantizationConfig(op_types_to_quantize=["Conv", "Gemmm"]), "Did you mean: Gemm"),
    (QuantizationConfig(nodes_to_exclude=["conv_1"]), "not in the model"),
    (QuantizationConfig(extra_options={"AutoMixprecision": {"TargetOpType": ["conv"],
                                                            "TargetQuantType": QuantType.QInt16}}), "Did you mean: Conv"),
    (QConfig(global_config=QLayerConfig(Int8Spec(), Int8Spec()), layer_type_config={None: ["Relu6"]}), "Relu6"),
])
def test_unknown_names_are_errors_at_quantize_time(config, match, calib, tmp_path):
    with pytest.raises(ConfigError, match=match):
        ModelQuantizer(config).quantize_model(MODEL, str(tmp_path / "x.onnx"), Reader(calib))
    assert not (tmp_path / "x.onnx").exists()


def test_node_names_are_those_of_the_model(calib, tmp_path):
    m = onnx.load(MODEL)
    conv = next(n for n in m.graph.node if n.op_type == "Conv")
    name = conv.name or "Conv_0"
    r = ModelQuantizer(Config(global_quant_config=QuantizationConfig(nodes_to_exclude=[name])))
    r.translation.print_summary = False
    r.quantize_model(MODEL, str(tmp_path / "x.onnx"), Reader(calib))
    assert r.result.plan.float_nodes


def test_calib_data_size_uses_the_first_samples(calib, tmp_path):
    def run(n):
        q = ModelQuantizer(QuantizationConfig(extra_options={"CalibDataSize": n}, print_summary=False,
                                              include_cle=False))
        return q.quantize_model(MODEL, str(tmp_path / f"c{n}.onnx"), Reader(calib, batch=4))
    a, b = run(2), run(8)
    assert a.SerializeToString() != b.SerializeToString()
    ref = mixq.quantize(MODEL, QuantizationConfig(include_cle=False).to_mixq(), [{"image": calib[:2]}]).model
    assert a.SerializeToString() == ref.SerializeToString()


def test_calib_data_size_keeps_a_fixed_batch_whole(tmp_path):
    """CalibDataSize=10 on a model exported with a batch of 4: the reader's batches are whole,
    so the first 12 samples calibrate (the 10th's batch in full); cutting the last batch to 2
    rows made the user's valid data a DataError of mixq's own."""
    from tests.graphs import model

    m = model("""<ir_version: 8, opset_import: ["": 17]>
        g (float[4,8] x) => (float[4,4] y) { y = MatMul(x, W) }""", W=(8, 4))
    rng = np.random.default_rng(0)
    batches = [{"x": rng.standard_normal((4, 8)).astype(np.float32)} for _ in range(5)]

    class Once:
        def __init__(self):
            self.it = iter(batches)

        def get_next(self):
            return next(self.it, None)

    q = ModelQuantizer(QuantizationConfig(extra_options={"CalibDataSize": 10}, print_summary=False,
                                          include_cle=False))
    got = q.quantize_model(m, str(tmp_path / "q.onnx"), Once())
    ref = mixq.quantize(m, QuantizationConfig(include_cle=False).to_mixq(), batches[:3]).model
    assert got.SerializeToString() == ref.SerializeToString()


def _vendor_l2(model_a, model_b, feeds):
    outs = []
    for m in (model_a, model_b):
        s = make_session(m, optimize=False)
        outs.append([[s.run(None, f)[0]] for f in feeds])
    return average_l2(*outs)


def test_l2_target_is_the_vendors_average_l2(calib, tmp_path):
    """L2Target bounds the mean over batches of ||float - quantized||_2, absolute: a loose target
    narrows every candidate layer, a target below the all-wide model's L2 narrows none."""
    def walk(target):
        qc = QuantizationConfig(activation_type=ExtendedQuantType.QInt16, weight_type=QuantType.QInt8,
                                print_summary=False, extra_options={"AutoMixprecision": {
                                    "ActTargetQuantType": QuantType.QInt8, "WeightTargetQuantType": QuantType.QInt8,
                                    "OutputIndex": 0, "L2Target": target}})
        q = ModelQuantizer(Config(global_quant_config=qc))
        q.quantize_model(MODEL, str(tmp_path / f"l2_{target}.onnx"), Reader(calib, batch=2))
        return q.result
    loose = walk(1e6)
    assert loose.candidates and sorted(loose.narrowed) == sorted(loose.candidates) and loose.target_met
    # narrowed in ascending order of each layer's own L2
    assert [loose.sensitivity[n] for n in loose.narrowed] == sorted(loose.sensitivity.values())
    feeds = [{"image": calib[i:i + 2]} for i in range(0, len(calib), 2)]
    measured = _vendor_l2(MODEL, loose.model, feeds)
    assert loose.metric == pytest.approx(measured, rel=1e-4)
    tight = walk(measured / 1e3)
    assert tight.narrowed == []
    # the wide model's own L2 is what the vendor's formula gives on it
    assert tight.metric == pytest.approx(_vendor_l2(MODEL, tight.model, feeds), rel=1e-4)


def test_evaluate_function_is_called_with_results(calib, tmp_path):
    calls = []
    labels = np.argmax(make_session(MODEL).run(None, {"image": calib})[0], 1)

    def top1_acc(results):
        # the vendor's call: one entry per batch, each the list [output OutputIndex]
        calls.append(results)
        pred = np.concatenate([np.argmax(r[0], 1) for r in results])
        return float(np.mean(pred == labels[:len(pred)]))

    qc = QuantizationConfig(activation_type=ExtendedQuantType.QInt16, weight_type=QuantType.QInt8,
                            include_auto_mp=True, print_summary=False, extra_options={"AutoMixprecision": {
                                "ActTargetQuantType": QuantType.QInt8, "WeightTargetQuantType": QuantType.QInt8,
                                "OutputIndex": 0, "Top1AccTarget": 0.5, "EvaluateFunction": top1_acc}})
    q = ModelQuantizer(Config(global_quant_config=qc))
    q.quantize_model(MODEL, str(tmp_path / "top1.onnx"), Reader(calib, batch=4))
    assert calls and all(isinstance(r, list) and len(r) == 2 and len(r[0]) == 1 and r[0][0].shape == (4, 10)
                         for r in calls)
    assert q.result.target_met and q.result.metric <= 0.5 and q.result.narrowed
