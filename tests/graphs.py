"""Small test graphs written in ONNX text, and checks by values.

`model(text, seed=..., **shapes)`: parse an ONNX-text model whose constants are declared as graph
inputs, then turn the inputs named in `weights` into initializers with seeded random values.
`operand(qmodel, op_type, index, feed)`: the values that reach input `index` of the (single)
node of `op_type` in a quantized model, read from onnxruntime by exposing that input.
`assert_in_format(values, fmt, axis)`: the values are on the grid of `fmt` (a fixed point of
its NumPy reference), which is how a test tells that a format was applied without looking at
node names.
"""
from __future__ import annotations

import numpy as np
import onnx
import onnx.parser
import onnxruntime as ort
from onnx import numpy_helper

from mixq.formats import get_format


def model(text: str, *, seed: int = 0, scale: float = 0.3, **weights: tuple[int, ...]) -> onnx.ModelProto:
    m = onnx.parser.parse_model(text)
    rng = np.random.default_rng(seed)
    g = m.graph
    for name, shape in weights.items():
        arr = (rng.standard_normal(shape) * scale).astype(np.float32)
        g.initializer.append(numpy_helper.from_array(arr, name))
    keep = [i for i in g.input if i.name not in weights]
    del g.input[:]
    g.input.extend(keep)
    onnx.checker.check_model(m)
    return m


def feeds(m: onnx.ModelProto, n: int = 3, seed: int = 1, batch: int = 2) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    inits = {t.name for t in m.graph.initializer}
    out = []
    for _ in range(n):
        f = {}
        for i in m.graph.input:
            if i.name in inits:
                continue
            dims = [d.dim_value if d.HasField("dim_value") else batch for d in i.type.tensor_type.shape.dim]
            f[i.name] = rng.standard_normal(dims).astype(np.float32)
        out.append(f)
    return out


def session(m: onnx.ModelProto, optimize: bool = True) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.log_severity_level = 3
    if not optimize:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])


def run(m: onnx.ModelProto, feed: dict[str, np.ndarray], optimize: bool = True) -> list[np.ndarray]:
    s = session(m, optimize)
    names = {i.name for i in s.get_inputs()}
    return s.run(None, {k: v for k, v in feed.items() if k in names})


def operand(qmodel: onnx.ModelProto, op_type: str, index: int, feed: dict[str, np.ndarray]) -> np.ndarray:
    nodes = [n for n in qmodel.graph.node if n.op_type == op_type]
    assert len(nodes) == 1, f"expected one {op_type}, found {len(nodes)}"
    name = nodes[0].input[index]
    m = onnx.ModelProto()
    m.CopyFrom(qmodel)
    if name not in {o.name for o in m.graph.output}:
        m.graph.output.append(onnx.ValueInfoProto(name=name))
    s = session(m, optimize=False)
    names = {i.name for i in s.get_inputs()}
    return s.run([name], {k: v for k, v in feed.items() if k in names})[0]


def assert_in_format(values: np.ndarray, fmt_name: str, axis: int | None = None,
                     scale: float | None = None) -> None:
    """`values` are exactly representable in `fmt_name` (blocks along `axis`; integer formats:
    at most 2**bits distinct values, and multiples of `scale` when it is given)."""
    fmt = get_format(fmt_name)
    v = np.asarray(values, np.float32)
    if fmt.kind == "int":
        u = np.unique(v)
        assert u.size <= 2 ** fmt.bits, f"{u.size} distinct values: not {fmt_name}"
        if scale is not None:
            k = v.astype(np.float64) / np.float64(scale)
            assert np.allclose(k, np.rint(k), atol=1e-3), f"values are not on the {fmt_name} grid of scale {scale}"
            assert np.ptp(np.rint(k)) < 2 ** fmt.bits, f"values span more codes than {fmt_name} has"
        return
    if fmt.kind == "block":
        q = fmt.fake_quant(v, axis=axis)
    else:
        q = fmt.fake_quant(v)
    assert np.array_equal(q, v), (f"values are not in {fmt_name}: {int(np.sum(q != v))} of "
                                  f"{v.size} change when quantized again")


def assert_not_in_format(values: np.ndarray, fmt_name: str, axis: int | None = None) -> None:
    try:
        assert_in_format(values, fmt_name, axis)
    except AssertionError:
        return
    raise AssertionError(f"values are already in {fmt_name}")


def dq_scale(qmodel: onnx.ModelProto, value: str) -> float | None:
    """The per-tensor scale of the DequantizeLinear that produces `value`, if any."""
    inits = {t.name: t for t in qmodel.graph.initializer}
    for n in qmodel.graph.node:
        if n.op_type == "DequantizeLinear" and n.output[0] == value and n.input[1] in inits:
            sc = numpy_helper.to_array(inits[n.input[1]])
            zp = numpy_helper.to_array(inits[n.input[2]]) if len(n.input) > 2 and n.input[2] in inits else 0
            if sc.size == 1 and np.all(np.asarray(zp) == 0):
                return float(sc.reshape(()))
    return None
