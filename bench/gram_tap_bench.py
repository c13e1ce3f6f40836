"""Time of GPTQ's statistics (a GramTap's float pass over the calibration data), A/B in one process.

    git show REV:src/mixq/passes/gptq.py > /tmp/gptq_old.py
    python bench/gram_tap_bench.py /tmp/gptq_old.py [--models efficientnet_lite0,ppocr_rec] [--rounds 3]

Both versions collect the grams of the A8W8 plan's GPTQ targets over the bench model's
calibration feeds (``.cache/bench/<model>/``, written by ``python -m bench``), alternating
old and new, each with its own onnxruntime pass (included in the time); the medians are
printed, with how far the new grams are from the old ones (the largest difference relative to
the gram's largest entry; where both read the same rows, float32 rounding).
"""
from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from types import ModuleType

import numpy as np

from mixq.config import get_default_config
from mixq.passes import gptq as new
from mixq.pipeline import Pipeline

BENCH = Path(__file__).resolve().parents[1] / ".cache" / "bench"


def _old(path: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location("mixq.passes._gptq_old", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot load {path}")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def _feeds(d: Path) -> list[dict[str, np.ndarray]]:
    groups: dict[str, dict[str, np.ndarray]] = defaultdict(dict)
    with np.load(d / "calib.npz") as z:
        for k in z.files:
            feed, name = k.split("/")
            groups[feed][name] = z[k]
    return [groups[f] for f in sorted(groups)]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("old")
    ap.add_argument("--models", default="efficientnet_lite0,ppocr_rec,ppocr_det,minilm_l6,ppocr_cls")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    old = _old(args.old)
    print("| model | GPTQ targets | old s | new s | speed-up | largest gram difference |")
    print("|---|---:|---:|---:|---:|---:|")
    for model in args.models.split(","):
        d = BENCH / model
        if not (d / "calib.npz").is_file():
            raise SystemExit(f"no {d}/calib.npz: run `python -m bench --suite full --models {model}` first")
        pipe = Pipeline.load(str(d / "float.onnx"))
        plan = pipe.plan(get_default_config("A8W8"))
        feeds = _feeds(d)
        times: dict[str, list[float]] = {"old": [], "new": []}
        taps = {}
        for _ in range(args.rounds):
            for name, mod in (("old", old), ("new", new)):
                tap = mod.GramTap(pipe.model, plan)
                t = time.perf_counter()
                tap.run(pipe.model, feeds)
                times[name].append(time.perf_counter() - t)
                taps[name] = tap
        diff = max(float(np.abs(a.gram - b.gram).max() / max(np.abs(a.gram).max(), 1e-30))
                   for a, b in zip(taps["old"].targets, taps["new"].targets) if a.gram is not None)
        o, n = statistics.median(times["old"]), statistics.median(times["new"])
        print(f"| {model} | {len(taps['new'].targets)} | {o:.2f} | {n:.2f} | {o / n:.1f}x | {diff:.1e} |",
              flush=True)


if __name__ == "__main__":
    main()
