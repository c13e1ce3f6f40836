"""Mixed precision at element, layer and tensor granularity on a real pretrained model (the PP-OCR
text-direction classifier), written the way the vendor documentation writes it: each seed
snippet runs with only its import lines changed, and the test checks the formats in the graph."""
from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest

import mixq
from mixq.errors import ConfigError
from tests.graphs import compare
from tests import realmodels

# --- the import lines of the snippets, changed -------------------------------------------------
from mixq.compat import ModelQuantizer, CalibrationMethod, QuantType, VitisQuantFormat, VitisQuantType  # noqa: E402
from mixq.compat import Config, QuantizationConfig, PowerOfTwoMethod, quark  # noqa: E402

pytestmark = pytest.mark.skipif(not realmodels.have_ppocr_models(),
                                reason="pip install --no-deps rapidocr-onnxruntime==1.4.4")


class Reader:
    """An onnxruntime-style calibration data reader."""

    def __init__(self, x: np.ndarray, name: str = "x", batch: int = 8) -> None:
        self.batches = iter([{name: x[i:i + batch]} for i in range(0, len(x), batch)])

    def get_next(self):
        return next(self.batches, None)


@pytest.fixture(scope="module")
def cls_case(tmp_path_factory):
    path = str(realmodels.ppocr_cls_model_path())
    name = onnx.load(path, load_external_data=False).graph.input[0].name
    calib = realmodels.cls_inputs("calib", 16)
    ev = realmodels.cls_inputs("eval", 32)
    return path, name, calib, [{name: ev[i:i + 8]} for i in range(0, len(ev), 8)], tmp_path_factory.mktemp("mp")


def _run(case, quant_config, tag):
    input_model_path, name, calib, _, tmp = case
    output_model_path = str(tmp / f"{tag}.onnx")
    data_reader = Reader(calib, name)
    # --- the snippet's own lines --------------------------------------------------------------
    config = Config(global_quant_config=quant_config)
    quantizer = ModelQuantizer(config)
    quantizer.quantize_model(input_model_path, output_model_path, data_reader)
    # ------------------------------------------------------------------------------------------
    model = onnx.load(output_model_path)
    onnx.checker.check_model(model, full_check=True)
    return model, quantizer.result


def _sqnr(case, model) -> float:
    return compare(case[0], model, case[3]).first().sqnr_db


def _bf16_weights(model) -> int:
    return sum(1 for t in model.graph.initializer if t.data_type == onnx.TensorProto.BFLOAT16)


def _kind(op_type: str) -> str:
    """A block function's name without its length / rank / constant-input variant suffixes."""
    return re.sub(r"(_n\d+)?(_p\d+)?(_r\d+)?(_const)?$", "", op_type)


def _input_format_of(model, op_type: str) -> Counter:
    """For each node of `op_type`, the op type producing its first input (its quantizer)."""
    prod = {o: n for n in model.graph.node for o in n.output}
    return Counter(_kind(prod[n.input[0]].op_type) if n.input[0] in prod else "graph input"
                   for n in model.graph.node if n.op_type == op_type)


def test_element_wise_bfp16_activations_bf16_weights(cls_case):
    quant_config = QuantizationConfig(
        calibrate_method=CalibrationMethod.MinMax,
        quant_format=VitisQuantFormat.QDQ,
        activation_type=VitisQuantType.QBFP,
        weight_type=VitisQuantType.QBFloat16,
    )
    model, res = _run(cls_case, quant_config, "elem1")
    ops = Counter(n.op_type for n in model.graph.node)
    assert any(op.startswith("BFP16_axis") for op in ops)          # activations: BFP16 functions
    assert _bf16_weights(model) >= 20                               # weights stored as bfloat16
    assert set(_input_format_of(model, "Conv")) <= {"BFP16_axis1"}  # every Conv reads BFP16
    assert _sqnr(cls_case, model) > 25


def test_element_wise_bf16_activations_bfp16_weights(cls_case):
    quant_config = QuantizationConfig(
        calibrate_method=CalibrationMethod.MinMax,
        quant_format=VitisQuantFormat.QDQ,
        activation_type=VitisQuantType.QBloat16,  # the documentation's spelling
        weight_type=VitisQuantType.QBFP,
    )
    model, res = _run(cls_case, quant_config, "elem2")
    conv_inputs = _input_format_of(model, "Conv")
    assert set(conv_inputs) == {"Cast"}                              # bf16 Cast pair on activations
    weights = {n.input[1] for n in model.graph.node if n.op_type == "Conv"}
    prod = {o: n for n in model.graph.node for o in n.output}
    assert all(prod[w].op_type.startswith("BFP16_axis") for w in weights)
    assert _bf16_weights(model) == 0
    assert _sqnr(cls_case, model) > 25


def _layer_wise_config(dual: bool):
    return QuantizationConfig(
        calibrate_method=CalibrationMethod.MinMax,
        quant_format=VitisQuantFormat.QDQ,
        activation_type=VitisQuantType.QBloat16,
        weight_type=VitisQuantType.QBloat16,
        include_auto_mp=True,
        extra_options={
            "AutoMixprecision": {
                "TargetOpType": ["Conv", "ConvTranspose", "Gemm", "MatMul"],
                "TargetQuantType": VitisQuantType.QBFP,
                **({"DualQuantNodes": True} if dual else {}),
            },
        },
    )


@pytest.mark.parametrize("dual", [False, True])
def test_layer_wise_bfp16_on_compute_ops_bf16_elsewhere(cls_case, dual):
    model, res = _run(cls_case, _layer_wise_config(dual), f"layer{dual}")
    prod = {o: n for n in model.graph.node for o in n.output}
    # every Conv reads BFP16 activations and BFP16 weights
    for n in model.graph.node:
        if n.op_type == "Conv":
            assert _kind(prod[n.input[0]].op_type) == "BFP16_axis1", n.name
            assert prod[n.input[1]].op_type.startswith("BFP16_axis"), n.name
    # other ops read bf16 (Cast pairs)
    others = [n for n in model.graph.node if n.op_type in ("HardSigmoid", "Mul", "Add", "Relu")]
    # (a Relu/Clip right after a Conv reads it unquantized: the pair is fused, fuse_activations)
    assert others and all(prod[n.input[0]].op_type in ("Cast", "Reshape", "Flatten")
                          or (n.op_type in ("Relu", "Clip") and prod[n.input[0]].op_type in ("Conv", "Add", "Gemm", "MatMul"))
                          for n in others if n.input[0] in prod)
    assert res.rewrite.boundary_conversions > 0
    # DualQuantNodes: the boundary conversion reads the producer's quantized value, so a BFP16
    # node sits right after a bf16 Cast pair; without it, it reads the float tensor
    bfp_after_cast = sum(1 for n in model.graph.node if _kind(n.op_type) == "BFP16_axis1"
                         and n.input[0] in prod and prod[n.input[0]].op_type == "Cast")
    assert (bfp_after_cast > 0) == dual


def test_tensor_wise_one_and_two_formats(cls_case):
    path = cls_case[0]
    m = onnx.load(path)
    conv = [n for n in m.graph.node if n.op_type == "Conv"]
    w_name, act_name = conv[3].input[1], conv[3].input[0]
    w2_name, act2_name = conv[5].input[1], conv[5].input[0]
    quant_config = QuantizationConfig(
        calibrate_method=CalibrationMethod.MinMax,
        quant_format=VitisQuantFormat.QDQ,
        activation_type=VitisQuantType.QBFP,
        weight_type=VitisQuantType.QBFP,
        specific_tensor_precision=True,
        extra_options={
            "MixedPrecisionTensor": {
                VitisQuantType.QBFloat16: [w_name, act_name],
            },
        },
    )
    model, res = _run(cls_case, quant_config, "tensor1")
    assert res.plan.tensors[w_name].format == "bf16" and res.plan.tensors[act_name].format == "bf16"
    assert res.plan.tensors[w2_name].format == "bfp16"
    assert _bf16_weights(model) == 1

    quant_config = QuantizationConfig(
        calibrate_method=CalibrationMethod.MinMax,
        quant_format=VitisQuantFormat.QDQ,
        activation_type=VitisQuantType.QBFP,
        weight_type=VitisQuantType.QBFP,
        specific_tensor_precision=True,
        extra_options={
            "MixedPrecisionTensor": {
                VitisQuantType.QBFloat16: [w_name, act_name],
                VitisQuantType.QInt16: [w2_name, act2_name],
            },
        },
    )
    model, res = _run(cls_case, quant_config, "tensor2")
    assert res.plan.tensors[w2_name].format == "int16" and res.plan.tensors[act2_name].format == "int16"
    int16 = [t for t in model.graph.initializer if t.data_type == onnx.TensorProto.INT16]
    assert any(len(t.dims) == 4 for t in int16)  # the int16 conv weight, stored as int16
    assert res.calibrated >= 1  # the int16 activation needed statistics
    assert _sqnr(cls_case, model) > 25


def test_int16_int8_layer_wise_example(cls_case):
    m = onnx.load(cls_case[0])
    convs = [n for n in m.graph.node if n.op_type == "Conv"]
    data_type_0, data_type_1 = QuantType.QInt8, VitisQuantType.QInt16
    quant_config = QuantizationConfig(
        calibrate_method=quark.onnx.PowerOfTwoMethod.NonOverflow,
        quant_format=quark.onnx.VitisQuantFormat.QDQ,
        activation_type=quark.onnx.VitisQuantType.QInt16,
        weight_type=quark.onnx.QuantType.QInt8,
        specific_tensor_precision=True,
        extra_options={"MixedPrecisionTensor": {data_type_0: [convs[1].input[0], convs[2].input[0]],
                                                data_type_1: [convs[1].input[1]]}},
    )
    model, res = _run(cls_case, quant_config, "int16int8")
    plan = res.plan
    assert plan.tensors[convs[1].input[0]].format == "int8"
    assert plan.tensors[convs[1].input[1]].format == "int16"
    assert plan.tensors[convs[3].input[0]].format == "int16"
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
    scales = [inits[n.input[1]] for n in model.graph.node
              if n.op_type == "QuantizeLinear" and inits[n.input[1]].dtype == np.float32]
    assert scales and all(np.all(np.frexp(s)[0] == 0.5) for s in scales)  # power-of-two scales


def test_fidelity_lies_between_all_low_and_all_high(cls_case):
    path, name, calib, ev, tmp = cls_case
    low = mixq.quantize(path, mixq.QuantConfig(activation="int8", weight="int8"), Reader(calib, name))
    high = mixq.quantize(path, mixq.QuantConfig(activation="int16", weight="int16"), Reader(calib, name))
    layer = mixq.quantize(path, mixq.QuantConfig(
        activation="int8", weight="int8",
        layer_rules=(mixq.LayerRule(op_types={"Conv"}, activation="int16", weight="int16"),)),
        Reader(calib, name))
    first_conv = next(n for n in onnx.load(path).graph.node if n.op_type == "Conv")
    tensor = mixq.quantize(path, mixq.QuantConfig(
        activation="int8", weight="int8",
        tensor_formats={first_conv.input[0]: "int16", first_conv.input[1]: "int16"}), Reader(calib, name))
    element = mixq.quantize(path, mixq.QuantConfig(activation="int16", weight="int8"), Reader(calib, name))
    s = {k: compare(path, r.model, ev, optimize=False).first().sqnr_db
         for k, r in dict(low=low, high=high, layer=layer, tensor=tensor, element=element).items()}
    for k in ("layer", "tensor", "element"):
        assert s["low"] <= s[k] <= s["high"], s


def test_plan_json_round_trip_and_replay_bytes(cls_case, tmp_path):
    path, name, calib, ev, _ = cls_case
    cfg = Config(global_quant_config=_layer_wise_config(True)).translate().config  # the QuantConfig part (no CLE)
    res = mixq.quantize(path, cfg, Reader(calib, name))
    text = res.plan.to_json()
    plan = mixq.PrecisionPlan.from_json(text)
    assert plan == res.plan and plan.to_json() == text
    again = mixq.quantize(path, cfg, Reader(calib, name), plan=plan)
    assert again.model.SerializeToString() == res.model.SerializeToString()


def test_unknown_tensor_name_suggests_the_closest(cls_case):
    path, name, calib, _, _ = cls_case
    conv = next(n for n in onnx.load(path).graph.node if n.op_type == "Conv")
    wrong = conv.input[1] + "x"
    with pytest.raises(ConfigError, match="Did you mean") as e:
        mixq.quantize(path, mixq.QuantConfig(tensor_formats={wrong: "int16"}), Reader(calib, name))
    assert conv.input[1] in str(e.value) and wrong in str(e.value)


def test_unknown_auto_mp_key_is_an_error():
    with pytest.raises(ConfigError, match="TargetOpType"):
        QuantizationConfig(extra_options={"AutoMixprecision": {"TargetOpTypes": ["Conv"]}}).to_mixq()


def test_mixq_plan_prints_the_table(cls_case, tmp_path, capsys):
    from mixq.cli.main import main

    out = tmp_path / "plan.json"
    cfg = tmp_path / "cfg.json"
    import json

    cfg.write_text(json.dumps({"preset": "BF16", "layer_rules": [
        {"op_types": ["Conv"], "activation": "bfp16", "weight": "bfp16"}]}))
    assert main(["plan", cls_case[0], "--config", str(cfg), "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert "| tensor | role | format | reason |" in text and "layer rule 0 (Conv)" in text
    assert mixq.PrecisionPlan.from_json(out.read_text()).tensors


@pytest.mark.parametrize("op", ["Slice", "Transpose", "Reshape", "MaxPool", "Squeeze", "Unsqueeze"])
@pytest.mark.parametrize("fmt", ["fp16", "bf16", "mxint8"])
def test_a_pass_through_output_overridden_to_another_format_loads_in_onnxruntime(op, fmt):
    """An int8 tensor read by a pass-through op whose output a tensor_formats override puts in
    another format: DequantizeLinear (int8) -> op -> a Cast or a block function, which
    onnxruntime 1.31's QDQ propagation (default optimizations) turns into a QuantizeLinear it
    then refuses at session creation (random overrides on a Llama-style block: 7 of 60). The
    rewrite's last step re-quantizes the op's output on its input's grid (no value changes)."""
    from onnx import TensorProto, helper, numpy_helper

    from mixq.evaluate import make_session

    rng = np.random.default_rng(0)
    x = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4, 8, 8])]
    inits = [numpy_helper.from_array(rng.normal(0, 0.3, (4, 4, 1, 1)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.normal(0, 0.3, (4, 4, 1, 1)).astype(np.float32), "w2"),
             numpy_helper.from_array(np.array([0], np.int64), "b"), numpy_helper.from_array(np.array([8], np.int64), "e"),
             numpy_helper.from_array(np.array([3], np.int64), "ax"), numpy_helper.from_array(np.array([2, 4, 8, 8], np.int64), "shp"),
             numpy_helper.from_array(np.array([0], np.int64), "ax0")]
    move = {"Slice": helper.make_node("Slice", ["c", "b", "e", "ax"], ["m"]),
            "Transpose": helper.make_node("Transpose", ["c"], ["m"], perm=[0, 1, 3, 2]),
            "Reshape": helper.make_node("Reshape", ["c", "shp"], ["m"]),
            "MaxPool": helper.make_node("MaxPool", ["c"], ["m"], kernel_shape=[1, 1]),
            "Squeeze": helper.make_node("Squeeze", ["u", "ax0"], ["m"]),
            "Unsqueeze": helper.make_node("Unsqueeze", ["c", "ax0"], ["m"])}[op]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]), move]
    if op == "Squeeze":
        nodes.insert(1, helper.make_node("Unsqueeze", ["c", "ax0"], ["u"]))
    last = "m"
    if op == "Unsqueeze":
        nodes.append(helper.make_node("Squeeze", ["m", "ax0"], ["ms"]))
        last = "ms"
    nodes.append(helper.make_node("Conv", [last, "w2"], ["y"]))
    g = helper.make_graph(nodes, "g", x, [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4, 8, 8])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    feeds = [{"x": rng.normal(size=(2, 4, 8, 8)).astype(np.float32)} for _ in range(4)]
    res = mixq.quantize(m, mixq.get_default_config("A8W8").with_options(tensor_formats=(("m", fmt),)), feeds,
                        check_kernels=False)
    assert res.plan.tensors["m"].format == fmt and res.plan.tensors["c"].format == "int8"
    make_session(res.model, optimize=True)  # default optimizations: the session loads
    room = next(p for p in res.rewrite.passes if p.name == "propagation_room")
    assert room.changed == 1 and "re-quantized on their input's int8 grid" in res.summary()
    got = make_session(res.model, optimize="basic").run(None, feeds[0])[0]
    assert compare(m, res.model, feeds).outputs[0].cosine > 0.99 and np.all(np.isfinite(got))
