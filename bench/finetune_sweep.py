"""Fast finetuning on random graphs with few calibration samples: is the finetuned model ever
worse than plain quantization on samples neither saw?

Each seeded graph (the quantizer's random-graph builder, `tests/integration/test_random_graphs.py`)
is quantized with nearest rounding (what finetuning starts from) and with AdaRound / AdaQuant at
their defaults and AdaQuant at lr 1e-3, calibrated on `--calib` samples and scored against float
on 64 fresh ones (output SQNR in onnxruntime, default optimizations). Configs cycle A8W8, XINT8,
A-MXFP8 W-MXFP4 and int8 activations with int4 weights.

    python bench/finetune_sweep.py [--graphs 16] [--seed 1] [--calib 16]

Prints one row per run (fresh SQNR plain -> finetuned, what the report claims on the
calibration data), the count of runs more than 0.5 dB worse and better than plain and the
mean change (docs/ROBUSTNESS.md,
round 23).
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import mixq  # noqa: E402
from bench.feeds import fresh_sqnr  # noqa: E402
from mixq.finetune import AdaQuantConfig, AdaRoundConfig  # noqa: E402
from tests.integration.test_random_graphs import _build  # noqa: E402

OPS = ["Conv", "Conv", "Relu", "Add", "MatMulT", "Sigmoid", "Mul", "BN", "Tanh", "GlobalAveragePool"]
CONFIGS = [("A8W8", mixq.get_default_config("A8W8")), ("XINT8", mixq.get_default_config("XINT8")),
           ("MXFP4", mixq.QuantConfig(activation="mxfp8_e4m3", weight="mxfp4")),
           ("int8/int4", mixq.QuantConfig(activation="int8", weight="int4"))]
ALGOS = [AdaRoundConfig(), AdaQuantConfig(), AdaQuantConfig(learning_rate=1e-3)]
WORSE_DB = 0.5



def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--graphs", type=int, default=16)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--calib", type=int, default=16)
    args = ap.parse_args(argv)
    top = np.random.default_rng(args.seed)
    print("| graph | config | algorithm | fresh SQNR plain | finetuned | report (calibration data) |")
    print("|---|---|---|---:|---:|---|")
    runs = worse = better = 0
    gains: list[float] = []
    for i in range(args.graphs):
        s = int(top.integers(0, 10**6))
        r = np.random.default_rng(s)
        ops = [(str(r.choice(OPS)), int(r.integers(1, 7))) for _ in range(int(r.integers(1, 6)))]
        c, hw = int(r.integers(1, 5)), int(r.integers(2, 6))
        m = _build(ops, ["t"], c, hw, s)
        calib = [{"x": r.standard_normal((1, c, hw, hw)).astype(np.float32)} for _ in range(args.calib)]
        fresh = [{"x": r.standard_normal((1, c, hw, hw)).astype(np.float32)} for _ in range(64)]
        name, cfg = CONFIGS[i % len(CONFIGS)]
        plain = fresh_sqnr(m, mixq.quantize(m, cfg.with_options(weight_rounding="nearest"), calib,
                                       check_kernels=False).model, fresh)
        for ft in ALGOS:
            try:
                res = mixq.quantize(m, cfg, calib, check_kernels=False, finetune=ft)
            except mixq.ConfigError as exc:  # AdaRound on block weights
                print(f"| {s} | {name} | {ft.algorithm} lr {ft.learning_rate:g} | | | {exc} |")
                continue
            got = fresh_sqnr(m, res.model, fresh)
            rep = res.finetune
            runs += 1
            worse += got < plain - WORSE_DB
            better += got > plain + WORSE_DB
            gains.append(got - plain)
            print(f"| {s} {ops} c{c} {hw}x{hw} | {name} | {ft.algorithm} lr {ft.learning_rate:g} | {plain:.2f} | "
                  f"{got:.2f} | {rep.metric_before} -> {rep.metric_after}"
                  f"{'; not kept' if rep.plain_because else ''} |", flush=True)
    print(f"\n{worse} of {runs} finetuned models more than {WORSE_DB} dB below plain quantization on fresh samples, "
          f"{better} more than {WORSE_DB} dB above; mean change {np.mean(gains):+.2f} dB.")


if __name__ == "__main__":
    main()
