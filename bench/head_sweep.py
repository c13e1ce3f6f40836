"""Regression heads on random scales: does a preset keep every target, or say it did not?

Each seeded model is a small MLP, x (N, 8) -> Gemm -> Relu -> Gemm -> y (N, K), K of 2 to 8
targets whose scales are drawn log-uniform over 1 .. 10^spread (spread 0.5, 1, 2 or 3), with an
offset on a random target in half of them. It is quantized with A8W8, U8S8, XINT8 and A16W8
from 16 calibration feeds of 8 rows and scored on 512 fresh rows, target by target (the
worst target's SQNR: a head whose first target is 80x its others keeps the others at 4 dB
while its whole output reads 38). A run whose worst target is under 10 dB while the guard did
not call the model broken is *silent*.

    python bench/head_sweep.py [--models 40] [--seed 5] [--no-channels-policy]

`--no-channels-policy` switches the plan's policy (j) off (docs/ACCURACY.md section 2), so that
the outputs stay on one grid and the guard alone must tell.

Prints one row per run (the worst target's fresh SQNR, the whole output's, the guard's verdict,
and how many outputs the plan kept float), then the counts: docs/ROBUSTNESS.md, round 25.
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import mixq  # noqa: E402
from mixq.evaluate import make_session  # noqa: E402
from tests.graphs import random_head  # noqa: E402

PRESETS = ("A8W8", "U8S8", "XINT8", "A16W8")
LOW_DB = 10.0


def _db(ref: np.ndarray, got: np.ndarray) -> float:
    noise = float(np.sum((ref - got) ** 2))
    return float("inf") if noise == 0 else 10 * float(np.log10(np.sum(ref ** 2) / noise))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", type=int, default=40)
    ap.add_argument("--seed", type=int, default=5)
    ap.add_argument("--no-channels-policy", action="store_true")
    args = ap.parse_args(argv)
    if args.no_channels_policy:
        import mixq.plan.numerics as numerics

        numerics.channel_scale_outputs = lambda *a, **kw: {}  # type: ignore[assignment]
    top = np.random.default_rng(args.seed)
    runs = low = silent = 0
    print("| model | head | preset | worst target (fresh dB) | whole output (fresh dB) | guard | outputs kept float |")
    print("|---|---|---|---:|---:|---|---:|")
    for i in range(args.models):
        s = int(top.integers(0, 10**6))
        m, what = random_head(s)
        r = np.random.default_rng(s + 1)
        calib = [{"x": r.normal(size=(8, 8)).astype(np.float32)} for _ in range(16)]
        fresh = {"x": r.normal(size=(512, 8)).astype(np.float32)}
        ref = make_session(m.SerializeToString()).run(None, fresh)[0]
        for preset in PRESETS:
            res = mixq.quantize(m, preset, calib, check_kernels=False)
            got = make_session(res.model, optimize=False).run(None, fresh)[0]
            worst = min(_db(ref[:, j], got[:, j]) for j in range(ref.shape[1]))
            kept = sum(tp.format is None for n, tp in res.plan.tensors.items() if n == "y")
            verdict = "broken" if res.fidelity.broken else "quiet"
            runs += 1
            low += worst < LOW_DB
            miss = worst < LOW_DB and not res.fidelity.broken
            silent += miss
            print(f"| {i} | {what} | {preset} | {worst:.1f} | {_db(ref, got):.1f} | "
                  f"{verdict}{' **silent**' if miss else ''} | {kept} |", flush=True)
    print(f"\n{runs} runs: {low} with a target under {LOW_DB:g} dB on fresh rows, "
          f"{silent} of them while the guard called the model fine")


if __name__ == "__main__":
    main()
