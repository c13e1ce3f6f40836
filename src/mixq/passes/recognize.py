"""Recognise normalisations and activations written out as element-wise ops and fuse them into
the native ONNX op: LayerNormalization (opset 17), Gelu (opset 20), Softmax, HardSwish /
HardSigmoid (relu6(x + 3) / 6, as exporters write them before opset 14), Mish (x *
tanh(softplus(x)), before opset 18) and GroupNormalization (opset 21; torch writes it as an
InstanceNormalization of x reshaped to groups, then a per-channel scale and shift); and an
Einsum that is a matrix product (with a weight, or batched, as attention), rewritten as MatMul.

Why: a LayerNorm written out as ReduceMean/Sub/Mul/Sqrt/Div (or, from JAX, with the variance as
E[x^2] - E[x]^2) exposes every intermediate to quantization, and the variance cancels
catastrophically once its terms sit on an integer grid. The native op is quantized only at its
input and output, and computes the same function.

Each rule is pattern / check / rewrite over the onnx protos. A matcher returns None when the
anchor node is not the pattern at all, a reason string when the pattern is there but a check
fails (the fusion would change the meaning: another axis, a constant out of tolerance, an
intermediate read elsewhere or a graph output), or a `_Match`. The pass works in place.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..graph import GraphIndex, NameAllocator, float_attr, int_attr, per_channel

#: Relative tolerance of the constants a pattern needs (0.5, 1, sqrt(2), sqrt(2/pi), 0.044715, 1/n).
CONST_RTOL = 1e-4


@dataclass
class Fusion:
    """One fusion: the native op that replaced `nodes` (their names), writing `output`."""

    kind: str
    output: str
    nodes: list[str]


@dataclass
class Declined:
    """A match left alone, with the check that failed."""

    kind: str
    anchor: str
    reason: str


@dataclass
class RecognizeReport:
    """What `recognize` fused and what it declined."""

    fused: list[Fusion] = field(default_factory=list)
    declined: list[Declined] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        """Fusions per native op type."""
        out: dict[str, int] = {}
        for f in self.fused:
            out[f.kind] = out.get(f.kind, 0) + 1
        return out


@dataclass
class _Match:
    nodes: list[onnx.NodeProto]  # every node replaced (the last one writes `output`)
    output: str
    new_node: onnx.NodeProto
    new_inits: list[onnx.TensorProto] = field(default_factory=list)
    before: list[onnx.NodeProto] = field(default_factory=list)  # new nodes that feed new_node
    kind: str | None = None  # the native op, where a rule has more than one (else the rule's)


class _Index:
    """Producers, consumers, constants and shapes of a graph (rebuilt after each rule), on the
    graph layer: consumers include the If/Loop/Scan nodes whose subgraphs read a value (so an
    intermediate a branch reads is never fused away), and new names come from the allocator."""

    def __init__(self, model: onnx.ModelProto) -> None:
        g = model.graph
        ix = GraphIndex.of(model)
        self.model = model
        self.producer: dict[str, onnx.NodeProto] = ix.producers
        self.consumers: dict[str, list[onnx.NodeProto]] = {
            name: ix.consumers(name) for name in set(ix.readers) | set(ix.subgraph_readers)}
        self.inits = ix.initializers
        self.outputs = set(ix.outputs)
        self.info = {v.name: v for v in [*g.value_info, *g.input, *g.output]}
        self.opset = next((int(o.version) for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
        self._names = NameAllocator.for_model(model)

    def const(self, name: str) -> np.ndarray | None:
        """The value of a constant tensor (initializer or Constant node), else None."""
        if name in self.inits:
            t = self.inits[name]
            if t.data_location == onnx.TensorProto.EXTERNAL:
                return None
            return numpy_helper.to_array(t)
        p = self.producer.get(name)
        if p is not None and p.op_type == "Constant":
            for a in p.attribute:
                if a.name == "value":
                    return numpy_helper.to_array(a.t)
                if a.name == "value_float":
                    return np.array(a.f, np.float32)
        return None

    def scalar(self, name: str) -> float | None:
        """A constant holding one value (any shape of size 1)."""
        v = self.const(name)
        if v is None or v.size != 1 or v.dtype.kind not in "fiu":
            return None
        return float(v.reshape(()))

    def prod(self, name: str, *ops: str) -> onnx.NodeProto | None:
        """The node producing `name` when its op type is one of `ops`."""
        p = self.producer.get(name)
        if p is None or p.domain not in ("", "ai.onnx") or p.op_type not in ops:
            return None
        return p

    def shape(self, name: str) -> list[int | None] | None:
        v = self.info.get(name)
        if v is None or not v.type.tensor_type.HasField("shape"):
            if name in self.inits:
                return list(self.inits[name].dims)
            return None
        return [d.dim_value if d.HasField("dim_value") else None for d in v.type.tensor_type.shape.dim]

    def elem_type(self, name: str) -> int:
        v = self.info.get(name)
        if v is not None and v.type.tensor_type.elem_type:
            return int(v.type.tensor_type.elem_type)
        return onnx.TensorProto.FLOAT

    def fresh(self, base: str) -> str:
        return self._names.exact(base)


def _close(v: float | None, want: float) -> bool:
    return v is not None and math.isclose(v, want, rel_tol=CONST_RTOL, abs_tol=0.0)


def _other(n: onnx.NodeProto, name: str) -> str | None:
    """The other input of a binary node that reads `name` (None when it does not)."""
    if len(n.input) != 2:
        return None
    if n.input[0] == name:
        return n.input[1]
    if n.input[1] == name:
        return n.input[0]
    return None


def _const_side(idx: _Index, n: onnx.NodeProto) -> tuple[str, float] | None:
    """(the non-constant input, the scalar) of a binary node with one scalar constant input."""
    if len(n.input) != 2:
        return None
    for c, x in ((1, 0), (0, 1)):
        v = idx.scalar(n.input[c])
        if v is not None and idx.const(n.input[x]) is None:
            return n.input[x], v
    return None


def _reduce_axes(idx: _Index, n: onnx.NodeProto, rank: int | None, squeezed: bool = False) -> tuple[int, ...] | str:
    """Normalized (non-negative where the rank is known) axes of a Reduce* node, or a reason.
    `squeezed`: the node must drop the reduced axes (keepdims=0; a caller checks that they are
    put back), else keep them."""
    if squeezed and int_attr(n, "keepdims", 1) != 0:
        return f"{n.op_type} {n.name!r} keeps the reduced axes where a Reshape puts them back"
    if not squeezed and int_attr(n, "keepdims", 1) != 1:
        return f"{n.op_type} {n.name!r} drops the reduced axes (keepdims=0)"
    axes: list[int] | None = None
    for a in n.attribute:
        if a.name == "axes":
            axes = list(a.ints)
    if len(n.input) > 1 and n.input[1]:
        v = idx.const(n.input[1])
        if v is None:
            return f"{n.op_type} {n.name!r} takes its axes at run time"
        axes = [int(a) for a in v.reshape(-1)]
    if not axes:
        if int_attr(n, "noop_with_empty_axes", 0):
            return f"{n.op_type} {n.name!r} reduces nothing (noop_with_empty_axes)"
        if rank is None:
            return f"{n.op_type} {n.name!r} reduces all axes of a tensor of unknown rank"
        axes = list(range(rank))
    if rank is not None:
        axes = [a + rank if a < 0 else a for a in axes]
    return tuple(sorted(axes))


def _through_expands(idx: _Index, t: str, used: list[onnx.NodeProto]) -> str:
    """The source of `t` through Expand nodes that broadcast nothing known (the BroadcastTo
    jax2tf writes before a broadcasting op: the same rank, and no static dim that changes),
    appended to `used`: the op that reads `t` broadcasts their input alike."""
    while True:
        e = idx.prod(t, "Expand")
        a = idx.shape(e.input[0]) if e is not None else None
        b = idx.shape(t) if e is not None else None
        if e is None or a is None or b is None or len(a) != len(b) or \
                any((u is None) != (v is None) or u != v for u, v in zip(a, b)):
            return t
        used.append(e)
        t = e.input[0]


def _put_back(idx: _Index, t: str, x: str, axes: tuple[int, ...], used: list[onnx.NodeProto]) -> str | None:
    """The squeezed tensor s when `t` is s (x reduced over `axes` with keepdims=0) with those
    axes put back as 1 (an Unsqueeze of exactly them, or a Reshape proven to: every static dim
    in place, at most one dim unknown, which the element count then fixes), behind
    broadcast-only Expands; the nodes are appended to `used`. None when it is not."""
    sub: list[onnx.NodeProto] = []
    t = _through_expands(idx, t, sub)
    r = idx.prod(t, "Reshape", "Unsqueeze")
    xs = idx.shape(x)
    if r is None or xs is None:
        return None
    rank = len(xs)
    if r.op_type == "Unsqueeze":
        ax = idx.const(r.input[1]) if len(r.input) > 1 else None
        got = [a.ints for a in r.attribute if a.name == "axes"]
        put = [int(v) for v in ax.reshape(-1)] if ax is not None else (list(got[0]) if got else None)
        if put is None or sorted(a + rank if a < 0 else a for a in put) != list(axes):
            return None
    else:
        out = idx.shape(r.output[0])
        if out is None or len(out) != rank or any(out[a] != 1 for a in axes):
            return None
        rest = [j for j in range(rank) if j not in axes]
        if any(out[j] is not None and xs[j] is not None and out[j] != xs[j] for j in rest) or \
                sum(out[j] is None or xs[j] is None for j in rest) > 1:
            return None
    used += [*sub, r]
    return r.input[0]


def _mean_of(idx: _Index, t: str, used: list[onnx.NodeProto], squeezed: bool = False
             ) -> tuple[str, tuple[int, ...]] | str | None:
    """(x, axes) when `t` is the mean of x over axes (ReduceMean, or ReduceSum times 1/n or
    divided by n), with the axes kept (or, `squeezed`, dropped: keepdims=0); appends the nodes
    to `used`. A mean taken with keepdims=0 and put back (`_put_back`) counts as kept."""
    if not squeezed:
        direct = _mean_of_here(idx, t, used, False)
        if direct is not None:
            return direct
        # keepdims=0, then a Reshape / Unsqueeze (and a broadcast-only Expand) back: jax2tf
        r = idx.prod(_through_expands(idx, t, []), "Reshape", "Unsqueeze")
        if r is None:
            return None
        sub: list[onnx.NodeProto] = []
        m = _mean_of_here(idx, r.input[0], sub, True)
        if not isinstance(m, tuple):
            return m
        if _put_back(idx, t, m[0], m[1], sub) != r.input[0]:
            return "a mean taken with keepdims=0 is reshaped to something else than its reduced axes put back"
        used += sub
        return m
    return _mean_of_here(idx, t, used, True)


def _mean_of_here(idx: _Index, t: str, used: list[onnx.NodeProto], squeezed: bool
                  ) -> tuple[str, tuple[int, ...]] | str | None:
    rm = idx.prod(t, "ReduceMean")
    if rm is not None:
        shape = idx.shape(rm.input[0])
        axes = _reduce_axes(idx, rm, len(shape) if shape is not None else None, squeezed)
        if isinstance(axes, str):
            return axes
        used.append(rm)
        return rm.input[0], axes
    scaled = idx.prod(t, "Mul", "Div")
    if scaled is None:
        return None
    cs = _const_side(idx, scaled)
    if cs is None:
        return None
    s, c = cs
    if scaled.op_type == "Div" and scaled.input[0] != s:
        return None
    rs = idx.prod(s, "ReduceSum")
    if rs is None:
        return None
    shape = idx.shape(rs.input[0])
    axes = _reduce_axes(idx, rs, len(shape) if shape is not None else None, squeezed)
    if isinstance(axes, str):
        return axes
    if shape is None or any(a < 0 or a >= len(shape) or not shape[a] for a in axes):
        return f"ReduceSum {rs.name!r}: the reduced size is not known, so 1/n cannot be checked"
    n = float(np.prod([int(shape[a] or 0) for a in axes]))
    want = n if scaled.op_type == "Div" else 1.0 / n
    if not _close(c, want):
        return f"{scaled.op_type} {scaled.name!r}: constant {c:g} is not {'n' if scaled.op_type == 'Div' else '1/n'} = {want:g}"
    used += [rs, scaled]
    return rs.input[0], axes


def _square_of(idx: _Index, t: str, used: list[onnx.NodeProto]) -> str | None:
    """x when `t` is x*x or Pow(x, 2)."""
    p = idx.prod(t, "Mul", "Pow")
    if p is None or len(p.input) != 2:
        return None
    if p.op_type == "Mul" and p.input[0] == p.input[1]:
        used.append(p)
        return p.input[0]
    if p.op_type == "Pow" and _close(idx.scalar(p.input[1]), 2.0):
        used.append(p)
        return p.input[0]
    return None


def _check_private(idx: _Index, nodes: list[onnx.NodeProto], output: str) -> str | None:
    """A reason when an intermediate tensor is read outside `nodes` or is a graph output."""
    ids = {id(n) for n in nodes}
    for n in nodes:
        for o in n.output:
            if not o or o == output:
                continue
            if o in idx.outputs:
                return f"intermediate {o!r} is a graph output"
            for c in idx.consumers.get(o, []):
                if id(c) not in ids:
                    return f"intermediate {o!r} is also read by {c.op_type} {c.name!r} outside the pattern"
    return None


def _why_not(idx: _Index, used: list[onnx.NodeProto], y: str, op: str, since: int) -> str | None:
    """Why the nodes `used` (writing y) cannot become `op`: an intermediate read elsewhere, or a
    model opset before `since`, where the standard defines `op`; None when they can."""
    why = _check_private(idx, used, y)
    if why is None and idx.opset < since:
        why = f"{op} needs opset {since} (the model has {idx.opset})"
    return why


# ---------------------------------------------------------------------------- LayerNorm
def _variance_of(idx: _Index, v: str, x: str, axes: tuple[int, ...], used: list[onnx.NodeProto]
                 ) -> str | None:
    """None when `v` is the (biased) variance of x over `axes`, else a reason: computed with
    the axes kept, or with keepdims=0 and the axes put back after (jax2tf, `_put_back`)."""
    sub: list[onnx.NodeProto] = []
    inner = _put_back(idx, v, x, axes, sub)
    if inner is None:
        return _variance_here(idx, v, x, axes, used, False)
    why = _variance_here(idx, inner, x, axes, sub, True)
    if why is None:
        used += sub
    return why


def _variance_here(idx: _Index, v: str, x: str, axes: tuple[int, ...], used: list[onnx.NodeProto],
                   squeezed: bool) -> str | None:
    clamp = idx.prod(v, "Relu", "Max")  # flax: max(0, E[x^2] - E[x]^2)
    if clamp is not None:
        if clamp.op_type == "Max":
            cs = _const_side(idx, clamp)
            if cs is None or cs[1] != 0.0 or len(clamp.input) != 2:
                return f"Max {clamp.name!r} before the epsilon is not a clamp at 0"
            used.append(clamp)
            v = cs[0]
        else:
            used.append(clamp)
            v = clamp.input[0]
    mean_sq = _mean_of(idx, v, used, squeezed)
    if isinstance(mean_sq, tuple):  # (x - mean)^2 form
        sq, ax2 = mean_sq
        d = _square_of(idx, sq, used)
        if d is None:
            return "the variance is not the mean of a square"
        sub = idx.prod(d, "Sub")
        if sub is None or sub.input[0] != x:
            return "the squared term is not x - mean(x)"
        m = _mean_of(idx, sub.input[1], used)
        if not isinstance(m, tuple) or m[0] != x or m[1] != axes or ax2 != axes:
            return "the variance is taken over other axes or another mean"
        used.append(sub)
        return None
    if isinstance(mean_sq, str):
        return mean_sq
    sub = idx.prod(v, "Sub")  # E[x^2] - E[x]^2 form
    if sub is None:
        return "the value under the epsilon is not a recognised variance"
    ex2 = _mean_of(idx, sub.input[0], used, squeezed)
    if not isinstance(ex2, tuple):
        return ex2 or "E[x^2] - E[x]^2: the first term is not a mean"
    if ex2[1] != axes or _square_of(idx, ex2[0], used) != x:
        return "E[x^2] - E[x]^2: the first term is not the mean of x^2 over the same axes"
    msq = _square_of(idx, sub.input[1], used)
    if msq is None:
        return "E[x^2] - E[x]^2: the second term is not a square"
    m = _mean_of(idx, msq, used, squeezed)
    if not isinstance(m, tuple) or m != (x, axes):
        return "E[x^2] - E[x]^2: the second term is not the square of mean(x) over the same axes"
    used.append(sub)
    return None


def _match_layernorm(idx: _Index, anchor: onnx.NodeProto) -> _Match | str | None:
    """Anchor: the Sqrt of (variance + eps), or Pow(variance + eps, -0.5)."""
    if anchor.op_type == "Pow" and not _close(idx.scalar(anchor.input[1]), -0.5):
        return None
    add = idx.prod(anchor.input[0], "Add")
    if add is None:
        return None
    cs = _const_side(idx, add)
    if cs is None or cs[1] < 0:
        return None
    var, eps = cs
    used: list[onnx.NodeProto] = [add, anchor]
    out = anchor.output[0]
    cons = idx.consumers.get(out, [])
    if len(cons) != 1:
        return f"{anchor.op_type} {anchor.name!r} has {len(cons)} readers"
    c = cons[0]
    gamma: np.ndarray | None = None
    if anchor.op_type == "Sqrt" and c.op_type == "Div" and c.input[1] == out:
        if idx.scalar(c.input[0]) is not None and _close(idx.scalar(c.input[0]), 1.0):
            inv, norm_op = c.output[0], None  # 1 / sqrt: a reciprocal
            used.append(c)
        else:
            inv, norm_op = None, c  # d / sqrt
    elif anchor.op_type == "Sqrt" and c.op_type == "Reciprocal":
        inv, norm_op = c.output[0], None
        used.append(c)
    elif anchor.op_type == "Pow":
        inv, norm_op = out, None
    else:
        return f"{anchor.op_type} {anchor.name!r} is read by {c.op_type}, not a division"
    norm: onnx.NodeProto
    d: str | None
    if norm_op is None and inv is not None:
        rc = idx.consumers.get(inv, [])
        if len(rc) != 1 or rc[0].op_type != "Mul":
            return "the inverse standard deviation is not read by one Mul"
        m = rc[0]
        other = _other(m, inv)
        g = idx.const(other) if other is not None else None
        if g is not None:  # rsqrt * gamma, then d * that
            gamma = g
            used.append(m)
            rc2 = idx.consumers.get(m.output[0], [])
            if len(rc2) != 1 or rc2[0].op_type != "Mul":
                return "rsqrt * scale is not read by one Mul"
            other = _other(rc2[0], m.output[0])
            m = rc2[0]
        norm, d = m, other
    elif norm_op is not None:
        norm, d = norm_op, norm_op.input[0]
    else:
        return "no normalisation node"
    norm_op = norm
    if d is None:
        return "the normalisation does not read x - mean(x)"
    used.append(norm_op)
    sub = idx.prod(d, "Sub")
    if sub is None:
        return "the normalised tensor is not x - mean(x)"
    x = sub.input[0]
    mean = _mean_of(idx, sub.input[1], used)
    if not isinstance(mean, tuple) or mean[0] != x:
        return mean if isinstance(mean, str) else "the subtracted value is not mean(x)"
    axes = mean[1]
    used.append(sub)
    why = _variance_of(idx, var, x, axes, used)
    if why is not None:
        return why
    shape = idx.shape(x)
    rank = len(shape) if shape is not None else None
    perm: list[int] | None = None  # reduced axes that are not the trailing ones: moved there and back
    if rank is None:
        if axes != (-1,):
            return "x has an unknown rank and the axes are not just the last one"
        axis, norm_shape = -1, None  # type: tuple[int, list[int] | None]
    else:
        if any(a < 0 or a >= rank for a in axes):
            return f"the reduced axes {list(axes)} are not axes of a rank-{rank} tensor"
        axis = rank - len(axes)
        if list(axes) != list(range(axis, rank)):  # LayerNormalization normalises trailing axes
            perm = [j for j in range(rank) if j not in axes] + list(axes)
        dims = [shape[a] for a in axes]  # type: ignore[index]
        norm_shape = [int(v or 0) for v in dims] if all(v for v in dims) else None
    y = norm_op.output[0]
    beta: np.ndarray | None = None
    # forward: optional Mul by a constant scale, then optional Add of a constant bias
    for op in ("Mul", "Add"):
        if op == "Mul" and gamma is not None:
            continue
        rc = idx.consumers.get(y, [])
        if len(rc) != 1 or rc[0].op_type != op or y in idx.outputs:
            continue
        other = _other(rc[0], y)
        val = idx.const(other) if other is not None else None
        if val is None:
            continue
        if op == "Mul":
            gamma = val
        else:
            beta = val
        used.append(rc[0])
        y = rc[0].output[0]
    # scale/bias must broadcast over the normalised axes only
    params: list[np.ndarray] = []
    for name, val in (("scale", gamma), ("bias", beta)):
        if val is None:
            continue
        if norm_shape is None:
            return f"the {name} cannot be checked against a normalised shape that is not static"
        k = len(norm_shape)
        if perm is not None:  # x's axes: the parameter must vary along the reduced ones only
            if val.ndim > len(perm):
                return f"the {name} of shape {list(val.shape)} has more axes than x"
            full = val.reshape((1,) * (len(perm) - val.ndim) + val.shape)
            if any(full.shape[j] != 1 for j in perm[:len(perm) - k]):
                return f"the {name} of shape {list(val.shape)} varies outside the normalised axes"
            val = np.transpose(full, perm)
        lead = val.shape[:-k] if val.ndim > k else ()
        if any(s != 1 for s in lead):
            return f"the {name} of shape {list(val.shape)} varies outside the normalised axes"
        try:
            params.append(np.broadcast_to(val.reshape(val.shape[len(lead):]), norm_shape))
        except ValueError:
            return f"the {name} of shape {list(val.shape)} does not broadcast to {norm_shape}"
    why = _why_not(idx, used, y, "LayerNormalization", 17)
    if why is not None:
        return why
    dtype = helper.tensor_dtype_to_np_dtype(idx.elem_type(x))
    inits = []
    ins = [x]
    if gamma is None:
        if norm_shape is None:
            return "no scale and the normalised shape is not static"
        gamma_arr = np.ones(norm_shape, dtype)
    else:
        gamma_arr = np.ascontiguousarray(params[0], dtype)
    sname = idx.fresh(f"{y}_ln_scale")
    inits.append(numpy_helper.from_array(gamma_arr, sname))
    ins.append(sname)
    if beta is not None:
        bname = idx.fresh(f"{y}_ln_bias")
        inits.append(numpy_helper.from_array(np.ascontiguousarray(params[-1], dtype), bname))
        ins.append(bname)
    nodes = list({id(n): n for n in used}.values())
    base = norm_op.name or y
    if perm is None:
        node = helper.make_node("LayerNormalization", ins, [y], name=idx.fresh(f"{base}_layernorm"),
                                axis=axis, epsilon=float(eps))
        return _Match(nodes, y, node, inits)
    # normalised over inner axes (jax2tf: a LayerNorm over axis 1 of (N, 512, 256)): the axes
    # moved last, normalised, moved back; Transposes move values without changing them
    xt, yt = idx.fresh(f"{y}_ln_in"), idx.fresh(f"{y}_ln_out")
    into = helper.make_node("Transpose", [x], [xt], name=idx.fresh(f"{base}_ln_transpose_in"), perm=perm)
    ln = helper.make_node("LayerNormalization", [xt, *ins[1:]], [yt], name=idx.fresh(f"{base}_layernorm"),
                          axis=-len(axes), epsilon=float(eps))
    back = helper.make_node("Transpose", [yt], [y], name=idx.fresh(f"{base}_ln_transpose_out"),
                            perm=[int(i) for i in np.argsort(perm)])
    return _Match(nodes, y, back, inits, before=[into, ln], kind="LayerNormalization")


def _unary(idx: _Index, used: list[onnx.NodeProto], x: str, y: str, op: str, since: int, base: str,
           kind: str | None = None, **attrs: Any) -> _Match | str:
    """The match of `used` (x in, y out) as the one-input op `op` (in the standard from opset
    `since`), or why not: an intermediate read elsewhere, or an older opset."""
    why = _why_not(idx, used, y, op, since)
    if why is not None:
        return why
    return _Match(used, y, helper.make_node(op, [x], [y], name=idx.fresh(f"{base}_{op.lower()}"), **attrs), kind=kind)


# ---------------------------------------------------------------------------- GELU
def _gelu_tail(idx: _Index, g_out: str, x: str, used: list[onnx.NodeProto]) -> str | None:
    """y for 0.5 * x * (1 + g) in its usual arrangements (appends the nodes), else None."""
    add = None
    rc = idx.consumers.get(g_out, [])
    if len(rc) == 1 and rc[0].op_type == "Add":
        cs = _const_side(idx, rc[0])
        if cs is not None and cs[0] == g_out and _close(cs[1], 1.0):
            add = rc[0]
    if add is None:
        return None
    used.append(add)
    t = add.output[0]
    rc = idx.consumers.get(t, [])
    if len(rc) != 1 or rc[0].op_type != "Mul":
        return None
    m1 = rc[0]
    other = _other(m1, t)
    if other is None:
        return None
    used.append(m1)
    half = idx.scalar(other)
    if _close(half, 0.5) or other == x:  # (1+g)*0.5 then *x, or x*(1+g) then *0.5
        rc2 = idx.consumers.get(m1.output[0], [])
        if len(rc2) != 1 or rc2[0].op_type != "Mul":
            return None
        m2 = rc2[0]
        o2 = _other(m2, m1.output[0])
        if o2 is None or (other == x and not _close(idx.scalar(o2), 0.5)) or (other != x and o2 != x):
            return None
        used.append(m2)
        return m2.output[0]
    p = idx.prod(other, "Mul")  # (x*0.5) * (1+g)
    cs = _const_side(idx, p) if p is not None else None
    if p is None or cs is None or cs[0] != x or not _close(cs[1], 0.5):
        return None
    used.append(p)
    return m1.output[0]


def _monomial(idx: _Index, t: str, x: str, used: list[onnx.NodeProto], depth: int = 0
              ) -> tuple[int, float] | None:
    """(p, c) when `t` is c * x^p as a tree of Mul nodes over x and scalar constants, with
    Pow(., integer) (jax2tf writes 0.044715 x^3 as x * (x * (0.044715 * x))); the tree's nodes
    are appended to `used`. None when `t` is not such a product of x."""
    if t == x:
        return 1, 1.0
    c = idx.scalar(t)
    if c is not None:
        return 0, c
    p = idx.prod(t, "Mul", "Pow")
    if p is None or len(p.input) != 2 or depth > 8:
        return None
    sub: list[onnx.NodeProto] = []
    if p.op_type == "Pow":
        e = idx.scalar(p.input[1])
        base = _monomial(idx, p.input[0], x, sub, depth + 1)
        if e is None or base is None or e != int(e) or not 1 <= e <= 4:
            return None
        power, coeff = base[0] * int(e), base[1] ** int(e)
    else:
        a = _monomial(idx, p.input[0], x, sub, depth + 1)
        b = _monomial(idx, p.input[1], x, sub, depth + 1)
        if a is None or b is None:
            return None
        power, coeff = a[0] + b[0], a[1] * b[1]
    used += [*sub, p]
    return power, coeff


def _match_gelu(idx: _Index, anchor: onnx.NodeProto) -> _Match | str | None:
    """Anchor: the Erf (x / sqrt 2) or the Tanh (sqrt(2/pi) * (x + 0.044715 x^3))."""
    used: list[onnx.NodeProto] = [anchor]
    if anchor.op_type == "Erf":
        p = idx.prod(anchor.input[0], "Div", "Mul")
        if p is None:
            return None
        cs = _const_side(idx, p)
        if cs is None or (p.op_type == "Div" and p.input[0] != cs[0]):
            return None
        x: str | None = cs[0]
        c = cs[1]
        if not _close(c, math.sqrt(2.0) if p.op_type == "Div" else 1.0 / math.sqrt(2.0)):
            return f"Erf {anchor.name!r}: its input is x times {c:g}, not x / sqrt(2)"
        used.append(p)
        approx = "none"
    else:
        p = idx.prod(anchor.input[0], "Mul")
        cs = _const_side(idx, p) if p is not None else None
        if p is None or cs is None:
            return None
        s, c = cs
        if not _close(c, math.sqrt(2.0 / math.pi)):
            return f"Tanh {anchor.name!r}: its input is scaled by {c:g}, not sqrt(2/pi)"
        add = idx.prod(s, "Add")
        if add is None or len(add.input) != 2:
            return None
        x = None
        for a, b in ((0, 1), (1, 0)):
            sub: list[onnx.NodeProto] = []
            mono = _monomial(idx, add.input[b], add.input[a], sub)
            if mono is not None and mono[0] == 3:  # x + c x^3, c x^3 written in any order
                if not _close(mono[1], 0.044715):
                    return f"Tanh {anchor.name!r}: the cubic coefficient is {mono[1]:g}, not 0.044715"
                x = add.input[a]
                used += [p, add, *sub]
                break
        if x is None:
            return None
        approx = "tanh"
    if x is None:
        return None
    y = _gelu_tail(idx, anchor.output[0], x, used)
    if y is None:
        return f"{anchor.op_type} {anchor.name!r} is not followed by 0.5 * x * (1 + .)"
    return _unary(idx, used, x, y, "Gelu", 20, anchor.name or y, approximate=approx)


# ---------------------------------------------------------------------------- Softmax
def _match_softmax(idx: _Index, anchor: onnx.NodeProto) -> _Match | str | None:
    """Anchor: the Exp of exp(x - max(x)) / sum(exp(x - max(x))) (the max is optional); the
    sum and the max taken with the axis kept, or with keepdims=0 and put back (`_put_back`;
    the max behind jax's Max(-inf, .) guard)."""
    e = anchor.output[0]
    rc = idx.consumers.get(e, [])
    rs = [c for c in rc if c.op_type == "ReduceSum"]
    dv = [c for c in rc if c.op_type == "Div" and c.input[0] == e]
    if not rs:
        return None
    if len(rc) != 2 or len(rs) != 1 or len(dv) != 1:
        return f"Exp {anchor.name!r} is read by {[c.op_type for c in rc]}, not one ReduceSum and one Div"
    rsum, div = rs[0], dv[0]
    used = [anchor, rsum, div]
    shape = idx.shape(e)
    rank = len(shape) if shape is not None else None
    squeezed = div.input[1] != rsum.output[0]
    axes = _reduce_axes(idx, rsum, rank, squeezed)
    if squeezed:
        back: list[onnx.NodeProto] = []
        if isinstance(axes, str) or _put_back(idx, div.input[1], e, axes, back) != rsum.output[0]:
            return f"Div {div.name!r} does not divide by the sum of the exponentials"
        used += back
    if isinstance(axes, str):
        return axes
    if len(axes) != 1:
        return f"ReduceSum {rsum.name!r} sums over {len(axes)} axes; Softmax takes one"
    x = anchor.input[0]
    sub = idx.prod(x, "Sub")
    if sub is not None:
        found = _max_of(idx, sub.input[1], sub.input[0], axes)
        if isinstance(found, str):
            return found
        if found is not None:
            used = [*found, sub, *used]
            x = sub.input[0]
    y = div.output[0]
    why = _check_private(idx, used, y)
    if why is not None:
        return why
    if idx.opset < 13:
        return f"Softmax over one axis needs opset 13 (the model has {idx.opset})"
    node = helper.make_node("Softmax", [x], [y], name=idx.fresh(f"{div.name or y}_softmax"), axis=axes[0])
    return _Match(used, y, node)


def _max_of(idx: _Index, m: str, x: str, axes: tuple[int, ...]) -> list[onnx.NodeProto] | str | None:
    """The nodes when `m` is max(x) over `axes` (ReduceMax with them kept, or dropped and put
    back, behind a Max(-inf, .) guard); a reason when it is a max over other axes; None when it
    is no max of x."""
    used: list[onnx.NodeProto] = []
    mx = idx.prod(m, "ReduceMax")
    squeezed = False
    if mx is None:
        r = idx.prod(_through_expands(idx, m, []), "Reshape", "Unsqueeze")
        if r is None:
            return None
        inner = r.input[0]
        guard = idx.prod(inner, "Max")
        if guard is not None:
            cs = _const_side(idx, guard)
            if cs is None or cs[1] != -math.inf:
                return None
            used.append(guard)
            inner = cs[0]
        mx = idx.prod(inner, "ReduceMax")
        if mx is None or _put_back(idx, m, x, axes, used) != r.input[0]:
            return None
        squeezed = True
    if mx.input[0] != x:
        return None
    shape = idx.shape(x)
    max_axes = _reduce_axes(idx, mx, len(shape) if shape is not None else None, squeezed)
    if isinstance(max_axes, str):
        return max_axes
    if max_axes != axes:
        return f"the max is taken over axes {list(max_axes)}, the sum over {list(axes)}"
    return [mx, *used]


# ---------------------------------------------------------------------------- HardSwish
def _sixth(idx: _Index, n: onnx.NodeProto, t: str) -> bool:
    """Whether `n` is `t / 6` or `t * (1/6)`."""
    cs = _const_side(idx, n)
    if cs is None or cs[0] != t:
        return False
    return (n.op_type == "Div" and n.input[0] == t and _close(cs[1], 6.0)) or \
        (n.op_type == "Mul" and _close(cs[1], 1.0 / 6.0))


def _match_hardswish(idx: _Index, anchor: onnx.NodeProto) -> _Match | str | None:
    """Anchor: the Clip of relu6(x + 3) (then / 6 and * x, in either order: paddle2onnx, tf2onnx,
    torch before opset 14), or a HardSigmoid(alpha 1/6, beta 0.5) then * x. Fused into
    HardSwish(x); relu6(x + 3) / 6 read by anything but x's Mul is HardSigmoid(x) (a gate)."""
    used: list[onnx.NodeProto] = [anchor]
    if anchor.op_type == "HardSigmoid":
        if not (_close(float_attr(anchor, "alpha", 0.2), 1.0 / 6.0) and _close(float_attr(anchor, "beta", 0.5), 0.5)):
            return None
        x, g, scaled = anchor.input[0], anchor.output[0], True
    else:
        if len(anchor.input) != 3 or idx.scalar(anchor.input[1]) != 0.0 or not _close(idx.scalar(anchor.input[2]), 6.0):
            return None
        add = idx.prod(anchor.input[0], "Add")
        cs = _const_side(idx, add) if add is not None else None
        if add is None or cs is None or not _close(cs[1], 3.0):
            return None
        x, g = cs[0], anchor.output[0]
        used.append(add)
        rc = idx.consumers.get(g, [])
        scaled = len(rc) == 1 and _sixth(idx, rc[0], g)
        if scaled:
            used.append(rc[0])
            g = rc[0].output[0]
    rc = idx.consumers.get(g, [])
    mul = rc[0] if len(rc) == 1 and rc[0].op_type == "Mul" and _other(rc[0], g) == x else None
    if mul is None:  # no * x: a gate, relu6(x + 3) / 6
        if anchor.op_type == "HardSigmoid" or not scaled:
            return f"Clip {anchor.name!r}: relu6(x + 3) is read by {len(rc)} nodes" \
                if anchor.op_type == "Clip" and len(rc) > 1 else None
        return _unary(idx, used, x, g, "HardSigmoid", 6, anchor.name or g, kind="HardSigmoid",
                      alpha=1.0 / 6.0, beta=0.5)
    used.append(mul)
    y = mul.output[0]
    if not scaled:  # x * relu6(x + 3), then / 6
        rc = idx.consumers.get(y, [])
        if len(rc) != 1 or not _sixth(idx, rc[0], y):
            return f"Clip {anchor.name!r}: x * relu6(x + 3) is not divided by 6"
        used.append(rc[0])
        y = rc[0].output[0]
    return _unary(idx, used, x, y, "HardSwish", 14, anchor.name or y)


# ---------------------------------------------------------------------------- Mish
def _match_mish(idx: _Index, anchor: onnx.NodeProto) -> _Match | str | None:
    """Anchor: the Tanh of x * tanh(softplus(x)), softplus as Softplus(x) or Log(Exp(x) + 1)
    (torch before opset 18, tf2onnx). Fused into Mish(x)."""
    used: list[onnx.NodeProto] = [anchor]
    sp = idx.prod(anchor.input[0], "Softplus", "Log")
    if sp is None:
        return None
    if sp.op_type == "Softplus":
        x = sp.input[0]
        used.append(sp)
    else:
        add = idx.prod(sp.input[0], "Add")
        cs = _const_side(idx, add) if add is not None else None
        exp = idx.prod(cs[0], "Exp") if cs is not None and _close(cs[1], 1.0) else None
        if add is None or exp is None:
            return None
        x = exp.input[0]
        used += [sp, add, exp]
    rc = idx.consumers.get(anchor.output[0], [])
    if len(rc) != 1 or rc[0].op_type != "Mul" or _other(rc[0], anchor.output[0]) != x:
        return f"Tanh {anchor.name!r}: tanh(softplus(x)) is not multiplied by x alone"
    used.append(rc[0])
    y = rc[0].output[0]
    return _unary(idx, used, x, y, "Mish", 18, anchor.name or y)


# ---------------------------------------------------------------------------- GroupNorm
def _channel_affine(idx: _Index, t: str, op: str, rank: int, channels: int,
                    used: list[onnx.NodeProto]) -> tuple[str, np.ndarray | None]:
    """(its output, the constant per channel) where `t`'s one reader is `op` (Mul or Add) by a
    constant that is one value per channel (the node is appended to `used`), else (t, None)."""
    rc = idx.consumers.get(t, [])
    if len(rc) != 1 or rc[0].op_type != op or rc[0].domain not in ("", "ai.onnx"):
        return t, None
    other = _other(rc[0], t)
    c = idx.const(other) if other is not None else None
    v = per_channel(c, rank, channels) if c is not None else None
    if v is None:
        return t, None
    used.append(rc[0])
    return rc[0].output[0], v


def _match_groupnorm(idx: _Index, anchor: onnx.NodeProto) -> _Match | str | None:
    """Anchor: an InstanceNormalization (constant per-group scale and bias: 1 and 0 as torch
    exports nn.GroupNorm, the group's own as prepare expands the deprecated
    GroupNormalization-18) of x reshaped to (N, G, -1), then reshaped back to x's shape and
    (optionally) times a per-channel gamma plus a per-channel beta. Fused into
    GroupNormalization (opset 21: per-channel scale and bias), quantized at its input and
    output only."""
    if len(anchor.input) != 3:
        return None
    scale, bias = idx.const(anchor.input[1]), idx.const(anchor.input[2])
    reshape = idx.prod(anchor.input[0], "Reshape")
    target = idx.const(reshape.input[1]) if reshape is not None and len(reshape.input) > 1 else None
    if scale is None or bias is None or reshape is None or target is None:
        return None
    if target.ndim != 1 or target.size != 3 or int(target[2]) != -1 or int(target[1]) != scale.size:
        return None
    if scale.size != bias.size or not (np.all(np.isfinite(scale)) and np.all(np.isfinite(bias))):
        return f"InstanceNormalization {anchor.name!r}: its scale / bias are not one finite value per group"
    groups, x = int(target[1]), reshape.input[0]
    shape = idx.shape(x)
    if shape is None or len(shape) < 3 or not shape[1]:
        return f"InstanceNormalization {anchor.name!r}: the rank or the channels of {x!r} are not known"
    if (int(target[0]) != 0 or int_attr(reshape, "allowzero", 0)) and shape[0] != int(target[0]):
        return f"Reshape {reshape.name!r}: its target does not keep the batch dim of {x!r}"
    rank, channels = len(shape), int(shape[1])
    if channels % groups:
        return f"InstanceNormalization {anchor.name!r}: {channels} channels are not {groups} groups"
    rc = idx.consumers.get(anchor.output[0], [])
    back = rc[0] if len(rc) == 1 and rc[0].op_type == "Reshape" and len(rc[0].input) > 1 else None
    if back is None:
        return f"InstanceNormalization {anchor.name!r}: its output is not reshaped back alone"
    used: list[onnx.NodeProto] = [reshape, anchor, back]
    src = idx.prod(back.input[1], "Shape")
    back_target = idx.const(back.input[1])
    if src is not None and src.input[0] == x and not src.attribute:
        used.append(src)
    elif back_target is None or any(d is None for d in shape) or [int(d) for d in back_target] != shape:
        return f"Reshape {back.name!r}: the normalized tensor is not reshaped back to the shape of {x!r}"
    y, gamma = _channel_affine(idx, back.output[0], "Mul", rank, channels, used)
    y, beta = _channel_affine(idx, y, "Add", rank, channels, used)
    why = _why_not(idx, used, y, "GroupNormalization", 21)  # opset 21: scale and bias per channel
    if why is not None:
        return why
    dtype = helper.tensor_dtype_to_np_dtype(idx.elem_type(x))
    # gamma * (s_g * x_hat + b_g) + beta, per channel c of group g
    g64 = gamma.astype(np.float64) if gamma is not None else np.ones(channels)
    s_c, b_c = (np.repeat(v.astype(np.float64).reshape(-1), channels // groups) for v in (scale, bias))
    params = [g64 * s_c, g64 * b_c + (beta.astype(np.float64) if beta is not None else 0.0)]
    names = [idx.fresh(f"{y}_gn_{p}") for p in ("scale", "bias")]
    inits = [numpy_helper.from_array(np.ascontiguousarray(v, dtype), n) for v, n in zip(params, names)]
    node = helper.make_node("GroupNormalization", [x, *names], [y], name=idx.fresh(f"{anchor.name or y}_groupnorm"),
                            num_groups=groups, epsilon=float_attr(anchor, "epsilon", 1e-5))
    return _Match(used, y, node, inits)


# ---------------------------------------------------------------------------- Einsum as MatMul
def _match_einsum(idx: _Index, anchor: onnx.NodeProto) -> _Match | str | None:
    """Anchor: an Einsum of a run-time tensor and a constant weight that is a matrix product:
    the tensor's labels are batch labels then the contracted ones, the output's the same batch
    labels then the weight's free ones ('bsd,df->bsf', 'bsd,dhk->bshk', 'bshk,hkd->bsd',
    '...d,fd->...f'). It becomes MatMul with the weight laid out as (contracted, free), between
    Reshapes where more than one label is contracted or free: the same products and sums,
    and a layer every format quantizes (JAX and TF exports write dense layers this way)."""
    if len(anchor.input) != 2:
        return None
    eq = next((a.s.decode() for a in anchor.attribute if a.name == "equation"), "").replace(" ", "")
    if "->" not in eq:
        return f"Einsum {anchor.name!r}: equation {eq!r} has no explicit output"
    lhs, out = eq.split("->")
    terms = lhs.split(",")
    if len(terms) != 2:
        return None
    consts = [i for i, t in enumerate(anchor.input) if idx.const(t) is not None]
    if not consts:
        return _batched_matmul(idx, anchor, terms, out)
    if len(consts) != 1:
        return f"Einsum {anchor.name!r} has two constant operands"
    wi = consts[0]
    x, w_name = anchor.input[1 - wi], anchor.input[wi]
    xt, wt = terms[1 - wi], terms[wi]
    if "." in wt:
        return f"Einsum {anchor.name!r}: an ellipsis on the weight"
    rank = len(idx.shape(x) or []) if "..." in xt else 0
    if "..." in xt and (not xt.startswith("...") or not out.startswith("...") or not rank):
        return f"Einsum {anchor.name!r}: an ellipsis that is not the leading batch dims of known rank"
    ell = rank - len(xt.replace("...", "")) if "..." in xt else 0  # dims the ellipsis stands for
    xl, ol = list(xt.replace("...", "")), list(out.replace("...", ""))
    if any(len(set(t)) != len(t) for t in (xl, list(wt), ol)):
        return f"Einsum {anchor.name!r}: a label repeated within one operand (a diagonal)"
    c = [a for a in xl if a in wt and a not in ol]
    f = [a for a in wt if a in ol and a not in xl]
    b = [a for a in xl if a in ol and a not in wt]
    if set(wt) != set(c) | set(f) or set(xl) != set(b) | set(c) or ol != b + f or xl != b + c or not c or not f:
        return (f"Einsum {anchor.name!r}: {eq!r} is no matrix product of batch, contracted and free "
                "labels in that order")
    w = idx.const(w_name)
    assert w is not None  # consts above
    if w.dtype.kind != "f":
        return f"Einsum {anchor.name!r}: a weight of dtype {w.dtype}"
    dims = dict(zip(wt, w.shape))
    kc, kf = int(np.prod([dims[a] for a in c])), [int(dims[a]) for a in f]
    w2 = np.ascontiguousarray(np.transpose(w, [wt.index(a) for a in c + f]).reshape(kc, int(np.prod(kf))))
    y = anchor.output[0]
    nb = ell + len(b)  # leading batch dims, copied by the Reshapes' zeros
    base = anchor.name or y
    inits = [numpy_helper.from_array(w2, idx.fresh(f"{w_name}_matmul"))]
    before: list[onnx.NodeProto] = []
    x2 = x
    if len(c) > 1:
        inits.append(numpy_helper.from_array(np.array([0] * nb + [kc], np.int64), idx.fresh(f"{base}_in_shape")))
        x2 = idx.fresh(f"{base}_in")
        before.append(helper.make_node("Reshape", [x, inits[-1].name], [x2], name=idx.fresh(f"{base}_reshape_in")))
    if len(f) == 1:
        node = helper.make_node("MatMul", [x2, inits[0].name], [y], name=idx.fresh(f"{base}_matmul"))
        return _Match([anchor], y, node, inits, before)
    m = idx.fresh(f"{base}_mm")
    before.append(helper.make_node("MatMul", [x2, inits[0].name], [m], name=idx.fresh(f"{base}_matmul")))
    inits.append(numpy_helper.from_array(np.array([0] * nb + kf, np.int64), idx.fresh(f"{base}_out_shape")))
    node = helper.make_node("Reshape", [m, inits[-1].name], [y], name=idx.fresh(f"{base}_reshape_out"))
    return _Match([anchor], y, node, inits, before)


def _batched_matmul(idx: _Index, anchor: onnx.NodeProto, terms: list[str], out: str) -> _Match | str:
    """An Einsum of two run-time tensors that is a batched matrix product, as attention writes
    it ('bhqd,bhkd->bhqk', 'bhqk,bhkd->bhqd', XLNet's 'ibnd,jbnd->bnij'): every label is a
    batch label (in all three terms), the row (first operand and output), the column (second
    operand and output) or the contracted one (both operands), one of each of the last three.
    It becomes MatMul of the operands laid out as (batch, row, contracted) and (batch,
    contracted, column), with Transposes where a term's order differs (none under an ellipsis,
    whose rank the permutation would need)."""
    a, b = terms
    no = f"Einsum {anchor.name!r}: {'->'.join([','.join(terms), out])!r} is no batched matrix product"
    ell = a.startswith("...")
    if "." in (a + b + out).replace("...", "") or (ell and not (b.startswith("...") and out.startswith("..."))) \
            or (not ell and "..." in b + out):
        return no + " of two run-time tensors (an ellipsis that is not the leading batch dims of all three)"
    a, b, out = (t.replace("...", "") for t in (a, b, out))
    if any(len(set(t)) != len(t) for t in (a, b, out)):
        return no + " (a label repeated within one term)"
    batch = [x for x in out if x in a and x in b]
    row = [x for x in a if x in out and x not in b]
    col = [x for x in b if x in out and x not in a]
    con = [x for x in a if x in b and x not in out]
    if len(row) != 1 or len(col) != 1 or len(con) != 1 or set(a) != {*batch, *row, *con} or \
            set(b) != {*batch, *col, *con} or set(out) != {*batch, *row, *col}:
        return no + " of two run-time tensors"
    want_a, want_b, got = "".join(batch + row + con), "".join(batch + con + col), "".join(batch + row + col)
    y, base = anchor.output[0], anchor.name or anchor.output[0]
    if ell and (a != want_a or b != want_b or out != got):
        return no + " without a Transpose (under an ellipsis, whose rank it would need)"
    before: list[onnx.NodeProto] = []

    def laid_out(name: str, have: str, want: str) -> str:
        if have == want:
            return name
        t = idx.fresh(f"{base}_{name}_t")
        before.append(helper.make_node("Transpose", [name], [t], name=idx.fresh(f"{base}_transpose"),
                                       perm=[have.index(x) for x in want]))
        return t

    x1, x2 = laid_out(anchor.input[0], a, want_a), laid_out(anchor.input[1], b, want_b)
    if out == got:
        return _Match([anchor], y, helper.make_node("MatMul", [x1, x2], [y], name=idx.fresh(f"{base}_matmul")),
                      [], before)
    mm = idx.fresh(f"{base}_mm")
    before.append(helper.make_node("MatMul", [x1, x2], [mm], name=idx.fresh(f"{base}_matmul")))
    node = helper.make_node("Transpose", [mm], [y], name=idx.fresh(f"{base}_transpose_out"),
                            perm=[got.index(x) for x in out])
    return _Match([anchor], y, node, [], before)


def einsum_verdicts(model: onnx.ModelProto) -> list[str | None]:
    """For each Einsum of `model`'s main graph: None where the recognition pass rewrites it as
    MatMul (a matrix product with a constant weight, or a batched one), else why it stays an
    Einsum. Shapes are
    inferred on a copy where an ellipsis needs a rank (prepare infers them before the pass)."""
    if any(n.op_type == "Einsum" and "..." in onnx.helper.get_attribute_value(a).decode()
           for n in model.graph.node for a in n.attribute if a.name == "equation"):
        try:
            model = onnx.shape_inference.infer_shapes(model)
        except Exception:  # noqa: BLE001 - a model inference rejects: the ranks stay unknown
            pass
    idx = _Index(model)
    out: list[str | None] = []
    for n in model.graph.node:
        if n.op_type == "Einsum" and n.domain in ("", "ai.onnx"):
            res = _match_einsum(idx, n)
            out.append(None if isinstance(res, _Match) else
                       res or "not an Einsum of two operands")
    return out


_RULES: list[tuple[str, tuple[str, ...], Callable[[_Index, onnx.NodeProto], _Match | str | None]]] = [
    ("LayerNormalization", ("Sqrt", "Pow"), _match_layernorm),
    ("Gelu", ("Erf", "Tanh"), _match_gelu),
    ("Softmax", ("Exp",), _match_softmax),
    ("HardSwish", ("Clip", "HardSigmoid"), _match_hardswish),
    ("Mish", ("Tanh",), _match_mish),
    ("GroupNormalization", ("InstanceNormalization",), _match_groupnorm),
    ("MatMul", ("Einsum",), _match_einsum),
]


def _apply(model: onnx.ModelProto, matches: list[_Match]) -> None:
    g = model.graph
    last: dict[int, _Match] = {}
    pos = {id(n): i for i, n in enumerate(g.node)}
    for m in matches:  # the fused node goes where the last replaced node was
        last_id = max((id(n) for n in m.nodes), key=lambda i: pos[i])
        last[last_id] = m
    drop = {id(n) for m in matches for n in m.nodes}
    new_nodes = []
    for n in g.node:
        if id(n) in last:
            new_nodes.extend([*last[id(n)].before, last[id(n)].new_node])
        if id(n) not in drop:
            new_nodes.append(n)
    gone = {o for m in matches for n in m.nodes for o in n.output if o != m.output}
    del g.node[:]
    g.node.extend(new_nodes)
    for m in matches:
        g.initializer.extend(m.new_inits)
    keep_vi = [v for v in g.value_info if v.name not in gone]
    del g.value_info[:]
    g.value_info.extend(keep_vi)
    # constants only the replaced nodes read
    read = {i for n in g.node for i in n.input} | {o.name for o in g.output}
    for n in g.node:
        for a in n.attribute:
            if a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS):
                return  # subgraphs may read outer constants: leave the initializers alone
    keep = [t for t in g.initializer if t.name in read]
    if len(keep) != len(g.initializer):
        del g.initializer[:]
        g.initializer.extend(keep)


def recognize(model: onnx.ModelProto, kept: Callable[[str], bool] = lambda name: False) -> RecognizeReport:
    """Fuse written-out LayerNorm, GELU, Softmax, HardSwish, Mish and GroupNorm of `model`'s main graph into the native ops,
    in place, where the fusion is exact in meaning. Run it on a model whose shapes are inferred
    (the ReduceSum-times-1/n forms and the normalised axes need static shapes). A match holding
    a node `kept` names (one a config names) is declined: the config must still find it."""
    report = RecognizeReport()
    for kind, anchors, rule in _RULES:
        idx = _Index(model)
        matches: list[_Match] = []
        claimed: set[int] = set()
        for node in list(model.graph.node):
            if node.op_type not in anchors or node.domain not in ("", "ai.onnx") or id(node) in claimed:
                continue
            res = rule(idx, node)
            if res is None:
                continue
            if isinstance(res, str):
                report.declined.append(Declined(kind, node.name or node.output[0], res))
                continue
            named = next((n.name for n in res.nodes if kept(n.name)), None)
            if named is not None:
                report.declined.append(Declined(kind, node.name or node.output[0],
                                                f"node {named!r} is named in the config: kept as written"))
                continue
            ids = {id(n) for n in res.nodes}
            if ids & claimed:
                continue
            claimed |= ids
            matches.append(res)
            report.fused.append(Fusion(res.kind or kind, res.output, [n.name or n.output[0] for n in res.nodes]))
        if matches:
            _apply(model, matches)
    return report
