"""Typed, frozen configs of fast finetuning: AdaRound and AdaQuant.

Everything is validated on creation; a bad value raises ConfigError naming the option and the
fix. Pure Python (no torch): configs can be built, compared and printed without PyTorch.
"""
from __future__ import annotations

import math
import numbers
from collections.abc import Iterable
from dataclasses import dataclass, field, fields, replace
from typing import Any

from ..errors import ConfigError, did_you_mean

#: Op types fast finetuning can re-implement in PyTorch (the weight is input 1, an initializer).
FINETUNE_OP_TYPES: frozenset[str] = frozenset({"Conv", "ConvTranspose", "Gemm", "MatMul"})


def _int(option: str, value: Any, *, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ConfigError(f"{option}={value!r} must be an integer >= {minimum}.")
    if int(value) < minimum:
        raise ConfigError(f"{option}={value!r} must be >= {minimum}.")
    return int(value)


def _float(option: str, value: Any, *, lo: float, hi: float = math.inf, lo_open: bool = False,
           hi_open: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ConfigError(f"{option}={value!r} must be a number.")
    v = float(value)
    bad = (not math.isfinite(v) or (v <= lo if lo_open else v < lo) or (v >= hi if hi_open else v > hi))
    if bad:
        lb, hb = "(" if lo_open else "[", ")" if hi_open else "]"
        raise ConfigError(f"{option}={value!r} must be a finite number in {lb}{lo:g}, {hi:g}{hb}.")
    return v


def _names(option: str, value: Any) -> frozenset[str] | None:
    if value is None:
        return None
    if isinstance(value, str) or not isinstance(value, Iterable):
        raise ConfigError(f"{option} must be a collection of node names (e.g. ['conv1']), "
                          f"not {value!r}.")
    out = frozenset(value)
    bad = [v for v in out if not isinstance(v, str)]
    if bad:
        raise ConfigError(f"{option} must hold node names (strings); got {bad[0]!r}.")
    return out


#: a layer with at least this many cached rows holds a quarter of them (at most
#: HELD_OUT_MAX_ROWS) out of the fit, to judge the finetuned weights on; below it there are
#: too few to spare and the layer is judged on the rows it was fit on (the report says so)
HELD_OUT_MIN_ROWS = 8
HELD_OUT_MAX_ROWS = 64


def held_out_rows(n: int) -> int:
    """How many of a layer's `n` cached rows are held out of its fit (0: too few to spare)."""
    return min(n // 4, HELD_OUT_MAX_ROWS) if n >= HELD_OUT_MIN_ROWS else 0


@dataclass(frozen=True)
class EarlyStop:
    """Stop a layer's optimization when its reconstruction loss stops improving.

    Every `interval` iterations the loss of the deployable weights (AdaRound: hard rounding,
    AdaQuant: the fake-quantized weights) is measured on the cached rows held out of the fit (all
    of them where the layer has fewer than HELD_OUT_MIN_ROWS); the best weights so far are kept,
    and the layer stops after `patience` checks without a relative improvement larger than
    `min_delta`.
    """

    patience: int = 3
    min_delta: float = 0.0
    interval: int = 50

    def __post_init__(self) -> None:
        object.__setattr__(self, "patience", _int("early_stop.patience", self.patience, minimum=1))
        object.__setattr__(self, "min_delta", _float("early_stop.min_delta", self.min_delta, lo=0.0, hi=1.0,
                                                     hi_open=True))
        object.__setattr__(self, "interval", _int("early_stop.interval", self.interval, minimum=1))


@dataclass(frozen=True)
class _FinetuneConfig:
    """Options shared by AdaRound and AdaQuant (see the subclasses for the defaults).

    num_iterations: optimizer steps per layer; 0 leaves every weight unchanged (the result is
        exactly the plain quantized model).
    learning_rate: Adam learning rate.
    batch_size: cached samples per optimizer step.
    early_stop: None / False (run every iteration), True (EarlyStop()) or an EarlyStop.
    include_layers: node names to finetune (None: every eligible layer); exclude_layers: node
        names to leave alone. Unknown names raise ConfigError.
    op_types: op types to finetune (subset of Conv, ConvTranspose, Gemm, MatMul).
    output_index: which model output the report's fidelity metric (SQNR, top-1 agreement vs the
        float model) is measured on.
    seed: seeds sample selection and the optimizer (torch.manual_seed); with the same seed and
        num_threads the result is the same bytes.
    max_cache_mb / max_samples: bound the cached layer inputs + float targets of one layer
        (samples beyond the budget are subsampled with a seeded reservoir).
    num_threads: torch CPU threads (default 1: layers are small and extra threads mostly wait on
        each other; None: torch's current setting).
    report_metric: measure the model-level metric before and after (two extra data passes), and
        keep the plain weights where the output lost with the finetuned ones.
    verbose: per-layer progress on stderr (also printed when stderr is a terminal).
    """

    num_iterations: int = 1000
    learning_rate: float = 1e-3
    batch_size: int = 8
    early_stop: EarlyStop | bool | None = None
    include_layers: frozenset[str] | None = None
    exclude_layers: frozenset[str] = frozenset()
    op_types: frozenset[str] = FINETUNE_OP_TYPES
    output_index: int = 0
    seed: int = 0
    max_cache_mb: float = 256.0
    max_samples: int | None = None
    num_threads: int | None = 1
    report_metric: bool = True
    verbose: bool = False

    algorithm = "finetune"

    def __post_init__(self) -> None:
        s = object.__setattr__
        s(self, "num_iterations", _int("num_iterations", self.num_iterations, minimum=0))
        s(self, "learning_rate", _float("learning_rate", self.learning_rate, lo=0.0, lo_open=True))
        s(self, "batch_size", _int("batch_size", self.batch_size, minimum=1))
        es = self.early_stop
        if es is True:
            es = EarlyStop()
        elif es is False:
            es = None
        if es is not None and not isinstance(es, EarlyStop):
            raise ConfigError(f"early_stop={es!r} must be None, a bool or an EarlyStop(patience=, "
                              "min_delta=, interval=).")
        s(self, "early_stop", es)
        s(self, "include_layers", _names("include_layers", self.include_layers))
        s(self, "exclude_layers", _names("exclude_layers", self.exclude_layers) or frozenset())
        ops = _names("op_types", self.op_types)
        if not ops:
            raise ConfigError(f"op_types must name at least one of {sorted(FINETUNE_OP_TYPES)}.")
        for op in ops:
            if op not in FINETUNE_OP_TYPES:
                raise ConfigError(f"op_types: {op!r} cannot be finetuned; choose from "
                                  f"{', '.join(sorted(FINETUNE_OP_TYPES))}." + did_you_mean(op, FINETUNE_OP_TYPES))
        s(self, "op_types", ops)
        s(self, "output_index", _int("output_index", self.output_index, minimum=0))
        s(self, "seed", _int("seed", self.seed, minimum=0))
        s(self, "max_cache_mb", _float("max_cache_mb", self.max_cache_mb, lo=0.0, lo_open=True))
        if self.max_samples is not None:
            s(self, "max_samples", _int("max_samples", self.max_samples, minimum=1))
        if self.num_threads is not None:
            s(self, "num_threads", _int("num_threads", self.num_threads, minimum=1))
        for opt in ("report_metric", "verbose"):
            if not isinstance(getattr(self, opt), bool):
                raise ConfigError(f"{opt}={getattr(self, opt)!r} must be True or False.")

    def with_options(self, **changes: Any) -> "_FinetuneConfig":
        """A copy with some options changed; unknown option names raise ConfigError."""
        known = [f.name for f in fields(self)]
        for k in changes:
            if k not in known:
                raise ConfigError(f"unknown {type(self).__name__} option {k!r}." + did_you_mean(k, known)
                                  + f" Options: {', '.join(known)}.")
        return replace(self, **changes)


@dataclass(frozen=True)
class AdaRoundConfig(_FinetuneConfig):
    """AdaRound (Nagel et al. 2020): learn, per weight, whether to round up or down.

    Integer weight formats only. The rounding is a rectified sigmoid h(V) of a learned V; the
    loss is the layer's reconstruction error plus
    ``reg_param * sum(1 - |2 h(V) - 1| ** beta)``, with beta annealed linearly from
    ``beta_range[0]`` to ``beta_range[1]`` after the first ``warm_start`` fraction of the
    iterations (no regularization before). The result is hard-rounded: every weight lands
    exactly on its integer grid, with the scales of the plan's qparams.
    """

    learning_rate: float = 1e-2
    reg_param: float = 0.01
    beta_range: tuple[float, float] = (20.0, 2.0)
    warm_start: float = 0.2

    algorithm = "adaround"

    def __post_init__(self) -> None:
        super().__post_init__()
        s = object.__setattr__
        s(self, "reg_param", _float("reg_param", self.reg_param, lo=0.0))
        br = self.beta_range
        if isinstance(br, (str, bytes)) or not isinstance(br, Iterable) or len(tuple(br)) != 2:
            raise ConfigError(f"beta_range={br!r} must be a pair (start, end), e.g. (20, 2).")
        b0, b1 = (_float(f"beta_range[{i}]", b, lo=0.0, lo_open=True) for i, b in enumerate(br))
        if b0 < b1:
            raise ConfigError(f"beta_range={br!r}: beta is annealed from the first value down to the "
                              "second; give start >= end, e.g. (20, 2).")
        s(self, "beta_range", (b0, b1))
        s(self, "warm_start", _float("warm_start", self.warm_start, lo=0.0, hi=1.0, hi_open=True))


@dataclass(frozen=True)
class AdaQuantConfig(_FinetuneConfig):
    """AdaQuant (Hubara et al. 2021): optimize the continuous weight (and bias) under the weight
    format's fake quantization (straight-through estimator) so that the layer's output matches
    the float layer's output (MSE). Works for every weight format (the only choice for
    BF16/FP16, which have no rounding to learn)."""

    learning_rate: float = 1e-5
    update_bias: bool = True

    algorithm = "adaquant"

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.update_bias, bool):
            raise ConfigError(f"update_bias={self.update_bias!r} must be True or False.")


FinetuneConfig = AdaRoundConfig | AdaQuantConfig

__all__ = ["AdaQuantConfig", "AdaRoundConfig", "EarlyStop", "FINETUNE_OP_TYPES", "FinetuneConfig"]
