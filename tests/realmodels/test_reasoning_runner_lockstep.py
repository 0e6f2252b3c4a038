"""The reasoning runner in lockstep: prompts of a chunk served together give the
records of prompts served one by one (draft updates at chunk ends included), the
timing prompts are served again alone into timing.jsonl and agree with their lockstep
record, a killed lockstep run resumes to the same records, and speed comes from the
batch-1 rows only, with a paired interval."""
from __future__ import annotations

import math

import pytest

from specloop.realmodels.reasoning.judge import ExactMatchJudge
from specloop.realmodels.reasoning.runner import ReasonConfig, ReasonRunner, add_speedups, read_records
from tests.realmodels.reasoning_util import contains_answer, sum_items, target_and_draft

CONFIG = ReasonConfig(chunk=3, num_draft_steps=2, max_new_tokens=12, max_step_tokens=6, lr=3e-2, epochs=2,
                      batch_size=2)


@pytest.fixture(scope="module")
def models():
    return target_and_draft()


def _items(n=6):
    return sum_items(n)


def _runner(models, out):
    target, draft = models
    return ReasonRunner(target, draft, _items(), out, CONFIG, judge=ExactMatchJudge(),
                        scorer=contains_answer)


def _quality(path):
    return [{k: v for k, v in r.items() if k not in ("timing", "batch")} for r in read_records(path)]


@pytest.mark.parametrize("method,width", [("target", 4), ("draft", 4), ("lr", 4), ("lr", 2), ("online-lr", 2)])
def test_lockstep_records_equal_one_by_one(models, tmp_path, method, width):
    alone = _runner(models, tmp_path / "alone").run_method(method)
    together = _runner(models, tmp_path / "lockstep").run_method(method, batch_prompts=width, timing_prompts=[1, 4])
    folder = tmp_path / "lockstep" / method
    assert _quality(folder / "records.jsonl") == _quality(tmp_path / "alone" / method / "records.jsonl")
    # groups never cross a chunk end (updates happen there): 3 + 3 prompts, at most `width` in flight
    assert [r["batch"] for r in read_records(folder / "records.jsonl")] == [min(width, 3)] * 6
    timing = read_records(folder / "timing.jsonl")
    assert [t["index"] for t in timing] == [1, 4] and all(t["same_as_lockstep"] for t in timing)
    assert together["timed_prompts"] == 2 and alone["timed_prompts"] == 6
    assert together["lockstep_mismatches"] == 0 and together["prompts"] == 6
    assert together["avg_accepted_steps"] == alone["avg_accepted_steps"]
    assert set(together["per_prompt_tokens_per_s"]) == {"1", "4"}
    if method == "online-lr":
        assert together["per_chunk"][0]["update"]["pairs"] == alone["per_chunk"][0]["update"]["pairs"] > 0


def test_killed_lockstep_run_resumes(models, tmp_path):
    full = _runner(models, tmp_path / "full").run_method("online-lr", batch_prompts=3, timing_prompts=[0, 5])
    part = _runner(models, tmp_path / "part").run_method("online-lr", batch_prompts=3, timing_prompts=[0, 5],
                                                          stop_after=4)
    assert part["prompts"] == 4      # a group cut at the stop: 3, then 1
    resumed = _runner(models, tmp_path / "part").run_method("online-lr", batch_prompts=3, timing_prompts=[0, 5])
    assert _quality(tmp_path / "part" / "online-lr" / "records.jsonl") == \
        _quality(tmp_path / "full" / "online-lr" / "records.jsonl")
    assert [t["index"] for t in read_records(tmp_path / "part" / "online-lr" / "timing.jsonl")] == [0, 5]
    assert resumed["avg_accepted_steps"] == full["avg_accepted_steps"]


def test_paired_speedup_and_quality_fields(models, tmp_path):
    runner = _runner(models, tmp_path)
    summaries = {m: runner.run_method(m, batch_prompts=3, timing_prompts=[0, 2, 4]) for m in ("target", "lr")}
    add_speedups(summaries)
    lr = summaries["lr"]
    assert lr["speedup_paired_n"] == 3 and lr["speedup_paired_ci"][0] <= lr["speedup_paired"] <= \
        lr["speedup_paired_ci"][1]
    assert summaries["target"]["speedup_paired"] == pytest.approx(1.0)
    low, high = lr["accuracy_ci"]
    assert 0.0 <= low <= lr["accuracy"] <= high <= 100.0
    assert 0 <= lr["finished"] <= 6 and math.isfinite(lr["tokens_per_s"])
    with pytest.raises(ValueError, match="batch_prompts"):
        runner.run_method("lr", batch_prompts=0)


def test_timed_indices_spread_over_the_stream():
    from specloop.cli.reason_cmd import timed_indices
    assert timed_indices(100, 20) == list(range(0, 100, 5))
    assert timed_indices(6, 20) == list(range(6)) and timed_indices(7, 3) == [0, 2, 4]


def test_a_spent_deadline_stops_before_the_next_group_and_resumes(models, tmp_path):
    import time
    stopped = _runner(models, tmp_path).run_method("lr", batch_prompts=3, deadline=time.time() - 1)
    assert stopped["prompts"] == 0
    done = _runner(models, tmp_path).run_method("lr", batch_prompts=3)
    assert done["prompts"] == 6


def test_frozen_rows_resume_under_other_update_settings(models, tmp_path):
    """Target, Draft and LR records do not depend on the draft's learning rate: a
    sweep over it reuses them; an updating method's folder still refuses a change."""
    import dataclasses
    target, draft = models
    other = dataclasses.replace(CONFIG, lr=1e-3, epochs=1)
    first = _runner(models, tmp_path).run_method("lr", stop_after=2)
    again = ReasonRunner(target, draft, _items(), tmp_path, other, judge=ExactMatchJudge(),
                         scorer=contains_answer)
    assert again.run_method("lr")["prompts"] == 6 and first["prompts"] == 2
    _runner(models, tmp_path).run_method("online-lr", stop_after=1)
    with pytest.raises(ValueError, match="other settings"):
        again.run_method("online-lr")


def test_updating_run_continues_from_its_small_files_alone(models, tmp_path):
    """An Online-LR run stopped after its first chunk's update, its folder copied
    elsewhere (records, pairs, a few-kB state: no draft weights), continues there to
    the records of an uninterrupted run; the replayed update matches the recorded one."""
    import shutil
    full = _runner(models, tmp_path / "full").run_method("online-lr", batch_prompts=2)
    _runner(models, tmp_path / "a").run_method("online-lr", batch_prompts=2, stop_after=4)
    folder = tmp_path / "a" / "online-lr"
    assert (folder / "state.pt").stat().st_size < 50_000
    shutil.copytree(folder, tmp_path / "b" / "online-lr")
    resumed = _runner(models, tmp_path / "b").run_method("online-lr", batch_prompts=2)
    assert _quality(tmp_path / "b" / "online-lr" / "records.jsonl") == \
        _quality(tmp_path / "full" / "online-lr" / "records.jsonl")
    assert resumed["replay_max_rel_diff"] == pytest.approx(0.0, abs=1e-6)
    assert [c["update"]["loss_first"] for c in resumed["per_chunk"]] == \
        pytest.approx([c["update"]["loss_first"] for c in full["per_chunk"]], nan_ok=True)
    (tmp_path / "b" / "online-lr" / "pairs.jsonl").write_text("")
    with pytest.raises(ValueError, match="no pairs of prompt 0"):
        _runner(models, tmp_path / "b").run_method("online-lr")


def test_a_run_with_a_saved_draft_keeps_saving_it_and_resumes_twice(models, tmp_path):
    """A state written before pairs.jsonl existed carries the draft itself; such a run
    goes on saving it (its pairs file starts late), so it resumes again and again."""
    from specloop.realmodels.online import load_checkpoint, save_checkpoint
    full = _runner(models, tmp_path / "full").run_method("online-lr")
    _runner(models, tmp_path / "old").run_method("online-lr", stop_after=3)
    folder = tmp_path / "old" / "online-lr"
    # make it look like the older layout: the draft in the state after chunk 0, no pairs file
    _runner(models, tmp_path / "probe").run_method("online-lr", stop_after=3)
    import copy

    from specloop.realmodels.reasoning.dpo import DraftUpdater
    _, draft = models
    runner = _runner(models, tmp_path / "probe")
    updater = DraftUpdater(copy.deepcopy(draft.model), "dpo", lr=CONFIG.lr, beta=CONFIG.beta, epochs=CONFIG.epochs,
                           batch_size=CONFIG.batch_size, clip=CONFIG.clip)
    runner._replay(tmp_path / "probe" / "online-lr", updater, load_checkpoint(tmp_path / "probe" / "online-lr" /
                                                                             "state.pt"))
    state = load_checkpoint(folder / "state.pt")
    state["updater"] = updater.state_dict()
    save_checkpoint(folder / "state.pt", state)
    (folder / "pairs.jsonl").unlink()
    _runner(models, tmp_path / "old").run_method("online-lr", stop_after=5)
    assert load_checkpoint(folder / "state.pt").get("updater") is not None
    _runner(models, tmp_path / "old").run_method("online-lr")
    assert _quality(folder / "records.jsonl") == _quality(tmp_path / "full" / "online-lr" / "records.jsonl")
    assert full["prompts"] == 6


def test_a_replay_that_does_not_reproduce_the_record_is_refused(models, tmp_path):
    from specloop.realmodels.online import load_checkpoint, save_checkpoint
    _runner(models, tmp_path).run_method("online-lr", stop_after=4)
    path = tmp_path / "online-lr" / "state.pt"
    state = load_checkpoint(path)
    assert state["updates"][0]["pairs"] > 0
    state["updates"][0]["loss_first"] *= 1.01
    save_checkpoint(path, state)
    with pytest.raises(ValueError, match="differs from the recorded one"):
        _runner(models, tmp_path).run_method("online-lr")
    state["updates"][0]["pairs"] += 1
    save_checkpoint(path, state)
    with pytest.raises(ValueError, match="pairs, the record says"):
        _runner(models, tmp_path).run_method("online-lr")


def test_update_seconds_are_charged_to_the_timed_rows_by_their_share():
    from specloop.realmodels.reasoning.runner import summarise_records
    records = [{"index": i, "task": "arith", "batch": 4, "rounds": 1, "committed_per_round": [1],
                "accepted_per_round": [0], "spec_tokens": 0, "spec_rounds": 0, "target_tokens": 100,
                "correct": None, "stop_reason": "eos", "timing": {"seconds": 0.0}} for i in range(4)]
    timing = [{"index": 0, "task": "arith", "target_tokens": 100, "timing": {"seconds": 10.0},
               "same_as_lockstep": True}]
    summary = summarise_records(records, 4, [{"chunk": 0, "seconds": 8.0, "pairs": 1}], timing=timing)
    # 100 timed tokens of 400: a quarter of the 8 update seconds
    assert summary["tokens_per_s_with_training"] == pytest.approx(100 / (10 + 2))
