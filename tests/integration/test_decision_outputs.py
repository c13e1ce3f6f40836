"""Outputs that hold decisions (class indices from an ArgMax / ArgMin or a TopK's indices, through
casts and reshapes) are judged by the share of elements equal to float's. Before, the guard
scored the indices' values by SQNR: class 3 read for class 4 is a small error in value, so a
classifier deployed with its ArgMax inside the graph could lose a quarter of its decisions at
SQNR > 10 dB and be called fine."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import mixq
from mixq.data import default_model_path, load_default_samples
from mixq.evaluate import ErrorStats, make_session
from mixq.fidelity import class_score_outputs, decision_outputs, is_broken, value_outputs


def _with_head(kind: str) -> onnx.ModelProto:
    """The embedded classifier with its logits turned into decisions inside the graph: an ArgMax
    (then Squeeze and Cast, as exporters write it), or a TopK of 3 (values and indices)."""
    m = onnx.load(default_model_path())
    logits = m.graph.output[0].name
    del m.graph.output[:]
    if kind == "argmax":
        m.graph.node.append(helper.make_node("ArgMax", [logits], ["idx"], axis=1, keepdims=1))
        m.graph.node.append(helper.make_node("Squeeze", ["idx", "ax"], ["sq"]))
        m.graph.node.append(helper.make_node("Cast", ["sq"], ["cls"], to=TensorProto.INT32))
        m.graph.initializer.append(onnx.numpy_helper.from_array(np.array([1], np.int64), "ax"))
        m.graph.output.append(helper.make_tensor_value_info("cls", TensorProto.INT32, ["N"]))
    else:
        m.graph.initializer.append(onnx.numpy_helper.from_array(np.array([3], np.int64), "k"))
        m.graph.node.append(helper.make_node("TopK", [logits, "k"], ["top_v", "top_i"], axis=1))
        m.graph.output.extend([helper.make_tensor_value_info("top_v", TensorProto.FLOAT, ["N", 3]),
                               helper.make_tensor_value_info("top_i", TensorProto.INT64, ["N", 3])])
    return m


def test_which_outputs_are_decisions():
    assert decision_outputs(_with_head("argmax")) == {"cls"}
    assert decision_outputs(_with_head("topk")) == {"top_i"}
    # a TopK's values are sorted: column 0 is the top-1 of every row by construction
    assert value_outputs(_with_head("topk")) == {"top_v"}
    assert decision_outputs(onnx.load(default_model_path())) == value_outputs(onnx.load(default_model_path())) == set()


def test_error_stats_count_equal_elements():
    ref = np.array([3, 4, 7, 1, 0, 9, 2, 5, 5, 8])
    got = ref.copy()
    got[[0, 5, 7]] = [4, 8, 6]  # three neighbouring classes: a small error in value
    st = ErrorStats(decisions=True).update(ref, got).result("cls")
    assert st.decisions and st.top1_agreement == 0.7 and st.rows == 10
    assert st.sqnr_db > 10  # what the guard used to judge by
    assert is_broken([st])
    assert not is_broken([ErrorStats(decisions=True).update(ref, ref).result("cls")])


@pytest.mark.parametrize("kind", ["argmax", "topk"])
def test_the_guard_judges_decisions_by_agreement(kind):
    """MX4 (4-bit block elements) loses a quarter of the embedded classifier's decisions: with the
    logits as output the guard calls it broken; with an ArgMax inside, it now does too."""
    x = load_default_samples().calib_images[:64]
    logits = mixq.quantize(default_model_path(), "MX4", x).fidelity
    assert logits.broken
    fid = mixq.quantize(_with_head(kind), "MX4", x).fidelity
    dec = next(o for o in fid.outputs if o.decisions)
    assert dec.top1_agreement is not None and dec.top1_agreement < 0.9
    assert fid.broken
    assert "values equal to float's" in fid.lines()[0]
    if kind == "topk":  # judged by SQNR, not by an agreement of 100 % by construction
        assert next(o for o in fid.outputs if o.name == "top_v").top1_agreement is None
    ok = mixq.quantize(_with_head(kind), "A16W8", x).fidelity
    assert not ok.broken and next(o for o in ok.outputs if o.decisions).top1_agreement >= 0.9


def _embedder(seed: int = 0) -> onnx.ModelProto:
    """x[N, 32] -> MatMul -> Relu -> MatMul -> L2 normalization: a sentence-embedding head."""
    rng = np.random.default_rng(seed)
    w1 = onnx.numpy_helper.from_array((rng.standard_normal((32, 256)) / 6).astype(np.float32), "w1")
    w2 = onnx.numpy_helper.from_array((rng.standard_normal((256, 384)) / 16).astype(np.float32), "w2")
    ax = onnx.numpy_helper.from_array(np.array([1], np.int64), "ax")
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("MatMul", ["r", "w2"], ["e"]), helper.make_node("ReduceL2", ["e", "ax"], ["n"]),
             helper.make_node("Div", ["e", "n"], ["emb"])]
    g = helper.make_graph(nodes, "emb", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 32])],
                          [helper.make_tensor_value_info("emb", TensorProto.FLOAT, ["N", 384])], [w1, w2, ax])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


def test_an_embedding_is_judged_by_sqnr_not_by_an_argmax_over_its_dimensions():
    """An argmax over an embedding's 384 dimensions decides nothing; at MXFP4 it flips on 30 %
    of the rows while the embedding keeps 12.9 dB, and the guard called the model broken (so
    did all-MiniLM-L6-v2 at A8W8, cosine 0.975, with its pooling and normalization in the
    graph)."""
    m = _embedder()
    assert value_outputs(m) == {"emb"}
    x = np.random.default_rng(1).standard_normal((64, 32)).astype(np.float32)
    res = mixq.quantize(m, "MXFP4", [{"x": x[i:i + 16]} for i in range(0, 64, 16)])
    emb = res.fidelity.outputs[0]
    assert emb.top1_agreement is None and 10 < emb.sqnr_db < 20 and not res.fidelity.broken
    # what the argmax over the dimensions says on the guard's samples (the last 32)
    ref = make_session(m).run(None, {"x": x[-32:]})[0]
    got = make_session(res.model, optimize="basic").run(None, {"x": x[-32:]})[0]
    argmax = ErrorStats().update(ref, got).result("emb")
    assert argmax.top1_agreement is not None and argmax.top1_agreement < 0.9


def test_mixq_eval_reads_outputs_as_the_guard_does(tmp_path, capsys):
    """`mixq eval` (evaluate.compare) on the test images: the ArgMax head's agreement is the
    share of equal indices, and the logits' argmax agreement is the same number."""
    from mixq.cli.main import main as cli_main
    from mixq.evaluate import compare

    s = load_default_samples()
    m = _with_head("argmax")
    q = mixq.quantize(m, "MX4", s.calib_images[:64]).model
    feeds = [{"image": s.test_images[i:i + 50]} for i in range(0, 200, 50)]
    c = compare(m, q, feeds, optimize=False).first()
    assert c.decisions and c.rows == 200
    f = onnx.load(default_model_path())
    ql = mixq.quantize(default_model_path(), "MX4", s.calib_images[:64]).model
    assert c.top1_agreement == compare(f, ql, feeds, optimize=False).first().top1_agreement < 0.9
    onnx.save(m, tmp_path / "f.onnx")
    onnx.save(q, tmp_path / "q.onnx")
    np.save(tmp_path / "x.npy", s.test_images[:200])
    assert cli_main(["eval", str(tmp_path / "f.onnx"), str(tmp_path / "q.onnx"), "--data", str(tmp_path / "x.npy")]) == 0
    row = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("| cls | disabled"))
    assert row.rstrip(" |").endswith(f"{c.top1_agreement:.4f}")


def _segmenter(seed: int = 0) -> onnx.ModelProto:
    """x[N, 3, 16, 16] -> Conv 3x3 -> Relu -> Conv 1x1 -> Softmax over the 5 classes (axis 1)."""
    rng = np.random.default_rng(seed)
    w1 = onnx.numpy_helper.from_array((rng.standard_normal((8, 3, 3, 3)) / 4).astype(np.float32), "w1")
    w2 = onnx.numpy_helper.from_array((rng.standard_normal((5, 8, 1, 1)) / 2).astype(np.float32), "w2")
    nodes = [helper.make_node("Conv", ["x", "w1"], ["h"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("Conv", ["r", "w2"], ["z"]), helper.make_node("Softmax", ["z"], ["p"], axis=1)]
    g = helper.make_graph(nodes, "seg", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 16, 16])],
                          [helper.make_tensor_value_info("p", TensorProto.FLOAT, ["N", 5, 16, 16])], [w1, w2])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


@pytest.mark.parametrize("preset", ["A16W8", "MX4"])
def test_per_pixel_classes_of_a_softmax_over_channels(preset):
    """A segmentation model's Softmax over axis 1 (N, C, H, W): the guard reads each pixel's
    class, as it reads a CTC recognizer's frames; before, a rank-4 output got no agreement."""
    m = _segmenter()
    assert class_score_outputs(m) == {"p": 1}
    x = np.random.default_rng(1).standard_normal((64, 3, 16, 16)).astype(np.float32)
    res = mixq.quantize(m, preset, [{"x": x[i:i + 16]} for i in range(0, 64, 16)], check_kernels=False)
    o = res.fidelity.outputs[0]
    ref = make_session(m).run(None, {"x": x[-32:]})[0]
    got = make_session(res.model, optimize="basic").run(None, {"x": x[-32:]})[0]
    pixels = np.mean(ref.argmax(1) == got.argmax(1))
    assert o.rows == 32 * 16 * 16 and o.top1_agreement == pytest.approx(pixels)
    judged = o.decisive_agreement if o.decisive_agreement is not None else pixels
    assert res.fidelity.broken == (judged < 0.9)


def test_logits_of_a_global_average_pool_stay_class_scores():
    """A classifier whose last op is a global average pool (ReduceMean over H and W after a 1x1
    Conv, as the guard sweep's U-Net) keeps the agreement verdict and its likely-loss reading."""
    rng = np.random.default_rng(0)
    w = onnx.numpy_helper.from_array((rng.standard_normal((10, 3, 3, 3)) / 3).astype(np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["h"], pads=[1, 1, 1, 1]),
             helper.make_node("ReduceMean", ["h"], ["logits"], axes=[2, 3], keepdims=0)]
    g = helper.make_graph(nodes, "gap", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8])],
                          [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 10])], [w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    assert value_outputs(m) == set() and decision_outputs(m) == set()
    x = np.random.default_rng(1).standard_normal((64, 3, 8, 8)).astype(np.float32)
    o = mixq.quantize(m, "A16W8", [{"x": x[i:i + 16]} for i in range(0, 64, 16)]).fidelity.outputs[0]
    assert o.top1_agreement is not None and o.expected_agreement is not None
