"""onnxruntime's CPU kernels on the tensors of a block function: with and without a size-1 dim
after the block axis, and the ways to widen a per-block tensor to the block's shape.

    python bench/block_reduce_bench.py [--runs 200]

A block function views x as (..., blocks, block[, post]) and reduces over the block axis.
Where nothing follows the axis (a MatMul's last axis, 1x1 spatial dims) a trailing post dim of
1 sends onnxruntime's ReduceSum (and, less, ReduceMax) and element-wise ops to slow generic
paths, and a per-block (..., blocks, 1) tensor broadcast over (..., blocks, block) runs block
by block. Prints three tables (1 intra-op thread, median of --runs runs, milliseconds).
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

# (label, view shape, reduced axes): MiniLM-sized MatMul input (128 tokens x 384 channels)
# under 32-element blocks, and under MX9's 16-element blocks of 2-element sub-blocks
CASES = [("blocks of 32", (1, 128, 12, 32), [3]),
         ("blocks of 16 x sub-blocks of 2", (1, 128, 24, 8, 2), [3, 4])]
# a MiniLM FFN input (42 tokens x 1536) under BFP16's 8-element blocks
VIEW, BLOCK = (1, 42, 192), 8


def _session(nodes: list, inputs: dict[str, tuple[int, ...]], inits: list | None = None,
             dtype: int = TensorProto.FLOAT) -> ort.InferenceSession:
    vi = [helper.make_tensor_value_info(n, dtype, list(s)) for n, s in inputs.items()]
    y = helper.make_tensor_value_info("y", dtype, None)
    graph = helper.make_graph(nodes, "g", vi, [y], inits or [])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=9)
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def _time(sess: ort.InferenceSession, feed: dict[str, np.ndarray], runs: int) -> float:
    for _ in range(5):
        sess.run(None, feed)
    t = []
    for _ in range(runs):
        a = time.perf_counter()
        sess.run(None, feed)
        t.append(time.perf_counter() - a)
    return 1e3 * float(np.median(t))


def _i64(name: str, v: list[int]) -> TensorProto:
    return numpy_helper.from_array(np.array(v, np.int64), name)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=200)
    args = ap.parse_args(argv)
    runs = args.runs
    rng = np.random.default_rng(0)
    print(f"onnxruntime {ort.__version__}, 1 thread, median of {runs} runs (ms)\n")

    print("| view | op | ends at the block axis | trailing dim of 1 | ratio |")
    print("|---|---|---:|---:|---:|")
    for label, shape, axes in CASES:
        x = np.abs(rng.standard_normal(shape)).astype(np.float32)
        for op in ("ReduceSum", "ReduceMax"):
            ts = []
            for s, xv in ((shape, x), (shape + (1,), x[..., None])):
                node = helper.make_node(op, ["x", "axes"], ["y"], keepdims=1)
                ts.append(_time(_session([node], {"x": s}, [_i64("axes", axes)]), {"x": xv}, runs))
            print(f"| {label} {shape} | {op} | {ts[0]:.3f} | {ts[1]:.3f} | {ts[1] / ts[0]:.1f}x |")

    print(f"\nElement-wise with a scalar, a per-block tensor of {int(np.prod(VIEW))} elements:\n")
    print("| op | shape | ms | shape + (1,) | ms | ratio |")
    print("|---|---|---:|---|---:|---:|")
    for op, dtype, np_dtype in (("Mul", TensorProto.FLOAT, np.float32),
                                ("BitwiseAnd", TensorProto.INT32, np.int32)):
        ts = []
        for s in (VIEW, VIEW + (1,)):
            c = numpy_helper.from_array(np.array(3, np_dtype), "c")
            sess = _session([helper.make_node(op, ["x", "c"], ["y"])], {"x": s}, [c], dtype)
            ts.append(_time(sess, {"x": (rng.random(s) * 100).astype(np_dtype)}, runs))
        print(f"| {op} | {VIEW} | {ts[0]:.3f} | {VIEW + (1,)} | {ts[1]:.3f} | {ts[1] / ts[0]:.1f}x |")

    full, per = VIEW + (BLOCK,), VIEW + (1,)
    x = rng.standard_normal(full).astype(np.float32)
    s = (rng.random(per) + 0.5).astype(np.float32)
    ones = numpy_helper.from_array(np.ones((1, BLOCK), np.float32), "ones")
    ways = [("broadcast Mul(x, s)", [helper.make_node("Mul", ["x", "s"], ["y"])], []),
            ("Expand(s) then Mul", [helper.make_node("Expand", ["s", "shape"], ["e"]),
                                    helper.make_node("Mul", ["x", "e"], ["y"])], [_i64("shape", list(full))]),
            ("Tile(s) then Mul", [helper.make_node("Tile", ["s", "reps"], ["e"]),
                                  helper.make_node("Mul", ["x", "e"], ["y"])],
             [_i64("reps", [1] * len(VIEW) + [BLOCK])]),
            ("MatMul(s, ones(1, B)) then Mul", [helper.make_node("MatMul", ["s", "ones"], ["e"]),
                                                helper.make_node("Mul", ["x", "e"], ["y"])], [ones])]
    print(f"\nA per-block tensor {per} applied to its blocks {full}:\n")
    print("| way | ms |")
    print("|---|---:|")
    for label, nodes, inits in ways:
        print(f"| {label} | {_time(_session(nodes, {'x': full, 's': per}, inits), {'x': x, 's': s}, runs):.3f} |")
    same = _session([helper.make_node("Mul", ["x", "e"], ["y"])], {"x": full, "e": full})
    print(f"| (same-shape Mul alone) | {_time(same, {'x': x, 'e': x}, runs):.3f} |")


if __name__ == "__main__":
    main()
