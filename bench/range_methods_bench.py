"""The integer presets' range methods on the bench models: the task metric of A8W8 / U8S8 /
A16W8 under plain MinMSE activations and under each `minmse_min_gain`, with MinMax or MinMSE
weights (the table in docs/ACCURACY.md, section 4).

    python -m bench.range_methods_bench [--models efficientnet_lite0,ppocr_rec,...]
        [--presets A8W8,U8S8] [--gains 1,1.25,1.5,2] [--weights minmax,minmse] [--bias-correction]
        [--weight-rounding nearest,gptq]

(`--presets A8W8,A16W8,U8S8 --gains 1.5 --weight-rounding nearest`, with and without
`--bias-correction`, gives the bias correction table of docs/ACCURACY.md section 6;
`--presets A8W8,A16W8,U8S8 --gains 1.5 --weight-rounding nearest,gptq` the GPTQ table of
section 5. The tables of sections 4 and 6 predate GPTQ: `--weight-rounding nearest` gives them.)

Each cell quantizes the float model with the preset changed only in those two options
(calibration feeds of the bench case), then scores the output with the case's metric on its
whole evaluation data in onnxruntime (default optimizations). Prints a Markdown table.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from .cases import get_case
from .feeds import load_feeds
from .suite import WORK_DIR


def _case_dir(name: str) -> Path:
    """The case's model and data: the full suite's build when there is one (`python -m bench
    --suite full` leaves it in the bench cache), else built here once."""
    case = get_case(name)
    case.for_suite("full")
    for d in (WORK_DIR / name, WORK_DIR / "full" / name, WORK_DIR / "ranges" / name):
        if all((d / f).exists() for f in ("float.onnx", "calib.npz", "eval.npz")):
            return d
    d = WORK_DIR / "ranges" / name
    d.mkdir(parents=True, exist_ok=True)
    case.build(d)
    return d


def cell(name: str, preset: str, gain: float, weights: str, bias_correction: bool = False,
         rounding: str = "auto") -> float:
    """The task metric of `preset` with `minmse_min_gain=gain`, `weight_calibration=weights`,
    `bias_correction` and `weight_rounding=rounding`."""
    import mixq
    from mixq.evaluate import make_session

    case = get_case(name)
    d = _case_dir(name)
    cfg = mixq.get_default_config(preset).with_options(minmse_min_gain=gain, weight_calibration=weights,
                                                       bias_correction=bias_correction,
                                                       weight_rounding=rounding)
    res = mixq.quantize(str(d / "float.onnx"), cfg, load_feeds(d / "calib.npz"), check_kernels=False)
    return float(case.score(make_session(res.model.SerializeToString()), d)[0])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="efficientnet_lite0,ppocr_rec,minilm_l6,fashion_cnn")
    ap.add_argument("--presets", default="A8W8,U8S8")
    ap.add_argument("--gains", default="1,1.25,1.5,2")
    ap.add_argument("--weights", default="minmax")
    ap.add_argument("--bias-correction", action="store_true", help="every cell with bias_correction=True")
    ap.add_argument("--weight-rounding", default="auto",
                    help="comma-separated weight_rounding values, one column each (auto: the presets')")
    ap.add_argument("--json", type=Path, default=None, help="also write the cells here")
    args = ap.parse_args(argv)
    gains = [float(g) for g in args.gains.split(",")]
    weights = args.weights.split(",")
    cols = [(g, w, r) for r in args.weight_rounding.split(",") for w in weights for g in gains]
    print("| model | preset | " + " | ".join(f"gain {g:g}, weights {w}, rounding {r}" for g, w, r in cols) + " |")
    print("|---|---|" + "---|" * len(cols))
    out = []
    for name in args.models.split(","):
        for preset in args.presets.split(","):
            row = [cell(name, preset, g, w, args.bias_correction, r) for g, w, r in cols]
            out.append({"model": name, "preset": preset,
                        "cells": [{"gain": g, "weights": w, "rounding": r, "metric": v}
                                  for (g, w, r), v in zip(cols, row)]})
            print(f"| {name} | {preset} | " + " | ".join(f"{v:.4g}" for v in row) + " |", flush=True)
    if args.json is not None:
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
