"""The round profile: a profiled `DecodeSession` times the phases of
each round; all but "record" partition the record's draft + verify + update seconds, and
profiling changes no output."""
from __future__ import annotations

import pytest

from specloop.realmodels.decoder import SpeculativeDecoder
from specloop.realmodels.drafters.small_lm import SmallLMDrafter
from specloop.realmodels.policy import FixedDraftPolicy, parse_tree_shape
from specloop.realmodels.session import PHASES
from specloop.strategies.engine import drive_round

from tests.realmodels.decoder_util import as_loaded, tiny_llama


@pytest.mark.parametrize("plan", ["chain", "tree"])
def test_phases_sum_to_the_round_time(plan):
    target, draft = tiny_llama(vocab=16, seed=0), tiny_llama(vocab=16, seed=0, scale=0.97)
    policy = FixedDraftPolicy(3) if plan == "chain" else FixedDraftPolicy(3, parse_tree_shape("2x2x1"))
    outputs = {}
    for profile in (False, True):
        decoder = SpeculativeDecoder(as_loaded(target), SmallLMDrafter(draft), policy=policy, eos_token_id=[])
        session = decoder.session([1, 4, 7, 2, 9, 3], 20, profile=profile)
        while not session.done:
            drive_round(policy, session)
        outputs[profile] = session.new_tokens
        if profile:
            assert len(session.phase_log) == len(session.trace) >= 5
            for phases, record in zip(session.phase_log, session.trace):
                assert tuple(phases) == PHASES and all(v >= 0 for v in phases.values())
                inside = sum(v for k, v in phases.items() if k != "record")
                assert inside == pytest.approx(record.round_time, rel=0.05, abs=2e-5)
                assert phases["target_forward"] > 0 and phases["draft"] > 0
                assert phases["draft"] + phases["tree_selection"] == pytest.approx(record.draft_time, rel=0.05,
                                                                                   abs=2e-5)
        else:
            assert session.phase_log == []
    assert outputs[True] == outputs[False]
