"""Cross-layer equalization: rescale a Conv's output channels by 1/s and the next Conv's
matching input channels by s, so that both layers' per-channel weight ranges meet at
sqrt(r1 * r2) (the "max" balance of data-free quantization). Relu(x / s) = Relu(x) / s for
s > 0: the float model computes the same function.

Two users: `equalize` (the vendor's `include_cle`, every pair, run by
`mixq.compat.ModelQuantizer`) and `equalize_imbalanced`, a preparation pass that balances only
the pairs whose channel imbalance a per-tensor activation grid cannot hold: a network trained
without normalization, or one whose BatchNorm fold left channels 1000x apart, puts its quiet
channels on one or two codes of the loud ones' grid (A8W8 3 dB, BFP16 1.5 dB on such a pair,
`python -m bench.class_sweep --models conv_imbalance`). The choice is data-free, from the
weights: a predicted SQNR of the second Conv's output (`pair_sqnr_db`) before and after.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import numpy_helper

from ..graph import PassResult

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


def _attr(node: onnx.NodeProto, name: str, default: int) -> int:
    for a in node.attribute:
        if a.name == name:
            return int(a.i)
    return default


def conv_pairs(model: onnx.ModelProto) -> list[tuple[onnx.NodeProto, onnx.NodeProto]]:
    """(first Conv, second Conv) pairs that can be equalized: a Conv (any group: output channel
    i is filter i's alone) whose output, read by nothing else and no graph output, goes through
    at most `_MAX_BETWEEN` `HOMOGENEOUS` ops, each read alone, to a Conv (group 1 or depthwise);
    both with weights (and biases) of their own in the file (a MaxPool's indices output unused;
    a PRelu's slope, of any shape, multiplies x and x / s alike)."""
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

    def weight_ok(n: onnx.NodeProto) -> bool:
        return (n.op_type == "Conv" and n.domain in ("", "ai.onnx") and len(n.input) >= 2 and own(n.input[1])
                and (len(n.input) < 3 or not n.input[2] or own(n.input[2])))

    def between_ok(n: onnx.NodeProto) -> bool:
        return n.op_type in HOMOGENEOUS and n.domain in ("", "ai.onnx") and len([o for o in n.output if o]) == 1

    out = []
    for a in g.node:
        if not weight_ok(a):
            continue
        nxt = single(a.output[0])
        for _ in range(_MAX_BETWEEN):
            if nxt is None or not between_ok(nxt):
                break
            nxt = single(nxt.output[0])
        if nxt is not None and weight_ok(nxt) and nxt.input[0] != a.input[0]:
            out.append((a, nxt))
    return out


def _by_input_channel(w2: np.ndarray, c: int, group: int) -> np.ndarray | None:
    """The second Conv's weights as (input channel, output channel, rest) with zeros where a
    depthwise Conv's output does not read the channel; None for other groupings."""
    if group == 1 and w2.shape[1] == c:
        return np.moveaxis(w2, 1, 0).reshape(c, w2.shape[0], -1)
    if group == c and w2.shape[0] == c and w2.shape[1] == 1:  # depthwise: output i reads input i
        out = np.zeros((c, c, int(np.prod(w2.shape[2:], dtype=np.int64))))
        out[np.arange(c), np.arange(c)] = w2.reshape(c, -1)
        return out
    return None


def balance_scales(w1: np.ndarray, w2: np.ndarray, group: int) -> np.ndarray | None:
    """The per-channel s that brings the first Conv's output-channel range r1 and the second's
    input-channel range r2 both to sqrt(r1 * r2) (1 where either is 0); None where the second
    Conv's grouping is neither 1 nor depthwise."""
    c = w1.shape[0]
    w2c = _by_input_channel(w2, c, group)
    if w2c is None:
        return None
    r1 = np.max(np.abs(w1.reshape(c, -1)), axis=1)
    r2 = np.max(np.abs(w2c.reshape(c, -1)), axis=1)
    ok = (r1 > 0) & (r2 > 0)
    s = np.ones(c)
    s[ok] = np.sqrt(r1[ok] / r2[ok])
    return s


def pair_sqnr_db(w1: np.ndarray, w2: np.ndarray, group: int, s: np.ndarray | None = None) -> float:
    """The SQNR the second Conv's output keeps with its input on one int8 grid and its weights on
    per-output-channel int8 grids, predicted from the weights alone (after scaling channel i by
    1 / s[i] when `s` is given): channel i's activations spread as the L2 norm of the first
    Conv's filter i (inputs alike for every channel), the grid spans the loudest channel's
    4 standard deviations, and each output sums its input channels' contributions."""
    c = w1.shape[0]
    w2c = _by_input_channel(w2.astype(np.float64), c, group)
    if w2c is None:
        return math.inf
    act = np.linalg.norm(w1.reshape(c, -1).astype(np.float64), axis=1)
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


def scale_pair(inits: dict[str, onnx.TensorProto], a: onnx.NodeProto, b: onnx.NodeProto, s: np.ndarray) -> None:
    """Divide the first Conv's output channels (weights and bias) by `s`, multiply the second's
    matching input channels by it; in place, in the initializers' own dtype."""
    w1 = numpy_helper.to_array(inits[a.input[1]])
    w2 = numpy_helper.to_array(inits[b.input[1]])
    c, dt = w1.shape[0], w1.dtype
    new1 = w1.astype(np.float64) / s.reshape((c,) + (1,) * (w1.ndim - 1))
    if _attr(b, "group", 1) == 1:
        new2 = w2.astype(np.float64) * s.reshape((1, c) + (1,) * (w2.ndim - 2))
    else:
        new2 = w2.astype(np.float64) * s.reshape((c,) + (1,) * (w2.ndim - 1))
    inits[a.input[1]].CopyFrom(numpy_helper.from_array(new1.astype(dt), a.input[1]))
    inits[b.input[1]].CopyFrom(numpy_helper.from_array(new2.astype(dt), b.input[1]))
    if len(a.input) >= 3 and a.input[2]:
        b1 = numpy_helper.to_array(inits[a.input[2]]).astype(np.float64) / s
        inits[a.input[2]].CopyFrom(numpy_helper.from_array(b1.astype(dt), a.input[2]))


def equalize(model: onnx.ModelProto, steps: int = 1) -> tuple[onnx.ModelProto, int]:
    """A copy of `model` with every `conv_pairs` pair balanced (`steps` passes); returns the
    copy and the number of pairs."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    inits = {t.name: t for t in m.graph.initializer}
    pairs = conv_pairs(m)
    for _ in range(steps):
        for a, b in pairs:
            s = balance_scales(numpy_helper.to_array(inits[a.input[1]]),
                               numpy_helper.to_array(inits[b.input[1]]), _attr(b, "group", 1))
            if s is not None:
                scale_pair(inits, a, b, s)
    return m, len(pairs)


@dataclass(frozen=True)
class Balanced:
    """One pair `equalize_imbalanced` balanced, with its predictions."""

    first: str
    second: str
    before_db: float
    after_db: float


def equalize_imbalanced(model: onnx.ModelProto, result: PassResult | None = None) -> list[Balanced]:
    """Balance, in place, the `conv_pairs` whose `pair_sqnr_db` is under `EQUALIZE_BELOW_DB`
    and gains at least `EQUALIZE_GAIN_DB` by it; the others are declined in `result` where
    they are imbalanced at all (a predicted gain over 1 dB), with why."""
    inits = {t.name: t for t in model.graph.initializer}
    done: list[Balanced] = []
    for a, b in conv_pairs(model):
        w1 = numpy_helper.to_array(inits[a.input[1]])
        w2 = numpy_helper.to_array(inits[b.input[1]])
        group = _attr(b, "group", 1)
        s = balance_scales(w1, w2, group)
        if s is None:
            continue
        before, after = pair_sqnr_db(w1, w2, group), pair_sqnr_db(w1, w2, group, s)
        where = f"{a.name or a.output[0]} -> {b.name or b.output[0]}"
        if before < EQUALIZE_BELOW_DB and after - before >= EQUALIZE_GAIN_DB:
            scale_pair(inits, a, b, s)
            done.append(Balanced(a.name or a.output[0], b.name or b.output[0], before, after))
        elif result is not None and after - before > 1.0:
            result.decline(where, f"predicted {before:.1f} dB unbalanced, {after:.1f} dB balanced: "
                                  f"left as it is (balanced under {EQUALIZE_BELOW_DB:.0f} dB and a gain of "
                                  f"{EQUALIZE_GAIN_DB:.0f} dB or more)")
    if result is not None:
        result.changed += len(done)
        if done:
            worst = min(done, key=lambda d: d.before_db)
            result.notes.append(
                f"{len(done)} Conv pair(s) equalized (cross-layer equalization; the float model computes the "
                f"same function): their channels' ranges were too far apart for one activation grid (e.g. "
                f"{worst.first} -> {worst.second}: a predicted {worst.before_db:.1f} dB on int8, "
                f"{worst.after_db:.1f} dB balanced)")
    return done
