"""Inference latency of block-format quantized models against the float model (onnxruntime CPU).

For each model (the embedded CNN, PP-OCR cls) and block preset, quantizes the model with mixq
and times ``session.run`` on one calibration-sized batch, 1 intra-op thread by default, with
the float model timed in the same process; runs are interleaved round-robin (one run of every
session per round) so machine load hits every session alike. Prints a Markdown table of
medians and the ratio to float.

    python bench/block_latency.py [--models embedded,cls] [--presets BFP16,MXINT8,MXFP8_E4M3,MX9]
                                  [--rounds 30] [--threads 1]
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

import mixq


def _model_and_input(name: str) -> tuple[str, np.ndarray]:
    if name == "embedded":
        import mixq.data as d
        return str(d.default_model_path()), d.load_default_samples().calib_images[:32]
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests import realmodels as r
    if name == "cls":
        return str(r.ppocr_cls_model_path()), r.cls_inputs("calib", 16, seed=0)
    if name == "rec":
        return str(r.ppocr_rec_model_path()), r.rec_inputs("calib", 8, seed=0)
    raise SystemExit(f"unknown model {name!r}")


def _session(path: str, threads: int) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="embedded,cls")
    ap.add_argument("--presets", default="BFP16,MXINT8,MXFP8_E4M3,MX9")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    print(f"onnxruntime {ort.__version__}, {args.threads} thread(s), median of {args.rounds} "
          "interleaved rounds\n")
    print("| model | preset | float ms | quantized ms | ratio |")
    print("|---|---|---:|---:|---:|")
    for model in args.models.split(","):
        path, x = _model_and_input(model)
        with tempfile.TemporaryDirectory() as tmp:
            sessions = {"float": _session(path, args.threads)}
            for preset in args.presets.split(","):
                out = str(Path(tmp) / f"{preset}.onnx")
                mixq.quantize(path, preset, output_path=out)
                sessions[preset] = _session(out, args.threads)
            name = sessions["float"].get_inputs()[0].name
            feed = {name: x}
            times: dict[str, list[float]] = {k: [] for k in sessions}
            for s in sessions.values():  # warm-up
                s.run(None, feed)
            for _ in range(args.rounds):
                for k, s in sessions.items():
                    t = time.perf_counter()
                    s.run(None, feed)
                    times[k].append(time.perf_counter() - t)
        med = {k: float(np.median(v)) * 1e3 for k, v in times.items()}
        for preset in args.presets.split(","):
            print(f"| {model} | {preset} | {med['float']:.2f} | {med[preset]:.2f} | "
                  f"{med[preset] / med['float']:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
