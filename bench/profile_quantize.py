"""cProfile of `mixq quantize` (the API call the CLI makes) on one model and preset.

    python bench/profile_quantize.py {embedded|cls|rec} PRESET [--top 25] [--no-profile]
    python bench/profile_quantize.py efficientnet_lite0 A8W8 --no-profile   # any bench model
                                     # (its .cache/bench/<model>/ files, made by `python -m bench`)

Prints QuantizeResult.timings (the stage wall times) and the functions with the largest
cumulative time. Used to write docs/PERFORMANCE.md.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def _model_and_data(name: str) -> tuple[str, np.ndarray, int]:
    """(model path, calibration samples, batch) as bench/cases.py builds them."""
    if name == "embedded":
        import mixq.data as d
        return str(d.default_model_path()), d.load_default_samples().calib_images, 32
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests import realmodels as r
    if name == "cls":
        return str(r.ppocr_cls_model_path()), r.cls_inputs("calib", 64, seed=0), 16
    if name == "rec":
        return str(r.ppocr_rec_model_path()), r.rec_inputs("calib", 32, seed=0), 8
    raise SystemExit(f"unknown model {name!r}")


BENCH = Path(__file__).resolve().parents[1] / ".cache" / "bench"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", help="embedded, cls, rec, or a bench model with files in .cache/bench")
    ap.add_argument("preset")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--sort", default="cumulative")
    ap.add_argument("--no-profile", action="store_true", help="time only (no cProfile overhead)")
    args = ap.parse_args(argv)
    t = time.perf_counter()
    import mixq
    t_import = time.perf_counter() - t
    bench = BENCH / args.model
    if args.model not in ("embedded", "cls", "rec") and not (bench / "calib.npz").is_file():
        raise SystemExit(f"no {bench}/calib.npz: run `python -m bench --suite full --models {args.model}` first")
    with tempfile.TemporaryDirectory() as tmp:
        if (bench / "calib.npz").is_file():  # the bench's own model and calibration feeds
            path, calib = str(bench / "float.onnx"), bench / "calib.npz"
            with np.load(calib) as z:  # keys "<feed>/<input>": samples of the first input
                first = z.files[0].split("/")[-1]
                n = sum(z[k].shape[0] for k in z.files if k.split("/")[-1] == first)
        else:
            path, x, batch = _model_and_data(args.model)
            import onnx
            name = onnx.load(path, load_external_data=False).graph.input[0].name
            calib = Path(tmp) / "calib.npz"  # batches as separate feeds, like bench/feeds.py
            np.savez(calib, **{name: np.stack([x[i:i + batch] for i in range(0, len(x), batch)])})
            n = len(x)
        out = Path(tmp) / "q.onnx"
        prof = cProfile.Profile()
        t = time.perf_counter()
        if not args.no_profile:
            prof.enable()
        res = mixq.quantize(path, args.preset, calibration_data=str(calib), output_path=str(out))
        prof.disable()
        total = time.perf_counter() - t
    print(f"model {args.model} ({path}), preset {args.preset}, {n} calibration samples")
    print(f"import mixq {t_import:.3f} s; quantize {total:.3f} s"
          + ("" if args.no_profile else " (under cProfile)"))
    print("timings: " + ", ".join(f"{k} {v:.3f}" for k, v in res.timings.items()))
    if args.no_profile:
        return
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats(args.sort).print_stats(args.top)
    print(s.getvalue())


if __name__ == "__main__":
    main()
