"""Determinism: the same input, config and data give the same output bytes on a rerun in another
process, and for calibration batch sizes 1, 7 and 32."""
from __future__ import annotations

import hashlib
import subprocess
import sys

import numpy as np
import pytest

import mixq

from . import models as M

PRESETS = ["A8W8", "MXFP4", "BFP16"]  # an int preset and block presets


@pytest.fixture(scope="module")
def calib(tmp_path_factory):
    d = tmp_path_factory.mktemp("det")
    m = M.seq_block()
    p = d / "model.onnx"
    p.write_bytes(m.SerializeToString())
    x = np.random.default_rng(3).standard_normal((64, 5, M.D)).astype(np.float32)
    np.save(d / "calib.npy", x)  # [64, 5, 16]: rank 3 = one batch of 64 rows, cut by batch_size
    return p, d / "calib.npy", x


_CHILD = """
import hashlib, sys, mixq
res = mixq.quantize(sys.argv[1], sys.argv[2], sys.argv[3], output_path=sys.argv[4])
print(hashlib.sha256(open(sys.argv[4], 'rb').read()).hexdigest())
"""


@pytest.mark.parametrize("preset", PRESETS)
def test_rerun_in_separate_processes_gives_same_bytes(preset, calib, tmp_path):
    model, data, _ = calib
    digests = []
    for i in range(2):
        out = tmp_path / f"q{i}.onnx"
        p = subprocess.run([sys.executable, "-c", _CHILD, str(model), preset, str(data), str(out)],
                           capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr[-2000:]
        digests.append(p.stdout.strip().splitlines()[-1])
    assert digests[0] == digests[1]
    here = mixq.quantize(str(model), preset, str(data), check_kernels=False).model.SerializeToString()
    assert hashlib.sha256(here).hexdigest() == digests[0]


@pytest.mark.parametrize("method", ["minmax", "percentile", "entropy", "minmse"])
@pytest.mark.parametrize("preset", PRESETS)
def test_batch_size_does_not_change_output(preset, method, calib):
    model, _, x = calib
    cfg = mixq.get_default_config(preset)
    if cfg.activation.startswith("int") or cfg.activation.startswith("uint"):
        cfg = cfg.with_options(calibration=method)
    elif method != "minmax":
        pytest.skip("block presets calibrate nothing")
    outs = set()
    for bs in (1, 7, 32):
        feeds = [{"x": x[i:i + bs]} for i in range(0, len(x), bs)]
        outs.add(mixq.quantize(str(model), cfg, feeds, check_kernels=False).model.SerializeToString())
    assert len(outs) == 1


def test_a_model_that_draws_random_values_gives_the_same_bytes_in_another_process(tmp_path):
    """onnxruntime draws unseeded random values from a seed of its own per process: a VAE's
    calibration statistics, and its quantized bytes, changed from one run of the same command
    to the next. Every session mixq computes with seeds its random ops (`evaluate.seeded_source`);
    the written model keeps them unseeded."""
    from ..graphs import vae_decoder

    m, feeds = vae_decoder()
    model = tmp_path / "vae.onnx"
    model.write_bytes(m.SerializeToString())
    data = tmp_path / "calib.npy"
    np.save(data, np.concatenate([f["x"] for f in feeds]))
    digests = []
    for i in range(2):
        out = tmp_path / f"q{i}.onnx"
        p = subprocess.run([sys.executable, "-c", _CHILD, str(model), "A8W8", str(data), str(out)],
                           capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr[-2000:]
        digests.append(p.stdout.strip().splitlines()[-1])
    assert digests[0] == digests[1]
