"""Whether calibration data can stand for real inputs.

Data in which every input holds one value (`np.zeros` or `np.ones` passed as calibration data,
zeros as token ids, a silent audio clip) cannot: the activation ranges fit that one input, and
every check made on the same data (the fidelity guard scores the last calibration samples,
`mixq auto` a held-out part of them) measures on it too and reports a perfect model. Inputs
holding inf or NaN reach every tensor downstream. The quantizer says so instead of vouching for
the output; `InputExtremes` watches the calibration pass for it.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np
import onnx

from ..graph import static_shape
from .data import feed_rows

__all__ = ["ConstantDataWarning", "InputExtremes", "Extremes", "data_inputs", "constant_data", "feed_extremes"]


class ConstantDataWarning(UserWarning):
    """The calibration data is constant (`constant_data`): nothing measured on it vouches for the
    model."""


def data_inputs(model: onnx.ModelProto) -> list[str]:
    """The numeric graph inputs (float or integer: images, audio, token ids) that hold more than
    one value per sample: a scalar per sample (a temperature, a length) is constant by design
    and says nothing about the data."""
    inits = {t.name for t in model.graph.initializer}
    out = []
    for i in model.graph.input:
        elem = i.type.tensor_type.elem_type if i.type.HasField("tensor_type") else 0
        if i.name in inits or elem in (0, onnx.TensorProto.STRING):
            continue
        shape = static_shape(i.type)
        if shape is not None and all(d is not None for d in shape[1:]) and math.prod(shape[1:]) <= 1:  # type: ignore[arg-type]
            continue
        out.append(i.name)
    return out


@dataclass
class Extremes:
    """One input over the data: its smallest and largest finite value, its inf and NaN values,
    and every value seen."""

    lo: float = math.inf
    hi: float = -math.inf
    inf: int = 0
    nan: int = 0
    count: int = 0

    def add(self, a: np.ndarray) -> None:
        a = np.asarray(a)
        if a.size == 0 or a.dtype.kind not in "fiub":
            return
        self.count += a.size
        if a.dtype.kind == "f":
            finite = np.isfinite(a)
            if not finite.all():
                nan = int(np.count_nonzero(np.isnan(a)))
                self.nan += nan
                self.inf += a.size - int(np.count_nonzero(finite)) - nan
                a = a[finite]
                if a.size == 0:
                    return
        self.lo, self.hi = min(self.lo, float(np.min(a))), max(self.hi, float(np.max(a)))

    @property
    def constant(self) -> bool:
        """Every value seen is one finite value."""
        return self.count > 0 and not (self.inf or self.nan) and self.lo == self.hi


class InputExtremes:
    """A calibration tap (`names`, `update(values, rows)`, `finish()`, as mixq.fidelity.HeldBack)
    that keeps the `Extremes` of each data input over the pass."""

    def __init__(self, model: onnx.ModelProto) -> None:
        self.names = data_inputs(model)
        self.extremes: dict[str, Extremes] = {}
        self.rows = 0  # the samples the pass read (`feed_rows`), whatever it watched of them
        self.complete = False

    def update(self, values: Mapping[str, np.ndarray], rows: int = 0) -> None:
        self.rows += rows
        for n in self.names:
            if n in values:
                self.extremes.setdefault(n, Extremes()).add(values[n])

    def add(self, feed: Mapping[str, np.ndarray]) -> None:
        self.update(feed, feed_rows(feed))

    def finish(self) -> None:
        self.complete = True


def constant_data(model: onnx.ModelProto, extremes: Mapping[str, Extremes], *,
                  calibrated: bool = True) -> str | None:
    """Why the calibration data cannot stand for real inputs, when every input of `data_inputs`
    held a single finite value over all of it; None when one varied, or one was not seen.
    `calibrated=False`: no range was fit to the data (block formats), only checks measured on it."""
    names = data_inputs(model)
    if not names or any(n not in extremes for n in names):
        return None
    if not all(extremes[n].constant for n in names):
        return None
    held = "; ".join(f"input {n!r} holds only the value {extremes[n].lo:g}" for n in names[:3])
    if not calibrated:
        return (f"the calibration data is constant: {held}, in every sample. No range was fit to "
                "it (these formats take none from data), but the fidelity check measured on that "
                "one input, so it does not say how the model does on real inputs. Pass real "
                "samples (a few hundred typical inputs).")
    return (f"the calibration data is constant: {held}, in every sample. The ranges were fit to "
            "that one input, and the checks made on the same data measured on it too, so none of "
            "them says how the model does on real inputs. Calibrate with real samples (a few "
            "hundred typical inputs).")


def feed_extremes(feeds: Iterable[Mapping[str, np.ndarray]], model: onnx.ModelProto) -> dict[str, Extremes]:
    """The `Extremes` of each data input of `model` over `feeds` held in memory."""
    tap = InputExtremes(model)
    for f in feeds:
        tap.update(f)
    return tap.extremes
