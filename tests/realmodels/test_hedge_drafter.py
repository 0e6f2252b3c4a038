"""The ``hedge:`` drafter on tiny models: lossless greedy with ``hedge:suffix,ngram``
(chain and tree, choose and merge, >= 20 prompts, EOS inside a block), sampling keeps the
target distribution (chi-square), every source observes every round, the feedback of a
source that was not verified, the registry and refusals."""
from __future__ import annotations


import numpy as np
import pytest
import torch

from specloop.realmodels.decoder import SpeculativeDecoder
from specloop.realmodels.drafters.base import BaseDrafter, DraftProposal, VerifyFeedback
from specloop.realmodels.drafters.hedge import HedgeDrafter, greedy_feedback, parse_hedge_name
from specloop.realmodels.drafters.ngram import NGramDrafter
from specloop.realmodels.registry.drafters import check_drafter_name, make_drafter
from specloop.realmodels.drafters.suffix import SuffixDrafter
from specloop.realmodels.policy import FixedDraftPolicy, parse_tree_shape
from specloop.realmodels.sampling import SamplingConfig
from specloop.strategies.hedge_sources import accepted_prefix
from tests.realmodels.decoder_util import FixedDrafter, SpyDrafter, as_loaded, chi_square_pvalue, exact_joint, one_thread, plain_greedy, tiny_llama  # noqa: F401

VOCAB = 12
POLICIES = {
    "chain": lambda: FixedDraftPolicy(4),
    "tree": lambda: FixedDraftPolicy(4, parse_tree_shape("topk=2,depth=4,v=8")),
}
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def target():
    return tiny_llama(VOCAB, seed=0)


def _prompts(n: int = 24) -> list[list[int]]:
    rng = np.random.default_rng(0)
    prompts = [[5]]
    while len(prompts) < n:
        prompts.append(rng.integers(0, VOCAB - 1, size=int(rng.integers(2, 12))).tolist())
    return prompts + prompts[:4]


def _hedge(mode="choose", choose="sample", seconds=(1e-4, 1e-4), **kw):
    return HedgeDrafter([SuffixDrafter(verify_cost=[1.0]), NGramDrafter()], ["suffix", "ngram"],
                        verify_cost=[1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.7], mode=mode, choose=choose,
                        draft_seconds=list(seconds), seed=0, **kw)


FEEDBACKS = {"request": {}, "request-explore1": {"explore": 1.0}, "shadow-round": {"per": "round"},
             "round": {"feedback": "round"}}


@pytest.mark.parametrize("case", [("chain", "choose", "request"), ("tree", "choose", "request"),
                                  ("tree", "merge", "request"), ("chain", "argmax", "request"),
                                  ("tree", "choose", "request-explore1"), ("chain", "choose", "shadow-round"),
                                  ("tree", "merge", "shadow-round"), ("tree", "choose", "round")])
def test_greedy_equals_plain_greedy(target, case):
    policy, mode, feedback = case
    if mode == "argmax":                                    # measured (wall-clock) drafting seconds
        hedge = HedgeDrafter([SuffixDrafter(verify_cost=[1.0]), NGramDrafter()], ["suffix", "ngram"],
                             verify_cost=[1.0, 1.1, 1.2, 1.3, 1.4], choose="argmax", **FEEDBACKS[feedback])
    else:
        hedge = _hedge(mode, **FEEDBACKS[feedback])
    spy = SpyDrafter(hedge)
    dec = SpeculativeDecoder(as_loaded(target), spy, policy=POLICIES[policy](), eos_token_id=[])
    prompts = _prompts()
    for prompt in prompts:
        result = dec.generate(prompt, 12)
        assert result.new_tokens == plain_greedy(target, prompt, 12), (case, prompt)
        # every source followed the committed sequence, verified or not
        assert hedge.sources[0]._seq == prompt + result.new_tokens
    assert all(p.q_draft is None for p in spy.proposals)
    assert any(f.num_accepted for f in spy.feedback)
    for f in spy.feedback:     # the rule the losses use agrees with the verifier on what it verified
        committed = f.committed_tokens.tolist()
        length, _ = accepted_prefix(f.proposal.tokens.tolist(), f.proposal.parents.tolist(), committed)
        assert min(length, len(committed) - 1) == f.num_accepted
    assert any(not p.is_chain for p in spy.proposals if p.size) == (policy == "tree")
    report = hedge.report()
    rounds = len(spy.proposals)
    assert report["pending_rounds"] == 0 and sum(report["chosen_counts"]) == rounds
    if report["per"] == "request":                          # one choice per request, no delay
        assert report["regret"]["rounds"] == report["requests"] == len(prompts)
        assert report["regret"]["max_delay"] == 0
        assert 0 < report["explored_requests"] <= len(prompts)
        assert (report["explored_requests"] == len(prompts)) == (report["explore"] == 1.0)
    else:
        assert report["regret"]["rounds"] == rounds
        assert report["regret"]["max_delay"] <= 5           # the plan's depth (+ the bonus token) bounds it
        if mode != "argmax":
            assert min(report["chosen_counts"]) > 0         # sampling tried both sources
    assert report["regret"]["expected"] <= report["regret"]["bound"]
    # the suffix source's global structure grew from every request (it observed them all)
    assert hedge.sources[0].cache.num_tokens == sum(min(len(p), 8) + 12 for p in prompts)


@pytest.mark.parametrize("policy", list(POLICIES))
def test_eos_inside_a_drafted_block(target, policy):
    prompt = [4, 7, 1]
    ref = plain_greedy(target, prompt, 10)
    eos = ref[2]
    stop = ref.index(eos)
    hedge = _hedge(choose="argmax", seconds=(0.0, 1.0))     # ngram priced out: suffix verified
    dec = SpeculativeDecoder(as_loaded(target), hedge, policy=POLICIES[policy](), eos_token_id=eos)
    first = dec.generate(prompt, 10)
    assert first.new_tokens == ref[: stop + 1] and first.stop_reason == "eos"
    second = dec.generate(prompt, 10)                       # drafted from the suffix source's global trie
    assert second.new_tokens == ref[: stop + 1] and second.stop_reason == "eos"
    assert second.trace[0].accepted_tokens >= stop and len(second.trace) == 1
    assert hedge.report()["pending_rounds"] == 0


def test_feedback_of_a_source_that_was_not_verified():
    # the verified source drafted [5, 9]: 5 accepted, committed (5, 6)
    verified = DraftProposal.chain([5, 9])
    rows = torch.eye(VOCAB)[[5, 6]]
    feedback = VerifyFeedback(verified, (0,), torch.tensor([5, 6]), rows, rows)
    tree = DraftProposal(torch.tensor([5, 6, 7, 3, 8]), torch.tensor([-1, 0, 1, 0, 1]))
    own = greedy_feedback(tree, feedback)
    # its path 5 -> 6 matches both committed tokens: 6's outcome is unknown, so 6 and its
    # child 7 are dropped; 5 is accepted, 3 rejected
    assert own.proposal.tokens.tolist() == [5, 3] and own.proposal.source_index == (0, 3)
    assert own.accepted_nodes == (0,) and own.committed_tokens.tolist() == [5, 6]
    assert own.p_target.shape == (2, VOCAB)
    miss = greedy_feedback(DraftProposal.chain([4, 6]), feedback)
    assert miss.accepted_nodes == () and miss.proposal.size == 2 and miss.p_target.shape == (1, VOCAB)
    done = VerifyFeedback(verified, (0,), torch.tensor([5, 6]), rows, rows, finished=True)
    full = greedy_feedback(tree, done)                     # a finished round decides everything
    assert full.proposal is tree and full.accepted_nodes == (0, 1)
    # SuffixDrafter calibrates only on decided nodes of its own proposal
    drafter = SuffixDrafter(verify_cost=[1.0], use_global=False, prior_count=0.0)
    ctx = [1, 2, 3, 1, 2, 4, 1, 2, 3, 9, 1, 2]
    drafter.reset(torch.tensor(ctx))
    from tests.realmodels.test_suffix_drafter import _request
    from specloop.strategies.base import DraftPlan, TreePlan
    prop = drafter.propose(_request(ctx, DraftPlan(3, TreePlan(top_k=2, max_depth=3))))
    rows = torch.eye(VOCAB)[[3, 1]]
    drafter.observe(greedy_feedback(prop, VerifyFeedback(DraftProposal.chain([3]), (0,),
                                                          torch.tensor([3, 1]), rows, rows)))
    # tested: the root's children 3 (accepted) and 4 (rejected), and 3's child 9 (rejected);
    # 3's child 1 matched the bonus token: undecided, not counted
    assert drafter.calibration.trials.sum() == 3 and drafter.calibration.accepted.sum() == 1
    assert drafter._seq[-2:] == [3, 1]



def _exact_joint(model, prompt, sampling, length):
    return exact_joint(model, prompt, sampling, length, VOCAB)


@pytest.mark.parametrize("case", [("chain", SamplingConfig(1.0)), ("tree", SamplingConfig(0.8, top_k=6))])
def test_sampling_preserves_target_distribution(case):
    target = tiny_llama(VOCAB, seed=0, scale=2.0)
    kind, sampling = case
    prompt = [2, 9, 2]
    joint = _exact_joint(target, prompt, sampling, 2)
    keys = list(joint)
    p = np.array([joint[k] for k in keys])
    policy = FixedDraftPolicy(2) if kind == "chain" else FixedDraftPolicy(2, parse_tree_shape("topk=3,depth=2,v=6"))
    # choose: the context n-gram (its "9 2" is seldom sampled here) priced out, so Hedge's
    # choice per request settles on the suffix source, whose drafts are often accepted
    hedge = HedgeDrafter([SuffixDrafter(verify_cost=[1.0], max_requests=50), NGramDrafter()],
                         verify_cost=[1.0], mode="merge" if kind == "tree" else "choose",
                         draft_seconds=[0.0, 0.0 if kind == "tree" else 10.0], seed=3)
    spy = SpyDrafter(hedge)
    dec = SpeculativeDecoder(as_loaded(target), spy, policy=policy, sampling=sampling, eos_token_id=[], seed=11)
    n = 1000
    counts = dict.fromkeys(keys, 0)
    for _ in range(n):
        counts[tuple(dec.generate(prompt, 2).new_tokens)] += 1
    assert sum(pr.size > 0 for pr in spy.proposals) > 0.9 * len(spy.proposals)
    assert sum(f.num_accepted for f in spy.feedback) > 200
    assert (kind == "tree") == any(not pr.is_chain for pr in spy.proposals)
    # the tolerance follows the sample count: chi-square's p-value at n draws
    assert chi_square_pvalue(counts, keys, p, n) > 1e-3


class _Sampled(BaseDrafter):
    name = "sampled"

    def propose(self, request):
        return DraftProposal.chain([1], q_draft=torch.full((1, VOCAB), 1.0 / VOCAB))


class _Head(BaseDrafter):
    name = "head"
    needs_target_hidden = (-1,)


def test_registry_and_refusals(target):
    drafter = make_drafter("hedge:suffix,ngram", None, dtype="bfloat16", hedge_mode="merge",
                           hedge_draft_seconds=[0.0, 0.0], hedge_max_nodes=4, depth=24)
    assert isinstance(drafter, HedgeDrafter) and drafter.name == "hedge:suffix,ngram"
    assert drafter.mode == "merge" and drafter.sources[0].cache.depth == 24
    shadow = drafter.shadow                           # default: each source's own run, seconds per token
    assert drafter.feedback == "shadow" and drafter.loss == "time" and drafter.delayed is None
    assert shadow.max_tokens == 5 and shadow.seconds_cap == pytest.approx(1.5 * shadow.verify_seconds(5))
    round_kw = dict(dtype="bfloat16", hedge_feedback="round", hedge_draft_seconds=[0.0, 0.0], hedge_max_nodes=4)
    ratio = make_drafter("hedge:suffix,ngram", None, **round_kw).delayed.loss   # round: the Dinkelbach loss
    assert ratio.max_tokens == 5 and ratio.seconds_cap == pytest.approx(1.5 * ratio.verify_seconds(5))
    rate = make_drafter("hedge:suffix,ngram", None, hedge_loss="rate", **round_kw).delayed.loss
    cost = rate.cost
    assert rate.rate_scale == pytest.approx(max(n / cost[n - 1] for n in range(1, 6)))
    with pytest.raises(ValueError, match="rate"):           # a state scored with the other loss
        make_drafter("hedge:suffix,ngram", None, **round_kw).load_state_dict(
            make_drafter("hedge:suffix,ngram", None, hedge_loss="rate", **round_kw).state_dict())
    with pytest.raises(ValueError, match="feedback"):       # a state of the other feedback
        drafter.load_state_dict(make_drafter("hedge:suffix,ngram", None, **round_kw).state_dict())
    with pytest.raises(ValueError, match="loss"):
        HedgeDrafter([NGramDrafter()], verify_cost=[1.0], feedback="round", loss="regret")
    with pytest.raises(ValueError, match="shadow feedback"):
        HedgeDrafter([NGramDrafter()], verify_cost=[1.0], loss="ratio")
    with pytest.raises(ValueError, match="feedback"):
        HedgeDrafter([NGramDrafter()], verify_cost=[1.0], feedback="played")
    check_drafter_name("hedge:suffix,ngram,ngram-datastore")
    assert parse_hedge_name("hedge: suffix , ngram") == ["suffix", "ngram"]
    for bad in ("hedge:", "hedge:suffix,", "hedge:hedge:ngram", "hedge:no-such-drafter-xyz"):
        with pytest.raises(ValueError):
            check_drafter_name(bad)
    with pytest.raises(ValueError, match="hidden states"):
        HedgeDrafter([NGramDrafter(), _Head()], verify_cost=[1.0])
    with pytest.raises(ValueError, match="mode"):
        HedgeDrafter([NGramDrafter()], verify_cost=[1.0], mode="vote")
    with pytest.raises(ValueError, match="draft_seconds"):
        HedgeDrafter([NGramDrafter()], verify_cost=[1.0], draft_seconds=[0.0, 1.0])
    dec = SpeculativeDecoder(as_loaded(target), HedgeDrafter([NGramDrafter(), _Sampled()], verify_cost=[1.0]),
                             policy=FixedDraftPolicy(2), eos_token_id=[])
    with pytest.raises(ValueError, match="q_draft"):
        dec.generate([1, 2, 1, 2], 4)


def test_state_round_trip(target):
    hedge = _hedge()
    dec = SpeculativeDecoder(as_loaded(target), hedge, policy=FixedDraftPolicy(4), eos_token_id=[])
    for prompt in _prompts(6):
        dec.generate(prompt, 8)
    state = hedge.state_dict()
    other = _hedge()
    other.load_state_dict(state)
    assert np.array_equal(other.hedge.weights(), hedge.hedge.weights())
    assert other.sources[0].cache.trie.items() == hedge.sources[0].cache.trie.items()
    assert other.report()["regret"] == hedge.report()["regret"]
    with pytest.raises(ValueError, match="sources"):
        HedgeDrafter([NGramDrafter()], ["ngram"], verify_cost=[1.0]).load_state_dict(state)


def test_merge_builds_one_trie_heaviest_source_first():
    from specloop.realmodels.drafters.base import DraftRequest
    from specloop.strategies.base import DraftPlan, TreePlan
    hedge = HedgeDrafter([FixedDrafter([1, 2, 3]), FixedDrafter([1, 4])], verify_cost=[1.0], mode="merge",
                         feedback="round", draft_seconds=[0.0, 0.0])     # driven by hand on one context
    hedge.reset(torch.tensor([7, 8]))

    def request(plan):
        return DraftRequest(torch.tensor([7, 8]), plan, 16, SamplingConfig(0.0), torch.Generator())
    tree = request(DraftPlan(3, TreePlan(top_k=2, max_depth=3)))
    merged = hedge.propose(tree)
    assert merged.tokens.tolist() == [1, 2, 3, 4] and merged.parents.tolist() == [-1, 0, 1, 0]
    rows = torch.eye(VOCAB)[[1, 4, 5]]
    hedge.observe(VerifyFeedback(merged, (0, 3), torch.tensor([1, 4, 5]), rows, rows))
    assert hedge.hedge.cumulative_loss[1] < hedge.hedge.cumulative_loss[0]   # source 1 would accept 2
    merged = hedge.propose(tree)                                              # now source 1 comes first
    assert merged.tokens.tolist() == [1, 4, 2, 3] and merged.parents.tolist() == [-1, 0, 0, 2]
    capped = DraftRequest(torch.tensor([7, 8]), DraftPlan(3, TreePlan(top_k=2, max_depth=3, verify_size=2)),
                          16, SamplingConfig(0.0), torch.Generator())
    assert hedge.propose(capped).size == 2
    assert hedge.propose(request(DraftPlan(3))).is_chain                     # a chain plan: choose


def test_per_request_play_is_the_chosen_sources_standalone_run(target):
    """Shadow feedback, one choice per request: every request's rounds are exactly the
    chosen source's rounds alone (stateless sources, so their runs do not depend on the
    stream), and Hedge's shadow throughputs are the sources' standalone ones."""
    def sources():
        return [NGramDrafter(max_ngram=3), NGramDrafter(max_ngram=1, max_matches=1)]
    policy = POLICIES["tree"]
    alone = [SpeculativeDecoder(as_loaded(target), src, policy=policy(), eos_token_id=[]) for src in sources()]
    hedge = HedgeDrafter(sources(), ["ngram3", "ngram1"], verify_cost=[1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.7],
                         draft_seconds=[1e-3, 2e-3], explore=0.5, seed=1)
    dec = SpeculativeDecoder(as_loaded(target), hedge, policy=policy(), eos_token_id=[])
    chosen_seen, seconds = set(), np.zeros(2)
    for prompt in _prompts():
        result = dec.generate(prompt, 16)
        chosen = hedge.report()["chosen_counts"]
        runs = [a.generate(prompt, 16) for a in alone]
        shape = [(r.num_draft_tokens, r.accepted_tokens) for r in result.trace]
        match = [i for i, run in enumerate(runs) if shape == [(r.num_draft_tokens, r.accepted_tokens) for r in run.trace]]
        assert match, prompt                          # the played run is one source's own run
        chosen_seen.update(match)
        for i, run in enumerate(runs):                # what each source's standalone run costs
            seconds[i] += sum(hedge.shadow.verify_seconds(r.num_draft_tokens + 1) + [1e-3, 2e-3][i] for r in run.trace)
        assert sum(chosen) == sum(hedge.chosen_counts)
    report = hedge.report()
    assert 0 < report["explored_requests"] < report["requests"] == len(_prompts())
    # the shadows saw every explored request's standalone runs (and the chosen one's always)
    assert np.all(hedge.shadow.tokens_decided > 0) and np.all(hedge.shadow.seconds_decided <= seconds + 1e-9)


def test_one_source_hedge_is_that_source(target):
    """K = 1 (a stateful suffix source): the played stream equals the suffix drafter alone,
    round for round, over requests that share its global structure."""
    policy = POLICIES["tree"]
    solo = SpeculativeDecoder(as_loaded(target), SuffixDrafter(verify_cost=[1.0]), policy=policy(), eos_token_id=[])
    hedge = HedgeDrafter([SuffixDrafter(verify_cost=[1.0])], verify_cost=[1.0, 1.1, 1.2, 1.3, 1.4],
                         draft_seconds=[0.0])
    dec = SpeculativeDecoder(as_loaded(target), hedge, policy=policy(), eos_token_id=[])
    prompts = _prompts(12)                       # 12, then 4 of them again (drafted from the global trie)
    for prompt in prompts:
        ours, theirs = dec.generate(prompt, 12), solo.generate(prompt, 12)
        assert ours.new_tokens == theirs.new_tokens
        assert [(r.num_draft_tokens, r.accepted_tokens) for r in ours.trace] == \
            [(r.num_draft_tokens, r.accepted_tokens) for r in theirs.trace]
    assert hedge.report()["requests"] == len(prompts) and hedge.shadow.tokens_decided[0] == 12 * len(prompts)


@pytest.mark.parametrize("per", ["request", "round"])
def test_requests_the_decoder_never_asks_to_draft(target, per):
    """A one-token request (the decoder asks no draft: the bonus token is the whole
    output) still closes every shadow; the next request drafts as usual."""
    hedge = _hedge(per=per, explore=1.0)             # every shadow in every request
    dec = SpeculativeDecoder(as_loaded(target), hedge, policy=POLICIES["tree"](), eos_token_id=[])
    for prompt, length in (([3, 4, 3], 1), ([3, 4, 3, 4], 6), ([5], 1)):
        assert dec.generate(prompt, length).new_tokens == plain_greedy(target, prompt, length)
    report = hedge.report()
    assert report["pending_rounds"] == 0 and np.all(hedge.shadow.tokens_decided == 8)
