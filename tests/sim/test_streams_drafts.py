"""Streams and the parametric draft."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from specloop.sim.drafts import ParametricDraft
from specloop.sim.streams import SCENARIOS, make_stream


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_stream_targets_are_distributions(scenario):
    stream = make_stream(scenario, vocab_size=50, rounds=40, seed=3, num_contexts=5)
    assert stream.vocab_size == 50 and stream.rounds == 40 and stream.num_contexts == 5
    for t in (0, 17, 39):
        p = stream.target(t)
        assert p.shape == (50,) and p.dtype == np.float64
        assert np.all(p >= 0) and abs(p.sum() - 1) < 1e-12
        assert 0 <= stream.context(t) < 5


def test_stream_is_deterministic_in_seed():
    a = make_stream("smooth", 30, 20, seed=1)
    b = make_stream("smooth", 30, 20, seed=1)
    c = make_stream("smooth", 30, 20, seed=2)
    assert np.array_equal(a.target(7), b.target(7))
    assert not np.array_equal(a.target(7), c.target(7))


def test_scenarios_drift_as_described():
    stat = make_stream("stationary", 40, 100, seed=0, num_contexts=1)
    assert np.array_equal(stat.target(0), stat.target(99))
    piece = make_stream("piecewise", 40, 100, seed=0, num_contexts=1, segment_length=10)
    assert np.array_equal(piece.target(0), piece.target(9))
    assert not np.allclose(piece.target(0), piece.target(10))
    smooth = make_stream("smooth", 40, 1000, seed=0, num_contexts=1)
    fast = make_stream("fast", 40, 1000, seed=0, num_contexts=1)
    step_smooth = np.abs(smooth.target(1) - smooth.target(0)).sum()
    step_fast = np.abs(fast.target(1) - fast.target(0)).sum()
    assert step_fast > 10 * step_smooth > 0
    rl = make_stream("trained-target", 40, 200, seed=0, num_contexts=1, rl_step_size=0.1)
    # the policy concentrates on rewarded tokens: its reward mass grows monotonically
    reward = rl._reward[0]
    masses = [float(rl.target(t) @ reward) for t in (0, 50, 100, 199)]
    assert all(b > a for a, b in zip(masses, masses[1:]))


def test_zipf_shape_and_temperature():
    hot = make_stream("stationary", 1000, 1, seed=0, num_contexts=1, temperature=2.0)
    cold = make_stream("stationary", 1000, 1, seed=0, num_contexts=1, temperature=0.5)
    sorted_p = np.sort(cold.target(0))[::-1]
    ratio = sorted_p[0] / sorted_p[9]  # (1 + 9)^(s / T) for ranks 0 and 9
    assert ratio == pytest.approx(10 ** (1.1 / 0.5), rel=1e-9)
    assert cold.target(0).max() > hot.target(0).max()


def test_chain_correlation_and_iid_option():
    stream = make_stream("stationary", 64, 5, seed=0, num_contexts=8)
    iid = make_stream("stationary", 64, 5, seed=0, num_contexts=8, iid=True)
    assert np.array_equal(iid.target_at(0, [3, 5]), iid.target(0))
    nexts = {stream.context_at(0, [x]) for x in range(64)}
    assert len(nexts) > 1  # the next position depends on the drafted token


@pytest.mark.parametrize("kwargs, match", [
    (dict(scenario="nope"), "unknown scenario"),
    (dict(vocab_size=1), "vocab_size"),
    (dict(vocab_size=70000), "vocab_size"),
    (dict(rounds=0), "rounds"),
    (dict(temperature=0.0), "temperature"),
    (dict(bogus=1), "unknown stream options"),
])
def test_stream_bad_input(kwargs, match):
    args = dict(scenario="stationary", vocab_size=10, rounds=5, seed=0) | kwargs
    with pytest.raises(ValueError, match=match):
        make_stream(**args)
    with pytest.raises(ValueError, match="round index"):
        make_stream("stationary", 10, 5, 0).target(5)


@settings(max_examples=25, deadline=None)
@given(vocab=st.integers(2, 30), contexts=st.integers(1, 5), rank=st.integers(0, 3),
       seed=st.integers(0, 2**31 - 1), temperature=st.floats(0.5, 2.0))
def test_draft_gradient_matches_finite_differences(vocab, contexts, rank, seed, temperature):
    rng = np.random.default_rng(seed)
    draft = ParametricDraft(vocab, contexts, rank, init_scale=0.5, temperature=temperature)
    params = draft.init_params(rng)
    params[2] = rng.standard_normal(vocab)
    p = rng.dirichlet(np.ones(vocab))
    c = int(rng.integers(contexts))
    loss, grads = draft.loss_and_grad(params, c, p)
    entropy = -(p * np.log(p)).sum()
    assert loss == pytest.approx(draft.kl(params, c, p) + entropy, rel=1e-9, abs=1e-12)
    eps = 1e-6
    for i, arr in enumerate(params):
        flat = arr.reshape(-1)
        for j in rng.choice(flat.size, size=min(flat.size, 6), replace=False) if flat.size else []:
            old = flat[j]
            flat[j] = old + eps
            up, _ = draft.loss_and_grad(params, c, p)
            flat[j] = old - eps
            down, _ = draft.loss_and_grad(params, c, p)
            flat[j] = old
            assert grads[i].reshape(-1)[j] == pytest.approx((up - down) / (2 * eps), abs=1e-6)


def test_draft_shapes_capacity_and_learning():
    draft = ParametricDraft(vocab_size=40, num_contexts=8, rank=2)
    assert draft.has_capacity_gap and draft.num_parameters < 8 * 40
    rng = np.random.default_rng(0)
    params = draft.init_params(rng)
    q = draft.q_draft(params, 3)
    assert q.shape == (40,) and abs(q.sum() - 1) < 1e-12
    assert np.allclose(draft.q_table(params)[3], q)
    stream = make_stream("stationary", 40, 1, seed=0, num_contexts=8)
    table = stream.target_table(0)
    kl0 = np.mean([draft.kl(params, c, table[c]) for c in range(8)])
    for _ in range(300):  # plain gradient descent lowers the loss but cannot reach 0
        for c in range(8):
            _, grads = draft.loss_and_grad(params, c, table[c])
            params = [a - 0.5 * g for a, g in zip(params, grads)]
    kl1 = np.mean([draft.kl(params, c, table[c]) for c in range(8)])
    assert kl1 < 0.5 * kl0 and kl1 > 1e-3


def test_draft_bad_input():
    draft = ParametricDraft(10, 3, 1)
    params = draft.init_params(np.random.default_rng(0))
    with pytest.raises(ValueError, match="context"):
        draft.q_draft(params, 3)
    with pytest.raises(ValueError, match="sums to"):
        draft.loss_and_grad(params, 0, np.full(10, 0.2))
    with pytest.raises(ValueError, match="NaN"):
        draft.kl(params, 0, np.full(10, np.nan))
    with pytest.raises(ValueError, match="shape"):
        draft.q_draft([params[0], params[1], np.zeros(9)], 0)
    with pytest.raises(ValueError, match="rank"):
        ParametricDraft(10, 3, -1)
