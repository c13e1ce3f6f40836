"""Block formats: a block of elements along one axis shares a power-of-two scale computed from
the live data (no calibration). Three families, one spec (:class:`BlockFormat`):

* **BFP** (block floating point): ``bfp16`` (block 8, 8-bit shared exponent, sign + 7-bit
  magnitude) and ``bfp(block=B,exp=E,mant=M)`` for any widths (``sub=S`` adds microexponents).
* **Shared microexponents** (Rouhani et al., ISCA 2023): ``mx4 mx6 mx9`` = block 16, 8-bit
  shared exponent, sub-blocks of 2 with a 1-bit shift, sign + 2 / 4 / 7 magnitude bits.
* **OCP Microscaling v1.0**: ``mxint8 mxfp8_e4m3 mxfp8_e5m2 mxfp6_e3m2 mxfp6_e2m3 mxfp4``
  (block 32, E8M0 shared scale).

Semantics (the reference, :meth:`BlockFormat.fake_quant`; the ONNX in ``_block_onnx`` is
bit-identical in onnxruntime):

1. Blocks run along ``axis``; a last partial block is padded with zeros, which never change a
   block maximum; the padding is dropped again.
2. Non-finite blocks: a block holding any NaN or +-inf becomes all NaN. (OCP: such a block's
   E8M0 scale is the NaN code 0xFF and a NaN scale makes every element NaN; this is what the
   spec authors' reference library does. BFP / microexponents have no special codes, so NaN
   makes the damage visible instead of silently saturating.)
3. Shared exponent ``E = floor(log2(max |v|))`` of the block (computed exactly, frexp); an
   all-zero block gives zeros whatever E is.
4. Integer elements (BFP, MX4/6/9, MXINT8): ``s = clip(E, smin, smax)`` where a `exp`-bit BFP
   exponent with bias ``b = 2**(exp-1) - 1`` covers ``[-b, 2**exp - 1 - b]`` (every code is an
   exponent) and MXINT8 (E8M0) covers ``[-127, 127]``. An element is a sign-magnitude integer
   ``m``, ``|m| <= 2**mant - 1``, worth ``m * 2**(s_e - mant + 1)``; ``m = round(v / step)``
   (half to even by default, ``Rounding.HALF_AWAY`` selectable) and then **saturated** to
   ``+-(2**mant - 1)`` (a block maximum that rounds up to ``2**mant`` keeps the top code rather
   than bumping the exponent, as BFP hardware does). MXINT8 is this with mant = 7: the spec's
   8-bit two's complement with implied scale 2**-6, saturated symmetrically to +-127/64 (the
   code -128 = -2.0 is never produced, so negation commutes with quantization).
   ``s_e = s`` except with microexponents: a sub-block whose maximum is below ``2**s`` (fits one
   binade lower) uses ``s_e = s - 1``.
5. Float elements (MXFP8/6/4): ``X = 2**clip(E - emax_elem, -127, 127)`` (E8M0), elements
   ``P = round_to_element(v / X)``, half to even, saturating to the element's max normal (an
   FP4 block with max 7.0 has X = 1 and 7.0 -> 6.0); value ``P * X``.

The sign of a zero result follows the input (``-1e-30 -> -0.0``), except that HALF_AWAY
rounding gives ``+0.0`` for an input of ``-0.0`` (like ``sign(v) * floor(|v| + 0.5)``).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from mixq.errors import FormatError

from ._grid import round_half
from .base import Emission, Format, QParams, Rounding, Shape
from .floating import FP_FORMATS, FloatFormat
from .onnx_util import const_tensor

#: Smallest float32 exponent step the element grids may use (the float32 subnormal step):
#: every value a block format produces must be exactly representable in float32.
_F32_MIN_STEP_EXP = -149


@dataclass(frozen=True)
class BlockFormat(Format):
    """A block format: `block_size` elements along an axis share a power-of-two scale.

    `element` is ``"int"`` (sign + `mant_bits` magnitude bits; BFP, MX4/6/9, MXINT8) or the
    name of a float element format in FP_FORMATS (OCP MXFP). `scale_bits` is the width of the
    shared exponent; `ocp` selects the OCP E8M0 rules (range [-127, 127], float elements scaled
    by 2**-emax_elem). `sub_block` > 1 adds a 1-bit microexponent per sub-block.
    `label` is the canonical name (`name`)."""

    label: str
    block_size: int
    scale_bits: int = 8
    element: str = "int"
    mant_bits: int = 7
    sub_block: int = 1
    ocp: bool = False
    kind: ClassVar[str] = "block"
    onnx_opset: ClassVar[int] = 26  # BitCast (see _block_onnx)

    # -- identity -------------------------------------------------------------------------------
    @property
    def name(self) -> str:  # type: ignore[override]
        return self.label

    @property
    def bits(self) -> int:
        """Storage bits of one element (sign included)."""
        if self.element == "int":
            return 1 + self.mant_bits
        return self.element_format.bits

    @property
    def avg_bits(self) -> float:
        """Element bits + shared exponent / block + microexponent bit / sub-block."""
        micro = 1.0 / self.sub_block if self.sub_block > 1 else 0.0
        return self.bits + self.scale_bits / self.block_size + micro

    @property
    def needs_qparams(self) -> bool:
        return False

    @property
    def element_format(self) -> FloatFormat:
        """The float element format (OCP MXFP only)."""
        if self.element == "int":
            raise FormatError(f"{self.name} has integer elements, not a float element format")
        return FP_FORMATS[self.element]

    @property
    def scale_range(self) -> tuple[int, int]:
        """Inclusive range of the shared scale exponent s."""
        if self.ocp:
            return -127, 127  # E8M0; 0xFF (NaN) is reserved
        bias = 2 ** (self.scale_bits - 1) - 1
        return -bias, 2 ** self.scale_bits - 1 - bias

    @property
    def max_code(self) -> int:
        """Largest element magnitude code of integer elements (2**mant - 1)."""
        return 2 ** self.mant_bits - 1

    def __repr__(self) -> str:
        return f"BlockFormat({self.name})"

    # -- reference ------------------------------------------------------------------------------
    def _check_call(self, qparams: QParams | None, axis: int | None) -> int:
        if qparams is not None:
            raise FormatError(f"{self.name} computes its shared scales from the data; pass qparams=None")
        if axis is None:
            raise FormatError(f"{self.name} needs `axis`, the axis its blocks of {self.block_size} run along")
        if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)):
            raise FormatError(f"axis must be an int, got {axis!r}")
        return int(axis)

    def fake_quant(self, x: np.ndarray, qparams: QParams | None = None, *, axis: int | None = None,
                   rounding: Rounding = Rounding.HALF_EVEN) -> np.ndarray:
        """Quantize-dequantize `x` in blocks along `axis` (float32 in / out); see module doc."""
        axis = self._check_call(qparams, axis)
        x = np.asarray(x, dtype=np.float32)
        if not -x.ndim <= axis < x.ndim:
            raise FormatError(f"axis {axis} is out of range for a tensor of rank {x.ndim}")
        axis %= x.ndim
        n = x.shape[axis]
        if x.size == 0:
            return x.copy()
        v = np.moveaxis(x, axis, -1).astype(np.float64)
        nb = -(-n // self.block_size)
        pad = nb * self.block_size - n
        if pad:  # zeros never raise a block maximum
            v = np.concatenate([v, np.zeros(v.shape[:-1] + (pad,))], axis=-1)
        v = v.reshape(v.shape[:-1] + (nb, self.block_size))
        q = self._quant_blocks(v, rounding)
        q = q.reshape(q.shape[:-2] + (nb * self.block_size,))[..., :n]
        return np.moveaxis(q.astype(np.float32), -1, axis)

    def _quant_blocks(self, v: np.ndarray, rounding: Rounding) -> np.ndarray:
        """Quantize `v` of shape (..., nblocks, block) in float64 (exact: every step is 2**k)."""
        a = np.abs(v)
        finite = np.isfinite(a)
        bad = ~finite.all(axis=-1, keepdims=True)
        amax = np.max(np.where(finite, a, 0.0), axis=-1, keepdims=True)
        _, e = np.frexp(amax)  # amax = f * 2**e, f in [0.5, 1): floor(log2 amax) = e - 1
        big_e = e.astype(np.int64) - 1
        lo, hi = self.scale_range
        with np.errstate(invalid="ignore", over="ignore"):
            if self.element == "int":
                s = np.clip(big_e, lo, hi)
                if self.sub_block > 1:
                    sub = a.reshape(a.shape[:-1] + (-1, self.sub_block))
                    submax = np.max(np.where(np.isfinite(sub), sub, 0.0), axis=-1)  # (..., nb, B/S)
                    s = s - (submax < np.ldexp(1.0, s)).astype(np.int64)  # fits one binade lower
                    s = np.repeat(s, self.sub_block, axis=-1)
                step = np.ldexp(1.0, s - self.mant_bits + 1)
                m = np.clip(round_half(v / step, rounding), -self.max_code, self.max_code)
                q = m * step
            else:
                ef = self.element_format
                X = np.ldexp(1.0, np.clip(big_e - ef.emax, lo, hi))
                q = ef.round_elements(v / X, rounding) * X
        return np.where(bad, np.nan, q)

    # -- ONNX -----------------------------------------------------------------------------------
    def function_name(self, axis: int, rounding: Rounding = Rounding.HALF_EVEN, *,
                      length: int | None = None, const: bool = False,
                      post: int | None = None, rank: int | None = None) -> str:
        """Name of the model-local function for this format, axis and rounding, e.g.
        ``MXFP4_axis1``, ``BFP16_axism1``, ``BFP_B16_E8_M4_axis0_away``; ``_n64`` marks the
        variant for an axis of known length 64 (padded to whole blocks when it is not a
        multiple), ``_p784`` the one whose dims after the axis are known (784 elements), ``_r4``
        the one for inputs of rank 4 (a constant view), ``_const`` the one for constant inputs."""
        return _function_name(self, axis, rounding, length, const, post, rank)

    def emit(self, input_name: str, output_name: str, *, qparams: QParams | None = None,
             axis: int | None = None, prefix: str, rounding: Rounding = Rounding.HALF_EVEN,
             shape: Shape | None = None, opset: int | None = None) -> Emission:
        """One node in MIXQ_DOMAIN calling the model-local function of this format and axis
        (the aligned variant when `shape` says the axis length is a multiple of the block);
        `opset` below `onnx_opset`: the function at that opset (same values, see _block_onnx)."""
        from ._block_onnx import emit_block
        axis = self._check_call(qparams, axis)
        return emit_block(self, input_name, output_name, axis=axis, prefix=prefix, rounding=rounding,
                          shape=shape, opset=opset)

    def emit_weight(self, w: np.ndarray, output_name: str, *, qparams: QParams | None = None,
                    axis: int | None = None, prefix: str,
                    rounding: Rounding = Rounding.HALF_EVEN, opset: int | None = None) -> Emission:
        """The fake-quantized float32 weight as an initializer followed by the same function node
        (`opset` as in `emit`).

        ONNX has no type for block payloads, so the node keeps the format visible to a backend
        (it can re-derive the exact codes: the stored values are on the grid and fake_quant is
        idempotent) while onnxruntime constant-folds it to the same values."""
        from ._block_onnx import emit_block
        axis = self._check_call(qparams, axis)
        w = np.asarray(w, dtype=np.float32)
        if not -w.ndim <= axis < w.ndim:
            raise FormatError(f"axis {axis} is out of range for a weight of rank {w.ndim}")
        wname = f"{prefix}/w"
        em = emit_block(self, wname, output_name, axis=axis, prefix=prefix, rounding=rounding,
                        foldable=True, shape=w.shape, opset=opset)
        em.initializers.insert(0, const_tensor(wname, self.fake_quant(w, axis=axis, rounding=rounding)))
        return em


def _function_name(fmt: BlockFormat, axis: int, rounding: Rounding, length: int | None,
                   const: bool, post: int | None = None, rank: int | None = None) -> str:
    base = re.sub(r"[^A-Za-z0-9]+", "_", fmt.name.upper())
    if fmt.name.startswith("bfp("):  # bfp(block=16,exp=8,mant=4) -> BFP_B16_E8_M4
        base = f"BFP_B{fmt.block_size}_E{fmt.scale_bits}_M{fmt.mant_bits}"
        if fmt.sub_block > 1:
            base += f"_S{fmt.sub_block}"
    ax = f"axis{axis}" if axis >= 0 else f"axism{-axis}"
    return (f"{base}_{ax}" + ("" if length is None else f"_n{length}")
            + ("" if post is None else f"_p{post}") + ("" if rank is None else f"_r{rank}")
            + ("_away" if rounding is Rounding.HALF_AWAY else "") + ("_const" if const else ""))


# -- construction and names ------------------------------------------------------------------------
def _bfp_label(block: int, exp: int, mant: int, sub: int) -> str:
    for named in _PRESETS.values():
        if (named.element, named.ocp, named.block_size, named.scale_bits, named.mant_bits,
                named.sub_block) == ("int", False, block, exp, mant, sub):
            return named.name
    return f"bfp(block={block},exp={exp},mant={mant}" + (f",sub={sub})" if sub > 1 else ")")


#: Largest bfp block: every block is padded to its full size in memory (values and ONNX).
MAX_BLOCK = 4096


def make_bfp(block: int = 8, exp: int = 8, mant: int = 7, sub: int = 1) -> BlockFormat:
    """A BFP format (with 1-bit microexponents per `sub` elements when `sub` > 1), validated.

    Limits: 1 <= block <= MAX_BLOCK (4096); 1 <= exp <= 8; mant >= 1 with the finest step
    2**(smin - [sub > 1] - mant + 1) >= 2**-149 (every value is a float32); sub divides block."""
    for key, val in (("block", block), ("exp", exp), ("mant", mant), ("sub", sub)):
        if isinstance(val, bool) or not isinstance(val, (int, np.integer)) or val < 1:
            raise FormatError(f"bfp {key}={val!r} must be a positive integer")
    if block > MAX_BLOCK:  # a block is padded to its full size: unbounded blocks exhaust memory
        raise FormatError(f"bfp block={block} is above the largest block size {MAX_BLOCK}; "
                          "use a block of 8..64 elements (bfp16 uses 8, MX formats 32)")
    if exp > 8:
        raise FormatError(f"bfp exp={exp}: shared exponents wider than 8 bits exceed the float32 range; use 1..8")
    if block % sub:
        raise FormatError(f"bfp sub={sub} must divide block={block}")
    if sub == block and sub > 1:
        raise FormatError(f"bfp sub={sub} must be smaller than block={block}")
    bias = 2 ** (exp - 1) - 1
    finest = -bias - (1 if sub > 1 else 0) - mant + 1
    if finest < _F32_MIN_STEP_EXP:
        raise FormatError(f"bfp mant={mant} with exp={exp}: the finest step 2**{finest} is below the "
                          f"float32 subnormal step 2**-149; use mant <= {mant - (_F32_MIN_STEP_EXP - finest)}")
    label = _bfp_label(int(block), int(exp), int(mant), int(sub))
    if label in _PRESETS:  # bfp16, mx4/6/9: the one instance
        return _PRESETS[label]
    return BlockFormat(label, int(block), int(exp), "int", int(mant), int(sub))


_PRESETS: dict[str, BlockFormat] = {}
for _f in (
    BlockFormat("bfp16", 8, 8, "int", 7),
    BlockFormat("mx4", 16, 8, "int", 2, 2),
    BlockFormat("mx6", 16, 8, "int", 4, 2),
    BlockFormat("mx9", 16, 8, "int", 7, 2),
    BlockFormat("mxint8", 32, 8, "int", 7, ocp=True),
    BlockFormat("mxfp8_e4m3", 32, 8, "fp8_e4m3fn", ocp=True),
    BlockFormat("mxfp8_e5m2", 32, 8, "fp8_e5m2", ocp=True),
    BlockFormat("mxfp6_e3m2", 32, 8, "fp6_e3m2", ocp=True),
    BlockFormat("mxfp6_e2m3", 32, 8, "fp6_e2m3", ocp=True),
    BlockFormat("mxfp4", 32, 8, "fp4_e2m1", ocp=True),
):
    _PRESETS[_f.name] = _f

#: Every named block format, by canonical name.
BLOCK_FORMATS: dict[str, BlockFormat] = dict(_PRESETS)

_BFP_RE = re.compile(r"bfp\((.*)\)")
_BFP_KEYS = ("block", "exp", "mant", "sub")


def parse_block_format(name: str) -> BlockFormat | None:
    """Registry parser: ``bfp16``, ``mx4 mx6 mx9``, the OCP names and
    ``bfp(block=16,exp=8,mant=4[,sub=2])`` (keys in any order; omitted keys take the bfp16
    defaults block=8, exp=8, mant=7, sub=1). None for names outside this grammar."""
    key = re.sub(r"\s+", "", name.lower())
    if key in _PRESETS:
        return _PRESETS[key]
    if not key.startswith("bfp("):
        return None
    m = _BFP_RE.fullmatch(key)
    if m is None:
        raise FormatError(f"malformed block format {name!r}: expected e.g. 'bfp(block=16,exp=8,mant=4)'")
    params: dict[str, int] = {}
    for item in filter(None, m.group(1).split(",")) if m.group(1) else []:
        k, sep, val = item.partition("=")
        if not sep or k not in _BFP_KEYS:
            raise FormatError(f"malformed block format {name!r}: {item!r} is not one of "
                              f"{', '.join(k + '=<int>' for k in _BFP_KEYS)}")
        if k in params:
            raise FormatError(f"malformed block format {name!r}: {k} given twice")
        if not re.fullmatch(r"[0-9]+", val):
            raise FormatError(f"malformed block format {name!r}: {k}={val!r} is not a positive integer")
        params[k] = int(val)
    if not params:
        raise FormatError(f"malformed block format {name!r}: give at least one of block=, exp=, mant=")
    return make_bfp(**params)


def _register() -> None:
    from .registry import register_parser
    register_parser(parse_block_format, BLOCK_FORMATS.values())


_register()

__all__ = ["BlockFormat", "BLOCK_FORMATS", "make_bfp", "parse_block_format"]
