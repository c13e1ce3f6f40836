"""Fake quantization in PyTorch, bit-exact with mixq's NumPy reference (`Format.fake_quant`).

One `TorchQuantizer` per tensor: it holds the format, the parameters expanded to the tensor's
shape (integer and scaled float formats) or the block axis (block formats), and computes

* ``quantizer(x)``: quantize-dequantize, no gradient, bit-exact with
  ``get_format(name).fake_quant(x, qparams, axis=...)`` (tested);
* ``quantizer.ste(x)``: the same values with a straight-through gradient (1 where the value is
  inside the representable range, 0 where it clips).

Rounding onto float grids and block scales run in float64, where every float32 input and every
power-of-two step is exact, as the NumPy reference does; integer formats run in float32 as
onnxruntime's QuantizeLinear does.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import FormatError
from ..formats import Format, QParams, Rounding, get_format
from ..formats.block import BlockFormat
from ..formats.floating import FloatFormat
from ..formats.integer import IntFormat, expand_param
from ._torch import require_torch


def _pow2(k: Any) -> Any:
    """2.0 ** k as float64, exactly, for an int64 tensor k in [-1022, 1023]."""
    torch = require_torch()
    return ((k + 1023) << 52).view(torch.float64)


def _round_half(v: Any, rounding: Rounding) -> Any:
    torch = require_torch()
    if rounding is Rounding.HALF_EVEN:
        return torch.round(v)
    return torch.sign(v) * torch.floor(torch.abs(v) + 0.5)


def round_float_grid(x: Any, *, mantissa_bits: int, min_exp: int, max_value: float,
                     rounding: Rounding = Rounding.HALF_EVEN, saturate: bool = True) -> Any:
    """Torch twin of `mixq.formats._grid.round_float_grid` (float64 in, float64 out)."""
    torch = require_torch()
    x = x.to(torch.float64)
    a = torch.abs(x)
    finite = torch.isfinite(a)
    _, e = torch.frexp(torch.where(finite, a, torch.zeros_like(a)))
    exp = torch.clamp(e.to(torch.int64) - 1, min=min_exp)
    step = _pow2(exp - mantissa_bits)
    q = _round_half(a / step, rounding) * step
    if saturate:
        q = torch.clamp(q, max=max_value)
    else:
        q = torch.where(q > max_value, torch.full_like(q, float("inf")), q)
    q = torch.where(torch.isinf(a), torch.full_like(q, max_value if saturate else float("inf")), q)
    out = torch.copysign(q, x)
    return torch.where(torch.isnan(x), x, out)


class TorchQuantizer:
    """Fake quantization of one tensor of a fixed shape with one format (see the module doc).

    `qparams` as for `Format.fake_quant` (integer and scaled float formats); `axis` is the block
    axis of block formats (ignored otherwise)."""

    def __init__(self, fmt: Format | str, shape: tuple[int, ...], qparams: QParams | None = None, *,
                 axis: int | None = None, rounding: Rounding = Rounding.HALF_EVEN) -> None:
        torch = require_torch()
        self.fmt = get_format(fmt)
        self.shape = tuple(int(d) for d in shape)
        self.rounding = rounding
        self.axis = axis
        fmt = self.fmt
        self.scale = self.zero_point = None
        if isinstance(fmt, IntFormat):
            qp = fmt._check_qparams(qparams)  # noqa: SLF001 - the format's own validation
            s = expand_param(qp.scale, self.shape, qp.axis, qp.block_size).astype(np.float32)
            zp = expand_param(qp.zero_point, self.shape, qp.axis, qp.block_size).astype(np.float32)
            self.scale, self.zero_point = torch.from_numpy(np.array(s)), torch.from_numpy(np.array(zp))
            lo, hi = fmt._fbounds  # noqa: SLF001
            self.lo, self.hi = float(lo), float(hi)
        elif isinstance(fmt, FloatFormat):
            fqp = fmt._check_qparams(qparams)  # noqa: SLF001
            if fqp is not None:
                s = expand_param(fqp.scale, self.shape, fqp.axis, fqp.block_size).astype(np.float32)
                self.scale = torch.from_numpy(np.array(s))
        elif isinstance(fmt, BlockFormat):
            ax = fmt._check_call(qparams, axis)  # noqa: SLF001
            if not -len(self.shape) <= ax < len(self.shape):
                raise FormatError(f"axis {axis} is out of range for a tensor of rank {len(self.shape)}")
            self.axis = ax % len(self.shape)
        else:  # pragma: no cover - every registered format is one of the three classes
            raise FormatError(f"format {fmt.name} of kind {fmt.kind!r} has no torch fake quantization")

    # -- exact values ---------------------------------------------------------------------------
    def __call__(self, x: Any) -> Any:
        """Quantize-dequantize `x` (float32 tensor of `shape`), no gradient."""
        torch = require_torch()
        with torch.no_grad():
            x = x.detach().to(torch.float32)
            f = self.fmt
            if isinstance(f, IntFormat):
                return self._int(x)
            if isinstance(f, FloatFormat):
                return self._float(x, f)
            if isinstance(f, BlockFormat):
                return self._block(x, f)
            raise FormatError(f"format {f.name} has no torch fake quantization")  # pragma: no cover

    def _int(self, x: Any) -> Any:
        torch = require_torch()
        y = x / self.scale
        if self.rounding is Rounding.HALF_EVEN:
            r = torch.round(y)
        else:
            r = _round_half(y.to(torch.float64), self.rounding).to(torch.float32)
        q = torch.clamp(r + self.zero_point, self.lo, self.hi)
        q = torch.where(torch.isnan(x), torch.full_like(q, self.lo), q)
        return (q - self.zero_point) * self.scale

    def _float(self, x: Any, f: FloatFormat) -> Any:
        torch = require_torch()
        if self.scale is None and f.name in ("bf16", "fp16"):
            # torch's casts round to nearest even, keep subnormals and NaN and overflow to +-inf,
            # exactly as the reference (tested bit for bit); much faster than the grid rounding
            if self.rounding is Rounding.HALF_EVEN:
                return x.to(torch.bfloat16 if f.name == "bf16" else torch.float16).to(torch.float32)
        if self.scale is None:
            return round_float_grid(x, mantissa_bits=f.mantissa_bits, min_exp=f.min_exp,
                                    max_value=f.max_normal, rounding=self.rounding,
                                    saturate=False).to(torch.float32)
        y = x / self.scale
        r = round_float_grid(y, mantissa_bits=f.mantissa_bits, min_exp=f.min_exp, max_value=f.max_normal,
                             rounding=self.rounding, saturate=True).to(torch.float32)
        return r * self.scale

    def _block(self, x: Any, f: BlockFormat) -> Any:
        torch = require_torch()
        if x.numel() == 0:
            return x.clone()
        ax = self.axis
        n = x.shape[ax]
        v = torch.movedim(x, ax, -1).to(torch.float64)
        nb = -(-n // f.block_size)
        pad = nb * f.block_size - n
        if pad:
            v = torch.cat([v, v.new_zeros(v.shape[:-1] + (pad,))], dim=-1)
        v = v.reshape(v.shape[:-1] + (nb, f.block_size))
        a = torch.abs(v)
        finite = torch.isfinite(a)
        bad = ~finite.all(dim=-1, keepdim=True)
        a0 = torch.where(finite, a, torch.zeros_like(a))
        amax = a0.amax(dim=-1, keepdim=True)
        _, e = torch.frexp(amax)
        big_e = e.to(torch.int64) - 1
        lo, hi = f.scale_range
        if f.element == "int":
            s = torch.clamp(big_e, lo, hi)
            if f.sub_block > 1:
                sub = a0.reshape(a0.shape[:-1] + (-1, f.sub_block))
                submax = sub.amax(dim=-1)
                s = s - (submax < _pow2(s)).to(torch.int64)
                s = torch.repeat_interleave(s, f.sub_block, dim=-1)
            step = _pow2(s - f.mant_bits + 1)
            m = torch.clamp(_round_half(v / step, self.rounding), -f.max_code, f.max_code)
            q = m * step
        else:
            ef = f.element_format
            scale = _pow2(torch.clamp(big_e - ef.emax, lo, hi))
            q = round_float_grid(v / scale, mantissa_bits=ef.mantissa_bits, min_exp=ef.min_exp,
                                 max_value=ef.max_normal, rounding=self.rounding, saturate=True) * scale
        q = torch.where(bad, torch.full_like(q, float("nan")), q)
        q = q.reshape(q.shape[:-2] + (nb * f.block_size,))[..., :n]
        return torch.movedim(q.to(torch.float32), -1, ax)

    # -- straight-through estimator --------------------------------------------------------------
    def in_range(self, x: Any) -> Any:
        """Boolean mask of the elements that do not clip (where the STE passes the gradient)."""
        torch = require_torch()
        with torch.no_grad():
            f = self.fmt
            if isinstance(f, IntFormat):
                y = x / self.scale + self.zero_point
                return (y >= self.lo - 0.5) & (y <= self.hi + 0.5)
            if isinstance(f, FloatFormat):
                y = x if self.scale is None else x / self.scale
                return torch.abs(y) <= f.max_normal
            return torch.isfinite(x)

    def ste(self, x: Any) -> Any:
        """`self(x)` in the forward pass; gradient 1 inside the range, 0 where values clip."""
        torch = require_torch()
        q = self(x)
        mask = self.in_range(x).to(x.dtype)
        xm = x * mask
        return xm + (q - xm).detach()


def torch_fake_quant(x: Any, fmt: Format | str, qparams: QParams | None = None, *,
                     axis: int | None = None, rounding: Rounding = Rounding.HALF_EVEN) -> Any:
    """One-shot torch twin of ``get_format(fmt).fake_quant(x, qparams, axis=axis)``."""
    return TorchQuantizer(fmt, tuple(x.shape), qparams, axis=axis, rounding=rounding)(x)


__all__ = ["TorchQuantizer", "round_float_grid", "torch_fake_quant"]
