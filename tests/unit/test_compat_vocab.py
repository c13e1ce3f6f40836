"""The translation table, entry by entry: each documented name shows its effect on the translated
config (QuantConfig fields, the finetune config, the walk request, the run options) or raises
its "unsupported" error; string booleans, a string for a list and unknown names are errors."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import mixq
from mixq.compat import (AdaQuantConfig, AdaRoundConfig, AutoMixprecisionConfig, BFP16Spec, BiasCorrectionConfig,
                         CalibMethod, CalibrationMethod, CLEConfig, Config, ExtendedQuantType, GPTQConfig,
                         Int8Spec, Int16Spec, Int32Spec, MXInt8Spec, PowerOfTwoMethod, QConfig, QLayerConfig,
                         QuantGranularity, QuantizationConfig, QuantType, QuarotConfig, ScaleType,
                         SmoothQuantConfig, UInt8Spec, VitisQuantFormat, VitisQuantType, XInt8Spec,
                         get_default_config)
from mixq.compat import table as T
from mixq.compat.enums import ENUMS, TYPE_FORMATS
from mixq.compat.presets import PRESET_DATA
from mixq.compat.qconfig import QCONFIG_PRESETS
from mixq.config import LayerRule, QuantConfig
from mixq.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]


def _pc(cfg) -> bool:
    """Per-channel weights, whether QuantConfig spells it `per_channel` or (granularity) exposes
    `per_channel_weights`."""
    v = getattr(cfg, "per_channel_weights", None)
    return bool(cfg.per_channel if v is None else v)


def _get(tr, path: str):
    """Translation attribute path: 'config.percentile', 'flags.extra_op_types', 'amp.l2_target'."""
    obj = tr
    for part in path.split("."):
        if part == "per_channel" and isinstance(obj, QuantConfig):
            obj = _pc(obj)
        else:
            obj = obj[part] if isinstance(obj, dict) else getattr(obj, part)
    return obj


def _check(make, entry):
    if entry.kind == "unsupported" or "error" in (entry.effect or {}):
        word = "unsupported" if entry.kind == "unsupported" else entry.effect["error"]
        with pytest.raises(ConfigError) as exc:
            make(entry.example)
        assert word in str(exc.value)
        return
    tr = make(entry.example)
    assert entry.effect, f"{entry.scope}.{entry.name} has no effect to check"
    for path, want in entry.effect.items():
        assert _get(tr, path) == want, (entry.name, path)


def _ids(entries):
    return [f"{e.scope}.{e.name}" for e in entries]


@pytest.mark.parametrize("entry", T.QUANTIZATION_CONFIG, ids=_ids(T.QUANTIZATION_CONFIG))
def test_quantization_config_field(entry):
    _check(lambda v: QuantizationConfig(**{entry.name: v}).translate(), entry)
    if entry.kind == "unsupported":  # the vendor default and mixq's own values pass
        for ok in (entry.default, *entry.accept):
            QuantizationConfig(**{entry.name: ok})


@pytest.mark.parametrize("entry", T.EXTRA_OPTIONS, ids=_ids(T.EXTRA_OPTIONS))
def test_extra_options_key(entry):
    _check(lambda v: QuantizationConfig(extra_options={entry.name: v}).translate(), entry)
    for ok in entry.accept:
        QuantizationConfig(extra_options={entry.name: ok})


#: Extra AutoMixprecision keys an entry's case needs (a target precision, a target).
_AMP_BASE = {"TargetOpType": {"L2Target": 1.0, "ActTargetQuantType": QuantType.QInt8},
             "TargetQuantType": {"L2Target": 1.0}, "Top1AccTarget": {"EvaluateFunction": len, "ActTargetQuantType": QuantType.QInt8},
             "EvaluateFunction": {"Top1AccTarget": 0.1, "ActTargetQuantType": QuantType.QInt8}, "DualQuantNodes": {"TargetQuantType": QuantType.QInt8},
             "TargetLayerConfig": {"L2Target": 1.0}, "NumTarget": {"ActTargetQuantType": QuantType.QInt8}}


@pytest.mark.parametrize("entry", T.AUTO_MIXPRECISION, ids=_ids(T.AUTO_MIXPRECISION))
def test_auto_mixprecision_key(entry):
    base = _AMP_BASE.get(entry.name, {"L2Target": 1.0, "ActTargetQuantType": QuantType.QInt8})
    example = QLayerConfig(Int16Spec(), Int16Spec()) if entry.name == "TargetLayerConfig" else entry.example
    e = T.Entry(entry.scope, entry.name, entry.kind, entry.mixq, example=example, effect=entry.effect)
    _check(lambda v: QuantizationConfig(activation_type=QuantType.QInt8, extra_options={
        "AutoMixprecision": {**base, entry.name: v}}).translate(), e)


_FF_BASE = {"UpdateBias": {"OptimAlgorithm": "adaquant"}}


@pytest.mark.parametrize("entry", T.FAST_FINETUNE, ids=_ids(T.FAST_FINETUNE))
def test_fast_finetune_key(entry):
    base = _FF_BASE.get(entry.name, {})
    _check(lambda v: QuantizationConfig(include_fast_ft=True, extra_options={
        "FastFinetune": {**base, entry.name: v}}).translate(), entry)
    if entry.alias:  # the same option as an AdaRoundConfig / AdaQuantConfig argument
        cls = AdaQuantConfig if base.get("OptimAlgorithm") == "adaquant" else AdaRoundConfig
        if entry.kind == "unsupported":
            with pytest.raises(ConfigError, match="unsupported"):
                cls(**{entry.alias: entry.example})
        else:
            cfg = Config(global_quant_config=QuantizationConfig(), algo_config=[cls(**{entry.alias: entry.example})])
            for path, want in entry.effect.items():
                assert _get(cfg.translate(), path) == want


@pytest.mark.parametrize("entry", T.BFP_MX, ids=_ids(T.BFP_MX))
def test_bfp_mx_attribute(entry):
    t = ExtendedQuantType.QBFP if entry.scope == "BFPAttributes" else ExtendedQuantType.QMX
    _check(lambda v: QuantizationConfig(activation_type=t, weight_type=t,
                                        extra_options={entry.scope: v}).translate(), entry)


#: What each quantization type is in mixq (independent of the table).
_TYPE_FORMATS = {"QInt8": "int8", "QUInt8": "uint8", "QInt16": "int16", "QUInt16": "uint16", "QInt4": "int4",
                 "QUInt4": "uint4", "QInt32": "int32", "QUInt32": "uint32", "QFLOAT8E4M3FN": "fp8_e4m3fn",
                 "QFloat16": "fp16", "QBFloat16": "bf16", "QBFP": "bfp16", "QMX": "mxint8"}
_CALIB = {"CalibrationMethod.MinMax": "minmax", "CalibrationMethod.Entropy": "entropy",
          "CalibrationMethod.Percentile": "percentile", "PowerOfTwoMethod.NonOverflow": "minmax",
          "PowerOfTwoMethod.MinMSE": "minmse", "Int16Method.MinMax": "minmax",
          "ExtendedCalibrationMethod.MinMSE": "minmse"}


@pytest.mark.parametrize("entry", T.enum_entries(), ids=_ids(T.enum_entries()))
def test_enum_member(entry):
    m = ENUMS[entry.scope][entry.name]
    key = f"{entry.scope}.{m.name}"
    if entry.scope in ("QuantType", "ExtendedQuantType", "VitisQuantType"):
        tr = QuantizationConfig(activation_type=m, weight_type=QuantType.QInt8).translate()
        assert tr.config.activation == _TYPE_FORMATS[m.name]
    elif entry.scope in ("QuantFormat", "ExtendedQuantFormat", "VitisQuantFormat"):
        if m.name in ("QOperator", "FixNeuron"):
            with pytest.raises(ConfigError, match="unsupported"):
                QuantizationConfig(quant_format=m)
        else:
            want = {"BFPFixNeuron": "bfp16", "MXFixNeuron": "mxint8"}.get(m.name, "int8")
            assert QuantizationConfig(quant_format=m).translate().config.activation == want
    elif key in _CALIB:
        c = QuantizationConfig(calibrate_method=m).translate().config
        assert c.calibration == _CALIB[key]
        assert c.power_of_two == ({"NonOverflow": "nonoverflow", "MinMSE": "minmse"}[m.name]
                                  if entry.scope == "PowerOfTwoMethod" else None)
    elif entry.scope in ("CalibrationMethod", "LayerWiseMethod"):
        with pytest.raises(ConfigError, match="unsupported"):
            QuantizationConfig(calibrate_method=m)
    elif entry.scope == "CalibMethod":
        make = lambda: QConfig(global_config=QLayerConfig(Int8Spec(calibration_method=m), Int8Spec())).translate().config
        if m.name in ("LayerwisePercentile", "Distribution"):
            with pytest.raises(ConfigError, match="unsupported"):
                make()
        else:
            assert make().calibration == m.name.lower()
    elif entry.scope == "ScaleType":
        make = lambda: QConfig(global_config=QLayerConfig(Int8Spec(scale_type=m), Int8Spec(scale_type=m))).translate().config
        if m.name == "Int16":
            with pytest.raises(ConfigError, match="unsupported"):
                make()
        else:
            assert (make().power_of_two is not None) == (m.name == "PowerOf2")
    else:  # QuantGranularity
        make = lambda: QConfig(global_config=QLayerConfig(Int8Spec(), Int8Spec(quant_granularity=m))).translate().config
        if m.name == "Group":
            with pytest.raises(ConfigError, match="unsupported"):
                make()
        else:
            assert _pc(make()) == (m.name == "Channel")


#: Each preset: (activation, weight, finetune algorithm) or the word its error names.
_PRESETS = {
    "UINT8_DYNAMIC_QUANT": "use_dynamic_quant", "VINT8": "optimize_model",
    "S16S16_MIXED_S8S8": "bias", "BF16_MIXED_BFP16": "bias", "BF16_MIXED_BFP16_ADAQUANT": "bias",
    "BF16_MIXED_MXINT8": "bias", "BF16_MIXED_MXINT8_ADAQUANT": "bias",
    "INT8_TRANSFORMER_DEFAULT": "enable_npu_transformer", "INT16_TRANSFORMER_DEFAULT": "enable_npu_transformer",
    "INT8_TRANSFORMER_ACCURATE": "enable_npu_transformer", "INT16_TRANSFORMER_ACCURATE": "enable_npu_transformer",
    "MATMUL_NBITS": "UseMatMulNBits",
    "XINT8": ("uint8", "int8", None), "S8S8_AAWS": ("int8", "int8", None), "U8S8_AAWS": ("uint8", "int8", None),
    "U8U8_AAWA": ("uint8", "uint8", None), "S16S8_ASWS": ("int16", "int8", None), "A8W8": ("int8", "int8", None),
    "A16W8": ("int16", "int8", None), "U16S8_AAWS": ("uint16", "int8", None), "FP16": ("fp16", "fp16", None),
    "BF16": ("bf16", "bf16", None), "BFP16": ("bfp16", "bfp16", None), "MX4": ("mx4", "mx4", None),
    "MX6": ("mx6", "mx6", None), "MX9": ("mx9", "mx9", None), "MXFP8E5M2": ("mxfp8_e5m2", "mxfp8_e5m2", None),
    "MXFP8E4M3": ("mxfp8_e4m3", "mxfp8_e4m3", None), "MXFP6E3M2": ("mxfp6_e3m2", "mxfp6_e3m2", None),
    "MXFP6E2M3": ("mxfp6_e2m3", "mxfp6_e2m3", None), "MXFP4E2M1": ("mxfp4", "mxfp4", None),
    "MXINT8": ("mxint8", "mxint8", None), "BF16_BFP16": ("bf16", "bfp16", None),
    "BF16_MXINT8": ("bf16", "mxint8", None), "MX9_INT8": ("mx9", "int8", None),
    "INT8_CNN_DEFAULT": ("uint8", "int8", None), "INT16_CNN_DEFAULT": ("uint16", "int16", None),
    "INT8_CNN_ACCURATE": ("uint8", "int8", "adaround"), "INT16_CNN_ACCURATE": ("uint16", "int16", "adaround"),
}
for _n in list(_PRESETS):
    if isinstance(_PRESETS[_n], tuple) and _PRESETS[_n][2] is None:
        for _suffix, _algo in (("_ADAROUND", "adaround"), ("_ADAQUANT", "adaquant")):
            if _n + _suffix in PRESET_DATA:
                _PRESETS[_n + _suffix] = (*_PRESETS[_n][:2], _algo)


def test_every_preset_is_listed():
    assert sorted(_PRESETS) == sorted(PRESET_DATA) and len(PRESET_DATA) == 65


@pytest.mark.parametrize("name", list(PRESET_DATA))
def test_preset(name):
    want = _PRESETS[name]
    if isinstance(want, str):
        with pytest.raises(ConfigError) as exc:
            get_default_config(name)
        assert name in str(exc.value) and want in str(exc.value) and "unsupported" in str(exc.value)
        return
    q = get_default_config(name)
    assert isinstance(q, QuantizationConfig)
    tr = Config(global_quant_config=q).translate()
    assert (tr.config.activation, tr.config.weight) == want[:2]
    assert (tr.finetune.algorithm if tr.finetune else None) == want[2]
    assert _pc(tr.config) is False  # the vendor's presets are per tensor


def test_preset_details_and_copies():
    x = get_default_config("XINT8").translate().config
    assert x.power_of_two == "minmse" and x.activation_symmetric and x.share_concat_scales
    a = get_default_config("A16W8").translate().config
    assert a.share_concat_scales and a.fuse_activations and a.activation_symmetric
    assert get_default_config("S8S8_AAWS").translate().config.percentile == 99.9999
    ft = get_default_config("A8W8_ADAROUND").finetune_config
    assert (ft.num_iterations, ft.learning_rate, ft.batch_size, ft.seed, ft.max_samples) == (1000, 0.1, 2, 1705472343, 1000)
    assert ft.early_stop is not None
    get_default_config("A8W8").extra_options["Percentile"] = 50.5  # a copy: the next call is clean
    assert "Percentile" not in get_default_config("A8W8").extra_options
    assert isinstance(mixq.get_default_config("A8W8"), QuantConfig)  # mixq's own stays typed
    c = QConfig.get_default_config("XINT8")  # the vendor's classmethod spelling: a Config
    assert isinstance(c, Config) and c.translate().config == get_default_config("XINT8").translate().config
    assert get_default_config("XINT8").translate().flags["cle"]  # the vendor's presets run CLE
    with pytest.raises(ConfigError, match="Did you mean: XINT8"):
        get_default_config("XINT"), 


@pytest.mark.parametrize("name", QCONFIG_PRESETS)
def test_qconfig_preset(name):
    import mixq.compat as c

    if name == "VINT8_QCONFIG":
        with pytest.raises(ConfigError, match="unsupported"):
            getattr(c, name)
        return
    q = getattr(c, name)
    tr = q.translate()
    assert tr.config.activation == {"BF16": "bf16", "BFP16": "bfp16", "A16W8": "int16"}.get(name.split("_")[0], "int8")
    algo = "adaround" if "ADAROUND" in name else "adaquant" if "ADAQUANT" in name else None
    assert (tr.finetune.algorithm if tr.finetune else None) == algo


# --- the measured failures ----------------------------------------------------------------------
@pytest.mark.parametrize("make, match", [
    (lambda: QuantizationConfig(per_channel="no"), "must be True or False"),
    (lambda: QuantizationConfig(extra_options={"ActivationSymmetric": "False"}), "must be True or False"),
    (lambda: QuantizationConfig(extra_options={"AutoMixprecision": {"TargetOpType": "MatMul",
                                                                    "TargetQuantType": QuantType.QInt16}}),
     "not a string"),
    (lambda: QuantizationConfig(op_types_to_quantize="Conv"), "not a string"),
    (lambda: QuantizationConfig(extra_op_types_to_quantize=["NonMaxSuppression"]), "not one of them"),
    (lambda: QuantizationConfig(nodes_to_exclude="conv1"), "not a string"),
    (lambda: QuantizationConfig(extra_options={"ActivationSymetric": True}), "Did you mean: ActivationSymmetric"),
    (lambda: QuantizationConfig(extra_options={"AutoMixprecision": {"L2Targt": 0.1}}), "Did you mean: L2Target"),
    (lambda: QuantizationConfig(include_fast_ft=True, extra_options={"FastFinetune": {"NumIteration": 3}}),
     "Did you mean: NumIterations"),
    (lambda: QuantizationConfig(extra_options={"Percentile": 101}), r"\(50, 100\]"),
    (lambda: QuantizationConfig(extra_options={"Percentile": "99"}), "must be a number"),
    (lambda: QuantizationConfig(include_fast_ft=True, extra_options={"FastFinetune": {"NumIterations": -1}}),
     "must be an integer"),
    (lambda: QuantizationConfig(include_fast_ft=True, extra_options={"FastFinetune": {"EarlyStop": "yes"}}),
     "must be True or False"),
    (lambda: QuantizationConfig(quant_format=VitisQuantFormat.FixNeuron), "FixNeuron.*unsupported"),
    (lambda: QuantizationConfig(include_auto_mp=True), "needs extra_options\\['AutoMixprecision'\\]"),
    (lambda: QuantizationConfig(include_auto_mp=False, extra_options={"AutoMixprecision": {
        "TargetQuantType": QuantType.QInt16}}), "include_auto_mp=False"),
    (lambda: QuantizationConfig(extra_options={"MixedPrecisionTensor": {QuantType.QInt16: ["x"]}}),
     "specific_tensor_precision=True"),
    (lambda: QuantizationConfig(specific_tensor_precision=True), "MixedPrecisionTensor"),
    (lambda: QuantizationConfig(extra_options={"FastFinetune": {"NumIterations": 3}}), "include_fast_ft=True"),
    (lambda: CLEConfig(cle_balance_method="avg"), "unsupported"),
    (lambda: CLEConfig(cle_steps=0), ">= 1"),
    (lambda: QuantizationConfig(include_sq=True), "SmoothQuant is not implemented"),
    (lambda: QuantizationConfig(enable_npu_cnn=True, per_channel=True), "per-tensor"),
    (lambda: QuantizationConfig(activation_type=QuantType.QInt8, quant_format=VitisQuantFormat.BFPFixNeuron,
                                weight_type=QuantType.QInt16), "contradicts"),
    (lambda: Config(global_quant_config=QuantizationConfig(), algo_config=[SmoothQuantConfig(alpha=0.7)]), "SmoothQuant"),
    (lambda: Config(global_quant_config=QuantizationConfig(include_cle=False),
                    algo_config=[GPTQConfig(bits=4)]).to_mixq(), r"GPTQConfig\(bits=4\) disagrees"),
    (lambda: QConfig(global_config=QLayerConfig(Int8Spec(), Int8Spec()),
                     algo_config=[GPTQConfig(weight_symmetric=False)]).to_mixq(), "weight_symmetric=False"),
    (lambda: GPTQConfig(perc_damp=0), r"\(0, 1\]"),
    (lambda: GPTQConfig(act_order="yes"), "must be True or False"),
    (lambda: GPTQConfig(group_size=0), "no groups"),
    (lambda: Config(global_quant_config=QuantizationConfig(), algo_config=[QuarotConfig()]), "QuaRot"),
    (lambda: Config(global_quant_config=QuantizationConfig(), algo_config=AdaQuantConfig()), "must be a list"),
    (lambda: Config(global_quant_config=QuantizationConfig(include_fast_ft=True), algo_config=[AdaQuantConfig()]),
     "asked twice"),
    (lambda: AdaQuantConfig(num_iteration=3), "Did you mean: num_iterations"),
    (lambda: AdaRoundConfig(update_bias=True), "AdaRound learns"),
    (lambda: AdaQuantConfig(target_op_type=["LayerNormalization"]), "finetunes Conv"),
    # QConfig: options that were accepted and dropped
    (lambda: QConfig(global_config=QLayerConfig(Int8Spec(per_channel=True), Int8Spec())), "weights only"),
    (lambda: QConfig(global_config=QLayerConfig(Int8Spec(quant_granularity=QuantGranularity.Channel), Int8Spec())),
     "weights only"),
    (lambda: QConfig(global_config=QLayerConfig(Int8Spec(), Int8Spec(calibration_method=CalibMethod.Entropy))),
     "unsupported for weights"),
    (lambda: QConfig(global_config=QLayerConfig(Int8Spec(), Int8Spec()),
                     specific_layer_config={QLayerConfig(Int16Spec(symmetric=False), Int8Spec()): ["conv1"]}),
     "layer rules change formats only"),
    (lambda: QConfig(global_config=QLayerConfig(Int8Spec(), Int8Spec()),
                     layer_type_config={Int16Spec(calibration_method=CalibMethod.Entropy): ["Conv"]}),
     "layer rules change formats only"),
    (lambda: QConfig(global_config=QLayerConfig(XInt8Spec(), Int8Spec())), "power-of-two"),
    (lambda: QConfig(global_config=QLayerConfig(Int8Spec(), Int8Spec()), exclude=[(["a"], ["b"])]), "subgraphs"),
    (lambda: QConfig(global_config=QLayerConfig(Int8Spec(), Int8Spec()), use_external_data_format=True), "2 GB"),
    (lambda: QConfig(global_config=QLayerConfig(Int8Spec(), Int8Spec()), ActivationSymetric=True), "Did you mean"),
    (lambda: QConfig(global_config=QLayerConfig(Int8Spec(), Int8Spec(), bias=Int8Spec())), "bias"),
    # what only ModelQuantizer runs is refused by to_mixq (mixq.quantize), not dropped
    (lambda: QuantizationConfig(extra_options={"AutoMixprecision": {"ActTargetQuantType": QuantType.QInt8,
                                                                    "L2Target": 0.1}}).to_mixq(), "ModelQuantizer"),
    (lambda: QuantizationConfig(extra_options={"CalibDataSize": 4}).to_mixq(), "ModelQuantizer"),
    (lambda: QuantizationConfig().to_mixq(), "include_cle=False"),
])
def test_errors(make, match):
    with pytest.raises(ConfigError, match=match):
        make()


def test_qconfig_vendor_defaults_and_options():
    # the vendor's spec defaults: Int8Spec symmetric + Percentile, UInt8Spec asymmetric
    q = QConfig(global_config=QLayerConfig(input_tensors=UInt8Spec(), weight=Int8Spec())).translate().config
    assert (q.calibration, q.activation_symmetric, _pc(q)) == ("percentile", False, False)
    q = QConfig(global_config=QLayerConfig(Int8Spec(calibration_method=CalibMethod.MinMax, symmetric=False),
                                           Int8Spec(quant_granularity=QuantGranularity.Channel, symmetric=False))).translate().config
    assert (q.calibration, q.activation_symmetric, q.weight_symmetric, _pc(q)) == ("minmax", False, False, True)
    x = QConfig(global_config=QLayerConfig(Int8Spec(scale_type=ScaleType.PowerOf2, calibration_method=CalibMethod.MinMax),
                                           Int8Spec(scale_type=ScaleType.PowerOf2))).translate().config
    assert x.power_of_two == "nonoverflow" and x.share_concat_scales
    # extra_options keys as QConfig keyword arguments or nested, as the vendor's presets write them
    assert QConfig(global_config=QLayerConfig(Int8Spec(), Int8Spec()), AlignConcat=True).translate().config.share_concat_scales
    assert QConfig(global_config=QLayerConfig(Int8Spec(), Int8Spec()),
                   extra_options={"FoldRelu": False}).translate().config.fuse_activations is False
    # layer configs: QLayerConfig keys give activation and weight formats separately
    r = QConfig(global_config=QLayerConfig(Int8Spec(), Int8Spec()),
                layer_type_config={QLayerConfig(Int16Spec(), Int8Spec()): ["MatMul"]}).translate().config.layer_rules
    assert r == (LayerRule(op_types=frozenset({"MatMul"}), activation="int16", weight="int8"),)
    b = QConfig(global_config=QLayerConfig(Int8Spec(), Int8Spec(), bias=Int32Spec())).translate().config
    assert b.bias == "int32"
    assert QLayerConfig(activation=Int16Spec(), weight=Int8Spec()).input_tensors == Int16Spec()
    # AutoMixprecisionConfig in algo_config: layer-wise precision for its op types
    amp = QConfig(global_config=QLayerConfig(Int16Spec(), Int8Spec()), algo_config=[AutoMixprecisionConfig(
        target_layer_config=QLayerConfig(Int8Spec(), Int8Spec()), target_op_type=["Conv"])]).translate().config
    assert amp.layer_rules == (LayerRule(op_types=frozenset({"Conv"}), activation="int8", weight="int8"),)
    m = QConfig(global_config=QLayerConfig(MXInt8Spec(), BFP16Spec())).translate().config
    assert (m.activation, m.weight) == ("mxint8", "bfp16")


def test_layer_wise_auto_mp_follows_the_vendor_type_rules():
    rule = QuantizationConfig(activation_type=VitisQuantType.QBFloat16, weight_type=VitisQuantType.QBFloat16,
                              include_auto_mp=True, extra_options={"AutoMixprecision": {
                                  "TargetOpType": ["Conv", "MatMul"], "TargetQuantType": VitisQuantType.QBFP}}
                              ).translate().config.layer_rules[0]
    assert (rule.activation, rule.weight) == ("bfp16", "bfp16")  # block formats: both
    rule = QuantizationConfig(activation_type=ExtendedQuantType.QInt16, extra_options={"AutoMixprecision": {
        "TargetOpType": ["Conv"], "TargetQuantType": QuantType.QInt8}}).translate().config.layer_rules[0]
    assert (rule.activation, rule.weight) == ("int8", "int8")  # integers: activations; weights keep weight_type
    assert QuantizationConfig(extra_options={"AutoMixprecision": {
        "TargetTensors": ["x"], "TargetQuantType": ExtendedQuantType.QInt16}}).translate().config.tensor_formats == (("x", "int16"),)


def test_compat_md_is_up_to_date():
    from mixq.compat.doc import default_path, render

    assert default_path() == ROOT / "docs" / "COMPAT.md"
    assert default_path().read_text(encoding="utf-8") == render(), "run: python -m mixq.compat.doc"


def test_every_table_name_is_in_compat_md():
    text = (ROOT / "docs" / "COMPAT.md").read_text(encoding="utf-8")
    for group in (T.QUANTIZATION_CONFIG, T.EXTRA_OPTIONS, T.AUTO_MIXPRECISION, T.FAST_FINETUNE, T.BFP_MX):
        for e in group:
            assert f"`{e.name}`" in text
    for name in PRESET_DATA:
        assert f"`{name}`" in text


def test_qconfig_weight_calibration_method_maps_as_the_vendor_reads_it():
    """A weight spec's MinMSE gives MinMSE weight ranges; any other method MinMax, whatever the
    activations use (before: MinMSE activations dragged the weights along, MinMSE weights raised)."""
    act = Int8Spec(calibration_method=CalibMethod.MinMSE)
    plain = QConfig(global_config=QLayerConfig(act, Int8Spec())).to_mixq()
    mse = QConfig(global_config=QLayerConfig(act, Int8Spec(calibration_method=CalibMethod.MinMSE))).to_mixq()
    assert (plain.calibration, plain.weight_method) == ("minmse", "minmax")
    assert (mse.calibration, mse.weight_method) == ("minmse", "minmse")


def test_gptq_config_maps_to_mixq_weight_rounding():
    """GPTQConfig in a Config's or a QConfig's algo_config sets weight_rounding='gptq' with the
    vendor's defaults (act_order False, perc_damp 0.01); its grid arguments, when given, agree
    with the weight spec (it was refused as not implemented)."""
    base = dict(include_cle=False)
    a = Config(global_quant_config=QuantizationConfig(**base), algo_config=[GPTQConfig()]).to_mixq()
    assert (a.weight_rounding, a.gptq_damp, a.gptq_act_order) == ("gptq", 0.01, False)
    b = QConfig(global_config=QLayerConfig(Int8Spec(), Int8Spec()),
                algo_config=[GPTQConfig(bits=8, perc_damp=0.05, act_order=True, mse=True)]).to_mixq()
    assert (b.weight_rounding, b.gptq_damp, b.gptq_act_order, b.weight_method) == ("gptq", 0.05, True, "minmse")
    assert QuantizationConfig(**base).to_mixq().weight_rounding == "auto"  # mixq's default


def test_bias_correction_is_asked_for_in_all_three_documented_ways():
    """BiasCorrectionConfig in a Config's or a QConfig's algo_config, and the BiasCorrection
    extra option, all set mixq's bias_correction (they were refused as not implemented)."""
    base = dict(include_cle=False)
    a = Config(global_quant_config=QuantizationConfig(**base), algo_config=[BiasCorrectionConfig()]).to_mixq()
    b = QuantizationConfig(**base, extra_options={"BiasCorrection": True}).to_mixq()
    c = QConfig(global_config=QLayerConfig(Int8Spec(), Int8Spec()), algo_config=[BiasCorrectionConfig()]).to_mixq()
    assert a.bias_correction and b.bias_correction and c.bias_correction
    assert a == b
    assert not QuantizationConfig(**base).to_mixq().bias_correction
