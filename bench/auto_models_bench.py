"""`mixq auto` on the seven bench models: the task metric as the objective, a 1-point target.

For each model of `bench/cases.py` the evaluation data is cut in two halves of whole units
(batches; audio files for the streaming VAD), interleaved (even units for the search, odd ones
for the check: the case's data is ordered by source, e.g. two recording sets, and both halves
should see every source): the search sees only its half, as its held-out data or through an
``EvaluateFunction(model_path) -> task metric`` (below); the chosen model is then scored on the
other half, which the search never saw. The uniform presets A8W8, A16W8, BF16 and FP16 (and the float
model) are quantized from the same calibration data and scored on the same check half, so that
the table says whether the search met the target, and whether its model is larger than the
smallest uniform model that meets it.

Settings are `mixq auto`'s defaults (candidates int16/int8,int8,int8/int4, every op type, the
bisection strategy, the all-wide plan first and widening to float when it misses), with a
target of 1 point (0.01 cosine for MiniLM). The search's metric is the task metric: mixq's own
where the task metric is one (top-1 against labels for the Fashion-MNIST CNN and the PP-OCR
classifier, top-1 agreement with float for EfficientNet-Lite0: the search half is then its
held-out data and it reads the outputs, so a near-tie counts as the probable flip it is), else
``metric='function'`` (an EvaluateFunction returning per-sample task scores).

    python -m bench.auto_models_bench [--models fashion_cnn,ppocr_cls] [--doc docs/MIXED_PRECISION.md] [--no-install]

Results go to ``bench/results/auto_models.json`` (one entry per model, kept across runs of
subsets); ``--doc`` rewrites the table between the markers in that file.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from . import env
from .cases import CASES, Case, get_case
from .feeds import load_feeds

WORK_DIR = env.ROOT / ".cache" / "bench" / "auto"
RESULTS = env.ROOT / "bench" / "results" / "auto_models.json"
UNIFORM = ("A8W8", "A16W8", "BF16", "FP16")
#: the largest allowed drop in the task metric's units (points; cosine for MiniLM)
TARGETS = {"minilm_l6": 0.01}
DEFAULT_TARGET = 1.0
MAX_EVALUATIONS = 12  # the acceptance
BEGIN, END = "<!-- auto_models_bench: begin -->", "<!-- auto_models_bench: end -->"


def _built(case: Case) -> Path:
    """The case's model and data, built once into the bench's cache."""
    d = WORK_DIR / case.name
    marker = d / "built.json"
    if not marker.exists():
        d.mkdir(parents=True, exist_ok=True)
        case.for_suite("full")
        info = case.build(d)
        marker.write_text(json.dumps(info, indent=1))
    else:
        case.for_suite("full")
    return d


def _check_optimization() -> bool | str:
    """How the check half runs: onnxruntime's default optimizations, as users run a model; on
    an x86 CPU without VNNI, whose fused 8-bit kernels saturate (README: the int8 note), the QDQ
    semantics the search decides on (basic optimizations), so that the table is about the search
    and not about this CPU's kernels."""
    from mixq.api import cpu_has_vnni

    return True if cpu_has_vnni() is not False else "basic"


def _score(case: Case, d: Path, model: Any, units: list[int]) -> float:
    from mixq.evaluate import make_session

    src = model if isinstance(model, str) else model.SerializeToString()
    value, _, _ = case.score(make_session(src, optimize=_check_optimization()), d, units=units)
    return float(value)


def run_case(name: str, install: bool = True) -> dict[str, Any]:
    """Search one model and score the result and the uniform presets on the check half (installing
    what the case needs first unless `install` is False, as `python -m bench --suite full` does)."""
    from mixq import Pipeline, quantize
    from mixq.search import AutoConfig, auto_quantize, base_from_candidate, parse_candidates

    from .suite import _ensure_requirements

    case = get_case(name)
    case.for_suite("full")  # before the requirements: the full suite's data can need more
    missing = _ensure_requirements(case, install, allow_apt=True)
    if missing:
        return {"skipped": f"missing {'; '.join(missing)}"}
    d = _built(case)
    path = str(d / "float.onnx")
    n = case.units(d)
    search_units, check_units = list(range(0, n, 2)), list(range(1, n, 2))
    target = TARGETS.get(name, DEFAULT_TARGET)
    calib = load_feeds(d / "calib.npz")

    def search_metric(model_path: str) -> Any:
        # per-sample scores: the search bounds each plan's drop for sampling noise; run as the
        # check half is (on a CPU without VNNI the default optimizations' int8 kernels saturate)
        from mixq.evaluate import make_session

        return case.sample_scores(make_session(model_path, optimize=_check_optimization()), d,
                                  search_units)

    search_metric.__name__ = f"{name}_task_metric"
    cands = parse_candidates("int16/int8,int8,int8/int4")  # `mixq auto`'s default
    base = base_from_candidate(cands[0])
    t = time.perf_counter()
    if case.builtin_metric is not None:
        # the task metric is one of mixq's own (top-1 against labels, top-1 agreement): the
        # search gets the search half as its held-out data and reads the outputs itself, so it
        # sees how close each sample is to a flip, not only whether it flipped
        feeds = case.eval_feeds(d)
        auto = AutoConfig(base=base, candidates=tuple(cands[1:]), metric=case.builtin_metric,
                          target=target / 100.0)
        labels = case.labels(d, search_units) if case.builtin_metric == "top1" else None
        r = auto_quantize(path, auto, calib, [feeds[u] for u in search_units], labels=labels)
        scale = 100.0  # the task metric is in %
    else:
        auto = AutoConfig(base=base, candidates=tuple(cands[1:]), metric="function", target=target)
        r = auto_quantize(path, auto, calib, evaluate_function=search_metric)
        scale = 1.0
    wall = time.perf_counter() - t
    float_check = _score(case, d, path, check_units)
    check = _score(case, d, r.model, check_units)
    pipe = Pipeline.load(path)
    uniform: dict[str, dict[str, float]] = {
        "float": {"kb": r.float_size_bytes / 1e3, "check": float_check}}
    for preset in UNIFORM:
        q = quantize(path, preset, calib)
        uniform[preset] = {"kb": pipe.size_bytes(q.plan) / 1e3,
                           "check": _score(case, d, q.model, check_units)}
    meets = {k: float_check - v["check"] <= target for k, v in uniform.items()}
    smallest = min((k for k in uniform if meets[k]), key=lambda k: uniform[k]["kb"])
    kb = r.size_bytes / 1e3
    return {
        "metric": case.metric_name, "target_drop": target, "units": n, "search_units": len(search_units),
        "search_objective": case.builtin_metric or "function",
        "check_optimization": "default" if _check_optimization() is True else "basic (QDQ semantics)",
        "float_search": None if r.float_metric is None else r.float_metric * scale,
        "float_check": float_check, "search_metric": r.metric * scale, "check_metric": check,
        "met_search": bool(r.target_met), "met_check": float_check - check <= target,
        "evaluations": r.full_evaluations, "wall_s": round(wall, 1), "kb": kb,
        "widened_layers": len(r.widened_layers), "narrowed": len(r.assignment),
        "layers": len(r.sensitivity.layers), "message": r.message,
        "uniform": uniform, "uniform_meets": meets, "smallest_uniform": smallest,
        "not_larger": kb <= uniform[smallest]["kb"] + 1e-9,
        "smaller_than_a8w8": _smaller(kb, uniform["A8W8"]["kb"]),
    }


def _smaller(kb: float, a8w8_kb: float) -> bool:
    """At least 1 % smaller than A8W8: a few bytes of one small weight do not count."""
    return kb <= 0.99 * a8w8_kb


def table(results: dict[str, dict[str, Any]]) -> str:
    """The markdown table of `results` and the acceptance lines under it."""
    rows = ["| model (task metric) | target drop | float | A8W8 | A16W8 | BF16 | FP16 | auto (check half) "
            "| met | evaluations | auto kB | smallest uniform meeting it | ≤ it | vs A8W8 | wall s |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    ok = {"met": True, "evals": True, "not_larger": True, "below_a8w8": False}
    for name in CASES:
        r = results.get(name)
        if r is None:
            continue
        if "skipped" in r:
            rows.append(f"| {name} | skipped: {r['skipped']} |" + " |" * 13)
            ok["met"] = False
            continue
        u = r["uniform"]

        def cell(k: str) -> str:
            return f"{u[k]['check']:.4g} ({u[k]['kb']:.0f} kB)" if k in u else "-"

        rows.append(
            f"| {name} ({r['metric']}) | {r['target_drop']:g} | {r['float_check']:.4g} | "
            f"{cell('A8W8')} | {cell('A16W8')} | {cell('BF16')} | {cell('FP16')} | {r['check_metric']:.4g} | "
            f"{'yes' if r['met_check'] else '**no**'} | {r['evaluations']} | {r['kb']:.0f} | "
            f"{r['smallest_uniform']} ({u[r['smallest_uniform']]['kb']:.0f} kB) | "
            f"{'yes' if r['not_larger'] else '**no**'} | {r['kb'] / u['A8W8']['kb']:.2f}x | "
            f"{r['wall_s']:.0f} |")
        ok["met"] &= bool(r["met_check"])
        ok["evals"] &= r["evaluations"] <= MAX_EVALUATIONS
        ok["not_larger"] &= bool(r["not_larger"])
        ok["below_a8w8"] |= _smaller(r["kb"], u["A8W8"]["kb"])
    done = sum(1 for k in CASES if k in results)
    how = sorted({r.get("check_optimization", "default") for r in results.values() if "skipped" not in r})
    rows += ["", "Check half scored with onnxruntime's " + " / ".join(how) + " optimizations"
             + (" (an x86 CPU without VNNI: its fused 8-bit kernels saturate, README's int8 note)"
                if any("basic" in h for h in how) else "") + "."]
    rows += ["", f"Goals ({done} of {len(CASES)} models measured): target met on the check half on "
             f"every model: {ok['met']}; at most {MAX_EVALUATIONS} full-model evaluations each: "
             f"{ok['evals']}; never larger than the smallest uniform preset that meets the target: "
             f"{ok['not_larger']}; at least one model at least 1 % smaller than A8W8: {ok['below_a8w8']}."]
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default=",".join(CASES), help="comma-separated case names")
    ap.add_argument("--doc", help="a markdown file whose table between the markers is rewritten")
    ap.add_argument("--table-only", action="store_true",
                    help="print (and write) the table of the stored results, measuring nothing")
    ap.add_argument("--no-install", action="store_true",
                    help="skip a model whose packages are missing instead of installing them")
    args = ap.parse_args(argv)
    results: dict[str, Any] = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    for name in [] if args.table_only else args.models.split(","):
        t = time.perf_counter()
        results[name] = run_case(name, install=not args.no_install)
        print(f"{name}: {time.perf_counter() - t:.0f} s", file=sys.stderr, flush=True)
        RESULTS.write_text(json.dumps(results, indent=1, sort_keys=True))
    text = table(results)
    print(text)
    if args.doc:
        doc = Path(args.doc)
        body = doc.read_text()
        if BEGIN not in body:
            raise SystemExit(f"{doc} has no {BEGIN} ... {END} markers to write the table between")
        head, rest = body.split(BEGIN, 1)
        tail = rest.split(END, 1)[1]
        doc.write_text(f"{head}{BEGIN}\n{text}\n{END}{tail}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
