"""QConfig (the vendor's newer API) translated into a Translation, through the same extra_options
and algorithm tables as the legacy configs."""
from __future__ import annotations

from typing import Any

from ..errors import ConfigError
from ..finetune.compat import QConfig, QLayerConfig, layer_rule_of
from ..formats import get_format
from .algo import apply_gptq, cle_steps, split_algo_config, wants_bias_correction
from .amp import build_request, layer_wise_changes
from .legacy import (Translation, _amp_type_names, _block_attrs_used, _finish, _npu_cnn_constraints,
                     _op_type_changes, _tensor_precision)
from .table import Ctx, translate_extra


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
