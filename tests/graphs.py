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
from onnx import TensorProto, helper, numpy_helper

from mixq.api import cpu_has_vnni
from mixq.formats import get_format

#: how a test that judges a quantized model's numbers runs it: with onnxruntime's default
#: optimizations, as users do, except on an x86 CPU without VNNI, where its fused 8-bit kernels
#: saturate on full-range weights (README's int8 note: mixq warns there, which
#: tests/integration/test_quantize_small.py checks): there with the QDQ semantics (basic
#: optimizations), so that such a test judges the plan and not this CPU's kernels
RUNTIME: bool | str = True if cpu_has_vnni() is not False else "basic"


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


def session(m: onnx.ModelProto, optimize: bool | str = True) -> ort.InferenceSession:
    """A CPU session of `m`: default optimizations (True), none (False) or "basic"."""
    so = ort.SessionOptions()
    so.log_severity_level = 3
    if not optimize:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    elif optimize == "basic":
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    return ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])


def compare(float_model, quant_model, feeds, **kw):
    """`mixq.evaluate.compare`, the quantized model run as `RUNTIME` says unless `optimize` is
    given."""
    from mixq.evaluate import compare as _compare

    kw.setdefault("optimize", RUNTIME)
    return _compare(float_model, quant_model, feeds, **kw)


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


# ------------------------------------------------------------ phases of Sin / Cos computed at run time
def _model(nodes, inputs, outputs, inits, opset: int = 17) -> onnx.ModelProto:
    gr = helper.make_graph(nodes, "g", inputs, outputs, [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])
    return helper.make_model(gr, opset_imports=[helper.make_opsetid("", opset)], ir_version=9)


def _vi(name, shape, t=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, t, shape)


def stft_frontend():
    """A speech front end as onnx-asr's kaldi / NeMo exports write it: pre-emphasis (edge Pad,
    Slice, Mul by 0.97, Sub), the STFT as a Conv, the power (ReduceSumSquare), a Transpose to
    (B, T, F), the mel filterbank as a MatMul, the Log; loud, medium and quiet recordings."""
    N, nfft, hop, F, M = 4096, 256, 128, 129, 24
    t, k = np.arange(nfft), np.arange(F)[:, None]
    win = np.hanning(nfft)
    kern = np.concatenate([(np.cos(2 * np.pi * k * t / nfft) * win)[:, None],
                           (-np.sin(2 * np.pi * k * t / nfft) * win)[:, None]]).astype(np.float32)
    fb = np.zeros((F, M), np.float32)
    for j in range(M):
        c = int(2 + j * (F - 6) / M)
        fb[c:c + 5, j] = [0.25, 0.75, 1, 0.75, 0.25]
    inits = {"ax": np.array([1], np.int64), "pads": np.array([0, 0, 1, 0, 0, 0], np.int64),
             "s0": np.array([0], np.int64), "sN": np.array([N], np.int64), "a2": np.array([2], np.int64),
             "coef": np.float32(0.97), "kern": kern, "shp": np.array([0, 2, F, -1], np.int64), "fb": fb,
             "eps": np.float32(1e-10)}
    nodes = [helper.make_node("Unsqueeze", ["wave", "ax"], ["w3"]),
             helper.make_node("Pad", ["w3", "pads"], ["padded"], mode="edge"),
             helper.make_node("Slice", ["padded", "s0", "sN", "a2"], ["prev"]),
             helper.make_node("Mul", ["prev", "coef"], ["prev_s"]), helper.make_node("Sub", ["w3", "prev_s"], ["emph"]),
             helper.make_node("Conv", ["emph", "kern"], ["stft"], strides=[hop]),
             helper.make_node("Reshape", ["stft", "shp"], ["ri"]),
             helper.make_node("ReduceSumSquare", ["ri", "ax"], ["power"], keepdims=0),
             helper.make_node("Transpose", ["power"], ["power_t"], perm=[0, 2, 1]),
             helper.make_node("MatMul", ["power_t", "fb"], ["mel"]), helper.make_node("Add", ["mel", "eps"], ["mel_e"]),
             helper.make_node("Log", ["mel_e"], ["feats"])]
    m = _model(nodes, [_vi("wave", ["B", N])], [_vi("feats", ["B", None, M])], inits)
    m.opset_import[0].version = 18  # ReduceSumSquare's axes as an input

    def feeds(seed: int, n: int) -> list[dict[str, np.ndarray]]:
        rng = np.random.default_rng(seed)
        tt = np.arange(N) / 16000
        return [{"wave": ([0.5, 0.05, 0.002][i % 3] * (np.sin(2 * np.pi * rng.uniform(100, 3000, (4, 1)) * tt)
                                                       + 0.3 * rng.standard_normal((4, N)))).astype(np.float32)}
                for i in range(n)]
    return m, feeds(1, 12), feeds(2, 9)


def constant_q(octaves: int = 10, bins: int = 12, taps: int = 128, hop: int = 32, length: int = 1024):
    """A constant-Q transform as nnAudio's exports write it: each octave's windowed complex
    filters as a Conv on the waveform, the octaves stacked by a chain of Concats, the magnitude
    (square, sum of the real and imaginary parts, Sqrt), its Log, then a layer. Three tones per
    recording: most bins of most octaves are a filter's stopband, far below the loud bins."""
    rng = np.random.default_rng(5)
    freqs = np.linspace(0.02, 0.46, octaves * bins)
    n = np.arange(taps)
    win = 0.5 - 0.5 * np.cos(2 * np.pi * (n + 0.5) / taps)
    inits: dict = {}
    nodes = []
    for k in range(octaves):
        f = freqs[k * bins:(k + 1) * bins, None]
        w = np.concatenate([win * np.cos(2 * np.pi * f * n), win * np.sin(2 * np.pi * f * n)]) * 4 / taps
        inits[f"fb{k}"] = w[:, None, :].astype(np.float32)
        nodes.append(helper.make_node("Conv", ["x", f"fb{k}"], [f"c{k}"], strides=[hop]))
    prev = "c0"
    for k in range(1, octaves):
        nodes.append(helper.make_node("Concat", [prev, f"c{k}"], [f"s{k}"], axis=1))
        prev = f"s{k}"
    frames = (length - taps) // hop + 1
    inits.update(shape5=np.array([0, octaves, 2, bins, frames], np.int64),
                 shape3=np.array([0, octaves * bins, frames], np.int64), axis=np.array([2], np.int64),
                 eps=np.float32(1e-9), w2=rng.normal(0, 0.1, (8, octaves * bins, 1)).astype(np.float32))
    nodes += [helper.make_node("Reshape", [prev, "shape5"], ["r5"]), helper.make_node("Mul", ["r5", "r5"], ["sq"]),
              helper.make_node("ReduceSum", ["sq", "axis"], ["pw"], keepdims=0),
              helper.make_node("Sqrt", ["pw"], ["mag"]), helper.make_node("Add", ["mag", "eps"], ["mag_e"]),
              helper.make_node("Log", ["mag_e"], ["logm"]), helper.make_node("Reshape", ["logm", "shape3"], ["feat"]),
              helper.make_node("Conv", ["feat", "w2"], ["y"])]
    m = _model(nodes, [_vi("x", ["B", 1, length])], [_vi("y", ["B", 8, frames])], inits)
    t = np.arange(length)
    feeds = []
    for _ in range(10):
        x = np.zeros((2, 1, length))
        for b in range(2):
            for f in rng.uniform(freqs[0], freqs[-1], 3):
                x[b, 0] += rng.uniform(0.2, 1.0) * np.sin(2 * np.pi * f * t + rng.uniform(0, 6.3))
        feeds.append({"x": x.astype(np.float32)})
    return m, feeds


def rotary_at_run_time(start_max: int = 2000):
    """A rotary position embedding computed from position_ids at run time (int64 -> Cast ->
    Unsqueeze -> MatMul by the inverse-frequency row -> Concat -> Cos / Sin), rotating a
    projection of x; positions from up to `start_max` on, as in a long prompt's later tokens."""
    rng = np.random.default_rng(3)
    d, h = 16, 8
    inv = (1.0 / 10000 ** (np.arange(0, h, 2) / h)).astype(np.float32)[None, :]
    inits = {"wq": rng.normal(0, 0.3, (d, h)).astype(np.float32), "inv": inv, "ax": np.array([2], np.int64),
             "s0": np.array([0], np.int64), "s1": np.array([h // 2], np.int64), "s2": np.array([h], np.int64),
             "last": np.array([-1], np.int64), "wo": rng.normal(0, 0.3, (h, 6)).astype(np.float32)}
    nodes = [helper.make_node("Cast", ["position_ids"], ["pos"], to=TensorProto.FLOAT),
             helper.make_node("Unsqueeze", ["pos", "ax"], ["pos3"]),
             helper.make_node("MatMul", ["pos3", "inv"], ["freqs"]),
             helper.make_node("Concat", ["freqs", "freqs"], ["phase"], axis=-1),
             helper.make_node("Cos", ["phase"], ["cos"]), helper.make_node("Sin", ["phase"], ["sin"]),
             helper.make_node("MatMul", ["x", "wq"], ["q"]),
             helper.make_node("Slice", ["q", "s0", "s1", "last"], ["q1"]),
             helper.make_node("Slice", ["q", "s1", "s2", "last"], ["q2"]),
             helper.make_node("Neg", ["q2"], ["nq2"]), helper.make_node("Concat", ["nq2", "q1"], ["rot"], axis=-1),
             helper.make_node("Mul", ["q", "cos"], ["qc"]), helper.make_node("Mul", ["rot", "sin"], ["rs"]),
             helper.make_node("Add", ["qc", "rs"], ["qr"]), helper.make_node("MatMul", ["qr", "wo"], ["y"])]
    m = _model(nodes, [_vi("x", ["N", "S", d]), _vi("position_ids", ["N", "S"], TensorProto.INT64)],
               [_vi("y", ["N", "S", 6])], inits)
    feeds = []
    for _ in range(12):
        start = int(rng.integers(0, start_max))
        feeds.append({"x": rng.normal(0, 1, (2, 6, d)).astype(np.float32),
                      "position_ids": np.tile(np.arange(start, start + 6), (2, 1)).astype(np.int64)})
    return m, feeds


def timestep_embedding():
    """A diffusion model's timestep embedding: t in [0, 1000] times 8 frequencies (1 .. 1e-3),
    Sin and Cos concatenated, then a layer."""
    rng = np.random.default_rng(4)
    freqs = np.exp(-np.log(1000.0) * np.arange(8) / 8).astype(np.float32)[None, :]
    inits = {"ax": np.array([1], np.int64), "freqs": freqs, "w": rng.normal(0, 0.3, (16, 8)).astype(np.float32)}
    nodes = [helper.make_node("Unsqueeze", ["t", "ax"], ["t2"]), helper.make_node("Mul", ["t2", "freqs"], ["arg"]),
             helper.make_node("Sin", ["arg"], ["s"]), helper.make_node("Cos", ["arg"], ["c"]),
             helper.make_node("Concat", ["s", "c"], ["emb"], axis=1), helper.make_node("MatMul", ["emb", "w"], ["y"])]
    m = _model(nodes, [_vi("t", ["N"])], [_vi("y", ["N", 8])], inits)
    return m, [{"t": rng.uniform(0, 1000, 8).astype(np.float32)} for _ in range(8)]




def groupnorm_block(seed: int = 0):
    """Conv -> GroupNormalization (opset 21) -> SiLU -> Conv: ONNX type inference gives the
    GroupNormalization (a function op) no output type, nor anything after it."""
    rng = np.random.default_rng(seed)
    inits = {"w1": rng.normal(0, 0.3, (8, 4, 3, 3)).astype(np.float32), "g": np.ones(8, np.float32),
             "b": np.zeros(8, np.float32), "w2": rng.normal(0, 0.2, (4, 8, 3, 3)).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("GroupNormalization", ["c1", "g", "b"], ["gn"], num_groups=2),
             helper.make_node("Sigmoid", ["gn"], ["sg"]), helper.make_node("Mul", ["gn", "sg"], ["act"]),
             helper.make_node("Conv", ["act", "w2"], ["y"], pads=[1, 1, 1, 1])]
    m = _model(nodes, [_vi("x", ["N", 4, 8, 8])], [_vi("y", ["N", 4, 8, 8])], inits, opset=21)
    m.ir_version = 10
    return m, [{"x": rng.normal(0, 1, (2, 4, 8, 8)).astype(np.float32)} for _ in range(6)]


def standardized_features(seed: int = 0):
    """Tabular features fed unnormalized (a year 2020 +- 3, a price 350 +- 40, a latitude
    45 +- 0.5, a centred score) and standardized in the graph, (x - mean) / std with constants,
    then a two-layer MLP with a 2-value regression output."""
    rng = np.random.default_rng(seed)
    mean = np.array([2020.0, 350.0, 45.0, 0.0], np.float32)
    std = np.array([3.0, 40.0, 0.5, 1.0], np.float32)
    inits = {"mean": mean, "std": std, "w1": rng.normal(0, 0.5, (4, 32)).astype(np.float32),
             "b1": rng.normal(0, 0.1, 32).astype(np.float32), "w2": rng.normal(0, 0.3, (32, 2)).astype(np.float32)}
    nodes = [helper.make_node("Sub", ["x", "mean"], ["xc"]), helper.make_node("Div", ["xc", "std"], ["z"]),
             helper.make_node("MatMul", ["z", "w1"], ["h"]), helper.make_node("Add", ["h", "b1"], ["hb"]),
             helper.make_node("Relu", ["hb"], ["r"]), helper.make_node("MatMul", ["r", "w2"], ["y"])]
    m = _model(nodes, [_vi("x", ["N", 4])], [_vi("y", ["N", 2])], inits)
    feeds = [{"x": (mean + rng.normal(0, 1, (16, 4)) * std).astype(np.float32)} for _ in range(8)]
    return m, feeds


def offset_head(seed: int = 0):
    """A head whose values sit on large per-channel offsets (300, 250, 280: kelvins) with a
    small learned variation, then a layer (differences between the channels): every output
    element varies by ~1 around a constant of tens."""
    rng = np.random.default_rng(seed)
    inits = {"w1": rng.normal(0, 0.35, (8, 32)).astype(np.float32), "w2": rng.normal(0, 0.2, (32, 3)).astype(np.float32),
             "off": np.array([300.0, 250.0, 280.0], np.float32),
             "wd": np.array([[1, -1, 0], [0, 1, -1], [1, 0, -1]], np.float32)}
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("MatMul", ["r", "w2"], ["z"]), helper.make_node("Add", ["z", "off"], ["pre"]),
             helper.make_node("MatMul", ["pre", "wd"], ["y"])]
    m = _model(nodes, [_vi("x", ["N", 8])], [_vi("y", ["N", 3])], inits)
    return m, [{"x": rng.normal(0, 1, (8, 8)).astype(np.float32)} for _ in range(16)]


def bucketized_feature(seed: int = 0):
    """A feature bucketized in the graph (age 0 .. 110 -> Floor(age * 0.1) -> Cast -> Gather from
    an embedding per decade), concatenated with a dense branch and a layer."""
    rng = np.random.default_rng(seed)
    inits = {"k": np.float32(0.1), "emb": rng.normal(0, 1, (12, 8)).astype(np.float32),
             "w2": rng.normal(0, 0.3, (12, 3)).astype(np.float32), "wd": rng.normal(0, 0.3, (4, 4)).astype(np.float32)}
    nodes = [helper.make_node("MatMul", ["dense", "wd"], ["d"]), helper.make_node("Mul", ["age", "k"], ["a10"]),
             helper.make_node("Floor", ["a10"], ["bucket"]),
             helper.make_node("Cast", ["bucket"], ["idx"], to=TensorProto.INT64),
             helper.make_node("Gather", ["emb", "idx"], ["e"]), helper.make_node("Concat", ["e", "d"], ["z"], axis=1),
             helper.make_node("MatMul", ["z", "w2"], ["y"])]
    m = _model(nodes, [_vi("age", ["N"]), _vi("dense", ["N", 4])], [_vi("y", ["N", 3])], inits)
    feeds = [{"age": rng.uniform(0, 110, 32).astype(np.float32), "dense": rng.normal(0, 1, (32, 4)).astype(np.float32)}
             for _ in range(8)]
    return m, feeds


def image_output(seed: int = 0):
    """An image-to-image head (style transfer, denoising): two convolutions, Tanh, scaled to
    0..255: the output's mean (~128) is a sizeable share of its power, not all of it."""
    rng = np.random.default_rng(seed)
    inits = {"w1": rng.normal(0, 0.25, (16, 3, 3, 3)).astype(np.float32),
             "w2": rng.normal(0, 0.3, (3, 16, 3, 3)).astype(np.float32),
             "s": np.float32(127.5)}
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c1"], ["r"]),
             helper.make_node("Conv", ["r", "w2"], ["c2"], pads=[1, 1, 1, 1]), helper.make_node("Tanh", ["c2"], ["t"]),
             helper.make_node("Mul", ["t", "s"], ["ts"]), helper.make_node("Add", ["ts", "s"], ["y"])]
    m = _model(nodes, [_vi("x", ["N", 3, 16, 16])], [_vi("y", ["N", 3, 16, 16])], inits)
    return m, [{"x": rng.normal(0, 1, (2, 3, 16, 16)).astype(np.float32)} for _ in range(16)]


def nms_detector(seed: int = 0, anchors: int = 32):
    """A detector with NonMaxSuppression in its graph: boxes (sigmoid * 100 plus a minimum
    size) and two class scores per anchor, the selected (batch, class, box) indices, and the
    kept boxes gathered by them: outputs `selected` (int64, K x 3) and `kept` (K x 4)."""
    rng = np.random.default_rng(seed)
    inits = {"w1": rng.normal(0, 0.35, (8, 32)).astype(np.float32), "wb": rng.normal(0, 0.3, (32, 4)).astype(np.float32),
             "ws": rng.normal(0, 0.3, (32, 2)).astype(np.float32), "k": np.float32(100.0),
             "minwh": np.array([0, 0, 20, 20], np.float32), "maxk": np.array([5], np.int64),
             "iou": np.array([0.5], np.float32), "thr": np.array([0.3], np.float32),
             "col": np.array([2], np.int64), "ax0": np.array([0], np.int64), "ax1": np.array([1], np.int64)}
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("MatMul", ["r", "wb"], ["bl"]), helper.make_node("Sigmoid", ["bl"], ["bs"]),
             helper.make_node("Mul", ["bs", "k"], ["bk"]), helper.make_node("Add", ["bk", "minwh"], ["boxes"]),
             helper.make_node("MatMul", ["r", "ws"], ["sl"]), helper.make_node("Sigmoid", ["sl"], ["scores"]),
             helper.make_node("Transpose", ["scores"], ["st"], perm=[0, 2, 1]),
             helper.make_node("NonMaxSuppression", ["boxes", "st", "maxk", "iou", "thr"], ["selected"]),
             helper.make_node("Gather", ["selected", "col"], ["bi"], axis=1),
             helper.make_node("Squeeze", ["bi", "ax1"], ["idx"]), helper.make_node("Squeeze", ["boxes", "ax0"], ["b2"]),
             helper.make_node("Gather", ["b2", "idx"], ["kept"], axis=0)]
    m = _model(nodes, [_vi("x", [1, anchors, 8])],
               [_vi("selected", ["K", 3], TensorProto.INT64), _vi("kept", ["K", 4])], inits)
    return m, [{"x": rng.normal(0, 1, (1, anchors, 8)).astype(np.float32)} for _ in range(16)]


def vae_decoder(seed: int = 0):
    """A VAE: an encoder's mu and log-variance, the reparameterization mu + exp(logvar / 2) *
    RandomNormalLike(mu) (a new draw at every run), a decoder to 16 sigmoid pixels."""
    rng = np.random.default_rng(seed)
    inits = {"w1": rng.normal(0, 0.25, (16, 32)).astype(np.float32), "wm": rng.normal(0, 0.2, (32, 8)).astype(np.float32),
             "wv": rng.normal(0, 0.2, (32, 8)).astype(np.float32), "half": np.float32(0.5),
             "w2": rng.normal(0, 0.35, (8, 32)).astype(np.float32), "w3": rng.normal(0, 0.2, (32, 16)).astype(np.float32)}
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("MatMul", ["r", "wm"], ["mu"]), helper.make_node("MatMul", ["r", "wv"], ["lv"]),
             helper.make_node("Mul", ["lv", "half"], ["lh"]), helper.make_node("Exp", ["lh"], ["sd"]),
             helper.make_node("RandomNormalLike", ["mu"], ["eps"]), helper.make_node("Mul", ["sd", "eps"], ["noise"]),
             helper.make_node("Add", ["mu", "noise"], ["z"]), helper.make_node("MatMul", ["z", "w2"], ["d"]),
             helper.make_node("Relu", ["d"], ["dr"]), helper.make_node("MatMul", ["dr", "w3"], ["o"]),
             helper.make_node("Sigmoid", ["o"], ["y"])]
    m = _model(nodes, [_vi("x", ["N", 16])], [_vi("y", ["N", 16])], inits)
    return m, [{"x": rng.normal(0, 1, (4, 16)).astype(np.float32)} for _ in range(16)]


def zipmap_classifier(seed: int = 0):
    """sklearn-onnx's default classifier outputs: the label (ArgMax) and the probabilities as a
    ZipMap (ai.onnx.ml), a sequence of {class: probability} maps."""
    rng = np.random.default_rng(seed)
    inits = {"w1": rng.normal(0, 0.5, (4, 16)).astype(np.float32), "w2": rng.normal(0, 0.4, (16, 3)).astype(np.float32)}
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("MatMul", ["r", "w2"], ["lg"]), helper.make_node("Softmax", ["lg"], ["p"], axis=1),
             helper.make_node("ArgMax", ["p"], ["label"], axis=1, keepdims=0),
             helper.make_node("ZipMap", ["p"], ["probabilities"], domain="ai.onnx.ml", classlabels_int64s=[0, 1, 2])]
    seqmap = helper.make_sequence_type_proto(helper.make_map_type_proto(
        TensorProto.INT64, helper.make_tensor_type_proto(TensorProto.FLOAT, [])))
    g = helper.make_graph(nodes, "zipmap", [_vi("x", ["N", 4])],
                          [_vi("label", ["N"], TensorProto.INT64), helper.make_value_info("probabilities", seqmap)],
                          [numpy_helper.from_array(v, k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 1)],
                          ir_version=9)
    return m, [{"x": rng.normal(0, 1, (4, 4)).astype(np.float32)} for _ in range(8)]


def random_head(seed: int) -> tuple[onnx.ModelProto, str]:
    """A seeded regression head, x (N, 8) -> Gemm -> Relu -> Gemm -> y (N, K), and a line
    saying what it is: K of 2 to 8 targets on scales drawn log-uniform over 1 .. 10^spread
    (spread 0.5, 1, 2 or 3), an offset on one target in half of them (bench/head_sweep.py)."""
    r = np.random.default_rng(seed)
    k = int(r.integers(2, 9))
    spread = float(r.choice([0.5, 1.0, 2.0, 3.0]))
    scales = 10.0 ** r.uniform(0.0, spread, size=k)
    w1 = (r.normal(size=(8, 16)) / 3).astype(np.float32)
    w2 = (r.normal(size=(16, k)) / 3 * scales).astype(np.float32)
    b2 = np.zeros(k, np.float32)
    if r.random() < 0.5:
        j = int(r.integers(0, k))
        b2[j] = 3.0 * scales[j]
    g = helper.make_graph(
        [helper.make_node("Gemm", ["x", "W1"], ["h"]), helper.make_node("Relu", ["h"], ["hr"]),
         helper.make_node("Gemm", ["hr", "W2", "b2"], ["y"])], "head",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", k])],
        [numpy_helper.from_array(w1, "W1"), numpy_helper.from_array(w2, "W2"), numpy_helper.from_array(b2, "b2")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    return m, f"K={k}, scales 1..{scales.max() / scales.min():.0f}x" + (", offset" if b2.any() else "")


def random_mlp(seed: int) -> tuple[onnx.ModelProto, list[dict[str, np.ndarray]], list[dict[str, np.ndarray]]]:
    """A seeded MLP, x (N, d) -> 3 to 6 x (MatMul, Add, one of Relu/Tanh/Sigmoid/none) -> y,
    widths 8 to 64, a few outlier weights in 40 % of the layers (int4 then costs that layer
    much more than the others); with 8 calibration and 8 held-out batches of 8 rows
    (tests/integration/test_auto_refine.py)."""
    r = np.random.default_rng(seed)
    depth, d = int(r.integers(3, 7)), int(r.choice([8, 16, 32]))
    nodes, inits = [], []
    src, width = "x", d
    acts = ["Relu", "Tanh", "Sigmoid", None]
    for i in range(depth):
        out_w = int(r.choice([8, 16, 32, 64])) if i < depth - 1 else int(r.integers(2, 11))
        w = r.normal(0, 1 / np.sqrt(width), (width, out_w)).astype(np.float32)
        if r.random() < 0.4:
            idx = r.integers(0, w.size, size=max(1, w.size // 50))
            w.flat[idx] *= float(r.choice([5, 20]))
        inits += [numpy_helper.from_array(w, f"W{i}"),
                  numpy_helper.from_array(r.normal(0, 0.1, out_w).astype(np.float32), f"B{i}")]
        nodes += [helper.make_node("MatMul", [src, f"W{i}"], [f"m{i}"], name=f"mm{i}"),
                  helper.make_node("Add", [f"m{i}", f"B{i}"], [f"a{i}"], name=f"add{i}")]
        src = f"a{i}"
        a = acts[int(r.integers(0, 4))] if i < depth - 1 else None
        if a:
            nodes.append(helper.make_node(a, [src], [f"h{i}"], name=f"act{i}"))
            src = f"h{i}"
        width = out_w
    nodes.append(helper.make_node("Identity", [src], ["y"], name="out"))
    g = helper.make_graph(nodes, "mlp", [_vi("x", ["N", d])], [_vi("y", ["N", width])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    scale = float(r.choice([0.5, 1, 4]))
    calib = [{"x": r.normal(0, scale, (8, d)).astype(np.float32)} for _ in range(8)]
    held = [{"x": r.normal(0, scale, (8, d)).astype(np.float32)} for _ in range(8)]
    return m, calib, held
