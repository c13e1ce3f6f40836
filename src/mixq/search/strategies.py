"""Search strategies over a nested path of plans.

The path P[0..N] starts at the all-wide plan and switches one (layer, format) move at a time in
ascending order of estimated sensitivity, so P[k+1] is P[k] with one more layer narrowed. Each
strategy picks the index k of the plan to return, counting the full-model evaluations it spends:

- greedy: the documented walk: evaluate P[1], P[2], ... and stop before the first that breaks
  the target (N evaluations at worst);
- bisection: binary search for the last P[k] meeting the target (about log2 N evaluations),
  assuming the metric worsens along the path;
- pareto: evaluate a spread of points along the path (log-spaced from both ends), refine by
  bisection between the last good and the first bad point, and return the front of accuracy vs
  size; with a size budget alone a single evaluation suffices.
Every strategy honours a deadline: when time runs out it returns the best plan found so far.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

STRATEGIES = ("bisection", "greedy", "pareto")


@dataclass
class Evaluation:
    """One full-model evaluation of path point `k`."""

    k: int
    metric: float
    ok: bool
    size_bytes: float
    seconds: float


class OutOfTime(Exception):
    """The time budget ran out before the next evaluation."""


class Evaluator:
    """Evaluates path points once each, counts them, and enforces the deadline."""

    def __init__(self, fn: Callable[[int], tuple[float, bool, float]], deadline: float | None) -> None:
        self.fn = fn
        self.deadline = deadline
        self.done: dict[int, Evaluation] = {}

    def __call__(self, k: int) -> Evaluation:
        if k in self.done:
            return self.done[k]
        if self.deadline is not None and time.monotonic() > self.deadline:
            raise OutOfTime
        t = time.perf_counter()
        metric, ok, size = self.fn(k)
        self.done[k] = Evaluation(k, metric, ok, size, time.perf_counter() - t)
        return self.done[k]

    @property
    def count(self) -> int:
        return len(self.done)

    def best_ok(self) -> int:
        """The furthest (smallest) evaluated point meeting the target, else 0 (all wide)."""
        ok = [k for k, e in self.done.items() if e.ok]
        return max(ok) if ok else 0


def greedy(n: int, ev: Evaluator) -> int:
    k = 0
    for k in range(1, n + 1):
        if not ev(k).ok:
            return k - 1
    return k


def bisection(n: int, ev: Evaluator) -> int:
    if n == 0 or ev(n).ok:
        return n
    lo, hi = 0, n  # P[lo] assumed good (all wide), P[hi] bad
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if ev(mid).ok:
            lo = mid
        else:
            hi = mid
    return lo


def spread(n: int) -> list[int]:
    """Log-spaced points from both ends of 0..n (both ends included)."""
    pts = {0, n}
    step = 1
    while step < n:
        pts.add(step)
        pts.add(n - step)
        step *= 2
    return sorted(p for p in pts if 0 <= p <= n)


def pareto(n: int, ev: Evaluator, *, size_ok: Callable[[int], bool] | None = None,
           accuracy_target: bool = True) -> int:
    """Evaluate a spread of points, refine at the target; returns the chosen k."""
    if size_ok is not None and not accuracy_target:
        # the size budget alone: the first point along the path that fits is the most accurate
        fits = [k for k in range(n + 1) if size_ok(k)]
        k = fits[0] if fits else n
        ev(k)
        return k
    for k in spread(n):
        ev(k)
    good = [k for k, e in ev.done.items() if e.ok and (size_ok is None or size_ok(k))]
    bad = [k for k, e in ev.done.items() if not e.ok]
    if good:
        lo = max(good)
        above = [k for k in bad if k > lo]
        hi = min(above) if above else None
        while hi is not None and hi - lo > 1:
            mid = (lo + hi) // 2
            if ev(mid).ok:
                lo = mid
            else:
                hi = mid
        return lo
    return 0


def front(evals: list[Evaluation], higher_is_better: bool) -> list[Evaluation]:
    """The non-dominated evaluations (smaller size, better metric), sorted by size."""
    pts = sorted(evals, key=lambda e: (e.size_bytes, -e.metric if higher_is_better else e.metric))
    out: list[Evaluation] = []
    for e in pts:
        if not out:
            out.append(e)
            continue
        last = out[-1]
        better = e.metric > last.metric if higher_is_better else e.metric < last.metric
        if better:
            out.append(e)
    # sorted by size ascending the metric must improve as size grows: keep only improving points
    return out
