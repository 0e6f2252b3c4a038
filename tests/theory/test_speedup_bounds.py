"""Speedup (Eq. 7), measured-cost speedup, Lemma 1 and Theorem 1 bounds."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from specloop.theory import (VerifyCostTable, acceptance_rate, expected_tokens_chain,
                             kl_divergence, lemma1_bounds, speedup_linear, speedup_measured,
                             speedup_upper_bound, theorem1_bounds)
from tests.strategies import acceptance_rates, cost_ratios, distribution_pairs, num_draft_tokens


@given(acceptance_rates(), num_draft_tokens(), cost_ratios())
def test_speedup_at_most_upper_bound(acc, k, ratio):
    gamma = float(speedup_linear(acc, k, ratio))
    assert 0 < gamma <= float(speedup_upper_bound(k, ratio)) * (1 + 1e-12)
    assert gamma == pytest.approx(float(expected_tokens_chain(acc, k)) / (ratio * k + 1))


@given(acceptance_rates(), acceptance_rates(), num_draft_tokens(), cost_ratios())
def test_speedup_monotone_in_acceptance(a, b, k, ratio):
    lo, hi = sorted((a, b))
    assert float(speedup_linear(lo, k, ratio)) <= float(speedup_linear(hi, k, ratio)) * (1 + 1e-12)


def test_verify_cost_table_interpolates_and_extrapolates():
    table = VerifyCostTable(np.array([1, 4, 8, 16]), np.array([0.033, 0.053, 0.064, 0.069]))
    assert float(table(4)) == pytest.approx(0.053)
    assert float(table(6)) == pytest.approx(0.0585)
    assert float(table(24)) == pytest.approx(0.069 + 8 * (0.069 - 0.064) / 8)
    assert float(table(0)) == pytest.approx(max(0.033 - (0.020 / 3), 0.0))
    np.testing.assert_allclose(table([1, 16]), [0.033, 0.069])
    assert float(VerifyCostTable([5], [0.1])(100)) == 0.1


@pytest.mark.parametrize("tokens, seconds, message", [
    ([], [], "non-empty"), ([1, 2], [0.1], "equally long"), ([2, 1], [0.1, 0.2], "increasing"),
    ([0, 1], [0.1, 0.2], ">= 1"), ([1, 2], [0.1, -0.2], ">= 0"), ([1, 2], [0.1, np.nan], "NaN"),
])
def test_verify_cost_table_rejects(tokens, seconds, message):
    with pytest.raises(ValueError, match=message):
        VerifyCostTable(tokens, seconds)


@given(acceptance_rates(), num_draft_tokens(), st.floats(0.001, 1.0))
def test_measured_speedup_with_constant_verify_cost_is_eq7(acc, k, ratio):
    target_time = 0.04
    table = VerifyCostTable([1, 2], [target_time, target_time])
    measured = float(speedup_measured(acc, k, ratio * target_time, table, target_time))
    assert measured == pytest.approx(float(speedup_linear(acc, k, ratio)), rel=1e-12)


def test_measured_speedup_uses_k_plus_one_tokens():
    cost = lambda n: 0.03 + 0.002 * np.asarray(n)  # noqa: E731
    gamma = float(speedup_measured(0.8, 4, 0.005, cost, 0.032))
    expected = float(expected_tokens_chain(0.8, 4)) * 0.032 / (4 * 0.005 + 0.03 + 0.002 * 5)
    assert gamma == pytest.approx(expected)
    with pytest.raises(ValueError, match="target_time"):
        speedup_measured(0.8, 4, 0.005, cost, 0.0)
    with pytest.raises(ValueError, match="draft_time"):
        speedup_measured(0.8, 4, -1.0, cost, 0.03)
    with pytest.raises(ValueError, match="callable"):
        speedup_measured(0.8, 4, 0.005, 0.03, 0.03)


@given(st.lists(distribution_pairs(max_vocab=200), min_size=1, max_size=6),
       st.integers(0, 16), st.floats(0.0, 1.0))
def test_lemma1_and_theorem1_hold_for_committed_tokens(pairs, k, ratio):
    """Assumption 1 (i.i.d. positions), comparator q = p: Reg_T = sum KL(p_t || q_t)."""
    rounds = len(pairs)
    total = sum(float(expected_tokens_chain(acceptance_rate(p, q), k)) for p, q in pairs)
    reg = sum(float(kl_divergence(p, q)) for p, q in pairs)
    lower, upper = lemma1_bounds(reg, rounds, k)
    assert float(lower) <= total * (1 + 1e-9) and total <= float(upper) * (1 + 1e-12)
    g_lower, g_upper = theorem1_bounds(reg, rounds, k, ratio)
    gamma = total / (rounds * (ratio * k + 1))
    assert float(g_lower) <= gamma * (1 + 1e-9) and gamma <= float(g_upper) * (1 + 1e-12)


def test_bounds_values_and_limits():
    lower, upper = lemma1_bounds(0.0, 10, 4)
    assert float(lower) == float(upper) == 50.0
    lower, _ = lemma1_bounds(np.inf, 10, 4)
    assert float(lower) == 0.0
    lower, _ = lemma1_bounds(8.0, 4, 3)
    assert float(lower) == pytest.approx(16 / (1 + 4 * 1.0))
    g_lower, g_upper = theorem1_bounds(8.0, 4, 3, 0.1)
    assert float(g_upper) == pytest.approx(4 / 1.3) and float(g_lower) == pytest.approx(4 / 1.3 / 5)
    lows, _ = lemma1_bounds(np.array([0.0, 1.0, 10.0]), 5, 2)
    assert np.all(np.diff(lows) < 0)


@pytest.mark.parametrize("args, message", [
    ((-1.0, 10, 2), "dynamic_regret"), ((1.0, 0, 2), "rounds"), ((1.0, 10, -1), "num_draft"),
    ((np.nan, 10, 2), "dynamic_regret"),
])
def test_bounds_reject(args, message):
    with pytest.raises(ValueError, match=message):
        lemma1_bounds(*args)
    with pytest.raises(ValueError, match=message):
        theorem1_bounds(*args, 0.1)


def test_cost_ratio_rejected():
    with pytest.raises(ValueError, match="cost_ratio"):
        theorem1_bounds(1.0, 10, 2, -0.1)
    with pytest.raises(ValueError, match="cost_ratio"):
        speedup_linear(0.5, 2, -0.1)
    with pytest.raises(ValueError, match="cost_ratio"):
        speedup_upper_bound(2, np.nan)
