"""Session-creation and run time of block-format fake quantization in onnxruntime.

A chain of N calls ``F(x) -> Relu -> F -> Relu ...`` (F = the format's model-local function,
blocks along axis 1) on an input declared either dynamic ``["N", 64, "H", "W"]`` or static
``[1, 64, 8, 8]``; prints the InferenceSession creation time per N, then the run time of one
call on a 1x64x56x56 tensor next to a float 3x3 Conv 64->64 on the same tensor.

    python bench/block_session_bench.py [--formats bfp16,mx9] [--ns 20,40,80,160] [--cap 60]

Larger N for a (format, shape) row are skipped once one creation took more than --cap seconds.
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import onnx
from onnx import TensorProto, helper

from mixq.formats import get_format
from mixq.formats.base import Emission
from mixq.formats.onnx_util import emission_to_model

FORMATS = ("bfp16", "mx9", "mxfp4", "mxfp8_e4m3")
DYNAMIC = ["N", 64, "H", "W"]
STATIC = [1, 64, 8, 8]


def chain_model(name: str, n: int, shape: list) -> onnx.ModelProto:
    fmt = get_format(name)
    em = Emission()
    cur = "x"
    for i in range(n):
        em.extend(fmt.emit(cur, f"q{i}", axis=1, prefix=f"n{i}"))
        em.nodes.append(helper.make_node("Relu", [f"q{i}"], [f"r{i}"], name=f"relu{i}"))
        cur = f"r{i}"
    return emission_to_model(em, {"x": TensorProto.FLOAT}, output_names=[cur],
                             input_shapes={"x": shape})


def session(model: onnx.ModelProto, threads: int = 0):
    import onnxruntime as ort
    so = ort.SessionOptions()
    if threads:
        so.intra_op_num_threads = threads
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def creation_time(model: onnx.ModelProto) -> float:
    t = time.perf_counter()
    session(model)
    return time.perf_counter() - t


def run_time(sess, feeds: dict, reps: int = 20) -> float:
    sess.run(None, feeds)
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        sess.run(None, feeds)
        best = min(best, time.perf_counter() - t)
    return best


def conv_model() -> onnx.ModelProto:
    w = helper.make_tensor("w", TensorProto.FLOAT, [64, 64, 3, 3],
                           np.random.default_rng(0).standard_normal(64 * 64 * 9).astype(np.float32))
    g = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])], "conv",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, DYNAMIC)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
    m.ir_version = 10
    return m


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--formats", default=",".join(FORMATS))
    ap.add_argument("--ns", default="20,40,80,160")
    ap.add_argument("--cap", type=float, default=60.0, help="skip larger N after a creation this slow (s)")
    ap.add_argument("--no-run", action="store_true", help="skip the run-time comparison")
    args = ap.parse_args()
    formats = args.formats.split(",")
    ns = [int(v) for v in args.ns.split(",")]

    print("session creation (s), chain of N calls F -> Relu, blocks along axis 1")
    print(f"{'format':<12} {'input':<8} " + " ".join(f"{'N=' + str(n):>8}" for n in ns), flush=True)
    for name in formats:
        for label, shape in (("dynamic", DYNAMIC), ("static", STATIC)):
            cells = []
            skip = False
            for n in ns:
                if skip:
                    cells.append(f"{'skip':>8}")
                    continue
                t = creation_time(chain_model(name, n, shape))
                skip = t > args.cap
                cells.append(f"{t:8.2f}")
            print(f"{name:<12} {label:<8} " + " ".join(cells), flush=True)

    if args.no_run:
        return
    x = np.random.default_rng(1).standard_normal((1, 64, 56, 56)).astype(np.float32)
    conv = run_time(session(conv_model()), {"x": x})
    print(f"\nrun time, one call on 1x64x56x56 (best of 20), vs float Conv 3x3 64->64 = {conv * 1e3:.2f} ms")
    for name in formats:
        t = run_time(session(chain_model(name, 1, DYNAMIC)), {"x": x})
        print(f"{name:<12} {t * 1e3:8.2f} ms  {t / conv:5.2f}x conv", flush=True)


if __name__ == "__main__":
    main()
