"""benchmarks/stream_sources.py's pure accounting (no model, no recording): pooled tau of
per-request taus (Arctic's rows), the wall-clock prompt spread over domains, and the
targets' booleans (Hedge must beat the best source when the best source changes)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from benchmarks.stream_sources import compute_targets, pooled_tau, wall_indices_of


def test_pooled_tau_sums_tokens_and_rounds():
    # request 0: 10 tokens in 5 rounds, 1: 30 in 10, 2: 8 in 8 (a mean of taus would be 5/3 + ...)
    out = pooled_tau([10, 30, 8], [2.0, 3.0, 1.0], ["a", "a", "b"], chunk=2)
    assert out["per_domain"]["a"] == pytest.approx(40 / 15)
    assert out["per_domain"]["b"] == pytest.approx(1.0)
    assert out["per_chunk_tau"] == pytest.approx([40 / 15, 1.0])
    with pytest.raises(ValueError):
        pooled_tau([10], [0.0], ["a"], 1)


def test_wall_indices_spread_over_domains():
    items = [SimpleNamespace(index=i, dataset="abc"[i // 100]) for i in range(300)]
    picked = wall_indices_of(items, 7)
    per = [sum(1 for i in picked if i // 100 == d) for d in range(3)]
    assert per == [3, 2, 2] and picked[0] == 0 and 299 in picked
    assert wall_indices_of(items[:5], 24) == [0, 1, 2, 3, 4]       # fewer prompts than asked


def _replay(rates_by_domain):
    out = {}
    for name, rates in rates_by_domain.items():
        per = {d: {"priced_tokens_per_s_float32": r} for d, r in rates.items()}
        out[name] = {"priced_tokens_per_s_float32": sum(rates.values()) / len(rates),
                     "mean_accepted_length": 2.0, "per_domain": per}
    return out


@pytest.mark.parametrize("hedge_rate, changes, met", [(9.9, False, True), (9.7, False, False),
                                                       (9.9, True, False), (10.5, True, True)])
def test_hedge_target(hedge_rate, changes, met):
    rates = {"suffix": {"x": 10.0, "y": 10.0}, "ngram": {"x": 9.0, "y": 11.0 if changes else 9.0}}
    replay = _replay(rates)
    best = max(r["priced_tokens_per_s_float32"] for r in replay.values())
    replay["hedge-choose"] = {"priced_tokens_per_s_float32": hedge_rate * best / 10.0, "mean_accepted_length": 2.0}
    row = compute_targets({"float32": replay}, {}, {}, {})["hedge-choose_vs_best_single_source_float32_table"]
    assert row["best_source_changes"] is changes and row["met"] is met
