"""The SuffixDecoding structure (`specloop.strategies.suffix_tree`) against plain-loop
references: counts of every substring, longest matches, candidate probabilities,
the cost rule, FIFO eviction (bounded memory over 10^5 requests) and exact state
round-trips."""
from __future__ import annotations

import json
import tracemalloc
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, strategies as st

from specloop.strategies.suffix_tree import (AcceptanceCalibration, GlobalSuffixCache, SuffixTrie,
                                             cost_optimal_size, expand_candidates, longest_match,
                                             monotone_cost)

token_streams = st.lists(st.lists(st.integers(0, 3), min_size=0, max_size=14), min_size=1, max_size=6)


def brute_counts(sequences, depth):
    """Every occurrence of every substring of length 1..depth, by a plain loop."""
    counts: Counter = Counter()
    for seq in sequences:
        for start in range(len(seq)):
            for length in range(1, depth + 1):
                if start + length <= len(seq):
                    counts[tuple(seq[start: start + length])] += 1
    return dict(counts)


def brute_continuations(sequences, path):
    """Counter of the tokens that followed ``path`` anywhere."""
    out: Counter = Counter()
    n = len(path)
    for seq in sequences:
        for start in range(len(seq) - n):
            if list(seq[start: start + n]) == list(path):
                out[seq[start + n]] += 1
    return out


@given(token_streams, st.integers(1, 6), st.integers(1, 4))
def test_trie_counts_equal_brute_force_with_eviction(sequences, depth, max_requests):
    cache = GlobalSuffixCache(depth, max_requests=max_requests)
    for seq in sequences:
        cache.add(seq)
    kept = [s for s in sequences if s][-max_requests:]
    assert [list(s) for s in cache.sequences] == kept
    items = cache.trie.items()
    assert items == brute_counts(kept, depth)
    assert cache.trie.num_nodes == len(items) + 1
    assert cache.trie.root.count == sum(map(len, kept)) == cache.num_tokens


@given(token_streams, st.integers(1, 6), st.integers(1, 5))
def test_token_budget_evicts_oldest_first(sequences, depth, max_tokens):
    cache = GlobalSuffixCache(depth, max_requests=100, max_tokens=max_tokens)
    kept: list = []
    for seq in sequences:
        cache.add(seq)
        if seq:
            kept.append(list(seq[:max_tokens]))
            while sum(map(len, kept)) > max_tokens:
                kept.pop(0)
    assert [list(s) for s in cache.sequences] == kept
    assert cache.trie.items() == brute_counts(kept, depth)


@given(st.lists(st.integers(0, 3), max_size=30), st.integers(1, 6), st.data())
def test_incremental_append_equals_whole_insertion(seq, depth, data):
    cut = data.draw(st.integers(0, len(seq)))
    trie = SuffixTrie(depth)
    active = trie.extend(trie.start(), seq[:cut])
    active = trie.extend(active, seq[cut:])
    assert trie.items() == brute_counts([seq], depth)
    assert len(active) == min(depth, len(seq) + 1)        # root + suffixes of length 1..depth-1


@given(token_streams, st.lists(st.integers(0, 3), min_size=1, max_size=10), st.integers(2, 7),
       st.integers(1, 8))
def test_longest_match_is_the_longest_suffix_with_a_continuation(sequences, context, depth, max_match):
    trie = SuffixTrie(depth)
    for seq in sequences:
        trie.extend(trie.start(), seq)
    node, matched = longest_match(trie, context, max_match)
    expect = 0
    for m in range(1, min(max_match, len(context), depth - 1) + 1):
        if brute_continuations(sequences, context[-m:]):
            expect = m
    assert matched == expect
    if expect:
        assert {t: c.count for t, c in node.children.items()} == \
            dict(brute_continuations(sequences, context[-expect:]))
    else:
        assert node is None


def _path(tokens, parents, i):
    out = []
    while i >= 0:
        out.append(tokens[i])
        i = parents[i]
    return out[::-1]


@given(token_streams, token_streams, st.lists(st.integers(0, 3), min_size=1, max_size=8),
       st.integers(1, 6), st.integers(1, 20), st.sampled_from([0.0, 1.0]), st.booleans())
def test_candidates_are_best_first_max_over_sources(seqs_a, seqs_b, context, depth_cap, max_nodes,
                                                    prior, chain):
    depth = 8
    sources, tries = [], []
    for seqs in (seqs_a, seqs_b):
        trie = SuffixTrie(depth)
        for seq in seqs:
            trie.extend(trie.start(), seq)
        node, matched = longest_match(trie, context, 4)
        sources.append((node, depth - matched))
        tries.append((seqs, context[len(context) - matched:] if matched else None, depth - matched))
    stats: list = []
    tokens, parents, probs = expand_candidates(sources, depth_cap, max_nodes, prior, 0.0, chain, stats)

    def source_prob(seqs, match, remaining, path):
        if match is None or len(path) > remaining - 0:
            return 0.0
        prob = 1.0
        for d in range(len(path)):
            conts = brute_continuations(seqs, list(match) + path[:d])
            if not conts[path[d]]:
                return 0.0
            prob *= conts[path[d]] / (sum(conts.values()) + prior)
        return prob

    assert len(tokens) <= max_nodes and len(stats) == len(tokens)
    for i, (count, total, length) in enumerate(stats):          # matched lengths default to 0
        assert 1 <= count <= total and length == len(_path(tokens, parents, i)) - 1
    seen = set()
    for i in range(len(tokens)):
        assert parents[i] < i
        path = _path(tokens, parents, i)
        assert len(path) <= depth_cap and tuple(path) not in seen
        seen.add(tuple(path))
        expect = max(source_prob(s, m, r, path) for s, m, r in tries)
        assert probs[i] == pytest.approx(expect, rel=1e-12) and probs[i] > 0
        if i:
            assert probs[i] <= probs[i - 1] + 1e-15          # best-first
        if chain:
            assert parents[i] == i - 1
    if not chain and len(tokens) < max_nodes:                # every positive candidate was drafted
        frontier = [[]]
        count = 0
        while frontier:
            path = frontier.pop()
            for tok in range(4):
                cand = path + [tok]
                if len(cand) <= depth_cap and max(source_prob(s, m, r, cand) for s, m, r in tries) > 0:
                    count += 1
                    frontier.append(cand)
        assert count == len(tokens)


@given(st.lists(st.floats(0.0, 1.0), max_size=12),
       st.lists(st.floats(0.01, 2.0), min_size=1, max_size=16))
def test_cost_optimal_size_is_the_argmax(probs, table):
    cost = monotone_cost(table)
    assert np.all(np.diff(cost) >= 0) and np.all(cost <= np.asarray(table))
    n = cost_optimal_size(probs, cost)
    rates = [(1 + sum(probs[:k])) / cost[min(k + 1, cost.size) - 1] for k in range(len(probs) + 1)]
    assert rates[n] == max(rates) and rates.index(max(rates)) == n


def test_cost_rule_drafts_less_where_verification_is_dear():
    probs = [0.9, 0.6, 0.3, 0.1]
    assert cost_optimal_size(probs, monotone_cost([1.0])) == 4              # flat: verify everything
    assert cost_optimal_size(probs, monotone_cost([1.0, 1.2, 1.5, 2.0, 3.0])) == 2
    assert cost_optimal_size(probs, monotone_cost([1.0, 5.0])) == 0
    assert cost_optimal_size([], monotone_cost([1.0])) == 0


@given(token_streams, st.integers(1, 6), st.integers(1, 3))
def test_state_round_trips_exactly(sequences, depth, max_requests):
    cache = GlobalSuffixCache(depth, max_requests=max_requests, max_tokens=20)
    for seq in sequences:
        cache.add(seq)
    state = json.loads(json.dumps(cache.state_dict()))
    copy = GlobalSuffixCache(1, 1)
    copy.load_state_dict(state)
    assert copy.state_dict() == cache.state_dict()
    assert copy.trie.items() == cache.trie.items() and copy.trie.num_nodes == cache.trie.num_nodes
    for extra in ([1, 2, 3], [0] * 7, [3, 1]):          # and they keep evicting in the same order
        cache.add(extra)
        copy.add(extra)
        assert copy.trie.items() == cache.trie.items()


def test_eviction_keeps_memory_bounded_over_1e5_requests():
    rng = np.random.default_rng(0)
    templates = rng.integers(0, 50, size=(1000, 8)).tolist()
    lengths = rng.integers(3, 9, size=100_000)
    picks = rng.integers(0, 1000, size=100_000)
    depth, max_requests = 4, 100
    cache = GlobalSuffixCache(depth, max_requests=max_requests)
    peaks = []
    tracemalloc.start()
    try:
        for i in range(100_000):
            cache.add(templates[picks[i]][: lengths[i]])
            if i % 10_000 == 9_999:
                peaks.append(tracemalloc.get_traced_memory()[1])
                tracemalloc.reset_peak()
    finally:
        tracemalloc.stop()
    assert len(cache.sequences) == max_requests
    assert cache.trie.num_nodes - 1 <= max_requests * 8 * depth
    # a bound from the structure: <= 3200 nodes of < 700 bytes (object + dict) plus 100 sequences
    assert max(peaks) < 3_200 * 700 + 100 * 200, peaks
    assert max(peaks[5:]) < 1.1 * max(peaks[:5]), peaks      # no growth: the second 5e4 requests peak as the first


def test_calibration_learns_the_acceptance_rate():
    cal = AcceptanceCalibration(prior_count=1.0, prior_strength=2.0, exploration=1.0)
    assert cal.estimate(1, 1, 3) == pytest.approx(0.5)         # the smoothed prior 1 / (1 + 1), no bonus yet
    for i in range(200):
        cal.update(1, 1, 3, accepted=i % 10 != 0)              # accepted 90 % of the time
    assert cal.mean(1, 1, 3) == pytest.approx((180 + 1.0) / (200 + 2.0))
    assert cal.mean(1, 1, 4) == cal.mean(1, 1, 3)               # lengths 3-4 share a bucket
    assert cal.mean(3, 3, 3) == pytest.approx(0.75)             # another bucket is untouched
    assert cal.mean(1, 1, 9) == pytest.approx(0.5)              # and so is a longer suffix
    # the UCB bonus: sqrt(log(1 + N) / (2 (n_b + strength)))
    bonus = np.sqrt(np.log1p(200) / (2 * (200 + 2)))
    assert cal.estimate(1, 1, 3) == pytest.approx(min(1.0, cal.mean(1, 1, 3) + bonus))
    untried = cal.estimate(1, 1, 9)
    assert untried == pytest.approx(min(1.0, 0.5 + np.sqrt(np.log1p(200) / 4)))
    assert cal.bucket(1, 1) != cal.bucket(2, 2) and cal.bucket(3, 3) == cal.bucket(4, 4)
    copy = AcceptanceCalibration()
    copy.load_state_dict(json.loads(json.dumps(cal.state_dict())))
    assert copy.estimate(1, 1, 3) == cal.estimate(1, 1, 3) and copy.total_trials == 200
    assert np.array_equal(copy.trials, cal.trials)


def test_calibration_without_exploration_gets_stuck_and_with_it_recovers():
    """The regression behind the UCB bonus: a bucket whose first outcomes were bad
    has a mean below the drafting threshold and is never tested again; the bonus
    grows with the outcomes seen elsewhere until it is tried again."""
    threshold = 0.45
    for exploration, expect_retry in ((0.0, False), (1.0, True)):
        cal = AcceptanceCalibration(exploration=exploration)
        for _ in range(3):
            cal.update(1, 1, 16, accepted=False)                # unlucky start of the long-match bucket
        retried = False
        for step in range(2000):
            cal.update(1, 4, 1, accepted=step % 2 == 0)         # other rounds keep producing outcomes
            if cal.estimate(1, 1, 16) > threshold:
                retried = True
                break
        assert retried == expect_retry


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="depth"):
        SuffixTrie(0)
    with pytest.raises(ValueError, match="max_requests"):
        GlobalSuffixCache(4, max_requests=0)
    with pytest.raises(ValueError, match="verify_cost"):
        monotone_cost([1.0, -1.0])
    with pytest.raises(ValueError, match="GlobalSuffixCache"):
        GlobalSuffixCache().load_state_dict({"depth": 3})
    with pytest.raises(ValueError, match="AcceptanceCalibration"):
        AcceptanceCalibration().load_state_dict({})
    with pytest.raises(ValueError, match="exploration"):
        AcceptanceCalibration(exploration=-1.0)
    trie = SuffixTrie(3)
    trie.extend(trie.start(), [1, 2])
    with pytest.raises(KeyError):
        trie.remove([2, 3])
