"""The speculative decoder on tiny randomly initialised Llama models (CPU, fast):
greedy == plain greedy for chain and tree and every drafter, EOS inside an accepted
block, max_new_tokens, sampling preserves the target distribution (chi-square
against the exact joint computed by enumeration), q handed to verification is the
one sampled from, identical draft => acceptance 1, bad inputs."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from specloop.realmodels.decoder import SpeculativeDecoder
from specloop.realmodels.drafters.base import BaseDrafter, DraftProposal
from specloop.realmodels.drafters.ngram import NGramDrafter, build_trie, find_continuations
from specloop.realmodels.drafters.small_lm import SmallLMDrafter
from specloop.realmodels.policy import FixedDraftPolicy, parse_tree_shape
from specloop.realmodels.sampling import SamplingConfig, processed_probs
from specloop.strategies.base import DraftPlan
from tests.realmodels.decoder_util import FixedDrafter, SpyDrafter, as_loaded, chi_square_pvalue, exact_joint, one_thread, plain_greedy, tiny_llama

VOCAB = 12
POLICIES = {
    "chain": lambda: FixedDraftPolicy(4),
    "tree": lambda: FixedDraftPolicy(4, parse_tree_shape("3x2x1x1")),
    "dyntree": lambda: FixedDraftPolicy(4, parse_tree_shape("topk=2,depth=3,v=6")),
}

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def target():
    return tiny_llama(VOCAB, seed=0)


@pytest.fixture(scope="module")
def draft():
    return tiny_llama(VOCAB, seed=0, layers=1)  # shares embeddings' seed, differs in depth


@pytest.fixture(scope="module")
def small_draft():
    return tiny_llama(VOCAB - 2, seed=3, layers=1)  # smaller vocabulary: zero-padded


def _prompts(n: int = 20) -> list[list[int]]:
    rng = np.random.default_rng(0)
    prompts = [[5]]  # a one-token prompt
    while len(prompts) < n:
        length = int(rng.integers(2, 12))
        prompts.append(rng.integers(0, VOCAB - 1, size=length).tolist())
    return prompts


def _drafters(target, draft, small_draft):
    from specloop.strategies.lookup_length import LookupLength
    return {"ngram": lambda: NGramDrafter(), "small-lm": lambda: SmallLMDrafter(draft),
            "self": lambda: SmallLMDrafter(target), "smaller-vocab": lambda: SmallLMDrafter(small_draft),
            "ngram-learned": lambda: NGramDrafter(length_model=LookupLength([1.0, 1.1, 1.2, 1.3], max_length=6))}


@pytest.mark.parametrize("policy", list(POLICIES))
@pytest.mark.parametrize("drafter", ["ngram", "small-lm", "self", "smaller-vocab", "ngram-learned"])
def test_greedy_equals_plain_greedy(target, draft, small_draft, policy, drafter):
    make = _drafters(target, draft, small_draft)[drafter]
    dec = SpeculativeDecoder(as_loaded(target), make(), policy=POLICIES[policy](), eos_token_id=[])
    for prompt in _prompts(20):
        result = dec.generate(prompt, 12)
        assert result.new_tokens == plain_greedy(target, prompt, 12), (drafter, policy, prompt)
        assert all(0 <= t < VOCAB for t in result.new_tokens)
        assert sum(r.tokens_per_round for r in result.trace) == 12


def test_identical_draft_accepts_everything(target):
    dec = SpeculativeDecoder(as_loaded(target), SmallLMDrafter(target), policy=FixedDraftPolicy(5),
                             eos_token_id=[])
    result = dec.generate([1, 2, 3], 24)
    assert result.trace.acceptance_rate() == 1.0
    assert result.trace.mean_accepted_length() == pytest.approx(6.0)
    # sampling: identical q and p accept with probability 1 as well
    dec = SpeculativeDecoder(as_loaded(target), SmallLMDrafter(target), policy=FixedDraftPolicy(5),
                             sampling=SamplingConfig(1.0), eos_token_id=[], seed=3)
    result = dec.generate([1, 2, 3], 24)
    assert result.trace.acceptance_rate() > 0.99


@pytest.mark.parametrize("policy", ["chain", "tree"])
def test_eos_inside_accepted_block(target, policy):
    prompt = [4, 7, 1]
    ref = plain_greedy(target, prompt, 10)
    eos = ref[2]
    stop = ref.index(eos)
    dec = SpeculativeDecoder(as_loaded(target), SmallLMDrafter(target), policy=POLICIES[policy](),
                             eos_token_id=eos)
    result = dec.generate(prompt, 10)
    assert result.new_tokens == ref[: stop + 1] and result.stop_reason == "eos"
    assert result.trace[0].accepted_tokens >= stop  # the EOS sat inside the accepted block


def test_never_exceeds_max_new_tokens(target):
    dec = SpeculativeDecoder(as_loaded(target), SmallLMDrafter(target), policy=FixedDraftPolicy(6),
                             eos_token_id=[])
    for n in range(0, 9):
        result = dec.generate([3, 3], n)
        assert len(result.new_tokens) == n


def test_context_window_stops(target):
    dec = SpeculativeDecoder(as_loaded(target), NGramDrafter(), policy=FixedDraftPolicy(6), eos_token_id=[])
    result = dec.generate(list(range(10)) * 6, 20)  # 60 of 64 positions used
    assert len(result.new_tokens) == 4 and result.stop_reason == "context"



def _exact_joint(model, prompt, sampling, length):
    return exact_joint(model, prompt, sampling, length, VOCAB)


@pytest.mark.parametrize("case", [
    ("chain", SamplingConfig(1.0)),
    ("tree", SamplingConfig(0.8, top_k=6)),
    pytest.param(("ngram-tree", SamplingConfig(1.0, top_p=0.9)), marks=pytest.mark.slow),
    pytest.param(("chain", SamplingConfig(0.7, top_p=0.8)), marks=pytest.mark.slow),
])
def test_sampling_preserves_target_distribution(target, draft, case):
    kind, sampling = case
    prompt = [2, 9, 2]
    joint = _exact_joint(target, prompt, sampling, 2)
    keys = list(joint)
    p = np.array([joint[k] for k in keys])
    if kind == "ngram-tree":
        drafter, policy = NGramDrafter(min_ngram=1), FixedDraftPolicy(2, parse_tree_shape("3x1"))
    elif kind == "tree":
        drafter, policy = SmallLMDrafter(draft), FixedDraftPolicy(2, parse_tree_shape("2x2"))
    else:
        drafter, policy = SmallLMDrafter(draft), FixedDraftPolicy(2)
    dec = SpeculativeDecoder(as_loaded(target), drafter, policy=policy, sampling=sampling,
                             eos_token_id=[], seed=11)
    n = 1000 if sampling.top_p is None else 3000
    counts = dict.fromkeys(keys, 0)
    for _ in range(n):
        counts[tuple(dec.generate(prompt, 2).new_tokens)] += 1
    # the tolerance follows the sample count: chi-square's p-value at n draws
    assert chi_square_pvalue(counts, keys, p, n) > 1e-3


def test_q_handed_to_verification_is_the_sampled_distribution(target, draft):
    sampling = SamplingConfig(0.9, top_k=8)
    spy = SpyDrafter(SmallLMDrafter(draft))
    dec = SpeculativeDecoder(as_loaded(target), spy, policy=FixedDraftPolicy(3), sampling=sampling,
                             eos_token_id=[], seed=5)
    prompt = [1, 4, 6, 2]
    result = dec.generate(prompt, 12)
    seq = list(prompt)
    assert len(spy.proposals) >= 3
    for feedback in spy.feedback:
        proposal = feedback.proposal
        if proposal.size == 0:  # last round: one token left, nothing drafted
            seq += feedback.committed_tokens.tolist()
            continue
        assert proposal.q_draft is not None
        for i, tok in enumerate(proposal.tokens.tolist()):
            with torch.no_grad():
                logits = draft(torch.tensor([seq + proposal.tokens[:i].tolist()])).logits[0, -1]
            torch.testing.assert_close(proposal.q_draft[i], processed_probs(logits, sampling), atol=1e-5, rtol=1e-4)
            assert proposal.q_draft[i, tok] > 0
        seq += feedback.committed_tokens.tolist()
    assert seq[len(prompt):] == result.new_tokens


def test_feedback_carries_target_hidden(target):
    class Wants(BaseDrafter):
        needs_target_hidden = (-1,)

        def __init__(self):
            self.prefill = None
            self.hidden = []

        def reset(self, prompt_ids, *, target_hidden=None):
            self.prefill = target_hidden

        def propose(self, request):
            return DraftProposal.chain([3, 3])

        def observe(self, feedback):
            self.hidden.append((feedback.target_hidden[0], feedback.num_accepted))

    drafter = Wants()
    prompt = [1, 2, 3, 4]
    result = SpeculativeDecoder(as_loaded(target), drafter, policy=FixedDraftPolicy(2),
                                eos_token_id=[]).generate(prompt, 6)
    assert drafter.prefill[0].shape == (3, 16)
    seq = prompt + result.new_tokens
    with torch.no_grad():
        full = target(torch.tensor([seq]), output_hidden_states=True).hidden_states[-1][0]
    pos = len(prompt) - 1
    for hidden, accepted in drafter.hidden:
        assert hidden.shape == (1 + accepted, 16)
        torch.testing.assert_close(hidden, full[pos: pos + 1 + accepted], atol=1e-4, rtol=1e-4)
        pos += 1 + accepted


def test_ngram_continuations_and_trie():
    ids = np.array([1, 2, 3, 4, 1, 2, 5, 6, 1, 2])
    conts = find_continuations(ids, depth=3, width=3, max_ngram=2)
    assert conts[0] == [5, 6, 1] and conts[1] == [3, 4, 1]
    tokens, parents = build_trie([[5, 6], [5, 7], [3]], max_nodes=10)
    assert tokens == [5, 6, 7, 3] and parents == [-1, 0, 0, -1]


# -- bad input ------------------------------------------------------------------------
def test_bad_prompts_and_arguments(target):
    dec = SpeculativeDecoder(as_loaded(target), NGramDrafter(), eos_token_id=[])
    with pytest.raises(ValueError, match="empty prompt"):
        dec.generate([], 4)
    with pytest.raises(ValueError, match="context window"):
        dec.generate([1] * 64, 4)
    with pytest.raises(ValueError, match=r"\[0, 12\)"):
        dec.generate([1, 12], 4)
    with pytest.raises(ValueError, match="max_new_tokens"):
        dec.generate([1], -1)
    with pytest.raises(ValueError, match="k"):
        FixedDraftPolicy(-1)
    with pytest.raises(ValueError):
        DraftPlan(-1)
    with pytest.raises(ValueError):
        parse_tree_shape("3xa")


def test_nan_logits_raise(target):
    model = tiny_llama(VOCAB, seed=4)
    with torch.no_grad():
        model.lm_head.weight.fill_(math.nan)
    dec = SpeculativeDecoder(as_loaded(model), NGramDrafter(), eos_token_id=[])
    with pytest.raises(ValueError, match="NaN"):
        dec.generate([1, 2], 3)


def test_vocabulary_mismatch_refused(target):
    class Bigger(BaseDrafter):
        def propose(self, request):
            return DraftProposal.chain([1], torch.full((1, VOCAB + 3), 1.0 / (VOCAB + 3)))

    class OutOfRange(BaseDrafter):
        def propose(self, request):
            return DraftProposal.chain([VOCAB + 1])

    for drafter in (Bigger(), OutOfRange()):
        dec = SpeculativeDecoder(as_loaded(target), drafter, eos_token_id=[])
        with pytest.raises(ValueError, match="vocabulary"):
            dec.generate([1, 2], 3)


def test_fixed_drafter_counts(target):
    dec = SpeculativeDecoder(as_loaded(target), FixedDrafter([0, 0, 0]), policy=FixedDraftPolicy(3),
                             eos_token_id=[])
    result = dec.generate([1, 2], 5)
    for record in result.trace:
        assert record.verified_tokens == record.num_draft_tokens + 1
        assert record.tokens_per_round == record.accepted_tokens + 1 or record is result.trace[-1]


def test_learned_lookup_length_learns_from_every_drafted_round(target):
    """The n-gram drafter's LookupLength sees each verified chain once: its trials at
    position 1 equal the rounds that drafted, its acceptances the rounds that accepted
    at least one token; with a steep cost and no successes it stops drafting."""
    from specloop.strategies.lookup_length import LookupLength
    model = LookupLength([1.0, 1.05, 1.1, 1.15], max_length=6)
    dec = SpeculativeDecoder(as_loaded(target), NGramDrafter(length_model=model), policy=FixedDraftPolicy(6),
                             eos_token_id=[])
    rounds = [r for prompt in _prompts(10) for r in dec.generate(prompt, 16).trace]
    drafted = [r for r in rounds if r.num_draft_tokens > 0]
    assert drafted and all(r.num_draft_tokens <= 6 for r in rounds)
    assert sum(t[0] for t in model.trials.values()) == len(drafted)
    assert sum(a[0] for a in model.accepted.values()) == sum(r.accepted_tokens > 0 for r in drafted)
    hopeless = LookupLength([1.0, 10.0], max_length=6, prior=(1.0, 50.0))
    dec = SpeculativeDecoder(as_loaded(target), NGramDrafter(length_model=hopeless), policy=FixedDraftPolicy(6),
                             eos_token_id=[])
    assert all(r.num_draft_tokens == 0 for r in dec.generate(_prompts(3)[2] * 3, 8).trace)
