"""The search's drop bounds (mixq.search.bounds): exact binomial bounds for pass/fail scores and
the flip exposure of top-1 metrics read from the outputs. Each is checked against an oracle
(the beta quantiles of the Clopper-Pearson definition) or by coverage over seeded draws from a
population whose true drop is known; the Student's t bound they replace fails the same checks
where few or no samples change."""
from __future__ import annotations

import math

import numpy as np
import pytest

from mixq.search.bounds import (NEAR_BAND, FlipExposure, binary_drop_margin, binomial_lower,
                                binomial_upper, drop_margin, flip_exposure, top1_margin, two_valued)

# (k, n, confidence) -> Clopper-Pearson one-sided upper / lower bound: the beta quantiles
# Beta(c; k + 1, n - k) and Beta(1 - c; k, n - k + 1), from scipy.stats.beta.ppf
CLOPPER_PEARSON = [
    ((0, 120, 0.90), 0.019005, 0.0),
    ((1, 10, 0.95), 0.394163, 0.005116),
    ((5, 20, 0.95), 0.455582, 0.104081),
    ((10, 1000, 0.90), 0.015365, 0.00623),
    ((3, 96, 0.90), 0.068266, 0.011534),
    ((50, 100, 0.99), 0.619283, 0.380717),
    ((199, 200, 0.90), 0.999473, 0.980691),
]


@pytest.mark.parametrize("args, upper, lower", CLOPPER_PEARSON)
def test_binomial_bounds_are_the_clopper_pearson_quantiles(args, upper, lower):
    assert binomial_upper(*args) == pytest.approx(upper, abs=2e-6)
    assert binomial_lower(*args) == pytest.approx(lower, abs=2e-6)


def test_binomial_bounds_at_the_ends():
    assert binomial_upper(7, 7, 0.9) == 1.0 and binomial_lower(0, 7, 0.9) == 0.0
    assert binomial_upper(0, 50, 0.9) == pytest.approx(1 - 0.1 ** (1 / 50))
    with pytest.raises(ValueError):
        binomial_upper(3, 2, 0.9)


def test_two_valued_scores():
    assert two_valued(np.array([0, 100, 100]), np.array([100, 0])) == (0.0, 100.0)  # float fails some
    assert two_valued(np.array([1.0, 1.0]), np.array([0.0, 1.0])) == (0.0, 1.0)  # a plan fails one
    # one value: nothing shows how far a changed sample would fall
    assert two_valued(np.array([100.0, 100.0]), np.array([100.0, 100.0])) is None
    # a continuous score that shows two values: one line's character accuracy fell to 97.4
    assert two_valued(np.array([100.0, 100.0]), np.array([97.4, 100.0])) is None
    assert two_valued(np.array([0.2, 0.5]), np.array([1.0, 0.5])) is None


@pytest.mark.parametrize("rate, n", [(0.01, 60), (0.01, 120), (0.005, 300), (0.03, 100)])
def test_the_pass_fail_bound_covers_rare_changes(rate, n):
    """Samples fail only with the plan at `rate` (and, a quarter as often, pass only with it):
    the bound covers the true mean drop in at least 90 % of 3000 draws (Clopper-Pearson is
    exact or conservative); Student's t, which sees no spread when no sample changed, far less
    often where changes are rare."""
    rng = np.random.default_rng(7)
    up_rate = rate / 4
    true_drop = 100.0 * (rate - up_rate)
    covered = t_covered = 0
    for _ in range(3000):
        u = rng.random(n)
        ref = np.full(n, 100.0)
        got = np.where(u < rate, 0.0, 100.0)
        ref[(u >= rate) & (u < rate + up_rate)] = 0.0  # the float model fails, the plan passes
        drop = ref - got
        covered += drop.mean() + binary_drop_margin(ref, got, 0.0, 100.0, 0.9) >= true_drop
        t_covered += drop.mean() + drop_margin(drop, 0.9) >= true_drop
    assert covered / 3000 >= 0.90
    if rate * n <= 1.2:  # about one change expected: t often sees none
        assert t_covered / 3000 < 0.75


def test_the_pass_fail_bound_reads_the_direction_and_the_point_estimate():
    ref, got = np.full(40, 1.0), np.full(40, 1.0)
    got[:2] = 0.0
    up = binary_drop_margin(ref, got, 0.0, 1.0, 0.9)
    assert up > 0 and binary_drop_margin(ref, got, 0.0, 1.0, 0.5) == 0.0
    # lower is better (an error rate): the same changes read the other way round
    assert binary_drop_margin(1.0 - ref, 1.0 - got, 0.0, 1.0, 0.9, higher_is_better=False) == pytest.approx(up)


def _population(sigma: float, n: int = 40000, classes: int = 10, seed: int = 0):
    rng = np.random.default_rng(seed)
    f = rng.standard_normal((n, classes))
    q = f + sigma * rng.standard_normal((n, classes))
    return f, q, (q.argmax(1) != f.argmax(1)).astype(np.float64)


@pytest.mark.parametrize("sigma", [0.01, 0.03, 0.1])
def test_flip_risk_predicts_the_flip_rate(sigma):
    """Gaussian class scores, Gaussian output noise: the mean flip risk read from one noisy
    output is the rate at which top-1 classes actually change, within 15 %."""
    f, q, flips = _population(sigma)
    risk = flip_exposure(q, f).risk
    assert flips.mean() > 0
    assert risk.mean() == pytest.approx(flips.mean(), rel=0.15)


def test_flip_exposure_of_simple_rows():
    f = np.array([[3.0, 0.0, 0.0], [1.0, 1.0, 0.0], [5.0, 0.0, -1.0], [1.0, 0.5, 0.0]])
    same = flip_exposure(f, f)
    assert np.all(same.risk == 0.0) and not same.near.any()  # no noise, no risk
    q = f + np.array([[0.01, -0.01, 0.0]] * 4)
    ex = flip_exposure(q, f)
    assert ex.risk[1] >= 0.5 and ex.near[1]  # a tie flips under any noise
    assert ex.risk[0] < 1e-12 and ex.risk[2] < 1e-12 and not ex.near[[0, 2]].any()
    q[3, 1] = np.nan
    assert flip_exposure(q, f).risk[3] == 1.0  # a non-finite output scores worst
    assert flip_exposure(np.ones((3, 1)), np.zeros((3, 1))).risk.tolist() == [0.0, 0.0, 0.0]


@pytest.mark.parametrize("sigma, n", [(0.01, 60), (0.01, 120), (0.03, 60), (0.1, 300)])
def test_the_top1_bound_covers_the_population_flip_rate(sigma, n):
    """The 90 % bound of a top-1 agreement drop, from `n` rows drawn from a population whose
    flip rate is known: it covers that rate in about 90 % of 1500 draws or more, where
    Student's t over the observed flips alone covers it far less often when flips are rare
    (0.4 at 60 rows and 0.85 % flips)."""
    f, q, flips = _population(sigma)
    ex = flip_exposure(q, f)
    rng = np.random.default_rng(3)
    covered = t_covered = 0
    draws = 1500
    for _ in range(draws):
        idx = rng.choice(len(f), n, replace=False)
        obs = flips[idx]
        sub = FlipExposure(ex.risk[idx], ex.near[idx])
        covered += obs.mean() + top1_margin(obs, sub, np.ones(n, bool), 0.9) >= flips.mean()
        t_covered += obs.mean() + drop_margin(obs, 0.9) >= flips.mean()
    assert covered / draws >= 0.88
    if flips.mean() * n < 1.0:
        assert t_covered / draws < 0.7


def test_a_near_tie_that_did_not_flip_still_counts():
    """Ten rows, one of them a near-tie the plan's noise did not flip: the bound is above the
    measured drop of 0 (Student's t over the observed flips adds nothing), and more so than
    with a wide lead in its place."""
    f = np.tile(np.array([4.0, 0.0, -1.0]), (10, 1))
    noise = np.tile(np.array([0.02, -0.02, 0.0]), (10, 1))
    tie = f.copy()
    tie[0] = [1.0, 0.99, 0.0]
    for ref in (f, tie):
        assert (np.argmax(ref + noise, 1) == np.argmax(ref, 1)).all()
    wide = top1_margin(np.zeros(10), flip_exposure(f + noise, f), np.ones(10, bool), 0.9)
    near = top1_margin(np.zeros(10), flip_exposure(tie + noise, tie), np.ones(10, bool), 0.9)
    assert drop_margin(np.zeros(10), 0.9) == 0.0
    assert near > wide > 0.0
    assert top1_margin(np.zeros(10), flip_exposure(tie + noise, tie), np.ones(10, bool), 0.5) == 0.0


def test_the_near_band_counts_rows_within_three_spreads():
    """A row is near a tie when its lead is below NEAR_BAND noise spreads (sqrt(2) * std of the
    row's noise): just inside and just outside the band."""
    noise = np.array([0.0, 0.0, 0.03])  # spread sqrt(2) * std = 0.02
    spread = math.sqrt(2.0) * np.std(noise)
    for factor, near in ((0.99, True), (1.01, False)):
        f = np.array([[1.0, 1.0 - factor * NEAR_BAND * spread, -5.0]])
        assert flip_exposure(f + noise, f).near[0] == near
