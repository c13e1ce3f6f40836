"""`get_default_config(name)`: the vendor's 65 named legacy presets as QuantizationConfig objects
(translated and checked like any other: the presets mixq cannot honour raise and say why). The
vendor's `*_QCONFIG` objects of the QConfig API are `mixq.compat.qconfig.qconfig_preset`."""
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
    from .qspecs import SPECS, QLayerConfig

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


__all__ = ["get_default_config", "PRESET_DATA"]
