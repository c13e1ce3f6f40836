"""The guard reads an output's channels on two scales apart: a detector's class scores (0..1)
concatenated beside its box coordinates (0..640) hold a thousandth of the output's power, so
the whole output's SQNR is the boxes'. Quantized on one grid, the scores were lost (YOLOv8-n
at A8W8: scores 6.3 dB, the whole output 25.8 dB, detection F1 70 % of float's) while the guard
stayed quiet; docs/ACCURACY.md's Limits named this case."""
from __future__ import annotations

import math

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import mixq
from mixq.evaluate import ErrorStats, quiet_part


def _boxes_and_scores(rng: np.random.Generator, n: int = 4, anchors: int = 100) -> tuple[np.ndarray, np.ndarray]:
    boxes = rng.uniform(0, 640, (n, 4, anchors))
    scores = 1 / (1 + np.exp(-rng.normal(-1, 1.5, (n, 18, anchors))))
    return boxes, scores


def test_a_quiet_part_is_found_and_scored_on_its_own():
    rng = np.random.default_rng(0)
    boxes, scores = _boxes_and_scores(rng)
    ref = np.concatenate([boxes, scores], axis=1)
    got = ref.copy()
    got[:, 4:] = np.round(got[:, 4:] / 5.0) * 5.0  # the scores on a grid sized for the boxes
    acc = ErrorStats(classifier=False).update(ref, got)
    part = acc.quiet_part()
    assert part is not None and part.axis == 1 and part.channels == tuple(range(4, 22)) and part.size == 22
    assert part.gap > 100 and part.sqnr_db < 3.0 < 40.0 < acc.sqnr_db
    assert part.describe() == "channels 4..21 of 22 along axis 1"
    metrics = acc.result("y")
    assert metrics.part == part and metrics.judged_sqnr_db == part.sqnr_db


def test_channels_on_one_scale_make_no_part():
    """A spectrum falling smoothly over 80 bins (no jump of PART_GAP between neighbours), and
    one with a bin that is zero in float everywhere: no part."""
    rng = np.random.default_rng(1)
    ref = rng.normal(0, 1, (8, 50, 80)) * np.geomspace(1, 1e-3, 80)
    ref[:, :, 7] = 0.0
    got = ref + rng.normal(0, 1e-3, ref.shape)
    assert ErrorStats(classifier=False).update(ref, got).quiet_part() is None
    assert quiet_part(np.array([4.0, 1.0, 0.0]), np.zeros(3), 1) is None


def test_rows_quiet_in_one_sample_and_loud_in_another_make_no_part():
    """A text detector's probability map (N, 1, H, W): each page's text rows are loud, its
    background rows ~0.001, and they are other rows on the next page. Over all pages the
    background rows' rms still jumps 16x below the rest (PP-OCRv4 det A16W8: 11 of 480 rows,
    8.9 dB, called broken at 30 dB before the split had to hold in every sample)."""
    rng = np.random.default_rng(3)
    maps = np.full((6, 1, 48, 40), 1e-3)
    for k in range(6):
        rows = rng.choice(48, 20, replace=False)
        maps[k, 0, rows] = rng.uniform(0.3, 0.9, (20, 40))
    maps[:, 0, :2] = 1e-3  # a margin quiet on every page
    got = maps + rng.normal(0, 2e-3, maps.shape)
    acc = ErrorStats(classifier=False).update(maps, got)
    sig, noise = acc.chan[2]
    assert quiet_part(sig, noise, 2) is not None  # over all pages alone: a part
    assert acc.quiet_part() is None


def test_an_axis_of_changing_length_is_dropped():
    rng = np.random.default_rng(2)
    acc = ErrorStats(classifier=False)
    for w in (100, 120):
        boxes, scores = _boxes_and_scores(rng, 1, w)
        ref = np.concatenate([boxes, scores], axis=1)
        acc.update(ref, ref + 0.01)
    assert 2 in acc.chan_dropped and 1 in acc.chan
    assert acc.quiet_part() is not None


def _detector_head() -> onnx.ModelProto:
    """Conv features -> one Conv of 7 channels -> Sigmoid -> a per-channel scale (640 for the
    4 box channels, 1 for the 3 scores: a decode), flattened to (1, 7, 256): with the tail
    quantized, the output is one grid over boxes and scores."""
    rng = np.random.default_rng(0)
    k = np.array([640.0] * 4 + [1.0] * 3, np.float32).reshape(1, 7, 1)
    inits = [numpy_helper.from_array(rng.normal(0, 0.4, (8, 3, 3, 3)).astype(np.float32), "c1"),
             numpy_helper.from_array(rng.normal(0, 0.4, (7, 8, 1, 1)).astype(np.float32), "ch"),
             numpy_helper.from_array(np.array([1, 7, -1], np.int64), "shp"),
             numpy_helper.from_array(k, "k")]
    nodes = [helper.make_node("Conv", ["x", "c1"], ["a"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["a"], ["r"]),
             helper.make_node("Conv", ["r", "ch"], ["h"]), helper.make_node("Sigmoid", ["h"], ["s"]),
             helper.make_node("Reshape", ["s", "shp"], ["flat"]),
             helper.make_node("Mul", ["flat", "k"], ["det"])]
    g = helper.make_graph(nodes, "head", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                          [helper.make_tensor_value_info("det", TensorProto.FLOAT, [1, 7, 256])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.mark.parametrize("preset,broken", [("A8W8", True), ("U8S8", True), ("A16W8", False)])
def test_the_guard_calls_scores_lost_beside_boxes_broken(preset, broken):
    """A8W8 / U8S8: the whole output passes 10 dB (the boxes), the scores' channels read a few
    dB: broken, naming the channels (quiet before, at the whole output's SQNR). A16W8 keeps the
    scores: quiet."""
    m = _detector_head()
    rng = np.random.default_rng(5)
    feeds = [{"x": rng.normal(0, 1, (1, 3, 16, 16)).astype(np.float32)} for _ in range(40)]
    cfg = mixq.get_default_config(preset).with_options(quantize_tail=True)
    res = mixq.quantize(m, cfg, feeds)
    fid = res.fidelity
    assert fid is not None
    (out,) = fid.outputs
    assert out.sqnr_db > 10.0  # the whole output passes
    assert out.part is not None and out.part.channels == (4, 5, 6) and out.part.axis == 1
    assert fid.broken is broken
    if broken:
        assert out.part.sqnr_db < 10.0 and out.judged_sqnr_db == out.part.sqnr_db
        assert "its channels 4..6 of 7 along axis 1" in res.summary()
        assert "looks broken" in res.summary()
        d = fid.to_dict()["outputs"][0]["part"]
        assert d["channels"] == [4, 5, 6] and math.isclose(d["sqnr_db"], out.part.sqnr_db)
    else:
        assert out.part.sqnr_db > 20.0


def test_the_searchs_relative_l2_reads_the_quiet_part_too():
    """`mixq auto`'s L2 (and SQNR) target is measured as the guard judges: the worst of the
    whole output's relative L2 and its quiet part's. Before, the scores lost beside the boxes
    read 0.04 (the boxes') and an L2 target of 0.1 accepted the broken plan."""
    from mixq.search.workbench import quiet_parts, relative_l2

    rng = np.random.default_rng(0)
    boxes, scores = _boxes_and_scores(rng)
    ref = np.concatenate([boxes, scores], axis=1)
    got = ref.copy()
    got[:, 4:] = np.round(got[:, 4:] / 5.0) * 5.0
    m = _detector_head()
    parts = quiet_parts(m, 0, [ref])
    assert parts == [(1, tuple(range(4, 22)))]
    whole = relative_l2([(got, ref)])
    assert whole < 0.01 < 0.5 < relative_l2([(got, ref)], parts)
    # rank 2 too: no Softmax wrote it, so the guard reads its parts beside its agreement
    # (test_guard_value_heads.py); a Softmax's probabilities are read by agreement alone
    assert quiet_parts(m, 0, [ref[:, :, 0]]) == [(1, tuple(range(4, 22)))]


def test_auto_with_an_l2_target_keeps_the_scores():
    from mixq.search import AutoConfig, Candidate, auto_quantize

    m = _detector_head()
    rng = np.random.default_rng(5)
    feeds = [{"x": rng.normal(0, 1, (1, 3, 16, 16)).astype(np.float32)} for _ in range(40)]
    base = mixq.get_default_config("A16W8").with_options(quantize_tail=True)
    auto = AutoConfig(base=base, candidates=(Candidate("int8", "int8"),), l2_target=0.1, cache_dir=None)
    res = auto_quantize(m, auto, feeds)
    assert res.target_met and res.metric <= 0.1
    assert res.narrow_metric is not None and res.narrow_metric > 0.3  # all int8: the scores lost
