"""Expected tokens per round: chain, per-position and tree formulas."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from scipy import stats

from specloop.theory import (acceptance_rate, expected_tokens_chain, expected_tokens_positional,
                             expected_tokens_tree, multidraft_sibling_acceptance,
                             residual_distribution)
from tests.strategies import acceptance_rates, num_draft_tokens


@given(acceptance_rates(), num_draft_tokens())
def test_chain_tokens_in_range(acc, k):
    tokens = float(expected_tokens_chain(acc, k))
    assert 1.0 - 1e-12 <= tokens <= k + 1 + 1e-9
    assert float(expected_tokens_chain(acc, k, "accepted")) == pytest.approx(tokens - 1, abs=1e-9)
    appendix = float(expected_tokens_chain(acc, k, "appendix"))
    assert min(k, 1) - 1e-12 <= appendix <= k + 1e-9


@given(acceptance_rates(), acceptance_rates(), num_draft_tokens())
def test_chain_monotone_in_acceptance(a, b, k):
    lo, hi = sorted((a, b))
    assert float(expected_tokens_chain(lo, k)) <= float(expected_tokens_chain(hi, k)) + 1e-12


def test_chain_closed_form_and_limits():
    assert float(expected_tokens_chain(0.5, 3)) == pytest.approx(1 + 0.5 + 0.25 + 0.125)
    assert float(expected_tokens_chain(1.0, 4)) == 5.0
    assert float(expected_tokens_chain(1.0, 4, "appendix")) == 4.0
    assert float(expected_tokens_chain(0.0, 4)) == 1.0
    assert float(expected_tokens_chain(0.7, 0)) == 1.0
    assert float(expected_tokens_chain(1 - 1e-12, 10)) == pytest.approx(11.0, rel=1e-9)
    # round-off within 1e-12 of [0, 1] is clipped, anything further raises
    assert float(expected_tokens_chain(1 + 1e-13, 3)) == 4.0
    with pytest.raises(ValueError, match="acceptance_rate"):
        expected_tokens_chain(1 + 1e-9, 3)
    grid = expected_tokens_chain(np.array([[0.2], [0.9]]), np.arange(4))
    assert grid.shape == (2, 4)


@given(st.lists(st.floats(0, 1), min_size=0, max_size=12), st.floats(0, 1))
def test_positional_reduces_to_chain(rates, acc):
    k = len(rates)
    assert float(expected_tokens_positional(np.full(k, acc))) == pytest.approx(
        float(expected_tokens_chain(acc, k)), rel=1e-12, abs=1e-12)
    tokens = float(expected_tokens_positional(np.array(rates, dtype=float).reshape(k)))
    assert 1.0 <= tokens <= k + 1 + 1e-12


@given(st.integers(0, 10), st.floats(0, 1))
def test_tree_chain_reduces_to_chain(k, acc):
    parents = np.arange(k) - 1
    assert float(expected_tokens_tree(parents, np.full(k, acc))) == pytest.approx(
        float(expected_tokens_chain(acc, k)), rel=1e-12)


def _full_tree(depth, width):
    parents, level = [], [-1]
    for _ in range(depth):
        nxt = []
        for par in level:
            for _ in range(width):
                parents.append(par)
                nxt.append(len(parents) - 1)
        level = nxt
    return np.array(parents)


def test_tree_multidraft_iid_matches_recursion():
    """Full m-ary tree with i.i.d. p/q at every node (Assumption 1): E = 1 + s + s^2 + ...,

    s = total probability that some sibling is accepted; each node's children carry the
    per-sibling probabilities of `multidraft_sibling_acceptance`.
    """
    p, q = np.array([0.6, 0.3, 0.1]), np.array([0.2, 0.5, 0.3])
    width, depth = 3, 3
    sib = multidraft_sibling_acceptance(p, q, width)
    parents = _full_tree(depth, width)
    probs = np.tile(sib, len(parents) // width)
    s = sib.sum()
    assert float(expected_tokens_tree(parents, probs)) == pytest.approx(1 + s + s ** 2 + s ** 3)
    # one sibling per node is the chain
    assert float(expected_tokens_tree(_full_tree(3, 1), np.full(3, sib[0]))) == pytest.approx(
        float(expected_tokens_chain(acceptance_rate(p, q), 3)))


def test_tree_batched_and_greedy_semantics():
    parents = np.array([-1, -1, 0, 0, 2])
    probs = np.array([[0.6, 0.3, 0.5, 0.4, 1.0], [0.0, 0.0, 0.0, 0.0, 0.0]])
    expected = 1 + 0.6 + 0.3 + 0.6 * 0.5 + 0.6 * 0.4 + 0.6 * 0.5
    np.testing.assert_allclose(expected_tokens_tree(parents, probs), [expected, 1.0])


def _simulate_chain(p, q, k, rounds, rng):
    """Algorithm 1 of OnlineSpec / Leviathan et al. with i.i.d. positions; committed tokens."""
    vocab = p.size
    drafts = rng.choice(vocab, size=(rounds, k), p=q)
    accept = rng.random((rounds, k)) < np.minimum(1.0, p[drafts] / q[drafts])
    accepted = np.where(accept.all(axis=1), k, np.argmin(accept, axis=1))
    return accepted + 1


def test_chain_formula_matches_simulation():
    rng = np.random.default_rng(7)
    p, q = np.array([0.5, 0.25, 0.15, 0.1]), np.array([0.3, 0.3, 0.2, 0.2])
    k, rounds = 5, 40_000
    committed = _simulate_chain(p, q, k, rounds, rng)
    expected = float(expected_tokens_chain(acceptance_rate(p, q), k))
    z = stats.norm.ppf(1 - 1e-4 / 2)  # two-sided, false-alarm rate 1e-4
    assert abs(committed.mean() - expected) <= z * committed.std(ddof=1) / np.sqrt(rounds)
    assert residual_distribution(p, q).sum() == pytest.approx(1.0)


@pytest.mark.parametrize("acc, k, message", [
    (-0.1, 2, "acceptance_rate"), (1.1, 2, "acceptance_rate"), (np.nan, 2, "NaN"),
    (0.5, -1, "num_draft_tokens"), (0.5, np.inf, "num_draft_tokens"),
])
def test_chain_rejects(acc, k, message):
    with pytest.raises(ValueError, match=message):
        expected_tokens_chain(acc, k)


def test_chain_rejects_unknown_convention():
    with pytest.raises(ValueError, match="convention"):
        expected_tokens_chain(0.5, 2, "bonus")


def test_positional_and_tree_reject():
    with pytest.raises(ValueError, match="acceptance_rates"):
        expected_tokens_positional([0.5, 1.5])
    with pytest.raises(ValueError, match="last axis"):
        expected_tokens_positional(0.5)
    with pytest.raises(ValueError, match="earlier node"):
        expected_tokens_tree([0, -1], [0.5, 0.5])
    with pytest.raises(ValueError, match="shape"):
        expected_tokens_tree([-1, 0], [0.5])
    with pytest.raises(ValueError, match="sum to more than 1"):
        expected_tokens_tree([-1, -1], [0.7, 0.6])
    with pytest.raises(ValueError, match="1-D"):
        expected_tokens_tree([[-1]], [0.5])
