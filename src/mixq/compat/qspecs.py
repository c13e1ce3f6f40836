"""The documented QConfig vocabulary's data types: the data-type specs (`Int8Spec`,
`BFloat16Spec`, `MXFP4Spec`, ...) and `QLayerConfig`, with the vendor's defaults (Int8Spec:
symmetric, float scales, Percentile calibration, per tensor; UInt8Spec / UInt16Spec:
asymmetric; XInt8Spec: power-of-two scales by MinMSE). Plain checked values: the translators
(`mixq.compat.qconfig`, `.amp`, `.presets`) read them; `QConfig`, which translates itself on
creation, lives with its translator in `mixq.compat.qconfig`. Every option changes the result
or raises: see docs/COMPAT.md. Pure Python: no torch needed.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from ..config import LayerRule
from ..errors import ConfigError, did_you_mean
from ..formats import get_format

_CALIB = ("minmax", "percentile", "entropy", "minmse", "layerwisepercentile", "distribution")


def _calib_name(name: str, value: Any) -> str:
    m = getattr(value, "name", value)
    if not isinstance(m, str) or m.lower() not in _CALIB:
        raise ConfigError(f"{name}: calibration_method={value!r} must be a CalibMethod member (or one of "
                          f"{', '.join(_CALIB[:4])})." + did_you_mean(str(m), _CALIB))
    return m.lower()


class DataTypeSpec:
    """A data type for input tensors, weights, biases or outputs, with its quantization options.

    Options (keyword only; integer and scaled-float formats only, where a scale is calibrated):
    symmetric (bool), scale_type (ScaleType: Float32 | PowerOf2), calibration_method (CalibMethod
    or 'minmax' | 'percentile' | 'entropy' | 'minmse'), quant_granularity (QuantGranularity:
    Tensor | Channel), per_channel (bool; mixq's spelling of Channel granularity). Subclasses fix
    the format (`Int8Spec`, `BFloat16Spec`, `MXFP4E2M1Spec` ...) and the vendor's defaults."""

    format: ClassVar[str] = ""
    _options: dict[str, Any]
    default_symmetric: ClassVar[bool] = True
    default_calibration: ClassVar[str] = "minmax"
    default_pof2: ClassVar[bool] = False
    power_of_two: ClassVar[str | None] = None  # kept for callers of the earlier API
    _OPTIONS: ClassVar[tuple[str, ...]] = ("symmetric", "scale_type", "calibration_method",
                                           "quant_granularity", "per_channel")

    def __init__(self, **options: Any) -> None:
        name = type(self).__name__
        if not self.format:
            raise ConfigError("DataTypeSpec is abstract; use a concrete spec such as Int8Spec() "
                              "or BFloat16Spec().")
        for k in options:
            if k not in self._OPTIONS:
                raise ConfigError(f"{name}: unknown option {k!r}." + did_you_mean(k, self._OPTIONS)
                                  + f" Options: {', '.join(self._OPTIONS)}.")
        fmt = get_format(self.format)
        clean: dict[str, Any] = {}
        for k, v in options.items():
            if v is None:
                continue
            if not fmt.needs_qparams:
                raise ConfigError(f"{name}: option {k}={v!r} does not apply to {fmt.name}, which has "
                                  "no calibrated scale; remove it.")
            if k in ("symmetric", "per_channel"):
                if not isinstance(v, bool):
                    raise ConfigError(f"{name}: {k}={v!r} must be True or False.")
                if k == "symmetric" and fmt.kind == "float" and v is False:
                    raise ConfigError(f"{name}: {fmt.name} is always symmetric; remove symmetric=False.")
                clean[k] = v
            elif k == "calibration_method":
                clean[k] = _calib_name(name, v)
            elif k == "scale_type":
                s = getattr(v, "name", None)
                if s not in ("Float32", "PowerOf2", "Int16") or type(v).__name__ != "ScaleType":
                    raise ConfigError(f"{name}: scale_type={v!r} must be a ScaleType member.")
                if s == "Int16":
                    raise ConfigError(f"{name}: scale_type=ScaleType.Int16: unsupported: mixq's scales "
                                      "are float32 or powers of two (use ScaleType.Float32).")
                if s == "PowerOf2" and fmt.kind != "int":
                    raise ConfigError(f"{name}: power-of-two scales apply to integer formats only.")
                clean["pof2"] = s == "PowerOf2"
            else:  # quant_granularity
                g = getattr(v, "name", None)
                if g not in ("Tensor", "Channel", "Group") or type(v).__name__ != "QuantGranularity":
                    raise ConfigError(f"{name}: quant_granularity={v!r} must be a QuantGranularity member.")
                if g == "Group":
                    raise ConfigError(f"{name}: quant_granularity=QuantGranularity.Group: unsupported "
                                      "(unused by the vendor too; use Tensor or Channel).")
                clean["per_channel"] = g == "Channel"
        object.__setattr__(self, "_options", clean)

    def __setattr__(self, key: str, value: Any) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable")

    def option(self, key: str) -> Any:
        """The value given for option `key` (None when not given)."""
        return self._options.get(key)

    # the effective settings (given or the vendor's defaults)
    @property
    def symmetric(self) -> bool:
        v = self._options.get("symmetric")
        return self.default_symmetric if v is None else v

    @property
    def calibration(self) -> str:
        return self._options.get("calibration_method", self.default_calibration)

    @property
    def pof2(self) -> bool:
        return self._options.get("pof2", self.default_pof2)

    @property
    def per_channel(self) -> bool:
        return bool(self._options.get("per_channel", False))

    def settings(self, role: str, given_only: bool = False) -> dict[str, Any]:
        """What a layer rule cannot change: for input tensors symmetry, calibration and
        power-of-two scales; for weights symmetry, power-of-two scales and granularity (weight
        scales come from min/max whatever the calibration method). `given_only`: only the
        options given explicitly."""
        keys = ("symmetric", "calibration", "pof2") if role == "input_tensors" else ("symmetric", "pof2", "per_channel")
        given = {"calibration": "calibration_method"}
        out = {k: getattr(self, k) for k in keys}
        if given_only:
            out = {k: v for k, v in out.items() if given.get(k, k) in self._options}
        return out

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other) and self._options == other._options

    def __hash__(self) -> int:
        return hash((type(self).__name__, tuple(sorted(self._options.items()))))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in self._options.items())})"


def _spec(cls_name: str, fmt: str, doc: str, *, sym: bool = True, calib: str = "minmax",
          pof2: bool = False) -> type[DataTypeSpec]:
    return type(cls_name, (DataTypeSpec,), {
        "format": fmt, "default_symmetric": sym, "default_calibration": calib, "default_pof2": pof2,
        "power_of_two": "minmse" if pof2 else None, "__doc__": doc, "__module__": __name__})


Int4Spec = _spec("Int4Spec", "int4", "Signed 4-bit integer (mixq).", calib="percentile")
UInt4Spec = _spec("UInt4Spec", "uint4", "Unsigned 4-bit integer (mixq).", sym=False, calib="percentile")
Int8Spec = _spec("Int8Spec", "int8", "Signed 8-bit integer: symmetric, Percentile.", calib="percentile")
UInt8Spec = _spec("UInt8Spec", "uint8", "Unsigned 8-bit integer: asymmetric, Percentile.", sym=False,
                  calib="percentile")
XInt8Spec = _spec("XInt8Spec", "int8", "Signed 8-bit integer with power-of-two scales by MinMSE (NPU).",
                  calib="minmse", pof2=True)
Int16Spec = _spec("Int16Spec", "int16", "Signed 16-bit integer: symmetric, Percentile.", calib="percentile")
UInt16Spec = _spec("UInt16Spec", "uint16", "Unsigned 16-bit integer: asymmetric, Percentile.", sym=False,
                   calib="percentile")
Int32Spec = _spec("Int32Spec", "int32", "Signed 32-bit integer (biases).", calib="percentile")
UInt32Spec = _spec("UInt32Spec", "uint32", "Unsigned 32-bit integer.", sym=False, calib="percentile")
BFloat16Spec = _spec("BFloat16Spec", "bf16", "bfloat16 (Cast pairs; no scale).")
Float16Spec = _spec("Float16Spec", "fp16", "IEEE float16 (Cast pairs; no scale).")
FP8E4M3Spec = _spec("FP8E4M3Spec", "fp8_e4m3fn", "Scaled float8 E4M3FN (mixq).")
FP8E5M2Spec = _spec("FP8E5M2Spec", "fp8_e5m2", "Scaled float8 E5M2 (mixq).")
BFP16Spec = _spec("BFP16Spec", "bfp16", "Block floating point, 8 elements share an 8-bit exponent.")
MX4Spec = _spec("MX4Spec", "mx4", "Microexponents MX4.")
MX6Spec = _spec("MX6Spec", "mx6", "Microexponents MX6.")
MX9Spec = _spec("MX9Spec", "mx9", "Microexponents MX9.")
MXINT8Spec = _spec("MXINT8Spec", "mxint8", "OCP MXINT8 (also spelled MXInt8Spec).")
MXFP8E4M3Spec = _spec("MXFP8E4M3Spec", "mxfp8_e4m3", "OCP MXFP8 E4M3.")
MXFP8E5M2Spec = _spec("MXFP8E5M2Spec", "mxfp8_e5m2", "OCP MXFP8 E5M2.")
MXFP6E3M2Spec = _spec("MXFP6E3M2Spec", "mxfp6_e3m2", "OCP MXFP6 E3M2.")
MXFP6E2M3Spec = _spec("MXFP6E2M3Spec", "mxfp6_e2m3", "OCP MXFP6 E2M3.")
MXFP4Spec = _spec("MXFP4Spec", "mxfp4", "OCP MXFP4 (E2M1 elements; also spelled MXFP4E2M1Spec).")

SPECS: dict[str, type[DataTypeSpec]] = {c.__name__: c for c in (
    Int4Spec, UInt4Spec, Int8Spec, UInt8Spec, XInt8Spec, Int16Spec, UInt16Spec, Int32Spec, UInt32Spec,
    BFloat16Spec, Float16Spec, FP8E4M3Spec, FP8E5M2Spec, BFP16Spec, MX4Spec, MX6Spec, MX9Spec,
    MXINT8Spec, MXFP8E4M3Spec, MXFP8E5M2Spec, MXFP6E3M2Spec, MXFP6E2M3Spec, MXFP4Spec)}
#: The vendor's spellings of two of them.
MXInt8Spec = MXINT8Spec
MXFP4E2M1Spec = MXFP4Spec
SPECS.update({"MXInt8Spec": MXINT8Spec, "MXFP4E2M1Spec": MXFP4Spec})


def _as_spec(value: Any, option: str) -> DataTypeSpec:
    if isinstance(value, DataTypeSpec):
        return value
    if isinstance(value, type) and issubclass(value, DataTypeSpec):
        return value()
    raise ConfigError(f"{option}={value!r} must be a data-type spec such as Int8Spec() or BFloat16Spec() "
                      f"(known: {', '.join(SPECS)}).")


@dataclass(frozen=True, init=False)
class QLayerConfig:
    """Data types of one layer's tensors: `input_tensors` (activations; `activation=` is the
    vendor's deprecated alias), `weight`, optional `bias` (Int32Spec: int32 bias; a float spec:
    float bias) and `output_tensors` (must equal the input spec when given: mixq quantizes
    outputs with the activation format)."""

    input_tensors: Any
    weight: Any
    bias: Any
    output_tensors: Any

    def __init__(self, input_tensors: Any = None, weight: Any = None, bias: Any = None,
                 output_tensors: Any = None, *, activation: Any = None) -> None:
        if activation is not None:
            if input_tensors is not None:
                raise ConfigError("QLayerConfig: give input_tensors= or its deprecated alias activation=, "
                                  "not both.")
            input_tensors = activation
        if input_tensors is None or weight is None:
            raise ConfigError("QLayerConfig needs input_tensors= and weight= specs, e.g. "
                              "QLayerConfig(input_tensors=Int8Spec(), weight=Int8Spec()).")
        s = object.__setattr__
        s(self, "input_tensors", _as_spec(input_tensors, "input_tensors"))
        s(self, "weight", _as_spec(weight, "weight"))
        s(self, "bias", None if bias is None else _as_spec(bias, "bias"))
        s(self, "output_tensors", None if output_tensors is None else _as_spec(output_tensors, "output_tensors"))
        if self.output_tensors is not None and self.output_tensors != self.input_tensors:
            raise ConfigError(f"output_tensors={self.output_tensors!r} differs from input_tensors="
                              f"{self.input_tensors!r}; mixq quantizes outputs with the activation "
                              "spec: drop output_tensors or make it the same spec.")
        if self.bias is not None and self.bias.format not in ("int32", "fp16", "bf16"):
            raise ConfigError(f"bias={self.bias!r}: unsupported: biases are int32 (Int32Spec()) or kept "
                              "float in mixq; use Int32Spec() or leave bias unset.")
        if self.input_tensors.per_channel:
            raise ConfigError(f"input_tensors={self.input_tensors!r}: per-channel scales apply to "
                              "weights only (activations are per tensor); remove it.")
        wc = self.weight.option("calibration_method")
        if wc is not None and wc not in ("minmax", "percentile", "minmse"):
            raise ConfigError(f"weight={self.weight!r}: calibration_method={wc}: unsupported for weights: "
                              "mixq's weight ranges are MinMax or MinMSE (per channel with "
                              "QuantGranularity.Channel); use CalibMethod.MinMax or CalibMethod.MinMSE.")


def layer_rule_of(key: Any, global_config: QLayerConfig, opt: str, names: tuple[str, ...],
                  by: str) -> LayerRule:
    """A LayerRule for a specific_layer_config / layer_type_config entry: its formats; any other
    setting must equal the global one (a layer rule changes formats only)."""
    if isinstance(key, QLayerConfig):
        pairs = ((key.input_tensors, global_config.input_tensors, "input_tensors"),
                 (key.weight, global_config.weight, "weight"))
        act, w = key.input_tensors.format, key.weight.format
        if (key.bias is not None and key.bias != global_config.bias) or \
                (key.output_tensors is not None and key.output_tensors != global_config.output_tensors):
            raise ConfigError(f"{opt}: {key!r}: unsupported: a layer's bias / output_tensors spec must "
                              "equal the global config's (mixq's layer rules change formats only).")
    else:
        pairs = ((key, global_config.input_tensors, "input_tensors"), (key, global_config.weight, "weight"))
        act = w = key.format
    explicit = not isinstance(key, QLayerConfig)  # a bare spec (mixq's form): its given options only
    for spec, glob, role in pairs:
        if not (get_format(spec.format).needs_qparams and get_format(glob.format).needs_qparams):
            continue
        mine = spec.settings(role, given_only=explicit)
        theirs = {k: v for k, v in glob.settings(role).items() if k in mine}
        if mine != theirs:
            raise ConfigError(f"{opt}: {spec!r} ({role}): unsupported: its settings {mine} differ from the "
                              f"global {role} spec's {theirs}; mixq's layer rules change formats only "
                              "(give the same options, or set them on global_config).")
    if by == "op_types":
        return LayerRule(op_types=frozenset(names), activation=act, weight=w)
    return LayerRule(nodes=names, activation=act, weight=w)


__all__ = ["DataTypeSpec", "QLayerConfig", "SPECS", "layer_rule_of", "Int4Spec", "UInt4Spec", "Int8Spec", "UInt8Spec", "XInt8Spec", "Int16Spec", "UInt16Spec", "Int32Spec", "UInt32Spec", "BFloat16Spec", "Float16Spec", "FP8E4M3Spec", "FP8E5M2Spec", "BFP16Spec", "MX4Spec", "MX6Spec", "MX9Spec", "MXINT8Spec", "MXFP8E4M3Spec", "MXFP8E5M2Spec", "MXFP6E3M2Spec", "MXFP6E2M3Spec", "MXFP4Spec", "MXInt8Spec", "MXFP4E2M1Spec"]
