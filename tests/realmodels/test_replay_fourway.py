"""benchmarks/replay_fourway: the four-way table's rows and paired comparisons on
hand-computed numbers."""
from __future__ import annotations

import math

import pytest

from benchmarks.replay_fourway import compare, method_row


def _rows(taus, decode=1.0, update=0.0):
    """Prompt i: 40 rounds, 40 * tau_i tokens, the given seconds."""
    return {i: {"rounds": 40, "tokens": int(round(40 * t)), "decode": decode, "update": update}
            for i, t in enumerate(taus)}


def test_rows_price_background_and_serial():
    rows = _rows([2.0, 1.5], decode=2.0, update=3.0)
    row = method_row(rows, ["code", "chat"], baseline_tps=5.0)
    assert row["tau"] == pytest.approx(140 / 80)
    assert row["tau_per_domain"] == {"code": 2.0, "chat": 1.5}
    assert row["tokens_per_s_background"] == pytest.approx(140 / 4)
    assert row["tokens_per_s_serial"] == pytest.approx(140 / 10)
    assert row["speedup_serial"] == pytest.approx(140 / 10 / 5.0)


def test_comparison_is_paired_per_prompt():
    frozen = _rows([1.0, 2.0, 1.5, 1.25], decode=1.0)
    online = _rows([1.1, 2.2, 1.65, 1.375], decode=1.0, update=1.0)      # +10 % on every prompt
    out = compare(frozen, online, ["code", "code", "chat", "chat"])
    assert out["tau"]["gain"] == pytest.approx(0.10)
    assert out["tau"]["gain_ci"][0] == pytest.approx(0.10) and out["tau"]["better"] == 4
    assert set(out["tau_per_domain"]) == {"code", "chat"}
    assert out["tokens_per_s_background"]["ratio"] == pytest.approx(1.10)
    assert out["tokens_per_s_serial"]["ratio"] == pytest.approx(0.55)     # the updates double the time
    # only shared prompts count
    assert compare(frozen, {0: online[0], 1: online[1]}, ["code"] * 4)["tau"]["n"] == 2
    noisy = compare(frozen, _rows([1.2, 1.9, 1.7, 1.1]), ["code"] * 4)
    low, high = noisy["tokens_per_s_background"]["ratio_ci"]
    assert low < noisy["tokens_per_s_background"]["ratio"] < high and not math.isnan(low)


def test_cost_model_check_reproduces_the_priced_serial_ratio():
    """With the online draft drafting as fast as the frozen one, the model's serial
    speedup is the replay's priced ratio exactly (the same arithmetic on the same seconds)."""
    from benchmarks.replay_fourway import cost_model_check
    frozen = {i: {"rounds": 40, "tokens": 60, "verify": 4.0, "draft": 1.0, "decode": 5.0, "update": 0.0}
              for i in range(3)}
    online = {i: {"rounds": 40, "tokens": 66, "verify": 4.0, "draft": 1.0, "decode": 5.0, "update": 2.5}
              for i in range(3)}
    check = cost_model_check(frozen, online)
    assert check["gain"] == pytest.approx(0.10)
    assert check["predicted_serial"] == pytest.approx(1.10 * 5.0 / 7.5)
    assert check["measured_serial"] == pytest.approx(check["predicted_serial"])
