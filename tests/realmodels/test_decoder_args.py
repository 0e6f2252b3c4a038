"""Decoder-side argument checks: a batch is refused instead of flattened,
``accepted_tokens`` counts only committed draft tokens (hand-counted rounds), and
``generate``'s arguments are validated before any model work."""
from __future__ import annotations

import pytest
import torch

from specloop.realmodels.decoder import SpeculativeDecoder
from specloop.realmodels.drafters.base import BaseDrafter, DraftProposal, DraftRequest
from specloop.realmodels.drafters.ngram import NGramDrafter
from specloop.realmodels.policy import FixedDraftPolicy

from tests.realmodels.decoder_util import as_loaded, plain_greedy, tiny_llama

PROMPT = [1, 4, 7, 2, 9, 3]


class OracleDrafter(BaseDrafter):
    """Proposes the target's known greedy continuation at every position (all accepted)."""

    name = "oracle"

    def __init__(self, prompt: list[int], continuation: list[int]):
        self.text = list(prompt) + list(continuation)

    def propose(self, request: DraftRequest) -> DraftProposal:
        at = int(request.ids.shape[0])
        k = min(request.plan.num_draft_tokens, request.max_tokens)
        return DraftProposal.chain(self.text[at:at + k])


@pytest.fixture(scope="module")
def target():
    return tiny_llama(vocab=16, seed=0)


def test_batch_of_prompts_is_refused_not_flattened(target):
    decoder = SpeculativeDecoder(as_loaded(target), NGramDrafter(), eos_token_id=[])
    for batch in ([PROMPT, PROMPT], torch.tensor([PROMPT, PROMPT]), [PROMPT, PROMPT[:3]]):
        with pytest.raises(ValueError, match="one|batch"):
            decoder.generate(batch, 4)
    single = decoder.generate(torch.tensor([PROMPT]), 4).new_tokens     # a (1, L) batch of one is one prompt
    assert single == decoder.generate(PROMPT, 4).new_tokens
    with pytest.raises(ValueError, match="integer"):
        decoder.generate(torch.tensor(PROMPT, dtype=torch.float32), 4)


@pytest.mark.parametrize("bad", [2.7, True, "8", -1, None])
def test_max_new_tokens_must_be_an_int(target, bad):
    decoder = SpeculativeDecoder(as_loaded(target), NGramDrafter(), eos_token_id=[])
    with pytest.raises(ValueError, match="max_new_tokens"):
        decoder.generate(PROMPT, bad)


def test_accepted_tokens_count_only_committed_draft_tokens(target):
    """Hand-counted: k = 4 oracle drafts, all accepted by the target.

    * EOS as the 2nd greedy token: the first round accepts 4 drafted tokens but commits
      only 2 (EOS kept, the rest dropped): accepted_tokens must be 2, not 4.
    * no EOS, max_new_tokens = 7: rounds of k = 4 (4 accepted + bonus = 5 tokens), then
      k = min(4, 2 - 1) = 1 (1 accepted + bonus = 2): accepted 4 and 1, committed 5 and 2.
    """
    greedy = plain_greedy(target, PROMPT, 12)
    eos = greedy[1]
    assert eos not in greedy[:1]
    decoder = SpeculativeDecoder(as_loaded(target), OracleDrafter(PROMPT, greedy), policy=FixedDraftPolicy(4),
                                 eos_token_id=eos)
    out = decoder.generate(PROMPT, 12)
    assert out.new_tokens == greedy[:2] and out.stop_reason == "eos"
    assert [(r.num_draft_tokens, r.accepted_tokens, r.tokens_per_round) for r in out.trace] == [(4, 2, 2)]
    assert out.trace.acceptance_rate() == 1.0       # no draft token was rejected (censored at EOS)

    decoder = SpeculativeDecoder(as_loaded(target), OracleDrafter(PROMPT, greedy), policy=FixedDraftPolicy(4),
                                 eos_token_id=[])
    out = decoder.generate(PROMPT, 7)
    assert out.new_tokens == greedy[:7]
    assert [(r.num_draft_tokens, r.accepted_tokens, r.tokens_per_round) for r in out.trace] == [(4, 4, 5), (1, 1, 2)]
    for r in out.trace:
        assert r.accepted_tokens <= r.tokens_per_round


def test_acceptance_quantities_are_named_apart(target):
    """Greedy oracle rounds: every per-position Acc_j is 1 and every tried child's
    ratio is 1; a wrong draft token gives Acc 0 and ratio 0 at its position."""
    greedy = plain_greedy(target, PROMPT, 6)
    wrong = [(greedy[0] + 1) % 16] + greedy[1:]
    decoder = SpeculativeDecoder(as_loaded(target), OracleDrafter(PROMPT, greedy), policy=FixedDraftPolicy(3),
                                 eos_token_id=[])
    first = decoder.generate(PROMPT, 4).trace[0]
    assert first.acceptance_probs == (1.0, 1.0, 1.0) and first.child_acceptance_ratios == (1.0, 1.0, 1.0)
    decoder = SpeculativeDecoder(as_loaded(target), OracleDrafter(PROMPT, wrong), policy=FixedDraftPolicy(3),
                                 eos_token_id=[])
    first = decoder.generate(PROMPT, 4).trace[0]
    assert first.accepted_tokens == 0
    assert first.acceptance_probs == (0.0,) and first.child_acceptance_ratios == (0.0,)


def test_trace_acceptance_rate_counts_rejections_not_stops():
    """Hand-counted: a rejection after 1 accepted (n = 2), an EOS stop inside an accepted
    block (2 committed draft tokens, n = 2: censored), a fully accepted round (3 + bonus):
    accepted 1 + 2 + 3 = 6 over 6 + 1 rejection."""
    from specloop.record import RoundRecord, Trace
    rows = [(4, 1, 2), (4, 2, 2), (3, 3, 4)]
    trace = Trace([RoundRecord(round_index=i, stream_index=0, num_draft_tokens=k, tree_depth=k, verified_tokens=k + 1,
                               accepted_tokens=a, tokens_per_round=n) for i, (k, a, n) in enumerate(rows)])
    assert trace.acceptance_rate() == pytest.approx(6 / 7)
