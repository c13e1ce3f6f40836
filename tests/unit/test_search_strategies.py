"""Search strategies against a fake deterministic evaluator (a synthetic metric along the path)."""
from __future__ import annotations

import math
import time

import pytest

from mixq.search.strategies import Evaluator, OutOfTime, bisection, front, greedy, pareto, spread


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
