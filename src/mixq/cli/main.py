"""The `mixq` command line: quantize, plan, inspect, eval, demo, convert."""
from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np

from ..errors import MixqError


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
    p.add_argument("--calib-method", choices=["minmax", "percentile", "entropy", "minmse"])
    p.add_argument("--per-channel", dest="per_channel", action="store_true", default=None)
    p.add_argument("--per-tensor", dest="per_channel", action="store_false")
    p.add_argument("--reduce-range", action="store_true", default=None,
                   help="7-bit int8 weights: avoids int8 saturation in onnxruntime on CPUs without VNNI")
    p.add_argument("--exclude-op-types", default="", help="comma-separated op types to keep float")


def _add_parallel_args(p: argparse.ArgumentParser) -> None:
    g = p.add_mutually_exclusive_group()
    g.add_argument("--workers", type=int, default=None, metavar="N",
                   help="calibrate N shards of the data in N local processes (the same bytes "
                        "as one process)")
    g.add_argument("--ray", nargs="?", const="", default=None, metavar="ADDRESS",
                   help="calibrate shards as tasks on a Ray cluster (ADDRESS: 'auto', "
                        "'ray://host:10001'; none: RAY_ADDRESS or a new local cluster; give it after "
                        "the model paths, or as --ray=ADDRESS); needs pip install 'mixq[ray]'")


def _config_given(args: argparse.Namespace) -> bool:
    """Whether any config flag was given (a replayed plan carries its own config)."""
    return bool(args.config or args.preset or args.activation or args.weight or args.calib_method
                or args.per_channel is not None or args.reduce_range or args.exclude_op_types)


def _config_from_args(args: argparse.Namespace):
    import json

    from ..config import QuantConfig, get_default_config
    from ..errors import ConfigError

    if args.config:
        try:
            d = json.loads(Path(args.config).read_text())
        except (OSError, ValueError) as exc:
            raise ConfigError(f"cannot read the config file {args.config!r}: {exc}") from exc
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
    if args.per_channel is not None:
        changes["per_channel"] = args.per_channel
    if args.reduce_range:
        changes["reduce_range"] = True
    if args.exclude_op_types:
        changes["exclude_op_types"] = frozenset(s for s in args.exclude_op_types.split(",") if s)
    if changes:
        changes["name"] = f"{cfg.name}+custom"
        cfg = cfg.with_options(**changes)
    return cfg


def cmd_quantize(args: argparse.Namespace) -> int:
    from ..api import quantize
    from ..plan.plan import PrecisionPlan

    from .._io import check_output_path

    check_output_path(args.output, models=[args.input], inputs=[args.calib, args.config, args.plan])
    plan = _read_plan(args.plan) if args.plan else None
    # a replayed plan carries the config that made it; flags beside it must agree with it
    cfg = _config_from_args(args) if plan is None or _config_given(args) else None
    from ..distributed import executor_from

    executor = executor_from(args.workers, args.ray)
    try:
        with _progress("calibrating") as tick:
            res = quantize(args.input, cfg, args.calib, output_path=args.output, plan=plan,
                           progress=tick, executor=executor)
    finally:
        if executor is not None:
            executor.close()
    print(res.summary())
    print(f"\nwrote {res.output_path}")
    return 0


def _read_plan(path: str):
    from ..errors import ConfigError
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
    plan = Pipeline.load(args.model).plan(cfg)
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


def cmd_inspect(args: argparse.Namespace) -> int:
    from .._io import load_model

    m = load_model(args.model)
    ops = Counter(n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}.{n.op_type}" for n in m.graph.node)
    qtypes = Counter()
    for n in m.graph.node:
        if n.op_type == "DequantizeLinear":
            qtypes["QDQ"] += 1
        elif n.domain == "com.mixq":
            qtypes[n.op_type] += 1
    print(f"model: {args.model}")
    opsets = ", ".join(f"{i.domain or 'ai.onnx'}:{i.version}" for i in m.opset_import)
    print(f"opset: {opsets}")
    print(f"size: {m.ByteSize() / 1e6:.3f} MB, nodes: {len(m.graph.node)}, initializers: {len(m.graph.initializer)}")
    print("inputs: " + ", ".join(i.name for i in m.graph.input))
    print("outputs: " + ", ".join(o.name for o in m.graph.output))
    print("\n| op | count |\n|---|---|")
    for op, c in ops.most_common():
        print(f"| {op} | {c} |")
    if qtypes:
        print("\nquantization nodes: " + ", ".join(f"{k} x{v}" for k, v in qtypes.items()))
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    from .._io import load_model
    from ..calibration import as_feeds
    from ..evaluate import compare

    fm, qm = load_model(args.float_model), load_model(args.quant_model)
    labels = np.load(args.labels, allow_pickle=False) if args.labels else None
    rows = []
    from .._progress import track
    from ..calibration.collect import count_batches
    from ..calibration.data import input_specs_from_model

    total = count_batches(args.data, input_specs_from_model(fm))
    for optimize in (True, False):
        feeds = track(as_feeds(args.data, fm), "evaluating" + ("" if optimize else
                      " (optimizations disabled)"), total=total)
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


def cmd_auto(args: argparse.Namespace) -> int:
    from ..search import AutoConfig, auto_quantize, base_from_candidate, parse_candidates
    from ..search.auto import default_cache_dir

    cands = parse_candidates(args.candidates)
    if len(cands) < 2:
        from ..errors import ConfigError

        raise ConfigError("--candidates needs the wide base first and at least one narrower "
                          "precision, e.g. int16/int8,int8.")
    labels = np.load(args.labels, allow_pickle=False) if args.labels else None
    auto = AutoConfig(base=base_from_candidate(cands[0], args.preset), candidates=tuple(cands[1:]),
                      op_types=frozenset(args.op_types.split(",")), l2_target=args.l2_target,
                      top1_drop=args.top1_drop, max_size_mb=args.max_size_mb,
                      max_avg_bits=args.max_avg_bits, output_index=args.output_index,
                      strategy=args.strategy, time_budget_s=args.time_budget,
                      cache_dir=None if args.no_cache else (args.cache_dir or default_cache_dir()))
    from .._io import check_output_path
    from .._progress import StageProgress

    check_output_path(args.output, models=[args.input],  # before the search, not after it
                      inputs=[args.calib, args.eval, args.labels])
    progress = StageProgress()
    try:
        res = auto_quantize(args.input, auto, args.calib, args.eval, labels=labels,
                            output_path=args.output, report_dir=args.report_dir, progress=progress)
    finally:
        progress.close()
    from ..report.auto_report import to_markdown

    print(to_markdown(res))
    print(f"wrote {res.output_path}" + (f" and the report in {args.report_dir}" if args.report_dir else ""))
    return 0 if res.target_met else 1


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mixq", description="Mixed-precision quantization of ONNX models.")
    sub = p.add_subparsers(dest="command", required=True)

    q = sub.add_parser("quantize", help="quantize a model")
    q.add_argument("input")
    q.add_argument("output")
    q.add_argument("--calib", help="calibration data: .npz, .npy or a folder of them")
    q.add_argument("--plan", help="replay a precision plan saved by `mixq plan -o`")
    _add_parallel_args(q)
    _add_config_args(q)
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
    e.set_defaults(func=cmd_eval)

    a = sub.add_parser("auto", help="automatic mixed precision to an accuracy or size target")
    a.add_argument("input")
    a.add_argument("output")
    a.add_argument("--calib", required=True, help="calibration data: .npz, .npy or a folder")
    a.add_argument("--eval", help="held-out data the decisions are checked on (default: the "
                   "last quarter of --calib)")
    a.add_argument("--candidates", default="int16/int8,int8",
                   help="the wide base first, then narrower precisions: FORMAT or ACT/WEIGHT")
    a.add_argument("--preset", help="preset whose options (calibration, symmetry...) the base uses")
    a.add_argument("--l2-target", type=float, help="max relative L2 of the output to float")
    a.add_argument("--top1-drop", type=float, help="max top-1 drop (needs --labels)")
    a.add_argument("--labels", help=".npy of integer labels of the --eval data")
    a.add_argument("--max-size-mb", type=float, help="weight size budget in MB")
    a.add_argument("--max-avg-bits", type=float, help="average weight bits budget")
    a.add_argument("--output-index", type=int, default=0)
    a.add_argument("--op-types", default="Conv,ConvTranspose,Gemm,MatMul")
    a.add_argument("--strategy", default="bisection", choices=["bisection", "guided", "greedy", "pareto"])
    a.add_argument("--time-budget", type=float, help="seconds; the best plan so far is returned")
    a.add_argument("--report-dir", help="write report.md, report.json and PNG plots here")
    a.add_argument("--cache-dir", default=None,
                   help="where sensitivities, statistics and evaluations are cached so that a "
                   "rerun is instant (default: $MIXQ_CACHE_DIR, else ~/.cache/mixq); the cache "
                   "is bounded to $MIXQ_CACHE_MAX_MB MB (default 100), oldest files evicted first")
    a.add_argument("--no-cache", action="store_true", help="neither read nor write the cache")
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


def _stdout_closed() -> int:
    """The reader of stdout went away (`mixq ... | head -1`): stop quietly, as other command
    line tools do. Later writes (and the flush at exit) go to /dev/null instead of raising."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # stdout is not a real file: nothing left to flush there
        pass
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the process exit code (2 for mixq errors, with the message; 0 when
    the reader of stdout closed the pipe, e.g. `mixq inspect m.onnx | head -1`)."""
    from .._progress import set_quiet

    parser = build_parser()
    _add_quiet(parser, top=True)
    args = parser.parse_args(argv)
    set_quiet(args.quiet)
    try:
        code = int(args.func(args) or 0)
        sys.stdout.flush()  # here, where a closed pipe can still be handled
        return code
    except BrokenPipeError:
        return _stdout_closed()
    except MixqError as exc:
        print(f"mixq: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
