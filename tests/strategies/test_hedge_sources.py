"""Hedge over draft sources (pure part): weights against a plain NumPy reference, the
regret within its bound on simulated Bernoulli-acceptance sources whose best switches
halfway (with and without delayed feedback), delayed-feedback bookkeeping, the loss's
normalisation and the state round trip."""
from __future__ import annotations

import math

import numpy as np
import pytest

from specloop.strategies.hedge_sources import (DelayedFeedback, HedgeOverSources, RatioLoss, SourceDraft,
                                               ThroughputLoss, accepted_prefix, hedge_learning_rate,
                                               hedge_regret_bound)


def _reference_weights(losses: np.ndarray, horizon: int | None) -> np.ndarray:
    """Plain loop: p_t = exp(-eta_t L_{t-1}) / sum, eta_t = sqrt(8 ln K / t or T)."""
    rounds, k = losses.shape
    out = np.zeros((rounds, k))
    cum = np.zeros(k)
    for t in range(1, rounds + 1):
        eta = math.sqrt(8 * math.log(k) / (t if horizon is None else horizon))
        w = np.array([math.exp(-eta * cum[i]) for i in range(k)])
        out[t - 1] = w / w.sum()
        cum = cum + losses[t - 1]
    return out


@pytest.mark.parametrize("horizon", [None, 300])
def test_weights_equal_numpy_reference(horizon):
    rng = np.random.default_rng(1)
    losses = rng.random((300, 3))
    ref = _reference_weights(losses, horizon)
    hedge = HedgeOverSources(3, horizon=horizon, seed=0)
    for t in range(300):
        assert np.allclose(hedge.weights(), ref[t], rtol=1e-12, atol=1e-15)
        round_id, _ = hedge.play()
        hedge.update(round_id, losses[t])
    assert np.allclose(hedge.cumulative_loss, losses.sum(axis=0))
    # not last-chunk weights: the early losses still count at the end
    assert hedge.weights()[np.argmin(losses.sum(axis=0))] == hedge.weights().max()


def _switching_losses(rounds: int, seed: int) -> np.ndarray:
    """Two Bernoulli-acceptance sources: loss 0 when the draft is accepted. Source 0
    is accepted w.p. 0.8 then 0.3, source 1 w.p. 0.4 then 0.7 (best switches halfway)."""
    rng = np.random.default_rng(seed)
    half = rounds // 2
    accept = np.vstack([np.tile([0.8, 0.4], (half, 1)), np.tile([0.3, 0.7], (rounds - half, 1))])
    return (rng.random((rounds, 2)) >= accept).astype(float)


@pytest.mark.parametrize("horizon", [None, 4000])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_regret_within_bound_when_the_best_source_switches(horizon, seed):
    rounds = 4000
    losses = _switching_losses(rounds, seed)
    hedge = HedgeOverSources(2, horizon=horizon, seed=seed)
    for t in range(rounds):
        round_id, _ = hedge.play()
        hedge.update(round_id, losses[t])
    report = hedge.regret()
    bound = hedge_regret_bound(rounds, 2, horizon)
    assert report["rounds"] == rounds and report["max_delay"] == 0 and report["bound"] == bound
    best = losses.sum(axis=0).min()
    assert report["expected"] == pytest.approx(hedge.expected_loss - best)
    assert report["expected"] <= bound
    # the realised choices concentrate around the expected loss (Hoeffding, 1e-6)
    assert report["realised"] <= bound + math.sqrt(rounds * math.log(1e6) / 2)
    # the bound is informative: under 2 % of the rounds (a source alone loses 45 %)
    assert bound < 0.02 * rounds


@pytest.mark.parametrize("delay", [1, 4, 16])
def test_regret_within_bound_with_delayed_feedback(delay):
    rounds = 3000
    losses = _switching_losses(rounds, 7)
    rng = np.random.default_rng(delay)
    hedge = HedgeOverSources(2, seed=3)
    waiting: list[tuple[int, int]] = []                  # (due round, round id)
    for t in range(1, rounds + 1):
        round_id, _ = hedge.play()
        waiting.append((t + int(rng.integers(0, delay + 1)), round_id))
        for due, rid in [w for w in waiting if w[0] <= t]:
            hedge.update(rid, losses[rid - 1])
        waiting = [w for w in waiting if w[0] > t]
    for _, rid in waiting:
        hedge.update(rid, losses[rid - 1])
    report = hedge.regret()
    assert report["rounds"] == rounds and report["max_delay"] <= delay
    assert report["expected"] <= hedge_regret_bound(rounds, 2, None, report["max_delay"])
    assert hedge_regret_bound(rounds, 2, None, delay) > hedge_regret_bound(rounds, 2, None, 0)


def test_learning_rate_and_bound_values():
    assert hedge_learning_rate(2, 8) == pytest.approx(math.sqrt(math.log(2)))
    assert hedge_learning_rate(2, 5, horizon=8) == hedge_learning_rate(2, 1, horizon=8)
    assert hedge_learning_rate(1, 3) == 0.0 and hedge_regret_bound(10, 1) == 0.0
    # fixed rate: ln K / eta + eta T / 8 = sqrt(T ln K / 2)
    assert hedge_regret_bound(200, 3, horizon=200) == pytest.approx(math.sqrt(200 * math.log(3) / 2))
    for bad in ((0, 1), (2, 0)):
        with pytest.raises(ValueError):
            hedge_learning_rate(*bad)
    with pytest.raises(ValueError):
        HedgeOverSources(2, choose="best")
    hedge = HedgeOverSources(2)
    with pytest.raises(ValueError, match="not played"):
        hedge.update(1, [0.0, 0.0])
    rid, _ = hedge.play()
    with pytest.raises(ValueError, match="in \\[0, 1\\]"):
        hedge.update(rid, [0.0, 1.5])


def test_argmax_and_sampling_choices():
    hedge = HedgeOverSources(3, choose="argmax")
    rid, chosen = hedge.play()
    assert chosen == 0                                    # ties: the first source
    hedge.update(rid, [1.0, 0.0, 0.5])
    assert hedge.play()[1] == 1
    sampler = HedgeOverSources(2, seed=5)
    picks = []
    for _ in range(2000):
        rid, chosen = sampler.play()
        picks.append(chosen)
        sampler.update(rid, [0.0, 0.0])                   # equal losses: p = (1/2, 1/2)
    assert abs(np.mean(picks) - 0.5) < 0.05


def test_state_round_trip():
    rng = np.random.default_rng(2)
    a = HedgeOverSources(3, seed=9)
    for _ in range(20):
        rid, _ = a.play()
        a.update(rid, rng.random(3))
    open_round, _ = a.play()                              # a round still pending
    b = HedgeOverSources(3, seed=1)
    b.load_state_dict(a.state_dict())
    assert np.array_equal(a.weights(), b.weights()) and b.regret() == a.regret()
    b.update(open_round, [0.1, 0.2, 0.3])
    a.update(open_round, [0.1, 0.2, 0.3])
    assert [a.play() for _ in range(5)] == [b.play() for _ in range(5)]
    with pytest.raises(ValueError, match="sources"):
        HedgeOverSources(2).load_state_dict(a.state_dict())


def test_throughput_loss_normalisation():
    cost = [1.0, 1.2, 1.5, 2.0]                           # rates n / c(n): 1, 1.67, 2, 2
    loss = ThroughputLoss(cost)
    assert loss.rate_scale == pytest.approx(2.0)
    assert loss(3, 0.0, 2) == pytest.approx(0.0)          # 3 tokens in 1.5 s: the best rate
    assert loss(1, 0.0, 0) == pytest.approx(0.5)          # a plain step: 1 token / 1 s
    assert loss(1, 1.0, 0) == pytest.approx(0.75)         # drafting time counts
    assert loss.verify_seconds(8) == pytest.approx(4.0)   # linear past the table
    capped = ThroughputLoss(cost, max_nodes=1)            # R over n <= 2 only: 2 / 1.2
    assert capped.rate_scale == pytest.approx(2 / 1.2) and capped(2, 0.0, 1) == pytest.approx(0.0)
    assert capped(4, 0.0, 3) == 0.0                       # a larger proposal is clipped at 0
    with pytest.raises(ValueError):
        ThroughputLoss(cost, max_nodes=-1)
    rng = np.random.default_rng(0)
    for _ in range(200):
        nodes = int(rng.integers(0, 20))
        value = loss(int(rng.integers(1, nodes + 2)), float(rng.random()), nodes)
        assert 0.0 <= value <= 1.0


def test_accepted_prefix_on_a_tree():
    tokens, parents = [5, 6, 7, 9, 8], [-1, 0, 1, 1, 2]    # 5 -> 6 -> {7 -> 8, 9}
    assert accepted_prefix(tokens, parents, [4]) == (0, True)
    assert accepted_prefix(tokens, parents, [5, 6]) == (2, False)       # censored
    assert accepted_prefix(tokens, parents, [5, 6, 9]) == (3, True)     # a leaf
    assert accepted_prefix(tokens, parents, [5, 6, 7, 1]) == (3, True)
    assert accepted_prefix(tokens, parents, [5, 6, 7, 8, 2]) == (4, True)
    assert accepted_prefix([], [], []) == (0, True)


def test_delayed_feedback_resolves_censored_rounds_from_later_tokens():
    loss = ThroughputLoss([1.0] * 8)                      # flat: rate = committed tokens
    fb = DelayedFeedback(loss, max_delay=8)
    chosen = SourceDraft([5, 6, 1], [-1, 0, 1], 0.0)      # verified: accepts 5, 6; bonus 7
    other = SourceDraft([5, 6, 7, 8], [-1, 0, 1, 2], 0.0)  # would accept 5 6 7 8 (+ bonus)
    fb.add(1, [chosen, other])
    assert fb.commit([5, 6, 7]) == [] and fb.pending == 1   # `other` is censored at 3 tokens
    fb.add(2, [SourceDraft([8], [-1], 0.0), SourceDraft([], [], 0.0)])
    done = fb.commit([8, 3])                              # round 2 commits 8 (accepted) + 3
    assert [rid for rid, _ in done] == [1, 2]
    scale = loss.rate_scale
    np.testing.assert_allclose(done[0][1], [1 - 3 / scale, 1 - 5 / scale])
    np.testing.assert_allclose(done[1][1], [1 - 2 / scale, 1 - 1 / scale])
    assert fb.pending == 0 and fb._tokens == []           # nothing kept once decided


def test_delayed_feedback_delay_is_bounded_and_the_request_end_decides():
    loss = ThroughputLoss([1.0] * 16)
    fb = DelayedFeedback(loss, max_delay=2)
    deep = SourceDraft(list(range(10)), list(range(-1, 9)), 0.0)
    fb.add(1, [deep])
    assert fb.commit([0]) == []                           # its own round: 1 token known
    fb.add(2, [SourceDraft([], [], 0.0)])
    assert [r for r, _ in fb.commit([1])] == [2]          # round 2 (empty) is decided at once
    fb.add(3, [SourceDraft([], [], 0.0)])
    done = fb.commit([2])                                 # round 1 waited max_delay = 2 rounds
    assert [r for r, _ in done] == [1, 3]
    np.testing.assert_allclose(done[0][1], [1 - 4 / loss.rate_scale])  # censored: >= 3 accepted
    # the request ends: a verifier would have stopped at its last token too (exact)
    fb.add(4, [SourceDraft([7, 8, 9], [-1, 0, 1], 0.0)])
    fb.commit([7, 8])
    done = fb.end_request()
    assert [r for r, _ in done] == [4]
    np.testing.assert_allclose(done[0][1], [1 - 2 / loss.rate_scale])
    with pytest.raises(ValueError):
        DelayedFeedback(loss, max_delay=0)


def test_delay_term_counts_the_missing_loss_vectors_of_each_round():
    """delay_term = sum_t min(1, eta_t n_t / 4), n_t = rounds played but unresolved when
    round t is played (plain loop reference); the reported bound is the smaller of it
    (plus the undelayed bound) and the max-delay bound, and the expected regret stays
    below it; a state without the term (saved before it existed) falls back."""
    rng = np.random.default_rng(4)
    losses = _switching_losses(2000, 11)
    hedge = HedgeOverSources(2, seed=0)
    waiting, reference = [], 0.0
    for t in range(1, 2001):
        reference += min(1.0, math.sqrt(8 * math.log(2) / t) * len(waiting) / 4) if waiting else 0.0
        rid, _ = hedge.play()
        waiting.append((t + int(rng.integers(0, 6)), rid))
        for due, r in [w for w in waiting if w[0] <= t]:
            hedge.update(r, losses[r - 1])
        waiting = [w for w in waiting if w[0] > t]
    for _, r in waiting:
        hedge.update(r, losses[r - 1])
    assert hedge.delay_term == pytest.approx(reference, rel=1e-12)
    report = hedge.regret()
    loose = hedge_regret_bound(2000, 2, None, report["max_delay"])
    assert report["bound"] == pytest.approx(min(loose, hedge_regret_bound(2000, 2) + reference))
    assert report["expected"] <= report["bound"] < loose
    state = hedge.state_dict()
    state.pop("delay_term")
    old = HedgeOverSources(2)
    old.load_state_dict(state)
    assert old.delay_term is None and old.regret()["bound"] == loose


def test_delayed_feedback_state_round_trip_with_pending_rounds():
    """A saved DelayedFeedback with censored rounds pending decides them like the original."""
    import copy
    loss = ThroughputLoss([1.0, 1.2, 1.5, 2.0])
    a = DelayedFeedback(loss, max_delay=8)
    a.add(1, [SourceDraft([5, 6, 7], [-1, 0, 1], 0.01), SourceDraft([9], [-1], 0.0)])
    assert a.commit([5]) == [] and a.pending == 1               # source 0 censored
    a.add(2, [SourceDraft([6, 7], [-1, 0], 0.0), SourceDraft([6], [-1], 0.0)])
    state = copy.deepcopy(a.state_dict())
    b = DelayedFeedback(loss, max_delay=1)
    b.load_state_dict(state)
    assert b.pending == 2 and b.max_delay == 8
    for tokens in ([6], [7, 3]):
        got_a, got_b = a.commit(tokens), b.commit(tokens)
        assert [r for r, _ in got_a] == [r for r, _ in got_b]
        assert all(np.array_equal(x, y) for (_, x), (_, y) in zip(got_a, got_b))
    assert a.pending == b.pending == 0
    with pytest.raises(ValueError, match="lacks keys"):
        b.load_state_dict({"max_delay": 2})


def _ratio_reference(outcomes, cost, max_nodes):
    """Plain loop: theta_t from the totals of the rounds before t, then the normalised
    Dinkelbach loss (module docstring of strategies.hedge_sources)."""
    top, cap = max_nodes + 1, 1.5 * cost[max_nodes]
    tokens, seconds, out = None, None, []
    for rnd in outcomes:
        sec = [d + cost[n] for _, d, n in rnd]           # c(n + 1) = cost[n]
        theta = 0.0 if tokens is None else max(a / b for a, b in zip(tokens, seconds))
        out.append([min(1.0, max(0.0, (theta * x - m + top) / (theta * cap + top)))
                    for (m, _, _), x in zip(rnd, sec)])
        tokens = [m for m, _, _ in rnd] if tokens is None else [a + m for a, (m, _, _) in zip(tokens, rnd)]
        seconds = sec if seconds is None else [b + x for b, x in zip(seconds, sec)]
    return np.array(out)


def test_ratio_loss_equals_a_plain_loop():
    rng = np.random.default_rng(4)
    cost = np.sort(rng.uniform(0.03, 0.09, 9))
    outcomes = [[(int(rng.integers(0, n + 2)), float(rng.uniform(0, 0.01)), int(n))
                 for n in rng.integers(0, 9, 3)] for _ in range(200)]
    loss = RatioLoss(cost, max_nodes=8)
    got = np.array([loss.round_losses(rnd) for rnd in outcomes])
    assert np.allclose(got, _ratio_reference(outcomes, cost, 8), rtol=1e-12, atol=1e-14)
    assert np.all((got >= 0) & (got <= 1)) and loss.rounds == 200
    assert loss.theta == pytest.approx(max(loss.tokens / loss.seconds))


def test_ratio_loss_ranks_by_throughput_where_the_mean_rate_misleads():
    """Source 0 commits 2 tokens in 0.1 s every round (20 tokens/s); source 1 alternates
    1 token in 0.04 s (25/s) and 5 in 0.3 s (16.7/s): mean rate 20.8/s, higher, but
    throughput 6 / 0.34 = 17.6/s, lower. The rate loss prefers source 1, the ratio
    loss source 0, as the stream's tokens per second do."""
    cost = [0.04] * 8                                    # c(n) = 0.04 s: drafting seconds set the rest
    rounds = [[(2, 0.06, 1), (1, 0.0, 1) if t % 2 else (5, 0.26, 4)] for t in range(400)]
    ratio, rate = RatioLoss(cost, max_nodes=7), ThroughputLoss(cost, max_nodes=7)
    cum_ratio = sum(ratio.round_losses(r) for r in rounds)
    cum_rate = sum(rate.round_losses(r) for r in rounds)
    assert cum_rate[1] < cum_rate[0] and cum_ratio[0] < cum_ratio[1]
    assert ratio.rates == pytest.approx([20.0, 6 / 0.34])
    hedge, scorer = HedgeOverSources(2, seed=0), RatioLoss(cost, max_nodes=7)
    for r in rounds * 10:                                # Hedge on the ratio loss settles on source 0
        rid, _ = hedge.play()
        hedge.update(rid, scorer.round_losses(r))
    assert hedge.weights()[0] > 0.99


def test_ratio_loss_state_round_trip_through_delayed_feedback():
    rng = np.random.default_rng(7)
    cost = np.linspace(0.02, 0.05, 8)
    make = lambda: DelayedFeedback(RatioLoss(cost, max_nodes=4), max_delay=8)
    whole, first = make(), make()
    stream = rng.integers(0, 3, 120).tolist()
    drafts = [[SourceDraft(rng.integers(0, 3, 2).tolist(), [-1, 0], 0.001),
               SourceDraft(rng.integers(0, 3, 3).tolist(), [-1, 0, 1], 0.0)] for _ in range(60)]
    got_whole, got_split = [], []
    for i in range(60):
        whole.add(i, drafts[i])
        got_whole += whole.commit(stream[2 * i: 2 * i + 2])
        if i < 30:
            first.add(i, drafts[i])
            got_split += first.commit(stream[2 * i: 2 * i + 2])
        else:
            if i == 30:
                state = first.state_dict()
                first = make()
                first.load_state_dict(state)
                assert first.loss.rounds == state["loss"]["rounds"] > 0
            first.add(i, drafts[i])
            got_split += first.commit(stream[2 * i: 2 * i + 2])
    assert [r for r, _ in got_whole] == [r for r, _ in got_split]
    assert np.array_equal(np.array([l for _, l in got_whole]), np.array([l for _, l in got_split]))
