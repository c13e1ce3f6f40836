"""Every option either changes the output or is an error: an option set away from its preset that
no format of the config reads (a range method under bf16 casts, per-tensor scales under block
formats, reduce_range or bias correction without integer weights, GPTQ's dampening without
integer weights) is a ConfigError naming the option and why, through the API and the CLI.
Before, each was accepted and dropped (`mixq quantize --preset BF16 --calib-method percentile`
wrote the same bytes as without it)."""
from __future__ import annotations

import numpy as np
import pytest

import mixq
from mixq.cli.main import main as cli_main
from mixq.config import PerChannel, PerTensor, QuantConfig, get_default_config
from mixq.data import default_model_path, load_default_samples
from mixq.errors import ConfigError

ALL = set(QuantConfig.SCOPED_OPTIONS)
# the oracle, written from what each option does (docs of QuantConfig), not from why_inert:
# float casts and block formats have no scale, no range, no integer weights
EXPECTED_INERT = {
    # (BF16 quantizes every op, its post-processing tail included where asked; the block
    # presets quantize Conv/Gemm/MatMul inputs only, none of which lies in a tail)
    "BF16": ALL - {"quantize_tail"},
    # a block grid rounds a block's small values to 0 too: policy (b) keeps such weights off
    # it, and kept_weights says how they are stored
    "BFP16": ALL - {"kept_weights"}, "MXFP4": ALL - {"kept_weights"},
    # MinMSE activations (gain 1.5), MinMax int8 weights: percentile needs calibration='percentile'
    "A8W8": {"percentile"},
    "S16S16": {"percentile", "minmse_min_gain"},  # MinMax activations
    # power-of-two activations take no calibrated range (calibration still picks the weights'
    # method: weight_calibration is None), though minmse_min_gain decides when a power-of-two
    # scale clips; range_headroom and output_headroom are refused by the config itself
    "XINT8": {"percentile", "range_headroom", "output_headroom"},
}


def _changed(cfg: QuantConfig, option: str):
    """A value of `option` other than `cfg`'s."""
    v = getattr(cfg, option)
    return {
        "calibration": "percentile" if v != "percentile" else "entropy",
        "percentile": 99.0, "minmse_min_gain": 4.0, "range_headroom": 3.0, "output_headroom": 3.0,
        "weight_calibration": "minmse" if cfg.weight_method == "minmax" else "minmax",
        "power_of_two": "nonoverflow" if v != "nonoverflow" else "minmse",
        "granularity": PerTensor() if isinstance(v, PerChannel) else PerChannel(),
        "gptq_damp": 0.1, "kept_weights": "half" if v == "float" else "float",
    }.get(option, not v if isinstance(v, bool) else v)


@pytest.fixture(scope="module")
def calib():
    return load_default_samples().calib_images[:32]


@pytest.mark.parametrize("option", sorted(ALL))
@pytest.mark.parametrize("preset", sorted(EXPECTED_INERT))
def test_an_option_no_format_reads_is_an_error(preset, option, calib):
    base = get_default_config(preset)
    try:
        cfg = base.with_options(**{option: _changed(base, option)})
        res = mixq.quantize(default_model_path(), cfg, calib, check_kernels=False)
    except ConfigError as exc:
        assert option in EXPECTED_INERT[preset], f"{option} refused under {preset}: {exc}"
        assert option in str(exc) and ("Drop it" in str(exc) or "headroom" in option)
        return
    assert option not in EXPECTED_INERT[preset], f"{option} accepted under {preset}, and no format reads it"
    assert res.model is not None


@pytest.mark.parametrize("flags,says", [
    (["--preset", "BF16", "--calib-method", "percentile"], "--calib-method sets the activations' range method"),
    (["--preset", "BFP16", "--per-tensor"], "--per-channel/--per-tensor changes nothing with BFP16"),
    (["--preset", "BF16", "--reduce-range"], "--reduce-range changes nothing with BF16"),
    (["--preset", "FP16", "--bias-correction"], "--bias-correction changes nothing with FP16"),
    (["--preset", "MXFP4", "--gptq-damp", "0.1"], "--gptq-damp changes nothing with MXFP4"),
    (["--preset", "S16S16", "--minmse-min-gain", "2"], "applies to calibration='minmse', not 'minmax'"),
    (["--preset", "MXINT8", "--quantize-tail"], "quantizes none of it"),
    # XINT8's activations take power-of-two scales: --calib-method would only change the
    # weights' method, through the default weight_calibration, which is not what it says
    (["--preset", "XINT8", "--calib-method", "entropy"], "power-of-two scales follow their own rule"),
])
def test_cli_flags_no_format_reads(flags, says, tmp_path, capsys):
    assert cli_main(["plan", str(default_model_path()), *flags]) == 2
    assert says in capsys.readouterr().err


def test_options_that_apply_change_the_bytes(calib):
    """The other direction on the embedded model: a flag the preset's formats read is accepted
    and changes the written model."""
    def bytes_of(cfg):
        return mixq.quantize(default_model_path(), cfg, calib, check_kernels=False).model.SerializeToString()

    a8 = get_default_config("A8W8")
    ref = bytes_of(a8)
    for change in ({"calibration": "percentile"}, {"granularity": PerTensor()}, {"reduce_range": True},
                   {"weight_calibration": "minmse"}):
        assert bytes_of(a8.with_options(**change)) != ref, change
    assert bytes_of(get_default_config("XINT8").with_options(calibration="minmax")) != \
        bytes_of(get_default_config("XINT8"))  # the weights' method (weight_calibration=None)


@pytest.mark.parametrize("preset,method", [("A8W8", "percentile"), ("A8W8", "minmax"), ("U8S8", "entropy"),
                                           ("S16S16", "minmse")])
def test_cli_calib_method_that_applies_quantizes(preset, method, tmp_path):
    """--calib-method set the MinMSE gain to 1 whatever the method, and quantize then refused that
    implicit change as inert under percentile (the flag worked with `plan`, which stops before)."""
    data = tmp_path / "calib.npy"
    np.save(data, load_default_samples().calib_images[:16])
    out = tmp_path / "o.onnx"
    assert cli_main(["quantize", str(default_model_path()), str(out), "--preset", preset,
                     "--calib-method", method, "--calib", str(data), "-q"]) == 0
    assert out.exists()
