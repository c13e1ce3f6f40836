"""The main job: quantize the embedded Fashion-MNIST CNN with several presets and print a table
of top-1 accuracy against the float model, model size and quantize time."""
from __future__ import annotations

import time

import numpy as np

from .config import get_default_config

DEFAULT_PRESETS = ("A8W8", "XINT8", "A16W8", "U8S8", "BF16", "FP16", "BFP16", "MXFP8_E4M3",
                   "MXFP6_E3M2", "MXFP4", "MX6", "MX9")


def _batches(x: np.ndarray, batch: int, name: str = "image"):
    for i in range(0, len(x), batch):
        yield {name: x[i:i + batch]}


def run_demo(presets: list[str] | None = None, *, out=print) -> int:
    """Quantize the embedded model with each preset; print the table; return an exit code."""
    from .api import quantize
    from .data import default_model_path, load_default_samples
    from .evaluate import make_session

    samples = load_default_samples()
    model_path = str(default_model_path())
    fsess = make_session(model_path)
    ref = np.concatenate([fsess.run(None, f)[0] for f in _batches(samples.test_images, 100)])
    float_top1 = float(np.mean(np.argmax(ref, 1) == samples.test_labels))
    import os

    float_size = os.path.getsize(model_path)
    out(f"Embedded model: Fashion-MNIST CNN, {len(samples.test_images)} test images, "
        f"{len(samples.calib_images)} calibration images\n")
    out("| preset | activations | weights | top-1 | vs float | agreement | size KB | quantize s |")
    out("|---|---|---|---|---|---|---|---|")
    out(f"| float | fp32 | fp32 | {100 * float_top1:.2f} % | - | 100.00 % | {float_size / 1024:.1f} | - |")
    for name in presets or DEFAULT_PRESETS:
        cfg = get_default_config(name)
        t = time.perf_counter()
        res = quantize(model_path, cfg, _batches(samples.calib_images, 32))
        dt = time.perf_counter() - t
        qs = make_session(res.model)
        got = np.concatenate([qs.run(None, f)[0] for f in _batches(samples.test_images, 100)])
        top1 = float(np.mean(np.argmax(got, 1) == samples.test_labels))
        agree = float(np.mean(np.argmax(got, 1) == np.argmax(ref, 1)))
        out(f"| {cfg.name} | {cfg.activation} | {cfg.weight} | {100 * top1:.2f} % | "
            f"{100 * (top1 - float_top1):+.2f} | {100 * agree:.2f} % | "
            f"{res.quant_bytes / 1024:.1f} | {dt:.2f} |")
    return 0
