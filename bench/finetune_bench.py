"""Fast-finetuning benchmark: AdaRound and AdaQuant on the embedded Fashion-MNIST CNN.

    python bench/finetune_bench.py [--iterations 300] [--calib 256] [--config int8pt|A8W8|MXFP4]

Prints Markdown: per layer wall time and reconstruction loss before/after with totals (one table
per algorithm), then the model metric on the 500 held-out test images before and after (SQNR of
the logits vs float with onnxruntime optimizations off, top-1 agreement with float, accuracy).
"""
from __future__ import annotations

import argparse
import time

import numpy as np

import mixq
from mixq.data import default_model_path, load_default_samples
from mixq.evaluate import compare
from mixq.finetune import AdaQuantConfig, AdaRoundConfig, quantize_with_finetune

CONFIGS = {
    "int8pt": mixq.QuantConfig(activation="int8", weight="int8", per_channel=False, activation_symmetric=True,
                               name="int8 per-tensor"),
    "A8W8": mixq.get_default_config("A8W8"),
    "MXFP4": mixq.QuantConfig(activation="mxfp8_e4m3", weight="mxfp4", name="A-MXFP8 W-MXFP4"),
}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iterations", type=int, default=300)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--calib", type=int, default=256, help="calibration images (from the training split)")
    ap.add_argument("--config", choices=sorted(CONFIGS), default="int8pt")
    ap.add_argument("--adaquant-lr", type=float, default=1e-4)
    args = ap.parse_args(argv)

    path = str(default_model_path())
    s = load_default_samples()
    calib = [{"image": np.array(s.calib_images[i:i + 64])} for i in range(0, args.calib, 64)]
    held_out = [{"image": np.array(s.test_images[i:i + 100])} for i in range(0, 500, 100)]
    cfg = CONFIGS[args.config]

    acc_float = [0.0]

    def metrics(model) -> tuple[float, float, float]:
        c = compare(path, model, held_out, labels=s.test_labels, optimize=False)
        acc_float[0] = c.accuracy_float
        return c.first().sqnr_db, c.first().top1_agreement, c.accuracy_quant

    t = time.perf_counter()
    plain = mixq.quantize(path, cfg, calib, check_kernels=False)
    t_plain = time.perf_counter() - t
    rows = [("plain", *metrics(plain.model), t_plain)]
    print(f"# mixq fast finetuning: Fashion-MNIST CNN, {cfg.name} (activations {cfg.activation}, weights "
          f"{cfg.weight}), {args.calib} calibration images, {args.iterations} iterations, batch {args.batch_size}\n")
    for ft in (AdaRoundConfig(num_iterations=args.iterations, batch_size=args.batch_size, report_metric=False),
               AdaQuantConfig(num_iterations=args.iterations, batch_size=args.batch_size,
                              learning_rate=args.adaquant_lr, report_metric=False)):
        if ft.algorithm == "adaround" and mixq.get_format(cfg.weight).kind != "int":
            continue
        t = time.perf_counter()
        res = quantize_with_finetune(path, cfg, calib, ft, check_kernels=False)
        total = time.perf_counter() - t
        print(res.finetune.to_markdown(), "\n")
        rows.append((ft.algorithm, *metrics(res.model), total))
    print(f"## model metric on 500 held-out images (float model accuracy {100 * acc_float[0]:.1f}%)\n")
    print("| model | SQNR (dB) | gain (dB) | top-1 agreement | accuracy | quantize time (s) |")
    print("|---|---|---|---|---|---|")
    for name, sq, agree, acc, sec in rows:
        print(f"| {name} | {sq:.2f} | {sq - rows[0][1]:+.2f} | {100 * agree:.1f}% | {100 * acc:.1f}% | {sec:.1f} |")


if __name__ == "__main__":
    main()
