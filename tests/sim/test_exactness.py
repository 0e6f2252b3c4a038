"""Committed tokens are distributed as p (chi-square).

Chain speculative sampling and tree verification (every proposal), including one-hot,
p == q, disjoint supports, q missing part of p's support and V = 2; plus negative
controls showing the same test catches a wrong kernel.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from specloop.sim import _kernels as K
from specloop.sim.rounds import prepare_tables, simulate_chain_tables
from specloop.sim.trees import build_tree, simulate_tree_tables
from specloop.strategies.base import TreePlan
from tests.sim._stats import ALPHA, chi_square_pvalue, min_pvalue_by_context
from tests.strategies import REGIMES, distribution_pairs


def _case(name: str):
    """Hand-made (p, q) edge cases."""
    if name == "V=2":
        return np.array([0.3, 0.7]), np.array([0.8, 0.2])
    if name == "one-hot p":
        return np.array([0.0, 1.0, 0.0, 0.0]), np.array([0.25, 0.25, 0.25, 0.25])
    if name == "one-hot both, different":
        return np.array([1.0, 0.0, 0.0]), np.array([0.0, 0.0, 1.0])
    if name == "p == q":
        p = np.array([0.1, 0.2, 0.3, 0.4])
        return p, p.copy()
    if name == "disjoint":
        return np.array([0.5, 0.5, 0.0, 0.0]), np.array([0.0, 0.0, 0.3, 0.7])
    if name == "q missing support":
        return np.array([0.2, 0.2, 0.2, 0.2, 0.2]), np.array([0.5, 0.5, 0.0, 0.0, 0.0])
    raise KeyError(name)


CASES = ["V=2", "one-hot p", "one-hot both, different", "p == q", "disjoint", "q missing support"]


def _chain_pvalue(p, q, seed, rounds=3000, k=3, mode="sampling"):
    batch = simulate_chain_tables(p, q, np.zeros(rounds, dtype=np.int64), k,
                                  np.random.default_rng(seed), mode=mode, iid=True)
    tokens = batch.tokens[batch.tokens >= 0]
    return chi_square_pvalue(tokens, p), batch


@pytest.mark.parametrize("name", CASES)
def test_chain_commits_p_edge_cases(name):
    p, q = _case(name)
    pvalue, batch = _chain_pvalue(p, q, seed=1)
    assert pvalue > ALPHA
    if name == "p == q":
        assert (batch.accepted == 3).all()  # Acc = 1: every draft accepted
    if name in ("disjoint", "one-hot both, different"):
        assert (batch.accepted == 0).all()  # Acc = 0: every draft rejected


@settings(max_examples=30, deadline=None)
@given(pair=distribution_pairs(regimes=REGIMES, max_vocab=60), seed=st.integers(0, 2**31),
       k=st.integers(1, 5))
def test_chain_commits_p_hypothesis(pair, seed, k):
    p, q = pair
    pvalue, _ = _chain_pvalue(p, q, seed, rounds=1500, k=k)
    assert pvalue > ALPHA


def test_chain_commits_p_with_correlated_positions():
    rng = np.random.default_rng(5)
    C, V = 4, 12
    p_table = rng.dirichlet(np.full(V, 0.7), size=C)
    q_table = rng.dirichlet(np.full(V, 0.7), size=C)
    contexts = rng.integers(C, size=4000)
    batch = simulate_chain_tables(p_table, q_table, contexts, 4, rng, iid=False)
    assert min_pvalue_by_context(batch.tokens, contexts, p_table, iid=False) > ALPHA


def test_negative_control_correction_from_p_is_detected():
    """The same chi-square test rejects a kernel drawing the correction from p."""
    p, q = np.array([0.5, 0.3, 0.2]), np.array([0.1, 0.2, 0.7])
    t = prepare_tables(p, q)
    rounds, k = 3000, 3
    rng = np.random.default_rng(1)
    u = rng.random((rounds, k)), rng.random((rounds, k)), rng.random(rounds)
    outs = []
    # the wrong kernel's residual rows are those of p (tables and sampling blocks)
    wrong_blocks, wrong_guide = t.blocks.copy(), t.guide.copy()
    wrong_blocks[K.RESIDUAL], wrong_guide[K.RESIDUAL] = t.blocks[K.TARGET], t.guide[K.TARGET]
    right = (t.res_cdf, t.res_prob, t.blocks, t.guide)
    wrong = (t.p_cdf, t.p_table, wrong_blocks, wrong_guide)
    for res_cdf, res_prob, blocks, guide in (right, wrong):
        accepted = np.empty(rounds, np.int64)
        tokens = np.empty((rounds, k + 1), np.int64)
        acc = np.empty((rounds, k))
        K.chain_table_kernel(t.p_table, t.q_table, t.p_cdf, t.q_cdf, res_cdf, res_prob,
                             t.row_acc, t.p_argmax, t.q_argmax, blocks, guide,
                             np.zeros(rounds, np.int64), np.full(rounds, k, np.int64), True, False,
                             *u, accepted, tokens, acc)
        outs.append(chi_square_pvalue(tokens[tokens >= 0], p))
    assert outs[0] > ALPHA
    assert outs[1] < ALPHA


TREE_PLANS = [
    (TreePlan(branching=(3, 2, 1)), "iid"),
    (TreePlan(branching=(3, 2)), "without-replacement"),
    (TreePlan(branching=(2, 2, 2)), "deterministic"),
    (TreePlan(top_k=3, max_depth=3, verify_size=8), "deterministic"),
]


@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("plan, proposal", TREE_PLANS)
def test_tree_commits_p_edge_cases(name, plan, proposal):
    p, q = _case(name)
    batch = simulate_tree_tables(p, q, np.zeros(800, np.int64), plan,
                                 np.random.default_rng(2), "sampling", True, proposal)
    assert chi_square_pvalue(batch.tokens[batch.tokens >= 0], p) > ALPHA


@settings(max_examples=12, deadline=None)
@given(pair=distribution_pairs(max_vocab=40), seed=st.integers(0, 2**31),
       which=st.integers(0, len(TREE_PLANS) - 1))
def test_tree_commits_p_hypothesis(pair, seed, which):
    p, q = pair
    plan, proposal = TREE_PLANS[which]
    batch = simulate_tree_tables(p, q, np.zeros(600, np.int64), plan,
                                 np.random.default_rng(seed), "sampling", True, proposal)
    assert chi_square_pvalue(batch.tokens[batch.tokens >= 0], p) > ALPHA


def test_tree_commits_p_with_correlated_positions():
    rng = np.random.default_rng(7)
    C, V = 3, 10
    p_table = rng.dirichlet(np.full(V, 0.7), size=C)
    q_table = rng.dirichlet(np.full(V, 0.7), size=C)
    contexts = rng.integers(C, size=1500)
    batch = simulate_tree_tables(p_table, q_table, contexts, TreePlan(branching=(2, 2, 1)),
                                 rng, "sampling", False, "without-replacement")
    assert min_pvalue_by_context(batch.tokens, contexts, p_table, iid=False) > ALPHA


def test_negative_control_tree_with_wrong_proposal_is_detected():
    """Top-k (deterministic) siblings verified as if they were i.i.d. draws from q is
    not lossless; the same chi-square test detects it."""
    p, q = np.array([0.2, 0.4, 0.4]), np.array([0.6, 0.3, 0.1])
    rng = np.random.default_rng(3)
    rounds = 3000
    tree = build_tree(q[None, :], 0, TreePlan(branching=(2,)), rng, "sampling", True,
                      "deterministic")
    parent = np.tile(tree.parent, (rounds, 1))
    token = np.tile(tree.token, (rounds, 1))
    pvalues = []
    for proposal in (K.PROPOSAL_DETERMINISTIC, K.PROPOSAL_IID):  # right, wrong
        accepted = np.empty(rounds, np.int64)
        tokens = np.empty((rounds, 2), np.int64)
        K.tree_verify_kernel(p[None, :], q[None, :], parent, token, np.zeros_like(parent),
                             np.full(rounds, 2), proposal, False, rng.random((rounds, 3)),
                             rng.random(rounds), np.empty(3), accepted, tokens)
        pvalues.append(chi_square_pvalue(tokens[:, 0], p))
    assert pvalues[0] > ALPHA
    assert pvalues[1] < ALPHA


def test_greedy_chain_and_tree_commit_the_argmax():
    p, q = np.array([0.1, 0.6, 0.3]), np.array([0.2, 0.5, 0.3])
    _, batch = _chain_pvalue(p, q, 0, rounds=50, mode="greedy")
    assert (batch.tokens[batch.tokens >= 0] == 1).all() and (batch.accepted == 3).all()
    tb = simulate_tree_tables(p, q, np.zeros(20, np.int64), TreePlan(branching=(2, 2)),
                              np.random.default_rng(0), "greedy", True)
    assert (tb.tokens == 1).all() and (tb.accepted == 2).all()
