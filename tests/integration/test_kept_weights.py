"""`kept_weights`: the weights a numerics policy keeps off their integer or block grid, stored
in a 16-bit float ('half') instead of float32 ('float', the presets' default); `mixq auto` uses
'half' by default.

Silero VAD's STFT basis (66048 weights) was the case: policy (b) keeps it off the int8 grid
(its filters' stopbands feed a Sqrt), so every plan of `mixq auto` stored it in float32 and the
search's answer (887 kB) was larger than uniform BF16 (884 kB), which stores it in bfloat16.
"""
from __future__ import annotations

import numpy as np
import onnx
import pytest

import mixq
import mixq.plan.numerics
from mixq.errors import ConfigError
from mixq.plan.numerics import FP16_SAFE_ABSMAX, half_float_for
from mixq.search import AutoConfig, Candidate, auto_quantize

from ..graphs import compare, constant_q, stft_frontend

FILTERS = {f"fb{k}" for k in range(10)}


def _elems(m: onnx.ModelProto, names: set[str]) -> int:
    return sum(int(np.prod(t.dims)) for t in m.graph.initializer if t.name in names)


def _init_types(m: onnx.ModelProto) -> dict[str, int]:
    return {t.name: t.data_type for t in m.graph.initializer}


def _stored(m: onnx.ModelProto, name: str) -> int:
    """The element type a weight is stored in: the initializer itself (float32 as it came), or
    the one a Cast reads (a 16-bit float)."""
    types = _init_types(m)
    if name in types:
        return types[name]
    cast = next(n for n in m.graph.node if n.op_type == "Cast" and n.output[0].startswith(name))
    return types[cast.input[0]]


def _with_noise_floor(feeds, level: float = 0.01):
    """The constant-Q recordings with a broadband noise floor: the filters' stopband outputs sit
    on it, no longer on the leakage of the loud bins alone."""
    rng = np.random.default_rng(0)
    return [{"x": (f["x"] + level * rng.standard_normal(f["x"].shape)).astype(np.float32)} for f in feeds]


@pytest.mark.parametrize("preset", ["A8W8", "A16W8"])
def test_half_stores_the_filters_a_policy_keeps_in_float16(preset):
    """Over a noise floor, the constant-Q front end's filters are still kept off the integer
    grid by (b) (the noise its 8-bit weights add hides the quiet bins its Sqrt and Log read),
    and float16 passes the same rule: 'float' stores them as they came, 'half' in float16, at
    half the bytes."""
    m, feeds = constant_q()
    feeds = _with_noise_floor(feeds)
    kept = mixq.quantize(m, preset, feeds, check_kernels=False)
    cfg = mixq.get_default_config(preset).with_options(kept_weights="half")
    half = mixq.quantize(m, cfg, feeds, check_kernels=False)
    assert all(kept.plan.tensors[f].format is None for f in FILTERS)
    assert all(half.plan.tensors[f].format == "fp16" for f in FILTERS), \
        {f: half.plan.tensors[f].format for f in FILTERS}
    assert all("kept in fp16 (kept_weights='half')" in half.plan.tensors[f].reason for f in FILTERS)
    assert {f.tensor: f.kept for f in half.numerics if f.tensor in FILTERS} == dict.fromkeys(FILTERS, "fp16")
    assert "- kept fp16 (small_values): fb0:" in half.summary()
    assert all(_stored(kept.model, f) == onnx.TensorProto.FLOAT for f in FILTERS)
    assert all(_stored(half.model, f) == onnx.TensorProto.FLOAT16 for f in FILTERS)
    pipe = mixq.Pipeline.load(m)
    saved = pipe.size_bytes(kept.plan) - pipe.size_bytes(half.plan)
    assert saved == pytest.approx(2.0 * _elems(m, FILTERS))
    # measured: 43.9 -> 42.7 dB (A8W8), 56.7 -> 48.5 (A16W8)
    assert compare(m, half.model, feeds).first().sqnr_db >= (45.0 if preset == "A16W8" else 40.0)


def test_half_leaves_float32_where_float16_would_hide_the_quiet_bins_too():
    """Pure tones, no noise floor: the stopband outputs are the loud bins' leakage alone, and
    float16's rounding (relative to the weights, not to the outputs: a cancellation) still
    hides them: (b)'s rule, judged again in float16, keeps the filters in float32. Forced into
    float16 they cost 18 dB."""
    m, feeds = constant_q()
    cfg = mixq.get_default_config("A8W8")
    kept = mixq.quantize(m, cfg, feeds, check_kernels=False)
    half = mixq.quantize(m, cfg.with_options(kept_weights="half"), feeds, check_kernels=False)
    assert all(half.plan.tensors[f].format is None for f in FILTERS)
    assert half.model.SerializeToString() == kept.model.SerializeToString()
    forced = mixq.quantize(m, cfg.with_options(tensor_formats=dict.fromkeys(FILTERS, "fp16")), feeds,
                           check_kernels=False)
    db = {k: compare(m, r.model, feeds).first().sqnr_db for k, r in (("kept", kept), ("forced", forced))}
    assert db["forced"] < db["kept"] - 10.0, db


def test_half_keeps_a_matmul_weight_whose_input_is_float_off_matmulnbits(monkeypatch):
    """The filterbank MatMul of the STFT front end reads the float power spectrum: its weight
    is kept float so that onnxruntime cannot run DequantizeLinear(int8) -> MatMul as
    MatMulNBits (which quantizes the float input on the fly, and wrote NaN). In float16 it
    stays a Cast -> MatMul: finite and close to float with every optimization level. ((b)'s
    operand rule, which keeps it float too, is switched off: this rule alone.)"""
    monkeypatch.setattr(mixq.plan.numerics, "layer_noise", lambda *a: (lambda n: []))
    m, calib, fresh = stft_frontend()
    res = mixq.quantize(m, mixq.get_default_config("A8W8").with_options(kept_weights="half"), calib,
                        check_kernels=False)
    fb = res.plan.tensors["fb"]
    assert fb.format == "fp16" and "kept in fp16" in fb.reason, fb
    f = mixq.evaluate.make_session(m)
    ref = np.concatenate([f.run(None, x)[0].ravel() for x in fresh])
    for optimize in (True, "basic"):
        s = mixq.evaluate.make_session(res.model, optimize=optimize)
        got = np.concatenate([s.run(None, x)[0].ravel() for x in fresh])
        assert np.all(np.isfinite(got))
        assert float(got @ ref / np.linalg.norm(got) / np.linalg.norm(ref)) > 0.999


@pytest.mark.parametrize("values, want", [
    (np.linspace(-2.0, 2.0, 101), "fp16"),
    (np.zeros(8), "fp16"),
    (np.array([1.0, -3.0, FP16_SAFE_ABSMAX * 2]), "bf16"),  # past float16's safe range
    (np.full(64, 1e-9), "bf16"),  # under float16's subnormals: the cast would lose it all
    (np.array([1.0, 3e38]), "bf16"),
    (np.array([1.0, np.inf]), None),  # a sentinel: no rounding may move it
    (np.array([1.0, np.nan]), None),
    (np.array([1.0, 3.4e38]), None),  # rounds past bfloat16's largest finite value
])
def test_half_float_for_picks_the_format_that_holds_the_weight(values, want):
    assert half_float_for(np.asarray(values, np.float32)) == want


def test_kept_weights_is_checked():
    with pytest.raises(ConfigError, match="kept_weights='halve'.*choose one of float, half"):
        mixq.QuantConfig(kept_weights="halve")
    with pytest.raises(ConfigError, match="kept_weights='fp16'"):
        AutoConfig(base=mixq.get_default_config("A16W8"), candidates=(Candidate("int8", "int8"),),
                   l2_target=0.1, kept_weights="fp16")
    cfg = mixq.get_default_config("BF16").with_options(kept_weights="half")
    assert "no weight format is an integer or block grid" in cfg.why_inert("kept_weights")
    off = mixq.get_default_config("A8W8").with_options(kept_weights="half", numerics_policies=False)
    assert "numerics_policies=False" in off.why_inert("kept_weights")
    assert mixq.get_default_config("MXINT8").why_inert("kept_weights") is None


def test_the_cli_flag_changes_the_output_or_says_it_cannot(tmp_path, capsys):
    from mixq.cli.main import main

    m, feeds = constant_q()
    feeds = _with_noise_floor(feeds)
    src, data = tmp_path / "m.onnx", tmp_path / "calib.npz"
    onnx.save(m, src)
    np.savez(data, x=np.concatenate([f["x"] for f in feeds]))
    outs = {}
    for kept in ("float", "half"):
        out = tmp_path / f"{kept}.onnx"
        assert main(["quantize", str(src), str(out), "--calib", str(data), "--preset", "A8W8",
                     "--kept-weights", kept]) == 0
        outs[kept] = onnx.load(out)
    assert _stored(outs["float"], "fb0") == onnx.TensorProto.FLOAT
    assert _stored(outs["half"], "fb0") == onnx.TensorProto.FLOAT16
    assert main(["quantize", str(src), str(tmp_path / "x.onnx"), "--calib", str(data), "--preset", "BF16",
                 "--kept-weights", "half"]) == 2
    assert "--kept-weights changes nothing with BF16" in capsys.readouterr().err
    assert not (tmp_path / "x.onnx").exists()


def test_auto_measures_its_plans_with_the_kept_filters_in_float16():
    """Every plan of the search stores the filters (b) keeps off the grid in float16 by
    default: the result is smaller by their half bytes, and its reported metric is the written
    model's; kept_weights='float' gives the float32 filters back."""
    m, feeds = constant_q()
    feeds = _with_noise_floor(feeds)
    calib, held = feeds[:6], feeds[6:]
    base = mixq.get_default_config("A16W8")
    runs = {}
    for kept in ("half", "float"):
        auto = AutoConfig(base=base, candidates=(Candidate("int8", "int8"),), metric="sqnr", target=30.0,
                          kept_weights=kept)
        runs[kept] = auto_quantize(m, auto, calib, held)
    half, flt = runs["half"], runs["float"]
    assert all(half.plan.tensors[f].format == "fp16" for f in FILTERS)
    assert all(flt.plan.tensors[f].format is None for f in FILTERS)
    assert half.target_met and flt.target_met
    assert flt.size_bytes - half.size_bytes >= 2.0 * _elems(m, FILTERS) - 1e-6
    got = compare(m, half.model, held).first().sqnr_db
    assert got == pytest.approx(half.metric, abs=0.05) and got >= 30.0
