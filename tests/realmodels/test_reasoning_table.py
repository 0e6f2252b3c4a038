"""benchmarks/reasoning: the Table 2 verdicts on hand-written records (known paired
ratios and differences), each with its effect, interval and n."""
from __future__ import annotations

import json
import math

import pytest

from benchmarks.reasoning import verdicts


def _write(folder, rows, timing=()):
    folder.mkdir(parents=True)
    (folder / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "timing.jsonl").write_text("".join(json.dumps(t) + "\n" for t in timing))


def _rows(avglen, correct, batch=4):
    """One record per prompt: 4 rounds committing 4 * avglen steps in all."""
    out = []
    for i, (length, ok) in enumerate(zip(avglen, correct)):
        per_round = [length] * 4
        out.append({"index": i, "rounds": 4, "committed_per_round": per_round, "correct": ok, "batch": batch,
                    "target_tokens": 100, "timing": {"seconds": 1.0}})
    return out


def _timing(tokens_per_s):
    return [{"index": i, "target_tokens": 100, "timing": {"seconds": 100 / v}} for i, v in enumerate(tokens_per_s)]


def test_verdicts_from_paired_prompts(tmp_path):
    n = 6
    _write(tmp_path / "target", _rows([1.0] * n, [1.0] * n), _timing([10.0] * n))
    # LR: AvgLen 1.5x OSD-LR's on every prompt, 1.5x the target's speed, same answers
    _write(tmp_path / "lr", _rows([1.5] * n, [1.0] * n),
           _timing([15.0, 14.0, 16.0, 15.0, 15.5, 14.5]))
    _write(tmp_path / "osd-lr", _rows([1.0] * n, [1.0] * n), _timing([10.0, 11.0, 9.0, 10.0, 10.5, 9.5]))
    # Online-LR: AvgLen +/- around LR's (undecided), wrong where the target is right on 5 of 6
    _write(tmp_path / "online-lr", _rows([1.6, 1.4, 1.55, 1.45, 1.5, 1.5], [0.0, 0.0, 0.0, 1.0, 0.0, 0.0]),
           _timing([15.0] * n))
    found = {v["statement"]: v for v in verdicts(tmp_path, ["target", "lr", "osd-lr", "online-lr"])}
    assert found["lr > osd-lr in AvgLen"]["verdict"] == "holds"
    assert found["lr > osd-lr in AvgLen"]["effect"] == pytest.approx(1.5)
    assert found["online-lr > lr in AvgLen"]["verdict"] == "undecided"
    assert found["lr >= 1.2x the target"]["verdict"] == "holds" and found["lr >= 1.2x the target"]["n"] == n
    lo, hi = found["lr >= 1.2x the target"]["interval"]
    assert lo > 1.2 and lo <= found["lr >= 1.2x the target"]["effect"] <= hi
    assert found["lr accuracy within 3 points of the target"]["effect"] == 0.0
    online_acc = found["online-lr accuracy within 3 points of the target"]
    assert online_acc["effect"] == pytest.approx(-500 / 6) and online_acc["verdict"] == "does not hold"
    assert all(math.isfinite(v["effect"]) for v in found.values() if v.get("effect") is not None)


def test_too_few_paired_prompts_is_undecided(tmp_path):
    _write(tmp_path / "target", _rows([1.0], [1.0]), _timing([10.0]))
    _write(tmp_path / "lr", _rows([1.5], [1.0]), _timing([20.0]))
    found = {v["statement"]: v for v in verdicts(tmp_path, ["target", "lr"])}
    assert found["lr >= 1.2x the target"]["verdict"] == "undecided" and found["lr >= 1.2x the target"]["n"] == 1


def test_sweep_row_gain_after_the_first_update():
    from benchmarks.reason_sweep import setting_row
    frozen = [{"index": i, "rounds": 4, "committed_per_round": [1, 1, 1, 1]} for i in range(8)]
    # the same as frozen before the first update (prompts 0-3), then +50 % AvgLen with a little spread
    online = [{"index": i, "rounds": 4, "committed_per_round": [1, 1, 1, 1] if i < 4 else [2, 1, 2, 1 + (i % 2)]}
              for i in range(8)]
    summary = {"per_chunk": [{"mean_accepted_draft_steps": 0.0, "update": {"pairs": 3}},
                             {"mean_accepted_draft_steps": 0.5, "update": None}], "avg_accepted_steps": 1.3}
    row = setting_row(online, frozen, interval=4, summary=summary)
    assert row["later_prompts"] == 4 and row["verdict"] == "holds"
    assert row["gain_after_first_update"] == pytest.approx(math.exp(sum(math.log(x) for x in
                                                                        [1.5, 1.75, 1.5, 1.75]) / 4) - 1)
    assert row["gain_ci"][0] > 0 and row["accepted_draft_steps_per_round_per_chunk"] == [0.0, 0.5]
    assert setting_row(online[:5], frozen, interval=4, summary=summary)["verdict"] == "undecided"


def test_cost_model_inputs_come_from_the_timed_rows(tmp_path):
    from benchmarks.reasoning import cost_model
    target = [{"index": i, "batch": 1, "target_tokens": 100, "rounds": 5, "committed_per_round": [1] * 5,
               "timing": {"seconds": 40.0}, "correct": None} for i in range(2)]
    lr = [{"index": i, "batch": 1, "target_tokens": 60, "rounds": 3, "committed_per_round": [2, 1, 1],
           "accepted_per_round": [1, 0, 0], "drafted_per_round": [3, 3, 3], "judged": [["a", "a"]] * 4,
           "timing": {"seconds": 30.0, "draft": 4.5, "target": 20.0, "judge": 4.0, "commit": 1.5}, "correct": None}
          for i in range(2)]
    _write(tmp_path / "target", target)
    _write(tmp_path / "lr", lr)
    model = cost_model(tmp_path, 3, {"batch_gamma_over_batch1": 1.8})
    inputs = model["inputs"]
    assert inputs["t_decode"] == pytest.approx(0.4) and inputs["step_tokens"] == pytest.approx(15.0)
    assert inputs["t_draft"] == pytest.approx(0.5) and inputs["t_judge"] == pytest.approx(1.0)
    assert inputs["t_commit"] == pytest.approx(0.5) and inputs["acceptance_rate"] == pytest.approx(0.25)
    assert model["measured_speedup"] == pytest.approx((120 / 60) / 2.5)
    assert model["with_batch_ratio_1"]["max_speedup_all_accepted"] > model["max_speedup_all_accepted"]
    assert cost_model(tmp_path, 3, None) is None
