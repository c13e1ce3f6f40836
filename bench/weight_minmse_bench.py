"""Time of the MinMSE weight-range search over every weight of a model, A/B in one process.

    python bench/weight_minmse_bench.py OLD_OBSERVERS_PY [--models embedded,cls,rec] [--repeat 5]

OLD_OBSERVERS_PY is an older copy of mixq/calibration/observers.py (e.g. from
``git show REV:src/mixq/calibration/observers.py``); both versions run per output channel, 8 bits,
symmetric (the presets' weights), alternating, and the medians and total MSE are printed.
"""
from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from mixq.calibration import observers as new


def _weights(name: str) -> list[np.ndarray]:
    if name == "embedded":
        import mixq.data as d
        path = str(d.default_model_path())
    else:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        from tests import realmodels as r
        path = str(r.ppocr_cls_model_path() if name == "cls" else r.ppocr_rec_model_path())
    m = onnx.load(path)
    arrays = [numpy_helper.to_array(t) for t in m.graph.initializer]
    arrays += [numpy_helper.to_array(a.t) for n in m.graph.node if n.op_type == "Constant"
               for a in n.attribute if a.name == "value"]
    return [a.astype(np.float32) for a in arrays if a.ndim >= 2 and a.dtype.kind == "f"]


def _mse(w: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> float:
    m = w.reshape(w.shape[0], -1).astype(np.float64)
    scale = np.where(hi > lo, (hi - lo) / 255, 1.0)[:, None]
    return float(((np.clip(np.rint(m / scale), -128, 127) * scale - m) ** 2).sum())


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("old")
    ap.add_argument("--models", default="embedded,cls,rec")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args(argv)
    spec = importlib.util.spec_from_file_location("observers_old", args.old)
    old = importlib.util.module_from_spec(spec)
    sys.modules["observers_old"] = old  # dataclasses look their module up
    spec.loader.exec_module(old)
    print("| model | weights | old s | new s | old/new | MSE new/old |")
    print("|---|---:|---:|---:|---:|---:|")
    for model in args.models.split(","):
        ws = _weights(model)
        times: dict[str, list[float]] = {"old": [], "new": []}
        res: dict[str, list] = {}
        for _ in range(args.repeat):
            for key, mod in (("old", old), ("new", new)):
                t = time.perf_counter()
                res[key] = [mod.compute_weight_range(w, axis=0, method="minmse") for w in ws]
                times[key].append(time.perf_counter() - t)
        mse = {k: sum(_mse(w, *r) for w, r in zip(ws, v)) for k, v in res.items()}
        to, tn = float(np.median(times["old"])), float(np.median(times["new"]))
        print(f"| {model} | {len(ws)} | {to:.3f} | {tn:.3f} | {to / tn:.1f}x | "
              f"{mse['new'] / mse['old']:.5f} |", flush=True)


if __name__ == "__main__":
    main()
