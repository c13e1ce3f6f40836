"""How far a plan's measured drop can be trusted: upper confidence bounds of a drop measured on
a sample of the data (the search's held-out data), so that the plan the search picks meets the
target on other data from the same source too.

Three estimators, each for what the search can see of a metric:

* :func:`drop_margin`: Student's t over per-sample drops of a continuous score (cosine, a
  per-line character accuracy, a per-file agreement).
* :func:`binary_drop_margin`: exact binomial (Clopper-Pearson) bounds for pass/fail scores (a
  user function returning 0 or 100 per sample, against labels the float model gets wrong on
  some samples). With few or no changed samples Student's t measures no spread and adds
  nothing, however small the sample: a plan that flipped none of 120 images "meets" a 1-point
  target with certainty, where 1.9 % of images may flip.
* :func:`flip_exposure` + :func:`top1_margin`: for top-1 metrics read from the outputs, each
  sample's probability of flipping under output noise of the size this plan shows it, from its
  float top-1 lead over the runner-ups: a near-tie that happened not to flip still counts as the
  probable flip it is. And since a small sample can miss the near-ties altogether, the share of
  data within a few noise spreads of a tie gets a Clopper-Pearson bound of its own.
"""
from __future__ import annotations

import functools
import math

import numpy as np

# a sample's flip risk is an output metric (the fidelity guard reads it too); the bounds build on it
from ..evaluate import COMPETITORS as COMPETITORS
from ..evaluate import NEAR_BAND as NEAR_BAND
from ..evaluate import FlipExposure as FlipExposure
from ..evaluate import flip_exposure as flip_exposure


def t_quantile(p: float, df: int) -> float:
    """The p quantile (p in [0.5, 1)) of Student's t distribution with `df` >= 1 degrees of
    freedom, from the closed-form CDF of integer df (bisection to 1e-10); the normal quantile
    beyond 400 degrees of freedom, where the two differ by less than 1 %."""
    if not 0.5 <= p < 1.0 or df < 1:
        raise ValueError(f"t_quantile needs 0.5 <= p < 1 and df >= 1, got p={p}, df={df}")
    if p == 0.5:
        return 0.0
    if df > 400:
        from statistics import NormalDist

        return NormalDist().inv_cdf(p)

    def central(t: float) -> float:  # P(|T| <= t)
        theta = math.atan(t / math.sqrt(df))
        c2, s = math.cos(theta) ** 2, math.sin(theta)
        if df % 2 == 0:  # sin(th) * (1 + 1/2 c^2 + 1*3/(2*4) c^4 + ... up to c^(df-2))
            term = total = 1.0
            for k in range(1, df // 2):
                term *= c2 * (2 * k - 1) / (2 * k)
                total += term
            return s * total
        if df == 1:  # Cauchy
            return 2.0 / math.pi * theta
        term = total = 1.0  # 2/pi (th + s c (1 + 2/3 c^2 + 2*4/(3*5) c^4 + ... up to c^(df-3)))
        for k in range(1, (df - 1) // 2):
            term *= c2 * (2 * k) / (2 * k + 1)
            total += term
        return 2.0 / math.pi * (theta + s * math.cos(theta) * total)

    target = 2.0 * p - 1.0
    lo, hi = 0.0, 1.0
    while central(hi) < target:
        hi *= 2.0
    while hi - lo > 1e-10 * max(1.0, hi):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if central(mid) < target else (lo, mid)
    return 0.5 * (lo + hi)


def drop_margin(drops: np.ndarray, confidence: float) -> float:
    """How far above the mean of the per-sample `drops` their one-sided `confidence` upper
    bound lies: t_confidence(n-1) * sd / sqrt(n) (0 for a point estimate, confidence 0.5, or
    fewer than two samples, where no spread can be measured)."""
    d = np.asarray(drops, dtype=np.float64).ravel()
    if confidence <= 0.5 or d.size < 2:
        return 0.0
    sd = float(np.std(d, ddof=1))
    return t_quantile(confidence, d.size - 1) * sd / math.sqrt(d.size) if sd > 0 else 0.0


# -- pass/fail scores ----------------------------------------------------------------------------
@functools.lru_cache(maxsize=1024)
def binomial_upper(k: int, n: int, confidence: float) -> float:
    """The one-sided `confidence` Clopper-Pearson upper bound of a rate seen k times in n
    trials: the p at which k or fewer events have probability 1 - confidence (for k = 0:
    1 - (1 - confidence) ** (1 / n), e.g. 1.9 % for 0 of 120 at 90 %)."""
    if not 0 <= k <= n or n < 1:
        raise ValueError(f"binomial_upper needs 0 <= k <= n and n >= 1, got k={k}, n={n}")
    if k == n:
        return 1.0
    if k == 0:
        return 1.0 - (1.0 - confidence) ** (1.0 / n)
    # P(X <= k) = sum_i C(n, i) p^i (1 - p)^(n - i), summed in log space; it falls as p grows
    i = np.arange(k + 1, dtype=np.float64)
    log_fact = np.concatenate([[0.0], np.cumsum(np.log(np.arange(1, n + 1, dtype=np.float64)))])
    log_choose = log_fact[n] - log_fact[:k + 1] - log_fact[n - np.arange(k + 1)]
    tail = math.log(1.0 - confidence)
    lo, hi = k / n, 1.0
    while hi - lo > 1e-12:
        mid = 0.5 * (lo + hi)
        terms = log_choose + i * math.log(mid) + (n - i) * math.log1p(-mid)
        top = float(np.max(terms))
        log_cdf = top + math.log(float(np.sum(np.exp(terms - top))))
        lo, hi = (mid, hi) if log_cdf > tail else (lo, mid)
    return hi


def binomial_lower(k: int, n: int, confidence: float) -> float:
    """The one-sided `confidence` Clopper-Pearson lower bound of a rate seen k times in n."""
    if k == 0:
        return 0.0
    return 1.0 - binomial_upper(n - k, n, confidence)


def two_valued(reference: np.ndarray, scores: np.ndarray) -> tuple[float, float] | None:
    """(low, high) when the per-sample scores of the float model (`reference`) and of a plan are
    pass/fail: they take exactly two values, which the float model's own scores both take (a
    labelled top-1 it gets wrong on some samples) or one of which is 0 (a failed sample). Else
    None: scores that take one value show nothing of how far a changed sample would fall, and
    a continuous score that happens to show two (one line's character accuracy at 97.4 beside
    the others' 100) is no pass mark."""
    ref = np.asarray(reference, dtype=np.float64).ravel()
    values = np.unique(np.concatenate([ref, np.asarray(scores, dtype=np.float64).ravel()]))
    if values.size != 2 or not (np.unique(ref).size == 2 or 0.0 in values):
        return None
    return float(values[0]), float(values[1])


def binary_drop_margin(reference: np.ndarray, scores: np.ndarray, low: float, high: float,
                       confidence: float, higher_is_better: bool = True) -> float:
    """How far the `confidence` upper bound of the mean drop of pass/fail `scores` (values
    `low` / `high`) against the float model's `reference` scores lies above the measured drop.

    The drop is (high - low) * (p_down - p_up), p_down / p_up the rates of samples that fail
    only with the plan / pass only with it. Bounded by Clopper-Pearson: p_down's upper bound
    minus p_up's lower bound, each at (1 + confidence) / 2 when samples went both ways (so
    that both hold together at `confidence`), p_down's alone at `confidence` when none went up
    (a rate's lower bound of 0 holds at any confidence). 0 at confidence 0.5."""
    ref = np.asarray(reference, dtype=np.float64).ravel()
    got = np.asarray(scores, dtype=np.float64).ravel()
    n = ref.size
    if confidence <= 0.5 or n == 0:
        return 0.0
    sign = 1.0 if higher_is_better else -1.0
    drop = sign * (ref - got)
    down, up = int(np.sum(drop > 0)), int(np.sum(drop < 0))
    gap = high - low
    measured = gap * (down - up) / n
    each = confidence if up == 0 else 0.5 * (1.0 + confidence)
    bound = gap * (binomial_upper(down, n, each) - binomial_lower(up, n, each))
    return max(0.0, bound - measured)


# -- top-1 from the outputs ------------------------------------------------------------------------
#: the flip rate of samples whose leads spread evenly over [0, NEAR_BAND) noise spreads:
#: int_0^inf P(N(0,1) > t) dt / NEAR_BAND = phi(0) / NEAR_BAND
NEAR_FLIP_RATE = 1.0 / math.sqrt(2.0 * math.pi) / NEAR_BAND


def top1_margin(observed: np.ndarray, exposure: FlipExposure, exposed: np.ndarray,
                confidence: float) -> float:
    """How far the `confidence` upper bound of a top-1 metric's drop lies above the measured
    drop (the mean of the per-row `observed` drops: 1 a row lost, -1 gained, 0 kept).

    `exposed`: the rows whose float answer a flip would lose (every row for agreement with the
    float model; for top-1 against labels, the rows the float model gets right). The largest of
    three bounds counts, each at `confidence`:
    * the expected drop: each exposed row loses its flip risk (the calibrated estimate of its
      flip: a near-tie that did not flip this time counts, a wide lead that flipped by chance
      counts less), each gained row gains; Student's t over the rows;
    * the observed drop, Student's t (in case the noise is unlike the risk's model);
    * the near-ties the sample may have missed: were the leads spread evenly near a tie, rows
      within NEAR_BAND noise spreads of one would flip at NEAR_FLIP_RATE; their share of the
      data is bounded by Clopper-Pearson from the near or lost rows seen (not 0 when none are:
      120 samples cannot show that fewer than 1.9 % of the data are near a tie, at 90 %).
    0 at confidence 0.5 (the measured drop alone)."""
    obs = np.asarray(observed, dtype=np.float64).ravel()
    n = obs.size
    if confidence <= 0.5 or n == 0:
        return 0.0
    mask = np.asarray(exposed, dtype=bool).ravel()
    expected = np.where(mask, exposure.risk, 0.0) + np.minimum(obs, 0.0)
    measured = float(np.mean(obs))
    bounds = [float(np.mean(expected)) + drop_margin(expected, confidence),
              measured + drop_margin(obs, confidence)]
    near = int(np.sum((exposure.near & mask) | (obs > 0)))
    bounds.append(NEAR_FLIP_RATE * binomial_upper(near, n, confidence))
    return max(0.0, max(bounds) - measured)
