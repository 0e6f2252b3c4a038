"""Shadow feedback for Hedge over draft sources (`strategies.hedge_shadow`): every source's
shadow equals its standalone run computed by a plain loop, whatever the played rounds'
boundaries (Hypothesis-driven); the played rounds' losses add up to each source's
standalone seconds; subtrees and paths; the state round trip mid-request; AdaHedge
(`HedgeOverSources(learning_rate="adahedge")`) against a plain NumPy loop, its
invariances and its regret within 2 * Delta."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specloop.strategies.hedge_shadow import ShadowFeedback, accepted_path, subtree_below
from specloop.strategies.hedge_sources import HedgeOverSources, SourceDraft, accepted_prefix, mixability_gap

VOCAB = 4
COST = [1.0, 1.2, 1.4, 1.6, 1.8, 2.0, 2.2, 2.4, 2.6]


def verify_seconds(n: int) -> float:
    return COST[n - 1] if n <= len(COST) else COST[-1] * n / len(COST)


def _source(seed: int, draft_seconds: float):
    """A deterministic source: a depth <= 3, width <= 2 tree from its own transition table
    (a function of the context only)."""
    table = np.random.default_rng(seed).permutation(np.tile(np.arange(VOCAB), (VOCAB, 1)), axis=1)

    def propose(context: list[int]) -> SourceDraft:
        last = context[-1] if context else 0
        tokens, parents = [], []
        frontier = [(-1, last)]
        for _ in range(1 + seed % 3):
            nxt = []
            for parent, tok in frontier:
                for child in table[tok][: 1 + (seed + tok) % 2]:
                    tokens.append(int(child))
                    parents.append(parent)
                    nxt.append((len(tokens) - 1, int(child)))
            frontier = nxt[:2]
        return SourceDraft(tokens, parents, draft_seconds)
    return propose


def _stream(seed: int, length: int) -> list[int]:
    """A sticky Markov chain the sources partly predict."""
    rng = np.random.default_rng(seed)
    out = [int(rng.integers(VOCAB))]
    while len(out) < length:
        out.append(out[-1] if rng.random() < 0.5 else int(rng.integers(VOCAB)))
    return out


def _standalone(propose, prompt: list[int], tokens: list[int]) -> list[tuple[int, int, float, float]]:
    """A source alone, by a plain loop: (start, committed, seconds, seconds unclipped) of each
    round, the tree clipped to depth (tokens left - 1) as the decoder clips it."""
    rounds, cursor = [], 0
    while cursor < len(tokens):
        draft = propose(prompt + tokens[:cursor])
        left = len(tokens) - cursor
        depth = [0] * len(draft.parents)
        for i, par in enumerate(draft.parents):
            depth[i] = 1 if par < 0 else depth[par] + 1
        accepted, _ = accepted_prefix(draft.tokens, draft.parents, tokens[cursor:])
        committed = min(accepted, left - 1) + 1
        nodes = sum(d <= left - 1 for d in depth)
        rounds.append((cursor, committed, draft.draft_seconds + verify_seconds(nodes + 1),
                       draft.draft_seconds + verify_seconds(len(draft.tokens) + 1)))
        cursor += committed
    return rounds


def _drive(shadow: ShadowFeedback, sources, prompt, tokens, cuts) -> tuple[dict, list]:
    """Play a request whose played rounds commit ``cuts`` tokens each; every decided shadow
    round is logged per source, every resolved played round's losses collected."""
    log, losses, start, round_id = {i: [] for i in range(len(sources))}, [], 0, 0

    def take(decisions):
        for d in decisions:
            log[d.source].append((d.start, len(d.committed)))
            assert d.committed == tokens[d.start:d.start + len(d.committed)]
            assert len(d.accepted) <= len(d.committed)

    def draft_all():
        while wanted := shadow.wants():
            for i in wanted:
                take(shadow.offer(i, sources[i](prompt + shadow.tokens(shadow.cursor(i)))))
    for cut in cuts:
        if start >= len(tokens):
            break
        draft_all()
        round_id += 1
        shadow.add_round(round_id)
        take(shadow.commit(tokens[start:start + cut]))
        losses += shadow.resolved()
        start += cut
    while start < len(tokens):                    # the rest in rounds of 3 (<= M tokens a round)
        draft_all()
        round_id += 1
        shadow.add_round(round_id)
        take(shadow.commit(tokens[start:start + 3]))
        losses += shadow.resolved()
        start += 3
    take(shadow.end_request())
    draft_all()
    losses += shadow.close_request()
    return log, losses


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), length=st.integers(1, 60),
       cuts=st.lists(st.integers(1, 5), min_size=0, max_size=40))
def test_shadows_equal_standalone_runs(seed, length, cuts):
    sources = [_source(seed + k, 0.1 * k) for k in range(3)]
    prompt, tokens = [seed % VOCAB], _stream(seed, length)
    shadow = ShadowFeedback(3, verify_seconds, max_nodes=8)
    log, losses = _drive(shadow, sources, prompt, tokens, cuts)
    for i, propose in enumerate(sources):
        alone = _standalone(propose, prompt, tokens)
        assert log[i] == [(s, m) for s, m, *_ in alone]
        assert shadow.tokens_decided[i] == len(tokens)
        # exact where a round was decided at the request's end; a round decided before it
        # is priced unclipped (the module docstring), so between the two
        clipped, unclipped = sum(r[2] for r in alone), sum(r[3] for r in alone)
        assert clipped - 1e-9 <= shadow.seconds_decided[i] <= unclipped + 1e-9
    # every played round resolved once, in play order, and the losses add up to each
    # source's standalone seconds / (M S) (no per-token cost reaches the cap S here)
    ids = [rid for rid, _ in losses]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    total = np.sum([loss for _, loss in losses], axis=0)
    scale = shadow.max_tokens * shadow.seconds_cap
    assert np.allclose(total, shadow.seconds_decided / scale)
    assert all(np.all((loss >= 0) & (loss <= 1)) for _, loss in losses)


def test_only_active_sources_draft_and_the_state_round_trips():
    sources = [_source(k, 0.0) for k in range(2)]
    prompt, tokens = [1], _stream(3, 30)
    shadow = ShadowFeedback(2, verify_seconds, max_nodes=8)
    shadow.start_request(active=[1])
    assert shadow.wants() == [1]
    shadow.offer(1, sources[1](prompt))
    shadow.add_round(1)
    shadow.commit(tokens[:2])
    saved = shadow.state_dict()
    other = ShadowFeedback(2, verify_seconds, max_nodes=8)
    other.load_state_dict(saved)
    for sh in (shadow, other):                    # the same continuation from the saved state
        sh.commit(tokens[2:])
        sh.end_request()
        while wanted := sh.wants():
            for i in wanted:
                sh.offer(i, sources[i](prompt + sh.tokens(sh.cursor(i))))
        sh.close_request()
    assert np.array_equal(shadow.seconds_decided, other.seconds_decided)
    assert shadow.tokens_decided.tolist() == [0, 30]
    with pytest.raises(ValueError, match="active"):
        shadow.start_request(active=[2])
    with pytest.raises(ValueError, match="pending"):
        shadow.start_request()
        shadow.offer(0, sources[0](prompt))
        shadow.offer(0, sources[0](prompt))


def test_paths_and_subtrees():
    tokens, parents = [5, 6, 7, 3, 8, 9], [-1, 0, 1, 0, 1, 4]
    assert accepted_path(tokens, parents, [5, 6, 8]) == [0, 1, 4]
    assert accepted_path(tokens, parents, [5, 6, 8], limit=2) == [0, 1]
    assert accepted_path(tokens, parents, [4]) == []
    assert subtree_below(parents, 1) == [2, 4, 5]
    assert subtree_below(parents, 1, max_nodes=2) == [2, 4]
    assert subtree_below(parents, -1) == list(range(6))
    assert subtree_below(parents, 5) == []


# -- AdaHedge ----------------------------------------------------------------------------
def _adahedge_reference(losses: np.ndarray) -> tuple[np.ndarray, float]:
    """Plain loop of de Rooij et al. (2014), Sec. 2: weights per round and Delta_T."""
    rounds, k = losses.shape
    cum, delta, out = np.zeros(k), 0.0, np.zeros((rounds, k))
    for t in range(rounds):
        if delta == 0:
            w = np.array([1.0 if cum[i] == cum.min() else 0.0 for i in range(k)])
        else:
            eta = math.log(k) / delta
            w = np.array([math.exp(-eta * (cum[i] - cum.min())) for i in range(k)])
        w /= w.sum()
        out[t] = w
        h = float(w @ losses[t])
        if delta == 0:
            m = min(losses[t][i] for i in range(k) if w[i] > 0)
        else:
            m = -math.log(sum(w[i] * math.exp(-eta * losses[t][i]) for i in range(k))) / eta
        delta += h - m
        cum += losses[t]
    return out, delta


def _play(losses: np.ndarray, seed: int = 0) -> HedgeOverSources:
    hedge = HedgeOverSources(losses.shape[1], seed=seed, learning_rate="adahedge")
    for row in losses:
        round_id, _ = hedge.play()
        hedge.update(round_id, row)
    return hedge


@pytest.mark.parametrize("seed", [0, 1])
def test_adahedge_equals_numpy_reference_and_is_invariant(seed):
    rng = np.random.default_rng(seed)
    losses = rng.normal(size=(400, 4)) + np.array([0.0, 0.1, 0.2, 0.3])
    ref, delta = _adahedge_reference(losses)
    hedge = HedgeOverSources(4, seed=seed, learning_rate="adahedge")
    for t, row in enumerate(losses):
        assert np.allclose(hedge.weights(), ref[t], rtol=1e-9, atol=1e-12)
        round_id, _ = hedge.play()
        hedge.update(round_id, row)
    assert hedge.mixability_gap == pytest.approx(delta, rel=1e-9)
    scaled = _play(37.0 * losses + 5.0, seed)               # rescaled and translated losses
    assert np.allclose(scaled.weights(), hedge.weights(), rtol=1e-9)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_adahedge_regret_within_twice_the_mixability_gap(seed):
    rng = np.random.default_rng(seed)
    half = 1500                                   # the best source switches halfway
    means = np.vstack([np.tile([0.2, 0.5, 0.6], (half, 1)), np.tile([0.7, 0.3, 0.6], (half, 1))])
    for losses in ((rng.random((2 * half, 3)) < means).astype(float), 3.0 * rng.random((2 * half, 3)) - 1.0):
        report = _play(losses, seed).regret()
        best = losses.sum(axis=0).min()
        assert report["expected"] == pytest.approx(_play(losses, seed).expected_loss - best)
        assert 0 <= report["expected"] <= report["bound"] == pytest.approx(2 * report["mixability_gap"])
        assert report["bound"] < 0.2 * 2 * half                 # and far below linear


def test_adahedge_refusals_and_mixability_gap():
    hedge = HedgeOverSources(2, learning_rate="adahedge")
    hedge.play()
    with pytest.raises(ValueError, match="delayed"):
        hedge.play()
    with pytest.raises(ValueError, match="horizon"):
        HedgeOverSources(2, horizon=10, learning_rate="adahedge")
    with pytest.raises(ValueError, match="learning_rate"):
        HedgeOverSources(2, learning_rate="doubling")
    with pytest.raises(ValueError, match="finite"):
        hedge.update(1, [0.0, math.inf])
    p, loss = np.array([0.5, 0.5]), np.array([0.0, 1.0])
    assert mixability_gap(p, loss, math.inf) == pytest.approx(0.5)      # p . l - min l
    assert mixability_gap(p, loss, 0.0) == 0.0
    eta = 2.0
    assert mixability_gap(p, loss, eta) == pytest.approx(0.5 + math.log(0.5 + 0.5 * math.exp(-eta)) / eta)
    one = HedgeOverSources(1, learning_rate="adahedge")
    round_id, chosen = one.play()
    one.update(round_id, [3.0])
    assert chosen == 0 and one.regret()["bound"] == 0.0
    state = _play(np.eye(3)[[0, 1, 2, 0]]).state_dict()
    again = HedgeOverSources(3, learning_rate="adahedge")
    again.load_state_dict(state)
    assert again.mixability_gap == state["mixability_gap"]
    with pytest.raises(ValueError, match="learning rate"):
        HedgeOverSources(3).load_state_dict(state)
