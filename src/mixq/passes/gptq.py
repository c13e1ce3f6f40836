"""GPTQ weight rounding: integer weight codes chosen to minimise the layer's output error on
the calibration data, instead of each weight rounded to its nearest code.

For a layer y = W x, rounding every weight to nearest minimises |W - Wq| element by element;
the output error (W - Wq) x depends on how the rounding errors of one output's weights combine
over the inputs x. GPTQ (Frantar et al., 2022, after Optimal Brain Quantization) rounds the
weight's columns one at a time and spreads each column's rounding error over the columns not yet
rounded, weighted by the inverse of H = sum x x^T (the layer inputs' second moments): a closed
form, no iterations, no learning rate. The scales and zero points are the ones the plan already
chose (qparams), so only the codes change: the output is the same QDQ graph with other integers.

H comes from one streaming onnxruntime pass of the float model over the calibration data (one
batch in memory). For a Conv the inputs are the patches each output reads (im2col, with the
Conv's pads, strides, dilations and groups); each group has its own H. At most `MAX_ROWS`
patches (or tokens) per layer and sample enter H, drawn with a seed of the sample's index, and
H is summed sample by sample (2-D inputs: in blocks of `ROW_BLOCK` rows): the same data give
the same bytes whatever the batch size.

The pass changes the weight initializers of the prepared model in place to the dequantized
values of the chosen codes; the rewrite quantizes them back to exactly those codes (checked
here). It returns the float weights it replaced, which bias correction then measures against.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import numpy_helper

from .._io import has_external_data
from ..errors import MixqError
from ..formats import QParams, get_format
from ..formats.integer import IntFormat, expand_param
from ..graph import with_outputs
from ..plan.plan import PrecisionPlan

__all__ = ["GPTQ_DAMP", "GPTQ_BLOCK", "MAX_ROWS", "GramTap", "WeightRounder", "WeightRoundingReport",
           "gptq_round"]

#: Dampening added to H's diagonal, as a fraction of its mean (GPTQ's `percdamp`).
GPTQ_DAMP = 0.01
#: Columns rounded per block before the rest of the weight is updated (a speed knob only).
GPTQ_BLOCK = 128
#: Input rows (patches, tokens) per layer and sample that enter H.
MAX_ROWS = 1024
#: Rows of a 2-D layer input (one sample each) summed into H together.
ROW_BLOCK = 64


@dataclass
class WeightRoundingReport:
    """What GPTQ did: per weight, its layer's output error on the calibration data relative to
    round-to-nearest's (H-weighted, < 1 is better); weights left to nearest rounding and why."""

    rounded: dict[str, float] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    samples: int = 0
    original: dict[str, np.ndarray] = field(default_factory=dict, repr=False)
    nearest_because: str | None = None  # weight_rounding='auto' could not run GPTQ, or measured it worse: why
    #: weight_rounding='auto': the whole model's mean output SQNR (dB) with GPTQ and with nearest
    #: rounding, and on how many of the guard's samples (None: not compared)
    compared: tuple[float, float, int] | None = None

    def lines(self) -> list[str]:
        """Markdown lines for the quantize summary."""
        if self.nearest_because is not None:
            return [f"weights rounded to nearest, not GPTQ: {self.nearest_because}"]
        if not self.rounded and not self.skipped:
            return ["GPTQ: no Conv/Gemm/MatMul with constant integer weights"]
        out = []
        if self.rounded:
            r = np.asarray(list(self.rounded.values()))
            out.append(f"GPTQ: {len(self.rounded)} weights rounded from the input statistics of "
                       f"{self.samples} samples (layer output error vs nearest rounding: median "
                       f"{np.median(r):.2f}, worst {r.max():.2f})")
        if self.compared is not None:
            g, n, k = self.compared
            out.append(f"GPTQ kept: mean output SQNR {g:.2f} dB on the guard's {k} samples, nearest "
                       f"rounding {n:.2f}")
        out += [f"GPTQ skipped: {k}: {v}" for k, v in self.skipped.items()]
        return out


@dataclass
class _Target:
    node: onnx.NodeProto
    weight: str
    kind: str  # "conv" | "gemm" | "matmul"
    groups: int = 1
    gram: np.ndarray | None = None  # (groups, k, k), float64
    finite: bool = True  # False: an input value was inf or NaN


def _ints(node: onnx.NodeProto, name: str, default: list[int]) -> list[int]:
    a = next((a for a in node.attribute if a.name == name), None)
    return list(a.ints) if a is not None and a.ints else list(default)


def _int(node: onnx.NodeProto, name: str, default: int) -> int:
    a = next((a for a in node.attribute if a.name == name), None)
    return int(a.i) if a is not None else default


def _str(node: onnx.NodeProto, name: str, default: str) -> str:
    a = next((a for a in node.attribute if a.name == name), None)
    return a.s.decode() if a is not None else default


def _targets(model: onnx.ModelProto, plan: PrecisionPlan) -> tuple[list[_Target], dict[str, str]]:
    """Every Conv / Gemm / MatMul whose constant weight the plan puts on an integer grid."""
    inits = {t.name: t for t in model.graph.initializer}
    readers = Counter(i for n in model.graph.node for i in n.input)
    out, skipped = [], {}
    for n in model.graph.node:
        if n.op_type not in ("Conv", "Gemm", "MatMul") or len(n.input) < 2:
            continue
        w = n.input[1]
        tp = plan.tensors.get(w)
        if tp is None or tp.role != "weight" or tp.format is None:
            continue
        if not isinstance(get_format(tp.format), IntFormat):
            skipped[w] = f"{tp.format} is not an integer grid (GPTQ rounds integer codes)"
        elif w not in inits:
            skipped[w] = "the weight is not a constant"
        elif readers.get(w, 0) > 1:
            skipped[w] = "the weight is shared by several nodes (one rounding cannot fit each)"
        elif has_external_data(inits[w]):
            skipped[w] = "the weight stays in its external data file (a big model)"
        elif inits[w].data_type != onnx.TensorProto.FLOAT:
            skipped[w] = "the weight is not float32"
        elif n.op_type == "Conv" and _str(n, "auto_pad", "NOTSET") not in (
                "NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER"):
            skipped[w] = "unknown auto_pad"
        elif 0 in inits[w].dims:
            skipped[w] = "the weight is empty"
        elif n.op_type == "Conv" and len(inits[w].dims) < 3:
            skipped[w] = "a Conv weight of rank < 3"
        elif n.op_type in ("Gemm", "MatMul") and len(inits[w].dims) != 2:
            skipped[w] = "a MatMul weight of rank != 2 (batched weights)"
        else:
            kind = n.op_type.lower()
            out.append(_Target(n, w, kind, _int(n, "group", 1) if kind == "conv" else 1))
    return out, skipped


def _pick(n: int, rng: np.random.Generator) -> np.ndarray:
    """Sorted indices of at most MAX_ROWS of n rows (all of them when n is small enough)."""
    return np.arange(n) if n <= MAX_ROWS else np.sort(rng.choice(n, MAX_ROWS, replace=False))


def _conv_rows(x: np.ndarray, node: onnx.NodeProto, kshape: list[int], groups: int,
               rng: np.random.Generator) -> np.ndarray:
    """(groups, rows, cin_g * prod(kernel)) patches that the Conv's outputs read from the batch
    x (N, C, *spatial), in the weight's (cin_g, *kernel) order; at most MAX_ROWS output
    positions, drawn before any patch is copied."""
    nd = len(kshape)
    strides = _ints(node, "strides", [1] * nd)
    dil = _ints(node, "dilations", [1] * nd)
    pads = _ints(node, "pads", [0] * 2 * nd)
    auto = _str(node, "auto_pad", "NOTSET")
    span = [(k - 1) * d + 1 for k, d in zip(kshape, dil)]
    if auto == "VALID":
        pads = [0] * 2 * nd
    elif auto in ("SAME_UPPER", "SAME_LOWER"):
        pads = [0] * 2 * nd
        for i, size in enumerate(x.shape[2:]):
            total = max((-(-size // strides[i]) - 1) * strides[i] + span[i] - size, 0)
            small = total // 2
            pads[i], pads[i + nd] = (small, total - small) if auto == "SAME_UPPER" else (total - small, small)
    if any(pads):
        x = np.pad(x, [(0, 0), (0, 0)] + [(pads[i], pads[i + nd]) for i in range(nd)])
    win = np.lib.stride_tricks.sliding_window_view(x, span, axis=tuple(range(2, nd + 2)))
    win = win[(slice(None), slice(None)) + tuple(slice(None, None, s) for s in strides)
              + tuple(slice(None, None, d) for d in dil)]  # (N, C, *out, *kernel), a view
    out_shape = (x.shape[0],) + win.shape[2:2 + nd]
    pos = np.unravel_index(_pick(int(np.prod(out_shape)), rng), out_shape)
    patches = win[(pos[0], slice(None)) + tuple(pos[1:])]  # (rows, C, *kernel): the only copy
    rows, c = patches.shape[:2]
    return patches.reshape(rows, groups, -1).transpose(1, 0, 2)


class GramTap:
    """The layer inputs' second moments H of every GPTQ target of `plan`, accumulated from the
    batches a calibration run shows it (`names`: the tensors it reads; `update` per batch) or
    from a run of its own (`run`).

    Grams are summed in float64 per sample in data order (each sample's own in float32 BLAS
    after a power-of-two rescale, so that no value overflows); 2-D inputs (a row per sample) in
    blocks of ROW_BLOCK rows carried across batches: no sum depends on the batch size."""

    def __init__(self, model: onnx.ModelProto, plan: PrecisionPlan) -> None:
        self.targets, self.skipped = _targets(model, plan)
        self._shapes = {t.name: tuple(t.dims) for t in model.graph.initializer}
        self.names = sorted({t.node.input[0] for t in self.targets})
        self.samples = 0
        self.complete = False
        self._pending: dict[int, list[np.ndarray]] = {}

    def update(self, values: dict[str, np.ndarray], rows: int) -> None:
        """Add one batch of `rows` samples; `values`: the batch's tensors of `names`."""
        first = self.samples
        for ti, t in enumerate(self.targets):
            if t.node.input[0] not in values:
                continue
            v = np.asarray(values[t.node.input[0]], dtype=np.float32)
            if t.kind == "gemm" and _int(t.node, "transA", 0):
                v = v.T
            if v.ndim == 2:  # one row per sample
                self._pending.setdefault(ti, []).append(v)
                self._flush(ti, full_only=True)
                continue
            for j in range(v.shape[0]):
                rng = np.random.default_rng([ti, first + j])
                if t.kind == "conv":
                    r = _conv_rows(v[j:j + 1], t.node, list(self._shapes[t.weight][2:]), t.groups, rng)
                else:
                    x = v[j].reshape(-1, v.shape[-1])
                    r = x[_pick(x.shape[0], rng)][None]
                self._add(t, r)
        self.samples += rows

    def finish(self) -> None:
        """After the last batch: the rows still pending enter H."""
        for ti in list(self._pending):
            self._flush(ti, full_only=False)
        self.complete = True

    def run(self, model: onnx.ModelProto, feeds: Iterable[dict[str, np.ndarray]]) -> None:
        """A float run of `model` of its own over `feeds` (where no calibration run fed it)."""
        from ..evaluate import make_session

        inputs = {i.name for i in model.graph.input}
        fetch = [x for x in self.names if x not in inputs]
        # no graph optimization, as the calibration pass: fused kernels round differently, and
        # the grams (and codes) must not depend on which pass measured them
        sess = make_session(with_outputs(model, fetch).SerializeToString(), optimize=False)
        for feed in feeds:
            values = dict(zip(fetch, sess.run(fetch, feed))) if fetch else {}
            values.update({k: v for k, v in feed.items() if k in self.names})
            f0 = next(iter(feed.values()), None)
            self.update(values, int(f0.shape[0]) if f0 is not None and f0.ndim else 1)
        self.finish()

    def _add(self, t: _Target, r: np.ndarray) -> None:
        big = float(np.max(np.abs(r))) if r.size else 0.0
        if not np.isfinite(big):
            t.finite = False
            return
        scale = 2.0 ** int(np.ceil(np.log2(big))) if big > 0 else 1.0  # exact rescale
        r = r / np.float32(scale)
        g = np.matmul(r.transpose(0, 2, 1), r).astype(np.float64) * (scale * scale)
        t.gram = g if t.gram is None else t.gram + g

    def _flush(self, ti: int, full_only: bool) -> None:
        parts = self._pending.pop(ti, [])
        if not parts:
            return
        rows = np.concatenate(parts)
        n = (rows.shape[0] // ROW_BLOCK) * ROW_BLOCK if full_only else rows.shape[0]
        for b in range(0, n, ROW_BLOCK):
            self._add(self.targets[ti], rows[b:b + ROW_BLOCK][None])
        if n < rows.shape[0]:
            self._pending[ti] = [rows[n:]]


def _layout(t: _Target, w: np.ndarray) -> tuple[np.ndarray, Callable[[np.ndarray], np.ndarray]]:
    """The weight as (groups, rows, k) and the function that puts such an array back."""
    shape = w.shape
    if t.kind == "conv":
        cout = shape[0]
        return (w.reshape(t.groups, cout // t.groups, -1),
                lambda a: a.reshape(shape))
    trans = t.kind == "gemm" and _int(t.node, "transB", 0)
    if trans:  # (N, K): rows are outputs already
        return w[None], lambda a: a[0]
    return w.T[None], lambda a: a[0].T


def _gptq(w: np.ndarray, h: np.ndarray, s: np.ndarray, z: np.ndarray, lo: float, hi: float,
          damp: float, block: int, act_order: bool = True) -> tuple[np.ndarray, float, float]:
    """GPTQ codes of w (g, r, k) for the grams h (g, k, k) on the grid (s, z, [lo, hi]) of the
    same shape as w; with the H-weighted error of nearest rounding and of these codes."""
    g, _, k = w.shape
    w = w.astype(np.float64)
    s = s.astype(np.float64)
    z = z.astype(np.float64)
    h = h.copy()
    diag = np.einsum("gii->gi", h)
    dead = diag <= 0
    idx = np.arange(k)
    h[:, idx, idx] += np.where(dead, 1.0, 0.0) + damp * np.maximum(diag.mean(axis=1, keepdims=True), 1e-30)
    # act order: the columns with the largest input energy first (their errors get spread over
    # the most columns); scales are fixed, so the order changes only which codes are chosen
    order = np.argsort(-np.einsum("gii->gi", h), axis=1, kind="stable") if act_order \
        else np.broadcast_to(idx, (g, k))
    # columns as rows (g, k, r): each step reads and updates contiguous memory
    take = lambda a: np.ascontiguousarray(  # noqa: E731
        np.take_along_axis(a, order[:, None, :], axis=2).transpose(0, 2, 1))
    wt, st, zt = take(w), take(s), take(z)
    hp = np.take_along_axis(np.take_along_axis(h, order[:, :, None], axis=1), order[:, None, :], axis=2)
    u = np.linalg.cholesky(np.linalg.inv(hp)).transpose(0, 2, 1)  # upper, inv(hp) = u^T u
    ud = np.einsum("gii->gi", u)
    qt = np.empty_like(wt)
    for b0 in range(0, k, block):
        b1 = min(b0 + block, k)
        err = np.empty((g, b1 - b0, wt.shape[2]))
        for i in range(b0, b1):
            col = wt[:, i]
            code = np.clip(np.rint(col / st[:, i]) + zt[:, i], lo, hi)
            qt[:, i] = code
            e = (col - (code - zt[:, i]) * st[:, i]) / ud[:, i, None]
            wt[:, i + 1:b1] -= u[:, i, i + 1:b1, None] * e[:, None, :]
            err[:, i - b0] = e
        if b1 < k:
            wt[:, b1:] -= np.matmul(u[:, b0:b1, b1:].transpose(0, 2, 1), err)
    codes = np.empty_like(w)
    np.put_along_axis(codes, order[:, None, :], qt.transpose(0, 2, 1), axis=2)
    nearest = np.clip(np.rint(w / s) + z, lo, hi)

    def cost(c: np.ndarray) -> float:
        d = w - (c - z) * s
        return float(np.sum(np.matmul(d, h) * d))
    return codes, cost(nearest), cost(codes)


def _int_format(plan: PrecisionPlan, weight: str) -> IntFormat | None:
    tp = plan.tensors.get(weight)
    fmt = get_format(tp.format) if tp is not None and tp.format is not None else None
    return fmt if isinstance(fmt, IntFormat) else None


def _round_one(t: _Target, w: np.ndarray, qp: QParams, fmt: IntFormat, damp: float, act_order: bool,
               block: int) -> tuple[np.ndarray, float] | str:
    """The dequantized GPTQ weight of `t` on the grid (`fmt`, `qp`) with its H-weighted layer
    output error relative to nearest rounding's; or why it keeps nearest rounding."""
    if not t.finite:
        return "its input held inf or NaN in the calibration run"
    if t.gram is None:
        return "its input was not seen in the calibration run"
    s = expand_param(qp.scale, w.shape, qp.axis, qp.block_size).astype(np.float32)
    z = expand_param(qp.zero_point, w.shape, qp.axis, qp.block_size).astype(np.float32)
    s, z = np.broadcast_to(s, w.shape), np.broadcast_to(z, w.shape)
    wl, back = _layout(t, w)
    if t.gram.shape != (wl.shape[0], wl.shape[2], wl.shape[2]):
        return f"its input's shape does not match the weight {list(w.shape)}"
    lo, hi = (float(b) for b in fmt._fbounds)
    try:
        codes, before, after = _gptq(wl, t.gram, _layout(t, s)[0], _layout(t, z)[0], lo, hi,
                                     damp, block, act_order)
    except np.linalg.LinAlgError:
        return "its input's second moments are singular even after dampening"
    q = back(codes.astype(np.float32))
    new = fmt.dequantize(q, qp).astype(np.float32)
    if not np.array_equal(fmt.quantize(new, qp), q):
        raise MixqError(f"internal error: GPTQ codes of {t.weight} do not survive requantization")
    return new, (after / before if before > 0 else 1.0)


def gptq_round(model: onnx.ModelProto, plan: PrecisionPlan, qparams: dict[str, QParams],
               tap: GramTap, *, damp: float = GPTQ_DAMP, act_order: bool = True,
               block: int = GPTQ_BLOCK) -> WeightRoundingReport:
    """Replace, in place, the integer-planned Conv / Gemm / MatMul weights of `model` by the
    dequantized GPTQ codes on their `qparams` grid (see the module docstring), from the grams
    of a finished `tap`. Targets whose weight `plan` no longer puts on an integer grid (a
    numerics policy kept it float) are left alone."""
    rep = WeightRoundingReport(skipped=dict(tap.skipped), samples=tap.samples)
    inits = {t.name: t for t in model.graph.initializer}
    for t in tap.targets:
        fmt = _int_format(plan, t.weight)
        if fmt is None or t.weight not in qparams:
            continue
        w = numpy_helper.to_array(inits[t.weight]).astype(np.float32)
        got = _round_one(t, w, qparams[t.weight], fmt, damp, act_order, block)
        if isinstance(got, str):
            rep.skipped[t.weight] = got
            continue
        rep.original[t.weight] = w
        inits[t.weight].CopyFrom(numpy_helper.from_array(got[0], t.weight))
        rep.rounded[t.weight] = got[1]
    return rep


class WeightRounder:
    """GPTQ-rounded weights for any plan of one calibrated model: what a search applies to each
    plan it builds. A weight's codes depend only on its grid and its layer's input statistics
    (not on the other layers' formats), so each (weight, grid) is rounded once."""

    def __init__(self, model: onnx.ModelProto, tap: GramTap, *, damp: float = GPTQ_DAMP,
                 act_order: bool = True, block: int = GPTQ_BLOCK) -> None:
        inits = {t.name: t for t in model.graph.initializer}
        self._targets = {t.weight: t for t in tap.targets}
        self._float = {w: numpy_helper.to_array(inits[w]).astype(np.float32) for w in self._targets}
        self._done: dict[tuple[object, ...], np.ndarray | None] = {}
        self.damp, self.act_order, self.block = damp, act_order, block

    def __bool__(self) -> bool:
        return bool(self._targets)

    def weights(self, plan: PrecisionPlan, qparams: dict[str, QParams]) -> dict[str, np.ndarray]:
        """Weight name -> its GPTQ-rounded float values for `plan`'s integer weights (the rewrite
        quantizes them to GPTQ's codes); weights GPTQ skips are not listed (nearest)."""
        out = {}
        for w, t in self._targets.items():
            fmt, qp = _int_format(plan, w), qparams.get(w)
            if fmt is None or qp is None:
                continue
            key = (w, fmt.name, qp.axis, qp.block_size, np.asarray(qp.scale).tobytes(),
                   np.asarray(qp.zero_point).tobytes())
            if key not in self._done:
                got = _round_one(t, self._float[w], qp, fmt, self.damp, self.act_order, self.block)
                self._done[key] = None if isinstance(got, str) else got[0]
            new = self._done[key]
            if new is not None:
                out[w] = new
        return out
