"""Every Numba kernel agrees with its NumPy reference for the same uniforms."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, settings, strategies as st

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
    rounds = 2 * K.ROUND_BLOCK + 13  # several round blocks, the last one partial
    ctx = rng.integers(C, size=rounds)
    k = rng.integers(0, kmax + 1, size=rounds)
    u = rng.random((rounds, kmax)), rng.random((rounds, kmax)), rng.random(rounds)
    if kmax:
        u[0][:5, 0] = [0.0, np.nextafter(1.0, 0.0), 0.5, 1e-300, 1.0 - 1e-12]
    u[2][:5] = [0.0, np.nextafter(1.0, 0.0), 0.5, 1e-300, 1.0 - 1e-12]
    outs = []
    for impl in (K, R):
        out = (np.empty(rounds, np.int64), np.empty((rounds, kmax + 1), np.int64),
               np.empty((rounds, kmax)))
        impl.chain_table_kernel(*t.kernel_tables(), ctx, k, iid, greedy, *u, *out)
        outs.append(out)
    for a, b in zip(*outs):
        np.testing.assert_array_equal(a, b)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31), vocab=st.integers(2, 400), zeros=st.floats(0.0, 0.95),
       concentration=st.sampled_from([0.01, 0.3, 3.0]))
def test_chain_table_kernel_matches_reference_large_vocab(seed, vocab, zeros, concentration):
    """Rows with many zero or tiny entries (draws that leave their start line, run
    into the padding, or need the whole-row fallback), several contexts, correlated
    positions."""
    rng = np.random.default_rng(seed)
    C = 3
    tables = []
    for _ in range(2):
        rows = rng.dirichlet(np.full(vocab, concentration), size=C)
        rows[rng.random((C, vocab)) < zeros] = 0.0
        rows[rows.sum(axis=1) == 0, 0] = 1.0
        tables.append(rows / rows.sum(axis=1, keepdims=True))
    t = prepare_tables(*tables)
    rounds, kmax = 300, 5
    ctx = rng.integers(C, size=rounds)
    k = rng.integers(0, kmax + 1, size=rounds)
    u = rng.random((rounds, kmax)), rng.random((rounds, kmax)), rng.random(rounds)
    outs = []
    for impl in (K, R):
        out = (np.empty(rounds, np.int64), np.empty((rounds, kmax + 1), np.int64),
               np.empty((rounds, kmax)))
        impl.chain_table_kernel(*t.kernel_tables(), ctx, k, False, False, *u, *out)
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


# found by Hypothesis in CI: after q's two heavy tokens are drawn, 1 - (their mass)
# cancels to 0.0 although ~1e-25 of q is left (the kernel divided by zero)
EXHAUSTED_HEAD = (np.array([[0., 0., 0., 0., 0., 1., 0.]]),
                  np.array([[8.70713892e-001, 8.70357118e-038, 1.25066987e-025, 4.02024765e-153,
                             1.29286108e-001, 5.38812854e-055, 1.05181753e-032]]))


@pytest.mark.parametrize("proposal", sorted(PROPOSALS))
@pytest.mark.parametrize("greedy", [False, True])
@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 2**31), iid=st.booleans(),
       tables=context_tables(max_contexts=3, max_vocab=12))
@example(seed=0, iid=False, tables=EXHAUSTED_HEAD)
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


def _one_row_tables(probs):
    """prepare_tables for q = probs (p = probs too): rows DRAFT, TARGET of context 0."""
    return prepare_tables(probs, probs)


def test_sample_cdf_never_returns_zero_probability_tokens():
    probs = np.array([0.0, 0.5, 0.0, 0.5, 0.0])
    cdf = np.cumsum(probs)
    t = _one_row_tables(probs)
    for u in (0.0, 0.25, 0.5, 0.75, np.nextafter(1.0, 0.0)):
        i = K._sample_cdf(cdf, probs, u)
        assert probs[i] > 0 and i == R._sample_cdf(cdf, probs, u)
        for d in (K.DRAFT, K.TARGET):
            assert K._sample_blocked(t.blocks, t.guide, d, 0, t.q_table, u) == i


def test_sampling_tables_hold_the_plain_cumulative_sums():
    """The kernel's tables are built in one Numba pass; the CDFs the reference
    searches are exactly ``np.cumsum`` of the rows and the blocks hold copies."""
    rng = np.random.default_rng(0)
    p, q = rng.dirichlet(np.full(37, 0.4), size=(2, 3))
    p[0, :5] = 0.0
    p /= p.sum(axis=1, keepdims=True)
    t = prepare_tables(p, q)
    res = np.maximum(p - q, 0.0)
    for got, want in ((t.p_cdf, np.cumsum(p, axis=1)), (t.q_cdf, np.cumsum(q, axis=1)),
                      (t.res_prob, res), (t.res_cdf, np.cumsum(res, axis=1))):
        np.testing.assert_array_equal(got, want)
    V = p.shape[1]
    line = K.LINE
    padded = np.arange(V + 1)
    at = (padded // line) * 2 * line + padded % line
    for d, cdf, values in ((K.DRAFT, t.q_cdf, np.where(q > 0, p / np.where(q > 0, q, 1), 0)),
                           (K.TARGET, t.p_cdf, p), (K.RESIDUAL, t.res_cdf, res)):
        np.testing.assert_array_equal(t.blocks[d][:, at[1:]], cdf)
        np.testing.assert_array_equal(t.blocks[d][:, at[1:] + line], values)
        assert (t.blocks[d][:, 0] == 0).all()
        assert np.isinf(t.blocks[d][:, (V + 1) // line * 2 * line + (V + 1) % line]).all()
    assert t.blocks.ctypes.data % 128 == 0
    # the guide (only a starting point for the draws) is the Chen-Asau table
    for d, cdf in ((K.DRAFT, t.q_cdf), (K.TARGET, t.p_cdf), (K.RESIDUAL, t.res_cdf)):
        for c in range(cdf.shape[0]):
            steps = np.arange(V + 1) * (cdf[c, -1] / V)
            want = np.minimum(np.searchsorted(cdf[c], steps, side="right"), V - 1)
            assert np.abs(t.guide[d, c].astype(np.int64) - want).max() <= 1
            assert (np.diff(t.guide[d, c]) >= 0).all()


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31), vocab=st.integers(2, 300), zeros=st.floats(0.0, 0.95),
       tiny=st.booleans())
def test_blocked_sampling_equals_plain_binary_search(seed, vocab, zeros, tiny):
    rng = np.random.default_rng(seed)
    probs = rng.dirichlet(np.full(vocab, 0.3))
    probs[rng.random(vocab) < zeros] = 0.0
    if tiny:  # entries far below the rounding of the running sum
        probs[rng.random(vocab) < 0.3] = 1e-300
    if probs.sum() == 0:
        probs[0] = 1.0
    probs /= probs.sum()
    cdf = np.cumsum(probs)
    t = _one_row_tables(probs)
    u = np.concatenate([rng.random(300), [0.0, np.nextafter(1.0, 0.0), 1e-300, 0.5]])
    u = np.concatenate([u, cdf[:50] / cdf[-1], np.nextafter(cdf[:50] / cdf[-1], 0.0)])
    u = u[u < 1.0]
    for value in u:
        want = K._sample_cdf(cdf, probs, value)
        assert K._sample_blocked(t.blocks, t.guide, K.DRAFT, 0, t.q_table, value) == want


def test_blocked_sampling_with_a_wrong_start_still_finds_the_token():
    """The guide only gives a start line: any start (too early, too late, past the
    end) still returns the inverse-CDF index (whole-row fallback)."""
    rng = np.random.default_rng(3)
    probs = rng.dirichlet(np.full(100, 0.2))
    cdf = np.cumsum(probs)
    t = _one_row_tables(probs)
    total = cdf[-1]
    for value in rng.random(200):
        want = K._sample_cdf(cdf, probs, value)
        for line in (0, 3, (100 + 1) // K.LINE):
            got = K._find_in_blocks(t.blocks, K.DRAFT, 0, line, value * total, 100)
            assert got == want


@pytest.mark.parametrize("chunk", [1, 7, 4096])
def test_simulate_chain_tables_chunks_match_reference(monkeypatch, chunk):
    """The wrapper draws its uniforms chunk by chunk (u_draft, u_accept, u_final per
    chunk of `UNIFORM_CHUNK_ROUNDS` rounds); replaying that order of draws through
    the reference over all rounds gives the same tokens, so no chunk boundary drops,
    repeats or misplaces a round (ragged k, last chunk partial)."""
    from specloop.sim import rounds as rounds_mod

    monkeypatch.setattr(rounds_mod, "UNIFORM_CHUNK_ROUNDS", chunk)
    rng = np.random.default_rng(3)
    p, q = rng.dirichlet(np.ones(40), size=3), rng.dirichlet(np.ones(40), size=3)
    t = prepare_tables(p, q)
    num_rounds = 53
    ctx, k = rng.integers(3, size=num_rounds), rng.integers(0, 5, size=num_rounds)
    batch = rounds_mod.simulate_chain_tables(None, None, ctx, k, np.random.default_rng(11),
                                             tables=t)
    replay, kmax = np.random.default_rng(11), int(k.max())
    u_draft, u_accept, u_final = (np.empty((num_rounds, kmax)), np.empty((num_rounds, kmax)),
                                  np.empty(num_rounds))
    for start in range(0, num_rounds, min(chunk, num_rounds)):
        stop = min(start + chunk, num_rounds)
        u_draft[start:stop] = replay.random((stop - start, kmax))
        u_accept[start:stop] = replay.random((stop - start, kmax))
        u_final[start:stop] = replay.random(stop - start)
    out = (np.empty(num_rounds, np.int64), np.empty((num_rounds, kmax + 1), np.int64),
           np.empty((num_rounds, kmax)))
    R.chain_table_kernel(*t.kernel_tables(), ctx, k, False, False, u_draft, u_accept, u_final,
                         *out)
    np.testing.assert_array_equal(batch.accepted, out[0])
    np.testing.assert_array_equal(batch.tokens, out[1])
    np.testing.assert_array_equal(batch.position_acceptance, out[2])
