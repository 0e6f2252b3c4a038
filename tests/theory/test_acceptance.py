"""Acceptance rate, TV, KL, residual and multi-draft sibling acceptance."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from scipy import stats

from specloop.theory import (acceptance_rate, kl_divergence, multidraft_sibling_acceptance,
                             residual_distribution, total_variation, validate_distribution)
from tests.strategies import distribution_pairs, probability_vectors

EPS = 1e-12


@given(distribution_pairs())
def test_acceptance_equals_one_minus_tv(pair):
    p, q = pair
    assert abs(float(acceptance_rate(p, q)) - (1.0 - float(total_variation(p, q)))) <= 1e-12


@given(distribution_pairs(with_regime=True))
def test_regime_values(triple):
    p, q, regime = triple
    acc, kl = float(acceptance_rate(p, q)), float(kl_divergence(p, q))
    assert -EPS <= acc <= 1 + EPS and kl >= 0
    if regime == "equal":
        assert acc == pytest.approx(1.0, abs=1e-12) and kl == pytest.approx(0.0, abs=1e-12)
    if regime == "disjoint":
        assert acc == 0.0 and np.isinf(kl)
    if regime == "q_missing_support":
        assert np.isinf(kl)
    if np.isfinite(kl):  # Pinsker: TV <= sqrt(KL / 2)
        assert float(total_variation(p, q)) <= np.sqrt(kl / 2) + 1e-9


@given(distribution_pairs())
def test_residual_never_nan_and_normalised(pair):
    p, q = pair
    r = residual_distribution(p, q)
    assert np.all(np.isfinite(r)) and np.all(r >= 0)
    assert r.sum() == pytest.approx(1.0, abs=1e-9)
    if (p - q).clip(min=0).sum() > 0:
        assert np.all(r[p <= q] == 0)  # support of the residual is {p > q}


def test_residual_zero_mass_returns_p():
    p = np.array([0.2, 0.3, 0.5])
    np.testing.assert_array_equal(residual_distribution(p, p), p)


def test_speculative_sampling_output_is_exactly_p():
    """Leviathan et al.: min(p, q) + (1 - Acc) * residual == p (losslessness identity)."""
    rng = np.random.default_rng(0)
    for _ in range(50):
        p, q = rng.dirichlet(np.ones(7) * 0.3), rng.dirichlet(np.ones(7) * 0.3)
        out = np.minimum(p, q) + (1 - acceptance_rate(p, q)) * residual_distribution(p, q)
        np.testing.assert_allclose(out, p, atol=1e-12)


def test_batched_shapes_and_broadcasting():
    rng = np.random.default_rng(1)
    p = rng.dirichlet(np.ones(5), size=(3, 4))
    q = rng.dirichlet(np.ones(5), size=(4,))
    acc = acceptance_rate(p, q)
    assert acc.shape == (3, 4)
    np.testing.assert_allclose(acc[2, 1], acceptance_rate(p[2, 1], q[1]))
    assert kl_divergence(p, q).shape == (3, 4) and residual_distribution(p, q).shape == (3, 4, 5)


def test_kl_known_value():
    p, q = np.array([0.5, 0.5]), np.array([0.25, 0.75])
    expected = 0.5 * np.log(2) + 0.5 * np.log(0.5 / 0.75)
    assert float(kl_divergence(p, q)) == pytest.approx(expected, rel=1e-14)


def _exact_mss_output(p, q, m):
    """Output distribution of m-sibling recursive rejection sampling, computed by recursion."""
    out, reach, r = np.zeros_like(p), 1.0, p
    for _ in range(m):
        out += reach * np.minimum(r, q)
        reach *= 1 - np.minimum(r, q).sum()
        r = residual_distribution(r, q)
    return out + reach * r


@given(distribution_pairs(max_vocab=30))
def test_multidraft_siblings_lossless_and_consistent(pair):
    p, q = pair
    probs = multidraft_sibling_acceptance(p, q, 4)
    assert probs.shape == (4,) and np.all(probs >= -EPS) and probs.sum() <= 1 + 1e-9
    assert probs[0] == pytest.approx(float(acceptance_rate(p, q)), abs=1e-12)
    np.testing.assert_allclose(_exact_mss_output(p, q, 4), p, atol=1e-9)
    # more siblings never lower the chance that some draft is accepted
    assert multidraft_sibling_acceptance(p, q, 5).sum() >= probs.sum() - 1e-12


def test_multidraft_siblings_match_monte_carlo():
    """Simulate recursive rejection sampling with i.i.d. drafts; per-sibling frequencies."""
    p, q = np.array([0.5, 0.3, 0.15, 0.05]), np.array([0.1, 0.2, 0.3, 0.4])
    m, n = 3, 40_000
    rng = np.random.default_rng(123)
    counts = np.zeros(m + 1, dtype=int)
    active = np.ones(n, dtype=bool)  # trials whose siblings so far were all rejected
    r = p
    for j in range(m):  # the residual after j rejections does not depend on the trial
        x = rng.choice(4, size=n, p=q)
        accepted = active & (rng.random(n) < np.minimum(1.0, r[x] / q[x]))
        counts[j] = accepted.sum()
        active &= ~accepted
        r = residual_distribution(r, q)
    counts[m] = active.sum()
    expected = multidraft_sibling_acceptance(p, q, m)
    expected = np.append(expected, 1 - expected.sum())
    assert stats.chisquare(counts, expected * n).pvalue > 1e-4


@pytest.mark.parametrize("bad, message", [
    ([0.5, -0.1, 0.6], "negative"),
    ([0.5, 0.6], "sum to 1"),
    ([np.nan, 1.0], "NaN"),
    (0.5, "at least 1 dimension"),
    (np.zeros((2, 0)), "empty vocabulary"),
])
def test_validate_distribution_rejects(bad, message):
    with pytest.raises(ValueError, match=message):
        validate_distribution(bad)


def test_validate_distribution_accepts_and_converts():
    out = validate_distribution([[1, 0], [0.5, 0.5 + 5e-7]], name="q_draft")
    assert out.dtype == np.float64 and out.shape == (2, 2)
    with pytest.raises(ValueError, match="q_draft .* batch index \\(1,\\)"):
        validate_distribution([[1, 0], [0.5, 0.6]], name="q_draft")
    validate_distribution(np.full((3, 2), 0.5).T, axis=0)


@pytest.mark.parametrize("func", [acceptance_rate, total_variation, kl_divergence,
                                  residual_distribution])
def test_pair_functions_reject_mismatch(func):
    with pytest.raises(ValueError, match="mismatched vocabularies"):
        func([0.5, 0.5], [0.2, 0.3, 0.5])
    with pytest.raises(ValueError, match="do not broadcast"):
        func(np.full((2, 2), 0.5), np.full((3, 2), 0.5))
    with pytest.raises(ValueError, match="p_target"):
        func([0.5, np.nan], [0.5, 0.5])
    with pytest.raises(ValueError, match="q_draft"):
        func([0.5, 0.5], [1.5, -0.5])


def test_multidraft_rejects_bad_count():
    with pytest.raises(ValueError, match="num_siblings"):
        multidraft_sibling_acceptance([1.0], [1.0], -1)
    with pytest.raises(ValueError, match="num_siblings"):
        multidraft_sibling_acceptance([1.0], [1.0], 1.5)


@given(probability_vectors())
def test_probability_vectors_strategy_is_valid(p):
    validate_distribution(p)
