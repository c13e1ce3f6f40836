"""The plan's stages on small graphs written in ONNX text (pure: no onnxruntime): requests from
the op table, resolution into producer and consumer formats, and the policies."""
from __future__ import annotations

import onnx
from hypothesis import given, settings
from hypothesis import strategies as st

import mixq
from mixq.config import LayerRule
from mixq.plan.memo import StatsMemo
from mixq.graph import GraphIndex
from mixq.plan.plan import PrecisionPlan
from mixq.plan.rules import _requests, _resolve, build_plan

from ..graphs import model

CHAIN = """<ir_version: 8, opset_import: ["": 17]>
    g (float[1,3,8,8] x, float[4,3,3,3] W, float[4] B, float[4,4,1,1] W2) => (float[1,4,6,6] y) {
        c = Conv(x, W, B)
        r = Relu(c)
        p = MaxPool <kernel_shape = [1, 1]> (r)
        y = Conv(p, W2) }"""


def _ix(text=CHAIN, **w):
    m = model(text, **(w or {"W": (4, 3, 3, 3), "B": (4,), "W2": (4, 4, 1, 1)}))
    return GraphIndex.of(onnx.shape_inference.infer_shapes(m))


def test_requests_follow_the_op_table():
    ix = _ix()
    req = _requests(ix, mixq.get_default_config("A8W8"))
    assert len(req.consumed["x"]) == 1 and req.consumed["x"][0][1] == "int8"
    assert req.constants["W"].role == "weight" and req.constants["W"].channel_axis == 0
    assert req.constants["B"].role == "bias" and req.constants["B"].format == "int32"
    assert "c" in req.produced and req.passthrough_of["p"] == "r"


def test_resolve_inherits_integer_parameters_through_pass_through_ops():
    ix = _ix()
    cfg = mixq.get_default_config("A8W8")
    req = _requests(ix, cfg)
    tensors = _resolve(ix, cfg, req)
    assert tensors["p"].format == "int8" and not tensors["p"].calibrate
    assert req.groups.find("p") == req.groups.find("r")


def test_block_formats_do_not_survive_pass_through_ops():
    """A MaxPool moves values across blocks: the second Conv asks for its own bfp16."""
    ix = _ix()
    cfg = mixq.QuantConfig(activation="bfp16", weight="bfp16")
    plan = build_plan(ix.model, cfg, index=ix)
    assert plan.tensors["p"].format == "bfp16" and plan.tensors["p"].block_axis == 1


def test_layer_rule_makes_a_boundary():
    ix = _ix()
    cfg = mixq.QuantConfig(activation="int8", weight="int8",
                           layer_rules=(mixq.LayerRule(op_types=frozenset({"Conv"}),
                                                       activation="int16", weight="int8"),))
    plan = build_plan(ix.model, cfg, index=ix)
    assert plan.tensors["r"].format == "int8"
    assert plan.tensors["x"].format == "int16"


def test_fusion_policy_and_reasons():
    ix = _ix()
    plan = build_plan(ix.model, mixq.QuantConfig(activation="bf16", weight="bf16"), index=ix)
    assert "c" in plan.skipped and "fused" in plan.skipped["c"]
    plan = build_plan(ix.model, mixq.get_default_config("A8W8"), index=ix)
    assert "fused" in plan.tensors["c"].reason and plan.tensors["c"].group == plan.tensors["r"].group


def test_operand_only_configs_say_why_outputs_stay_float():
    ix = _ix()
    plan = build_plan(ix.model, mixq.get_default_config("BFP16"), index=ix)
    assert plan.tensors["x"].format == "bfp16" and plan.tensors["p"].format == "bfp16"
    assert "not in op_types" in plan.skipped["r"]          # Relu is not a compute op
    assert "quantize_outputs=False" in plan.skipped["y"]   # the compute output stays float
    assert plan.config == mixq.get_default_config("BFP16").to_dict()


def _stats(seed: int) -> dict:
    import numpy as np

    from mixq.calibration.stats import TensorStats

    rng = np.random.default_rng(seed)
    return {n: TensorStats.from_array(rng.normal(0, s, 4096).astype(np.float32))
            for n, s in (("x", 1.0), ("c", 3.0), ("r", 2.0), ("p", 2.0))}


def test_range_memo_reuses_choices_and_never_serves_other_statistics(monkeypatch):
    """activation_qparams through a memo gives the parameters it gives without one, chooses
    each (statistics, format, options) once across plans, and statistics that are other
    objects (recollected) get their own choice."""
    import numpy as np

    import mixq.plan.qparams as qp_mod

    calls = []
    real = qp_mod.compute_range
    monkeypatch.setattr(qp_mod, "compute_range", lambda *a, **k: calls.append(1) or real(*a, **k))
    m = onnx.shape_inference.infer_shapes(model(CHAIN, W=(4, 3, 3, 3), B=(4,), W2=(4, 4, 1, 1)))
    a8, a16 = mixq.get_default_config("A8W8"), mixq.get_default_config("A16W8")
    stats, memo = _stats(0), StatsMemo()

    def same(a, b):
        return a.keys() == b.keys() and all(np.array_equal(a[k].scale, b[k].scale) and
                                            np.array_equal(a[k].zero_point, b[k].zero_point) for k in a)

    new_choices = []
    for cfg in (a8, a16, a8):
        plan = build_plan(m, cfg)
        want = qp_mod.activation_qparams(plan, stats, cfg)
        n = len(calls)
        assert same(qp_mod.activation_qparams(plan, stats, cfg, memo), want)
        new_choices.append(len(calls) - n)
    assert new_choices[0] > 0 and new_choices[1] > 0 and new_choices[2] == 0
    plan, other = build_plan(m, a8), _stats(1)
    got = qp_mod.activation_qparams(plan, other, a8, memo)
    assert same(got, qp_mod.activation_qparams(plan, other, a8))
    assert not same(got, qp_mod.activation_qparams(plan, stats, a8))


def test_plan_json_has_every_field_of_every_tensor():
    import json
    from dataclasses import asdict

    m = onnx.shape_inference.infer_shapes(model(CHAIN, W=(4, 3, 3, 3), B=(4,), W2=(4, 4, 1, 1)))
    plan = build_plan(m, mixq.get_default_config("A8W8"))
    assert json.loads(plan.to_json())["tensors"] == [asdict(t) for t in plan.tensors.values()]
    assert PrecisionPlan.from_json(plan.to_json()) == plan


@given(nodes=st.lists(st.text("ab*?[]!.0", max_size=4), max_size=6),
       names=st.lists(st.text("ab*?[]!.0", max_size=4), min_size=1, max_size=8))
@settings(max_examples=300, deadline=None)
def test_layer_rule_matches_names_and_patterns_as_fnmatch(nodes, names):
    """LayerRule looks plain names up and sends only patterns through fnmatch: the same answer
    as comparing every entry and matching it as a pattern, for any mix of names, patterns and
    broken patterns ('[' without ']')."""
    import fnmatch

    rule = LayerRule(nodes=tuple(nodes), weight="int8") if nodes else LayerRule(op_types={"Conv"}, weight="int8")
    for name in names:
        want = any(name == p or fnmatch.fnmatchcase(name, p) for p in nodes)
        assert rule.matches("Relu", name) == want, (nodes, name)
        assert rule.matches("Conv", name) == (want or not nodes)
