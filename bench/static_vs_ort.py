"""mixq vs onnxruntime.quantization.quantize_static on the same model and data, side by side.

Prints a Markdown table: quantize wall time, output size, output latency in onnxruntime
(batch 1, 1 thread, median of 50 runs, default optimizations) and fidelity (SQNR / top-1 vs
float with default optimizations and with them disabled).

    python bench/static_vs_ort.py [--model embedded|ppocr_cls|ppocr_rec] [--preset A8W8]
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def load_case(name: str):
    """(model path, calibration feeds, evaluation feeds) for a named case."""
    if name == "embedded":
        from mixq.data import default_model_path, load_default_samples

        s = load_default_samples()
        calib = [{"image": s.calib_images[i:i + 32]} for i in range(0, len(s.calib_images), 32)]
        ev = [{"image": s.test_images[i:i + 100]} for i in range(0, len(s.test_images), 100)]
        return str(default_model_path()), calib, ev
    from tests import realmodels as rm

    if name == "ppocr_cls":
        path, fn = rm.ppocr_cls_model_path(), rm.cls_inputs
    elif name == "ppocr_rec":
        path, fn = rm.ppocr_rec_model_path(), rm.rec_inputs
    else:
        raise SystemExit(f"unknown model {name!r}")
    inp = onnx.load(str(path), load_external_data=False).graph.input[0].name
    calib_x, eval_x = fn("calib", 64), fn("eval", 64)
    calib = [{inp: calib_x[i:i + 8]} for i in range(0, len(calib_x), 8)]
    ev = [{inp: eval_x[i:i + 8]} for i in range(0, len(eval_x), 8)]
    return str(path), calib, ev


def latency_ms(path: str, feed: dict) -> float:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    one = {k: v[:1] for k, v in feed.items()}
    for _ in range(5):
        sess.run(None, one)
    times = []
    for _ in range(50):
        t = time.perf_counter()
        sess.run(None, one)
        times.append(time.perf_counter() - t)
    return 1e3 * float(np.median(times))


def run_ort(model_path: str, out: str, calib: list, preset: str) -> float:
    from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType,
                                          quantize_static)
    from onnxruntime.quantization.shape_inference import quant_pre_process

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.it = iter(calib)

        def get_next(self):
            return next(self.it, None)

    act = {"A8W8": QuantType.QInt8, "U8S8": QuantType.QUInt8, "A16W8": QuantType.QInt16}[preset]
    t = time.perf_counter()
    pre = out + ".pre.onnx"
    m = onnx.load(model_path)
    if m.opset_import[0].version < 13:  # per-channel QDQ needs opset 13: what a user must do first
        from onnx import version_converter

        m = version_converter.convert_version(m, 13)
        model_path = out + ".op13.onnx"
        onnx.save(m, model_path)
    quant_pre_process(model_path, pre, skip_symbolic_shape=True)
    quantize_static(pre, out, Reader(), quant_format=QuantFormat.QDQ, activation_type=act,
                    weight_type=QuantType.QInt8, per_channel=True,
                    extra_options={"ActivationSymmetric": preset != "U8S8"})
    return time.perf_counter() - t


def run_mixq(model_path: str, out: str, calib: list, preset: str) -> float:
    import mixq

    t = time.perf_counter()
    mixq.quantize(model_path, preset, calib, output_path=out)
    return time.perf_counter() - t


def fidelity(float_path: str, q_path: str, ev: list) -> tuple[float, float, float | None]:
    from mixq.evaluate import compare

    a = compare(float_path, q_path, ev, optimize=True).first()
    b = compare(float_path, q_path, ev, optimize=False).first()
    return a.sqnr_db, b.sqnr_db, a.top1_agreement


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="embedded")
    ap.add_argument("--preset", default="A8W8,U8S8,A16W8")
    args = ap.parse_args(argv)
    path, calib, ev = load_case(args.model)
    print(f"model: {args.model} ({os.path.getsize(path) / 1e6:.2f} MB), float latency "
          f"{latency_ms(path, ev[0]):.2f} ms\n")
    print("| preset | tool | quantize s | size MB | latency ms | SQNR dB (opt) | SQNR dB (no opt) | top-1 agree |")
    print("|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as d:
        for preset in args.preset.split(","):
            for tool, fn in (("mixq", run_mixq), ("onnxruntime", run_ort)):
                out = os.path.join(d, f"{tool}_{preset}.onnx")
                try:
                    secs = fn(path, out, calib, preset)
                    s_opt, s_ref, top1 = fidelity(path, out, ev)
                except Exception as exc:  # a peer failing is a result, not a crash
                    print(f"| {preset} | {tool} | failed: {type(exc).__name__}: {str(exc)[:80]} | | | | | |")
                    continue
                t1 = f"{100 * top1:.1f} %" if top1 is not None else "-"
                print(f"| {preset} | {tool} | {secs:.2f} | {os.path.getsize(out) / 1e6:.3f} | "
                      f"{latency_ms(out, ev[0]):.2f} | {s_opt:.2f} | {s_ref:.2f} | {t1} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
