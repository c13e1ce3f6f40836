"""Wall time of `mixq auto` (automatic mixed precision) with 1 and 2 workers: one process, local
processes and a local Ray cluster, on a real model; every run's output is checked byte for byte
against the one-process run.

    python -m bench.auto_scaling_bench                     # PP-OCR text-direction classifier
    python -m bench.auto_scaling_bench --repeats 3 --no-ray

What runs on the workers (see docs/SCALING.md): the calibration shards, one task per layer for
the sensitivities, and the candidate models of the search (built and evaluated on the workers,
the bisection evaluating its likely next points at once). "cold" is the first run on a new
executor, starting the worker processes included; "warm" the fastest of --repeats runs on the
same executor, the rows' warm runs taken in turns. Ray's own start (`ray.init` of a local
cluster) is shown apart: a real cluster is started once, not per search. The cache is off:
every run does the whole search.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import resource
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _warm(shared: Any, item: int) -> int:
    import onnxruntime  # noqa: F401  (a worker's import, paid before the timed runs)

    return item


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calib", type=int, default=64, help="calibration lines")
    ap.add_argument("--eval", type=int, default=96, help="held-out lines the search scores on")
    ap.add_argument("--target", type=float, default=0.02, help="relative L2 target")
    ap.add_argument("--candidates", default="int16/int8,int8,int8/int4,int4")
    ap.add_argument("--repeats", type=int, default=2, help="warm runs per row (the fastest counts)")
    ap.add_argument("--no-ray", action="store_true")
    args = ap.parse_args(argv)

    from mixq.distributed import ProcessExecutor, RayExecutor, SerialExecutor
    from mixq.search import AutoConfig, auto_quantize, base_from_candidate, parse_candidates
    from tests import realmodels

    path = str(realmodels.ppocr_cls_model_path())
    calib = realmodels.cls_inputs("calib", args.calib)
    ev = realmodels.cls_inputs("eval", args.eval)
    cands = parse_candidates(args.candidates)
    auto = AutoConfig(base=base_from_candidate(cands[0]), candidates=tuple(cands[1:]),
                      l2_target=args.target, cache_dir=None)
    c = [{"x": calib[i:i + 1]} for i in range(len(calib))]
    e = [{"x": ev[i:i + 8]} for i in range(0, len(ev), 8)]

    def run(ex: Any) -> tuple[float, Any]:
        t = time.perf_counter()
        r = auto_quantize(path, auto, c, e, executor=ex)
        return time.perf_counter() - t, r

    def cpu_s() -> float:
        """This process's CPU seconds so far, every thread (onnxruntime's included)."""
        u = resource.getrusage(resource.RUSAGE_SELF)
        return u.ru_utime + u.ru_stime

    print(f"model: PP-OCR text-direction classifier; {len(c)} calibration lines, {args.eval} "
          f"held-out lines; target relative L2 <= {args.target}; candidates {args.candidates}\n")
    print("| executor | workers | cold s | warm s | speed-up (warm) | full-model evaluations | "
          "same bytes | calibrate / sensitivities / search s (warm) |")
    print("|---|---|---|---|---|---|---|---|")
    rows: list[tuple[str, Any]] = [("one process (no executor)", None)]
    rows += [("local processes", ProcessExecutor(1)), ("local processes", ProcessExecutor(2))]
    ray_s = 0.0
    if not args.no_ray:
        try:
            import ray

            t = time.perf_counter()
            ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
            ray_s = time.perf_counter() - t
            rows += [("Ray, local cluster", RayExecutor(workers=1)),
                     ("Ray, local cluster", RayExecutor(workers=2))]
        except ImportError:
            print("(Ray is not installed: pip install 'mixq[ray]'; its rows are left out)\n")
    # every row's cold run, then the warm runs in turns (one of each row per repeat): a slow
    # spell of a shared machine then slows every row alike, not the row it happened to fall on
    cold: list[tuple[float, Any]] = []
    for _, ex in rows:
        if ex is not None and not isinstance(ex, SerialExecutor):
            ex.map(_warm, list(range(ex.workers)))  # start the workers outside the timed runs
        cold.append(run(ex))
    warm_runs: list[list[tuple[float, Any]]] = [[] for _ in rows]
    busy_cpu = busy_wall = 0.0
    for _ in range(args.repeats):
        for i, (_, ex) in enumerate(rows):
            cpu0 = cpu_s()
            warm_runs[i].append(run(ex))
            if ex is None:  # the cores the one-process run keeps busy, on average
                busy_cpu += cpu_s() - cpu0
                busy_wall += warm_runs[i][-1][0]
    busy = busy_cpu / busy_wall
    ref_digest = hashlib.sha256(cold[0][1].model.SerializeToString()).hexdigest()
    base_s = min(w for w, _ in warm_runs[0])
    for (label, ex), (cold_s, r), runs in zip(rows, cold, warm_runs):
        warm, wr = min(runs, key=lambda tr: tr[0])
        phases = " / ".join(f"{wr.timings.get(k, 0.0):.2f}" for k in ("calibrate", "sensitivity", "search"))
        same = all(hashlib.sha256(x.model.SerializeToString()).hexdigest() == ref_digest
                   for x in [r, *(x for _, x in runs)])
        print(f"| {label} | {1 if ex is None else ex.workers} | {cold_s:.2f} | {warm:.2f} | "
              f"{base_s / warm:.2f}x | {r.full_evaluations} | {'yes' if same else 'NO'} | {phases} |")
    for _, ex in rows:
        if ex is not None:
            ex.close()
    cores = os.cpu_count() or 1
    print(f"\nthe one-process run keeps {busy:.2f} of this machine's {cores} cores busy on average "
          f"(CPU seconds / wall seconds, every thread included): were all of it work, the same work "
          f"split over {cores} workers on these cores could finish at most {cores / busy:.2f}x "
          "sooner; part of it is onnxruntime's and the BLAS library's threads spinning while they "
          "wait (docs/SCALING.md), so the bound is higher")
    if ray_s:
        print(f"\nray.init of the local cluster: {ray_s:.1f} s (once per cluster)")
        import ray

        ray.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
