"""The paired samples the measured verdicts read: `ltd eval` rows carry
per-(pass, prompt) seconds and per-episode tokens/s, the regret sweep per-seed values,
and `ltd.paired_speed_ratio` turns two rows into the paired ratio."""
from __future__ import annotations

import numpy as np
import pytest


def _record(stream_index: int, tokens: int, seconds: float):
    from specloop.record import RoundRecord
    return RoundRecord(0, stream_index, 4, 2, 5, tokens - 1, tokens, draft_time=0.25 * seconds,
                       verify_time=0.75 * seconds)


def test_paired_rows_keep_the_seconds_of_every_pair():
    from specloop.ltd.evaluate import evaluate_rows_paired
    from specloop.figures.ltd import paired_speed_ratio
    from specloop.record import Trace

    speed = {"static": 1.0, "ltd": 0.8}
    prompt_cost = {1: 1.0, 2: 2.0, 3: 0.5}

    def run(policy, prompts):
        seconds = speed[policy] * prompt_cost[prompts[0]]
        return Trace([_record(prompts[0], 3, seconds)]), [2], [4]

    rows, _ = evaluate_rows_paired(run, {"static": "static", "ltd": "ltd"}, prompts=[1, 2, 3], repeats=2)
    static, ltd = rows
    assert static["pair_seconds"] == pytest.approx([1.0, 2.0, 0.5] * 2)      # pass-major, prompt order
    assert ltd["pair_seconds"] == pytest.approx([0.8, 1.6, 0.4] * 2)
    assert np.mean(np.divide(static["pair_seconds"], ltd["pair_seconds"])) == pytest.approx(ltd["paired_speedup"])
    est = paired_speed_ratio(ltd, static, "ltd / static")
    assert est.n == 6 and est.effect == pytest.approx(1.25)          # every pair 1.25x: zero-width interval
    assert paired_speed_ratio(ltd, None, "x") is None
    assert paired_speed_ratio({"config": "a"}, static, "x") is None     # an eval written before the field


def test_unpaired_rows_give_tokens_per_s_per_episode():
    from specloop.ltd.evaluate import evaluate_rows
    from specloop.figures.ltd import paired_speed_ratio
    from specloop.record import Trace

    def run(policy):          # two episodes: 2 rounds of 3 tokens in 1 s / 1 round of 4 tokens in 2 s
        scale = 1.0 if policy == "static" else 0.5
        return Trace([_record(0, 3, 0.5 * scale), _record(0, 3, 0.5 * scale),
                      _record(1, 4, 2.0 * scale)]), [2, 2, 2], [4, 4, 4]

    rows, _ = evaluate_rows(run, {"static": "static", "ltd": "ltd"}, None)
    assert rows[0]["tokens_per_s_per_episode"] == pytest.approx([6.0, 2.0])
    assert rows[1]["tokens_per_s_per_episode"] == pytest.approx([12.0, 4.0])
    est = paired_speed_ratio(rows[1], rows[0], "ltd / static")
    assert est.n == 2 and est.effect == pytest.approx(2.0)


def test_regret_sweep_rows_have_per_seed_values_in_seed_order():
    from specloop.sim.online import SweepConfig, regret_sweep
    rows = regret_sweep(SweepConfig(scenarios=("stationary",), learners=("fixed", "ogd"),
                                    rounds_list=(20, 40), seeds=(2, 0)))
    for row in rows:
        assert len(row["speedup_by_seed"]) == len(row["regret_at_max_T_by_seed"]) == 2
        assert np.mean(row["speedup_by_seed"]) == pytest.approx(row["speedup"])
        assert np.mean(row["regret_at_max_T_by_seed"]) == pytest.approx(row["regret_at_max_T"])
    one = regret_sweep(SweepConfig(scenarios=("stationary",), learners=("ogd",), rounds_list=(20, 40), seeds=(0,)))
    assert rows[1]["speedup_by_seed"][0] == pytest.approx(one[0]["speedup_by_seed"][0])   # seed 0 first
