"""Paired per-prompt comparison of stream methods."""
from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
from scipy import stats

from specloop.realmodels.streams.compare import domain_accepted_length, per_prompt_counts
from specloop.stats import paired_gain


def rows(taus, rounds=10):
    return [{"index": i, "rounds": rounds, "tokens": int(round(t * rounds))} for i, t in enumerate(taus)]


def test_per_prompt_counts_and_domains():
    records = [SimpleNamespace(stream_index=i, tokens_per_round=t) for i, t in [(1, 3), (0, 1), (1, 2), (0, 2)]]
    counts = per_prompt_counts(records)
    assert counts == [{"index": 0, "rounds": 2, "tokens": 3}, {"index": 1, "rounds": 2, "tokens": 5}]
    assert domain_accepted_length(counts, ["code", "chat"]) == {"code": 1.5, "chat": 2.5}
    assert domain_accepted_length(counts, ["code", "code"]) == {"code": 2.0}
    assert per_prompt_counts([]) == []


def test_identical_methods_tie_everywhere():
    g = paired_gain(rows([1.5, 2.0, 1.2]), rows([1.5, 2.0, 1.2]))
    assert g["n"] == 3 and g["ties"] == 3 and g["better"] == g["worse"] == 0
    assert g["gain"] == 0.0 and g["gain_ci"] == [0.0, 0.0] and g["pooled_gain"] == 0.0
    assert g["wilcoxon_p"] == 1.0


def test_gain_is_the_geometric_mean_ratio_with_a_t_interval():
    frozen = [1.0, 2.0, 1.5, 1.2, 1.8, 1.1, 1.4, 2.2, 1.3, 1.6]
    ratio = [1.1, 1.3, 1.05, 1.2, 1.25, 0.95, 1.15, 1.1, 1.3, 1.2]
    online = [f * r for f, r in zip(frozen, ratio)]
    g = paired_gain(rows(frozen, 1000), rows(online, 1000))
    logs = np.log(np.array(online) / np.array(frozen))
    assert g["gain"] == pytest.approx(math.expm1(logs.mean()), rel=1e-3)
    lo, hi = stats.t.interval(0.95, len(logs) - 1, loc=logs.mean(), scale=stats.sem(logs))
    assert g["gain_ci"] == pytest.approx([math.expm1(lo), math.expm1(hi)], rel=1e-2)
    assert g["better"] == 9 and g["worse"] == 1
    # 9 of 10 positive with the single negative of the smallest rank: exact two-sided p = 2 * 2 / 2**10
    assert g["wilcoxon_p"] == pytest.approx(stats.wilcoxon(np.array(online) - np.array(frozen)).pvalue)
    assert g["wilcoxon_p"] < 0.01
    assert g["pooled_gain"] == pytest.approx(sum(online) / sum(frozen) - 1, rel=1e-3)


def test_only_shared_prompts_count_and_bad_input_is_refused():
    g = paired_gain(rows([1.0, 2.0, 3.0]), rows([2.0, 2.0])[:1])
    assert g["n"] == 1 and g["gain"] == pytest.approx(1.0) and math.isnan(g["wilcoxon_p"])
    assert all(math.isnan(x) for x in g["gain_ci"])
    empty = paired_gain([], rows([1.0]))
    assert empty["n"] == 0 and math.isnan(empty["gain"])
    with pytest.raises(ValueError, match="confidence"):
        paired_gain(rows([1.0]), rows([1.0]), confidence=1.0)
    with pytest.raises(ValueError, match="zero rounds"):
        paired_gain([{"index": 0, "rounds": 0, "tokens": 0}], rows([1.0]))
