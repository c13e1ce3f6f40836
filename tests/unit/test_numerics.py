"""Numerics detectors on hand-made statistics, and apply_numerics on a plan."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from mixq.calibration.stats import TensorStats
from mixq.plan.numerics import (SMALL_MIN_DB, apply_numerics, cancellation_inputs, concat_range_outputs,
                                layer_noise, root_output_sqnr_db, sentinel_tensors, small_value_inputs,
                                swamped_share)
from mixq.plan.memo import StatsMemo
from mixq.plan.plan import PrecisionPlan, TensorPrecision

RNG = np.random.default_rng(0)


def _st(x) -> TensorStats:
    return TensorStats.from_array(np.asarray(x, np.float32))


def test_sentinel_flags_masks_not_ordinary_tensors():
    scores = RNG.normal(0, 3, 4000)
    masked = np.where(RNG.random(4000) < 0.4, -1e4, 0.0)
    stats = {"mask_add": _st(scores + masked), "mask_max": _st(scores + masked * 3.4e34),
             "normal": _st(scores), "relu": _st(np.maximum(scores, 0)),
             "softmax": _st(np.r_[RNG.uniform(0.5, 1, 970), np.full(30, 1e-17)]),
             "tiny_tail": _st(np.r_[scores, 1e-20, -1e-25]), "heavy": _st(np.r_[scores * 1e-4, 50.0])}
    found = sentinel_tensors(stats)
    assert set(found) == {"mask_add", "mask_max", "heavy"}, found
    assert "2^" in found["mask_add"] and "below absmax (1e+04)" in found["mask_add"]


def _graph(nodes, inits=()):
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], list(inits))
    return helper.make_model(g)


def test_small_value_inputs_walk_back_only_through_quiet_tensors():
    m = _graph([helper.make_node("MatMul", ["x", "w"], ["a"]), helper.make_node("Mul", ["a", "a"], ["p"]),
                helper.make_node("Log", ["p"], ["y"])],
               [numpy_helper.from_array(np.eye(4, dtype=np.float32), "w")])
    quiet = _st(np.r_[np.full(50, 100.0), np.full(50, 1e-4)])
    loud = _st(RNG.normal(0, 1, 1000))
    out = small_value_inputs(m, {"p": quiet, "a": quiet, "x": loud})
    assert set(out) == {"p", "a"} and "Log" in out["p"] and "through Mul" in out["a"]
    out = small_value_inputs(m, {"p": quiet, "a": loud, "x": quiet})
    assert set(out) == {"p"}  # the walk stops at a tensor without quiet values


def test_root_output_sqnr_reads_the_grid_against_the_values():
    """A running sum's values spread from 0 to the absmax: an int8 grid sized for the largest
    leaves the smallest a few codes, and a Log of them keeps little; values within a factor of
    two of the absmax keep plenty; a divisor weighs its small values most."""
    ramp = _st(np.linspace(0.0, 186.0, 20000))
    step = 186.0 / 127
    assert root_output_sqnr_db(ramp, step, None) < SMALL_MIN_DB
    assert root_output_sqnr_db(ramp, step / 256, None) > SMALL_MIN_DB  # int16
    narrow = _st(RNG.uniform(93.0, 186.0, 20000))
    assert root_output_sqnr_db(narrow, step, None) > 30.0
    assert root_output_sqnr_db(narrow, step, -1.0) > 30.0 and root_output_sqnr_db(narrow, step, 0.5) > 40.0
    near_zero = _st(np.r_[RNG.uniform(93.0, 186.0, 19000), RNG.uniform(0.0, 1.0, 1000)])
    assert root_output_sqnr_db(near_zero, step, -1.0) < 3.0  # 1/x of values that round to 0: all lost
    assert root_output_sqnr_db(_st(np.zeros(10)), step, None) == float("inf")


def test_the_predicted_rule_follows_element_wise_ops_only():
    """(b)'s predicted-SQNR rule judges what reaches the root element by element (an added
    epsilon): a ramp feeding Log through Add is kept float on an int8 grid (its share of tiny
    values is under 10%, so the share rule alone lets it through); behind a MatMul, a sum that
    averages its terms' errors, a bell-shaped input is not judged by it."""
    m = _graph([helper.make_node("MatMul", ["x", "w"], ["a"]), helper.make_node("Add", ["a", "eps"], ["p"]),
                helper.make_node("Log", ["p"], ["y"])],
               [numpy_helper.from_array(np.eye(4, dtype=np.float32), "w"),
                numpy_helper.from_array(np.float32(1e-3), "eps")])
    ramp, bell = _st(np.linspace(0.0, 186.0, 20000)), _st(RNG.normal(0, 1, 20000))
    stats = {"p": ramp, "a": ramp, "x": bell}

    def int8(name: str, value: float) -> float:
        return value / 127

    assert set(small_value_inputs(m, stats)) == {"p"}
    out = small_value_inputs(m, stats, spacing=int8)
    assert set(out) == {"p", "a"} and "would keep about" in out["a"] and "through Add" in out["a"]
    assert set(small_value_inputs(m, stats, spacing=lambda n, v: v / 32767)) == {"p"}  # int16 grid: fine


def test_cancellation_and_concat():
    m = _graph([helper.make_node("Sub", ["x", "b"], ["d"]), helper.make_node("Concat", ["x", "d"], ["y"], axis=0)])
    big, small = _st(RNG.normal(100, 1, 1000)), _st(RNG.normal(0, 1, 1000))
    assert set(cancellation_inputs(m, {"x": big, "b": big, "d": small})) == {"x", "b"}
    assert cancellation_inputs(m, {"x": small, "b": small, "d": small}) == {}
    found = concat_range_outputs(m, {"x": big, "d": small})
    assert set(found) == {"y"} and "Concat" in found["y"]
    assert concat_range_outputs(m, {"x": small, "d": small}) == {}


def test_apply_numerics_new_plan_with_reasons_and_sharers():
    m = _graph([helper.make_node("Add", ["x", "x"], ["s"]), helper.make_node("Reshape", ["s", "shape"], ["r"]),
                helper.make_node("Log", ["r"], ["y"])],
               [numpy_helper.from_array(np.array([4], np.int64), "shape")])
    tp = {"x": TensorPrecision("x", "activation", "int8", "in"),
          "s": TensorPrecision("s", "activation", "int8", "out", group="s"),
          "r": TensorPrecision("r", "activation", "int8", "pass", group="s", calibrate=False)}
    plan = PrecisionPlan(tensors=tp)
    scores = RNG.normal(0, 3, 1000)
    stats = {"x": _st(scores), "s": _st(scores + np.where(RNG.random(1000) < 0.3, -3.4e38, 0))}
    new, findings = apply_numerics(plan, m, stats)
    assert plan.tensors["s"].format == "int8"  # the input plan is untouched
    assert {f.tensor: f.policy for f in findings} == {"s": "sentinel", "r": "small_values"}
    assert new.tensors["s"].format is None and new.tensors["s"].reason.startswith("kept float: additive mask")
    assert new.tensors["r"].format is None and new.tensors["x"].format == "int8"
    same, none = apply_numerics(plan, m, stats, enabled=False)
    assert same is plan and none == []


def test_tensor_override_is_left_as_set():
    m = _graph([helper.make_node("Log", ["x"], ["y"])])
    plan = PrecisionPlan(tensors={"x": TensorPrecision("x", "activation", "int8", "tensor override")})
    new, findings = apply_numerics(plan, m, {"x": _st(RNG.normal(0, 1, 100))})
    assert findings == [] and new.tensors["x"].format == "int8"


def test_a_memo_gives_the_same_findings_and_reads_each_statistics_once(monkeypatch):
    """A search plans many points over one set of statistics: with a StatsMemo the per-tensor
    verdicts (sentinel, outlier quantile) are computed once per statistics object, the findings
    are those of the memo-less call, and other statistics (even equal in value) are read anew."""
    import mixq.plan.numerics as nm

    m = _graph([helper.make_node("Add", ["x", "x"], ["s"]), helper.make_node("Relu", ["s"], ["y"])])
    scores = RNG.normal(0, 3, 2000)
    stats = {"x": _st(np.r_[scores * 1e-2, 40.0]),  # an outlier: the 99th percentile under a code
             "s": _st(scores + np.where(RNG.random(2000) < 0.3, -1e4, 0)), "y": _st(scores)}
    tp = {n: TensorPrecision(n, "activation", "int8", "in") for n in stats}
    plans = [PrecisionPlan(tensors=tp), PrecisionPlan(tensors={**tp, "y": replace(tp["y"], format="int16")})]
    calls = {"sentinel": 0, "quantile": 0}
    real_sentinel, real_quantile = nm._sentinel_reason, nm._quantile_abs

    def sentinel(*a):
        calls["sentinel"] += 1
        return real_sentinel(*a)

    def quantile(*a):
        calls["quantile"] += 1
        return real_quantile(*a)

    monkeypatch.setattr(nm, "_sentinel_reason", sentinel)
    monkeypatch.setattr(nm, "_quantile_abs", quantile)
    memo = StatsMemo()
    for plan in plans * 3:
        with_memo = apply_numerics(plan, m, stats, memo=memo)
        without = apply_numerics(plan, m, stats)
        assert with_memo[1] == without[1] and with_memo[0].tensors == without[0].tensors
    assert {f.tensor: f.policy for f in with_memo[1]} == {"s": "sentinel", "x": "outliers"}
    # 6 plans without the memo read the 3 tensors each time; with it, each tensor once
    assert calls == {"sentinel": 3 * 6 + 3, "quantile": 3 * 6 + 3}, calls
    copies = {n: st.copy() for n, st in stats.items()}
    apply_numerics(plans[0], m, copies, memo=memo)
    assert calls == {"sentinel": 3 * 6 + 6, "quantile": 3 * 6 + 6}, calls


def test_phase_walk_goes_through_an_outer_product_not_through_a_layer():
    """(h) The walk back from a Sin's input carries on through a MatMul with a constant whose
    contracted dimension is 1 (positions times a frequency row: each output is one input times a
    constant) and stops at one whose sum averages its inputs' rounding (a layer)."""
    from mixq.plan.numerics import phase_paths

    def model(k: int):
        inits = [numpy_helper.from_array(np.ones((k, 4), np.float32), "w"),
                 numpy_helper.from_array(np.array([2], np.int64), "ax")]
        src = "x3" if k == 1 else "x"
        nodes = ([helper.make_node("Unsqueeze", ["x", "ax"], ["x3"])] if k == 1 else []) + \
                [helper.make_node("MatMul", [src, "w"], ["ph"]), helper.make_node("Sin", ["ph"], ["y"])]
        shape = ["N", "S"] if k == 1 else ["N", "S", k]
        g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", "S", 4])], inits)
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
        import onnx

        return onnx.shape_inference.infer_shapes(m)

    assert phase_paths(model(1)) == {"ph": ["ph", "x3", "w", "x"]}
    assert phase_paths(model(8)) == {"ph": ["ph"]}


def test_root_output_sqnr_of_a_steep_power_does_not_overflow():
    """x ** -5 of float32 subnormals is 1e225 squared: the weights are scaled, not overflowed."""
    st = _st(np.r_[RNG.uniform(1.0, 2.0, 1000), np.float32(1e-44), np.float32(3e-40)])
    db = root_output_sqnr_db(st, 2.0 / 127, -5.0)
    assert np.isfinite(db) and db < 3.0  # the subnormals round to 0: their quotients are lost
    assert root_output_sqnr_db(_st(RNG.uniform(1.0, 2.0, 1000)), 2.0 / 127, -5.0) > 20.0


def test_layer_noise_predicts_the_noise_each_operands_grid_adds_at_the_output():
    """The rms of the output error that rounding a MatMul's weight (int8 per channel) or its
    input (int8) adds, as `layer_noise` predicts it from the statistics, against the measured
    one: within 15 %. `swamped_share` reads what such a noise hides."""
    from mixq.formats import get_format

    x = RNG.normal(0, 1, (4000, 64)).astype(np.float32) * np.linspace(0.2, 2, 64).astype(np.float32)
    w = RNG.normal(0, 0.3, (64, 16)).astype(np.float32) * np.linspace(0.5, 3, 16).astype(np.float32)
    m = _graph([helper.make_node("MatMul", ["x", "w"], ["y"])], [numpy_helper.from_array(w, "w")])
    plan = PrecisionPlan(tensors={"x": TensorPrecision("x", "activation", "int8", "in"),
                                  "w": TensorPrecision("w", "weight", "int8", "w", channel_axis=1)})
    got = {kind: (name, rms) for name, kind, rms in layer_noise(plan, m, {"x": _st(x)})(m.graph.node[0])}
    fmt = get_format("int8")
    scale_w = np.abs(w).max(0) / fmt.symmetric_limit
    w_q = np.round(w / scale_w) * scale_w
    scale_x = np.abs(x).max() / fmt.symmetric_limit
    x_q = np.round(x / scale_x) * scale_x
    measured = {"weight": float(np.sqrt(np.mean((x @ (w_q - w)) ** 2))),
                "input": float(np.sqrt(np.mean(((x_q - x) @ w) ** 2)))}
    assert got["weight"][0] == "w" and got["input"][0] == "x"
    for kind, rms in measured.items():
        assert abs(got[kind][1] / rms - 1) < 0.15, (kind, got[kind][1], rms)
    y = _st(np.r_[np.full(900, 1.0), np.full(100, 1e-3)])
    assert swamped_share(y, 1e-3) == 0.1 and swamped_share(y, 1e-4) == 0.0
