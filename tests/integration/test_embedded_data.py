"""The embedded default model/data (mixq.data) and the real-model test helpers."""
from __future__ import annotations

import time

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from mixq.data import (
    DefaultSamples,
    default_model_path,
    default_samples_path,
    load_default_samples,
)
from tests import realmodels as rm

# Measured by scripts/train_embedded.py (onnxruntime, float32) on the 500
# shipped test images; the test recomputes it from the arrays.
EMBEDDED_FLOAT_CORRECT = 463  # 92.6% top-1
EMBEDDED_N_TEST = 500

# Float PP-OCR cls accuracy measured on cls_inputs("eval", 64, seed) for seeds
# 0, 1, 2: 1.000 each (calib split: 0.984-1.000). Threshold leaves a margin.
CLS_FLOAT_MIN_ACC = 0.90
# Float PP-OCRv4 rec character accuracy on rec_inputs("eval", 32, seed), seeds
# 0-2: 1.000 each. Threshold leaves a margin.
REC_FLOAT_MIN_CHAR_ACC = 0.90


def _session(path) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


# ----------------------------------------------------------------------------- embedded
def test_default_model_is_valid_onnx():
    path = default_model_path()
    assert path.is_file() and path.name == "fashion_cnn.onnx"
    assert path.stat().st_size < 1_000_000
    model = onnx.load(str(path))
    onnx.checker.check_model(model, full_check=True)
    assert {(o.domain, o.version) for o in model.opset_import} == {("", 17)}
    (inp,) = model.graph.input
    (out,) = model.graph.output
    assert inp.name == "image" and out.name == "logits"
    assert [d.dim_param or d.dim_value for d in inp.type.tensor_type.shape.dim] == ["N", 1, 28, 28]
    assert [d.dim_param or d.dim_value for d in out.type.tensor_type.shape.dim] == ["N", 10]
    ops = [n.op_type for n in model.graph.node]
    # BN must stay un-folded (mixq's folding pass needs something to fold).
    assert ops.count("Conv") == ops.count("BatchNormalization") == 6
    for op in ("Relu", "Add", "MaxPool", "GlobalAveragePool", "Flatten", "Gemm", "Sub", "Mul"):
        assert op in ops, op
    n_params = sum(int(np.prod(t.dims)) for t in model.graph.initializer)
    assert 50_000 <= n_params <= 150_000


def test_default_samples_shapes_and_ranges():
    s = load_default_samples()
    assert isinstance(s, DefaultSamples)
    assert default_samples_path().stat().st_size < 2_000_000
    assert s.calib_images.shape == (256, 1, 28, 28)
    assert s.test_images.shape == (500, 1, 28, 28)
    for a in (s.calib_images, s.test_images):
        assert a.dtype == np.float32
        assert a.min() >= 0.0 and a.max() <= 1.0 and a.max() > 0.9
        assert not a.flags.writeable
    assert s.test_labels.dtype == np.int64 and s.test_labels.shape == (500,)
    assert set(np.unique(s.test_labels)) <= set(range(10))
    assert len(np.unique(s.test_labels)) == 10
    assert s.class_names.shape == (10,) and s.class_names[0] == "T-shirt/top"
    # calibration (train split) and test (test split) images share nothing
    calib = {a.tobytes() for a in s.calib_images}
    assert not any(a.tobytes() in calib for a in s.test_images)
    assert load_default_samples() is s  # cached


def test_default_model_float_top1():
    s = load_default_samples()
    logits = _session(default_model_path()).run(["logits"], {"image": s.test_images})[0]
    assert logits.shape == (500, 10) and logits.dtype == np.float32
    correct = int((logits.argmax(1) == s.test_labels).sum())
    assert correct == EMBEDDED_FLOAT_CORRECT, f"{correct}/500"
    assert correct / EMBEDDED_N_TEST >= 0.90


# ----------------------------------------------------------------------------- real models
needs_ppocr = pytest.mark.skipif(
    not rm.have_ppocr_models(), reason=f"PP-OCR models not installed: {rm.RAPIDOCR_PIP}")
needs_font = pytest.mark.skipif(
    not rm._DEJAVU.is_file(), reason=f"DejaVu font not installed: {rm.FONT_APT}")


def test_missing_model_error_names_pip_line(monkeypatch):
    monkeypatch.setattr(rm.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(rm.ModelNotInstalled, match="pip install --no-deps rapidocr-onnxruntime"):
        rm.ppocr_cls_model_path()


@needs_ppocr
def test_ppocr_models_are_located():
    for fn, opset in ((rm.ppocr_cls_model_path, 11), (rm.ppocr_rec_model_path, 12),
                      (rm.ppocr_det_model_path, 12)):
        m = onnx.load(str(fn()), load_external_data=False)
        assert m.graph.input[0].name == "x"
        assert {o.version for o in m.opset_import if o.domain in ("", "ai.onnx")} == {opset}
    assert len(rm.rec_charset()) == 6625


def test_sentence_splits_are_disjoint():
    calib, ev = set(rm.sentences("calib")), set(rm.sentences("eval"))
    assert len(calib) >= 40 and len(ev) >= 15
    assert not calib & ev
    assert not set(rm._line_pool("calib")) & set(rm._line_pool("eval"))
    with pytest.raises(ValueError):
        rm.sentences("train")


@needs_font
def test_ocr_inputs_are_deterministic_and_fast():
    t0 = time.perf_counter()
    imgs = rm.ocr_line_images(64, seed=0, split="calib")
    elapsed = time.perf_counter() - t0
    assert elapsed < 10.0  # ~0.25 s on 2 cores
    assert len(imgs) == 64 and all(i.dtype == np.uint8 and i.ndim == 3 and i.shape[2] == 3 for i in imgs)
    again = rm.ocr_line_images(64, seed=0, split="calib")
    assert all(np.array_equal(a, b) for a, b in zip(imgs, again))
    other = rm.ocr_line_images(8, seed=1, split="calib")
    assert not all(np.array_equal(a, b) for a, b in zip(imgs[:8], other))

    x1, l1 = rm.cls_inputs("eval", 16, with_labels=True)
    x2, l2 = rm.cls_inputs("eval", 16, with_labels=True)
    assert x1.shape == (16, 3, 48, 192) and x1.dtype == np.float32
    assert np.array_equal(x1, x2) and np.array_equal(l1, l2)
    assert l1.tolist() == [0, 1] * 8
    assert x1.min() >= -1.0 and x1.max() <= 1.0

    r1, t1 = rm.rec_inputs("eval", 8, with_texts=True)
    r2 = rm.rec_inputs("eval", 8)
    assert r1.shape == (8, 3, 48, 320) and np.array_equal(r1, r2)
    assert set(t1) <= set(rm._line_pool("eval"))
    assert rm.rec_inputs("calib", 2, width=256).shape == (2, 3, 48, 256)


@needs_ppocr
@needs_font
def test_float_cls_model_tells_upright_from_rotated():
    x, labels = rm.cls_inputs("eval", 64, seed=0, with_labels=True)
    probs = _session(rm.ppocr_cls_model_path()).run(None, {"x": x})[0]
    assert probs.shape == (64, 2)
    acc = float((probs.argmax(1) == labels).mean())
    assert acc >= CLS_FLOAT_MIN_ACC, acc


@needs_ppocr
@needs_font
def test_float_rec_model_reads_the_lines():
    x, texts = rm.rec_inputs("eval", 16, seed=0, with_texts=True)
    probs = _session(rm.ppocr_rec_model_path()).run(None, {"x": x})[0]
    assert probs.shape == (16, 40, 6625)
    decoded = rm.ctc_greedy_decode(probs)
    acc = rm.char_accuracy(decoded, texts)
    assert acc >= REC_FLOAT_MIN_CHAR_ACC, list(zip(texts, decoded))


def test_ctc_decode_and_char_accuracy():
    charset = ("blank", "a", "b", " ")
    probs = np.eye(4, dtype=np.float32)[[[1, 1, 0, 1, 2, 2, 3, 0]]]
    assert rm.ctc_greedy_decode(probs, charset) == ["aab "]
    assert rm.edit_distance("kitten", "sitting") == 3
    assert rm.char_accuracy(["aab "], ["aab"]) == 1.0
    assert rm.char_accuracy(["ab"], ["abcd"]) == 0.5
