"""Typed, frozen quantization configs and the named presets.

Everything is validated on creation: an unknown format, method or preset raises ConfigError (or
FormatError) naming the value and the valid choices. The documented vocabulary of other tools is
translated into these objects once, in `mixq.compat`.
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

from .errors import ConfigError, did_you_mean
from .formats import get_format

CALIB_METHODS = ("minmax", "percentile", "entropy", "minmse")
POF2_METHODS = ("nonoverflow", "minmse")
BIAS_MODES = ("auto", "int32", "float")


def _choice(option: str, value: str, allowed: tuple[str, ...]) -> str:
    v = str(value).lower()
    if v not in allowed:
        raise ConfigError(f"{option}={value!r} is not valid; choose one of {', '.join(allowed)}."
                          + did_you_mean(v, allowed))
    return v


@dataclass(frozen=True)
class QuantConfig:
    """How to quantize a model.

    activation / weight: format names (see `mixq.formats.list_formats()`), chosen independently.
    calibration: range method for activations: minmax | percentile | entropy | minmse.
    power_of_two: None, or 'nonoverflow' | 'minmse' to use power-of-two scales (NPU presets).
    per_channel: per-output-channel weight scales for integer weights.
    activation_symmetric / weight_symmetric: zero point 0 (or the unsigned midpoint).
    bias: 'auto' (int32 when activations and weights are integer, else float), 'int32', 'float'.
    op_types: op types to quantize (None: every op type mixq knows); exclude_op_types and
        exclude_nodes remove some.
    reduce_range: integer weights use one bit less (int8 -> [-64, 63]) so that onnxruntime's
        fused int8 kernels cannot saturate on x86 CPUs without VNNI.
    share_concat_scales: Concat inputs and output share one scale (what NPU compilers want).
    quantize_outputs: quantize the outputs of quantized ops (graph outputs included).
    """

    activation: str = "int8"
    weight: str = "int8"
    calibration: str = "minmax"
    percentile: float = 99.999
    power_of_two: str | None = None
    per_channel: bool = True
    activation_symmetric: bool = False
    weight_symmetric: bool = True
    bias: str = "auto"
    op_types: frozenset[str] | None = None
    exclude_op_types: frozenset[str] = frozenset()
    exclude_nodes: frozenset[str] = frozenset()
    reduce_range: bool = False
    share_concat_scales: bool = False
    quantize_outputs: bool = True
    name: str = "custom"

    def __post_init__(self) -> None:
        # canonicalize names so that equal configs compare equal
        object.__setattr__(self, "activation", get_format(self.activation).name)
        object.__setattr__(self, "weight", get_format(self.weight).name)
        object.__setattr__(self, "calibration", _choice("calibration", self.calibration, CALIB_METHODS))
        if self.power_of_two is not None:
            object.__setattr__(self, "power_of_two",
                               _choice("power_of_two", self.power_of_two, POF2_METHODS))
        object.__setattr__(self, "bias", _choice("bias", self.bias, BIAS_MODES))
        if not 50.0 < float(self.percentile) <= 100.0:
            raise ConfigError(f"percentile={self.percentile} must be in (50, 100], e.g. 99.999.")
        for opt in ("op_types", "exclude_op_types", "exclude_nodes"):
            v = getattr(self, opt)
            if v is not None:
                if isinstance(v, str):
                    raise ConfigError(f"{opt} must be a collection of names, not the string {v!r}.")
                object.__setattr__(self, opt, frozenset(v))

    def with_options(self, **changes: Any) -> "QuantConfig":
        """A copy with some options changed; unknown option names raise ConfigError."""
        known = [f.name for f in fields(self)]
        for k in changes:
            if k not in known:
                raise ConfigError(f"unknown config option {k!r}." + did_you_mean(k, known)
                                  + f" Options: {', '.join(known)}.")
        return replace(self, **changes)


def _p(name: str, **kw: Any) -> QuantConfig:
    return QuantConfig(name=name, **kw)


#: Named presets. Integer presets use symmetric int8 weights per channel.
PRESETS: dict[str, QuantConfig] = {
    "XINT8": _p("XINT8", activation="int8", weight="int8", calibration="minmse",
                power_of_two="minmse", activation_symmetric=True, share_concat_scales=True),
    "A8W8": _p("A8W8", activation="int8", weight="int8", calibration="minmse",
               activation_symmetric=True),
    "A16W8": _p("A16W8", activation="int16", weight="int8", calibration="minmse",
                activation_symmetric=True),
    "U8S8": _p("U8S8", activation="uint8", weight="int8", calibration="minmse"),
    "S16S16": _p("S16S16", activation="int16", weight="int16", calibration="minmax",
                 activation_symmetric=True),
    "BF16": _p("BF16", activation="bf16", weight="bf16"),
    "FP16": _p("FP16", activation="fp16", weight="fp16"),
    "BFP16": _p("BFP16", activation="bfp16", weight="bfp16"),
    "MXINT8": _p("MXINT8", activation="mxint8", weight="mxint8"),
    "MXFP8_E4M3": _p("MXFP8_E4M3", activation="mxfp8_e4m3", weight="mxfp8_e4m3"),
    "MXFP8_E5M2": _p("MXFP8_E5M2", activation="mxfp8_e5m2", weight="mxfp8_e5m2"),
    "MXFP6_E3M2": _p("MXFP6_E3M2", activation="mxfp6_e3m2", weight="mxfp6_e3m2"),
    "MXFP6_E2M3": _p("MXFP6_E2M3", activation="mxfp6_e2m3", weight="mxfp6_e2m3"),
    "MXFP4": _p("MXFP4", activation="mxfp4", weight="mxfp4"),
    "MX4": _p("MX4", activation="mx4", weight="mx4"),
    "MX6": _p("MX6", activation="mx6", weight="mx6"),
    "MX9": _p("MX9", activation="mx9", weight="mx9"),
}


def get_default_config(name: str) -> QuantConfig:
    """The preset called `name` (case-insensitive), e.g. 'XINT8', 'A8W8', 'A16W8', 'MXFP4'."""
    key = str(name).upper().replace("-", "_")
    if key not in PRESETS:
        raise ConfigError(f"unknown preset {name!r}." + did_you_mean(key, PRESETS)
                          + f" Presets: {', '.join(PRESETS)}.")
    return PRESETS[key]
