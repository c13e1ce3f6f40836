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
    from mixq.distributed import _calib_shard

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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--case", default="fashion_cnn", help="fashion_cnn (embedded) or a bench case")
    p.add_argument("--samples", type=int, default=4096, help="fashion_cnn: calibration samples")
    p.add_argument("--repeat", type=int, default=8, help="bench case: repeat its calib feeds")
    p.add_argument("--workers", default="1,2")
    p.add_argument("--repeats", type=int, default=3, help="warm runs per row (the fastest counts)")
    p.add_argument("--no-ray", action="store_true")
    p.add_argument("--json", help="write the results here too")
    args = p.parse_args(argv)
    model_path, feeds = _workload(args)
    counts = [int(w) for w in args.workers.split(",")]
    print(f"model {model_path.name}, {len(feeds)} calibration feeds, workers {counts}")

    def warm_runs(ex: Executor | None) -> tuple[float, bool]:
        # the fastest of `repeats` runs: the machine is shared, the minimum is the least noisy
        runs = [_calibrate(model_path, feeds, ex) for _ in range(args.repeats)]
        return min(t for t, _ in runs), all(js == ref for _, js in runs)

    rows: list[dict[str, Any]] = []
    first_s, ref = _calibrate(model_path, feeds, None)
    base_s, same = warm_runs(None)
    rows.append({"executor": "one process (no executor)", "workers": 1, "cold_s": first_s,
                 "warm_s": base_s, "same": same})
    for n in counts:
        with ProcessExecutor(n) as ex:
            cold, a = _calibrate(model_path, feeds, ex)
            warm, same = warm_runs(ex)
        rows.append({"executor": "local processes", "workers": n, "cold_s": cold, "warm_s": warm,
                     "same": a == ref and same})
    if not args.no_ray:
        import ray

        for n in counts:
            t = time.perf_counter()
            ray.init(num_cpus=n, include_dashboard=False, log_to_driver=False)
            init_s = time.perf_counter() - t
            try:
                ex = RayExecutor()
                cold, a = _calibrate(model_path, feeds, ex)
                warm, same = warm_runs(ex)
            finally:
                ray.shutdown()
            rows.append({"executor": f"Ray, local cluster (ray.init {init_s:.1f} s)",
                         "workers": n, "cold_s": cold, "warm_s": warm,
                         "same": a == ref and same})

    print(f"\n| executor | workers | calibrate, cold (s) | warm, best of {args.repeats} (s) | "
          "speed-up (warm) | same statistics |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['executor']} | {r['workers']} | {r['cold_s']:.2f} | {r['warm_s']:.2f} | "
              f"{base_s / r['warm_s']:.2f}x | {'yes' if r['same'] else 'NO'} |")
    parts = _parts(model_path, feeds)
    print("\nmodel terms (one process): " + ", ".join(f"{k} {v:.4f}" for k, v in parts.items()))
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "parts": parts,
                                               "feeds": len(feeds)}, indent=1))
    return 0 if all(r["same"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
