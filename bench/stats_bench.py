"""Time `TensorStats.update` (the calibration histogram) on activation-sized tensors, optionally
against another version of `mixq/calibration/stats.py`, and check both count the same buckets.

    python bench/stats_bench.py                       # this tree's TensorStats only
    git show 3611b59:src/mixq/calibration/stats.py > /tmp/stats_old.py
    python bench/stats_bench.py /tmp/stats_old.py     # old vs new, interleaved, best of 5
"""
from __future__ import annotations

import argparse
import importlib.util
import time
from types import ModuleType

import numpy as np

from mixq.calibration import stats as new

#: (N, C, H, W) of a calibration batch's activations: EfficientNet-Lite0's first stages (batch
#: 16), PP-OCRv4 rec's (batch 8).
SHAPES = [(4, 96, 112, 112), (16, 144, 56, 56), (16, 672, 14, 14), (8, 32, 48, 320)]


def _load(path: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location("stats_old", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _same(a: object, b: object) -> bool:
    keys = ("count", "min", "max", "_pos_off", "_neg_off")
    return all(getattr(a, k) == getattr(b, k) for k in keys) and \
        np.array_equal(a._pos, b._pos) and np.array_equal(a._neg, b._neg)  # type: ignore[attr-defined]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("old", nargs="?", help="another stats.py to compare with")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)
    old = _load(args.old) if args.old else None
    rng = np.random.default_rng(0)
    print("| shape | elements | new ms | old ms | speed-up | same statistics |")
    print("|---|---:|---:|---:|---:|---|")
    for shape in SHAPES:
        x = rng.standard_normal(shape).astype(np.float32)
        t_new, t_old = [], []
        for _ in range(args.repeats):  # interleaved: a noisy machine slows both alike
            t = time.perf_counter()
            a = new.TensorStats().update(x)
            t_new.append(time.perf_counter() - t)
            if old is not None:
                t = time.perf_counter()
                b = old.TensorStats().update(x)
                t_old.append(time.perf_counter() - t)
        tn = 1e3 * min(t_new)
        if old is None:
            print(f"| {shape} | {x.size} | {tn:.1f} | - | - | - |")
            continue
        to = 1e3 * min(t_old)
        print(f"| {shape} | {x.size} | {tn:.1f} | {to:.1f} | {to / tn:.2f}x | {_same(a, b)} |")


if __name__ == "__main__":
    main()
