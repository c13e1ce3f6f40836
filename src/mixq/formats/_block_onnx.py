"""ONNX emission of block formats: one model-local function per (format, axis, rounding).

Built from standard opset-21 ops onnxruntime CPU implements, bit-identical to
BlockFormat.fake_quant. Design (why, not what):

* No Transpose: x is padded along `axis` to a multiple of the block and reshaped to
  (pre, nblocks, block, post) so ReduceMax over axis 2 gives the block maxima in place, for any
  axis and rank (the shapes are computed at run time, so every dim may stay dynamic).
* Shapes for onnxruntime's planner: only the per-block quantities live in the blocked layout;
  the per-block step is brought back by a blocked DequantizeLinear of int8 ones shaped like x,
  so every full-size tensor (and the output) has exactly x's symbolic shape, and the blocked /
  per-block tensors have no inferred shape at all (their Reshape targets end with a tensor of
  unknown rank). A tensor with known rank but unknown dims made onnxruntime's memory planner
  scan its whole free list in vain, and stay there: with many calls on dynamic shapes session
  creation was quadratic (80-110 s for ~200 calls); bench/block_session_bench.py measures it.
* Exact exponents without BitCast (opset 26): an estimate floor(log(a) / ln 2), corrected by
  one comparison against each of 2**e and 2**(e+1) taken from a 278-entry table of exact powers
  of two (Gather), which also yields every scale and step exactly (Pow is not guaranteed exact).
  Tiny maxima are pre-scaled by 2**64 so a libm that mishandles subnormals cannot derail it.
* NaN/Inf: onnxruntime's ReduceMax does not propagate NaN reliably, so a per-block
  ReduceSum(x * 0) (NaN iff the block holds NaN or inf) is added to the per-block step: any
  later product with the step is NaN.
* Scaling by 2**k is done with Mul/Div by exact powers of two; elements are rounded with Round
  (half to even) and clipped (saturation) for integer elements, with Cast to float8 (saturate,
  round to nearest even; fp6 via an exponent-aligned float8 type) or a 2-step binade ladder
  (fp4) for float elements.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

from mixq.errors import FormatError

from .base import MIXQ_DOMAIN, MIXQ_DOMAIN_VERSION, Emission, Rounding
from .onnx_util import ONNX_OPSET, const_node, make_function

#: _POW2[i] = 2**(i - 149) in float32 (exact; the last entry, 2**128, is inf).
_POW2_OFFSET = 149
_POW2 = np.append(np.ldexp(1.0, np.arange(-149, 128)), np.inf).astype(np.float32)

#: fp6 elements are rounded by a float8 Cast after scaling by 2**-shift, which aligns the fp6
#: subnormal step with the float8 one (same mantissa width): (float8 type, shift).
_CAST_ELEMENTS = {
    "fp8_e4m3fn": (TensorProto.FLOAT8E4M3FN, 0),
    "fp8_e5m2": (TensorProto.FLOAT8E5M2, 0),
    "fp6_e2m3": (TensorProto.FLOAT8E4M3FN, 6),
    "fp6_e3m2": (TensorProto.FLOAT8E5M2, 12),
}


class _Body:
    """Accumulates function-body nodes with unique value names."""

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self._n = 0
        self._consts: dict[tuple, str] = {}

    def op(self, op_type: str, *inputs: str, out: str | None = None, **attrs: object) -> str:
        self._n += 1
        name = out or f"t{self._n}_{op_type}"
        self.nodes.append(helper.make_node(op_type, list(inputs), [name], **attrs))
        return name

    def const(self, value: object, dtype: object = np.float32) -> str:
        """A Constant, shared by every use of the same value (fewer nodes per call)."""
        arr = np.asarray(value, dtype=dtype)
        key = (arr.dtype.str, arr.shape, arr.tobytes())
        if key not in self._consts:
            self._n += 1
            self._consts[key] = name = f"c{self._n}"
            self.nodes.append(const_node(name, arr))
        return self._consts[key]


def _exponent(b: _Body, a: str, flag: str) -> str:
    """floor(log2(a)) (float, exact integer value) of finite-sanitized per-block maxima `a`."""
    bad = b.op("IsNaN", flag)
    a = b.op("Where", bad, b.const(1.0), a)  # NaN/inf maxima: any finite stand-in
    a = b.op("Max", a, b.const(2.0 ** -149))  # zero blocks: any exponent will do
    small = b.op("Less", a, b.const(2.0 ** -100))
    a2 = b.op("Mul", a, b.op("Where", small, b.const(2.0 ** 64), b.const(1.0)))
    est = b.op("Floor", b.op("Mul", b.op("Log", a2), b.const(1.0 / np.log(2.0))))
    est = b.op("Add", est, b.op("Where", small, b.const(-64.0), b.const(0.0)))
    est = b.op("Clip", est, b.const(-149.0), b.const(127.0))
    table = b.const(_POW2)
    idx = b.op("Cast", b.op("Add", est, b.const(float(_POW2_OFFSET))), to=TensorProto.INT64)
    lo = b.op("Gather", table, idx)
    hi = b.op("Gather", table, b.op("Add", idx, b.const(1, np.int64)))
    up = b.op("Cast", b.op("GreaterOrEqual", a, hi), to=TensorProto.FLOAT)
    down = b.op("Cast", b.op("Less", a, lo), to=TensorProto.FLOAT)
    return b.op("Sub", b.op("Add", est, up), down)


def _pow2(b: _Body, e: str) -> str:
    """2**e (float32, exact) for a float tensor `e` of integer values in [-149, 128]."""
    idx = b.op("Cast", b.op("Add", e, b.const(float(_POW2_OFFSET))), to=TensorProto.INT64)
    return b.op("Gather", b.const(_POW2), idx)


def _round(b: _Body, y: str, rounding: Rounding, sign_of: str) -> str:
    """Round `y` = `sign_of` / step to integers (`sign_of` carries the sign even where y underflowed)."""
    if rounding is Rounding.HALF_EVEN:
        return b.op("Round", y)
    # sign * (floor|y| + [frac >= 0.5]): exact, unlike floor(|y| + 0.5) at |y| = 0.5 - 2**-25
    a = b.op("Abs", y)
    t = b.op("Floor", a)
    up = b.op("Cast", b.op("GreaterOrEqual", b.op("Sub", a, t), b.const(0.5)), to=TensorProto.FLOAT)
    return b.op("Mul", b.op("Sign", sign_of), b.op("Add", t, up))


def build_function(fmt, axis: int, rounding: Rounding) -> onnx.FunctionProto:
    """The FunctionProto `fmt.function_name(axis, rounding)`: input x, output y."""
    if rounding is not Rounding.HALF_EVEN and fmt.element != "int":
        raise FormatError(f"ONNX emission of {fmt.name} supports only Rounding.HALF_EVEN "
                          f"(its elements are rounded by float8 casts), got {rounding}")
    b = _Body()
    B, S = fmt.block_size, fmt.sub_block
    i64 = np.int64
    one = b.const([1], i64)
    # -- shapes: d = dim along axis, post = product of the dims after it, nb = blocks ------------
    if axis == -1:
        head = b.op("Shape", "x", end=-1)
        d = b.op("Shape", "x", start=-1)
        tail = None
        post = one
    else:
        head = b.op("Shape", "x", end=axis)
        d = b.op("Shape", "x", start=axis, end=axis + 1)
        tail = b.op("Shape", "x", start=axis + 1)
        post = b.op("ReduceProd", b.op("Concat", one, tail, axis=0), keepdims=1)
    nb = b.op("Div", b.op("Add", d, b.const([B - 1], i64)), b.const([B], i64))
    pad = b.op("Sub", b.op("Mul", nb, b.const([B], i64)), d)
    # `post` again, as a tensor of unknown rank for shape inference (reshaped to [1] by a shape
    # vector sliced up to a run-time end), so that the blocked and per-block tensors below have
    # no shape at all rather than a known rank with unknown dims. onnxruntime's memory planner
    # scans its whole free list for every output whose shape it cannot match, and such tensors
    # stay in that list: session creation became quadratic in the number of calls on dynamic
    # shapes. Outputs without a shape are not looked up.
    hpost = b.op("Reshape", post, b.op("Slice", one, b.const([0], i64), b.op("Add", d, one)))

    def hidden(*parts: str) -> str:
        """A Reshape target (ending with `post`) whose length shape inference cannot know."""
        return b.op("Concat", *parts, hpost, axis=0)

    # -- blocked view of x, padded along axis to whole blocks: (pre, nb, B, post) --------------
    xp = b.op("Pad", b.op("Reshape", "x", hidden(b.const([-1], i64), d)),
              b.op("Concat", b.const([0], i64), pad, axis=0), b.const(0.0), b.const([1], i64),
              mode="constant")
    inner = b.const([B // S, S] if S > 1 else [B], i64)
    v = b.op("Reshape", xp, hidden(b.const([-1], i64), nb, inner))
    # -- per-block maxima and the non-finite flag (on the blocked view; from here on the
    #    per-block tensors are B times smaller than x) ------------------------------------------
    av = b.op("Abs", v)
    if S > 1:
        submax = b.op("ReduceMax", av, b.const([3], i64), keepdims=1)  # (pre, nb, B/S, 1, post)
        amax = b.op("ReduceMax", submax, b.const([2], i64), keepdims=1)
        flag_axes = b.const([2, 3], i64)
    else:
        amax = b.op("ReduceMax", av, b.const([2], i64), keepdims=1)  # (pre, nb, 1, post)
        flag_axes = b.const([2], i64)
    flag = b.op("ReduceSum", b.op("Mul", v, b.const(0.0)), flag_axes, keepdims=1)
    # int8 ones shaped like x (0 where x is NaN: that block's scale is NaN anyway), stacked twice
    # along a new leading axis: onnxruntime takes a one-element scale for per-tensor and then
    # rejects block_size (a single block, e.g. a [1, 8, 1, 1] tensor), two elements never are
    ones1 = b.op("Unsqueeze", b.op("Cast", b.op("Equal", "x", "x"), to=TensorProto.INT8), b.const([0], i64))
    ones = b.op("Concat", ones1, ones1, axis=0)
    dq_axis = axis + 1 if axis >= 0 else axis

    def to_x(t: str, groups: str, k: int) -> str:
        """Per-group tensor `t` (`groups` groups of k along axis) repeated k times along axis,
        cut to d: a tensor of exactly x's (symbolic) shape, by a blocked DequantizeLinear."""
        n = b.op("Div", b.op("Add", d, b.const([k - 1], i64)), b.const([k], i64))  # ceil(d / k)
        t = b.op("Reshape", t, hidden(b.const([-1], i64), groups))
        if k != B:  # sub-blocks: the padding may hold whole ones
            t = b.op("Slice", t, b.const([0], i64), n, b.const([1], i64))
        parts = [head, n] + ([tail] if tail is not None else [])
        # both copies in one flat Concat of rank-unknown tensors, then one (aliasing) Reshape
        two = b.op("Concat", t, t, axis=0)
        # allowzero: a zero-length dim in the target is a real 0, not "copy the input's dim"
        tx = b.op("Reshape", two, b.op("Concat", b.const([2], i64), *parts, axis=0), allowzero=1)
        full = b.op("DequantizeLinear", ones, tx, axis=dq_axis, block_size=k)
        return b.op("Gather", full, b.const(0, i64), axis=0)

    e = _exponent(b, amax, flag)
    lo, hi = fmt.scale_range
    if fmt.element == "int":
        s = b.op("Clip", e, b.const(float(lo)), b.const(float(hi)))
        step = b.op("Add", _pow2(b, b.op("Add", s, b.const(float(1 - fmt.mant_bits)))), flag)
        if S > 1:  # microexponent: sub-blocks below 2**s use the binade below (step / 2)
            # step * 2**(mant - 1) = 2**s exactly (a power of two within float32's range)
            fits_lower = b.op("Less", submax, b.op("Mul", step, b.const(2.0 ** (fmt.mant_bits - 1))))
            step = b.op("Where", fits_lower, b.op("Mul", step, b.const(0.5)), step)  # (.., B/S, 1, ..)
            step = to_x(step, b.op("Mul", nb, b.const([B // S], i64)), S)
        else:
            step = to_x(step, nb, B)
        m = _round(b, b.op("Div", "x", step), rounding, "x")
        m = b.op("Clip", m, b.const(float(-fmt.max_code)), b.const(float(fmt.max_code)))
        b.op("Mul", m, step, out="y")
    else:
        ef = fmt.element_format
        s = b.op("Clip", b.op("Sub", e, b.const(float(ef.emax))), b.const(float(lo)), b.const(float(hi)))
        if fmt.element in _CAST_ELEMENTS:
            f8, shift = _CAST_ELEMENTS[fmt.element]
            # inv = 2**-(s + shift) is in [2**-139, 2**127]: representable, unlike its inverse
            inv = b.op("Add", _pow2(b, b.op("Neg", b.op("Add", s, b.const(float(shift))))), flag)
            inv = to_x(inv, nb, B)
            y = b.op("Mul", "x", inv)
            r = b.op("Cast", b.op("Cast", y, to=f8, saturate=1), to=TensorProto.FLOAT)
            if shift:
                lim = float(ef.max_normal) * 2.0 ** -shift
                r = b.op("Clip", r, b.const(-lim), b.const(lim))
        elif fmt.element == "fp4_e2m1":
            inv = to_x(b.op("Add", _pow2(b, b.op("Neg", s)), flag), nb, B)
            y = b.op("Mul", "x", inv)
            ay = b.op("Abs", y)
            st = b.op("Where", b.op("GreaterOrEqual", ay, b.const(2.0)), b.const(1.0), b.const(0.5))
            st = b.op("Where", b.op("GreaterOrEqual", ay, b.const(4.0)), b.const(2.0), st)
            r = b.op("Mul", b.op("Round", b.op("Div", y, st)), st)
            r = b.op("Clip", r, b.const(-float(ef.max_normal)), b.const(float(ef.max_normal)))
        else:  # pragma: no cover - every OCP element is handled above
            raise FormatError(f"no ONNX element rounding for {fmt.element}")
        b.op("Div", r, inv, out="y")
    doc = (f"{fmt.name} fake quantization, blocks of {B} along axis {axis}, "
           f"{'half to even' if rounding is Rounding.HALF_EVEN else 'half away from zero'}")
    return make_function(fmt.function_name(axis, rounding), ["x"], ["y"], b.nodes, doc=doc)


def emit_block(fmt, input_name: str, output_name: str, *, axis: int, prefix: str,
               rounding: Rounding) -> Emission:
    """An Emission: one node in MIXQ_DOMAIN calling the format's function, plus the function."""
    fn = build_function(fmt, axis, rounding)
    node = helper.make_node(fn.name, [input_name], [output_name], name=f"{prefix}/{fn.name}",
                            domain=MIXQ_DOMAIN)
    return Emission(nodes=[node], functions=[fn], opsets={"": ONNX_OPSET, MIXQ_DOMAIN: MIXQ_DOMAIN_VERSION})
