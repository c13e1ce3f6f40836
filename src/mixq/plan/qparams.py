"""Choose quantization parameters for a plan: activations from calibration statistics, weights
and constants from their values. Pure: numpy only."""
from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from ..calibration.observers import compute_range, compute_weight_range, pof2_exponent
from ..calibration.stats import TensorStats
from ..config import QuantConfig
from ..errors import ConfigError
from ..errors import DataError
from ..formats import QParams, get_format
from .memo import StatsMemo
from .plan import PrecisionPlan


def _pof2_qparams(fmt, k: np.ndarray | int, symmetric_zp: int) -> QParams:
    scale = np.ldexp(np.float32(1.0), np.asarray(k, dtype=np.int64)).astype(np.float32)
    zp = np.full(np.shape(scale), symmetric_zp, dtype=np.int64)
    return QParams(scale, zp)


def consumer_key(tensor: str, fmt: str) -> str:
    """Key of the parameters a tensor gets in a consumer format (precision boundaries)."""
    return f"{tensor}@{fmt}"


def activation_qparams(plan: PrecisionPlan, stats: dict[str, TensorStats], config: QuantConfig,
                       memo: StatsMemo | None = None,
                       bounds: Mapping[str, tuple[float, float]] | None = None,
                       unclipped: Collection[str] = ()) -> dict[str, QParams]:
    """Parameters per activation group (keyed by the group's name, or the tensor's) in its
    producer format, and per (tensor, consumer format) at precision boundaries.

    `memo` (the caller keeps it) remembers each choice by the statistics objects it read, the
    format and the options that choose a range: the plans of one search share most of their
    tensors, and a MinMSE range costs a scan of the histogram. `bounds` (`plan.ops.
    bounded_tensors`): the interval a tensor lies in by construction, where the range's
    headroom stops (a group's, when every calibrated member has one). `unclipped`
    (`plan.ops.output_defining_tensors`): tensors whose extremes are the model's answer (a
    graph output, the logits a float Softmax reads): MinMSE never clips them (`_choose`); a
    group with one such member is one."""
    bounds = bounds or {}
    merged: dict[str, TensorStats] = {}
    names: dict[str, list[str]] = {}  # the calibrated members of each group
    fmts: dict[str, str] = {}
    for name, tp in plan.tensors.items():
        if tp.role != "activation" or tp.format is None:
            continue
        key = tp.group or name
        fmts.setdefault(key, tp.format)
        if name in stats and tp.calibrate:
            merged[key] = merged[key].copy().merge(stats[name]) if key in merged else stats[name]
            names.setdefault(key, []).append(name)
    # per group: the statistics read (the memo's key) and the bound its members share
    read_of = {key: tuple(stats[n] for n in members) for key, members in names.items()}
    bound_of = {key: _union(bounds.get(n) for n in members) for key, members in names.items()}
    whole = set(unclipped)
    whole_of = {key: any(n in whole for n in members) for key, members in names.items()}
    out: dict[str, QParams] = {}
    for key, st in merged.items():
        qp = _chosen(key, get_format(fmts[key]), st, read_of[key], config, memo, bound_of[key], whole_of[key])
        if qp is not None:
            out[key] = qp
    for name, tp in plan.tensors.items():
        for fmt_name in set(tp.consumer_formats.values()):
            read: tuple[TensorStats, ...]
            key = tp.group or name
            if name in stats:
                st, read, bound, keep = stats[name], (stats[name],), bounds.get(name), name in whole
            elif key in merged:
                st, read, bound, keep = merged[key], read_of[key], bound_of[key], whole_of[key]
            else:
                continue
            qp = _chosen(name, get_format(fmt_name), st, read, config, memo, bound, keep)
            if qp is not None:
                out[consumer_key(name, fmt_name)] = qp
    return out


def _union(bounds: Iterable[tuple[float, float] | None]) -> tuple[float, float] | None:
    """The interval holding every one of `bounds`; None when one is None (unbounded)."""
    lo, hi = math.inf, -math.inf
    for b in bounds:
        if b is None:
            return None
        lo, hi = min(lo, b[0]), max(hi, b[1])
    return (lo, hi) if lo <= hi else None


def _chosen(name: str, fmt: Any, st: TensorStats, read: tuple[TensorStats, ...], config: QuantConfig,
            memo: StatsMemo | None, bound: tuple[float, float] | None = None,
            unclipped: bool = False) -> QParams | None:
    """`_choose`, through `memo` (by the statistics merged into `st`); a ConfigError names the
    tensor `name` (a layer rule's grid the config's method cannot calibrate)."""
    try:
        if memo is None:
            return _choose(fmt, st, config, bound, unclipped)
        what = ("range", fmt.name, config.power_of_two, config.activation_symmetric, config.calibration,
                config.percentile, config.minmse_min_gain, config.headroom_for(fmt, unclipped), bound, unclipped)
        return memo.get(read, what, lambda: _choose(fmt, st, config, bound, unclipped))
    except ConfigError as exc:
        raise ConfigError(f"tensor {name!r} ({fmt.name}): {exc}") from exc


def _choose(fmt, st: TensorStats, config: QuantConfig,
            bound: tuple[float, float] | None = None, unclipped: bool = False) -> QParams | None:
    """`fmt`'s parameters for a tensor of statistics `st`. `unclipped`: the tensor's extremes
    are the model's answer (the largest logit is the class): MinMSE, whose objective is the
    tensor's own error, would trade them for the bulk's precision; MinMax (the power of two no
    value overflows) keeps them."""
    if not fmt.needs_qparams:
        return None
    if config.power_of_two and fmt.kind == "int":
        # symmetric: zero point in the middle of the codes, +-absmax must fit;
        # asymmetric unsigned: zero point 0, [0, max] must fit
        sym = config.activation_symmetric or fmt.signed
        k = pof2_exponent(st, "nonoverflow" if unclipped else config.power_of_two, bits=fmt.bits,
                          signed=sym, min_gain=config.minmse_min_gain)
        return _pof2_qparams(fmt, k, fmt.symmetric_zero_point if sym else 0)
    method = "minmax" if unclipped and config.calibration == "minmse" else config.calibration
    lo, hi = compute_range(st, method, fmt, symmetric=config.activation_symmetric,
                           percentile=config.percentile, min_gain=config.minmse_min_gain)
    h = config.headroom_for(fmt, unclipped)  # an answer's extremes: output_headroom where asked
    if h != 1.0 and lo <= min(st.min, 0.0) and hi >= max(st.max, 0.0):
        # unclipped: the calibration extremes are a sample's, unseen inputs go past them, but
        # not past the bound of the op that makes the tensor (a Softmax's 1, a ReLU6's 6)
        wide_lo, wide_hi = lo * h, hi * h
        if bound is not None:
            wide_lo, wide_hi = max(wide_lo, min(lo, bound[0])), min(wide_hi, max(hi, bound[1]))
        lo, hi = wide_lo, wide_hi
    return fmt.qparams_from_range(lo, hi, symmetric=config.activation_symmetric)


def constant_qparams(model: onnx.ModelProto, plan: PrecisionPlan, config: QuantConfig
                     ) -> dict[str, QParams]:
    """Parameters of weights and constant inputs, from their values (per channel when planned)."""
    inits = {t.name: t for t in model.graph.initializer}
    out: dict[str, QParams] = {}
    for name, tp in plan.tensors.items():
        if tp.role not in ("weight", "constant") or tp.format is None:
            continue
        fmt: Any = get_format(tp.format)  # an IntFormat or a scaled float format
        if not fmt.needs_qparams:
            continue
        w = numpy_helper.to_array(inits[name])
        if w.dtype.kind == "f" and not np.isfinite(w).all():  # the numerics policies keep these float
            readers = [n.name or n.op_type for n in model.graph.node if name in n.input]
            raise DataError(f"{tp.role} {name!r} holds {w.size - int(np.count_nonzero(np.isfinite(w)))} "
                            f"non-finite value(s) (a -inf mask?), which no {tp.format} grid represents; "
                            "keep the numerics policies on (they leave it float), or leave the node that "
                            f"reads it float: exclude_nodes={{{', '.join(map(repr, readers[:3]))}}}")
        axis = tp.channel_axis if tp.role == "weight" and w.ndim > 0 else None
        method = config.weight_method if fmt.kind == "int" else "minmax"
        # a constant input of an activation slot is in the activation format: its symmetry too
        symmetric = config.weight_symmetric if tp.role == "weight" else config.activation_symmetric
        if tp.block_size and tp.block_axis is not None and fmt.kind == "int" and w.ndim > 0:
            out[name] = _block_qparams(w, fmt, tp.block_axis, tp.block_size, method, symmetric,
                                       config)
            continue
        lo, hi = compute_weight_range(w, axis=axis, method=method, symmetric=symmetric, fmt=fmt)
        if config.reduce_range and fmt.kind == "int" and tp.role == "weight":
            # one bit less: widen the range so that the codes used stay within half the scale
            widen = fmt.symmetric_limit / np.floor(fmt.symmetric_limit / 2)
            lo, hi = np.asarray(lo) * widen, np.asarray(hi) * widen
        if config.power_of_two and fmt.kind == "int":
            absmax = np.maximum(np.abs(lo), np.abs(hi))
            k = np.log2(_pof2_scale(absmax, fmt)).astype(np.int64)
            qp = _pof2_qparams(fmt, k, 0)
            out[name] = QParams(qp.scale, qp.zero_point, axis=axis if np.ndim(k) else None)
        else:
            out[name] = fmt.qparams_from_range(lo, hi, symmetric=symmetric, axis=axis)
    return out


def _block_qparams(w: np.ndarray, fmt: Any, axis: int, size: int, method: str, symmetric: bool,
                   config: QuantConfig) -> QParams:
    """Per-block parameters of a constant: one scale per `size` consecutive elements along
    `axis` (the last block may be partial), per element on the other axes; the layout of opset
    21's blocked DequantizeLinear (scale shape = w's shape with ceil(n / size) along `axis`)."""
    moved = np.moveaxis(w, axis, 0)
    n = moved.shape[0]
    nb = -(-n // size)
    pad = nb * size - n
    if pad:  # zeros pad the last block: they are exact on every grid and widen no range
        moved = np.concatenate([moved, np.zeros((pad, *moved.shape[1:]), moved.dtype)])
    rest = moved.shape[1:]
    rows = moved.reshape(nb, size, -1).transpose(0, 2, 1).reshape(-1, size)
    lo, hi = compute_weight_range(rows, axis=0, method=method, symmetric=symmetric, fmt=fmt)
    if config.reduce_range:
        widen = fmt.symmetric_limit / np.floor(fmt.symmetric_limit / 2)
        lo, hi = np.asarray(lo) * widen, np.asarray(hi) * widen
    qp = fmt.qparams_from_range(lo, hi, symmetric=symmetric or bool(config.power_of_two),
                                power_of_two=bool(config.power_of_two), axis=0)
    shape = (nb, *rest)
    scale = np.moveaxis(np.asarray(qp.scale).reshape(shape), 0, axis)
    zp = np.moveaxis(np.asarray(qp.zero_point).reshape(shape), 0, axis)
    return QParams(np.ascontiguousarray(scale), np.ascontiguousarray(zp), axis=axis, block_size=size)


def _pof2_scale(absmax, fmt):
    from ..formats.integer import pof2_scale

    return pof2_scale(absmax, fmt)
