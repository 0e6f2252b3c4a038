"""Simulated tokens per round vs the theory; Lemma 1 and Theorem 1 on simulated streams."""
from __future__ import annotations

import numpy as np
import pytest

from specloop.sim.costs import LinearCost
from specloop.sim.drafts import NoisyDraft, ParametricDraft
from specloop.sim.engine import run_chain, speedup_vs_autoregressive
from specloop.sim.rounds import simulate_chain_tables, simulate_iid_chain
from specloop.sim.streams import SCENARIOS, make_stream
from specloop.sim.trees import simulate_tree_tables, theory_tokens_tree
from specloop.strategies.base import DraftPlan, TreePlan
from specloop.theory import (acceptance_rate, expected_tokens_chain, lemma1_bounds,
                             theorem1_bounds)

Z = 4.0  # tolerance in standard errors


class FixedPlan:
    """Minimal fixed-k policy for these tests (the real FixedK lives in strategies)."""

    def __init__(self, k: int, tree: TreePlan | None = None):
        self.k, self.tree, self.observed = k, tree, []

    def plan(self, state):
        return DraftPlan(self.k, self.tree)

    def observe(self, record):
        self.observed.append(record.round_index)


class PlainSGD:
    def __init__(self, lr: float):
        self.lr = lr

    def step(self, params, grads, loss):
        return [w - self.lr * g for w, g in zip(params, grads)]


def _within(mean, se, theory):
    assert abs(mean - theory) <= Z * se + 1e-12, (mean, se, theory)


@pytest.mark.parametrize("acc", [0.0, 0.3, 0.7, 0.95, 1.0])
@pytest.mark.parametrize("k", [0, 1, 4, 10])
def test_iid_fast_path_matches_theory(acc, k):
    batch = simulate_iid_chain(acc, k, 20000, np.random.default_rng(int(acc * 100) + k))
    _within(batch.mean_tokens_per_round(), batch.standard_error(),
            float(expected_tokens_chain(acc, k)))


def test_full_vocab_chain_matches_theory_on_iid_stream():
    stream = make_stream("stationary", 500, 20000, seed=0, num_contexts=8, iid=True)
    q = NoisyDraft(stream, noise=1.5).q_table(0)
    p = stream.target_table(0)
    batch = simulate_chain_tables(p, q, stream.contexts, 5, np.random.default_rng(0), iid=True)
    theory = expected_tokens_chain(acceptance_rate(p, q)[stream.contexts], 5).mean()
    _within(batch.mean_tokens_per_round(), batch.standard_error(), theory)
    assert 0.2 < batch.acceptance_rate() < 0.95


def test_correlated_chain_acceptance_matches_position_rates():
    """Non-iid positions (the next context follows the drafted token): each verified
    position is accepted with probability Acc_i given the past, so accepted - sum of
    the verified positions' Acc_i has mean 0 (optional stopping)."""
    stream = make_stream("stationary", 300, 20000, seed=1, num_contexts=16)
    q = NoisyDraft(stream, noise=1.5).q_table(0)
    batch = simulate_chain_tables(stream.target_table(0), q, stream.contexts, 4,
                                  np.random.default_rng(1))
    diff = batch.accepted - np.nansum(batch.position_acceptance, axis=1)
    _within(diff.mean(), diff.std(ddof=1) / np.sqrt(diff.size), 0.0)
    verified = (~np.isnan(batch.position_acceptance)).sum(axis=1)
    np.testing.assert_array_equal(verified, np.minimum(batch.accepted + 1, 4))


@pytest.mark.parametrize("plan, proposal, mode", [
    (TreePlan(branching=(3, 2, 1)), "iid", "sampling"),
    (TreePlan(branching=(2, 2, 2)), "deterministic", "sampling"),
    (TreePlan(top_k=3, max_depth=4, verify_size=12), "deterministic", "sampling"),
    (TreePlan(branching=(4, 2)), "deterministic", "greedy"),
])
def test_tree_matches_theory(plan, proposal, mode):
    rng = np.random.default_rng(3)
    p, q = rng.dirichlet(np.full(40, 0.3)), rng.dirichlet(np.full(40, 0.3))
    q = 0.5 * q + 0.5 * p
    batch = simulate_tree_tables(p, q, np.zeros(4000, np.int64), plan, rng, mode, True, proposal)
    _within(batch.mean_tokens_per_round(), batch.standard_error(),
            theory_tokens_tree(p, q, plan, mode, proposal))


def test_engine_matches_theory_and_calls_policy_in_order():
    stream = make_stream("stationary", 200, 3000, seed=2, num_contexts=4, iid=True)
    draft = NoisyDraft(stream, noise=1.0)
    policy = FixedPlan(3)
    trace = run_chain(stream, draft, policy, rng=0, cost_model=LinearCost(0.1, 1.0))
    assert policy.observed == list(range(3000))
    acc = acceptance_rate(stream.target_table(0), draft.q_table(0))[stream.contexts]
    n = trace.column("tokens_per_round")
    _within(n.mean(), n.std(ddof=1) / np.sqrt(n.size), expected_tokens_chain(acc, 3).mean())
    record = trace[0]
    assert record.verified_tokens == 4 and record.draft_time == pytest.approx(0.3)
    assert record.verify_time == 1.0 and record.target_time == 1.0


def _regret_run(scenario, draft_kind, rounds=1500, k=4, seed=0):
    stream = make_stream(scenario, 300, rounds, seed=seed, num_contexts=6, iid=True)
    cost = LinearCost(draft_time=0.1, target_time=1.0)
    if draft_kind == "learned":
        draft = ParametricDraft(300, 6, rank=2)
        params = draft.init_params(np.random.default_rng(seed))
        trace = run_chain(stream, draft, FixedPlan(k), rng=seed, cost_model=cost, params=params,
                          learner=PlainSGD(0.5))
        entropy = np.array([-(p[p > 0] * np.log(p[p > 0])).sum()
                            for p in (stream.target(t) for t in range(rounds))])
        kl = trace.column("loss") - entropy  # f_t(w_t) - f_t(w*_t), OnlineSpec Eq. (4)
    else:
        draft = NoisyDraft(stream, noise=0.05)
        trace = run_chain(stream, draft, FixedPlan(k), rng=seed, cost_model=cost)
        kl = np.array([_kl(stream.target(t), draft.q_draft(t, stream.context(t)))
                       for t in range(rounds)])
    return trace, float(kl.sum()), cost


def _kl(p, q):
    s = p > 0
    return float((p[s] * np.log(p[s] / q[s])).sum())


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_lemma1_and_theorem1_on_simulated_streams(scenario):
    """Committed reading (n_t = accepted + 1): both bounds hold."""
    k = 4
    trace, regret, cost = _regret_run(scenario, "learned", k=k)
    rounds = len(trace)
    n = trace.column("tokens_per_round")
    se_sum = n.std(ddof=1) * np.sqrt(rounds)
    lower, upper = lemma1_bounds(regret, rounds, k)
    assert n.sum() <= upper
    assert n.sum() >= lower - Z * se_sum
    gamma = speedup_vs_autoregressive(trace, cost)
    g_lower, g_upper = theorem1_bounds(regret, rounds, k, cost.cost_ratio)
    scale = 1.0 / (rounds * (cost.cost_ratio * k + 1.0))
    assert gamma == pytest.approx(n.sum() * scale)  # Eq. (7)
    assert g_lower - Z * se_sum * scale <= gamma <= g_upper


@pytest.mark.parametrize("scenario", ["stationary", "smooth"])
def test_lemma1_needs_the_committed_reading(scenario):
    """Accepted reading (Algorithm 1's n_t, accepted drafts only): the upper bound
    holds but the lower bound fails for a near-perfect draft; the bound shifted by
    the T bonus tokens holds. Theorem 1 behaves the same way."""
    k = 4
    trace, regret, cost = _regret_run(scenario, "noisy", k=k)
    rounds = len(trace)
    accepted = trace.column("accepted_tokens")
    se_sum = accepted.std(ddof=1) * np.sqrt(rounds)
    lower, upper = lemma1_bounds(regret, rounds, k)
    assert accepted.sum() <= upper
    assert accepted.sum() + Z * se_sum < lower  # literal Lemma 1 fails under this reading
    assert accepted.sum() >= lower - rounds - Z * se_sum
    g_lower, g_upper = theorem1_bounds(regret, rounds, k, cost.cost_ratio)
    scale = 1.0 / (rounds * (cost.cost_ratio * k + 1.0))
    gamma_accepted = accepted.sum() * scale
    assert gamma_accepted + Z * se_sum * scale < g_lower <= g_upper
