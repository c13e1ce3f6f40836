"""The post-processing tail stays float: the nodes after the last Conv/Gemm/MatMul on the way to
an output (a YOLO-style box decode, the class scores' Sigmoid, a final Softmax). On a uniform
grid, a decode's anchor grid (0..32 cells), its per-anchor strides and the decoded coordinates
(0..256 px) each lose up to half a step: boxes come out pixels off. Deployment flows run that
tail on the host; mixq leaves it float unless `quantize_tail=True`."""
from __future__ import annotations

import dataclasses

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import mixq
from mixq.config import LayerRule, get_default_config
from mixq.errors import ConfigError
from mixq.plan.ops import TAIL_REASON, postprocess_tail
from tests import graphs

IMG = 256
STRIDES = (8, 16, 32)
NC = 3    # classes
REG = 16  # distribution bins per box side (DFL)


def _init(g: onnx.GraphProto, name: str, arr: np.ndarray) -> str:
    g.initializer.append(numpy_helper.from_array(np.asarray(arr), name))
    return name


def yolo_decode_model(seed: int = 0) -> onnx.ModelProto:
    """A YOLOv8-style detector head and decode: three feature scales, per-scale 1x1 heads of
    4*REG box bins + NC class logits, concatenated over anchors; DFL (Softmax over the bins, then
    a Conv with weights 0..REG-1), anchors minus / plus the distances, times the stride, and
    Concat(boxes, Sigmoid(classes)) into one (1, 4 + NC, A) output."""
    rng = np.random.default_rng(seed)
    g = helper.make_graph([], "yolo", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, IMG, IMG])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4 + NC, None])])
    n = g.node
    c = 16
    w0 = _init(g, "w0", rng.standard_normal((c, 3, 8, 8)).astype(np.float32) * 0.1)
    n.append(helper.make_node("Conv", ["x", w0], ["f0"], strides=[8, 8], name="stem"))
    n.append(helper.make_node("Relu", ["f0"], ["p0"], name="stem_relu"))
    feats, prev = [], "p0"
    for k, s in enumerate(STRIDES):
        if k:
            w = _init(g, f"wd{k}", rng.standard_normal((c, c, 2, 2)).astype(np.float32) * 0.3)
            n.append(helper.make_node("Conv", [prev, w], [f"d{k}"], strides=[2, 2], name=f"down{k}"))
            n.append(helper.make_node("Relu", [f"d{k}"], [f"p{k}"], name=f"down{k}_relu"))
            prev = f"p{k}"
        wh = _init(g, f"wh{k}", rng.standard_normal((4 * REG + NC, c, 1, 1)).astype(np.float32) * 0.6)
        bh = _init(g, f"bh{k}", np.concatenate([rng.uniform(-1, 1, 4 * REG), np.full(NC, -2.0)]).astype(np.float32))
        n.append(helper.make_node("Conv", [prev, wh, bh], [f"h{k}"], name=f"head{k}"))
        shp = _init(g, f"shp{k}", np.array([1, 4 * REG + NC, -1], np.int64))
        n.append(helper.make_node("Reshape", [f"h{k}", shp], [f"hf{k}"], name=f"flat{k}"))
        feats.append(f"hf{k}")
    n.append(helper.make_node("Concat", feats, ["cat"], axis=2, name="cat_scales"))
    split = _init(g, "split", np.array([4 * REG, NC], np.int64))
    n.append(helper.make_node("Split", ["cat", split], ["box", "cls"], axis=1, name="split"))
    # DFL: (1, 4*REG, A) -> (1, 4, REG, A) -> (1, REG, 4, A) -> softmax over REG -> expectation
    n.append(helper.make_node("Reshape", ["box", _init(g, "s4", np.array([1, 4, REG, -1], np.int64))],
                              ["b4"], name="dfl_reshape"))
    n.append(helper.make_node("Transpose", ["b4"], ["bt"], perm=[0, 2, 1, 3], name="dfl_transpose"))
    n.append(helper.make_node("Softmax", ["bt"], ["bp"], axis=1, name="dfl_softmax"))
    wdfl = _init(g, "wdfl", np.arange(REG, dtype=np.float32).reshape(1, REG, 1, 1))
    n.append(helper.make_node("Conv", ["bp", wdfl], ["dist4"], name="dfl_conv"))
    n.append(helper.make_node("Reshape", ["dist4", _init(g, "s3", np.array([1, 4, -1], np.int64))],
                              ["dist"], name="dfl_out"))
    # anchors (cell centres, in cells) and strides, as the export stores them
    anchors, strides = [], []
    for s in STRIDES:
        m = IMG // s
        yy, xx = np.meshgrid(np.arange(m) + 0.5, np.arange(m) + 0.5, indexing="ij")
        anchors.append(np.stack([xx.ravel(), yy.ravel()]))
        strides.append(np.full(m * m, s))
    anc = _init(g, "anchors", np.concatenate(anchors, axis=1)[None].astype(np.float32))
    std = _init(g, "strides", np.concatenate(strides)[None, None].astype(np.float32))
    n.append(helper.make_node("Split", ["dist", _init(g, "half", np.array([2, 2], np.int64))],
                              ["lt", "rb"], axis=1, name="split_lt_rb"))
    n.append(helper.make_node("Sub", [anc, "lt"], ["x1y1"], name="decode_x1y1"))
    n.append(helper.make_node("Add", [anc, "rb"], ["x2y2"], name="decode_x2y2"))
    n.append(helper.make_node("Add", ["x1y1", "x2y2"], ["csum"], name="decode_csum"))
    n.append(helper.make_node("Div", ["csum", _init(g, "two", np.array(2.0, np.float32))], ["cxy"], name="decode_c"))
    n.append(helper.make_node("Sub", ["x2y2", "x1y1"], ["wh"], name="decode_wh"))
    n.append(helper.make_node("Concat", ["cxy", "wh"], ["dbox"], axis=1, name="decode_cat"))
    n.append(helper.make_node("Mul", ["dbox", std], ["boxes"], name="decode_stride"))
    n.append(helper.make_node("Sigmoid", ["cls"], ["scores"], name="scores"))
    n.append(helper.make_node("Concat", ["boxes", "scores"], ["y"], axis=1, name="out_cat"))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


def _images(n: int, seed: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"x": rng.uniform(0, 1, (1, 3, IMG, IMG)).astype(np.float32)} for _ in range(n)]


@pytest.fixture(scope="module")
def model() -> onnx.ModelProto:
    return yolo_decode_model()


def _box_error(qmodel: onnx.ModelProto, model: onnx.ModelProto) -> tuple[float, float]:
    """(largest, mean) box coordinate error in pixels vs float, on held-out images (the QDQ
    graph's own values: on a CPU without VNNI, onnxruntime's fused int8 kernels saturate)."""
    errs = []
    for f in _images(4, seed=99):
        ref = graphs.run(model, f)[0]
        got = graphs.run(qmodel, f, optimize=False)[0]
        assert np.all(np.isfinite(got))
        errs.append(np.abs(got[:, :4] - ref[:, :4]))
    e = np.concatenate(errs, axis=None)
    return float(e.max()), float(e.mean())


def test_the_tail_is_what_follows_the_last_compute_op(model):
    names = {model.graph.node[i].name for i in postprocess_tail(model.graph.node)}
    assert names == {"decode_x1y1", "decode_x2y2", "decode_csum", "decode_c",
                     "decode_wh", "decode_cat", "decode_stride", "scores", "out_cat"}
    # the stem's Relu is fused into its Conv (one kernel) and the Reshape / Split after the DFL
    # carry its grid: no tail; a graph with no compute op has no tail
    assert not postprocess_tail([n for n in model.graph.node if n.op_type not in ("Conv",)])


@pytest.mark.parametrize("preset", ["A8W8", "XINT8", "A16W8"])
def test_a_box_decode_stays_float_and_boxes_stay_within_a_few_pixels(model, preset):
    cal = _images(8, seed=1)
    res = mixq.quantize(model, preset, calibration_data=cal)
    for node in ("decode_stride", "scores", "out_cat"):
        assert res.plan.float_nodes[node] == TAIL_REASON
    assert "anchors" not in res.plan.tensors and "strides" not in res.plan.tensors
    assert res.plan.tensors["bp"].format is not None  # the DFL itself is quantized
    worst, mean = _box_error(res.model, model)
    # the policy off: the anchor grid, the strides and the decoded boxes on integer grids
    off = mixq.quantize(model, dataclasses.replace(get_default_config(preset), quantize_tail=True),
                        calibration_data=cal)
    worst_off, mean_off = _box_error(off.model, model)
    print(preset, f"tail float: max {worst:.2f} px, mean {mean:.3f}; quantized: max {worst_off:.2f}, "
          f"mean {mean_off:.3f}")
    if preset == "A16W8":
        # 16-bit grids round the tail finely: what is left is the 8-bit weights' error
        assert mean < 0.2 and mean <= 1.05 * mean_off, (mean, mean_off)
        return
    # what is left comes from the head's 8-bit logits (random weights): a DFL bin error of 0.3
    # times a stride of 32, on both sides of a box; the tail adds its own rounding on top
    assert mean_off > 2 * mean and worst_off > worst, (worst_off, mean_off, worst, mean)


def test_a_layer_rule_naming_a_tail_node_quantizes_it(model):
    cal = _images(4, seed=1)
    cfg = dataclasses.replace(get_default_config("A8W8"), layer_rules=(LayerRule(nodes=("scores",), activation="int16"),))
    res = mixq.quantize(model, cfg, calibration_data=cal)
    assert "scores" not in res.plan.float_nodes and res.plan.tensors["scores"].format == "int16"
    assert "decode_stride" in res.plan.float_nodes


def test_an_override_on_a_tail_tensor_says_why_it_stays_float(model):
    cfg = dataclasses.replace(get_default_config("A8W8"), tensor_formats=(("boxes", "int16"),))
    with pytest.raises(ConfigError, match="post-processing"):
        mixq.quantize(model, cfg, calibration_data=_images(2, seed=1))


def test_the_cli_flag_quantizes_the_tail(tmp_path, model):
    from mixq.cli.main import main

    src = tmp_path / "m.onnx"
    onnx.save(model, src)
    np.savez(tmp_path / "cal.npz", x=np.concatenate([f["x"] for f in _images(2, seed=1)]))
    plans = {}
    for flag in ([], ["--quantize-tail"]):
        out = tmp_path / f"plan{len(flag)}.json"
        assert main(["plan", str(src), "--preset", "A8W8", "-o", str(out), *flag]) == 0
        plans[len(flag)] = out.read_text()
    assert "post-processing" in plans[0] and "post-processing" not in plans[1]


@pytest.mark.parametrize("excluded", [("dfl_out", "split_lt_rb"), ("dfl_transpose", "dfl_softmax")])
def test_excluded_pass_through_nodes_keep_their_input_grid_and_the_model_loads(model, excluded):
    """onnxruntime users exclude a detector's post-processing by node names. A pass-through node
    left float after an int8 tensor, read by float ops, is what onnxruntime's QDQ propagation
    (default optimizations) turns into a QuantizeLinear it then rejects at session creation: the
    node's outputs carry its input's grid instead, which changes no value."""
    cal = _images(4, seed=1)
    base = dataclasses.replace(get_default_config("A8W8"), quantize_tail=True)
    ref = mixq.quantize(model, base, calibration_data=cal)
    res = mixq.quantize(model, dataclasses.replace(base, exclude_nodes=frozenset(excluded)), calibration_data=cal)
    assert all(res.plan.float_nodes[n] == "node excluded by exclude_nodes" for n in excluded)
    for f in _images(2, seed=7):
        got = graphs.run(res.model, f)[0]  # default optimizations: the session loads
        assert np.all(np.isfinite(got))
        if "dfl_softmax" not in excluded:  # pass-through nodes alone: not one value changes
            assert np.array_equal(got, graphs.run(ref.model, f)[0])
            assert np.array_equal(graphs.run(res.model, f, optimize=False)[0],
                                  graphs.run(ref.model, f, optimize=False)[0])


def test_nothing_a_subgraph_reads_is_tail():
    """An If whose branch reads a tensor by outer-scope capture is a barrier like a compute op:
    what feeds it is not post-processing (mixq leaves subgraphs float, but not their inputs)."""
    def branch(name: str) -> onnx.GraphProto:
        return helper.make_graph([helper.make_node("Identity", ["s"], [f"{name}_out"])], name, [],
                                 [helper.make_tensor_value_info(f"{name}_out", TensorProto.FLOAT, None)])
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
             helper.make_node("Sigmoid", ["c"], ["s"], name="sig"),
             helper.make_node("Tanh", ["c"], ["t"], name="tanh"),
             helper.make_node("If", ["cond"], ["y"], then_branch=branch("a"), else_branch=branch("b"), name="if")]
    names = {nodes[i].name for i in postprocess_tail(nodes)}
    assert names == {"tanh"}  # the Sigmoid feeds the If's branches (by capture)


@pytest.mark.parametrize("layout", ["Transpose", "Reshape", "Flatten"])
def test_a_layout_op_after_the_tail_stays_float_with_it(layout):
    """Boxes (hundreds) and scores (0..1) concatenated, then transposed or reshaped to the
    output, as many detector exports end: the Concat is tail, and the layout op after it
    stayed out of the tail as a pass-through, so the Concat's output was quantized as its input
    on one grid, the scores one or two codes (0 dB), with the guard quiet (the boxes dominate
    the output's SQNR). A pass-through op reading a tail node's output now stays float with it."""
    rng = np.random.default_rng(0)
    g = helper.make_graph([], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 6, 6])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    w = _init(g, "w", rng.normal(0, 0.3, (4, 3, 3, 3)).astype(np.float32))
    g.node.extend([helper.make_node("Conv", ["x", w], ["c"], pads=[1, 1, 1, 1], name="head"),
                   helper.make_node("Mul", ["c", _init(g, "stride", np.array(300.0, np.float32))], ["boxes"],
                                    name="decode"),
                   helper.make_node("Sigmoid", ["c"], ["scores"], name="scores"),
                   helper.make_node("Concat", ["boxes", "scores"], ["cat"], axis=1, name="cat")])
    if layout == "Transpose":
        g.node.append(helper.make_node("Transpose", ["cat"], ["y"], perm=[0, 2, 3, 1], name="layout"))
    elif layout == "Reshape":
        g.node.append(helper.make_node("Reshape", ["cat", _init(g, "shape", np.array([0, 8, -1], np.int64))], ["y"],
                                       name="layout"))
    else:
        g.node.append(helper.make_node("Flatten", ["cat"], ["y"], axis=2, name="layout"))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    assert "layout" in {m.graph.node[i].name for i in postprocess_tail(m.graph.node)}
    cal = [{"x": rng.normal(0, 1, (4, 3, 6, 6)).astype(np.float32)} for _ in range(8)]
    test = {"x": rng.normal(0, 1, (8, 3, 6, 6)).astype(np.float32)}
    res = mixq.quantize(m, "A8W8", calibration_data=cal, check_kernels=False)
    assert res.plan.float_nodes["layout"] == TAIL_REASON
    want, got = (graphs.run(q, test)[0].reshape(8, 8, -1) if layout != "Transpose" else
                 graphs.run(q, test)[0].transpose(0, 3, 1, 2).reshape(8, 8, -1) for q in (m, res.model))
    scores_w, scores_g = want[:, 4:], got[:, 4:]
    assert 10 * np.log10(np.sum(scores_w ** 2) / np.sum((scores_w - scores_g) ** 2)) > 30
