"""``specloop stream --method hedge-sources``: Hedge over suffix + n-gram as a stream
method. Its drafting is priced at fixed seconds per proposal and its whole state
(weights, generator, pending delayed feedback, suffix tries) is saved with the stream's
state, so a killed run resumes to the uninterrupted records and drafter state; without
the saved drafter state the resumed drafter's end state differs (the test can fail)."""
from __future__ import annotations

import json

import pytest

from specloop.realmodels.drafters.hedge import HEDGE_SOURCES_DRAFTER, STREAM_DRAFT_SECONDS, HedgeDrafter
from specloop.realmodels.online import load_checkpoint, save_checkpoint
from specloop.realmodels.streams.runner import StreamConfig, StreamRunner, resolve_method
from specloop.record import Trace
from tests.realmodels.decoder_util import plain_greedy
from tests.realmodels.test_online_util import prompts, tiny_loaded

METHOD = "hedge-sources"


@pytest.fixture(scope="module")
def target():
    return tiny_loaded()


def _stream():
    return prompts(4) * 2                                # the second half repeats the first


def _runner(target, out):
    config = StreamConfig(chunk=2, max_new_tokens=14, num_draft_tokens=3)
    return StreamRunner(target, _stream(), out, config)   # the registry builds the hedge drafter


def _records(path):
    keys = ("round_index", "stream_index", "num_draft_tokens", "accepted_tokens", "tokens_per_round",
            "verified_tokens")
    return [tuple(getattr(r, k) for k in keys) for r in Trace.load(path)]


def test_method_table_entry():
    spec = resolve_method("Hedge (sources)")
    assert spec.name == METHOD and spec.learner is None and spec.drafter == HEDGE_SOURCES_DRAFTER
    assert HEDGE_SOURCES_DRAFTER == "hedge:suffix@160us,ngram@70us"
    assert STREAM_DRAFT_SECONDS == {"suffix": 160e-6, "ngram": 70e-6}


def test_killed_run_resumes_to_identical_records(target, tmp_path):
    full = _runner(target, tmp_path / "full").run_method(METHOD)
    assert full["prompts_done"] == 8
    part = _runner(target, tmp_path / "resumed").run_method(METHOD, stop_after=3)
    assert part["prompts_done"] == 3
    rounds = tmp_path / "resumed" / METHOD / "rounds.jsonl"
    whole = Trace.load(tmp_path / "full" / METHOD / "rounds.jsonl")
    torn = [r for r in whole if r.stream_index == 3][:2]          # killed inside prompt 3
    with open(rounds, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(torn[0].to_dict()) + "\n" + json.dumps(torn[1].to_dict())[:25])
    state = load_checkpoint(tmp_path / "resumed" / METHOD / "state.pt")
    saved = state["drafter"]
    assert saved["kind"] == "hedge" and saved["sources"] == ["suffix", "ngram"]
    assert saved["draft_seconds"] == pytest.approx([160e-6, 70e-6])
    assert saved["source_states"][0] is not None                  # the suffix tries
    assert saved["hedge"]["t"] > 0 and saved["shadow"]["rounds"] == []    # decided at each prompt's end
    assert saved["feedback"] == "shadow" and saved["prompt"] is None
    resumed = _runner(target, tmp_path / "resumed").run_method(METHOD)
    assert _records(rounds) == _records(tmp_path / "full" / METHOD / "rounds.jsonl")
    assert resumed["mean_accepted_length"] == pytest.approx(full["mean_accepted_length"])
    # the outputs are the target's greedy outputs (lossless)
    outputs = load_checkpoint(tmp_path / "resumed" / METHOD / "state.pt")["outputs"]
    for ids, out in zip(_stream(), outputs):
        assert out == plain_greedy(target.model, ids, 14)


def _end_state(folder) -> tuple:
    """What a resumed drafter must carry over: Hedge's request count, the per-source choice
    counts and standalone tokens, and the suffix tries' size."""
    saved = load_checkpoint(folder / METHOD / "state.pt")["drafter"]
    return (saved["hedge"]["t"], list(saved["chosen_counts"]), list(saved["shadow"]["tokens_decided"]),
            len(repr(saved["source_states"][0])))


def test_resume_without_the_drafter_state_differs(target, tmp_path):
    """The guard: dropping the saved drafter state (Hedge's weights and counts, the tries)
    changes the resumed drafter's end state, while a resume with it matches the
    uninterrupted run's. (The records cannot show it on this tiny stream: both sources
    commit the same rounds on its repetitive outputs, so either choice gives equal records;
    the shadow-Hedge commit c74b7d1 left this guard asserting on the records, and it failed.)"""
    _runner(target, tmp_path / "full").run_method(METHOD)
    _runner(target, tmp_path / "kept").run_method(METHOD, stop_after=4)
    _runner(target, tmp_path / "kept").run_method(METHOD)
    assert _end_state(tmp_path / "kept") == _end_state(tmp_path / "full")
    _runner(target, tmp_path / "cut").run_method(METHOD, stop_after=4)
    path = tmp_path / "cut" / METHOD / "state.pt"
    state = load_checkpoint(path)
    state.pop("drafter")
    save_checkpoint(path, state)
    _runner(target, tmp_path / "cut").run_method(METHOD)
    cut, full = _end_state(tmp_path / "cut"), _end_state(tmp_path / "full")
    assert cut[0] == 4 and full[0] == 8                  # the fresh drafter saw only the last 4 requests
    assert cut != full


def test_state_with_other_fixed_costs_is_refused(target):
    from specloop.realmodels.registry.drafters import make_drafter
    a = make_drafter(HEDGE_SOURCES_DRAFTER, target)
    b = make_drafter("hedge:suffix@1ms,ngram@1ms", target)
    assert isinstance(a, HedgeDrafter) and a.draft_seconds == pytest.approx([160e-6, 70e-6])
    with pytest.raises(ValueError, match="prices drafting"):
        b.load_state_dict(a.state_dict())
    with pytest.raises(ValueError, match="every source or for none"):
        make_drafter("hedge:suffix@1ms,ngram", target)
    with pytest.raises(ValueError, match="do not also pass"):
        make_drafter(HEDGE_SOURCES_DRAFTER, target, hedge_draft_seconds=[0.0, 0.0])
