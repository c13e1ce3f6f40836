"""Peak memory of calibration must not grow with the number of samples.

Builds (or takes, ``--model PATH``) a small CNN with a 1x3x224x224 input, then runs
``collect_stats`` on every float tensor of it in two fresh subprocesses: one with 64 samples
and one with 1024, each sample generated lazily by a generator (never materialized). Prints the
peak RSS (``resource.getrusage(...).ru_maxrss``) of each run and their ratio as a Markdown
table; the target is a ratio < 1.10.

    python bench/calib_memory_bench.py [--model PATH] [--small 64] [--large 1024]
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

TARGET_RATIO = 1.10


def build_model(path: Path) -> None:
    """Conv(3->16)+Relu, Conv(16->32, s2)+Relu, Conv(32->32)+Relu, GAP, MatMul(32->10)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)

    def w(name, shape, scale):
        return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32),
                                       name)

    inits = [w("w1", (16, 3, 3, 3), 0.3), w("w2", (32, 16, 3, 3), 0.1),
             w("w3", (32, 32, 3, 3), 0.08), w("fc", (32, 10), 0.2),
             numpy_helper.from_array(np.array([1, 32], np.int64), "flat_shape")]
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("Conv", ["r2", "w3"], ["c3"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c3"], ["r3"]),
        helper.make_node("GlobalAveragePool", ["r3"], ["gap"]),
        helper.make_node("Reshape", ["gap", "flat_shape"], ["flat"]),
        helper.make_node("MatMul", ["flat", "fc"], ["logits"]),
    ]
    g = helper.make_graph(nodes, "bench_cnn",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 224, 224])],
                          [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 10])],
                          inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=10),
              str(path))


def child(model: str, n: int) -> None:
    """Run one calibration over `n` lazily generated samples; print a JSON line."""
    import onnx

    from mixq.calibration import collect_stats

    m = onnx.load(model)
    inp = m.graph.input[0]
    shape = [d.dim_value or 1 for d in inp.type.tensor_type.shape.dim]
    names = [o for node in m.graph.node for o in node.output]

    def samples():
        rng = np.random.default_rng(123)
        for _ in range(n):
            yield {inp.name: rng.standard_normal(shape).astype(np.float32)}

    t0 = time.perf_counter()
    res = collect_stats(model, names, samples())
    dt = time.perf_counter() - t0
    rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    print(json.dumps({"samples": n, "peak_rss_mib": rss_mib, "seconds": dt,
                      "tensors": len(res), "skipped": len(res.skipped)}))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="ONNX model with one float input (default: a built CNN)")
    ap.add_argument("--small", type=int, default=64)
    ap.add_argument("--large", type=int, default=1024)
    ap.add_argument("--child", nargs=2, metavar=("MODEL", "N"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child[0], int(args.child[1]))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model or str(Path(tmp) / "bench_cnn.onnx")
        if not args.model:
            build_model(Path(model))
        rows = []
        for n in (args.small, args.large):
            out = subprocess.run([sys.executable, __file__, "--child", model, str(n)],
                                 check=True, capture_output=True, text=True).stdout
            rows.append(json.loads(out.strip().splitlines()[-1]))
    ratio = rows[1]["peak_rss_mib"] / rows[0]["peak_rss_mib"]
    print("| samples | peak RSS (MiB) | time (s) | tensors |")
    print("|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['samples']} | {r['peak_rss_mib']:.1f} | {r['seconds']:.1f} | {r['tensors']} |")
    print(f"\nratio {rows[1]['samples']}/{rows[0]['samples']} peak RSS: **{ratio:.3f}** "
          f"(target < {TARGET_RATIO:.2f}: {'PASS' if ratio < TARGET_RATIO else 'FAIL'})")
    return 0 if ratio < TARGET_RATIO else 1


if __name__ == "__main__":
    sys.exit(main())
