"""Outputs whose shape depends on the values: a detector that ends in NonMaxSuppression selects
another number of boxes when a score near the threshold moves. Before, every integer preset
and every block preset on such a model died with numpy's "operands could not be broadcast
together" (the rounding check, the guard, `mixq eval` and `mixq auto` all compared element by
element), and the selected indices (int64) were read as class scores ("top-1 agreement" over
their three columns). Now an integer or boolean output is a decision output (equal elements,
compared as far as both hold rows), a pair of samples whose shapes differ is counted and left
out of the SQNR, a value output that changes shape on more than 1 sample in 10 is called
broken, and `mixq auto` refuses an integer output with the float ones it can read."""
from __future__ import annotations

import math

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import mixq
from mixq.errors import ConfigError
from mixq.evaluate import ErrorStats, compare
from mixq.fidelity import decision_outputs, is_broken
from mixq.search import AutoConfig, Candidate, auto_quantize, base_from_candidate
from mixq.search.workbench import relative_l2

ANCHORS = 64


def _detector(*, gathered_boxes: bool = False) -> onnx.ModelProto:
    """Conv head -> boxes (centre form) and sigmoid scores for 64 anchors -> NonMaxSuppression
    (score threshold 0.62, so the count varies); outputs the selected indices (int64, (K, 3)),
    the scores and, optionally, the selected boxes gathered (float, (K, 4))."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(0, 0.3, (8, 3, 3, 3)).astype(np.float32), "c1"),
             numpy_helper.from_array(rng.normal(0, 0.3, (5, 8, 1, 1)).astype(np.float32), "c2"),
             numpy_helper.from_array(np.array([1, 5, -1], np.int64), "shp"),
             numpy_helper.from_array(np.array([20], np.int64), "max_out"),
             numpy_helper.from_array(np.array([0.5], np.float32), "iou"),
             numpy_helper.from_array(np.array([0.62], np.float32), "score_th"),
             numpy_helper.from_array(np.array([4, 1], np.int64), "split"),
             numpy_helper.from_array(np.array(2, np.int64), "col"),
             numpy_helper.from_array(np.array([0], np.int64), "ax0")]
    nodes = [helper.make_node("Conv", ["x", "c1"], ["a"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["a"], ["r"]),
             helper.make_node("Conv", ["r", "c2"], ["o"]), helper.make_node("Reshape", ["o", "shp"], ["o2"]),
             helper.make_node("Split", ["o2", "split"], ["bx", "sc"], axis=1),
             helper.make_node("Transpose", ["bx"], ["boxes"], perm=[0, 2, 1]),
             helper.make_node("Sigmoid", ["sc"], ["scores"]),
             helper.make_node("NonMaxSuppression", ["boxes", "scores", "max_out", "iou", "score_th"], ["sel"],
                              center_point_box=1)]
    outputs = [helper.make_tensor_value_info("sel", TensorProto.INT64, ["K", 3]),
               helper.make_tensor_value_info("scores", TensorProto.FLOAT, [1, 1, ANCHORS])]
    if gathered_boxes:
        nodes += [helper.make_node("Gather", ["sel", "col"], ["box_idx"], axis=1),  # (K,)
                  helper.make_node("Squeeze", ["boxes", "ax0"], ["boxes2"]),
                  helper.make_node("Gather", ["boxes2", "box_idx"], ["sel_boxes"], axis=0)]
        outputs.append(helper.make_tensor_value_info("sel_boxes", TensorProto.FLOAT, ["K", 4]))
    g = helper.make_graph(nodes, "nms", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                          outputs, inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _feeds(n: int = 40) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(1)
    return [{"x": rng.standard_normal((1, 3, 8, 8)).astype(np.float32)} for _ in range(n)]


def test_the_float_model_selects_a_varying_number_of_boxes():
    import onnxruntime as ort

    s = ort.InferenceSession(_detector().SerializeToString(), providers=["CPUExecutionProvider"])
    assert len({s.run(["sel"], f)[0].shape for f in _feeds(10)}) > 1


def test_integer_outputs_are_decisions():
    assert decision_outputs(_detector()) == {"sel"}


def test_error_stats_of_pairs_of_other_shapes():
    ref = np.array([[0, 0, 5], [0, 0, 9], [0, 0, 2]])
    got = np.array([[0, 0, 5], [0, 0, 9]])  # the last box dropped
    st = ErrorStats(decisions=True).update(ref, got).update(ref, ref).result("sel")
    assert st.shape_changed == 1 and st.pairs == 2
    assert st.top1_agreement == pytest.approx(15 / 18)  # 6 equal of 9, then 9 of 9
    assert math.isinf(st.sqnr_db) and st.sqnr_db > 0  # the same-shape pair alone: exact
    v = ErrorStats(classifier=False).update(np.ones((3, 4)), np.ones((2, 4))).result("boxes")
    assert v.sqnr_db == -math.inf and v.cosine == 0.0  # nothing comparable: the worst, never perfect
    one_in_five = ErrorStats(classifier=False)
    for k in (2, 3, 3, 3, 3):
        one_in_five.update(np.ones((3, 4)), np.ones((k, 4)))
    assert is_broken([one_in_five.result("boxes")])  # 20 % of the samples changed shape
    assert relative_l2([(np.ones((2, 4)), np.ones((3, 4)))]) == pytest.approx(math.sqrt(20 / 12))


@pytest.mark.parametrize("preset", ["A8W8", "A16W8", "BFP16", "MXFP4"])
def test_every_preset_quantizes_a_detector_with_nms(preset, tmp_path):
    out = tmp_path / "q.onnx"
    res = mixq.quantize(_detector(gathered_boxes=True), preset, _feeds(), output_path=out)
    line = res.fidelity.lines()[0]
    assert "sel: values equal to float's" in line, line
    sel = next(o for o in res.fidelity.outputs if o.name == "sel")
    assert sel.decisions and sel.pairs == 32
    boxes = next(o for o in res.fidelity.outputs if o.name == "sel_boxes")
    if boxes.shape_changed:
        assert f"another shape than float's on {boxes.shape_changed} of 32 samples" in line
    assert out.exists()
    cmp = compare(_detector(gathered_boxes=True), res.model, _feeds())  # `mixq eval`
    assert {o.name for o in cmp.outputs} == {"sel", "scores", "sel_boxes"}


def test_auto_refuses_an_integer_output_and_searches_a_float_one():
    m, feeds = _detector(), _feeds()
    cands = (Candidate("int8", "int8"),)
    base = base_from_candidate(Candidate("int16", "int8"))
    with pytest.raises(ConfigError, match=r"output 0 \('sel'\) holds tensor\(int64\).*1 \('scores'\)"):
        auto_quantize(m, AutoConfig(base=base, candidates=cands, metric="sqnr", target=20.0), feeds)
    res = auto_quantize(m, AutoConfig(base=base, candidates=cands, metric="sqnr", target=20.0, output_index=1,
                                      confidence=0.5), feeds)
    assert res.model is not None
