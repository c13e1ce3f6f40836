"""THE translation table of the documented vocabulary: every enum member, config field,
`extra_options` key (with the nested AutoMixprecision, FastFinetune, BFPAttributes and
MXAttributes dicts), QConfig / spec / algorithm option and preset name, with what it becomes in
mixq or why it is unsupported. The translators (`translate_legacy`, `translate_extra`,
`finetune_from_vendor`) read their checks and actions from here, `docs/COMPAT.md` is generated
from it (`python -m mixq.compat.doc`), and the tests walk it (one case per entry).

An entry is one of
- kind "maps": the value is checked (`check`) and applied (`apply`, or `field`: that
  QuantConfig field);
- kind "unsupported": only the values in `accept` (what mixq does anyway) pass; any other
  value raises "unsupported: <why> (<instead>)".
`example` is a value that shows the entry's effect, `effect` that effect (attribute paths of the
Translation: 'config.percentile', 'finetune.seed', ...), checked by the tests.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..config import LayerRule
from ..errors import ConfigError, did_you_mean
from . import checks as C
from .enums import (BLOCK_AXIS_RULE, ENUMS, CalibMethod, CalibrationMethod, ExtendedCalibrationMethod,
                    ExtendedQuantFormat, ExtendedQuantType, Int16Method, LayerWiseMethod, PowerOfTwoMethod, QuantFormat,
                    QuantType, VitisQuantFormat, VitisQuantType, type_format)

_UNSET = object()


@dataclass
class Ctx:
    """What a translation accumulates: QuantConfig fields, the finetune and auto-mixed-precision
    requests, and the options of the run itself."""

    changes: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    finetune: dict[str, Any] | None = None       # vendor FastFinetune keys
    amp: dict[str, Any] | None = None             # vendor AutoMixprecision keys
    calib_samples: int | None = None
    print_summary: bool = True
    ignore_warnings: bool = True
    op_types: set[str] = field(default_factory=set)       # op types named anywhere (checked on the model)
    node_names: set[str] = field(default_factory=set)     # node names named anywhere
    flags: dict[str, Any] = field(default_factory=dict)   # include_* and specific_tensor_precision


@dataclass(frozen=True)
class Entry:
    """One documented name and what mixq does with it."""

    scope: str
    name: str
    kind: str                      # "maps" | "unsupported"
    mixq: str                      # the doc text: the mixq meaning, or the reason and the remedy
    check: Callable[[str, Any], Any] = C.anything
    apply: Callable[[Ctx, Any], None] | None = None
    field: str | None = None       # shorthand apply: ctx.changes[field] = value
    default: Any = _UNSET          # the vendor default (accepted; does not change the result)
    accept: tuple[Any, ...] = ()   # unsupported entries: values that are what mixq does anyway
    example: Any = _UNSET
    effect: dict[str, Any] | None = None
    alias: str | None = None       # the snake_case argument name of the same option (algo configs)

    def run(self, ctx: Ctx, value: Any, label: str) -> None:
        """Check `value` (the option called `label` in messages) and apply it to `ctx`, or raise
        the unsupported error."""
        if self.kind == "unsupported":
            if _same(value, self.default) or any(_same(value, a) for a in self.accept):
                return
            raise ConfigError(f"{label}={_short(value)}: unsupported: {self.mixq}")
        v = self.check(label, value)
        if self.apply is not None:
            self.apply(ctx, v)
        elif self.field is not None:
            ctx.changes[self.field] = v


def _same(a: Any, b: Any) -> bool:
    """Whether `a` is the value `b` (booleans are not numbers; lists equal tuples)."""
    if b is _UNSET or isinstance(a, bool) != isinstance(b, bool):
        return False
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return list(a) == list(b)
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    try:
        return type(a) is type(b) and bool(a == b)
    except Exception:  # noqa: BLE001 - arbitrary user objects
        return False


def _short(v: Any) -> str:
    r = repr(v)
    return r if len(r) < 80 else r[:77] + "..."


# --------------------------------------------------------------------------------------------
# actions
# --------------------------------------------------------------------------------------------
def _set(name: str, value: Any) -> Callable[[Ctx, Any], None]:
    def act(ctx: Ctx, _v: Any) -> None:
        ctx.changes[name] = value
    return act


def _calibrate(ctx: Ctx, m: Any) -> None:
    if isinstance(m, PowerOfTwoMethod):
        ctx.changes["power_of_two"] = "minmse" if m is PowerOfTwoMethod.MinMSE else "nonoverflow"
        ctx.changes["calibration"] = "minmse" if m is PowerOfTwoMethod.MinMSE else "minmax"
    elif m is CalibrationMethod.Distribution or m is LayerWiseMethod.LayerWisePercentile:
        raise ConfigError(f"calibrate_method={m}: unsupported: mixq calibrates by minmax, percentile, "
                          "entropy or minmse (use CalibrationMethod.Percentile).")
    elif m is ExtendedCalibrationMethod.MinMSE:
        ctx.changes["calibration"] = "minmse"
    elif m is Int16Method.MinMax:
        ctx.changes["calibration"] = "minmax"
    else:
        ctx.changes["calibration"] = {"MinMax": "minmax", "Entropy": "entropy",
                                      "Percentile": "percentile"}[m.name]


def _quant_format(ctx: Ctx, f: Any) -> None:
    if f.name == "QOperator":
        raise ConfigError(f"quant_format={f}: unsupported: QOperator models run only on the kernels "
                          "onnxruntime has for them; mixq writes QDQ models (use QuantFormat.QDQ).")
    if f is VitisQuantFormat.FixNeuron:
        raise ConfigError("quant_format=VitisQuantFormat.FixNeuron: unsupported: FixNeuron is a custom op "
                          "that needs the vendor's library; mixq writes standard QuantizeLinear/"
                          "DequantizeLinear pairs that stock onnxruntime runs (use QuantFormat.QDQ).")
    if f in (VitisQuantFormat.BFPFixNeuron, VitisQuantFormat.MXFixNeuron):
        # the vendor forces QBFP / QMX for activations and weights with these formats
        ctx.flags["force_type"] = ExtendedQuantType.QBFP if f is VitisQuantFormat.BFPFixNeuron else ExtendedQuantType.QMX


def _npu_cnn(ctx: Ctx, on: bool) -> None:
    if on:
        ctx.flags["npu_cnn"] = True


def _op_types(ctx: Ctx, v: tuple[str, ...]) -> None:
    ctx.op_types.update(v)
    if v:
        ctx.changes["op_types"] = frozenset(v) | ctx.changes.get("op_types", frozenset())


def _extra_op_types(ctx: Ctx, v: tuple[str, ...]) -> None:
    ctx.op_types.update(v)
    if v:
        ctx.flags["extra_op_types"] = frozenset(v)


def _exclude_nodes(ctx: Ctx, v: tuple[str, ...]) -> None:
    ctx.node_names.update(v)
    if v:
        ctx.changes["exclude_nodes"] = frozenset(v) | ctx.changes.get("exclude_nodes", frozenset())


def _flag(name: str) -> Callable[[Ctx, Any], None]:
    def act(ctx: Ctx, v: Any) -> None:
        ctx.flags[name] = v
    return act


def _print_summary(ctx: Ctx, v: bool) -> None:
    ctx.print_summary = v


def _ignore_warnings(ctx: Ctx, v: bool) -> None:
    ctx.ignore_warnings = v


def _calib_size(ctx: Ctx, v: int) -> None:
    ctx.calib_samples = v


def _bias_float_if_false(ctx: Ctx, v: bool) -> None:
    if not v:
        ctx.changes["bias"] = "float"


def _int32_bias(ctx: Ctx, v: bool) -> None:
    if not v:
        raise ConfigError("extra_options['Int32Bias']=False: unsupported: a bias quantized to the "
                          "weight type loses the accumulator precision; mixq quantizes biases to int32 "
                          "or keeps them float (use QuantizeBias=False for float biases).")


def _concat(ctx: Ctx, v: bool) -> None:
    ctx.changes["share_concat_scales"] = v


def _fold_relu(ctx: Ctx, v: bool) -> None:
    ctx.changes["fuse_activations"] = v


def _all_op_types(ctx: Ctx, v: bool) -> None:
    if v:
        ctx.flags["all_op_types"] = True


def _percentile(ctx: Ctx, v: float) -> None:
    ctx.changes["percentile"] = v


def _mixed_tensors(ctx: Ctx, v: Any) -> None:
    ctx.flags["mixed_precision_tensor"] = v


def _fast_ft(ctx: Ctx, v: dict) -> None:
    ctx.finetune = dict(v)


def _amp(ctx: Ctx, v: dict) -> None:
    ctx.amp = dict(v)


def _npu_flag(ctx: Ctx, v: bool) -> None:
    if v:
        ctx.flags["npu_cnn"] = True


def _dual(ctx: Ctx, v: bool) -> None:
    ctx.changes["dual_quant_nodes"] = v


# --------------------------------------------------------------------------------------------
# QuantizationConfig (legacy) fields
# --------------------------------------------------------------------------------------------
_TYPES = (QuantType, ExtendedQuantType, VitisQuantType)
_CALIBS = (CalibrationMethod, PowerOfTwoMethod, Int16Method, LayerWiseMethod, ExtendedCalibrationMethod)
_NOT_FOR = "mixq runs no such step"

QC = "QuantizationConfig"
QUANTIZATION_CONFIG: list[Entry] = [
    Entry(QC, "calibrate_method", "maps", "`calibration` (MinMax/Entropy/Percentile; PowerOfTwoMethod.X: "
          "power-of-two scales by X; ExtendedCalibrationMethod.MinMSE: minmse; Int16Method.MinMax: minmax, "
          "float scales); Distribution and LayerWisePercentile raise, and so does Entropy on grids wider than 8 bits "
          "(its KL search would need 120 GiB at int16: use Percentile or MinMSE there)", C.member(*_CALIBS), _calibrate,
          default=CalibrationMethod.MinMax, example=CalibrationMethod.Percentile,
          effect={"config.calibration": "percentile"}),
    Entry(QC, "quant_format", "maps", "QDQ (every QDQ spelling); BFPFixNeuron/MXFixNeuron force QBFP/QMX "
          "for both types as the vendor does; QOperator and FixNeuron raise (custom op / no stock kernels)",
          C.member(QuantFormat, ExtendedQuantFormat, VitisQuantFormat), _quant_format,
          default=QuantFormat.QDQ, example=VitisQuantFormat.BFPFixNeuron,
          effect={"config.activation": "bfp16", "config.weight": "bfp16"}),
    Entry(QC, "activation_type", "maps", "`activation` format (QBFP/QMX: by BFPAttributes/MXAttributes)",
          C.member(*_TYPES), _flag("activation_type"), default=QuantType.QInt8,
          example=ExtendedQuantType.QInt16, effect={"config.activation": "int16"}),
    Entry(QC, "weight_type", "maps", "`weight` format (QBFP/QMX: by BFPAttributes/MXAttributes)",
          C.member(*_TYPES), _flag("weight_type"), default=QuantType.QInt8,
          example=QuantType.QUInt8, effect={"config.weight": "uint8"}),
    Entry(QC, "input_nodes", "unsupported", "mixq has no start nodes: the whole graph is quantized "
          "(list the nodes to keep float in nodes_to_exclude)", C.names, default=[], accept=((),),
          example=["conv1"]),
    Entry(QC, "output_nodes", "unsupported", "mixq has no end nodes: the whole graph is quantized "
          "(list the nodes to keep float in nodes_to_exclude)", C.names, default=[], accept=((),),
          example=["fc"]),
    Entry(QC, "op_types_to_quantize", "maps", "`op_types` (checked against the ONNX op set at quantize time)",
          C.names, _op_types, default=[], example=["Conv", "MatMul"],
          effect={"config.op_types": frozenset({"Conv", "MatMul"})}),
    Entry(QC, "nodes_to_quantize", "unsupported", "mixq selects nodes by op type and exclusion "
          "(use op_types_to_quantize and nodes_to_exclude)", C.names, default=[], accept=((),),
          example=["conv1"]),
    Entry(QC, "extra_op_types_to_quantize", "maps", "added to `op_types` when op_types_to_quantize is "
          "given (mixq quantizes every op type it knows otherwise); checked against the ONNX op set",
          C.names, _extra_op_types, default=[], example=["Relu"],
          effect={"flags.extra_op_types": frozenset({"Relu"})}),
    Entry(QC, "nodes_to_exclude", "maps", "`exclude_nodes` (checked against the model's node names; a node named there is never "
          "folded away in preparation, and an fnmatch pattern excludes every node it matches)",
          C.names, _exclude_nodes, default=[], example=["conv1"],
          effect={"config.exclude_nodes": frozenset({"conv1"})}),
    Entry(QC, "subgraphs_to_exclude", "unsupported", "mixq excludes nodes, not subgraphs (list the "
          "subgraph's nodes in nodes_to_exclude)", C.anything, default=[], accept=((),),
          example=[(["a"], ["b"])]),
    Entry(QC, "specific_tensor_precision", "maps", "enables MixedPrecisionTensor (`tensor_formats`); "
          "True without it, or MixedPrecisionTensor without it, raise", C.boolean,
          _flag("specific_tensor_precision"), default=False, example=True,
          effect={"error": "MixedPrecisionTensor"}),
    Entry(QC, "execution_providers", "unsupported", "mixq calibrates with onnxruntime's "
          "CPUExecutionProvider (remove the option)", C.names, default=["CPUExecutionProvider"],
          example=["CUDAExecutionProvider"]),
    Entry(QC, "per_channel", "maps", "`per_channel` (per-output-channel weight scales)", C.boolean,
          field="per_channel", default=False, example=True, effect={"config.per_channel": True}),
    Entry(QC, "reduce_range", "maps", "`reduce_range` (7-bit int8 weights)", C.boolean, field="reduce_range",
          default=False, example=True, effect={"config.reduce_range": True}),
    Entry(QC, "optimize_model", "unsupported", "mixq always prepares the graph its own way (BatchNorm and "
          "Pad folding, shape inference) and cannot skip it (remove optimize_model)", C.boolean,
          default=True, example=False),
    Entry(QC, "use_dynamic_quant", "unsupported", "mixq quantizes statically with calibrated ranges "
          "(use a static config and calibration data)", C.boolean, default=False, example=True),
    Entry(QC, "use_external_data_format", "unsupported", "mixq writes external data itself when the "
          "model exceeds 2 GB (remove the option)", C.boolean, default=False, example=True),
    Entry(QC, "convert_fp16_to_fp32", "unsupported", "mixq always computes a float16 model in float32 "
          "between its quantize nodes, keeping the model's float16 inputs and outputs (remove the "
          "option)", C.boolean, default=False, example=True),
    Entry(QC, "convert_nchw_to_nhwc", "unsupported", "mixq keeps the model's layout (transpose the "
          "model before quantizing)", C.boolean, default=False, example=True),
    Entry(QC, "include_sq", "unsupported", "SmoothQuant is not implemented: it moves activation "
          "outliers of LLM MatMuls into the weights (use 16-bit activations, e.g. activation_type="
          "ExtendedQuantType.QInt16, or AutoMixprecision)", C.boolean, default=False, example=True),
    Entry(QC, "include_rotation", "unsupported", "QuaRot rotations are not implemented (use 16-bit "
          "activations or AutoMixprecision)", C.boolean, default=False, example=True),
    Entry(QC, "include_cle", "maps", "cross-layer equalization of Conv -> [Relu] -> Conv pairs before "
          "quantizing (mixq.compat.cle; the float function is unchanged). True is the vendor's default, kept: "
          "ModelQuantizer runs it (mixq.quantize refuses a config that asks for it: set include_cle=False "
          "there). False (and a QConfig without CLEConfig) also turns off mixq's own equalization of the "
          "pairs one activation grid cannot hold (QuantConfig.equalize=False)", C.boolean, _flag("cle"), default=True, example=False,
          effect={"flags.cle": False}),
    Entry(QC, "include_auto_mp", "maps", "True runs the AutoMixprecision options (which must be given); "
          "False with AutoMixprecision raises; left unset, AutoMixprecision runs when given (as the "
          "documented L2 snippet writes it)", C.optional(C.boolean), _flag("include_auto_mp"),
          default=None, example=True, effect={"error": "AutoMixprecision"}),
    Entry(QC, "include_fast_ft", "maps", "True runs fast finetuning with the FastFinetune options "
          "(defaults: AdaRound); False with FastFinetune raises", C.optional(C.boolean),
          _flag("include_fast_ft"), default=None, example=True, effect={"finetune.algorithm": "adaround"}),
    Entry(QC, "enable_npu_cnn", "maps", "power-of-two scales (`power_of_two`, minmse unless "
          "calibrate_method is a PowerOfTwoMethod), symmetric activations, `share_concat_scales`; per-tensor "
          "weights required (per_channel=True raises, as the vendor's NPU CNN constraints)", C.boolean,
          _npu_cnn, default=False, example=True,
          effect={"config.power_of_two": "minmse", "config.share_concat_scales": True,
                  "config.activation_symmetric": True}),
    Entry(QC, "enable_npu_transformer", "unsupported", "the vendor's NPU transformer quantizer graph "
          "constraints are not implemented (use the A8W8 / A16W8 settings without it)", C.boolean,
          default=False, example=True),
    Entry(QC, "debug_mode", "unsupported", "no debug mode (inspect result.summary() and the plan)",
          C.boolean, default=False, example=True),
    Entry(QC, "crypto_mode", "unsupported", "mixq keeps no encrypted models (remove the option)",
          C.boolean, default=False, example=True),
    Entry(QC, "print_summary", "maps", "ModelQuantizer prints result.summary() after quantizing "
          "(False: it prints nothing)", C.boolean, _print_summary, default=True, example=False,
          effect={"print_summary": False}),
    Entry(QC, "ignore_warnings", "maps", "False: ModelQuantizer raises result.warnings as Python "
          "warnings (True: they stay in result.warnings)", C.boolean, _ignore_warnings, default=True,
          example=False, effect={"ignore_warnings": False}),
    Entry(QC, "log_severity_level", "unsupported", "deprecated by the vendor and without effect there "
          "(remove it)", C.anything, default=None, example=1),
    Entry(QC, "extra_options", "maps", "a dict of the keys below; unknown keys raise with a suggestion",
          C.mapping, None, default={}, example={"Percentile": 99.9},
          effect={"config.percentile": 99.9}),
]


# --------------------------------------------------------------------------------------------
# extra_options keys
# --------------------------------------------------------------------------------------------
EO = "extra_options"


def _u(name: str, why: str, *, accept: tuple[Any, ...] = (), example: Any = True) -> Entry:
    return Entry(EO, name, "unsupported", why, accept=accept, example=example)


_PRE = "the vendor's graph pre-processing step; mixq's prepare pass folds BatchNorm and Pad and infers shapes, nothing else (transform the model before quantizing)"
_NPU = "a DPU/NPU graph rewrite of the vendor's NPU CNN quantizer; mixq writes standard QDQ for stock onnxruntime (remove it)"
_QDQ = "mixq's QDQ rewrite places one Q/DQ pair per tensor and format; this vendor placement option has no counterpart (remove it)"
_CAL = "not a mixq calibration option (mixq calibrates with calibrate_method and Percentile only)"
_INFRA = "an option of the vendor's runtime or tooling; mixq has no counterpart (remove it)"
_LLM = "the vendor's LLM weight-only path (MatMulNBits, GPTQ, ...) is not implemented; use weight_type=QuantType.QInt4 with per_channel=True"

EXTRA_OPTIONS: list[Entry] = [
    # -- what mixq maps -------------------------------------------------------------------------
    Entry(EO, "ActivationSymmetric", "maps", "`activation_symmetric` (QUInt8 + True: zero point 128, as the vendor)",
          C.boolean, field="activation_symmetric", example=True, effect={"config.activation_symmetric": True}),
    Entry(EO, "WeightSymmetric", "maps", "`weight_symmetric`", C.boolean, field="weight_symmetric",
          example=False, effect={"config.weight_symmetric": False}),
    Entry(EO, "Percentile", "maps", "`percentile` (in (50, 100])", C.number(50, 100, lo_open=True),
          _percentile, example=99.9, effect={"config.percentile": 99.9}),
    Entry(EO, "MixedPrecisionTensor", "maps", "`tensor_formats` {type: [tensor names]} (needs "
          "specific_tensor_precision=True; names checked on the model)", C.mapping, _mixed_tensors,
          example={ExtendedQuantType.QInt16: ["x"]}, effect={"error": "specific_tensor_precision"}),
    Entry(EO, "SpecificTensorPrecision", "maps", "same as the field specific_tensor_precision", C.boolean,
          _flag("specific_tensor_precision"), example=True, effect={"error": "MixedPrecisionTensor"}),
    Entry(EO, "AutoMixprecision", "maps", "layer-wise precision (`layer_rules`) or the vendor's "
          "auto mixed-precision walk; keys below", C.mapping, _amp,
          example={"TargetOpType": ["Conv"], "TargetQuantType": ExtendedQuantType.QInt16},
          effect={"config.layer_rules": (LayerRule(op_types=frozenset({"Conv"}), activation="int16", weight="int8"),)}),
    Entry(EO, "FastFinetune", "maps", "fast finetuning options (keys below); used with include_fast_ft=True",
          C.mapping, _fast_ft, example={"NumIterations": 5}, effect={"error": "include_fast_ft"}),
    Entry(EO, "BFPAttributes", "maps", "which block format QBFP is (keys below); given without a QBFP "
          "type it raises", C.mapping, None,
          example={"bfp_method": "to_bfp_prime", "bit_width": 13, "block_size": 16}, effect={"error": "QBFP"}),
    Entry(EO, "MXAttributes", "maps", "which MX format QMX is (keys below); given without a QMX type it "
          "raises", C.mapping, None, example={"element_dtype": "fp4_e2m1"}, effect={"error": "QMX"}),
    Entry(EO, "QuantizeBias", "maps", "False: `bias='float'` (True: int32 biases)", C.boolean,
          _bias_float_if_false, example=False, effect={"config.bias": "float"}),
    Entry(EO, "Int32Bias", "maps", "True: int32 biases (mixq's way); False raises (a bias in the weight "
          "type loses the accumulator's precision)", C.boolean, _int32_bias, example=False,
          effect={"error": "Int32Bias"}),
    Entry(EO, "AlignConcat", "maps", "`share_concat_scales`", C.boolean, _concat, example=True,
          effect={"config.share_concat_scales": True}),
    Entry(EO, "FoldRelu", "maps", "`fuse_activations` (a Relu/Clip after a compute op shares its "
          "quantization, as a folded Relu)", C.boolean, _fold_relu, example=False,
          effect={"config.fuse_activations": False}),
    Entry(EO, "QuantizeAllOpTypes", "maps", "True: every op type mixq knows (`op_types=None`), even when "
          "op_types_to_quantize is given", C.boolean, _all_op_types, example=True,
          effect={"flags.all_op_types": True}),
    Entry(EO, "EnableNPUCnn", "maps", "same as enable_npu_cnn", C.boolean, _npu_flag, example=True,
          effect={"config.power_of_two": "minmse"}),
    Entry(EO, "BiasCorrection", "maps", "`bias_correction` (Conv/Gemm biases absorb the mean error of "
          "their quantized weights)", C.boolean, field="bias_correction", example=True,
          effect={"config.bias_correction": True}),
    Entry(EO, "CalibDataSize", "maps", "ModelQuantizer calibrates on the first N samples of the reader",
          C.number(1, integer=True), _calib_size, example=4, effect={"calib_samples": 4}),
    Entry(EO, "OpTypesToQuantize", "maps", "same as op_types_to_quantize", C.names, _op_types,
          example=["Conv"], effect={"config.op_types": frozenset({"Conv"})}),
    Entry(EO, "ExtraOpTypesToQuantize", "maps", "same as extra_op_types_to_quantize", C.names,
          _extra_op_types, example=["Relu"], effect={"flags.extra_op_types": frozenset({"Relu"})}),
    Entry(EO, "DualQuantNodes", "maps", "`dual_quant_nodes`", C.boolean, _dual, example=True,
          effect={"config.dual_quant_nodes": True}),
    Entry(EO, "PrintSummary", "maps", "same as print_summary", C.boolean, _print_summary, example=False,
          effect={"print_summary": False}),
    Entry(EO, "IgnoreWarnings", "maps", "same as ignore_warnings", C.boolean, _ignore_warnings, example=False,
          effect={"ignore_warnings": False}),
    # -- values that are what mixq does anyway ----------------------------------------------------
    _u("ForceQuantizeNoInputCheck", "False asks the vendor to leave ops with a float input unquantized; "
       "mixq quantizes every op of op_types whatever its producer (True is what mixq does)",
       accept=(True,), example=False),
    _u("AlignSlice", "scale alignment across Slice is an NPU constraint mixq does not apply (False is "
       "what mixq does)", accept=(False,)),
    _u("AlignPool", "scale alignment across pooling is an NPU constraint mixq does not apply (False is "
       "what mixq does)", accept=(False,)),
    _u("AlignPad", "scale alignment across Pad is an NPU constraint mixq does not apply (False is "
       "what mixq does)", accept=(False,)),
    _u("AlignTranspose", "scale alignment across Transpose is an NPU constraint mixq does not apply "
       "(False is what mixq does)", accept=(False,)),
    _u("AlignReshape", "scale alignment across Reshape is an NPU constraint mixq does not apply (False "
       "is what mixq does)", accept=(False,)),
    _u("AlignEltwiseQuantType", "mixq gives element-wise ops the activation type of their config (True "
       "is what mixq does); False has no counterpart", accept=(True,), example=False),
    _u("RemoveQDQConvClip", _QDQ + "; True is what mixq does (a Clip after a Conv shares its Q/DQ, "
       "see FoldRelu)", accept=(True,), example=False),
    _u("RemoveQDQConvRelu", _QDQ + "; True is what mixq does", accept=(True,), example=False),
    _u("RemoveQDQConvLeakyRelu", _QDQ, example=False),
    _u("RemoveQDQConvPRelu", _QDQ, example=False),
    _u("Int16Bias", "biases are int32 or float in mixq (False is what mixq does)", accept=(False,)),
    # -- unsupported ------------------------------------------------------------------------------
    *[_u(k, _PRE) for k in (
        "SkipPreprocess", "ShapeShifterYaml", "PreprocessYAML", "OptimizeModel", "SimplifyModel",
        "SimplifyModelOptions", "ConvertFP16ToFP32", "ConvertNCHWToNHWC", "ConvertOpsetVersion",
        "ConvertBNToConv", "ConvertReduceMeanToGlobalAvgPool", "SplitLargeKernelPool",
        "ConvertSplitToSlice", "ConvertClipToRelu", "FuseInstanceNorm", "FuseL2Norm", "FuseGelu",
        "FuseLayerNorm", "FoldBatchNorm", "ReplaceClip6Relu", "FixShapes", "RemoveInputInit",
        "CopySharedInit", "CopyBiasInit", "QuantizeFP16")],
    _u("NodesToQuantize", "mixq selects nodes by op type and exclusion (use op_types_to_quantize and "
       "nodes_to_exclude)", example=["conv1"]),
    _u("InputNodes", "mixq has no start nodes (use nodes_to_exclude)", example=["conv1"]),
    _u("OutputNodes", "mixq has no end nodes (use nodes_to_exclude)", example=["fc"]),
    _u("WeightsOnly", "mixq quantizes activations and weights (use BF16/FP16 activations with integer "
       "weights for a weight-mostly model)"),
    _u("MatMulConstBOnly", "mixq quantizes every MatMul of op_types (exclude the others with "
       "nodes_to_exclude)"),
    _u("EnableSubgraph", "mixq does not quantize inside If/Loop/Scan bodies (they stay float)"),
    _u("OpTypesToExcludeOutputQuantization", "mixq quantizes the outputs of quantized ops (use "
       "QuantConfig.quantize_outputs=False for none)", example=["Conv"]),
    _u("NodesToExcludeOutputQuantization", "mixq quantizes the outputs of quantized ops (use "
       "QuantConfig.quantize_outputs=False for none)", example=["conv1"]),
    _u("CalibPassthroughOpTypes", _CAL, example=["Reshape"]),
    *[_u(k, _QDQ) for k in (
        "AddQDQPairToWeight", "DedicatedQDQPair", "DedicateDQNode", "EnableDualQuantNodePairs",
        "QDQOpTypePerChannelSupportToAxis", "UseQDQContribOps", "UseQDQVitisCustomOps",
        "RemoveQDQConvGelu", "RemoveQDQMulAdd", "RemoveQDQBetweenOps", "RemoveQDQInstanceNorm",
        "RemoveFusedQDQ")],
    _u("CalibTensorRangeSymmetric", _CAL + " (use ActivationSymmetric)"),
    _u("CalibMovingAverage", "mixq's MinMax takes the range over all samples, not a moving average "
       "(use CalibrationMethod.Percentile to discount outliers)"),
    *[_u(k, _CAL, example=1) for k in (
        "CalibMovingAverageConstant", "NumBins", "NumQuantizedBins", "Scenario", "LWPMetric",
        "PercentileCandidates", "LWPUseHistogram", "MinMSEModePof2Scale", "MinMSEModeFloatScale",
        "CalibOptimizeMem", "WeightCalibrateMethod", "TensorsRangeFile",
        "SaveTensorHistFig", "SaveAndRestore")],
    _u("CalibWorkerNum", "mixq spreads calibration over workers outside the config: "
       "mixq.quantize(..., executor=mixq.distributed.ProcessExecutor(N)) or `mixq quantize "
       "--workers N` / `--ray` (the same bytes as one process)", accept=(1,), example=2),
    _u("UseRandomData", "mixq calibrates on real data only: random inputs give ranges that do not "
       "match the model's use (pass a calibration data reader)"),
    _u("RandomDataReaderInputShape", "mixq calibrates on real data only (pass a data reader)", example=[1, 3]),
    _u("RandomDataReaderInputDataRange", "mixq calibrates on real data only (pass a data reader)", example=[0, 1]),
    _u("UseUnsignedReLU", "mixq keeps the activation type of the config after a Relu (use "
       "activation_type=QuantType.QUInt8 for unsigned activations)"),
    _u("Int16Scale", "mixq's int16 scales are float32 (remove it)"),
    _u("UsePowerOf2Scale", "use calibrate_method=PowerOfTwoMethod.MinMSE / NonOverflow for power-of-two scales"),
    _u("UseFP32Scale", "mixq's scales are float32 already (remove it)"),
    _u("ActivationScaled", "not a mixq option (remove it)"),
    _u("WeightScaled", "not a mixq option (remove it)"),
    _u("AdjustBiasScale", "mixq's int32 bias scale is input scale x weight scale (remove it)"),
    _u("AdjustWeightScaleForInt32Bias", "mixq's int32 bias scale is input scale x weight scale (remove it)"),
    _u("TensorQuantOverrides", "onnxruntime's per-tensor override format is not read (use "
       "MixedPrecisionTensor with specific_tensor_precision=True)", example={"x": [{}]}),
    _u("NodesWithMixedPrecision", "internal to the vendor (use MixedPrecisionTensor or AutoMixprecision)",
       example=["conv1"]),
    *[_u(k, _NPU) for k in (
        "SimulateDPU", "ConvertLeakyReluToDPUVersion", "ConvertSigmoidToHardSigmoid",
        "ConvertHardSigmoidToDPUVersion", "ConvertAvgPoolToDPUVersion", "ConvertClipToDPUVersion",
        "ConvertReduceMeanToDPUVersion", "ConvertSoftmaxToDPUVersion", "ConvertInstanceNormToDPUVersion",
        "NPULimitationCheck", "MaxLoopNum", "AdjustShiftCut", "AdjustShiftBias", "AdjustShiftRead",
        "AdjustShiftWrite", "AdjustShiftSwish", "AdjustHardSigmoid")],
    *[_u(k, "the vendor's BF16 custom-op path; mixq's BF16 is standard Cast pairs (remove it)")
      for k in ("BF16QDQToCast", "EnableVaimlBF16", "BF16WithClip")],
    _u("RefineBlockAxis", f"{BLOCK_AXIS_RULE}, always (remove it)"),
    *[_u(k, _LLM) for k in ("UseMatMulNBits", "UseGPTQ")],
    *[_u(k, _LLM, example={"Bits": 4}) for k in ("MatMulNBitsParams", "GPTQParams")],
    _u("SmoothAlpha", "SmoothQuant is not implemented (see include_sq)", example=0.5),
    *[_u(k, "QuaRot is not implemented (see include_rotation)", example=1)
      for k in ("RMatrixDim", "UseRandomHad", "RConfigPath")],
    Entry(EO, "CLESteps", "maps", "passes of cross-layer equalization (with include_cle)",
          C.number(1, integer=True), _flag("cle_steps"), example=2, effect={"flags.cle_steps": 2}),
    _u("CLEBalanceMethod", "mixq balances by the max of |w| ('max' is what mixq does)", accept=("max",), example="avg"),
    *[_u(k, "mixq equalizes every Conv pair it finds, without thresholds (remove it)", example=0.1) for k in (
        "CLEWeightThreshold", "CLEScaleAppendBias", "CLEScaleUseThreshold", "CLETotalLayerDiffThreshold")],
    *[_u(k, _INFRA, example="x") for k in (
        "ExecutionProviders", "TmpDir", "UserCustomOpLibPath", "EncryptionAlgorithm", "CryptoMode",
        "DebugMode", "EvalMetrics", "EvalDataReader",
        "FillAllValueInfo", "QuantizationPreference")],
]


# --------------------------------------------------------------------------------------------
# AutoMixprecision keys
# --------------------------------------------------------------------------------------------
AM = "AutoMixprecision"
_NEW_AMP = ("the vendor's newer sensitivity engine is not implemented; mixq runs the documented walk "
            "(use L2Target or Top1AccTarget with EvaluateFunction, or mixq.search.auto_quantize)")
AUTO_MIXPRECISION: list[Entry] = [
    Entry(AM, "TargetOpType", "maps", "op types of the layers that take the target precision "
          "(default Conv, ConvTranspose, Gemm, MatMul); checked against the ONNX op set", C.names,
          example=["Conv"], effect={"amp.op_types": frozenset({"Conv"})}),
    Entry(AM, "TargetQuantType", "maps", "the target precision: activations (and weights too for "
          "QBFP/QMX, as the vendor mixes block formats); without a target: a layer rule for TargetOpType",
          C.member(*_TYPES), example=ExtendedQuantType.QInt16, effect={"amp.activation": "int16"}),
    Entry(AM, "ActTargetQuantType", "maps", "the activation format of narrowed layers", C.member(*_TYPES),
          example=QuantType.QUInt8, effect={"amp.activation": "uint8"}),
    Entry(AM, "WeightTargetQuantType", "maps", "the weight format of narrowed layers", C.member(*_TYPES),
          example=QuantType.QUInt8, effect={"amp.weight": "uint8"}),
    Entry(AM, "TargetLayerConfig", "maps", "a QLayerConfig (or {QLayerConfig: [node names]}): the "
          "target precision (its input_tensors and weight specs)", C.anything,
          example="QLayerConfig(Int16Spec, Int16Spec)", effect={"amp.activation": "int16"}),
    Entry(AM, "OutputIndex", "maps", "the output the L2 / EvaluateFunction results are taken from",
          C.number(0, integer=True), example=1, effect={"amp.output_index": 1}),
    Entry(AM, "MetricOutputIndex", "maps", "same as OutputIndex", C.number(0, integer=True), example=1,
          effect={"amp.output_index": 1}),
    Entry(AM, "L2Target", "maps", "walk: narrow layers in ascending sensitivity while the mean over "
          "calibration batches of ||float output - quantized output||_2 (absolute, the vendor's "
          "average_L2) stays <= L2Target", C.number(0, lo_open=True), example=0.5,
          effect={"amp.l2_target": 0.5}),
    Entry(AM, "Top1AccTarget", "maps", "walk: narrow layers while round(EvaluateFunction(float results) "
          "- EvaluateFunction(quantized results), 4) <= Top1AccTarget", C.number(0), example=0.01,
          effect={"amp.top1_target": 0.01}),
    Entry(AM, "EvaluateFunction", "maps", "called as the vendor calls it: with a list, one entry per "
          "calibration batch, of [output OutputIndex] (numpy arrays); returns the accuracy",
          C.callable_, example=len, effect={"amp.evaluate_function": len}),
    Entry(AM, "NumTarget", "maps", "walk: narrow the NumTarget least sensitive layers",
          C.number(0, integer=True), example=2, effect={"amp.num_target": 2}),
    Entry(AM, "TargetTensors", "maps", "these tensors take the target precision (`tensor_formats`)",
          C.names, example=["x"], effect={"amp.target_tensors": ("x",)}),
    Entry(AM, "DataSize", "maps", "the walk evaluates the first DataSize + 1 batches (the vendor's count)",
          C.number(0, integer=True), example=3, effect={"amp.data_size": 3}),
    Entry(AM, "NoInputQDQShared", "maps", "True (default): the walk skips layers whose input feeds other "
          "nodes too, as the vendor", C.boolean, example=False, effect={"amp.no_shared": False}),
    Entry(AM, "DualQuantNodes", "maps", "`dual_quant_nodes`", C.boolean, example=True,
          effect={"config.dual_quant_nodes": True}),
    Entry(AM, "IncludeLayers", "maps", "only these nodes are candidate layers (names checked on the model)",
          C.names, example=["conv1"], effect={"amp.include": ("conv1",)}),
    Entry(AM, "ExcludeLayers", "maps", "these nodes are never narrowed (names checked on the model)",
          C.names, example=["conv1"], effect={"amp.exclude": ("conv1",)}),
    Entry(AM, "BiasTargetQuantType", "unsupported", "mixq's biases follow QuantizeBias (int32 or float)",
          example=ExtendedQuantType.QInt32),
    Entry(AM, "TargetIndices", "unsupported", "module indices depend on the vendor's subgraph split "
          "(use IncludeLayers with node names)", example=[0]),
    Entry(AM, "ExcludeIndices", "unsupported", "module indices depend on the vendor's subgraph split "
          "(use ExcludeLayers with node names)", example=[0]),
    Entry(AM, "AutoMixUseFastFT", "unsupported", "finetuning inside the walk is not implemented (use "
          "include_fast_ft: it finetunes the chosen model)", accept=(False,)),
    Entry(AM, "MetricDefault", "unsupported", _NEW_AMP + "; 'l2' is what L2Target measures",
          accept=("l2",), example="kl"),
    *[Entry(AM, k, "unsupported", _NEW_AMP, example=1) for k in (
        "SubgraphJson", "MetricDistanceFn", "MetricEvaluateFn", "MetricThreshold", "MetricOptimizeObject",
        "SensitivityCacheFile", "SharedParamMode")],
    Entry(AM, "WorkerNum", "unsupported", "the documented walk runs in one process; mixq's search "
          "runs on workers: mixq.search.auto_quantize(..., executor=mixq.distributed."
          "ProcessExecutor(N)) or `mixq auto --workers N` / `--ray` (the same result as one "
          "process)", default=1, example=2),
]


# --------------------------------------------------------------------------------------------
# FastFinetune keys (and the AdaRoundConfig / AdaQuantConfig arguments of the same names)
# --------------------------------------------------------------------------------------------
FF = "FastFinetune"
_FT_PERF = "a resource option of the vendor's trainer; mixq finetunes on CPU, one layer at a time, with a bounded cache (max_cache_mb) (remove it)"
VENDOR_FT_OPS = ("Conv", "ConvTranspose", "Gemm", "MatMul", "InstanceNormalization", "LayerNormalization")
FAST_FINETUNE: list[Entry] = [
    Entry(FF, "OptimAlgorithm", "maps", "'adaround' -> mixq AdaRoundConfig, 'adaquant' -> AdaQuantConfig",
          C.choice("adaround", "adaquant"), default="adaround", example="adaquant",
          effect={"finetune.algorithm": "adaquant"}),
    Entry(FF, "FixedSeed", "maps", "`seed`", C.number(0, integer=True), default=1705472343, example=7,
          effect={"finetune.seed": 7}, alias="fixed_seed"),
    Entry(FF, "DataSize", "maps", "`max_samples` (the vendor default 1e9: all samples)",
          C.number(1), default=1e9, example=16, effect={"finetune.max_samples": 16}, alias="data_size"),
    Entry(FF, "BatchSize", "maps", "`batch_size`", C.number(1, integer=True), default=1, example=4,
          effect={"finetune.batch_size": 4}, alias="batch_size"),
    Entry(FF, "NumIterations", "maps", "`num_iterations` (defaults: AdaRound 1000, AdaQuant 3000)",
          C.number(0, integer=True), example=5, effect={"finetune.num_iterations": 5}, alias="num_iterations"),
    Entry(FF, "LearningRate", "maps", "`learning_rate` (defaults: AdaRound 0.1, AdaQuant 1e-5)",
          C.number(0, lo_open=True), example=0.5, effect={"finetune.learning_rate": 0.5}, alias="learning_rate"),
    Entry(FF, "EarlyStop", "maps", "`early_stop` (True: mixq's EarlyStop(): patience 3, checked every 50 "
          "iterations)", C.boolean, default=False, example=True, effect={"finetune.early_stop.patience": 3},
          alias="early_stop"),
    Entry(FF, "OutputIndex", "maps", "`output_index` (the output of the report's metric)",
          C.number(0, integer=True), default=0, example=1, effect={"finetune.output_index": 1},
          alias="output_index"),
    Entry(FF, "TargetOpType", "maps", "`op_types` (mixq finetunes Conv, ConvTranspose, Gemm, MatMul; the "
          "vendor default list, which adds the norms, means those four)", C.names, example=["Conv"],
          effect={"finetune.op_types": frozenset({"Conv"})}, alias="target_op_type"),
    Entry(FF, "UpdateBias", "maps", "AdaQuant `update_bias` (AdaRound learns the rounding only: True "
          "raises)", C.boolean, example=False, effect={"finetune.update_bias": False}, alias="update_bias"),
    Entry(FF, "RegParam", "maps", "AdaRound `reg_param`", C.number(0), default=0.01, example=0.05,
          effect={"finetune.reg_param": 0.05}, alias="reg_param"),
    Entry(FF, "BetaRange", "maps", "AdaRound `beta_range`", C.pair, default=(20, 2), example=(10, 2),
          effect={"finetune.beta_range": (10.0, 2.0)}, alias="beta_range"),
    Entry(FF, "WarmStart", "maps", "AdaRound `warm_start`", C.number(0, 1), default=0.2, example=0.1,
          effect={"finetune.warm_start": 0.1}, alias="warm_start"),
    Entry(FF, "OptimDevice", "unsupported", "mixq finetunes with torch on the CPU ('cpu' is what mixq does)",
          default="cpu", example="cuda:0", alias="optim_device"),
    Entry(FF, "InferDevice", "unsupported", "mixq runs onnxruntime on the CPU ('cpu' is what mixq does)",
          default="cpu", example="cuda:0", alias="infer_device"),
    Entry(FF, "NumBatches", "unsupported", "mixq draws one batch per step (1 is what mixq does)",
          default=1, example=2, alias="num_batches"),
    Entry(FF, "LRAdjust", "unsupported", "mixq keeps the learning rate constant (remove it)",
          default=None, accept=((),), example=(0.5, 100), alias="lr_adjust"),
    Entry(FF, "SelectiveUpdate", "unsupported", "mixq keeps a layer's finetuned weights only where they beat "
          "the plain ones on cached rows held out of the fit, and none where the model's output loses (choose "
          "layers with include_layers / exclude_layers of mixq's configs)", default=False, example=True,
          alias="selective_update"),
    Entry(FF, "OutputQDQ", "unsupported", "mixq's layer targets are the float outputs (False is what mixq "
          "does)", default=False, example=True, alias="output_qdq"),
    Entry(FF, "DropRatio", "unsupported", "mixq feeds quantized layer inputs (1.0 is what mixq does)",
          default=1.0, example=0.5, alias="drop_ratio"),
    Entry(FF, "RefModelPath", "unsupported", "the float model is the reference in mixq", default=None,
          example="ref.onnx", alias="ref_model_path"),
    Entry(FF, "DynamicBatch", "unsupported", _FT_PERF, default=False, example=True, alias="dynamic_batch"),
    Entry(FF, "Parallel", "unsupported", _FT_PERF, default=False, example=True, alias="parallel"),
    Entry(FF, "MemOptLevel", "unsupported", _FT_PERF, default=1, example=2, alias="mem_opt_level"),
    Entry(FF, "CacheDir", "unsupported", _FT_PERF, default=None, example="/tmp/c", alias="cache_dir"),
    Entry(FF, "SelectMaxMemLayer", "unsupported", _FT_PERF, default=False, example=True,
          alias="select_max_mem_layer"),
    Entry(FF, "NumWorkers", "unsupported", _FT_PERF, default=1, example=2, alias="num_workers"),
    Entry(FF, "PinMemory", "unsupported", _FT_PERF, default=False, example=True, alias="pin_memory"),
    Entry(FF, "UseGDS", "unsupported", _FT_PERF, default=False, example=True, alias="use_gds"),
    Entry(FF, "LogPeriod", "unsupported", "mixq logs per layer with verbose=True (remove it)",
          default=100, example=10, alias="log_period"),
]


# --------------------------------------------------------------------------------------------
# BFPAttributes / MXAttributes (read by enums.bfp_format / mx_format)
# --------------------------------------------------------------------------------------------
BFP_MX: list[Entry] = [
    Entry("BFPAttributes", "bfp_method", "maps", "'to_bfp' (BFP16) or 'to_bfp_prime' (MX4/6/9)",
          example={"bfp_method": "to_bfp_prime", "bit_width": 11, "block_size": 16},
          effect={"config.activation": "mx4"}),
    Entry("BFPAttributes", "bit_width", "maps", "16 (BFP16); 11 / 13 / 16 with to_bfp_prime: MX4 / MX6 / MX9",
          example={"bfp_method": "to_bfp_prime", "bit_width": 13, "block_size": 16},
          effect={"config.activation": "mx6"}),
    Entry("BFPAttributes", "block_size", "maps", "8 (BFP16) or 16 (MX4/6/9); other sizes raise",
          example={"block_size": 4}, effect={"error": "unsupported"}),
    Entry("BFPAttributes", "sub_block_size", "maps", "2 with to_bfp_prime (other values raise)",
          example={"bfp_method": "to_bfp_prime", "bit_width": 16, "block_size": 16, "sub_block_size": 4},
          effect={"error": "unsupported"}),
    Entry("BFPAttributes", "sub_block_shift_bits", "maps", "1 with to_bfp_prime (other values raise)",
          example={"bfp_method": "to_bfp_prime", "bit_width": 16, "block_size": 16, "sub_block_shift_bits": 2},
          effect={"error": "unsupported"}),
    Entry("BFPAttributes", "axis", "unsupported", f"{BLOCK_AXIS_RULE} (1, the default, is accepted)",
          default=1, example={"axis": 0}),
    Entry("BFPAttributes", "rounding_mode", "unsupported", "mixq rounds half to even (2 is what mixq does)",
          default=2, example={"rounding_mode": 0}),
    Entry("BFPAttributes", "convert_to_bfloat_before_bfp", "unsupported", "mixq quantizes float32 "
          "directly (0 is what mixq does)", default=0, example={"convert_to_bfloat_before_bfp": 1}),
    Entry("MXAttributes", "element_dtype", "maps", "int8 / fp8_e4m3 / fp8_e5m2 / fp6_e3m2 / fp6_e2m3 / "
          "fp4_e2m1 -> mxint8 / mxfp8_e4m3 / mxfp8_e5m2 / mxfp6_e3m2 / mxfp6_e2m3 / mxfp4",
          example={"element_dtype": "fp8_e4m3"}, effect={"config.activation": "mxfp8_e4m3"}),
    Entry("MXAttributes", "block_size", "unsupported", "OCP MX blocks are 32 elements (32 is what mixq "
          "does)", default=32, example={"block_size": 16}),
    Entry("MXAttributes", "axis", "unsupported", f"{BLOCK_AXIS_RULE} (1, the default, is accepted)",
          default=1, example={"axis": 0}),
    Entry("MXAttributes", "rounding_mode", "unsupported", "mixq rounds half to even (2 is what mixq does)",
          default=2, example={"rounding_mode": 0}),
]


# --------------------------------------------------------------------------------------------
# The QConfig API (documentation entries; the checks live in mixq.compat.qspecs and
# mixq.compat.qconfig, and tests/unit/test_compat_vocab.py covers each)
# --------------------------------------------------------------------------------------------
def _doc(scope: str, name: str, text: str) -> Entry:
    return Entry(scope, name, "unsupported" if text.startswith("unsupported") else "maps", text)


QCONFIG_API: list[Entry] = [
    _doc("QConfig", "global_config", "a QLayerConfig: the formats and settings of every layer"),
    _doc("QConfig", "specific_layer_config", "{QLayerConfig (or a spec): [node names]}: `layer_rules` "
         "by node name; the key None excludes the nodes; a key whose symmetry / calibration / scale type / "
         "granularity differ from global_config's raises (layer rules change formats only)"),
    _doc("QConfig", "layer_type_config", "{QLayerConfig (or a spec): [op types]}: `layer_rules` by op "
         "type; None excludes the op types (`exclude_op_types`); same restriction as above"),
    _doc("QConfig", "exclude", "node names: `exclude_nodes`; (start, end) subgraph tuples raise"),
    _doc("QConfig", "algo_config", "a list: AdaRoundConfig / AdaQuantConfig (one), "
         "AutoMixprecisionConfig, CLEConfig, BiasCorrectionConfig, GPTQConfig; SmoothQuantConfig, "
         "QuarotConfig raise"),
    _doc("QConfig", "use_external_data_format", "unsupported: mixq writes external data itself above "
         "2 GB (remove it)"),
    _doc("QConfig", "**kwargs / extra_options", "extra_options keys (the table above)"),
    _doc("QLayerConfig", "input_tensors", "the activation spec (`activation`, `calibration`, "
         "`activation_symmetric`, power-of-two scales)"),
    _doc("QLayerConfig", "activation", "deprecated alias of input_tensors"),
    _doc("QLayerConfig", "weight", "the weight spec (`weight`, `weight_symmetric`, `per_channel`)"),
    _doc("QLayerConfig", "bias", "Int32Spec: int32 biases; Float16Spec / BFloat16Spec: float biases; "
         "other specs raise"),
    _doc("QLayerConfig", "output_tensors", "must equal input_tensors (mixq quantizes outputs with the "
         "activation spec); another spec raises"),
    _doc("spec", "symmetric", "`activation_symmetric` / `weight_symmetric` (defaults: Int*Spec True, "
         "UInt*Spec False)"),
    _doc("spec", "scale_type", "ScaleType.PowerOf2: `power_of_two` (MinMSE -> minmse, else nonoverflow; "
         "both specs must agree; both PowerOf2 also shares Concat scales, the vendor's EnableNPUCnn); "
         "ScaleType.Int16 raises"),
    _doc("spec", "calibration_method", "activations: `calibration` (MinMSE keeps float scales unless "
         "scale_type is PowerOf2); weights: `weight_calibration` (MinMSE -> minmse, MinMax / "
         "Percentile -> minmax, as the vendor reads them; the others raise); LayerwisePercentile / "
         "Distribution raise"),
    _doc("spec", "quant_granularity", "Channel on a weight spec: `per_channel`; on an activation spec "
         "it raises; Group raises"),
    _doc("spec", "per_channel", "mixq's spelling of QuantGranularity.Channel; on an activation spec it "
         "raises"),
    *[_doc("algo_config", n, t) for n, t in (
        ("AdaRoundConfig", "mixq AdaRoundConfig (arguments as the FastFinetune keys, snake_case)"),
        ("AdaQuantConfig", "mixq AdaQuantConfig (arguments as the FastFinetune keys, snake_case)"),
        ("AutoMixprecisionConfig", "the AutoMixprecision keys (target_layer_config -> TargetLayerConfig, ...)"),
        ("CLEConfig", "cross-layer equalization in ModelQuantizer (cle_steps passes; the other arguments "
                      "at their defaults only)"),
        ("SmoothQuantConfig", "unsupported: SmoothQuant is not implemented (use 16-bit activations)"),
        ("BiasCorrectionConfig", "`bias_correction=True` (not together with AdaRound / AdaQuant)"),
        ("GPTQConfig", "`weight_rounding='gptq'`: perc_damp -> `gptq_damp`, act_order -> `gptq_act_order`, "
                       "mse=True -> `weight_calibration='minmse'`, block_size: speed only; bits, group_size, "
                       "per_channel, weight_symmetric must agree with the weight spec (else they raise); "
                       "not together with AdaRound / AdaQuant"),
        ("QuarotConfig", "unsupported: QuaRot is not implemented (use 16-bit activations)"))],
]


def _entries_by_name(entries: list[Entry]) -> dict[str, Entry]:
    return {e.name: e for e in entries}


QC_ENTRIES = _entries_by_name(QUANTIZATION_CONFIG)
EO_ENTRIES = _entries_by_name(EXTRA_OPTIONS)
AM_ENTRIES = _entries_by_name(AUTO_MIXPRECISION)
FF_ENTRIES = _entries_by_name(FAST_FINETUNE)
FF_ALIASES = {e.alias: e for e in FAST_FINETUNE if e.alias}


def lookup(entries: dict[str, Entry], key: Any, scope: str) -> Entry:
    """The entry of `key`, or ConfigError naming the scope, a suggestion and the known keys."""
    if not isinstance(key, str) or key not in entries:
        raise ConfigError(f"unknown {scope} key {key!r}." + did_you_mean(str(key), entries)
                          + f" Known keys: {', '.join(entries)} (see docs/COMPAT.md).")
    return entries[key]


def translate_extra(ctx: Ctx, extra: Any, where: str = "extra_options") -> None:
    """Check and apply every extra_options key."""
    extra = C.mapping(where, extra)
    ctx.extra = dict(extra)
    for k, v in extra.items():
        lookup(EO_ENTRIES, k, where).run(ctx, v, f"{where}[{k!r}]")


def enum_entries() -> list[Entry]:
    """One entry per enum member: what it means in mixq."""
    out: list[Entry] = []
    meaning = {
        "QuantType": lambda m: f"format {type_format(m, 'x')}",
        "ExtendedQuantType": lambda m: ("BFPAttributes decide: bfp16 (default), mx4, mx6, mx9" if m.name == "QBFP"
                                        else "MXAttributes decide: mxint8 (default), mxfp8_e4m3, ..." if m.name == "QMX"
                                        else f"format {type_format(m, 'x')}"),
        "QuantFormat": lambda m: "QDQ output" if m.name == "QDQ" else "unsupported: QOperator (use QDQ)",
        "ExtendedQuantFormat": lambda m: "QDQ output" if m.name == "QDQ" else "unsupported: QOperator (use QDQ)",
        "VitisQuantFormat": lambda m: {"QDQ": "QDQ output", "FixNeuron": "unsupported: custom op (use QDQ)",
                                       "BFPFixNeuron": "QDQ output, both types QBFP",
                                       "MXFixNeuron": "QDQ output, both types QMX"}[m.name],
        "CalibrationMethod": lambda m: {"MinMax": "calibration minmax", "Entropy": "calibration entropy",
                                        "Percentile": "calibration percentile",
                                        "Distribution": "unsupported (use Percentile)"}[m.name],
        "PowerOfTwoMethod": lambda m: f"power_of_two {m.name.lower()}, calibration "
                                      f"{'minmse' if m.name == 'MinMSE' else 'minmax'}",
        "Int16Method": lambda m: "calibration minmax (float scales)",
        "LayerWiseMethod": lambda m: "unsupported (use Percentile)",
        "ExtendedCalibrationMethod": lambda m: "calibration minmse",
        "CalibMethod": lambda m: {"MinMax": "calibration minmax", "MinMSE": "calibration minmse",
                                  "Percentile": "calibration percentile", "Entropy": "calibration entropy",
                                  "LayerwisePercentile": "unsupported (use Percentile)",
                                  "Distribution": "unsupported (use Percentile)"}[m.name],
        "ScaleType": lambda m: {"Float32": "float scales", "PowerOf2": "power_of_two minmse",
                                "Int16": "unsupported (use Float32)"}[m.name],
        "QuantGranularity": lambda m: {"Tensor": "per_channel False", "Channel": "per_channel True (weights)",
                                       "Group": "unsupported (unused by the vendor too)"}[m.name],
    }
    for ename, enum_cls in ENUMS.items():
        if ename == "VitisQuantType":
            ename_m = meaning["ExtendedQuantType"]
        else:
            ename_m = meaning[ename]
        for mname, m in enum_cls.__members__.items():
            text = ename_m(m)
            if mname != m.name:
                text = f"alias of {ename}.{m.name}: {text}"
            out.append(Entry(ename, mname, "unsupported" if text.startswith("unsupported") else "maps", text))
    return out


__all__ = ["Ctx", "Entry", "QUANTIZATION_CONFIG", "EXTRA_OPTIONS", "AUTO_MIXPRECISION", "FAST_FINETUNE",
           "BFP_MX", "QC_ENTRIES", "EO_ENTRIES", "AM_ENTRIES", "FF_ENTRIES", "FF_ALIASES", "lookup",
           "translate_extra", "enum_entries", "VENDOR_FT_OPS", "CalibMethod"]
