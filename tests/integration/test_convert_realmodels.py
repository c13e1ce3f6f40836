"""The BF16 converter on PP-OCRv4 rec (a real model that is not ours, from the rapidocr wheel):
the `bf16` output loads and runs in onnxruntime CPU with its default graph optimizations, and the
fidelity of every bf16 format on rendered text lines (issue 18)."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from mixq.convert import to_bf16
from mixq.convert.report import sqnr_db
from tests import realmodels

pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.skipif(not realmodels.have_ppocr_models(), reason=realmodels.RAPIDOCR_PIP)]


@pytest.fixture(scope="module")
def rec():
    path = str(realmodels.ppocr_rec_model_path())
    ev, texts = realmodels.rec_inputs("eval", 8, with_texts=True)
    return path, ev, texts


def _run(model, x: np.ndarray) -> np.ndarray:
    so = ort.SessionOptions()  # onnxruntime's defaults: every graph optimization on (fusions included)
    so.log_severity_level = 3
    assert so.graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    data = model if isinstance(model, str) else model.SerializeToString()
    return ort.InferenceSession(data, so, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def test_bf16_rec_loads_and_runs_on_cpu_with_default_optimizations(rec):
    path, ev, texts = rec
    out, rep = to_bf16(path, "bf16", feeds={"x": ev[:4]})
    got = _run(out, ev)
    ref = _run(path, ev)
    s = sqnr_db(ref, got)
    # measured 32.3 dB (26.0 before one-element weights stayed float32); report and direct run agree
    assert s >= 28.0 and abs(rep.min_sqnr_db - sqnr_db(ref[:4], got[:4])) < 1e-3, (s, rep.min_sqnr_db)
    md = rep.to_markdown()
    assert "SQNR" in md and "written-out normalization" in md  # the 5 LayerNorms of the SVTR neck
    decoded = realmodels.ctc_greedy_decode(got, realmodels.rec_charset(path))
    assert realmodels.char_accuracy(decoded, texts) >= 0.95


@pytest.mark.parametrize("fmt,floor", [("with_cast", 25.5), ("customqdq", 25.5), ("simulate_bf16", 29.0)])
def test_rec_fidelity_per_format(rec, fmt, floor):
    """Measured on these lines: with_cast/customqdq 26.2 dB (24.4 before), simulate_bf16 31.2 dB
    (26.0 before). Not the 35 dB the issue asks: rounding only the Conv/MatMul weights of this
    model to bfloat16 already gives 32.6 dB (see docs/BF16.md)."""
    path, ev, _ = rec
    out, rep = to_bf16(path, fmt, feeds={"x": ev[:4]})
    assert rep.min_sqnr_db >= floor, rep.to_markdown()
