"""`StatsMemo`: values computed from calibration statistics, remembered across the plans of one
search (activation ranges, the numerics policies' per-tensor verdicts)."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar, cast

from ..calibration.stats import TensorStats

T = TypeVar("T")


class StatsMemo:
    """Values computed from statistics objects, remembered by the objects' identity (which the
    memo keeps alive, so no identity is reused) and what was computed. A search plans many
    points over one set of statistics; statistics are never changed in place once collected
    (a group merges copies), so an object stands for its values."""

    def __init__(self) -> None:
        self._values: dict[tuple[Any, ...], tuple[tuple[TensorStats, ...], Any]] = {}

    def get(self, read: TensorStats | tuple[TensorStats, ...], what: tuple[Any, ...],
            compute: Callable[[], T]) -> T:
        """`compute()`, or its value from an earlier call that read the same statistics
        objects (one, or the members of a group) for the same `what`."""
        objs = read if isinstance(read, tuple) else (read,)
        key = (tuple(id(s) for s in objs), *what)
        hit = self._values.get(key)
        if hit is None:
            hit = self._values[key] = (objs, compute())
        return cast(T, hit[1])
