"""Optimal candidate length: exact argmax, Corollary 4's closed form, efficiency."""
from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from specloop.theory import (optimal_k_efficiency, optimal_k_exact, optimal_k_paper,
                             speedup_linear)


def _brute_force(acc, ratio, convention="committed", k_max=80):
    """Exact rational argmax (smallest maximiser) over 0..k_max."""
    a, c = Fraction(acc), Fraction(ratio)
    best_k, best = 0, None
    tokens, power = Fraction(0), Fraction(1)  # committed: sum_{j<=k} a^j; appendix: sum_{j<k}
    for k in range(k_max + 1):
        if convention == "committed":
            tokens += power
        value = tokens / (c * k + 1)
        if convention == "appendix":
            tokens += power
        power *= a
        if best is None or value > best:
            best_k, best = k, value
    return best_k


@given(st.floats(0.0, 0.9), st.floats(0.05, 2.0), st.sampled_from(["committed", "appendix"]))
def test_exact_matches_brute_force(acc, ratio, convention):
    k = optimal_k_exact(acc, ratio, convention)
    assert k < 80 and k == _brute_force(acc, ratio, convention)


def test_known_values_and_ties():
    assert optimal_k_exact(0.8, 0.05) == _brute_force(0.8, 0.05) == 8
    assert optimal_k_exact(0.0, 0.3) == 0 and optimal_k_exact(0.0, 0.3, "appendix") == 1
    assert optimal_k_exact(1.0, 1.0) == 0 and optimal_k_exact(1.0, 2.0) == 0
    # exact tie between k = 0 and k = 1 ((1 + a)/(1 + c) = 1 when a = c): smaller k
    assert optimal_k_exact(0.25, 0.25) == 0
    assert optimal_k_exact(1.0, 0.5, k_max=7) == 7
    assert optimal_k_exact(0.9, 0.01, k_max=3) == 3


def test_unbounded_argmax_raises_without_cap():
    with pytest.raises(ValueError, match="without bound"):
        optimal_k_exact(1.0, 0.5)
    with pytest.raises(ValueError, match="without bound"):
        optimal_k_exact(0.5, 0.0)
    with pytest.raises(ValueError, match="without bound"):
        optimal_k_exact(1.0, 3.0, "appendix")


def test_paper_closed_form_equals_stated_expression():
    for acc in (0.1, 0.5, 0.8, 0.95):
        for c in (0.01, 0.1, 1.0):
            big_c = -1 + acc + math.sqrt(1 - 2 * acc + acc ** 2 + 3 * c - 4 * acc * c + acc ** 2 * c)
            assert optimal_k_paper(acc, c) == pytest.approx(big_c / (c * (1 - acc)), rel=1e-10)
            assert 0 <= big_c <= 1
    assert optimal_k_paper(1.0, 0.1) == math.inf
    assert optimal_k_paper(0.5, 0.0) == pytest.approx(2.5 / 1.0)
    assert optimal_k_paper(np.array([0.5, 0.9]), 0.1).shape == (2,)


@given(st.floats(0.0, 1.0), st.floats(0.0, 2.0))
def test_efficiency_in_unit_interval_and_nan_free(acc, ratio):
    eff = optimal_k_efficiency(acc, ratio)
    assert 0.0 <= eff <= 1.0 and not math.isnan(eff)


def test_efficiency_value():
    k_round = int(math.floor(optimal_k_paper(0.8, 0.05) + 0.5))
    expected = float(speedup_linear(0.8, k_round, 0.05) / speedup_linear(0.8, 8, 0.05))
    assert optimal_k_efficiency(0.8, 0.05) == pytest.approx(expected)
    assert optimal_k_efficiency(1.0, 0.5) == 1.0 and optimal_k_efficiency(1.0, 2.0) == 0.5


@pytest.mark.parametrize("args, message", [
    ((-0.1, 0.1), "acceptance_rate"), ((0.5, -0.1), "cost_ratio"), ((np.nan, 0.1), "NaN"),
])
def test_optimal_k_rejects(args, message):
    with pytest.raises(ValueError, match=message):
        optimal_k_exact(*args)
    with pytest.raises(ValueError, match=message):
        optimal_k_paper(*args)
    with pytest.raises(ValueError, match=message):
        optimal_k_efficiency(*args)
    with pytest.raises(ValueError, match="k_max"):
        optimal_k_exact(0.5, 0.1, k_max=-1)
