"""Floating-point element formats: fp16, bf16 (casts), fp8_e4m3fn, fp8_e5m2 (scaled, native
QuantizeLinear), fp6_e3m2, fp6_e2m3, fp4_e2m1 (scaled, model-local function).

Every reference rounds with `round_float_grid` (bit-exact with ml_dtypes casts). Verified
onnxruntime behaviour the emissions rely on (see the integration tests):

* Cast float -> float16 / bfloat16 rounds to nearest even, overflows to +-inf, keeps NaN;
* QuantizeLinear to float8 (saturate=1) divides x / scale in float32, rounds to nearest even,
  saturates +-inf and overflow to +-max, keeps NaN; DequantizeLinear multiplies in float32;
* fp6/fp4 have no onnxruntime kernel: ``com.mixq.QDQ_<name>`` finds the binade of |x/scale| with
  a short Where ladder over the powers of two of the grid (exact, no Log), rounds the signed
  value with Round (half to even) at that step (keeping the sign of zeros), saturates with
  Max/Min and multiplies by the scale. NaN stays NaN, +-inf saturates to +-max (as the fp8 path).
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np
import onnx
from onnx import TensorProto, helper

from mixq.errors import FormatError

from ._grid import round_float_grid
from .base import MIXQ_DOMAIN, MIXQ_DOMAIN_VERSION, Emission, Format, QParams, Rounding, Shape
from .integer import _axbs, _qattrs, check_scale, expand_param, per_tensor_if_single, pof2_scale
from .onnx_util import ONNX_OPSET, const_node, const_tensor, expand_param_nodes, make_function


@dataclass(frozen=True)
class FloatFormat(Format):
    """A binary floating-point element format.

    `nan` says how special values are encoded: ``"ieee"`` (all-ones exponent is inf/NaN: fp16,
    bf16, fp8_e5m2), ``"fn"`` (finite; only the all-ones code is NaN: fp8_e4m3fn), ``"none"``
    (finite, no NaN: fp6/fp4). `scaled` formats need a per-tensor/channel/block scale
    (fake quant = round(x / scale) * scale); unscaled ones are plain casts."""

    fmt_name: str
    exponent_bits: int
    mantissa_bits: int
    bias: int
    nan: str = "ieee"
    scaled: bool = False
    kind = "float"

    # -- identity -------------------------------------------------------------------------------
    @property
    def name(self) -> str:  # type: ignore[override]
        """Canonical name (ml_dtypes spelling: fp8_e4m3fn, fp4_e2m1 ...)."""
        return self.fmt_name

    @property
    def bits(self) -> int:
        return 1 + self.exponent_bits + self.mantissa_bits

    @property
    def avg_bits(self) -> float:
        return float(self.bits)

    @property
    def needs_qparams(self) -> bool:
        return self.scaled

    @property
    def has_inf(self) -> bool:
        """Whether the format encodes +-inf."""
        return self.nan == "ieee"

    @property
    def has_nan(self) -> bool:
        """Whether the format encodes NaN."""
        return self.nan != "none"

    def __repr__(self) -> str:
        return f"FloatFormat({self.name})"

    # -- limits ---------------------------------------------------------------------------------
    @property
    def emax(self) -> int:
        """Exponent of the largest normal binade (fp8_e4m3fn 8, fp6_e3m2 4, fp4_e2m1 2)."""
        top = 2 ** self.exponent_bits - 1 - self.bias
        return top - 1 if self.nan == "ieee" else top

    @property
    def min_exp(self) -> int:
        """Exponent of the smallest normal binade (1 - bias)."""
        return 1 - self.bias

    @property
    def max_normal(self) -> float:
        """Largest finite magnitude."""
        m = self.mantissa_bits
        frac = 2.0 - 2.0 ** (1 - m) if self.nan == "fn" else 2.0 - 2.0 ** -m  # fn: top code is NaN
        return frac * 2.0 ** self.emax

    @property
    def min_normal(self) -> float:
        """Smallest positive normal value."""
        return 2.0 ** self.min_exp

    @property
    def min_subnormal(self) -> float:
        """Smallest positive (subnormal) value."""
        return 2.0 ** (self.min_exp - self.mantissa_bits)

    @property
    def symmetric_limit(self) -> float:
        """Largest |x / scale| representable: max_normal (used by pof2_scale)."""
        return self.max_normal

    @property
    def np_dtype(self) -> Any:
        """The ml_dtypes / NumPy type of one element."""
        return _ML_DTYPES[self.name]

    @property
    def onnx_type(self) -> int | None:
        """TensorProto element type onnxruntime can QDQ / Cast, or None (fp6, fp4)."""
        return _ONNX_TYPES.get(self.name)

    # -- reference ------------------------------------------------------------------------------
    def round_elements(self, x: np.ndarray, rounding: Rounding = Rounding.HALF_EVEN, *,
                       saturate: bool = True) -> np.ndarray:
        """Round unscaled `x` onto the element grid, as float64. Saturating (the MX / OCP
        convention, +-inf -> +-max_normal) unless `saturate` is False (IEEE cast: overflow -> inf)."""
        with warnings.catch_warnings():  # frexp exponents of inf/NaN warn when cast; unused
            warnings.simplefilter("ignore", RuntimeWarning)
            return round_float_grid(x, mantissa_bits=self.mantissa_bits, min_exp=self.min_exp,
                                    max_value=self.max_normal, rounding=rounding, saturate=saturate)

    def _check_qparams(self, qparams: QParams | None) -> QParams | None:
        if not self.scaled:
            if qparams is not None:
                raise FormatError(f"{self.name} is a cast format and takes no qparams")
            return None
        if qparams is None:
            raise FormatError(f"format {self.name} needs qparams (a scale)")
        check_scale(qparams.scale)
        qparams = per_tensor_if_single(qparams)
        if np.any(np.asarray(qparams.zero_point) != 0):
            raise FormatError(f"{self.name} is symmetric: zero points must be 0")
        return qparams

    def fake_quant(self, x: np.ndarray, qparams: QParams | None = None, *, axis: int | None = None,
                   rounding: Rounding = Rounding.HALF_EVEN) -> np.ndarray:
        """Cast formats: round x to the format (IEEE: overflow -> inf). Scaled formats:
        round_elements(x / scale) * scale in float32, saturating (+-inf -> +-max * scale)."""
        qparams = self._check_qparams(qparams)
        x = np.asarray(x, dtype=np.float32)
        if qparams is None:
            return self.round_elements(x, rounding, saturate=False).astype(np.float32)
        s = expand_param(qparams.scale, x.shape, qparams.axis, qparams.block_size).astype(np.float32)
        with np.errstate(over="ignore", invalid="ignore"):
            y = np.divide(x, s, dtype=np.float32)
            r = self.round_elements(y, rounding).astype(np.float32)
            return np.multiply(r, s, dtype=np.float32)

    def qparams_from_range(self, lo: Any, hi: Any, symmetric: bool = True, power_of_two: bool = False,
                           axis: int | None = None) -> QParams:
        """Scale = max(|lo|, |hi|) / max_normal (zero range: 1), zero point 0; power_of_two
        rounds the scale up to 2**k. Float formats have no zero point, so `symmetric` is
        accepted for a uniform call signature and has no effect (the range is always +-absmax)."""
        if not self.scaled:
            raise FormatError(f"{self.name} is a cast format and takes no qparams")
        lo_a = np.asarray(lo, dtype=np.float64)
        hi_a = np.asarray(hi, dtype=np.float64)
        if not (np.all(np.isfinite(lo_a)) and np.all(np.isfinite(hi_a))):
            raise FormatError("cannot compute qparams from a non-finite range")
        absmax = np.maximum(np.abs(lo_a), np.abs(hi_a))
        if power_of_two:
            scale = pof2_scale(absmax, self)
        else:
            scale = np.where(absmax > 0, absmax / self.max_normal, 1.0)
            scale = np.maximum(scale, 2.0 ** -126).astype(np.float32)
        return QParams(scale, np.zeros(scale.shape, np.int64), axis=axis if scale.ndim == 1 else None)

    # -- ONNX -----------------------------------------------------------------------------------
    def function(self) -> onnx.FunctionProto:
        """MIXQ_DOMAIN function QDQ_<name>(x, scale) -> out, `scale` broadcastable to x."""
        m = self.mantissa_bits
        nodes = [helper.make_node("Div", ["x", "scale"], ["y"]),
                 helper.make_node("Abs", ["y"], ["a"]),
                 const_node("step_min", np.float32(2.0 ** (self.min_exp - m)))]
        step = "step_min"
        for i, k in enumerate(range(self.min_exp + 1, self.emax + 1)):  # binade ladder, exact
            nodes += [const_node(f"binade{i}", np.float32(2.0 ** k)),
                      const_node(f"ulp{i}", np.float32(2.0 ** (k - m))),
                      helper.make_node("GreaterOrEqual", ["a", f"binade{i}"], [f"ge{i}"]),
                      helper.make_node("Where", [f"ge{i}", f"ulp{i}", step], [f"step{i}"])]
            step = f"step{i}"
        nodes += [
            # rounding the signed value keeps the sign of zeros and infinities (Round(-0.2) = -0)
            helper.make_node("Div", ["y", step], ["u"]),  # exact: step is a power of two
            helper.make_node("Round", ["u"], ["ru"]),  # half to even
            helper.make_node("Mul", ["ru", step], ["q0"]),
            const_node("maxv", np.float32(self.max_normal)),
            const_node("minv", np.float32(-self.max_normal)),
            helper.make_node("Max", ["q0", "minv"], ["q1"]),  # saturate; NaN propagates
            helper.make_node("Min", ["q1", "maxv"], ["q"]),
            helper.make_node("Mul", ["q", "scale"], ["out"]),
        ]
        return make_function(f"QDQ_{self.name}", ["x", "scale"], ["out"], nodes,
                             doc=f"scaled round-to-{self.name}, saturating, half to even")

    def _check_emit(self, qparams: QParams | None, rounding: Rounding) -> QParams | None:
        qparams = self._check_qparams(qparams)
        if rounding is not Rounding.HALF_EVEN:
            raise FormatError(f"ONNX emission of {self.name} supports only Rounding.HALF_EVEN, got {rounding}")
        return qparams

    def emit(self, input_name: str, output_name: str, *, qparams: QParams | None = None,
             axis: int | None = None, prefix: str, rounding: Rounding = Rounding.HALF_EVEN,
             shape: Shape | None = None) -> Emission:
        """Cast -> Cast (fp16/bf16), QuantizeLinear -> DequantizeLinear (fp8) or the
        QDQ_<name> function (fp6/fp4)."""
        qparams = self._check_emit(qparams, rounding)
        em = Emission(opsets={"": ONNX_OPSET})
        if qparams is None:
            mid = f"{prefix}/cast"
            em.nodes += [helper.make_node("Cast", [input_name], [mid], name=f"{prefix}/Cast", to=self.onnx_type),
                         helper.make_node("Cast", [mid], [output_name], name=f"{prefix}/CastBack",
                                          to=TensorProto.FLOAT)]
            return em
        sname = f"{prefix}/scale"
        em.initializers.append(const_tensor(sname, qparams.scale, np.float32))
        attrs = _qattrs(qparams)
        if self.onnx_type is not None:  # fp8: native, saturating
            zname, q = f"{prefix}/zero_point", f"{prefix}/q"
            em.initializers.append(const_tensor(zname, np.zeros(qparams.scale.shape, self.np_dtype)))
            em.nodes += [helper.make_node("QuantizeLinear", [input_name, sname, zname], [q],
                                          name=f"{prefix}/QuantizeLinear", saturate=1, **attrs),
                         helper.make_node("DequantizeLinear", [q, sname, zname], [output_name],
                                          name=f"{prefix}/DequantizeLinear", **attrs)]
            return em
        em.opsets[MIXQ_DOMAIN] = MIXQ_DOMAIN_VERSION
        em.functions.append(self.function())
        s_in = sname
        if attrs:
            s_in = f"{prefix}/scale_full"
            em.nodes += expand_param_nodes(input_name, sname, s_in, prefix=f"{prefix}/xs", **_axbs(qparams))
        em.nodes.append(helper.make_node(f"QDQ_{self.name}", [input_name, s_in], [output_name],
                                         name=f"{prefix}/QDQ", domain=MIXQ_DOMAIN))
        return em

    def emit_weight(self, w: np.ndarray, output_name: str, *, qparams: QParams | None = None,
                    axis: int | None = None, prefix: str) -> Emission:
        """fp16/bf16: the cast payload + Cast to float. fp8: the fp8 payload + DequantizeLinear.
        fp6/fp4: one uint8 code per element + Gather from the 2**bits-entry value table,
        times the scale (4x smaller than float32); weights with NaN keep float + the function."""
        qparams = self._check_qparams(qparams)
        w = np.asarray(w, dtype=np.float32)
        em = Emission(opsets={"": ONNX_OPSET})
        qname = f"{prefix}/q"
        if qparams is None:
            payload = self.fake_quant(w).astype(self.np_dtype)
            em.initializers.append(const_tensor(qname, payload))
            em.nodes.append(helper.make_node("Cast", [qname], [output_name], name=f"{prefix}/Cast",
                                             to=TensorProto.FLOAT))
            return em
        s = expand_param(qparams.scale, w.shape, qparams.axis, qparams.block_size).astype(np.float32)
        with np.errstate(over="ignore", invalid="ignore"):
            r = self.round_elements(np.divide(w, s, dtype=np.float32))
        sname = f"{prefix}/scale"
        attrs = _qattrs(qparams)
        if self.onnx_type is not None:
            zname = f"{prefix}/zero_point"
            em.initializers += [const_tensor(qname, r.astype(self.np_dtype)),
                                const_tensor(sname, qparams.scale, np.float32),
                                const_tensor(zname, np.zeros(qparams.scale.shape, self.np_dtype))]
            em.nodes.append(helper.make_node("DequantizeLinear", [qname, sname, zname], [output_name],
                                             name=f"{prefix}/DequantizeLinear", **attrs))
            return em
        if np.isnan(w).any():  # no NaN code in fp6/fp4
            wname = f"{prefix}/w"
            em = self.emit(wname, output_name, qparams=qparams, prefix=prefix)
            em.initializers.insert(0, const_tensor(wname, w))
            return em
        codes = r.astype(self.np_dtype).view(np.uint8)
        table = np.arange(2 ** self.bits, dtype=np.uint8).view(self.np_dtype).astype(np.float32)
        idx, vals = f"{prefix}/idx", f"{prefix}/vals"
        em.initializers += [const_tensor(qname, codes), const_tensor(f"{prefix}/table", table),
                            const_tensor(sname, qparams.scale, np.float32)]
        s_in = sname
        em.nodes += [helper.make_node("Cast", [qname], [idx], name=f"{prefix}/CastIdx", to=TensorProto.INT32),
                     helper.make_node("Gather", [f"{prefix}/table", idx], [vals], name=f"{prefix}/Gather")]
        if attrs:
            s_in = f"{prefix}/scale_full"
            em.nodes += expand_param_nodes(vals, sname, s_in, prefix=f"{prefix}/xs", **_axbs(qparams))
        em.nodes.append(helper.make_node("Mul", [vals, s_in], [output_name], name=f"{prefix}/Mul"))
        return em


_ML_DTYPES: dict[str, Any] = {
    "fp16": np.float16, "bf16": ml_dtypes.bfloat16,
    "fp8_e4m3fn": ml_dtypes.float8_e4m3fn, "fp8_e5m2": ml_dtypes.float8_e5m2,
    "fp6_e3m2": ml_dtypes.float6_e3m2fn, "fp6_e2m3": ml_dtypes.float6_e2m3fn,
    "fp4_e2m1": ml_dtypes.float4_e2m1fn,
}
_ONNX_TYPES = {
    "fp16": TensorProto.FLOAT16, "bf16": TensorProto.BFLOAT16,
    "fp8_e4m3fn": TensorProto.FLOAT8E4M3FN, "fp8_e5m2": TensorProto.FLOAT8E5M2,
}

#: Every named floating-point element format, by canonical name.
FP_FORMATS: dict[str, FloatFormat] = {f.name: f for f in (
    FloatFormat("fp16", 5, 10, 15, "ieee"),
    FloatFormat("bf16", 8, 7, 127, "ieee"),
    FloatFormat("fp8_e4m3fn", 4, 3, 7, "fn", scaled=True),
    FloatFormat("fp8_e5m2", 5, 2, 15, "ieee", scaled=True),
    FloatFormat("fp6_e3m2", 3, 2, 3, "none", scaled=True),
    FloatFormat("fp6_e2m3", 2, 3, 1, "none", scaled=True),
    FloatFormat("fp4_e2m1", 2, 1, 1, "none", scaled=True),
)}

__all__ = ["FloatFormat", "FP_FORMATS"]
