"""Wall time of sharded calibration with 1 and 2 workers: local processes and a local Ray cluster.

    python -m bench.scaling_bench                          # embedded Fashion CNN, 4096 samples
    python -m bench.scaling_bench --samples 1024 --workers 1,2
    python -m bench.scaling_bench --case ppocr_cls --repeat 8   # a bench-suite model
    python -m bench.scaling_bench --no-ray                 # local processes only

Every configuration calibrates the same feeds on a fresh Pipeline (the calibrate stage only:
plan, parameters and rewrite do not change with the workers) and its statistics are checked
byte for byte against the one-process pass. "cold" (one run) includes starting the workers
(spawning processes that import onnxruntime; Ray's worker processes); "warm" is the fastest of
--repeats further runs on the same executor (on a shared machine the fastest is the least
disturbed). Ray's own start (`ray.init`, a local cluster) is reported apart: a real cluster is
started once, not per run. The per-part times the table ends with feed the model in
docs/SCALING.md.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

import mixq
from mixq.distributed import Executor, ProcessExecutor, RayExecutor
from mixq.pipeline import Pipeline


def _workload(args: argparse.Namespace) -> tuple[Path, list[dict[str, np.ndarray]]]:
    """(model path, calibration feeds)."""
    if args.case == "fashion_cnn":
        from mixq.data import default_model_path, load_default_samples

        imgs = load_default_samples().calib_images
        reps = -(-args.samples // len(imgs))
        x = np.concatenate([imgs] * reps)[:args.samples]
        name = _input_name(default_model_path())
        return default_model_path(), [{name: x[i:i + 1]} for i in range(len(x))]
    from .cases import get_case
    from .feeds import load_feeds
    from .suite import WORK_DIR

    case = get_case(args.case)
    d = WORK_DIR / "scaling" / args.case
    if not (d / "float.onnx").exists():
        d.mkdir(parents=True, exist_ok=True)
        case.build(d)
    return d / "float.onnx", load_feeds(d / "calib.npz") * args.repeat


def _input_name(model_path: Path) -> str:
    import onnx

    m = onnx.load(str(model_path), load_external_data=False)
    inits = {t.name for t in m.graph.initializer}
    return next(i.name for i in m.graph.input if i.name not in inits)


def _calibrate(model_path: Path, feeds: list[dict], executor: Executor | None) -> tuple[float, str]:
    """Seconds of the calibrate stage and its statistics as JSON."""
    pipe = Pipeline.load(model_path)
    plan = pipe.plan(mixq.get_default_config("A8W8"))
    t = time.perf_counter()
    stats = pipe.calibrate(plan, feeds, executor=executor)
    dt = time.perf_counter() - t
    return dt, json.dumps({n: s.to_dict() for n, s in stats.items()})


def _parts(model_path: Path, feeds: list[dict]) -> dict[str, float]:
    """The terms of the wall-time model in docs/SCALING.md, measured in this process:
    read_s: the driver reads and validates every feed (serial);
    task_fixed_s: one task's fixed cost (model bytes parsed, augmented model, onnxruntime
    session), the same whatever its shard size;
    per_feed_s: one feed through the pass (the part that divides by the workers);
    merge_s: the driver rebuilds and merges one shard's statistics (once per shard)."""
    from mixq.calibration.data import FeedSource
    from mixq.calibration.stats import TensorStats
    from mixq.calibration.sharded import _calib_shard

    pipe = Pipeline.load(model_path)
    names = pipe.plan(mixq.get_default_config("A8W8")).calibrated_tensors(lambda f: True)
    t = time.perf_counter()
    fed = [dict(f) for f in FeedSource(feeds, pipe.model)]
    read = time.perf_counter() - t
    shared = (pipe.model.SerializeToString(), list(names), fed, None)
    _calib_shard(shared, (0, 1))  # warm-up: imports, allocator
    t = time.perf_counter()
    _calib_shard(shared, (0, 1))
    one = time.perf_counter() - t
    t = time.perf_counter()
    part, _, _ = _calib_shard(shared, (0, len(fed)))
    full = time.perf_counter() - t
    per_feed = (full - one) / max(1, len(fed) - 1)
    base = {n: TensorStats.from_dict(d) for n, d in part.items()}
    t = time.perf_counter()
    for n, d in part.items():
        base[n].merge(TensorStats.from_dict(d))
    merge = time.perf_counter() - t
    return {"read_s": read, "task_fixed_s": max(0.0, one - per_feed), "per_feed_s": per_feed,
            "merge_s": merge, "pass_s": full}


def _noop(shared: Any, item: int) -> int:
    return item


def _dispatch_s(ex: Executor, n: int) -> float:
    """One map of n no-op tasks with a small shared object: the per-round overhead."""
    ts = []
    for _ in range(3):
        t = time.perf_counter()
        ex.map(_noop, list(range(n)), b"x" * 1024)
        ts.append(time.perf_counter() - t)
    return min(ts)


class _Evals:
    """The search's full-model evaluations: candidate plans scored one after another (the rounds
    of a bisection), each split over the workers by its evaluation feeds."""

    def __init__(self, model_path: Path, calib: list[dict], n_eval: int) -> None:
        import onnxruntime as ort

        self.pipe = Pipeline.load(model_path)
        self.cands = []
        for preset in ("A8W8", "A16W8", "U8S8"):
            cfg = mixq.get_default_config(preset)
            plan = self.pipe.plan(cfg)
            self.pipe.calibrate(plan, calib[:64])
            self.cands.append((plan, cfg))
        sess = ort.InferenceSession(self.pipe.model.SerializeToString(),
                                    providers=["CPUExecutionProvider"])
        feeds = [dict(f) for f in calib[-n_eval:]]
        self.state = (feeds, [sess.run(None, f)[0] for f in feeds])
        self.n = len(feeds)

    def run(self, ex: Executor | None) -> tuple[float, list[float]]:
        from mixq.distributed import RELATIVE_L2, SerialExecutor, evaluate_plans

        t = time.perf_counter()
        out = [evaluate_plans(self.pipe, [c], RELATIVE_L2, self.state, self.n,
                              ex or SerialExecutor(1))[0] for c in self.cands]
        return time.perf_counter() - t, out


def _rounds(levels: int, depth: int) -> int:
    """Rounds of a bisection of `levels` levels that evaluates `depth` levels of its decision
    tree at once (2**depth - 1 plans a round): the same decisions as one level a round."""
    return -(-levels // depth)


def estimate(n: int, t: dict[str, float]) -> dict[str, float]:
    """Wall time with `n` workers from measured per-part times (the model of docs/SCALING.md).

    Calibration: T_read + T_fixed + N*t_feed/k + k*t_merge + t_task, over k <= n shards (the
    best k: beyond sqrt(N*t_feed/t_merge) the driver's merges cost more than they save).
    auto: T_other + calibration + ceil(L/n)*t_layer + the evaluations: one all-wide check, then
    a bisection of ceil(log2(P+1)) levels, `depth` levels a round (2**depth - 1 plans, each split
    over n // (2**depth - 1) workers by its E feeds): 1 + ceil(levels/depth) rounds of
    t_build + E*t_eval/w + t_task (the best depth)."""
    import math

    def calib(n_feeds: float, workers: int) -> float:
        return min(t["read_s"] + t["task_fixed_s"] + n_feeds * t["per_feed_s"] / k
                   + k * t["merge_s"] + (t["task_s"] if workers > 1 else 0.0)
                   for k in range(1, workers + 1))

    levels = math.ceil(math.log2(t["path"] + 1))
    evals = []
    for depth in range(1, levels + 1):
        plans = 2 ** depth - 1
        if plans > n and depth > 1:
            break
        w = max(1, n // plans)
        per_round = t["build_s"] + t["eval_feeds"] * t["eval_per_feed_s"] / w + \
            (t["task_s"] if n > 1 else 0.0)
        evals.append((1 + _rounds(levels, depth)) * per_round)
    auto = (t["other_s"] + calib(t["auto_calib_feeds"], n)
            + math.ceil(t["layers"] / n) * t["layer_s"] + min(evals))
    return {"calibrate": calib(t["calib_feeds"], n), "auto": auto}


def _terms(args: argparse.Namespace, parts: dict[str, float], rows: list[dict[str, Any]],
           evals: _Evals, n_feeds: int) -> dict[str, float]:
    """The estimate's inputs: the calibration terms, with the per-feed time of the fastest
    one-process run (the least disturbed), the evaluation terms and the dispatch overhead."""
    from mixq.pipeline import model_from_shared as _model_of

    pipe, (plan, cfg) = evals.pipe, evals.cands[0]
    shared = (pipe.model.SerializeToString(), {n: s.to_dict() for n, s in pipe.stats.items()},
              None)
    builds = []
    for _ in range(3):
        t = time.perf_counter()
        _model_of(shared, plan.to_json(), cfg.to_dict())
        builds.append(time.perf_counter() - t)
    build = min(builds)
    one = rows[0]
    fixed = parts["read_s"] + parts["task_fixed_s"]
    # the smaller of two measurements of the same thing: on a shared machine the least disturbed
    per_feed = min(parts["per_feed_s"], max(0.0, one["warm_s"] - fixed) / n_feeds)
    eval_per_feed = max(0.0, one["eval_s"] / len(evals.cands) - build) / evals.n
    task = max((r["dispatch_s"] for r in rows if r["workers"] > 1), default=0.0)
    print(f"evaluation measured here: build {build:.3f} s, {eval_per_feed * 1e3:.3f} ms a feed; "
          f"the estimate uses the search's own: build {args.auto_build_s} s, "
          f"{args.auto_eval_s} s an evaluation of 500 feeds")
    return {"read_s": parts["read_s"], "task_fixed_s": parts["task_fixed_s"],
            "per_feed_s": per_feed, "merge_s": parts["merge_s"], "task_s": task,
            "calib_feeds": n_feeds, "build_s": args.auto_build_s,
            "eval_per_feed_s": (args.auto_eval_s - args.auto_build_s) / 500,
            "eval_feeds": 500, "layers": args.auto_layers, "layer_s": args.auto_layer_s,
            "path": args.auto_path, "other_s": args.auto_other_s,
            "auto_calib_feeds": args.auto_calib_feeds}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--case", default="fashion_cnn", help="fashion_cnn (embedded) or a bench case")
    p.add_argument("--samples", type=int, default=4096, help="fashion_cnn: calibration samples")
    p.add_argument("--repeat", type=int, default=8, help="bench case: repeat its calib feeds")
    p.add_argument("--eval-feeds", type=int, default=500,
                   help="feeds each candidate evaluation runs (the last calibration feeds)")
    p.add_argument("--workers", default="1,2")
    p.add_argument("--repeats", type=int, default=3, help="warm runs per row (the fastest counts)")
    p.add_argument("--no-ray", action="store_true")
    p.add_argument("--json", help="write the results here too")
    # the auto search's shape and serial parts, measured in one process on the embedded model
    # (mixq.search.auto_quantize, candidates int16/int8,int8/int8,int8/int4, top-1 drop 1 %)
    p.add_argument("--auto-layers", type=int, default=7)
    p.add_argument("--auto-layer-s", type=float, default=0.30, help="sensitivity of one layer")
    p.add_argument("--auto-path", type=int, default=14, help="plans on the bisection's path")
    p.add_argument("--auto-other-s", type=float, default=2.1,
                   help="the search's serial rest: load, capture, float outputs, write")
    p.add_argument("--auto-calib-feeds", type=int, default=256)
    p.add_argument("--auto-eval-s", type=float, default=2.24,
                   help="one full-model evaluation inside the search (500 feeds)")
    p.add_argument("--auto-build-s", type=float, default=0.35,
                   help="of which: building the candidate's model")
    args = p.parse_args(argv)
    model_path, feeds = _workload(args)
    counts = [int(w) for w in args.workers.split(",")]
    evals = _Evals(model_path, feeds, args.eval_feeds)
    print(f"model {model_path.name}, {len(feeds)} calibration feeds, {len(evals.cands)} candidate "
          f"evaluations of {evals.n} feeds, workers {counts}")

    first_s, ref = _calibrate(model_path, feeds, None)
    _, ref_scores = evals.run(None)

    def measure(label: str, n: int, ex: Executor | None) -> dict[str, Any]:
        cold, js = _calibrate(model_path, feeds, ex) if ex is not None else (first_s, ref)
        same = js == ref
        # the fastest of `repeats` runs: the machine is shared, the minimum is the least noisy
        calib_runs, eval_runs = [], []
        for _ in range(args.repeats):
            t, js = _calibrate(model_path, feeds, ex)
            calib_runs.append(t)
            te, scores = evals.run(ex)
            eval_runs.append(te)
            same = same and js == ref and scores == ref_scores
        return {"executor": label, "workers": n, "cold_s": cold, "warm_s": min(calib_runs),
                "eval_s": min(eval_runs), "same": same,
                "dispatch_s": _dispatch_s(ex, n) if ex is not None else 0.0}

    rows = [measure("one process (no executor)", 1, None)]
    for n in counts:
        with ProcessExecutor(n) as ex:
            rows.append(measure("local processes", n, ex))
    if not args.no_ray:
        import ray

        for n in counts:
            t = time.perf_counter()
            ray.init(num_cpus=n, include_dashboard=False, log_to_driver=False)
            init_s = time.perf_counter() - t
            try:
                rows.append(measure(f"Ray, local cluster (ray.init {init_s:.1f} s)", n,
                                    RayExecutor()))
            finally:
                ray.shutdown()

    base, base_e = rows[0]["warm_s"], rows[0]["eval_s"]
    print(f"\n| executor | workers | calibrate, cold (s) | calibrate, best of {args.repeats} (s) | "
          f"speed-up | {len(evals.cands)} evaluations, best of {args.repeats} (s) | speed-up | "
          "same bytes / floats |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['executor']} | {r['workers']} | {r['cold_s']:.2f} | {r['warm_s']:.2f} | "
              f"{base / r['warm_s']:.2f}x | {r['eval_s']:.2f} | {base_e / r['eval_s']:.2f}x | "
              f"{'yes' if r['same'] else 'NO'} |")
    parts = _parts(model_path, feeds)
    print("\nmodel terms (one process): " + ", ".join(f"{k} {v:.4f}" for k, v in parts.items()))
    terms = _terms(args, parts, rows, evals, len(feeds))
    print("terms of the estimate: " + ", ".join(f"{k} {v:.4g}" for k, v in terms.items()))
    print("\n| workers | calibration (s) | auto (s) |\n|---|---|---|")
    est = {n: estimate(n, terms) for n in (1, 2, 8, 64)}
    for n, e in est.items():
        print(f"| {n} | {e['calibrate']:.2f} | {e['auto']:.2f} |")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "parts": parts, "terms": terms,
                                               "estimate": est, "feeds": len(feeds)}, indent=1))
    return 0 if all(r["same"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
