"""Property test: randomly generated small graphs (op chains from the op table, random shapes and
names, including names that look like mixq's own) quantized with every preset. Every output is
accepted by the checker, runs in onnxruntime, and every planned activation carries its format
(checked by values on the tensors the plan quantizes)."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st
from onnx import helper, numpy_helper

import mixq
from mixq.formats import get_format
from mixq.plan.ops import TAIL_REASON, postprocess_tail, shape_only_tensors

from ..graphs import assert_in_format, dq_scale, run, session

_NAMES = st.sampled_from(["t", "a:b", "a_b", "x__mq", "h/scale", "conv.out", "n 1", "ü", "y__f"])

#: (op, builder) pairs: each builder appends nodes reading `src` (shape (N, C, H, W)) and
#: returns the new tensor (same shape unless the op changes it, given back too).
_UNARY = ["Relu", "Sigmoid", "Tanh", "HardSigmoid", "Identity", "Softmax", "Sin", "Cos"]


#: post-processing after the final MatMul (shape (1, 5) kept): a bias Add, activations, a
#: decode-like scaling by a constant, a product
_TAIL = ["AddBias", "MulConst", "Sigmoid", "Softmax", "Relu", "Tanh", "Square"]


def _build(ops: list[tuple[str, int]], names: list[str], c: int, hw: int, seed: int,
           tail: list[str] = ()) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    nodes, inits = [], []
    used: set[str] = set()

    def fresh(base: str) -> str:
        i = 0
        while f"{base}{i}" in used:
            i += 1
        used.add(f"{base}{i}")
        return f"{base}{i}"

    src, shape = "x", [1, c, hw, hw]
    for k, (op, arg) in enumerate(ops):
        out = fresh(names[k % len(names)])
        if op == "Conv":
            w = fresh("w")
            oc = max(1, arg)
            inits.append(numpy_helper.from_array((rng.standard_normal((oc, shape[1], 3, 3)) * 0.2).astype(np.float32), w))
            b = fresh("b")
            inits.append(numpy_helper.from_array((rng.standard_normal(oc) * 0.1).astype(np.float32), b))
            nodes.append(helper.make_node("Conv", [src, w, b], [out], pads=[1, 1, 1, 1]))
            shape = [1, oc, shape[2], shape[3]]
        elif op in ("ConvTBiasBN", "BN"):  # paddle2onnx: ConvTranspose, its bias as an Add, then BN
            if op == "ConvTBiasBN":
                w, b, tb = fresh("wt"), fresh("bt"), fresh("tb")
                oc = max(1, arg)
                inits += [numpy_helper.from_array((rng.standard_normal((shape[1], oc, 3, 3)) * 0.2).astype(np.float32), w),
                          numpy_helper.from_array((rng.standard_normal((1, oc, 1, 1)) * 0.1).astype(np.float32), b)]
                t = fresh("convt")
                nodes += [helper.make_node("ConvTranspose", [src, w], [t], pads=[1, 1, 1, 1]),
                          helper.make_node("Add", [t, b], [tb])]
                src, shape = tb, [1, oc, shape[2], shape[3]]
            params = [fresh(p_) for p_ in ("g", "beta", "mean", "var")]
            ch = shape[1]
            for p_, v in zip(params, (rng.uniform(0.5, 2, ch), rng.standard_normal(ch) * 0.3,
                                      rng.standard_normal(ch) * 0.5, rng.uniform(0.3, 2, ch))):
                inits.append(numpy_helper.from_array(v.astype(np.float32), p_))
            nodes.append(helper.make_node("BatchNormalization", [src, *params], [out]))
        elif op == "Add":
            other = fresh("k")
            inits.append(numpy_helper.from_array((rng.standard_normal(shape[1:]) * 0.5).astype(np.float32), other))
            nodes.append(helper.make_node("Add", [src, other], [out]))
        elif op == "Mul":
            nodes.append(helper.make_node("Mul", [src, src], [out]))
        elif op == "Concat":
            nodes.append(helper.make_node("Concat", [src, src], [out], axis=1))
            shape = [1, 2 * shape[1], shape[2], shape[3]]
        elif op == "MaxPool":
            nodes.append(helper.make_node("MaxPool", [src], [out], kernel_shape=[2, 2], strides=[1, 1], pads=[0, 0, 1, 1]))
        elif op == "Transpose":
            nodes.append(helper.make_node("Transpose", [src], [out], perm=[0, 1, 3, 2]))
        elif op == "MatMulT":  # x @ x^T per channel: both operands run-time, as attention's
            t = fresh("xt")
            nodes += [helper.make_node("Transpose", [src], [t], perm=[0, 1, 3, 2]),
                      helper.make_node("MatMul", [src, t], [out])]
            shape = [1, shape[1], shape[2], shape[2]]
        elif op == "RotHalf" and shape[3] % 2 == 0:  # rotary embedding's rotate-half, as Llama exports it
            h = shape[3] // 2
            x1, x2, neg, rot, m1, m2, c1, c2 = (fresh(p) for p in ("x1", "x2", "neg", "rot", "m1", "m2", "cos", "sin"))
            inits += [numpy_helper.from_array(np.cos(rng.uniform(0, 3, shape[3])).astype(np.float32), c1),
                      numpy_helper.from_array(np.sin(rng.uniform(0, 3, shape[3])).astype(np.float32), c2)]
            for half, (b, e) in ((x1, (0, h)), (x2, (h, 2 * h))):
                bounds = [fresh(p) for p in ("start", "end", "axis")]
                inits += [numpy_helper.from_array(np.array([v], np.int64), n) for v, n in zip((b, e, 3), bounds)]
                nodes.append(helper.make_node("Slice", [src, *bounds], [half]))
            nodes += [helper.make_node("Neg", [x2], [neg]), helper.make_node("Concat", [neg, x1], [rot], axis=3),
                      helper.make_node("Mul", [src, c1], [m1]), helper.make_node("Mul", [rot, c2], [m2]),
                      helper.make_node("Add", [m1, m2], [out])]
        elif op == "SqueezeUnsqueeze":
            ax0, u = fresh("ax"), fresh("u")
            inits.append(numpy_helper.from_array(np.array([0], np.int64), ax0))
            nodes += [helper.make_node("Unsqueeze", [src, ax0], [u]), helper.make_node("Squeeze", [u, ax0], [out])]
        elif op == "GlobalAveragePool":
            nodes.append(helper.make_node("GlobalAveragePool", [src], [out]))
            shape = [1, shape[1], 1, 1]
        elif op in ("ShapeReshape", "ShapeScale"):  # float arithmetic on Shape (torch exports)
            dims = [fresh("dims"), fresh("dims_f")]
            nodes += [helper.make_node("Shape", [src], [dims[0]]),
                      helper.make_node("Cast", [dims[0]], [dims[1]], to=onnx.TensorProto.FLOAT)]
            parts = [fresh(f"d{i}") for i in range(4)]
            for i, part in enumerate(parts):
                idx = fresh("i")
                inits.append(numpy_helper.from_array(np.array([i], np.int64), idx))
                nodes.append(helper.make_node("Gather", [dims[1], idx], [part], axis=0))
            if op == "ShapeReshape":  # (N, C, H, W) -> (N, C, H * W, 1), the target in float
                hw_, one, tgt_f, tgt = fresh("hw"), fresh("one"), fresh("tgt_f"), fresh("tgt")
                inits.append(numpy_helper.from_array(np.array([1.0], np.float32), one))
                nodes += [helper.make_node("Mul", [parts[2], parts[3]], [hw_]),
                          helper.make_node("Concat", [parts[0], parts[1], hw_, one], [tgt_f], axis=0),
                          helper.make_node("Cast", [tgt_f], [tgt], to=onnx.TensorProto.INT64),
                          helper.make_node("Reshape", [src, tgt], [out])]
                shape = [1, shape[1], shape[2] * shape[3], 1]
            else:  # x / sqrt(C): a float operand of a quantized Mul, from the shape
                root, inv, one = fresh("root"), fresh("inv"), fresh("one")
                inits.append(numpy_helper.from_array(np.array([1.0], np.float32), one))
                nodes += [helper.make_node("Sqrt", [parts[1]], [root]),
                          helper.make_node("Div", [one, root], [inv]),
                          helper.make_node("Mul", [src, inv], [out])]
        else:
            nodes.append(helper.make_node(op, [src], [out]) if op not in ("Softmax", "RotHalf") else
                         helper.make_node(op, [src], [out], axis=1) if op == "Softmax" else
                         helper.make_node("Identity", [src], [out]))  # RotHalf of an odd width
        src = out
    flat = fresh("flat")
    nodes.append(helper.make_node("Flatten", [src], [flat]))
    w = fresh("fc")
    feat = int(np.prod(shape[1:]))
    inits.append(numpy_helper.from_array((rng.standard_normal((feat, 5)) * 0.2).astype(np.float32), w))
    last = "y" if not tail else fresh("logits")
    nodes.append(helper.make_node("MatMul", [flat, w], [last]))
    for k, op in enumerate(tail):
        out = "y" if k == len(tail) - 1 else fresh("post")
        if op in ("AddBias", "MulConst"):
            k_ = fresh("k")
            shape_k = (5,) if op == "AddBias" else (1, 5)
            inits.append(numpy_helper.from_array((rng.standard_normal(shape_k) * 4).astype(np.float32), k_))
            nodes.append(helper.make_node(op[:3], [last, k_], [out]))
        elif op == "Square":
            nodes.append(helper.make_node("Mul", [last, last], [out]))
        else:
            nodes.append(helper.make_node(op, [last], [out]))
        last = out
    for i, n in enumerate(nodes):
        n.name = f"{n.op_type.lower()}_{i}"
    g = helper.make_graph(nodes, "random", [helper.make_tensor_value_info("x", 1, [1, c, hw, hw])],
                          [helper.make_tensor_value_info("y", 1, [1, 5])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.checker.check_model(m, full_check=True)
    return m


#: op types a user may exclude: data movement, element-wise ops, a tail activation
_DROPPABLE = ["Transpose", "Slice", "Concat", "Add", "Mul", "MaxPool", "Reshape", "Squeeze", "Unsqueeze",
              "Sigmoid", "Relu"]

_OP = st.one_of(st.tuples(st.sampled_from(["Conv", "ConvTBiasBN"]), st.integers(1, 6)),
                st.tuples(st.sampled_from(["Add", "Mul", "Concat", "MaxPool", "Transpose", "BN", "MatMulT",
                                           "GlobalAveragePool", "ShapeReshape", "ShapeScale", "RotHalf",
                                           "SqueezeUnsqueeze", *_UNARY]),
                          st.just(0)))


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow],
          phases=[Phase.explicit, Phase.reuse, Phase.generate], derandomize=True)
@given(ops=st.lists(_OP, min_size=1, max_size=6), names=st.lists(_NAMES, min_size=1, max_size=4),
       c=st.integers(1, 5), hw=st.integers(2, 6), seed=st.integers(0, 1000),
       tail=st.lists(st.sampled_from(_TAIL), max_size=3),
       excluded=st.tuples(st.integers(0, 40), st.integers(0, 3)),
       dropped=st.sets(st.sampled_from(_DROPPABLE), max_size=4),
       headroom=st.sampled_from(["auto", 1.5]))
# a Transpose and the Sigmoid after it excluded: DequantizeLinear (int8) -> Transpose -> float
@example(ops=[("Conv", 4), ("Transpose", 0), ("Sigmoid", 0)], names=["t"], c=2, hw=4, seed=3, tail=[],
         excluded=(1, 2), dropped=set(), headroom="auto")
# rotate-half with every op but Mul excluded by type: the Muls' island has no layer and is
# dropped, then the Conv's grid reaches the excluded Transpose, whose output (dropped) was left
# float: DequantizeLinear (int8) -> Transpose -> Slice, which onnxruntime refused
@example(ops=[("Conv", 4), ("Transpose", 0), ("RotHalf", 0)], names=["t"], c=2, hw=4, seed=3, tail=[],
         excluded=(0, 0), dropped={"Transpose", "Slice", "Concat", "Add"}, headroom="auto")
# the same with the Slices quantized: the grid the excluded Transpose carries reaches them after
# the island drop had left their outputs float
@example(ops=[("Conv", 4), ("Transpose", 0), ("RotHalf", 0)], names=["t"], c=2, hw=4, seed=3, tail=[],
         excluded=(0, 0), dropped={"Transpose", "Concat", "Add"}, headroom="auto")
@pytest.mark.parametrize("preset", list(mixq.PRESETS))
def test_random_graphs_quantize_and_run(preset, ops, names, c, hw, seed, tail, excluded, dropped, headroom):
    m = _build(ops, names, c, hw, seed, tail)
    rng = np.random.default_rng(seed)
    fs = [{"x": rng.standard_normal((1, c, hw, hw)).astype(np.float32)} for _ in range(3)]
    # a run of nodes a user excludes by name (onnxruntime's nodes_to_exclude, e.g. a region of
    # post-processing): pass-through ones included, which left float after an int8 tensor and
    # read by float ops made onnxruntime refuse the model at session creation
    start = excluded[0] % len(m.graph.node)
    skip = frozenset(n.name for n in m.graph.node[start:start + excluded[1]])
    # and op types a user excludes (exclude_op_types / op_types)
    cfg = mixq.get_default_config(preset).with_options(exclude_nodes=skip, exclude_op_types=frozenset(dropped))
    if headroom != "auto" and cfg.power_of_two is None and cfg.why_inert("output_headroom") is None:
        cfg = cfg.with_options(output_headroom=headroom)  # the output's ranges widened (opt-in)
    try:
        res = mixq.quantize(m, cfg, fs, check_kernels=False)
    except mixq.ConfigError as exc:  # a headroom that moves no range of this graph is refused
        if headroom == "auto" or "output_headroom=1.5 changes nothing in this model" not in str(exc):
            raise
        cfg = cfg.with_options(output_headroom="auto")
        res = mixq.quantize(m, cfg, fs, check_kernels=False)
    onnx.checker.check_model(res.model, full_check=True)
    got = run(res.model, fs[0])[0]  # default optimizations: the session loads
    assert got.shape == (1, 5) and np.all(np.isfinite(got))
    # every planned activation carries its format: the value its first consumer reads in the
    # quantized model is exposed and checked by value
    pipe = mixq.pipeline.Pipeline.load(m, keep_nodes=sorted(skip))  # as quantize prepares it
    ix = pipe.index
    qnodes = {n.name: n for n in res.model.graph.node}
    for name, tp in res.plan.tensors.items():
        if tp.role != "activation" or tp.format is None:
            continue
        readers = [n for n in ix.consumers(name) if n.name not in tp.consumer_formats]
        if not readers:
            continue
        node = qnodes[readers[0].name]
        value = node.input[list(readers[0].input).index(name)]
        assert_in_format(_expose(res.model, value, fs[0]), tp.format, axis=tp.block_axis,
                         scale=dq_scale(res.model, value))
        if get_format(tp.format).kind == "block":  # blocks run along the axis the reader reduces
            want = _reduced_axis(readers[0], list(readers[0].input).index(name), ix.rank(name))
            assert want is None or tp.block_axis == want, (name, readers[0].op_type, tp.block_axis, want)
    floats = [v for v in ix.values() + list(ix.initializers) if ix.elem_type(v) == onnx.TensorProto.FLOAT]
    assert all(v in res.plan.tensors or v in res.plan.skipped for v in floats)
    # float shape arithmetic is never quantized (a rounded Reshape target fails or misplaces data)
    shaped = shape_only_tensors(pipe.model.graph.node, set(ix.initializers))
    assert not [v for v in shaped if v in res.plan.tensors and res.plan.tensors[v].format is not None]
    # the post-processing after the final MatMul stays float, and only it: a bias Add right
    # after the MatMul and a Relu after either are part of the layer (one kernel with it)
    expect, layer = set(), True
    for node, op in zip(m.graph.node[len(m.graph.node) - len(tail):], tail):
        layer = layer and op in ("AddBias", "Relu")
        if not layer:
            expect.add(node.name)
    nodes = list(pipe.model.graph.node)
    found = {nodes[i].name for i in postprocess_tail(nodes, {n: tuple(t.dims) for n, t in ix.initializers.items()})}
    assert found == expect, (tail, found, expect)
    for name in expect:
        why = res.plan.float_nodes.get(name, "")
        assert why == TAIL_REASON or why.startswith("op type") or name in skip, (name, why)


def _reduced_axis(node: onnx.NodeProto, index: int, rank: int | None) -> int | None:
    """The axis `node` sums input `index` over (None: not a dot-product op, or rank unknown)."""
    if rank is None:
        return None
    if node.op_type in ("Conv", "ConvTranspose"):
        return 0 if (node.op_type, index) == ("ConvTranspose", 1) else 1
    if node.op_type == "MatMul":
        return rank - 1 if index == 0 or rank == 1 else rank - 2
    return None


def _expose(qmodel: onnx.ModelProto, name: str, feed: dict[str, np.ndarray]) -> np.ndarray:
    m = onnx.ModelProto()
    m.CopyFrom(qmodel)
    if name not in {o.name for o in m.graph.output}:
        m.graph.output.append(onnx.ValueInfoProto(name=name))
    return session(m, optimize=False).run([name], feed)[0]
