"""The stream runner: methods table, resumable results (a killed run continues and
reproduces the uninterrupted records), summaries, CLI result/plot plumbing."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from specloop.realmodels.streams.runner import (BASELINE, METHODS, StreamConfig, StreamRunner, resolve_method,
                                                summarise)
from specloop.record import Trace
from tests.realmodels.decoder_util import plain_greedy
from tests.realmodels.test_online_util import hydra_drafter, prompts, tiny_loaded

ONLINE = {"lr": 0.05, "batch_size": 2, "osd_interval": 2}


@pytest.fixture(scope="module")
def target():
    return tiny_loaded()


def runner(target, out, mode="round"):
    config = StreamConfig(chunk=2, max_new_tokens=14, num_draft_tokens=3, online={**ONLINE, "mode": mode})
    return StreamRunner(target, prompts(5), out, config, make_drafter=lambda spec: hydra_drafter(target))


def comparable(path):
    keys = ("round_index", "stream_index", "num_draft_tokens", "accepted_tokens", "tokens_per_round")
    return [tuple(getattr(r, k) for k in keys) for r in Trace.load(path)]


def test_methods_table_and_names():
    assert resolve_method("Opt-Hydra") == METHODS["opt-hydra"]
    assert resolve_method("ens-eagle-3").drafter == "eagle3"
    assert resolve_method("Ens-EAGLE-3").learner == "ensemble"   # the registry's names
    assert resolve_method("Vanilla SD").learner is None and resolve_method("osd").drafter == "small-lm"
    assert resolve_method("optens-eagle").learner == "optimistic-ensemble"
    assert resolve_method("opt-hydra").learner == "optimistic" and resolve_method("osd-medusa").learner == "osd"
    assert resolve_method(BASELINE).drafter == ""
    with pytest.raises(ValueError, match="unknown method"):
        resolve_method("turbo-hydra")


@pytest.mark.parametrize("method,mode", [("ogd-hydra", "round"), ("osd-hydra", "round"),
                                         ("ens-hydra", "chunk")])
def test_resume_after_kill_reproduces_records(target, tmp_path, method, mode):
    full = runner(target, tmp_path / "full", mode).run_method(method)
    killed = runner(target, tmp_path / "resumed", mode)
    part = killed.run_method(method, stop_after=3)
    assert part["prompts_done"] == 3
    rounds = tmp_path / "resumed" / method / "rounds.jsonl"
    # a kill in the middle of prompt 3: some of its rounds written, the last one torn
    extra = Trace.load(tmp_path / "full" / method / "rounds.jsonl")
    torn = [r for r in extra if r.stream_index == 3][:2]
    with open(rounds, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(torn[0].to_dict()) + "\n" + json.dumps(torn[1].to_dict())[:25])
    resumed = runner(target, tmp_path / "resumed", mode).run_method(method)
    assert comparable(rounds) == comparable(tmp_path / "full" / method / "rounds.jsonl")
    assert resumed["prompts_done"] == full["prompts_done"] == 5
    assert resumed["mean_accepted_length"] == pytest.approx(full["mean_accepted_length"])
    assert [c["mean_accepted_length"] for c in resumed["chunks"]] == \
        pytest.approx([c["mean_accepted_length"] for c in full["chunks"]])
    assert len(resumed["chunks"]) == 3
    # running again does nothing new
    again = runner(target, tmp_path / "resumed", mode).run_method(method)
    assert comparable(rounds) == comparable(tmp_path / "full" / method / "rounds.jsonl")
    assert again["rounds"] == full["rounds"]


@pytest.mark.parametrize("method", ["opt-hydra", "ens-hydra"])
def test_state_written_at_chunk_ends_a_kill_between_serves_those_prompts_again(target, tmp_path, method):
    """A learner's state is not rewritten after every prompt (``state_every_s``): a run
    killed after prompt 2 (between chunk ends) resumes from the state of chunk 0 and
    serves prompt 2 again, to the uninterrupted run's records."""
    from specloop.realmodels.online import load_checkpoint
    full = runner(target, tmp_path / "full").run_method(method)

    class Killed(Exception):
        pass
    served = []

    def kill_after_third(_):
        served.append(1)
        if len(served) == 3:
            raise Killed
    killed = runner(target, tmp_path / "resumed")
    killed.state_every_s = 1e9
    with pytest.raises(Killed):
        killed.run_method(method, progress=kill_after_third)
    rounds = tmp_path / "resumed" / method / "rounds.jsonl"
    assert max(r.stream_index for r in Trace.load(rounds)) == 2          # prompt 2's rounds were written
    assert load_checkpoint(tmp_path / "resumed" / method / "state.pt")["prompts_done"] == 2   # chunk 0's state
    resumed = runner(target, tmp_path / "resumed").run_method(method)
    assert comparable(rounds) == comparable(tmp_path / "full" / method / "rounds.jsonl")
    assert resumed["rounds"] == full["rounds"]
    with pytest.raises(ValueError, match="state_every_s"):
        StreamRunner(target, prompts(2), tmp_path / "x", StreamConfig(), state_every_s=-1)


def test_deadline_stops_at_a_prompt_boundary_with_the_state_written(target, tmp_path, monkeypatch):
    """A run past its deadline writes its state after the prompt that ended past it and
    stops; the same call without a deadline continues to the uninterrupted records."""
    import time as real_time

    from specloop.realmodels.online import load_checkpoint
    from specloop.realmodels.streams import runner as runner_module
    full = runner(target, tmp_path / "full").run_method("opt-hydra")

    class Clock:                       # wall-clock time advances 10 s per served prompt
        now = 0.0

        def time(self):
            return self.now

        def monotonic(self):
            return real_time.monotonic()
    clock = Clock()
    monkeypatch.setattr(runner_module, "time", clock)

    def tick(_):
        clock.now += 10.0
    stopped = runner(target, tmp_path / "resumed").run_method("opt-hydra", progress=tick, deadline=25.0)
    assert stopped["stopped_early"] and stopped["prompts_done"] == 4      # prompt 3 ended past 25 s
    assert load_checkpoint(tmp_path / "resumed" / "opt-hydra" / "state.pt")["prompts_done"] == 4
    monkeypatch.setattr(runner_module, "time", real_time)
    resumed = runner(target, tmp_path / "resumed").run_method("opt-hydra")
    rounds = tmp_path / "resumed" / "opt-hydra" / "rounds.jsonl"
    assert comparable(rounds) == comparable(tmp_path / "full" / "opt-hydra" / "rounds.jsonl")
    assert not resumed["stopped_early"] and resumed["rounds"] == full["rounds"]


def test_outputs_are_the_targets_greedy_output(target, tmp_path):
    run = runner(target, tmp_path)
    for method in (BASELINE, "hydra", "opt-hydra"):
        run.run_method(method)
    from specloop.realmodels.online import load_checkpoint
    for method in (BASELINE, "hydra", "opt-hydra"):
        outputs = load_checkpoint(tmp_path / method / "state.pt")["outputs"]
        for ids, out in zip(run.prompts, outputs):
            assert out == plain_greedy(target.model, ids, 14, eos=2)
    base = Trace.load(tmp_path / BASELINE / "rounds.jsonl")
    assert base.mean_accepted_length() == 1.0 and set(base.column("num_draft_tokens")) == {0.0}


def test_other_settings_refuse_to_resume(target, tmp_path):
    runner(target, tmp_path).run_method("hydra", stop_after=1)
    runner(target, tmp_path).run_method("ogd-hydra", stop_after=1)

    def other(**changes):
        base = dict(chunk=2, max_new_tokens=14, num_draft_tokens=3, online={**ONLINE, "mode": "round"})
        return StreamRunner(target, prompts(5), tmp_path, StreamConfig(**{**base, **changes}),
                            make_drafter=lambda spec: hydra_drafter(target))
    with pytest.raises(ValueError, match="other settings"):
        other(max_new_tokens=9).run_method("hydra")
    with pytest.raises(ValueError, match="other settings"):
        other(online={**ONLINE, "mode": "chunk"}).run_method("ogd-hydra")
    with pytest.raises(ValueError, match="prompt stream"):
        StreamRunner(target, prompts(6)[1:], tmp_path, StreamConfig(chunk=2, max_new_tokens=14, num_draft_tokens=3,
                     online={**ONLINE, "mode": "round"}), make_drafter=lambda spec: hydra_drafter(target)
                     ).run_method("hydra")
    def retrained(spec):
        drafter = hydra_drafter(target)
        drafter.train_report = {"heldout_top1": 0.5}
        return drafter
    with pytest.raises(ValueError, match="retrained"):
        StreamRunner(target, prompts(5), tmp_path, StreamConfig(chunk=2, max_new_tokens=14, num_draft_tokens=3,
                     online={**ONLINE, "mode": "round"}), make_drafter=retrained).run_method("hydra")
    # a frozen draft's rounds do not depend on chunking or learner settings: it resumes
    assert other(chunk=3, online={"lr": 1.0}).run_method("hydra")["prompts_done"] == 5
    with pytest.raises(ValueError, match="empty"):
        StreamRunner(target, [], tmp_path, StreamConfig())


def test_missing_draft_names_what_is_missing(target, tmp_path):
    config = StreamConfig(chunk=2, max_new_tokens=4)
    run = StreamRunner(target, prompts(1), tmp_path, config)
    with pytest.raises((FileNotFoundError, ValueError), match="hydra"):
        run.run_method("opt-hydra")


def test_summary_counts_training_time():
    from specloop.record import RoundRecord
    recs = [RoundRecord(i, i // 2, 3, 3, 4, 2, 3, draft_time=0.1, verify_time=0.1, update_time=0.05)
            for i in range(6)]
    s = summarise(Trace(recs), {"chunk_train_time": [1.0], "prompts_done": 3}, chunk=2, num_prompts=3)
    assert s["mean_accepted_length"] == 3.0 and s["tokens"] == 18
    assert s["tokens_per_s"] == pytest.approx(18 / 1.2)
    assert s["tokens_per_s_with_training"] == pytest.approx(18 / (1.2 + 0.3 + 1.0))
    assert [c["train_seconds"] for c in s["chunks"]] == pytest.approx([1.2, 0.1])


def test_cli_result_and_plot(tmp_path):
    from types import SimpleNamespace
    from specloop.cli.stream_cmd import _result, plot_stream
    chunk = {"mean_accepted_length": 2.0, "tokens_per_s": 10.0, "tokens_per_s_with_training": 8.0}
    summary = {"mean_accepted_length": 2.0, "tokens_per_s": 10.0, "tokens_per_s_with_training": 8.0,
               "update_seconds": 1.0, "chunks": [chunk, chunk]}
    base = {**summary, "mean_accepted_length": 1.0, "tokens_per_s": 5.0}
    args = SimpleNamespace(target="tiny", datasets="humaneval,ifbench", order="shift")
    items = [SimpleNamespace(dataset="humaneval"), SimpleNamespace(dataset="ifbench")]
    result = _result({BASELINE: base, "opt-hydra": summary}, {}, items, StreamConfig(chunk=1), args)
    m = result["methods"]["opt-hydra"]
    assert set(m) >= {"mean_accepted_length", "speedup", "speedup_with_training", "per_chunk"}
    assert m["speedup"] == 2.0 and m["speedup_with_training"] == 1.6 and m["per_chunk"] == [2.0, 2.0]
    assert "vs_frozen" not in m          # its frozen draft did not run
    assert plot_stream(result, tmp_path / "s.png").stat().st_size > 0
    # with the frozen draft in the run: per-dataset tau and the paired per-prompt gain
    frozen = {**summary, "prompts": [{"index": 0, "rounds": 10, "tokens": 20}, {"index": 1, "rounds": 10, "tokens": 15}]}
    online = {**summary, "prompts": [{"index": 0, "rounds": 10, "tokens": 24}, {"index": 1, "rounds": 10, "tokens": 15}]}
    result = _result({BASELINE: base, "hydra": frozen, "opt-hydra": online}, {}, items, StreamConfig(chunk=1), args)
    m = result["methods"]["opt-hydra"]
    assert m["per_domain"] == {"humaneval": 2.4, "ifbench": 1.5}
    vs = m["vs_frozen"]
    assert vs["frozen"] == "hydra" and vs["n"] == 2 and vs["better"] == 1 and vs["ties"] == 1
    assert vs["per_domain"]["humaneval"]["gain"] == pytest.approx(0.2)
    assert vs["per_domain"]["ifbench"]["gain"] == pytest.approx(0.0)
    assert "vs_frozen" not in result["methods"]["hydra"]


@pytest.mark.parametrize("method,mode", [("ogd-hydra", "round"), ("osd-hydra", "round"), ("ens-hydra", "chunk")])
def test_online_records_carry_the_rounds_loss(target, tmp_path, method, mode):
    """RoundRecord.loss = f_t(w_t) of the round for online methods (also OSD and chunk
    mode, which take no gradient step in the round); NaN for frozen drafts."""
    run = runner(target, tmp_path, mode)
    run.run_method(method)
    run.run_method("hydra")
    online = Trace.load(tmp_path / method / "rounds.jsonl")
    losses = online.column("loss")
    finite = np.isfinite(losses)
    assert finite.sum() >= len(online) - 5          # at most the first round of each prompt lacks a sample
    assert (losses[finite] > 0).all() and bool(np.all(losses[finite] < 10 * math.log(80)))
    assert np.isnan(Trace.load(tmp_path / "hydra" / "rounds.jsonl").column("loss")).all()


def test_drafts_dir_serves_the_saved_draft_and_never_falls_back(target, tmp_path):
    from dataclasses import asdict

    from specloop.realmodels.heads.common import save_draft
    heads = hydra_drafter(target).heads
    save_draft(heads.state_dict(), {"architecture": asdict(heads.config)}, "tiny", "hydra",
               tmp_path / "drafts" / "hydra")
    config = StreamConfig(chunk=2, max_new_tokens=14, num_draft_tokens=3, online={**ONLINE, "mode": "round"})
    from_dir = StreamRunner(target, prompts(3), tmp_path / "a", config, drafts_dir=tmp_path / "drafts")
    from_dir.run_method("hydra")
    runner_same = StreamRunner(target, prompts(3), tmp_path / "b", config,
                               make_drafter=lambda spec: hydra_drafter(target))
    runner_same.run_method("hydra")
    assert comparable(tmp_path / "a" / "hydra" / "rounds.jsonl") == comparable(tmp_path / "b" / "hydra" / "rounds.jsonl")
    # a kind with no folder under drafts_dir fails, naming the folder, instead of using another draft
    with pytest.raises(FileNotFoundError, match="drafts.medusa.*draft train --kind medusa"):
        from_dir.run_method("medusa")


def test_suffix_method_learns_over_the_stream_and_resumes_exactly(target, tmp_path):
    """The suffix method's tries grow over the stream; a killed run restores them from
    the stream's state and reproduces the uninterrupted records."""
    from specloop.realmodels.drafters.suffix import SuffixDrafter

    def make(out):
        config = StreamConfig(chunk=2, max_new_tokens=14, num_draft_tokens=3, online=ONLINE)
        stream = prompts(3) * 2                          # the second half repeats the first
        return StreamRunner(target, stream, out, config, make_drafter=lambda spec: SuffixDrafter())

    assert resolve_method("suffix").drafter == "suffix" and resolve_method("SuffixDecoding").learner is None
    full = make(tmp_path / "full").run_method("suffix")
    make(tmp_path / "resumed").run_method("suffix", stop_after=4)
    resumed = make(tmp_path / "resumed").run_method("suffix")
    assert comparable(tmp_path / "resumed" / "suffix" / "rounds.jsonl") == \
        comparable(tmp_path / "full" / "suffix" / "rounds.jsonl")
    assert resumed["mean_accepted_length"] == pytest.approx(full["mean_accepted_length"])
    trace = Trace.load(tmp_path / "full" / "suffix" / "rounds.jsonl")
    first = [r.tokens_per_round for r in trace if r.stream_index < 3]
    second = [r.tokens_per_round for r in trace if r.stream_index >= 3]
    assert np.mean(second) > np.mean(first) + 0.5         # repeated requests are drafted from the tries
