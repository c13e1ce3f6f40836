"""A > 2 GiB MatMul chain written tensor by tensor as external data, and a subprocess measuring
the peak RSS of quantizing it (used by tests/robustness/test_bigmodel.py and
bench/bigmodel_bench.py). The peak includes the pages of the weights file onnxruntime maps
during calibration (ru_maxrss counts mapped file pages once touched).

The weights are generated in row chunks straight into the external data file, so generating the
model never holds more than one chunk in memory; the .onnx file itself is a few kB.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

_CHUNK_ROWS = 512


def write_big_model(path: str | os.PathLike, *, layers: int = 9, dim: int = 8192, seed: int = 0,
                    opset: int = 21) -> int:
    """Write `layers` MatMul(+Relu) layers of `dim` x `dim` float32 weights to `path` with the
    weights in `<path>.data`; returns the weight bytes. Input x: [N, dim] (N dynamic)."""
    path = Path(path)
    data_name = path.name + ".data"
    rng = np.random.default_rng(seed)
    inits, nodes = [], []
    offset = 0
    scale = np.float32(2.0 / np.sqrt(dim))
    # one random chunk, rolled and rescaled per chunk: generating 600M normals would take a minute
    base = rng.standard_normal((_CHUNK_ROWS, dim), dtype=np.float32)
    with open(path.parent / data_name, "wb") as f:
        for i in range(layers):
            pad = (-offset) % 4096
            if pad:
                f.write(b"\0" * pad)
                offset += pad
            start = offset
            for r in range(0, dim, _CHUNK_ROWS):
                rows = min(_CHUNK_ROWS, dim - r)
                chunk = np.roll(base[:rows], int(rng.integers(dim)), axis=1)
                chunk *= scale * np.float32(rng.uniform(0.5, 1.5))
                chunk.tofile(f)
                offset += chunk.nbytes
            t = TensorProto()
            t.name, t.data_type = f"w{i}", TensorProto.FLOAT
            t.dims.extend([dim, dim])
            t.data_location = TensorProto.EXTERNAL
            for k, v in (("location", data_name), ("offset", str(start)), ("length", str(offset - start))):
                e = t.external_data.add()
                e.key, e.value = k, v
            inits.append(t)
            src = "x" if i == 0 else f"r{i - 1}"
            last = i == layers - 1
            nodes.append(helper.make_node("MatMul", [src, f"w{i}"], ["y" if last else f"m{i}"], name=f"mm{i}"))
            if not last:
                nodes.append(helper.make_node("Relu", [f"m{i}"], [f"r{i}"], name=f"relu{i}"))
    g = helper.make_graph(nodes, "big_mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", dim])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", dim])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 10
    with open(path, "wb") as f:
        f.write(m.SerializeToString())
    return layers * dim * dim * 4


def calibration_file(path: str | os.PathLike, *, samples: int, dim: int = 8192, seed: int = 1) -> Path:
    """A .npy of `samples` rows [samples, dim] (fed one row at a time)."""
    x = np.random.default_rng(seed).standard_normal((samples, 1, dim), dtype=np.float32)
    np.save(path, x)
    return Path(path)


_MEASURE = textwrap.dedent("""
    import json, resource, sys, time
    import mixq
    model, calib, out, preset = sys.argv[1:5]
    t = time.perf_counter()
    res = mixq.quantize(model, preset, calib, output_path=out)
    dt = time.perf_counter() - t
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({"seconds": dt, "peak_rss": peak, "timings": res.timings,
                      "quant_bytes": res.quant_bytes, "warnings": res.warnings}))
""")


def measure_quantize(model: str | os.PathLike, calib: str | os.PathLike, out: str | os.PathLike,
                     preset: str = "A8W8", timeout: float = 600) -> dict:
    """Quantize in a fresh process; returns {"seconds", "peak_rss", "timings", ...}."""
    env = dict(os.environ)
    p = subprocess.run([sys.executable, "-c", _MEASURE, str(model), str(calib), str(out), preset],
                       capture_output=True, text=True, timeout=timeout, env=env)
    if p.returncode != 0:
        raise RuntimeError(f"quantize subprocess failed ({p.returncode}):\n{p.stderr[-4000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])
