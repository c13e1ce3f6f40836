"""Integer formats (int4 ... uint32, narrow-range variants): affine fake quantization that is
bit-exact with onnxruntime's QuantizeLinear -> DequantizeLinear.

What onnxruntime does, and so what the reference does (verified by the tests):

* quantize: ``q = clip(round_half_even(x / scale) + zero_point, qmin, qmax)`` with the division
  in float32 (a true division, not a multiplication by 1/scale);
* dequantize: ``(q - zero_point) * scale`` in float32;
* NaN quantizes to qmin (whatever the zero point), +-inf saturates to qmax / qmin.

onnxruntime 1.31 bug worked around in `emit`: blocked QuantizeLinear along a non-last axis and
per-axis int4/uint4 along the last axis convert x / scale to int32 before clamping, so +inf and
|x / scale| >= 2**31 (and NaN with a negative zero point) land on the wrong end; the emission
clamps x to +-scale * 2**24 (NaN -> the low bound) first, which changes no result.

int32 / uint32 have no QuantizeLinear kernel in onnxruntime: they run as the model-local function
``com.mixq.QDQ_int32`` (``QDQ_uint32``) of standard float32 ops, and the reference follows the
same float32 arithmetic: the clip bounds are the float32 values nearest inside the range
(int32: [-2**31, 2**31 - 128], uint32: [0, 2**32 - 256]), so every result is a true integer of
the type. Narrow-range formats (name suffix ``n``: ``int8n`` is [-127, 127], ``uint8n`` is
[1, 255]) quantize into the full-range type and clip the integer code with a scalar Clip.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np
import onnx
from onnx import TensorProto, helper

from mixq.errors import FormatError

from ._grid import round_half
from .base import MIXQ_DOMAIN, MIXQ_DOMAIN_VERSION, Emission, Format, QParams, Rounding, Shape
from .onnx_util import ONNX_OPSET, const_node, const_tensor, expand_param_nodes, make_function

INT_BITS = (4, 8, 16, 32)

_NP_TYPES: dict[tuple[int, bool], Any] = {
    (4, True): ml_dtypes.int4, (4, False): ml_dtypes.uint4,
    (8, True): np.int8, (8, False): np.uint8,
    (16, True): np.int16, (16, False): np.uint16,
    (32, True): np.int32, (32, False): np.uint32,
}
_ONNX_TYPES = {
    (4, True): TensorProto.INT4, (4, False): TensorProto.UINT4,
    (8, True): TensorProto.INT8, (8, False): TensorProto.UINT8,
    (16, True): TensorProto.INT16, (16, False): TensorProto.UINT16,
    (32, True): TensorProto.INT32, (32, False): TensorProto.UINT32,
}


# ---------------------------------------------------------------------------------------------
# the one broadcasting primitive for per-tensor / per-channel / per-block parameters

def normalize_axis(axis: int, ndim: int) -> int:
    """`axis` in [0, ndim), accepting negative values; FormatError when out of range."""
    if not -ndim <= axis < ndim:
        raise FormatError(f"axis {axis} is out of range for a tensor of rank {ndim}")
    return axis % ndim


def expand_param(p: np.ndarray, shape: tuple[int, ...], axis: int | None = None,
                 block_size: int | None = None) -> np.ndarray:
    """Broadcast a quantization parameter against a tensor of `shape`.

    * per tensor: `p` has one element (axis ignored) -> returned as a 0-d array;
    * per channel: `axis` given, `p` 1-D of length shape[axis] -> reshaped to broadcast;
    * per block: `block_size` given, `p` has `shape` with shape[axis] ceil-divided by
      block_size -> each entry repeated block_size times along axis (last block may be partial).
    """
    p = np.asarray(p)
    shape = tuple(int(d) for d in shape)
    if block_size:
        if axis is None:
            raise FormatError("per-block quantization needs qparams.axis")
        if int(block_size) < 1:
            raise FormatError(f"block_size must be >= 1, got {block_size}")
        ax = normalize_axis(axis, len(shape))
        want = list(shape)
        want[ax] = -(-shape[ax] // int(block_size))
        if p.shape != tuple(want):
            raise FormatError(f"per-block parameter has shape {p.shape}; a tensor of shape {shape} "
                              f"with block_size {block_size} along axis {axis} needs {tuple(want)}")
        return np.take(np.repeat(p, int(block_size), axis=ax), np.arange(shape[ax]), axis=ax)
    if p.size == 1 and (axis is None or p.ndim == 0):
        return p.reshape(())
    if axis is None:
        raise FormatError(f"parameter of shape {p.shape} needs qparams.axis (per-channel) "
                          f"or must be a scalar (per-tensor)")
    ax = normalize_axis(axis, len(shape))
    if p.ndim != 1 or p.shape[0] != shape[ax]:
        raise FormatError(f"per-channel parameter has shape {p.shape}; axis {axis} of a tensor of "
                          f"shape {shape} needs ({shape[ax]},)")
    view = [1] * len(shape)
    view[ax] = shape[ax]
    return p.reshape(view)


def check_scale(scale: np.ndarray) -> None:
    """FormatError unless every scale is finite and > 0."""
    s = np.asarray(scale, dtype=np.float32)
    if s.size == 0 or not np.all(np.isfinite(s)) or not np.all(s > 0):
        raise FormatError(f"quantization scales must be finite and > 0; got {s.ravel()[:8]}"
                          f"{' ...' if s.size > 8 else ''}")


def per_tensor_if_single(qparams: QParams) -> QParams:
    """A one-element scale without blocks is per-tensor: scalar scale / zero point, no axis
    (QuantizeLinear wants a scalar there)."""
    scale = np.asarray(qparams.scale)
    if scale.size == 1 and not qparams.block_size and (scale.ndim > 0 or qparams.axis is not None):
        zp = np.asarray(qparams.zero_point)
        if zp.size != 1:
            raise FormatError(f"zero point shape {zp.shape} does not match scale shape {scale.shape}")
        return QParams(scale.reshape(()), zp.reshape(()))
    return qparams


def _qattrs(qparams: QParams) -> dict[str, Any]:
    """axis / block_size attributes of QuantizeLinear / DequantizeLinear for `qparams`.

    Typed ``Any`` because it is splatted into ``helper.make_node(**attrs)``, whose keyword
    parameters (name, domain, ...) are strings: the int values only ever fill node attributes."""
    attrs: dict[str, Any] = {}
    if np.asarray(qparams.scale).size > 1 or qparams.block_size:
        if qparams.axis is None:
            raise FormatError("per-channel / per-block qparams need an axis")
        attrs["axis"] = int(qparams.axis)
    if qparams.block_size:
        attrs["block_size"] = int(qparams.block_size)
    return attrs


def _pof2_up(s: np.ndarray) -> np.ndarray:
    """Smallest power of two >= s (s > 0), exactly, as float32 (kept in the float32 normals)."""
    m, e = np.frexp(np.asarray(s, dtype=np.float64))
    e = np.where(m == 0.5, e - 1, e)  # already a power of two
    return np.ldexp(1.0, np.clip(e, -126, 127)).astype(np.float32)


def pof2_scale(absmax: Any, fmt: Format) -> np.ndarray:
    """Smallest power-of-two scale that represents +-`absmax` without clipping, per element.

    For an integer format the symmetric limit is min(qmax - zp, zp - qmin) with the symmetric
    zero point; for a scaled float format it is its max_normal. absmax == 0 -> scale 1."""
    limit = getattr(fmt, "symmetric_limit", None)
    if limit is None:
        raise FormatError(f"format {fmt} has no scale to choose (it needs no qparams)")
    a = np.asarray(absmax, dtype=np.float64)
    if not np.all(np.isfinite(a)):
        raise FormatError("absmax must be finite to choose a scale")
    a = np.abs(a)
    with np.errstate(divide="ignore"):
        s = np.where(a > 0, a / float(limit), 1.0)
    return _pof2_up(s)


# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class IntFormat(Format):
    """A (u)intN format quantized affinely with a scale and a zero point.

    `narrow_range` drops the most negative code of signed types ([-127, 127] for int8) and
    code 0 of unsigned ones ([1, 255] for uint8), as TensorFlow's narrow_range does."""

    int_bits: int
    signed: bool
    narrow_range: bool = False
    kind = "int"

    def __post_init__(self) -> None:
        if self.int_bits not in INT_BITS:
            raise FormatError(f"integer formats have {INT_BITS} bits, got {self.int_bits}")

    # -- identity -------------------------------------------------------------------------------
    @property
    def name(self) -> str:  # type: ignore[override]
        """Canonical name, e.g. ``int8``, ``uint4``, ``int8n`` (narrow range)."""
        return f"{'' if self.signed else 'u'}int{self.int_bits}{'n' if self.narrow_range else ''}"

    @property
    def bits(self) -> int:
        return self.int_bits

    @property
    def avg_bits(self) -> float:
        return float(self.int_bits)

    @property
    def needs_qparams(self) -> bool:
        return True

    def __repr__(self) -> str:
        return f"IntFormat({self.name})"

    # -- ranges ---------------------------------------------------------------------------------
    @property
    def qmin(self) -> int:
        """Smallest integer code."""
        if self.signed:
            return -(2 ** (self.int_bits - 1)) + (1 if self.narrow_range else 0)
        return 1 if self.narrow_range else 0

    @property
    def qmax(self) -> int:
        """Largest integer code."""
        return 2 ** (self.int_bits - 1) - 1 if self.signed else 2 ** self.int_bits - 1

    @property
    def np_dtype(self) -> Any:
        """NumPy / ml_dtypes type of the codes."""
        return _NP_TYPES[(self.int_bits, self.signed)]

    @property
    def onnx_type(self) -> int:
        """TensorProto element type of the codes."""
        return _ONNX_TYPES[(self.int_bits, self.signed)]

    @property
    def native_qdq(self) -> bool:
        """Whether onnxruntime's QuantizeLinear supports the type (everything but 32-bit)."""
        return self.int_bits < 32

    @property
    def _fbounds(self) -> tuple[np.float32, np.float32]:
        """float32 clip bounds: qmin/qmax, pulled inside the range where float32 rounds out."""
        lo = np.float32(self.qmin)
        hi = np.float32(self.qmax)
        if float(hi) > self.qmax:
            hi = np.nextafter(hi, np.float32(0))
        if float(lo) < self.qmin:
            lo = np.nextafter(lo, np.float32(0))
        return lo, hi

    @property
    def symmetric_zero_point(self) -> int:
        """Zero point of symmetric quantization: 0 for signed, the middle code for unsigned."""
        return int(math.ceil((self.qmin + self.qmax) / 2))

    @property
    def symmetric_limit(self) -> float:
        """Largest |x / scale| symmetric quantization represents on both sides without clipping."""
        zp = self.symmetric_zero_point
        return float(min(self.qmax - zp, zp - self.qmin))

    # -- qparams --------------------------------------------------------------------------------
    def qparams_from_range(self, lo: Any, hi: Any, symmetric: bool, power_of_two: bool = False,
                           axis: int | None = None) -> QParams:
        """Scale and zero point covering [lo, hi] (scalars, or 1-D per channel along `axis`).

        symmetric: zp = symmetric_zero_point (0 signed, 128 uint8), scale = absmax / symmetric_limit
        (int8: absmax / 127), so +-absmax never clips. asymmetric: the range is widened to
        include 0, scale = (hi - lo) / (qmax - qmin), zp = round(qmin - lo / scale) clipped.
        A zero range gives scale 1; scales never go below 2**-126. power_of_two rounds the
        scale up to 2**k (never more clipping than the exact scale)."""
        lo_a = np.asarray(lo, dtype=np.float64)
        hi_a = np.asarray(hi, dtype=np.float64)
        if lo_a.shape != hi_a.shape:
            raise FormatError(f"lo and hi must have the same shape, got {lo_a.shape} and {hi_a.shape}")
        if not (np.all(np.isfinite(lo_a)) and np.all(np.isfinite(hi_a))):
            raise FormatError("cannot compute qparams from a non-finite range")
        if np.any(lo_a > hi_a):
            raise FormatError("range has lo > hi")
        if lo_a.ndim > 1 or (lo_a.ndim == 1 and axis is None and lo_a.size != 1):
            raise FormatError("per-channel ranges must be 1-D and come with an axis")
        tiny = 2.0 ** -126
        if symmetric:
            absmax = np.maximum(np.abs(lo_a), np.abs(hi_a))
            zp = np.full(absmax.shape, self.symmetric_zero_point, dtype=np.int64)
            if power_of_two:
                scale = pof2_scale(absmax, self)
            else:
                scale = np.where(absmax > 0, absmax / self.symmetric_limit, 1.0)
        else:
            lo_a, hi_a = np.minimum(lo_a, 0.0), np.maximum(hi_a, 0.0)
            span = hi_a - lo_a
            scale = np.where(span > 0, span / (self.qmax - self.qmin), 1.0)
            if power_of_two:
                scale = _pof2_up(scale)
            scale = np.maximum(scale, tiny).astype(np.float32)
            zp = np.rint(self.qmin - lo_a / scale.astype(np.float64)).astype(np.float32)
            zp = np.clip(zp, *self._fbounds).astype(np.int64)  # float32-exact (32-bit types)
        scale = np.maximum(np.asarray(scale, dtype=np.float64), tiny).astype(np.float32)
        return QParams(scale, zp, axis=axis if scale.ndim == 1 else None)

    def _check_qparams(self, qparams: QParams | None) -> QParams:
        if qparams is None:
            raise FormatError(f"format {self.name} needs qparams (scale and zero point)")
        check_scale(qparams.scale)
        qparams = per_tensor_if_single(qparams)
        zp = np.asarray(qparams.zero_point)
        if zp.size and (zp.min() < self.qmin or zp.max() > self.qmax):
            raise FormatError(f"zero point out of the {self.name} range [{self.qmin}, {self.qmax}]")
        if zp.size and not np.all(np.float32(zp).astype(np.float64) == zp):
            raise FormatError(f"zero points must be exact in float32 (|zp| <= 2**24), got {zp.ravel()[:4]}")
        return qparams

    # -- reference ------------------------------------------------------------------------------
    def quantize(self, x: np.ndarray, qparams: QParams, *,
                 rounding: Rounding = Rounding.HALF_EVEN) -> np.ndarray:
        """Integer codes of `x` (as float32 values; exact integers of the type)."""
        qparams = self._check_qparams(qparams)
        x = np.asarray(x, dtype=np.float32)
        s = expand_param(qparams.scale, x.shape, qparams.axis, qparams.block_size).astype(np.float32)
        zp = expand_param(qparams.zero_point, x.shape, qparams.axis, qparams.block_size).astype(np.float32)
        lo, hi = self._fbounds
        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
            y = np.divide(x, s, dtype=np.float32)  # float32 true division, as onnxruntime
            if rounding is Rounding.HALF_EVEN:
                r = np.rint(y)
            else:  # in float64 so that |y| + 0.5 is exact
                r = round_half(y.astype(np.float64), rounding).astype(np.float32)
            q = np.clip(np.add(r, zp, dtype=np.float32), lo, hi)
        return np.where(np.isnan(x), lo, q).astype(np.float32)  # onnxruntime: NaN -> qmin

    def dequantize(self, q: np.ndarray, qparams: QParams) -> np.ndarray:
        """(q - zero_point) * scale in float32, as DequantizeLinear."""
        q = np.asarray(q, dtype=np.float32)
        s = expand_param(qparams.scale, q.shape, qparams.axis, qparams.block_size).astype(np.float32)
        zp = expand_param(qparams.zero_point, q.shape, qparams.axis, qparams.block_size).astype(np.float32)
        return np.multiply(np.subtract(q, zp, dtype=np.float32), s, dtype=np.float32)

    def fake_quant(self, x: np.ndarray, qparams: QParams | None = None, *, axis: int | None = None,
                   rounding: Rounding = Rounding.HALF_EVEN) -> np.ndarray:
        """Quantize-dequantize `x` with `qparams` (per tensor / channel / block); `axis` unused."""
        qparams = self._check_qparams(qparams)
        return self.dequantize(self.quantize(x, qparams, rounding=rounding), qparams)

    # -- ONNX -----------------------------------------------------------------------------------
    def _container(self) -> "IntFormat":
        """The full-range type whose QuantizeLinear the emission uses (int4n -> int8)."""
        if not self.narrow_range:
            return self
        return IntFormat(max(self.int_bits, 8), self.signed)

    def _zp_array(self, qparams: QParams, dtype: Any) -> np.ndarray:
        zp = np.asarray(qparams.zero_point)
        return np.broadcast_to(zp, np.asarray(qparams.scale).shape).astype(dtype)

    def function(self) -> onnx.FunctionProto:
        """The MIXQ_DOMAIN function QDQ_int32 / QDQ_uint32 (inputs x, scale, zero point as float32,
        both already broadcastable to x; output the fake-quantized x)."""
        lo, hi = self._fbounds
        nodes = [
            const_node("lo", lo), const_node("hi", hi),
            helper.make_node("Div", ["x", "scale"], ["y"]),
            helper.make_node("Round", ["y"], ["r"]),  # half to even
            helper.make_node("Add", ["r", "zp"], ["rz"]),
            helper.make_node("Max", ["rz", "lo"], ["c0"]),
            helper.make_node("Min", ["c0", "hi"], ["c1"]),
            helper.make_node("IsNaN", ["x"], ["isnan"]),
            helper.make_node("Where", ["isnan", "lo", "c1"], ["q"]),  # NaN -> qmin, like QuantizeLinear
            helper.make_node("Sub", ["q", "zp"], ["d0"]),
            # onnxruntime drops Add/Sub of a constant 0 zero point, which would let Round's -0
            # through; pin zeros to +0 as the integer path (and the reference) has them
            const_node("zero", np.float32(0.0)),
            helper.make_node("Equal", ["d0", "zero"], ["is0"]),
            helper.make_node("Where", ["is0", "zero", "d0"], ["d"]),
            helper.make_node("Mul", ["d", "scale"], ["out"]),
        ]
        return make_function(f"QDQ_{self.name}", ["x", "scale", "zp"], ["out"], nodes,
                             doc=f"fake quantization to {self.name} in float32 arithmetic")

    def emit(self, input_name: str, output_name: str, *, qparams: QParams | None = None,
             axis: int | None = None, prefix: str, rounding: Rounding = Rounding.HALF_EVEN,
             shape: Shape | None = None) -> Emission:
        """QuantizeLinear -> DequantizeLinear (opset 21), or the QDQ_(u)int32 function."""
        qparams = self._check_qparams(qparams)
        if rounding is not Rounding.HALF_EVEN:
            raise FormatError(f"ONNX emission of {self.name} supports only Rounding.HALF_EVEN "
                              f"(QuantizeLinear rounds half to even), got {rounding}")
        attrs = _qattrs(qparams)
        sname, zname = f"{prefix}/scale", f"{prefix}/zero_point"
        em = Emission(opsets={"": ONNX_OPSET})
        if not self.native_qdq:
            em.opsets[MIXQ_DOMAIN] = MIXQ_DOMAIN_VERSION
            em.functions.append(self.function())
            em.initializers += [const_tensor(sname, qparams.scale, np.float32),
                                const_tensor(zname, self._zp_array(qparams, np.float32))]
            s_in, z_in = sname, zname
            if attrs:  # broadcast per-channel / per-block parameters to x in-graph
                s_in, z_in = f"{prefix}/scale_full", f"{prefix}/zp_full"
                em.nodes += expand_param_nodes(input_name, sname, s_in, prefix=f"{prefix}/xs", **_axbs(qparams))
                em.nodes += expand_param_nodes(input_name, zname, z_in, prefix=f"{prefix}/xz", **_axbs(qparams))
            em.nodes.append(helper.make_node(f"QDQ_{self.name}", [input_name, s_in, z_in], [output_name],
                                             name=f"{prefix}/QDQ", domain=MIXQ_DOMAIN))
            return em
        cont = self._container()
        em.initializers += [const_tensor(sname, qparams.scale, np.float32),
                            const_tensor(zname, self._zp_array(qparams, cont.np_dtype))]
        q, x_in = f"{prefix}/q", input_name
        if qparams.block_size or (attrs and self.int_bits == 4):
            # onnxruntime 1.31 bug: blocked QuantizeLinear along a non-last axis, and per-axis
            # int4/uint4 along the last one, overflow float -> int32 before the clamp: x / scale
            # >= 2**31 (+inf included) becomes qmin, and <= -2**31 wraps with a negative zero
            # point, and NaN wraps to qmax with a negative zero point. Clamping x to
            # +-scale * 2**24 first (NaN -> -scale * 2**24, i.e. qmin as everywhere else) is
            # exact: |x / scale| then still saturates, and nothing else changes.
            bname, bfull, x_in = f"{prefix}/bound", f"{prefix}/bound_full", f"{prefix}/x_clamped"
            bound = np.minimum(qparams.scale.astype(np.float64) * 2.0 ** 24, np.finfo(np.float32).max)
            em.initializers.append(const_tensor(bname, bound, np.float32))
            em.nodes += expand_param_nodes(input_name, bname, bfull, prefix=f"{prefix}/xb", **_axbs(qparams))
            em.nodes += [
                helper.make_node("Neg", [bfull], [f"{bfull}_neg"], name=f"{prefix}/NegBound"),
                helper.make_node("Min", [input_name, bfull], [f"{x_in}_hi"], name=f"{prefix}/ClampHi"),
                helper.make_node("Max", [f"{x_in}_hi", f"{bfull}_neg"], [f"{x_in}_lo"], name=f"{prefix}/ClampLo"),
                helper.make_node("IsNaN", [input_name], [f"{prefix}/isnan"], name=f"{prefix}/IsNaN"),
                helper.make_node("Where", [f"{prefix}/isnan", f"{bfull}_neg", f"{x_in}_lo"], [x_in],
                                 name=f"{prefix}/NaNToMin"),
            ]
        em.nodes.append(helper.make_node("QuantizeLinear", [x_in, sname, zname], [q],
                                         name=f"{prefix}/QuantizeLinear", **attrs))
        if self.narrow_range:
            # onnxruntime's Clip has int8/uint8 kernels but none for 16-bit: clip those in int32
            # (DequantizeLinear takes int32 codes with an int32 zero point)
            cdt = cont.np_dtype if cont.int_bits == 8 else np.int32
            if cdt is np.int32:
                em.nodes.append(helper.make_node("Cast", [q], [f"{q}_i32"], name=f"{prefix}/CastI32",
                                                 to=TensorProto.INT32))
                q = f"{q}_i32"
                zname = f"{prefix}/zero_point_i32"
                em.initializers.append(const_tensor(zname, self._zp_array(qparams, np.int32)))
            em.initializers += [const_tensor(f"{prefix}/qmin", np.array(self.qmin, cdt)),
                                const_tensor(f"{prefix}/qmax", np.array(self.qmax, cdt))]
            em.nodes.append(helper.make_node("Clip", [q, f"{prefix}/qmin", f"{prefix}/qmax"], [f"{q}_n"],
                                             name=f"{prefix}/ClipNarrow"))
            q = f"{q}_n"
        em.nodes.append(helper.make_node("DequantizeLinear", [q, sname, zname], [output_name],
                                         name=f"{prefix}/DequantizeLinear", **attrs))
        return em

    def emit_weight(self, w: np.ndarray, output_name: str, *, qparams: QParams | None = None,
                    axis: int | None = None, prefix: str) -> Emission:
        """The integer payload as an initializer (int4/uint4 packed two per byte) plus
        DequantizeLinear. uint32 (no DequantizeLinear kernel) keeps the float weight and the
        function; so does int32 when q - zero_point could overflow int32."""
        qparams = self._check_qparams(qparams)
        w = np.asarray(w, dtype=np.float32)
        q = self.quantize(w, qparams)
        zp64 = expand_param(qparams.zero_point, w.shape, qparams.axis, qparams.block_size)
        diff = q.astype(np.int64) - zp64
        payload_ok = self.native_qdq or (self.signed and diff.min(initial=0) >= -2**31
                                          and diff.max(initial=0) < 2**31)
        if not payload_ok:
            wname = f"{prefix}/w"
            em = self.emit(wname, output_name, qparams=qparams, prefix=prefix)
            em.initializers.insert(0, const_tensor(wname, w))
            return em
        attrs = _qattrs(qparams)
        sname, zname, qname = f"{prefix}/scale", f"{prefix}/zero_point", f"{prefix}/q"
        em = Emission(opsets={"": ONNX_OPSET})
        em.initializers += [const_tensor(qname, q.astype(np.int64).astype(self.np_dtype)),
                            const_tensor(sname, qparams.scale, np.float32),
                            const_tensor(zname, self._zp_array(qparams, self.np_dtype))]
        em.nodes.append(helper.make_node("DequantizeLinear", [qname, sname, zname], [output_name],
                                         name=f"{prefix}/DequantizeLinear", **attrs))
        return em


def _axbs(qparams: QParams) -> dict[str, int | None]:
    return {"axis": qparams.axis, "block_size": qparams.block_size or None}


#: Every named integer format.
INT_FORMATS: dict[str, IntFormat] = {
    f.name: f for f in (IntFormat(b, s, n) for b in INT_BITS for s in (True, False) for n in (False, True))
}
