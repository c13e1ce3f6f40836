"""The `mixq` command line: quantize, plan, inspect, eval, demo, convert."""
from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np

from ..errors import ConfigError, MixqError


def _progress(prefix: str):
    """The progress display of a calibration pass (mixq._progress: a bar in a terminal, a
    line every few seconds in a pipe, nothing with --quiet); usable as a `with` block."""
    from .._progress import Progress

    return Progress(prefix, unit="batches")


def _add_config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", help="preset name (XINT8, A8W8, A16W8, U8S8, BF16, MXFP4, ...); "
                   "default A8W8")
    p.add_argument("--config", help="JSON file of QuantConfig fields (may name a 'preset', "
                   "'layer_rules', 'tensor_formats'); flags override it")
    p.add_argument("--activation", help="activation format, overrides the preset (e.g. int16, bf16, mxfp8_e4m3)")
    p.add_argument("--weight", help="weight format, overrides the preset")
    p.add_argument("--calib-method", choices=["minmax", "percentile", "entropy", "minmse"],
                   help="activation range method (minmse here is plain MinMSE: gain 1 unless "
                        "--minmse-min-gain is given)")
    p.add_argument("--minmse-min-gain", type=float, default=None, metavar="G",
                   help="MinMSE clips an activation range only where that lowers its expected "
                        "error G times (the integer presets: 1.5)")
    p.add_argument("--range-headroom", default=None, metavar="H",
                   help="widen unclipped integer activation ranges H times (auto: 2 on 16-bit "
                        "grids, none on narrower ones; 1: off)")
    p.add_argument("--output-headroom", default=None, metavar="H",
                   help="widen the ranges of the tensors that define the output (graph outputs, "
                        "the logits a Softmax or ArgMax reads) H times, where --range-headroom widens less "
                        "(auto: as --range-headroom; 1.5 for few calibration samples)")
    p.add_argument("--weight-calib-method", choices=["minmax", "minmse"],
                   help="integer weight range method (the integer presets: minmax)")
    p.add_argument("--per-channel", dest="per_channel", action="store_true", default=None)
    p.add_argument("--per-tensor", dest="per_channel", action="store_false")
    p.add_argument("--reduce-range", action="store_true", default=None,
                   help="7-bit int8 weights: avoids int8 saturation in onnxruntime on CPUs without VNNI")
    p.add_argument("--exclude-op-types", default="", help="comma-separated op types to keep float")
    p.add_argument("--quantize-tail", action="store_true", default=None,
                   help="quantize the post-processing after the last Conv/Gemm/MatMul too (box "
                   "decode, scores, final Softmax), which stays float by default; docs/ACCURACY.md")
    p.add_argument("--kept-weights", choices=("float", "half"), default=None,
                   help="how the weights a numerics policy keeps off their grid are stored: float "
                        "(the default: float32, as they came) or half (float16, or bfloat16 where "
                        "float16 would not hold them: half the bytes)")
    p.add_argument("--bias-correction", action="store_true", default=None,
                   help="Conv/Gemm biases absorb the mean error of their quantized weights (a second "
                        "float pass over the calibration data)")
    p.add_argument("--weight-rounding", choices=("auto", "nearest", "gptq"), default=None,
                   help="how integer Conv/Gemm/MatMul weights are rounded: nearest, gptq (codes that "
                        "minimise each layer's output error on the calibration data), or auto (the "
                        "default: gptq where it can run and the whole model scores no worse with it; "
                        "the summary says why not)")
    p.add_argument("--gptq-damp", type=float, default=None, metavar="X",
                   help="GPTQ's dampening, a fraction of the mean input energy (default 0.01)")


#: A --config file is a few hundred bytes; anything far larger is not one.
_MAX_CONFIG_BYTES = 1_000_000


def _add_parallel_args(p: argparse.ArgumentParser, what: str = "calibration shards") -> None:
    g = p.add_mutually_exclusive_group()
    g.add_argument("--workers", type=int, default=None, metavar="N",
                   help=f"run the {what} in N local processes (the same bytes as one process)")
    g.add_argument("--ray", nargs="?", const="", default=None, metavar="ADDRESS",
                   help=f"run the {what} as tasks on a Ray cluster (ADDRESS: 'auto', "
                        "'ray://host:10001'; none: RAY_ADDRESS or a new local cluster; give it after "
                        "the model paths, or as --ray=ADDRESS); needs pip install 'mixq[ray]'")


def _config_given(args: argparse.Namespace) -> bool:
    """Whether any config flag was given (a replayed plan carries its own config)."""
    return bool(args.config or args.preset or args.activation or args.weight or args.calib_method
                or args.minmse_min_gain is not None or args.range_headroom is not None
                or args.output_headroom is not None
                or args.weight_calib_method or args.bias_correction
                or args.weight_rounding or args.gptq_damp is not None
                or args.per_channel is not None or args.reduce_range or args.exclude_op_types
                or args.quantize_tail or args.kept_weights
                or getattr(args, "numerics_policies", None) is False
                or getattr(args, "equalize", None) is False)


def _add_data_args(p: argparse.ArgumentParser, *, calib: bool) -> None:
    """--cast (and --calib-samples for calibration data): see docs/DATA.md."""
    p.add_argument("--cast", action="store_true",
                   help="convert data whose dtype is of another kind than the model input's "
                   "(e.g. uint8 images into a float32 input) instead of refusing it")
    if calib:
        from ..calibration.data import DEFAULT_MAX_SAMPLES

        p.add_argument("--calib-samples", type=int, default=None, metavar="N",
                       help=f"read at most N calibration samples (feeds) per pass (default "
                       f"{DEFAULT_MAX_SAMPLES}; 0 = no bound)")


def _calib_data(args: argparse.Namespace):
    """args.calib, wrapped with --calib-samples / --cast when given."""
    from ..calibration.data import DEFAULT_MAX_SAMPLES, CalibData

    n = getattr(args, "calib_samples", None)
    if args.calib is None and (n is not None or args.cast):
        raise ConfigError(f"{'--cast' if args.cast else '--calib-samples'} applies to the "
                          "calibration data, and no --calib was given; add --calib DATA or drop it")
    if args.calib is None or (n is None and not args.cast):
        return args.calib
    if n is not None and n < 0:
        raise ConfigError(f"--calib-samples {n}: give a positive number of samples, or 0 for "
                          "no bound")
    bound = DEFAULT_MAX_SAMPLES if n is None else (n or None)
    return CalibData(args.calib, max_samples=bound, cast=args.cast)


def _add_finetune_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--finetune", choices=["adaround", "adaquant"],
                   help="fast finetuning before the rewrite (needs torch); other options at the "
                   "vendor's FastFinetune defaults, as QuantizationConfig(include_fast_ft=True)")
    p.add_argument("--ft-iters", type=int, help="finetuning iterations per layer (default: adaround "
                   "1000, adaquant 3000)")
    p.add_argument("--ft-lr", type=float, help="finetuning learning rate (default: adaround 0.1, "
                   "adaquant 1e-5)")


def _finetune_from_args(args: argparse.Namespace):
    if args.finetune is None:
        if args.ft_iters is not None or args.ft_lr is not None:
            raise ConfigError("--ft-iters / --ft-lr need --finetune adaround|adaquant.")
        return None
    from ..compat import finetune_from_cli

    return finetune_from_cli(args.finetune, args.ft_iters, args.ft_lr)


def _headroom_arg(text: str, flag: str = "--range-headroom") -> float | str:
    """--range-headroom's (--output-headroom's) value: 'auto' or a number (QuantConfig checks
    its range)."""
    if text.strip().lower() == "auto":
        return "auto"
    try:
        return float(text)
    except ValueError:
        raise ConfigError(f"{flag} {text!r} must be 'auto' or a number >= 1, e.g. 2.") from None


def _config_from_args(args: argparse.Namespace):
    import json

    from ..config import QuantConfig, get_default_config

    if args.config:
        try:
            path = Path(args.config)
            if path.is_file() and path.stat().st_size > _MAX_CONFIG_BYTES:
                raise ConfigError(f"the config file {args.config!r} is larger than "
                                  f"{_MAX_CONFIG_BYTES // 1000} kB: not a mixq config.")
            d = json.loads(path.read_text())
        except (OSError, ValueError, RecursionError) as exc:
            raise ConfigError(f"cannot read the config file {args.config!r}: "
                              f"{'nested too deeply' if isinstance(exc, RecursionError) else exc}") from exc
        if not isinstance(d, dict):
            raise ConfigError(f"the config file {args.config!r} must hold a JSON object.")
        if args.preset:
            d["preset"] = args.preset
        cfg = QuantConfig.from_dict(d)
    else:
        cfg = get_default_config(args.preset or "A8W8")
    changes = {}
    if args.activation:
        changes["activation"] = args.activation
    if args.weight:
        changes["weight"] = args.weight
    if args.calib_method:
        changes["calibration"] = args.calib_method
        if args.calib_method == "minmse":  # plain MinMSE; the gain means nothing to the others
            changes["minmse_min_gain"] = 1.0
    if args.minmse_min_gain is not None:
        changes["minmse_min_gain"] = args.minmse_min_gain
    if args.range_headroom is not None:
        changes["range_headroom"] = _headroom_arg(args.range_headroom)
    if args.output_headroom is not None:
        changes["output_headroom"] = _headroom_arg(args.output_headroom, "--output-headroom")
    if args.weight_calib_method:
        changes["weight_calibration"] = args.weight_calib_method
    if args.per_channel is not None:
        changes["per_channel"] = args.per_channel
    if args.reduce_range:
        changes["reduce_range"] = True
    if args.bias_correction:
        changes["bias_correction"] = True
    if args.weight_rounding:
        changes["weight_rounding"] = args.weight_rounding
    if args.gptq_damp is not None:
        if (args.weight_rounding or cfg.weight_rounding) == "nearest":
            raise ConfigError("--gptq-damp applies to GPTQ rounding, not to --weight-rounding nearest.")
        changes["gptq_damp"] = args.gptq_damp
    if getattr(args, "numerics_policies", None) is False:
        changes["numerics_policies"] = False
    if getattr(args, "equalize", None) is False:
        changes["equalize"] = False
    if args.quantize_tail:
        changes["quantize_tail"] = True
    if args.kept_weights:
        changes["kept_weights"] = args.kept_weights
    if args.exclude_op_types:
        changes["exclude_op_types"] = frozenset(s for s in args.exclude_op_types.split(",") if s)
    if changes:
        changes["name"] = f"{cfg.name}+custom"
        before, cfg = cfg, cfg.with_options(**changes)
        given = {opt for opt, flag in _SCOPED_FLAGS.items() if getattr(args, flag, None) is not None}
        inert = {k: v for k, v in cfg.inert_changes(before, activations_only=True).items() if k in given}
        if inert:
            opt, why = next(iter(inert.items()))
            flag = "--per-channel/--per-tensor" if opt == "granularity" else "--" + _SCOPED_FLAGS[opt].replace("_", "-")
            if opt == "calibration":
                raise ConfigError(f"--calib-method sets the activations' range method, which changes "
                                  f"nothing with {before.name}: {why}. Drop it (--weight-calib-method "
                                  "sets the integer weights' method).")
            raise ConfigError(f"{flag} changes nothing with {before.name}: {why}. Drop it.")
    return cfg


#: The config options the quantize/plan flags set, by option (argparse dest), which
#: `QuantConfig.why_inert` can find inert.
_SCOPED_FLAGS = {"calibration": "calib_method", "minmse_min_gain": "minmse_min_gain",
                 "range_headroom": "range_headroom", "output_headroom": "output_headroom",
                 "weight_calibration": "weight_calib_method",
                 "granularity": "per_channel", "reduce_range": "reduce_range",
                 "bias_correction": "bias_correction", "gptq_damp": "gptq_damp",
                 "quantize_tail": "quantize_tail", "kept_weights": "kept_weights"}


def cmd_quantize(args: argparse.Namespace) -> int:
    from ..api import quantize
    from ..plan.plan import PrecisionPlan

    from .._io import check_output_path

    check_output_path(args.output, models=[args.input], inputs=[args.calib, args.config, args.plan])
    plan = _read_plan(args.plan) if args.plan else None
    # a replayed plan carries the config that made it; flags beside it must agree with it
    cfg = _config_from_args(args) if plan is None or _config_given(args) else None
    ft = _finetune_from_args(args)
    from ..distributed import executor_from

    executor = executor_from(args.workers, args.ray)
    try:
        with _progress("calibrating") as tick:
            res = quantize(args.input, cfg, _calib_data(args), output_path=args.output, plan=plan,
                           progress=tick, finetune=ft, strict=args.strict, executor=executor)
    finally:
        if executor is not None:
            executor.close()
    print(res.summary())
    print(f"\nwrote {res.output_path}")
    return 0


def _read_plan(path: str):
    from ..plan.plan import PrecisionPlan

    try:
        return PrecisionPlan.from_json(Path(path).read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read the plan file {path!r}: {exc}; give the JSON file "
                          "written by `mixq plan -o`.") from exc
    except (ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"the plan file {path!r} is not a mixq plan ({exc}); write one with "
                          "`mixq plan MODEL -o plan.json`.") from exc


def cmd_check(args: argparse.Namespace) -> int:
    from ..check import check_model_support

    rep = check_model_support(args.model)
    print(rep.table())
    return 0 if rep.ok else 1


def cmd_plan(args: argparse.Namespace) -> int:
    from ..pipeline import Pipeline

    cfg = _config_from_args(args)
    plan = Pipeline.load(args.model, equalize=cfg.equalize, keep_nodes=cfg.named_nodes()).plan(cfg)
    print(plan.table())
    print(f"\n{sum(tp.format is not None for tp in plan.tensors.values())} tensors quantized, "
          f"{sum(tp.format is None for tp in plan.tensors.values()) + len(plan.skipped)} float "
          f"tensors left float (each with its reason above), {len(plan.float_nodes)} nodes left float")
    if args.output:
        from .._io import write_output

        write_output(args.output, plan.to_json().encode(), models=[args.model],
                     inputs=[args.config], kind="plan JSON", example="plan.json")
        print(f"\nwrote {args.output}")
    return 0


def _init_bytes(t) -> int:
    """Stored bytes of an initializer (external data by its recorded length)."""
    from onnx import numpy_helper

    if t.data_location == t.EXTERNAL:
        ext = {e.key: e.value for e in t.external_data}
        if "length" in ext:
            return int(ext["length"])
    if t.raw_data:
        return len(t.raw_data)
    try:
        return int(numpy_helper.to_array(t).nbytes)
    except Exception:  # noqa: BLE001 - an unreadable tensor counts nothing, the model check says why
        return 0


def formats_in_use(m) -> Counter:
    """Counter of (tensor role, format) over the model: activations and weights of QDQ pairs
    (by their quantized type), Casts to narrower floats, mixq block-format functions (by name)
    and float weights left as they are."""
    from onnx import helper

    inits = {t.name: t for t in m.graph.initializer}

    def tname(et: int) -> str:
        name = helper.tensor_dtype_to_string(et).replace("TensorProto.", "").lower()
        return {"float": "float32", "double": "float64"}.get(name, name)

    fmt: Counter = Counter()
    quantized: set[str] = set()
    for n in m.graph.node:
        if n.op_type == "QuantizeLinear" and n.domain in ("", "ai.onnx") and n.input[0] not in inits:
            zp = inits.get(n.input[2]) if len(n.input) > 2 and n.input[2] else None
            attr = {a.name: a.i for a in n.attribute}
            et = zp.data_type if zp is not None else attr.get("output_dtype") or 2  # uint8
            fmt[("activation", f"QDQ {tname(et)}")] += 1
        elif n.op_type in ("DequantizeLinear", "Cast") and n.domain in ("", "ai.onnx") \
                and n.input[0] in inits:
            t = inits[n.input[0]]
            role = "bias" if n.op_type == "DequantizeLinear" and len(t.dims) == 1 and \
                t.data_type == 6 else "weight"  # int32 vectors are biases
            kind = "QDQ" if n.op_type == "DequantizeLinear" else "stored"
            fmt[(role, f"{kind} {tname(t.data_type)}")] += 1
            quantized.add(t.name)
        elif n.op_type == "Cast" and n.domain in ("", "ai.onnx"):
            to = next((a.i for a in n.attribute if a.name == "to"), 0)
            if to not in (1, 11):  # a cast back to float32/64 is the other half of the pair
                fmt[("activation", f"Cast {tname(to)}")] += 1
        elif n.domain == "com.mixq":
            name = n.op_type.split("_axis")[0]
            if any(i in inits for i in n.input):
                quantized.update(i for i in n.input if i in inits)
                fmt[("weight", f"mixq {name}")] += 1
            else:
                fmt[("activation", f"mixq {name}")] += 1
    for t in inits.values():
        if t.name not in quantized and t.data_type in (1, 10, 11, 16) and len(t.dims) >= 2:
            fmt[("weight", f"unquantized {tname(t.data_type)}")] += 1
    return fmt


def cmd_inspect(args: argparse.Namespace) -> int:
    from .._io import load_model

    m = load_model(args.model)
    ops = Counter(n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}.{n.op_type}" for n in m.graph.node)
    print(f"model: {args.model}")
    opsets = ", ".join(f"{i.domain or 'ai.onnx'}:{i.version}" for i in m.opset_import)
    print(f"opset: {opsets}")
    weights = sum(_init_bytes(t) for t in m.graph.initializer)
    print(f"size: {m.ByteSize() / 1e6:.3f} MB (graph), deployed weights {weights / 1e6:.3f} MB "
          f"(MB = 10^6 bytes), nodes: {len(m.graph.node)}, initializers: {len(m.graph.initializer)}")
    print("inputs: " + ", ".join(i.name for i in m.graph.input))
    print("outputs: " + ", ".join(o.name for o in m.graph.output))
    fmts = formats_in_use(m)
    print("\nformats in use:\n| role | format | tensors |\n|---|---|---|")
    for (role, f), c in sorted(fmts.items()):
        print(f"| {role} | {f} | {c} |")
    if not fmts:
        print("| - | no quantized tensors, no float weights | 0 |")
    print("\n| op | count |\n|---|---|")
    for op, c in ops.most_common():
        print(f"| {op} | {c} |")
    return 0


def _read_labels(path: str) -> np.ndarray:
    """The --labels .npy: a 1-D array of integer class indices, never unpickled."""
    from ..errors import DataError

    p = Path(path)
    if not p.is_file():
        raise DataError(f"--labels {path!r} {'is not a file' if p.exists() else 'does not exist'}"
                        "; give a .npy file of integer class indices, one per sample")
    try:
        labels = np.load(p, allow_pickle=False)
    except ValueError as exc:  # object arrays, bad headers
        raise DataError(f"--labels {path!r} cannot be read as a numeric .npy ({exc}); mixq never "
                        "unpickles: save the labels with np.save(path, np.asarray(labels, "
                        "np.int64))") from exc
    except (OSError, EOFError) as exc:
        raise DataError(f"cannot read --labels {path!r}: {exc}") from exc
    if not isinstance(labels, np.ndarray):  # an .npz archive
        labels.close()
        raise DataError(f"--labels {path!r} is an .npz archive; give a .npy file holding one "
                        "1-D integer array")
    if labels.ndim != 1:
        raise DataError(f"--labels {path!r} has shape {labels.shape}; give a 1-D array of class "
                        "indices, one per sample")
    if labels.dtype.kind not in "iu":
        raise DataError(f"--labels {path!r} has dtype {labels.dtype}; give integer class indices "
                        "(np.int64), not scores or one-hot rows")
    return labels


def _check_same_inputs(fm, qm) -> None:
    """The quantized model must take the float model's inputs (names and dtypes)."""
    from ..calibration.data import input_specs_from_model
    from ..errors import DataError

    f = {s.name: s.dtype for s in input_specs_from_model(fm)}
    q = {s.name: s.dtype for s in input_specs_from_model(qm)}
    if f != q:
        fs = ", ".join(f"{k} ({v})" for k, v in f.items())
        qs = ", ".join(f"{k} ({v})" for k, v in q.items())
        raise DataError(f"the two models take different inputs: float model {fs}; quantized "
                        f"model {qs}. Compare a model with its own quantized version.")


def _check_classifier_output(fm) -> None:
    """--labels are compared with the argmax over classes of the first output: it must be
    (batch, classes) where its rank is known."""
    from ..errors import DataError

    out = fm.graph.output[0]
    tt = out.type.tensor_type
    if tt.HasField("shape") and len(tt.shape.dim) != 2:
        dims = ", ".join(d.dim_param or str(d.dim_value) if (d.dim_param or d.HasField("dim_value"))
                         else "?" for d in tt.shape.dim)
        raise DataError(f"--labels are compared with the argmax over classes of the first output, "
                        f"which must be (batch, classes); output {out.name!r} has shape ({dims}). "
                        "Drop --labels (the SQNR/cosine table needs none)")


def _count_labelled(feeds, labels: np.ndarray, data: str):
    """Pass `feeds` through, refusing as soon as the samples outnumber `labels`, and at the end
    when they are fewer (a partial match would print a wrong accuracy)."""
    from ..errors import DataError

    seen = 0
    for feed in feeds:
        first = next(iter(feed.values()))
        seen += first.shape[0] if first.ndim else 1
        if seen > len(labels):
            raise DataError(f"--labels holds {len(labels)} labels but --data {data!r} has more "
                            f"samples (at least {seen}); give one label per sample")
        yield feed
    if seen != len(labels):
        raise DataError(f"--labels holds {len(labels)} labels but --data {data!r} has {seen} "
                        "samples; give one label per sample")


def cmd_eval(args: argparse.Namespace) -> int:
    from .._io import load_model
    from ..calibration import as_feeds
    from ..evaluate import compare

    fm, qm = load_model(args.float_model), load_model(args.quant_model)
    labels = _read_labels(args.labels) if args.labels else None
    _check_same_inputs(fm, qm)
    if labels is not None:
        _check_classifier_output(fm)
    rows = []
    from .._progress import track
    from ..calibration.collect import count_batches
    from ..calibration.data import input_specs_from_model

    total = count_batches(args.data, input_specs_from_model(fm))
    for optimize in (True, False):
        feeds = as_feeds(args.data, fm, max_samples=None, cast=args.cast)  # every sample counts
        if labels is not None:
            feeds = _count_labelled(feeds, labels, args.data)
        feeds = track(feeds, "evaluating" + ("" if optimize else " (optimizations disabled)"),
                      total=total)
        c = compare(fm, qm, feeds, labels=labels, optimize=optimize)
        rows.append((optimize, c))
    print("| output | optimizations | SQNR dB | cosine | max abs err | top-1 agreement |")
    print("|---|---|---|---|---|---|")
    for optimize, c in rows:
        for o in c.outputs:
            top1 = f"{o.top1_agreement:.4f}" if o.top1_agreement is not None else "-"
            print(f"| {o.name} | {'default' if optimize else 'disabled'} | {o.sqnr_db:.2f} | "
                  f"{o.cosine:.6f} | {o.max_abs_err:.4g} | {top1} |")
    c = rows[0][1]
    if c.accuracy_float is not None:
        print(f"\naccuracy: float {c.accuracy_float:.4f}, quantized {c.accuracy_quant:.4f}")
    d = rows[0][1].first().sqnr_db - rows[1][1].first().sqnr_db
    if abs(d) > 3:
        print(f"\nwarning: onnxruntime's optimized kernels change the SQNR by {d:+.1f} dB; on CPUs "
              "without VNNI signed int8 activations can saturate: try --preset U8S8.")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from ..demo import run_demo

    return run_demo(presets=args.presets.split(",") if args.presets else None)


def _load_evaluate_function(spec: str):
    """`module:function` or `path/to/file.py:function` -> the callable (imported with importlib,
    never evaluated as text)."""
    import importlib
    import importlib.util
    import os

    module, _, name = spec.rpartition(":")
    if not module or not name or not name.isidentifier():
        raise ConfigError(f"--metric {spec!r}: write a metric name (l2, sqnr, cosine, agreement, "
                          "top1) or MODULE:FUNCTION, e.g. my_eval:evaluate or my_eval.py:evaluate.")
    try:
        if module.endswith(".py") or os.sep in module or "/" in module:
            if not os.path.isfile(module):
                raise ConfigError(f"--metric {spec!r}: no file {module!r}.")
            mspec = importlib.util.spec_from_file_location(
                os.path.splitext(os.path.basename(module))[0], module)
            if mspec is None or mspec.loader is None:
                raise ConfigError(f"--metric {spec!r}: {module!r} is not an importable Python file.")
            mod = importlib.util.module_from_spec(mspec)
            mspec.loader.exec_module(mod)
        else:
            # the working directory first, as `python -m` does: the user's own module
            sys.path.insert(0, os.getcwd())
            try:
                mod = importlib.import_module(module)
            finally:
                sys.path.remove(os.getcwd())
    except ConfigError:
        raise
    except ImportError as exc:
        raise ConfigError(f"--metric {spec!r}: cannot import {module!r}: {exc}.") from exc
    except Exception as exc:  # the user's module failed while loading: say where
        raise ConfigError(f"--metric {spec!r}: importing {module!r} raised "
                          f"{type(exc).__name__}: {exc}.") from exc
    fn = getattr(mod, name, None)
    if not callable(fn):
        raise ConfigError(f"--metric {spec!r}: {module!r} has no function {name!r}; it must be "
                          "f(model_path) -> number.")
    return fn


def cmd_auto(args: argparse.Namespace) -> int:
    from ..search import AutoConfig, auto_quantize, base_from_candidate, parse_candidates
    from ..search.auto import default_cache_dir
    from ..search.objectives import METRICS

    cands = parse_candidates(args.candidates)
    if len(cands) < 2:
        from ..errors import ConfigError

        raise ConfigError("--candidates needs the wide base first and at least one narrower "
                          "precision, e.g. int16/int8,int8.")
    labels = _read_labels(args.labels) if args.labels else None
    metric, evaluate_function = args.metric, None
    if metric is not None and metric not in METRICS:
        if ":" not in metric:
            from ..errors import ConfigError, did_you_mean

            raise ConfigError(f"--metric {metric!r}: choose one of l2, sqnr, cosine, agreement, "
                              "top1, or MODULE:FUNCTION." + did_you_mean(metric, METRICS))
        evaluate_function, metric = _load_evaluate_function(metric), "function"
    if args.target is not None and metric is None:
        from ..errors import ConfigError

        raise ConfigError("--target needs --metric (l2, sqnr, cosine, agreement, top1 or "
                          "MODULE:FUNCTION); or use --l2-target / --top1-drop.")
    base = base_from_candidate(cands[0], args.preset)
    if args.weight_rounding:
        base = base.with_options(weight_rounding=args.weight_rounding)
    auto = AutoConfig(base=base, candidates=tuple(cands[1:]),
                      op_types=frozenset(args.op_types.split(",")), l2_target=args.l2_target,
                      top1_drop=args.top1_drop, max_size_mb=args.max_size_mb,
                      max_avg_bits=args.max_avg_bits, output_index=args.output_index,
                      strategy=args.strategy, time_budget_s=args.time_budget,
                      cache_dir=None if args.no_cache else (args.cache_dir or default_cache_dir()),
                      metric=metric, target=args.target, confidence=args.confidence,
                      refine=args.refine, kept_weights=args.kept_weights)
    from .._io import check_output_path
    from .._progress import StageProgress

    check_output_path(args.output, models=[args.input],  # before the search, not after it
                      inputs=[args.calib, args.eval, args.labels, args.check])
    import warnings

    from ..calibration.variety import ConstantDataWarning
    from ..distributed import executor_from
    from ..search.auto import TargetNotMetWarning

    progress = StageProgress()
    executor = executor_from(args.workers, args.ray)
    try:
        with warnings.catch_warnings():  # the message is printed below, with the exit code
            warnings.simplefilter("ignore", TargetNotMetWarning)
            warnings.simplefilter("ignore", ConstantDataWarning)
            res = auto_quantize(args.input, auto, args.calib, args.eval, labels=labels,
                                evaluate_function=evaluate_function, output_path=args.output,
                                report_dir=args.report_dir, progress=progress,
                                check_data=args.check, executor=executor)
    finally:
        progress.close()
        if executor is not None:
            executor.close()
    from ..report.auto_report import to_markdown

    print(to_markdown(res))
    print(f"wrote {res.output_path}" + (f" and the report in {args.report_dir}" if args.report_dir else ""))
    if not res.target_met or res.check_met is False:
        print(f"mixq: {res.message}", file=sys.stderr)
        return AUTO_TARGET_MISSED
    if res.message.startswith("WARNING: "):  # met, on data that cannot vouch for it
        print(f"mixq: {res.message}", file=sys.stderr)
    return 0


#: `mixq auto`'s exit code when the target is not met (the best model found is still written)
AUTO_TARGET_MISSED = 3


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mixq", description="Mixed-precision quantization of ONNX models.")
    sub = p.add_subparsers(dest="command", required=True)

    q = sub.add_parser("quantize", help="quantize a model")
    q.add_argument("input")
    q.add_argument("output")
    q.add_argument("--calib", help="calibration data: .npz, .npy or a folder of them; an .npz "
                   "may also hold one array per sample and input, keyed SAMPLE/INPUT (e.g. 00000/image)")
    q.add_argument("--plan", help="replay a precision plan saved by `mixq plan -o`")
    q.add_argument("--strict", action="store_true",
                   help="exit non-zero, writing nothing, when the fidelity guard finds the "
                   "quantized model broken (top-1 agreement < 90 %% or SQNR < 10 dB vs float), or "
                   "onnxruntime's default optimizations compute something else than its QDQ graph")
    q.add_argument("--no-numerics-policies", dest="numerics_policies", action="store_false",
                   default=None, help="quantize every planned tensor even where a uniform grid "
                   "breaks it (masks, Log/Reciprocal inputs, cancellation); see docs/ACCURACY.md")
    q.add_argument("--no-equalize", dest="equalize", action="store_false", default=None,
                   help="leave every layer pair as it is, even where its channels' ranges are too far "
                   "apart for one activation grid (see docs/ACCURACY.md)")
    _add_data_args(q, calib=True)
    _add_parallel_args(q)
    _add_config_args(q)
    _add_finetune_args(q)
    q.set_defaults(func=cmd_quantize)

    pl = sub.add_parser("plan", help="print (and save) the precision plan a config gives")
    pl.add_argument("model")
    pl.add_argument("-o", "--output", help="write the plan as JSON")
    _add_config_args(pl)
    pl.set_defaults(func=cmd_plan)

    c = sub.add_parser("check", help="what mixq can and cannot quantize in a model, and why "
                       "(before any work; exit 1 when there are problems to fix)")
    c.add_argument("model")
    c.set_defaults(func=cmd_check)

    i = sub.add_parser("inspect", help="ops, formats in use and size of a model")
    i.add_argument("model")
    i.set_defaults(func=cmd_inspect)

    e = sub.add_parser("eval", help="compare a quantized model with its float original")
    e.add_argument("float_model")
    e.add_argument("quant_model")
    e.add_argument("--data", required=True, help=".npz, .npy or folder of inputs")
    e.add_argument("--labels", help=".npy of integer labels (first output's argmax is compared)")
    _add_data_args(e, calib=False)
    e.set_defaults(func=cmd_eval)

    a = sub.add_parser("auto", help="automatic mixed precision to an accuracy or size target")
    a.add_argument("input")
    a.add_argument("output")
    a.add_argument("--calib", required=True, help="calibration data: .npz, .npy or a folder; an "
                   ".npz may also hold one array per sample and input, keyed SAMPLE/INPUT "
                   "(e.g. 00000/image)")
    a.add_argument("--eval", help="held-out data the decisions are checked on (default: the "
                   "last quarter of --calib)")
    a.add_argument("--check", help="data the search never sees: the chosen model's metric on it "
                   f"is reported, and a miss there exits {AUTO_TARGET_MISSED} too (l2, sqnr, cosine, agreement)")
    a.add_argument("--candidates", default="int16/int8,int8,int8/int4",
                   help="the wide base first, then narrower precisions: FORMAT or ACT/WEIGHT "
                   "(default int16/int8,int8,int8/int4: int4 weights let the size go below "
                   "A8W8)")
    a.add_argument("--preset", help="preset whose options (calibration, symmetry...) the base uses "
                   "(default: the preset of the base's formats, A16W8 for int16/int8 and A8W8 for "
                   "int8; otherwise symmetric activations, MinMax ranges)")
    a.add_argument("--metric", help="what the target is on: l2 (relative L2 of the output to "
                   "float), sqnr (dB), cosine (mean cosine similarity of output rows with float), "
                   "agreement (top-1 agreement with float), top1 (accuracy; needs --labels), or "
                   "MODULE:FUNCTION / FILE.py:FUNCTION, your f(model_path) -> number (higher is "
                   "better unless it has higher_is_better = False)")
    a.add_argument("--target", type=float, help="the target in the metric's units: the largest "
                   "relative L2 (l2), the smallest dB (sqnr), else the largest allowed drop from "
                   "the float model (e.g. 0.01). A target that cannot be met ends with a message "
                   f"and exit code {AUTO_TARGET_MISSED}; the best model found is still written")
    a.add_argument("--confidence", type=float, default=0.9,
                   help="a plan meets an accuracy target only when the one-sided upper bound of "
                   "its drop at this confidence does (Student's t over per-sample drops; each "
                   "sample's flip risk from its top-1 lead for agreement and top1; exact binomial "
                   "bounds for pass/fail scores), so that it holds on other data from the same "
                   "source too (default 0.9; 0.5: the measured drop alone). Applies to cosine, "
                   "agreement, top1 and functions that return per-sample scores")
    a.add_argument("--refine", type=int, default=3, metavar="N",
                   help="after the strategy's point, at most N more evaluations try the "
                   "weight-narrowing moves past the one that broke the target, one at a time, "
                   "each kept when the plan still meets it (default 3; 0: none)")
    a.add_argument("--kept-weights", choices=("half", "float"), default="half",
                   help="how every plan stores the weights a numerics policy keeps off their "
                   "grid: half (the default: float16, or bfloat16 where float16 would not hold "
                   "them) or float (float32)")
    a.add_argument("--l2-target", type=float, help="max relative L2 of the output to float "
                   "(= --metric l2 --target X)")
    a.add_argument("--top1-drop", type=float, help="max top-1 drop (needs --labels; "
                   "= --metric top1 --target X)")
    a.add_argument("--weight-rounding", choices=("auto", "nearest", "gptq"), default=None,
                   help="how every plan's integer Conv/Gemm/MatMul weights are rounded: GPTQ (auto, "
                   "the default: where any candidate has integer weights; gptq: an error where none "
                   "has) or nearest")
    a.add_argument("--labels", help=".npy of integer labels of the --eval data")
    a.add_argument("--max-size-mb", type=float, help="weight size budget in MB")
    a.add_argument("--max-avg-bits", type=float, help="average weight bits budget")
    a.add_argument("--output-index", type=int, default=0)
    a.add_argument("--op-types", default="all",
                   help="op types whose nodes the search may give another precision, comma "
                   "separated, or 'all' (default): every op that quantizes a tensor of its own "
                   "(element-wise ops, Softmax, Concat... as well as Conv/Gemm/MatMul)")
    a.add_argument("--strategy", default="bisection", choices=["bisection", "guided", "greedy", "pareto"])
    a.add_argument("--time-budget", type=float, help="seconds; the best plan so far is returned")
    a.add_argument("--report-dir", help="write report.md, report.json and PNG plots here")
    a.add_argument("--cache-dir", default=None,
                   help="where sensitivities, statistics and evaluations are cached so that a "
                   "rerun is instant (default: $MIXQ_CACHE_DIR, else ~/.cache/mixq); the cache "
                   "is bounded to $MIXQ_CACHE_MAX_MB MB (default 100), oldest files evicted first")
    a.add_argument("--no-cache", action="store_true", help="neither read nor write the cache")
    _add_parallel_args(a, "calibration shards, per-layer sensitivities and candidate evaluations "
                       "(the bisection evaluates its likely next points at once)")
    a.set_defaults(func=cmd_auto)

    d = sub.add_parser("demo", help="quantize the embedded model with several presets")
    d.add_argument("--presets", help="comma-separated presets")
    d.set_defaults(func=cmd_demo)

    from ..convert.cli import add_convert_subparser

    add_convert_subparser(sub)
    return p


def _add_quiet(parser: argparse.ArgumentParser, top: bool = False) -> None:
    """--quiet on `parser` and every subcommand under it (so it may go before or after the
    command name)."""
    parser.add_argument("-q", "--quiet", action="store_true",
                        default=False if top else argparse.SUPPRESS,
                        help="no progress display on stderr (results still go to stdout)")
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):
                _add_quiet(sub)


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the process exit code (2 for mixq errors, with the message; 0 when
    the reader of stdout closed the pipe, e.g. `mixq inspect m.onnx | head -1`)."""
    from .. import _progress
    from .._progress import set_quiet, stdout_closed

    parser = build_parser()
    _add_quiet(parser, top=True)
    args = parser.parse_args(argv)
    was_quiet = _progress._quiet
    set_quiet(args.quiet)  # for this run only: main() called in-process must not leak it
    try:
        code = int(args.func(args) or 0)
        sys.stdout.flush()  # here, where a closed pipe can still be handled
        return code
    except BrokenPipeError:
        return stdout_closed()
    except MixqError as exc:
        print(f"mixq: error: {exc}", file=sys.stderr)
        return 2
    finally:
        set_quiet(was_quiet)


if __name__ == "__main__":
    sys.exit(main())
