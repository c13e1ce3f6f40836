"""AutoMixprecision as the vendor documents and measures it.

Two modes:
- layer-wise (no target): the layers of TargetOpType (or the nodes of a TargetLayerConfig dict)
  take the target precision: a mixq `LayerRule`;
- the documented walk (L2Target, Top1AccTarget with EvaluateFunction, or NumTarget): quantize
  every layer wide; measure each candidate layer alone at the target precision; narrow layers in
  ascending order of that measure, one at a time, and stop at the first that breaks the target
  (it is put back).

The measures are the vendor's: `average_l2` is the mean over calibration batches of the L2 norm
of (float output - quantized output), absolute, not relative; `EvaluateFunction` is called with
the model's results (a list with one entry per batch, each the list [output OutputIndex]) and
returns an accuracy; the loss is round(float accuracy - quantized accuracy, 4). Both run on the
calibration data reader's batches, as the vendor does. mixq's own search (relative L2 on held-out
data, EvaluateFunction(model_path), bisection) is `mixq.search.auto_quantize`.
"""
from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx

from ..config import LayerRule, QuantConfig
from ..errors import ConfigError
from . import checks as C
from .enums import ExtendedQuantType, QuantType, VitisQuantType, type_format
from .table import AM_ENTRIES, Ctx, lookup

_DEFAULT_OPS = ("Conv", "ConvTranspose", "Gemm", "MatMul")


@dataclass(frozen=True)
class AmpRequest:
    """What an AutoMixprecision dict asks for (formats resolved)."""

    activation: str
    weight: str
    op_types: frozenset[str] = frozenset(_DEFAULT_OPS)
    l2_target: float | None = None
    top1_target: float | None = None
    evaluate_function: Callable[[Any], Any] | None = None
    num_target: int = 0
    output_index: int | None = None
    data_size: int | None = None
    no_shared: bool = True
    include: tuple[str, ...] | None = None
    exclude: tuple[str, ...] = ()
    target_tensors: tuple[str, ...] = ()
    target_nodes: tuple[str, ...] = ()

    @property
    def search(self) -> bool:
        """Whether this asks for the walk (a target) rather than a layer rule."""
        return self.l2_target is not None or self.top1_target is not None or self.num_target > 0


def _layer_config_formats(value: Any) -> tuple[str, str, tuple[str, ...]]:
    from .qspecs import QLayerConfig

    nodes: tuple[str, ...] = ()
    if isinstance(value, dict):
        if len(value) != 1:
            raise ConfigError("AutoMixprecision['TargetLayerConfig'] as a dict takes one "
                              "{QLayerConfig: [node names]} pair.")
        (value, names), = value.items()
        nodes = C.names("AutoMixprecision['TargetLayerConfig'] node list", names)
    if not isinstance(value, QLayerConfig):
        raise ConfigError(f"AutoMixprecision['TargetLayerConfig']={value!r}: unsupported form: give a "
                          "QLayerConfig(input_tensors=..., weight=...) or {QLayerConfig: [node names]}.")
    return value.input_tensors.format, value.weight.format, nodes


def build_request(amp: dict[str, Any], ctx: Ctx, act_default: str, weight_default: str) -> AmpRequest:
    """Check every AutoMixprecision key and resolve the target formats (vendor rules: with only
    TargetQuantType, it is the activation target and weights keep weight_type, except for
    QBFP/QMX, which the vendor mixes into both)."""
    vals: dict[str, Any] = {}
    for k, v in amp.items():
        e = lookup(AM_ENTRIES, k, "AutoMixprecision")
        label = f"AutoMixprecision[{k!r}]"
        if e.kind == "unsupported":
            e.run(ctx, v, label)
            continue
        vals[k] = e.check(label, v)
    extra = ctx.extra
    act = weight = None
    nodes: tuple[str, ...] = ()
    if "TargetLayerConfig" in vals:
        act, weight, nodes = _layer_config_formats(vals["TargetLayerConfig"])
    if "ActTargetQuantType" in vals:
        act = type_format(vals["ActTargetQuantType"], "ActTargetQuantType", extra)
    if "WeightTargetQuantType" in vals:
        weight = type_format(vals["WeightTargetQuantType"], "WeightTargetQuantType", extra)
    if "TargetQuantType" in vals and act is None and weight is None:
        t = vals["TargetQuantType"]
        act = type_format(t, "TargetQuantType", extra)
        if t.name in ("QBFP", "QMX"):
            weight = act
    if act is None and weight is None:
        raise ConfigError("AutoMixprecision needs the target precision: TargetQuantType, "
                          "ActTargetQuantType / WeightTargetQuantType, or TargetLayerConfig.")
    act = act or act_default
    weight = weight or weight_default
    if "L2Target" in vals and "Top1AccTarget" in vals:
        raise ConfigError("AutoMixprecision: give L2Target or Top1AccTarget, not both (the vendor "
                          "drops L2Target with a warning; mixq asks you to choose).")
    if "Top1AccTarget" in vals and "EvaluateFunction" not in vals:
        raise ConfigError("AutoMixprecision['Top1AccTarget'] needs EvaluateFunction: "
                          "f(results) -> top-1 accuracy, results being one [output] list per batch.")
    if "EvaluateFunction" in vals and "Top1AccTarget" not in vals:
        raise ConfigError("AutoMixprecision['EvaluateFunction'] is used with Top1AccTarget; add it.")
    ops = vals.get("TargetOpType", _DEFAULT_OPS)
    ctx.op_types.update(ops)
    for k in ("IncludeLayers", "ExcludeLayers"):
        ctx.node_names.update(vals.get(k, ()))
    ctx.node_names.update(nodes)
    out_idx = vals.get("OutputIndex", vals.get("MetricOutputIndex"))
    if "DualQuantNodes" in vals:
        ctx.changes["dual_quant_nodes"] = vals["DualQuantNodes"]
    return AmpRequest(activation=act, weight=weight, op_types=frozenset(ops),
                      l2_target=vals.get("L2Target"), top1_target=vals.get("Top1AccTarget"),
                      evaluate_function=vals.get("EvaluateFunction"), num_target=vals.get("NumTarget", 0),
                      output_index=out_idx, data_size=vals.get("DataSize"),
                      no_shared=vals.get("NoInputQDQShared", True), include=vals.get("IncludeLayers"),
                      exclude=vals.get("ExcludeLayers", ()), target_tensors=vals.get("TargetTensors", ()),
                      target_nodes=nodes)


def layer_wise_changes(req: AmpRequest, changes: dict[str, Any]) -> None:
    """The layer rule (and tensor formats) of a request without a target."""
    if req.exclude:
        raise ConfigError("AutoMixprecision['ExcludeLayers'] without a target: unsupported in layer-wise "
                          "mode (list the layers to change in IncludeLayers or TargetLayerConfig).")
    rules = list(changes.get("layer_rules", ()))
    nodes = tuple(req.target_nodes) + tuple(req.include or ())
    if nodes:
        rules.append(LayerRule(nodes=nodes, activation=req.activation, weight=req.weight))
    elif not req.target_tensors:
        rules.append(LayerRule(op_types=req.op_types, activation=req.activation, weight=req.weight))
    if rules:
        changes["layer_rules"] = tuple(rules)
    if req.target_tensors:
        tf = dict(changes.get("tensor_formats", ()))
        tf.update({t: req.activation for t in req.target_tensors})
        changes["tensor_formats"] = tuple(sorted(tf.items()))


# ---------------------------------------------------------------------------------------------
# the vendor's measures
# ---------------------------------------------------------------------------------------------
def average_l2(float_results: list[list[np.ndarray]], quant_results: list[list[np.ndarray]]) -> float:
    """The vendor's L2: the mean, over batches and outputs, of ||float - quantized||_2 (the norm of
    the whole batch output, in float32)."""
    if not float_results or len(float_results) != len(quant_results):
        raise ConfigError("average_l2: the float and quantized results have different batch counts.")
    d = [float(np.linalg.norm(np.asarray(f, np.float32) - np.asarray(q, np.float32)))
         for fb, qb in zip(float_results, quant_results) for f, q in zip(fb, qb)]
    return float(np.mean(d))


def run_results(model: onnx.ModelProto | str, feeds: list[dict[str, np.ndarray]],
                output_index: int | None) -> list[list[np.ndarray]]:
    """The model's results as the vendor's inference_model gives them: one list per batch, holding
    [output output_index] (every output when it is None or out of range); no graph
    optimizations, as the vendor runs it."""
    from ..evaluate import make_session

    sess = make_session(model, optimize=False)
    names = [o.name for o in sess.get_outputs()]
    if output_index is not None and 0 <= output_index < len(names):
        names = [names[output_index]]
    return [list(sess.run(names, f)) for f in feeds]


def top1_loss(evaluate_function: Callable[[Any], Any], float_results: Any, quant_results: Any) -> float:
    """round(EvaluateFunction(float results) - EvaluateFunction(quantized results), 4)."""
    vals = []
    for r in (float_results, quant_results):
        v = evaluate_function(r)
        try:
            vals.append(float(v))
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"EvaluateFunction returned {v!r}; it must return a number (the "
                              "top-1 accuracy of the results it is given).") from exc
    return round(vals[0] - vals[1], 4)


@dataclass
class WalkResult:
    """What the documented walk chose, and the quantization of that choice."""

    narrowed: list[str]
    sensitivity: dict[str, float]
    metric_name: str
    metric: float
    target_met: bool
    quantize_result: Any = None
    candidates: list[str] = field(default_factory=list)

    @property
    def model(self) -> onnx.ModelProto:
        return self.quantize_result.model

    @property
    def plan(self) -> Any:
        return self.quantize_result.plan

    @property
    def assignment(self) -> dict[str, str]:
        return {n: "narrow" for n in self.narrowed}


def _workbench(model: Any, configs: tuple[QuantConfig, ...], data: Any, req: AmpRequest) -> tuple[Any, Any, Any, Any]:
    """A search workbench on the prepared model with the statistics `configs` need, the prepared
    model, all calibration feeds, and the feeds the walk evaluates on. (Works with the search
    workbench's pipeline.)"""
    from ..calibration.collect import collect_stats
    from ..calibration.data import as_feeds
    from ..formats import get_format
    from ..search.workbench import Workbench

    from ..pipeline import Pipeline

    pipe = Pipeline.load(model, defer=False, equalize=all(c.equalize for c in configs),
                         keep_nodes=sorted({n for c in configs for n in c.named_nodes()}))
    prepared = pipe.model
    plan_of: Callable[[QuantConfig], Any] = pipe.plan
    feeds = list(as_feeds(data, prepared))
    if not feeds:
        raise ConfigError("the calibration data reader gave no batches.")
    needed: set[str] = set()
    for cfg in configs:
        needed |= set(plan_of(cfg).calibrated_tensors(lambda f: get_format(f).needs_qparams))
    stats = dict(collect_stats(prepared, sorted(needed), feeds).stats) if needed else {}
    n_eval = len(feeds) if req.data_size is None else min(len(feeds), req.data_size + 1)
    eval_feeds = feeds[:n_eval]
    pipe.stats.update(stats)
    wb = Workbench(pipe, eval_feeds, output_index=req.output_index or 0)
    return wb, prepared, feeds, eval_feeds


def ensure_names(model: onnx.ModelProto) -> None:
    """Name every node as mixq's pipeline does (layer rules refer to nodes by name)."""
    from ..pipeline import ensure_node_names

    ensure_node_names(model)


def _narrowed(base: QuantConfig, req: AmpRequest, nodes: list[str]) -> QuantConfig:
    if not nodes:
        return base
    rule = LayerRule(nodes=tuple(sorted(nodes)), activation=req.activation, weight=req.weight)
    return base.with_options(layer_rules=tuple(base.layer_rules) + (rule,), name=f"{base.name}+amp")


def vendor_walk(model: str | os.PathLike | onnx.ModelProto, base: QuantConfig, req: AmpRequest,
                calibration_data: Any, *, output_path: str | os.PathLike | None = None,
                finetune: Any = None) -> WalkResult:
    """Run the documented walk and quantize the chosen plan (see the module docstring)."""
    from ..api import quantize
    from ..search.sensitivity import candidate_layers

    if calibration_data is None:
        raise ConfigError("AutoMixprecision with a target needs a calibration data reader.")
    if base.weight_rounding == "gptq":
        raise ConfigError("AutoMixprecision with GPTQConfig: the documented walk measures weights "
                          "rounded to nearest; drop GPTQConfig, or run mixq auto (mixq.search."
                          "auto_quantize), whose plans are GPTQ-rounded.")
    # the written model is the one the walk measured: its weights rounded to nearest
    base = base.with_options(weight_rounding="nearest")
    narrow_all = base.with_options(activation=req.activation, weight=req.weight)
    wb, prepared, feeds, eval_feeds = _workbench(model, (base, narrow_all), calibration_data, req)
    float_results = run_results(prepared, eval_feeds, req.output_index)

    if req.top1_target is not None:
        fn: Callable[[Any], Any] = req.evaluate_function  # type: ignore[assignment]  # checked by build_request
        metric_name = "top-1 loss"

        def measure(cfg: QuantConfig) -> float:
            return top1_loss(fn, float_results, run_results(wb.materialize(cfg)[0], eval_feeds, req.output_index))
        target: float | None = req.top1_target
    else:
        metric_name = "average L2"

        def measure(cfg: QuantConfig) -> float:
            return average_l2(float_results, run_results(wb.materialize(cfg)[0], eval_feeds, req.output_index))
        target = req.l2_target

    layers = candidate_layers(wb, base, req.op_types)
    if req.include is not None:
        layers = [n for n in layers if n in set(req.include)]
    layers = [n for n in layers if n not in set(req.exclude)]
    if req.no_shared:
        consumers: dict[str, int] = {}
        for node in prepared.graph.node:
            for i in node.input:
                consumers[i] = consumers.get(i, 0) + 1
        first_input = {node.name: node.input[0] for node in prepared.graph.node if node.input}
        layers = [n for n in layers if consumers.get(first_input.get(n, ""), 0) <= 1]
    current = measure(base) if target is not None else 0.0
    chosen: list[str] = []
    sens: dict[str, float] = {}
    if req.top1_target is None or current <= req.top1_target:
        sens = {n: measure(_narrowed(base, req, [n])) for n in layers}
        order = sorted(layers, key=lambda n: sens[n])  # stable: ties keep the graph order
        for n in order:
            if req.num_target > 0 and req.l2_target is None and req.top1_target is None:
                if len(chosen) >= req.num_target:
                    break
                chosen.append(n)
                continue
            trial = measure(_narrowed(base, req, chosen + [n]))
            if target is not None and trial > target:
                break
            chosen.append(n)
            current = trial
    final = _narrowed(base, req, chosen)
    res = quantize(model, final, feeds, output_path=output_path, finetune=finetune)
    met = target is None or current <= target
    return WalkResult(narrowed=chosen, sensitivity=sens, metric_name=metric_name, metric=current,
                      target_met=met, quantize_result=res, candidates=layers)


__all__ = ["AmpRequest", "WalkResult", "average_l2", "build_request", "layer_wise_changes", "run_results",
           "top1_loss", "vendor_walk", "ExtendedQuantType", "QuantType", "VitisQuantType"]
