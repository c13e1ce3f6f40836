"""Automatic mixed precision on a real pretrained model (the PP-OCR text-direction classifier, with
upright/rotated labels): the documented snippets, targets on held-out data, the front, the
baselines, time budget and cache."""
from __future__ import annotations

import math
import time

import numpy as np
import onnx
import pytest

from mixq.errors import ConfigError
from mixq.evaluate import make_session
from mixq.search import AutoConfig, Candidate, auto_quantize, base_from_candidate
from tests import realmodels

_MINMAX_INT8 = base_from_candidate(Candidate("int8", "int8"), "A8W8").with_options(
    calibration="minmax", name="int8 MinMax base")

# the documented snippets' import lines, changed
from mixq.compat import ModelQuantizer, QuantType, VitisQuantFormat, VitisQuantType  # noqa: E402
from mixq.compat import Config, QuantizationConfig, CalibrationMethod, quark  # noqa: E402

pytestmark = pytest.mark.skipif(not realmodels.have_ppocr_models(),
                                reason="pip install --no-deps rapidocr-onnxruntime==1.4.4")


class Reader:
    def __init__(self, x, batch=8):
        self.it = iter([{"x": x[i:i + batch]} for i in range(0, len(x), batch)])

    def get_next(self):
        return next(self.it, None)


@pytest.fixture(scope="module")
def case():
    path = str(realmodels.ppocr_cls_model_path())
    calib = realmodels.cls_inputs("calib", 24)
    ev, labels = realmodels.cls_inputs("eval", 48, with_labels=True)
    return path, calib, ev, labels


def _acc(model_path, x, labels):
    # the QDQ semantics the search decides on where onnxruntime's fused 8-bit kernels saturate
    # (an x86 CPU without VNNI, README's int8 note): there one of these 48 images flips
    from mixq.api import cpu_has_vnni

    s = make_session(model_path, optimize=True if cpu_has_vnni() is not False else "basic")
    return float(np.mean(np.argmax(s.run(None, {"x": x})[0], 1) == labels))


def _vendor_l2(float_path, quant_model, feeds) -> float:
    """The vendor's measure: mean over batches of ||float - quantized||_2 (absolute)."""
    from mixq.compat import average_l2

    res = []
    for m in (float_path, quant_model):
        s = make_session(m, optimize=False)
        res.append([[s.run(None, f)[0]] for f in feeds])
    return average_l2(*res)


def test_l2_snippet_meets_its_target_as_the_vendor_measures_it(case, tmp_path):
    input_model_path, calib, _, _ = case
    output_model_path = str(tmp_path / "l2.onnx")
    data_reader = Reader(calib)
    quant_config = QuantizationConfig(
        calibrate_method=CalibrationMethod.MinMax,
        quant_format=VitisQuantFormat.QDQ,
        activation_type=VitisQuantType.QInt16,
        weight_type=QuantType.QInt8,
        extra_options={
            'AutoMixprecision': {
                "TargetOpType": ["Conv", "ConvTranspose", "Gemm", "MatMul"],
                'ActTargetQuantType': QuantType.QInt8,
                'WeightTargetQuantType': QuantType.QInt8,
                'OutputIndex': 0,
                'L2Target': 0.1,
            },
        },
    )
    config = Config(global_quant_config=quant_config)
    quantizer = ModelQuantizer(config)
    quantizer.quantize_model(input_model_path, output_model_path, data_reader)
    res = quantizer.result
    out = onnx.load(output_model_path)
    onnx.checker.check_model(out, full_check=True)
    feeds = [{"x": calib[i:i + 8]} for i in range(0, len(calib), 8)]
    measured = _vendor_l2(input_model_path, out, feeds)
    # the walk's measure is the vendor's absolute average L2 on the calibration batches
    assert res.metric == pytest.approx(measured, rel=1e-3, abs=1e-6)
    assert res.target_met == (measured <= 0.1)
    narrowed = set(res.narrowed)
    assert narrowed <= set(res.candidates)
    # the switched layers read int8 in the output graph, the others int16
    plan = res.plan
    assert any(t.format == "int16" for t in plan.tensors.values() if t.role == "activation") or \
        narrowed == set(res.candidates)


def test_top1_snippet_with_evaluate_function_meets_its_target(case, tmp_path):
    input_model_path, _, _, _ = case
    calib, labels = realmodels.cls_inputs("calib", 24, with_labels=True)
    calls = []

    def top1_acc(results) -> float:
        # called as the vendor calls it: one entry per batch, each [output 0]
        calls.append(len(results))
        pred = np.concatenate([np.argmax(r[0], 1) for r in results])
        return float(np.mean(pred == labels[:len(pred)]))

    quant_config = QuantizationConfig(
        calibrate_method=quark.onnx.CalibrationMethod.Percentile,
        quant_format=quark.onnx.VitisQuantFormat.QDQ,
        activation_type=quark.onnx.VitisQuantType.QInt16,
        weight_type=QuantType.QInt8,
        include_auto_mp=True,
        extra_options={
            'AutoMixprecision': {
                'ActTargetQuantType': QuantType.QInt8,
                'WeightTargetQuantType': QuantType.QInt8,
                'OutputIndex': 0,
                'Top1AccTarget': 0.1,
                'EvaluateFunction': top1_acc,
            },
        },
    )
    config = Config(global_quant_config=quant_config)
    out = str(tmp_path / "top1.onnx")
    q = ModelQuantizer(config)
    q.quantize_model(input_model_path, out, Reader(calib))
    assert calls and set(calls) == {3}  # 24 samples in batches of 8
    s_f, s_q = make_session(input_model_path), make_session(out)
    acc = [float(np.mean(np.argmax(s.run(None, {"x": calib})[0], 1) == labels)) for s in (s_f, s_q)]
    assert round(acc[0] - acc[1], 4) <= 0.1 + 1e-9 and q.result.target_met


def test_search_beats_both_uniform_baselines_at_a_top1_target(case, tmp_path):
    path, calib, ev, labels = case
    # a MinMax int8 base with nearest rounding (the A8W8 preset's MinMSE weights already keep
    # int4 within 0.02 here, and so does GPTQ rounding: all int4 then reads as float does,
    # leaving nothing between the baselines to find)
    auto = AutoConfig(base=_MINMAX_INT8.with_options(weight_rounding="nearest"),
                      candidates=(Candidate("int8", "int4"),), top1_drop=0.02, strategy="pareto")
    res = auto_quantize(path, auto, Reader(calib), [{"x": ev}], labels=labels,
                        output_path=tmp_path / "auto.onnx", report_dir=tmp_path / "report")
    assert res.target_met and res.float_metric - res.metric <= 0.02
    assert res.size_bytes < res.wide_size_bytes          # smaller than all-wide at the target
    assert res.metric > res.narrow_metric                # more accurate than all-narrow
    sizes = [e.size_bytes for e in res.front]
    metrics = [e.metric for e in res.front]
    assert sizes == sorted(sizes) and metrics == sorted(metrics)  # the front is monotone
    # the returned model is the one measured: re-measure it from the written file
    assert abs(_acc(str(tmp_path / "auto.onnx"), ev, labels) - res.metric) < 1e-9
    names = {p.name for p in res.report_paths}
    assert {"report.md", "report.json", "sensitivity.png", "front.png"} <= names
    assert "| layer |" in (tmp_path / "report" / "report.md").read_text()


@pytest.mark.parametrize("strategy", ["bisection", "guided"])
def test_search_meets_a_top1_target_with_few_verified_evaluations(case, strategy):
    path, calib, ev, labels = case
    auto = AutoConfig(base=_MINMAX_INT8, candidates=(Candidate("int8", "int4"),), top1_drop=0.02,
                      strategy=strategy)
    assert AutoConfig(base=auto.base, candidates=auto.candidates, top1_drop=0.02).strategy == "bisection"
    res = auto_quantize(path, auto, Reader(calib), [{"x": ev}], labels=labels)
    n = len(res.path_labels)
    assert res.target_met and res.float_metric - res.metric <= 0.02
    assert res.size_bytes < res.wide_size_bytes
    # every full-model evaluation is counted, and the returned point is one of them that passed;
    # guided falls back to bisection when its predictions miss: at most about twice its count;
    # the all-wide point is evaluated first (+1)
    bound = math.ceil(math.log2(n + 1)) + 2
    assert res.full_evaluations == len(res.evaluations) <= (bound if strategy == "bisection" else 2 * bound)
    assert any(e.k == res.chosen_k and e.ok for e in res.evaluations)


def _small():
    from tests.conftest import feeds, small_cnn

    return small_cnn(), feeds(32, 8), feeds(32, 16, seed=9)


def test_time_budget_still_writes_a_valid_model_and_report(tmp_path):
    model, calib, ev = _small()
    auto = AutoConfig(base=base_from_candidate(Candidate("int16", "int8")),
                      candidates=(Candidate("int8", "int4"),), l2_target=1e-9, strategy="greedy",
                      time_budget_s=1e-3)
    res = auto_quantize(model, auto, calib, ev, output_path=tmp_path / "t.onnx",
                        report_dir=tmp_path / "r")
    assert res.timed_out
    onnx.checker.check_model(onnx.load(tmp_path / "t.onnx"), full_check=True)
    assert (tmp_path / "r" / "report.md").exists()


@pytest.mark.parametrize("where", ["report_dir_is_a_file", "output_is_a_report_file", "output_is_a_dir"])
def test_bad_result_paths_are_refused_before_the_search(tmp_path, monkeypatch, where):
    """A report directory that is a file (or a model path the report would overwrite) was found
    after the search, with the model already written; now nothing runs and nothing is written."""
    import mixq.search.auto as auto_mod
    from mixq.errors import OutputError

    model, calib, ev = _small()
    (tmp_path / "file").write_bytes(b"keep")
    (tmp_path / "d").mkdir()
    out, rep = {"report_dir_is_a_file": (tmp_path / "m.onnx", tmp_path / "file"),
                "output_is_a_report_file": (tmp_path / "r" / "report.md", tmp_path / "r"),
                "output_is_a_dir": (tmp_path / "d", tmp_path / "r")}[where]

    def no_search(*a, **k):
        raise AssertionError("the search ran")

    monkeypatch.setattr(auto_mod.Pipeline, "load", no_search)
    auto = AutoConfig(base=base_from_candidate(Candidate("int16", "int8")),
                      candidates=(Candidate("int8", "int4"),), l2_target=0.05, strategy="greedy")
    with pytest.raises(OutputError):
        auto_quantize(model, auto, calib, ev, output_path=out, report_dir=rep)
    assert (tmp_path / "file").read_bytes() == b"keep"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d", "file"]


def test_rerun_with_cache_is_fast_and_identical(tmp_path):
    model, calib, ev = _small()
    auto = AutoConfig(base=base_from_candidate(Candidate("int16", "int8")),
                      candidates=(Candidate("int8", "int4"),), l2_target=0.05, strategy="greedy",
                      cache_dir=str(tmp_path / "cache"))
    t = time.perf_counter()
    a = auto_quantize(model, auto, calib, ev)
    first = time.perf_counter() - t
    t = time.perf_counter()
    b = auto_quantize(model, auto, calib, ev)
    second = time.perf_counter() - t
    assert a.model.SerializeToString() == b.model.SerializeToString()
    assert b.timings["sensitivity"] < 0.2 * max(a.timings["sensitivity"], 1e-3) + 0.05
    assert second < first


def test_auto_cli(tmp_path, capsys):
    from mixq.cli.main import main

    model, calib, ev = _small()
    onnx.save(model, tmp_path / "m.onnx")
    np.savez(tmp_path / "calib.npz", x=np.concatenate([f["x"] for f in calib]))
    np.savez(tmp_path / "eval.npz", x=np.concatenate([f["x"] for f in ev]))
    rc = main(["auto", str(tmp_path / "m.onnx"), str(tmp_path / "o.onnx"),
               "--calib", str(tmp_path / "calib.npz"), "--eval", str(tmp_path / "eval.npz"),
               "--l2-target", "0.05", "--candidates", "int16/int8,int8/int4", "--no-cache",
               "--report-dir", str(tmp_path / "rep")])
    assert rc == 0
    assert "full-model evaluations" in capsys.readouterr().out


def test_missing_target_and_unknown_strategy_are_errors():
    base = base_from_candidate(Candidate("int16", "int8"))
    with pytest.raises(ConfigError, match="target"):
        AutoConfig(base=base, candidates=(Candidate("int8", "int8"),))
    with pytest.raises(ConfigError, match="bisection"):
        AutoConfig(base=base, candidates=(Candidate("int8", "int8"),), l2_target=0.1, strategy="bisect")
    with pytest.raises(ConfigError, match="EvaluateFunction"):
        QuantizationConfig(extra_options={"AutoMixprecision": {"ActTargetQuantType": QuantType.QInt8,
                                                               "Top1AccTarget": 0.1}})
        ModelQuantizer(Config(global_quant_config=QuantizationConfig(extra_options={
            "AutoMixprecision": {"ActTargetQuantType": QuantType.QInt8, "Top1AccTarget": 0.1}})))
