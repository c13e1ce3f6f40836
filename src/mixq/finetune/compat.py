"""The documented `QConfig` vocabulary (data-type specs, layer configs, algorithm list), translated
once into mixq's typed `QuantConfig` plus a fast-finetuning config.

    from mixq.compat import AdaQuantConfig, BFloat16Spec, QConfig, QLayerConfig

    config = QConfig(global_config=QLayerConfig(input_tensors=BFloat16Spec(), weight=BFloat16Spec()),
                     algo_config=[AdaQuantConfig(num_iterations=1000, learning_rate=1e-6)])
    mixq.quantize(model, config, calibration_data)          # runs AdaQuant before the rewrite

`QConfig.to_mixq()` gives the QuantConfig (what `mixq.quantize` uses); `QConfig.finetune_config`
the AdaRound/AdaQuant config it carries (or None). Pure Python: no torch needed to build configs.
Unknown options raise ConfigError with a "did you mean"; nothing is silently ignored.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from ..config import LayerRule, QuantConfig
from ..errors import ConfigError, did_you_mean
from ..formats import get_format
from .config import AdaQuantConfig, AdaRoundConfig, EarlyStop

_CALIB = ("minmax", "percentile", "entropy", "minmse")


class DataTypeSpec:
    """A data type for input tensors, weights, biases or outputs, with its quantization options.

    Options (keyword only; integer and scaled-float formats only, where a scale is calibrated):
    symmetric (bool), per_channel (bool, weights), calibration_method (a
    mixq.compat.CalibrationMethod member or 'minmax' | 'percentile' | 'entropy' | 'minmse').
    Subclasses fix the format (`Int8Spec`, `BFloat16Spec`, `MXFP4Spec` ...)."""

    format: ClassVar[str] = ""
    power_of_two: ClassVar[str | None] = None
    _OPTIONS: ClassVar[tuple[str, ...]] = ("symmetric", "per_channel", "calibration_method")

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
        scaled = fmt.needs_qparams
        clean: dict[str, Any] = {}
        for k, v in options.items():
            if v is None:
                continue
            if not scaled:
                raise ConfigError(f"{name}: option {k}={v!r} does not apply to {fmt.name}, which has "
                                  "no calibrated scale; remove it.")
            if k in ("symmetric", "per_channel"):
                if not isinstance(v, bool):
                    raise ConfigError(f"{name}: {k}={v!r} must be True or False.")
                if k == "symmetric" and fmt.kind == "float" and v is False:
                    raise ConfigError(f"{name}: {fmt.name} is always symmetric; remove symmetric=False.")
                clean[k] = v
            else:
                m = getattr(v, "value", v)
                if not isinstance(m, str) or m.lower() not in _CALIB:
                    raise ConfigError(f"{name}: calibration_method={v!r} must be a CalibrationMethod "
                                      f"or one of {', '.join(_CALIB)}." + did_you_mean(str(m), _CALIB))
                clean[k] = m.lower()
        object.__setattr__(self, "_options", clean)

    def __setattr__(self, key: str, value: Any) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable")

    def option(self, key: str) -> Any:
        """The value given for option `key` (None when not given)."""
        return self._options.get(key)

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other) and self._options == other._options  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash((type(self).__name__, tuple(sorted(self._options.items()))))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in self._options.items())})"


def _spec(cls_name: str, fmt: str, doc: str, pof2: str | None = None) -> type[DataTypeSpec]:
    return type(cls_name, (DataTypeSpec,), {"format": fmt, "power_of_two": pof2, "__doc__": doc,
                                            "__module__": __name__})


Int4Spec = _spec("Int4Spec", "int4", "Signed 4-bit integer.")
UInt4Spec = _spec("UInt4Spec", "uint4", "Unsigned 4-bit integer.")
Int8Spec = _spec("Int8Spec", "int8", "Signed 8-bit integer.")
UInt8Spec = _spec("UInt8Spec", "uint8", "Unsigned 8-bit integer.")
XInt8Spec = _spec("XInt8Spec", "int8", "Signed 8-bit integer with power-of-two scales (NPU).", "minmse")
Int16Spec = _spec("Int16Spec", "int16", "Signed 16-bit integer.")
UInt16Spec = _spec("UInt16Spec", "uint16", "Unsigned 16-bit integer.")
Int32Spec = _spec("Int32Spec", "int32", "Signed 32-bit integer.")
UInt32Spec = _spec("UInt32Spec", "uint32", "Unsigned 32-bit integer.")
BFloat16Spec = _spec("BFloat16Spec", "bf16", "bfloat16 (Cast pairs; no scale).")
Float16Spec = _spec("Float16Spec", "fp16", "IEEE float16 (Cast pairs; no scale).")
FP8E4M3Spec = _spec("FP8E4M3Spec", "fp8_e4m3fn", "Scaled float8 E4M3FN.")
FP8E5M2Spec = _spec("FP8E5M2Spec", "fp8_e5m2", "Scaled float8 E5M2.")
BFP16Spec = _spec("BFP16Spec", "bfp16", "Block floating point, 8 elements share an 8-bit exponent.")
MX4Spec = _spec("MX4Spec", "mx4", "Microexponents MX4.")
MX6Spec = _spec("MX6Spec", "mx6", "Microexponents MX6.")
MX9Spec = _spec("MX9Spec", "mx9", "Microexponents MX9.")
MXINT8Spec = _spec("MXINT8Spec", "mxint8", "OCP MXINT8.")
MXFP8E4M3Spec = _spec("MXFP8E4M3Spec", "mxfp8_e4m3", "OCP MXFP8 E4M3.")
MXFP8E5M2Spec = _spec("MXFP8E5M2Spec", "mxfp8_e5m2", "OCP MXFP8 E5M2.")
MXFP6E3M2Spec = _spec("MXFP6E3M2Spec", "mxfp6_e3m2", "OCP MXFP6 E3M2.")
MXFP6E2M3Spec = _spec("MXFP6E2M3Spec", "mxfp6_e2m3", "OCP MXFP6 E2M3.")
MXFP4Spec = _spec("MXFP4Spec", "mxfp4", "OCP MXFP4 (E2M1 elements).")

SPECS: dict[str, type[DataTypeSpec]] = {c.__name__: c for c in (
    Int4Spec, UInt4Spec, Int8Spec, UInt8Spec, XInt8Spec, Int16Spec, UInt16Spec, Int32Spec, UInt32Spec,
    BFloat16Spec, Float16Spec, FP8E4M3Spec, FP8E5M2Spec, BFP16Spec, MX4Spec, MX6Spec, MX9Spec,
    MXINT8Spec, MXFP8E4M3Spec, MXFP8E5M2Spec, MXFP6E3M2Spec, MXFP6E2M3Spec, MXFP4Spec)}


def _as_spec(value: Any, option: str) -> DataTypeSpec:
    if isinstance(value, DataTypeSpec):
        return value
    if isinstance(value, type) and issubclass(value, DataTypeSpec):
        return value()
    raise ConfigError(f"{option}={value!r} must be a data-type spec such as Int8Spec() or BFloat16Spec() "
                      f"(known: {', '.join(SPECS)}).")


@dataclass(frozen=True)
class QLayerConfig:
    """Data types of one layer's tensors: `input_tensors` (activations), `weight`, optional
    `bias` (Int32Spec: int32 bias; a float spec: float bias) and `output_tensors` (must equal
    the input spec when given: mixq quantizes outputs with the activation format)."""

    input_tensors: Any = None
    weight: Any = None
    bias: Any = None
    output_tensors: Any = None

    def __post_init__(self) -> None:
        if self.input_tensors is None or self.weight is None:
            raise ConfigError("QLayerConfig needs input_tensors= and weight= specs, e.g. "
                              "QLayerConfig(input_tensors=Int8Spec(), weight=Int8Spec()).")
        for opt in ("input_tensors", "weight", "bias", "output_tensors"):
            v = getattr(self, opt)
            if v is not None:
                object.__setattr__(self, opt, _as_spec(v, opt))
        if self.output_tensors is not None and self.output_tensors.format != self.input_tensors.format:
            raise ConfigError(f"output_tensors={self.output_tensors!r} differs from input_tensors="
                              f"{self.input_tensors!r}; mixq quantizes outputs with the activation "
                              "format: drop output_tensors or make it the same spec.")
        if self.bias is not None and self.bias.format not in ("int32", "fp16", "bf16"):
            raise ConfigError(f"bias={self.bias!r}: biases are int32 (Int32Spec()) or kept float; "
                              "use Int32Spec() or leave bias unset.")


@dataclass(frozen=True)
class QConfig:
    """The documented top-level config.

    global_config: a QLayerConfig for every layer. specific_layer_config / layer_type_config:
    ``{spec: [node names]}`` / ``{spec: [op types]}`` for other data types on some layers
    (``None`` as the key excludes them). exclude: node names left float. algo_config: a list
    with at most one AdaRoundConfig / AdaQuantConfig (fast finetuning)."""

    global_config: QLayerConfig | None = None
    specific_layer_config: Mapping[Any, Iterable[str]] | None = None
    layer_type_config: Mapping[Any, Iterable[str]] | None = None
    exclude: Iterable[str] = field(default_factory=tuple)
    algo_config: Iterable[Any] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        if not isinstance(self.global_config, QLayerConfig):
            raise ConfigError("QConfig needs global_config=QLayerConfig(input_tensors=..., weight=...); "
                              f"got {self.global_config!r}.")
        for opt in ("exclude", "algo_config"):
            v = getattr(self, opt)
            if v is None:
                v = ()
            if isinstance(v, (str, bytes)) or not isinstance(v, Iterable):
                raise ConfigError(f"{opt} must be a list, not {v!r}.")
            object.__setattr__(self, opt, tuple(v))
        for a in self.algo_config:
            if not isinstance(a, (AdaRoundConfig, AdaQuantConfig)):
                raise ConfigError(f"algo_config: {type(a).__name__} is not supported; mixq runs "
                                  "AdaRoundConfig and AdaQuantConfig (fast finetuning).")
        if len(self.algo_config) > 1:
            raise ConfigError("algo_config: give at most one of AdaRoundConfig / AdaQuantConfig "
                              f"(got {len(self.algo_config)}).")
        for opt in ("specific_layer_config", "layer_type_config"):
            v = getattr(self, opt)
            if v is None:
                continue
            if not isinstance(v, Mapping):
                raise ConfigError(f"{opt} must be a dict {{spec or None: [names]}}, got {v!r}.")
            clean = {}
            for k, names in v.items():
                if isinstance(names, str) or not isinstance(names, Iterable):
                    raise ConfigError(f"{opt}[{k!r}] must be a list of names, not {names!r}.")
                clean[None if k is None else _as_spec(k, f"{opt} key")] = tuple(names)
            object.__setattr__(self, opt, clean)

    @property
    def finetune_config(self) -> AdaRoundConfig | AdaQuantConfig | None:
        """The fast-finetuning algorithm of `algo_config` (None when there is none)."""
        return self.algo_config[0] if self.algo_config else None

    def to_mixq(self) -> QuantConfig:
        """The typed QuantConfig (the finetune config is `finetune_config`)."""
        g = self.global_config
        act, w = g.input_tensors, g.weight
        changes: dict[str, Any] = {"activation": act.format, "weight": w.format, "name": "compat",
                                   "per_channel": bool(w.option("per_channel") or False)}
        if act.option("symmetric") is not None:
            changes["activation_symmetric"] = act.option("symmetric")
        if w.option("symmetric") is not None:
            changes["weight_symmetric"] = w.option("symmetric")
        if act.option("calibration_method") is not None:
            changes["calibration"] = act.option("calibration_method")
        if act.power_of_two or w.power_of_two:
            changes["power_of_two"] = act.power_of_two or w.power_of_two
            changes["activation_symmetric"] = True
            changes.setdefault("calibration", "minmse")
        if g.bias is not None:
            changes["bias"] = "int32" if g.bias.format == "int32" else "float"
        exclude_nodes = set(self.exclude)
        exclude_ops: set[str] = set()
        rules: list[LayerRule] = []
        for opt, key in (("layer_type_config", "op_types"), ("specific_layer_config", "nodes")):
            for spec, names in (getattr(self, opt) or {}).items():
                if spec is None:
                    (exclude_ops if key == "op_types" else exclude_nodes).update(names)
                elif names:
                    rules.append(LayerRule(**{key: names}, activation=spec.format, weight=spec.format))
        if exclude_nodes:
            changes["exclude_nodes"] = frozenset(exclude_nodes)
        if exclude_ops:
            changes["exclude_op_types"] = frozenset(exclude_ops)
        if rules:
            changes["layer_rules"] = tuple(rules)
        return QuantConfig(**changes)


__all__ = ["AdaQuantConfig", "AdaRoundConfig", "DataTypeSpec", "EarlyStop", "QConfig", "QLayerConfig",
           "SPECS", *SPECS]
