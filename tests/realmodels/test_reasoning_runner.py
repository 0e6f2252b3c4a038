"""The reasoning runner: a killed run resumes to the uninterrupted records (online
draft updates included), summaries and speedups, refusals, CLI bad input."""
from __future__ import annotations

import json

import pytest

from specloop.realmodels.reasoning.judge import ExactMatchJudge
from specloop.realmodels.reasoning.runner import (ReasonConfig, ReasonRunner, add_speedups, fitting_group,
                                                  read_records, resolve_methods)
from tests.realmodels.reasoning_util import contains_answer, sum_items, target_and_draft

CONFIG = ReasonConfig(chunk=2, num_draft_steps=2, max_new_tokens=12, max_step_tokens=6, lr=3e-2, epochs=2,
                      batch_size=2)


@pytest.fixture(scope="module")
def models():
    return target_and_draft()


def _items(n=4):
    return sum_items(n)


def _runner(models, out, items=None, config=CONFIG):
    target, draft = models
    return ReasonRunner(target, draft, items or _items(), out, config, judge=ExactMatchJudge(),
                        scorer=contains_answer)


def _comparable(path):
    return [{k: v for k, v in r.items() if k != "timing"} for r in read_records(path)]


@pytest.mark.parametrize("method", ["online-lr", "osd-lr"])
def test_killed_run_resumes_to_identical_records(models, tmp_path, method):
    full = _runner(models, tmp_path / "full").run_method(method)
    part = _runner(models, tmp_path / "resumed").run_method(method, stop_after=3)
    assert part["prompts"] == 3
    records = tmp_path / "resumed" / method / "records.jsonl"
    # killed inside prompt 3 after its record was written but before the state was saved, mid-line
    extra = read_records(tmp_path / "full" / method / "records.jsonl")[3]
    with open(records, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(extra) + "\n" + json.dumps(extra)[:30])
    resumed = _runner(models, tmp_path / "resumed").run_method(method)
    assert _comparable(records) == _comparable(tmp_path / "full" / method / "records.jsonl")
    assert [r["index"] for r in read_records(records)] == list(range(4))
    assert resumed["prompts"] == full["prompts"] == 4
    assert [c["update"]["pairs"] for c in full["per_chunk"][:2]] == \
        [c["update"]["pairs"] for c in resumed["per_chunk"][:2]]


def test_updates_change_the_draft_and_frozen_lr_does_not(models, tmp_path):
    runner = _runner(models, tmp_path)
    frozen = runner.run_method("lr")
    online = runner.run_method("online-lr")
    assert frozen["update_seconds"] == 0.0 and online["per_chunk"][0]["update"]["pairs"] > 0
    before = _comparable(tmp_path / "lr" / "records.jsonl")
    after = _comparable(tmp_path / "online-lr" / "records.jsonl")
    # the draft's proposals (the judged pairs): the same draft in chunk 0, the updated one after it
    assert [r["judged"] for r in before[:2]] == [r["judged"] for r in after[:2]]
    assert [r["judged"] for r in before[2:]] != [r["judged"] for r in after[2:]]
    # the runner copied the draft: the loaded one is untouched (a second frozen run is identical)
    again = _runner(models, tmp_path / "again").run_method("lr")
    assert _comparable(tmp_path / "again" / "lr" / "records.jsonl") == before
    assert again["avg_accepted_steps"] == frozen["avg_accepted_steps"]


def test_summaries_speedups_and_refusals(models, tmp_path):
    runner = _runner(models, tmp_path, _items(3))
    summaries = {m: runner.run_method(m) for m in ("target", "draft", "lr")}
    add_speedups(summaries)
    assert summaries["target"]["speedup"] == pytest.approx(1.0)
    assert summaries["target"]["avg_accepted_steps"] == 1.0 and summaries["draft"]["avg_accepted_steps"] == 1.0
    lr = summaries["lr"]
    assert lr["avg_accepted_steps"] >= 1.0 and lr["mean_accepted_length"] is None
    assert set(lr["tasks"]) == {"arith"} and lr["accuracy"] is not None
    assert [c["chunk"] for c in lr["per_chunk"]] == [0, 1] and lr["per_chunk"][0]["prompts"] == 2
    with pytest.raises(ValueError, match="unknown method"):
        resolve_methods("lr,turbo")
    with pytest.raises(ValueError, match="other settings"):
        _runner(models, tmp_path, _items(3), ReasonConfig(chunk=3, max_new_tokens=12)).run_method("lr")
    with pytest.raises(ValueError, match="needs a judge"):
        ReasonRunner(*models, _items(2), tmp_path / "x", CONFIG).run_method("lr")


@pytest.mark.parametrize("argv", [["--prompts", "0"], ["--tasks", "gsm9k"], ["--method", "lr,x"],
                                  ["--gamma", "0"], ["--lr", "-1"], ["--step-delimiter", "tab"],
                                  ["--batch-prompts", "0"], ["--timed", "1", "--batch-prompts", "2"],
                                  ["--token-spec", "--batch-prompts", "2"]])
def test_cli_bad_input_exits_2(argv, capsys):
    from specloop.cli import main
    assert main(["reason", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("specloop: error:")


def test_step_delimiter_is_a_setting_and_older_runs_resume(models, tmp_path):
    """A run's state records its step delimiter: another delimiter is refused; a state
    written before the setting existed (no key) resumes as the task rules' default."""
    from specloop.realmodels.online import load_checkpoint, save_checkpoint
    full = _runner(models, tmp_path / "full").run_method("lr")
    _runner(models, tmp_path / "old").run_method("lr", stop_after=2)
    state_path = tmp_path / "old" / "lr" / "state.pt"
    state = load_checkpoint(state_path)
    del state["config"]["step_delimiter"]          # as written before the setting existed
    save_checkpoint(state_path, state)
    resumed = _runner(models, tmp_path / "old").run_method("lr")
    assert _comparable(tmp_path / "old" / "lr" / "records.jsonl") == _comparable(tmp_path / "full" / "lr" / "records.jsonl")
    assert resumed["prompts"] == full["prompts"] == 4
    newline = ReasonConfig(**{**CONFIG.__dict__, "step_delimiter": "newline"})
    with pytest.raises(ValueError, match="other settings"):
        _runner(models, tmp_path / "full", config=newline).run_method("lr")
    with pytest.raises(ValueError, match="unknown step delimiter"):
        ReasonConfig(step_delimiter="tab")


@pytest.mark.parametrize("size, width, per_prompt, remaining, expected", [
    (24, 8, None, 60.0, 8),        # nothing measured yet: one wave, to measure it
    (3, 8, None, 60.0, 3),
    (24, 8, None, 0.0, 0),         # deadline passed
    (24, 8, 10.0, 1000.0, 24),     # the whole group fits
    (24, 8, 10.0, 150.0, 15),      # shrunk to what fits
    (24, 8, 10.0, 79.0, 0),        # not even one wave (8 x 10 s) fits
    (2, 8, 10.0, 79.0, 0),         # a short wave still costs about a full one
    (2, 8, 10.0, 80.0, 2),
    (1, 1, 30.0, 31.0, 1),         # prompts served alone
    (1, 1, 30.0, 29.0, 0),
    (0, 8, 1.0, 100.0, 0),
])
def test_fitting_group_starts_only_what_ends_in_time(size, width, per_prompt, remaining, expected):
    assert fitting_group(size, width, per_prompt, remaining) == expected


def test_a_passed_deadline_serves_nothing_and_a_deadline_in_time_gives_the_full_records(models, tmp_path):
    import time
    full = _runner(models, tmp_path / "full").run_method("lr", batch_prompts=2)
    none = _runner(models, tmp_path / "cut").run_method("lr", batch_prompts=2, deadline=time.time() - 1)
    assert none["prompts"] == 0
    first = _runner(models, tmp_path / "cut").run_method("lr", batch_prompts=2, deadline=time.time() + 3600)
    assert first["prompts"] == full["prompts"] == 4
    assert _comparable(tmp_path / "cut" / "lr" / "records.jsonl") == \
        _comparable(tmp_path / "full" / "lr" / "records.jsonl")
