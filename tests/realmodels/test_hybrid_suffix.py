"""The suffix-tree hybrid (`heads.hybrid.HybridDrafter` with a suffix lookup) and the
stream runner's ``+suffix`` methods: the source rule, the lookup learning from rounds
it did not draft, online learning of the head alone, and a resumed run that restores
both the head's learner and the tries."""
from __future__ import annotations

import json

import pytest
import torch

from specloop.realmodels.decoder import SpeculativeDecoder
from specloop.realmodels.drafters.suffix import SuffixDrafter
from specloop.realmodels.heads.hybrid import HybridDrafter
from specloop.realmodels.policy import FixedDraftPolicy
from specloop.realmodels.streams.runner import (METHODS, SUFFIX_MIN_SCORE, StreamConfig, StreamRunner, frozen_method,
                                                resolve_method)
from specloop.record import Trace
from tests.realmodels.decoder_util import plain_greedy
from tests.realmodels.test_online_util import hydra_drafter, prompts, tiny_loaded

ONLINE = {"lr": 0.05, "batch_size": 2, "osd_interval": 2}


@pytest.fixture(scope="module")
def target():
    return tiny_loaded()


class Proposals:
    """Wraps a drafter and keeps the token lists it proposed."""

    def __init__(self, inner):
        self.inner, self.name, self.seen = inner, inner.name, []
        self.needs_target_hidden = tuple(inner.needs_target_hidden)

    def reset(self, prompt_ids, *, target_hidden=None):
        self.inner.reset(prompt_ids, target_hidden=target_hidden)

    def propose(self, request):
        proposal = self.inner.propose(request)
        self.seen.append(proposal.tokens.tolist())
        return proposal

    def observe(self, feedback):
        return self.inner.observe(feedback)

    def parameters(self):
        return self.inner.parameters()


def _serve(target, drafter, stream, max_new=14):
    decoder = SpeculativeDecoder(target, drafter, policy=FixedDraftPolicy(3), eos_token_id=[])
    return [decoder.generate(p, max_new).new_tokens for p in stream]


def test_min_score_decides_the_source_and_output_stays_greedy(target):
    stream = prompts(3) * 2
    reference = [plain_greedy(target.model, p, 14) for p in stream]
    eager = HybridDrafter(hydra_drafter(target), lookup_drafter=SuffixDrafter(), min_score=0.0)
    assert _serve(target, eager, stream) == reference
    assert eager.lookup_rounds > 0 and eager.head_rounds > 0
    # a score no proposal reaches: every round is the head's, token for token the plain head's
    never = Proposals(HybridDrafter(hydra_drafter(target), lookup_drafter=SuffixDrafter(), min_score=1e9))
    alone = Proposals(hydra_drafter(target))
    assert _serve(target, never, stream) == _serve(target, alone, stream) == reference
    assert never.inner.lookup_rounds == 0 and never.seen == alone.seen


def test_the_lookup_learns_from_rounds_the_head_drafted(target):
    """Its tries hold every committed token whichever source drafted (the same global
    structure as a suffix drafter serving the stream alone)."""
    stream = prompts(3)
    hybrid = HybridDrafter(hydra_drafter(target), lookup_drafter=SuffixDrafter(), min_score=1e9)
    alone = SuffixDrafter()
    _serve(target, hybrid, stream)
    _serve(target, alone, stream)
    assert hybrid.keeps_stream_state and hybrid.state_dict()["global"] == alone.state_dict()["global"]
    assert hybrid.lookup.calibration.state_dict() != SuffixDrafter().calibration.state_dict()   # it calibrated


def test_prompt_lookup_hybrid_keeps_no_stream_state(target):
    hybrid = HybridDrafter(hydra_drafter(target))
    assert not hybrid.keeps_stream_state
    with pytest.raises(TypeError, match="keeps no stream state"):
        hybrid.state_dict()
    with pytest.raises(ValueError, match="min_score"):
        HybridDrafter(hydra_drafter(target), min_score=-1.0)


def test_suffix_methods_pair_with_their_frozen_hybrid():
    spec = resolve_method("Opt-Hydra + suffix")
    assert spec is METHODS["opt-hydra+suffix"] and spec.learner == "optimistic" and spec.draft_kind == "hydra"
    assert frozen_method(spec) == "hydra+suffix" and frozen_method(METHODS["opt-hydra"]) == "hydra"
    assert dict(spec.drafter_options) == {"head": "hydra", "lookup": "suffix", "min_score": SUFFIX_MIN_SCORE}
    assert frozen_method(METHODS["ens-eagle3+suffix"]) == "eagle3+suffix"


def _runner(target, out):
    config = StreamConfig(chunk=2, max_new_tokens=14, num_draft_tokens=3, online={**ONLINE, "mode": "round"})
    make = (lambda spec: HybridDrafter(hydra_drafter(target), lookup_drafter=SuffixDrafter(), min_score=0.5))
    return StreamRunner(target, prompts(3) * 2, out, config, make_drafter=make)


def _rows(path):
    keys = ("stream_index", "num_draft_tokens", "accepted_tokens", "tokens_per_round")
    return [tuple(getattr(r, k) for k in keys) for r in Trace.load(path)]


def test_online_suffix_method_trains_the_head_and_resumes_exactly(target, tmp_path):
    from specloop.realmodels.online.checkpoint import load_checkpoint
    full = _runner(target, tmp_path / "full").run_method("opt-hydra+suffix")
    _runner(target, tmp_path / "resumed").run_method("opt-hydra+suffix", stop_after=3)
    state = load_checkpoint(tmp_path / "resumed" / "opt-hydra+suffix" / "state.pt")
    assert state["adapter"] is not None and state["drafter"]["kind"] == "suffix"     # both kinds of state
    resumed = _runner(target, tmp_path / "resumed").run_method("opt-hydra+suffix")
    assert _rows(tmp_path / "resumed" / "opt-hydra+suffix" / "rounds.jsonl") == \
        _rows(tmp_path / "full" / "opt-hydra+suffix" / "rounds.jsonl")
    assert resumed["mean_accepted_length"] == pytest.approx(full["mean_accepted_length"])
    frozen = _runner(target, tmp_path / "frozen").run_method("hydra+suffix")
    reference = [plain_greedy(target.model, p, 14) for p in prompts(3) * 2]
    for folder in (tmp_path / "full" / "opt-hydra+suffix", tmp_path / "frozen" / "hydra+suffix"):
        assert [list(o) for o in load_checkpoint(folder / "state.pt")["outputs"]] == reference
    assert full["update_seconds"] > 0 and frozen["update_seconds"] < full["update_seconds"]


def test_online_adapter_trains_only_the_head(target):
    from specloop.realmodels.online import OnlineAdapter, OnlineConfig
    from specloop.realmodels.online.objectives import FeatureHeadObjective
    head = hydra_drafter(target)
    hybrid = HybridDrafter(head, lookup_drafter=SuffixDrafter())
    adapter = OnlineAdapter(hybrid, OnlineConfig(learner="ogd", **ONLINE))
    assert isinstance(adapter.objective, FeatureHeadObjective) and adapter.objective.drafter is head
    assert [p.data_ptr() for p in adapter.params] == [p.data_ptr() for p in head.parameters()]
    before = [p.detach().clone() for p in head.parameters()]
    from specloop.realmodels.online import OnlineDrafter
    _serve(target, OnlineDrafter(hybrid, adapter), prompts(2))
    assert adapter.num_steps > 0
    assert any(not torch.equal(b, p) for b, p in zip(before, head.parameters()))
    assert json.dumps(hybrid.state_dict())                                    # the tries stay JSON-able
