"""Bias correction: each Conv / Gemm whose weight is quantized on an integer grid takes into its
bias the mean error the quantized weight adds to its output.

With W the float weight and Wq its quantize-dequantized value, the layer's output error is
(Wq - W) x; its mean over the data is (Wq - W) E[x], a per-output-channel constant that
rounding leaves in every output (it does not average out: the same rounded weights meet
every input). Subtracting it from the bias removes it. E[x] is the per-channel mean of the
layer's float input, measured in one streaming onnxruntime pass of the float model over the
calibration data (the means of 32 samples left EfficientNet-Lite0 A16W8 at 89.4 % agreement,
those of its 64 calibration samples gave 90.7). For a Conv the mean is taken over the batch
and the spatial positions, so zero padding at the borders is not modelled.

The pass changes the bias initializers of the prepared model in place, before the rewrite
quantizes them (to int32 at input scale x weight scale when planned so).
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import numpy_helper

from .._io import has_external_data
from ..formats import QParams, get_format
from ..graph import float_attr, int_attr, with_outputs
from ..plan.plan import PrecisionPlan

__all__ = ["BiasCorrectionReport", "correct_biases"]


@dataclass
class BiasCorrectionReport:
    """What the pass did: biases corrected (name -> largest |correction| relative to the
    bias's largest magnitude), layers it left alone and why, and the samples the means came from."""

    corrected: dict[str, float] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    samples: int = 0

    def lines(self) -> list[str]:
        """Markdown lines for the quantize summary."""
        if not self.corrected and not self.skipped:
            return ["bias correction: no Conv/Gemm with a bias and integer weights"]
        out = [f"bias correction: {len(self.corrected)} biases corrected from the input means of "
               f"{self.samples} samples"
               + (f" (largest change {max(self.corrected.values()):.1%} of a bias's range)"
                  if self.corrected else "")]
        out += [f"bias correction skipped: {k}: {v}" for k, v in self.skipped.items()]
        return out


def _targets(model: onnx.ModelProto, plan: PrecisionPlan, qparams: dict[str, QParams]
             ) -> tuple[list[tuple[onnx.NodeProto, str, str]], dict[str, str]]:
    """(node, weight, bias) of every Conv / Gemm (transA=0) whose weight is planned on an
    integer grid and whose bias is an initializer read by that node alone; skip reasons."""
    inits = {t.name: t for t in model.graph.initializer}
    readers = Counter(i for n in model.graph.node for i in n.input)
    out, skipped = [], {}
    for n in model.graph.node:
        if n.op_type not in ("Conv", "Gemm") or len(n.input) < 3 or not n.input[2]:
            continue
        w, b = n.input[1], n.input[2]
        tp = plan.tensors.get(w)
        if tp is None or tp.role != "weight" or tp.format is None or w not in qparams \
                or get_format(tp.format).kind != "int":
            continue
        if n.op_type == "Gemm" and int_attr(n, "transA", 0):
            skipped[b] = "Gemm with transA=1"
        elif b not in inits or w not in inits:
            skipped[b] = "the bias or the weight is not a constant"
        elif readers.get(b, 0) > 1:
            skipped[b] = "the bias is shared by several nodes"
        elif has_external_data(inits[b]) or has_external_data(inits[w]):
            skipped[b] = "the weights stay in their external data file (a big model)"
        else:
            out.append((n, w, b))
    return out, skipped


def _input_means(model: onnx.ModelProto, names: list[str], feeds: Iterable[dict[str, np.ndarray]]
                 ) -> tuple[dict[str, np.ndarray], int]:
    """Per-channel (axis 1) means of `names` over the other axes, from one run of `model`."""
    from ..evaluate import make_session

    sess = make_session(with_outputs(model, names).SerializeToString())
    sums: dict[str, np.ndarray] = {}
    counts: dict[str, int] = {}
    samples = 0
    for feed in feeds:
        for x, v in zip(names, sess.run(names, feed)):
            v = np.asarray(v, dtype=np.float64)
            if v.ndim < 2:
                continue
            per = np.moveaxis(v, 1, 0).reshape(v.shape[1], -1)
            sums[x] = sums.get(x, 0.0) + per.sum(axis=1)
            counts[x] = counts.get(x, 0) + per.shape[1]
        first = next(iter(feed.values()), None)
        samples += int(first.shape[0]) if first is not None and first.ndim else 1
    return {x: sums[x] / counts[x] for x in sums if counts[x]}, samples


def correct_biases(model: onnx.ModelProto, plan: PrecisionPlan, qparams: dict[str, QParams],
                   feeds: Iterable[dict[str, np.ndarray]],
                   original: dict[str, np.ndarray] | None = None) -> BiasCorrectionReport:
    """Correct, in place, the biases of `model`'s Conv / Gemm layers whose weights `plan`
    quantizes with `qparams` (see the module docstring); `feeds`: the samples whose input means
    are used, streamed (one batch in memory at a time); `original`: the float weights of those
    a pass before already moved onto their grid (GPTQ), which the error is measured against."""
    rep = BiasCorrectionReport()
    targets, rep.skipped = _targets(model, plan, qparams)
    if not targets:
        return rep
    inits = {t.name: t for t in model.graph.initializer}
    means, rep.samples = _input_means(model, sorted({n.input[0] for n, _, _ in targets}), feeds)
    for node, w_name, b_name in targets:
        mean = means.get(node.input[0])
        cur = numpy_helper.to_array(inits[w_name]).astype(np.float32)
        w = (original or {}).get(w_name, cur)
        b = numpy_helper.to_array(inits[b_name]).astype(np.float64)
        fmt = get_format(str(plan.tensors[w_name].format))  # an integer format (see _targets)
        err = (fmt.fake_quant(cur, qparams[w_name]) - w).astype(np.float64)
        if mean is None:
            rep.skipped[b_name] = f"the input {node.input[0]} has no channel axis"
            continue
        if node.op_type == "Conv":
            cout, cin_g = err.shape[0], err.shape[1]
            groups = int_attr(node, "group", 1)
            if mean.size != cin_g * groups or b.shape != (cout,):
                rep.skipped[b_name] = "the input's channels do not match the weight"
                continue
            m = mean.reshape(groups, cin_g)[np.arange(cout) // (cout // groups)]  # (cout, cin_g)
            delta = (err.reshape(cout, cin_g, -1).sum(axis=2) * m).sum(axis=1)
        else:  # Gemm: y = alpha * A @ B' + beta * C
            e = err.T if int_attr(node, "transB", 0) else err  # (K, N)
            alpha, beta = float_attr(node, "alpha", 1.0), float_attr(node, "beta", 1.0)
            if mean.size != e.shape[0] or b.shape != (e.shape[1],) or beta == 0:
                rep.skipped[b_name] = "the bias is not one value per output"
                continue
            delta = alpha * (mean @ e) / beta
        new = (b - delta).astype(np.float32)
        inits[b_name].CopyFrom(numpy_helper.from_array(new, b_name))
        rng = float(np.max(np.abs(b))) if b.size else 0.0
        rep.corrected[b_name] = float(np.max(np.abs(delta))) / rng if rng > 0 else 0.0
    return rep
