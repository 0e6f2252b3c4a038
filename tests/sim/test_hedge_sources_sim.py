"""Hedge over sources in the simulator (`specloop.sim.hedge_sources`): the played weights
against a plain NumPy loop over the losses resolved so far (delayed feedback included),
the delayed feedback against the uncensored truth, the expected regret within its bound
on every one of many fixed seeds and the realised regret within the bound plus an
Azuma-Hoeffding slack, the bound separating Hedge from a uniform chooser, Hedge beating
every source run alone when the best source changes between domains, and the drafting
time in the loss."""
from __future__ import annotations

import math

import numpy as np
import pytest

from specloop.sim.costs import load_cost_table
from specloop.sim.hedge_sources import (AcceptanceSource, SimSourcesEngine, SourceRequest,
                                        domain_shift_requests, run_sources)
from specloop.strategies.base import DraftPlan, TreePlan
from specloop.strategies.hedge_sources import hedge_regret_bound

K_DRAFT = 8
SEEDS = range(40)


@pytest.fixture(scope="module")
def cost():
    table = load_cost_table()
    return [float(table(n)) for n in range(1, 33)]


def _switching():
    return [AcceptanceSource("a", (0.9, 0.3), 1e-4), AcceptanceSource("b", (0.3, 0.9), 1e-4)]


def _reference_weights(engine) -> dict[int, np.ndarray]:
    """Plain loop: p_t = exp(-eta_t L) / sum, L = the loss vectors resolved before round
    t was played (resolved after round s was played -> known from round s + 1 on)."""
    k = len(engine.sources)
    out = {}
    for t in sorted(engine.played):
        cum = np.zeros(k)
        for _, losses, after in engine.resolved:
            if after < t:
                cum = cum + losses
        eta = math.sqrt(8 * math.log(k) / t)
        w = np.array([math.exp(-eta * (cum[i] - cum.min())) for i in range(k)])
        out[t] = w / w.sum()
    return out


def test_weights_equal_numpy_reference_with_delayed_feedback(cost):
    run = run_sources(_switching(), domain_shift_requests([0, 1], 6, 48), cost, K_DRAFT, seed=3)
    engine = run.engine
    ref = _reference_weights(engine)
    assert len(ref) == len(run.trace) > 100
    for t, p in engine.played.items():
        assert np.allclose(p, ref[t], rtol=1e-12, atol=1e-15), t
    # feedback really was delayed (censored rounds waited for later tokens)
    delays = [after - rid for rid, _, after in engine.resolved]
    assert max(delays) >= 2 and run.report["max_delay"] == max(delays)


def test_delayed_feedback_resolves_censored_rounds_exactly(cost):
    run = run_sources(_switching(), domain_shift_requests([0, 1], 8, 48), cost, K_DRAFT, seed=5)
    engine = run.engine
    assert sorted(r for r, _, _ in engine.resolved) == list(range(1, len(run.trace) + 1))
    censored = 0
    for rid, losses, after in engine.resolved:
        assert np.array_equal(losses, engine.truth[rid]), rid
        censored += after > rid
    assert censored > 20
    assert run.report["rounds"] == len(run.trace) and engine.delayed.pending == 0
    # the Hedge round drafts with every source: its drafting time is their sum
    assert all(r.draft_time == pytest.approx(2e-4) for r in run.trace)


@pytest.mark.parametrize("horizon", [None, 1500])
def test_regret_within_bound_on_every_seed(cost, horizon):
    """The expected-regret bound is pathwise (any loss sequence, adaptive too), so it
    must hold on each seed; the realised regret exceeds the expected one by a martingale
    with increments in an interval of length 1: with a union bound over the seeds it is
    below the bound + sqrt(T ln(2 |seeds| / delta) / 2) except with probability delta."""
    delta = 1e-6
    regrets, bounds = [], []
    for seed in SEEDS:
        run = run_sources(_switching(), domain_shift_requests([0, 1], 12, 48), cost, K_DRAFT,
                          seed=seed, hedge_seed=seed, horizon=horizon)
        rep = run.report
        T = rep["rounds"]
        assert rep["expected"] <= rep["bound"], seed
        assert rep["bound"] <= hedge_regret_bound(T, 2, horizon, rep["max_delay"])
        assert rep["realised"] <= rep["bound"] + math.sqrt(T * math.log(2 * len(SEEDS) / delta) / 2), seed
        assert rep["expected_tokens_per_s"] == pytest.approx(rep["expected"] * rep["rate_scale_tokens_per_s"])
        regrets.append(rep["expected"])
        bounds.append(rep["bound"])
    # far inside the bound on average: the bound is a worst case
    assert np.mean(regrets) < 0.5 * np.mean(bounds)


def test_bound_separates_hedge_from_a_uniform_chooser(cost):
    """On a stationary stream where one source is better, choosing uniformly has regret
    linear in T, above the bound on every seed, while Hedge stays below it."""
    sources = [AcceptanceSource("good", (0.85,), 1e-4), AcceptanceSource("poor", (0.35,), 1e-4)]
    for seed in range(10):
        rep = run_sources(sources, domain_shift_requests([0], 40, 48), cost, K_DRAFT, seed=seed,
                          hedge_seed=seed).report
        assert rep["expected"] <= rep["bound"] < rep["uniform_regret"], seed
        assert rep["best_source"] == 0 and rep["chosen_counts"][0] > 0.9 * sum(rep["chosen_counts"])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_hedge_beats_every_single_source_when_the_best_source_changes(cost, seed):
    requests = domain_shift_requests([0, 1], 40, 64)
    hedge = run_sources(_switching(), requests, cost, K_DRAFT, seed=seed, hedge_seed=seed)
    alone = [run_sources(_switching(), requests, cost, K_DRAFT, seed=seed, fixed_source=i) for i in range(2)]
    best = max(a.tokens_per_s for a in alone)
    # same target tokens served by every run
    assert hedge.trace.total_tokens == alone[0].trace.total_tokens == alone[1].trace.total_tokens == 80 * 64
    assert hedge.tokens_per_s > 1.3 * best, (hedge.tokens_per_s, [a.tokens_per_s for a in alone])
    assert len(hedge.trace) < min(len(a.trace) for a in alone)
    # ... while on its own rounds it is still within the bound of the best fixed source
    assert hedge.report["expected"] <= hedge.report["bound"]
    # a stationary stream: Hedge within a few per cent of the better source alone
    still = domain_shift_requests([0], 40, 64)
    mixed = run_sources(_switching(), still, cost, K_DRAFT, seed=seed, hedge_seed=seed).tokens_per_s
    assert mixed > 0.95 * run_sources(_switching(), still, cost, K_DRAFT, seed=seed, fixed_source=0).tokens_per_s


def test_loss_counts_drafting_time(cost):
    """A head accepted more often but slow to draft loses to a cheap lookup: Hedge
    maximises tokens per second, not accepted length."""
    sources = [AcceptanceSource("head", (0.8,), 0.15, 4), AcceptanceSource("lookup", (0.6,), 1e-5, 4)]
    requests = domain_shift_requests([0], 30, 48)
    rep = run_sources(sources, requests, cost, 4, seed=0).report
    assert rep["best_source"] == 1 and rep["chosen_counts"][1] > 0.8 * sum(rep["chosen_counts"])
    tau = [run_sources(sources, requests, cost, 4, seed=0, fixed_source=i).trace.mean_accepted_length()
           for i in range(2)]
    assert tau[0] > tau[1] + 0.4                       # the head has the longer accepted length


def test_bad_arguments(cost):
    src = AcceptanceSource("a", (0.5,))
    with pytest.raises(ValueError, match="acceptance_rates"):
        AcceptanceSource("x", (1.2,))
    with pytest.raises(ValueError, match="draft_seconds"):
        AcceptanceSource("x", (0.5,), -1.0)
    with pytest.raises(ValueError, match="domain"):
        SimSourcesEngine([src], [SourceRequest(1, 10)], cost)
    with pytest.raises(ValueError, match="fixed_source"):
        SimSourcesEngine([src], [SourceRequest(0, 10)], cost, fixed_source=2)
    with pytest.raises(ValueError, match="domains"):
        domain_shift_requests([], 2, 3)
    engine = SimSourcesEngine([src], [SourceRequest(0, 10)], cost)
    with pytest.raises(ValueError, match="chains only"):
        engine.start_round(DraftPlan(4, TreePlan(top_k=2, max_depth=3)))
