"""Benchmark of mixq.convert: in-process conversion time per format and the process time of
`python -m mixq.tools.convert_fp32_to_bf16` (imports included). Prints a Markdown table.

    python bench/convert_bench.py                 # builds a ~5M-parameter MatMul stack
    python bench/convert_bench.py --model m.onnx  # any float32 model
    python bench/convert_bench.py --params 20000000 --repeat 5

In-process times are the median of --repeat runs (after one warm-up that fills the kernel-probe
cache), without the fidelity evaluation (`evaluate=False`); the bf16/fp16 formats include the
onnxruntime session check of the result. The target is < 0.5 s per conversion at 5M parameters.
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="float32 .onnx model (default: a generated MatMul stack)")
    ap.add_argument("--params", type=int, default=5_000_000, help="parameters of the generated model")
    ap.add_argument("--repeat", type=int, default=3, help="timed runs per format (median)")
    ap.add_argument("--no-subprocess", action="store_true", help="skip the python -m timing")
    args = ap.parse_args(argv)

    import onnx

    from mixq._io import load_model, save_model
    from mixq.convert import BF16_FORMATS, to_bf16, to_fp16
    from mixq.convert.testing import stack_model

    model = load_model(args.model) if args.model else stack_model(args.params)
    n_params = sum(int(__import__("numpy").prod(t.dims)) for t in model.graph.initializer)
    rows = []
    jobs = [(f"bf16/{f}", lambda f=f: to_bf16(model, f, evaluate=False)) for f in BF16_FORMATS]
    jobs += [(f"fp16/{f}", lambda f=f: to_fp16(model, f, evaluate=False)) for f in ("fp16", "with_cast")]
    for name, fn in jobs:
        fn()  # warm-up: imports, kernel probes
        times = []
        for _ in range(args.repeat):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
        rows.append((name, statistics.median(times), min(times)))
    _, rep = to_bf16(model, "bf16")  # one evaluated run for the fidelity column
    fid = rep.min_sqnr_db

    sub = None
    if not args.no_subprocess:
        with tempfile.TemporaryDirectory() as tmp:
            src = save_model(model, Path(tmp) / "in.onnx")
            cmd = [sys.executable, "-m", "mixq.tools.convert_fp32_to_bf16", "--input", str(src),
                   "--output", str(Path(tmp) / "out.onnx"), "--format", "bf16", "--no-eval"]
            times = []
            for _ in range(args.repeat):
                t = time.perf_counter()
                subprocess.run(cmd, check=True, capture_output=True)
                times.append(time.perf_counter() - t)
            sub = statistics.median(times)

    print(f"### mixq convert benchmark: {len(model.graph.node)} nodes, {n_params / 1e6:.2f} M parameters, "
          f"{model.ByteSize() / 2 ** 20:.1f} MiB (onnx {onnx.__version__})\n")
    print("| conversion | median (s) | min (s) | < 0.5 s |")
    print("|---|---:|---:|:---:|")
    for name, med, mn in rows:
        print(f"| {name} | {med:.3f} | {mn:.3f} | {'yes' if med < 0.5 else 'NO'} |")
    if sub is not None:
        print(f"| `python -m mixq.tools.convert_fp32_to_bf16 --format bf16 --no-eval` (process) | {sub:.3f} | | |")
    print(f"\nbf16 fidelity on random inputs: min SQNR {fid:.2f} dB; fidelity evaluation {rep.eval_time_s:.3f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
