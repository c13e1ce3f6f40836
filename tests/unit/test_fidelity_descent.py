"""The guard's halving descent (`mixq.fidelity._descend`) on an exact additive noise model (the
output's noise is the sum of each tensor's share, and putting a group back to float removes its
shares) and on one where noises compound. Random instances check what it returns and how many
runs it takes."""
from __future__ import annotations

import math

import numpy as np
import pytest

from mixq.fidelity import MIN_GAIN_DB, _descend


def _model(shares: dict[str, float]):
    total = sum(shares.values())  # signal power 1: SQNR = -10 log10(noise)
    runs: list[list[str]] = []

    def sqnr_of(group: list[str]) -> float:
        runs.append(list(group))
        left = total - sum(shares[t] for t in group)
        return math.inf if left <= 0 else -10.0 * math.log10(left)

    return total, sqnr_of, runs


def _db(noise: float) -> float:
    return -10.0 * math.log10(noise)


@pytest.mark.parametrize("seed", range(40))
def test_one_dominant_share_is_found_in_log_runs(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 40))
    names = [f"t{i}" for i in range(n)]
    shares = {t: float(v) for t, v in zip(names, rng.uniform(0.001, 0.01, n))}
    bad = names[int(rng.integers(n))]
    shares[bad] = 0.5  # the one that matters
    total, sqnr_of, runs = _model(shares)
    base = _db(total)
    group, db, finished = _descend(names, sqnr_of, base, sqnr_of(names), None)
    assert finished and group == [bad], group
    assert db == pytest.approx(_db(total - shares[bad]))  # measured, not inferred
    assert len(runs) - 1 <= 2 * math.ceil(math.log2(n))  # one or two runs a level


@pytest.mark.parametrize("seed", range(40))
def test_spread_shares_end_on_the_smallest_group_that_gains(seed):
    rng = np.random.default_rng(1000 + seed)
    n = int(rng.integers(12, 64))
    names = [f"t{i}" for i in range(n)]
    shares = {t: float(v) for t, v in zip(names, rng.uniform(0.9, 1.1, n) / n)}
    total, sqnr_of, runs = _model(shares)
    base = _db(total)
    group, db, finished = _descend(names, sqnr_of, base, sqnr_of(names), None)
    gain = db - base
    assert finished and gain >= MIN_GAIN_DB
    assert all(_db(total - shares[t]) - base < MIN_GAIN_DB for t in names)  # no single one would do
    assert len(group) > 1 and len(group) < n
    assert db == pytest.approx(_db(total - sum(shares[t] for t in group)))
    # its halves gain less (it is the smallest on the path): the larger half alone is under 1 dB
    half = max((group[:len(group) // 2], group[len(group) // 2:]), key=lambda g: sum(shares[t] for t in g))
    assert _db(total - sum(shares[t] for t in half)) - base < MIN_GAIN_DB + 1e-9


def test_a_passed_deadline_stops_before_the_first_split():
    shares = {"a": 0.5, "b": 0.01}
    total, sqnr_of, runs = _model(shares)
    group, db, finished = _descend(["a", "b"], sqnr_of, _db(total), sqnr_of(["a", "b"]), deadline=0.0)
    assert not finished and group == ["a", "b"] and len(runs) == 1


def test_compounding_noise_does_not_lead_it_astray():
    """Noise that only goes away when both halves are float (say an early layer's error that a
    later one amplifies, and the later one's own): the first half alone gains little, so
    additive shares would credit the second half with the rest and descend into it, but
    measured it gains even less. The descent stops on the whole group, the honest answer."""
    names = [f"t{i}" for i in range(8)]
    first, second = set(names[:4]), set(names[4:])

    def sqnr_of(group: list[str]) -> float:
        left = set(names) - set(group)
        noise = 1e-3 + 0.2 * bool(left & first) + 0.1 * bool(left & second) + 1.0 * bool(left)
        return -10.0 * math.log10(noise)

    base = sqnr_of([])
    group, db, finished = _descend(names, sqnr_of, base, sqnr_of(names), None)
    assert finished and group == names and db - base > 20, (group, db - base)
