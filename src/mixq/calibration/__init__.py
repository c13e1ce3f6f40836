"""mixq.calibration: streaming activation statistics, range observers, data readers and the
onnxruntime collector.

``stats``, ``observers`` and ``data`` are pure (numpy/onnx); ``collect`` imports onnxruntime and
is loaded lazily, on first access of :func:`collect_stats` / :class:`CollectResult`.
"""
from __future__ import annotations

from typing import Any

from .data import CalibData, FeedSource, InputSpec, as_feeds, input_specs_from_model, validate_feed
from .observers import CalibMethod, compute_range, compute_weight_range, pof2_exponent
from .stats import TensorStats

__all__ = [
    "TensorStats", "CalibMethod", "compute_range", "compute_weight_range", "pof2_exponent",
    "as_feeds", "CalibData", "FeedSource", "InputSpec", "input_specs_from_model", "validate_feed",
    "collect_stats", "CollectResult",
]

_LAZY = {"collect_stats", "CollectResult"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from . import collect

        return getattr(collect, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
