"""The quantization pipeline: load, prepare, plan, calibrate, choose parameters, rewrite, check,
save, evaluate."""
from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import onnx

from ._io import (has_external_data, load_deferred, load_model, load_model_deferred, model_size,
                  same_path, save_model)
from .check import custom_op_problems
from .config import QuantConfig, get_default_config
from .errors import ConfigError, ModelError, OutputError
from .formats import get_format
from .passes.prepare import PrepareReport, check_graph, prepare
from .passes.qdq import RewriteReport, apply_plan
from .fidelity import float_reference, guard as fidelity_guard
from .plan.numerics import apply_numerics
from .plan.plan import PrecisionPlan
from .plan.qparams import activation_qparams, constant_qparams
from .plan.rules import build_plan


@dataclass
class QuantizeResult:
    """What `quantize` produced and what it did on the way."""

    model: onnx.ModelProto
    plan: PrecisionPlan
    config: QuantConfig
    prepare: PrepareReport
    rewrite: RewriteReport
    calibrated: int = 0
    skipped: dict[str, str] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    output_path: Path | None = None
    float_bytes: int = 0
    quant_bytes: int = 0
    warnings: list[str] = field(default_factory=list)
    finetune: Any = None  # mixq.finetune.FinetuneReport when a finetune config was given
    numerics: list = field(default_factory=list)  # mixq.plan.numerics.Finding: tensors kept float
    fidelity: Any = None  # mixq.fidelity.FidelityReport: quantized vs float on held-back samples

    def summary(self) -> str:
        """A short Markdown report."""
        counts = self.plan.format_counts()
        lines = [f"## mixq: {self.config.name} (activations {self.config.activation}, "
                 f"weights {self.config.weight})", "",
                 "| what | value |", "|---|---|",
                 f"| opset | {self.prepare.opset_from} -> {self.prepare.opset_to} |",
                 f"| BatchNorms folded | {self.prepare.batchnorms_folded} |",
                 f"| Pads folded into Conv | {self.prepare.pads_folded} |",
                 f"| activations quantized | {self.rewrite.activations_quantized} |",
                 f"| weights/constants quantized | {self.rewrite.weights_quantized} |",
                 f"| int32 biases | {self.rewrite.biases_int32} |",
                 f"| tensors calibrated | {self.calibrated} |",
                 f"| nodes left float | {len(self.plan.float_nodes)} |",
                 f"| size | {self.float_bytes / 1e6:.3f} MB -> {self.quant_bytes / 1e6:.3f} MB |",
                 f"| time | {sum(self.timings.values()):.2f} s ("
                 + ", ".join(f"{k} {v:.2f}" for k, v in self.timings.items()) + ") |"]
        lines += ["", "| role | format | tensors |", "|---|---|---|"]
        lines += [f"| {r} | {f} | {n} |" for (r, f), n in sorted(counts.items())]
        if self.plan.float_nodes:
            why: dict[str, int] = {}
            for r in self.plan.float_nodes.values():
                why[r] = why.get(r, 0) + 1
            lines += ["", "Left float: " + "; ".join(f"{n} x {r}" for r, n in sorted(why.items()))]
        for name, r in self.rewrite.biases_kept_float.items():
            lines.append(f"- bias {name}: {r}")
        lines += [f"- written-out {k} fused into the native op: {n}" for k, n in self.prepare.recognized.counts().items()]
        lines += [f"- kept float ({f.policy}): {f.tensor}: {f.reason}" for f in self.numerics]
        lines += [f"- {ln}" for ln in (self.fidelity.lines() if self.fidelity is not None else [])]
        for w in [*self.rewrite.notes, *self.warnings, *(f"not calibrated: {k}: {v}" for k, v in self.skipped.items())]:
            lines.append(f"- {w}")
        return "\n".join(lines)


def _resolve_config(config: QuantConfig | str | None) -> QuantConfig:
    if config is None:
        return get_default_config("A8W8")
    if isinstance(config, str):
        return get_default_config(config)
    if isinstance(config, QuantConfig):
        return config
    to_typed = getattr(config, "to_mixq", None)  # compat configs translate themselves
    if callable(to_typed):
        return to_typed()
    raise ConfigError(f"config must be a QuantConfig, a preset name or a compat Config, "
                      f"got {type(config).__name__}")


def quantize(model: onnx.ModelProto | str | os.PathLike, config: QuantConfig | str | None = None,
             calibration_data: Any = None, *, output_path: str | os.PathLike | None = None,
             plan: PrecisionPlan | None = None, progress: Callable[[int], None] | None = None,
             check_kernels: bool = True, finetune: Any = None, strict: bool = False) -> QuantizeResult:
    """Quantize `model` with `config` (a QuantConfig or a preset name), calibrating activations on
    `calibration_data` (a data reader, an iterable of feed dicts, a .npz/.npy file or a folder).

    `plan` replays a saved precision plan instead of building one from the config. The result
    holds the quantized ModelProto; with `output_path` it is also written (atomically).
    `check_kernels` runs the integer model on a few calibration batches with onnxruntime's
    default optimizations and with them disabled, and warns when the fused kernels disagree
    with the QDQ semantics (int8 saturation on x86 CPUs without VNNI).
    `finetune` (a mixq.finetune AdaRoundConfig / AdaQuantConfig, or a compat QConfig's
    algo_config) adjusts the weights layer by layer before the rewrite (needs torch).
    The result's `fidelity` compares quantized and float outputs on the last calibration
    samples; `strict` raises a ModelError when the quantized model looks broken.
    """
    t0 = time.perf_counter()
    timings: dict[str, float] = {}
    cfg = _resolve_config(config)
    ft_config = finetune if finetune is not None else getattr(config, "finetune_config", None)
    base_dir = None  # where deferred weights are read from (None: the model is all in memory)
    if isinstance(model, (str, os.PathLike)) and ft_config is None:
        # a big model's weights stay in its external data file: onnxruntime maps them during
        # calibration, and the rewrite reads and quantizes one tensor at a time
        src, base_dir = load_model_deferred(model)
    else:
        src = load_model(model)
    if base_dir is None:
        unloaded = [t.name for t in src.graph.initializer if has_external_data(t)]
        if unloaded:
            raise ModelError(f"initializer {unloaded[0]!r} refers to external data that is not "
                             f"loaded ({len(unloaded)} such initializers); pass the .onnx path, or "
                             "load the model with its data (onnx.load(path) without "
                             "load_external_data=False).")
    # a model mixq loaded itself (from a path or bytes) is prepared and rewritten in place:
    # no copies of the weights (what keeps > 2 GB models within memory)
    owned = not isinstance(model, onnx.ModelProto)
    float_bytes = model_size(src)
    out_path = Path(output_path) if output_path is not None else None
    protect = None if isinstance(model, (onnx.ModelProto, bytes)) else model
    if out_path is not None and protect is not None and same_path(out_path, protect):
        # checked before any work, and again by save_model
        raise OutputError(f"output path {str(out_path)!r} is the input model; choose another "
                          "path (mixq never overwrites its input).")
    prepared, prep = prepare(src, copy=not owned, base_dir=base_dir)
    _ensure_node_names(prepared)
    timings["prepare"] = time.perf_counter() - t0

    t = time.perf_counter()
    the_plan = plan if plan is not None else build_plan(prepared, cfg)
    _check_plan(the_plan, prepared)
    the_plan = _skip_empty_block_tensors(the_plan, prepared)
    timings["plan"] = time.perf_counter() - t

    t = time.perf_counter()
    needed = the_plan.calibrated_tensors(lambda f: get_format(f).needs_qparams)
    stats: dict = {}
    skipped: dict[str, str] = {}
    unknown_ops = {d: why for d, why in custom_op_problems(prepared).items() if "custom op library" in why}
    if needed and unknown_ops:
        raise ModelError(f"calibration runs the model in onnxruntime, but {next(iter(unknown_ops.values()))}. "
                         "Replace the op with standard ONNX ops (or a model-local function), or "
                         "use a preset that needs no calibration (BF16, FP16, block formats).")
    if needed:
        if calibration_data is None:
            raise ConfigError(f"format {cfg.activation} needs calibration data for "
                              f"{len(needed)} activations; pass calibration_data (a data reader, "
                              "feeds, a .npz/.npy file or a folder).")
        from .calibration.collect import collect_stats

        res = collect_stats(prepared, needed, calibration_data, progress=progress, base_dir=base_dir)
        stats, skipped = res.stats, dict(res.skipped)
    numerics: list = []
    if plan is None:  # numerics policies shape a built plan; a replayed plan is applied as saved
        the_plan, numerics = apply_numerics(the_plan, prepared, stats)
    timings["calibrate"] = time.perf_counter() - t

    t = time.perf_counter()
    qparams = activation_qparams(the_plan, stats, cfg)
    qparams.update(_constant_qparams(prepared, the_plan, cfg, base_dir))
    float_ref = float_reference(model, prepared, base_dir)  # before finetuning and the rewrite
    ft_report = None
    if ft_config is not None:  # AdaRound / AdaQuant: adjusted weights, same qparams (mixq.finetune)
        from .finetune import run_finetune

        prepared, ft_report = run_finetune(prepared, the_plan, qparams, calibration_data, ft_config,
                                           lambda m: apply_plan(m, the_plan, qparams, dual=cfg.dual_quant_nodes)[0])
        timings["finetune"] = ft_report.total_seconds
    qmodel, rew = apply_plan(prepared, the_plan, qparams, dual=cfg.dual_quant_nodes, copy=False,
                             base_dir=base_dir)
    # weights left float: the result holds the whole model. A rewrite that returned a new model
    # (an opset conversion) rebuilt every tensor, and loaded ones would have lost their
    # data_location field on the way: so do these, for the bytes of a model loaded whole
    load_deferred(qmodel, base_dir, rebuilt=qmodel is not prepared)
    quant_bytes = model_size(qmodel)
    try:
        # full check (which serializes) only below 2 GiB; the graph alone above
        check_graph(qmodel, full_check=quant_bytes < 2**31 - 1, size=quant_bytes)
    except Exception as exc:
        raise ModelError(f"internal error: the quantized model fails the ONNX checker: {exc}") from exc
    timings["rewrite"] = time.perf_counter() - t - timings.get("finetune", 0.0)

    saved, save_s = None, 0.0
    if out_path is not None:  # first: the kernel check then loads the file instead of a copy
        t = time.perf_counter()
        saved = save_model(qmodel, out_path, protect=protect, size=quant_bytes)
        save_s = time.perf_counter() - t
    t = time.perf_counter()
    warnings = _check_optimized_kernels(prepared, qmodel, cfg, calibration_data, saved) if check_kernels else []
    timings["kernel check"] = time.perf_counter() - t
    warnings += [f"{why}; the quantized model runs only where that library is registered"
                 for why in unknown_ops.values()]

    t = time.perf_counter()
    fid = fidelity_guard(float_ref, qmodel, calibration_data, config=cfg, size=quant_bytes,
                         model_path=str(model) if isinstance(model, (str, os.PathLike)) else None,
                         custom_ops=bool(unknown_ops), stats=stats)
    timings["fidelity"] = time.perf_counter() - t
    if strict and fid.broken:
        if saved is not None:
            saved.unlink(missing_ok=True)  # a broken model is never left behind
        raise ModelError("the quantized model looks broken (--strict): " + "; ".join(fid.lines()))
    result = QuantizeResult(numerics=numerics, fidelity=fid, warnings=warnings, finetune=ft_report, model=qmodel, plan=the_plan, config=cfg, prepare=prep, rewrite=rew,
                            calibrated=len(stats), skipped=skipped, timings=timings,
                            float_bytes=float_bytes, quant_bytes=quant_bytes)
    if saved is not None:
        result.output_path = saved
        timings["save"] = save_s
    return result


def _constant_qparams(model: onnx.ModelProto, plan: PrecisionPlan, cfg: QuantConfig,
                      base_dir: Path | None) -> dict:
    """constant_qparams, reading deferred weights one at a time: each is loaded into a
    one-tensor model that is dropped once its parameters are known, so the float weights are
    never all in memory (protobuf never gives back the memory of a cleared field)."""
    from dataclasses import replace

    inits = {t.name: t for t in model.graph.initializer}
    deferred = [n for n, tp in plan.tensors.items()
                if n in inits and has_external_data(inits[n]) and tp.role in ("weight", "constant")]
    if base_dir is None or not deferred:
        return constant_qparams(model, plan, cfg)
    skip = set(deferred)
    out = constant_qparams(model, replace(plan, tensors={
        n: tp for n, tp in plan.tensors.items() if n not in skip}), cfg)
    for name in deferred:
        one = onnx.ModelProto()
        one.graph.initializer.add().CopyFrom(inits[name])  # no data yet: a small copy
        load_deferred(one, base_dir)
        out.update(constant_qparams(one, replace(plan, tensors={name: plan.tensors[name]}), cfg))
        del one
    return {n: out[n] for n in plan.tensors if n in out}  # constant_qparams' (plan) order


def _ensure_node_names(model: onnx.ModelProto) -> None:
    seen: set[str] = set()
    for i, n in enumerate(model.graph.node):
        name = n.name or f"{n.op_type}_{i}"
        while name in seen:
            name = f"{name}_{i}"
        n.name = name
        seen.add(name)


def _check_plan(plan: PrecisionPlan, model: onnx.ModelProto) -> None:
    names = {i for n in model.graph.node for i in [*n.input, *n.output]} | \
        {t.name for t in model.graph.initializer} | {i.name for i in model.graph.input}
    unknown = [t for t in plan.tensors if t not in names]
    if unknown:
        from .errors import did_you_mean

        raise ConfigError(f"the plan names tensor {unknown[0]!r}, which the model does not have."
                          + did_you_mean(unknown[0], names))


def _skip_empty_block_tensors(plan: PrecisionPlan, model: onnx.ModelProto) -> PrecisionPlan:
    """Leave float the activations whose inferred shape has a zero dim: there is nothing to
    quantize, and the block formats' reshapes cannot run on zero-size tensors."""
    from dataclasses import replace

    empty = {v.name for v in [*model.graph.value_info, *model.graph.output]
             if v.type.tensor_type.HasField("shape")
             and any(d.HasField("dim_value") and d.dim_value == 0 for d in v.type.tensor_type.shape.dim)}
    hit = [n for n, tp in plan.tensors.items() if n in empty and tp.role == "activation" and any(
        f is not None and get_format(f).kind == "block" for f in [tp.format, *tp.consumer_formats.values()])]
    if not hit:
        return plan
    tensors = dict(plan.tensors)
    for n in hit:
        tensors[n] = replace(tensors[n], format=None, consumer_formats={},
                             reason="zero-size tensor: nothing to quantize, left float")
    return replace(plan, tensors=tensors)


def cpu_has_vnni() -> bool | None:
    """True/False on x86 Linux (from /proc/cpuinfo's flags), None where it cannot be told."""
    import platform

    if platform.machine().lower() not in ("x86_64", "amd64", "i686", "x86"):
        return None
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    return bool(flags & {"avx512_vnni", "avx_vnni", "avx_vnni_int8", "amx_int8"})
    except OSError:
        return None
    return None


#: SQNR (dB) between optimized and unoptimized runs below which the fused kernels are suspect.
KERNEL_SQNR_WARN_DB = 30.0


def _check_optimized_kernels(prepared: onnx.ModelProto, qmodel: onnx.ModelProto, cfg: QuantConfig,
                             data: Any, saved: Path | None = None) -> list[str]:
    """Warnings when onnxruntime's optimized int8 kernels disagree with the QDQ model. `saved`:
    the file `qmodel` was written to; onnxruntime loads that instead of two serialized copies
    of the model (what would otherwise be the peak memory of quantizing a big model)."""
    act, wgt = get_format(cfg.activation), get_format(cfg.weight)
    # only 8-bit activations with full-range 8-bit weights reach onnxruntime's saturating u8 x s8
    # kernels, and only on x86 CPUs without VNNI
    if act.kind != "int" or wgt.kind != "int" or act.bits != 8 or wgt.bits != 8 or cfg.reduce_range:
        return []
    if cpu_has_vnni() is not False:
        return []
    if not isinstance(data, (list, tuple, str, os.PathLike)):
        return ["kernel check skipped: the calibration data is a one-shot reader; run "
                "`mixq eval` to compare optimized and unoptimized onnxruntime runs"]
    from .calibration.data import as_feeds
    from .evaluate import sqnr_between_optimization_levels

    # one batch of up to 8 samples shows saturation; more only costs time on big models
    first = next(iter(as_feeds(data, prepared)))
    sqnr = sqnr_between_optimization_levels(str(saved) if saved is not None else qmodel,
                                            [{k: (v[:2] if v.ndim else v) for k, v in first.items()}])
    if sqnr >= KERNEL_SQNR_WARN_DB:
        return []
    return [f"onnxruntime's optimized int8 kernels disagree with the QDQ model on this CPU "
            f"(SQNR {sqnr:.1f} dB between default and disabled optimizations): the CPU lacks VNNI "
            f"and its int8 dot products saturate. Remedy: reduce_range=True (--reduce-range) "
            f"with the U8S8 preset, or run with optimizations disabled."]
