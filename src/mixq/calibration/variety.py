"""Whether calibration data can stand for real inputs.

Data in which every float input holds one value (`np.zeros` or `np.ones` passed as calibration
data, a silent audio clip) cannot: the activation ranges fit that one input, and every check
made on the same data (the fidelity guard scores the last calibration samples, `mixq auto` a
held-out part of them) measures on it too and reports a perfect model. The quantizer then says
so instead of vouching for the output.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

import numpy as np
import onnx

from ..graph import is_float_type, static_shape, tensor_type

__all__ = ["ConstantDataWarning", "data_inputs", "constant_data", "feed_extremes"]


class ConstantDataWarning(UserWarning):
    """The calibration data is constant (`constant_data`): nothing measured on it vouches for the
    model."""


def data_inputs(model: onnx.ModelProto) -> list[str]:
    """The float graph inputs that hold more than one value per sample: a scalar per sample (a
    temperature, a threshold) is constant by design and says nothing about the data."""
    inits = {t.name for t in model.graph.initializer}
    out = []
    for i in model.graph.input:
        if i.name in inits or not is_float_type(tensor_type(i.type)):
            continue
        shape = static_shape(i.type)
        if shape is not None and all(d is not None for d in shape[1:]) and math.prod(shape[1:]) <= 1:  # type: ignore[arg-type]
            continue
        out.append(i.name)
    return out


def constant_data(model: onnx.ModelProto, extremes: Mapping[str, tuple[float, float]]) -> str | None:
    """Why the calibration data cannot stand for real inputs, when every input of `data_inputs`
    held a single finite value over all of it; None when one varied, or one is missing from
    `extremes` (its smallest and largest value over the data: NaN where any was not finite)."""
    names = data_inputs(model)
    if not names or any(n not in extremes for n in names):
        return None
    if any(not (extremes[n][0] == extremes[n][1]) for n in names):  # NaN compares unequal
        return None
    held = "; ".join(f"input {n!r} holds only the value {extremes[n][0]:g}" for n in names[:3])
    return (f"the calibration data is constant: {held}, in every sample. The ranges were fit to "
            "that one input, and the checks made on the same data measured on it too, so none of "
            "them says how the model does on real inputs. Calibrate with real samples (a few "
            "hundred typical inputs).")


def feed_extremes(feeds: Iterable[Mapping[str, np.ndarray]], names: Iterable[str]) -> dict[str, tuple[float, float]]:
    """(smallest, largest) value of each of `names` over `feeds` held in memory (NaN where a
    value is not finite)."""
    out: dict[str, tuple[float, float]] = {}
    for f in feeds:
        for n in names:
            if n not in f:
                continue
            a = np.asarray(f[n])
            if a.size == 0:
                continue
            lo, hi = float(np.min(a)), float(np.max(a))
            if not (math.isfinite(lo) and math.isfinite(hi)):
                lo = hi = math.nan
            plo, phi = out.get(n, (lo, hi))
            out[n] = (min(plo, lo), max(phi, hi)) if not math.isnan(plo) and not math.isnan(lo) else (math.nan, math.nan)
    return out
