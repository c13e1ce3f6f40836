"""onnxruntime session creation of mixq's outputs, with and without declared shapes.

mixq declares every intermediate tensor's type and shape in the model it writes
(`mixq.passes.prepare.declare_shapes`); onnxruntime then plans memory from them instead of
inferring them node by node. This prints, per bench model and preset, the best of 5 session
creations of the output as written and of the same model with its value_info removed (what mixq
wrote before), with the graph optimizations the guard uses ('basic') and the default ones.

    python -m bench.session_bench [--models ppocr_cls,ppocr_rec] [--presets A8W8,BFP16]
"""
from __future__ import annotations

import argparse
import sys
import time

import onnx

from .cases import CASES
from .range_methods_bench import _case_dir


def _create(model: bytes, level: str) -> float:
    """Best of 5 session creations, seconds."""
    import onnxruntime as ort

    best = float("inf")
    for _ in range(5):
        so = ort.SessionOptions()
        so.log_severity_level = 3
        if level == "basic":
            so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        t = time.perf_counter()
        ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
        best = min(best, time.perf_counter() - t)
    return best


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="fashion_cnn,ppocr_cls,ppocr_rec,efficientnet_lite0")
    ap.add_argument("--presets", default="A8W8,BFP16")
    args = ap.parse_args(argv)
    from mixq import quantize

    from .feeds import load_feeds

    print("| model | preset | declared shapes | basic: declared s | basic: none s | speed-up "
          "| default: declared s | default: none s | speed-up |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name in args.models.split(","):
        if name not in CASES or CASES[name].missing():
            print(f"| {name} | - | skipped: not installed |||||||", flush=True)
            continue
        d = _case_dir(name)
        for preset in args.presets.split(","):
            q = quantize(str(d / "float.onnx"), preset, load_feeds(d / "calib.npz")).model
            bare = onnx.ModelProto()
            bare.CopyFrom(q)
            del bare.graph.value_info[:]
            with_b, bare_b = q.SerializeToString(), bare.SerializeToString()
            cells = [name, preset, str(len(q.graph.value_info))]
            for level in ("basic", "default"):
                a, b = _create(with_b, level), _create(bare_b, level)
                cells += [f"{a:.3f}", f"{b:.3f}", f"{b / a:.2f}x"]
            print("| " + " | ".join(cells) + " |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
