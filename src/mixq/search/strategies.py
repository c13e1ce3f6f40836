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
  size; with a size budget alone a single evaluation suffices;
- guided: predict where the target breaks from the cheap sensitivities and verify
  with a few evaluations (see `guided`).
Every strategy honours a deadline: when time runs out it returns the best plan found so far.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

STRATEGIES = ("guided", "bisection", "greedy", "pareto")
LINKS = ("power", "flip", "linear")


@dataclass
class Evaluation:
    """One full-model evaluation of path point `k`."""

    k: int
    metric: float
    ok: bool
    size_bytes: float
    seconds: float
    label: str = ""  # what the point is when it is not on the searched path (e.g. "all wide")


class OutOfTime(Exception):
    """The time budget ran out before the next evaluation."""


class Evaluator:
    """Evaluates path points once each, counts them, and enforces the deadline.

    `batch` (optional): evaluates several points at once (on parallel workers), the same values
    as `fn` one by one; `width` is how many it runs at once. Strategies call `prefetch` with the
    points they will likely ask for next (see `bisection`): the points are then known when asked
    for, and the strategy's decisions, which read only the values, are those of a serial run."""

    def __init__(self, fn: Callable[[int], tuple[float, bool, float]], deadline: float | None,
                 batch: Callable[[list[int]], list[tuple[float, bool, float]]] | None = None,
                 width: int = 1) -> None:
        self.fn = fn
        self.deadline = deadline
        self.batch = batch
        self.width = width if batch is not None else 1
        self.done: dict[int, Evaluation] = {}
        self.seeded: set[int] = set()

    def prefetch(self, ks: Sequence[int]) -> None:
        """Evaluate the points of `ks` not yet known, at once (nothing without a `batch`, or for
        fewer than two points: those are evaluated when asked for)."""
        todo = list(dict.fromkeys(k for k in ks if k not in self.done))
        if self.batch is None or len(todo) < 2:
            return
        if self.deadline is not None and time.monotonic() > self.deadline:
            raise OutOfTime
        t = time.perf_counter()
        values = self.batch(todo)
        dt = (time.perf_counter() - t) / len(todo)
        for k, (metric, ok, size) in zip(todo, values):
            self.done[k] = Evaluation(k, metric, ok, size, dt)

    def seed(self, k: int, e: Evaluation) -> None:
        """Point k is a plan already evaluated elsewhere: known, and not counted again."""
        self.done[k] = Evaluation(k, e.metric, e.ok, e.size_bytes, 0.0, e.label)
        self.seeded.add(k)

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
        """Full-model evaluations spent (seeded points not included)."""
        return len(self.done) - len(self.seeded)

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


def bisection(n: int, ev: Evaluator | PointView,
              guess: Callable[[int, int], int | None] | None = None) -> int:
    """The last point meeting the target, by bisection. With parallel workers (`ev.width` > 1)
    each round evaluates, at once, the next midpoints the bisection would probe if the points
    went as `guess(lo, hi)` predicts (the last point of the bracket predicted to meet the
    target; None: each midpoint predicted to meet it): a right guess saves rounds, a wrong one
    evaluations, and the decisions (so the result) are those of the serial bisection."""
    if n == 0:
        return n
    if ev.width > 1:
        first = [] if n in ev.done else [n]
        ev.prefetch([*first, *speculate(0, n, ev.width - len(first), ev,
                                         None if guess is None else guess(0, n))])
    if ev(n).ok:
        return n
    lo, hi = 0, n  # P[lo] assumed good (all wide), P[hi] bad
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if ev.width > 1 and mid not in ev.done:
            ev.prefetch(speculate(lo, hi, ev.width, ev, None if guess is None else guess(lo, hi)))
        if ev(mid).ok:
            lo = mid
        else:
            hi = mid
    return lo


class PointView:
    """An Evaluator seen through a subsequence of its points (index i is point ``points[i]``),
    for a strategy that may only return some points (`bisection` over the first point of each
    model size, see `mixq.search.auto`)."""

    def __init__(self, ev: Evaluator, points: Sequence[int]) -> None:
        self.ev, self.points = ev, list(points)
        self.width = ev.width

    @property
    def done(self) -> dict[int, Evaluation]:
        return {i: self.ev.done[p] for i, p in enumerate(self.points) if p in self.ev.done}

    def prefetch(self, idx: Sequence[int]) -> None:
        self.ev.prefetch([self.points[i] for i in idx])

    def __call__(self, i: int) -> Evaluation:
        return self.ev(self.points[i])

    def index_at_most(self, k: int | None) -> int | None:
        """The index of the last point <= path point `k` (None stays None)."""
        if k is None:
            return None
        return max(0, int(np.searchsorted(self.points, k, side="right")) - 1)


def speculate(lo: int, hi: int, width: int, ev: Evaluator | PointView, last_ok: int | None
              ) -> list[int]:
    """Up to `width` midpoints the bisection of bracket (lo, hi) would probe next, known
    outcomes followed and unknown ones predicted (ok up to `last_ok`; None: every one ok)."""
    pts: list[int] = []
    while hi - lo > 1 and len(pts) < width:
        mid = (lo + hi) // 2
        if mid in ev.done:
            ok = ev.done[mid].ok
        else:
            pts.append(mid)
            ok = last_ok is None or mid <= last_ok
        lo, hi = (mid, hi) if ok else (lo, mid)
    return pts


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


# bisect when this many probes in a row did not halve the bracket
_GUARD_PROBES = 3
# the flip link saturates at d = saturation (noise far above every margin); cap d just below it
_FLIP_CAP = 1.0 - 1e-6


@dataclass(frozen=True)
class MetricModel:
    """How a metric degrades as the output noise grows: what `guided` predicts the break with.

    degradation: metric value -> d >= 0, how much worse than the float model it is (0: as good).
    limit: the largest d that meets the target.
    link: how d relates to the output noise power P (the noise powers of the layers add):
      'power': d^2 ~ P (a relative L2 error: noise power over signal power);
      'flip': d = 2 saturation Phi(-m / sigma), sigma^2 ~ P (a top-1 drop: the fraction of
      samples whose margin m, one typical margin, Gaussian output noise pushes below zero; it
      grows to `saturation`, chance level, when the noise swamps every margin);
      'linear': d ~ P (no better knowledge).
    resolution: the step of d when it counts samples (1/N for a top-1 drop on N samples).
    saturation: the largest d of the 'flip' link, float accuracy - 1/classes (for a perfect
      two-class float model d = Phi(-m / sigma): exactly the one-sided flip probability).
    """

    degradation: Callable[[float], float]
    limit: float
    link: str = "power"
    resolution: float | None = None
    saturation: float = 1.0

    def __post_init__(self) -> None:
        if self.link not in LINKS:
            raise ValueError(f"link={self.link!r}: choose one of {', '.join(LINKS)}")
        if not self.saturation > 0:
            raise ValueError(f"saturation={self.saturation} must be positive")

    def power(self, d: float) -> float:
        """The noise power, in units of the link's constant, that degradation `d` stands for."""
        d = max(float(d), 0.0)
        if self.link == "power":
            return d * d
        if self.link == "linear":
            return d
        if d == 0.0:
            return 0.0
        z = NormalDist().inv_cdf(0.5 * min(d / self.saturation, _FLIP_CAP))
        return 1.0 / (z * z)

    def target_power(self) -> float:
        """The noise power at which the target breaks."""
        limit = self.limit
        if self.link == "flip" and self.resolution:
            # with A flips allowed the target breaks with even odds once the expected number of
            # flips reaches A + ln 2 (flips are rare, independent events: a Poisson count)
            allowed = math.floor(limit / self.resolution + 1e-9)
            limit = (allowed + math.log(2)) * self.resolution
        return self.power(limit)


def noise_coordinates(noise: Sequence[float]) -> np.ndarray:
    """x_k: the predicted output noise power that path point k adds to the all-wide point.

    `noise[k]` is the cumulative estimated error power of P[k] (sum over layers of err^2 of the
    layer's current precision). A move whose estimate says it removes noise (a narrower format
    measured as more accurate) is estimation noise: it is counted as adding none."""
    s = np.asarray(noise, dtype=np.float64)
    steps = np.maximum(np.diff(s), 0.0) if s.size > 1 else np.zeros(0)
    x = np.concatenate([[0.0], np.cumsum(steps)])
    if not np.all(np.isfinite(x)) or x[-1] <= 0.0:
        # no usable estimate: the path index is the coordinate (the search becomes bisection)
        x = np.arange(s.size, dtype=np.float64)
    return x


def noise_crossing(x: np.ndarray, model: MetricModel, ev: Evaluator, lo: int, hi: int) -> float | None:
    """Where `model`'s noise power crosses the target between bracket ends lo and hi (hi
    evaluated; lo too, or assumed to degrade nothing), in noise coordinates `x`; None when the
    bad end degrades less than the good one (the model cannot tell)."""
    def power(k: int) -> float:
        return model.power(model.degradation(ev.done[k].metric))

    p_hi = power(hi)
    x0, p0 = 0.0, 0.0
    if lo in ev.done and power(lo) > 0.0:
        x0, p0 = float(x[lo]), power(lo)
    if not p_hi > p0 or not x[hi] > x0:
        return None
    return x0 + (model.target_power() - p0) / (p_hi - p0) * (x[hi] - x0)


def predicted_break(x: np.ndarray, model: MetricModel | None, ev: Evaluator, lo: int,
                    hi: int) -> int | None:
    """The last point of bracket (lo, hi) that `model` predicts to meet the target (None: no
    prediction: no model, or hi not evaluated yet)."""
    if model is None or hi not in ev.done:
        return None
    xs = noise_crossing(x, model, ev, lo, hi)
    return None if xs is None else _last_at_most(x, xs)


def _last_at_most(x: np.ndarray, value: float) -> int:
    """The largest index k with x[k] <= value (-1 when none)."""
    return int(np.searchsorted(x, value, side="right")) - 1


def guided(n: int, ev: Evaluator, noise: Sequence[float], sizes: Sequence[float],
           model: MetricModel | None = None, *, size_tol: float = 0.02) -> int:
    """Predict where along the path the target breaks from the cheap estimates; verify with few
    full-model evaluations. Returns the furthest evaluated point that met the target (or 0).

    noise[k]: the cheap estimate of P[k]'s error power (see `noise_coordinates`); sizes[k]: its
    weight bytes (known without evaluating); model: how the metric grows with the noise (None:
    bisection in noise space). Steps:

    1. evaluate the all-narrow end P[n]: done if it meets the target;
    2. keep a bracket [lo: meets, hi: breaks] (lo = 0, the all-wide point, is assumed to meet
       until evaluated) and probe the last point the model predicts to meet: the model's noise
       power, interpolated linearly in noise space between the measured bracket ends, crosses the
       target power there (a one-parameter fit through the origin from hi alone when lo shows no
       degradation: zero flips say nothing about the scale);
    3. safeguards: a prediction outside the bracket right after one inside it that measured
       some degradation probes the point next to the end it passed (that prediction was right,
       or off by little: its neighbour likely closes the bracket); any other prediction outside
       the bracket bisects in noise space (on a coarse metric, such as a top-1 drop counted on
       few samples, a point that measured no degradation says nothing about the model's scale,
       and creeping one point at a time would cost more than bisection); when three probes in a
       row did not halve the bracket, bisect in noise space (a poor model costs at most about
       twice bisection's evaluations); a probe within `size_tol` of a bracket end (in size)
       moves to the furthest point still within it, so that it either closes the bracket or
       moves that end by the whole tolerance;
    4. stop when the weight size still at stake, size[lo] - size[hi], is at most `size_tol` of
       the all-wide to all-narrow size range (where sizes do not change along the path, each move
       counts the same), or lo and hi are adjacent.

    Only evaluated points are returned: when nothing but the all-wide point is left it is
    evaluated too (a target it misses is unreachable on this path). Deadlines: see `Evaluator`.
    """
    if n <= 0:
        return 0
    if len(noise) != n + 1 or len(sizes) != n + 1:
        raise ValueError(f"noise and sizes need n + 1 = {n + 1} entries, "
                         f"got {len(noise)} and {len(sizes)}")
    x = noise_coordinates(noise)
    cost = np.asarray(sizes, dtype=np.float64)
    if not cost[0] > cost[n]:
        cost = np.arange(n, -1, -1, dtype=np.float64)  # sizes do not move: every move counts the same
    tol = size_tol * (cost[0] - cost[n])

    def power(k: int) -> float:
        assert model is not None
        return model.power(model.degradation(ev.done[k].metric))

    def crossing(lo: int, hi: int) -> float | None:
        return None if model is None else noise_crossing(x, model, ev, lo, hi)

    if ev(n).ok:
        return n
    lo, hi = 0, n
    widths = [n]
    last_pred: int | None = None  # the last probe, when it was a prediction inside the bracket
    while hi - lo > 1 and cost[lo] - cost[hi] > tol:
        stalled = len(widths) > _GUARD_PROBES and widths[-1] > widths[-1 - _GUARD_PROBES] / 2
        xs = None if stalled else crossing(lo, hi)
        mid = 0.5 * (x[lo] + x[hi])
        k = _last_at_most(x, mid if xs is None else xs)
        inside = xs is not None and lo < k < hi
        # a neighbour probe only right after a prediction that measured some degradation: one
        # that measured none (a top-1 drop of zero flips) says nothing about the model's scale
        near = last_pred is not None and power(last_pred) > 0.0
        if xs is not None and not inside and not near:
            k = _last_at_most(x, mid)  # the model is off about this end: bisect
        last_pred = k if inside else None
        k = min(max(k, lo + 1), hi - 1)
        inner = np.arange(lo + 1, hi)
        if cost[lo] - cost[k] <= tol:
            k = int(inner[cost[lo + 1:hi] >= cost[lo] - tol][-1])
        elif cost[k] - cost[hi] <= tol:
            k = int(inner[cost[lo + 1:hi] <= cost[hi] + tol][0])
        if ev(k).ok:
            lo = k
        else:
            hi = k
        widths.append(hi - lo)
    if lo == 0:
        ev(0)
    return lo


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
