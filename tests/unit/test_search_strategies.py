"""Search strategies against a fake deterministic evaluator (a synthetic metric along the path);
`guided` also on synthetic paths whose metric follows, or misfits, the cheap noise estimate."""
from __future__ import annotations

import math
import time
from statistics import NormalDist

import numpy as np
import pytest

from mixq.search.strategies import (Evaluator, MetricModel, OutOfTime, bisection, front, greedy,
                                    guided, noise_coordinates, pareto, spread)


def make_eval(n: int, limit: int, deadline=None):
    """Metric = k (error grows along the path); points k <= limit meet the target."""
    return Evaluator(lambda k: (float(k), k <= limit, float(n - k)), deadline)


@pytest.mark.parametrize("n,limit", [(1, 0), (1, 1), (12, 0), (12, 5), (12, 12), (100, 37), (577, 300)])
def test_strategies_agree_on_a_monotone_path(n, limit):
    ev_g, ev_b, ev_p = make_eval(n, limit), make_eval(n, limit), make_eval(n, limit)
    assert greedy(n, ev_g) == bisection(n, ev_b) == pareto(n, ev_p) == limit
    assert ev_b.count <= math.ceil(math.log2(n + 1)) + 1
    assert ev_g.count == min(limit + 1, n)


def test_bisection_needs_a_tenth_of_greedy_evaluations_on_a_long_path():
    n, limit = 200, 150
    ev_g, ev_b = make_eval(n, limit), make_eval(n, limit)
    greedy(n, ev_g)
    bisection(n, ev_b)
    assert ev_b.count * 10 <= ev_g.count


def test_size_budget_alone_costs_one_evaluation():
    n = 50
    ev = make_eval(n, n)
    k = pareto(n, ev, size_ok=lambda k: (n - k) <= 20, accuracy_target=False)
    assert k == 30 and ev.count == 1


def test_deadline_stops_the_search_and_keeps_the_best_so_far():
    n = 64
    calls = []

    def fn(k):
        calls.append(k)
        time.sleep(0.02)
        return float(k), k <= 40, 0.0

    ev = Evaluator(fn, time.monotonic() + 0.05)
    with pytest.raises(OutOfTime):
        greedy(n, ev)
    assert 1 <= ev.count < n
    assert ev.best_ok() == max(k for k in ev.done if ev.done[k].ok)


def test_front_is_monotone_and_non_dominated():
    n, limit = 40, 20
    ev = make_eval(n, limit)
    for k in spread(n):
        ev(k)
    fr = front(list(ev.done.values()), higher_is_better=False)
    sizes = [e.size_bytes for e in fr]
    metrics = [e.metric for e in fr]
    assert sizes == sorted(sizes)
    assert metrics == sorted(metrics, reverse=True)  # bigger models are strictly more accurate
    for e in ev.done.values():  # nothing evaluated dominates a front point
        assert not any(e.size_bytes <= f.size_bytes and e.metric < f.metric for f in fr)


def test_spread_covers_both_ends():
    assert spread(0) == [0]
    assert spread(10)[0] == 0 and spread(10)[-1] == 10
    assert len(spread(1000)) <= 2 * math.ceil(math.log2(1000)) + 2


# -- guided ----------------------------------------------------------------------------------------


def synthetic_path(n: int, seed: int = 0, misfit: float = 0.0):
    """A path like build_path's: layers in ascending estimated error; returns the estimated noise
    s[k], weight bytes sizes[k] and the true added output noise power (estimate x per-layer gain,
    lognormal with sigma `misfit`; 0: the estimate is exact up to one constant)."""
    rng = np.random.default_rng(seed)
    err = np.sort(np.exp(rng.normal(np.log(0.05), 0.8, n)))
    base = err * rng.uniform(0.05, 0.5, n)
    inc = err ** 2 - base ** 2
    s = np.concatenate([[np.sum(base ** 2)], np.sum(base ** 2) + np.cumsum(inc)])
    saved = np.exp(rng.normal(np.log(2000.0), 0.5, n))
    sizes = np.concatenate([[2 * saved.sum()], 2 * saved.sum() - np.cumsum(saved)])
    gain = np.exp(rng.normal(0.0, misfit, n)) if misfit else np.ones(n)
    true_power = np.concatenate([[0.0], np.cumsum(gain * inc)])
    return s, sizes, true_power


def l2_case(n: int, break_at: int, seed: int = 0, misfit: float = 0.0):
    """Relative L2 = sqrt(true noise power): the target sits between P[break_at] and the next."""
    s, sizes, p = synthetic_path(n, seed, misfit)
    l2 = np.sqrt(p)
    target = float(0.5 * (l2[break_at] + l2[break_at + 1])) if break_at < n else float(l2[n])
    ev = Evaluator(lambda k: (float(l2[k]), bool(l2[k] <= target), float(sizes[k])), None)
    return ev, s, sizes, MetricModel(lambda v: v, target, "power"), l2 <= target


def test_guided_finds_the_break_of_a_smooth_metric_in_a_few_evaluations():
    n = 120
    for break_at in (5, 40, 77, 119):
        ev, s, sizes, model, ok = l2_case(n, break_at)
        k = guided(n, ev, s, sizes, model, size_tol=0.0)
        assert k == break_at and ev.done[k].ok
        assert ev.count <= 4, (break_at, list(ev.done))  # the end, the prediction, its neighbour
        ev_g = l2_case(n, break_at)[0]
        assert greedy(n, ev_g) == k
        if break_at >= 40:
            assert ev.count * 10 <= ev_g.count


@pytest.mark.parametrize("seed", range(12))
def test_guided_on_a_misfit_metric_returns_a_verified_point_no_worse_than_greedy(seed):
    n = 80
    rng = np.random.default_rng(100 + seed)
    break_at = int(rng.integers(1, n))
    ev, s, sizes, model, ok = l2_case(n, break_at, seed=seed, misfit=0.8)
    k = guided(n, ev, s, sizes, model, size_tol=0.0)
    assert ev.done[k].ok and k == ev.best_ok()
    ev_g = l2_case(n, break_at, seed=seed, misfit=0.8)[0]
    assert sizes[k] <= sizes[greedy(n, ev_g)]      # adjacency: never behind the first break
    assert ev.count <= 2 * math.ceil(math.log2(n + 1)) + 2  # the safeguards bound a poor model


def test_guided_size_tolerance_bounds_what_is_left_on_the_table():
    n, tol = 100, 0.05
    ev, s, sizes, model, ok = l2_case(n, 60, misfit=0.8)
    k = guided(n, ev, s, sizes, model, size_tol=tol)
    assert ev.done[k].ok
    best = int(np.flatnonzero(ok)[-1])  # the metric is monotone here: the last good point
    assert sizes[k] - sizes[best] <= tol * (sizes[0] - sizes[n]) + 1e-9


def test_guided_with_a_counted_top1_drop():
    """A top-1 drop on 48 samples: each sample flips once the output noise exceeds its margin
    (either way: the 'flip' link with saturation 1)."""
    n, rows = 90, 48
    s, sizes, p = synthetic_path(n, seed=3)
    margins = np.exp(np.random.default_rng(3).normal(0.0, 0.3, rows))
    noise = np.sqrt(p / p[n] * 4.0)  # the all-narrow output noise: four typical margins
    drop = np.mean(noise[:, None] * np.abs(np.random.default_rng(4).normal(size=rows)) > margins, axis=1)
    for max_drop in (0.0, 0.05):
        ev = Evaluator(lambda k: (1.0 - float(drop[k]), bool(drop[k] <= max_drop), float(sizes[k])),
                       None)
        model = MetricModel(lambda v: 1.0 - v, max_drop, "flip", resolution=1.0 / rows)
        k = guided(n, ev, s, sizes, model, size_tol=0.0)
        first_bad = int(np.flatnonzero(drop > max_drop)[0])
        assert k == first_bad - 1 and ev.done[k].ok
        assert ev.count <= math.ceil(math.log2(n + 1)) + 1, list(ev.done)  # bisection's bound


def test_guided_degenerate_paths():
    ev = Evaluator(lambda k: (0.0, True, 1.0), None)
    assert guided(0, ev, [0.1], [1.0], None) == 0 and ev.count == 0  # nothing to decide
    n = 30
    ev, s, sizes, model, ok = l2_case(n, n)  # the all-narrow end meets the target: one evaluation
    assert guided(n, ev, s, sizes, model) == n and ev.count == 1
    # nothing meets the target, not even all wide: the all-wide point is returned, evaluated
    ev = Evaluator(lambda k: (1.0 + k, False, float(n - k)), None)
    assert guided(n, ev, np.linspace(0, 1, n + 1), np.arange(n, -1, -1.0),
                  MetricModel(lambda v: v, 0.5, "power")) == 0
    assert 0 in ev.done and ev.count <= 2 * math.ceil(math.log2(n + 1)) + 2
    with pytest.raises(ValueError):
        guided(n, Evaluator(lambda k: (0.0, True, 0.0), None), [0.0] * n, [0.0] * (n + 1))


@pytest.mark.parametrize("n,limit", [(1, 0), (12, 5), (100, 37), (577, 300)])
def test_guided_without_a_model_is_bisection_in_noise_space(n, limit):
    """No model, and sizes that do not change (activation-only candidates): still the last good
    point, in about log2 n evaluations; with a tolerance every move counts the same."""
    ev = make_eval(n, limit)
    assert guided(n, ev, np.arange(n + 1.0) ** 2, [1.0] * (n + 1), None, size_tol=0.0) == limit
    assert ev.count <= math.ceil(math.log2(n + 1)) + 2
    ev = make_eval(n, limit)
    k = guided(n, ev, np.arange(n + 1.0) ** 2, [1.0] * (n + 1), None, size_tol=0.02)
    assert ev.done[k].ok and limit - k <= 0.02 * n


def test_guided_deadline_returns_the_best_verified_point_so_far():
    n = 200
    s, sizes, p = synthetic_path(n, seed=5, misfit=0.8)
    l2 = np.sqrt(p)
    target = float(l2[150])

    def fn(k):
        if len(ev.done) == 1:
            ev.deadline = time.monotonic() - 1.0  # the budget runs out during the second one
        return float(l2[k]), bool(l2[k] <= target), float(sizes[k])

    ev = Evaluator(fn, None)
    with pytest.raises(OutOfTime):  # closing the bracket needs at least three
        guided(n, ev, s, sizes, MetricModel(lambda v: v, target, "power"), size_tol=0.0)
    assert ev.count == 2
    best = ev.best_ok()
    assert best == 0 or (ev.done[best].ok and l2[best] <= target)


def test_noise_coordinates_and_links():
    # a move estimated to remove noise adds none; the base's own power is the origin
    assert noise_coordinates([1.0, 1.5, 1.2, 2.0]).tolist() == [0.0, 0.5, 0.5, 1.3]
    # no usable estimate: the path index
    assert noise_coordinates([0.3, 0.3, 0.3]).tolist() == [0.0, 1.0, 2.0]
    l2 = MetricModel(lambda v: v, 0.1, "power")
    assert l2.power(0.2) == pytest.approx(4 * l2.power(0.1)) and l2.target_power() == pytest.approx(0.01)
    flip = MetricModel(lambda v: v, 0.02, "flip", resolution=1 / 48)
    ps = [flip.power(d) for d in (0.0, 0.01, 0.05, 0.2, 0.5, 1.0)]
    assert ps == sorted(ps) and ps[0] == 0.0 and all(np.isfinite(ps))
    # d = 2 Phi(-1/sqrt(P)): the power that gives d back
    assert 2 * NormalDist().cdf(-1 / math.sqrt(flip.power(0.05))) == pytest.approx(0.05)
    # 0 flips allowed of 48 (0.01 and 0.02 alike): the break is where ln 2 flips are expected
    assert flip.target_power() == pytest.approx(flip.power(math.log(2) / 48))
    same = MetricModel(lambda v: v, 0.01, "flip", 1 / 48)
    assert same.target_power() == pytest.approx(flip.target_power())
    with pytest.raises(ValueError):
        MetricModel(lambda v: v, 0.1, "cubic")


@pytest.mark.parametrize("break_at", [20, 37, 50])
def test_guided_does_not_creep_past_points_without_degradation(break_at):
    """A coarse metric (no flip at all up to the break, then a drop), with a model that predicts
    the break much too early: probes that measure no degradation carry no scale, so guided
    bisects from them rather than creeping one point at a time (it spent 10 evaluations where
    bisection spent 7 on the PP-OCR classifier before this rule)."""
    n = 54
    x = np.arange(n + 1.0)
    drop = np.where(x <= break_at, 0.0, 0.0625 + 0.005 * (x - break_at))
    sizes = np.arange(n, -1, -1.0)
    ev = Evaluator(lambda k: (1.0 - float(drop[k]), bool(drop[k] <= 0.02), float(sizes[k])), None)
    model = MetricModel(lambda v: 1.0 - v, 0.02, "flip", resolution=1.0 / 48)
    k = guided(n, ev, (x / 2.0) ** 2, sizes, model, size_tol=0.0)  # noise grows 4x too fast
    assert k == break_at
    ev_b = Evaluator(ev.fn, None)
    assert bisection(n, ev_b) == break_at
    assert ev.count <= ev_b.count + 1, (sorted(ev.done), sorted(ev_b.done))


def test_a_seeded_point_is_known_and_not_counted():
    from mixq.search.strategies import Evaluation

    calls = []

    def fn(k):
        calls.append(k)
        return float(k), k <= 3, 100.0 - k

    ev = Evaluator(fn, None)
    ev.seed(10, Evaluation(0, 10.0, False, 90.0, 1.0, "all wide"))
    assert bisection(10, ev) == 3
    assert 10 not in calls and ev.count == len(calls)  # the known end cost nothing


def _parallel_eval(n: int, limit: int, width: int, rounds: list):
    fn = lambda k: (float(k), k <= limit, float(n - k))  # noqa: E731

    def batch(ks):
        rounds.append(list(ks))
        return [fn(k) for k in ks]

    ev = Evaluator(lambda k: (rounds.append([k]), fn(k))[1], None, batch=batch, width=width)
    return ev


@pytest.mark.parametrize("width", [2, 3, 4])
@pytest.mark.parametrize("n", [1, 2, 7, 12, 33])
def test_speculative_bisection_decides_as_the_serial_one(n, width):
    """Every break point and every guess (right, wrong, none): the serial bisection's answer; a
    right guess takes fewer rounds of (parallel) evaluations than the serial bisection."""
    for limit in range(n + 1):
        serial = make_eval(n, limit)
        expected = bisection(n, serial)
        for guess in (None, lambda lo, hi: limit, lambda lo, hi: n - limit, lambda lo, hi: 0):
            rounds: list = []
            assert bisection(n, _parallel_eval(n, limit, width, rounds), guess) == expected
            if guess is not None and guess(0, n) == limit and serial.count > 2:
                assert len(rounds) < serial.count
            assert all(len(r) <= width for r in rounds)


def test_prefetch_needs_a_batch_and_two_points():
    ev = make_eval(10, 5)
    ev.prefetch([1, 2, 3])  # no batch: nothing evaluated ahead
    assert ev.count == 0 and ev.width == 1
    rounds: list = []
    ev = _parallel_eval(10, 5, 2, rounds)
    ev.prefetch([4])  # one point: evaluated when asked, not ahead
    assert ev.count == 0
    ev.prefetch([4, 9, 4])
    assert rounds == [[4, 9]] and ev(9).ok is False and len(rounds) == 1


def test_the_path_narrows_weights_before_activations_alone():
    """Moves that narrow no weight save no byte. Sorted by error alone they came first (an
    element-wise layer's int16 -> int8 costs little), so on a decoder block the first point
    of a smaller size held 72 activation moves: relative L2 0.103 for one weight's saving, and
    `mixq auto --l2-target 0.1` returned the all-wide plan (0.126 MB; 0.112 MB meets it when
    weight moves come first). The first plan of each size is now the widest of it."""
    from mixq.search import Candidate
    from mixq.search.auto import build_path
    from mixq.search.sensitivity import SensitivityTable

    base, a8, w4 = Candidate("int16", "int8"), Candidate("int8", "int8"), Candidate("int8", "int4")
    table = SensitivityTable(["add", "mm"], [base.label, a8.label, w4.label],
                             {"add": {a8.label: 1e-5, w4.label: 1e-5}, "mm": {a8.label: 1e-4, w4.label: 0.05}})
    path = build_path(["add", "mm"], base, [a8, w4], table, weightless=frozenset({"add"}))
    assert path == [("mm", w4), ("add", a8)]
    # activation-only candidates: every move saves nothing, ascending error as before
    path = build_path(["add", "mm"], base, [a8], table, weightless=frozenset({"add"}))
    assert path == [("add", a8), ("mm", a8)]
