"""Vectorized rounding of float arrays to bfloat16 / float16, and TensorProto conversions.

`bf16_bits` is the hot path of every conversion (all weights go through it), so it works on
the float32 bit pattern with integer arithmetic (about 3 ns per element) instead of
`mixq.formats._grid.round_float_grid` (about 200 ns per element in float64). The tests check it
bit-exact against round_float_grid (mantissa_bits=7, min_exp=-126, saturate=False), against
ml_dtypes.bfloat16 and against onnxruntime's Cast, for every class of input: normals, ties,
subnormals, overflow to infinity, +-inf, NaN (kept NaN, sign preserved, quiet payload 0x7FC0 as
ml_dtypes and onnxruntime produce).
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

__all__ = ["bf16_bits", "round_to_bf16", "round_to_fp16", "round_like", "tensor_to_target",
           "round_tensor_inplace", "FP16_MAX", "BF16_MAX"]

FP16_MAX = 65504.0
#: the largest finite bfloat16 (0x7F7F); weights beyond it saturate here (see `round_like`)
BF16_MAX = float(np.uint32(0x7F7F0000).view(np.float32))
_NP_OF = {TensorProto.FLOAT: np.float32, TensorProto.FLOAT16: np.float16}


def bf16_bits(x: np.ndarray) -> np.ndarray:
    """The bfloat16 bit patterns (uint16) of `x` rounded to nearest, ties to even.

    `x` is float32 or float16 (float16 widens to float32 exactly). Values past the bfloat16
    range become +-inf, NaN stays NaN (quiet, sign kept)."""
    x = np.asarray(x)
    if x.dtype != np.float32:
        with np.errstate(invalid="ignore", over="ignore"):
            x = x.astype(np.float32)
    u = x.view(np.uint32)
    # round to nearest even on the upper 16 bits: add 0x7FFF plus the lowest kept bit
    r = ((u + (np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1)))) >> np.uint32(16)).astype(np.uint16)
    nan = np.isnan(x)
    if nan.any():
        r[nan] = ((u[nan] >> np.uint32(16)) & np.uint32(0x8000)).astype(np.uint16) | np.uint16(0x7FC0)
    return r


def _bits_to_f32(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32)


def round_to_bf16(x: np.ndarray) -> np.ndarray:
    """`x` rounded to bfloat16 values, returned in x's own dtype (float32 or float16).

    For float16 input, values that round past the float16 range become +-inf, as a
    float16 -> bfloat16 -> float16 Cast pair in onnxruntime computes."""
    x = np.asarray(x)
    out = _bits_to_f32(bf16_bits(x))
    if x.dtype == np.float32:
        return out
    with np.errstate(over="ignore", invalid="ignore"):
        return out.astype(x.dtype)


def round_to_fp16(x: np.ndarray, *, saturate: bool = False) -> np.ndarray:
    """`x` rounded to float16 values (round to nearest even), returned in x's dtype.

    With `saturate`, finite values beyond the float16 range become +-65504 instead of +-inf."""
    x = np.asarray(x)
    if saturate:
        finite = np.isfinite(x)
        x = np.where(finite, np.clip(x, -FP16_MAX, FP16_MAX), x)
    with np.errstate(over="ignore"):
        return x.astype(np.float16).astype(x.dtype)


def round_like(x: np.ndarray, target: int) -> np.ndarray:
    """Round the weight values `x` to the values of ONNX element type `target` (BFLOAT16 or
    FLOAT16), keep dtype. Finite values past the range saturate to the largest finite value:
    past float32's range only sentinels live (a mask of float32's lowest value), and as +-inf
    a fully masked row's Softmax turns NaN."""
    if target == TensorProto.BFLOAT16:
        x = np.asarray(x)
        if x.dtype == np.float32:  # float16 values are all within bfloat16's range
            x = np.where(np.isfinite(x), np.clip(x, -BF16_MAX, BF16_MAX), x).astype(np.float32)
        return round_to_bf16(x)
    return round_to_fp16(x, saturate=True)


def _array(t: TensorProto) -> np.ndarray:
    return numpy_helper.to_array(t)


def tensor_to_target(t: TensorProto, target: int, name: str | None = None) -> tuple[TensorProto, int]:
    """A copy of the float32/float16 tensor `t` stored as `target` (BFLOAT16 or FLOAT16).

    Returns the new tensor and the number of finite values past the target's range, saturated
    to its largest finite value (as `round_like`)."""
    arr = _array(t)
    out = TensorProto()
    out.name = t.name if name is None else name
    out.dims.extend(t.dims)
    out.data_type = target
    if target == TensorProto.BFLOAT16:
        bits = bf16_bits(arr)
        past = np.isinf(_bits_to_f32(bits)) & np.isfinite(arr)
        over = int(np.count_nonzero(past))
        if over:
            bits[past] = (bits[past] & np.uint16(0x8000)) | np.uint16(0x7F7F)
        out.raw_data = bits.astype("<u2").tobytes()
    elif target == TensorProto.FLOAT16:
        over = int(np.count_nonzero(np.isfinite(arr) & (np.abs(arr) > FP16_MAX)))
        out.raw_data = round_to_fp16(arr.astype(np.float32), saturate=True).astype("<f2").tobytes()
    else:
        raise ValueError(f"unsupported target element type {target}")
    if t.doc_string:
        out.doc_string = t.doc_string
    return out, over


def round_tensor_inplace(t: TensorProto, target: int) -> int:
    """Replace the values of float32/float16 tensor `t` by their `target`-rounded values, keeping
    its element type. Returns the number of finite values that overflowed."""
    arr = _array(t)
    r = round_like(arr, target)
    with np.errstate(invalid="ignore"):
        over = int(np.count_nonzero(np.isfinite(arr) & ~np.isfinite(round_to_bf16(arr)))) \
            if target == TensorProto.BFLOAT16 \
            else int(np.count_nonzero(np.isfinite(arr) & (np.abs(arr.astype(np.float32)) > FP16_MAX)))
    new = numpy_helper.from_array(np.ascontiguousarray(r.astype(arr.dtype)), t.name)
    keep_doc = t.doc_string
    t.CopyFrom(new)
    if keep_doc:
        t.doc_string = keep_doc
    return over


def element_type_name(t: int) -> str:
    """'float32', 'float16', 'bfloat16', ... for an ONNX element type."""
    names: dict[int, str] = {TensorProto.FLOAT: "float32", TensorProto.FLOAT16: "float16",
                             TensorProto.BFLOAT16: "bfloat16", TensorProto.DOUBLE: "float64"}
    return names.get(t, onnx.TensorProto.DataType.Name(t).lower())
