"""ONNX emission of block formats: one model-local function per (format, axis, rounding).

Built from standard opset-26 ops onnxruntime CPU implements, bit-identical to
BlockFormat.fake_quant. Design (why, not what):

* No Transpose: x is padded along `axis` to a multiple of the block and reshaped to
  (pre, nblocks, block, post) so ReduceMax over axis 2 gives the block maxima in place, for any
  axis and rank (the shapes are computed at run time, so every dim may stay dynamic; where the
  axis length and x's rank are known, the pads, the view's target and the cut are constants
  instead, whose 0s copy x's symbolic dims: a call on small tensors is mostly its op count). The whole
  computation stays in that view (per-block scales broadcast over the block axis); the result
  is reshaped back, cut to the axis length and reshaped to Shape(x). When nothing follows the
  axis (post is 1) the view ends at the block axis and per-block tensors drop their block dims:
  onnxruntime runs ops on tensors ending with a size-1 dim, and broadcasts over a last axis,
  element by element (see build_function).
* Shapes for onnxruntime's planner: the blocked tensors have no inferred shape at all (their
  Reshape targets end with a tensor of unknown rank). Tensors with known rank but unknown dims
  made onnxruntime's memory planner scan its whole free list in vain: with many calls on
  dynamic shapes session creation was quadratic; bench/block_session_bench.py measures it.
  The rewrite pass declares each call's output shape (x's) in the graph's value_info.
* Exact exponents: the exponent field of a (BitCast to int32 and a mask, opset 26) is
  2**floor(log2(a)) for a normal float; maxima below 2**-126 only ever meet a scale clipped to
  2**-127. Every scale and step is then a power of two obtained by exact Mul/Div/Clip. A model
  with an op onnxruntime runs at its own opset and not at 26 (RoiAlign: no kernel for its
  opset-22 version) gets the functions at an older opset (`opset`), with the constant-weight
  variant's exponent (a log corrected against a table of powers of two): slower, same bits.
* NaN/Inf: onnxruntime's ReduceMax does not propagate NaN reliably, so a per-block flag (NaN
  iff the block holds NaN or inf: the block's sum of |x| is NaN, or its maximum is inf) is
  added to the per-block step: any later product with the step is NaN.
* Scaling by 2**k is done with Mul/Div by exact powers of two; integer elements are rounded
  with Round (half to even) and clipped (saturation). Float elements (fp8/fp6/fp4) are rounded
  by arithmetic alone, see `_round_to_element`: onnxruntime's Cast to float8 converts one
  element at a time and cost 90 % of an MXFP8 call (bench/formats_bench.py).
"""
from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import ArrayLike, DTypeLike
import onnx
from onnx import TensorProto, helper

from mixq.errors import FormatError

from .base import MIXQ_DOMAIN, MIXQ_DOMAIN_VERSION, Emission, Rounding, Shape
from .onnx_util import const_node, make_function

#: The oldest default-domain opset the functions' bodies are valid at without BitCast (ReduceMax
#: and Pad take their axes as inputs from opset 18; mixq's base opset is 21)
MIN_BLOCK_OPSET = 21

#: _POW2[i] = 2**(i - 149) in float32 (exact; the last entry, 2**128, is inf).
_POW2_OFFSET = 149
_POW2 = np.append(np.ldexp(1.0, np.arange(-149, 128)), np.inf).astype(np.float32)

class _Body:
    """Accumulates function-body nodes with unique value names."""

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self._n = 0
        self._consts: dict[tuple, str] = {}

    def op(self, op_type: str, *inputs: str, out: str | None = None, **attrs: Any) -> str:
        self._n += 1
        name = out or f"t{self._n}_{op_type}"
        self.nodes.append(helper.make_node(op_type, list(inputs), [name], **attrs))
        return name

    def const(self, value: ArrayLike, dtype: DTypeLike = np.float32) -> str:
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


def _pow2_floor(b: _Body, amax: str, flag: str, foldable: bool) -> str:
    """2**floor(log2(amax)) (float32, exact) of per-block maxima of at least 2**-126; smaller
    maxima give 0 (or 2**-127, foldable variant).

    The exponent field of amax, kept by a BitCast to int32 and a mask (opset 26), is exactly
    2**floor(log2(amax)) for a normal float; maxima below 2**-126 (zero, subnormal) give 0, which
    every caller clips up to its scale range's low end (>= -127, see build_function), where no
    format can tell them apart. NaN/inf maxima give inf here; the block's NaN flag overrides
    them. Three cheap ops instead of a Cast to float8e8m0 and back, which onnxruntime converts
    one element at a time (docs/PERFORMANCE.md: twice the time of the three)."""
    if foldable:  # see build_function
        return _pow2(b, _exponent(b, amax, flag))
    bits = b.op("BitCast", amax, to=TensorProto.INT32)
    return b.op("BitCast", b.op("BitwiseAnd", bits, b.const(0x7F800000, np.int32)), to=TensorProto.FLOAT)


def _round(b: _Body, y: str, rounding: Rounding, sign_of: str) -> str:
    """Round `y` = `sign_of` / step to integers (`sign_of` carries the sign even where y underflowed)."""
    if rounding is Rounding.HALF_EVEN:
        return b.op("Round", y)
    # sign * (floor|y| + [frac >= 0.5]): exact, unlike floor(|y| + 0.5) at |y| = 0.5 - 2**-25
    a = b.op("Abs", y)
    t = b.op("Floor", a)
    up = b.op("Cast", b.op("GreaterOrEqual", b.op("Sub", a, t), b.const(0.5)), to=TensorProto.FLOAT)
    return b.op("Mul", b.op("Sign", sign_of), b.op("Add", t, up))


def _round_to_element(b: _Body, y: str, ef, abs_scaled: str | None = None) -> str:
    """`y` rounded to the float element grid `ef`, half to even, saturated to +-max_normal.

    By arithmetic alone: y is rounded to its own grid step qs = 2**(max(e, emin) - m), where
    e = floor(log2|y|), as Round(y / qs) * qs (exact: qs is a power of two; Round is half to
    even and keeps the sign of zero). qs comes from Veltkamp splitting without a compare or a
    Where: t = max(|y|, 2**emin) * 0.75 * 2**-m lies in [0.75, 1.5) * 2**(e' - m) (e' =
    max(e, emin); the product is exact or rounds down inside the binade), and
    g + (t - g), g = t * (2**23 + 1), rounds t to one significant bit, which is 2**(e' - m)
    on that whole interval (the tie at 0.75 * 2**k goes up: test_formats_onnx_block.py runs
    it on whole binades). It cannot overflow: |y| < 2**(emax + 1), the block's scale puts
    its maximum in the top binade, and t stays a normal float (emin - m - 1 >= -126).
    `abs_scaled`: |y| * 0.75 * 2**-m when the caller has it from |x| (one op less), else None."""
    m = ef.mantissa_bits
    if abs_scaled is None:
        abs_scaled = b.op("Mul", b.op("Abs", y), b.const(0.75 * 2.0 ** -m))
    t = b.op("Max", abs_scaled, b.const(0.75 * 2.0 ** (ef.min_exp - m)))
    g = b.op("Mul", t, b.const(2.0 ** 23 + 1.0))
    qs = b.op("Add", g, b.op("Sub", t, g))
    r = b.op("Mul", b.op("Round", b.op("Div", y, qs)), qs)
    return b.op("Clip", r, b.const(-float(ef.max_normal)), b.const(float(ef.max_normal)))


def _alignable(fmt, length: int) -> bool:
    """Whether an axis of `length` has a blocked view by one Reshape: whole blocks, or a single
    short block of whole sub-blocks."""
    if length <= 0:
        return False
    return length % fmt.block_size == 0 or (length < fmt.block_size and length % fmt.sub_block == 0)


def _padded(fmt, length: int) -> int:
    """The alignable length an axis of `length` is padded to: whole blocks, or for an axis
    shorter than one block, whole sub-blocks (zeros never raise a block's maximum)."""
    unit = fmt.sub_block if length < fmt.block_size else fmt.block_size
    return -(-length // unit) * unit


def build_function(fmt, axis: int, rounding: Rounding, *, foldable: bool = False,
                   length: int | None = None, post: int | None = None,
                   opset: int | None = None, rank: int | None = None) -> onnx.FunctionProto:
    """The FunctionProto `fmt.function_name(axis, rounding)`: input x, output y.

    `foldable`: the variant for constant weights. onnxruntime's constant folding cannot hold a
    float8e8m0 tensor (it fails the session), so weights use a slower exact exponent that folds:
    floor(log(a) / ln 2) corrected against a table of exact powers of two.
    `length`: the axis length when it is known and `axis` is non-negative. A multiple of the
    block size, or a length shorter than one block (and a multiple of the sub-block), is
    *aligned*: the blocked view is a single Reshape. A short axis is one block of `length`
    elements: the reference pads it with zeros, which never raise a block's maximum. Any other
    known length is padded with zeros to an aligned one by a Pad whose pads are constants, and
    cut back by a constant Slice, instead of computing both per call.
    `post`: with `length`, the number of elements after the axis when every dim after it is
    known: the view's target is then a constant (x's leading dims copied by 0s), which saves the
    ~8 shape ops that compute it per call (they dominate a call on small tensors).
    `opset`: the default-domain opset of the body (default `fmt.onnx_opset`, 26); below 26 the
    exponent is `foldable`'s (no BitCast) and the name ends with ``_o<opset>``.
    `rank`: x's rank, required with `length` and no `post`: the view is then an Unsqueeze and
    a Reshape to a constant target whose 0s copy x's leading and trailing dims (symbolic ones
    too), so neither the ~8 shape ops that computed it per call nor a tensor of unknown dims
    (see the module doc) is needed."""
    at = fmt.onnx_opset if opset is None else opset
    if at < MIN_BLOCK_OPSET:
        raise FormatError(f"a {fmt.name} function needs opset {MIN_BLOCK_OPSET} or newer, got {at}")
    if post is not None and (length is None or post <= 0):
        raise FormatError(f"a {fmt.name} function with known trailing elements ({post}) needs a "
                          "known axis length and post > 0")
    if length is not None and (axis < 0 or length <= 0):
        raise FormatError(f"a {fmt.name} function of known axis length needs a non-negative axis "
                          f"and a positive length; got axis {axis}, length {length}")
    if length is not None and post is None and (rank is None or not axis < rank):
        raise FormatError(f"a {fmt.name} function of known axis length and unknown trailing dims "
                          f"needs x's rank, above the axis; got axis {axis}, rank {rank}")
    if rank is not None and (length is None or post is not None):
        raise FormatError(f"a {fmt.name} function of known rank ({rank}) is the one of a known axis "
                          "length with unknown trailing dims")
    if rounding is not Rounding.HALF_EVEN and fmt.element != "int":
        raise FormatError(f"ONNX emission of {fmt.name} supports only Rounding.HALF_EVEN "
                          f"(its elements are rounded by float8 casts), got {rounding}")
    b = _Body()
    B, S = fmt.block_size, fmt.sub_block
    i64 = np.int64
    aligned = length is not None
    x = "x"
    cut = None  # the axis length to cut the result back to (a padded axis)
    if length is not None and not _alignable(fmt, length):
        cut, length = length, _padded(fmt, length)
        x = b.op("Pad", x, b.const([0, length - cut], i64), b.const(0.0), b.const([axis], i64),
                 mode="constant")
    if aligned and post is not None:
        # -- everything after x's leading dims known: a constant view target; 0 copies x's dim
        #    (allowzero=0), so the view keeps x's symbolic leading dims and a zero-size one
        blen = min(length, B)
        # no trailing dim of 1 (axis last, or 1x1 spatial dims): onnxruntime's reductions over
        # the block axis take a slow generic path when a size-1 dim follows it (ReduceSum 20-30x
        # slower on MatMul inputs, bench/block_reduce_bench.py)
        view = ([0] * axis + [max(length // B, 1)] + ([blen // S, S] if S > 1 else [blen])
                + ([post] if post > 1 else []))
        v = b.op("Reshape", x, b.const(view, i64))
        bax = axis + 1
        last = post == 1  # the view ends at the block (sub-block) axis
        view_rank = len(view)
    elif rank is not None:  # (aligned, trailing dims unknown: build_function requires the rank)
        # -- known rank: x with u unit dims inserted after its leading ones, reshaped to
        #    (x's leading dims, nb, B[/S, S], x's trailing dims): every 0 copies the dim at its
        #    index, which the Unsqueeze lined up, so the view keeps x's symbolic dims
        blen = min(length, B)
        inner_dims = [blen // S, S] if S > 1 else [blen]
        u = len(inner_dims)
        view = [0] * axis + [max(length // B, 1)] + inner_dims + [0] * (rank - axis - 1)
        v = b.op("Reshape", b.op("Unsqueeze", x, b.const(list(range(axis, axis + u)), i64)),
                 b.const(view, i64))
        bax = axis + 1
        last, view_rank = False, 0
    else:
        one = b.const([1], i64)
        bax = 2
        last = axis == -1
        blen = B
        view_rank = 2 + (2 if S > 1 else 1)  # (pre, nb, B/S, S) or (pre, nb, B)
        inner = b.const([B // S, S] if S > 1 else [B], i64)
        # -- shapes: d = dim along axis, post = product of the dims after it, nb = blocks --------
        if axis == -1:
            d = b.op("Shape", "x", start=-1)
            post_t = None  # the view ends at the block axis (no trailing 1, see above)
        else:
            d = b.op("Shape", "x", start=axis, end=axis + 1)
            tail = b.op("Shape", "x", start=axis + 1)
            post_t = b.op("ReduceProd", b.op("Concat", one, tail, axis=0), keepdims=1)
        nb = b.op("Div", b.op("Add", d, b.const([B - 1], i64)), b.const([B], i64))
        pad = b.op("Sub", b.op("Mul", nb, b.const([B], i64)), d)
        # `post` again, as a tensor of unknown rank for shape inference (reshaped to [1] by a
        # shape vector sliced up to a run-time end), so that the blocked and per-block tensors
        # below have no shape at all rather than a known rank with unknown dims. onnxruntime's
        # memory planner scans its whole free list for every output whose shape it cannot
        # match, and such tensors stay in that list: session creation became quadratic in the
        # number of calls on dynamic shapes. Outputs without a shape are not looked up.
        run_len = b.op("Slice", one, b.const([0], i64), b.op("Add", d, one))
        if post_t is None:  # axis -1: the leading -1 is the part of unknown length instead
            hlead = b.op("Reshape", b.const([-1], i64), run_len)

            def hidden(*parts: str) -> str:
                """A Reshape target (starting with -1) whose length shape inference cannot know."""
                return b.op("Concat", hlead, *parts[1:], axis=0)
        else:
            hpost = b.op("Reshape", post_t, run_len)

            def hidden(*parts: str) -> str:
                """A Reshape target (ending with `post`) whose length shape inference cannot know."""
                return b.op("Concat", *parts, hpost, axis=0)

        # -- blocked view of x, padded along axis to whole blocks: (pre, nb, B, post) ----------
        xp = b.op("Pad", b.op("Reshape", "x", hidden(b.const([-1], i64), d)),
                  b.op("Concat", b.const([0], i64), pad, axis=0), b.const(0.0), b.const([1], i64),
                  mode="constant")
        v = b.op("Reshape", xp, hidden(b.const([-1], i64), nb, inner))
    # -- per-block maxima and the non-finite flag (on the blocked view; from here on the
    #    per-block tensors are B times smaller than x) ------------------------------------------
    av = b.op("Abs", v)
    if last:
        # the view ends at the block (sub-block) axis: per-block tensors drop their block dims
        # (keepdims=0). onnxruntime runs element-wise ops on a tensor ending with a size-1 dim,
        # and broadcasts of (.., nb, 1) over (.., nb, B), element by element (10x slower,
        # bench/block_reduce_bench.py); a per-block tensor is instead widened to the view's
        # shape by a MatMul with a row of ones (exact: one product by 1 each).
        width = [blen // S, S] if S > 1 else [blen]
        red = b.const([-2, -1] if S > 1 else [-1], i64)

        def reduce(op: str, t: str, axes: str, sub: bool = False) -> str:
            """`op` over `axes`, the reduced dims dropped (`sub`: all but the sub-block axis).
            Not by keepdims=0 or Squeeze: onnxruntime 1.31's reductions return an empty input
            unreduced; a Reshape to the per-block dims holds for both. Its target copies the
            leading dims (0s), or is hidden like the view's (general function)."""
            if aligned:
                target = b.const([0] * (view_rank - len(width) + sub), i64)
            else:
                target = hidden(b.const([-1], i64), nb, *([b.const([B // S], i64)] if sub else []))
            return b.op("Reshape", b.op(op, t, axes, keepdims=1), target)
        last_ax = b.const([-1], i64)
        submax = reduce("ReduceMax", av, last_ax, sub=True) if S > 1 else ""  # (.., nb, B/S)
        amax = reduce("ReduceMax", submax or av, last_ax)  # (.., nb)
        total = reduce("ReduceSum", av, red)

        def widen(t: str, dims: list[int]) -> str:
            """Per-block `t` repeated over the trailing `dims` (the MatMul with ones above)."""
            for n in dims:
                t = b.op("MatMul", b.op("Unsqueeze", t, last_ax), b.const(np.ones((1, n))))
            return t
    else:
        if S > 1:
            submax = b.op("ReduceMax", av, b.const([bax + 1], i64), keepdims=1)  # (.., nb, B/S, 1, ..)
            amax = b.op("ReduceMax", submax, b.const([bax], i64), keepdims=1)
            red = b.const([bax, bax + 1], i64)
        else:
            amax = b.op("ReduceMax", av, b.const([bax], i64), keepdims=1)  # (.., nb, 1, ..)
            red = b.const([bax], i64)
        # NaN iff the block holds a NaN (the sum of |v| is NaN) or an inf (see below)
        total = b.op("ReduceSum", av, red, keepdims=1)
        width = []

        def widen(t: str, dims: list[int]) -> str:
            return t  # per-block tensors broadcast over the block axis (not the last one)
    # NaN iff the block holds a NaN (the sum of |v| is NaN) or an inf (the maximum is inf; the
    # sum alone would also overflow for huge finite blocks): one reduction of |v|, already
    # computed, instead of a full-size Mul(v, 0) before it
    # (amax - amax: NaN iff the maximum is inf; three small per-block ops)
    flag = b.op("Where", b.op("IsNaN", total), b.const(np.nan), b.op("Sub", amax, amax))

    p = _pow2_floor(b, amax, flag, foldable or at < fmt.onnx_opset)  # 2**e, e = the block's exponent
    lo, hi = fmt.scale_range
    # everything below stays in the blocked view: per-block (and per-sub-block) quantities
    # broadcast over the block axis, so nothing is expanded to full size (but by `widen`, see
    # above). Scales are powers of two, so every Mul/Div/Clip on them below is exact.
    if fmt.element == "int":
        # 2**s, NaN for a flagged block (any product with it, the step, is NaN too)
        sc = b.op("Add", b.op("Clip", p, b.const(2.0 ** lo), b.const(2.0 ** min(hi, 127))), flag)
        if S > 1:  # microexponent: sub-blocks below 2**s use the binade below (step / 2)
            sc = widen(sc, width[:1])  # per sub-block
            # against sc = 2**s itself (a NaN-flagged block keeps its NaN step either way)
            fits_lower = b.op("Less", submax, sc)
            step = b.op("Mul", sc, b.const(2.0 ** (1 - fmt.mant_bits)))
            step = b.op("Where", fits_lower, b.op("Mul", step, b.const(0.5)), step)  # (.., B/S, 1, ..)
            step = widen(step, width[1:])
        else:
            step = widen(b.op("Mul", sc, b.const(2.0 ** (1 - fmt.mant_bits))), width)
        m = _round(b, b.op("Div", v, step), rounding, v)
        m = b.op("Clip", m, b.const(float(-fmt.max_code)), b.const(float(fmt.max_code)))
        q = b.op("Mul", m, step)
    else:
        ef = fmt.element_format
        # 2**s, s = clip(e - emax, lo, hi)
        sc = b.op("Clip", b.op("Mul", p, b.const(2.0 ** -ef.emax)), b.const(2.0 ** lo), b.const(2.0 ** hi))
        # inv = 2**-s is in [2**-127, 2**127]: representable, like s itself
        inv = widen(b.op("Add", b.op("Div", b.const(1.0), sc), flag), width)
        # |y| * 0.75 * 2**-m as |v| * (inv * 0.75 * 2**-m): one rounding of the same real
        # product either way (inv is a power of two; a product too small to be normal is far
        # below the clamp at 0.75 * 2**(emin - m)), and |v| is already there
        k = b.op("Mul", inv, b.const(0.75 * 2.0 ** -ef.mantissa_bits))
        r = _round_to_element(b, b.op("Mul", v, inv), ef, abs_scaled=b.op("Mul", av, k))
        q = b.op("Div", r, inv)
    # back to x's layout (unpadded: (pre, nb * B, post) cut to d), then x's own shape
    if not aligned:
        q = b.op("Reshape", q, hidden(b.const([-1], i64), b.op("Mul", nb, b.const([B], i64))))
        q = b.op("Slice", q, b.const([0], i64), d, b.const([1], i64))
    if cut is not None:  # back to the padded layout, then the constant cut along the axis
        b.op("Slice", b.op("Reshape", q, b.op("Shape", x), allowzero=1), b.const([0], i64),
             b.const([cut], i64), b.const([axis], i64), out="y")
    else:
        b.op("Reshape", q, b.op("Shape", "x"), out="y", allowzero=1)
    doc = (f"{fmt.name} fake quantization, blocks of {B} along axis {axis}, "
           f"{'half to even' if rounding is Rounding.HALF_EVEN else 'half away from zero'}")
    name = fmt.function_name(axis, rounding, length=length if cut is None else cut,
                             const=foldable, post=post, rank=rank)
    if at != fmt.onnx_opset:
        name += f"_o{at}"
    return make_function(name, ["x"], ["y"], b.nodes, opset=at, doc=doc)


def emit_block(fmt, input_name: str, output_name: str, *, axis: int, prefix: str,
               rounding: Rounding, foldable: bool = False,
               shape: Shape | None = None, opset: int | None = None) -> Emission:
    """An Emission: one node in MIXQ_DOMAIN calling the format's function, plus the function
    (`foldable`: the variant for constant inputs, see build_function). A known `shape` (None for
    unknown dims) whose axis length is known selects a function with a constant view (see
    build_function): padded to whole blocks when the length is not a multiple of the block."""
    length = post = rank = None
    if shape is not None and -len(shape) <= axis < len(shape):
        axis_pos = axis % len(shape)
        dim = shape[axis_pos]
        if isinstance(dim, int) and dim > 0:
            axis, length = axis_pos, dim
            tail = [t for t in shape[axis_pos + 1:] if isinstance(t, int) and t > 0]
            if len(tail) == len(shape) - axis_pos - 1:  # every dim after the axis known
                post = int(np.prod(tail, dtype=np.int64))
            else:
                rank = len(shape)
        elif axis_pos == len(shape) - 1:
            axis = -1  # the general function whose view ends at the block axis (no trailing 1)
    fn = build_function(fmt, axis, rounding, foldable=foldable, length=length, post=post,
                        opset=opset, rank=rank)
    node = helper.make_node(fn.name, [input_name], [output_name], name=f"{prefix}/{fn.name}",
                            domain=MIXQ_DOMAIN)
    return Emission(nodes=[node], functions=[fn],
                    opsets={"": fn.opset_import[0].version, MIXQ_DOMAIN: MIXQ_DOMAIN_VERSION})
