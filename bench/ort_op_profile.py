"""Where an onnxruntime run spends its time, per op type (onnxruntime's own profiler).

    python bench/ort_op_profile.py MODEL FILE.onnx [--runs 20] [--top 20] [--by-shape OP]
    python bench/ort_op_profile.py minilm_l6 q.onnx      # q.onnx: mixq.quantize(... float.onnx ...)

Runs FILE.onnx on the bench model's latency feed (batch 1; `.cache/bench/MODEL/`, made by
`python -m bench`) with 1 intra-op thread and default optimizations, --runs times with
profiling on, and prints each op type's kernel time per run, node count and share.
`--by-shape OP`: that op type's time per input shape instead.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import tempfile
from pathlib import Path

import onnxruntime as ort

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", help="a bench model with files in .cache/bench (its latency feed)")
    ap.add_argument("file", help="the ONNX file to profile")
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--top", type=int, default=20)
    ap.add_argument("--by-shape", default=None, metavar="OP")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from bench.cases import get_case

    d = ROOT / ".cache" / "bench" / args.model
    feed = get_case(args.model).latency_feed(d)
    with tempfile.TemporaryDirectory() as tmp:
        so = ort.SessionOptions()
        so.intra_op_num_threads = 1
        so.inter_op_num_threads = 1
        so.log_severity_level = 3
        so.enable_profiling = True
        so.profile_file_prefix = os.path.join(tmp, "prof")
        sess = ort.InferenceSession(args.file, so, providers=["CPUExecutionProvider"])
        for _ in range(args.runs):
            sess.run(None, feed)
        events = json.loads(Path(sess.end_profiling()).read_text())
    time_us: collections.Counter[str] = collections.Counter()
    calls: collections.Counter[str] = collections.Counter()
    for e in events:
        if e.get("cat") != "Node" or not e["name"].endswith("_kernel_time"):
            continue
        op = e["args"].get("op_name", "?")
        if args.by_shape:
            if op != args.by_shape:
                continue
            op = json.dumps(e["args"].get("input_type_shape"))
        time_us[op] += e["dur"]
        calls[op] += 1
    total = sum(time_us.values()) or 1
    print(f"{args.file} on {args.model}'s latency feed, {args.runs} runs, 1 thread\n")
    print(f"| {'input shapes of ' + args.by_shape if args.by_shape else 'op type'} | ms a run | nodes | share |")
    print("|---|---:|---:|---:|")
    for op, us in time_us.most_common(args.top):
        print(f"| {op} | {us / args.runs / 1e3:.3f} | {calls[op] // args.runs} | {100 * us / total:.1f} % |")


if __name__ == "__main__":
    main()
