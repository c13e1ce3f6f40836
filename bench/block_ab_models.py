"""A/B latency of block-format models written by two versions of mixq, on the bench models.

    git worktree add /tmp/old <commit>          # the version to compare with
    python bench/block_ab_models.py --old-src /tmp/old/src [--models minilm_l6,ppocr_rec]
                                    [--presets BFP16,MXINT8,MXFP8_E4M3,MX9] [--rounds 50]

Each bench model (its `.cache/bench/<model>/` files, made by `python -m bench`) is quantized
with each preset by this checkout's mixq and by the one under --old-src (a fresh process each,
the same calibration feeds), then the float, old and new models run interleaved round-robin
in one process (1 intra-op thread, batch 1: the bench's latency feed) so machine load hits
all three alike. Prints a Markdown table of medians and ratios to the float model.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

ROOT = Path(__file__).resolve().parents[1]
_QUANTIZE = ("import sys, mixq; mixq.quantize(sys.argv[1], sys.argv[2], calibration_data=sys.argv[3], "
             "output_path=sys.argv[4])")


def _quantize(src: Path, model: str, preset: str, out: Path) -> None:
    d = ROOT / ".cache" / "bench" / model
    env = dict(os.environ, PYTHONPATH=str(src))
    subprocess.run([sys.executable, "-c", _QUANTIZE, str(d / "float.onnx"), preset, str(d / "calib.npz"),
                    str(out)], env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _session(path: Path) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old-src", required=True, help="the src/ folder of the mixq to compare with")
    ap.add_argument("--models", default="minilm_l6,ppocr_rec,ppocr_cls,efficientnet_lite0,ppocr_det,"
                                        "silero_vad,fashion_cnn")
    ap.add_argument("--presets", default="BFP16,MXINT8,MXFP8_E4M3,MX9")
    ap.add_argument("--rounds", type=int, default=50)
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from bench.cases import get_case

    print(f"onnxruntime {ort.__version__}, 1 thread, batch 1, median of {args.rounds} interleaved rounds\n")
    print("| model | preset | float ms | old ms | old / float | new ms | new / float |")
    print("|---|---|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        for model in args.models.split(","):
            d = ROOT / ".cache" / "bench" / model
            if not (d / "calib.npz").is_file():
                raise SystemExit(f"no {d}/calib.npz: run `python -m bench --suite full --models {model}` first")
            feed = get_case(model).latency_feed(d)
            for preset in args.presets.split(","):
                old, new = Path(tmp) / f"{model}_{preset}_old.onnx", Path(tmp) / f"{model}_{preset}_new.onnx"
                _quantize(Path(args.old_src).resolve(), model, preset, old)
                _quantize(ROOT / "src", model, preset, new)
                sessions = [_session(d / "float.onnx"), _session(old), _session(new)]
                times: list[list[float]] = [[], [], []]
                for s in sessions:
                    for _ in range(3):
                        s.run(None, feed)
                for _ in range(args.rounds):
                    for i, s in enumerate(sessions):
                        t = time.perf_counter()
                        s.run(None, feed)
                        times[i].append(time.perf_counter() - t)
                f, o, n = (1e3 * float(np.median(t)) for t in times)
                print(f"| {model} | {preset} | {f:.3f} | {o:.3f} | {o / f:.2f}x | {n:.3f} | {n / f:.2f}x |",
                      flush=True)


if __name__ == "__main__":
    main()
