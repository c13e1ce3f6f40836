"""`mixq auto` on random MLPs: is the chosen model the smallest that meets the target?

Each seeded model is `tests.graphs.random_mlp` (3 to 6 MatMul/Add layers with activations,
widths 8 to 64, a few outlier weights in 40 % of the layers), with 8 calibration and 8
held-out feeds of 8 rows. The search runs with `mixq auto`'s default candidates
(int16/int8 base, int8, int8/int4) and a relative L2 target of 0.7, 1.5 or 3 times the
all-wide plan's (below 1 the search widens: the most sensitive layers stay in a 16-bit float).
Then every MatMul of the chosen plan is narrowed alone by one weight step (fp16 -> int16/int8,
int16/int8 or int8 -> int8/int4) and measured again from the quantized model in onnxruntime:
a narrowing that still meets the target is a smaller model the search passed by.

    python bench/auto_refine_sweep.py [--models 30] [--refine 3]

Prints one row per model (target, the chosen weight bytes, evaluations, the refinement's tries
and kept moves, the one-step narrowings that still meet the target), then the totals with
`--refine 0` beside them: docs/ROBUSTNESS.md, round 26.
"""
from __future__ import annotations

import argparse
import os
import sys
import warnings

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import mixq  # noqa: E402
from mixq.evaluate import make_session  # noqa: E402
from mixq.search import AutoConfig, Candidate, auto_quantize, base_from_candidate  # noqa: E402
from mixq.search.auto import _assignment_config  # noqa: E402
from mixq.search.workbench import quiet_parts, relative_l2  # noqa: E402
from tests.graphs import random_mlp  # noqa: E402

CANDS = tuple(Candidate.parse(s) for s in ("int8", "int8/int4"))
BASE = base_from_candidate(Candidate.parse("int16/int8"))
#: one weight step narrower (the activation-only int16/int8 -> int8 move saves no byte)
STEP = {"float": "int16/int8", "fp16": "int16/int8", "bf16": "int16/int8",
        "int16/int8": "int8/int4", "int8": "int8/int4"}
FRACS = (0.7, 1.5, 3.0)


def _l2(qmodel, model, held) -> float:
    q, f = make_session(qmodel.SerializeToString()), make_session(model)
    fo = [f.run(None, fd)[0] for fd in held]
    return relative_l2([(q.run(None, fd)[0], o) for fd, o in zip(held, fo)], quiet_parts(model, 0, fo))


def _one(seed: int, refine: int) -> dict:
    model, calib, held = random_mlp(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        probe = auto_quantize(model, AutoConfig(base=BASE, candidates=CANDS, l2_target=1e-9), calib, held)
        target = FRACS[seed % 3] * next(e.metric for e in probe.evaluations if e.label.startswith("all wide"))
        res = auto_quantize(model, AutoConfig(base=BASE, candidates=CANDS, l2_target=target, refine=refine),
                            calib, held)
    passed = []
    if res.target_met:
        assignment = {k: Candidate.parse(v) for k, v in res.assignment.items()}
        for node in model.graph.node:
            if node.op_type != "MatMul":
                continue
            now = res.assignment.get(node.name, "int16/int8")
            if now not in STEP:
                continue
            trial = dict(assignment, **{node.name: Candidate.parse(STEP[now])})
            qm = mixq.quantize(model, _assignment_config(BASE, trial), calib, check_kernels=False).model
            if _l2(qm, model, held) <= target:
                passed.append(f"{node.name} {now}->{STEP[now]}")
    return {"seed": seed, "target": target, "met": res.target_met, "bytes": res.size_bytes,
            "evals": res.full_evaluations, "tried": res.refine_tried, "kept": res.refine_kept,
            "passed": passed, "honest": abs(_l2(res.model, model, held) - res.metric) <= 1e-6}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", type=int, default=30)
    ap.add_argument("--refine", type=int, default=3, help="AutoConfig.refine of the searched run")
    args = ap.parse_args(argv)
    print("| seed | target x all-wide | met | weight bytes | evaluations | refine kept/tried | "
          "one-step narrowings still meeting it | (refine 0: bytes, evaluations, narrowings) |")
    print("|---|---|---|---|---|---|---|---|")
    tot = {"bytes": 0.0, "evals": 0, "models_passed": 0, "bytes0": 0.0, "evals0": 0, "models_passed0": 0}
    dishonest = 0
    for seed in range(args.models):
        r, r0 = _one(seed, args.refine), _one(seed, 0)
        dishonest += (not r["honest"]) + (not r0["honest"])
        tot["bytes"] += r["bytes"]
        tot["evals"] += r["evals"]
        tot["models_passed"] += bool(r["passed"])
        tot["bytes0"] += r0["bytes"]
        tot["evals0"] += r0["evals"]
        tot["models_passed0"] += bool(r0["passed"])
        print(f"| {seed} | {FRACS[seed % 3]} | {'yes' if r['met'] else 'no'} | {r['bytes']:.0f} | {r['evals']} | "
              f"{r['kept']}/{r['tried']} | {', '.join(r['passed']) or '-'} | {r0['bytes']:.0f}, {r0['evals']}, "
              f"{len(r0['passed'])} |", flush=True)
    print(f"\n{args.models} models; refine {args.refine}: {tot['bytes']:.0f} weight bytes in all, "
          f"{tot['evals']} evaluations, {tot['models_passed']} models with a one-step narrowing that still "
          f"meets the target; refine 0: {tot['bytes0']:.0f} bytes, {tot['evals0']} evaluations, "
          f"{tot['models_passed0']} such models. Reported metric not the written model's: {dishonest}.")


if __name__ == "__main__":
    main()
