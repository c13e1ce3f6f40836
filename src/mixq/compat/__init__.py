"""The documented configuration vocabulary, accepted at the edge and translated once into
mixq's typed `QuantConfig`.

Code written against the vendor documentation runs with only its import lines changed:

    from mixq.compat import ModelQuantizer, CalibrationMethod, VitisQuantFormat, VitisQuantType
    from mixq.compat import Config, QuantizationConfig

Unknown options or `extra_options` keys raise ConfigError with a "did you mean"; nothing is
silently ignored.
"""
from __future__ import annotations

import enum
import os
import sys
import types
from dataclasses import dataclass, field
from typing import Any

from ..config import LayerRule, QuantConfig, get_default_config
from ..errors import ConfigError, did_you_mean


class QuantType(enum.Enum):
    """onnxruntime-style quantization types."""

    QInt8 = "int8"
    QUInt8 = "uint8"
    QInt16 = "int16"
    QUInt16 = "uint16"
    QInt4 = "int4"
    QUInt4 = "uint4"
    QFLOAT8E4M3FN = "fp8_e4m3fn"


class VitisQuantType(enum.Enum):
    """The extended types of the documentation (integers, half floats, BFP, MX)."""

    QInt8 = "int8"
    QUInt8 = "uint8"
    QInt16 = "int16"
    QUInt16 = "uint16"
    QInt32 = "int32"
    QUInt32 = "uint32"
    QFloat16 = "fp16"
    QBFloat16 = "bf16"
    QBloat16 = "bf16"  # the spelling of one documented snippet (an alias of QBFloat16)
    QBFP = "bfp16"
    QMX4 = "mx4"
    QMX6 = "mx6"
    QMX9 = "mx9"
    QMXINT8 = "mxint8"
    QMXFP8E4M3 = "mxfp8_e4m3"
    QMXFP8E5M2 = "mxfp8_e5m2"
    QMXFP6E3M2 = "mxfp6_e3m2"
    QMXFP6E2M3 = "mxfp6_e2m3"
    QMXFP4 = "mxfp4"


class QuantFormat(enum.Enum):
    QDQ = "qdq"
    QOperator = "qoperator"


class VitisQuantFormat(enum.Enum):
    QDQ = "qdq"
    FixNeuron = "fixneuron"


class CalibrationMethod(enum.Enum):
    MinMax = "minmax"
    Entropy = "entropy"
    Percentile = "percentile"
    MinMSE = "minmse"


class PowerOfTwoMethod(enum.Enum):
    NonOverflow = "nonoverflow"
    MinMSE = "minmse"


def _format_name(value: Any, option: str) -> str:
    if isinstance(value, (QuantType, VitisQuantType)):
        return value.value
    if isinstance(value, str):
        return value
    raise ConfigError(f"{option}={value!r}: expected a QuantType / VitisQuantType member or a "
                      "format name such as 'int8'.")


#: extra_options keys this layer understands (a later mixed-precision layer adds its own).
_EXTRA_KEYS = ("ActivationSymmetric", "WeightSymmetric", "Percentile", "MixedPrecisionTensor",
               "AutoMixprecision")


#: AutoMixprecision keys: layer-wise rule keys, and the keys of an automatic search.
_AMP_RULE_KEYS = ("TargetOpType", "TargetQuantType", "DualQuantNodes")
_AMP_SEARCH_KEYS = ("ActTargetQuantType", "WeightTargetQuantType", "OutputIndex", "L2Target",
                    "Top1AccTarget", "EvaluateFunction")


def _tensor_formats(value: Any) -> dict[str, str]:
    """MixedPrecisionTensor {type: [tensor names]} -> {tensor name: format name}."""
    if not isinstance(value, dict):
        raise ConfigError("extra_options['MixedPrecisionTensor'] must be a dict "
                          "{VitisQuantType.X: ['tensor', ...]}.")
    out: dict[str, str] = {}
    for qtype, names in value.items():
        fmt = _format_name(qtype, "MixedPrecisionTensor key")
        if isinstance(names, str) or not all(isinstance(n, str) for n in names):
            raise ConfigError(f"MixedPrecisionTensor[{qtype}] must be a list of tensor names.")
        for n in names:
            if n in out and out[n] != fmt:
                raise ConfigError(f"MixedPrecisionTensor gives tensor {n!r} two types, {out[n]} and {fmt}.")
            out[n] = fmt
    return out


def _auto_mp_options(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ConfigError("extra_options['AutoMixprecision'] must be a dict of options.")
    known = _AMP_RULE_KEYS + _AMP_SEARCH_KEYS
    for k in value:
        if k not in known:
            raise ConfigError(f"unknown AutoMixprecision key {k!r}." + did_you_mean(k, known)
                              + f" Known keys: {', '.join(known)}.")
    out = dict(value)
    search = {k for k in value if k in _AMP_SEARCH_KEYS}
    if search:
        out["search"] = search
    return out


@dataclass
class QuantizationConfig:
    """The documented global quantization configuration (field names as documented)."""

    calibrate_method: Any = CalibrationMethod.MinMax
    quant_format: Any = VitisQuantFormat.QDQ
    activation_type: Any = QuantType.QInt8
    weight_type: Any = QuantType.QInt8
    per_channel: bool = False
    include_auto_mp: bool = False
    specific_tensor_precision: bool = False
    enable_npu_cnn: bool = False
    op_types_to_quantize: list[str] | None = None
    nodes_to_exclude: list[str] = field(default_factory=list)
    extra_options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.quant_format in (QuantFormat.QOperator,):
            raise ConfigError("quant_format=QOperator is not supported: mixq emits QDQ models "
                              "(use QuantFormat.QDQ or VitisQuantFormat.QDQ).")
        for key in self.extra_options:
            if key not in _EXTRA_KEYS:
                raise ConfigError(f"unknown extra_options key {key!r}." + did_you_mean(key, _EXTRA_KEYS)
                                  + f" Known keys: {', '.join(_EXTRA_KEYS)}.")

    def to_mixq(self, *, allow_search: bool = False) -> QuantConfig:
        """Translate into mixq's typed config. AutoMixprecision search keys (targets) need the
        search, which `ModelQuantizer` runs; elsewhere they raise instead of being ignored."""
        extra = dict(self.extra_options)
        changes: dict[str, Any] = {
            "activation": _format_name(self.activation_type, "activation_type"),
            "weight": _format_name(self.weight_type, "weight_type"),
            "per_channel": bool(self.per_channel),
            "name": "compat",
        }
        m = self.calibrate_method
        if isinstance(m, PowerOfTwoMethod):
            changes["power_of_two"] = m.value
            changes["calibration"] = "minmse" if m is PowerOfTwoMethod.MinMSE else "minmax"
        elif isinstance(m, CalibrationMethod):
            changes["calibration"] = m.value
        else:
            raise ConfigError(f"calibrate_method={m!r}: expected a CalibrationMethod or "
                              "PowerOfTwoMethod member.")
        if self.enable_npu_cnn:
            # NPU CNN targets: power-of-two, symmetric scales shared across Concat
            changes.setdefault("power_of_two", "minmse")
            changes["activation_symmetric"] = True
            changes["share_concat_scales"] = True
        if "ActivationSymmetric" in extra:
            changes["activation_symmetric"] = bool(extra["ActivationSymmetric"])
        if "WeightSymmetric" in extra:
            changes["weight_symmetric"] = bool(extra["WeightSymmetric"])
        if "Percentile" in extra:
            changes["percentile"] = float(extra["Percentile"])
        if "MixedPrecisionTensor" in extra:
            changes["tensor_formats"] = _tensor_formats(extra["MixedPrecisionTensor"])
        if "AutoMixprecision" in extra:
            amp = _auto_mp_options(extra["AutoMixprecision"])
            if amp.get("search") and not allow_search:
                raise ConfigError(
                    "extra_options['AutoMixprecision'] with " + ", ".join(sorted(amp["search"]))
                    + " asks for an automatic mixed-precision search: run it with "
                    "mixq.compat.ModelQuantizer(config).quantize_model(...) or mixq.search."
                    "auto_quantize (mixq.quantize takes fixed configs).")
            if "TargetQuantType" in amp and not amp.get("search"):
                if "TargetOpType" not in amp:
                    raise ConfigError("AutoMixprecision needs TargetOpType with TargetQuantType "
                                      "for layer-wise precision.")
                fmt = _format_name(amp["TargetQuantType"], "TargetQuantType")
                changes["layer_rules"] = (LayerRule(op_types=frozenset(amp["TargetOpType"]),
                                                    activation=fmt, weight=fmt),)
            changes["dual_quant_nodes"] = bool(amp.get("DualQuantNodes", False))
        if self.op_types_to_quantize:
            changes["op_types"] = frozenset(self.op_types_to_quantize)
        if self.nodes_to_exclude:
            changes["exclude_nodes"] = frozenset(self.nodes_to_exclude)
        return QuantConfig(**changes)


def _auto_config(qc: "QuantizationConfig"):
    """The AutoMixprecision search keys as a mixq AutoConfig (None when there are none)."""
    amp = qc.extra_options.get("AutoMixprecision")
    if amp is None:
        return None, None
    opts = _auto_mp_options(amp)
    if not opts.get("search"):
        return None, None
    from ..search import AutoConfig, Candidate
    from ..search.auto import DEFAULT_OP_TYPES

    base = qc.to_mixq(allow_search=True)
    fallback = opts.get("TargetQuantType")
    act = opts.get("ActTargetQuantType", fallback)
    wgt = opts.get("WeightTargetQuantType", fallback)
    if act is None and wgt is None:
        raise ConfigError("AutoMixprecision needs ActTargetQuantType and/or WeightTargetQuantType "
                          "(the narrow precision of insensitive layers).")
    cand = Candidate(_format_name(act, "ActTargetQuantType") if act is not None else base.activation,
                     _format_name(wgt, "WeightTargetQuantType") if wgt is not None else base.weight)
    has_l2, has_top1 = "L2Target" in opts, "Top1AccTarget" in opts
    if has_l2 == has_top1:
        raise ConfigError("AutoMixprecision needs exactly one target: L2Target, or Top1AccTarget "
                          "with EvaluateFunction.")
    if has_top1 and "EvaluateFunction" not in opts:
        raise ConfigError("Top1AccTarget needs EvaluateFunction: f(model_path) -> top-1 accuracy.")
    auto = AutoConfig(base=base, candidates=(cand,),
                      op_types=frozenset(opts.get("TargetOpType", DEFAULT_OP_TYPES)),
                      l2_target=float(opts["L2Target"]) if has_l2 else None,
                      top1_drop=float(opts["Top1AccTarget"]) if has_top1 else None,
                      output_index=int(opts.get("OutputIndex", 0)))
    return auto, opts.get("EvaluateFunction")


@dataclass
class Config:
    """Top-level documented config: `Config(global_quant_config=QuantizationConfig(...))`."""

    global_quant_config: QuantizationConfig

    def to_mixq(self, *, allow_search: bool = False) -> QuantConfig:
        return self.global_quant_config.to_mixq(allow_search=allow_search)


class ModelQuantizer:
    """The documented front door: `ModelQuantizer(config).quantize_model(in, out, reader)`."""

    def __init__(self, config: Config | QuantConfig | str) -> None:
        if isinstance(config, (Config, QuantizationConfig)):
            self.config = config.to_mixq(allow_search=True)
        elif isinstance(config, str):
            self.config = get_default_config(config)
        elif isinstance(config, QuantConfig):
            self.config = config
        else:
            raise ConfigError(f"ModelQuantizer needs a Config, a QuantConfig or a preset name, "
                              f"got {type(config).__name__}.")
        self.result = None
        qc = config.global_quant_config if isinstance(config, Config) else \
            config if isinstance(config, QuantizationConfig) else None
        self.auto, self.evaluate_function = _auto_config(qc) if qc is not None else (None, None)

    def quantize_model(self, model_input: str | os.PathLike, model_output: str | os.PathLike,
                       calibration_data_reader: Any = None) -> Any:
        """Quantize `model_input` into `model_output`; returns the ModelProto written."""
        if self.auto is not None:  # AutoMixprecision with a target: the search
            from ..search import auto_quantize

            self.result = auto_quantize(model_input, self.auto, calibration_data_reader,
                                        evaluate_function=self.evaluate_function,
                                        output_path=model_output)
            return self.result.model
        from ..api import quantize

        self.result = quantize(model_input, self.config, calibration_data_reader,
                               output_path=model_output)
        return self.result.model


# the finetuning vocabulary (QConfig, QLayerConfig, AdaQuantConfig, BFloat16Spec, ...); torch is
# imported only when finetuning runs
from ..finetune.compat import SPECS as _SPECS  # noqa: E402
from ..finetune.compat import AdaQuantConfig, AdaRoundConfig, QConfig, QLayerConfig  # noqa: E402,F401

globals().update(_SPECS)

#: `quark.onnx.X` attribute access of the documented snippets: `from mixq.compat import quark`.
quark = types.SimpleNamespace(onnx=sys.modules[__name__])

__all__ = ["quark", "QConfig", "QLayerConfig", "AdaQuantConfig", "AdaRoundConfig", *_SPECS, "QuantType", "VitisQuantType", "QuantFormat", "VitisQuantFormat", "CalibrationMethod",
           "PowerOfTwoMethod", "QuantizationConfig", "Config", "ModelQuantizer", "get_default_config"]
