"""A/B inference latency of saved quantized models against their float model, one process.

    python bench/block_ab.py FLOAT.onnx INPUT.npy A.onnx B.onnx ... [--rounds 30] [--threads 1]

Sessions run interleaved round-robin (one run of each per round) so machine load hits all alike;
prints each model's median and its ratio to the float model.
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import onnxruntime as ort


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("float_model")
    ap.add_argument("input")
    ap.add_argument("models", nargs="+")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    x = np.load(args.input)
    sessions = {}
    for p in [args.float_model] + args.models:
        so = ort.SessionOptions()
        so.intra_op_num_threads = args.threads
        so.inter_op_num_threads = 1
        sessions[p] = ort.InferenceSession(p, so, providers=["CPUExecutionProvider"])
    feed = {sessions[args.float_model].get_inputs()[0].name: x}
    times: dict[str, list[float]] = {p: [] for p in sessions}
    for s in sessions.values():
        s.run(None, feed)
    for _ in range(args.rounds):
        for p, s in sessions.items():
            t = time.perf_counter()
            s.run(None, feed)
            times[p].append(time.perf_counter() - t)
    f = float(np.median(times[args.float_model]))
    for p, v in times.items():
        m = float(np.median(v))
        print(f"{p}: {m * 1e3:.2f} ms  {m / f:.2f}x float", flush=True)


if __name__ == "__main__":
    main()
