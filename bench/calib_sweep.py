"""Range methods on random graphs: does any combination crash, or read fine while it is not?

Each seeded graph (the quantizer's random-graph builder, `tests/integration/test_random_graphs.py`;
ops among Conv, MatMul, Softmax, Concat, MaxPool, Cos and the activations) gets inputs at a scale
of 1e-3, 1 or 1e3 and 1, 2, 8 or 40 calibration samples, and is quantized cycling the range
methods MinMax, Percentile, Entropy and MinMSE and the power-of-two methods NonOverflow and MinMSE
over int8, uint8 and int16 activations (int8 weights). Each result is scored against float on
16 fresh samples (output SQNR in onnxruntime).

    python bench/calib_sweep.py [--graphs 60] [--seed 3]

Prints one row per run: the error where quantize refused, else the fresh SQNR, whether the
guard called it broken and the summary's first line; then the counts of crashes (any exception
but mixq's own errors), of runs under 10 dB on fresh samples that the guard did not call broken,
and of those the summary said nothing about (no few-samples exposure note): docs/ROBUSTNESS.md,
round 24.
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import mixq  # noqa: E402
from bench.feeds import fresh_sqnr  # noqa: E402
from tests.integration.test_random_graphs import _build  # noqa: E402

OPS = ["Conv", "Conv", "Relu", "Add", "MatMulT", "Sigmoid", "Mul", "BN", "Tanh", "GlobalAveragePool", "Softmax",
       "Concat", "MaxPool", "HardSigmoid", "Cos"]
VARIANTS = [{"calibration": c} for c in ("minmax", "percentile", "entropy", "minmse")] + \
    [{"power_of_two": "nonoverflow"}, {"power_of_two": "minmse"}]
ACTIVATIONS = ["int8", "uint8", "int16"]
LOW_DB = 10.0



def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--graphs", type=int, default=60)
    ap.add_argument("--seed", type=int, default=3)
    args = ap.parse_args(argv)
    top = np.random.default_rng(args.seed)
    crashes = low = silent = 0
    print("| graph | method | activations | samples | input scale | fresh SQNR | guard |")
    print("|---|---|---|---:|---:|---:|---|")
    for i in range(args.graphs):
        s = int(top.integers(0, 10**6))
        r = np.random.default_rng(s)
        ops = [(str(r.choice(OPS)), int(r.integers(1, 7))) for _ in range(int(r.integers(1, 6)))]
        c, hw = int(r.integers(1, 5)), int(r.integers(2, 6))
        scale = float(r.choice([1e-3, 1.0, 1e3]))
        m = _build(ops, ["t"], c, hw, s)
        n = int(r.choice([1, 2, 8, 40]))
        calib = [{"x": (scale * r.standard_normal((1, c, hw, hw))).astype(np.float32)} for _ in range(n)]
        fresh = [{"x": (scale * r.standard_normal((1, c, hw, hw))).astype(np.float32)} for _ in range(16)]
        variant, act = VARIANTS[i % len(VARIANTS)], ACTIVATIONS[i % len(ACTIVATIONS)]
        head = f"| {s} {ops} | {variant} | {act} | {n} | {scale:g} |"
        try:
            res = mixq.quantize(m, mixq.QuantConfig(activation=act, weight="int8", **variant), calib,
                                check_kernels=False)
        except mixq.MixqError as exc:
            print(f"{head} | refused: {type(exc).__name__}: {str(exc)[:160]} |")
            continue
        except Exception as exc:  # noqa: BLE001 - what the sweep looks for
            crashes += 1
            print(f"{head} | CRASH {type(exc).__name__}: {str(exc)[:160]} |")
            continue
        got = fresh_sqnr(m, res.model, fresh)
        lines = res.fidelity.lines()
        if got < LOW_DB and not res.fidelity.broken:
            low += 1
            silent += not res.exposed
        print(f"{head} {got:.1f} | {'broken; ' if res.fidelity.broken else ''}{lines[0][:110] if lines else ''}"
              f"{'; exposure named' if res.exposed else ''} |", flush=True)
    print(f"\n{crashes} crashes; {low} runs under {LOW_DB:g} dB on fresh samples not called broken, "
          f"{silent} of them with no exposure note.")


if __name__ == "__main__":
    main()
