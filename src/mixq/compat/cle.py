"""Cross-layer equalization (`include_cle`, the vendor's default): for a Conv whose output feeds,
alone and through at most one Relu, a second Conv, the output channels of the first are rescaled
by s and the matching input channels of the second by 1/s, with s chosen so that both layers'
per-channel weight ranges become equal (sqrt(r1 * r2), the "max" balance method). Relu(x / s) =
Relu(x) / s for s > 0, so the float model computes the same function; per-tensor weight scales
then fit every channel far better.

Runs on the prepared graph (BatchNorms already folded into the Convs), before quantization.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

#: Activations between the two Convs that commute with a positive per-channel scale.
_HOMOGENEOUS = ("Relu",)


def _attr(node: onnx.NodeProto, name: str, default: int) -> int:
    for a in node.attribute:
        if a.name == name:
            return int(a.i)
    return default


def _pairs(model: onnx.ModelProto) -> list[tuple[onnx.NodeProto, onnx.NodeProto]]:
    """(first Conv, second Conv) pairs that can be equalized."""
    g = model.graph
    inits = {t.name for t in g.initializer}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for n in g.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    outputs = {o.name for o in g.output}

    def single(t: str) -> onnx.NodeProto | None:
        c = consumers.get(t, [])
        return c[0] if len(c) == 1 and t not in outputs else None

    def weight_ok(n: onnx.NodeProto) -> bool:
        return (n.op_type == "Conv" and len(n.input) >= 2 and n.input[1] in inits
                and len(consumers.get(n.input[1], [])) == 1
                and (len(n.input) < 3 or not n.input[2] or
                     (n.input[2] in inits and len(consumers.get(n.input[2], [])) == 1)))

    out = []
    for a in g.node:
        if not weight_ok(a) or _attr(a, "group", 1) != 1:
            continue
        nxt = single(a.output[0])
        if nxt is not None and nxt.op_type in _HOMOGENEOUS:
            nxt = single(nxt.output[0])
        if nxt is not None and weight_ok(nxt) and nxt.input[0] != a.input[0]:
            out.append((a, nxt))
    return out


def equalize(model: onnx.ModelProto, steps: int = 1) -> tuple[onnx.ModelProto, int]:
    """A copy of `model` with every equalizable Conv pair balanced (`steps` passes); returns the
    copy and the number of pairs."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    inits = {t.name: t for t in m.graph.initializer}
    pairs = _pairs(m)
    for _ in range(steps):
        for a, b in pairs:
            w1 = numpy_helper.to_array(inits[a.input[1]]).astype(np.float64)
            w2 = numpy_helper.to_array(inits[b.input[1]]).astype(np.float64)
            c = w1.shape[0]
            group = _attr(b, "group", 1)
            if group == 1 and w2.shape[1] == c:
                r2 = np.max(np.abs(np.moveaxis(w2, 1, 0).reshape(c, -1)), axis=1)
            elif group == c and w2.shape[0] == c and w2.shape[1] == 1:  # depthwise
                r2 = np.max(np.abs(w2.reshape(c, -1)), axis=1)
            else:
                continue
            r1 = np.max(np.abs(w1.reshape(c, -1)), axis=1)
            ok = (r1 > 0) & (r2 > 0)
            s = np.ones(c)
            s[ok] = np.sqrt(r1[ok] * r2[ok]) / r2[ok]  # new range of both: sqrt(r1 * r2)
            shape1 = (c,) + (1,) * (w1.ndim - 1)
            w1 = w1 / s.reshape(shape1)
            if group == 1:
                w2 = w2 * s.reshape((1, c) + (1,) * (w2.ndim - 2))
            else:
                w2 = w2 * s.reshape((c,) + (1,) * (w2.ndim - 1))
            dt1 = numpy_helper.to_array(inits[a.input[1]]).dtype
            inits[a.input[1]].CopyFrom(numpy_helper.from_array(w1.astype(dt1), a.input[1]))
            inits[b.input[1]].CopyFrom(numpy_helper.from_array(w2.astype(dt1), b.input[1]))
            if len(a.input) >= 3 and a.input[2]:
                b1 = numpy_helper.to_array(inits[a.input[2]]).astype(np.float64) / s
                inits[a.input[2]].CopyFrom(numpy_helper.from_array(b1.astype(dt1), a.input[2]))
    return m, len(pairs)
