"""The plan is authoritative: it carries the whole config that made it, `--plan` replays it
byte-identically, and a flag that contradicts it is an error. Granularity is a type: per-block
integer weights are reachable from a config."""
from __future__ import annotations

import numpy as np
import onnx
import pytest

import mixq
from mixq.cli.main import main
from mixq.data import default_model_path, load_default_samples
from mixq.errors import ConfigError
from mixq.granularity import PerBlock, PerChannel, PerTensor
from mixq.plan.plan import PrecisionPlan

from ..graphs import model, operand, run


@pytest.fixture(scope="module")
def calib(tmp_path_factory):
    d = tmp_path_factory.mktemp("calib")
    p = d / "calib.npz"
    np.savez(p, image=load_default_samples().calib_images[:16])
    return p


@pytest.mark.parametrize("preset", ["XINT8", "A16W8", "BF16", "MXFP4"])
def test_cli_plan_replay_is_byte_identical(preset, calib, tmp_path):
    m = str(default_model_path())
    plan, a, b = tmp_path / "p.json", tmp_path / "a.onnx", tmp_path / "b.onnx"
    assert main(["plan", m, "--preset", preset, "-o", str(plan)]) == 0
    assert main(["quantize", m, str(a), "--plan", str(plan), "--calib", str(calib)]) == 0
    assert main(["quantize", m, str(b), "--preset", preset, "--calib", str(calib)]) == 0
    assert a.read_bytes() == b.read_bytes()
    # the same preset beside the plan agrees with it
    assert main(["quantize", m, str(b), "--plan", str(plan), "--preset", preset, "--calib", str(calib)]) == 0


def test_cli_plan_with_contradicting_preset_is_an_error(calib, tmp_path, capsys):
    m = str(default_model_path())
    plan, out = tmp_path / "p.json", tmp_path / "out.onnx"
    assert main(["plan", m, "--preset", "XINT8", "-o", str(plan)]) == 0
    capsys.readouterr()
    assert main(["quantize", m, str(out), "--plan", str(plan), "--preset", "BF16", "--calib", str(calib)]) == 2
    err = capsys.readouterr().err
    assert "XINT8" in err and "plan" in err
    assert not out.exists()


def test_plan_json_carries_the_config_and_the_skipped_reasons():
    pipe = mixq.pipeline.Pipeline.load(str(default_model_path()))
    cfg = mixq.get_default_config("XINT8")
    plan = pipe.plan(cfg)
    back = PrecisionPlan.from_json(plan.to_json())
    assert back == plan
    assert mixq.QuantConfig.from_dict(back.config) == cfg
    with pytest.raises(ConfigError, match="XINT8"):
        mixq.quantize(str(default_model_path()), "A8W8", None, plan=back)


def test_granularity_types():
    assert mixq.QuantConfig(per_channel=False).granularity == PerTensor()
    assert mixq.QuantConfig().granularity == PerChannel()
    cfg = mixq.QuantConfig(granularity="per_block:32")
    assert cfg.granularity == PerBlock(32)
    assert mixq.QuantConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ConfigError, match="block size"):
        PerBlock(1)
    with pytest.raises(ConfigError, match="per_channel"):
        mixq.QuantConfig(per_channel="no")


@pytest.mark.parametrize("fmt", ["int4", "uint4", "int16"])
def test_per_block_integer_weights(fmt):
    """PerBlock(32) on a MatMul weight (64 x 16): blocked DequantizeLinear (opset 21), one scale
    per 32 rows of each column; every block is on its own grid."""
    m = model("""<ir_version: 8, opset_import: ["": 17]>
        g (float[4,64] x, float[64,16] W) => (float[4,16] y) { y = MatMul(x, W) }""", W=(64, 16))
    w = onnx.numpy_helper.to_array(m.graph.initializer[0]).copy()
    w[:32] *= 10.0  # the two blocks of a column have very different ranges
    m.graph.initializer[0].CopyFrom(onnx.numpy_helper.from_array(w, "W"))
    fs = [{"x": np.random.default_rng(i).standard_normal((4, 64)).astype(np.float32)} for i in range(3)]
    cfg = mixq.QuantConfig(activation="int8", weight=fmt, granularity=PerBlock(32),
                           activation_symmetric=True, weight_rounding="nearest")  # the grids alone
    res = mixq.quantize(m, cfg, fs)
    assert res.plan.tensors["W"].block_size == 32
    dq = [n for n in res.model.graph.node if n.op_type == "DequantizeLinear" and n.output[0].startswith("W")]
    assert any(a.name == "block_size" and a.i == 32 for a in dq[0].attribute)
    wq = operand(res.model, "MatMul", 1, fs[0])
    bits = mixq.get_format(fmt).bits
    for col in range(16):
        for blk in (wq[:32, col], wq[32:, col]):
            u = np.unique(blk)
            assert u.size <= 2 ** bits
    # per block beats per tensor on the small block
    pt = mixq.quantize(m, cfg.with_options(granularity=PerTensor()), fs)
    err_b = np.abs(operand(res.model, "MatMul", 1, fs[0])[32:] - w[32:]).mean()
    err_t = np.abs(operand(pt.model, "MatMul", 1, fs[0])[32:] - w[32:]).mean()
    assert err_b < err_t / 4
    ref = fs[0]["x"] @ w
    assert np.corrcoef(ref.ravel(), run(res.model, fs[0])[0].ravel())[0, 1] > 0.99


def test_per_block_int8_weights_with_int8_activations_fall_back_with_a_reason():
    """onnxruntime fuses blocked 8-bit weights with 8-bit activations into QLinearMatMul, which
    rejects them at run time: the plan keeps per-channel scales and says why."""
    m = model("""<ir_version: 8, opset_import: ["": 17]>
        g (float[4,64] x, float[64,16] W) => (float[4,16] y) { y = MatMul(x, W) }""", W=(64, 16))
    fs = [{"x": np.random.default_rng(i).standard_normal((4, 64)).astype(np.float32)} for i in range(3)]
    res = mixq.quantize(m, mixq.QuantConfig(weight="int8", granularity=PerBlock(32)), fs)
    tp = res.plan.tensors["W"]
    assert tp.block_size is None and tp.channel_axis == 1 and "not per block" in tp.reason
    run(res.model, fs[0])


def test_summary_opset_is_the_written_models():
    """MXFP8's functions need opset 25: the summary used to say 17 -> 21 above a note saying 25."""
    res = mixq.quantize(str(default_model_path()), "MXFP8_E4M3", None)
    opset = next(i.version for i in res.model.opset_import if i.domain in ("", "ai.onnx"))
    assert f"-> {opset} |" in res.summary() and opset == mixq.get_format("mxfp8_e4m3").onnx_opset > 21


def test_the_upgrade_note_names_no_opset_the_user_never_had():
    """Preparation raises an opset-20 model to 21 before the block formats raise it to 26: the
    note said "upgraded from opset 21 to 26" under a table that says 20 -> 26."""
    m = model("""<ir_version: 9, opset_import: ["": 20]>
        g (float[N,64] x, float[64,64] W) => (float[N,64] y) { y = MatMul(x, W) }""", W=(64, 64))
    res = mixq.quantize(m, "BFP16", [{"x": np.random.default_rng(1).standard_normal((8, 64)).astype(np.float32)}],
                        check_kernels=False)
    lines = [line for line in res.summary().splitlines() if "opset" in line]
    assert "| opset | 20 -> 26 |" in lines and "from opset 21" not in res.summary(), lines
    assert any("upgraded to opset 26" in line for line in lines), lines


def test_every_command_reads_an_npz_keyed_by_sample(calib, tmp_path, capsys):
    """`mixq auto` documents SAMPLE/INPUT keys (00000/image); `quantize` and `eval` read the same
    file, and quantize from it writes the same bytes as from the input-keyed file."""
    m = str(default_model_path())
    x = np.load(calib)
    name = onnx.load(m).graph.input[0].name
    rows = x[name].reshape(-1, *x[name].shape[-3:]) if x[name].ndim == 5 else x[name]
    keyed = tmp_path / "s.npz"
    np.savez(keyed, **{f"{i:05d}/{name}": rows[i] for i in range(len(rows))})  # no batch axis
    a, b = tmp_path / "a.onnx", tmp_path / "b.onnx"
    assert main(["quantize", m, str(a), "--preset", "A8W8", "--calib", str(keyed)]) == 0, capsys.readouterr().err
    np.savez(tmp_path / "rows.npz", **{name: rows[:, None]})  # a stack of one-row feeds, in order
    assert main(["quantize", m, str(b), "--preset", "A8W8", "--calib", str(tmp_path / "rows.npz")]) == 0
    assert a.read_bytes() == b.read_bytes()
    assert main(["eval", m, str(a), "--data", str(keyed)]) == 0
