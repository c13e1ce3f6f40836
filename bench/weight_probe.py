"""Which quantized weight costs a bench model its task metric: each one put back to float alone.

The preset's model is built once; for each weight (a DequantizeLinear of an initializer with at
least two dims) a copy reads the prepared float weight instead, and the case's task metric is
measured on its whole evaluation data. Prints, per weight, the metric gained back and the
weight's per-channel int8 SQNR (max-abs scale per output channel), sorted by the gain.

    python -m bench.weight_probe --model efficientnet_lite0 --preset A16W8 [--limit 20]
"""
from __future__ import annotations

import argparse
import sys

import numpy as np
import onnx
from onnx import numpy_helper

from .cases import get_case
from .feeds import load_feeds
from .range_methods_bench import _case_dir


def _int8_sqnr_db(w: np.ndarray) -> float:
    """SQNR of symmetric per-output-channel int8 rounding of `w` (max-abs scales)."""
    amax = np.abs(w).max(axis=tuple(range(1, w.ndim)), keepdims=True)
    scale = np.where(amax > 0, amax / 127.0, 1.0)
    err = w - np.clip(np.round(w / scale), -127, 127) * scale
    return float(10.0 * np.log10(np.sum(w.astype(np.float64) ** 2) / max(float(np.sum(err ** 2)), 1e-30)))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="efficientnet_lite0")
    ap.add_argument("--preset", default="A16W8")
    ap.add_argument("--limit", type=int, default=None, help="probe only the first N weights")
    args = ap.parse_args(argv)
    from mixq import Pipeline, quantize
    from mixq.evaluate import make_session

    case, d = get_case(args.model), _case_dir(args.model)
    path = str(d / "float.onnx")
    floats = {t.name: t for t in Pipeline.load(path, defer=False).model.graph.initializer}
    q = quantize(path, args.preset, load_feeds(d / "calib.npz")).model
    base = case.score(make_session(q.SerializeToString()), d)[0]
    inits = {t.name for t in q.graph.initializer}
    rows: list[tuple[float, str, tuple[int, ...], float]] = []
    for n in q.graph.node:
        if args.limit is not None and len(rows) >= args.limit:
            break
        if n.op_type != "DequantizeLinear" or n.input[0] not in inits:
            continue
        dq_out = n.output[0]
        # the float weight the DequantizeLinear stands for: same name stem, same shape
        qshape = next(tuple(t.dims) for t in q.graph.initializer if t.name == n.input[0])
        src = next((k for k, t in floats.items() if tuple(t.dims) == qshape and len(qshape) >= 2
                    and dq_out.startswith(k)), None)
        if src is None:
            continue
        w = numpy_helper.to_array(floats[src])
        m = onnx.ModelProto()
        m.CopyFrom(q)
        m.graph.initializer.append(numpy_helper.from_array(w, dq_out + "/float"))
        for node in m.graph.node:
            for i, x in enumerate(node.input):
                if x == dq_out:
                    node.input[i] = dq_out + "/float"
        got = case.score(make_session(m.SerializeToString()), d)[0]
        rows.append((got - base, src, qshape, _int8_sqnr_db(w)))
        print(f"  {src}: {got - base:+.2f}", file=sys.stderr, flush=True)
    print(f"{args.model} {args.preset}: {case.metric_name} {base:.2f} with every weight quantized\n")
    print("| weight | shape | metric gained back when float | int8 per-channel SQNR dB |")
    print("|---|---|---|---|")
    for gain, name, shape, sq in sorted(rows, key=lambda r: -r[0]):
        print(f"| {name} | {'x'.join(map(str, shape))} | {gain:+.2f} | {sq:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
