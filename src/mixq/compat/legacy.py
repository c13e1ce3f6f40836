"""The vendor's legacy configs, `QuantizationConfig` and `Config`, field for field, translated
once (through `mixq.compat.table`) into a `Translation`: mixq's typed QuantConfig plus the
finetune config, the auto-mixed-precision request and the run options."""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from ..config import QuantConfig
from ..errors import ConfigError
from . import checks as C
from .amp import AmpRequest, build_request, layer_wise_changes
from .enums import CalibrationMethod, ExtendedQuantType, QuantFormat, QuantType, member_name, type_format
from .finetune_vocab import finetune_from_vendor
from .table import QC_ENTRIES, Ctx, translate_extra


def typed_config(tr: "Translation") -> QuantConfig:
    """The QuantConfig for `mixq.quantize`, which runs no AutoMixprecision walk and reads the
    calibration data as given: such requests raise instead of being dropped."""
    if tr.amp is not None:
        raise ConfigError("this config asks for the AutoMixprecision walk (L2Target / Top1AccTarget / "
                          "NumTarget): run it with mixq.compat.ModelQuantizer(config).quantize_model(...); "
                          "mixq.quantize takes fixed configs.")
    if tr.flags.get("cle"):
        raise ConfigError("include_cle=True (the vendor's default) is run by mixq.compat.ModelQuantizer; "
                          "with mixq.quantize set include_cle=False (or run ModelQuantizer).")
    if tr.calib_samples is not None:
        raise ConfigError("extra_options['CalibDataSize'] is applied by mixq.compat.ModelQuantizer; with "
                          "mixq.quantize pass the first samples yourself.")
    return tr.config


@dataclass
class Translation:
    """A documented config in mixq's terms."""

    config: QuantConfig
    finetune: Any = None                 # mixq AdaRoundConfig / AdaQuantConfig, or None
    amp: AmpRequest | None = None        # an AutoMixprecision walk (None: none, or layer-wise)
    calib_samples: int | None = None
    print_summary: bool = True
    ignore_warnings: bool = True
    op_types: frozenset[str] = frozenset()
    node_names: frozenset[str] = frozenset()
    flags: dict[str, Any] = field(default_factory=dict)


def _finish(ctx: Ctx, finetune: Any, amp: AmpRequest | None) -> Translation:
    changes = dict(ctx.changes)
    if not ctx.flags.get("cle"):  # the documented config asks for no CLE: none at all, mixq's own included
        changes["equalize"] = False
    try:
        cfg = QuantConfig(**changes)
    except TypeError as exc:  # an internal mistake, not user input
        raise ConfigError(f"internal error translating the config: {exc}") from exc
    names = set(ctx.node_names) | {t for t, _ in cfg.tensor_formats}
    return Translation(config=cfg, finetune=finetune, amp=amp, calib_samples=ctx.calib_samples,
                       print_summary=ctx.print_summary, ignore_warnings=ctx.ignore_warnings,
                       op_types=frozenset(ctx.op_types), node_names=frozenset(names), flags=dict(ctx.flags))


def _mixed_tensors(value: Any, extra: dict[str, Any]) -> tuple[tuple[str, str], ...]:
    value = C.mapping("extra_options['MixedPrecisionTensor']", value)
    out: dict[str, str] = {}
    for qtype, tensors in value.items():
        fmt = type_format(qtype, "MixedPrecisionTensor key", extra)
        for t in C.names(f"MixedPrecisionTensor[{member_name(qtype)}]", tensors):
            if t in out and out[t] != fmt:
                raise ConfigError(f"MixedPrecisionTensor gives tensor {t!r} two types, {out[t]} and {fmt}.")
            out[t] = fmt
    return tuple(sorted(out.items()))


def translate_legacy(qc: "QuantizationConfig", algo_finetune: Any = None,
                     algo_amp: dict[str, Any] | None = None) -> Translation:
    """Check every field and extra_options key of `qc` and build the Translation.
    `algo_finetune` / `algo_amp`: what a Config's algo_config list adds."""
    ctx = Ctx(changes={"name": "compat"})
    for f in fields(qc):
        if f.name != "extra_options":
            QC_ENTRIES[f.name].run(ctx, getattr(qc, f.name), f.name)
    translate_extra(ctx, qc.extra_options)
    extra = ctx.extra
    act_t, w_t = ctx.flags["activation_type"], ctx.flags["weight_type"]
    forced = ctx.flags.get("force_type")
    if forced is not None:
        for opt, t in (("activation_type", act_t), ("weight_type", w_t)):
            if t.name not in (forced.name, "QInt8"):
                raise ConfigError(f"quant_format={qc.quant_format} makes both types {member_name(forced)}; "
                                  f"{opt}={member_name(t)} contradicts it (drop it or use QuantFormat.QDQ).")
        act_t = w_t = forced
    ch = ctx.changes
    _block_attrs_used(extra, {act_t.name, w_t.name} | _amp_type_names(ctx))
    ch["activation"] = type_format(act_t, "activation_type", extra)
    ch["weight"] = type_format(w_t, "weight_type", extra)
    if ctx.flags.get("npu_cnn"):
        _npu_cnn_constraints(ch, qc, extra)
    _op_type_changes(ch, ctx)
    _tensor_precision(ch, ctx)
    finetune = _finetune(ctx, algo_finetune)
    amp_dict = ctx.amp
    if algo_amp is not None:
        if amp_dict is not None:
            raise ConfigError("AutoMixprecision is given twice: in extra_options and as "
                              "AutoMixprecisionConfig in algo_config; keep one.")
        amp_dict = algo_amp
    inc = ctx.flags.get("include_auto_mp")
    amp: AmpRequest | None = None
    if amp_dict is None:
        if inc:
            raise ConfigError("include_auto_mp=True needs extra_options['AutoMixprecision'] (the target "
                              "precision and, for a search, L2Target or Top1AccTarget).")
    else:
        if inc is False:
            raise ConfigError("extra_options['AutoMixprecision'] is given but include_auto_mp=False: "
                              "set include_auto_mp=True (or leave it unset) to use it, or remove it.")
        req = build_request(amp_dict, ctx, ch["activation"], ch["weight"])
        if req.search:
            amp = req
        else:
            layer_wise_changes(req, ch)
    return _finish(ctx, finetune, amp)


def _amp_type_names(ctx: Ctx) -> set[str]:
    """Names of the quantization types the extra options use (AutoMixprecision, MixedPrecisionTensor)."""
    out: set[str] = set()
    if isinstance(ctx.amp, dict):
        out |= {getattr(ctx.amp.get(k), "name", "") for k in ("TargetQuantType", "ActTargetQuantType",
                                                               "WeightTargetQuantType")}
    mpt = ctx.flags.get("mixed_precision_tensor")
    if isinstance(mpt, dict):
        out |= {getattr(k, "name", "") for k in mpt}
    return out


def _block_attrs_used(extra: dict[str, Any], type_names: set[str]) -> None:
    """BFPAttributes / MXAttributes describe QBFP / QMX: given without such a type they would do
    nothing, so they raise."""
    for key, t in (("BFPAttributes", "QBFP"), ("MXAttributes", "QMX")):
        if key in extra and t not in type_names:
            raise ConfigError(f"extra_options['{key}'] describes the {t} type, but no type is {t} "
                              f"(activation_type, weight_type, MixedPrecisionTensor or AutoMixprecision); "
                              f"remove it or use ExtendedQuantType.{t}.")


def _npu_cnn_constraints(ch: dict[str, Any], qc: "QuantizationConfig", extra: dict[str, Any]) -> None:
    """enable_npu_cnn: power-of-two symmetric scales shared across Concat; the vendor's hard
    constraints raise instead of being ignored."""
    if ch.get("per_channel"):
        raise ConfigError("enable_npu_cnn=True needs per-tensor weights (per_channel=False): the "
                          "vendor's NPU CNN quantizer allows no per-channel scales.")
    if ch.get("reduce_range"):
        raise ConfigError("enable_npu_cnn=True does not allow reduce_range=True.")
    if ch["weight"] != "int8":
        raise ConfigError(f"enable_npu_cnn=True needs weight_type=QuantType.QInt8 (got {ch['weight']}).")
    for key in ("ActivationSymmetric", "WeightSymmetric"):
        if extra.get(key) is False:
            raise ConfigError(f"enable_npu_cnn=True needs {key}=True (the NPU uses symmetric scales).")
    ch.setdefault("power_of_two", "minmse")
    ch.setdefault("calibration", "minmse")
    ch["activation_symmetric"] = True
    ch["share_concat_scales"] = True


def _op_type_changes(ch: dict[str, Any], ctx: Ctx) -> None:
    extra_ops = ctx.flags.get("extra_op_types")
    if ctx.flags.get("all_op_types"):
        ch.pop("op_types", None)
    elif extra_ops and ch.get("op_types"):
        ch["op_types"] = frozenset(ch["op_types"]) | extra_ops
    elif extra_ops:
        # no op_types_to_quantize: mixq quantizes every op type it knows; an extra type it does
        # not know would be dropped, so it raises
        from ..plan.ops import OP_TABLE

        unknown = sorted(set(extra_ops) - set(OP_TABLE))
        if unknown:
            raise ConfigError(f"extra_op_types_to_quantize: {unknown[0]!r}: unsupported: mixq quantizes the "
                              f"op types it has semantics for ({', '.join(sorted(OP_TABLE))}); "
                              f"{unknown[0]!r} is not one of them (remove it).")


def _tensor_precision(ch: dict[str, Any], ctx: Ctx) -> None:
    on = ctx.flags.get("specific_tensor_precision", False)
    mpt = ctx.flags.get("mixed_precision_tensor")
    if mpt is not None and not on:
        raise ConfigError("extra_options['MixedPrecisionTensor'] needs specific_tensor_precision=True "
                          "(the vendor ignores it otherwise; mixq asks you to say so).")
    if on and mpt is None:
        raise ConfigError("specific_tensor_precision=True needs extra_options['MixedPrecisionTensor'] "
                          "{type: [tensor names]}.")
    if mpt is not None:
        ch["tensor_formats"] = _mixed_tensors(mpt, ctx.extra)


def _finetune(ctx: Ctx, algo_finetune: Any) -> Any:
    inc = ctx.flags.get("include_fast_ft")
    if ctx.finetune is not None and not inc:
        raise ConfigError("extra_options['FastFinetune'] is given but include_fast_ft is not True: set "
                          "include_fast_ft=True to finetune, or remove FastFinetune.")
    ft = finetune_from_vendor(ctx.finetune or {}) if inc else None
    if ft is not None and algo_finetune is not None:
        raise ConfigError("fast finetuning is asked twice: include_fast_ft=True and an AdaRound/AdaQuant "
                          "config in algo_config; keep one.")
    return ft if ft is not None else algo_finetune


@dataclass
class QuantizationConfig:
    """The vendor's legacy quantization config: every field, with the vendor's defaults except
    `include_auto_mp` / `include_fast_ft` (None: not given). `include_cle=True` (the vendor's
    default) equalizes Conv pairs in ModelQuantizer; `mixq.quantize` refuses it (set False). Checked on creation; unknown fields are a TypeError, as
    for any Python class; unknown extra_options keys a ConfigError with a suggestion."""

    calibrate_method: Any = CalibrationMethod.MinMax
    quant_format: Any = QuantFormat.QDQ
    activation_type: Any = QuantType.QInt8
    weight_type: Any = QuantType.QInt8
    input_nodes: list[str] = field(default_factory=list)
    output_nodes: list[str] = field(default_factory=list)
    op_types_to_quantize: list[str] = field(default_factory=list)
    nodes_to_quantize: list[str] = field(default_factory=list)
    extra_op_types_to_quantize: list[str] = field(default_factory=list)
    nodes_to_exclude: list[str] = field(default_factory=list)
    subgraphs_to_exclude: list[Any] = field(default_factory=list)
    specific_tensor_precision: bool = False
    execution_providers: list[str] = field(default_factory=lambda: ["CPUExecutionProvider"])
    per_channel: bool = False
    reduce_range: bool = False
    optimize_model: bool = True
    use_dynamic_quant: bool = False
    use_external_data_format: bool = False
    convert_fp16_to_fp32: bool = False
    convert_nchw_to_nhwc: bool = False
    include_sq: bool = False
    include_rotation: bool = False
    include_cle: bool = True
    include_auto_mp: bool | None = None
    include_fast_ft: bool | None = None
    enable_npu_cnn: bool = False
    enable_npu_transformer: bool = False
    debug_mode: bool = False
    crypto_mode: bool = False
    print_summary: bool = True
    ignore_warnings: bool = True
    log_severity_level: Any = None
    extra_options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.translate()

    def translate(self) -> Translation:
        """The Translation (raises ConfigError for anything unsupported or malformed)."""
        return translate_legacy(self)

    def to_mixq(self) -> QuantConfig:
        """mixq's typed QuantConfig (what `mixq.quantize` uses)."""
        return typed_config(self.translate())

    @property
    def finetune_config(self) -> Any:
        """The finetune config of include_fast_ft + FastFinetune (None without)."""
        return self.translate().finetune


@dataclass
class Config:
    """`Config(global_quant_config=QuantizationConfig(...), algo_config=[...])`. algo_config (an
    addition to the vendor's legacy Config, as its QConfig has): AdaRoundConfig / AdaQuantConfig /
    AutoMixprecisionConfig; the other algorithms raise "unsupported"."""

    global_quant_config: Any
    algo_config: Any = None

    def __post_init__(self) -> None:
        if not isinstance(self.global_quant_config, QuantizationConfig):
            raise ConfigError("Config needs global_quant_config=QuantizationConfig(...) (or "
                              "mixq.compat.get_default_config(name)); got "
                              f"{type(self.global_quant_config).__name__}.")
        self.translate()

    def translate(self) -> Translation:
        from .algo import apply_gptq, cle_steps, split_algo_config, wants_bias_correction

        ft, amp = split_algo_config(self.algo_config)
        tr = translate_legacy(self.global_quant_config, ft, amp)
        if wants_bias_correction(self.algo_config):
            tr.config = tr.config.with_options(bias_correction=True)
        tr.config = apply_gptq(self.algo_config, tr.config)
        steps = cle_steps(self.algo_config)
        if steps:
            tr.flags["cle"], tr.flags["cle_steps"] = True, steps
        return tr

    def to_mixq(self) -> QuantConfig:
        """mixq's typed QuantConfig (what `mixq.quantize` uses)."""
        return typed_config(self.translate())

    @property
    def finetune_config(self) -> Any:
        return self.translate().finetune


__all__ = ["Config", "QuantizationConfig", "Translation", "translate_legacy", "ExtendedQuantType"]
