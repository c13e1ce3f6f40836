"""Peak RSS of quantizing big models vs model size and vs number of calibration samples.

    python -m bench.bigmodel_bench [--dims 2048,4096,8192] [--samples 1,8,64] [--layers 9]

Each run generates a MatMul chain (weights in external data, written chunk by chunk), quantizes
it with A8W8 in a fresh process and reads that process's peak RSS (resource.getrusage). Prints
Markdown tables.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.robustness.bigmodel import calibration_file, measure_quantize, write_big_model  # noqa: E402


_DONE: dict[tuple, dict] = {}


def _run(tmp: Path, dim: int, layers: int, samples: int, preset: str) -> dict:
    """Quantize the `dim` model with `samples` calibration rows (each configuration once: the
    two tables share one)."""
    key = (dim, layers, samples, preset)
    if key in _DONE:
        return _DONE[key]
    model = tmp / f"m{dim}x{layers}.onnx"
    if not model.exists():
        for old in tmp.glob("m*.onnx*"):  # one model on disk at a time: they are GBs
            old.unlink()
        write_big_model(model, layers=layers, dim=dim)
    calib = calibration_file(tmp / f"c{dim}_{samples}.npy", samples=samples, dim=dim)
    out = tmp / "out" / f"q{dim}_{samples}.onnx"
    r = measure_quantize(model, calib, out, preset)
    for p in out.parent.glob(out.name + "*"):
        p.unlink()
    r["weight_bytes"] = layers * dim * dim * 4
    _DONE[key] = r
    return r


def _phases(r: dict) -> str:
    t = r["timings"]
    return " / ".join(f"{t.get(k, 0.0):.1f}" for k in ("calibrate", "rewrite", "kernel check", "save"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dims", default="2048,4096,8192")
    ap.add_argument("--layers", type=int, default=9)
    ap.add_argument("--samples", default="1,8,64")
    ap.add_argument("--preset", default="A8W8")
    args = ap.parse_args(argv)
    dims = [int(d) for d in args.dims.split(",")]
    samples = [int(s) for s in args.samples.split(",")]
    with tempfile.TemporaryDirectory(prefix="mixq_bigbench_") as t:
        tmp = Path(t)
        print(f"## peak RSS vs model size ({args.preset}, {args.layers} MatMul layers, 4 samples)\n")
        print("| dim | weights GB | time s | calibrate / rewrite / kernel check / save s "
              "| peak RSS GB | peak / weights |")
        print("|---|---|---|---|---|---|")
        for d in dims:
            r = _run(tmp, d, args.layers, 4, args.preset)
            print(f"| {d} | {r['weight_bytes'] / 1e9:.2f} | {r['seconds']:.1f} | {_phases(r)} | "
                  f"{r['peak_rss'] / 1e9:.2f} | {r['peak_rss'] / r['weight_bytes']:.2f} |", flush=True)
        d = dims[len(dims) // 2]
        print(f"\n## peak RSS vs calibration samples (dim {d})\n")
        print("| samples | time s | peak RSS GB | peak / weights |")
        print("|---|---|---|---|")
        for s in samples:
            r = _run(tmp, d, args.layers, s, args.preset)
            print(f"| {s} | {r['seconds']:.1f} | {r['peak_rss'] / 1e9:.2f} | "
                  f"{r['peak_rss'] / r['weight_bytes']:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
