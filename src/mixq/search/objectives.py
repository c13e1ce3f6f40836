"""What a search aims at: an accuracy target and/or a size budget.

Metrics (`METRICS`; `make_objective` builds one from its name and target):
  l2: relative L2 of one output to the float model; the target is the largest allowed value;
  sqnr: signal-to-quantization-noise ratio of that output in dB; the target is the smallest
    allowed value;
  cosine: mean cosine similarity of each output row with the float one (float: 1); the target
    is the largest allowed drop;
  agreement: the fraction of rows whose top-1 class matches the float model's (float: 1); the
    target is the largest allowed drop;
  top1: top-1 accuracy from labels of the held-out data; the target is the largest allowed drop
    from the float model's accuracy;
  function: a user EvaluateFunction(model_path) -> number (higher is better unless the function
    has `higher_is_better = False`); the target is the largest allowed drop from the float
    model's value, in the function's own units. A function may return one score per sample (a
    1-D sequence) instead: the metric is their mean, and the search can then allow for sampling
    noise (below).

Sampling noise. A search picks the smallest plan whose drop, measured on the search data,
meets the target; measured on other data from the same source, that plan's drop is as often
above the target as below (the plans the search stops at sit on the boundary). With a
`confidence` c > 0.5, a metric that is a mean over samples (agreement, cosine, top1; a function
that returns per-sample scores) meets its target only when the one-sided c upper confidence
bound of the drop does (`mixq.search.bounds`):
  * continuous per-sample scores (cosine, a function's per-line accuracy): mean paired drop +
    t_c(n-1) * sd / sqrt(n), over the n per-sample drops and Student's t;
  * top-1 read from the outputs (agreement, top1 with labels): the largest of Student's t over
    each sample's flip risk (the probability that its float top-1 class is overtaken under
    output noise of the size the plan shows on it: a near-tie counts as the probable flip it
    is, flipped this time or not), Student's t over the observed flips, and a Clopper-Pearson
    bound on the near-ties a small sample can miss (`bounds.top1_margin`);
  * a function's pass/fail scores (two values seen, e.g. a labelled top-1 the float model gets
    wrong on some samples): exact binomial bounds on the rates of samples that fail or pass
    only with the plan (no changed sample among 120 still leaves room for 1.9 % of them to
    change, at 90 %).
l2 and sqnr are ratios of sums over the whole data, with no per-sample decomposition: they take
no margin. The float model itself (a plan that quantizes nothing) drops nothing, on any data.
"""
from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx

from ..errors import ConfigError
from .bounds import (FlipExposure, binary_drop_margin, drop_margin, flip_exposure, t_quantile,
                     top1_margin, two_valued)
from .workbench import Workbench

__all__ = ["METRICS", "Measured", "Objective", "L2Objective", "SQNRObjective", "Top1Objective",
           "DropObjective", "AgreementObjective", "CosineObjective", "make_objective",
           "drop_margin", "t_quantile"]


@dataclass(frozen=True)
class Measured:
    """One model's metric and the margin its drop carries for sampling noise (see the module
    docstring; 0 without per-sample values or at confidence 0.5)."""

    value: float
    margin: float = 0.0


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
    #: the one-sided confidence of `meets` (see the module docstring; 0.5: the point estimate)
    confidence: float = 0.5

    def evaluate(self, wb: Workbench, model: onnx.ModelProto) -> float:
        """The metric of `model` on the workbench's held-out data."""
        return self.measure(wb, model).value

    def measure(self, wb: Workbench, model: onnx.ModelProto) -> Measured:
        """The metric of `model` on the held-out data and its drop's margin."""
        return self.measure_outputs(wb, wb.outputs(model))

    def score(self, wb: Workbench, outputs: list[np.ndarray]) -> float:
        """The metric of a model from its outputs on the held-out feeds (what a worker sends
        back: the same floats wherever the outputs were computed)."""
        return self.measure_outputs(wb, outputs).value

    def measure_outputs(self, wb: Workbench, outputs: list[np.ndarray]) -> Measured:
        """`score` with the drop's margin."""
        raise NotImplementedError

    @property
    def scores_outputs(self) -> bool:
        """Whether the metric is a function of the outputs alone (`score`): then the outputs
        can be computed on workers. A user function measures its own data."""
        return True

    def meets(self, value: float, margin: float = 0.0) -> bool:
        """Whether `value` meets the target once its drop is raised by `margin`."""
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

    def measure_outputs(self, wb: Workbench, outputs: list[np.ndarray]) -> Measured:
        return Measured(wb.relative_l2(outputs))

    def meets(self, value: float, margin: float = 0.0) -> bool:
        return self.target is None or value + margin <= self.target

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
    confidence: float = 0.5
    float_samples: np.ndarray | None = None

    def __post_init__(self) -> None:
        if self.labels is None and self.evaluate_function is None:
            raise ConfigError("a top-1 target needs labels for the held-out data or an "
                              "EvaluateFunction(model_path) -> accuracy.")
        if self.evaluate_function is not None and not callable(self.evaluate_function):
            raise ConfigError("EvaluateFunction must be callable: f(model_path) -> top-1 accuracy.")
        if self.max_drop is not None and not (np.isfinite(self.max_drop) and self.max_drop >= 0):
            raise ConfigError(f"Top1AccTarget={self.max_drop} must be a number >= 0.")
        if self.evaluate_function is not None:
            # a user metric: its own name and direction (e.g. a CER, lower is better)
            fn_name = str(getattr(self.evaluate_function, "__name__", ""))
            self.name = fn_name if fn_name.isidentifier() else "evaluate function"  # not <lambda>
            self.higher_is_better = bool(getattr(self.evaluate_function, "higher_is_better", True))

    def measure(self, wb: Workbench, model: onnx.ModelProto) -> Measured:
        if self.evaluate_function is None:
            return self.measure_outputs(wb, wb.outputs(model))
        with tempfile.TemporaryDirectory() as d:
            p = os.path.join(d, "candidate.onnx")
            onnx.save(model, p)
            v = self.evaluate_function(p)
        samples = self._samples(v)
        if self.float_samples is None:  # the float model itself (bind_float)
            return Measured(float(np.mean(samples)))
        if samples.size != self.float_samples.size:
            raise ConfigError(f"EvaluateFunction returned {samples.size} per-sample scores for this "
                              f"model and {self.float_samples.size} for the float model: it must "
                              "score the same samples, in the same order, every time.")
        return Measured(float(np.mean(samples)), self._margin(samples))

    def _margin(self, samples: np.ndarray) -> float:
        """The margin of a function's per-sample scores against the float model's: exact
        binomial bounds for pass/fail scores, Student's t for the others."""
        assert self.float_samples is not None
        values = two_valued(self.float_samples, samples)
        if values is not None:
            return binary_drop_margin(self.float_samples, samples, *values, self.confidence,
                                      higher_is_better=self.higher_is_better)
        sign = 1.0 if self.higher_is_better else -1.0
        return drop_margin(sign * (self.float_samples - samples), self.confidence)

    def _samples(self, v: Any) -> np.ndarray:
        """A user function's result as per-sample scores (one element: a plain number)."""
        try:
            a = np.asarray(v, dtype=np.float64)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"EvaluateFunction returned {v!r}; it must return a number (the "
                              "metric) or a 1-D sequence of per-sample scores.") from exc
        if a.ndim > 1 or a.size == 0:
            raise ConfigError(f"EvaluateFunction returned an array of shape {a.shape}; it must "
                              "return a number or a non-empty 1-D sequence of per-sample scores.")
        if not np.all(np.isfinite(a)):
            raise ConfigError("EvaluateFunction returned a NaN or infinite score; it must return "
                              "finite numbers.")
        return a.reshape(-1)

    def measure_outputs(self, wb: Workbench, outputs: list[np.ndarray]) -> Measured:
        assert self.labels is not None, "a user function has no outputs to score"
        correct = self._correct(outputs)
        if self.float_samples is None:
            return Measured(float(np.mean(correct)))
        ref = self.float_samples[:correct.size]
        # only the samples the float model gets right can be lost
        return Measured(float(np.mean(correct)),
                        top1_margin(ref - correct, _exposure(outputs, wb.float_outputs), ref == 1.0,
                                    self.confidence))

    def _correct(self, outputs: list[np.ndarray]) -> np.ndarray:
        """1.0 for each row whose top-1 class is its label, else 0.0."""
        assert self.labels is not None
        pred = np.concatenate([np.argmax(o.reshape(o.shape[0], -1), 1) for o in outputs])
        return (pred == self.labels[:len(pred)]).astype(np.float64)

    @property
    def scores_outputs(self) -> bool:
        return self.evaluate_function is None

    def bind_float(self, wb: Workbench) -> None:
        """Measure the float model once: the reference of the allowed drop (and, per sample, of
        the paired drops the margin reads)."""
        if self.evaluate_function is None:
            self.float_samples = self._correct(wb.float_outputs)
            self.float_value = float(np.mean(self.float_samples))
            return
        with tempfile.TemporaryDirectory() as d:
            p = os.path.join(d, "float.onnx")
            onnx.save(wb.model, p)
            samples = self._samples(self.evaluate_function(p))
        self.float_value = float(np.mean(samples))
        self.float_samples = samples

    def drop(self, value: float) -> float:
        """How much worse than the float model `value` is (in the metric's units)."""
        assert self.float_value is not None, "bind_float first"
        return self.float_value - value if self.higher_is_better else value - self.float_value

    def meets(self, value: float, margin: float = 0.0) -> bool:
        if self.max_drop is None:
            return True
        return self.drop(value) + margin <= self.max_drop + 1e-12

    def describe(self) -> str:
        ref = f" (float {self.float_value:.6g})" if self.float_value is not None else ""
        return (f"{self.name} drop <= {self.max_drop}{ref}{_at(self.confidence)}"
                if self.max_drop is not None else f"{self.name} (no target)")


def _at(confidence: float) -> str:
    """How a target's confidence reads in its description ('' for the point estimate)."""
    return f" at {confidence:.0%} confidence" if confidence > 0.5 else ""


def _rows(a: np.ndarray) -> np.ndarray:
    """An output as rows (one per sample along the first axis) of float64 values."""
    a = np.asarray(a, dtype=np.float64)
    return a.reshape(1, -1) if a.ndim == 0 else a.reshape(a.shape[0], -1)


@dataclass
class DropObjective(Objective):
    """A metric comparing output `output_index` with the float model's, equal to `float_value`
    for the float model itself, higher is better; the target is the largest allowed drop."""

    max_drop: float | None = None
    float_value: float = 1.0
    higher_is_better: bool = True

    def __post_init__(self) -> None:
        if self.max_drop is not None and not (np.isfinite(self.max_drop) and self.max_drop >= 0):
            raise ConfigError(f"the {self.name} target {self.max_drop} must be an allowed drop >= 0, "
                              "e.g. 0.01.")

    confidence: float = 0.5

    def measure_outputs(self, wb: Workbench, outputs: list[np.ndarray]) -> Measured:
        per_row = self.per_row(wb, outputs)
        return Measured(float(np.mean(per_row)) if per_row.size else self.float_value,
                        drop_margin(self.float_value - per_row, self.confidence))

    def per_row(self, wb: Workbench, outputs: list[np.ndarray]) -> np.ndarray:
        """The metric of each output row (its mean is the metric)."""
        raise NotImplementedError

    def meets(self, value: float, margin: float = 0.0) -> bool:
        return self.max_drop is None or self.float_value - value + margin <= self.max_drop + 1e-12

    def describe(self) -> str:
        return (f"{self.name} drop <= {self.max_drop} (float {self.float_value:.6g})"
                f"{_at(self.confidence)}" if self.max_drop is not None else f"{self.name} (no target)")


@dataclass
class AgreementObjective(DropObjective):
    """Top-1 agreement: the fraction of output rows whose argmax matches the float model's."""

    name: str = "top-1 agreement"

    def per_row(self, wb: Workbench, outputs: list[np.ndarray]) -> np.ndarray:
        return wb.top1_agree_rows(outputs)

    def measure_outputs(self, wb: Workbench, outputs: list[np.ndarray]) -> Measured:
        agree = self.per_row(wb, outputs)
        if not agree.size:
            return Measured(self.float_value)
        return Measured(float(np.mean(agree)),
                        top1_margin(1.0 - agree, _exposure(outputs, wb.float_outputs),
                                    np.ones(agree.size, dtype=bool), self.confidence))


def _exposure(outputs: list[np.ndarray], reference: list[np.ndarray]) -> FlipExposure:
    """`bounds.flip_exposure` of every row of the outputs, batch after batch (a batch whose
    shape changed: every row flipped)."""
    def one(q: np.ndarray, f: np.ndarray) -> FlipExposure:
        if q.shape == f.shape:
            return flip_exposure(q, f)
        n = len(_rows(f))
        return FlipExposure(np.ones(n), np.ones(n, dtype=bool))

    return FlipExposure.concat([one(q, f) for q, f in zip(outputs, reference)])


@dataclass
class CosineObjective(DropObjective):
    """The mean over output rows of the cosine similarity with the float output row (two zero
    rows agree: 1)."""

    name: str = "cosine"

    def per_row(self, wb: Workbench, outputs: list[np.ndarray]) -> np.ndarray:
        sims = []
        for q, f in zip(outputs, wb.float_outputs):
            q2, f2 = _rows(q), _rows(f)
            if q2.shape != f2.shape:  # a changed shape (a detector's box count): no similarity
                sims.append(np.zeros(len(f2)))
                continue
            nq, nf = np.linalg.norm(q2, axis=1), np.linalg.norm(f2, axis=1)
            dot = np.sum(q2 * f2, axis=1)
            both_zero = (nq == 0) & (nf == 0)
            with np.errstate(invalid="ignore", divide="ignore"):
                cos = np.where(both_zero, 1.0, dot / np.maximum(nq * nf, np.finfo(np.float64).tiny))
            sims.append(cos)
        return np.concatenate(sims) if sims else np.ones(0)


@dataclass
class SQNRObjective(Objective):
    """Signal-to-quantization-noise ratio of output `output_index` in dB over the held-out data:
    -20 log10(relative L2) (inf for the float model); the target is the smallest allowed value."""

    min_db: float | None = None
    name: str = "SQNR dB"
    higher_is_better: bool = True

    def __post_init__(self) -> None:
        if self.min_db is not None and not np.isfinite(self.min_db):
            raise ConfigError(f"the SQNR target {self.min_db} must be a finite number of dB, e.g. 30.")

    def measure_outputs(self, wb: Workbench, outputs: list[np.ndarray]) -> Measured:
        rel = wb.relative_l2(outputs)
        return Measured(float("inf") if rel == 0 else float(-20.0 * np.log10(rel)))

    def meets(self, value: float, margin: float = 0.0) -> bool:
        return self.min_db is None or value - margin >= self.min_db

    def describe(self) -> str:
        return f"SQNR >= {self.min_db} dB" if self.min_db is not None else "SQNR dB (no target)"


#: the metrics a search can aim at (see the module docstring)
METRICS = ("l2", "sqnr", "cosine", "agreement", "top1", "function")


def make_objective(metric: str, target: float | None, *, labels: np.ndarray | None = None,
                   evaluate_function: Callable[[str], Any] | None = None,
                   confidence: float = 0.5) -> Objective:
    """The objective of `metric` (one of METRICS) with its `target` (None: report it only) and
    the `confidence` its drop is bounded with (see the module docstring). A Top1Objective
    still needs `bind_float` before its first `meets`."""
    obj = _make_objective(metric, target, labels=labels, evaluate_function=evaluate_function)
    obj.confidence = confidence
    return obj


def _make_objective(metric: str, target: float | None, *, labels: np.ndarray | None,
                    evaluate_function: Callable[[str], Any] | None) -> Objective:
    if metric not in METRICS:
        from ..errors import did_you_mean

        raise ConfigError(f"metric={metric!r}: choose one of {', '.join(METRICS)} (or "
                          "module:function on the command line)." + did_you_mean(metric, METRICS))
    if evaluate_function is not None and metric not in ("top1", "function"):
        raise ConfigError(f"an EvaluateFunction was given with metric={metric!r}, which does not "
                          "call it: use metric='function' (or drop the function).")
    if metric == "function" and evaluate_function is None:
        raise ConfigError("metric='function' needs an EvaluateFunction(model_path) -> number "
                          "(--metric module:function on the command line).")
    if metric == "l2":
        return L2Objective(target)
    if metric == "sqnr":
        return SQNRObjective(target)
    if metric == "cosine":
        return CosineObjective(target)
    if metric == "agreement":
        return AgreementObjective(target)
    if metric == "top1" and labels is None and evaluate_function is None:
        raise ConfigError("metric top1 needs labels of the held-out data (--labels LABELS.npy); "
                          "or use --metric agreement (top-1 agreement with the float model, "
                          "no labels needed).")
    return Top1Objective(target, labels=labels, evaluate_function=evaluate_function)
