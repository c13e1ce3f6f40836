"""`mixq auto` reaches its target or says plainly that it cannot (issue 17): the all-wide plan
first, widening to float for the most sensitive layers, at most two evaluations for an
unreachable target with a non-zero exit and the best model still written; any batch rule the
model has; metrics on the command line; SAMPLE/INPUT .npz files."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from mixq.cli.main import AUTO_TARGET_MISSED, main
from mixq.evaluate import make_session
from mixq.search import AutoConfig, Candidate, auto_quantize, base_from_candidate
from mixq.search.auto import TargetNotMetWarning
from mixq.search.workbench import relative_l2
from tests.conftest import feeds, small_cnn


def _rel_l2(model_path, float_model, feed_list):
    q, f = make_session(str(model_path)), make_session(float_model)
    return relative_l2([(q.run(None, fd)[0], f.run(None, fd)[0]) for fd in feed_list])


def _files(tmp_path, model, n_calib=32, n_eval=32, shape=(3, 16, 16)):
    onnx.save(model, tmp_path / "m.onnx")
    rng = np.random.default_rng(1)
    np.savez(tmp_path / "calib.npz", x=rng.standard_normal((n_calib, *shape)).astype(np.float32))
    np.savez(tmp_path / "eval.npz", x=rng.standard_normal((n_eval, *shape)).astype(np.float32))
    return [str(tmp_path / "m.onnx"), str(tmp_path / "o.onnx"), "--calib", str(tmp_path / "calib.npz"),
            "--eval", str(tmp_path / "eval.npz"), "--no-cache"]


def test_unreachable_target_stops_in_two_evaluations_with_a_message_and_exit_code(tmp_path, capsys):
    args = _files(tmp_path, small_cnn())
    rc = main(["auto", *args, "--metric", "l2", "--target", "1e-7", "--report-dir", str(tmp_path / "r")])
    captured = capsys.readouterr()
    assert rc == AUTO_TARGET_MISSED != 0
    # every candidate layer float is the float model itself here (it proves nothing): the
    # widest quantized plan is every candidate layer in a 16-bit float
    assert "cannot be met" in captured.err and "in a 16-bit float" in captured.err
    assert "full-model evaluations: 2 by the search" in captured.out
    # the best model found is still written, and it runs
    out = onnx.load(tmp_path / "o.onnx")
    onnx.checker.check_model(out, full_check=True)
    x = np.load(tmp_path / "eval.npz")["x"][:1]
    assert np.all(np.isfinite(make_session(out).run(None, {"x": x})[0]))
    report = (tmp_path / "r" / "report.md").read_text()
    assert "NOT met" in report and "What it bought" in report


def test_unreachable_target_through_the_api_returns_the_better_of_the_two(tmp_path):
    model, calib, ev = small_cnn(), feeds(32, 8), feeds(32, 16, seed=9)
    auto = AutoConfig(base=base_from_candidate(Candidate("int8", "int8")),
                      candidates=(Candidate("int8", "int4"),), l2_target=1e-7)
    with pytest.warns(TargetNotMetWarning, match="cannot be met"):  # never silent
        res = auto_quantize(model, auto, calib, ev, output_path=tmp_path / "best.onnx")
    assert not res.target_met and res.full_evaluations == 2
    assert "cannot be met" in res.message and "1e-07" in res.message
    wide = next(e for e in res.evaluations if e.label.startswith("all wide"))
    # the better one: every candidate layer in a 16-bit float (every layer float would be the
    # float model itself, which meets any target and says nothing about quantized plans)
    assert res.metric <= wide.metric
    assert set(res.assignment.values()) <= {"fp16", "bf16"} and res.widened_how == "in a 16-bit float"
    assert abs(_rel_l2(tmp_path / "best.onnx", model, ev) - res.metric) < 1e-6


def test_target_the_all_wide_plan_misses_is_met_by_widening(tmp_path):
    model, calib, ev = small_cnn(), feeds(32, 8), feeds(32, 16, seed=9)
    base = base_from_candidate(Candidate("int8", "int8"))
    with pytest.warns(TargetNotMetWarning):
        probe = auto_quantize(model, AutoConfig(base=base, candidates=(Candidate("int8", "int4"),),
                                                l2_target=1e-7), calib, ev)
    wide = next(e.metric for e in probe.evaluations if e.label.startswith("all wide"))
    target = 0.5 * (wide + probe.metric)  # between all wide and all candidate layers float
    res = auto_quantize(model, AutoConfig(base=base, candidates=(Candidate("int8", "int4"),),
                                          l2_target=target), calib, ev,
                        output_path=tmp_path / "w.onnx")
    assert res.target_met and res.metric <= target and res.widened_layers
    # the widened layers start in a 16-bit float (half float32's bytes) once float32 met it
    kept = set(res.assignment.values()) - {"int8", "int8/int4"}
    assert kept and kept <= {"fp16", "bf16", "float"} and "missed" in res.message, res.assignment
    assert "stay wide" in res.message
    # the strategy's bisection, then at most `refine` single moves past its point
    assert res.full_evaluations <= 3 + int(np.ceil(np.log2(len(res.path_labels) + 1))) + res.refine_tried
    # measured again from the written file on the held-out data
    assert _rel_l2(tmp_path / "w.onnx", model, ev) <= target


def test_reachable_target_is_met_on_held_out_data(tmp_path, capsys):
    model = small_cnn()
    args = _files(tmp_path, model)
    rc = main(["auto", *args, "--metric", "l2", "--target", "0.05",
               "--candidates", "int16/int8,int8/int4"])
    out = capsys.readouterr().out
    assert rc == 0 and "target met" in out
    x = np.load(tmp_path / "eval.npz")["x"]
    assert _rel_l2(tmp_path / "o.onnx", model, [{"x": x[i:i + 1]} for i in range(len(x))]) <= 0.05
    # and on fresh data from the same distribution, with some room for the sample
    fresh = np.random.default_rng(7).standard_normal((16, 3, 16, 16)).astype(np.float32)
    assert _rel_l2(tmp_path / "o.onnx", model, [{"x": fresh}]) <= 0.075


def test_check_data_the_search_never_saw(tmp_path, capsys):
    model = small_cnn()
    args = _files(tmp_path, model)
    rng = np.random.default_rng(8)
    np.savez(tmp_path / "same.npz", x=rng.standard_normal((16, 3, 16, 16)).astype(np.float32))
    rc = main(["auto", *args, "--l2-target", "0.05", "--check", str(tmp_path / "same.npz")])
    out = capsys.readouterr().out
    assert rc == 0 and "on the check data (never searched on)" in out and "also met" in out
    # data far outside the calibrated range: met on the search data, missed on the check data
    np.savez(tmp_path / "wild.npz", x=20 * rng.standard_normal((16, 3, 16, 16)).astype(np.float32))
    rc = main(["auto", *args, "--l2-target", "0.05", "--check", str(tmp_path / "wild.npz")])
    captured = capsys.readouterr()
    assert rc == AUTO_TARGET_MISSED and "NOT on the check data" in captured.err
    assert (tmp_path / "o.onnx").exists()


def _fixed_batch_convnet() -> onnx.ModelProto:
    """Conv-Relu-Conv-GlobalAveragePool-Flatten-Gemm with input [1, 3, 8, 8]: batch 1 only."""
    rng = np.random.default_rng(3)
    f = lambda *s: (rng.standard_normal(s) * 0.3).astype(np.float32)  # noqa: E731
    inits = [numpy_helper.from_array(f(4, 3, 3, 3), "w1"), numpy_helper.from_array(f(4), "b1"),
             numpy_helper.from_array(f(4, 4, 3, 3), "w2"), numpy_helper.from_array(f(4), "b2"),
             numpy_helper.from_array(f(5, 4), "wf"), numpy_helper.from_array(f(5), "bf")]
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1], name="conv2"),
             helper.make_node("GlobalAveragePool", ["c2"], ["gp"], name="gap"),
             helper.make_node("Flatten", ["gp"], ["fl"], name="flat"),
             helper.make_node("Gemm", ["fl", "wf", "bf"], ["y"], transB=1, name="fc")]
    g = helper.make_graph(nodes, "fixed1", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 5])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def test_fixed_batch_one_model_runs_with_default_settings(tmp_path, capsys):
    model = _fixed_batch_convnet()
    args = _files(tmp_path, model, n_calib=16, n_eval=16, shape=(3, 8, 8))
    rc = main(["auto", *args, "--l2-target", "0.05"])  # default candidates, strategy, rows
    assert rc == 0, capsys.readouterr().err
    # the API with feed dicts of batch 1 and no eval data (held out from the calibration feeds)
    x = np.random.default_rng(5).standard_normal((12, 1, 3, 8, 8)).astype(np.float32)
    res = auto_quantize(model, AutoConfig(base=base_from_candidate(Candidate("int16", "int8")),
                                          candidates=(Candidate("int8", "int8"),), l2_target=0.05),
                        [{"x": xi} for xi in x])
    assert res.target_met and res.sensitivity.err  # the sensitivities were measured


def test_metric_options_on_the_command_line(tmp_path, capsys):
    model = small_cnn()
    args = _files(tmp_path, model)
    for metric, target in (("cosine", "0.01"), ("agreement", "0.2"), ("sqnr", "20")):
        rc = main(["auto", *args, "--metric", metric, "--target", target])
        out = capsys.readouterr().out
        assert rc == 0, (metric, out)
        assert {"cosine": "cosine drop <= 0.01", "agreement": "top-1 agreement drop <= 0.2",
                "sqnr": "SQNR >= 20.0 dB"}[metric] in out
    # the user's own function, imported from a file; lower is better when it says so
    (tmp_path / "my_eval.py").write_text(
        "import numpy as np, onnxruntime as ort\n"
        f"X = np.load({str(tmp_path / 'eval.npz')!r})['x']\n"
        f"F = ort.InferenceSession({str(tmp_path / 'm.onnx')!r}).run(None, {{'x': X}})[0]\n"
        "CALLS = []\n"
        "def err(path):\n"
        "    CALLS.append(path)\n"
        "    q = ort.InferenceSession(path).run(None, {'x': X})[0]\n"
        "    return float(np.abs(q - F).max())\n"
        "err.higher_is_better = False\n")
    rc = main(["auto", *args, "--metric", f"{tmp_path / 'my_eval.py'}:err", "--target", "0.05"])
    out = capsys.readouterr().out
    assert rc == 0 and "err drop <= 0.05" in out
    q = make_session(str(tmp_path / "o.onnx")).run(None, {"x": np.load(tmp_path / "eval.npz")["x"]})[0]
    f = make_session(model).run(None, {"x": np.load(tmp_path / "eval.npz")["x"]})[0]
    assert float(np.abs(q - f).max()) <= 0.05


@pytest.mark.parametrize("extra, message", [
    (["--metric", "top1", "--target", "0.01"], "--labels"),
    (["--metric", "cosin", "--target", "0.01"], "cosine"),
    (["--metric", "nosuchmodule_xyz:f", "--target", "0.01"], "cannot import"),
    (["--target", "0.01"], "--metric"),
    (["--metric", "l2", "--target", "0.01", "--l2-target", "0.01"], "not both"),
])
def test_bad_metric_options_are_clear_errors(tmp_path, capsys, extra, message):
    rc = main(["auto", *_files(tmp_path, small_cnn()), *extra])
    assert rc == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "o.onnx").exists()


def test_npz_keyed_by_sample_and_input(tmp_path, capsys):
    model = _fixed_batch_convnet()
    onnx.save(model, tmp_path / "m.onnx")
    rng = np.random.default_rng(2)
    np.savez(tmp_path / "s.npz", **{f"{i:05d}/x": rng.standard_normal((3, 8, 8)).astype(np.float32)
                                    for i in range(12)})
    rc = main(["auto", str(tmp_path / "m.onnx"), str(tmp_path / "o.onnx"), "--calib",
               str(tmp_path / "s.npz"), "--l2-target", "0.05", "--no-cache"])
    assert rc == 0, capsys.readouterr().err
    np.savez(tmp_path / "bad.npz", **{"00000/x": np.zeros((3, 8, 8), np.float32),
                                      "x": np.zeros((1, 3, 8, 8), np.float32)})
    rc = main(["auto", str(tmp_path / "m.onnx"), str(tmp_path / "o2.onnx"), "--calib",
               str(tmp_path / "bad.npz"), "--l2-target", "0.05", "--no-cache"])
    assert rc == 2 and "SAMPLE/INPUT" in capsys.readouterr().err


def test_report_plot_titles_match_their_axes(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    from matplotlib.axes import Axes

    seen = []
    orig = Axes.set_title

    def record(self, label, *a, **k):
        seen.append((label, self.get_xlabel(), self.get_ylabel()))
        return orig(self, label, *a, **k)

    monkeypatch.setattr(Axes, "set_title", record)
    model, calib, ev = small_cnn(), feeds(32, 8), feeds(32, 16, seed=9)
    auto = AutoConfig(base=base_from_candidate(Candidate("int16", "int8")),
                      candidates=(Candidate("int8", "int4"),), l2_target=0.05)
    auto_quantize(model, auto, calib, ev, report_dir=tmp_path / "r")
    for title, _, ylabel in seen:
        assert "accuracy" not in title
        assert ylabel.split()[0] in title or ylabel in title, (title, ylabel)


def _masked_softmax() -> onnx.ModelProto:
    """MatMul -> Add of a -1e4 attention mask -> Softmax: the Softmax input cannot be quantized
    (the mask sets its range), which a search over Conv/Gemm/MatMul alone cannot fix."""
    rng = np.random.default_rng(4)
    mask = np.zeros((1, 8), np.float32)
    mask[0, 5:] = -10000.0
    nodes = [helper.make_node("MatMul", ["x", "w"], ["s"], name="scores"),
             helper.make_node("Add", ["s", "mask"], ["sm"], name="mask_add"),
             helper.make_node("Softmax", ["sm"], ["y"], axis=-1, name="softmax")]
    g = helper.make_graph(nodes, "masked", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 8])],
                          [numpy_helper.from_array((rng.standard_normal((8, 8)) * 0.5).astype(np.float32), "w"),
                           numpy_helper.from_array(mask, "mask")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def test_every_quantized_op_is_a_candidate_with_op_types_all():
    model = _masked_softmax()
    rng = np.random.default_rng(0)
    calib = [{"x": rng.standard_normal((8, 8)).astype(np.float32)} for _ in range(4)]
    ev = [{"x": rng.standard_normal((8, 8)).astype(np.float32)} for _ in range(4)]
    # the search on its own: the numerics policies (which keep the mask's sum float) off, and
    # the Add and Softmax after the MatMul (a post-processing tail, float by default) quantized
    base = base_from_candidate(Candidate("int16", "int8")).with_options(numerics_policies=False,
                                                                       quantize_tail=True)
    kw = dict(base=base, candidates=(Candidate("int8", "int8"),), metric="cosine", target=0.001)
    with pytest.warns(TargetNotMetWarning):
        only_mm = auto_quantize(model, AutoConfig(op_types=frozenset({"MatMul"}), **kw), calib, ev)
    assert not only_mm.target_met and only_mm.full_evaluations == 2
    # with them (the default), every plan of the search has the Softmax input float
    kw_on = {**kw, "base": base.with_options(numerics_policies=True)}
    on = auto_quantize(model, AutoConfig(op_types=frozenset({"MatMul"}), **kw_on), calib, ev)
    assert on.target_met and on.metric >= 1 - 0.001
    every = auto_quantize(model, AutoConfig(op_types=frozenset({"all"}), **kw), calib, ev)
    assert {"scores", "mask_add", "softmax"} <= set(every.sensitivity.layers)
    assert every.target_met and every.metric >= 1 - 0.001
    # the Softmax input stays in a float format (a 16-bit one: the -1e4 mask fits float16)
    assert every.assignment.get("softmax") in ("float", "fp16", "bf16"), every.assignment


@pytest.mark.parametrize("mask_value,expect", [(-1e4, "fp16"), (-3.4e38, "bf16")])
def test_widening_takes_float16_only_where_the_calibrated_ranges_fit(mask_value, expect):
    """A layer widened after the all-wide miss takes float16 when every tensor it touches was
    measured below 2^14, else bfloat16: a -3.4e38 mask would be -inf in float16."""
    from mixq import Pipeline
    from mixq.search.auto import half_floats
    from mixq.search.workbench import Workbench

    model = _masked_softmax()
    for t in model.graph.initializer:
        if t.name == "mask":
            m = numpy_helper.to_array(t).copy()
            m[m != 0] = mask_value
            t.CopyFrom(numpy_helper.from_array(m, "mask"))
    rng = np.random.default_rng(0)
    calib = [{"x": rng.standard_normal((8, 8)).astype(np.float32)} for _ in range(4)]
    pipe = Pipeline.load(model)
    cfg = base_from_candidate(Candidate("int16", "int8"))
    pipe.calibrate(pipe.plan(cfg.with_options(fuse_activations=False, quantize_tail=True)), calib)
    got = half_floats(Workbench(pipe, calib), ["scores", "mask_add", "softmax"])
    assert got["scores"].label == "fp16"  # its tensors are small whatever the mask
    assert got["mask_add"].label == expect and got["softmax"].label == expect


def test_a_candidate_wider_than_the_base_is_an_error_not_ignored(tmp_path, capsys):
    from mixq.errors import ConfigError

    with pytest.raises(ConfigError, match="not narrower than the base int8"):
        AutoConfig(base=base_from_candidate(Candidate("int8", "int8")),
                   candidates=(Candidate("int16", "int8"),), l2_target=0.1)
    rc = main(["auto", *_files(tmp_path, small_cnn()), "--l2-target", "0.1",
               "--candidates", "int8,int8/int4,bfp16"])
    assert rc == 2 and "bfp16" in capsys.readouterr().err


def test_sample_keyed_npz_never_joins_samples_along_a_static_first_dim(tmp_path, capsys):
    # a second input [2, 1, 4] whose first dim is not a batch (like an LSTM state)
    rng = np.random.default_rng(6)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
             helper.make_node("Add", ["h", "state"], ["y"], name="add")]
    g = helper.make_graph(nodes, "two_inputs",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4]),
                           helper.make_tensor_value_info("state", TensorProto.FLOAT, [2, 1, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 1, 4])],
                          [numpy_helper.from_array(rng.standard_normal((4, 4)).astype(np.float32), "w")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, tmp_path / "m.onnx")
    arrays = {}
    for i in range(12):
        arrays[f"{i:05d}/x"] = rng.standard_normal(4).astype(np.float32)  # no batch axis
        arrays[f"{i:05d}/state"] = rng.standard_normal((2, 1, 4)).astype(np.float32)
    np.savez(tmp_path / "s.npz", **arrays)
    rc = main(["auto", str(tmp_path / "m.onnx"), str(tmp_path / "o.onnx"), "--calib",
               str(tmp_path / "s.npz"), "--l2-target", "0.1", "--no-cache"])
    assert rc == 0, capsys.readouterr().err


def test_a_gather_table_is_a_candidate_that_shrinks_the_model():
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Gather", ["table", "ids"], ["e"], name="emb"),
             helper.make_node("MatMul", ["e", "w"], ["y"], name="mm")]
    g = helper.make_graph(nodes, "emb", [helper.make_tensor_value_info("ids", TensorProto.INT64, ["N", 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4, 8])],
                          [numpy_helper.from_array(rng.standard_normal((50, 8)).astype(np.float32), "table"),
                           numpy_helper.from_array(rng.standard_normal((8, 8)).astype(np.float32), "w")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    ids = [{"ids": rng.integers(0, 50, (2, 4)).astype(np.int64)} for _ in range(8)]
    auto = AutoConfig(base=base_from_candidate(Candidate("int16", "int8")),
                      candidates=(Candidate("int8", "int8"),), l2_target=0.05,
                      op_types=frozenset({"all"}))
    res = auto_quantize(m, auto, ids[:6], ids[6:])
    assert "emb" in res.sensitivity.layers and res.target_met
    assert res.assignment.get("emb") == "int8"
    assert res.size_bytes < res.wide_size_bytes  # the int16 table went to int8


def test_metric_values_on_known_models():
    from mixq.pipeline import Pipeline
    from mixq.search.objectives import make_objective
    from mixq.search.workbench import Workbench

    model = small_cnn()
    wb = Workbench(Pipeline.load(model), feeds(16, 8))
    # the same model with negated logits: cosine -1, relative L2 2 (SQNR -6.02 dB)
    neg = onnx.ModelProto()
    neg.CopyFrom(wb.model)
    for t in neg.graph.initializer:
        if t.name in ("wf", "bf"):
            t.CopyFrom(numpy_helper.from_array(-numpy_helper.to_array(t), t.name))
    vals = {m: (make_objective(m, None).evaluate(wb, wb.model), make_objective(m, None).evaluate(wb, neg))
            for m in ("l2", "sqnr", "cosine", "agreement")}
    # (the float model itself differs from the reference by onnxruntime's rounding only)
    assert vals["l2"] == (pytest.approx(0.0, abs=1e-6), pytest.approx(2.0))
    assert vals["sqnr"][0] > 100 and vals["sqnr"][1] == pytest.approx(-20 * np.log10(2))
    assert vals["cosine"] == (pytest.approx(1.0), pytest.approx(-1.0))
    assert vals["agreement"][0] == 1.0 and vals["agreement"][1] < 0.5
    assert make_objective("cosine", 0.01).meets(0.995) and not make_objective("cosine", 0.01).meets(0.98)
    assert make_objective("sqnr", 30).meets(31) and not make_objective("sqnr", 30).meets(29)


def test_bisection_returns_the_widest_plan_of_its_size():
    """Moves that narrow only activations leave the weight bytes unchanged: the bisection runs
    over the first point of each size, so the plan it returns is never preceded on the path by
    a point of the same size (narrower activations would buy nothing the size counts)."""
    model, calib, ev = small_cnn(), feeds(32, 8), feeds(32, 16, seed=9)
    cands = (Candidate("int8", "int8"), Candidate("int8", "int4"))
    res = auto_quantize(model, AutoConfig(base=base_from_candidate(Candidate("int16", "int8")),
                                          candidates=cands, l2_target=0.03), calib, ev)
    weight = {layer: "int8" for layer, _ in res.path_labels}
    starts = [0]
    for k, (layer, label) in enumerate(res.path_labels, 1):
        w = label.split("/")[-1]
        if w != weight[layer]:
            starts.append(k)
        weight[layer] = w
    n = len(res.path_labels)
    assert any(a.split("/")[0] == "int8" and a.split("/")[-1] == "int8"
               for _, a in res.path_labels), "the path has activation-only moves"
    assert res.target_met and (res.chosen_k in starts or res.chosen_k == n), (res.chosen_k, starts)
    assert all(e.k in starts or e.k == n for e in res.evaluations if e.k >= 0)


def test_activation_only_candidates_narrow_as_far_as_the_target_allows():
    """Candidates that differ only in their activations (int16/int8, int8/int8: the guard's
    own suggestion) leave every plan of the path the same weight bytes, so the bisection over
    the first point of each size evaluated the two ends and returned the all-wide plan for any
    target that plan met: a search that narrowed nothing. Every point is a level there now:
    the plan returned is the last one of the path meeting the target, between the ends."""
    model, calib, ev = small_cnn(), feeds(32, 8), feeds(32, 16, seed=9)
    wide = Candidate("int16", "int8")
    ends = auto_quantize(model, AutoConfig(base=base_from_candidate(wide), candidates=(Candidate("int8", "int8"),),
                                           l2_target=1.0), calib, ev)
    n = len(ends.path_labels)
    narrow_l2 = ends.metric
    assert ends.chosen_k == n and narrow_l2 > 0
    res = auto_quantize(model, AutoConfig(base=base_from_candidate(wide), candidates=(Candidate("int8", "int8"),),
                                          l2_target=narrow_l2 * 0.9, refine=0), calib, ev)
    met = {e.k: e.ok for e in res.evaluations if e.k >= 0}
    assert res.target_met and 0 < res.chosen_k < n, (res.chosen_k, met)
    assert met.get(res.chosen_k + 1) is False  # the next point along the path misses
    # the refinement past that point narrows further or keeps it, never wider
    refined = auto_quantize(model, AutoConfig(base=base_from_candidate(wide), candidates=(Candidate("int8", "int8"),),
                                              l2_target=narrow_l2 * 0.9), calib, ev)
    assert refined.target_met and refined.chosen_k >= res.chosen_k


def test_a_node_reading_one_tensor_twice_is_measured():
    """Concat(f, f) (Llama's rotary embedding) and x * x: the one-node model of the sensitivity
    pass took the tensor as two graph inputs of one name, which onnxruntime refuses."""
    rng = np.random.default_rng(5)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["f"], name="mm"),
             helper.make_node("Concat", ["f", "f"], ["ff"], axis=-1, name="cat"),
             helper.make_node("Mul", ["ff", "ff"], ["sq"], name="square"),
             helper.make_node("MatMul", ["sq", "w2"], ["y"], name="mm2")]
    g = helper.make_graph(nodes, "twice", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
                          [numpy_helper.from_array(rng.normal(0, .4, (8, 8)).astype(np.float32), "w"),
                           numpy_helper.from_array(rng.normal(0, .4, (16, 4)).astype(np.float32), "w2")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    calib = [{"x": rng.standard_normal((8, 8)).astype(np.float32)} for _ in range(4)]
    ev = [{"x": rng.standard_normal((8, 8)).astype(np.float32)} for _ in range(4)]
    auto = AutoConfig(base=base_from_candidate(Candidate("int16", "int8")), candidates=(Candidate("int8", "int8"),),
                      op_types=frozenset({"all"}), metric="cosine", target=0.01)
    res = auto_quantize(m, auto, calib, ev)
    assert {"cat", "square"} <= set(res.sensitivity.layers) and res.target_met


def test_every_candidate_layer_float_is_the_float_model_itself():
    """MaxPool and Flatten are no candidates (they compute nothing new), but quantize their
    input for an integer consumer after them. With every layer around them left float that is
    a Q/DQ pair between float layers: the search leaves them float too, so the widened plan is
    the float model (no format anywhere) and takes the float model's value without a run; a
    pass-through whose consumer stays quantized keeps its quantization."""
    from mixq.pipeline import Pipeline
    from mixq.search.auto import FLOAT, PassThroughs, _assignment_config
    from mixq.search.sensitivity import candidate_layers
    from mixq.search.workbench import Workbench

    model = small_cnn()
    base = base_from_candidate(Candidate("int8", "int8"))
    pipe = Pipeline.load(model, defer=False)
    pipe.calibrate(pipe.plan(base), feeds(32, 8))
    wb = Workbench(pipe, feeds(16, 8, seed=9))
    layers = candidate_layers(wb, base, frozenset({"all"}))
    assert "pool" not in layers and "flat" not in layers
    passes = PassThroughs(wb.model, frozenset(wb.plan(base).float_nodes))
    assert passes.idle(frozenset()) == frozenset()  # the all-wide plan is the uniform preset
    every = frozenset(layers)
    assert passes.idle(every) == {"pool", "flat"}
    plain = wb.plan(_assignment_config(base, {n: FLOAT for n in layers}))
    assert plain.formats()  # before: the MaxPool and Flatten inputs stayed int8
    widened = wb.plan(_assignment_config(base, {n: FLOAT for n in layers}, passes.idle(every)))
    assert not widened.formats()
    # the Gemm after Flatten stays int8: Flatten still feeds it its grid; the MaxPool before
    # the float GlobalAveragePool does not
    partly = frozenset(n for n in layers if n != "fc")
    assert passes.idle(partly) == {"pool"}


@pytest.mark.parametrize("rows, exposed", [(16, True), (64, False)])
def test_auto_says_when_its_output_grids_end_at_few_calibration_samples(rows, exposed):
    """The quantize summary says when the output's 8-bit ranges end at the extremes of fewer
    than 64 calibration samples (an unseen input goes past them with probability 1/(N+1));
    `mixq auto`'s result said nothing, and its held-out data need not show the clipping: a
    random graph's auto run kept a cosine of 0.9988 on a row whose largest value was clipped
    from 9.1 to 5.0 (a scratch sweep, docs/ROBUSTNESS.md round 22)."""
    import mixq

    model = small_cnn()
    auto = AutoConfig(base=base_from_candidate(Candidate("int8", "int8")), candidates=(Candidate("int8", "int4"),),
                      metric="cosine", target=0.01)
    res = auto_quantize(model, auto, feeds(rows, 4), feeds(32, 8, seed=9))
    q = mixq.quantize(model, "A8W8", feeds(rows, 4), check_kernels=False)
    assert res.target_met and bool(res.exposed) == exposed and res.exposed == q.exposed
    note = f"the 8-bit ranges of logits, which define the output, end at (or just past) the extremes of {rows} calibration"
    assert (note in res.message) == exposed and (note in q.summary()) == exposed
