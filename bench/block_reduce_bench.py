"""onnxruntime's reductions over a block axis, with and without a size-1 dim after it.

    python bench/block_reduce_bench.py [--runs 200]

A block function views x as (..., blocks, block[, post]) and reduces over the block axis.
Where nothing follows the axis (a MatMul's last axis, 1x1 spatial dims) a trailing post dim of
1 sends onnxruntime's CPU ReduceSum (and, less, ReduceMax) to a slow generic path; this prints
the time of each reduction on both views (1 intra-op thread, median of --runs runs).
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper

# (label, view shape, reduced axes): MiniLM-sized MatMul input (128 tokens x 384 channels)
# under 32-element blocks, and under MX9's 16-element blocks of 2-element sub-blocks
CASES = [("blocks of 32", (1, 128, 12, 32), [3]),
         ("blocks of 16 x sub-blocks of 2", (1, 128, 24, 8, 2), [3, 4])]


def _session(op: str, shape: tuple[int, ...], axes: list[int]) -> ort.InferenceSession:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    ax = helper.make_tensor("axes", TensorProto.INT64, [len(axes)], axes)
    graph = helper.make_graph([helper.make_node(op, ["x", "axes"], ["y"], keepdims=1)], "g", [x], [y], [ax])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=9)
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def _time(sess: ort.InferenceSession, x: np.ndarray, runs: int) -> float:
    for _ in range(5):
        sess.run(None, {"x": x})
    t = []
    for _ in range(runs):
        a = time.perf_counter()
        sess.run(None, {"x": x})
        t.append(time.perf_counter() - a)
    return 1e3 * float(np.median(t))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=200)
    args = ap.parse_args(argv)
    print(f"onnxruntime {ort.__version__}, 1 thread, median of {args.runs} runs (ms)\n")
    print("| view | op | ends at the block axis | trailing dim of 1 | ratio |")
    print("|---|---|---:|---:|---:|")
    rng = np.random.default_rng(0)
    for label, shape, axes in CASES:
        x = np.abs(rng.standard_normal(shape)).astype(np.float32)
        for op in ("ReduceSum", "ReduceMax"):
            a = _time(_session(op, shape, axes), x, args.runs)
            b = _time(_session(op, shape + (1,), axes), x[..., None], args.runs)
            print(f"| {label} {shape} | {op} | {a:.3f} | {b:.3f} | {b / a:.1f}x |")


if __name__ == "__main__":
    main()
