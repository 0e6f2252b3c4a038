"""Every Numba kernel agrees with its NumPy reference for the same uniforms."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from specloop.sim import _kernels as K
from specloop.sim import _reference as R
from specloop.sim.rounds import prepare_tables
from specloop.sim.trees import PROPOSALS, build_tree
from specloop.strategies.base import TreePlan
from tests.strategies import context_tables, distribution_pairs


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31), kmax=st.integers(0, 12))
def test_iid_kernel_matches_reference(seed, kmax):
    rng = np.random.default_rng(seed)
    rounds = 200
    acc = rng.random(rounds)
    acc[:10] = [0.0, 1.0, 0.5, 1e-9, 1 - 1e-9, 0.0, 1.0, 0.3, 0.9, 0.99]
    k = rng.integers(0, kmax + 1, size=rounds)
    u = 1.0 - rng.random(rounds)
    out_k, out_r = np.empty(rounds, np.int64), np.empty(rounds, np.int64)
    K.iid_chain_kernel(acc, k, u, out_k)
    R.iid_chain_kernel(acc, k, u, out_r)
    np.testing.assert_array_equal(out_k, out_r)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31), kmax=st.integers(0, 6), iid=st.booleans(),
       greedy=st.booleans(), tables=context_tables(max_contexts=4, max_vocab=30))
def test_chain_table_kernel_matches_reference(seed, kmax, iid, greedy, tables):
    rng = np.random.default_rng(seed)
    t = prepare_tables(*tables)
    C = t.num_contexts
    rounds = 60
    ctx = rng.integers(C, size=rounds)
    k = rng.integers(0, kmax + 1, size=rounds)
    u = rng.random((rounds, kmax)), rng.random((rounds, kmax)), rng.random(rounds)
    outs = []
    for impl in (K, R):
        out = (np.empty(rounds, np.int64), np.empty((rounds, kmax + 1), np.int64),
               np.empty((rounds, kmax)))
        impl.chain_table_kernel(t.p_table, t.q_table, t.p_cdf, t.q_cdf, t.res_cdf, t.res_prob,
                                t.p_guide, t.q_guide, t.res_guide, t.row_acc, ctx, k, iid, greedy, t.p_argmax, t.q_argmax, *u, *out)
        outs.append(out)
    for a, b in zip(*outs):
        np.testing.assert_array_equal(a, b)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31), k=st.integers(0, 6), greedy=st.booleans(),
       pair=distribution_pairs(max_vocab=30))
def test_chain_rows_kernel_matches_reference(seed, k, greedy, pair):
    rng = np.random.default_rng(seed)
    p, q = pair
    V = p.size
    p_rows = np.vstack([p, rng.dirichlet(np.ones(V), size=k)])
    q_rows = np.vstack([q, rng.dirichlet(np.ones(V), size=k)])[:k]
    draft = np.array([rng.choice(V, p=row) for row in q_rows], dtype=np.int64)
    u_accept, u_final = rng.random(k), rng.random(1)
    results = []
    for impl in (K, R):
        tokens = np.empty(k + 1, np.int64)
        n = impl.chain_rows_kernel(p_rows, q_rows, draft, greedy, u_accept, u_final,
                                   np.empty(V), tokens)
        results.append((n, tokens))
    assert results[0][0] == results[1][0]
    np.testing.assert_array_equal(results[0][1], results[1][1])


@pytest.mark.parametrize("proposal", sorted(PROPOSALS))
@pytest.mark.parametrize("greedy", [False, True])
@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 2**31), iid=st.booleans(),
       tables=context_tables(max_contexts=3, max_vocab=12))
def test_tree_kernel_matches_reference(proposal, greedy, seed, iid, tables):
    rng = np.random.default_rng(seed)
    p_table, q_table = tables
    C, V, rounds = p_table.shape[0], p_table.shape[1], 40
    plan = TreePlan(branching=(3, 2, 2))
    trees = [build_tree(q_table, int(rng.integers(C)), plan, rng, "sampling", iid, proposal)
             for _ in range(rounds)]
    width = max(t.num_nodes for t in trees) + 1
    arrays = [np.full((rounds, width), -1, np.int64) for _ in range(3)]
    for r, tree in enumerate(trees):
        for arr, src in zip(arrays, (tree.parent, tree.token, tree.node_ctx)):
            arr[r, : src.size] = src
    arrays[2][arrays[2] < 0] = 0
    num_nodes = np.array([t.num_nodes for t in trees], np.int64)
    u = rng.random((rounds, width)), rng.random(rounds)
    outs = []
    for impl in (K, R):
        accepted, tokens = np.empty(rounds, np.int64), np.empty((rounds, 4), np.int64)
        impl.tree_verify_kernel(p_table, q_table, *arrays, num_nodes, PROPOSALS[proposal],
                                greedy, *u, np.empty(V), accepted, tokens)
        outs.append((accepted, tokens))
    np.testing.assert_array_equal(outs[0][0], outs[1][0])
    np.testing.assert_array_equal(outs[0][1], outs[1][1])


def test_sample_cdf_never_returns_zero_probability_tokens():
    probs = np.array([0.0, 0.5, 0.0, 0.5, 0.0])
    cdf = np.cumsum(probs)
    guide = K.guide_table(cdf[None, :])[0]
    for u in (0.0, 0.25, 0.5, 0.75, np.nextafter(1.0, 0.0)):
        i = K._sample_cdf(cdf, probs, u)
        assert probs[i] > 0 and i == R._sample_cdf(cdf, probs, u)
        assert K._sample_guided(cdf, guide, probs, u) == i


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**31), vocab=st.integers(2, 300), zeros=st.floats(0.0, 0.9))
def test_guided_search_equals_plain_binary_search(seed, vocab, zeros):
    rng = np.random.default_rng(seed)
    probs = rng.dirichlet(np.full(vocab, 0.3))
    probs[rng.random(vocab) < zeros] = 0.0
    if probs.sum() == 0:
        probs[0] = 1.0
    cdf = np.cumsum(probs)
    guide = K.guide_table(cdf[None, :])[0]
    u = np.concatenate([rng.random(200), [0.0, np.nextafter(1.0, 0.0)]])
    for value in u:
        assert K._sample_guided(cdf, guide, probs, value) == K._sample_cdf(cdf, probs, value)
