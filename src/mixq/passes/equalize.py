"""Cross-layer equalization: rescale a layer's output channels by 1/s and the next layer's
matching input channels by s (Conv, MatMul and Gemm pairs), so that both layers' per-channel
weight ranges meet at sqrt(r1 * r2) (the "max" balance of data-free quantization). Relu(x / s)
= Relu(x) / s for s > 0: the float model computes the same function.

Two users: `equalize` (the vendor's `include_cle`, every Conv pair, run by
`mixq.compat.ModelQuantizer`) and `equalize_imbalanced`, a preparation pass that balances only
the pairs whose channel imbalance a per-tensor activation grid cannot hold: a network trained
without normalization, or one whose BatchNorm fold left channels 1000x apart, puts its quiet
channels on one or two codes of the loud ones' grid (A8W8 3 dB, BFP16 1.5 dB on such a pair,
`python -m bench.class_sweep --models conv_imbalance`). The choice is data-free, from the
weights: a predicted SQNR of the second layer's output (`pair_sqnr_db`) before and after.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import numpy_helper

from ..graph import PassResult, int_attr

#: Ops between the two Convs that commute with a positive per-channel scale: f(x / s) =
#: f(x) / s for s > 0 (a PRelu's slope and a pool's window see the same signs and order).
HOMOGENEOUS = ("Relu", "LeakyRelu", "PRelu", "MaxPool", "AveragePool", "Identity")
#: The most of them a pair may have between its Convs.
_MAX_BETWEEN = 3
#: A pair is balanced when the prediction says it keeps less than this unbalanced (where the
#: guard would call the model broken; a balanced layer predicts about 38 dB on int8)...
EQUALIZE_BELOW_DB = 10.0
#: ...and gains at least this much balanced. The prediction is data-free and crude: PP-OCRv4's
#: recognizer has a pair it puts at 19 dB (37 balanced) whose balance cost 0.9 points of A8W8
#: character accuracy (a scratch run on 24 lines), and its classifier pairs of 25 and 30 dB
#: were fine either way. Only a pair the prediction calls broken is touched.
EQUALIZE_GAIN_DB = 10.0
#: The reference grid of the prediction: int8's symmetric codes; a channel's absmax taken as
#: 4 of its standard deviations (what a Gaussian's calibrated range comes to).
_CODES = 127.0
_PEAK = 4.0


#: Ops that act on each element alone: between a MatMul / Gemm pair (channels on the last
#: axis, where a pool would mix them), only these.
_ELEMENTWISE = ("Relu", "LeakyRelu", "PRelu", "Identity")


@dataclass(frozen=True)
class Pair:
    """Two layers joined by channels: `first` (Conv, MatMul or Gemm) computes channel i with the
    slice i of weight `w1` along `out_axis` (plus `biases`, each holding one value per channel);
    `second` reads it with the slice i of `w2` along `in_axis` (a depthwise Conv: its output i
    alone). Scaling both by 1/s and s leaves what `second` computes unchanged."""

    first: onnx.NodeProto
    second: onnx.NodeProto
    w1: str
    out_axis: int
    biases: tuple[str, ...]
    w2: str
    in_axis: int
    depthwise: bool = False

    @property
    def where(self) -> str:
        return f"{self.first.name or self.first.output[0]} -> {self.second.name or self.second.output[0]}"


def channel_pairs(model: onnx.ModelProto) -> list[Pair]:
    """The pairs that can be equalized: a Conv (any group: output channel i is filter i's
    alone), a MatMul with a 2-D weight (its bias an Add of one value per column) or a Gemm,
    whose output, read by nothing else and no graph output, goes through at most
    `_MAX_BETWEEN` ops that commute with a positive channel scale (`HOMOGENEOUS` after a Conv,
    `_ELEMENTWISE` after a MatMul / Gemm), each read alone, to a Conv (group 1 or depthwise), a
    MatMul or a Gemm reading it as its data operand. Every weight and bias is a float32
    initializer of its own in the file (a MaxPool's indices output unused; a PRelu's slope,
    of any shape, multiplies x and x / s alike)."""
    g = model.graph
    inits = {t.name: t for t in g.initializer}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for n in g.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    outputs = {o.name for o in g.output}

    def single(t: str) -> onnx.NodeProto | None:
        c = consumers.get(t, [])
        return c[0] if len(c) == 1 and t not in outputs else None

    def own(name: str) -> bool:
        t = inits.get(name)
        return (t is not None and len(consumers.get(name, [])) == 1
                and t.data_location != onnx.TensorProto.EXTERNAL and t.data_type == onnx.TensorProto.FLOAT)

    def dims(name: str) -> tuple[int, ...]:
        return tuple(int(d) for d in inits[name].dims)

    def per_channel(name: str, c: int) -> bool:  # (c,) or (1, ..., 1, c): one value per channel
        if not own(name):  # a bias computed at run time, or shared: not ours to scale
            return False
        d = dims(name)
        return len(d) >= 1 and d[-1] == c and all(x == 1 for x in d[:-1])

    def std(n: onnx.NodeProto, op: str) -> bool:
        return n.op_type == op and n.domain in ("", "ai.onnx")

    def first_of(n: onnx.NodeProto) -> tuple[str, int, tuple[str, ...], str, bool] | None:
        """(weight, output axis, biases, output tensor, channels last) of a producing layer."""
        if std(n, "Conv") and len(n.input) >= 2 and own(n.input[1]) and len(dims(n.input[1])) >= 3:
            c = dims(n.input[1])[0]
            bias = n.input[2] if len(n.input) > 2 and n.input[2] else ""
            if bias and not per_channel(bias, c):
                return None
            return n.input[1], 0, (bias,) if bias else (), n.output[0], False
        if std(n, "Gemm") and len(n.input) >= 2 and own(n.input[1]) and len(dims(n.input[1])) == 2 \
                and not int_attr(n, "transA", 0):
            axis = 0 if int_attr(n, "transB", 0) else 1
            c = dims(n.input[1])[axis]
            bias = n.input[2] if len(n.input) > 2 and n.input[2] else ""
            if bias and not per_channel(bias, c):
                return None
            return n.input[1], axis, (bias,) if bias else (), n.output[0], True
        if std(n, "MatMul") and own(n.input[1]) and len(dims(n.input[1])) == 2:
            c = dims(n.input[1])[1]
            nxt = single(n.output[0])
            if nxt is not None and std(nxt, "Add") and n.output[0] in nxt.input:
                other = nxt.input[1] if nxt.input[0] == n.output[0] else nxt.input[0]
                if other in inits:
                    return (n.input[1], 1, (other,), nxt.output[0], True) if per_channel(other, c) else None
            return n.input[1], 1, (), n.output[0], True
        return None

    def second_of(n: onnx.NodeProto, t: str, c: int, last: bool) -> tuple[str, int, bool] | None:
        """(weight, input axis, depthwise) of a layer reading tensor `t` of `c` channels."""
        if len(n.input) < 2 or n.input[0] != t or not own(n.input[1]):
            return None
        d = dims(n.input[1])
        if std(n, "Conv") and not last:
            group = int_attr(n, "group", 1)
            if group == 1 and len(d) > 2 and d[1] == c:
                return n.input[1], 1, False
            if group == c and len(d) > 2 and d[0] == c and d[1] == 1:
                return n.input[1], 0, True
            return None
        if std(n, "MatMul") and last and len(d) == 2 and d[0] == c:
            return n.input[1], 0, False
        if std(n, "Gemm") and last and len(d) == 2 and not int_attr(n, "transA", 0):
            axis = 1 if int_attr(n, "transB", 0) else 0
            return (n.input[1], axis, False) if d[axis] == c else None
        return None

    out = []
    for a in g.node:
        got = first_of(a)
        if got is None:
            continue
        w1, out_axis, biases, t, last = got
        c = dims(w1)[out_axis]
        allowed = _ELEMENTWISE if last else HOMOGENEOUS
        nxt = single(t)
        for _ in range(_MAX_BETWEEN):
            if nxt is None or not (nxt.op_type in allowed and nxt.domain in ("", "ai.onnx")
                                   and len([o for o in nxt.output if o]) == 1 and nxt.input[0] == t):
                break
            t = nxt.output[0]
            nxt = single(t)
        if nxt is None or nxt.input[0] == a.input[0]:
            continue
        sec = second_of(nxt, t, c, last)
        if sec is not None:
            out.append(Pair(a, nxt, w1, out_axis, biases, sec[0], sec[1], sec[2]))
    return out


def _by_input_channel(w2: np.ndarray, c: int, in_axis: int, depthwise: bool) -> np.ndarray:
    """The second layer's weights as (input channel, output channel, rest), zeros where a
    depthwise Conv's output does not read the channel."""
    if depthwise:  # output i reads input i
        out = np.zeros((c, c, int(np.prod(w2.shape[2:], dtype=np.int64))))
        out[np.arange(c), np.arange(c)] = w2.reshape(c, -1)
        return out
    moved = np.moveaxis(w2, in_axis, 0)
    return moved.reshape(c, moved.shape[1], -1)


def pair_weights(inits: dict[str, onnx.TensorProto], p: Pair) -> tuple[np.ndarray, np.ndarray]:
    """The pair's weights as `balance_scales` and `pair_sqnr_db` read them: the first as
    (channel, rest), the second as (input channel, output channel, rest); float64."""
    w1 = numpy_helper.to_array(inits[p.w1]).astype(np.float64)
    c = w1.shape[p.out_axis]
    w1r = np.moveaxis(w1, p.out_axis, 0).reshape(c, -1)
    return w1r, _by_input_channel(numpy_helper.to_array(inits[p.w2]).astype(np.float64), c, p.in_axis, p.depthwise)


def balance_scales(w1r: np.ndarray, w2c: np.ndarray) -> np.ndarray:
    """The per-channel s that brings the first layer's channel range r1 (over `w1r`'s rows) and
    the second's r2 (over `w2c`'s first axis) both to sqrt(r1 * r2); 1 where either is 0."""
    c = w1r.shape[0]
    r1 = np.max(np.abs(w1r), axis=1)
    r2 = np.max(np.abs(w2c.reshape(c, -1)), axis=1)
    ok = (r1 > 0) & (r2 > 0)
    s = np.ones(c)
    s[ok] = np.sqrt(r1[ok] / r2[ok])
    return s


def pair_sqnr_db(w1r: np.ndarray, w2c: np.ndarray, s: np.ndarray | None = None) -> float:
    """The SQNR the second layer's output keeps with its input on one int8 grid and its weights
    on per-output-channel int8 grids, predicted from the weights alone (`w1r`, `w2c` as
    `balance_scales` reads them; after scaling channel i by 1 / s[i] when `s` is given):
    channel i's activations spread as the L2 norm of the first layer's row i (inputs alike for
    every channel), the grid spans the loudest channel's 4 standard deviations, and each output
    sums its input channels' contributions."""
    act = np.linalg.norm(w1r, axis=1)
    if s is not None:
        act = act / s
        w2c = w2c * s[:, None, None]
    if not np.any(act > 0):
        return math.inf
    gain = np.sum(w2c * w2c, axis=2)  # (in, out): the energy channel i sends to output o
    signal = float(np.sum(act[:, None] ** 2 * gain))
    act_step = _PEAK * float(act.max()) / _CODES
    noise = act_step ** 2 / 12.0 * float(np.sum(gain))
    w_step = np.max(np.abs(w2c), axis=(0, 2)) / _CODES  # per output channel
    read = (np.abs(w2c) > 0).sum(axis=2)  # the weights of output o that read channel i
    noise += float(np.sum(w_step[None, :] ** 2 / 12.0 * act[:, None] ** 2 * read))
    if signal <= 0.0:
        return math.inf
    return 10.0 * math.log10(signal / max(noise, 1e-300))


def scale_pair(inits: dict[str, onnx.TensorProto], p: Pair, s: np.ndarray) -> None:
    """Divide the first layer's channels (weights and biases) by `s`, multiply the second's
    matching input channels by it; in place, in the initializers' own dtype."""
    def put(name: str, new: np.ndarray, dt: np.dtype) -> None:
        inits[name].CopyFrom(numpy_helper.from_array(new.astype(dt), name))

    w1 = numpy_helper.to_array(inits[p.w1])
    c = w1.shape[p.out_axis]
    shape1 = [1] * w1.ndim
    shape1[p.out_axis] = c
    put(p.w1, w1.astype(np.float64) / s.reshape(shape1), w1.dtype)
    w2 = numpy_helper.to_array(inits[p.w2])
    shape2 = [1] * w2.ndim
    shape2[0 if p.depthwise else p.in_axis] = c
    put(p.w2, w2.astype(np.float64) * s.reshape(shape2), w2.dtype)
    for b in p.biases:
        bias = numpy_helper.to_array(inits[b])
        put(b, bias.astype(np.float64) / s.reshape(bias.shape), bias.dtype)


def equalize(model: onnx.ModelProto, steps: int = 1) -> tuple[onnx.ModelProto, int]:
    """A copy of `model` with every Conv pair of `channel_pairs` balanced (`steps` passes; the
    vendor's CLE is of Convs); returns the copy and the number of pairs."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    inits = {t.name: t for t in m.graph.initializer}
    pairs = [p for p in channel_pairs(m) if p.first.op_type == p.second.op_type == "Conv"]
    for _ in range(steps):
        for p in pairs:
            scale_pair(inits, p, balance_scales(*pair_weights(inits, p)))
    return m, len(pairs)


@dataclass(frozen=True)
class Balanced:
    """One pair `equalize_imbalanced` balanced, with its predictions."""

    first: str
    second: str
    before_db: float
    after_db: float


def equalize_imbalanced(model: onnx.ModelProto, result: PassResult | None = None, *,
                        apply: bool = True) -> list[Balanced]:
    """Balance, in place, the `channel_pairs` whose `pair_sqnr_db` is under `EQUALIZE_BELOW_DB`
    and gains at least `EQUALIZE_GAIN_DB` by it; the others are declined in `result` where
    they are imbalanced at all (a predicted gain over 1 dB), with why. `apply=False`: only say
    which pairs it would balance (the model is not touched)."""
    inits = {t.name: t for t in model.graph.initializer}
    done: list[Balanced] = []
    for p in channel_pairs(model):
        w1r, w2c = pair_weights(inits, p)
        s = balance_scales(w1r, w2c)
        before, after = pair_sqnr_db(w1r, w2c), pair_sqnr_db(w1r, w2c, s)
        if before < EQUALIZE_BELOW_DB and after - before >= EQUALIZE_GAIN_DB:
            if apply:
                scale_pair(inits, p, s)
            done.append(Balanced(p.first.name or p.first.output[0], p.second.name or p.second.output[0],
                                 before, after))
        elif result is not None and after - before > 1.0:
            result.decline(p.where, f"predicted {before:.1f} dB unbalanced, {after:.1f} dB balanced: left as "
                                    f"it is (balanced under {EQUALIZE_BELOW_DB:.0f} dB and a gain of "
                                    f"{EQUALIZE_GAIN_DB:.0f} dB or more)")
    if result is not None:
        result.changed += len(done)
        if done:
            worst = min(done, key=lambda d: d.before_db)
            result.notes.append(
                f"{len(done)} layer pair(s) equalized (cross-layer equalization; the float model computes the "
                f"same function): their channels' ranges were too far apart for one activation grid (e.g. "
                f"{worst.first} -> {worst.second}: a predicted {worst.before_db:.1f} dB on int8, "
                f"{worst.after_db:.1f} dB balanced)")
    return done
