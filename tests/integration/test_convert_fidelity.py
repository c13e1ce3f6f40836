"""The converters' fidelity check never reads as perfect when it compared nothing, and says
loudly when a converted output is broken: outputs that are 0 everywhere (or hold no finite value)
on the evaluation inputs are 'not compared', an output below 10 dB SQNR is a warning, and
``strict`` / ``--strict`` turn either into an error that writes nothing."""
from __future__ import annotations

import math

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from mixq.convert import to_bf16, to_fp16
from mixq.convert.api import BF16_FORMATS
from mixq.convert.testing import check_conversion, to_fp16_model
from mixq.errors import ConfigError, ModelError
from mixq.tools import convert_fp32_to_bf16

from .test_random_graphs import _OP, _TAIL, _build


def _chain(ops: list[tuple[str, list[str], dict]], inits: dict[str, np.ndarray], extra_out=()) -> onnx.ModelProto:
    """x [1,8] -> MatMul(w) -> the ops in order -> y [1,8] (plus `extra_out` (name, type) outputs)."""
    rng = np.random.default_rng(0)
    inits = {"w": (rng.standard_normal((8, 8)) * 0.3).astype(np.float32), **inits}
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h0"], name="mm")]
    src = "h0"
    for k, (op, more, attrs) in enumerate(ops):
        out = "y" if k == len(ops) - 1 else f"h{k + 1}"
        nodes.append(helper.make_node(op, [src, *more], [out], name=f"n{k}", **attrs))
        src = out
    outs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])]
    for name, typ, op, attrs in extra_out:
        nodes.append(helper.make_node(op, ["y"], [name], name=f"to_{name}", **attrs))
        outs.append(helper.make_tensor_value_info(name, typ, [1, 8]))
    g = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])], outs,
                          initializer=[numpy_helper.from_array(v, k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.checker.check_model(m, full_check=True)
    return m


def zero_model() -> onnx.ModelProto:
    """y = Relu(-|x W|): 0 on every input."""
    return _chain([("Abs", [], {}), ("Neg", [], {}), ("Relu", [], {})], {})


def nan_model() -> onnx.ModelProto:
    """y = Sqrt(-(|x W| + 1)): NaN on every input."""
    return _chain([("Abs", [], {}), ("Add", ["one"], {}), ("Neg", [], {}), ("Sqrt", [], {})],
                  {"one": np.array(1.0, np.float32)})


def cancel_model() -> onnx.ModelProto:
    """y = (x W + 300) - 300: bfloat16 keeps 8 significant bits of the offset sum (spacing 2)."""
    big = np.array(300.0, np.float32)
    return _chain([("Add", ["big"], {}), ("Sub", ["big"], {})], {"big": big})


@pytest.mark.parametrize("build", [zero_model, nan_model], ids=["all_zero", "all_nan"])
@pytest.mark.parametrize("fmt", ["with_cast", "simulate_bf16", "fp16"])
def test_nothing_to_compare_is_not_a_perfect_score(build, fmt):
    conv = to_fp16 if fmt == "fp16" else to_bf16
    out, rep = conv(build(), fmt)
    (f,) = rep.fidelity
    assert f.not_compared and math.isnan(f.sqnr_db) and math.isnan(f.cosine)
    assert rep.min_sqnr_db == math.inf  # nothing compared: no worst SQNR either
    (w,) = rep.warnings
    assert "no output was compared" in w and "'y'" in w
    md = rep.to_markdown()
    assert "| y | not compared |" in md and "WARNING: no output was compared" in md
    with pytest.raises(ModelError, match="fails its fidelity check"):
        conv(build(), fmt, strict=True)


def test_a_broken_output_is_a_warning():
    _, rep = to_bf16(cancel_model(), "with_cast")
    (f,) = rep.fidelity
    assert not f.not_compared and f.sqnr_db < 10
    (w,) = rep.warnings
    assert "'y'" in w and "below 10 dB" in w and "simulate_bf16" in w
    with pytest.raises(ModelError, match="'y' reads"):
        to_bf16(cancel_model(), "with_cast", strict=True)
    _, ok = to_fp16(cancel_model(), "with_cast")  # float16 (spacing 0.25 there) holds it
    assert ok.fidelity[0].sqnr_db > 10 and not ok.warnings


def test_a_string_output_is_compared_by_equality():
    """A label output (a Cast to string) was parsed as numbers and scored in dB before."""
    m = _chain([("Relu", [], {})], {}, extra_out=[("s", TensorProto.STRING, "Cast", {"to": TensorProto.STRING})])
    _, rep = to_fp16(m, "fp16")
    by = {f.name: f for f in rep.fidelity}
    assert by["y"].sqnr_db > 20 and not by["y"].not_compared
    # float16 values print differently: every label that is not an exact float16 value differs
    assert by["s"].mismatched > 0 and by["s"].sqnr_db == -math.inf
    assert any("'s' reads" in w and "values unlike the original's" in w for w in rep.warnings)
    same = _chain([("Relu", [], {}), ("Sign", [], {})], {},  # 0 and 1: exact in bfloat16
                  extra_out=[("s", TensorProto.STRING, "Cast", {"to": TensorProto.STRING})])
    _, rep = to_bf16(same, "with_cast")
    by = {f.name: f for f in rep.fidelity}
    assert by["s"].mismatched == 0 and by["s"].sqnr_db == math.inf and not rep.warnings


def test_strict_refuses_failures_not_an_output_left_out_beside_compared_ones():
    """An output 0 on every input beside one that is compared (a mask beside the logits): the
    report says it was not compared, and strict, which refuses what fails the check, keeps the
    model (it refused it before, against its help text)."""
    m = _chain([("Relu", [], {})], {"zero": np.array(0.0, np.float32)})
    m.graph.node.append(helper.make_node("Mul", ["y", "zero"], ["z"], name="mask"))
    m.graph.output.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 8]))
    _, rep = to_bf16(m, "with_cast", strict=True)
    assert not rep.failures and rep.warnings == ["not compared: 'z': " + rep.fidelity[1].not_compared]
    assert "WARNING: not compared: 'z'" in rep.to_markdown()


def test_a_conversion_not_evaluated_says_so():
    """With evaluate=False (--no-eval) the report had no fidelity section and said nothing."""
    _, rep = to_bf16(zero_model(), "with_cast", evaluate=False)
    assert not rep.fidelity and "Fidelity: not checked (evaluate=False, --no-eval)" in rep.to_markdown()
    _, rep = to_bf16(cancel_model(), "with_cast")
    assert "not checked" not in rep.to_markdown()


def test_strict_needs_the_fidelity_check():
    with pytest.raises(ConfigError, match="evaluate=False"):
        to_bf16(zero_model(), "with_cast", evaluate=False, strict=True)


def test_cli_warns_on_stderr_and_strict_writes_nothing(tmp_path, capsys):
    src = tmp_path / "zero.onnx"
    onnx.save(zero_model(), str(src))
    out = tmp_path / "out.onnx"
    assert convert_fp32_to_bf16.main(["-i", str(src), "-o", str(out)]) == 0
    cap = capsys.readouterr()
    assert "warning: no output was compared" in cap.err and out.exists()
    strict = tmp_path / "strict.onnx"
    assert convert_fp32_to_bf16.main(["-i", str(src), "-o", str(strict), "--strict"]) == 2
    assert "fails its fidelity check (strict)" in capsys.readouterr().err and not strict.exists()
    assert convert_fp32_to_bf16.main(["-i", str(src), "-o", str(strict), "--strict", "--no-eval"]) == 2
    assert "--no-eval" in capsys.readouterr().err and not strict.exists()


_FORMATS = [*BF16_FORMATS, "fp16", "fp16:with_cast", "simulate_fp16"]


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow],
          phases=[Phase.explicit, Phase.reuse, Phase.generate], derandomize=True)
@given(ops=st.lists(_OP, min_size=1, max_size=6), c=st.integers(1, 5), hw=st.integers(2, 6),
       seed=st.integers(0, 1000), tail=st.lists(st.sampled_from(_TAIL), max_size=3), fp16_source=st.booleans())
# a graph whose output is 0 on every input: read as SQNR inf, cosine 1 ("perfect") before
@example(ops=[("MaxPool", 0), ("BN", 0), ("ConvTBiasBN", 1), ("Relu", 0), ("ShapeScale", 0),
              ("GlobalAveragePool", 0)], c=1, hw=2, seed=11, tail=["MulConst"], fp16_source=False)
@pytest.mark.parametrize("fmt", _FORMATS)
def test_random_graphs_convert_run_and_report_honestly(fmt, ops, c, hw, seed, tail, fp16_source):
    """Every format converts any graph the quantizer's property test draws, the result passes
    check_conversion (checker, runs, keeps its signature and its format's structure), and each
    output is either scored or says why not, with a warning when none was."""
    m = _build(ops, ["t"], c, hw, seed, tail)
    if fp16_source and fmt in BF16_FORMATS:
        try:
            m = to_fp16_model(m)
        except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError):  # shape arithmetic in float: no float16 twin to test
            pass
    _, rep = check_conversion(m, fmt, min_sqnr_db=None, min_cosine=None)
    for f in rep.fidelity:
        assert f.not_compared or not math.isnan(f.sqnr_db), f
    if all(f.not_compared for f in rep.fidelity):
        assert any("no output was compared" in w for w in rep.warnings)
