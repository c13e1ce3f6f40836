"""The main job: quantize the embedded Fashion-MNIST CNN with several presets and print a table
of top-1 accuracy against the float model, model size and quantize time."""
from __future__ import annotations

import os
import time

import numpy as np

from .config import QuantConfig, get_default_config

#: (label, config) rows of the demo table.
DEFAULT_PRESETS = ("A8W8", "XINT8", "A16W8", "U8S8", "BF16", "FP16", "BFP16", "MXFP8_E4M3",
                   "MXFP6_E3M2", "MXFP4", "MX6", "MX9")


def _batches(x: np.ndarray, batch: int, name: str = "image"):
    for i in range(0, len(x), batch):
        yield {name: x[i:i + batch]}


def _configs(presets: list[str] | None) -> list[tuple[str, QuantConfig]]:
    rows = [(p, get_default_config(p)) for p in (presets or DEFAULT_PRESETS)]
    if presets is None:  # the remedy for x86 CPUs without VNNI, next to the plain presets
        rows.insert(4, ("U8S8 +reduce_range", get_default_config("U8S8").with_options(reduce_range=True)))
    return rows


def run_demo(presets: list[str] | None = None, *, out=print) -> int:
    """Quantize the embedded model with each preset; print the table; return an exit code."""
    from .api import quantize
    from .data import default_model_path, load_default_samples
    from .evaluate import make_session
    from .pipeline import Pipeline

    samples = load_default_samples()
    model_path = str(default_model_path())
    pipe = Pipeline.load(model_path)
    elems = pipe.weight_elems
    fsess = make_session(model_path)
    ref = fsess.run(None, {"image": samples.test_images})[0]
    float_top1 = float(np.mean(np.argmax(ref, 1) == samples.test_labels))
    out(f"Embedded model: Fashion-MNIST CNN ({sum(elems.values())} parameters), "
        f"{len(samples.test_images)} labelled test images, {len(samples.calib_images)} calibration "
        "images from the training split.\n")
    out("top-1 (ort): onnxruntime CPU with its default optimizations; top-1 (qdq): the same model "
        "with optimizations disabled, i.e. exactly the QDQ semantics mixq emits.\n")
    out("| preset | activations | weights | top-1 (ort) | top-1 (qdq) | vs float (qdq) | "
        "agreement (ort) | weights kB | file kB | quantize s |")
    out("|---|---|---|---|---|---|---|---|---|---|")
    out(f"| float | fp32 | fp32 | {100 * float_top1:.2f} % | {100 * float_top1:.2f} % | - | 100.00 % | "
        f"{4 * sum(elems.values()) / 1e3:.1f} | {os.path.getsize(model_path) / 1e3:.1f} | - |")
    notes = []
    for label, cfg in _configs(presets):
        t = time.perf_counter()
        res = quantize(model_path, cfg, list(_batches(samples.calib_images, 32)))
        dt = time.perf_counter() - t
        got = make_session(res.model).run(None, {"image": samples.test_images})[0]
        ref_q = make_session(res.model, optimize=False).run(None, {"image": samples.test_images})[0]
        top1 = float(np.mean(np.argmax(got, 1) == samples.test_labels))
        top1_q = float(np.mean(np.argmax(ref_q, 1) == samples.test_labels))
        agree = float(np.mean(np.argmax(got, 1) == np.argmax(ref, 1)))
        out(f"| {label} | {cfg.activation} | {cfg.weight} | {100 * top1:.2f} % | {100 * top1_q:.2f} % | "
            f"{100 * (top1_q - float_top1):+.2f} | {100 * agree:.2f} % | "
            f"{pipe.size_bytes(res.plan) / 1e3:.1f} | {res.quant_bytes / 1e3:.1f} | {dt:.2f} |")
        if res.warnings:
            notes.append(f"- {label}: {res.warnings[0]}")
    out("\nweights kB (10^3 bytes): what a backend stores (each weight at its format's bits, shared scales "
        "included); file kB: the ONNX file, where block formats keep float32 weights already on "
        "their grid.")
    if notes:
        out("\n" + "\n".join(dict.fromkeys(notes)))
    return 0
