"""Small test models and `check_conversion`, shared by the tests and the benchmark.

`check_conversion(model_or_path, fmt)` runs one conversion and asserts everything a converted
model must satisfy (checker, loads and runs in onnxruntime CPU, fidelity bound, the format's
defining structure); reuse it for any model:

```python
from mixq.convert.testing import check_conversion
out, report = check_conversion("resnet.onnx", "bf16", min_sqnr_db=30)
```
"""
from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ..formats.base import MIXQ_DOMAIN
from .api import BF16_FORMATS, to_bf16, to_fp16
from .report import ConversionReport

__all__ = ["classifier_model", "transformer_model", "layernorm_cancel_model", "shape_paths_model", "if_model", "stack_model",
           "to_fp16_model", "check_conversion", "bf16_representable", "TEST_MODELS"]

OPSET = 17


def _w(rng: np.random.Generator, *shape: int, scale: float = 0.1) -> np.ndarray:
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def _model(nodes, inputs, outputs, inits, opset: int = OPSET, name: str = "g") -> onnx.ModelProto:
    g = helper.make_graph(nodes, name, inputs, outputs,
                          initializer=[numpy_helper.from_array(v, k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], producer_name="mixq-tests")
    m.ir_version = 8
    onnx.checker.check_model(m, full_check=True)
    return m


def classifier_model(seed: int = 0) -> onnx.ModelProto:
    """Conv+BN+Relu x2, GlobalAveragePool, Flatten, Gemm: input [N,3,16,16] -> logits [N,10]."""
    rng = np.random.default_rng(seed)
    inits = {
        "c1.w": _w(rng, 8, 3, 3, 3, scale=0.3), "c1.b": _w(rng, 8),
        "bn1.s": (1 + _w(rng, 8)), "bn1.b": _w(rng, 8), "bn1.m": _w(rng, 8),
        "bn1.v": (1 + np.abs(_w(rng, 8))),
        "c2.w": _w(rng, 16, 8, 3, 3, scale=0.2), "c2.b": _w(rng, 16),
        "bn2.s": (1 + _w(rng, 16)), "bn2.b": _w(rng, 16), "bn2.m": _w(rng, 16),
        "bn2.v": (1 + np.abs(_w(rng, 16))),
        "fc.w": _w(rng, 16, 10, scale=0.5), "fc.b": _w(rng, 10),
    }
    nodes = [
        helper.make_node("Conv", ["input", "c1.w", "c1.b"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c1", "bn1.s", "bn1.b", "bn1.m", "bn1.v"], ["b1"], name="bn1"),
        helper.make_node("Relu", ["b1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "c2.w", "c2.b"], ["c2"], name="conv2", pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("BatchNormalization", ["c2", "bn2.s", "bn2.b", "bn2.m", "bn2.v"], ["b2"], name="bn2"),
        helper.make_node("Relu", ["b2"], ["r2"], name="relu2"),
        helper.make_node("GlobalAveragePool", ["r2"], ["gap"], name="gap"),
        helper.make_node("Flatten", ["gap"], ["flat"], name="flatten"),
        helper.make_node("Gemm", ["flat", "fc.w", "fc.b"], ["logits"], name="fc"),
    ]
    return _model(nodes, [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 3, 16, 16])],
                  [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 10])], inits,
                  name="classifier")


def transformer_model(seed: int = 0, d: int = 32, seq: int = 8) -> onnx.ModelProto:
    """A pre-LN transformer block: LayerNormalization, Q/K/V MatMuls, Softmax attention, Erf GELU
    MLP, residual Adds; a Constant node for the 1/sqrt(d) scale. x [B,seq,d] -> y [B,seq,d]."""
    rng = np.random.default_rng(seed)
    inits = {
        "ln1.g": 1 + _w(rng, d), "ln1.b": _w(rng, d), "ln2.g": 1 + _w(rng, d), "ln2.b": _w(rng, d),
        "wq": _w(rng, d, d, scale=d ** -0.5), "wk": _w(rng, d, d, scale=d ** -0.5),
        "wv": _w(rng, d, d, scale=d ** -0.5), "wo": _w(rng, d, d, scale=d ** -0.5),
        "w1": _w(rng, d, 4 * d, scale=d ** -0.5), "b1": _w(rng, 4 * d),
        "w2": _w(rng, 4 * d, d, scale=(4 * d) ** -0.5), "b2": _w(rng, d),
        "half": np.array(0.5, np.float32), "one": np.array(1.0, np.float32),
        "rsqrt2": np.array(2 ** -0.5, np.float32),
    }
    mk = helper.make_node
    nodes = [
        mk("LayerNormalization", ["x", "ln1.g", "ln1.b"], ["h"], name="ln1", axis=-1, epsilon=1e-5),
        mk("MatMul", ["h", "wq"], ["q"], name="q"), mk("MatMul", ["h", "wk"], ["k"], name="k"),
        mk("MatMul", ["h", "wv"], ["v"], name="v"),
        mk("Transpose", ["k"], ["kt"], name="kt", perm=[0, 2, 1]),
        mk("MatMul", ["q", "kt"], ["s"], name="qk"),
        mk("Constant", [], ["scale"], name="scale_const",
           value=numpy_helper.from_array(np.array(d ** -0.5, np.float32), "scale")),
        mk("Mul", ["s", "scale"], ["ss"], name="scale"),
        mk("Softmax", ["ss"], ["p"], name="softmax", axis=-1),
        mk("MatMul", ["p", "v"], ["a"], name="pv"),
        mk("MatMul", ["a", "wo"], ["o"], name="o"),
        mk("Add", ["x", "o"], ["r1"], name="res1"),
        mk("LayerNormalization", ["r1", "ln2.g", "ln2.b"], ["h2"], name="ln2", axis=-1, epsilon=1e-5),
        mk("MatMul", ["h2", "w1"], ["f1"], name="fc1"), mk("Add", ["f1", "b1"], ["f1b"], name="fc1b"),
        mk("Mul", ["f1b", "rsqrt2"], ["g0"], name="gelu_div"), mk("Erf", ["g0"], ["g1"], name="gelu_erf"),
        mk("Add", ["g1", "one"], ["g2"], name="gelu_add"), mk("Mul", ["f1b", "g2"], ["g3"], name="gelu_mul"),
        mk("Mul", ["g3", "half"], ["g4"], name="gelu_half"),
        mk("MatMul", ["g4", "w2"], ["f2"], name="fc2"), mk("Add", ["f2", "b2"], ["f2b"], name="fc2b"),
        mk("Add", ["r1", "f2b"], ["y"], name="res2"),
    ]
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", seq, d])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["B", seq, d])], inits,
                  name="transformer")


def layernorm_cancel_model(seed: int = 0, d: int = 64, seq: int = 16, form: str = "mul") -> onnx.ModelProto:
    """A written-out LayerNorm whose variance is E[x^2] - E[x]^2, then a MatMul: x [B,seq,d] ->
    y [B,seq,d]. `form` spells the statistics: ``mul`` (ReduceMean(x*x) - m*m), ``pow``
    (Pow(x,2)) or ``sum`` (ReduceSum * 1/d). Fed x with a mean offset (e.g. N(3,1)) the two
    terms nearly cancel, which bfloat16 cannot represent."""
    rng = np.random.default_rng(seed)
    inits = {"g": 1 + _w(rng, d), "b": _w(rng, d), "w": _w(rng, d, d, scale=d ** -0.5),
             "eps": np.array(1e-5, np.float32), "two": np.array(2.0, np.float32),
             "inv_d": np.array(1.0 / d, np.float32)}
    mk = helper.make_node
    if form == "sum":
        stats = [mk("ReduceSum", ["x", "axes"], ["s1"], name="sum_x", keepdims=1),
                 mk("Mul", ["s1", "inv_d"], ["m"], name="mean_x"),
                 mk("Mul", ["x", "x"], ["xx"], name="sq_x"),
                 mk("ReduceSum", ["xx", "axes"], ["s2"], name="sum_xx", keepdims=1),
                 mk("Mul", ["s2", "inv_d"], ["ex2"], name="mean_xx"),
                 mk("Mul", ["m", "m"], ["m2"], name="sq_mean")]
        inits["axes"] = np.array([-1], np.int64)
    else:
        sq = (lambda a, o, n: mk("Pow", [a, "two"], [o], name=n)) if form == "pow" else \
            (lambda a, o, n: mk("Mul", [a, a], [o], name=n))
        stats = [mk("ReduceMean", ["x"], ["m"], name="mean_x", axes=[-1]), sq("x", "xx", "sq_x"),
                 mk("ReduceMean", ["xx"], ["ex2"], name="mean_xx", axes=[-1]), sq("m", "m2", "sq_mean")]
    nodes = stats + [
        mk("Sub", ["ex2", "m2"], ["var"], name="var"),
        mk("Add", ["var", "eps"], ["ve"], name="var_eps"),
        mk("Sqrt", ["ve"], ["std"], name="std"),
        mk("Sub", ["x", "m"], ["xc"], name="center"),
        mk("Div", ["xc", "std"], ["xn"], name="normalize"),
        mk("Mul", ["xn", "g"], ["xg"], name="gamma"),
        mk("Add", ["xg", "b"], ["h"], name="beta"),
        mk("MatMul", ["h", "w"], ["y"], name="proj"),
    ]
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", seq, d])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["B", seq, d])], inits,
                  name=f"layernorm_cancel_{form}")


def shape_paths_model(seed: int = 0) -> onnx.ModelProto:
    """int64 shape paths and float parameters: Conv, Clip(min,max), Resize (float scales),
    Shape/Gather/Unsqueeze/Concat/Reshape, an embedding Gather with int64 ids, ReduceMean, MatMul.
    Inputs img [1,4,8,8] float, ids [1,5] int64 -> logits [1,10]."""
    rng = np.random.default_rng(seed)
    c = 4
    inits = {
        "conv.w": _w(rng, c, 4, 1, 1, scale=0.5), "conv.b": _w(rng, c),
        "clip.min": np.array(0.0, np.float32), "clip.max": np.array(6.0, np.float32),
        "scales": np.array([1, 1, 2, 2], np.float32),
        "idx0": np.array([0], np.int64), "minus1": np.array([-1], np.int64),
        "fc.w": _w(rng, c * 16 * 16, 10, scale=0.05), "emb": _w(rng, 20, 10, scale=1.0),
    }
    mk = helper.make_node
    nodes = [
        mk("Conv", ["img", "conv.w", "conv.b"], ["c"], name="conv"),
        mk("Clip", ["c", "clip.min", "clip.max"], ["cl"], name="relu6"),
        mk("Resize", ["cl", "", "scales"], ["up"], name="resize", mode="nearest"),
        mk("Shape", ["up"], ["shp"], name="shape"),
        mk("Gather", ["shp", "idx0"], ["batch"], name="gather_batch", axis=0),
        mk("Concat", ["batch", "minus1"], ["newshape"], name="concat_shape", axis=0),
        mk("Reshape", ["up", "newshape"], ["flat"], name="reshape"),
        mk("MatMul", ["flat", "fc.w"], ["l0"], name="fc"),
        mk("Gather", ["emb", "ids"], ["e"], name="embed", axis=0),
        mk("ReduceMean", ["e"], ["em"], name="pool", axes=[1], keepdims=0),
        mk("Add", ["l0", "em"], ["logits"], name="add"),
    ]
    return _model(nodes, [helper.make_tensor_value_info("img", TensorProto.FLOAT, [1, 4, 8, 8]),
                          helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 5])],
                  [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 10])], inits,
                  name="shape_paths")


def if_model(seed: int = 0) -> onnx.ModelProto:
    """MatMul -> If (then: Add of an outer-scope weight, else: Mul) -> Relu. Inputs x [2,8], cond."""
    rng = np.random.default_rng(seed)
    inits = {"w": _w(rng, 8, 8, scale=0.4), "c1": _w(rng, 8), "c2": _w(rng, 8)}
    then_g = helper.make_graph([helper.make_node("Add", ["h", "c1"], ["t"])], "then", [],
                               [helper.make_tensor_value_info("t", TensorProto.FLOAT, [2, 8])])
    else_g = helper.make_graph([helper.make_node("Mul", ["h", "c2"], ["e"])], "else", [],
                               [helper.make_tensor_value_info("e", TensorProto.FLOAT, [2, 8])])
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
             helper.make_node("If", ["cond"], ["z"], name="branch", then_branch=then_g, else_branch=else_g),
             helper.make_node("Relu", ["z"], ["y"], name="relu")]
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8]),
                          helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])], inits, name="if")


def stack_model(params: int = 5_000_000, width: int = 1024, seed: int = 0) -> onnx.ModelProto:
    """A stack of MatMul+Add+Relu layers with about `params` parameters (benchmarks)."""
    rng = np.random.default_rng(seed)
    layers = max(1, round(params / (width * width + width)))
    nodes, inits = [], {}
    x = "x"
    for k in range(layers):
        inits[f"l{k}.w"] = (rng.standard_normal((width, width), dtype=np.float32) * width ** -0.5)
        inits[f"l{k}.b"] = rng.standard_normal(width, dtype=np.float32) * 0.01
        nodes += [helper.make_node("MatMul", [x, f"l{k}.w"], [f"m{k}"], name=f"mm{k}"),
                  helper.make_node("Add", [f"m{k}", f"l{k}.b"], [f"a{k}"], name=f"add{k}"),
                  helper.make_node("Relu" if k < layers - 1 else "Identity", [f"a{k}"],
                                   [f"r{k}" if k < layers - 1 else "y"], name=f"act{k}")]
        x = f"r{k}"
    g = helper.make_graph(nodes, "stack", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", width])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["B", width])],
                          initializer=[numpy_helper.from_array(v, k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", OPSET)])
    m.ir_version = 8
    return m


def to_fp16_model(model: onnx.ModelProto) -> onnx.ModelProto:
    """The float16 twin of a float32 test model: float weights, Constant values and graph
    inputs/outputs become float16 (Resize/Upsample scales stay float32)."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph
    keep32 = {n.input[2] for n in g.node if n.op_type == "Resize" and len(n.input) > 2} | \
             {n.input[1] for n in g.node if n.op_type == "Resize" and len(n.input) > 1}

    def conv(t: onnx.TensorProto) -> None:
        if t.data_type == TensorProto.FLOAT and t.name not in keep32:
            arr = numpy_helper.to_array(t).astype(np.float16)
            t.CopyFrom(numpy_helper.from_array(arr, t.name))

    def walk(graph: onnx.GraphProto) -> None:
        for t in graph.initializer:
            conv(t)
        for vi in list(graph.input) + list(graph.output) + list(graph.value_info):
            if vi.type.tensor_type.elem_type == TensorProto.FLOAT:
                vi.type.tensor_type.elem_type = TensorProto.FLOAT16
        for n in graph.node:
            for a in n.attribute:
                if a.type == onnx.AttributeProto.TENSOR:
                    conv(a.t)
                elif a.type == onnx.AttributeProto.GRAPH:
                    walk(a.g)
    walk(g)
    onnx.checker.check_model(m, full_check=True)
    return m


#: name -> builder of the float32 test models.
TEST_MODELS = {"classifier": classifier_model, "transformer": transformer_model,
               "shape_paths": shape_paths_model}


def bf16_representable(a: np.ndarray) -> bool:
    """Whether every value of float array `a` is exactly a bfloat16 value (NaN counts as one)."""
    a32 = np.asarray(a, np.float32)
    low = a32.view(np.uint32) & np.uint32(0xFFFF)
    return bool(np.all((low == 0) | np.isnan(a32)))


def _data_initializers(model: onnx.ModelProto, F: int, exact: ConversionReport | None = None,
                       scalars: bool = True) -> list[onnx.TensorProto]:
    """F weights read as data. With `exact` (the report), leave out those the converter keeps
    exact on purpose: weights read only by nodes it kept float and, unless `scalars` (fp16
    converts them), one-element weights."""
    from ._graph import NON_DATA_INPUTS
    params = {n.input[j] for n in model.graph.node for j in NON_DATA_INPUTS.get(n.op_type, ())
              if j < len(n.input)}
    used = {i for n in model.graph.node for i in n.input}
    out = [t for t in model.graph.initializer if t.data_type == F and t.name not in params and t.name in used]
    if exact is None:
        return out
    kept = {k.node for k in exact.kept_float}
    readers: dict[str, set[str]] = {}
    for n in model.graph.node:
        for i in n.input:
            readers.setdefault(i, set()).add(n.name or n.output[0])
    return [t for t in out if (scalars or int(np.prod(t.dims)) != 1) and not readers.get(t.name, set()) <= kept]


def check_conversion(model: onnx.ModelProto | str | os.PathLike, fmt: str, *, source: str = "auto",
                     min_sqnr_db: float | None = 35.0, min_cosine: float | None = 0.999,
                     feeds: Mapping[str, np.ndarray] | None = None,
                     shapes: Mapping[str, Sequence[int]] | None = None, full_check: bool = True,
                     ) -> tuple[onnx.ModelProto, ConversionReport]:
    """Convert `model` (to bf16 for the four bf16 formats, to fp16 for 'fp16'/'simulate_fp16'/
    'fp16:with_cast') and assert: the checker passes, the result runs in onnxruntime CPU, every
    output's SQNR >= `min_sqnr_db` and cosine >= `min_cosine` (None: not checked), model inputs and
    outputs keep their names and types, and the format's defining structure. Returns both."""
    from .._io import load_model

    original = load_model(model)
    orig_copy = original.SerializeToString() if original.ByteSize() < (1 << 30) else None
    if fmt in BF16_FORMATS:
        out, rep = to_bf16(original, fmt, source=source, feeds=feeds, shapes=shapes)
        target = TensorProto.BFLOAT16
    else:
        out, rep = to_fp16(original, fmt.replace("fp16:", ""), feeds=feeds, shapes=shapes)
        target = TensorProto.FLOAT16
    F = TensorProto.FLOAT16 if rep.source == "fp16" else TensorProto.FLOAT
    if orig_copy is not None:
        assert original.SerializeToString() == orig_copy, "the input model was modified"
    if full_check:
        if out.ByteSize() < (1 << 31) - 1:
            onnx.checker.check_model(out, full_check=True)
        else:
            onnx.checker.check_model(out)
    import onnxruntime as ort  # runs (fidelity already ran it; run once more with given feeds)
    assert rep.fidelity, "fidelity was not evaluated"
    for f in rep.fidelity:
        if f.not_compared:  # the report says why (and warns when nothing was compared)
            assert rep.warnings, f"{fmt}: output {f.name} not compared, and the report does not warn"
            continue
        if min_sqnr_db is not None:
            assert f.sqnr_db >= min_sqnr_db, f"{fmt}: output {f.name} SQNR {f.sqnr_db:.2f} dB < {min_sqnr_db}"
        if min_cosine is not None:
            assert f.cosine >= min_cosine, f"{fmt}: output {f.name} cosine {f.cosine:.6f} < {min_cosine}"
    sig = lambda vs: [(v.name, v.type.tensor_type.elem_type) for v in vs]  # noqa: E731
    inits = {t.name for t in original.graph.initializer}
    assert sig(i for i in out.graph.input if i.name not in inits) == \
        sig(i for i in original.graph.input if i.name not in inits), "model inputs changed"
    assert sig(out.graph.output) == sig(original.graph.output), "model outputs changed"
    ops = lambda m: [n.op_type for n in m.graph.node]  # noqa: E731
    n_cast = lambda m: sum(n.op_type == "Cast" for n in m.graph.node)  # noqa: E731
    if fmt == "with_cast" or fmt == "fp16:with_cast":
        assert rep.tensors_converted > 0
        assert n_cast(out) - n_cast(original) == rep.casts_inserted == 2 * rep.tensors_converted
        if target == TensorProto.BFLOAT16:
            for t in _data_initializers(out, F, rep, scalars=False):
                assert bf16_representable(numpy_helper.to_array(t)), f"weight {t.name} not bf16-rounded"
        assert any(f.sqnr_db != float("inf") for f in rep.fidelity if not f.not_compared) \
            or all(f.not_compared for f in rep.fidelity) or rep.tensors_converted == 0, \
            "with_cast outputs identical to the original: were the Casts optimized away?"
    elif fmt in ("simulate_bf16", "simulate_fp16"):
        assert ops(out) == ops(original), "simulate must not change the graph"
        assert rep.initializers_converted > 0
        for t in _data_initializers(out, F, rep, scalars=target != TensorProto.BFLOAT16):
            arr = numpy_helper.to_array(t)
            if target == TensorProto.BFLOAT16:
                assert bf16_representable(arr), f"weight {t.name} not bf16-representable"
            else:
                assert np.array_equal(arr.astype(np.float16).astype(arr.dtype), arr, equal_nan=True)
    elif fmt in ("bf16", "fp16"):
        stored = [t for t in out.graph.initializer if t.data_type == target]
        assert stored, f"no {fmt} initializers"
        assert rep.initializers_converted == len(stored)
        left = [t.name for t in _data_initializers(out, F, rep, scalars=target != TensorProto.BFLOAT16)
                if t.name not in {i.name for i in out.graph.input}]
        assert not left, f"float weights left unconverted: {left}"
    elif fmt == "customqdq":
        fn_names = {(f.domain, f.name) for f in out.functions}
        assert {(MIXQ_DOMAIN, "BFloat16Quantize"), (MIXQ_DOMAIN, "BFloat16Dequantize")} <= fn_names
        assert any(o.domain == MIXQ_DOMAIN for o in out.opset_import)
        fn_nodes = [n for n in out.graph.node if n.domain == MIXQ_DOMAIN]
        assert len(fn_nodes) == rep.qdq_nodes_inserted > 0
        assert sum(n.op_type == "BFloat16Quantize" for n in fn_nodes) == rep.tensors_converted
        assert n_cast(out) == n_cast(original), "customqdq must use function nodes, not Casts"
        assert any(t.data_type == TensorProto.BFLOAT16 for t in out.graph.initializer)
    # it runs with the report's own inputs too (fidelity did), and with fresh ones here
    from .report import make_feeds
    sess = ort.InferenceSession(out.SerializeToString(), providers=["CPUExecutionProvider"]) \
        if out.ByteSize() < (1 << 31) - 1 else None
    if sess is not None:
        res = sess.run(None, dict(feeds) if feeds is not None else make_feeds(original, shapes, seed=1))
        assert len(res) == len(out.graph.output)
    return out, rep
