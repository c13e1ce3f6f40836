"""What a search aims at: an accuracy target (relative L2 of one output, top-1 from labels or a
user EvaluateFunction) and/or a size budget."""
from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx

from ..errors import ConfigError
from .workbench import Workbench


@dataclass(frozen=True)
class Metric:
    """How good one quantized model is; `value` in the metric's own units."""

    name: str
    value: float
    higher_is_better: bool


class Objective:
    """Evaluates a model and says whether it meets the accuracy target."""

    name: str = "objective"
    higher_is_better: bool = False

    def evaluate(self, wb: Workbench, model: onnx.ModelProto) -> float:
        raise NotImplementedError

    def meets(self, value: float) -> bool:
        raise NotImplementedError

    def describe(self) -> str:
        raise NotImplementedError

    def better(self, a: float, b: float) -> bool:
        """Whether metric value `a` is better than `b`."""
        return a > b if self.higher_is_better else a < b


@dataclass
class L2Objective(Objective):
    """Relative L2 distance of output `output_index` to the float model (0 = identical):
    sqrt(sum (q - f)^2 / sum f^2) over the held-out data; the target is an upper bound."""

    target: float | None = None
    name: str = "relative L2"
    higher_is_better: bool = False

    def __post_init__(self) -> None:
        if self.target is not None and not (np.isfinite(self.target) and self.target > 0):
            raise ConfigError(f"L2Target={self.target} must be a positive number, e.g. 0.1.")

    def evaluate(self, wb: Workbench, model: onnx.ModelProto) -> float:
        return wb.relative_l2(wb.outputs(model))

    def meets(self, value: float) -> bool:
        return self.target is None or value <= self.target

    def describe(self) -> str:
        return f"relative L2 <= {self.target}" if self.target is not None else "relative L2 (no target)"


@dataclass
class Top1Objective(Objective):
    """Top-1 accuracy, from labels of the held-out data or from a user EvaluateFunction called with
    the path of a temporary .onnx file; the target is the largest allowed drop from the float
    model's accuracy, in the function's own units."""

    max_drop: float | None = None
    labels: np.ndarray | None = None
    evaluate_function: Callable[[str], Any] | None = None
    float_value: float | None = None
    name: str = "top-1"
    higher_is_better: bool = True

    def __post_init__(self) -> None:
        if self.labels is None and self.evaluate_function is None:
            raise ConfigError("a top-1 target needs labels for the held-out data or an "
                              "EvaluateFunction(model_path) -> accuracy.")
        if self.evaluate_function is not None and not callable(self.evaluate_function):
            raise ConfigError("EvaluateFunction must be callable: f(model_path) -> top-1 accuracy.")
        if self.max_drop is not None and not (np.isfinite(self.max_drop) and self.max_drop >= 0):
            raise ConfigError(f"Top1AccTarget={self.max_drop} must be a number >= 0.")

    def evaluate(self, wb: Workbench, model: onnx.ModelProto) -> float:
        if self.evaluate_function is not None:
            with tempfile.TemporaryDirectory() as d:
                p = os.path.join(d, "candidate.onnx")
                onnx.save(model, p)
                v = self.evaluate_function(p)
            try:
                return float(v)
            except (TypeError, ValueError) as exc:
                raise ConfigError(f"EvaluateFunction returned {v!r}; it must return a number "
                                  "(the top-1 accuracy).") from exc
        outs = wb.outputs(model)
        pred = np.concatenate([np.argmax(o.reshape(o.shape[0], -1), 1) for o in outs])
        return float(np.mean(pred == self.labels[:len(pred)]))

    def bind_float(self, wb: Workbench) -> None:
        """Measure the float model once: the reference of the allowed drop."""
        self.float_value = self.evaluate(wb, wb.model)

    def meets(self, value: float) -> bool:
        if self.max_drop is None:
            return True
        return (self.float_value - value) <= self.max_drop + 1e-12

    def describe(self) -> str:
        ref = f" (float {self.float_value:.4f})" if self.float_value is not None else ""
        return f"top-1 drop <= {self.max_drop}{ref}" if self.max_drop is not None else "top-1 (no target)"
