"""An input model that is already quantized (onnxruntime's QDQ or QOperator output, a mixq output,
Q/DQ inside a subgraph or a model-local function) is refused with a ModelError naming what it
holds, by every command that would quantize or convert it again; before, `mixq quantize` folded
the int8 weights' DequantizeLinear back to float, put them on new grids and added its own Q/DQ
pairs beside the ones there (a runnable model, rounded twice, with a summary that called the
old pairs "left float")."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import mixq
from mixq.check import check_model_support
from mixq.cli.main import main as cli_main
from mixq.convert import to_bf16
from mixq.errors import ModelError
from mixq.passes.prepare import quantized_nodes

from . import models as M
from .conftest import outcome

MATCH = r"already quantized: it holds \d+ x "


class _Reader:
    def __init__(self, feeds: list[dict]) -> None:
        self.it = iter(feeds)

    def get_next(self):
        return next(self.it, None)


def _ort(fmt: str) -> onnx.ModelProto:
    from onnxruntime.quantization import QuantFormat, quantize_static

    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as d:
        src, dst = Path(d) / "f.onnx", Path(d) / "q.onnx"
        onnx.save(M.mlp(), src)
        quantize_static(str(src), str(dst), _Reader(M.feeds(M.mlp(), 4)),
                        quant_format=QuantFormat.QDQ if fmt == "qdq" else QuantFormat.QOperator)
        return onnx.load(dst)


def _mixq(preset: str) -> onnx.ModelProto:
    return mixq.quantize(M.mlp(), preset, M.feeds(M.mlp(), 4)).model


def _qdq_in_branch() -> onnx.ModelProto:
    """The If model with a QuantizeLinear -> DequantizeLinear pair in its then-branch only."""
    m = M.if_model()
    then = next(a.g for a in next(n for n in m.graph.node if n.op_type == "If").attribute
                if a.name == "then_branch")
    then.initializer.extend([numpy_helper.from_array(np.array(0.05, np.float32), "s")])
    mm = then.node[0]
    mm.output[0] = "t_mm"
    then.node.extend([helper.make_node("QuantizeLinear", ["t_mm", "s"], ["t_q"], name="branch_q"),
                      helper.make_node("DequantizeLinear", ["t_q", "s"], ["t_out"], name="branch_dq")])
    return m


def _qdq_in_function() -> onnx.ModelProto:
    """The custom-function model whose function body quantizes its input and back."""
    m = M.custom_function_model()
    fn = m.functions[0]
    body = [helper.make_node("Constant", [], ["s"], value=numpy_helper.from_array(np.array(0.05, np.float32))),
            helper.make_node("QuantizeLinear", ["a", "s"], ["q"]),
            helper.make_node("DequantizeLinear", ["q", "s"], ["aq"]),
            helper.make_node("Sigmoid", ["aq"], ["sa"]), helper.make_node("Mul", ["aq", "sa"], ["b"])]
    del fn.node[:]
    fn.node.extend(body)
    return m


QUANTIZED = {"ort_qdq": lambda: _ort("qdq"), "ort_qoperator": lambda: _ort("qop"),
             "mixq_A8W8": lambda: _mixq("A8W8"), "mixq_BFP16": lambda: _mixq("BFP16"),
             "qdq_in_if_branch": _qdq_in_branch, "qdq_in_function": _qdq_in_function}


@pytest.fixture(scope="module", params=sorted(QUANTIZED))
def quantized(request, tmp_path_factory):
    m = QUANTIZED[request.param]()
    p = tmp_path_factory.mktemp(request.param) / "q.onnx"
    onnx.save(m, p)
    return request.param, m, p


def test_quantize_refuses_a_quantized_model_and_writes_nothing(quantized, tmp_path):
    name, m, p = quantized
    feeds = M.feeds(M.mlp(), 3)
    out = tmp_path / "o.onnx"
    err = outcome(lambda: mixq.quantize(p, "A8W8", feeds, output_path=out), input_path=p, output_path=out,
                  expect_error=ModelError, match=MATCH)
    assert not out.exists()
    # a block format's functions are mixq's own (integer QDQ is anyone's)
    assert ("a mixq output" in str(err)) == (name == "mixq_BFP16")
    # in memory, and for a block preset (no calibration) too
    outcome(lambda: mixq.quantize(m, "BFP16"), expect_error=ModelError, match=MATCH)


def test_every_command_refuses_it(quantized, tmp_path, capsys):
    name, m, p = quantized
    out = tmp_path / "o.onnx"
    assert cli_main(["quantize", str(p), str(out), "--preset", "BF16"]) != 0
    assert "already quantized" in capsys.readouterr().err and not out.exists()
    with pytest.raises(ModelError, match=MATCH + ".*mixq converts float models"):
        to_bf16(m, "with_cast")
    rep = check_model_support(m)
    assert any("already quantized" in p for p in rep.problems), rep.problems


def test_the_documented_api_refuses_it(quantized, tmp_path):
    pytest.importorskip("torch")
    from mixq.compat import Config, ModelQuantizer, get_default_config

    _, _, p = quantized
    q = ModelQuantizer(Config(global_quant_config=get_default_config("A8W8")))
    with pytest.raises(ModelError, match=MATCH):
        q.quantize_model(str(p), str(tmp_path / "o.onnx"), _Reader(M.feeds(M.mlp(), 3)))
    assert not (tmp_path / "o.onnx").exists()


@pytest.mark.parametrize("builder", [M.mlp, M.seq_block, M.if_model, M.loop_model, M.custom_function_model,
                                     M.contrib_op_model])
def test_float_models_hold_no_quantized_node(builder):
    """Float models, onnxruntime contrib ops (com.microsoft.Gelu) and functions included."""
    assert quantized_nodes(builder()) == []


def test_contrib_ops_that_only_start_with_q_are_float():
    m = M.contrib_op_model()
    next(n for n in m.graph.node if n.op_type == "Gelu").op_type = "QuickGelu"
    assert quantized_nodes(m) == []
    next(n for n in m.graph.node if n.op_type == "QuickGelu").op_type = "QLinearSigmoid"
    assert [op for _, op in quantized_nodes(m)] == ["com.microsoft.QLinearSigmoid"]
