"""The graph layer on the cases that broke mixq on unseen models (issue 14): each ends in a model
that runs in onnxruntime with the asked formats on the compute inputs (checked by values), or in
a clear mixq error that names the tensor."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import mixq
from mixq.errors import MixqError
from mixq.graph import GraphIndex, NameAllocator, all_names

from ..graphs import assert_in_format, feeds, model, operand, run

INT_PRESETS = ["A8W8", "XINT8", "A16W8", "U8S8", "S16S16"]
ALL_PRESETS = list(mixq.PRESETS)


def _quantize_runs(m, preset, fs):
    res = mixq.quantize(m, preset, fs)
    onnx.checker.check_model(res.model, full_check=True)
    for optimize in (True, False):
        out = run(res.model, fs[0], optimize)
        assert all(np.all(np.isfinite(o)) for o in out)
    return res


# --------------------------------------------------------------- MatMul with N-D constants
@pytest.mark.parametrize("shape_x,shape_b", [((2, 8), (8,)), ((3, 2, 8), (3, 8, 5)),
                                              ((2, 3, 4, 8), (2, 3, 8, 5))])
@pytest.mark.parametrize("preset", INT_PRESETS + ["BFP16", "MXFP4", "BF16"])
def test_matmul_with_nd_constant(shape_x, shape_b, preset):
    """A8W8 on a MatMul with a 1-D, 3-D or 4-D constant B: QLinearMatMul failed at run time
    (per-column scales exist only for a 2-D B); now such weights are per tensor, with the
    reason in the plan."""
    rank_x = len(shape_x)
    dims_x = ",".join(map(str, shape_x))
    m = model(f"""<ir_version: 8, opset_import: ["": 17]>
        g (float[{dims_x}] x, float[{",".join(map(str, shape_b))}] B) => (float y) {{ y = MatMul(x, B) }}""",
              B=shape_b)
    del m.graph.output[:]
    m.graph.output.append(helper.make_tensor_value_info("y", 1, None if rank_x else None))
    m = onnx.shape_inference.infer_shapes(m)
    out_shape = np.matmul(np.zeros(shape_x), np.zeros(shape_b)).shape
    del m.graph.output[:]
    m.graph.output.append(helper.make_tensor_value_info("y", 1, list(out_shape)))
    fs = [{"x": np.random.default_rng(i).standard_normal(shape_x).astype(np.float32)} for i in range(3)]
    res = _quantize_runs(m, preset, fs)
    tp = res.plan.tensors.get("B")
    if preset in INT_PRESETS and len(shape_b) != 2:
        assert tp.channel_axis is None and "per tensor" in tp.reason


# --------------------------------------------------------------- Gemm attributes, scalar bias
@pytest.mark.parametrize("preset", INT_PRESETS + ["BFP16", "BF16"])
def test_gemm_trans_a_alpha_beta_scalar_bias(preset):
    m = model("""<ir_version: 8, opset_import: ["": 17]>
        g (float[6,3] x, float[6,4] Bw, float C) => (float[3,4] y) {
            y = Gemm <transA = 1, alpha = 0.5, beta = 2.0> (x, Bw, C) }""", Bw=(6, 4), C=())
    fs = feeds(m)
    res = _quantize_runs(m, preset, fs)
    ref = 0.5 * fs[0]["x"].T @ numpy_helper.to_array(m.graph.initializer[0]) + \
        2.0 * numpy_helper.to_array(m.graph.initializer[1])
    got = run(res.model, fs[0])[0]
    assert np.corrcoef(ref.ravel(), got.ravel())[0, 1] > 0.99
    if preset in INT_PRESETS:
        assert res.plan.tensors["C"].format is None and "kept float" in res.plan.tensors["C"].reason


# --------------------------------------------------------------- grouped ConvTranspose
@pytest.mark.parametrize("preset", INT_PRESETS + ["BFP16", "MXFP8_E4M3"])
def test_grouped_conv_transpose(preset):
    m = model("""<ir_version: 8, opset_import: ["": 17]>
        g (float[1,4,5,5] x, float[4,2,3,3] W, float[4] b) => (float[1,4,7,7] y) {
            y = ConvTranspose <group = 2> (x, W, b) }""", W=(4, 2, 3, 3), b=(4,))
    _quantize_runs(m, preset, feeds(m))


# --------------------------------------------------------------- Concat with 100 inputs
def test_concat_with_100_inputs_quantizes_every_input():
    ins = [f"x{i}" for i in range(100)]
    body = "\n".join(f"x{i} = Mul(x, k{i})" for i in range(100))
    decl = ", ".join(f"float[1] k{i}" for i in range(100))
    m = model(f"""<ir_version: 8, opset_import: ["": 17]>
        g (float[2,3] x, {decl}) => (float[2,300] y) {{ {body}
            y = Concat <axis = 1> ({", ".join(ins)}) }}""", **{f"k{i}": (1,) for i in range(100)})
    fs = feeds(m)
    res = _quantize_runs(m, "XINT8", fs)
    assert all(res.plan.tensors[i].format == "int8" for i in ins)
    groups = {res.plan.tensors[i].group for i in ins}
    assert len(groups) == 1, "XINT8 shares one scale across every Concat input"
    assert_in_format(run(res.model, fs[0])[0], "int8")


# --------------------------------------------------------------- zero sizes
@pytest.mark.parametrize("preset", ["A8W8", "BFP16", "MXFP4", "BF16"])
def test_static_zero_batch(preset):
    m = model("""<ir_version: 8, opset_import: ["": 17]>
        g (float[0,8] x, float[8,4] W) => (float[0,4] y) { y = MatMul(x, W) }""", W=(8, 4))
    fs = [{"x": np.zeros((0, 8), np.float32)}]
    res = mixq.quantize(m, preset, fs)
    assert run(res.model, fs[0])[0].shape == (0, 4)


@pytest.mark.parametrize("preset", ["A8W8", "MXFP4", "BFP16", "BF16"])
def test_zero_size_weight(preset):
    m = model("""<ir_version: 8, opset_import: ["": 17]>
        g (float[2,0] x, float[0,4] W) => (float[2,4] y) { y = MatMul(x, W) }""", W=(0, 4))
    fs = [{"x": np.zeros((2, 0), np.float32)}]
    res = mixq.quantize(m, preset, fs)
    assert np.array_equal(run(res.model, fs[0])[0], np.zeros((2, 4), np.float32))


# --------------------------------------------------------------- names
@pytest.mark.parametrize("preset", ["A8W8", "BFP16", "BF16", "MXFP4", "XINT8"])
def test_colliding_and_lookalike_names(preset):
    """`a:b` and `a_b` sanitize alike (TensorFlow exports); `x__mq` and `h/scale` look like the
    names mixq gives; none may collide with a name the rewrite creates."""
    m = model("""<ir_version: 8, opset_import: ["": 17]>
        g (float[2,8] x, float[8,8] "a:b", float[8,8] a_b) => (float[2,8] y) {
            "h/scale" = MatMul(x, "a:b")
            x__mq = MatMul("h/scale", a_b)
            y = Relu(x__mq) }""", **{"a:b": (8, 8), "a_b": (8, 8)})
    fs = feeds(m)
    res = _quantize_runs(m, preset, fs)
    names = [t.name for t in res.model.graph.initializer]
    assert len(names) == len(set(names))


def test_name_allocator_never_collides():
    m = model("""<ir_version: 8, opset_import: ["": 17]>
        g (float[2,8] x) => (float[2,8] y) { "t/scale" = Relu(x)  t__mq = Relu("t/scale")  y = Relu(t__mq) }""")
    names = NameAllocator.for_model(m)
    assert names.value("t", "mq") == "t__mq_2"
    assert names.value("t", "mq") == "t__mq_3"
    p1, p2 = names.prefix("t"), names.prefix("t:")
    assert p1 == "t_2" and p2 not in (p1, "t")  # "t" is taken as a namespace by t/scale
    assert "t__mq_2" in names and "t__mq" in all_names(m)


# --------------------------------------------------------------- sparse initializers
@pytest.mark.parametrize("preset", ["A8W8", "BFP16"])
def test_sparse_initializer(preset):
    rng = np.random.default_rng(0)
    dense = (rng.standard_normal((8, 8)) * (rng.random((8, 8)) > 0.6)).astype(np.float32)
    idx = np.flatnonzero(dense).astype(np.int64)
    sp = helper.make_sparse_tensor(numpy_helper.from_array(dense.reshape(-1)[idx], "S"),
                                   numpy_helper.from_array(idx, "S_idx"), [8, 8])
    g = helper.make_graph([helper.make_node("MatMul", ["x", "S"], ["y"], name="mm")], "g",
                          [helper.make_tensor_value_info("x", 1, [2, 8])],
                          [helper.make_tensor_value_info("y", 1, [2, 8])], sparse_initializer=[sp])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    fs = feeds(m)
    res = _quantize_runs(m, preset, fs)
    ref = fs[0]["x"] @ dense
    assert np.corrcoef(ref.ravel(), run(res.model, fs[0])[0].ravel())[0, 1] > 0.99


# --------------------------------------------------------------- subgraphs
def test_weight_shared_by_main_graph_and_if_branch():
    """The weight W feeds a main-graph MatMul and a MatMul inside an If branch: the rewrite
    replaces it for the main graph only and must keep it for the branch."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array((rng.standard_normal((8, 8)) * 0.3).astype(np.float32), "W")
    then_g = helper.make_graph([helper.make_node("MatMul", ["h", "W"], ["t_out"])], "then", [],
                               [helper.make_tensor_value_info("t_out", 1, [2, 8])])
    else_g = helper.make_graph([helper.make_node("Relu", ["h"], ["e_out"])], "else", [],
                               [helper.make_tensor_value_info("e_out", 1, [2, 8])])
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"),
             helper.make_node("If", ["c"], ["y"], name="branch", then_branch=then_g, else_branch=else_g)]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", 1, [2, 8]),
                                       helper.make_tensor_value_info("c", onnx.TensorProto.BOOL, [])],
                          [helper.make_tensor_value_info("y", 1, [2, 8])], [w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    fs = [{"x": rng.standard_normal((2, 8)).astype(np.float32), "c": np.array(True)} for _ in range(3)]
    for preset in ("A8W8", "BFP16", "BF16"):
        res = _quantize_runs(m, preset, fs)
        assert any(t.name == "W" for t in res.model.graph.initializer)
        ix = GraphIndex.of(m)
        assert [n.name for n in ix.consumers("W")] == ["mm", "branch"]
        assert "t_out" in res.plan.skipped and "If" in res.plan.skipped["t_out"]


# --------------------------------------------------------------- pass-through ops
CONV_VIA_SLICE = """<ir_version: 8, opset_import: ["": 17]>
    g (float[1,8,8,6] x, float[8,4,3,3] W, int64[1] st, int64[1] en, int64[1] ax) => (float[1,8,6,6] y) {
        s = Slice(x, st, en, ax)
        t = Transpose <perm = [0, 3, 1, 2]> (s)
        y = Conv(t, W) }"""


def _conv_via_slice():
    m = model(CONV_VIA_SLICE, W=(8, 4, 3, 3))
    for name, v in (("st", [0]), ("en", [4]), ("ax", [3])):
        m.graph.initializer.append(numpy_helper.from_array(np.array(v, np.int64), name))
    keep = [i for i in m.graph.input if i.name == "x"]
    del m.graph.input[:]
    m.graph.input.extend(keep)
    return m


@pytest.mark.parametrize("act,wgt,override", [
    ("bfp16", "bf16", None), ("bf16", "bfp16", None), ("bfp16", "bfp16", None),
    ("mxfp8_e4m3", "mxfp8_e4m3", None), ("bf16", "bf16", None), ("int8", "int8", None),
    ("bfp16", "bfp16", ("t", "bf16")), ("bf16", "bf16", ("t", "bfp16")),
    ("bfp16", "bfp16", ("W", "bf16"))])
def test_conv_fed_through_transpose_of_slice(act, wgt, override):
    """Element-wise and tensor-wise configs (the seeds' snippets): the asked formats reach the
    Conv's inputs, checked by the values onnxruntime feeds it. A block format does not survive
    a Slice or Transpose (elements move across blocks), so the Conv gets its own."""
    m = _conv_via_slice()
    cfg = mixq.QuantConfig(activation=act, weight=wgt, calibration="minmax",
                           tensor_formats=(override,) if override else ())
    fs = [{"x": np.random.default_rng(i).standard_normal((1, 8, 8, 6)).astype(np.float32) * 3 + 1}
          for i in range(3)]
    res = mixq.quantize(m, cfg, fs)
    want_act = override[1] if override and override[0] == "t" else act
    want_w = override[1] if override and override[0] == "W" else wgt
    assert_in_format(operand(res.model, "Conv", 0, fs[0]), want_act, axis=1)
    if get_kind(want_w) != "int":
        assert_in_format(operand(res.model, "Conv", 1, fs[0]), want_w, axis=1)


def get_kind(name: str) -> str:
    return mixq.get_format(name).kind


# --------------------------------------------------------------- untyped tensors
def test_untyped_tensor_has_a_reason():
    """A custom op's output (its type unknown to shape inference) feeding a Conv: it stays
    float with the reason in the plan; calibrating needs the op, which is a clear error."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array((rng.standard_normal((4, 3, 3, 3)) * 0.3).astype(np.float32), "W")
    nodes = [helper.make_node("Fancy", ["x"], ["u"], name="fancy", domain="acme"),
             helper.make_node("Conv", ["u", "W"], ["y"], name="conv")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", 1, [1, 3, 8, 8])],
                          [helper.make_tensor_value_info("y", 1, [1, 4, 6, 6])], [w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("acme", 1)])
    m.ir_version = 8
    plan = mixq.pipeline.Pipeline.load(m).plan(mixq.get_default_config("A8W8"))
    assert "u" in plan.skipped and "type unknown" in plan.skipped["u"] and "fancy" in plan.skipped["u"]
    with pytest.raises(MixqError, match="acme"):
        mixq.quantize(m, "A8W8", [{"x": np.zeros((1, 3, 8, 8), np.float32)}])


# --------------------------------------------------------------- declared shapes
@pytest.mark.parametrize("preset", ["A8W8", "BF16", "BFP16"])
def test_wrong_declared_output_shape_is_repaired_and_reported(preset):
    """The model declares y as (2, 4) but computes (2, 3, 4): onnxruntime runs it; mixq's
    rewrite used to end in an 'internal error' from the checker."""
    m = model("""<ir_version: 7, opset_import: ["": 12]>
        g (float[2,3,8] x, float[8,4] W) => (float[2,4] y) { y = MatMul(x, W) }""", W=(8, 4))
    fs = feeds(m)
    res = _quantize_runs(m, preset, fs)
    assert any("declared with shape (2, 4)" in n for n in res.prepare.notes)
    assert "declared with shape (2, 4)" in res.summary()


def _ctc_head_declared_wrong() -> onnx.ModelProto:
    """A CTC head as ddddocr's OCR model writes it (opset 12, Constant nodes): (T, B, H) is
    flattened to (T*B, H) for a Gemm and reshaped back to (T, B, C) by a target computed from
    Shape / Gather / Unsqueeze / Concat at run time; the output is declared (1, seqlen)."""
    rng = np.random.default_rng(3)
    w = numpy_helper.from_array((rng.standard_normal((6, 8)) * 0.4).astype(np.float32), "W")
    b = numpy_helper.from_array(np.zeros(6, np.float32), "B")
    minus1 = numpy_helper.from_array(np.array([-1], np.int64), "minus1")

    def const(name: str, v: object) -> onnx.NodeProto:
        return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.array(v, np.int64), name))

    nodes = [const("flat3", [0, 0, -1]), helper.make_node("Reshape", ["x", "flat3"], ["h"]),
             helper.make_node("Shape", ["h"], ["sh"]), const("i0", 0), const("i1", 1), const("i2", 2),
             helper.make_node("Gather", ["sh", "i0"], ["t"], axis=0),
             helper.make_node("Gather", ["sh", "i1"], ["bb"], axis=0),
             helper.make_node("Gather", ["sh", "i2"], ["c"], axis=0),
             helper.make_node("Mul", ["t", "bb"], ["tb"]),
             helper.make_node("Unsqueeze", ["tb"], ["tb1"], axes=[0]),
             helper.make_node("Unsqueeze", ["c"], ["c1"], axes=[0]),
             helper.make_node("Concat", ["tb1", "c1"], ["flat2"], axis=0),
             helper.make_node("Reshape", ["h", "flat2"], ["rows"]),
             helper.make_node("Gemm", ["rows", "W", "B"], ["logits"], transB=1),
             helper.make_node("Unsqueeze", ["t"], ["t1"], axes=[0]),
             helper.make_node("Unsqueeze", ["bb"], ["b1"], axes=[0]),
             helper.make_node("Concat", ["t1", "b1", "minus1"], ["back"], axis=0),
             helper.make_node("Reshape", ["logits", "back"], ["y"])]
    g = helper.make_graph(nodes, "ctc", [helper.make_tensor_value_info("x", 1, ["T", 1, 8])],
                          [helper.make_tensor_value_info("y", 1, [1, "seqlen"])], [w, b, minus1])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 12)])
    m.ir_version = 7
    return m


@pytest.mark.parametrize("preset", ["A8W8", "A16W8", "BF16"])
def test_an_output_declared_wrong_behind_a_run_time_reshape_is_repaired(preset):
    """Inference on the model as exported cannot follow the run-time Reshape target, so the
    first repair sees no contradiction; on the prepared graph (constants folded) it can. Every
    preset failed with 'internal error: the quantized model fails the ONNX checker ... differ in
    rank: (3) vs (2)' before the repair ran again after prepare (ddddocr's OCR model)."""
    m = _ctc_head_declared_wrong()
    rng = np.random.default_rng(0)
    fs = [{"x": rng.standard_normal((t, 1, 8)).astype(np.float32)} for t in (5, 7, 9, 6) * 4]
    res = _quantize_runs(m, preset, fs)
    assert any("declared with shape (1, ?)" in n and "(?, 1, ?)" in n for n in res.prepare.notes)
    assert [d.dim_value for d in res.model.graph.output[0].type.tensor_type.shape.dim][1:] == [1, 0]


# --------------------------------------------------------------- every float tensor accounted
@pytest.mark.parametrize("preset", ALL_PRESETS)
def test_every_float_tensor_is_planned_or_skipped_with_a_reason(preset):
    m = _conv_via_slice()
    pipe = mixq.pipeline.Pipeline.load(m)
    plan = pipe.plan(mixq.get_default_config(preset))
    ix = pipe.index
    floats = [n for n in ix.values() + list(ix.initializers) if ix.elem_type(n) == onnx.TensorProto.FLOAT]
    for n in floats:
        assert n in plan.tensors or n in plan.skipped, f"{n} has no reason"
    assert all(why for why in plan.skipped.values())
    assert all(tp.reason for tp in plan.tensors.values())


def test_rewrite_postconditions_node_order_and_value_info():
    """After the rewrite every node reads only values produced earlier (or inputs/initializers),
    and value_info declares the values the nodes produce, none that is gone (the declarations
    agree with onnxruntime: tests/integration/test_declared_shapes.py)."""
    m = _conv_via_slice()
    fs = [{"x": np.random.default_rng(0).standard_normal((1, 8, 8, 6)).astype(np.float32)}]
    for preset in ("A8W8", "BFP16", "BF16"):
        q = mixq.quantize(m, preset, fs).model
        known = {i.name for i in q.graph.input} | {t.name for t in q.graph.initializer} | {""}
        for n in q.graph.node:
            assert all(i in known for i in n.input), (preset, n.name, [i for i in n.input if i not in known])
            known.update(n.output)
        produced = {o for n in q.graph.node for o in n.output}
        assert {v.name for v in q.graph.value_info} <= produced, preset
        block_outs = {n.output[0] for n in q.graph.node if n.domain == "com.mixq"}
        assert block_outs <= {v.name for v in q.graph.value_info}, preset


def test_batchnorm_fold_bias_name_never_collides():
    """The folded bias takes `<weight>_bnfold_bias`, which the model may already use."""
    m = model("""<ir_version: 8, opset_import: ["": 17]>
        g (float[1,3,6,6] x, float[4,3,3,3] W, float[4] s, float[4] b, float[4] mu, float[4] var,
           float[4] W_bnfold_bias) => (float[1,4,4,4] y, float[4] z) {
            c = Conv(x, W)
            y = BatchNormalization(c, s, b, mu, var)
            z = Relu(W_bnfold_bias) }""", W=(4, 3, 3, 3), s=(4,), b=(4,), mu=(4,), W_bnfold_bias=(4,))
    m.graph.initializer.append(numpy_helper.from_array(np.ones(4, np.float32), "var"))
    keep = [i for i in m.graph.input if i.name == "x"]
    del m.graph.input[:]
    m.graph.input.extend(keep)
    fs = feeds(m)
    res = _quantize_runs(m, "A8W8", fs)
    assert res.prepare.batchnorms_folded == 1
    ref, got = run(m, fs[0]), run(res.model, fs[0])
    assert np.allclose(ref[1], got[1], atol=0.02)  # the unrelated tensor keeps its own values (int8 steps)


def test_batchnorm_fold_declines_a_weight_an_if_branch_reads():
    """Folding BN scales the Conv weight in place: with the weight also read inside an If
    branch the fold would silently change the branch's result; it is declined, with why."""
    rng = np.random.default_rng(0)
    W = (rng.standard_normal((4, 3, 3, 3)) * 0.3).astype(np.float32)
    inits = [numpy_helper.from_array(W, "W")] + [
        numpy_helper.from_array(v.astype(np.float32), n) for n, v in
        (("s", rng.random(4) + 0.5), ("b", rng.standard_normal(4)), ("mu", rng.standard_normal(4)),
         ("var", rng.random(4) + 0.5))]
    then_g = helper.make_graph([helper.make_node("Conv", ["x", "W"], ["t"])], "then", [],
                               [helper.make_tensor_value_info("t", 1, [1, 4, 4, 4])])
    else_g = helper.make_graph([helper.make_node("Conv", ["x", "W"], ["e"], pads=[0, 0, 0, 0])], "else", [],
                               [helper.make_tensor_value_info("e", 1, [1, 4, 4, 4])])
    nodes = [helper.make_node("Conv", ["x", "W"], ["c"], name="conv"),
             helper.make_node("BatchNormalization", ["c", "s", "b", "mu", "var"], ["y"], name="bn"),
             helper.make_node("If", ["cond"], ["z"], name="branch", then_branch=then_g, else_branch=else_g)]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", 1, [1, 3, 6, 6]),
                                       helper.make_tensor_value_info("cond", onnx.TensorProto.BOOL, [])],
                          [helper.make_tensor_value_info("y", 1, [1, 4, 4, 4]),
                           helper.make_tensor_value_info("z", 1, [1, 4, 4, 4])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    pipe = mixq.pipeline.Pipeline.load(m)
    assert pipe.prepare_report.batchnorms_folded == 0
    bn = next(p for p in pipe.prepare_report.passes if p.name == "fold BatchNorm")
    assert bn.declined and "subgraph" in bn.declined[0][1]
    feed = {"x": rng.standard_normal((1, 3, 6, 6)).astype(np.float32), "cond": np.array(True)}
    ref, got = run(m, feed), run(pipe.model, feed)
    assert np.allclose(ref[1], got[1], atol=1e-5)


@pytest.mark.parametrize("wide", ["fp16", "bf16"])
def test_an_integer_pass_through_op_between_float16_layers_loads_and_is_quantized(wide):
    """fp16/bf16 layers around an int8 MaxPool and Flatten (the layer-wise plans `auto` builds):
    the pass-through outputs read their input in int8 at a boundary, so they are int8 with
    parameters of their own (the input's group is fp16), their fp16 consumers read a conversion,
    and onnxruntime loads the model with its default optimizations (without the Q after MaxPool
    its optimizer propagated the DQ and formed a QuantizeLinear it rejected)."""
    from mixq.config import LayerRule
    from mixq.evaluate import make_session
    from tests.conftest import feeds as cnn_feeds
    from tests.conftest import small_cnn

    m, calib = small_cnn(), cnn_feeds(32, 8)
    rules = (LayerRule(nodes=("conv1", "relu1", "conv2", "relu2", "add", "gap", "fc"),
                       activation=wide, weight=wide),)
    cfg = mixq.QuantConfig(activation="int8", weight="int8", activation_symmetric=True,
                           layer_rules=rules)
    res = mixq.quantize(m, cfg, calib, check_kernels=False)
    for t in ("p", "fl"):
        tp = res.plan.tensors[t]
        assert tp.format == "int8" and tp.calibrate and tp.consumer_formats, tp
    assert not [n for n in res.rewrite.notes if "no statistics" in n], res.rewrite.notes
    consumers = {n.name: list(n.input) for n in res.model.graph.node}
    assert consumers["gap"][0].endswith(f"__mq_{wide}") and consumers["fc"][0].endswith(f"__mq_{wide}")
    x = calib[0]["x"]
    out = make_session(res.model.SerializeToString()).run(None, {"x": x})[0]
    ref = make_session(m.SerializeToString()).run(None, {"x": x})[0]
    assert np.isfinite(out).all() and np.corrcoef(out.ravel(), ref.ravel())[0, 1] > 0.99
