"""`get_default_config(name)`: the vendor's 65 named legacy presets as QuantizationConfig objects
(translated and checked like any other: the presets mixq cannot honour raise and say why), and
the vendor's `*_QCONFIG` objects of the QConfig API."""
from __future__ import annotations

import copy
import re
from typing import Any

from ..errors import ConfigError, did_you_mean
from ._preset_data import PRESET_DATA
from .enums import ENUMS


def _member(text: str) -> Any:
    cls, name = text.split(".")
    return ENUMS[cls][name]


def _layer_config(text: str) -> Any:
    """'QLayerConfig(input_tensors=Int8Spec, weight=Int8Spec, bias=Int8Spec)' -> the object."""
    from ..finetune.compat import SPECS, QLayerConfig

    args = dict(re.findall(r"(\w+)=(\w+)", text))
    return QLayerConfig(**{k: SPECS[v]() for k, v in args.items()})


def _resolve(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _resolve(v) for k, v in value.items()}
    if isinstance(value, str) and value.startswith("QLayerConfig("):
        return _layer_config(value)
    return value


def get_default_config(name: str) -> Any:
    """The vendor preset `name` as a QuantizationConfig (a fresh copy), usable where the documentation
    uses it: `Config(global_quant_config=get_default_config("XINT8"))`. Presets mixq cannot honour
    raise ConfigError naming the option and the reason. (`mixq.get_default_config` is mixq's own:
    it returns a QuantConfig.)"""
    from .legacy import QuantizationConfig

    key = str(name)
    if key not in PRESET_DATA:
        raise ConfigError(f"unknown preset {name!r}." + did_you_mean(key, PRESET_DATA)
                          + f" Presets: {', '.join(PRESET_DATA)}.")
    d = copy.deepcopy(PRESET_DATA[key])
    try:
        return QuantizationConfig(
            calibrate_method=_member(d["calibrate_method"]), quant_format=_member(d["quant_format"]),
            activation_type=_member(d["activation_type"]), weight_type=_member(d["weight_type"]),
            **d["fields"], extra_options=_resolve(d["extra_options"]))
    except ConfigError as exc:
        raise ConfigError(f"preset {key!r}: {exc}") from None


#: The vendor's QConfig presets: (input spec, weight spec, algorithm, extra_options).
_QCONFIG_PRESETS: dict[str, tuple[str, str, str | None, dict[str, Any]]] = {}
_A8 = {"ForceQuantizeNoInputCheck": True, "AlignSlice": False, "FoldRelu": True, "AlignConcat": True}
_VINT8 = {"OptimizeModel": False, "EnableNPUCnn": False, "UseRandomData": True, "ConvertBNToConv": True,
          "ConvertSigmoidToHardSigmoid": False, "ConvertClipToRelu": True, "ConvertSplitToSlice": True,
          "SplitLargeKernelPool": False, "ReplaceClip6Relu": True, "ConvertReduceMeanToGlobalAvgPool": False,
          "RemoveQDQConvClip": False, "RemoveQDQConvPRelu": False, "RemoveQDQConvRelu": False,
          "RemoveQDQConvLeakyRelu": False, "Int32Bias": False, "DedicatedQDQPair": True,
          "QuantizeAllOpTypes": True}
for _base, _a, _w, _extra in (("XINT8", "XInt8Spec", "XInt8Spec", {"ForceQuantizeNoInputCheck": True}),
                              ("A8W8", "Int8Spec", "Int8Spec", _A8),
                              ("A16W8", "Int16Spec", "Int8Spec", {**_A8, "AlignEltwiseQuantType": True})):
    for _suffix, _algo in (("", None), ("_ADAROUND", "AdaRoundConfig"), ("_ADAQUANT", "AdaQuantConfig")):
        _QCONFIG_PRESETS[f"{_base}{_suffix}_QCONFIG"] = (_a, _w, _algo, _extra)
_QCONFIG_PRESETS["VINT8_QCONFIG"] = ("XInt8Spec", "XInt8Spec", None, _VINT8)
_QCONFIG_PRESETS["BF16_QCONFIG"] = ("BFloat16Spec", "BFloat16Spec", None, {"ForceQuantizeNoInputCheck": True})
_QCONFIG_PRESETS["BFP16_QCONFIG"] = ("BFP16Spec", "BFP16Spec", None, {})
QCONFIG_PRESETS = tuple(_QCONFIG_PRESETS)


def qconfig_preset(name: str) -> Any:
    """The vendor's `name` QConfig object (e.g. 'A8W8_QCONFIG'); unsupported ones raise."""
    from ..finetune.compat import SPECS, QConfig, QLayerConfig
    from .algo import ALGO_CONFIGS

    a, w, algo, extra = _QCONFIG_PRESETS[name]
    try:
        return QConfig(global_config=QLayerConfig(input_tensors=SPECS[a](), weight=SPECS[w]()),
                       algo_config=[ALGO_CONFIGS[algo]()] if algo else None, extra_options=dict(extra))
    except ConfigError as exc:
        raise ConfigError(f"{name}: {exc}") from None


__all__ = ["get_default_config", "qconfig_preset", "QCONFIG_PRESETS", "PRESET_DATA"]
