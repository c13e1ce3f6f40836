"""The quantization pipeline: load, prepare, plan, calibrate, choose parameters, rewrite, check,
save, evaluate."""
from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from ._io import check_output_path, load_deferred, model_size, save_model
from .calibration.data import CalibData, readable_twice
from .calibration.stats import TensorStats
from .calibration.variety import InputExtremes
from .calibration.variety import constant_data as constant_data_why
from .config import QuantConfig, get_default_config
from .errors import ConfigError, ModelError, OutputError
from .formats import QParams, get_format
from .formats.integer import IntFormat
from .graph import with_weights
from .fidelity import FLOAT_LOAD_FAILED, HeldBack, ModelScore, Runs, float_reference
from .fidelity import guard as fidelity_guard
from .passes.prepare import PrepareReport, check_graph, model_opset
from .passes.qdq import RewriteReport
from .pipeline import Pipeline, config_of_plan
from .plan.numerics import apply_numerics
from .plan.plan import PrecisionPlan


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
    fidelity: Any = None  # mixq.fidelity.FidelityReport: quantized vs float on the last calibration samples
    bias_correction: Any = None  # mixq.passes.bias_correction.BiasCorrectionReport when asked for
    weight_rounding: Any = None  # mixq.passes.gptq.WeightRoundingReport: what GPTQ did, or why it did not run
    #: the kernel check found onnxruntime's fused int8 kernels saturating on this CPU (its warning
    #: is in `warnings`, and says why the guard's runtime check disagrees too)
    kernels_disagree: bool = False
    #: activations whose range MinMSE would choose but never clips: their extremes are the
    #: answer (`plan.ops.output_defining_tensors`, docs/ACCURACY.md section 13)
    unclipped: tuple[str, ...] = ()
    #: the samples the calibration pass read (0: none ran), and the output-defining 8-bit
    #: (narrower) activations whose ranges end at those samples' extremes where they are few
    #: (`EXPOSED_BELOW`): unseen inputs go past them, and the guard cannot see it
    calibration_rows: int = 0
    exposed: tuple[str, ...] = ()

    def summary(self) -> str:
        """A short Markdown report."""
        counts = self.plan.format_counts()
        lines = [f"## mixq: {self.config.name} (activations {self.config.activation}, "
                 f"weights {self.config.weight})", "",
                 "| what | value |", "|---|---|",
                 f"| opset | {self.prepare.opset_from} -> {model_opset(self.model)} |",
                 f"| BatchNorms folded | {self.prepare.batchnorms_folded} |",
                 f"| Pads folded into Conv | {self.prepare.pads_folded} |",
                 *([f"| bias Adds folded into their layer | {self.prepare.bias_adds_folded} |"]
                   if self.prepare.bias_adds_folded else []),
                 *([f"| scales (Mul / Div by a constant) folded into their layer | {self.prepare.scales_folded} |"]
                   if self.prepare.scales_folded else []),
                 f"| activations quantized | {self.rewrite.activations_quantized} |",
                 f"| weights/constants quantized | {self.rewrite.weights_quantized} |",
                 f"| int32 biases | {self.rewrite.biases_int32} |",
                 f"| tensors calibrated | {self.calibrated} |",
                 f"| nodes left float | {len(self.plan.float_nodes)} |",
                 f"| float tensors not planned | {len(self.plan.skipped)} (reasons: `mixq plan`) |",
                 f"| size | {self.float_bytes / 1e6:.3f} MB -> {self.quant_bytes / 1e6:.3f} MB |",
                 f"| time | {sum(self.timings.values()):.2f} s ("
                 + ", ".join(f"{k} {v:.2f}" for k, v in self.timings.items()) + ") |"]
        lines += ["", "| role | format | tensors |", "|---|---|---|"]
        lines += [f"| {r} | {f} | {n} |" for (r, f), n in sorted(counts.items())]
        # the verdict first: how the output compares with the float model, and what may run
        # differently from what was checked; then what was done on the way
        lines.append("")
        fid = self.fidelity.lines(runtime=not self.kernels_disagree) if self.fidelity is not None else []
        lines += [f"- {ln}" for ln in fid]
        lines += [f"- {w}" for w in self.warnings]
        if self.plan.float_nodes:
            why: dict[str, int] = {}
            for r in self.plan.float_nodes.values():
                why[r] = why.get(r, 0) + 1
            lines += ["", "Left float: " + "; ".join(f"{n} x {r}" for r, n in sorted(why.items()))]
        for name, r in self.rewrite.biases_kept_float.items():
            lines.append(f"- bias {name}: {r}")
        lines += [f"- Einsum (a matrix product) rewritten as MatMul: {n}" if k == "MatMul" else
                  f"- written-out {k} fused into the native op: {n}"
                  for k, n in self.prepare.recognized.counts().items()]
        lines += [f"- kept {f.kept} ({f.policy}): {f.tensor}: {f.reason}" for f in self.numerics]
        if self.unclipped:
            more = len(self.unclipped) - 3
            shown = ", ".join(self.unclipped[:3]) + (f" and {more} more" if more > 0 else "")
            lines.append(f"- range never clipped by MinMSE (MinMax instead) for {len(self.unclipped)} tensor(s) that "
                         f"define the output, whose extremes are the answer: {shown}")
        if self.exposed:
            lines.append("- " + exposure_note(self.plan, self.exposed, self.calibration_rows,
                                              "which the fidelity check, scoring those samples, cannot see",
                                              self.config))
        lines += [f"- {ln}" for ln in (self.finetune.lines() if self.finetune is not None else [])]
        lines += [f"- {ln}" for ln in (self.weight_rounding.lines() if self.weight_rounding is not None else [])]
        lines += [f"- {ln}" for ln in (self.bias_correction.lines() if self.bias_correction is not None else [])]
        if self.rewrite.bias_grids:
            shifts = [k for _, k in self.rewrite.bias_grids.values()]
            named = ", ".join(f"{w} (x 2**{k})" for w, (_, k) in list(self.rewrite.bias_grids.items())[:3])
            more = len(shifts) - 3
            lines.append(f"- {len(shifts)} weight grid(s) widened by 2**{min(shifts)} to 2**{max(shifts)} "
                         "so that their biases fit int32 at input scale x weight scale (onnxruntime's "
                         f"8-bit Conv/Gemm kernels read them there): {named}"
                         + (f" and {more} more (`QuantizeResult.rewrite.bias_grids`)" if more > 0 else ""))
        for w in [*self.prepare.notes, *self.rewrite.notes,
                  *(f"not calibrated: {k}: {v}" for k, v in self.skipped.items())]:
            lines.append(f"- {w}")
        return "\n".join(lines)


#: Fewer calibration samples than this, and the summary says how exposed the output's 8-bit
#: ranges are: an unseen sample goes past the maximum of N exchangeable ones with
#: probability 1/(N + 1), one in 64 or more here.
EXPOSED_BELOW = 64


def exposure_note(plan: PrecisionPlan, exposed: tuple[str, ...], rows: int, unseen_by: str,
                  cfg: QuantConfig) -> str:
    """The sentence saying that the grids of `exposed` (see `_exposed`) end at the extremes of
    `rows` calibration samples, what that costs on unseen inputs, who cannot see it
    (`unseen_by`) and the fix under `cfg`: the quantize summary's and `mixq auto`'s."""
    bits = "/".join(str(b) for b in sorted({get_format(tp.format).bits for t, tp in plan.tensors.items()
                                            if t in exposed and tp.format}))
    more = len(exposed) - 3
    shown = ", ".join(exposed[:3]) + (f" and {more} more" if more > 0 else "")
    if cfg.power_of_two is not None:  # the NPU's rule sets the scales: no headroom to ask for
        fix = "Calibrate on more samples (hundreds)"
    elif cfg.calibration in ("percentile", "entropy"):  # output_headroom widens unclipped ranges only
        fix = (f"Calibrate on more samples (hundreds), or calibrate with MinMax instead of {cfg.calibration} "
               "and widen these ranges with output_headroom=1.5 (docs/ACCURACY.md section 8)")
    else:
        fix = ("Calibrate on more samples (hundreds), or widen these ranges with output_headroom=1.5 "
               "(`--output-headroom 1.5`; their step grows with them: docs/ACCURACY.md section 8)")
    return (f"the {bits}-bit ranges of {shown}, which define the output, end at (or just past) the extremes "
            f"of {rows} calibration sample(s): about 1 in {rows + 1} unseen inputs like them goes past and is "
            f"clipped there, {unseen_by}. {fix}")


def _output_int_activations(pipe: Pipeline, plan: PrecisionPlan, calibrated: bool = True) -> tuple[str, ...]:
    """The output-defining activations (`plan.ops.output_defining_tensors`) the plan puts on
    integer grids, sorted; `calibrated`: only those whose range the statistics set."""
    keep = pipe.output_defining
    return tuple(sorted(t for t, tp in plan.tensors.items()
                        if t in keep and tp.role == "activation" and tp.format is not None
                        and (tp.calibrate or not calibrated) and get_format(tp.format).kind == "int"))


#: an output grid reaching less than this many times past its calibrated extreme is exposed
#: (`_exposed`): MinMax and MinMSE ranges end at it, Percentile and Entropy ones inside it, a
#: power-of-two scale may leave only a few percent past it
EXPOSED_HEADROOM = 1.25


def _exposed(pipe: Pipeline, plan: PrecisionPlan, cfg: QuantConfig) -> tuple[str, ...]:
    """The output-defining integer activations (`plan.ops.output_defining_tensors`) whose
    ranges, as quantized, reach less than EXPOSED_HEADROOM times past the calibrated extremes
    (whatever chose them: a range method, power-of-two scales; headroom counts) and stop short
    of the bound of the op that makes them by more than a step, when fewer than
    `EXPOSED_BELOW` samples were calibrated and `output_headroom` is 'auto'."""
    n = pipe.calibration_rows
    if not 0 < n < EXPOSED_BELOW or cfg.output_headroom != "auto":
        return ()
    ints = _output_int_activations(pipe, plan)
    qparams = pipe.activation_qparams(plan, cfg) if ints else {}
    out = []
    for t in ints:
        st, fmt, q = pipe.stats.get(t), get_format(plan.tensors[t].format), qparams.get(t)  # type: ignore[arg-type]
        if st is None or q is None or not isinstance(fmt, IntFormat):
            continue
        lo, hi = min(st.min, 0.0), max(st.max, 0.0)
        step = (hi - lo) / (2 ** fmt.bits - 1)
        b = pipe.bounds.get(t)
        if b is not None and hi + step >= b[1] and lo - step <= b[0]:
            continue  # the data reached the bound of the op that makes it (within a step): no clip
        zp, scale = q.zero_point.astype(np.float64), q.scale.astype(np.float64)
        reach_hi, reach_lo = float(np.min((fmt.qmax - zp) * scale)), float(np.max((fmt.qmin - zp) * scale))
        if (hi > 0 and reach_hi < EXPOSED_HEADROOM * hi) or (lo < 0 and reach_lo > EXPOSED_HEADROOM * lo):
            out.append(t)
    return tuple(out)


def _check_output_headroom(pipe: Pipeline, plan: PrecisionPlan, cfg: QuantConfig,
                           qparams: Mapping[str, QParams]) -> None:
    """A ConfigError where an `output_headroom` asked for moves no range of this model: its
    output-defining tensors are not on integer grids, already as wide (range_headroom), or at
    the bound of the op that makes them. Which of them it is depends on the model, so it is
    checked here, against the parameters 'auto' gives."""
    if cfg.output_headroom == "auto" or float(cfg.output_headroom) == 1.0:
        return  # 1: no floor over range_headroom's (what a plan made before the option carries)
    auto = pipe.activation_qparams(plan, cfg.with_options(output_headroom="auto"))
    moved = [t for t, q in auto.items() if t in qparams and not (
        np.array_equal(q.scale, qparams[t].scale) and np.array_equal(q.zero_point, qparams[t].zero_point))]
    if moved:
        return
    ints = _output_int_activations(pipe, plan, calibrated=False)
    why = ("every tensor that defines the output (" + ", ".join(ints[:3])
           + ") is already as wide (range_headroom) or at the bound of the op that makes it") if ints else \
        "no tensor that defines the output is on an integer grid (they are float or in other formats)"
    raise ConfigError(f"output_headroom={cfg.output_headroom!r} changes nothing in this model: {why}. Drop it.")


def _unclipped(pipe: Pipeline, plan: PrecisionPlan, cfg: QuantConfig) -> tuple[str, ...]:
    """The calibrated activations `activation_qparams` keeps unclipped where MinMSE chooses the
    range (integer grids under calibration='minmse' or power_of_two='minmse')."""
    if cfg.calibration != "minmse" and cfg.power_of_two != "minmse":
        return ()
    return _output_int_activations(pipe, plan)


def _resolve_config(config: Any) -> QuantConfig:
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
             check_kernels: bool = True, finetune: Any = None, strict: bool = False,
             executor: Any = None) -> QuantizeResult:
    """Quantize `model` with `config` (a QuantConfig or a preset name; default A8W8),
    calibrating activations on `calibration_data` (a data reader, an iterable of feed dicts, a
    .npz/.npy file or a folder).

    `plan` replays a saved precision plan instead of building one: it is replayed with the
    config it carries (a different `config` beside it is an error), so it gives the same bytes
    as the config that made it. The result holds the quantized ModelProto; with `output_path`
    it is also written (atomically).
    `check_kernels` runs the integer model on a few calibration batches with onnxruntime's
    default optimizations and with them disabled, and warns when the fused kernels disagree
    with the QDQ semantics (int8 saturation on x86 CPUs without VNNI).
    `finetune` (a mixq.finetune AdaRoundConfig / AdaQuantConfig, or a compat QConfig's
    algo_config) adjusts the weights layer by layer before the rewrite (needs torch).
    The result's `fidelity` compares quantized and float outputs on the last calibration
    samples; `strict` raises a ModelError when the quantized model looks broken.
    `executor` (a mixq.distributed Executor: local processes or Ray) calibrates shards of the
    data on its workers; the statistics, and the model, are the same bytes as without it.
    """
    t0 = time.perf_counter()
    timings: dict[str, float] = {}
    given = None if config is None else _resolve_config(config)
    if plan is not None:
        cfg = config_of_plan(plan, given)
    else:
        cfg = given if given is not None else get_default_config("A8W8")
    if plan is None:  # a replayed plan is replayed as it was made
        _check_inert_options(cfg)
    ft_config = finetune if finetune is not None else getattr(config, "finetune_config", None)
    if cfg.bias_correction and ft_config is not None:
        raise ConfigError("bias_correction=True with finetuning: AdaRound / AdaQuant fit each layer "
                          "to the float one themselves; choose one of the two.")
    protect = None if isinstance(model, (onnx.ModelProto, bytes)) else model
    raw_data = calibration_data.data if isinstance(calibration_data, CalibData) else calibration_data
    data_inputs = [raw_data] if isinstance(raw_data, (str, os.PathLike)) else []
    # checked before any work, and again by save_model
    out_path = None if output_path is None else \
        check_output_path(output_path, models=[protect], inputs=data_inputs, kind="output")
    # a big model's weights stay in their external data file: onnxruntime maps them for
    # calibration, and the rewrite reads and quantizes one tensor at a time (finetuning needs
    # the weights in memory)
    pipe = Pipeline.load(model, defer=ft_config is None, equalize=cfg.equalize, keep_nodes=cfg.named_nodes())
    float_bytes = model_size(pipe.model)
    timings["prepare"] = time.perf_counter() - t0

    t = time.perf_counter()
    the_plan = plan if plan is not None else pipe.plan(cfg)
    pipe.check_plan(the_plan)
    timings["plan"] = time.perf_counter() - t

    t = time.perf_counter()
    tap, nearest_why = _gram_tap(pipe, the_plan, calibration_data, cfg, ft_config)
    # data read once (a reader, a generator): the calibration pass keeps the guard's samples
    kept = HeldBack(pipe.model) if calibration_data is not None and not readable_twice(calibration_data) \
        else None
    pipe.calibrate(the_plan, calibration_data, progress=progress, executor=executor, tap=tap, kept=kept)
    # numerics policies read the statistics: tensors whose range or role makes a uniform grid
    # wrong stay float, each with its reason in the plan (tensor overrides are left as set);
    # applied to replayed plans too, so that a plan replays to the bytes its config gives
    the_plan, numerics = apply_numerics(the_plan, pipe.model, pipe.stats,
                                        enabled=cfg.numerics_policies, kept_weights=cfg.kept_weights)
    constant_data = pipe.constant_calibration()  # np.zeros as calibration data: say so, loudly
    bad_data = _nonfinite_warning(pipe.nonfinite_inputs(), numerics, pipe.stats)
    timings["calibrate"] = time.perf_counter() - t

    t = time.perf_counter()
    qparams = pipe.qparams(the_plan, cfg)
    _check_output_headroom(pipe, the_plan, cfg, qparams)
    unclipped = _unclipped(pipe, the_plan, cfg)  # of the float model: the rewrite changes it in place
    exposed = _exposed(pipe, the_plan, cfg)
    float_ref = float_reference(model, pipe.model, pipe.base_dir)  # before the rewrite changes it
    round_rep = _round_weights(pipe, the_plan, qparams, cfg, tap, nearest_why)
    del tap
    bias_rep = _correct_biases(pipe, the_plan, qparams, calibration_data,
                               None if round_rep is None else round_rep.original) \
        if cfg.bias_correction else None
    ft_report = None
    target = pipe.model
    if ft_config is not None:  # AdaRound / AdaQuant: adjusted weights, same qparams (mixq.finetune)
        from .finetune.core import run_finetune

        target, ft_report = run_finetune(
            pipe.model, the_plan, qparams, calibration_data, ft_config,
            lambda m: pipe.rewrite(the_plan, qparams, cfg, model=m)[0])
        timings["finetune"] = ft_report.total_seconds
    from .check import custom_op_problems

    custom_ops = [why for why in custom_op_problems(pipe.model).values() if "custom op library" in why]
    # weight_rounding='auto': nearest rounding's twin (GPTQ's weights put back), scored against
    # GPTQ's model below
    twin = with_weights(target, round_rep.original) if (
        cfg.weight_rounding == "auto" and ft_config is None and bias_rep is None and not custom_ops
        and float_ref is not None and round_rep is not None and round_rep.rounded) else None
    qmodel, rew = pipe.rewrite(the_plan, qparams, cfg, model=target, copy=False)
    runs = None  # the float and chosen models' outputs on the guard's samples, once measured
    if twin is not None and float_ref is not None:
        t_check = time.perf_counter()
        qmodel, rew, runs = _keep_better_rounding(pipe, the_plan, qparams, cfg, (qmodel, rew), twin,
                                                  float_ref, calibration_data, round_rep, kept)
        if round_rep.nearest_because is not None:
            target = twin  # what the chosen model was rewritten from
        del twin
        timings["rounding check"] = time.perf_counter() - t_check
    # weights left float: the result holds the whole model. A rewrite that returned a new model
    # (an opset conversion) rebuilt every tensor, and loaded ones would have lost their
    # data_location field on the way: so do these, for the bytes of a model loaded whole
    load_deferred(qmodel, pipe.base_dir, rebuilt=qmodel is not target)
    quant_bytes = model_size(qmodel)
    try:
        # full check (which serializes) only below 2 GiB; the graph alone above
        check_graph(qmodel, full_check=quant_bytes < 2**31 - 1, size=quant_bytes)
    except Exception as exc:
        raise ModelError(f"internal error: the quantized model fails the ONNX checker: {exc}") from exc
    timings["rewrite"] = (time.perf_counter() - t - timings.get("finetune", 0.0)
                          - timings.get("rounding check", 0.0))

    # the fidelity guard: quantized against float on the last calibration samples; runs before
    # the save, so that --strict leaves an existing output untouched when the model is broken
    t = time.perf_counter()
    # no calibration pass (block formats): the guard's samples are the only data read
    watch = InputExtremes(pipe.model) if not pipe.input_extremes else None
    try:
        fid = fidelity_guard(float_ref, qmodel, calibration_data, config=cfg, size=quant_bytes,
                             model_path=str(model) if isinstance(model, (str, os.PathLike)) else None,
                             custom_ops=bool(custom_ops), stats=pipe.stats, kept=kept, runs=runs,
                             watch=watch)
    except ModelError as exc:  # presets with no calibration pass load the model here first
        pipe.raise_if_source_fails(exc, FLOAT_LOAD_FAILED)
        raise
    if constant_data is None and watch is not None:
        constant_data = constant_data_why(pipe.model, watch.extremes, calibrated=False)
    del runs
    del float_ref
    timings["fidelity"] = time.perf_counter() - t
    if strict and (fid.broken or fid.runtime_disagrees):
        raise ModelError("the quantized model looks broken (strict): " + "; ".join(fid.lines()))
    if strict and constant_data is not None:
        raise ModelError(f"nothing vouches for the quantized model (strict): {constant_data}")
    if strict and fid.nonfinite and not fid.outputs:
        raise ModelError(f"nothing vouches for the quantized model (strict): {fid.not_checked}")

    saved, save_s = None, 0.0
    warnings: list[str] = []
    disagree = False
    t = time.perf_counter()
    if check_kernels and strict:
        # strict: onnxruntime's fused kernels on this CPU must agree before anything is written
        warnings, disagree = _check_optimized_kernels(pipe.model, qmodel, cfg, calibration_data, None, kept)
        if disagree:
            raise ModelError("the quantized model runs broken here (strict): " + "; ".join(warnings))
    kernel_s = time.perf_counter() - t
    if out_path is not None:  # first: the kernel check then loads the file instead of a copy
        t = time.perf_counter()
        saved = save_model(qmodel, out_path, protect=protect, inputs=data_inputs, size=quant_bytes)
        save_s = time.perf_counter() - t
    t = time.perf_counter()
    if check_kernels and not strict:
        warnings, disagree = _check_optimized_kernels(pipe.model, qmodel, cfg, calibration_data, saved, kept)
    del kept
    timings["kernel check"] = kernel_s + time.perf_counter() - t
    warnings += [f"{why}; the quantized model runs only where that library is registered"
                 for why in custom_ops]
    warnings += [f"prepare: {n}" for n in pipe.prepare_report.notes if "shape inference failed" in n]
    unknown_layers = _unknown_layers(pipe.model, the_plan, cfg.name)
    if unknown_layers is not None:
        warnings.insert(0, unknown_layers)
    if not (rew.activations_quantized or rew.weights_quantized):
        warnings.insert(0, _nothing_quantized(the_plan, cfg.name))
    elif (float_layers := _float_layers(qmodel, the_plan, cfg)) is not None:
        warnings.insert(0, float_layers)
    if constant_data is not None:
        warnings.insert(0, f"WARNING: {constant_data}")
    if bad_data is not None:
        warnings.insert(0, bad_data)

    result = QuantizeResult(numerics=numerics, fidelity=fid, warnings=warnings, finetune=ft_report,
                            bias_correction=bias_rep, weight_rounding=round_rep,
                            model=qmodel, plan=the_plan, config=cfg, prepare=pipe.prepare_report,
                            rewrite=rew, calibrated=len(pipe.stats), skipped=dict(pipe.calib_skipped),
                            timings=timings, float_bytes=float_bytes, quant_bytes=quant_bytes,
                            kernels_disagree=disagree, unclipped=unclipped,
                            calibration_rows=pipe.calibration_rows, exposed=exposed)
    if saved is not None:
        result.output_path = saved
        timings["save"] = save_s
    return result


def _check_inert_options(cfg: QuantConfig) -> None:
    """A ConfigError for an option set away from the preset the config came from (its name, or
    "X+custom") or from the defaults (a config built as QuantConfig(...)) that changes no output
    under the config's formats: every option changes the output or is an error. Configs the
    documented vocabulary translated (name "compat") carry the vendor's own fields."""
    from .config import PRESETS

    base = cfg.name.split("+")[0].upper()
    reference = PRESETS.get(base) if base in PRESETS else QuantConfig() if cfg.name == "custom" else None
    if reference is None:
        return
    inert = cfg.inert_changes(reference)
    if inert:
        opt, why = next(iter(inert.items()))
        shown = cfg.granularity if opt == "granularity" else getattr(cfg, opt)
        raise ConfigError(f"{opt}={shown!r} changes nothing with {cfg.name}: {why}. Drop it.")


def _nonfinite_warning(inputs: dict[str, tuple[int, int, int]], numerics: list[Any],
                       stats: Mapping[str, TensorStats]) -> str | None:
    """The warning for calibration data whose inputs hold inf or NaN (None without such): the
    tensors those values reach hold them too, and the sentinel policy keeps each float as it
    would an additive -inf mask; unless the input is such a mask, that is a data error. Where
    the graph itself replaces them (missing values imputed by IsNaN and Where, or an Imputer;
    infinities clipped), no calibrated tensor past the inputs holds one: a note, not a warning."""
    if not inputs:
        return None
    held = "; ".join(f"input {n!r}: {inf} infinite and {nan} NaN of {total} values"
                     for n, (inf, nan, total) in list(inputs.items())[:3])
    inner = [st for n, st in stats.items() if n not in inputs]
    if inner and not any(st.nan_count or st.inf_count for st in inner):
        return (f"the calibration data holds values that are not finite ({held}); the graph replaces "
                f"them (no calibrated tensor past the inputs holds one, as where a model imputes missing "
                "values or clips infinities)")
    kept = sum(1 for f in numerics if f.policy == "sentinel")
    return (f"WARNING: the calibration data holds values that are not finite ({held}). Every tensor "
            f"they reach holds them too{f', and {kept} were kept float for it' if kept else ''} "
            "(as an additive -inf mask would be: see 'kept float (sentinel)' below). Unless that "
            "input is such a mask, this is a data error: remove those samples and quantize again.")


def _unknown_layers(model: onnx.ModelProto, plan: PrecisionPlan, preset: str) -> str | None:
    """The warning for layers left float because mixq does not know their op: custom-domain
    nodes (a runtime's or a tool's own ops, which a standard op's reason does not explain) that
    hold a layer's weights, so that part of the model is not `preset` whatever the summary's
    counts say; None when there is none. A node counts where it reads an initializer of rank 2
    or more, and, for onnxruntime's own ops, is a layer op (`ORT_LAYER_OPS`)."""
    from collections import Counter

    from .passes.unfuse import MS_DOMAIN, NCHWC_DOMAIN, ORT_LAYER_OPS

    weights = {t.name for t in model.graph.initializer if len(t.dims) >= 2}

    def layer(n: onnx.NodeProto) -> bool:  # reads a weight (a FusedMatMul of two activations does not)
        known = n.domain not in (MS_DOMAIN, NCHWC_DOMAIN) or (n.domain, n.op_type) in ORT_LAYER_OPS
        return known and any(i in weights for i in n.input)

    ops = Counter(f"{n.domain}.{n.op_type}" for n in model.graph.node
                  if n.domain not in ("", "ai.onnx", "ai.onnx.ml") and n.name in plan.float_nodes
                  and "not in mixq's op table" in plan.float_nodes[n.name] and layer(n))
    if not ops:
        return None
    listed = ", ".join(f"{op} x {k}" for op, k in ops.most_common(4))
    hint = (" The model was saved by onnxruntime at ORT_ENABLE_ALL: its NCHWc ops hold weights in a "
            "layout tied to one CPU's vector width. Quantize the model as exported, or one saved at "
            "ORT_ENABLE_EXTENDED (whose fused ops mixq expands)."
            if any(op.startswith(NCHWC_DOMAIN + ".") for op in ops) else
            " Quantize the model as exported, before a tool replaced its layers with its own ops; the "
            "summary's notes say why an onnxruntime fused op was kept.")
    return (f"WARNING: {sum(ops.values())} layer(s) with weights stayed float: mixq does not know their "
            f"op ({listed}), so that part of the model is not {preset}.{hint}")


def _nothing_quantized(plan: PrecisionPlan, preset: str) -> str:
    """The warning for an output that computes what its input did: no tensor took a format."""
    from collections import Counter

    why = Counter(r.split(":")[0].split(" (")[0] for r in plan.skipped.values())
    top = "; ".join(f"{n} x {r}" for r, n in why.most_common(3))
    return (f"WARNING: nothing was quantized: the output computes exactly what the float model does, "
            f"not {preset}" + (f" ({len(plan.skipped)} float tensors not planned, mostly: {top}; "
                               "`mixq plan` lists every reason)" if top else ""))


def _float_layers(qmodel: onnx.ModelProto, plan: PrecisionPlan, cfg: QuantConfig) -> str | None:
    """The warning for an integer preset's output whose every layer (Conv, ConvTranspose, Gemm,
    MatMul) computes in float, no DequantizeLinear feeding its input or weight (a speech front
    end whose STFT and filterbank the small-value policy keeps exact): the few element-wise ops
    left on a grid make it no smaller and no faster. None where a layer reads a dequantized
    operand, where there is no layer, or for float and block presets."""
    from .plan.ops import COMPUTE_OPS

    if not any(get_format(f).kind == "int" for f in (cfg.activation, cfg.weight) if f is not None):
        return None
    layers = [n for n in qmodel.graph.node if n.domain in ("", "ai.onnx") and n.op_type in COMPUTE_OPS]
    dequantized = {o for n in qmodel.graph.node if n.op_type == "DequantizeLinear" for o in n.output}
    if not layers or any(i in dequantized for n in layers for i in n.input[:2]):
        return None
    kept = sum(1 for n in layers for i in n.input[:2]
               if (tp := plan.tensors.get(i)) is not None and tp.reason.startswith("kept float"))
    return (f"WARNING: no layer is {cfg.name}: all {len(layers)} Conv/ConvTranspose/Gemm/MatMul layer(s) compute "
            f"in float" + (f" ({kept} of their inputs and weights kept float by the numerics policies: the "
                           "'kept float' lines say why)" if kept else "")
            + "; the model is about as large and as slow as float, and computes about what it does")


def _has_integer_weights(cfg: QuantConfig) -> bool:
    """Whether any weight format `cfg` can give is an integer grid."""
    from .formats.integer import IntFormat

    names = {cfg.weight, *(r.weight for r in cfg.layer_rules), *(f for _, f in cfg.tensor_formats)}
    return any(isinstance(get_format(n), IntFormat) for n in names if n is not None)


def _second_pass_data(pipe: Pipeline, data: Any, option: str) -> Any:
    """Calibration feeds for a second float pass (bias correction, GPTQ); an error where the
    data cannot be read again, since the option would otherwise change nothing."""
    from .calibration.data import as_feeds

    if pipe.base_dir is not None:
        raise ConfigError(f"{option}: the model's weights stay in their external data file (a model "
                          "over 2 GiB), which this pass does not read; drop the option.")
    if not readable_twice(data):
        raise ConfigError(f"{option} needs calibration data it can read a second time (a list of "
                          "feeds, a file or a folder), not a one-shot data reader.")
    return as_feeds(data, pipe.model, batch_size=8)


def _correct_biases(pipe: Pipeline, plan: PrecisionPlan, qparams: dict, data: Any,
                    original: dict | None = None) -> Any:
    """Bias correction from the input means over the calibration data (a second, streaming
    float pass); `original`: float weights a pass before replaced (GPTQ), measured against."""
    from .passes.bias_correction import correct_biases

    feeds = _second_pass_data(pipe, data, "bias_correction=True")
    return correct_biases(pipe.model, plan, qparams, feeds, original=original)


def _gram_tap(pipe: Pipeline, plan: PrecisionPlan, data: Any, cfg: QuantConfig,
              finetune: Any) -> tuple[Any, str | None]:
    """(the GramTap that collects GPTQ's statistics during calibration, or None; why weights are
    rounded to nearest instead where `cfg.weight_rounding` is 'auto'). 'gptq' where it cannot
    run is an error; None, None: nearest as asked, or no integer weight at all."""
    from .passes.gptq import GramTap

    integer = _has_integer_weights(cfg)
    if cfg.weight_rounding == "nearest" or (cfg.weight_rounding == "auto" and not integer):
        return None, None
    why = None
    if not integer:
        why = (f"it chooses integer weight codes, but the config's weights are {cfg.weight} (no layer "
               "rule or tensor format gives an integer one)")
    elif finetune is not None:
        why = "finetuning (AdaRound / AdaQuant) chooses the weights' rounding itself"
    elif pipe.base_dir is not None:
        why = "the model's weights stay in their external data file (a model over 2 GiB)"
    elif data is None:
        why = "there is no calibration data to measure the layers' inputs on"
    if why is not None:
        if cfg.weight_rounding == "gptq":
            raise ConfigError(f"weight_rounding='gptq': {why}; drop the option.")
        return None, why
    return GramTap(pipe.model, plan), None


def _round_weights(pipe: Pipeline, plan: PrecisionPlan, qparams: dict, cfg: QuantConfig,
                   tap: Any, why: str | None) -> Any:
    """GPTQ rounding of the integer weights from the grams `tap` collected by calibration (its
    pass, the float pass over the feeds read for workers, or one of its own where no statistic
    was missing); the report, or None (nearest as asked)."""
    from .passes.gptq import WeightRoundingReport, gptq_round

    if why is None and tap is not None and not tap.targets:
        return None  # no layer's weight is on an integer grid here: nothing to round
    if why is None and tap is not None and not tap.complete:
        # calibration ran no float pass: only where onnxruntime cannot run the model here
        why = "no float pass of the model ran here (it has ops onnxruntime cannot run)"
        if cfg.weight_rounding == "gptq":
            raise ConfigError(f"weight_rounding='gptq': {why}; drop the option.")
    if why is not None:
        return WeightRoundingReport(nearest_because=why)
    if tap is None:
        return None
    return gptq_round(pipe.model, plan, qparams, tap, damp=cfg.gptq_damp, act_order=cfg.gptq_act_order)


#: weight_rounding='auto' keeps nearest rounding where the whole model scores this much better
#: with it (mean output SQNR on the guard's samples, which GPTQ was fit on too: a GPTQ loss there
#: is real, a small one may be noise)
ROUNDING_MARGIN_DB = 0.5
#: ... or where its decision outputs (class indices) equal float's on this larger share of
#: their elements, which settles it before any SQNR does (what a classifier's user reads)
ROUNDING_MARGIN_AGREEMENT = 0.01


def _nearest_wins(gptq: ModelScore, near: ModelScore) -> bool:
    """Whether nearest rounding's `ModelScore` beats GPTQ's by the margins: decisions first
    (where they differ by more than ROUNDING_MARGIN_AGREEMENT), then the value outputs' SQNR."""
    g, n = gptq.agreement, near.agreement
    if g is not None and n is not None and abs(n - g) > ROUNDING_MARGIN_AGREEMENT:
        return n > g
    g, n = gptq.sqnr_db, near.sqnr_db
    return g is not None and n is not None and n > g + ROUNDING_MARGIN_DB


def _keep_better_rounding(pipe: Pipeline, plan: PrecisionPlan, qparams: dict, cfg: QuantConfig,
                          gptq: tuple[onnx.ModelProto, RewriteReport], twin: onnx.ModelProto,
                          float_ref: bytes | str, data: Any, rep: Any,
                          kept: HeldBack | None = None
                          ) -> tuple[onnx.ModelProto, RewriteReport, Runs | None]:
    """GPTQ's model or nearest rounding's, whichever the whole model scores better with.

    GPTQ minimises each layer's output error for float inputs; the model runs on quantized
    activations, and there a coarse weight grid can do worse with GPTQ's codes than with the
    nearest ones (per-tensor power-of-two weights of a detector, measured). So both models are
    scored on the guard's samples (`score_models`: decision outputs by their equal elements,
    the others by SQNR); `rep` records the comparison or why nearest was kept. Also returns the
    chosen model's runs there, which the guard reuses."""
    from .fidelity import count_samples, held_back_feeds, score_models

    feeds = held_back_feeds(data, gptq[0], kept=kept)
    if not feeds:
        return gptq[0], gptq[1], None
    near = pipe.rewrite(plan, qparams, cfg, model=twin, copy=False)
    (g, g_runs), (n, n_runs) = score_models(float_ref, [gptq[0], near[0]], feeds)
    k = count_samples(feeds)
    if g.sqnr_db is None and g.agreement is None:  # nothing tells them apart
        rep.not_compared = ("the model has no numeric output to score either rounding by" if not g.empty else
                            f"no output holds a value to score either rounding by ({', '.join(g.empty)}: 0 or "
                            f"non-finite on the guard's {k} samples, in float and in both roundings)")
        return gptq[0], gptq[1], g_runs
    if _nearest_wins(g, n):
        rep.nearest_because = (f"measured worse on the guard's {k} samples: {g.text()} with GPTQ's codes, "
                               f"{n.text()} with nearest rounding (nearest is kept when its decisions agree "
                               f"with float's on {100 * ROUNDING_MARGIN_AGREEMENT:g} point(s) more, or its "
                               f"SQNR wins by {ROUNDING_MARGIN_DB:g} dB; --weight-rounding gptq keeps GPTQ)")
        rep.rounded.clear()
        return near[0], near[1], n_runs
    rep.compared = (g, n, k)
    return gptq[0], gptq[1], g_runs


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
                             data: Any, saved: Path | None = None, kept: HeldBack | None = None
                             ) -> tuple[list[str], bool]:
    """Warnings when onnxruntime's optimized int8 kernels disagree with the QDQ model, and
    whether they do (what --strict refuses). `saved`:
    the file `qmodel` was written to; onnxruntime loads that instead of two serialized copies
    of the model (what would otherwise be the peak memory of quantizing a big model). `kept`:
    the calibration pass's first feed, for data that cannot be read again."""
    act, wgt = get_format(cfg.activation), get_format(cfg.weight)
    # only 8-bit activations with full-range 8-bit weights reach onnxruntime's saturating u8 x s8
    # kernels, and only on x86 CPUs without VNNI
    if act.kind != "int" or wgt.kind != "int" or act.bits != 8 or wgt.bits != 8 or cfg.reduce_range:
        return [], False
    if cpu_has_vnni() is not False:
        return [], False
    from .calibration.data import as_feeds
    from .evaluate import random_ops, sqnr_between_optimization_levels
    from .fidelity import batch_axis_dynamic, probe_feeds

    # one batch of up to 8 samples shows saturation; more only costs time on big models
    first = next(iter(as_feeds(data, prepared))) if readable_twice(data) else \
        kept.first if kept is not None else None
    if first is None:
        return ["kernel check skipped: the calibration data is a one-shot reader that no calibration "
                "pass here read; run `mixq eval` to compare optimized and unoptimized onnxruntime runs"], False
    # two samples show saturation; a model with a fixed batch takes its whole first feed
    two = probe_feeds([first], 2, sliceable=batch_axis_dynamic(prepared))
    # the file, unless the model draws random values: the ModelProto's sessions seed them alike
    sqnr = sqnr_between_optimization_levels(str(saved) if saved is not None and not random_ops(qmodel) else qmodel,
                                            two)
    if sqnr >= KERNEL_SQNR_WARN_DB:
        return [], False
    return [f"WARNING: onnxruntime's optimized int8 kernels disagree with the QDQ model on this CPU "
            f"(SQNR {sqnr:.1f} dB between default and disabled optimizations): the CPU lacks VNNI "
            f"and its int8 dot products saturate. Remedy: reduce_range=True (--reduce-range) "
            f"with the U8S8 preset, or run with optimizations disabled."], True
