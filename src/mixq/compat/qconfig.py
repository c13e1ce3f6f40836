"""The vendor's newer API: `QConfig` (data-type specs per layer, the algorithm list), translated
once into mixq's typed QuantConfig plus a fast-finetuning config, through the same
extra_options and algorithm tables as the legacy configs; and its `*_QCONFIG` presets.

    from mixq.compat import AdaQuantConfig, BFloat16Spec, QConfig, QLayerConfig

    config = QConfig(global_config=QLayerConfig(input_tensors=BFloat16Spec(), weight=BFloat16Spec()),
                     algo_config=[AdaQuantConfig(num_iterations=1000, learning_rate=1e-6)])
    mixq.quantize(model, config, calibration_data)          # runs AdaQuant before the rewrite

`QConfig.to_mixq()` gives the QuantConfig (what `mixq.quantize` uses); `QConfig.finetune_config`
the AdaRound/AdaQuant config (or None). Pure Python: no torch needed to build configs.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..config import QuantConfig
from ..errors import ConfigError
from ..finetune.config import AdaQuantConfig, AdaRoundConfig
from ..formats import get_format
from .algo import apply_gptq, cle_steps, split_algo_config, wants_bias_correction
from .amp import build_request, layer_wise_changes
from .legacy import (Translation, _amp_type_names, _block_attrs_used, _finish, _npu_cnn_constraints,
                     _op_type_changes, _tensor_precision, typed_config)
from .qspecs import SPECS, QLayerConfig, _as_spec, layer_rule_of
from .table import Ctx, translate_extra


@dataclass(frozen=True, init=False)
class QConfig:
    """The documented top-level config.

    global_config: a QLayerConfig for every layer. specific_layer_config / layer_type_config:
    ``{QLayerConfig or spec: [node names]}`` / ``{...: [op types]}`` for other data types on some
    layers (``None`` as the key excludes them). exclude: node names left float. algo_config: a
    list with at most one AdaRoundConfig / AdaQuantConfig (fast finetuning) and at most one
    AutoMixprecisionConfig. Other keyword arguments (and ``extra_options={...}``) are
    extra_options keys."""

    global_config: QLayerConfig
    specific_layer_config: Mapping[Any, tuple[str, ...]] | None
    layer_type_config: Mapping[Any, tuple[str, ...]] | None
    exclude: tuple[str, ...]
    algo_config: tuple[Any, ...]
    use_external_data_format: bool
    extra_options: dict[str, Any] = field(default_factory=dict)

    def __init__(self, global_config: Any = None, specific_layer_config: Any = None,
                 layer_type_config: Any = None, exclude: Any = None, algo_config: Any = None,
                 use_external_data_format: bool = False, **kwargs: Any) -> None:
        s = object.__setattr__
        if not isinstance(global_config, QLayerConfig):
            raise ConfigError("QConfig needs global_config=QLayerConfig(input_tensors=..., weight=...); "
                              f"got {global_config!r}.")
        s(self, "global_config", global_config)
        for opt, v in (("exclude", exclude), ("algo_config", algo_config)):
            v = () if v is None else v
            if isinstance(v, (str, bytes, Mapping)) or not isinstance(v, Iterable):
                raise ConfigError(f"{opt} must be a list, not {v!r}.")
            s(self, opt, tuple(v))
        for e in self.exclude:
            if not isinstance(e, str):
                raise ConfigError(f"exclude: {e!r}: unsupported: mixq excludes nodes by name, not "
                                  "(start, end) subgraphs (list the subgraph's node names).")
        if not isinstance(use_external_data_format, bool):
            raise ConfigError(f"use_external_data_format={use_external_data_format!r} must be True or False.")
        s(self, "use_external_data_format", use_external_data_format)
        extra = dict(kwargs.pop("extra_options", None) or {})
        extra.update(kwargs)
        s(self, "extra_options", extra)
        for opt, v in (("specific_layer_config", specific_layer_config), ("layer_type_config", layer_type_config)):
            if v is None:
                s(self, opt, None)
                continue
            if not isinstance(v, Mapping):
                raise ConfigError(f"{opt} must be a dict {{QLayerConfig or None: [names]}}, got {v!r}.")
            clean: dict[Any, tuple[str, ...]] = {}
            for k, names in v.items():
                if isinstance(names, (str, bytes)) or not isinstance(names, Iterable):
                    raise ConfigError(f"{opt}[{k!r}] must be a list of names, not {names!r}.")
                key = k if k is None or isinstance(k, QLayerConfig) else _as_spec(k, f"{opt} key")
                clean[key] = tuple(names)
            s(self, opt, clean)
        self.translate()  # checked on creation

    @staticmethod
    def get_default_config(name: str) -> Any:
        """The vendor's `QConfig.get_default_config(name)`: Config(global_quant_config=<preset name>)."""
        from .legacy import Config
        from .presets import get_default_config

        return Config(global_quant_config=get_default_config(name))

    def translate(self) -> Any:
        """The mixq.compat Translation (QuantConfig, finetune config, AutoMixprecision request)."""
        return translate_qconfig(self)

    @property
    def finetune_config(self) -> AdaRoundConfig | AdaQuantConfig | None:
        """The fast-finetuning algorithm of `algo_config` (None when there is none)."""
        return self.translate().finetune

    def to_mixq(self) -> QuantConfig:
        """The typed QuantConfig (the finetune config is `finetune_config`)."""
        return typed_config(self.translate())


def _spec_changes(g: QLayerConfig) -> dict[str, Any]:
    """QuantConfig fields of the global layer config (the vendor's activation / weight mapping;
    activation MinMSE with float scales keeps float scales, which the vendor turns into
    power-of-two ones with a warning)."""
    act, w = g.input_tensors, g.weight
    ch: dict[str, Any] = {"name": "compat", "activation": act.format, "weight": w.format}
    a_scaled, w_scaled = get_format(act.format).needs_qparams, get_format(w.format).needs_qparams
    if a_scaled:
        if act.calibration in ("layerwisepercentile", "distribution"):
            raise ConfigError(f"input_tensors={act!r}: calibration_method={act.calibration}: unsupported: "
                              "mixq calibrates by minmax, percentile, entropy or minmse (use Percentile).")
        ch["calibration"] = act.calibration
        ch["activation_symmetric"] = act.symmetric
    if w_scaled:
        ch["weight_symmetric"] = w.symmetric
        ch["per_channel"] = w.per_channel
        # the vendor's weights: MinMSE -> its float-scale MinMSE, every other method -> MinMax
        ch["weight_calibration"] = "minmse" if w.calibration == "minmse" else "minmax"
    else:
        ch["per_channel"] = False
    pof2 = {x.pof2 for x, scaled in ((act, a_scaled), (w, w_scaled)) if scaled}
    if len(pof2) > 1:
        raise ConfigError("one of input_tensors / weight has power-of-two scales and the other not: "
                          "unsupported: mixq uses power-of-two scales for every tensor or none (use "
                          "ScaleType.PowerOf2 on both, e.g. XInt8Spec for both).")
    if pof2 == {True}:
        ch["power_of_two"] = "minmse" if act.calibration == "minmse" else "nonoverflow"
        if act.calibration not in ("minmse", "minmax"):
            ch["calibration"] = "minmax"
        # the vendor switches EnableNPUCnn on when both scale types are PowerOf2
        ch["share_concat_scales"] = True
        ch["activation_symmetric"] = True
    if g.bias is not None:
        ch["bias"] = "int32" if g.bias.format == "int32" else "float"
    return ch


def translate_qconfig(q: QConfig) -> Translation:
    """Check and translate a QConfig."""
    ctx = Ctx(changes=_spec_changes(q.global_config))
    if q.use_external_data_format:
        raise ConfigError("use_external_data_format=True: unsupported: mixq writes external data itself "
                          "when the model exceeds 2 GB (remove the option).")
    translate_extra(ctx, q.extra_options)
    ch = ctx.changes
    _block_attrs_used(ctx.extra, _amp_type_names(ctx))  # the specs fix the global formats
    if ctx.flags.get("npu_cnn"):
        _npu_cnn_constraints(ch, None, ctx.extra)  # type: ignore[arg-type]
    _op_type_changes(ch, ctx)
    _tensor_precision(ch, ctx)
    exclude_nodes = set(q.exclude)
    exclude_ops: set[str] = set()
    rules = list(ch.get("layer_rules", ()))
    for opt, by in (("layer_type_config", "op_types"), ("specific_layer_config", "nodes")):
        for key, names in (getattr(q, opt) or {}).items():
            (ctx.op_types if by == "op_types" else ctx.node_names).update(names)
            if key is None:
                (exclude_ops if by == "op_types" else exclude_nodes).update(names)
            elif names:
                rules.append(layer_rule_of(key, q.global_config, opt, names, by))
    ctx.node_names.update(q.exclude)
    if exclude_nodes:
        ch["exclude_nodes"] = frozenset(exclude_nodes) | ch.get("exclude_nodes", frozenset())
    if exclude_ops:
        ch["exclude_op_types"] = frozenset(exclude_ops)
    if rules:
        ch["layer_rules"] = tuple(rules)
    ft, algo_amp = split_algo_config(q.algo_config)
    if ctx.finetune is not None or ctx.flags.get("include_fast_ft"):
        raise ConfigError("QConfig takes fast finetuning as algo_config=[AdaRoundConfig(...) or "
                          "AdaQuantConfig(...)], not as FastFinetune / include_fast_ft extra options.")
    amp_dict = ctx.amp
    if algo_amp is not None:
        if amp_dict is not None:
            raise ConfigError("AutoMixprecision is given twice (extra option and AutoMixprecisionConfig).")
        amp_dict = algo_amp
    amp = None
    if amp_dict is not None:
        req = build_request(amp_dict, ctx, ch["activation"], ch["weight"])
        if req.search:
            amp = req
        else:
            layer_wise_changes(req, ch)
    steps = cle_steps(q.algo_config)
    if steps:
        ctx.flags["cle"], ctx.flags["cle_steps"] = True, steps
    if wants_bias_correction(q.algo_config):
        ch["bias_correction"] = True
    tr = _finish(ctx, ft, amp)
    tr.config = apply_gptq(q.algo_config, tr.config)
    return tr


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
    from .algo import ALGO_CONFIGS

    a, w, algo, extra = _QCONFIG_PRESETS[name]
    try:
        return QConfig(global_config=QLayerConfig(input_tensors=SPECS[a](), weight=SPECS[w]()),
                       algo_config=[ALGO_CONFIGS[algo]()] if algo else None, extra_options=dict(extra))
    except ConfigError as exc:
        raise ConfigError(f"{name}: {exc}") from None


__all__ = ["QConfig", "translate_qconfig", "qconfig_preset", "QCONFIG_PRESETS"]
