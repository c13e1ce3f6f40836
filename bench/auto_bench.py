"""Auto mixed precision: greedy (the documented walk), bisection and Pareto strategies on the same
real model and target. Prints full-model evaluations, wall time, final weight size and metric.

    python bench/auto_bench.py [--target 0.02] [--candidates int8/int8,int8/int4]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", type=float, default=0.02, help="max top-1 drop")
    ap.add_argument("--candidates", default="int8/int8,int8/int4")
    args = ap.parse_args(argv)
    from mixq.search import AutoConfig, auto_quantize, base_from_candidate, parse_candidates
    from tests import realmodels

    path = str(realmodels.ppocr_cls_model_path())
    calib = realmodels.cls_inputs("calib", 24)
    ev, labels = realmodels.cls_inputs("eval", 48, with_labels=True)
    cands = parse_candidates(args.candidates)
    print(f"model: PP-OCR text-direction classifier; target: top-1 drop <= {args.target} on 48 "
          f"held-out lines; base {cands[0].label}, candidates {', '.join(c.label for c in cands[1:])}\n")
    print("| strategy | full-model evaluations | wall s | weight KB | top-1 | layers narrowed | target met |")
    print("|---|---|---|---|---|---|---|")
    rows = {}
    for strategy in ("greedy", "bisection", "pareto"):
        auto = AutoConfig(base=base_from_candidate(cands[0]), candidates=tuple(cands[1:]),
                          top1_drop=args.target, strategy=strategy)
        t = time.perf_counter()
        r = auto_quantize(path, auto, [{"x": calib}], [{"x": ev}], labels=labels)
        dt = time.perf_counter() - t
        rows[strategy] = r
        print(f"| {strategy} | {r.full_evaluations} | {dt:.1f} | {r.size_bytes / 1e3:.1f} | "
              f"{r.metric:.4f} | {len(r.assignment)}/{len(r.sensitivity.layers)} | {r.target_met} |")
    g, b = rows["greedy"], rows["bisection"]
    print(f"\nbisection uses {b.full_evaluations / max(g.full_evaluations, 1):.2f}x the greedy walk's "
          f"evaluations (target <= 0.10x) for a model of {b.size_bytes / max(g.size_bytes, 1):.3f}x "
          f"its size; all wide {g.wide_size_bytes / 1e3:.1f} KB (top-1 {g.wide_metric:.4f}), all "
          f"narrow {g.narrow_size_bytes / 1e3:.1f} KB (top-1 {g.narrow_metric:.4f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
