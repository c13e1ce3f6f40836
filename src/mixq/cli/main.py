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
    """A minimal progress indicator on stderr (one line, updated in place)."""
    if not sys.stderr.isatty():
        return None

    def tick(i: int) -> None:
        sys.stderr.write(f"\r{prefix}: batch {i + 1}")
        sys.stderr.flush()

    return tick


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

    cfg = _config_from_args(args)
    plan = PrecisionPlan.from_json(Path(args.plan).read_text()) if args.plan else None
    res = quantize(args.input, cfg, args.calib, output_path=args.output, plan=plan,
                   progress=_progress("calibrating"))
    if sys.stderr.isatty():
        sys.stderr.write("\n")
    print(res.summary())
    print(f"\nwrote {res.output_path}")
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    from .._io import load_model
    from ..api import _ensure_node_names
    from ..passes.prepare import prepare
    from ..plan.rules import build_plan

    cfg = _config_from_args(args)
    model, _ = prepare(load_model(args.model))
    _ensure_node_names(model)
    plan = build_plan(model, cfg)
    print(plan.table())
    if args.output:
        from .._io import _atomic_write

        _atomic_write(Path(args.output), plan.to_json().encode())
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
    from ..api import _input_specs
    from ..calibration import as_feeds
    from ..evaluate import compare

    fm, qm = load_model(args.float_model), load_model(args.quant_model)
    labels = np.load(args.labels, allow_pickle=False) if args.labels else None
    rows = []
    for optimize in (True, False):
        feeds = as_feeds(args.data, _input_specs(fm))
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


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mixq", description="Mixed-precision quantization of ONNX models.")
    sub = p.add_subparsers(dest="command", required=True)

    q = sub.add_parser("quantize", help="quantize a model")
    q.add_argument("input")
    q.add_argument("output")
    q.add_argument("--calib", help="calibration data: .npz, .npy or a folder of them")
    q.add_argument("--plan", help="replay a precision plan saved by `mixq plan -o`")
    _add_config_args(q)
    q.set_defaults(func=cmd_quantize)

    pl = sub.add_parser("plan", help="print (and save) the precision plan a config gives")
    pl.add_argument("model")
    pl.add_argument("-o", "--output", help="write the plan as JSON")
    _add_config_args(pl)
    pl.set_defaults(func=cmd_plan)

    i = sub.add_parser("inspect", help="ops, formats in use and size of a model")
    i.add_argument("model")
    i.set_defaults(func=cmd_inspect)

    e = sub.add_parser("eval", help="compare a quantized model with its float original")
    e.add_argument("float_model")
    e.add_argument("quant_model")
    e.add_argument("--data", required=True, help=".npz, .npy or folder of inputs")
    e.add_argument("--labels", help=".npy of integer labels (first output's argmax is compared)")
    e.set_defaults(func=cmd_eval)

    d = sub.add_parser("demo", help="quantize the embedded model with several presets")
    d.add_argument("--presets", help="comma-separated presets")
    d.set_defaults(func=cmd_demo)

    from ..convert.cli import add_convert_subparser

    add_convert_subparser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the process exit code (2 for mixq errors, with the message)."""
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except MixqError as exc:
        print(f"mixq: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
