"""theory.lookahead_cost: the expected steps and judged pairs of an LR round against a
Monte Carlo simulation of rounds (tolerance from the sample count), the speedup's
bounds, and the break-even acceptance rate."""
from __future__ import annotations

import math

import numpy as np
import pytest

from specloop.theory.lookahead_cost import (LookaheadCosts, break_even_acceptance, expected_judged_pairs,
                                            expected_steps_per_round, lookahead_speedup, max_speedup,
                                            round_seconds)

COSTS = LookaheadCosts(step_tokens=17.0, t_decode=0.42, batch_ratio=1.8, t_draft=0.9, t_judge=1.2, t_commit=0.5)


def _simulate(p, gamma, rounds, rng):
    """(steps, judged) per round: judge pairs in order until the first rejection."""
    accepts = rng.random((rounds, gamma)) < p
    leading = np.where(accepts.all(axis=1), gamma, accepts.argmin(axis=1))
    steps = leading + (leading < gamma)
    judged = np.minimum(leading + 1, gamma)
    return steps, judged


@pytest.mark.parametrize("p,gamma", [(0.0, 3), (0.3, 3), (0.7, 5), (1.0, 2), (0.5, 1)])
def test_expectations_match_simulated_rounds(p, gamma):
    rng = np.random.default_rng(0)
    steps, judged = _simulate(p, gamma, 200_000, rng)
    for sample, exact in ((steps, expected_steps_per_round(p, gamma)), (judged, expected_judged_pairs(p, gamma))):
        half = 4.0 * sample.std() / math.sqrt(sample.size) + 1e-12     # 4 standard errors
        assert abs(sample.mean() - exact) <= half
    assert expected_steps_per_round(p, gamma) == pytest.approx(expected_judged_pairs(p, gamma))
    if p < 1:
        assert expected_steps_per_round(p, gamma) == pytest.approx((1 - p ** gamma) / (1 - p))


def test_speedup_from_round_seconds_and_its_bounds():
    gamma = 3
    s = lookahead_speedup(0.3, gamma, COSTS)
    assert s == pytest.approx(expected_steps_per_round(0.3, gamma) * 17 * 0.42 / round_seconds(0.3, gamma, COSTS))
    ps = np.linspace(0, 1, 21)
    values = [lookahead_speedup(p, gamma, COSTS) for p in ps]
    assert all(b > a for a, b in zip(values, values[1:]))                 # increases with p
    assert max_speedup(gamma, COSTS) == pytest.approx(values[-1])
    assert max_speedup(gamma, COSTS) <= gamma / COSTS.batch_ratio
    slow = LookaheadCosts(17.0, 0.42, batch_ratio=3.0, t_draft=0.0, t_judge=0.0)
    assert max_speedup(3, slow) == pytest.approx(1.0) and break_even_acceptance(3, slow) is None


def test_break_even_acceptance_solves_speedup_one():
    gpu_like = LookaheadCosts(17.0, 0.02, batch_ratio=1.05, t_draft=0.05, t_judge=0.04, t_commit=0.01)
    p = break_even_acceptance(3, gpu_like)
    assert 0 < p < 1 and lookahead_speedup(p, 3, gpu_like) == pytest.approx(1.0, abs=1e-6)
    assert break_even_acceptance(3, COSTS) is None or lookahead_speedup(break_even_acceptance(3, COSTS), 3,
                                                                           COSTS) == pytest.approx(1.0, abs=1e-6)


@pytest.mark.parametrize("kwargs", [{"step_tokens": 0}, {"batch_ratio": 0.5}, {"t_judge": -1}])
def test_bad_costs_are_refused(kwargs):
    base = dict(step_tokens=10.0, t_decode=0.1, batch_ratio=1.0, t_draft=0.1, t_judge=0.1)
    with pytest.raises(ValueError):
        LookaheadCosts(**{**base, **kwargs})
    with pytest.raises(ValueError, match="acceptance rate"):
        expected_steps_per_round(1.5, 3)
    with pytest.raises(ValueError, match="gamma"):
        expected_judged_pairs(0.5, 0)
