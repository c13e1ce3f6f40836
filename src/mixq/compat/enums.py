"""The vendor's enums, member for member (values as the vendor numbers them), and what each
quantization type, format and calibration method means in mixq.

Every member is listed in `mixq.compat.table` (and so in docs/COMPAT.md): it maps to a mixq
format / calibration method, or it is unsupported with a reason.
"""
from __future__ import annotations

import enum
from typing import Any

from ..errors import ConfigError, did_you_mean


class QuantType(enum.Enum):
    """onnxruntime's quantization types (re-exported by the vendor)."""

    QInt8 = 0
    QUInt8 = 1
    QFLOAT8E4M3FN = 2
    QInt16 = 3
    QUInt16 = 4
    QInt4 = 5
    QUInt4 = 6


class ExtendedQuantType(enum.Enum):
    """The vendor's extended types: wider integers, half floats, block formats."""

    QInt8 = 1
    QUInt8 = 2
    QInt16 = 3
    QUInt16 = 4
    QInt32 = 5
    QUInt32 = 6
    QFloat16 = 7
    QBFloat16 = 8
    QBFP = 9
    QMX = 10


class VitisQuantType(enum.Enum):
    """Deprecated alias of ExtendedQuantType (same members). `QBloat16` is the spelling of one
    documented snippet, accepted as an alias of QBFloat16."""

    QInt8 = 1
    QUInt8 = 2
    QInt16 = 3
    QUInt16 = 4
    QInt32 = 5
    QUInt32 = 6
    QFloat16 = 7
    QBFloat16 = 8
    QBloat16 = 8  # alias (the documentation's typo)
    QBFP = 9
    QMX = 10


class QuantFormat(enum.Enum):
    """onnxruntime's output formats."""

    QOperator = 0
    QDQ = 1


class ExtendedQuantFormat(enum.Enum):
    """The vendor's output formats."""

    QOperator = 0
    QDQ = 1


class VitisQuantFormat(enum.Enum):
    """Deprecated vendor output formats."""

    QDQ = 2
    FixNeuron = 3
    BFPFixNeuron = 4
    MXFixNeuron = 5


class CalibrationMethod(enum.Enum):
    """onnxruntime's calibration methods."""

    MinMax = 0
    Entropy = 1
    Percentile = 2
    Distribution = 3


class PowerOfTwoMethod(enum.Enum):
    """Power-of-two scales (NPU), by range (NonOverflow) or by least squared error (MinMSE)."""

    NonOverflow = 0
    MinMSE = 1


class Int16Method(enum.Enum):
    MinMax = 0


class LayerWiseMethod(enum.Enum):
    LayerWisePercentile = 0


class ExtendedCalibrationMethod(enum.Enum):
    MinMSE = 0


class CalibMethod(enum.Enum):
    """Calibration methods of the QConfig API (QTensorConfig / *Spec)."""

    MinMax = 0
    MinMSE = 1
    Percentile = 2
    Entropy = 3
    LayerwisePercentile = 4
    Distribution = 5


class ScaleType(enum.Enum):
    Float32 = 0
    PowerOf2 = 1
    Int16 = 2


class QuantGranularity(enum.Enum):
    Tensor = 0
    Channel = 1
    Group = 2


#: Every vendor enum, by name (the table lists their members).
ENUMS: dict[str, type[enum.Enum]] = {e.__name__: e for e in (
    QuantType, ExtendedQuantType, VitisQuantType, QuantFormat, ExtendedQuantFormat, VitisQuantFormat,
    CalibrationMethod, PowerOfTwoMethod, Int16Method, LayerWiseMethod, ExtendedCalibrationMethod,
    CalibMethod, ScaleType, QuantGranularity)}

#: Quantization types with a fixed mixq format (QBFP / QMX depend on BFPAttributes / MXAttributes).
TYPE_FORMATS: dict[str, str] = {
    "QInt8": "int8", "QUInt8": "uint8", "QInt16": "int16", "QUInt16": "uint16", "QInt4": "int4",
    "QUInt4": "uint4", "QInt32": "int32", "QUInt32": "uint32", "QFLOAT8E4M3FN": "fp8_e4m3fn",
    "QFloat16": "fp16", "QBFloat16": "bf16",
}

#: Defaults of the vendor's BFPAttributes / MXAttributes.
BFP_DEFAULTS: dict[str, Any] = {"bfp_method": "to_bfp", "axis": 1, "bit_width": 16, "block_size": 8,
                                "rounding_mode": 2, "sub_block_size": 2, "sub_block_shift_bits": 1,
                                "convert_to_bfloat_before_bfp": 0}
MX_DEFAULTS: dict[str, Any] = {"element_dtype": "int8", "axis": 1, "block_size": 32, "rounding_mode": 2}

#: The BFP attribute sets mixq has formats for: (bfp_method, bit_width, block_size) -> format
#: (to_bfp_prime also needs sub_block_size 2 and sub_block_shift_bits 1, as MX4/6/9 define).
BFP_FORMATS: dict[tuple[str, int, int], str] = {
    ("to_bfp", 16, 8): "bfp16",
    ("to_bfp_prime", 11, 16): "mx4", ("to_bfp_prime", 13, 16): "mx6", ("to_bfp_prime", 16, 16): "mx9",
}
#: MXAttributes element_dtype -> mixq format (block 32, as the OCP MX formats define).
MX_FORMATS: dict[str, str] = {"int8": "mxint8", "fp8_e4m3": "mxfp8_e4m3", "fp8_e5m2": "mxfp8_e5m2",
                              "fp6_e3m2": "mxfp6_e3m2", "fp6_e2m3": "mxfp6_e2m3", "fp4_e2m1": "mxfp4"}


def member_name(value: Any) -> str:
    """'QuantType.QInt8' for an enum member."""
    return f"{type(value).__name__}.{value.name}"


def _check_attrs(kind: str, attrs: Any, defaults: dict[str, Any]) -> dict[str, Any]:
    if attrs is None:
        return dict(defaults)
    if not isinstance(attrs, dict):
        raise ConfigError(f"extra_options['{kind}'] must be a dict of attributes, got {attrs!r}.")
    out = dict(defaults)
    for k, v in attrs.items():
        if k not in defaults:
            raise ConfigError(f"unknown {kind} key {k!r}." + did_you_mean(k, defaults)
                              + f" Keys: {', '.join(defaults)}.")
        if k in ("bfp_method", "element_dtype"):
            if not isinstance(v, str):
                raise ConfigError(f"{kind}['{k}']={v!r} must be a string.")
        elif isinstance(v, bool) or not isinstance(v, int):
            raise ConfigError(f"{kind}['{k}']={v!r} must be an integer.")
        out[k] = v
    return out


#: Where mixq's block formats put their blocks, said wherever a block axis is asked for.
BLOCK_AXIS_RULE = ("mixq blocks along the axis each reading op reduces (a Conv's input channels, axis 1; "
                   "a MatMul's or Gemm's K: A's last axis, B's second-to-last)")


def bfp_format(attrs: Any) -> str:
    """The mixq format of QBFP under BFPAttributes `attrs` (None: the vendor's defaults)."""
    a = _check_attrs("BFPAttributes", attrs, BFP_DEFAULTS)
    if a["axis"] != 1:
        raise ConfigError(f"BFPAttributes axis={a['axis']}: unsupported: {BLOCK_AXIS_RULE}; a fixed "
                          "axis is not offered (use the default, 1, or leave it out).")
    if a["rounding_mode"] != 2:
        raise ConfigError(f"BFPAttributes rounding_mode={a['rounding_mode']}: unsupported: mixq's "
                          "block formats round half to even (rounding_mode 2, the default).")
    if a["convert_to_bfloat_before_bfp"]:
        raise ConfigError("BFPAttributes convert_to_bfloat_before_bfp: unsupported: mixq quantizes "
                          "float32 values into the block format directly (remove it).")
    key = (a["bfp_method"], a["bit_width"], a["block_size"])
    fmt = BFP_FORMATS.get(key)
    if fmt is not None and a["bfp_method"] == "to_bfp_prime" and \
            (a["sub_block_size"], a["sub_block_shift_bits"]) != (2, 1):
        fmt = None
    if fmt is None:
        raise ConfigError(f"BFPAttributes {attrs!r}: unsupported: mixq has the block formats "
                          "BFP16 (to_bfp, bit_width 16, block_size 8) and MX4/MX6/MX9 (to_bfp_prime, "
                          "bit_width 11/13/16, block_size 16, sub_block_size 2, sub_block_shift_bits 1); "
                          "use one of these attribute sets.")
    return fmt


def mx_format(attrs: Any) -> str:
    """The mixq format of QMX under MXAttributes `attrs` (None: the vendor's defaults)."""
    a = _check_attrs("MXAttributes", attrs, MX_DEFAULTS)
    if a["element_dtype"] not in MX_FORMATS:
        raise ConfigError(f"MXAttributes element_dtype={a['element_dtype']!r} is not valid; choose one "
                          f"of {', '.join(MX_FORMATS)}." + did_you_mean(a["element_dtype"], MX_FORMATS))
    if a["block_size"] != 32:
        raise ConfigError(f"MXAttributes block_size={a['block_size']}: unsupported: mixq's MX formats "
                          "use the OCP block of 32 elements (use 32).")
    if a["axis"] != 1:
        raise ConfigError(f"MXAttributes axis={a['axis']}: unsupported: {BLOCK_AXIS_RULE}; a fixed "
                          "axis is not offered (use the default, 1, or leave it out).")
    if a["rounding_mode"] != 2:
        raise ConfigError(f"MXAttributes rounding_mode={a['rounding_mode']}: unsupported: mixq rounds "
                          "half to even (rounding_mode 2, the default).")
    return MX_FORMATS[a["element_dtype"]]


def type_format(value: Any, option: str, extra: dict[str, Any] | None = None) -> str:
    """The mixq format of a quantization-type member (QBFP / QMX read BFP/MXAttributes)."""
    if not isinstance(value, (QuantType, ExtendedQuantType, VitisQuantType)):
        raise ConfigError(f"{option}={value!r}: expected a QuantType / ExtendedQuantType member, "
                          "e.g. QuantType.QInt8.")
    extra = extra or {}
    if value.name == "QBFP":
        return bfp_format(extra.get("BFPAttributes"))
    if value.name == "QMX":
        return mx_format(extra.get("MXAttributes"))
    return TYPE_FORMATS[value.name]
