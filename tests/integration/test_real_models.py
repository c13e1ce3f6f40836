"""The static quantizer and the BF16/FP16 converters on real pretrained models that are not ours
(PP-OCR text-direction classifier and PP-OCRv4 recognizer, from the rapidocr wheel) and on the
embedded Fashion-MNIST CNN, with real inputs (rendered text lines, Fashion-MNIST test images)."""
from __future__ import annotations

import numpy as np
import onnx
import pytest

import mixq
from mixq.convert.testing import check_conversion
from mixq.data import default_model_path, load_default_samples
from mixq.evaluate import compare, make_session
from tests import realmodels

needs_ppocr = pytest.mark.skipif(not realmodels.have_ppocr_models(),
                                 reason="pip install --no-deps rapidocr-onnxruntime==1.4.4")


@pytest.fixture(scope="module")
def cls():
    path = str(realmodels.ppocr_cls_model_path())
    x = realmodels.cls_inputs("calib", 16)
    ev, labels = realmodels.cls_inputs("eval", 32, with_labels=True)
    return path, [{"x": x[i:i + 8]} for i in range(0, 16, 8)], ev, labels


@pytest.fixture(scope="module")
def rec():
    path = str(realmodels.ppocr_rec_model_path())
    x = realmodels.rec_inputs("calib", 8)
    ev, texts = realmodels.rec_inputs("eval", 8, with_texts=True)
    return path, [{"x": x[i:i + 4]} for i in range(0, 8, 4)], ev, texts


# measured on these inputs, minus a margin (QDQ semantics: optimizations off)
@needs_ppocr
@pytest.mark.parametrize("preset,min_sqnr", [("A8W8", 30.0), ("A16W8", 60.0), ("U8S8", 30.0)])
def test_ppocr_classifier_static_int8_and_a16w8(cls, preset, min_sqnr):
    path, calib, ev, labels = cls
    res = mixq.quantize(path, preset, calib)
    onnx.checker.check_model(res.model, full_check=True)
    assert res.prepare.opset_from == 11 and res.prepare.opset_to == 21
    c = compare(path, res.model, [{"x": ev}], optimize=False)
    assert c.first().sqnr_db > min_sqnr, c.first()
    pred = np.argmax(make_session(res.model).run(None, {"x": ev})[0], 1)
    assert np.mean(pred == labels) >= 0.95  # upright vs rotated lines, default onnxruntime



@needs_ppocr
def test_ppocr_classifier_u8s8_runs_every_add_and_mul_in_integer_kernels(cls, tmp_path):
    """Constant inputs of Add/Mul take the activation format between integer formats (uint8
    here), so onnxruntime fuses every quantized Add and Mul (7 of the 44 Adds before: a uint8
    activation plus an int8 constant has no integer kernel). 18 of the 44 are paddle2onnx's
    Conv biases, which preparation folds into the Convs' int32 biases (passes.layer_fold),
    and 18 more (with 18 Muls) are its HardSwish written out as x * relu6(x + 3) / 6, which
    preparation recognises as HardSwish (passes.recognize): 8 Adds and 9 Muls remain."""
    import collections

    import onnxruntime as ort

    path, calib, _, _ = cls
    q = mixq.quantize(path, "U8S8", calib).model
    inits = {t.name: t.data_type for t in q.graph.initializer}
    prod = {o: n for n in q.graph.node for o in n.output}
    consts = [prod[i].input[0] for n in q.graph.node if n.op_type in ("Add", "Mul")
              for i in n.input if i in prod and prod[i].op_type == "DequantizeLinear"
              and prod[i].input[0] in inits]
    assert consts and all(inits[c] == onnx.TensorProto.UINT8 for c in consts)
    so = ort.SessionOptions()
    so.optimized_model_filepath = str(tmp_path / "opt.onnx")
    ort.InferenceSession(q.SerializeToString(), so, providers=["CPUExecutionProvider"])
    ops = collections.Counter(n.op_type for n in onnx.load(str(tmp_path / "opt.onnx")).graph.node)
    mine = collections.Counter(n.op_type for n in q.graph.node)
    assert (ops["QLinearAdd"], ops["QLinearMul"]) == (mine["Add"], mine["Mul"]) == (8, 9), ops


@needs_ppocr
@pytest.mark.parametrize("preset,min_acc", [("A16W8", 0.95), ("U8S8", 0.80)])
def test_ppocr_recognizer_reads_text_after_quantization(rec, preset, min_acc):
    path, calib, ev, texts = rec
    cfg = mixq.get_default_config(preset)
    res = mixq.quantize(path, cfg, calib)
    onnx.checker.check_model(res.model, full_check=True)
    probs = make_session(res.model, optimize=False).run(None, {"x": ev})[0]
    charset = realmodels.rec_charset(path)
    decoded = realmodels.ctc_greedy_decode(probs, charset)
    acc = realmodels.char_accuracy(decoded, texts)
    assert acc >= min_acc, (acc, decoded[:2], texts[:2])



@needs_ppocr
@pytest.mark.parametrize("preset,min_acc", [("MXFP8_E4M3", 0.85), ("BFP16", 0.95), ("MXINT8", 0.95)])
def test_block_presets_quantize_compute_operands_and_keep_the_recognizer_reading(rec, preset, min_acc):
    """Block presets quantize the operands of Conv/ConvTranspose/MatMul/Gemm, as block-format
    hardware does; every other op stays float. Quantizing every op's inputs (LayerNorm and
    softmax included) took MXFP8 on this transformer to 0 % (bench/mx_scope_bench.py)."""
    from mixq.config import BLOCK_PRESET_OPS
    from mixq.formats import MIXQ_DOMAIN

    path, calib, ev, texts = rec
    q = mixq.quantize(path, preset, calib).model
    calls = {n.output[0] for n in q.graph.node if n.domain == MIXQ_DOMAIN}
    # every block call quantizes an operand of a compute op (other readers of that tensor, such
    # as a Shape or a Concat beside the Conv, see the same value: quantization is per tensor)
    operands = {i for n in q.graph.node if n.op_type in BLOCK_PRESET_OPS for i in n.input}
    assert calls and calls <= operands, sorted(calls - operands)[:5]
    assert {n.op_type for n in q.graph.node if calls & set(n.input)} >= {"Conv", "MatMul"}
    probs = make_session(q, optimize=False).run(None, {"x": ev})[0]
    acc = realmodels.char_accuracy(realmodels.ctc_greedy_decode(probs, realmodels.rec_charset(path)), texts)
    assert acc >= min_acc, acc


def test_calibration_batch_size_gives_identical_scales():
    s = load_default_samples()
    path = str(default_model_path())
    x = s.calib_images[:64]
    a = mixq.quantize(path, "A8W8", [{"image": x[i:i + 1]} for i in range(64)], check_kernels=False)
    b = mixq.quantize(path, "A8W8", [{"image": x[i:i + 32]} for i in range(0, 64, 32)], check_kernels=False)
    assert a.model.SerializeToString() == b.model.SerializeToString()


@pytest.mark.parametrize("fmt", ["with_cast", "bf16", "simulate_bf16", "customqdq", "fp16"])
def test_convert_embedded_model(fmt):
    s = load_default_samples()
    out, rep = check_conversion(str(default_model_path()), fmt, min_sqnr_db=35.0,
                                feeds={"image": s.test_images[:64]})
    ref = make_session(str(default_model_path())).run(None, {"image": s.test_images})[0]
    got = make_session(out).run(None, {"image": s.test_images})[0]
    assert np.mean(np.argmax(got, 1) == np.argmax(ref, 1)) >= 0.99


@needs_ppocr
@pytest.mark.parametrize("fmt", ["with_cast", "bf16", "simulate_bf16", "customqdq"])
def test_convert_ppocr_classifier(fmt, cls):
    path, _, ev, labels = cls
    out, _ = check_conversion(path, fmt, min_sqnr_db=35.0, feeds={"x": ev[:8]})
    pred = np.argmax(make_session(out).run(None, {"x": ev})[0], 1)
    assert np.mean(pred == labels) >= 0.95


@needs_ppocr
@pytest.mark.parametrize("fmt", ["with_cast", "bf16", "simulate_bf16", "customqdq"])
def test_convert_ppocr_recognizer_still_reads_text(fmt, rec):
    # the recognizer's 6625-way CTC probabilities computed in bf16 end to end (with_cast,
    # customqdq) reach about 25 dB SQNR: the task metric is the text read
    path, _, ev, texts = rec
    out, rep = check_conversion(path, fmt, min_sqnr_db=20.0, min_cosine=0.99, feeds={"x": ev[:4]})
    decoded = realmodels.ctc_greedy_decode(make_session(out).run(None, {"x": ev})[0],
                                           realmodels.rec_charset(path))
    assert realmodels.char_accuracy(decoded, texts) >= 0.95


@pytest.mark.parametrize("preset", ["A8W8", "XINT8", "A16W8", "U8S8"])
def test_embedded_model_int_presets_within_one_point(preset):
    """The QDQ model (optimizations off: exactly what mixq emits) loses at most one point of
    top-1 on the shipped test images; with default optimizations the drop is the CPU's (see the
    kernel check), which reduce_range removes."""
    s = load_default_samples()
    path = str(default_model_path())
    float_top1 = np.mean(np.argmax(make_session(path).run(None, {"image": s.test_images})[0], 1)
                         == s.test_labels)
    res = mixq.quantize(path, preset, [{"image": s.calib_images[i:i + 32]} for i in range(0, 256, 32)])
    onnx.checker.check_model(res.model, full_check=True)
    got = make_session(res.model, optimize=False).run(None, {"image": s.test_images})[0]
    assert np.mean(np.argmax(got, 1) == s.test_labels) >= float_top1 - 0.01
    rr = mixq.quantize(path, mixq.get_default_config(preset).with_options(reduce_range=True),
                       [{"image": s.calib_images[i:i + 32]} for i in range(0, 256, 32)])
    got = make_session(rr.model).run(None, {"image": s.test_images})[0]  # default optimizations
    assert np.mean(np.argmax(got, 1) == s.test_labels) >= float_top1 - 0.01


@needs_ppocr
def test_s16s16_int32_biases_survive_onnxruntime_optimizations(cls):
    """int16 x int16 scales are so small that bias / (input scale x weight scale) overflows
    int32; such biases are stored at that scale x 2**k. Left float, onnxruntime's basic
    optimizations quantized them to int32 without a range check: 62 % instead of 100 % on the
    classifier, while the QDQ semantics read 100 %."""
    path, calib, ev, labels = cls
    # without range headroom: with it, these scales are large enough for int32 biases here
    res = mixq.quantize(path, mixq.get_default_config("S16S16").with_options(range_headroom=1), calib)
    shifted = [n for n in res.rewrite.notes if "x 2**" in n]
    assert shifted and not res.rewrite.biases_kept_float
    preds = [np.argmax(make_session(res.model, optimize=o).run(None, {"x": ev})[0], 1) for o in (True, False)]
    np.testing.assert_array_equal(preds[0], preds[1])
    assert np.mean(preds[0] == labels) >= 0.95


@pytest.mark.parametrize("preset", ["A8W8", "U8S8"])
def test_embedded_model_entropy_calibration_within_a_point_of_minmax(preset):
    samples = load_default_samples()
    model = onnx.load(default_model_path())
    name = model.graph.input[0].name

    def top1(method: str) -> float:
        cfg = mixq.get_default_config(preset).with_options(calibration=method)
        q = mixq.quantize(model, cfg, [{name: samples.calib_images}]).model
        y = make_session(q, optimize=False).run(None, {name: samples.test_images})[0]
        return float(np.mean(np.argmax(y, 1) == samples.test_labels))

    assert top1("entropy") >= top1("minmax") - 0.01
