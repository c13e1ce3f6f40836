"""What runs in the benchmark's fresh subprocesses: one quantization, one evaluation, or the
floor of a quantization (one float pass over the calibration data plus writing the model).

    python -m bench.worker quantize SPEC.json
    python -m bench.worker evaluate SPEC.json
    python -m bench.worker floor SPEC.json

SPEC.json holds the arguments and the path of the result file the worker writes (JSON). A
worker never raises past ``main``: failures are written into the result (``error``,
``traceback``), so the suite records them as rows. The parent measures the quantize wall time
from just before it starts the process to the ``written_at`` time stamp the child records once
the output file exists, so interpreter start-up and imports count.
"""
from __future__ import annotations

import json
import os
import resource
import sys
import time
import traceback
from pathlib import Path
from typing import Any


def _peak_rss_mb() -> float:
    """Peak resident set size of this process (and of any children it waited for), in MB."""
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return max(own, kids) / 1024.0  # Linux: kilobytes


def _error(exc: BaseException) -> dict[str, Any]:
    tb = traceback.format_exception(type(exc), exc, exc.__traceback__)
    frames = traceback.extract_tb(exc.__traceback__)
    where = next((f"{Path(f.filename).name}:{f.lineno} in {f.name}" for f in reversed(frames)), "")
    return {"error": f"{type(exc).__name__}: {str(exc)[:500]}", "where": where,
            "traceback": "".join(tb)[-4000:]}


def run_quantize(spec: dict[str, Any]) -> dict[str, Any]:
    """Quantize spec['model'] with spec['tool'] / spec['preset'] into spec['out']."""
    from .feeds import load_feeds
    from .tools import QUANTIZERS

    out = Path(spec["out"])
    tmp = Path(spec["tmp"])
    tmp.mkdir(parents=True, exist_ok=True)
    res: dict[str, Any] = {"ok": False}
    try:
        feeds = load_feeds(Path(spec["calib"]))
        info = QUANTIZERS[spec["tool"]](Path(spec["model"]), out, feeds, spec["preset"],
                                        bool(spec["reduce_range"]), tmp)
        if not out.is_file():
            raise RuntimeError(f"{spec['tool']} returned without writing {out}")
        res.update(ok=True, written_at=time.time(), info=info, size_bytes=out.stat().st_size)
        res["info"]["graph"] = graph_summary(out)  # after the time stamp: not part of the figure
    except BaseException as exc:  # noqa: BLE001 - a failure is a result
        res.update(_error(exc))
    res["peak_rss_mb"] = round(_peak_rss_mb(), 1)
    return res


def run_floor(spec: dict[str, Any]) -> dict[str, Any]:
    """The least any post-training quantizer does, timed like `run_quantize` (from process start
    to the output written): read spec['model'], run every calibration feed of spec['calib']
    through it once in onnxruntime (default session options, as a user's float run), and write
    the model to spec['out']. Issue 19 puts `mixq quantize` within 3x of this."""
    res: dict[str, Any] = {"ok": False}
    try:
        import onnx
        import onnxruntime as ort

        from .feeds import load_feeds

        out = Path(spec["out"])
        model = onnx.load(spec["model"])
        so = ort.SessionOptions()
        so.log_severity_level = 3
        sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        for feed in load_feeds(Path(spec["calib"])):
            sess.run(None, feed)
        onnx.save(model, str(out))
        res.update(ok=True, written_at=time.time(), size_bytes=out.stat().st_size)
    except BaseException as exc:  # noqa: BLE001 - a failure is a result
        res.update(_error(exc))
    return res


def graph_summary(path: Path) -> dict[str, Any]:
    """What a quantized graph contains: Q/DQ/Cast counts, model-local function calls, and the op
    types that consume a dequantized (or fake-quantized) tensor, i.e. the ops that were quantized."""
    import onnx

    m = onnx.load(str(path), load_external_data=False)
    nodes = list(m.graph.node)
    counts: dict[str, int] = {}
    for n in nodes:
        key = n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}.{n.op_type}"
        counts[key] = counts.get(key, 0) + 1
    qdq_out = {o for n in nodes if n.op_type in ("DequantizeLinear", "Cast") or
               n.domain not in ("", "ai.onnx") for o in n.output}
    consumers: dict[str, int] = {}
    skip = {"QuantizeLinear", "DequantizeLinear", "Cast"}
    for n in nodes:
        if n.op_type in skip or n.domain not in ("", "ai.onnx"):
            continue
        if any(i in qdq_out for i in n.input):
            consumers[n.op_type] = consumers.get(n.op_type, 0) + 1
    q = counts.get("QuantizeLinear", 0) + counts.get("com.microsoft.QuantizeLinear", 0)
    dq = counts.get("DequantizeLinear", 0) + counts.get("com.microsoft.DequantizeLinear", 0)
    funcs = sum(v for k, v in counts.items() if "." in k and "QuantizeLinear" not in k)
    summary = (f"{len(nodes)} nodes, {q} Q, {dq} DQ, {counts.get('Cast', 0)} Cast, {funcs} function "
               "calls; quantized inputs feed " + ", ".join(f"{k} x{v}" for k, v in sorted(consumers.items())))
    return {"nodes": len(nodes), "quantize_linear": q, "dequantize_linear": dq,
            "functions": funcs, "quantized_consumers": consumers, "summary": summary}


def _session(path: str, *, optimize: bool, threads: int):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    if not optimize:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])


def run_evaluate(spec: dict[str, Any]) -> dict[str, Any]:
    """Load spec['model'] in stock onnxruntime; latency (batch 1, 1 thread, median of
    spec['latency_runs'] runs, default optimizations) and the task metric with default and with
    disabled optimizations."""
    import numpy as np

    from .cases import get_case

    case = get_case(spec["case"])
    d = Path(spec["case_dir"])
    model = spec["model"]
    res: dict[str, Any] = {"loads": False}
    try:
        sess = _session(model, optimize=True, threads=1)
        res["loads"] = True
    except BaseException as exc:  # noqa: BLE001
        res.update({f"load_{k}": v for k, v in _error(exc).items()})
        return res
    try:
        feed = case.latency_feed(d)
        for _ in range(5):
            sess.run(None, feed)
        times = []
        for _ in range(int(spec["latency_runs"])):
            t = time.perf_counter()
            sess.run(None, feed)
            times.append(time.perf_counter() - t)
        res["latency_ms"] = 1e3 * float(np.median(times))
        res["latency_runs"] = len(times)
    except BaseException as exc:  # noqa: BLE001
        res.update({f"latency_{k}": v for k, v in _error(exc).items()})
    del sess
    threads = int(spec.get("threads") or os.cpu_count() or 1)
    budget = spec.get("eval_budget_s")
    for key, optimize in (("metric_opt", True), ("metric_noopt", False)):
        t = time.perf_counter()
        try:
            value, done, total = case.score(_session(model, optimize=optimize, threads=threads), d,
                                            budget_s=budget)
            res[key] = float(value)
            if done < total:  # a slow (simulated) model: the metric covers a prefix of the data
                res[f"{key}_units"] = [done, total]
                ref, _, _ = case.score(_session(str(d / "float.onnx"), optimize=True,
                                                threads=threads), d, max_units=done)
                res[f"{key}_float_same_units"] = float(ref)
        except BaseException as exc:  # noqa: BLE001
            res.update({f"{key}_{k}": v for k, v in _error(exc).items()})
        res[f"{key}_s"] = round(time.perf_counter() - t, 2)
    return res


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    run = {"quantize": run_quantize, "evaluate": run_evaluate, "floor": run_floor}
    if len(argv) != 2 or argv[0] not in run:
        print("usage: python -m bench.worker quantize|evaluate|floor SPEC.json", file=sys.stderr)
        return 2
    spec = json.loads(Path(argv[1]).read_text())
    res = run[argv[0]](spec)
    Path(spec["result"]).write_text(json.dumps(res, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
