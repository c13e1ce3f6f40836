"""Throughput of every format's emitted ONNX in onnxruntime (CPU) and of its NumPy reference.

For each format in `mixq.formats.list_formats()`: the fake quantization of a 1x64x56x56
activation (per tensor; block formats along axis 1) and of a constant 256x256x3x3 weight
(per output channel; block formats along axis 1), next to a float Identity and a float 3x3
64->64 Conv of the same activation. Prints a Markdown table.

    python bench/formats_bench.py [--repeat 20] [--formats int8,mxfp4] [--threads 1]
"""
from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from mixq.formats import Emission, Format, QParams, list_formats
from mixq.formats.onnx_util import emission_to_model

ACT_SHAPE = (1, 64, 56, 56)
W_SHAPE = (256, 256, 3, 3)


def _time(fn: Callable[[], object], repeat: int) -> float:
    """Median wall time of `fn` in milliseconds (after one warm-up call)."""
    fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times)) * 1e3


def _session(model: onnx.ModelProto, threads: int) -> ort.InferenceSession:
    so = ort.SessionOptions()
    if threads:
        so.intra_op_num_threads = threads
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def _act_qparams(fmt: Format, x: np.ndarray) -> QParams | None:
    if not fmt.needs_qparams:
        return None
    return fmt.qparams_from_range(float(x.min()), float(x.max()), symmetric=True)


def _w_qparams(fmt: Format, w: np.ndarray) -> QParams | None:
    if not fmt.needs_qparams:
        return None
    red = tuple(range(1, w.ndim))
    return fmt.qparams_from_range(w.min(axis=red), w.max(axis=red), symmetric=True, axis=0)


def _baselines(x: np.ndarray, repeat: int, threads: int) -> list[tuple[str, float, float]]:
    ident = Emission(nodes=[helper.make_node("Identity", ["x"], ["y"])])
    m = emission_to_model(ident, {"x": TensorProto.FLOAT}, input_shapes={"x": list(x.shape)})
    s = _session(m, threads)
    t_id = _time(lambda: s.run(None, {"x": x}), repeat)
    cw = (np.random.default_rng(1).standard_normal((64, 64, 3, 3)) * 0.05).astype(np.float32)
    conv = Emission(nodes=[helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])],
                    initializers=[numpy_helper.from_array(cw, "w")])
    m = emission_to_model(conv, {"x": TensorProto.FLOAT}, input_shapes={"x": list(x.shape)})
    s = _session(m, threads)
    t_conv = _time(lambda: s.run(None, {"x": x}), repeat)
    return [("float Identity (baseline)", t_id, float("nan")),
            ("float Conv 3x3 64->64 (baseline)", t_conv, float("nan"))]


def bench_format(fmt: Format, x: np.ndarray, w: np.ndarray, repeat: int, threads: int
                 ) -> tuple[float, float, float, float]:
    """(ORT activation ms, NumPy activation ms, ORT weight ms, NumPy weight ms)."""
    block = fmt.kind == "block"
    qa = _act_qparams(fmt, x)
    em = fmt.emit("x", "y", qparams=qa, axis=1 if block else None, prefix="q")
    m = emission_to_model(em, {"x": TensorProto.FLOAT}, input_shapes={"x": list(x.shape)})
    s = _session(m, threads)
    t_act = _time(lambda: s.run(None, {"x": x}), repeat)
    kw = {"axis": 1} if block else {}
    t_np_act = _time(lambda: fmt.fake_quant(x, qa, **kw), max(3, repeat // 4))

    qw = _w_qparams(fmt, w)
    emw = fmt.emit_weight(w, "y", qparams=qw, axis=1 if block else None, prefix="w")
    mw = emission_to_model(emw, {})
    sw = _session(mw, threads)
    t_w = _time(lambda: sw.run(None, {}), repeat)
    t_np_w = _time(lambda: fmt.fake_quant(w, qw, **kw), max(3, repeat // 4))
    return t_act, t_np_act, t_w, t_np_w


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--formats", default="", help="comma-separated names (default: all)")
    ap.add_argument("--threads", type=int, default=0, help="onnxruntime intra-op threads (0: default)")
    args = ap.parse_args(argv)

    rng = np.random.default_rng(0)
    x = rng.standard_normal(ACT_SHAPE).astype(np.float32)
    w = (rng.standard_normal(W_SHAPE) * 0.05).astype(np.float32)
    fmts = list_formats()
    if args.formats:
        want = {n.strip().lower() for n in args.formats.split(",")}
        fmts = [f for f in fmts if f.name.lower() in want]
    mel_a, mel_w = x.size / 1e6, w.size / 1e6

    print(f"onnxruntime {ort.__version__}, activation {ACT_SHAPE}, weight {W_SHAPE}, "
          f"median of {args.repeat} runs\n")
    print("| format | bits | ORT act ms | ORT act Melem/s | NumPy act ms | ORT weight ms | "
          "NumPy weight ms | NumPy weight Melem/s |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, t, _ in _baselines(x, args.repeat, args.threads):
        print(f"| {name} | 32 | {t:.3f} | {mel_a / t * 1e3:.0f} | | | | |")
    for fmt in fmts:
        try:
            ta, tna, tw, tnw = bench_format(fmt, x, w, args.repeat, args.threads)
        except Exception as e:  # keep the table going; report the failure in its row
            print(f"| {fmt.name} | {fmt.avg_bits:g} | error: {type(e).__name__}: {str(e)[:80]} | | | | | |")
            continue
        print(f"| {fmt.name} | {fmt.avg_bits:g} | {ta:.3f} | {mel_a / ta * 1e3:.0f} | {tna:.2f} | "
              f"{tw:.3f} | {tnw:.2f} | {mel_w / tnw * 1e3:.0f} |")


if __name__ == "__main__":
    main()
